#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: lxc_raw
short_description: The raw lxc.* lines of Proxmox VE containers' configs, on a node
version_added: 0.1.0
description:
  - Makes the C(lxc.*) lines of C(/etc/pve/nodes/<node>/lxc/<vmid>.conf) the given ones (the PVE API shows them but
    cannot set them). They carry the bind mounts of the fleet's driver bundle and shares (raw lines are no volumes, so they
    leave the container snapshottable, as pve-container C(LXC/Config.pm) C(has_feature) asks only the rootfs and the
    C(mpN) volumes), and GPU passthrough on PVE before 8.1, which has no C(devN).
  - With O(owned), only the lines the collection writes are managed (binds of C(/dev/nvidia*), binds at the
    O(owned.targets), cgroup rules for the O(owned.majors)); the container's other raw lines are kept.
  - Runs on a node of the cluster. Uses only the Python standard library.
  - The container's other config lines, its description and its pending and snapshot sections are kept.
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: Reports the change without writing.
  diff_mode:
    support: full
    description: Shows the raw lines before and after.
options:
  vmid:
    description: The container (with O(entries)); or give O(containers).
    type: int
  node:
    description: The node the containers belong to.
    type: str
    required: true
  entries:
    description:
      - The raw lines of O(vmid), each written as in the config file (key, colon, value) or as V(lxc.key = value).
      - An empty list removes them all (with O(owned), all of the collection's).
    type: list
    elements: str
  containers:
    description: The raw lines of several containers of the node, as O(entries) each, by vmid.
    type: dict
  owned:
    description: Manage only the collection's lines (see above), leaving the others.
    type: dict
    suboptions:
      targets:
        description: The mount targets of the fleet's binds, as in the container (V(/opt/nvidia-driver)).
        type: list
        elements: str
        default: []
      majors:
        description: The device majors of the NVIDIA device nodes.
        type: list
        elements: str
        default: []
  pve_root:
    description: The cluster's configuration directory.
    type: path
    default: /etc/pve
'''

EXAMPLES = r'''
- name: Pass GPU 0 through the old way (PVE 8.0)
  gpufleet.proxmox.lxc_raw:
    vmid: 200
    node: gpu01
    entries:
      - "lxc.cgroup2.devices.allow: c 195:0 rw"
      - "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file"

- name: Bind the node's driver bundle into two containers, leaving their other raw lines alone
  gpufleet.proxmox.lxc_raw:
    node: gpu01
    containers:
      200: ["lxc.mount.entry: /opt/gpufleet/driver/580.95.05 opt/nvidia-driver none bind,ro,create=dir 0 0"]
      201: []
    owned:
      targets: [/opt/nvidia-driver]
'''

RETURN = r'''
entries:
  description: The raw lines of O(vmid) (or of the collection's, with O(owned)) after the run, as C([key, value]) pairs.
  returned: with O(vmid)
  type: list
  elements: list
path:
  description: The config file of O(vmid).
  returned: with O(vmid)
  type: str
changed_vmids:
  description: The containers whose lines changed (or would change, in check mode).
  returned: always
  type: list
  elements: int
lines:
  description: The lines before and after (each as in the file, key and value) of each container in RV(changed_vmids), by vmid.
  returned: always
  type: dict
'''

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _gpu, _pveconf


def _lines(entries):
    return ''.join('{0}: {1}\n'.format(k, v) for k, v in entries)


def main():
    module = AnsibleModule(argument_spec=dict(
        vmid=dict(type='int'), node=dict(type='str', required=True),
        entries=dict(type='list', elements='str'), containers=dict(type='dict'),
        owned=dict(type='dict', options=dict(targets=dict(type='list', elements='str', default=[]),
                                             majors=dict(type='list', elements='str', default=[]))),
        pve_root=dict(type='path', default='/etc/pve')),
        required_together=[('vmid', 'entries')], required_one_of=[('vmid', 'containers')],
        mutually_exclusive=[('vmid', 'containers')], supports_check_mode=True)
    p = module.params
    wanted = {p['vmid']: p['entries']} if p['vmid'] is not None else p['containers']
    owned = _pveconf.ours(_gpu.any_device_node, p['owned']['targets'], p['owned']['majors']) if p['owned'] is not None else None
    changed, before, after, path, entries, lines = [], [], [], None, [], {}
    for vmid in sorted(wanted, key=int):
        path = _pveconf.conf_path(p['pve_root'], p['node'], vmid)
        try:
            entries = _pveconf.normalize(wanted[vmid] or [])
            if module.check_mode and not os.path.exists(path) and os.path.isdir(os.path.dirname(path)):
                did, was, now = bool(entries), [], entries  # a container this run makes: written once it exists
            else:
                did, was, now = _pveconf.apply(path, entries, module.check_mode, owned)
        except _pveconf.RawError as e:
            module.fail_json(msg='CT {0}: {1}'.format(vmid, e), path=path, changed_vmids=changed)
        if did:
            changed.append(int(vmid))
            lines[int(vmid)] = {'before': _lines(was).splitlines(), 'after': _lines(now).splitlines()}
            before.append('# CT {0}\n{1}'.format(vmid, _lines(was)))
            after.append('# CT {0}\n{1}'.format(vmid, _lines(now)))
        entries = now
    single = dict(path=path, entries=[list(e) for e in entries]) if p['vmid'] is not None else {}
    module.exit_json(changed=bool(changed), changed_vmids=changed, lines=lines,
                     diff=dict(before=''.join(before), after=''.join(after), before_header='raw lxc lines',
                               after_header='raw lxc lines'), **single)


if __name__ == '__main__':
    main()
