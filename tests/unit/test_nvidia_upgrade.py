"""A node's driver upgrade planned (plugin_utils _nvidia_upgrade): whether it is needed, the steps, and a driver
refused below the floor of a container's venv profile."""

import pytest

from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _nvidia_upgrade as nu

RUNNING, NEXT = '6.14.11-4-pve', '6.17.2-1-pve'


def devices(loaded='580.95.05', installed=('580.95.05',), built=None, upcoming=NEXT):
    built = {'580.95.05': [RUNNING]} if built is None else built
    return {'driver_version': loaded, 'installed_versions': list(installed),
            'kernels': {'running_kernel': RUNNING, 'next_kernel': upcoming,
                        'dkms': dict((v, {'built': k, 'make_log': None}) for v, k in built.items())}}


# what the node's apt offers (apt-cache madison), NVIDIA's CUDA repository numbering its builds -1
OFFERED = {'libcuda1': ['580.105.08-1', '580.95.05-1'], 'nvidia-driver': ['580.105.08-1', '580.95.05-1']}

# the default profile's floor, as the driver_upgrade_plan action takes it from the lock (plugin_utils _profile)
CT = {'vmid': 221, 'hostname': 'train-c1', 'profile': 'default', 'needs': '580.65.06',
      'floor': "the venv profile default needs an NVIDIA driver of at least 580.65.06: its lock's "
               'nvidia-cudnn-cu13==9.19.0.56 is built for CUDA 13'}


def test_a_node_on_an_older_driver_needs_every_step_and_its_containers_are_named():
    plan = nu.plan('pve1', '580.105.08', 'apt', devices(), [CT], ['libcuda1', 'nvidia-driver'], offered=OFFERED)
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
    debian['kernels']['packages'] = {'libcuda1': {'version': '580.95.05-2', 'held': True, 'source': 'nvidia'}}
    assert 'libcuda1=580.95.05-2,' in nu.plan(
        'pve1', '580.105.08', 'apt', debian, [CT], ['libcuda1', 'nvidia-driver'],
        offered=dict(OFFERED, libcuda1=['580.105.08-1', '580.95.05-2']))['rollback']
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


def bookworm(status='installed', **kernels):
    """A PVE 8 node on Debian's own 535 packages (their real names, sources and versions), as discovery reads it."""
    pkgs = dict((n, {'version': '535.261.03-1', 'held': True, 'source': 'nvidia-graphics-drivers', 'state': status})
                for n in ('firmware-nvidia-gsp', 'libcuda1', 'libnvidia-ml1', 'nvidia-alternative',
                          'nvidia-kernel-dkms', 'nvidia-kernel-support', 'nvidia-smi'))
    # other sources, other versions: moved by apt as their dependencies say, never pinned
    pkgs['nvidia-modprobe'] = {'version': '535.161.07-1', 'held': True, 'source': 'nvidia-modprobe', 'state': 'installed'}
    pkgs['nvidia-kernel-common'] = {'version': '20151021+13', 'held': False, 'source': 'nvidia-support',
                                    'state': 'installed'}
    found = devices('535.261.03', ['535.261.03'], {'535.261.03': ['6.1.0-57-amd64']}, upcoming='6.1.0-57-amd64')
    found['kernels'].update(running_kernel='6.1.0-57-amd64', packages=pkgs, headers={'6.1.0-57-amd64': True},
                            unfinished={}, runfile=[])
    found['kernels'].update(kernels)
    return found


# what bookworm's apt offers for them (bookworm, bookworm-security)
BOOKWORM = dict((n, ['535.309.01-0+deb12u1', '535.261.03-1']) for n in (
    'firmware-nvidia-gsp', 'libcuda1', 'libnvidia-ml1', 'nvidia-alternative', 'nvidia-kernel-dkms',
    'nvidia-kernel-support', 'nvidia-smi'))


