"""Containers made through the lab's API are real LXC containers, reached with `pct` over SSH."""

import os
import subprocess

import pytest
from gpufleet.lab import host, manager
from proxmoxer.core import ResourceException
from gpufleet.lab.containers import Containers

pytestmark = pytest.mark.lab

OPEN = ('import errno, os, sys\n'
        'for p in sys.argv[1:]:\n'
        '    try:\n'
        '        os.close(os.open(p, os.O_RDWR)); print(p, "OK")\n'
        '    except OSError as e:\n'
        '        print(p, errno.errorcode[e.errno])\n')


def pct(node_ssh, command, env=''):
    """pct on the lab node over its sshd, as an operator or the collection runs it (env: VAR=value before it)."""
    return node_ssh('{0} pct {1}'.format(env, command).strip())


def opens(node_ssh, vmid, *paths):
    """What opening each path inside the container gives: OK, ENXIO, EPERM, ENOENT."""
    r = node_ssh("pct exec {0} -- python3 -c '{1}' {2}".format(vmid, OPEN, ' '.join(paths)))
    assert r.returncode == 0, r.stderr
    return dict(line.split() for line in r.stdout.splitlines())


def agree(control, vmid):
    row = [c for c in control.state() if c['vmid'] == vmid]
    return (row[0]['api'], row[0]['real']) if row else None


def test_container_runs_for_real_and_pct_reaches_it_over_ssh(lab, pve, control, node_ssh):
    pve.create(941, hostname='alpha', cores=1, memory=768)
    assert agree(control, 941) == ('stopped', 'stopped')
    pve.start(941)
    assert agree(control, 941) == ('running', 'running')
    info = subprocess.run(['lxc-info', '-P', lab.lxcpath, '-n', '941', '-s', '-H'], stdout=subprocess.PIPE, text=True)
    assert info.stdout.strip() == 'RUNNING'
    r = pct(node_ssh, 'exec 941 -- hostname')
    assert (r.returncode, r.stdout.strip()) == (0, 'alpha')
    addr = pct(node_ssh, 'exec 941 -- ip -4 -o addr show dev eth0').stdout
    assert '10.77.0.143/24' in addr
    mem = subprocess.run(['lxc-cgroup', '-P', lab.lxcpath, '-n', '941', 'memory.limit_in_bytes'],
                         stdout=subprocess.PIPE, text=True).stdout.strip()
    assert int(mem) == 768 * 1024 * 1024
    pve.stop(941)
    assert agree(control, 941) == ('stopped', 'stopped')
    assert pct(node_ssh, 'status 941').stdout.strip() == 'status: stopped'
    pve.ok(pve.ct(941).delete())
    assert agree(control, 941) is None
    assert not os.path.exists(lab.ct_dir(941))
    gone = pct(node_ssh, 'status 941')
    assert gone.returncode != 0 and "lxc/941.conf' does not exist" in gone.stderr


def test_devn_passthrough_hotplug_and_removal_on_restart(pve, node_ssh):
    pve.create(942, dev0='path=/dev/nvidia0,mode=0666', dev1='/dev/nvidiactl')
    pve.start(942)
    seen = opens(node_ssh, 942, '/dev/nvidia0', '/dev/nvidiactl', '/dev/nvidia1')
    # Passed through: the node is there and the cgroup lets it open; no driver behind it: ENXIO.
    assert seen == {'/dev/nvidia0': 'ENXIO', '/dev/nvidiactl': 'ENXIO', '/dev/nvidia1': 'ENOENT'}
    # A new devN is hot-plugged into the running container, as PVE does.
    pve.ct(942).config.put(dev2='path=/dev/nvidia2')
    assert pve.ct(942).config.get(current=1)['dev2'] == 'path=/dev/nvidia2'
    assert opens(node_ssh, 942, '/dev/nvidia2') == {'/dev/nvidia2': 'ENXIO'}
    # Removing one waits for a restart: pending until then, gone after.
    pve.ct(942).config.put(delete='dev0')
    pending = {p['key']: p for p in pve.ct(942).pending.get()}
    assert pending['dev0'].get('delete') == 1
    assert opens(node_ssh, 942, '/dev/nvidia0') == {'/dev/nvidia0': 'ENXIO'}
    pve.stop(942)
    pve.start(942)
    assert 'dev0' not in pve.ct(942).config.get(current=1)
    assert opens(node_ssh, 942, '/dev/nvidia0', '/dev/nvidia2') == {'/dev/nvidia0': 'ENOENT', '/dev/nvidia2': 'ENXIO'}


