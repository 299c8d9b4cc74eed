#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: pct_batch
short_description: Run the recorded module calls of a node's containers in one call to the node
version_added: 0.2.0
description:
  - Runs on a PVE node. The module calls its containers recorded for it (M(gpufleet.proxmox.venv_build) with
    O(gpufleet.proxmox.venv_build#module:defer), in a check run) run with C(pct exec), O(forks) at a time, all in this
    one call; each container then takes its call's result with M(gpufleet.proxmox.pct_batch_result).
  - A check run's reads of a whole node cost one connection to the node and a C(pct exec) per container, instead of a
    connection and a task's round trip from the controller per container.
  - The action plugin picks the calls recorded for this node (the container's C(gpufleet_node)) from O(var) of
    O(hosts) and hands them to the module on the node as O(calls). A C(pct exec) that failed before its command
    started (lxc-attach's C(Failed to rexec as memfd)) is run again, O(retries) times, as the pct connection does.
  - Changes nothing itself; the calls are what they were recorded as (check-mode calls, where they were deferred).
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: Runs the recorded calls, which carry their own check mode.
  diff_mode:
    support: none
    description: Nothing to show.
  action:
    description: The action plugin gathers the recorded calls on the controller.
    support: full
  platform:
    description: A PVE node (C(pct)).
    support: full
    platforms: posix
options:
  hosts:
    description: The containers (inventory names) whose recorded calls to run; those recorded for another node are
      left to it.
    type: list
    elements: str
    default: []
  var:
    description: The variable each container registered its recorded call in (its C(deferred) key).
    type: str
    required: true
  forks:
    description: How many containers run at once.
    type: int
    default: 8
  retries:
    description: How often a C(pct exec) that failed before its command started is tried again.
    type: int
    default: 6
  calls:
    description:
      - The calls to run, each C(host), C(argv) and C(stdin). The action plugin makes this from O(hosts) and O(var);
        tasks do not give it. The action leaves them out of the task's result (a call's command line carries its
        task's environment).
    type: list
    elements: dict
    default: []
'''

EXAMPLES = r'''
- name: Run the venv reads recorded for this node's containers (a check run)
  gpufleet.proxmox.pct_batch:
    hosts: "{{ groups['gpufleet_running'] | default([]) }}"
    var: torch_venv_build
  register: torch_venv_batch_run
'''

RETURN = r'''
runs:
  description: Per container (inventory name), its call's exit code C(rc), C(stdout) and C(stderr).
  returned: success
  type: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _pct

ARGUMENT_SPEC = dict(hosts=dict(type='list', elements='str', default=[]), var=dict(type='str', required=True),
                     forks=dict(type='int', default=8), retries=dict(type='int', default=6),
                     calls=dict(type='list', elements='dict', default=[]))


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    result = _pct.run_calls(module.params, module.check_mode)
    if result.get('failed'):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
