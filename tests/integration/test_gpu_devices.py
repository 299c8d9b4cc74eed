"""gpufleet.proxmox.gpu_devices on the lab node, reached over SSH like a real node."""

import os

import pytest

pytestmark = pytest.mark.lab


def discover(play, **options):
    args = {'proc_root': '{{ gpufleet_lab.proc_root }}', 'root': '{{ gpu_node_root }}',
            'nvidia_smi': '{{ gpufleet_lab_dir }}/driver/bin/nvidia-smi'}
    args.update(options)
    r = play([{'gpufleet.proxmox.gpu_devices': args}], hosts='pve1')
    res = r.task(0, 'pve1')
    assert not res.get('failed'), res
    assert res['changed'] is False
    return res['ansible_facts']['gpufleet_gpu_devices']


def test_the_lab_nodes_gpus(play, lab):
    facts = discover(play)
    record = lab.record()['gpus']
    assert facts['count'] == 8
    # nvidia-smi's index in PCI bus order; the lab's driver gave the minors in reverse (GPU 0 is /dev/nvidia7)
    assert [(g['index'], g['major'], g['minor'], g['path']) for g in facts['gpus']] == [
        (i, 195, 7 - i, '/dev/nvidia{0}'.format(7 - i)) for i in range(8)]
    assert facts['indexes'] == list(range(8))
    assert facts['gpus'][1]['pci_bus_id'] == '00000000:28:00.0' and facts['gpus'][0]['uuid'].startswith('GPU-')
    assert facts['control']['nvidiactl']['minor'] == 255 and facts['control']['nvidia-modeset']['minor'] == 254
    assert facts['uvm_major'] == record['uvm_major'] != 195
    assert facts['control']['nvidia-uvm']['major'] == facts['uvm_major']
    assert (facts['control']['nvidia-uvm-tools']['major'], facts['control']['nvidia-uvm-tools']['minor']) == (
        facts['uvm_major'], 1)
    assert facts['driver_version'] == '580.95.05'
    assert facts['findings'] == []
    # the kernel the node runs, the module built for it by DKMS, the driver's packages held
    kernels = facts['kernels']
    assert kernels['running_kernel'] == kernels['next_kernel'] == '6.14.11-4-pve'
    assert kernels['dkms'] == {'580.95.05': {'built': ['6.14.11-4-pve'], 'make_log': None, 'module': 'nvidia'}}
    assert kernels['modules']['6.14.11-4-pve'].endswith('/lib/modules/6.14.11-4-pve/updates/dkms/nvidia.ko')
    assert all(p['held'] for p in kernels['packages'].values()) and 'libcuda1' in kernels['packages']


def test_the_program_and_the_module_discover_alike(play):
    """gpu_devices runs on the node as a program of its entry point where the connection pipelines (its action), and
    as the module itself where it does not: both find the same, ~ in a share's or a boot file's path is the node's
    home, and a bad driver bundle is refused by name before anything runs. Where the node's Python is not given,
    Ansible's discovery of it runs first, as it would for the module, and the program runs with what it found."""
    args = {'proc_root': '{{ gpufleet_lab.proc_root }}', 'root': '{{ gpu_node_root }}',
            'nvidia_smi': '{{ gpufleet_lab_dir }}/driver/bin/nvidia-smi', 'shares': [{'path': '~/gpufleet-no-share'}],
            'boot_files': [{'path': '~/gpufleet-no-boot-file', 'content': 'x', 'mode': '0644'}]}
    r = play([{'gpufleet.proxmox.gpu_devices': args},
              {'gpufleet.proxmox.gpu_devices': args, 'vars': {'ansible_pipelining': False}},
              {'gpufleet.proxmox.gpu_devices': dict(args, bundle={'dest': 5, 'colour': 'red'}), 'ignore_errors': True},
              # (the lab's node is this machine, where pyenv's shims come first: discovery is given the system's)
              {'gpufleet.proxmox.gpu_devices': args, 'vars': {'ansible_python_interpreter': 'auto_silent',
                                                              'ansible_interpreter_python_fallback': ['/usr/bin/python3']}}],
             hosts='pve1')
    program, module, bad, discovered = (r.task(i, 'pve1') for i in range(4))
    assert not program.get('failed') and not module.get('failed'), (program, module)
    assert 'invocation' in module and 'invocation' not in program  # AnsibleModule's own, the program's not
    assert program['ansible_facts'] == module['ansible_facts']
    found = program['ansible_facts']['gpufleet_gpu_devices']['findings']
    assert ('share_missing', '/root/gpufleet-no-share') in [(f['code'], f.get('path')) for f in found], found
    assert any('/root/gpufleet-no-boot-file' in f['msg'] for f in found), found
    assert bad['failed'] and bad['msg'].startswith('bundle: ') and 'colour' in bad['msg'], bad
    assert not discovered.get('failed') and 'invocation' not in discovered, discovered
    assert discovered['ansible_facts']['discovered_interpreter_python'] == '/usr/bin/python3'
    assert discovered['ansible_facts']['gpufleet_gpu_devices'] == program['ansible_facts']['gpufleet_gpu_devices']


