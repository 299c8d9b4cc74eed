#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: torch_verify
short_description: Assert what a training job needs of its torch venv, and say exactly what is wrong
version_added: 0.1.0
description:
  - Runs a probe with the venv's interpreter in a subprocess with a timeout, so that an ImportError or a hang
    is a finding, not a crash. It reads torch's version, CUDA version, whether CUDA is available, the devices
    (name, compute capability, memory, whether torch was built for it), cuDNN and NCCL versions, and the
    userspace driver version (from the libcuda.so.1 the process loads).
  - Compares every expectation set and reports all failures at once, each with expected and actual.
  - When C(import torch) fails, names every shared library of the venv that does not resolve, with the
    distribution that should provide it.
  - When CUDA is unavailable, devices are short or the driver differs, adds a device diagnosis - which
    C(/dev/nvidia*) nodes exist, and for each whether opening it works, gives EPERM (passthrough or cgroup
    wrong) or ENXIO/ENODEV (no driver behind it) - and the userspace driver against the node's.
  - Changes nothing, so it runs in check mode too. The module itself uses only the standard library.
  - With O(record_fingerprint), a passing verification outside check mode is kept in the venv
    (C(gpufleet-verified.json), with that fingerprint and the time), so that a later run whose inputs give the
    same fingerprint may reuse it (the verify role's C(verify_max_age)). That record is its only write, and it
    is not reported as a change.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - gpufleet.proxmox.read_only
options:
  venv:
    description: The venv (its directory or the symlink to it).
    type: path
    default: /root/venv
  expect_torch_version:
    description: C(torch.__version__) exactly (V(2.11.0+cu128)).
    type: str
  expect_cuda_version:
    description: C(torch.version.cuda) (V(12.8)).
    type: str
  require_cuda:
    description: Fail unless C(torch.cuda.is_available()).
    type: bool
    default: false
  expect_device_count:
    description: C(torch.cuda.device_count()).
    type: int
  expect_cudnn_version:
    description: C(torch.backends.cudnn.version()) (V(91900) for 9.19.0).
    type: int
  expect_nccl_version:
    description: C(torch.cuda.nccl.version()) as a dotted string (V(2.28.9)).
    type: str
  expect_driver_version:
    description: The node's kernel module version (V(580.95.05)); the userspace driver must be the same.
    type: str
  smoke:
    description: V(matmul) runs a bf16 matmul on each device, checked against the CPU, and measures bf16 TFLOPS.
    type: str
    choices: [none, matmul]
    default: none
  min_tflops:
    description: A floor for each device's measured bf16 TFLOPS (with O(smoke=matmul)).
    type: float
  compile_check:
    description: Compile and run a tiny function with C(torch.compile), in one thread.
    type: bool
    default: false
  collective:
    description:
      - Run an all_reduce across the container's GPUs, one process each (NCCL, its transports read from its debug
        output), or across two CPU processes with gloo where there is no GPU; the check C(allreduce) in RV(checks).
    type: bool
    default: false
  collective_timeout:
    description: Seconds the collective may take before its ranks are stopped and it fails.
    type: int
    default: 60
  collective_bytes:
    description: The size of the all_reduce (default 64 MiB with NCCL, 8 MiB with gloo).
    type: int
  min_allreduce_gbps:
    description: A floor for the collective's algorithm bandwidth in GB/s (as nccl-tests reports it).
    type: float
  train_step:
    description: The check C(train_step) - a short, fixed training step of a small transformer on each GPU (bf16), or
      on the CPU where there is none (fp32), in tokens per second.
    type: bool
    default: false
  baseline_path:
    description:
      - Where the container keeps its training step's baseline (with O(train_step)) - the first passing verification's
        result is written there (not in check mode), and a later one that falls more than O(max_throughput_drop)
        below it is the failure C(throughput), naming the drop and what changed since (venv, torch, driver).
    type: path
  max_throughput_drop:
    description: The fraction of the baseline the training step may fall below it.
    type: float
    default: 0.15
  min_shm_mb_per_gpu:
    description: The check C(shm) - C(/dev/shm) must hold this many MiB per GPU (for one where there is none); 0 skips it.
    type: int
    default: 0
  min_nofile:
    description:
      - The check C(limits) - the container's open files (the hard limit of its init, which LXC sets and no process in
        the container can raise its own above) must be at least this many; 0 skips it.
    type: int
    default: 0
  memlock_unlimited:
    description: The check C(limits) - the container's locked memory must be unlimited (what NCCL over RDMA needs).
    type: bool
    default: false
  compile_backend:
    description: The C(torch.compile) backend for O(compile_check).
    type: str
    default: inductor
  dev_dir:
    description: Where the device nodes are, for the diagnosis.
    type: path
    default: /dev
  timeout:
    description: Seconds the probe may take.
    type: int
    default: 300
  user:
    description:
      - A user of the container (a name or a uid) who must be able to open every C(/dev/nvidia*) node, as a training
        job run by that user must; each node it cannot open (EACCES, EPERM) is a failure C(device_access).
      - PVE makes a passed-through node C(0660) root:root unless its devN entry says otherwise, so a check run as
        root alone passes where every other user gets EACCES.
    type: str
  record_fingerprint:
    description:
      - The caller's fingerprint of everything this verification depends on (the venv, the driver, the devices,
        the expectations). Given, a passing verification is recorded in the venv under it.
    type: str
