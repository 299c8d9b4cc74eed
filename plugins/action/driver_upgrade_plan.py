# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.driver_upgrade_plan: each GPU container's venv profile read with the venv_profile
lookup (the one torch_venv builds from) and its driver floor taken from its lock (plugin_utils _profile), the plan
made by plugin_utils _nvidia_upgrade."""


import os

from ansible.errors import AnsibleActionFail, AnsibleLookupError
from ansible.plugins.loader import lookup_loader

from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _nvidia_upgrade
from ansible_collections.gpufleet.proxmox.plugins.modules.driver_upgrade_plan import ARGUMENT_SPEC
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _profile
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils._action import ControllerAction


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def act(self, args, task_vars):
        node = args['node'] or task_vars.get('inventory_hostname')
        profiles = lookup_loader.get('gpufleet.proxmox.venv_profile', loader=self._loader, templar=self._templar)
        containers = []
        for entry in _nvidia_upgrade.gpu_containers(args['fleet'], node):
            name = entry.get('venv_profile') or args['profile']
            where = _profile.directory(name, args['profiles_dir'])
            try:
                lock = profiles.run([where], variables=task_vars)[0]['lock']
                floor = _profile.driver_floor(lock)
            except (AnsibleLookupError, ValueError) as e:
                raise AnsibleActionFail('CT {0} ({1}), venv profile {2}: {3}'.format(
                    entry.get('vmid'), entry.get('hostname'), name, e))
            containers.append({'vmid': entry.get('vmid'), 'hostname': entry.get('hostname'),
                               'profile': os.path.basename(name), 'needs': floor and floor['driver'],
                               'floor': floor and _profile.floor_words(os.path.basename(name), floor)})
        try:
            plan = _nvidia_upgrade.plan(node, args['version'], args['method'], args['devices'], containers,
                                        args['packages'], args['package_version'], args['read'],
                                        offered=_nvidia_upgrade.madison(args['offers']),
                                        need_rollback=args['rollback'])
        except _nvidia_upgrade.PlanError as e:
            raise AnsibleActionFail(str(e))
        return dict(plan, changed=False)
