"""The verification probe (torch_verify's work) without torch: a venv whose probe cannot run, or dies, is a failure
named 'probe' with what happened, never a verification without failures; a venv without torch fails its import."""

import json
import os

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _torch_probe

from fixtures import make_venv

PARAMS = {'expect_torch_version': '2.11.0+cu128', 'expect_device_count': 1, 'require_cuda': True, 'timeout': 60}


def test_a_path_that_is_no_venv_is_a_probe_failure(tmp_path):
    result = _torch_probe.verify(str(tmp_path / 'none'), PARAMS, dev_dir=str(tmp_path))
    assert result['failures'][0] == {'check': 'probe', 'expected': 'the probe runs',
                                     'actual': '{0} has no bin/python: not a venv'.format(tmp_path / 'none')}


def test_a_probe_that_dies_is_a_probe_failure_with_its_last_words(tmp_path):
    venv = tmp_path / 'venv'
    (venv / 'bin').mkdir(parents=True)
    python = venv / 'bin' / 'python'
    python.write_text('#!/bin/sh\necho "Segmentation fault" >&2\nexit 139\n')
    python.chmod(0o755)
    result = _torch_probe.verify(str(venv), PARAMS, dev_dir=str(tmp_path))
    assert result['failures'][0] == {'check': 'probe', 'expected': 'the probe runs',
                                     'actual': 'the probe died (exit 139): Segmentation fault'}
    assert 'torch_version' not in result


def test_a_venv_without_torch_fails_its_import(tmp_path):
    venv, _site = make_venv(tmp_path / 'venv')
    result = _torch_probe.verify(venv, PARAMS, dev_dir=str(tmp_path))
    assert [f['check'] for f in result['failures']][:1] == ['import']
    assert "No module named 'torch'" in result['failures'][0]['actual']
    assert os.path.isdir(venv)


# torch as a CUDA build on one H100 whose cuDNN fails at its first convolution the way cuDNN 9 fails when a
# sub-library of the venv's nvidia-cudnn wheel is gone (the message and stderr line as real runs print them:
# ultralytics/ultralytics#17170, nvidia-cosmos/cosmos-transfer1#152): every call the probe makes, the real
# probe code, run by the venv's interpreter
CUDA_TORCH = r'''
import contextlib, sys, types
__version__ = "2.11.0+cu128"
version = types.SimpleNamespace(cuda="12.8")
class device:
    def __init__(self, kind, index=None):
        self.type, self.index = kind, index
class Tensor:
    def __init__(self, where="cpu"):
        self.device, self.grad = where, None
    def _same(self, *a, **k):
        return Tensor(self.device)
    clone = requires_grad_ = square = sum = detach = float = half = _same
    def to(self, where, *a):
        return Tensor(getattr(where, "type", where))
    def cpu(self):
        return Tensor("cpu")
    def backward(self):
        pass
class Generator:
    def manual_seed(self, seed):
        return self
def randn(*shape, generator=None):
    return Tensor()
rand = randn
def _conv2d(x, w, padding=0):
    if x.device == "cuda":
        sys.stderr.write("Unable to load any of {libcudnn_engines_precompiled.so.9.19.0, "
                         "libcudnn_engines_precompiled.so.9.19, libcudnn_engines_precompiled.so.9, "
                         "libcudnn_engines_precompiled.so}\n")
        raise RuntimeError("CUDNN_BACKEND_TENSOR_DESCRIPTOR cudnnFinalize failedptrDesc->finalize() cudnn_status: "
                           "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED")
    return Tensor()
nn = types.SimpleNamespace(functional=types.SimpleNamespace(conv2d=_conv2d))
backends = types.SimpleNamespace(
    cudnn=types.SimpleNamespace(version=lambda: 91900, is_available=lambda: True,
                                flags=lambda **k: contextlib.nullcontext()),
    cusparselt=types.SimpleNamespace(is_available=lambda: False))
# STANDIN_GPUS of them (one unless said), numbered as CUDA numbers them: fastest first (the one at bus 0x41 here)
# unless CUDA_DEVICE_ORDER=PCI_BUS_ID
import os
def _props(i):
    buses = [0x01, 0x41] if os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" else [0x41, 0x01]
    return types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=85 << 30,
                                 pci_bus_id=buses[i], pci_device_id=0, pci_domain_id=0)
cuda = types.SimpleNamespace(
    is_available=lambda: True, device_count=lambda: int(os.environ.get("STANDIN_GPUS", "1")),
    get_arch_list=lambda: ["sm_80", "sm_90"], get_device_properties=_props,
    nccl=types.SimpleNamespace(version=lambda: (2, 28, 9)), synchronize=lambda d=None: None)
'''


