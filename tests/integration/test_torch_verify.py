"""torch_verify and the verify role on lab containers with the real CPU torch: the facts, every wrong
expectation at once, the device diagnosis (ENXIO through passthrough, nodes missing without it, EPERM where
the cgroup denies), a missing shared library named, and a hung probe timed out."""

import json
import os
import subprocess

import pytest

from conftest import Pve, _api, gpu_node, site
from test_gpu_container_role import entry
from test_pct_connection import inventory, run

pytestmark = pytest.mark.lab

GPU, CPU_ONLY = 331, 332
BASELINE = '/var/lib/gpufleet/throughput-baseline.json'
# what training jobs need of the GPU container, asked in its entry (written into its config, set when LXC starts it)
# (rdma: true, locked memory unlimited, is not asked: the lab's daemon, which starts its containers, has 8 MiB and no
# CAP_SYS_RESOURCE to raise it, and LXC refuses to start a container it cannot give its limits)
FLEET = [entry(GPU, 'verify-gpu', [0, 1], memory=2048, shm_mb=768, nofile=8192),
         entry(CPU_ONLY, 'verify-cpu', [], memory=2048)]


@pytest.fixture(scope='module')
def fleet(tmp_path_factory, creds, lab):
    """Both containers with their venvs and the verify stage, made once for this module."""
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.extend([GPU, CPU_ONLY])
    tmp = tmp_path_factory.mktemp('verify-site')
    reports = tmp / 'reports'
    result = site(tmp, FLEET, venv=True, verify_report_dir=str(reports))
    assert result.rc == 0, result.stdout[-4000:]
    yield {'site': result, 'reports': reports, 'pve': pve}
    pve.cleanup()


def verify(tmp_path, creds, vmid, fail=False, **options):
    options.setdefault('venv', '/root/venv')
    inv = inventory(tmp_path, creds, vmid, ansible_pct_local=True, ansible_pct_node=None)
    task = {'gpufleet.proxmox.torch_verify': options, 'ignore_errors': True}
    res = run(tmp_path, inv, [task]).task(0, 'ct')
    assert bool(res.get('failed')) == fail, res
    assert res['changed'] is False
    return res


def test_the_verify_stage_wrote_reports(fleet):
    summary = json.loads((fleet['reports'] / 'summary.json').read_text())
    assert summary['ok'] is True
    rows = {r['host']: r for r in summary['containers']}
    assert set(rows) == {'verify-gpu', 'verify-cpu'}
    assert rows['verify-gpu']['torch_version'] == '2.13.0+cpu' and rows['verify-gpu']['profile'] == 'cpu'
    assert rows['verify-gpu']['vmid'] == GPU and rows['verify-gpu']['venv_findings'] == 0
    report = json.loads((fleet['reports'] / 'verify-gpu.json').read_text())
    assert report['expected']['torch_version'] == '2.13.0+cpu' and report['audit']['healthy'] is True
    assert oct(os.stat(fleet['reports'] / 'verify-gpu.json').st_mode & 0o777) == '0o600'
    # what a training job needs beyond import, run for real where the lab can (gloo between two CPU processes of the
    # container, its /dev/shm), and the CUDA libraries' checks said not to apply, and why
    checks = dict((c['name'], c) for c in report['torch']['checks'])
    assert sorted(checks) == ['allreduce', 'cudnn_conv', 'cusparselt_24', 'device_order', 'limits', 'shm', 'train_step']
    assert checks['device_order'] == {'name': 'device_order', 'status': 'not_applicable',
                                      'why': 'no CUDA device: torch is a CPU build'}
    # the entry's shm_mb, nofile and rdma, as the container's init and /dev/shm have them
    assert checks['limits']['status'] == 'ok', checks['limits']
    assert checks['limits']['init']['nofile'] == {'soft': '8192', 'hard': '8192'}
    assert checks['shm']['bytes'] == 768 << 20
    assert checks['cudnn_conv']['status'] == 'not_applicable' and checks['cudnn_conv']['why'] == \
        'no CUDA device: torch is a CPU build'
    allreduce = checks['allreduce']
    assert allreduce['status'] == 'ok' and allreduce['backend'] == 'gloo' and allreduce['world'] == 2, allreduce
    assert allreduce['algbw_gbps'] > 0 and allreduce['busbw_gbps'] > 0
    assert checks['shm']['status'] == 'ok' and checks['shm']['floor_bytes'] == 256 << 20
    cpu = dict((c['name'], c) for c in json.loads((fleet['reports'] / 'verify-cpu.json').read_text())['torch']['checks'])
    assert cpu['limits']['status'] == 'ok' and 'memlock' in cpu['limits']['init'], cpu['limits']
    assert checks['train_step']['status'] == 'ok' and checks['train_step']['tokens_per_s'] > 0
    assert checks['train_step']['step'] == 'fp32 cpu: d=64 layers=2 batch=4 seq=64'
    # the first passing one is the container's baseline, kept outside the venv
    kept = json.loads(subprocess.run(['pct', 'exec', str(GPU), '--', 'cat', BASELINE], capture_output=True, text=True,
                                     check=True).stdout)
    assert kept['tokens_per_s'] == checks['train_step']['tokens_per_s'] and kept['device'] == 'cpu'
    assert kept['venv'].startswith('/opt/gpufleet/venvs/') and kept['torch_version'] == '2.13.0+cpu'