def make_node(tmp_path, dev=(), devices=None, version=True):
    """A node's /dev and /proc in a directory: dev = [(name, major, minor)]."""
    d = tmp_path / 'dev'
    d.mkdir()
    for name, major, minor in dev:
        os.mknod(str(d / name), 0o666 | 0o020000, os.makedev(major, minor))
    proc = tmp_path / 'proc'
    (proc / 'driver' / 'nvidia').mkdir(parents=True)
    lines = ['Character devices:', '195 nvidia-frontend'] + ['{0} {1}'.format(v, k) for k, v in (devices or {}).items()]
    (proc / 'devices').write_text('\n'.join(lines) + '\n\nBlock devices:\n  7 loop\n')
    if version:
        (proc / 'driver' / 'nvidia' / 'version').write_text(
            'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.172.08  Release Build  (dvs-builder@U16)\n')
    return str(d), str(proc)


def codes(facts):
    return sorted(f['code'] for f in facts['findings'])


def test_a_gpus_node_is_its_device_minor_not_its_index(play, tmp_path):
    """nvidia-smi counts GPUs in PCI order; the driver gives each its device minor (/dev/nvidiaN) as it probes
    them and says which in /proc/driver/nvidia/gpus/<bus>/information: the two need not agree."""
    dev, proc = make_node(tmp_path, [('nvidia0', 195, 0), ('nvidia1', 195, 1), ('nvidiactl', 195, 255),
                                     ('nvidia-uvm', 509, 0), ('nvidia-uvm-tools', 509, 1)], {'nvidia-uvm': 509})
    for bus, minor in (('0000:18:00.0', 1), ('0000:3b:00.0', 0), ('0000:5e:00.0', 2)):
        info = tmp_path / 'proc' / 'driver' / 'nvidia' / 'gpus' / bus / 'information'
        info.parent.mkdir(parents=True)
        info.write_text('Model: \t\t NVIDIA H100\nBus Location: \t {0}\nDevice Minor: \t {1}\n'.format(bus, minor))
    smi = tmp_path / 'nvidia-smi'
    smi.write_text('#!/bin/sh\necho "0, 00000000:18:00.0, GPU-a, NVIDIA H100"\necho "1, 00000000:3B:00.0, GPU-b, NVIDIA H100"\n'
                   'echo "2, 00000000:5E:00.0, GPU-c, NVIDIA H100"\n')
    smi.chmod(0o755)
    facts = discover(play, dev_dir=dev, proc_root=proc, nvidia_smi=str(smi))
    assert [(g['index'], g['minor'], g['path'], g['uuid']) for g in facts['gpus']] == [
        (0, 1, dev + '/nvidia1', 'GPU-a'), (1, 0, dev + '/nvidia0', 'GPU-b')]
    assert facts['indexes'] == [0, 1]
    # GPU 2 (minor 2) has no node: the finding names both
    (missing,) = [f for f in facts['findings'] if f['code'] == 'gpu_nodes_missing']
    assert missing['msg'] == 'nvidia-smi lists GPU(s) [2] without their /dev/nvidiaN node (/dev/nvidia2)'
    assert missing['fix'] == 'nvidia-modprobe -c 2'