def cuda_venv(tmp_path, cusparselt=True):
    from fixtures import install
    venv, site = make_venv(tmp_path / 'venv')
    install(site, 'torch', '2.11.0+cu128', {'torch/__init__.py': CUDA_TORCH.encode()})
    # the cuDNN wheel with the sub-library cuDNN could not load gone (its RECORD still names it)
    install(site, 'nvidia-cudnn-cu13', '9.19.0.56', {'nvidia/cudnn/lib/libcudnn.so.9': b'\x7fELF',
                                                     'nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9': b'x' * 64})
    os.unlink(os.path.join(site, 'nvidia', 'cudnn', 'lib', 'libcudnn_engines_precompiled.so.9'))
    if cusparselt:
        install(site, 'nvidia-cusparselt-cu13', '0.8.0', {'nvidia/cusparselt/lib/libcusparseLt.so.0': b'\x7fELF'})
    return venv


def test_each_library_is_checked_at_its_first_real_call_and_a_failure_says_which_file_is_gone(tmp_path):
    venv = cuda_venv(tmp_path)
    result = _torch_probe.verify(venv, {'expect_torch_version': '2.11.0+cu128', 'timeout': 60}, dev_dir=str(tmp_path))
    assert [(c['name'], c.get('device'), c['status']) for c in result['checks']] == [
        ('cudnn_conv', 0, 'failed'), ('cusparselt_24', 0, 'failed'), ('device_order', None, 'not_applicable')]
    assert all(c['seconds'] >= 0 for c in result['checks'] if c['status'] != 'not_applicable')
    assert result['checks'][0]['stderr'].startswith('Unable to load any of {libcudnn_engines_precompiled.so.9.19.0,')
    assert 'stderr' not in result['checks'][1]
    cudnn, sparse = [f for f in result['failures'] if f['check'] in ('cudnn_conv', 'cusparselt_24')]
    assert cudnn == {
        'check': 'cudnn_conv', 'device': 0, 'expected': 'a cuDNN convolution forward and backward matches the CPU',
        'actual': 'RuntimeError: CUDNN_BACKEND_TENSOR_DESCRIPTOR cudnnFinalize failedptrDesc->finalize() cudnn_status: '
                  'CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED',
        'why': "libcudnn_engines_precompiled.so.9.19.0 does not load: a file of the venv's distribution that ships it "
               "is missing or unreadable (reinstall that distribution; a drift run repairs it); nvidia-cudnn-cu13 "
               "9.19.0.56 lacks nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9"}
    assert sparse['actual'] == 'torch.backends.cusparselt.is_available() is False: torch does not load cuSPARSELt'
    assert sparse['why'] == 'nvidia-cudnn-cu13 9.19.0.56 lacks nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9'
    assert result['broken_distributions'][0]['name'] == 'nvidia-cudnn-cu13'
    assert 'cudnn_conv: expected a cuDNN convolution' in _torch_probe.message(result)


def test_a_check_the_venv_or_the_device_cannot_run_is_not_applicable_with_the_reason(tmp_path):
    venv = cuda_venv(tmp_path, cusparselt=False)
    result = _torch_probe.verify(venv, {'timeout': 60}, dev_dir=str(tmp_path))
    (sparse,) = [c for c in result['checks'] if c['name'] == 'cusparselt_24']
    assert sparse == {'name': 'cusparselt_24', 'device': 0, 'status': 'not_applicable',
                      'why': 'the venv has no cuSPARSELt (no nvidia-cusparselt distribution)'}
    assert 'cusparselt_24' not in [f['check'] for f in result['failures']]


def test_a_cpu_build_reports_the_gpu_library_checks_as_not_applicable(tmp_path):
    venv = cuda_venv(tmp_path)
    site = os.path.join(venv, 'lib', os.listdir(os.path.join(venv, 'lib'))[0], 'site-packages')
    with open(os.path.join(site, 'torch', '__init__.py'), 'a') as fh:
        fh.write('version = types.SimpleNamespace(cuda=None)\ncuda.is_available = lambda: False\n')
    result = _torch_probe.verify(venv, {'timeout': 60}, dev_dir=str(tmp_path))
    assert result['checks'] == [
        {'name': name, 'status': 'not_applicable', 'why': 'no CUDA device: torch is a CPU build'}
        for name in ('cudnn_conv', 'cusparselt_24', 'device_order')]
    assert result['failures'] == []


