"""What the lab makes of a PVE container config: pure translations, checked line by line."""

import os

import pytest
from gpufleet.lab import lxcconf, pveconf
from gpufleet.lab.layout import Lab


def test_split_props_takes_the_default_key():
    assert lxcconf.split_props('/dev/nvidia0,mode=0666,uid=1', 'path') == {
        'path': '/dev/nvidia0', 'mode': '0666', 'uid': '1'}
    assert lxcconf.split_props('name=eth0,bridge=vmbr0', 'name') == {'name': 'eth0', 'bridge': 'vmbr0'}
    with pytest.raises(lxcconf.ConfigError):
        lxcconf.split_props('novalue')


@pytest.mark.parametrize('key,v2,expected', [
    ('lxc.cgroup2.devices.allow', False, 'lxc.cgroup.devices.allow'),
    ('lxc.cgroup2.memory.max', False, 'lxc.cgroup.memory.limit_in_bytes'),
    ('lxc.cgroup2.devices.allow', True, 'lxc.cgroup2.devices.allow'),
    ('lxc.cgroup.devices.allow', True, 'lxc.cgroup2.devices.allow'),
    ('lxc.mount.entry', False, 'lxc.mount.entry'),
])
def test_raw_entries_are_written_for_the_hosts_cgroup_version(key, v2, expected):
    assert lxcconf.translate_raw(key, 'x', v2) == (expected, 'x')


def test_render_unprivileged_with_devices(tmp_path):
    dev = tmp_path / 'dev'
    dev.mkdir()
    os.mknod(str(dev / 'nvidia3'), 0o666 | 0o020000, os.makedev(195, 3))
    lab = Lab(root=str(tmp_path / 'lab'), cache=str(tmp_path / 'cache'), dev_dir=str(dev), bridge='lo')
    config = {'hostname': 'gpu-a', 'unprivileged': 1, 'memory': 2048, 'cores': 1,
              'dev0': 'path=/dev/nvidia3,deny-write=1', 'lxc': [['lxc.cgroup2.devices.allow', 'c 10:200 rwm']]}
    text = lxcconf.render(120, config, lab, False, '/lab/lxc/120/rootfs', {'dev0': '/pt/dev/nvidia3'})
    lines = text.splitlines()
    # the overlay the lab mounted, given to LXC as a directory (no overlay of LXC's own, no userxattr)
    assert 'lxc.rootfs.path = dir:/lab/lxc/120/rootfs' in lines and not any('rootfs.options' in x for x in lines)
    assert 'lxc.include = /usr/share/lxc/config/userns.conf' in lines
    assert 'lxc.idmap = u 0 100000 65536' in lines
    assert 'lxc.uts.name = gpu-a' in lines
    assert 'lxc.cgroup.memory.limit_in_bytes = 2147483648' in lines
    # The deny-all rule comes after the includes (userns.conf empties the list) and before the allows.
    assert lines.index('lxc.cgroup.devices.deny = a') > lines.index('lxc.include = /usr/share/lxc/config/userns.conf')
    assert 'lxc.mount.entry = /pt/dev/nvidia3 dev/nvidia3 none bind,create=file 0 0' in lines
    assert 'lxc.cgroup.devices.allow = c 195:3 r' in lines
    assert lines[-1] == 'lxc.cgroup.devices.allow = c 10:200 rwm'
    v2 = lxcconf.render(120, config, lab, True, '/lab/lxc/120/rootfs', {'dev0': '/pt/dev/nvidia3'})
    assert 'lxc.cgroup2.devices.allow = c 195:3 r' in v2.splitlines()
    assert 'lxc.cgroup2.memory.max = 2147483648' in v2.splitlines()


def test_missing_device_is_named(tmp_path):
    with pytest.raises(lxcconf.ConfigError, match='Device /dev/nvidia9 does not exist'):
        lxcconf.device_node({'path': '/dev/nvidia9'}, str(tmp_path))
    with pytest.raises(lxcconf.ConfigError, match='not under /dev'):
        lxcconf.device_node({'path': '/etc/passwd'}, str(tmp_path))


