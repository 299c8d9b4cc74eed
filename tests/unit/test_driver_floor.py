"""A venv profile's driver floor taken from its lock (plugin_utils _profile), not from the CUDA version it declares:
the default profile's cu13 wheels need the R580 driver though its torch is the CUDA 12.8 build; the fleet plan
refuses a GPU container whose node runs an older driver, naming the node, the profile, the wheel and the driver."""

import os

import pytest

from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _fleet, _profile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lock(name):
    with open(os.path.join(ROOT, 'roles', 'torch_venv', 'files', 'profiles', name, 'requirements.lock')) as fh:
        return fh.read()


def test_each_shipped_profiles_floor_comes_from_its_newest_cuda_wheel():
    default = _profile.driver_floor(lock('default'))
    # torch 2.11.0+cu128 alone would need 525.60.13; its cu13 overrides need CUDA 13's driver
    assert (default['driver'], default['cuda'], default['wheel']) == ('580.65.06', '13', 'nvidia-cudnn-cu13==9.19.0.56')
    assert {'nvidia-cusparselt-cu13==0.8.0', 'nvidia-nccl-cu13==2.28.9', 'nvidia-nvshmem-cu13==3.4.5'} <= set(
        default['wheels'])
    assert not [w for w in default['wheels'] if 'cu12' in w or w.startswith('torch==')]
    assert _profile.driver_floor(lock('cu130'))['driver'] == '580.65.06'
    assert _profile.driver_floor(lock('cpu')) is None  # a CPU torch needs no driver


def test_every_kind_of_cuda_wheel_is_read_and_an_unknown_cuda_is_named():
    text = ('torch==2.11.0+cu128 \\\n    --hash=sha256:00\nnvidia-nccl-cu12==2.28.9 \\\nnvidia-cuda-runtime==13.0.96\n'
            'nvidia-cufft==12.0.0.61\nnumpy==2.3.0\n')
    assert [(pin, major) for pin, major, _why in _profile.lock_cudas(text)] == [
        ('torch==2.11.0+cu128', '12'), ('nvidia-nccl-cu12==2.28.9', '12'), ('nvidia-cuda-runtime==13.0.96', '13')]
    assert _profile.driver_floor('torch==2.11.0+cu128\nnvidia-nccl-cu12==2.28.9\n') == {
        'driver': '525.60.13', 'cuda': '12', 'wheel': 'nvidia-nccl-cu12==2.28.9',
        'wheels': ['nvidia-nccl-cu12==2.28.9', 'torch==2.11.0+cu128'],
        'why': 'nvidia-nccl-cu12==2.28.9 is built for CUDA 12'}
    assert _profile.driver_floor('torch==2.11.0+cu128\n')['why'] == "torch==2.11.0+cu128 is torch's build for CUDA 12.8"
    with pytest.raises(ValueError, match=r'^nvidia-nccl-cu14==3.0 is built for CUDA 14, whose oldest driver gpufleet '
                                         r'does not know \(it knows CUDA 11, 12, 13\)$'):
        _profile.driver_floor('nvidia-nccl-cu14==3.0\n')


def test_a_driver_below_the_floor_is_found_by_version_not_by_text():
    floor = _profile.driver_floor(lock('default'))
    assert _profile.below_floor('570.172.08', floor) and _profile.below_floor('550.163.01', floor)
    assert _profile.below_floor('580.9.1', floor)  # 9 < 65: numbers, not text
    assert not _profile.below_floor('580.65.06', floor) and not _profile.below_floor('1000.1', floor)
    assert not _profile.below_floor(None, floor) and not _profile.below_floor('535.261.03', None)


def test_the_plan_refuses_a_gpu_container_on_a_node_below_its_profiles_floor():
    floor = _profile.driver_floor(lock('default'))
    profiles = {'': {'name': 'default', 'dir': '/p/default', 'pythons': ['3.11'], 'floor': floor},
                'cpu': {'name': 'cpu', 'dir': '/p/cpu', 'pythons': ['3.11'], 'floor': None}}
    nodes = {'gpu01': {'indexes': [0, 1], 'driver_version': '535.261.03'},
             'gpu02': {'indexes': [0], 'driver_version': '580.95.05'}}
    entries = [{'vmid': 201, 'hostname': 'a', 'node': 'gpu01', 'gpus': [0]},
               {'vmid': 202, 'hostname': 'b', 'node': 'gpu01', 'gpus': [1], 'venv_profile': 'cpu'},
               {'vmid': 203, 'hostname': 'c', 'node': 'gpu01', 'gpus': []},
               {'vmid': 204, 'hostname': 'd', 'node': 'gpu02', 'gpus': [0]}]
    with pytest.raises(_fleet.FleetError) as e:
        _fleet.Fleet(entries, nodes, profiles=profiles).check()
    assert e.value.problems == [
        "containers[0] (vmid 201).venv_profile: node gpu01 runs the NVIDIA driver 535.261.03, and the venv profile "
        "default needs an NVIDIA driver of at least 580.65.06: its lock's nvidia-cudnn-cu13==9.19.0.56 is built for "
        'CUDA 13 (as are 5 other wheel(s) of it), and CUDA 13.x runs on 580.65.06 or newer: upgrade the node\'s '
        'driver to 580.65.06 or newer (gpufleet driver-upgrade --node gpu01 --version VERSION), or give this '
        'container a profile whose wheels that driver runs']
    # read to judge another driver (the driver upgrade's plan, which holds the new driver to the floor): not refused
    _fleet.Fleet(entries, nodes, profiles=profiles, driver_floor=False).check()
    # the same fleet on a node with the R580 driver passes
    _fleet.Fleet(entries, dict(nodes, gpu01=dict(nodes['gpu01'], driver_version='580.95.05')), profiles=profiles).check()


def test_verify_fails_a_gpu_venv_whose_node_driver_went_below_its_floor():
    from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _verdict
    floor = _profile.driver_floor(lock('default'))
    meta = {'profile': 'default', 'floor': floor, 'expect': {'cuda_version': '12.8'}}
    facts = {'built': {'id': 'v1', 'meta': meta, 'link': '/root/venv'}, 'venv': '/root/venv', 'gpus': [0],
             'node_driver': '570.172.08', 'settings': {}}
    now = _verdict.state(facts)
    failure = now['below_floor']
    assert (failure['check'], failure['expected'], failure['actual']) == (
        'driver_floor', 'an NVIDIA driver of at least 580.65.06', '570.172.08')
    assert "nvidia-cudnn-cu13==9.19.0.56 is built for CUDA 13" in failure['why']
    passed = {'failures': [], 'msg': ''}
    failed = _verdict.with_failure(passed, failure)
    assert failed['failures'] == [failure] and failed['msg'].startswith(
        'driver_floor: expected an NVIDIA driver of at least 580.65.06, got 570.172.08 (the venv profile default')
    assert not _verdict.report(now, {'healthy': True}, failed, 'ct')['ok']
    assert _verdict.report(now, {'healthy': True}, passed, 'ct')['ok']
    # the R580 driver, a container without GPUs, a venv built before floors were kept: nothing to say
    assert _verdict.state(dict(facts, node_driver='580.95.05'))['below_floor'] is None
    assert _verdict.state(dict(facts, gpus=[]))['below_floor'] is None
    assert _verdict.state(dict(facts, built=dict(facts['built'], meta=dict(meta, floor=None))))['below_floor'] is None
    assert _verdict.with_failure(passed, None) is passed
