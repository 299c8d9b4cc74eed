#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: fleet_doctor
short_description: Say whether everything a first run of the fleet needs is there, and how to fix what is not
version_added: 0.1.0
description:
  - The last step of the doctor playbook (C(gpufleet.proxmox.doctor), C(gpufleet doctor)). It runs on the
    controller (an action plugin) and changes nothing.
  - Through the API - the password login and the token login (each one given), and a read with each; the
    cluster's nodes against the inventory's (each online, with its PVE version); on each node that a first run
    creates containers on, the template (the storage's C(vztmpl) content) and the room on the storage for their
    root disks.
  - From what the playbook read on each node (the fact C(gpufleet_doctor_node) - SSH, C(pct), the NVIDIA driver
    and devices, the containers' wheelhouse or index) - a row per check, where GPU checks apply only to nodes
    that containers of the fleet ask for GPUs.
  - From the fleet - the definition's check (O(failure), its message where it failed) and what a run would
    create, change, start, destroy, and the orphans it leaves alone (O(changes)).
  - Writes C(doctor.json) into O(report_dir) - C(ready), C(rows) - and returns the same.
extends_documentation_fragment:
  - gpufleet.proxmox.controller_action
options:
  api:
    description: The API options as M(gpufleet.proxmox.lxc_container) takes them (the gpu_container role's C(gpu_container_api)).
    type: dict
    required: true
  fleet:
    description: The fleet definition (C(gpufleet_containers)), for the nodes its containers ask GPUs of.
    type: list
    elements: dict
    default: []
  plan:
    description: M(gpufleet.proxmox.fleet_plan)'s result (its C(containers)), empty where the plan failed.
    type: dict
    default: {}
  changes:
    description: M(gpufleet.proxmox.lxc_container)'s result in check mode, empty where it did not run.
    type: dict
    default: {}
  failure:
    description: Why the fleet's plan or check run failed (the task's message); empty where they ran.
    type: str
    default: ''
  nodes_group:
    description: The inventory group of the PVE nodes.
    type: str
    default: pve_nodes
  report_dir:
    description: Where C(doctor.json) is written (made 0700).
    type: path
    required: true
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: It never changes anything.
author:
  - gpufleet maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Say whether the fleet is ready for its first run
  gpufleet.proxmox.fleet_doctor:
    api: "{{ gpu_container_api }}"
    fleet: "{{ gpu_container_fleet }}"
    plan: "{{ gpu_container_plan | default({}) }}"
    changes: "{{ gpu_container_result | default({}) }}"
    report_dir: "{{ lookup('env', 'GPUFLEET_REPORT_DIR') | default('gpufleet-reports', true) }}"
  run_once: true
'''

RETURN = r'''
ready:
  description: Whether every row is ok.
  returned: always
  type: bool
rows:
  description: One per check - where (a node, V(api) or V(fleet)), check, ok, detail, fix (empty when ok).
  returned: always
  type: list
  elements: dict
report:
  description: The path of C(doctor.json).
  returned: always
  type: str
'''

from ansible_collections.gpufleet.proxmox.plugins.module_utils._action_only import refuse

ARGUMENT_SPEC = {
    'api': {'type': 'dict', 'required': True, 'no_log': True},
    'fleet': {'type': 'list', 'elements': 'dict', 'default': []},
    'plan': {'type': 'dict', 'default': {}},
    'changes': {'type': 'dict', 'default': {}},
    'failure': {'type': 'str', 'default': ''},
    'nodes_group': {'type': 'str', 'default': 'pve_nodes'},
    'report_dir': {'type': 'path', 'required': True},
}


def main():
    refuse('fleet_doctor', ARGUMENT_SPEC)


if __name__ == '__main__':
    main()
