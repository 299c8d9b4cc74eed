#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: fleet_report
short_description: Judge a run over the whole fleet and write its reports on the controller
version_added: 0.1.0
description:
  - The end of a site, verify or drift run, once on the controller. From what the run left in the inventory - the
    nodes' discovery (C(gpufleet_gpu_devices)), the fleet definition and gpu_container's result as the nodes read
    it (C(gpufleet_containers), C(gpu_container_result)), and each running container's driver, venv build and
    verify report - it works out the fleet's verdict and, with O(drift), its drift.
  - The verdict covers every container of the fleet definition, reached or not - verified, failed, missing,
    stopped, unreached, unread - counting only this run's reports (those stamped with O(run)'s id).
    C(<dir>/summary.json) is written afresh with one report per container verified in this run; reports of
    earlier runs are removed.
  - With O(drift), C(<dir>/drift/) holds one report per node and container and the drift summary, afresh.
  - Reports are the run's output, not a change to any host, so they are written in check mode too and the task
    never reports changed. It never fails for what it finds; the play decides from the result's C(fleet.ok).
extends_documentation_fragment:
  - gpufleet.proxmox.controller_action
options:
  dir:
    description: The report directory on the controller (the verify role's C(verify_report_dir)).
    type: path
    required: true
  run:
    description: The run (the verify role's C(verify_run) - C(id) and C(started)); reports of other runs are not
      counted.
    type: dict
    default: {}
  verdict:
    description: Judge the fleet's verification and write C(summary.json) and the container reports. Off where the
      run did not verify (its verify stage skipped by tags), so that the summary the run started with stands.
    type: bool
    default: true
  drift:
    description: Also work out the drift and write the drift reports.
    type: bool
    default: false
  nodes_group:
    description: The inventory group of the PVE nodes.
    type: str
    default: pve_nodes
  containers_group:
    description: The inventory group of the running containers (the one gpu_container adds them to).
    type: str
    default: gpufleet_running
  limit:
    description: The run's C(--limit) (C(ansible_limit)), which the verdict names where it leaves containers out.
    type: str
  reads:
    description:
      - The host variables the report is made of, by what each holds; every one is written by a role of the
        collection (a unit test checks that each default has its writer). Give other names only where a playbook of
        your own registers them under other names.
    type: dict
    default: {}
    suboptions:
      definition:
        description: The fleet definition, on the nodes.
        type: str
        default: gpufleet_containers
      reconcile:
        description: The containers' reconcile (gpu_container's C(lxc_container) result), on the nodes.
        type: str
        default: gpu_container_result
      plan:
        description: The fleet's plan (gpu_container's C(fleet_plan) result), on the nodes.
        type: str
        default: gpu_container_plan
      devices:
        description: The node's GPUs, driver and findings (gpu_node's C(gpu_devices) result), on the nodes.
        type: str
        default: gpufleet_gpu_devices
      report:
        description: The container's verification report (a fact the verify role sets), on the containers.
        type: str
        default: verify_report
      build:
        description: The container's venv build (torch_venv's C(venv_build) result), on the containers.
        type: str
        default: torch_venv_build
      driver:
        description: The container's driver step where no venv build made it (gpu_container's), on the containers.
        type: str
        default: gpu_container_driver
      snapshot:
        description: The snapshot taken before the container's change (gpu_container's), on the containers.
        type: str
        default: gpufleet_snapshot
      engine:
        description: The CDI spec of the container's GPUs for its OCI engine (container_engine's C(cdi_spec) result).
        type: str
        default: container_engine_cdi
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: The reports are written in check mode too; the verdict and the drift say C(mode=check).
author:
  - gpufleet maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Judge the fleet and write the reports (drift too)
  gpufleet.proxmox.fleet_report:
    dir: "{{ verify_report_dir }}"
    run: "{{ verify_run }}"
    drift: true
  run_once: true
'''

RETURN = r'''
fleet:
  description: The fleet's verdict (as C(summary.json) holds it) - C(ok), C(verified), C(expected), C(verdict), C(run),
    C(mode) and a row per container with its C(state).
  returned: with O(verdict)
  type: dict
drift:
  description: The fleet's drift (as C(drift/summary.json) holds it) - C(drift), C(count), C(mode), C(nodes) and
    C(containers) with their items.
  returned: with O(drift)
  type: dict
written:
  description: The paths written, in file name order.
  returned: success
  type: list
  elements: str
removed:
  description: The reports of earlier runs removed, in file name order.
  returned: success
  type: list
  elements: str
'''

from ansible_collections.gpufleet.proxmox.plugins.module_utils._action_only import refuse

# The options, here beside DOCUMENTATION so that sanity checks one against the other; the action plugin
# (plugins/action/fleet_report.py) validates its task's arguments with this same spec.
ARGUMENT_SPEC = {
    'dir': {'type': 'path', 'required': True},
    'run': {'type': 'dict', 'default': {}},
    'verdict': {'type': 'bool', 'default': True},
    'drift': {'type': 'bool', 'default': False},
    'nodes_group': {'type': 'str', 'default': 'pve_nodes'},
    'containers_group': {'type': 'str', 'default': 'gpufleet_running'},
    'limit': {'type': 'str'},
    'reads': {'type': 'dict', 'default': {}, 'options': {
        'definition': {'type': 'str', 'default': 'gpufleet_containers'},
        'reconcile': {'type': 'str', 'default': 'gpu_container_result'},
        'plan': {'type': 'str', 'default': 'gpu_container_plan'},
        'devices': {'type': 'str', 'default': 'gpufleet_gpu_devices'},
        'report': {'type': 'str', 'default': 'verify_report'},
        'build': {'type': 'str', 'default': 'torch_venv_build'},
        'driver': {'type': 'str', 'default': 'gpu_container_driver'},
        'snapshot': {'type': 'str', 'default': 'gpufleet_snapshot'},
        'engine': {'type': 'str', 'default': 'container_engine_cdi'},
    }},
}


def main():
    refuse('fleet_report', ARGUMENT_SPEC)


if __name__ == '__main__':
    main()
