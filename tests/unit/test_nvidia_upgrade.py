"""A node's driver upgrade planned (module_utils _nvidia_upgrade): whether it is needed, the steps, and a driver
refused below the floor of a container's venv profile."""

import pytest

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _nvidia_upgrade as nu

RUNNING, NEXT = '6.14.11-4-pve', '6.17.2-1-pve'


def devices(loaded='580.95.05', installed=('580.95.05',), built=None, upcoming=NEXT):
    built = {'580.95.05': [RUNNING]} if built is None else built
    return {'driver_version': loaded, 'installed_versions': list(installed),
            'kernels': {'running_kernel': RUNNING, 'next_kernel': upcoming,
                        'dkms': dict((v, {'built': k, 'make_log': None}) for v, k in built.items())}}


# the default profile's floor, as the driver_upgrade_plan action takes it from the lock (plugin_utils _profile)
CT = {'vmid': 221, 'hostname': 'train-c1', 'profile': 'default', 'needs': '580.65.06',
      'floor': "the venv profile default needs an NVIDIA driver of at least 580.65.06: its lock's "
               'nvidia-cudnn-cu13==9.19.0.56 is built for CUDA 13'}


def test_a_node_on_an_older_driver_needs_every_step_and_its_containers_are_named():
    plan = nu.plan('pve1', '580.105.08', 'apt', devices(), [CT], ['libcuda1', 'nvidia-driver'])
    assert plan['needed'] and plan['kernels'] == [RUNNING, NEXT]
    assert (plan['from'], plan['to']) == ('580.95.05', '580.105.08')
    assert plan['steps'] == [
        'stop CT 221 (train-c1)',
        'install the packages libcuda1=580.105.08-1 nvidia-driver=580.105.08-1 (held again after)',
        'build the module for {0} (running) and {1} (boots next)'.format(RUNNING, NEXT),
        'reboot the node (the module 580.105.08 loads)',
        'make the device nodes and gather the driver bundle of 580.105.08',
        'start CT 221 (train-c1) with that bundle', 'verify CT 221 (train-c1) (torch and its GPUs)']
    assert plan['msg'].startswith("pve1: NVIDIA driver 580.95.05 -> 580.105.08 with Debian's packages; its GPU "
                                  'containers are down from the first step to the last: 1. stop CT 221 (train-c1); 2.')
    assert 'apt-get install -y --allow-change-held-packages --allow-downgrades libcuda1=580.95.05-1 ' \
           'nvidia-driver=580.95.05-1' in plan['rollback']
    assert plan['pins'] == ['libcuda1=580.105.08-1', 'nvidia-driver=580.105.08-1']
    # Debian's own packages are numbered apart (-2): the way back pins what dpkg has now
    debian = devices()
    debian['kernels']['packages'] = {'libcuda1': {'version': '580.95.05-2', 'held': True}}
    assert 'libcuda1=580.95.05-2 nvidia-driver=580.95.05-1,' in nu.plan(
        'pve1', '580.105.08', 'apt', debian, [CT], ['libcuda1', 'nvidia-driver'])['rollback']
    run = nu.plan('pve1', '580.105.08', 'run', devices(), [CT])
    assert run['steps'][1] == "run NVIDIA's installer of 580.105.08 (--silent --dkms)"
    assert 'sh NVIDIA-Linux-x86_64-580.95.05.run --silent --dkms' in run['rollback']


def test_a_node_is_done_only_when_its_module_userspace_and_both_kernels_modules_are_the_version():
    done = devices('580.105.08', ['580.105.08'], {'580.105.08': [RUNNING, NEXT]})
    assert not nu.plan('pve1', '580.105.08', 'apt', done, [CT])['needed']
    assert nu.plan('pve1', '580.105.08', 'apt', done, [CT])['msg'] == \
        'pve1: runs the NVIDIA driver 580.105.08 already: nothing to do'
    # installed, not rebooted
    assert nu.plan('pve1', '580.105.08', 'apt', devices('580.95.05', ['580.105.08'], {'580.105.08': [RUNNING, NEXT]}),
                   [CT])['needed']
    # loaded, but the kernel it boots next has no module of it
    assert nu.plan('pve1', '580.105.08', 'apt', devices('580.105.08', ['580.105.08'], {'580.105.08': [RUNNING]}),
                   [CT])['needed']
    # a node without a loaded driver (no GPUs) is left alone
    none = nu.plan('pve3', '580.105.08', 'apt', {'driver_version': None}, [])
    assert not none['needed']
    assert none['msg'] == 'pve3: no NVIDIA driver is loaded (a node without GPUs): nothing to upgrade'


