#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: verify_container
short_description: Verify one container's venv and torch, or reuse its last passing verification
version_added: 0.1.0
description:
  - The verify role's task. From what this run knows of the container (O(build), O(driver), O(gpus), O(devices),
    O(node_driver), O(container_changed)) it works out what torch must show, whether CUDA is required, and the
    fingerprint of everything a verification depends on; then either reuses the last passing verification
    recorded in the venv, or audits the venv with M(gpufleet.proxmox.venv_audit) (unless O(build) holds an audit
    of this run that stands) and runs M(gpufleet.proxmox.torch_verify).
  - The last passing verification is reused only when O(max_age) > 0, nothing changed in this run (the
    container's config or power, its driver, its venv), the venv audits healthy in fast mode, the fingerprint is
    the same and the record is at most O(max_age) seconds old.
  - Where O(build) is not given (torch_venv did not run), the expectations come from the marker the venv was
    built with, and the verification is not recorded.
  - It runs on the controller (an action plugin) and calls those modules over the task's connection, so one task
    does what took several.
  - Sets the facts C(verify_audit), C(verify_result) and C(verify_report). It never fails for what it finds; the
    report's C(ok) and the task's C(msg) say what is wrong, so that a play can write every container's report
    before failing any.
extends_documentation_fragment:
  - gpufleet.proxmox.controller_action
options:
  venv:
    description: The venv (the stable link torch_venv manages).
    type: path
    default: /root/venv
  build:
    description: The result of the venv's M(gpufleet.proxmox.venv_build) in this run (C(torch_venv_build)).
    type: dict
  driver:
    description: The result of the container's M(gpufleet.proxmox.userspace_driver) in this run.
    type: dict
  gpus:
    description: The node's GPU indexes given to the container.
    type: list
    elements: raw
    default: []
  devices:
    description: The node's devices for those GPUs (index, node, bus id).
    type: list
    elements: raw
    default: []
  node_driver:
    description: The node's NVIDIA kernel module version.
    type: str
  container_changed:
    description: Whether this run changed the container's config or power.
    type: bool
    default: false
  expect:
    description: Expectations over the derived ones (torch_version, cuda_version, cudnn_version, nccl_version,
      device_count, driver_version; null drops one).
    type: dict
    default: {}
  require_cuda:
    description: true, false, or auto (where the container has GPUs and its profile is a CUDA build).
    type: raw
    default: auto
  smoke:
    description: M(gpufleet.proxmox.torch_verify)'s smoke test.
    type: str
    choices: [none, matmul]
    default: none
  min_tflops:
    description: A floor for each device's bf16 TFLOPS with the matmul smoke test (0 for none).
    type: float
    default: 0
  compile_check:
    description: Compile and run a tiny function with torch.compile.
    type: bool
    default: false
  collective:
    description: An all_reduce across the container's GPUs (NCCL), or two CPU processes with gloo without one.
    type: bool
    default: true
  min_allreduce_gbps:
    description: A floor for the collective's algorithm bandwidth in GB/s (0 for none).
    type: float
    default: 0
  train_step:
    description: A short, fixed training step of a small transformer on each GPU (bf16), or on the CPU without one.
    type: bool
    default: true
  throughput_baseline:
    description: Where the container keeps its training step's first passing result, the baseline later verifications
      are held to ('' keeps none).
    type: str
    default: /var/lib/gpufleet/throughput-baseline.json
  max_throughput_drop:
    description: The fraction of the baseline the training step may fall below it before it is a finding.
    type: float
    default: 0.15
  min_shm_mb_per_gpu:
    description: C(/dev/shm) must hold this many MiB per GPU of the container (for one without any); 0 skips the check.
    type: int
    default: 256
  min_nofile:
    description: The container's open-file limit (its init's hard limit) must be at least this; 0 skips the check.
    type: int
    default: 65536
  rdma:
    description: The container's fleet entry asks for RDMA - its locked memory must be unlimited.
    type: bool
    default: false
  compile_backend:
    description: The backend of the compile check.
    type: str
    default: inductor
  user:
    description:
      - A user of the container who must be able to open its GPUs' device nodes (M(gpufleet.proxmox.torch_verify)'s
        O(gpufleet.proxmox.torch_verify#module:user)); empty for none.
    type: str
    default: nobody
  audit_mode:
    description: M(gpufleet.proxmox.venv_audit)'s mode.
    type: str
    choices: [fast, full]
    default: fast
  max_age:
    description: Seconds for which the last passing verification may be reused (0 - never).
    type: int
    default: 0
  timeout:
    description: Seconds the torch probe may take.
    type: int
    default: 300
  node:
    description: The container's node, for the report.
    type: str
  vmid:
    description: The container's VMID, for the report.
    type: int
  run:
    description:
      - The id of the run, kept in the report, so that the fleet's verdict counts only the reports of its own run.
    type: str
  rolled_back:
    description:
      - Where the container was rolled back in this run to the snapshot taken before its change, because its
        verification after the change failed - V(snapshot), V(done) (whether the rollback was made), V(msg) (why
        not), V(first) (the report of the verification that failed). The report keeps both verdicts in
        C(rolled_back), and the fleet's verdict counts the container as rolled back, not verified.
    type: dict
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Audits and verifies in check mode too; nothing is recorded where O(build) comes from a check.
author:
  - gpufleet maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Verify the container, reusing a verification younger than an hour where nothing changed
  gpufleet.proxmox.verify_container:
    venv: /root/venv
    build: "{{ torch_venv_build }}"
    gpus: "{{ gpufleet_gpus }}"
    node_driver: "{{ gpufleet_node_driver_version }}"
    max_age: 3600

- name: Fail where something is wrong
  ansible.builtin.fail:
    msg: "{{ verify_report }}"
  when: not verify_report.ok
'''

RETURN = r'''
state:
  description: What was worked out before auditing and verifying.
  returned: always
  type: dict
  contains:
    meta:
      description: The venv's profile (its name, lock, overrides and expectations).
      type: dict
    expect:
      description: What torch had to show.
      type: dict
    cuda:
      description: Whether CUDA was required.
      type: bool
    audited:
      description: Whether O(build)'s audit stood in for the role's own.
      type: bool
    fingerprint:
      description: The sha256 of everything the verification depends on.
      type: str
    reuse:
      description: Whether the last passing verification was reused.
      type: bool
msg:
  description: What is wrong, where the report is not ok.
  returned: when the report is not ok
  type: str
ansible_facts:
  description: The facts the task sets.
  returned: always
  type: dict
  contains:
    verify_audit:
      description: The venv's audit that stands (M(gpufleet.proxmox.venv_audit)'s result).
      type: dict
    verify_result:
      description: M(gpufleet.proxmox.torch_verify)'s result, or the reused one (with C(reused), C(verified_at)
        and C(age_s)).
      type: dict
    verify_report:
      description: The container's report - host, node, vmid, run, profile, ok, expected, torch, audit.
      type: dict
