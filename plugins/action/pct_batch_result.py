# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.pct_batch_result: a container's deferred module call, answered from its node's
pct_batch run, or run now where the node did not run it (plugin_utils _deferred); a result that was not deferred is
the result as it is."""


from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.proxmox.plugins.modules.pct_batch_result import ARGUMENT_SPEC as SPEC
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _container_python, _deferred


# What Ansible acts on when a task returns it (shows, sets): said once already, by the task that ran the call.
_SAID = ('warnings', 'deprecations', 'ansible_facts')


class ActionModule(ActionBase):
    _supports_check_mode = True
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(SPEC)

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self.validate_argument_spec(argument_spec=SPEC)[1]
        deferral = args['deferred'].get('deferred')
        if not deferral:  # the call ran where it was made: its result stands (a task may register it again)
            return dict((k, v) for k, v in args['deferred'].items() if k not in _SAID and not k.startswith('_ansible'))
        ran = (args['batch'].get('runs') or {}).get(task_vars['inventory_hostname'])
        result.update(_deferred.replay(self, deferral, ran, task_vars))
        if _container_python.unreadable(result):
            # the container's Python is missing or does not start: say which, and how it is put back
            found = _container_python.diagnose(self, _container_python.interpreter_of(self, task_vars))
            if found is not None:
                result = dict(_container_python.result(found, self._task.check_mode,
                                                       deferral['module'].rsplit('.', 1)[-1]))
        return result