def test_uvm_not_loaded_and_no_driver(play, tmp_path):
    dev, proc = make_node(tmp_path, [('nvidia0', 195, 0), ('nvidiactl', 195, 255)], version=False)
    facts = discover(play, dev_dir=dev, proc_root=proc, nvidia_smi='/nonexistent')
    assert codes(facts) == ['driver_not_loaded', 'uvm_not_loaded']
    assert [f['fix'] for f in facts['findings'] if f['code'] == 'uvm_not_loaded'] == ['nvidia-modprobe -u -c 0']
    assert facts['driver_version'] is None and facts['count'] == 1


def test_uvm_nodes_missing_or_stale(play, tmp_path):
    dev, proc = make_node(tmp_path, [('nvidia0', 195, 0), ('nvidiactl', 195, 255), ('nvidia-uvm', 500, 0)],
                          devices={'nvidia-uvm': 509, 'nvidia-caps': 508})
    facts = discover(play, dev_dir=dev, proc_root=proc, nvidia_smi='/nonexistent')
    assert codes(facts) == ['uvm_node_missing', 'uvm_node_stale']
    stale = [f for f in facts['findings'] if f['code'] == 'uvm_node_stale'][0]
    assert '500:0' in stale['msg'] and 'major 509' in stale['msg']
    assert facts['driver_version'] == '570.172.08'
    assert facts['majors'] == {'nvidia-frontend': 195, 'nvidia-uvm': 509, 'nvidia-caps': 508}


def test_gpu_without_a_node(play, tmp_path, lab):
    dev, proc = make_node(tmp_path, [('nvidia0', 195, 0), ('nvidiactl', 195, 255), ('nvidia-uvm', 509, 0),
                                     ('nvidia-uvm-tools', 509, 1)], devices={'nvidia-uvm': 509})
    facts = discover(play, dev_dir=dev, proc_root=proc)
    assert codes(facts) == ['gpu_nodes_missing']
    assert '[1, 2, 3, 4, 5, 6, 7]' in facts['findings'][0]['msg']


def test_shared_directories_wanting(play, lab, tmp_path):
    ok, owned, moded, plain, ro = (tmp_path / n for n in ('ok', 'owned', 'moded', 'plain', 'ro'))
    for d in (ok, owned, moded, ro):
        d.mkdir()
        os.chmod(str(d), 0o755)
    for d in (ok, moded):
        os.chown(str(d), 100000, 100000)
    os.chmod(str(moded), 0o700)
    os.chown(str(owned), 100000, 0)  # the group is not the containers' root
    plain.write_text('a file')
    shares = [{'path': str(p)} for p in (ok, owned, moded, plain, tmp_path / 'missing')]
    shares.append({'path': str(ro), 'mp': '/opt/ro', 'read_only': True})  # root's own: any owner will do
    facts = discover(play, shares=shares, shares_owner=100000)
    found = [(f['code'], f['path']) for f in facts['findings']]
    assert found == [('share_owner', str(owned)), ('share_mode', str(moded)), ('share_not_directory', str(plain)),
                     ('share_missing', str(tmp_path / 'missing'))]
    assert 'belongs to 100000:0, not 100000:100000' in facts['findings'][0]['msg']
    assert 'mode 0700, not 0755' in facts['findings'][1]['msg']
    # without an owner, any owner will do
    facts = discover(play, shares=[{'path': str(owned)}])
    assert facts['findings'] == []


