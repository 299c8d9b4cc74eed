# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test-only stdout callback: every task result of the run as one JSON document.

{"plays": [{"name", "tasks": [{"name", "hosts": {host: result}}]}], "stats": {host: {...}}}
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = '''
name: results_json
type: stdout
short_description: every task result as JSON (for the tests)
description: Collects each task's result per host and prints them as one JSON document at the end.
'''

import json

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'stdout'
    CALLBACK_NAME = 'results_json'

    def __init__(self):
        super(CallbackModule, self).__init__()
        self.plays = []

    def v2_playbook_on_play_start(self, play):
        self.plays.append({'name': play.get_name(), 'tasks': []})

    def v2_playbook_on_task_start(self, task, is_conditional):
        self.plays[-1]['tasks'].append({'name': task.get_name(), 'hosts': {}})

    v2_playbook_on_handler_task_start = v2_playbook_on_task_start

    def _record(self, result, **extra):
        res = dict(self._convert_result(result._result), **extra)
        self.plays[-1]['tasks'][-1]['hosts'][result._host.get_name()] = res

    def _convert_result(self, res):
        return json.loads(json.dumps(res, default=str))

    def v2_runner_on_ok(self, result):
        self._record(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, failed=True)

    def v2_runner_on_skipped(self, result):
        self._record(result, skipped=True)

    def v2_runner_on_unreachable(self, result):
        self._record(result, unreachable=True)

    def v2_playbook_on_stats(self, stats):
        summary = dict((h, stats.summarize(h)) for h in sorted(stats.processed))
        self._display.display(json.dumps({'plays': self.plays, 'stats': summary}, default=str))
