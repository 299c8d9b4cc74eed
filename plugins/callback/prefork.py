# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Keeps the controller's long-lived objects out of the garbage collection of Ansible's worker processes.

Ansible forks a worker for each task of each host. The worker inherits the whole controller process (the inventory,
every host's variables, the loaded plays): tens of thousands of objects that Python's cyclic garbage collector walks
again in each worker whenever it makes a full collection, writing to each object's header as it goes (so the forked
memory pages are copied too). In a drift check of 20 containers on the lab's two cores, the workers spent 4.4 s of
their 6.6 s of CPU collecting (measured with gc.callbacks in them), and the check took about a second longer.
Freezing the controller's objects right before a task's workers are forked (gc.freeze: they move to a generation
that no collection visits) leaves each worker to collect only what it makes itself. The controller's own
collections skip the frozen objects too; an object frozen while it was cyclic garbage stays until the run ends (a
few thousand objects a run, measured: the controller's peak memory did not change)."""

DOCUMENTATION = r'''
name: gc_freeze
type: aggregate
short_description: Spare Ansible's forked workers from collecting the controller's objects (faster runs)
description:
  - Right before each play's and each task's workers are forked, moves the controller process's objects to Python's
    permanent generation (C(gc.freeze)), so that a worker's garbage collection walks only the objects it made itself,
    not the inventory, the variables and the plays it inherited.
  - It changes no result and prints nothing. On the lab it takes about a tenth off a drift check of 20 containers
    (see the collection's docs/drift.md).
  - Enabled in the collection's C(ansible.cfg); the gpufleet CLI adds it to the enabled callbacks of its runs.
requirements:
  - enabled with C(callbacks_enabled = gpufleet.proxmox.gc_freeze) (the C([defaults]) section of C(ansible.cfg))
'''

import gc

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'aggregate'
    CALLBACK_NAME = 'gpufleet.proxmox.gc_freeze'
    CALLBACK_NEEDS_ENABLED = True

    def _freeze(self, *args, **kwargs):
        # each strategy sends a task's start before it forks the task's first worker
        gc.freeze()

    v2_playbook_on_play_start = v2_playbook_on_task_start = v2_playbook_on_handler_task_start = _freeze