def test_driver_bundle(play, lab, tmp_path):
    dest = str(tmp_path / 'bundle')
    args = {'version': '580.95.05', 'dest': dest, 'lib_dirs': ['{{ gpufleet_lab_dir }}/driver/lib'],
            'bin_dirs': ['{{ gpufleet_lab_dir }}/driver/bin'],
            'libs': {'libcuda': 'libcuda.so.1', 'libnvidia-ml': 'libnvidia-ml.so.1', 'libnvidia-nvvm': 'libnvidia-nvvm.so.4'}}

    def run(*flags, **over):
        r = play([{'gpufleet.proxmox.driver_bundle': dict(args, **over), 'ignore_errors': True}], *flags, hosts='pve1')
        return r.task(0, 'pve1')
    check = run('--check')
    assert not check.get('failed') and check['changed'] and not os.path.exists(dest), check
    first = run()
    assert not first.get('failed') and first['changed'] and first['files'] == ['bin/nvidia-smi', 'lib/libcuda.so.580.95.05',
                                                   'lib/libnvidia-ml.so.580.95.05']
    assert os.readlink(os.path.join(dest, '580.95.05', 'lib', 'libcuda.so.1')) == 'libcuda.so.580.95.05'
    again = run()
    assert not again.get('failed') and again['changed'] is False, again
    other = run(version='570.172.08')
    assert other.get('failed') and 'no libcuda.so.570.172.08' in other['msg']


def test_bundle_currency_is_discovered(play, lab, tmp_path):
    """Discovery tells a current bundle (by stat alone) from one that lacks a file, holds another copy of one
    or lacks a soname link, and names what is wrong; driver_bundle gathers only that."""
    dest = str(tmp_path / 'bundle')
    files = {'dest': dest, 'lib_dirs': ['{{ gpufleet_lab_dir }}/driver/lib'],
             'bin_dirs': ['{{ gpufleet_lab_dir }}/driver/bin'],
             'libs': {'libcuda': 'libcuda.so.1', 'libnvidia-ml': 'libnvidia-ml.so.1'}}
    bundle = os.path.join(dest, '580.95.05')

    def stale():
        facts = discover(play, bundle=files)
        assert facts['bundle'] == {'version': '580.95.05', 'path': bundle}
        found = [f for f in facts['findings'] if f['code'] == 'bundle_stale']
        assert all(f['path'] == bundle for f in found)
        return [f['msg'] for f in found]

    def gather():
        r = play([{'gpufleet.proxmox.driver_bundle': dict(files, version='580.95.05')}], hosts='pve1')
        return r.task(0, 'pve1')

    assert stale() == ['the driver bundle {0} lacks or holds another copy of lib/libcuda.so.580.95.05, '
                       'lib/libcuda.so.1, lib/libnvidia-ml.so.580.95.05, lib/libnvidia-ml.so.1, '
                       'bin/nvidia-smi'.format(bundle)]
    assert gather()['changed'] is True
    assert stale() == []
    source = lab.path('driver', 'lib', 'libcuda.so.580.95.05')
    copy = os.path.join(bundle, 'lib', 'libcuda.so.580.95.05')
    assert os.stat(copy).st_mtime_ns == os.stat(source).st_mtime_ns  # so that the next look is by stat alone
    # another copy of a library (clobbered in place), and a soname link gone
    with open(copy, 'ab') as fh:
        fh.write(b'x')
    os.unlink(os.path.join(bundle, 'lib', 'libnvidia-ml.so.1'))
    assert stale() == ['the driver bundle {0} lacks or holds another copy of lib/libcuda.so.580.95.05, '
                       'lib/libnvidia-ml.so.1'.format(bundle)]
    assert gather()['changed'] is True
    assert stale() == [] and gather()['changed'] is False
    with open(copy, 'rb') as a, open(source, 'rb') as b:
        assert a.read() == b.read()
    # a driver without its libcuda: the finding says so, and driver_bundle fails with the same words
    files['lib_dirs'] = [str(tmp_path)]
    assert stale() == ['no libcuda.so.580.95.05 in {0}: the node\'s userspace driver does not match its kernel '
                       'module 580.95.05'.format(tmp_path)]
    # without a bundle to look at, none is reported
    assert discover(play)['bundle'] is None
    # a bundle option without where bundles go is refused naming the field
    bad = play([{'gpufleet.proxmox.gpu_devices': {'proc_root': '{{ gpufleet_lab.proc_root }}',
                                                  'bundle': {'lib_dirs': ['/x'], 'libs': {'libcuda': 'libcuda.so.1'}}},
                 'ignore_errors': True}], hosts='pve1').task(0, 'pve1')
    assert bad['failed'] and bad['msg'] == 'bundle: missing required arguments: dest'


