# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Readies the controller process before Ansible forks its workers, so that each worker does less of what every
worker would do again.

Ansible forks a worker for each task of each host, and the worker inherits the whole controller process.

- Its garbage collection: the worker inherits the inventory, every host's variables, the loaded plays: tens of
  thousands of objects that Python's cyclic garbage collector walks again in each worker whenever it makes a full
  collection, writing to each object's header as it goes (so the forked memory pages are copied too). In a drift
  check of 20 containers on the lab's two cores, the workers spent 4.4 s of their 6.6 s of CPU collecting
  (measured with gc.callbacks in them). Freezing the controller's objects right before a task's workers are forked
  (gc.freeze: they move to a generation that no collection visits) leaves each worker to collect only what it makes
  itself. The controller's own collections skip the frozen objects too; an object frozen while it was cyclic
  garbage stays until the run ends (a few thousand objects a run, measured: the controller's peak memory did not
  change).
- Its plugins: a plugin the controller has not loaded is loaded in each worker that uses it, from source, its
  DOCUMENTATION parsed as YAML for its settings. Ansible's own filters and tests (every worker that templates
  loads them all), the connections the collection's hosts use (ssh to nodes, the collection's pct to containers,
  local) and the lookups its roles and inventories use were loaded that way in every worker (35 workers loaded
  the filters in a drift check of 5 containers). Loaded once in the controller when the playbook starts, they are
  the workers' already (Ansible's plugin loader takes a module it finds loaded): that check used about 0.3 s less
  of the machine's CPU (4.8-4.9 s against 5.1-5.2 s) and took 0.1-0.25 s less."""

DOCUMENTATION = r'''
name: prefork
type: aggregate
short_description: Ready the controller before Ansible forks its workers (faster runs)
description:
  - When the playbook starts, loads the plugins that each worker would otherwise load again itself (Ansible's own
    filters and tests, the ssh, local and gpufleet.proxmox.pct connections, the env, file and template lookups).
  - Right before each play's and each task's workers are forked, moves the controller process's objects to Python's
    permanent generation (C(gc.freeze)), so that a worker's garbage collection walks only the objects it made itself,
    not the inventory, the variables and the plays it inherited.
  - It changes no result and prints nothing. On the lab the objects' freeze took about a tenth off a drift check of
    20 containers, and the plugins loaded once 0.1-0.25 s off a drift check of 5 (see the collection's
    docs/drift.md).
  - Enabled in the collection's C(ansible.cfg); the gpufleet CLI adds it to the enabled callbacks of its runs.
    C(gpufleet.proxmox.gc_freeze), its former name, still finds it.
requirements:
  - enabled with C(callbacks_enabled = gpufleet.proxmox.prefork) (the C([defaults]) section of C(ansible.cfg))
'''

import gc

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import connection_loader, filter_loader, lookup_loader, test_loader

# (loader, a plugin's name): loading the name loads its file (a filter's or test's: all of Ansible's own)
PLUGINS = ((connection_loader, 'ansible.builtin.ssh'), (connection_loader, 'ansible.builtin.local'),
           (connection_loader, 'gpufleet.proxmox.pct'),
           (lookup_loader, 'ansible.builtin.env'), (lookup_loader, 'ansible.builtin.file'),
           (lookup_loader, 'ansible.builtin.template'),
           (filter_loader, 'ansible.builtin.to_json'), (test_loader, 'ansible.builtin.match'))


def load_plugins():
    """Loads PLUGINS in this process; [names that did not load] (a worker that needs one loads it, or says why
    not, as it would have)."""
    missed = []
    for loader, name in PLUGINS:
        try:
            if loader.get_with_context(name, class_only=True).object is None:
                missed.append(name)
        except Exception:  # pylint: disable=broad-except
            missed.append(name)
    return missed


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'aggregate'
    CALLBACK_NAME = 'gpufleet.proxmox.prefork'
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        load_plugins()

    def _freeze(self, *args, **kwargs):
        # each strategy sends a task's start before it forks the task's first worker
        gc.freeze()

    v2_playbook_on_play_start = v2_playbook_on_task_start = v2_playbook_on_handler_task_start = _freeze