def test_what_a_library_said_names_why_it_failed():
    why = _torch_probe.library_why
    assert why('RuntimeError: CUDNN_BACKEND_TENSOR_DESCRIPTOR cudnnFinalize failed cudnn_status: '
               'CUDNN_STATUS_NOT_INITIALIZED').startswith('cuDNN did not initialise')
    assert why('', 'Could not load library libcudnn_cnn_train.so.8. Error: libcudnn_cnn_train.so.8: cannot open shared '
               'object file: No such file or directory').startswith('libcudnn_cnn_train.so.8 does not load')
    assert 'newer CUDA' in why('RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version')
    assert 'architecture' in why('RuntimeError: CUDA error: no kernel image is available for execution on the device')
    assert 'exhausted' in why('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB')
    assert why('RuntimeError: something else') is None


# NCCL's debug lines as real runs print them (NVIDIA/nccl#952, #1518, #1589; pytorch/ci-infra#490)
NCCL_P2P = ('gpu0:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read\n'
            'gpu0:123:456 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/direct pointer\n')
NCCL_SHM = 'gpu0:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\n'
NCCL_NET = ('gpu0:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/3\n'
            'gpu0:123:456 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [receive] via NET/IB/0/GDRDMA\n')
NCCL_SHM_FULL = ('gpu0:123:456 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-WU88OE to '
                 '9637892 bytes, error: No space left on device (28)\n')


def test_nccls_transports_are_read_and_a_fall_back_from_peer_to_peer_is_named():
    assert _torch_probe.nccl_paths(NCCL_P2P, 2) == {'transports': ['P2P'], 'warnings': [], 'notes': []}
    shm = _torch_probe.nccl_paths(NCCL_SHM, 2)
    assert shm['transports'] == ['SHM'] and shm['notes'] == [
        'NCCL moved data between the GPUs through shared memory, not peer to peer: P2P is blocked between them (PCIe '
        "ACS or the IOMMU on the node's path, or NCCL_P2P_DISABLE)"]
    net = _torch_probe.nccl_paths(NCCL_NET, 2)
    assert net['transports'] == ['NET/IB', 'NET/Socket'] and net['notes'][0].startswith(
        'NCCL went through the network inside one container')
    full = _torch_probe.nccl_paths(NCCL_SHM_FULL, 2)
    assert full['warnings'] == [NCCL_SHM_FULL.strip()]
    assert full['notes'] == ["/dev/shm is too small for NCCL's shared-memory transport (it could not grow "
                             '/dev/shm/nccl-WU88OE to 9637892 bytes): give the container a larger /dev/shm']
    assert _torch_probe.nccl_paths(NCCL_SHM, 1)['notes'] == []  # one GPU: no peer to speak to


# torch.distributed of the stand-in CUDA build: NCCL's ranks fail at their first collective as they do when
# /dev/shm cannot hold NCCL's segments (the warning, then torch's error, as real runs print them)
DISTRIBUTED = r'''
import sys
def is_available():
    return True
def is_nccl_available():
    return True
def init_process_group(backend, **kw):
    sys.stdout.write("gpu0:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\n")
    sys.stdout.write("gpu0:123:456 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-WU88OE "
                     "to 9637892 bytes, error: No space left on device (28)\n")
    sys.stdout.flush()
    raise RuntimeError("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system "
                       "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.9")
def destroy_process_group():
    pass
'''


def test_a_collective_whose_ranks_fail_says_so_with_what_nccl_said(tmp_path):
    venv = cuda_venv(tmp_path)
    site = os.path.join(venv, 'lib', os.listdir(os.path.join(venv, 'lib'))[0], 'site-packages')
    with open(os.path.join(site, 'torch', '__init__.py'), 'a') as fh:
        fh.write('cuda.device_count = lambda: 2\n')
    with open(os.path.join(site, 'torch', 'distributed.py'), 'w') as fh:
        fh.write(DISTRIBUTED)
    result = _torch_probe.verify(venv, {'timeout': 60, 'collective': True, 'collective_timeout': 30},
                                 dev_dir=str(tmp_path))
    (check,) = [c for c in result['checks'] if c['name'] == 'allreduce']
    assert check['backend'] == 'nccl' and check['world'] == 2 and check['status'] == 'failed'
    assert check['error'].startswith('rank 0 failed: RuntimeError: NCCL error in: ')
    assert check['transports'] == ['SHM'] and 'output' not in check
    (failure,) = [f for f in result['failures'] if f['check'] == 'allreduce']
    assert failure['why'].startswith("/dev/shm is too small for NCCL's shared-memory transport")
    assert 'through shared memory, not peer to peer' in failure['why']


