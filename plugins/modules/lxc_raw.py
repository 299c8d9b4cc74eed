#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: lxc_raw
short_description: The raw lxc.* lines of a Proxmox VE container's config, on a node
version_added: 0.1.0
description:
  - Makes the C(lxc.*) lines of C(/etc/pve/nodes/<node>/lxc/<vmid>.conf) exactly the given ones (the PVE API
    shows them but cannot set them). Needed for GPU passthrough on PVE before 8.1, which has no C(devN).
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
    description: The container.
    type: int
    required: true
  node:
    description: The node the container belongs to.
    type: str
    required: true
  entries:
    description:
      - The raw lines, each written as in the config file (key, colon, value) or as V(lxc.key = value).
      - An empty list removes them all.
    type: list
    elements: str
    required: true
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
'''

RETURN = r'''
entries:
  description: The raw lines after the run, as C([key, value]) pairs.
  returned: always
  type: list
  elements: list
path:
  description: The config file.
  returned: always
  type: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _pveconf


def main():
    module = AnsibleModule(argument_spec=dict(vmid=dict(type='int', required=True), node=dict(type='str', required=True),
                                              entries=dict(type='list', elements='str', required=True),
                                              pve_root=dict(type='path', default='/etc/pve')),
                           supports_check_mode=True)
    p = module.params
    path = _pveconf.conf_path(p['pve_root'], p['node'], p['vmid'])
    try:
        changed, before, after = _pveconf.apply(path, _pveconf.normalize(p['entries']), module.check_mode)
    except _pveconf.RawError as e:
        module.fail_json(msg=str(e), path=path)
    fmt = ''.join('{0}: {1}\n'.format(k, v) for k, v in before), ''.join('{0}: {1}\n'.format(k, v) for k, v in after)
    module.exit_json(changed=changed, path=path, entries=[list(e) for e in after],
                     diff=dict(before=fmt[0], after=fmt[1], before_header=path, after_header=path))


if __name__ == '__main__':
    main()