def test_raw_lxc_entries_and_the_cgroup_rule(lab, pve, node_ssh):
    """A node bound in without a cgroup rule gives EPERM; with the rule (written as cgroup2, as PVE
    wants it) it gives ENXIO.  The raw lines live in the node's .conf, as on PVE < 8.1."""
    pve.create(943)
    conf = '/'.join([lab.pve_conf_dir, '943.conf'])
    entry = 'lxc.mount.entry: /dev/nvidia5 dev/nvidia5 none bind,optional,create=file'
    assert node_ssh("echo '{0}' >> {1}".format(entry, conf)).returncode == 0
    raw = pve.ct(943).config.get()['lxc']
    assert ['lxc.mount.entry', '/dev/nvidia5 dev/nvidia5 none bind,optional,create=file'] in raw
    pve.start(943)
    assert opens(node_ssh, 943, '/dev/nvidia5') == {'/dev/nvidia5': 'EPERM'}
    pve.stop(943)
    # PVE reads 'lxc.key = value' as well, and keys with dashes (Config.pm parse_pct_config)
    lines = 'lxc.cgroup2.devices.allow = c 195:5 rw\nlxc.hook.pre-start = /bin/true'
    assert node_ssh("printf '{0}\\n' >> {1}".format(lines, conf)).returncode == 0
    raw = pve.ct(943).config.get()['lxc']
    assert ['lxc.cgroup2.devices.allow', 'c 195:5 rw'] in raw and ['lxc.hook.pre-start', '/bin/true'] in raw
    pve.start(943)
    assert opens(node_ssh, 943, '/dev/nvidia5') == {'/dev/nvidia5': 'ENXIO'}


def as_nobody(node_ssh, vmid, *paths):
    """What opening each path gives to an unprivileged user of the container (nobody)."""
    r = node_ssh("pct exec {0} -- setpriv --reuid=65534 --regid=65534 --clear-groups python3 -c '{1}' {2}".format(
        vmid, OPEN, ' '.join(paths)))
    assert r.returncode == 0, r.stderr
    return dict(line.split() for line in r.stdout.splitlines())


def modes(node_ssh, vmid, *paths):
    r = node_ssh("pct exec {0} -- stat -c '%n %a %u %g' {1}".format(vmid, ' '.join(paths)))
    assert r.returncode == 0, r.stderr
    return dict((line.split()[0], ' '.join(line.split()[1:])) for line in r.stdout.splitlines())


def test_devn_nodes_are_0660_root_unless_the_entry_says(pve, node_ssh):
    # PVE's defaults (LXC.pm create_passthrough_device_node), not the node's own 0666: at start and hot-plugged
    pve.create(946, dev0='/dev/nvidia0', dev1='path=/dev/nvidia1,mode=0666', dev2='path=/dev/nvidiactl,gid=44')
    pve.start(946)
    pve.ct(946).config.put(dev3='/dev/nvidia2')
    assert modes(node_ssh, 946, '/dev/nvidia0', '/dev/nvidia1', '/dev/nvidiactl', '/dev/nvidia2') == {
        '/dev/nvidia0': '660 0 0', '/dev/nvidia1': '666 0 0', '/dev/nvidiactl': '660 0 44', '/dev/nvidia2': '660 0 0'}
    assert opens(node_ssh, 946, '/dev/nvidia0', '/dev/nvidia2') == {'/dev/nvidia0': 'ENXIO', '/dev/nvidia2': 'ENXIO'}
    assert as_nobody(node_ssh, 946, '/dev/nvidia0', '/dev/nvidia1', '/dev/nvidia2') == {
        '/dev/nvidia0': 'EACCES', '/dev/nvidia1': 'ENXIO', '/dev/nvidia2': 'EACCES'}


