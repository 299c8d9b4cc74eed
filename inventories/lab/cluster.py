#!/usr/bin/env python3
"""The lab as Ansible inventory, read from what `gpufleet lab up` wrote: where the lab keeps its files, its logins,
and its other nodes (`gpufleet lab up --nodes N`: pve2 ... pveN; hosts.yml has pve1).

Ansible runs this as an inventory script (`-i inventories/lab` reads the whole directory). Under $GPUFLEET_LAB_DIR
(default /var/lib/gpufleet-lab) it reads credentials.json (the logins, mode 0600) and nodes.json (a one-node lab has
none, and this lists no other host). It gives every host their values as they are, as an operator's inventory
does, not as lookups that each task using them would evaluate again: `gpufleet_lab_dir` and `gpufleet_lab` (the
logins, read by group_vars/all/lab.yml) for the group all. Without a readable credentials.json (the lab is not up,
or a user other than root runs it) `gpufleet_lab` is left out, and a run that needs the API says it is undefined."""

import json
import os
import sys

FIRST = 'pve1'


def read(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def inventory(root):
    nodes = read(os.path.join(root, 'nodes.json')) or []
    hosts = {}
    for node in nodes:
        if node['name'] == FIRST:
            if node.get('debian'):
                hosts[FIRST] = {'gpufleet_lab_debian': node['debian']}
            continue
        own = os.path.join(root, 'nodes', node['name'])
        hosts[node['name']] = {
            'ansible_host': '127.0.0.1', 'ansible_port': node['ssh_port'], 'ansible_user': 'root',
            'ansible_ssh_private_key_file': os.path.join(root, 'ssh', 'id_ed25519'),
            'ansible_ssh_common_args': '-o UserKnownHostsFile={0} -o StrictHostKeyChecking=yes'.format(
                os.path.join(root, 'ssh', 'known_hosts')),
            'ansible_python_interpreter': '/usr/bin/python3',
            # where this node's own files are (see group_vars/pve_nodes.yml)
            'gpufleet_lab_node_dir': own, 'gpu_node_dev_dir': own + '/dev',
        }
        if node.get('debian'):  # a node on Debian's own NVIDIA packaging (its suite)
            hosts[node['name']]['gpufleet_lab_debian'] = node['debian']
    common = {'gpufleet_lab_dir': root}
    logins = read(os.path.join(root, 'credentials.json'))
    if isinstance(logins, dict):
        common['gpufleet_lab'] = logins
    return {'all': {'vars': common}, 'pve_nodes': {'hosts': sorted(h for h in hosts if h != FIRST)},
            '_meta': {'hostvars': hosts}}


def main(argv):
    root = os.environ.get('GPUFLEET_LAB_DIR', '/var/lib/gpufleet-lab')
    if len(argv) > 1 and argv[1] == '--host':
        print(json.dumps(inventory(root)['_meta']['hostvars'].get(argv[2], {})))
    else:
        print(json.dumps(inventory(root), indent=2, sort_keys=True))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
