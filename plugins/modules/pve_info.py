#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: pve_info
short_description: What a Proxmox VE cluster is, read in three requests
version_added: 0.1.0
description:
  - Reads the PVE version, the nodes and every guest of the cluster, and says how the module logged in
    (whether it is V(root@pam) with a password, which device passthrough needs).
  - Changes nothing.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - gpufleet.proxmox.read_only
  - gpufleet.proxmox.pve
options: {}
'''

EXAMPLES = r'''
- name: Which PVE is this?
  gpufleet.proxmox.pve_info:
    api_host: pve1.example.com
    api_user: root@pam
    api_token_id: audit
    api_token_secret: "{{ vault_audit_token }}"
  register: pve
'''

RETURN = r'''
version:
  description: The PVE version (V(8.4.1)).
  returned: always
  type: str
nodes:
  description: The cluster's nodes with their status.
  returned: always
  type: list
  elements: dict
guests:
  description: Every guest, by vmid (as a string key) with its node, type, name and status.
  returned: always
  type: dict
user:
  description: The login.
  returned: always
  type: str
is_root_password:
  description: True when logged in as V(root@pam) with its password.
  returned: always
  type: bool
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _pve, _pve_options


def main():
    module = AnsibleModule(argument_spec=dict(_pve_options.CONNECTION_SPEC), supports_check_mode=True,
                           required_one_of=_pve_options.CONNECTION_REQUIRED_ONE_OF,
                           required_together=_pve_options.CONNECTION_REQUIRED_TOGETHER)
    missing = _pve.missing_proxmoxer()
    if missing:
        module.fail_json(**dict((k, v) for k, v in missing.items() if k != 'failed'))
    try:
        client = _pve.PveClient(module.params, read_only=True)
        version = client.version()
        nodes = client.get('nodes')
        guests = client.guests()
    except _pve.PveError as e:
        module.fail_json(**e.result())
    module.exit_json(changed=False, version=version.get('version'), nodes=nodes,
                     guests=dict((str(k), dict(node=g.get('node'), type=g.get('type'), name=g.get('name'),
                                               status=g.get('status'))) for k, g in guests.items()),
                     user=client.auth_label(), is_root_password=client.is_root_password)


if __name__ == '__main__':
    main()