def test_a_missing_device_is_refused_at_create_and_change_and_fails_the_start(pve, control, node_ssh):
    # Config.pm update_pct_config validates every devN (Tools.pm get_device_mode_and_rdev) before anything is
    # written: the create is refused before its task, the change under the lock; the start checks again.
    with pytest.raises(ResourceException) as err:
        pve.create(944, dev0='path=/dev/nvidia-caps/nvidia-cap9')
    assert err.value.status_code == 500 and 'Device /dev/nvidia-caps/nvidia-cap9 does not exist' in str(err.value)
    assert 944 not in [c['vmid'] for c in control.state()]
    pve.create(944)
    with pytest.raises(ResourceException) as err:
        pve.ct(944).config.put(dev0='/dev/nvidia-caps/nvidia-cap9', cores=3)
    assert 'Device /dev/nvidia-caps/nvidia-cap9 does not exist' in str(err.value)
    config = pve.ct(944).config.get()
    assert 'dev0' not in config and config.get('cores') != 3
    assert not [p for p in pve.ct(944).pending.get() if 'pending' in p or p.get('delete')]
    assert node_ssh('mknod -m 0666 /dev/gpufleet-lab-gone c 1 3').returncode == 0
    try:
        pve.ct(944).config.put(dev0='/dev/gpufleet-lab-gone')
    finally:
        node_ssh('rm -f /dev/gpufleet-lab-gone')
    st, log = pve.wait(pve.ct(944).status.start.post())
    assert 'Device /dev/gpufleet-lab-gone does not exist' in st['exitstatus']
    assert log[-1].startswith('TASK ERROR')
    assert agree(control, 944) == ('stopped', 'stopped')


def test_devn_hotplug_follows_the_pve_version(pve, control, node_ssh):
    pve.create(947)
    pve.start(947)
    control.set_version('8.4.1')
    try:
        # PVE 8 (pve-container 5.x): no devN hotplug, the new device waits in pending
        pve.ct(947).config.put(dev0='/dev/nvidia3')
        pending = {p['key']: p for p in pve.ct(947).pending.get()}
        assert pending['dev0'].get('pending') == '/dev/nvidia3' and 'value' not in pending['dev0']
        assert opens(node_ssh, 947, '/dev/nvidia3') == {'/dev/nvidia3': 'ENOENT'}
    finally:
        control.set_version('9.0.10')
    # PVE 9 (6.0.4 and later): a new devN key is hot-plugged
    pve.ct(947).config.put(dev1='/dev/nvidia4')
    pending = {p['key']: p for p in pve.ct(947).pending.get()}
    assert pending['dev1'].get('value') == '/dev/nvidia4' and 'pending' not in pending['dev1']
    assert opens(node_ssh, 947, '/dev/nvidia3', '/dev/nvidia4') == {'/dev/nvidia3': 'ENOENT', '/dev/nvidia4': 'ENXIO'}
    pve.stop(947)
    pve.start(947)  # the restart takes the pending one
    assert opens(node_ssh, 947, '/dev/nvidia3') == {'/dev/nvidia3': 'ENXIO'}


def test_a_failed_devn_hotplug_fails_the_whole_change_and_writes_nothing(pve, node_ssh):
    # PVE 9: API2/LXC/Config.pm writes no config when a hotplug failed, and answers 400 with each key's error
    pve.create(951, cores=1)
    pve.start(951)
    assert node_ssh('mknod -m 0666 /dev/gpufleet-lab-951 c 1 3').returncode == 0
    try:
        assert pct(node_ssh, 'exec 951 -- mkdir /dev/gpufleet-lab-951').returncode == 0  # in the way, as a directory
        with pytest.raises(ResourceException) as err:
            pve.ct(951).config.put(dev0='/dev/gpufleet-lab-951', tags='x')
    finally:
        node_ssh('rm -f /dev/gpufleet-lab-951')
    assert err.value.status_code == 400
    assert "unable to hotplug dev0: failed to create '/dev/gpufleet-lab-951': Is a directory" in str(err.value.errors)
    config = pve.ct(951).config.get()
    assert 'dev0' not in config and 'tags' not in config
    assert not [p for p in pve.ct(951).pending.get() if 'pending' in p or p.get('delete')]


