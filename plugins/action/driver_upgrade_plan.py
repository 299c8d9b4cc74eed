# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.driver_upgrade_plan: each GPU container's venv profile read with the venv_profile
lookup (the one torch_venv builds from), the plan made by module_utils _nvidia_upgrade."""


import os

from ansible.errors import AnsibleActionFail, AnsibleLookupError
from ansible.plugins.loader import lookup_loader

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _nvidia_upgrade
from ansible_collections.gpufleet.proxmox.plugins.modules.driver_upgrade_plan import ARGUMENT_SPEC
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils._action import ControllerAction


# The torch_venv role's shipped profiles, in this collection.
PROFILES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'roles',
                        'torch_venv', 'files', 'profiles')


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def act(self, args, task_vars):
        node = args['node'] or task_vars.get('inventory_hostname')
        profiles = lookup_loader.get('gpufleet.proxmox.venv_profile', loader=self._loader, templar=self._templar)
        containers = []
        for entry in _nvidia_upgrade.gpu_containers(args['fleet'], node):
            name = entry.get('venv_profile') or args['profile']
            where = name if '/' in name else os.path.join(args['profiles_dir'] or PROFILES, name)
            try:
                meta = profiles.run([where], variables=task_vars)[0]['meta']
            except AnsibleLookupError as e:
                raise AnsibleActionFail('CT {0} ({1}): {2}'.format(entry.get('vmid'), entry.get('hostname'), e))
            cuda = (meta.get('expect') or {}).get('cuda_version')
            try:
                needs = _nvidia_upgrade.min_driver(cuda)
            except _nvidia_upgrade.PlanError as e:
                raise AnsibleActionFail('CT {0} ({1}), venv profile {2}: {3}'.format(
                    entry.get('vmid'), entry.get('hostname'), name, e))
            containers.append({'vmid': entry.get('vmid'), 'hostname': entry.get('hostname'),
                               'profile': os.path.basename(name), 'cuda': cuda, 'needs': needs})
        try:
            plan = _nvidia_upgrade.plan(node, args['version'], args['method'], args['devices'], containers,
                                        args['packages'], args['package_version'], args['read'])
        except _nvidia_upgrade.PlanError as e:
            raise AnsibleActionFail(str(e))
        return dict(plan, changed=False)
