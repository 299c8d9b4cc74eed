# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.lxc_container: where the module would run on the controller (a task delegated to
localhost, as gpu_container's), its work (module_utils _lxc's run) is done in the task's own process
(plugin_utils _direct's here); elsewhere, or where this Python lacks proxmoxer, the module runs."""


from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _pve
from ansible_collections.gpufleet.proxmox.plugins.modules.lxc_container import CONSTRAINTS, argument_spec
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _direct


class ActionModule(ActionBase):
    _supports_check_mode = True
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = dict(self._task.args)
        if _pve.HAS_PROXMOXER and _direct.on_controller(self):
            result.update(_direct.here(self, '_lxc:run', argument_spec(), args, task_vars, **CONSTRAINTS))
        else:
            result.update(self._execute_module(module_name=_direct.module_of(self), module_args=args,
                                               task_vars=task_vars))
        return result
