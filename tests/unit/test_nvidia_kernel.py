"""The NVIDIA module across a node's kernels (module_utils _nvidia_kernel), on node trees made in a directory."""

import os

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _nvidia_kernel as nk

RUNNING, NEXT = '6.14.11-4-pve', '6.17.2-1-pve'


def put(root, rel, text=''):
    path = os.path.join(str(root), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as fh:
        fh.write(text)


def node(tmp_path, kernels=(RUNNING,), built=(RUNNING,), version='580.95.05', held=True):
    proc, root = tmp_path / 'proc', tmp_path / 'root'
    put(proc, 'sys/kernel/osrelease', RUNNING + '\n')
    for k in kernels:
        put(root, 'boot/vmlinuz-' + k)
    for k in built:
        put(root, 'lib/modules/{0}/updates/dkms/nvidia.ko'.format(k))
        put(root, 'var/lib/dkms/nvidia/{0}/{1}/x86_64/module/nvidia.ko'.format(version, k))
    put(root, 'var/lib/dpkg/status', ''.join(
        'Package: {0}\nStatus: {1} ok installed\nSource: nvidia-graphics-drivers\nVersion: {2}-1\n\n'.format(
            n, 'hold' if held else 'install', version)
        for n in ('nvidia-kernel-dkms', 'libcuda1')) + 'Package: bash\nStatus: install ok installed\nVersion: 5.2\n\n'
        # NVIDIA's container toolkit is versioned apart from the driver: not one of its packages
        'Package: libnvidia-container1\nStatus: install ok installed\nVersion: 1.17.8-1\n\n'
        'Package: nvidia-container-toolkit\nStatus: install ok installed\nVersion: 1.17.8-1\n')
    return str(proc), str(root)


def found(proc, root, loaded='580.95.05', installed=('580.95.05',), hold=True):
    return nk.findings(nk.state(proc, root), loaded, list(installed), hold)


def test_a_node_whose_module_is_built_for_its_kernels_and_held_has_no_finding(tmp_path):
    proc, root = node(tmp_path, kernels=(RUNNING, NEXT), built=(RUNNING, NEXT))
    st = nk.state(proc, root)
    assert (st['running_kernel'], st['next_kernel'], st['next_kernel_why']) == (RUNNING, NEXT, 'the newest installed')
    assert st['dkms'] == {'580.95.05': {'built': [RUNNING, NEXT], 'make_log': None, 'module': 'nvidia'}}
    assert st['packages'] == {
        'nvidia-kernel-dkms': {'version': '580.95.05-1', 'held': True, 'source': 'nvidia-graphics-drivers',
                               'state': 'installed'},
        'libcuda1': {'version': '580.95.05-1', 'held': True, 'source': 'nvidia-graphics-drivers', 'state': 'installed'}}
    assert (st['unfinished'], st['runfile'], st['headers']) == ({}, [], {RUNNING: False, NEXT: False})
    # a package of another source, not held (Debian's nvidia-modprobe): an upgrade of it replaces no driver
    with open(os.path.join(root, 'var/lib/dpkg/status'), 'a') as fh:
        fh.write('\n\nPackage: nvidia-modprobe\nStatus: install ok installed\nVersion: 535.309.01-0+deb12u1\n')
    assert found(proc, root) == [] and nk.driver_set(nk.packages(root)) == ['libcuda1', 'nvidia-kernel-dkms']
    assert found(proc, root) == []


def test_the_kernel_a_node_boots_next_without_the_module_or_with_a_failed_build(tmp_path):
    proc, root = node(tmp_path, kernels=(RUNNING, NEXT))
    (missing,) = found(proc, root)
    assert missing['code'] == 'module_missing_next_kernel' and missing['kernel'] == NEXT
    assert missing['fix'] == 'apt install proxmox-headers-{0} && dkms install nvidia/580.95.05 -k {0}'.format(NEXT)
    put(root, 'var/lib/dkms/nvidia/580.95.05/build/make.log', 'error\n')
    (failed,) = found(proc, root)
    assert failed['code'] == 'module_build_failed' and failed['log'].endswith('580.95.05/build/make.log')
    assert 'proxmox-boot-tool kernel pin ' + RUNNING in failed['fix']
    # pinned to the running kernel, the node boots it again: nothing to say
    put(root, 'etc/kernel/proxmox-boot-pin', RUNNING + '\n')
    assert nk.next_kernel(root, RUNNING) == (RUNNING, 'pinned') and found(proc, root) == []
    # a next-boot pin wins over the pin
    put(root, 'etc/kernel/next-boot-pin', NEXT + '\n')
    assert nk.next_kernel(root, RUNNING) == (NEXT, 'pinned for the next boot')


def test_a_module_built_for_the_next_kernel_of_another_version_than_the_userspace(tmp_path):
    proc, root = node(tmp_path, kernels=(RUNNING, NEXT), built=(RUNNING, NEXT), version='570.172.08')
    (other,) = found(proc, root, loaded='570.172.08', installed=['570.172.08', '580.95.05'])
    assert other['code'] == 'module_version_next_kernel' and other['fix'] == 'dkms install nvidia/580.95.05 -k ' + NEXT
    assert 'is 570.172.08, but the userspace driver is 580.95.05' in other['msg']


def test_the_running_kernel_without_its_module_and_a_runfile_install(tmp_path):
    proc, root = node(tmp_path, kernels=(RUNNING, NEXT), built=())
    codes = [f['code'] for f in found(proc, root)]
    assert codes == ['module_missing_running_kernel', 'module_missing_next_kernel']
    # NVIDIA's installer without DKMS: the module under kernel/drivers/video, no DKMS tree, no packages
    put(root, 'lib/modules/{0}/kernel/drivers/video/nvidia.ko'.format(RUNNING))
    os.unlink(os.path.join(root, 'var/lib/dpkg/status'))
    (missing,) = found(proc, root)
    assert missing['fix'] == ('apt install proxmox-headers-{0} && sh NVIDIA-Linux-x86_64-580.95.05.run --silent '
                              '--kernel-name={0}'.format(NEXT))


def test_driver_packages_not_held_and_no_proc_to_compare(tmp_path):
    proc, root = node(tmp_path, held=False)
    (loose,) = found(proc, root)
    assert loose['code'] == 'driver_not_held' and loose['fix'] == 'apt-mark hold libcuda1 nvidia-kernel-dkms'
    assert found(proc, root, hold=False) == []
    assert found(str(tmp_path / 'elsewhere'), root) == []  # no osrelease: not a node's /proc
    assert sorted(['6.8.12-9-pve', '6.14.11-4-pve', '6.8.12-10-pve'], key=nk.version_key) == \
        ['6.8.12-9-pve', '6.8.12-10-pve', '6.14.11-4-pve']


def test_the_newest_userspace_driver_is_the_newest_by_version_not_by_spelling(tmp_path):
    from ansible_collections.gpufleet.proxmox.plugins.module_utils import _nvidia_bundle
    lib = tmp_path / 'lib'
    for version in ('580.105.08', '580.95.05'):
        put(lib, 'libcuda.so.' + version)
    installed = _nvidia_bundle.installed_versions([str(lib)])
    assert installed == ['580.95.05', '580.105.08']
    proc, root = node(tmp_path, kernels=(RUNNING, NEXT), built=(RUNNING, NEXT), version='580.95.05')
    (other,) = found(proc, root, installed=installed)
    assert other['code'] == 'module_version_next_kernel' and other['fix'] == 'dkms install nvidia/580.105.08 -k ' + NEXT


def test_debians_dkms_module_is_nvidia_current_and_its_fixes_name_it(tmp_path):
    """Debian's nvidia-kernel-dkms registers the module as nvidia-current (its files nvidia-current.ko ...): read from
    the node, it is found built, and a fix names it as dkms knows it."""
    proc, root = tmp_path / 'proc', tmp_path / 'root'
    put(proc, 'sys/kernel/osrelease', RUNNING + '\n')
    for k in (RUNNING, NEXT):
        put(root, 'boot/vmlinuz-' + k)
    put(root, 'lib/modules/{0}/updates/dkms/nvidia-current.ko'.format(RUNNING))
    put(root, 'var/lib/dkms/nvidia-current/535.261.03/{0}/x86_64/module/nvidia-current.ko'.format(RUNNING))
    st = nk.state(str(proc), str(root))
    assert st['dkms'] == {'535.261.03': {'built': [RUNNING], 'make_log': None, 'module': 'nvidia-current'}}
    assert st['modules'][RUNNING].endswith('updates/dkms/nvidia-current.ko')
    (missing,) = nk.findings(st, '535.261.03', ['535.261.03'], hold=False)
    assert missing['code'] == 'module_missing_next_kernel'
    assert missing['fix'].endswith('dkms install nvidia-current/535.261.03 -k ' + NEXT)
    assert nk.dkms_name(st, '535.261.03') == nk.dkms_name(st, '535.309.01') == 'nvidia-current'
    assert nk.dkms_name({'dkms': {}}, '580.95.05') == 'nvidia'  # nothing built: NVIDIA's installer's name


def test_what_a_driver_change_needs_of_the_node_is_read_from_its_files(tmp_path):
    """dpkg's unfinished packages (as dpkg --audit reads its status), the headers of each kernel (its build link,
    absolute within the node's root, as Debian's linux-headers packages make it), NVIDIA's installer's files."""
    proc, root = node(tmp_path, kernels=(RUNNING, NEXT), built=(RUNNING, NEXT))
    os.makedirs(os.path.join(root, 'usr/src/linux-headers-' + RUNNING))
    os.symlink('/usr/src/linux-headers-' + RUNNING, os.path.join(root, 'lib/modules', RUNNING, 'build'))
    os.symlink('/usr/src/linux-headers-' + NEXT, os.path.join(root, 'lib/modules', NEXT, 'build'))  # dangling
    with open(os.path.join(root, 'var/lib/dpkg/status'), 'a') as fh:
        fh.write('\n\nPackage: firmware-nvidia-gsp\nStatus: install ok half-configured\nSource: nvidia-graphics-drivers'
                 '\nVersion: 535.309.01-0+deb12u1\n\nPackage: old\nStatus: deinstall ok config-files\nVersion: 1\n')
    put(root, 'usr/bin/nvidia-uninstall')
    st = nk.state(proc, root)
    assert st['headers'] == {RUNNING: True, NEXT: False}
    assert st['unfinished'] == {'firmware-nvidia-gsp': 'half-configured'}
    assert st['packages']['firmware-nvidia-gsp'] == {'version': '535.309.01-0+deb12u1', 'held': False,
                                                     'source': 'nvidia-graphics-drivers', 'state': 'half-configured'}
    assert st['runfile'] == ['usr/bin/nvidia-uninstall']
    assert nk.headers_package(NEXT) == 'proxmox-headers-' + NEXT
    assert nk.headers_package('6.1.0-57-amd64') == 'linux-headers-6.1.0-57-amd64'
