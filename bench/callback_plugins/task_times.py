# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where a run's time goes: each task's wall time (from its start to the next task's), summed by task name, written
as JSON to $GPUFLEET_TASK_TIMES when the run ends. Used by bench/scale_bench.py."""

DOCUMENTATION = r'''
name: task_times
type: aggregate
short_description: Write each task's wall time to a JSON file (benchmarks)
description:
  - Sums the wall time of the tasks of a run by play and task name and writes it to the file named by
    E(GPUFLEET_TASK_TIMES) when the run ends.
requirements:
  - enabled with C(callbacks_enabled)
'''

import json
import os
import time

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'aggregate'
    CALLBACK_NAME = 'task_times'
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super(CallbackModule, self).__init__()
        self.play = ''
        self.current = None
        self.started = None
        self.times = {}
        self.hosts = {}

    def _close(self):
        if self.current is not None:
            self.times[self.current] = self.times.get(self.current, 0.0) + time.monotonic() - self.started
        self.current = None

    def v2_playbook_on_play_start(self, play):
        self._close()
        self.play = play.get_name().strip()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._close()
        self.current = '{0} | {1}'.format(self.play, task.get_name().strip())
        self.started = time.monotonic()

    def v2_playbook_on_handler_task_start(self, task):
        self.v2_playbook_on_task_start(task, False)

    def _host(self, result, *args, **kwargs):
        if self.current is not None:
            self.hosts.setdefault(self.current, set()).add(result._host.get_name())

    v2_runner_on_ok = v2_runner_on_failed = v2_runner_on_skipped = v2_runner_on_unreachable = _host

    def v2_playbook_on_stats(self, stats):
        self._close()
        path = os.environ.get('GPUFLEET_TASK_TIMES')
        if not path:
            return
        out = [{'task': name, 's': round(seconds, 3), 'hosts': len(self.hosts.get(name, ()))}
               for name, seconds in sorted(self.times.items(), key=lambda item: -item[1])]
        with open(path, 'w') as fh:
            json.dump(out, fh, indent=1)