'''

EXAMPLES = r'''
- name: Verify the training venv
  gpufleet.proxmox.torch_verify:
    venv: /root/venv
    expect_torch_version: 2.11.0+cu128
    expect_cuda_version: "12.8"
    require_cuda: true
    expect_device_count: 4
    expect_cudnn_version: 91900
    expect_nccl_version: 2.28.9
    expect_driver_version: 580.95.05
    smoke: matmul
'''

RETURN = r'''
recorded:
  description: Whether this passing verification was recorded in the venv (O(record_fingerprint)).
  returned: when recorded
  type: bool
python_version:
  description: The version of the venv's Python that ran the verification (C(3.13.5)).
  returned: when the probe runs
  type: str
torch_version:
  description: C(torch.__version__).
  returned: when torch imports
  type: str
cuda_version:
  description: C(torch.version.cuda) (null for a CPU build).
  returned: when torch imports
  type: str
cuda_available:
  description: C(torch.cuda.is_available()).
  returned: when torch imports
  type: bool
device_count:
  description: C(torch.cuda.device_count()).
  returned: when torch imports
  type: int
devices:
  description: Per device - index, name, capability, memory_bytes, arch_supported; with the smoke test also
    matmul_rel_error and bf16_tflops.
  returned: when torch imports
  type: list
  elements: dict
cudnn_version:
  description: C(torch.backends.cudnn.version()).
  returned: when torch imports
  type: int
nccl_version:
  description: NCCL's version, dotted.
  returned: when torch imports
  type: str
driver_version:
  description: The userspace driver's version (from the loaded libcuda.so.1's file name).
  returned: when torch imports
  type: str
throughput:
  description: With O(baseline_path), the training step's tokens_per_s (the slowest device's), the baseline as kept
    (tokens_per_s, step, device, torch_version, driver_version, venv, recorded_at) and ratio (null where not compared).
  returned: when the training step ran
  type: dict
baseline_recorded:
  description: Whether this verification's training step was kept as the container's baseline.
  returned: with O(baseline_path), when the verification passed and not in check mode
  type: bool