def test_a_collective_that_never_ends_is_stopped_at_its_bound(tmp_path):
    venv = cuda_venv(tmp_path)
    site = os.path.join(venv, 'lib', os.listdir(os.path.join(venv, 'lib'))[0], 'site-packages')
    with open(os.path.join(site, 'torch', 'distributed.py'), 'w') as fh:
        fh.write(DISTRIBUTED.replace('    raise RuntimeError(', '    import time; time.sleep(600)\n    raise RuntimeError('))
    result = _torch_probe.verify(venv, {'timeout': 60, 'collective': True, 'collective_timeout': 2},
                                 dev_dir=str(tmp_path))
    (failure,) = [f for f in result['failures'] if f['check'] == 'allreduce']
    assert failure['actual'] == 'rank(s) 0 did not finish the collective in 2 s'
    assert result['timings']['total_s'] < 30


def test_a_dev_shm_smaller_than_the_gpus_need_is_a_finding_that_says_why(tmp_path):
    venv = cuda_venv(tmp_path)
    have = os.statvfs('/dev/shm')
    have_mb = have.f_frsize * have.f_blocks >> 20
    result = _torch_probe.verify(venv, {'timeout': 60, 'min_shm_mb_per_gpu': have_mb + 1}, dev_dir=str(tmp_path))
    (shm,) = [c for c in result['checks'] if c['name'] == 'shm']
    assert shm['status'] == 'failed' and shm['floor_bytes'] == (have_mb + 1) << 20  # one GPU
    (failure,) = [f for f in result['failures'] if f['check'] == 'shm']
    assert failure['expected'] == '>= {0} MiB'.format(have_mb + 1) and failure['actual'] == '{0} MiB'.format(have_mb)
    assert failure['why'].startswith("NCCL's shared-memory transport")
    result = _torch_probe.verify(venv, {'timeout': 60, 'min_shm_mb_per_gpu': 1}, dev_dir=str(tmp_path))
    assert [c['status'] for c in result['checks'] if c['name'] == 'shm'] == ['ok']


def step_result(venv, tokens, device='NVIDIA H100 80GB HBM3', driver='580.95.05'):
    return {'venv': str(venv), 'failures': [], 'torch_version': '2.11.0+cu128', 'driver_version': driver,
            'devices': [{'index': 0, 'name': device}, {'index': 1, 'name': device}],
            'checks': [{'name': 'train_step', 'device': 0, 'status': 'ok', 'tokens_per_s': tokens, 'step': 'bf16'},
                       {'name': 'train_step', 'device': 1, 'status': 'ok', 'tokens_per_s': tokens + 500, 'step': 'bf16'}]}


def test_the_first_passing_training_step_is_the_baseline_and_a_fall_below_it_names_what_changed(tmp_path):
    base = str(tmp_path / 'var' / 'lib' / 'gpufleet' / 'throughput-baseline.json')
    first = step_result(tmp_path / 'venv-a', 20000.0)
    _torch_probe.throughput(first, base)
    assert first['throughput'] == {'tokens_per_s': 20000.0, 'baseline': None, 'ratio': None} and not first['failures']
    assert _torch_probe.record_baseline(first, base, now=1796601600) is True
    kept = json.loads(open(base).read())
    assert kept == {'tokens_per_s': 20000.0, 'step': 'bf16', 'device': 'NVIDIA H100 80GB HBM3',
                    'torch_version': '2.11.0+cu128', 'driver_version': '580.95.05', 'venv': str(tmp_path / 'venv-a'),
                    'recorded_at': '2026-12-07T00:00:00Z'}
    assert _torch_probe.record_baseline(step_result(tmp_path / 'venv-a', 30000.0), base) is False  # kept, not raised
    # the incident: 20 to 12.8 Ktok/s after the venv was "cleaned"
    later = step_result(tmp_path / 'venv-b', 12800.0)
    _torch_probe.throughput(later, base)
    assert later['throughput']['ratio'] == 0.64
    assert later['failures'] == [{
        'check': 'throughput', 'expected': '>= 17000 tokens/s (15% below the baseline 20000.0 of 2026-12-07T00:00:00Z)',
        'actual': 12800.0, 'why': '36% below the baseline; since it: venv {0} -> {1}'.format(
            tmp_path / 'venv-a', tmp_path / 'venv-b')}]
    same = step_result(tmp_path / 'venv-a', 12800.0)
    _torch_probe.throughput(same, base, drop=0.5)
    assert same['failures'] == []  # within the drop asked for
    _torch_probe.throughput(same, base)
    assert same['failures'][0]['why'].startswith('36% below the baseline; since it: nothing the verification sees')
    within = step_result(tmp_path / 'venv-b', 17500.0)
    _torch_probe.throughput(within, base)
    assert within['failures'] == [] and within['throughput']['ratio'] == 0.875


