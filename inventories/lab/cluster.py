#!/usr/bin/env python3
"""The lab's other nodes (`gpufleet lab up --nodes N`: pve2 ... pveN) as Ansible inventory; hosts.yml has pve1.

Ansible runs this as an inventory script (`-i inventories/lab` reads the whole directory). It reads the lab's
nodes.json, which `gpufleet lab up` writes, under $GPUFLEET_LAB_DIR (default /var/lib/gpufleet-lab); a one-node
lab has none, and this lists no host."""

import json
import os
import sys

FIRST = 'pve1'


def inventory(root):
    try:
        with open(os.path.join(root, 'nodes.json')) as fh:
            nodes = json.load(fh)
    except (OSError, ValueError):
        nodes = []
    hosts = {}
    for node in nodes:
        if node['name'] == FIRST:
            continue
        own = '{{ gpufleet_lab_dir }}/nodes/' + node['name']
        hosts[node['name']] = {
            'ansible_host': '127.0.0.1', 'ansible_port': node['ssh_port'], 'ansible_user': 'root',
            'ansible_ssh_private_key_file': '{{ gpufleet_lab_dir }}/ssh/id_ed25519',
            'ansible_ssh_common_args': '-o UserKnownHostsFile={{ gpufleet_lab_dir }}/ssh/known_hosts '
                                       '-o StrictHostKeyChecking=yes',
            'ansible_python_interpreter': '/usr/bin/python3',
            # where this node's own files are (see group_vars/pve_nodes.yml)
            'gpufleet_lab_node_dir': own, 'gpu_node_dev_dir': own + '/dev',
        }
    return {'pve_nodes': {'hosts': sorted(hosts)}, '_meta': {'hostvars': hosts}}


def main(argv):
    root = os.environ.get('GPUFLEET_LAB_DIR', '/var/lib/gpufleet-lab')
    if len(argv) > 1 and argv[1] == '--host':
        print(json.dumps(inventory(root)['_meta']['hostvars'].get(argv[2], {})))
    else:
        print(json.dumps(inventory(root), indent=2, sort_keys=True))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