def test_debians_packages_are_pinned_as_apt_offers_them_the_whole_source_at_once():
    names = sorted(bookworm()['kernels']['packages'])
    plan = nu.plan('pve2', '535.309.01', 'apt', bookworm(), [], names, offered=BOOKWORM)
    assert plan['needed'] and plan['to'] == '535.309.01'
    assert plan['pins'] == ['{0}=535.309.01-0+deb12u1'.format(n) for n in sorted(BOOKWORM)]
    assert 'nvidia-kernel-dkms=535.261.03-1 nvidia-kernel-support=535.261.03-1' in plan['rollback']
    assert 'nvidia-modprobe' not in plan['rollback']  # another source: apt moves it
    # trixie: one upstream version, two Debian revisions: the upstream alone is ambiguous, the revision is not
    trixie = bookworm()
    for p in trixie['kernels']['packages'].values():
        p['version'] = '550.163.01-2' if p['source'] == 'nvidia-graphics-drivers' else p['version']
    trixie.update(driver_version='550.163.01', installed_versions=['550.163.01'])
    trixie['kernels']['dkms'] = {'550.163.01': {'built': ['6.1.0-57-amd64'], 'make_log': None}}
    offers = dict((n, ['550.163.01-4~bpo13+1', '550.163.01-2']) for n in BOOKWORM)
    # it runs 550.163.01 already; asked for 550.163.01 of a node on 535, the upstream alone names two builds
    assert not nu.plan('pve3', '550.163.01', 'apt', trixie, [], names, offered=offers)['needed']
    with pytest.raises(nu.PlanError, match=r"the node's sources offer 550.163.01-4~bpo13\+1 and 550.163.01-2 of "
                                           r'550.163.01 for firmware-nvidia-gsp, libcuda1, .*: give the version in full '
                                           r'\(gpu_node_driver_version=550.163.01-4~bpo13\+1\)'):
        nu.plan('pve2', '550.163.01', 'apt', bookworm(), [], names,
                offered=dict((n, offers[n] + BOOKWORM[n]) for n in BOOKWORM))
    plan = nu.plan('pve3', '550.163.01-4~bpo13+1', 'apt', trixie, [], names, offered=offers)
    assert plan['needed'] and plan['pins'][0] == 'firmware-nvidia-gsp=550.163.01-4~bpo13+1'  # same upstream: needed
    assert plan['msg'].startswith("pve3: NVIDIA driver 550.163.01 -> 550.163.01-4~bpo13+1 with Debian's packages")


def test_what_keeps_a_node_from_the_change_is_refused_before_anything_stops_each_with_its_fix():
    names = sorted(bookworm()['kernels']['packages'])

    def refused(devices_, offered=BOOKWORM, version='535.309.01', method='apt', **kw):
        with pytest.raises(nu.PlanError) as e:
            nu.plan('pve2', version, method, devices_, [], names, offered=offered, **kw)
        assert str(e.value).startswith('pve2: the upgrade to {0} cannot start, nothing was changed: '.format(version))
        return str(e.value)

    assert ("the node's sources offer no 535.400.01-1 of firmware-nvidia-gsp, libcuda1, libnvidia-ml1, "
            'nvidia-alternative, nvidia-kernel-dkms, nvidia-kernel-support, nvidia-smi (apt-cache madison '
            'firmware-nvidia-gsp lists what they offer') in refused(bookworm(), version='535.400.01-1')
    assert "the node's sources offer no 580.105.08 of firmware-nvidia-gsp" in refused(bookworm(), version='580.105.08')
    assert 'dpkg has not finished nvidia-kernel-dkms (half-configured): run dpkg --configure -a' in refused(
        bookworm(unfinished={'nvidia-kernel-dkms': 'half-configured'}))
    assert 'kernel 6.1.0-57-amd64 has no headers to build the module against: apt install ' \
           'linux-headers-6.1.0-57-amd64' in refused(bookworm(headers={'6.1.0-57-amd64': False}))
    assert "the driver is both Debian's packages" in refused(bookworm(runfile=['usr/bin/nvidia-uninstall']))
    assert 'set gpu_node_driver_install: apt' in refused(bookworm(), method='run')
    # the suite moved on (535.261.03-1 no longer offered, not in the cache): no way back, unless told to go on
    moved_on = dict((n, ['535.309.01-0+deb12u1']) for n in BOOKWORM)
    assert 'the way back needs firmware-nvidia-gsp=535.261.03-1 libcuda1=535.261.03-1' in refused(bookworm(), moved_on)
    assert nu.plan('pve2', '535.309.01', 'apt', bookworm(), [], names, offered=moved_on, need_rollback=False)['needed']
    # a node at the version already is not refused for what a change would need
    done = bookworm(unfinished={'x': 'half-configured'})
    assert not nu.plan('pve2', '535.261.03', 'apt', done, [], names, offered=BOOKWORM)['needed']


def test_apt_cache_madisons_lines_are_read_per_package():
    text = (' nvidia-kernel-dkms | 535.309.01-0+deb12u1 | http://deb.debian.org/debian-security '
            'bookworm-security/non-free amd64 Packages\n'
            ' nvidia-kernel-dkms | 535.261.03-1 | http://deb.debian.org/debian bookworm/non-free amd64 Packages\n'
            'nvidia-graphics-drivers | 535.261.03-1 | http://deb.debian.org/debian bookworm/non-free Sources\n'
            '  libcuda1 | 535.261.03-1 | file:/srv/lab ./ Packages\nN: Unable to locate package nvidia-driver\n')
    assert nu.madison(text) == {'nvidia-kernel-dkms': ['535.309.01-0+deb12u1', '535.261.03-1'],
                                'libcuda1': ['535.261.03-1']}