def test_a_new_devn_for_a_path_the_container_has_fails_as_pves_mknod_does(pve, node_ssh):
    # src/PVE/LXC.pm create_passthrough_device_node: the node of a path already passed through exists in the
    # container's passthrough directory, so its mknod fails, and with it the whole change (API2/LXC/Config.pm)
    pve.create(952, cores=1, dev0='/dev/nvidia3')
    pve.start(952)
    with pytest.raises(ResourceException) as err:
        pve.ct(952).config.put(dev1='/dev/nvidia3')
    assert err.value.status_code == 400
    assert 'unable to hotplug dev1: failed to mknod /var/lib/lxc/952/passthrough/dev/nvidia3: File exists' in str(
        err.value.errors)
    assert 'dev1' not in pve.ct(952).config.get()
    # a stopped container takes the change, and its start fails as PVE's prestart hook does
    pve.stop(952)
    pve.ct(952).config.put(dev1='/dev/nvidia3')
    st, log = pve.wait(pve.ct(952).status.start.post())
    assert st['exitstatus'] != 'OK' and any('failed to mknod' in line for line in log), (st, log)


def test_pct_exec_push_pull_and_exit_codes(lab, pve, node_ssh, tmp_path):
    pve.create(945)
    stopped = pct(node_ssh, 'exec 945 -- true')
    assert stopped.returncode == 255 and "container '945' not running!" in stopped.stderr
    pve.start(945)
    assert pct(node_ssh, "exec 945 -- sh -c 'exit 7'").returncode == 7
    # as pve-container's pct.pm exec: the caller's environment kept (--keep-env 1 on PVE 8 and 9) with the CLI
    # handler's PATH, which has no /usr/local/bin; --keep-env 0 is lxc's cleared one; a dash argument of the
    # command before `--` is an option, and an unknown one fails the call
    env = pct(node_ssh, "exec 945 -- sh -c 'echo $PATH; echo ${GPUFLEET_PROBE:-unset}'", env='GPUFLEET_PROBE=kept')
    assert env.stdout.split() == ['/sbin:/bin:/usr/sbin:/usr/bin', 'kept'], env
    cleared = pct(node_ssh, "exec 945 --keep-env 0 -- sh -c 'echo ${GPUFLEET_PROBE:-unset}'", env='GPUFLEET_PROBE=kept')
    assert cleared.stdout.split() == ['unset'], cleared
    dashed = pct(node_ssh, 'exec 945 ls -la /')
    assert dashed.returncode == 255 and 'unable to parse option' in dashed.stderr, dashed
    assert pct(node_ssh, 'exec 945 -- ls -la /').returncode == 0
    listing = pct(node_ssh, 'list').stdout.splitlines()
    assert listing[0].split() == ['VMID', 'Status', 'Lock', 'Name']
    assert ['945', 'running', 'ct945'] in [line.split() for line in listing[1:]]
    config = dict(line.split(': ', 1) for line in pct(node_ssh, 'config 945').stdout.splitlines())
    assert config['hostname'] == 'ct945' and config['unprivileged'] == '1'
    # push with owner and mode, pull back: the same bytes.
    src = tmp_path / 'payload.bin'
    src.write_bytes(os.urandom(200000))
    node_file = '/'.join([lab.root, 'payload.bin'])
    with open(node_file, 'wb') as fh:
        fh.write(src.read_bytes())
    assert pct(node_ssh, 'push 945 {0} /tmp/payload.bin --perms 0600 --user 1000 --group 1000'.format(
        node_file)).returncode == 0
    assert pct(node_ssh, "exec 945 -- stat -c '%a %u %g %s' /tmp/payload.bin").stdout.split() == [
        '600', '1000', '1000', '200000']
    back = '/'.join([lab.root, 'payload.back'])
    assert pct(node_ssh, 'pull 945 /tmp/payload.bin {0}'.format(back)).returncode == 0
    with open(back, 'rb') as fh:
        assert fh.read() == src.read_bytes()
    os.unlink(back)
    os.unlink(node_file)