def test_network_files_follow_net0():
    files = lxcconf.network_files({'hostname': 'h1', 'net0': 'name=eth0,bridge=vmbr0,ip=10.77.0.9/24,gw=10.77.0.1',
                                   'net1': 'name=eth1,bridge=vmbr0,ip=dhcp'})
    assert 'Address=10.77.0.9/24\nGateway=10.77.0.1' in files['/etc/systemd/network/eth0.network']
    assert 'DHCP=ipv4' in files['/etc/systemd/network/eth1.network']
    assert files['/etc/hostname'] == 'h1\n'


def test_pve_conf_round_trip():
    config = {'arch': 'amd64', 'cores': 4, 'hostname': 'a', 'description': 'line one\nline two: 100%',
              'dev0': 'path=/dev/nvidia0', 'onboot': 0,
              'lxc': [['lxc.cgroup2.devices.allow', 'c 195:* rwm'], ['lxc.mount.entry', '/dev/x dev/x none bind']]}
    pending = {'memory': 4096, 'dev1': None}
    text = pveconf.dump(config, pending)
    assert text.splitlines()[0] == '#line one'
    assert 'lxc.cgroup2.devices.allow: c 195:* rwm' in text.splitlines()
    assert '[pve:pending]' in text and 'delete: dev1' in text
    assert pveconf.parse(text) == (config, pending)


def test_containers_with_cores_are_spread_over_the_cpus_as_pvestatd_balances_them():
    assert lxcconf.parse_cpus('0-2,5\n') == [0, 1, 2, 5]
    assert lxcconf.cpu_list([3, 0, 1]) == '0,1,3'
    # each new one-core container goes to the CPU with the fewest containers, the lower number on a tie
    taken = []
    for _ in range(5):
        taken.append(lxcconf.balanced(1, taken, [0, 1]))
    assert taken == [[0], [1], [0], [1], [0]]
    assert lxcconf.balanced(2, [[0], [0], [1]], [0, 1, 2, 3]) == [2, 3]
    assert lxcconf.balanced(8, [], [0, 1]) == [0, 1]  # no more CPUs than the node has
    config = {'cores': 1}
    assert 'lxc.cgroup2.cpuset.cpus = 1' in lxcconf.limit_lines(config, True, [1])


def test_raw_keys_pve_does_not_pass_on_are_dropped_as_pve_drops_them():
    assert lxcconf.pve_passes('lxc.prlimit.memlock') and lxcconf.pve_passes('lxc.mount.entry')
    assert lxcconf.pve_passes('lxc.cgroup2.devices.allow') and lxcconf.pve_passes('lxc.net.0.type')
    # LXC would take these; PVE warns and starts the container without them
    assert not lxcconf.pve_passes('lxc.rootfs.options') and not lxcconf.pve_passes('lxc.environment.runtime')
    assert not lxcconf.pve_passes('lxc.rootfs.path') and not lxcconf.pve_passes('lxc.sysctl.net.core.somaxconn')
    assert lxcconf.pve_passes('lxc.mount')  # renamed by LXC 3.0: PVE warns and passes it, and LXC refuses it


def test_an_unprivileged_container_gets_pves_seccomp_rules_keyctl_only_with_its_feature():
    assert lxcconf.seccomp_rules({'unprivileged': 1}) == (
        'ioctl errno 1 [1,0x9400,SCMP_CMP_MASKED_EQ,0xff00]\nkeyctl errno 38\nsocket errno 97 [0,38,SCMP_CMP_EQ]\n')
    assert 'keyctl' not in lxcconf.seccomp_rules({'unprivileged': 1, 'features': 'nesting=1,keyctl=1'})
    assert 'keyctl' in lxcconf.seccomp_rules({'unprivileged': 1, 'features': 'nesting=1'})
    assert lxcconf.seccomp_rules({'unprivileged': 0, 'features': 'keyctl=1'}) is None
    assert lxcconf.seccomp_rules({'unprivileged': 1, 'lxc': [['lxc.seccomp.profile', '/x']]}) is None
