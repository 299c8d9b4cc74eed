# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.gpu_devices: the arguments (the driver bundle's too) checked on the controller, then the
module's work (module_utils _gpu's discover_node: the node's GPU vendor's) run on the node as a plugin_utils _direct program, without
Ansible's module wrapper (the module itself where the connection does not pipeline)."""


from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.proxmox.plugins.modules.gpu_devices import ARGUMENT_SPEC, checked_bundle
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _direct


class ActionModule(ActionBase):
    _supports_check_mode = True
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args, error = checked_bundle(dict(self._task.args))
        if error:
            return dict(result, failed=True, msg=error)
        result.update(_direct.execute(self, '_gpu:discover_node', ARGUMENT_SPEC, args, task_vars))
        return result