def test_unprivileged_maps_ids_and_privileged_does_not(lab, pve):
    pve.create(946)
    pve.create(947, unprivileged=0)
    pve.start(946)
    pve.start(947)
    containers = Containers(lab)

    def host_uid(vmid):
        with open('/proc/{0}/status'.format(containers.pid(vmid))) as fh:
            return [line.split()[1] for line in fh if line.startswith('Uid:')][0]
    assert host_uid(946) == '100000'
    assert host_uid(947) == '0'


def test_a_containers_root_file_system_renames_directories_and_apt_installs_into_it(lab, pve, node_ssh):
    """PVE's rootfs is a real file system, where dpkg renames what it replaces; the lab's overlay must be one too."""
    rename = ("import os; os.rename('/usr/share/doc/bash', '/usr/share/doc/bash.moved'); "
              "os.rename('/usr/share/doc/bash.moved', '/usr/share/doc/bash'); print(os.listdir('/usr/share/doc/bash'))")
    for vmid, unprivileged in ((948, 1), (949, 0)):
        pve.create(vmid, unprivileged=unprivileged)
        pve.start(vmid)
        moved = pct(node_ssh, 'exec {0} -- python3 -c "{1}"'.format(vmid, rename))
        assert moved.returncode == 0 and 'copyright' in moved.stdout, (vmid, moved.stderr)
        apt = pct(node_ssh, "exec {0} -- sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install "
                            "-y -qq --no-install-recommends tree && apt-get install -y -qq --reinstall bash && "
                            "tree --version'".format(vmid))
        assert apt.returncode == 0 and 'tree v' in apt.stdout, (vmid, apt.stdout[-2000:] + apt.stderr[-2000:])


KEYCTL = ('import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); '
          'r = libc.syscall(250, 0, -3, 0); print(os.strerror(ctypes.get_errno()) if r < 0 else "ok")')


def test_keyctl_fails_in_an_unprivileged_container_unless_its_features_allow_it(lab, pve, node_ssh):
    """pve-container's seccomp rules (LXC.pm make_seccomp_config): keyctl is ENOSYS without keyctl=1."""
    pve.create(950)
    pve.create(951, features='nesting=1,keyctl=1')
    for vmid in (950, 951):
        pve.start(vmid)
    said = dict((vmid, pct(node_ssh, "exec {0} -- python3 -c '{1}'".format(vmid, KEYCTL)).stdout.strip())
                for vmid in (950, 951))
    assert said[950] == 'Function not implemented' and said[951] != 'Function not implemented', said


def test_api_state_survives_a_daemon_restart(lab, pve, control):
    pve.create(948, cores=2)
    pve.start(948)
    host.stop_daemon(lab)
    assert not host.daemon_running(lab)
    manager.up(lab, say=lambda m: None)
    assert agree(control, 948) == ('running', 'running')
    assert pve.ct(948).config.get()['cores'] == 2



