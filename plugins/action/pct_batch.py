# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.pct_batch: on the controller, the calls recorded for this node (plugin_utils
_deferred) are gathered from the containers' variable; the module's work (module_utils _pct's run_calls) runs them on
the node in one call, as a plugin_utils _direct program."""


from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.proxmox.plugins.modules.pct_batch import ARGUMENT_SPEC
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _deferred, _direct
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils._action import host_var


class ActionModule(ActionBase):
    _supports_check_mode = True
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = dict(self._task.args)
        if args.get('calls'):
            return dict(result, failed=True, msg='pct_batch: calls are gathered from hosts and var, not given')
        node, hostvars = task_vars['inventory_hostname'], task_vars['hostvars']
        calls = []
        for host in args.get('hosts') or []:
            deferral = (host_var(hostvars, host, args.get('var') or '') or {}).get('deferred')
            if deferral and deferral.get('node') == node:
                calls.append(dict(_deferred.call_of(deferral), host=host))
        if not calls:
            return dict(result, changed=False, runs={})
        args['calls'] = calls
        result.update(_direct.execute(self, '_pct:run_calls', ARGUMENT_SPEC, args, task_vars))
        # the calls' command lines carry their tasks' environment: not in the result (nor its logs)
        result.pop('invocation', None)
        result['changed'] = False
        return result
