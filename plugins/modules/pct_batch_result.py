#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: pct_batch_result
short_description: A container's deferred module call's result, from its node's batch
version_added: 0.2.0
description:
  - Runs for a container whose module call was recorded for its node (O(gpufleet.proxmox.venv_build#module:defer))
    and run there by M(gpufleet.proxmox.pct_batch). Its result is the call's, parsed as Ansible parses any module's
    output - changed, failed with the module's message, or the container unreachable as the pct connection says.
  - Where the node did not run the call (its play was limited away, or its batch failed), the call runs now, over
    the container's own connection.
  - A result that holds no deferred call (the call ran in the container - another connection, or a run that changes
    things) is returned as it is, so that one task can take either and register it under the same name.
extends_documentation_fragment:
  - gpufleet.proxmox.controller_action
options:
  deferred:
    description: The container's registered result of the deferred task (its C(deferred) key), or of the task
      that ran.
    type: dict
    required: true
  batch:
    description: The registered result of M(gpufleet.proxmox.pct_batch) on the container's node; empty where it
      did not run.
    type: dict
    default: {}
attributes:
  check_mode:
    description: The call's own check mode, as recorded.
    support: full
author:
  - gpufleet maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Take the venv read its node ran (a build that ran in the container stays as it is)
  gpufleet.proxmox.pct_batch_result:
    deferred: "{{ torch_venv_build }}"
    batch: "{{ hostvars[gpufleet_node].torch_venv_batch_run | default({}) }}"
  register: torch_venv_build
'''

RETURN = r'''
# The deferred module's own return values (see M(gpufleet.proxmox.venv_build)).
'''

from ansible_collections.gpufleet.proxmox.plugins.module_utils._action_only import refuse

# The options, here beside DOCUMENTATION so that sanity checks one against the other; the action plugin
# (plugins/action/pct_batch_result.py) validates its task's arguments with this same spec.
ARGUMENT_SPEC = {
    'deferred': {'type': 'dict', 'required': True},
    'batch': {'type': 'dict', 'default': {}},
}


def main():
    refuse('pct_batch_result', ARGUMENT_SPEC)


if __name__ == '__main__':
    main()