def test_a_debian_node_and_a_driver_upgraded_without_a_reboot(play, lab, tmp_path):
    """Debian's driver packages keep the libraries in /usr/lib/x86_64-linux-gnu/nvidia/current (the role's default
    lib_dirs start there). After an upgrade of the userspace driver without a reboot, the node has no
    libcuda.so.<loaded version>: with the bundle gathered before intact, discovery says so plainly and asks for
    nothing to be gathered; without one, the bundle is stale with the same words."""
    import shutil
    lib = tmp_path / 'usr' / 'lib' / 'x86_64-linux-gnu'
    current = lib / 'nvidia' / 'current'
    current.mkdir(parents=True)
    for name in os.listdir(lab.path('driver', 'lib')):
        shutil.copy2(lab.path('driver', 'lib', name), str(current / name))
    (lib / 'libcuda.so.1').symlink_to('nvidia/current/libcuda.so.1')  # Debian's alternatives, in short
    files = {'dest': str(tmp_path / 'bundle'), 'lib_dirs': [str(current), str(lib)],
             'bin_dirs': ['{{ gpufleet_lab_dir }}/driver/bin'],
             'libs': {'libcuda': 'libcuda.so.1', 'libnvidia-ml': 'libnvidia-ml.so.1'}}
    bundle = os.path.join(files['dest'], '580.95.05')
    gathered = play([{'gpufleet.proxmox.driver_bundle': dict(files, version='580.95.05')}], hosts='pve1').task(0, 'pve1')
    assert not gathered.get('failed') and 'lib/libcuda.so.580.95.05' in gathered['files'], gathered
    assert discover(play, bundle=files)['findings'] == []
    # apt upgraded the userspace driver; the loaded module is still 580.95.05
    for name in os.listdir(str(current)):
        os.rename(str(current / name), str(current / name.replace('580.95.05', '590.48.01')))
    found = [f for f in discover(play, bundle=files)['findings'] if f['path'] == bundle]
    assert [f['code'] for f in found] == ['driver_not_rebooted'] and found[0]['installed'] == ['590.48.01']
    assert found[0]['msg'] == (
        'the node runs the NVIDIA kernel module 580.95.05 but its userspace driver is 590.48.01 (upgraded without '
        'a reboot): its containers keep the bundle of 580.95.05 gathered before ({0}) until the node is '
        'rebooted'.format(bundle))
    assert found[0]['fix'] == 'reboot the node (or reload the nvidia modules) to run 590.48.01'
    # no bundle gathered before: nothing can serve the containers
    fresh = dict(files, dest=str(tmp_path / 'none'))
    (stale,) = [f for f in discover(play, bundle=fresh)['findings'] if f['code'] == 'bundle_stale']
    assert 'upgraded without a reboot' in stale['msg'] and 'no bundle of 580.95.05 was gathered before' in stale['msg']


def test_ansibles_own_path_gives_what_the_direct_path_gives(lab, tmp_path):
    """GPUFLEET_DIRECT=0 (or an ansible-core whose internals plugin_utils _direct does not find as it needs): the
    module runs as Ansible runs it, with the same result."""
    from gpufleet.lab.testing import run_playbook
    task = {'gpufleet.proxmox.gpu_devices': {'proc_root': '{{ gpufleet_lab.proc_root }}', 'root': '{{ gpu_node_root }}',
                                             'nvidia_smi': '{{ gpufleet_lab_dir }}/driver/bin/nvidia-smi'}}
    play = [{'name': 'both ways', 'hosts': 'pve1', 'gather_facts': False, 'tasks': [task]}]
    seen = {}
    for direct in ('1', '0'):
        r = run_playbook(play, tmp_path, env={'GPUFLEET_DIRECT': direct})
        res = r.task(0, 'pve1')
        assert not res.get('failed'), res
        seen[direct] = res
    facts = [seen[d]['ansible_facts']['gpufleet_gpu_devices'] for d in ('1', '0')]
    assert facts[0] == facts[1] and facts[0]['count'] == 8
    # the module's own run says its invocation (AnsibleModule); the direct program prints the entry point's result
    assert 'invocation' in seen['0'] and 'invocation' not in seen['1']
