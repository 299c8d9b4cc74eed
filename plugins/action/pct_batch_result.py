# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.pct_batch_result: a container's deferred module call, answered from its node's
pct_batch run, or run now where the node did not run it (plugin_utils _deferred)."""


from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.proxmox.plugins.modules.pct_batch_result import ARGUMENT_SPEC as SPEC
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _deferred


class ActionModule(ActionBase):
    _supports_check_mode = True
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(SPEC)

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self.validate_argument_spec(argument_spec=SPEC)[1]
        deferral = args['deferred'].get('deferred')
        if not deferral:
            return dict(result, failed=True, msg='pct_batch_result: deferred holds no deferred call (a result of a '
                                                 'module task with defer, in a check run)')
        ran = (args['batch'].get('runs') or {}).get(task_vars['inventory_hostname'])
        result.update(_deferred.replay(self, deferral, ran, task_vars))
        return result