'''

from ansible_collections.gpufleet.proxmox.plugins.module_utils._action_only import refuse

# The options, here beside DOCUMENTATION so that sanity checks one against the other; the action plugin
# (plugins/action/verify_container.py) validates its task's arguments with this same spec.
ARGUMENT_SPEC = {
    'venv': {'type': 'path', 'default': '/root/venv'},
    'build': {'type': 'dict'},
    'driver': {'type': 'dict'},
    'gpus': {'type': 'list', 'elements': 'raw', 'default': []},
    'devices': {'type': 'list', 'elements': 'raw', 'default': []},
    'node_driver': {'type': 'str'},
    'container_changed': {'type': 'bool', 'default': False},
    'expect': {'type': 'dict', 'default': {}},
    'require_cuda': {'type': 'raw', 'default': 'auto'},
    'smoke': {'type': 'str', 'choices': ['none', 'matmul'], 'default': 'none'},
    'min_tflops': {'type': 'float', 'default': 0},
    'compile_check': {'type': 'bool', 'default': False},
    'collective': {'type': 'bool', 'default': True},
    'min_allreduce_gbps': {'type': 'float', 'default': 0},
    'min_shm_mb_per_gpu': {'type': 'int', 'default': 256},
    'min_nofile': {'type': 'int', 'default': 65536},
    'rdma': {'type': 'bool', 'default': False},
    'train_step': {'type': 'bool', 'default': True},
    'throughput_baseline': {'type': 'str', 'default': '/var/lib/gpufleet/throughput-baseline.json'},
    'max_throughput_drop': {'type': 'float', 'default': 0.15},
    'compile_backend': {'type': 'str', 'default': 'inductor'},
    'user': {'type': 'str', 'default': 'nobody'},
    'audit_mode': {'type': 'str', 'choices': ['fast', 'full'], 'default': 'fast'},
    'max_age': {'type': 'int', 'default': 0},
    'timeout': {'type': 'int', 'default': 300},
    'node': {'type': 'str'},
    'vmid': {'type': 'int'},
    'run': {'type': 'str'},
    'rolled_back': {'type': 'dict'},
}


def main():
    refuse('verify_container', ARGUMENT_SPEC)


if __name__ == '__main__':
    main()