checks:
  description:
    - Each CUDA library torch relies on beyond cuBLAS, exercised on each device at its first real call - C(cudnn_conv)
      (a convolution forward and backward against the CPU's) and C(cusparselt_24) (a 2:4 sparse matmul where the venv
      has cuSPARSELt); with O(collective), C(allreduce) (backend, world, algbw_gbps, busbw_gbps, and with NCCL the
      transports it chose, its warnings and notes on a fall back from peer to peer); with O(min_shm_mb_per_gpu),
      C(shm) (bytes, floor_bytes); with O(train_step), C(train_step) (tokens_per_s, step); C(device_order)
      (bus_ids, order - the GPUs as CUDA numbers them, with the C(CUDA_DEVICE_ORDER) the venv's activate exports,
      must be in PCI bus order, as C(nvidia-smi) numbers them; not applicable with fewer than two); with
      O(min_nofile) or O(memlock_unlimited), C(limits) (init - the soft and hard C(nofile) and C(memlock) of the
      container's init).
    - Each has name, device, status (ok, failed or not_applicable), why (when not applicable), error, what the library
      printed on stderr during it, rel_error and seconds; a failed one is also a failure with why.
  returned: when torch imports
  type: list
  elements: dict
timings:
  description: Seconds for the import, CUDA initialisation, compile check and the whole probe.
  returned: always
  type: dict
failures:
  description: Every failed expectation - check, expected, actual (and device, why).
  returned: always
  type: list
  elements: dict
device_access:
  description: With O(user), that user and what opening each C(/dev/nvidia*) node gave it (nodes, by path).
  returned: when O(user) is given
  type: dict
diagnosis:
  description: Device nodes and what opening each gives (open, why), missing nodes, and notes in words.
  returned: when CUDA is unavailable, devices are short or the driver differs
  type: dict
unresolved_libraries:
  description: When torch does not import, the venv's shared libraries that do not resolve (soname, needed_by,
    provided_by).
  returned: when torch does not import
  type: list
  elements: dict
missing_requirements:
  description: When torch does not import, the distributions that an installed one requires and that are not
    installed (name, requirement, required_by), each also a failure C(requirement).
  returned: when torch does not import
  type: list
  elements: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _torch_probe, _verify_record


def main():
    module = AnsibleModule(argument_spec=dict(
        venv=dict(type='path', default='/root/venv'), expect_torch_version=dict(type='str'),
        expect_cuda_version=dict(type='str'), require_cuda=dict(type='bool', default=False),
        expect_device_count=dict(type='int'), expect_cudnn_version=dict(type='int'),
        expect_nccl_version=dict(type='str'), expect_driver_version=dict(type='str'),
        smoke=dict(type='str', choices=['none', 'matmul'], default='none'), min_tflops=dict(type='float'),
        compile_check=dict(type='bool', default=False), compile_backend=dict(type='str', default='inductor'),
        collective=dict(type='bool', default=False), collective_timeout=dict(type='int', default=60),
        collective_bytes=dict(type='int'), min_allreduce_gbps=dict(type='float'),
        min_shm_mb_per_gpu=dict(type='int', default=0), train_step=dict(type='bool', default=False),
        min_nofile=dict(type='int', default=0), memlock_unlimited=dict(type='bool', default=False),
        baseline_path=dict(type='path'), max_throughput_drop=dict(type='float', default=0.15),
        dev_dir=dict(type='path', default='/dev'), timeout=dict(type='int', default=300),
        record_fingerprint=dict(type='str'), user=dict(type='str')),
        supports_check_mode=True)
    result = _torch_probe.verify(module.params['venv'], module.params, module.params['dev_dir'])
    if result['failures']:
        module.fail_json(msg='torch_verify: {0}'.format(_torch_probe.message(result)), changed=False, **result)
    if module.params['record_fingerprint'] and not module.check_mode:
        try:
            _verify_record.write_record(module.params['venv'], module.params['record_fingerprint'], result)
            result['recorded'] = True
        except (IOError, OSError) as e:
            module.warn('torch_verify: the verification passed but could not be recorded: {0}'.format(e))
    if module.params['baseline_path'] and not module.check_mode:
        try:
            result['baseline_recorded'] = _torch_probe.record_baseline(result, module.params['baseline_path'])
        except (IOError, OSError) as e:
            module.warn('torch_verify: the training step\'s baseline could not be kept: {0}'.format(e))
    module.exit_json(changed=False, **result)


if __name__ == '__main__':
    main()