def test_passing_expectations_return_the_facts(fleet, tmp_path, creds):
    res = verify(tmp_path, creds, GPU, expect_torch_version='2.13.0+cpu', expect_device_count=0,
                 expect_driver_version='580.95.05', compile_check=True, compile_backend='aot_eager')
    assert res['failures'] == [] and res['torch_version'] == '2.13.0+cpu' and res['cuda_version'] is None
    assert res['cuda_available'] is False and res['device_count'] == 0 and res['devices'] == []
    assert res['driver_version'] == '580.95.05'  # the node's driver, bound in by gpu_container
    assert res['compile_ok'] is True and res['timings']['import_s'] > 0 and 'diagnosis' not in res
    # each CUDA library's check, not applicable to the lab's CPU build, says so and why
    assert res['checks'] == [{'name': name, 'status': 'not_applicable', 'why': 'no CUDA device: torch is a CPU build'}
                             for name in ('cudnn_conv', 'cusparselt_24', 'device_order')]


def record(vmid):
    out = subprocess.run(['pct', 'exec', str(vmid), '--', 'cat', '/root/venv/gpufleet-verified.json'],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_a_passing_verification_is_recorded_under_its_fingerprint(fleet, tmp_path, creds):
    by_site = record(GPU)  # the verify stage recorded it under the role's fingerprint
    assert len(by_site['fingerprint']) == 64 and by_site['result']['torch_version'] == '2.13.0+cpu'
    res = verify(tmp_path, creds, GPU, expect_torch_version='2.13.0+cpu', record_fingerprint='fp-1')
    assert res['recorded'] is True
    now = record(GPU)
    assert now['fingerprint'] == 'fp-1' and now['verified_at'] >= by_site['verified_at']
    assert now['result']['failures'] == [] and now['result']['torch_version'] == '2.13.0+cpu'
    failed = verify(tmp_path, creds, GPU, fail=True, expect_torch_version='0.1', record_fingerprint='fp-2')
    assert 'recorded' not in failed and record(GPU) == now  # a failing verification is never recorded


def test_wrong_expectations_fail_all_at_once(fleet, tmp_path, creds):
    res = verify(tmp_path, creds, GPU, fail=True, expect_torch_version='2.11.0+cu128', expect_cuda_version='12.8',
                 expect_cudnn_version=91900, expect_nccl_version='2.28.9', expect_driver_version='570.1')
    assert res['failures'] == [
        {'check': 'torch_version', 'expected': '2.11.0+cu128', 'actual': '2.13.0+cpu'},
        {'check': 'cuda_version', 'expected': '12.8', 'actual': None},
        {'check': 'cudnn_version', 'expected': 91900, 'actual': None},
        {'check': 'nccl_version', 'expected': '2.28.9', 'actual': None},
        {'check': 'driver_version', 'expected': '570.1', 'actual': '580.95.05'}]
    assert 'torch_version: expected 2.11.0+cu128, got 2.13.0+cpu' in res['msg']
    assert 'userspace driver 580.95.05 but the node runs kernel module 570.1' in res['msg']


def test_require_cuda_diagnoses_passed_through_stand_ins_as_enxio(fleet, tmp_path, creds):
    res = verify(tmp_path, creds, GPU, fail=True, require_cuda=True, expect_device_count=2)
    (cuda,) = [f for f in res['failures'] if f['check'] == 'cuda_available']
    assert 'CPU build' in cuda['why']
    nodes = {os.path.basename(n['path']): n['open'] for n in res['diagnosis']['nodes']}
    gpus = dict((os.path.basename(gpu_node(i)), 'ENXIO') for i in (0, 1))  # GPUs 0 and 1: the driver's minors
    assert nodes == dict(gpus, **{'nvidiactl': 'ENXIO', 'nvidia-uvm': 'ENXIO', 'nvidia-uvm-tools': 'ENXIO',
                                  'nvidia-modeset': 'ENXIO'})
    assert any('no driver behind the node' in n for n in res['diagnosis']['notes'])


def test_a_container_without_passthrough_has_no_nodes(fleet, tmp_path, creds):
    res = verify(tmp_path, creds, CPU_ONLY, fail=True, require_cuda=True, expect_device_count=1)
    assert res['diagnosis']['nodes'] == []
    assert res['diagnosis']['notes'] == ['no /dev/nvidia* device nodes: the container has no GPU passthrough']


def test_a_node_the_cgroup_denies_is_eperm(fleet, tmp_path, creds, lab, node_ssh):
    pve = fleet['pve']
    conf = os.path.join(lab.root, 'etc', 'pve', 'nodes', 'pve1', 'lxc', '{0}.conf'.format(CPU_ONLY))
    line = 'lxc.mount.entry: /dev/nvidia5 dev/nvidia5 none bind,optional,create=file'
    pve.stop(CPU_ONLY)
    assert node_ssh("echo '{0}' >> {1}".format(line, conf)).returncode == 0
    pve.start(CPU_ONLY)
    try:
        res = verify(tmp_path, creds, CPU_ONLY, fail=True, require_cuda=True)
        assert res['diagnosis']['nodes'] == [{'path': '/dev/nvidia5', 'open': 'EPERM', 'why': (
            "the container's device cgroup denies it (passthrough or cgroup rules wrong)")}]
        assert res['diagnosis']['missing'] == ['nvidiactl', 'nvidia-uvm']
    finally:
        pve.stop(CPU_ONLY)
        node_ssh("sed -i '\\#{0}#d' {1}".format(line, conf))
        pve.start(CPU_ONLY)


def test_a_missing_library_is_named_with_its_distribution(fleet, tmp_path, creds):
    lib = '/root/venv/lib/python3.11/site-packages/torch/lib/libc10.so'
    assert subprocess.run(['pct', 'exec', str(GPU), '--', 'mv', lib, lib + '.away']).returncode == 0
    try:
        res = verify(tmp_path, creds, GPU, fail=True, expect_torch_version='2.13.0+cpu')
        assert res['failures'][0]['check'] == 'import' and 'libc10.so' in res['failures'][0]['actual']
        (c10,) = [u for u in res['unresolved_libraries'] if u['soname'] == 'libc10.so']
        assert c10['provided_by'] == ['torch'] and 'torch/lib/libtorch_cpu.so' in c10['needed_by']
        assert {'check': 'library', 'expected': 'libc10.so resolves'}.items() <= [
            f for f in res['failures'] if f['check'] == 'library'][0].items()
    finally:
        subprocess.run(['pct', 'exec', str(GPU), '--', 'mv', lib + '.away', lib], check=True)


def test_an_uninstalled_requirement_is_named_with_who_requires_it(fleet, tmp_path, creds):
    """As the incident's uninstall: a distribution torch requires is gone (its files and its dist-info), so torch
    does not import; the failure names it whole, with who requires it, beside the loader's one message."""
    site = '/root/venv/lib/python3.11/site-packages'
    away = 'mkdir -p /root/away && mv {0}/typing_extensions.py {0}/typing_extensions-*.dist-info /root/away/'.format(site)
    assert subprocess.run(['pct', 'exec', str(GPU), '--', 'sh', '-c', away]).returncode == 0
    try:
        res = verify(tmp_path, creds, GPU, fail=True, expect_torch_version='2.13.0+cpu')
        assert res['failures'][0]['check'] == 'import' and 'typing_extensions' in res['failures'][0]['actual']
        (gone,) = res['missing_requirements']
        assert gone['name'] == 'typing-extensions' and gone['required_by'] == ['torch'], gone
        (failure,) = [f for f in res['failures'] if f['check'] == 'requirement']
        assert failure['expected'] == gone['requirement'] + ' installed'
        assert failure['actual'] == 'not installed (required by torch)'
    finally:
        subprocess.run(['pct', 'exec', str(GPU), '--', 'sh', '-c', 'mv /root/away/* {0}/ && rmdir /root/away'.format(site)],
                       check=True)


def test_a_hung_probe_times_out(fleet, tmp_path, creds):
    made = subprocess.run(['pct', 'exec', str(GPU), '--', 'sh', '-c',
                           'python3 -m venv --without-pip /tmp/hung && mkdir -p /tmp/hung/lib/python3.11/site-packages/torch '
                           '&& echo "import time; time.sleep(600)" > /tmp/hung/lib/python3.11/site-packages/torch/__init__.py'])
    assert made.returncode == 0
    res = verify(tmp_path, creds, GPU, fail=True, venv='/tmp/hung', timeout=3)
    assert res['failures'][0]['check'] == 'probe'
    assert 'the probe did not finish in 3 s' in res['failures'][0]['actual']


def test_a_user_who_cannot_open_the_gpus_is_a_finding(fleet, tmp_path, creds, node_ssh):
    # the fleet made the GPU nodes 0666 (gpu_container_gpu_mode): the verify stage's user (nobody) opens them
    seen = verify(tmp_path, creds, GPU, user='nobody')['device_access']
    assert seen['user'] == 'nobody' and set(seen['nodes'].values()) == {'ENXIO'} and len(seen['nodes']) == 6
    report = json.loads((fleet['reports'] / 'verify-gpu.json').read_text())
    assert report['torch']['device_access']['user'] == 'nobody', report['torch'].get('device_access')
    # a devN without a mode is 0660 root:root in the container, as PVE makes it: root opens it, nobody cannot
    pve = fleet['pve']
    pve.ct(CPU_ONLY).config.put(dev0='/dev/nvidia6')
    try:
        assert verify(tmp_path, creds, CPU_ONLY, user='0')['device_access']['nodes'] == {'/dev/nvidia6': 'ENXIO'}
        res = verify(tmp_path, creds, CPU_ONLY, fail=True, user='nobody')
        assert res['failures'] == [{'check': 'device_access', 'expected': 'nobody can open /dev/nvidia6',
                                    'actual': 'EACCES (0660, uid 0, gid 0)', 'why': (
                                        'permission denied (the node is not readable and writable by this user); '
                                        'give the fleet a gpu_mode (0666) or a gpu_gid the user is in')}]
        assert 'device_access: expected nobody can open /dev/nvidia6, got EACCES' in res['msg']
        unknown = verify(tmp_path, creds, CPU_ONLY, fail=True, user='trainer')
        assert unknown['failures'] == [{'check': 'device_access', 'expected': 'a user trainer in the container',
                                        'actual': 'no such user'}]
    finally:
        pve.ct(CPU_ONLY).config.put(delete='dev0')
        pve.stop(CPU_ONLY)
        pve.start(CPU_ONLY)


def test_a_dev_shm_too_small_and_a_collective_that_cannot_finish_are_findings_with_why(fleet, tmp_path, creds):
    """/dev/shm shrunk in the container (a small tmpfs mounted over it, as a small shm size leaves it): the check
    shm fails and says why; a collective given no time to finish is stopped at its bound and fails."""
    small = subprocess.run(['pct', 'exec', str(GPU), '--', 'mount', '-t', 'tmpfs', '-o', 'size=16m,nosuid,nodev',
                            'tmpfs', '/dev/shm'], capture_output=True, text=True)
    assert small.returncode == 0, small.stderr
    try:
        res = verify(tmp_path, creds, GPU, fail=True, min_shm_mb_per_gpu=256, collective=True, collective_timeout=1,
                     collective_bytes=256 << 20)
        (shm,) = [f for f in res['failures'] if f['check'] == 'shm']
        assert shm['expected'] == '>= 256 MiB' and shm['actual'] == '16 MiB' and 'larger /dev/shm' in shm['why']
        (allreduce,) = [f for f in res['failures'] if f['check'] == 'allreduce']
        assert allreduce['actual'] == 'rank(s) 0, 1 did not finish the collective in 1 s', allreduce
    finally:
        subprocess.run(['pct', 'exec', str(GPU), '--', 'umount', '/dev/shm'], check=True)
    res = verify(tmp_path, creds, GPU, min_shm_mb_per_gpu=256, collective=True)
    assert [c['status'] for c in res['checks'] if c['name'] in ('shm', 'allreduce')] == ['ok', 'ok']


def test_container_limits_under_what_jobs_need_are_a_finding_that_names_the_entry_keys(fleet, tmp_path, creds):
    res = verify(tmp_path, creds, GPU, fail=True, min_nofile=65536, memlock_unlimited=True)
    (failure,) = [f for f in res['failures'] if f['check'] == 'limits']
    assert failure['actual'] == ("the container's open files are limited to 8192, under 65536; the container's locked "
                                 "memory is limited to 8388608 bytes where RDMA needs it unlimited"), failure
    assert 'nofile and rdma in its fleet entry' in failure['why']


def test_a_training_step_far_below_its_baseline_is_a_finding_that_names_the_drop(fleet, tmp_path, creds):
    """The container's baseline raised far above what it can reach (as a venv change that slows training leaves a
    container below its own): the verification fails on throughput and says by how much and what changed."""
    kept = subprocess.run(['pct', 'exec', str(GPU), '--', 'cat', BASELINE], capture_output=True, text=True,
                          check=True).stdout
    high = dict(json.loads(kept), tokens_per_s=1e9, venv='/root/venvs/before')
    assert subprocess.run(['pct', 'exec', str(GPU), '--', 'sh', '-c', 'cat > ' + BASELINE],
                          input=json.dumps(high), text=True).returncode == 0
    try:
        res = verify(tmp_path, creds, GPU, fail=True, train_step=True, baseline_path=BASELINE,
                     max_throughput_drop=0.9)
        (slow,) = [f for f in res['failures'] if f['check'] == 'throughput']
        assert slow['expected'].startswith('>= 100000000 tokens/s (90% below the baseline 1000000000.0 of ')
        assert slow['why'].startswith('100% below the baseline; since it: venv /root/venvs/before -> '
                                      '/opt/gpufleet/venvs/')
        assert res['throughput']['ratio'] < 0.01 and 'baseline_recorded' not in res
    finally:
        subprocess.run(['pct', 'exec', str(GPU), '--', 'sh', '-c', 'cat > ' + BASELINE], input=kept, text=True,
                       check=True)
    res = verify(tmp_path, creds, GPU, train_step=True, baseline_path=BASELINE, max_throughput_drop=0.9)
    assert res['throughput']['ratio'] > 0.1 and res['baseline_recorded'] is False