def test_a_baseline_of_other_hardware_is_not_compared_and_is_replaced(tmp_path):
    base = str(tmp_path / 'baseline.json')
    assert _torch_probe.record_baseline(step_result(tmp_path, 20000.0), base)
    moved = step_result(tmp_path, 9000.0, device='NVIDIA A100-SXM4-80GB')
    _torch_probe.throughput(moved, base)
    assert moved['failures'] == [] and moved['throughput']['ratio'] is None
    assert _torch_probe.record_baseline(moved, base) is True
    assert json.loads(open(base).read())['device'] == 'NVIDIA A100-SXM4-80GB'
    failed = dict(step_result(tmp_path, 1.0), checks=[{'name': 'train_step', 'status': 'failed', 'error': 'x'}])
    _torch_probe.throughput(failed, base)
    assert 'throughput' not in failed and _torch_probe.record_baseline(failed, base) is False


def test_gpus_numbered_otherwise_than_nvidia_smi_fail_unless_the_venvs_activate_orders_them(tmp_path, monkeypatch):
    venv = cuda_venv(tmp_path)
    monkeypatch.setenv('STANDIN_GPUS', '2')
    monkeypatch.setenv('CUDA_DEVICE_ORDER', 'FASTEST_FIRST')  # the controller's own is not the job's
    result = _torch_probe.verify(venv, {'timeout': 60}, dev_dir=str(tmp_path))
    (order,) = [c for c in result['checks'] if c['name'] == 'device_order']
    assert order['status'] == 'ok' and order['order'] == 'PCI_BUS_ID' and order['bus_ids'] == [
        '0000:01:00.0', '0000:41:00.0']
    assert 'device_order' not in [f['check'] for f in result['failures']]
    # an activate without the line: the job gets CUDA's own order, and the check names it
    with open(os.path.join(venv, 'bin', 'activate'), 'w') as fh:
        fh.write('VIRTUAL_ENV={0}\nexport VIRTUAL_ENV\n'.format(venv))
    result = _torch_probe.verify(venv, {'timeout': 60}, dev_dir=str(tmp_path))
    (failure,) = [f for f in result['failures'] if f['check'] == 'device_order']
    assert failure['actual'] == ('CUDA numbers the GPUs 0000:41:00.0, 0000:01:00.0, not in PCI bus order as '
                                 'nvidia-smi does (CUDA_DEVICE_ORDER is not set)')
    assert 'CUDA_DEVICE_ORDER=PCI_BUS_ID' in failure['why']


LIMITS = """Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max open files            1024                 {nofile}               files
Max locked memory         8388608              {memlock}              bytes
"""


def test_container_limits_under_what_its_jobs_need_fail_naming_the_fleet_entry_keys(tmp_path):
    venv = cuda_venv(tmp_path)
    limits = tmp_path / 'limits'
    limits.write_text(LIMITS.format(nofile=4096, memlock=8388608))
    result = _torch_probe.verify(venv, {'timeout': 60, 'min_nofile': 65536, 'memlock_unlimited': True,
                                        'limits_file': str(limits)}, dev_dir=str(tmp_path))
    (check,) = [c for c in result['checks'] if c['name'] == 'limits']
    assert check['status'] == 'failed' and check['init']['nofile'] == {'soft': '1024', 'hard': '4096'}
    (failure,) = [f for f in result['failures'] if f['check'] == 'limits']
    assert failure['actual'] == ("the container's open files are limited to 4096, under 65536; the container's "
                                 "locked memory is limited to 8388608 bytes where RDMA needs it unlimited")
    assert 'lxc.prlimit' in failure['why'] and 'rdma' in failure['why']
    limits.write_text(LIMITS.format(nofile=524288, memlock='unlimited'))
    result = _torch_probe.verify(venv, {'timeout': 60, 'min_nofile': 65536, 'memlock_unlimited': True,
                                        'limits_file': str(limits)}, dev_dir=str(tmp_path))
    assert [c['status'] for c in result['checks'] if c['name'] == 'limits'] == ['ok']
    # not asked: not checked
    result = _torch_probe.verify(venv, {'timeout': 60}, dev_dir=str(tmp_path))
    assert 'limits' not in [c['name'] for c in result['checks']]