def test_a_driver_below_a_containers_floor_is_refused_naming_each_container_and_the_wheel():
    cu12 = dict(CT, vmid=222, hostname='train-c2', profile='cu128-only', needs='525.60.13', floor=None)
    with pytest.raises(nu.PlanError) as refused:
        nu.plan('pve1', '570.172.08', 'apt', devices(), [CT, cu12])
    assert str(refused.value) == (
        'pve1: the NVIDIA driver 570.172.08 does not run the venv of every GPU container on it, nothing was changed: '
        "CT 221 (train-c1): the venv profile default needs an NVIDIA driver of at least 580.65.06: its lock's "
        'nvidia-cudnn-cu13==9.19.0.56 is built for CUDA 13')
    with pytest.raises(nu.PlanError, match=r'CT 222 \(train-c2\): its venv profile cu128-only needs an NVIDIA driver '
                                           r'of at least 525.60.13$'):
        nu.plan('pve1', '520.61.05', 'apt', devices(), [cu12])
    # a CPU profile needs none
    assert nu.plan('pve1', '520.61.05', 'apt', devices(), [dict(CT, needs=None, floor=None)])['needed']


def test_a_version_or_method_that_is_not_one_names_its_field():
    with pytest.raises(nu.PlanError, match=r"^gpu_node_driver_version: '' is not an NVIDIA driver version"):
        nu.plan('pve1', '', 'apt', devices(), [])
    with pytest.raises(nu.PlanError, match=r"^gpu_node_driver_install: 'yum' must be one of apt, run$"):
        nu.plan('pve1', '580.105.08', 'yum', devices(), [])


def test_the_fleets_gpu_containers_on_a_node():
    fleet = [{'vmid': 1, 'node': 'pve1', 'gpus': [0]}, {'vmid': 2, 'node': 'pve1', 'gpus': []},
             {'vmid': 3, 'node': 'pve2', 'gpus': 'all'}, {'vmid': 4, 'node': 'pve1', 'gpus': 'all', 'state': 'absent'},
             {'vmid': 5, 'node': 'pve1', 'gpus': 'all'}]
    assert [e['vmid'] for e in nu.gpu_containers(fleet, 'pve1')] == [1, 5]


def test_a_gpu_container_the_fleet_has_not_made_where_it_says_is_refused_where_the_node_needs_the_upgrade():
    other = dict(CT, vmid=224, hostname='train-c4')
    read = [{'vmid': 221, 'node': 'pve1', 'created': True, 'status': 'stopped'},
            {'vmid': 224, 'node': 'pve3', 'created': False, 'status': 'stopped', 'changed_keys': ['node']}]
    with pytest.raises(nu.PlanError) as refused:
        nu.plan('pve1', '580.105.08', 'apt', devices(), [CT, other], read=read)
    assert str(refused.value) == (
        'pve1: its GPU containers are not as the fleet says, nothing was changed: CT 221 (train-c1) does not exist; '
        'CT 224 (train-c4) is on pve3, not on pve1. Make the fleet first (ansible-playbook site.yml), then upgrade')
    # made where the fleet says (or not read at all): planned
    made = [{'vmid': 221, 'node': 'pve1', 'created': False, 'status': 'running'}]
    assert nu.plan('pve1', '580.105.08', 'apt', devices(), [CT, other], read=made)['needed']
    # a node with nothing to do stops nothing: not refused
    done = devices(loaded='580.105.08', installed=('580.105.08',), built={'580.105.08': [RUNNING, NEXT]})
    assert not nu.plan('pve1', '580.105.08', 'apt', done, [CT], read=read)['needed']