def test_a_node_reboot_takes_the_device_nodes_and_onboot_containers_fail_without_them(lab, pve, control):
    """What a real node does: after a reboot no NVIDIA device node exists until something makes it (the driver
    does not; nvidia-modprobe or udev does) and nvidia-uvm has another major, so an onboot container that passes
    a GPU through fails to start, one without starts, and one without onboot stays down."""
    pve.create(948, onboot=1, dev0='/dev/nvidia1')
    pve.create(949, onboot=1, startup='order=1')
    pve.create(950)
    for vmid in (948, 949, 950):
        pve.start(vmid)
    uvm = lab.record()['gpus']['uvm_major']
    wants = lab.path('node', 'etc', 'systemd', 'system', 'multi-user.target.wants')
    aside = wants + '.aside'
    if os.path.isdir(wants):
        os.rename(wants, aside)  # this node has no boot unit of the collection's
    try:
        done = manager.reboot_node(lab, say=lambda msg: None)
    finally:
        if os.path.isdir(aside):
            os.rename(aside, wants)
        manager.up(lab, say=lambda msg: None)  # the lab's own stand-ins back, as they were made at its first boot
    assert done['uvm_major'] != uvm and done['units'] == {}
    # startup order first, then by vmid; the lab may hold other onboot containers (a run stopped part way)
    assert [s['vmid'] for s in done['started'] if s['vmid'] in (948, 949, 950)] == [949, 948]
    started = dict((s['vmid'], s['exitstatus']) for s in done['started'])
    assert started[949] == 'OK' and 'Device /dev/nvidia1 does not exist' in started[948]
    assert [agree(control, v) for v in (948, 949, 950)] == [('stopped', 'stopped'), ('running', 'running'),
                                                             ('stopped', 'stopped')]
    with open(os.path.join(lab.proc_dir, 'devices')) as fh:
        assert '{0} nvidia-uvm'.format(done['uvm_major']) in fh.read()


def test_the_wheelhouse_holds_exactly_the_cpu_profiles_lock_and_uv(lab):
    """The containers build the CPU profile's lock offline from the node wheelhouse, so it holds the lock's pins (the
    wheels' hashes checked at download), not the newest releases of torch's dependencies, and the pinned uv."""
    from gpufleet.lab.host.base import lab_lock
    from gpufleet.lab.layout import UV_PIN
    from gpufleet.profiles import read_lock
    pins, problems = read_lock(lab_lock())
    assert problems == [] and 'torch' in pins
    wheels = {}
    for name in os.listdir(lab.wheelhouse):
        if name.endswith('.whl'):
            project, version = name.split('-')[:2]
            wheels[project.lower().replace('_', '-')] = version
    want = dict((key, version) for key, (version, _hashes) in pins.items())
    want['uv'] = UV_PIN.split('==')[1]
    assert wheels == want


def test_a_node_boots_the_kernel_its_pins_or_the_newest_say_and_without_its_module_has_no_driver(lab):
    """A reboot runs the kernel proxmox-boot-tool sets up (the next-boot pin, used up by the boot; else the pin; else
    the newest installed); where that kernel has no NVIDIA module (its DKMS build failed), the driver is not loaded:
    no /proc/driver/nvidia, no nvidia lines in /proc/devices. The running kernel pinned, the next reboot has it back."""
    node, upcoming = lab.on('pve1'), '6.17.2-1-pve'
    osrelease = os.path.join(lab.proc_dir, 'sys', 'kernel', 'osrelease')
    version = os.path.join(lab.proc_dir, 'driver', 'nvidia', 'version')

    def reboot():
        manager.reboot_node(lab, say=lambda msg: None)
        with open(osrelease) as fh:
            return fh.read().strip()

    try:
        manager.install_kernel(lab, 'pve1', upcoming, module='failed')
        assert reboot() == upcoming  # the newest installed
        assert not os.path.exists(version)
        with open(os.path.join(lab.proc_dir, 'devices')) as fh:
            assert 'nvidia' not in fh.read()
        manager.install_kernel(lab, 'pve1', host.KERNEL, pin='pin')
        assert reboot() == host.KERNEL and os.path.exists(version)
        manager.install_kernel(lab, 'pve1', upcoming, module='built', pin='next-boot')
        assert reboot() == upcoming and os.path.exists(version)  # once
        assert not os.path.exists(os.path.join(node.node_files, 'etc', 'kernel', 'next-boot-pin'))
        assert reboot() == host.KERNEL  # the pin again
    finally:
        manager.restore_kernel(lab, 'pve1')
        reboot()
        manager.up(lab, say=lambda msg: None)  # the lab's own stand-ins back, as they were made at its first boot
    with open(osrelease) as fh:
        assert fh.read().strip() == host.KERNEL
    assert os.path.exists(version)
