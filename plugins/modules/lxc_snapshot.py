#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: lxc_snapshot
short_description: A Proxmox VE container's snapshots, as the collection takes and rolls them back
version_added: 0.1.0
description:
  - Takes a snapshot of a container through the PVE API, named by the collection and the time
    (C(gpufleet-<UTC date>-<time>)), and deletes the collection's older ones beyond O(keep); the operator's own
    snapshots are never deleted.
  - Refuses, before asking PVE, a container PVE cannot snapshot, saying why (a host-path mount point, a volume on a
    storage that cannot snapshot).
  - Rolls a container back to a snapshot (the collection's newest by default), and starts it again.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - gpufleet.proxmox.pve
attributes:
  check_mode:
    support: full
    description: Names the snapshot that would be taken, the ones that would be deleted, or the one rolled back to.
  diff_mode:
    support: none
    description: Returns no diff; RV(name) and RV(removed) say what changed.
options:
  vmid:
    description: The container, wherever it is in the cluster.
    type: int
    required: true
  state:
    description:
      - V(present) takes a snapshot; V(rolled_back) rolls the container back to O(name); V(absent) deletes O(name).
    type: str
    choices: [present, rolled_back, absent]
    default: present
  name:
    description:
      - The snapshot. With O(state=present) the collection's name for now by default; with O(state=rolled_back) the
        collection's newest by default; required with O(state=absent).
    type: str
  keep:
    description:
      - With O(state=present), how many of the collection's snapshots are kept, the new one counted; older ones are
        deleted. V(0) deletes none.
    type: int
    default: 0
  start:
    description: With O(state=rolled_back), start the container after the rollback (PVE stops it first).
    type: bool
    default: true
  description:
    description: With O(state=present), the snapshot's description (what it was taken before).
    type: str
  lock_timeout:
    description: Seconds to retry while the container is locked.
    type: int
    default: 60
'''

EXAMPLES = r'''
- name: Snapshot CT 201 before changing it, keeping the last 3 of the collection's
  gpufleet.proxmox.lxc_snapshot:
    vmid: 201
    keep: 3
    description: before the venv switch to the cu130 profile
  register: snap

- name: Roll CT 201 back to the collection's newest snapshot, and start it
  gpufleet.proxmox.lxc_snapshot:
    vmid: 201
    state: rolled_back
'''

RETURN = r'''
name:
  description: The snapshot taken, rolled back to, or deleted.
  returned: success
  type: str
node:
  description: The container's node.
  returned: success
  type: str
removed:
  description: The snapshots deleted (or that would be, in check mode).
  returned: success
  type: list
  elements: str
refused:
  description:
    - Where PVE cannot snapshot the container (the task fails), why - V(host_path) (a mount point of its own that is
      a host path) or V(storage) (a volume on a storage that cannot snapshot).
  returned: when refused
  type: str
snapshots:
  description: The container's snapshots after the run.
  returned: success
  type: list
  elements: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _pve, _pve_options, _snapshot


def main():
    spec = dict(_pve_options.CONNECTION_SPEC)
    spec.update(vmid=dict(type='int', required=True),
                state=dict(type='str', choices=['present', 'rolled_back', 'absent'], default='present'),
                name=dict(type='str'), keep=dict(type='int', default=0), start=dict(type='bool', default=True),
                description=dict(type='str'), lock_timeout=dict(type='int', default=60))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True,
                           required_one_of=_pve_options.CONNECTION_REQUIRED_ONE_OF,
                           required_together=_pve_options.CONNECTION_REQUIRED_TOGETHER,
                           required_if=[('state', 'absent', ('name',))])
    p = module.params
    if p['keep'] < 0:
        module.fail_json(msg='keep: must be 0 or more, got {0}'.format(p['keep']))
    missing = _pve.missing_proxmoxer()
    if missing:
        module.fail_json(**dict((k, v) for k, v in missing.items() if k != 'failed'))
    try:
        client = _pve.PveClient(p, read_only=module.check_mode)
        result = _snapshot.run(client, p['vmid'], p['state'], p['name'], p['keep'], p['start'], p['description'],
                               module.check_mode, p['lock_timeout'])
    except _snapshot.Refused as e:
        module.fail_json(msg=str(e), refused=e.kind)
    except ValueError as e:
        module.fail_json(msg=str(e))
    except _pve.PveError as e:
        module.fail_json(**e.result())
    module.exit_json(**result)


if __name__ == '__main__':
    main()
