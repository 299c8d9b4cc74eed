# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.lxc_container: where the module would run on the controller (a task delegated to
localhost, as gpu_container's), its work (module_utils _lxc's run) is done in the task's own process
(plugin_utils _direct's here); elsewhere, where this Python lacks proxmoxer, or where the task is async, the module
runs."""


from ansible.plugins.action import ActionBase
from ansible.utils.vars import merge_hash

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _pve
from ansible_collections.gpufleet.proxmox.plugins.modules.lxc_container import CONSTRAINTS, argument_spec
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _direct


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = dict(self._task.args)
        if _pve.HAS_PROXMOXER and _direct.on_controller(self) and not self._task.async_val:
            return merge_hash(result, _direct.here(self, '_lxc:run', argument_spec(), args, **CONSTRAINTS))
        return merge_hash(result, _direct.the_module(self, args, task_vars))
