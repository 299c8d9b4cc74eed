"""Pure logic of the collection's module_utils: comparisons, plans, fleet checks, raw lines."""

import pytest
import base64
import json
import os
import sys

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _files, _gpu, _lxc, _lxc_config, _nvidia_devices, _pve, _pveconf, _venv, _venv_build, _venv_requires
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _drift, _fleet, _verdict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize('key,wanted,current,equal', [
    ('dev0', 'path=/dev/nvidia0,mode=666', 'mode=0666,path=/dev/nvidia0', True),
    ('dev0', 'path=/dev/nvidia0', '/dev/nvidia0', True),
    ('dev0', 'path=/dev/nvidia0', 'path=/dev/nvidia1', False),
    ('net0', 'name=eth0,bridge=vmbr0,ip=dhcp', 'bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=dhcp,name=eth0,type=veth', True),
    ('net0', 'name=eth0,bridge=vmbr0,ip=dhcp,hwaddr=bc:24:11:00:00:02', 'bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=dhcp,name=eth0', False),
    ('net0', 'name=eth0,bridge=vmbr0', 'name=eth0,bridge=vmbr0,firewall=1', False),
    ('features', 'nesting=1,keyctl=1', 'keyctl=1,nesting=1', True),
    ('features', 'nesting=1', 'nesting=1,keyctl=1', False),
    ('tags', 'b;a', 'a;b', True),
    ('mp0', 'local-lvm:8,mp=/data', 'local-lvm:vm-101-disk-1,mp=/data,size=8G', True),
    ('mp0', 'local-lvm:8,mp=/data', 'local-lvm:vm-101-disk-1,mp=/data,size=4G', False),
    ('cores', 4, '4', True),
    ('description', 'notes', 'notes\n', True),
])
def test_same_compares_what_pve_means(key, wanted, current, equal):
    assert _lxc_config.same(key, wanted, current) is equal


def test_plan_update_sets_deletes_and_keeps_the_mac():
    current = {'cores': 1, 'dev0': 'path=/dev/nvidia0', 'dev1': 'path=/dev/nvidia1', 'tags': 'x',
               'net0': 'name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=dhcp,type=veth', 'memory': 512}
    values, owned = _lxc_config.wanted_config({'cores': 2, 'devices': [{'path': '/dev/nvidia0'}], 'tags': [],
                                        'net': {'net0': 'name=eth0,bridge=vmbr1,ip=dhcp'}})
    sets, deletes, before, after = _lxc_config.plan_update(values, owned, current)
    assert sets['cores'] == 2 and 'hwaddr=BC:24:11:00:00:01' in sets['net0'] and 'bridge=vmbr1' in sets['net0']
    assert sorted(deletes) == ['dev1', 'tags']
    assert after['dev1'] is None and before['dev1'] == 'path=/dev/nvidia1'
    assert 'memory' not in before  # not given: not managed


def test_rootfs_grows_never_shrinks():
    assert _lxc_config.plan_resize({'rootfs': 'local-lvm:16'}, {'rootfs': 'local-lvm:vm-1-disk-0,size=8G'}) == '16G'
    assert _lxc_config.plan_resize({'rootfs': 'local-lvm:8'}, {'rootfs': 'local-lvm:vm-1-disk-0,size=8G'}) is None
    with pytest.raises(_lxc_config.SpecError, match='cannot shrink'):
        _lxc_config.plan_resize({'rootfs': 'local-lvm:4'}, {'rootfs': 'local-lvm:vm-1-disk-0,size=8G'})


def test_fleet_errors_name_container_and_field():
    nodes = {'gpu01': [0, 1, 2, 3], 'util01': []}
    fleet = [{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': [0, 1]},
             {'vmid': 201, 'hostname': 'b', 'node': 'gpu01', 'gpus': [1, 4]},
             {'vmid': 202, 'hostname': 'c', 'node': 'util01', 'gpus': 'all'}]
    errs = _fleet.errors(fleet, nodes, '9.0.3')
    assert errs == ['containers[1] (vmid 201).gpus: GPU 1 of node gpu01 is already given to containers[0] '
                    '(set gpu_container_gpu_sharing: true to share GPUs)',
                    'containers[1] (vmid 201).gpus: node gpu01 has no GPU 4 (it has [0, 1, 2, 3])']
    assert _fleet.errors(fleet[:2], nodes, '9.0.3', gpu_sharing=True) == [
        'containers[1] (vmid 201).gpus: node gpu01 has no GPU 4 (it has [0, 1, 2, 3])']
    assert 'root@pam' in _fleet.errors(fleet[:1], nodes, '9.0.3', is_root_password=False)[0]


def test_fleet_specs_and_raw_lines():
    fleet = [{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': [2], 'rootfs': 32, 'net': 'name=eth0,bridge=vmbr0'}]
    node = {'indexes': [0, 1, 2], 'majors': {'nvidia-uvm': 509}, 'driver': '/opt/gpufleet/driver/580.95.05'}
    spec = _fleet.Fleet(fleet, {'gpu01': node}, defaults={'storage': 'local-zfs', 'cores': 4},
                        driver_mount='/opt/nvidia-driver').spec(fleet[0], 'devn')
    assert spec['rootfs'] == 'local-zfs:32' and spec['cores'] == 4 and spec['net'] == {'net0': 'name=eth0,bridge=vmbr0'}
    assert [d['path'] for d in spec['devices']] == ['/dev/nvidia2'] + list(_nvidia_devices.PASSTHROUGH_CONTROL)
    # the driver bundle is no mount point (PVE could not snapshot the container): a raw bind line; the fleet owns
    # the container's mount points, so one an older release made for it goes
    assert spec['mounts'] == {}
    bound = _fleet.Fleet(fleet, {'gpu01': node}, driver_mount='/opt/nvidia-driver')
    assert bound.raw('devn') == {'gpu01': {200: [
        'lxc.mount.entry: /opt/gpufleet/driver/580.95.05 opt/nvidia-driver none bind,ro,create=dir 0 0']}}
    shares = [{'path': '/var/cache/gpufleet/uv', 'mp': '/var/cache/gpufleet/uv'},
              {'path': '/srv/wh', 'mp': '/opt/gpufleet/wheelhouse', 'read_only': True}]
    mine = dict(fleet[0], gpus=[], mounts={'mp0': 'local-zfs:8,mp=/data', 'mp254': '/x,mp=/x'})
    shared = _fleet.Fleet([mine], {'gpu01': dict(node, driver='/d', shares=shares)}, driver_mount='/opt/nvidia-driver')
    # no GPUs, no driver bundle; the shares are raw binds and the user's own mount points keep their keys
    assert shared.spec(mine, 'devn')['mounts'] == {'mp0': 'local-zfs:8,mp=/data', 'mp254': '/x,mp=/x'}
    assert shared.raw('devn')['gpu01'][200] == [
        'lxc.mount.entry: /var/cache/gpufleet/uv var/cache/gpufleet/uv none bind,create=dir 0 0',
        'lxc.mount.entry: /srv/wh opt/gpufleet/wheelhouse none bind,ro,create=dir 0 0']
    assert shared.raw_owned() == {'gpu01': {'targets': ['/opt/nvidia-driver', '/var/cache/gpufleet/uv',
                                                        '/opt/gpufleet/wheelhouse'], 'majors': ['509']}}
    dns = dict(fleet[0], nameserver='10.0.0.53 10.0.1.53', searchdomain='cluster.example')
    spec = _fleet.Fleet([dns], {'gpu01': node}).spec(dns, 'devn')
    assert (spec['nameserver'], spec['searchdomain']) == ('10.0.0.53 10.0.1.53', 'cluster.example')
    raw = _fleet.Fleet(fleet, {'gpu01': node}).raw()['gpu01'][200]
    assert 'lxc.cgroup2.devices.allow: c 195:2 rw' in raw and 'lxc.cgroup2.devices.allow: c 509:1 rw' in raw
    assert 'lxc.mount.entry: /dev/nvidia2 dev/nvidia2 none bind,optional,create=file' in raw


def test_fleet_plan_checks_the_whole_fleet_then_expands_it_by_the_clusters_version():
    nodes = {'gpu01': {'indexes': [0, 1], 'majors': {'nvidia-uvm': 509}}}
    entries = [{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': [1]}]
    fleet = _fleet.Fleet(entries, nodes, defaults={'state': 'started'}, passthrough='auto')
    assert fleet.needs_version()
    plan = fleet.plan('9.0.3')
    assert plan['passthrough'] == 'devn' and [d['path'] for d in plan['wanted'][0]['devices']][0] == '/dev/nvidia1'
    assert plan['containers'] == plan['wanted'] and plan['raw'] == {'gpu01': {200: []}}
    plan = fleet.plan('8.0.4')
    assert plan['passthrough'] == 'raw' and plan['wanted'][0]['devices'] == [] and plan['wanted'][0]['state'] == 'started'
    # raw lines go in before the container starts: it is reconciled present first (not in check mode)
    assert plan['containers'][0]['state'] == 'present' and fleet.plan('8.0.4', check_mode=True)['containers'] == \
        plan['wanted']
    assert 'lxc.cgroup2.devices.allow: c 195:1 rw' in plan['raw']['gpu01'][200]
    # what the caller sets on every container comes last; a teardown needs no version
    gone = _fleet.Fleet(entries, nodes, defaults={'state': 'started'}, override={'state': 'absent', 'force': True})
    assert not gone.needs_version()
    assert not _fleet.Fleet(entries, nodes, passthrough='raw').needs_version()
    assert _fleet.Fleet(entries, nodes, passthrough='devn').needs_version()  # devN needs PVE 8.1
    spec = gone.plan()['containers'][0]
    assert (spec['state'], spec['force']) == ('absent', True)
    # every problem at once, the login's too
    bad = _fleet.Fleet([{'vmid': 99, 'hostname': 'a_b', 'node': 'gpu01', 'gpus': [1]}], nodes)
    with pytest.raises(_fleet.FleetError) as e:
        bad.check('9.0.3', False)
    assert len(e.value.problems) == 3 and str(e.value).startswith('The fleet definition has 3 problem(s): ')
    assert '.vmid: must be' in str(e.value) and '.hostname:' in str(e.value) and 'root@pam' in str(e.value)
    assert _fleet.Fleet.root_login({'api_user': 'root@pam', 'api_password': 'x'})
    assert not _fleet.Fleet.root_login({'api_user': 'root@pam', 'api_token_id': 't'})
    # with both, a changing run logs in with the password, a check run with the token (and may: it sets nothing)
    both = {'api_user': 'root@pam', 'api_password': 'x', 'api_token_id': 't'}
    assert _fleet.Fleet.root_login(both) and _fleet.Fleet.root_login({'api_token_id': 't'}, read_only=True)
    assert not _fleet.Fleet.root_login({'api_user': 'ops@pve', 'api_password': 'x'})
    assert not _pve.use_token(both) and _pve.use_token(both, read_only=True)
    assert _pve.use_token({'api_token_id': 't'}) and not _pve.use_token({'api_password': 'x'}, read_only=True)


def test_gpu_nodes_get_the_fleets_mode_and_group_unless_the_entry_says():
    nodes = {'gpu01': {'indexes': [0, 1]}}
    entries = [{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': [0]},
               {'vmid': 201, 'hostname': 'b', 'node': 'gpu01', 'gpus': [1], 'gpu_mode': '0660', 'gpu_gid': 44,
                'devices': [{'path': '/dev/fb0'}]}]
    plain, own = _fleet.Fleet(entries, nodes).plan('9.0.3')['wanted']
    # PVE would make them 0660 root:root; the fleet's default lets every user of the container open them
    assert plain['devices'][0] == {'path': '/dev/nvidia0', 'mode': '0666'}
    assert all(d['mode'] == '0666' and 'gid' not in d for d in plain['devices'])
    assert own['devices'][:2] == [{'path': '/dev/nvidia1', 'mode': '0660', 'gid': 44},
                                  {'path': '/dev/nvidiactl', 'mode': '0660', 'gid': 44}]
    assert own['devices'][-1] == {'path': '/dev/fb0'}  # the entry's own devices stay as given
    # a node without the optional control nodes: the container goes without them (PVE would refuse them)
    bare = {'gpu01': {'indexes': [0, 1], 'control': ['nvidia-uvm', 'nvidiactl']}}
    assert [d['path'] for d in _fleet.Fleet(entries[:1], bare).plan('9.0.3')['wanted'][0]['devices']] == [
        '/dev/nvidia0', '/dev/nvidiactl', '/dev/nvidia-uvm']
    # a GPU's node is its device minor, which need not be its index
    swapped = {'gpu01': {'indexes': [0, 1], 'minors': {0: 1, 1: 0}, 'majors': {'nvidia-uvm': 509}}}
    assert _fleet.Fleet(entries[:1], swapped).plan('9.0.3')['wanted'][0]['devices'][0]['path'] == '/dev/nvidia1'
    raw = _fleet.Fleet(entries[:1], swapped).plan('8.0.4')['raw']['gpu01'][200]
    assert 'lxc.cgroup2.devices.allow: c 195:1 rw' in raw and 'lxc.cgroup2.devices.allow: c 195:0 rw' not in raw
    fleet_wide = _fleet.Fleet(entries[:1], nodes, gpu_mode='0660', gpu_gid=1000).plan('9.0.3')['wanted'][0]
    assert fleet_wide['devices'][0] == {'path': '/dev/nvidia0', 'mode': '0660', 'gid': 1000}
    with pytest.raises(_fleet.FleetError) as e:
        _fleet.Fleet(entries, nodes, gpu_mode='rw', gpu_gid='video').check('9.0.3')
    assert e.value.problems[:2] == ["gpu_mode: must be an octal mode as a string, as '0666' or '0660', got 'rw'",
                                    "gpu_gid: must be a group id of the container (a whole number, 0 or more), "
                                    "got 'video'"]


def test_raw_lines_replace_only_the_main_sections_lxc_lines():
    text = ('#notes\narch: amd64\nlxc.apparmor.profile: unconfined\ncores: 2\n\n'
            '[pve:pending]\nlxc.mount.entry: pending\n\n[snap1]\nlxc.cgroup2.devices.allow: a\n')
    assert _pveconf.read(text) == [('lxc.apparmor.profile', 'unconfined')]
    new = _pveconf.replace(text, [('lxc.cgroup2.devices.allow', 'c 195:0 rw')])
    assert new.startswith('#notes\narch: amd64\ncores: 2\nlxc.cgroup2.devices.allow: c 195:0 rw\n\n[pve:pending]')
    assert new.endswith('[snap1]\nlxc.cgroup2.devices.allow: a\n')
    with pytest.raises(_pveconf.RawError, match=r'lxc_raw\[0\]'):
        _pveconf.normalize(['cores: 2'])


def test_the_collections_raw_lines_are_managed_and_the_operators_left_alone(tmp_path):
    conf = tmp_path / '200.conf'
    conf.write_text('arch: amd64\nlxc.prlimit.memlock: unlimited\n'
                    'lxc.mount.entry: /opt/gpufleet/driver/570.172.08 opt/nvidia-driver none bind,ro,create=dir 0 0\n'
                    'lxc.mount.entry: /srv/data srv/data none bind 0 0\nlxc.cgroup2.devices.allow: c 195:3 rw\n'
                    'lxc.cgroup2.devices.allow: c 10:200 rwm\n\n[before]\nlxc.mount.entry: /old opt/nvidia-driver\n')
    owned = _pveconf.ours(_gpu.any_device_node, ['/opt/nvidia-driver'], ['195', '509'])
    line = 'lxc.mount.entry: /opt/gpufleet/driver/580.95.05 opt/nvidia-driver none bind,ro,create=dir 0 0'
    changed, before, after = _pveconf.apply(str(conf), _pveconf.normalize([line]), owned=owned)
    # the bundle's old bind and a GPU's cgroup rule were the collection's; memlock, the /srv bind and /dev/net/tun's
    # rule are the operator's, kept where they were; a snapshot's section is not touched
    assert changed and [k + ': ' + v for k, v in before] == [
        'lxc.mount.entry: /opt/gpufleet/driver/570.172.08 opt/nvidia-driver none bind,ro,create=dir 0 0',
        'lxc.cgroup2.devices.allow: c 195:3 rw']
    assert conf.read_text() == ('arch: amd64\nlxc.prlimit.memlock: unlimited\nlxc.mount.entry: /srv/data srv/data '
                                'none bind 0 0\nlxc.cgroup2.devices.allow: c 10:200 rwm\n' + line + '\n\n'
                                '[before]\nlxc.mount.entry: /old opt/nvidia-driver\n')
    assert _pveconf.apply(str(conf), _pveconf.normalize([line]), owned=owned)[0] is False
    assert _pveconf.apply(str(conf), [], owned=owned)[0] is True and line not in conf.read_text()
    assert 'lxc.prlimit.memlock: unlimited' in conf.read_text()


def test_what_an_entry_asks_for_its_jobs_is_raw_lines_that_take_the_place_of_the_operators_own(tmp_path):
    entry = {'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': [0, 1], 'shm_mb': 16384, 'nofile': 1048576,
             'rdma': True}
    node = {'indexes': [0, 1], 'majors': {'nvidia-uvm': 509}}
    lines = _fleet.Fleet([entry], {'gpu01': node}).raw('devn')['gpu01'][200]
    assert lines == ['lxc.mount.entry: shm dev/shm tmpfs rw,nosuid,nodev,size=16384m,create=dir 0 0',
                     'lxc.prlimit.nofile: 1048576', 'lxc.prlimit.memlock: unlimited']
    assert _fleet.Fleet([dict(entry, shm_mb=None, nofile=None, rdma=False)], {'gpu01': node}).raw('devn') == {
        'gpu01': {200: []}}
    # an operator's own line in the same place (a /dev/shm mount, a prlimit) gives way to the entry's; the others stay
    conf = tmp_path / '200.conf'
    conf.write_text('arch: amd64\nlxc.prlimit.memlock: 65536\nlxc.prlimit.stack: unlimited\n'
                    'lxc.mount.entry: tmpfs dev/shm tmpfs size=64m 0 0\nlxc.mount.entry: /srv/data srv/data none bind 0 0\n')
    owned = _pveconf.ours(_gpu.any_device_node, [], ['195', '509'])
    changed, before, _after = _pveconf.apply(str(conf), _pveconf.normalize(lines), owned=owned)
    assert changed and before == [('lxc.prlimit.memlock', '65536'), ('lxc.mount.entry', 'tmpfs dev/shm tmpfs size=64m 0 0')]
    assert conf.read_text() == ('arch: amd64\nlxc.prlimit.stack: unlimited\nlxc.mount.entry: /srv/data srv/data none '
                                'bind 0 0\n' + ''.join(line + '\n' for line in lines))
    assert _pveconf.apply(str(conf), _pveconf.normalize(lines), owned=owned)[0] is False
    # bad values are named before anything changes
    nodes = {'gpu01': [0, 1]}
    assert _fleet.errors([dict(entry, shm_mb=0, nofile='many', rdma='yes')], nodes, '9.0.3') == [
        "containers[0] (vmid 200).shm_mb: must be the size of the container's /dev/shm in MiB (a whole number, 1 or "
        "more), got 0",
        "containers[0] (vmid 200).nofile: must be the container's open-file limit (a whole number, 1024 or more), "
        "got 'many'",
        "containers[0] (vmid 200).rdma: must be true or false, got 'yes'"]


def test_a_containers_changed_raw_lines_are_told_and_wait_for_its_restart():
    results = [{'vmid': 200, 'status': 'running', 'changed': False, 'changed_keys': [], 'pending': [],
                'restart_required': False, 'diff': {'before': {}, 'after': {}}},
               {'vmid': 201, 'status': 'running', 'power': 'reboot', 'changed': True, 'changed_keys': [],
                'pending': [], 'restart_required': False, 'diff': {'before': {}, 'after': {}}},
               {'vmid': 202, 'status': 'running', 'changed': False, 'changed_keys': [], 'pending': [],
                'restart_required': False, 'diff': {'before': {}, 'after': {}}}]
    lines = {'before': ['lxc.mount.entry: /a x none bind 0 0'], 'after': []}
    _lxc.raw_told(results, {'200': lines, 201: lines})
    assert results[0]['changed'] and results[0]['changed_keys'] == ['lxc'] and results[0]['pending'] == ['lxc']
    assert results[0]['restart_required'] and results[0]['diff']['before']['lxc'] == lines['before']
    # restarted in this run: it has them
    assert results[1]['changed_keys'] == ['lxc'] and not results[1]['restart_required']
    assert not results[2]['changed'] and results[2]['changed_keys'] == []


def test_pci_bus_ids_as_the_driver_writes_them():
    from ansible_collections.gpufleet.proxmox.plugins.module_utils import _nvidia
    assert _nvidia.bus_id('00000000:18:00.0') == '0000:18:00.0' == _nvidia.bus_id('0000:18:00.0')
    assert _nvidia.bus_id('00000001:1A:00.0') == '0001:1a:00.0'


def test_raw_lines_are_read_as_pve_reads_them():
    # Config.pm parse_pct_config: keys with dashes, and 'key = value' as well as 'key: value'
    text = ('arch: amd64\nlxc.apparmor.profile = unconfined\nlxc.hook.pre-start: /bin/true\n'
            'lxc.cgroup2.devices.allow=c 195:0 rw\ncores: 2\n')
    assert _pveconf.read(text) == [('lxc.apparmor.profile', 'unconfined'), ('lxc.hook.pre-start', '/bin/true'),
                                   ('lxc.cgroup2.devices.allow', 'c 195:0 rw')]
    # managed lines replace every raw line, whichever way it was written: none is left behind twice
    assert _pveconf.replace(text, [('lxc.apparmor.profile', 'unconfined')]) == (
        'arch: amd64\ncores: 2\nlxc.apparmor.profile: unconfined\n')
    assert _pveconf.normalize(['lxc.mount.auto = proc:rw', 'lxc.hook.pre-start: /x']) == [
        ('lxc.mount.auto', 'proc:rw'), ('lxc.hook.pre-start', '/x')]
    with pytest.raises(_pveconf.RawError):
        _pveconf.normalize(['lxc.Mount.auto: x'])  # PVE reads lower-case keys only


def test_elf_reads_a_system_library():
    import glob
    from ansible_collections.gpufleet.proxmox.plugins.module_utils import _elf
    path = sorted(glob.glob('/lib/x86_64-linux-gnu/libz.so.1*') + glob.glob('/usr/lib/x86_64-linux-gnu/libz.so.1*'))[0]
    info = _elf.read(path)
    assert info.soname == 'libz.so.1' and 'libc.so.6' in info.needed and info.bits == 64
    assert _elf.Resolver().find('libc.so.6', info)
    assert _elf.Resolver(system_dirs=[]).find('libc.so.6', info) is None
    assert _elf.read(__file__) is None


def test_drift_reports_one_file_per_host_and_the_summary():
    item = {'stage': 'node', 'item': 'uvm_node_missing', 'detail': 'x'}
    fleet = _drift.summary({'pve1': [item]}, {'train-0': [], 'pve1-ct': []}, True)
    assert (fleet['mode'], fleet['drift'], fleet['count']) == ('check', True, 1)
    files = _drift.reports(fleet)
    assert sorted(files) == ['pve1', 'pve1-ct', 'summary', 'train-0']
    assert files['summary'] is fleet
    assert files['pve1'] == {'host': 'pve1', 'kind': 'node', 'mode': 'check', 'drift': True, 'items': [item]}
    assert files['train-0'] == {'host': 'train-0', 'kind': 'container', 'mode': 'check', 'drift': False, 'items': []}


def test_fleet_hosts_carry_what_the_node_knows_of_each_container():
    fleet = [{'vmid': 1, 'hostname': 'a', 'node': 'n', 'gpus': [1]}, {'vmid': 2, 'hostname': 'b', 'node': 'n', 'gpus': 'all'},
             {'vmid': 3, 'hostname': 'c', 'node': 'n'}]
    node = {'indexes': [0, 1], 'gpus': [{'index': 0, 'pci_bus_id': '0:1'}, {'index': 1, 'pci_bus_id': '0:2'}]}
    got = _fleet.Fleet(fleet, {'n': node}).plan('9.0.3')['hosts']
    assert [got[v]['hostname'] for v in (1, 2, 3)] == ['a', 'b', 'c']
    assert got[1]['gpus'] == [1] and got[1]['gpu_info'] == [{'index': 1, 'pci_bus_id': '0:2'}]
    assert got[2]['gpus'] == [0, 1] and len(got[2]['gpu_info']) == 2
    assert got[3]['gpus'] == [] and got[3]['gpu_info'] == [] and got[3]['entry'] == fleet[2]


def _facts(**over):
    meta = {'profile': 'p', 'lock': '/l', 'expect': {'torch_version': '2.11.0+cu128', 'cuda_version': '12.8'}}
    facts = {'marker': None,
             'built': {'id': 'v1', 'link': '/root/venv', 'meta': meta, 'changed': False, 'verified': None,
                       'audit': {'healthy': True}},
             'driver': {'version': '580', 'library': '/x', 'changed': False},
             'gpus': [0, 1], 'devices': [{'index': 0}, {'index': 1}], 'node_driver': '580', 'container_changed': False,
             'venv': '/root/venv', 'check_mode': True,
             'settings': {'expect': {}, 'require_cuda': 'auto', 'smoke': 'none', 'min_tflops': 0,
                          'compile_check': False, 'compile_backend': 'inductor', 'audit_mode': 'fast', 'max_age': 3600}}
    facts.update(over)
    return facts


def test_verify_state_expects_from_the_profile_and_the_container():
    now = _verdict.state(_facts())
    assert now['cuda'] and now['audited'] and now['audit'] == {'healthy': True}
    assert now['expect'] == {'torch_version': '2.11.0+cu128', 'cuda_version': '12.8', 'cudnn_version': None,
                             'nccl_version': None, 'device_count': 2, 'driver_version': '580'}
    cpu = _verdict.state(_facts(gpus=[], settings=dict(_facts()['settings'], expect={'torch_version': 'x'})))
    assert not cpu['cuda'] and cpu['expect']['device_count'] is None and cpu['expect']['torch_version'] == 'x'
    # where torch_venv did not run: the profile from the venv's marker, and the role audits
    marker = base64.b64encode(json.dumps({'meta': {'profile': 'q', 'expect': {}}}).encode()).decode()
    alone = _verdict.state(_facts(marker=marker, built=None))
    assert alone['meta']['profile'] == 'q' and not alone['audited'] and not alone['reuse']
    # a repair run: the audit of the repaired venv stands (no second audit), and the venv is verified again
    repaired = dict(_facts()['built'], changed=True, repaired=True, audit={'healthy': False},
                    repair_audit={'healthy': True, 'findings': {}})
    after = _verdict.state(_facts(built=repaired, check_mode=False))
    assert after['audited'] and after['audit'] == repaired['repair_audit'] and not after['reuse']
    assert not _verdict.state(_facts(built=dict(repaired, repair_audit=None), check_mode=False))['audited']


def test_verify_state_reuses_a_record_only_while_what_it_saw_holds():
    fingerprint = _verdict.state(_facts())['fingerprint']
    record = {'fingerprint': fingerprint, 'verified_at': 100, 'age_s': 60, 'result': {'torch_version': 't'}}
    built = dict(_facts()['built'], verified=record)
    now = _verdict.state(_facts(built=built))
    assert now['reuse'] and now['result'] == {'torch_version': 't', 'reused': True, 'verified_at': 100, 'age_s': 60}
    for over in ({'built': dict(built, changed=True)}, {'container_changed': True},
                 {'driver': {'version': '580', 'library': '/x', 'changed': True}},
                 {'built': dict(built, verified=dict(record, age_s=7200))},
                 {'built': dict(built, audit={'healthy': False})}, {'built': dict(built, link='/other')},
                 {'gpus': [0]},
                 {'settings': dict(_facts()['settings'], max_age=0)},
                 {'settings': dict(_facts()['settings'], audit_mode='full')}):
        assert not _verdict.state(_facts(built=over.pop('built', built), **over))['reuse'], over


def test_verify_report_is_ok_only_with_a_healthy_audit_and_no_failure():
    now = {'meta': {'profile': 'p'}, 'expect': {'torch_version': 't'}}
    good = _verdict.report(now, {'healthy': True, 'findings': {}}, {'failures': [], 'torch_version': 't',
                                                                          'changed': False}, 'h', 'n', 1)
    assert good['ok'] and good['torch'] == {'failures': [], 'torch_version': 't'} and good['profile'] == 'p'
    assert good['audit'] == {'healthy': True, 'findings': {}, 'error': None}
    assert not _verdict.report(now, {'healthy': False}, {'failures': []}, 'h')['ok']
    skipped = _verdict.report(now, {'msg': 'no venv'}, {'skipped': True}, 'h')
    assert not skipped['ok'] and skipped['audit']['error'] == 'no venv'
    # a healthy venv whose verification never ran (the task was skipped, or failed before the probe): not ok
    for never in ({'skipped': True}, {'changed': False, 'msg': 'ssh failed'}, None):
        assert _verdict.report(now, {'healthy': True, 'findings': {}}, never, 'h')['ok'] is False, never


def test_verify_problems_name_the_failed_check_and_the_audit():
    assert _verdict.problems({'healthy': True}, {'failures': []}) == []
    both = _verdict.problems({'healthy': False, 'findings': {'missing': ['a']}},
                                 {'failures': [{'check': 'torch_version'}], 'msg': 'torch_version: expected 1'})
    assert both == ['torch_version: expected 1', 'venv audit: {"missing": ["a"]}']
    assert _verdict.problems({'healthy': True}, {}) == ['torch was not verified']
    assert _verdict.problems({'msg': 'no venv at /root/venv'}, {'failures': []}) == ['venv audit: no venv at /root/venv']


def test_verify_keeps_plain_data_of_a_module_result():
    failed = {'failed': True, 'msg': 'm', 'failures': [{'check': 'torch_version'}], 'exception': object(),
              'invocation': {'module_args': {}}, '_ansible_no_log': False}
    assert _verdict.plain(failed) == {'failed': True, 'msg': 'm', 'failures': [{'check': 'torch_version'}]}
    assert 'exception' not in _verdict.report({}, {'healthy': True}, failed, 'h')['torch']


def test_a_failed_audit_names_each_set_of_claimants_once():
    nccl = ['nvidia-nccl-cu12', 'nvidia-nccl-cu13']
    findings = {'broken_distributions': [], 'unresolved_libraries': [], 'drift': {'missing': [], 'extra': []},
                'collisions': [{'path': 'nvidia/nccl/include/{0}.h'.format(n), 'claimed_by': nccl, 'on_disk': None}
                               for n in ('a', 'b', 'c')] +
                              [{'path': 'x/__init__.py', 'claimed_by': ['x', 'y'], 'on_disk': 'x'}]}
    assert _venv_build.summary(findings) == (
        '3 files (nvidia/nccl/include/a.h, nvidia/nccl/include/b.h, ...) are claimed by nvidia-nccl-cu12, '
        'nvidia-nccl-cu13; x/__init__.py is claimed by x, y')


LINUX = {'os_name': 'posix', 'sys_platform': 'linux', 'platform_system': 'Linux', 'platform_machine': 'x86_64',
         'python_version': '3.11', 'python_full_version': '3.11.7', 'implementation_name': 'cpython'}


@pytest.mark.parametrize('marker,extras,holds', [
    ('platform_system == "Linux"', set(), True),
    ('platform_system == "Linux" and platform_machine == "aarch64"', set(), False),
    ('(platform_system == "Windows" or sys_platform == "linux") and python_version < "3.12"', set(), True),
    ('python_version >= "3.12"', set(), False),
    ('python_full_version ~= "3.11.0"', set(), True),
    ('python_version == "3.*"', set(), True),
    ("'linux' in sys_platform", set(), True),
    ('extra == "cudnn"', set(), False),
    ('extra == "cu-dnn"', {'cu-dnn'}, True),
    ('platform_system == "Linux" and extra == "Cu_DNN"', {'cu-dnn'}, True),
])
def test_markers_of_requires_dist(marker, extras, holds):
    assert _venv_requires.marker_holds(marker, LINUX, extras) is holds


def test_a_marker_it_cannot_read_is_refused():
    with pytest.raises(ValueError):
        _venv_requires.marker_holds('platform_system == ', LINUX, set())
    with pytest.raises(ValueError):
        _venv_requires.marker_holds('unknown_variable == "x"', LINUX, set())


def test_what_the_installed_distributions_require():
    dists = [{'key': 'torch', 'name': 'torch', 'requires': [
        'nvidia-nccl-cu13==2.28.9; platform_system == "Linux"', 'cuda-toolkit[cudnn]==13.0.2; platform_system == "Linux"',
        'opt-einsum>=3.3; extra == "opt-einsum"', 'tbb; platform_system == "Windows"', 'odd; what is this']},
        {'key': 'cuda-toolkit', 'name': 'cuda-toolkit', 'requires': [
            'nvidia-cudnn-cu13==9.19.0.56; extra == "cudnn"', 'nvidia-cublas==13.1; extra == "cublas"']},
        {'key': 'nvidia-nccl-cu12', 'name': 'nvidia-nccl-cu12', 'requires': []}]
    assert _venv_requires.required_by(_venv_requires.requirement_edges(dists, LINUX)) == {
        'nvidia-nccl-cu13': ['torch'], 'cuda-toolkit': ['torch'], 'nvidia-cudnn-cu13': ['cuda-toolkit'],
        'odd': ['torch']}  # a marker it cannot read counts as holding
    # what pip check calls not installed: the requirements that hold (the extra torch asks of cuda-toolkit too), not
    # one whose marker cannot be read
    assert _venv_requires.missing_requirements(dists, _venv_requires.requirement_edges(dists, LINUX)) == [
        {'name': 'nvidia-cudnn-cu13', 'requirement': 'nvidia-cudnn-cu13==9.19.0.56', 'required_by': ['cuda-toolkit']},
        {'name': 'nvidia-nccl-cu13', 'requirement': 'nvidia-nccl-cu13==2.28.9', 'required_by': ['torch']}]
    # one requirement twice with markers that disagree (as torch's METADATA has): it holds where one holds
    twice = [{'key': 'torch', 'name': 'torch', 'requires': [
        'setuptools; python_version >= "3.10"', 'setuptools; python_version < "3.0"', 'sympy>=1.13']}]
    assert _venv_requires.required_by(_venv_requires.requirement_edges(twice, LINUX)) == {'setuptools': ['torch'], 'sympy': ['torch']}
    assert [m['name'] for m in _venv_requires.missing_requirements(twice, _venv_requires.requirement_edges(twice, LINUX))] == ['setuptools', 'sympy']


def test_who_wins_a_path_claimed_with_different_bytes():
    requirers = {'nvidia-nccl-cu13': ['torch']}
    pair = ['nvidia-nccl-cu12', 'nvidia-nccl-cu13']
    assert _venv.decide(pair, {'nvidia-nccl-cu12'}, {}, requirers) == ('nvidia-nccl-cu12', 'overrides')
    assert _venv.decide(pair, set(), {'nvidia-nccl-cu12': ('nvidia-nccl-cu12', '2.28.9')}, requirers) == \
        ('nvidia-nccl-cu12', 'lock')
    assert _venv.decide(pair, set(), {}, requirers) == ('nvidia-nccl-cu13', 'requirements')
    wins, why = _venv.decide(pair, set(), {}, dict(requirers, **{'nvidia-nccl-cu12': ['torch-cu128']}))
    assert wins is None and why == (
        'nvidia-nccl-cu12 and nvidia-nccl-cu13 install this path with different bytes and each is required '
        '(nvidia-nccl-cu12 by torch-cu128; nvidia-nccl-cu13 by torch): declare one in `overrides`, or give a lock')
    locked = dict((k, (k, '1')) for k in pair)
    assert _venv.decide(pair, set(), locked, {})[1].endswith('no installed distribution requires either: declare '
                                                             'one in `overrides`, or remove all but one from the lock')


def _ct(vmid, status, **extra):
    return dict({'vmid': vmid, 'node': 'pve1', 'status': status}, **extra)


def test_the_fleet_verdict_covers_every_container_of_the_definition():
    fleet = [{'vmid': 201, 'hostname': 'a', 'node': 'pve1'}, {'vmid': 202, 'hostname': 'b', 'node': 'pve1'},
             {'vmid': 203, 'hostname': 'c', 'node': 'pve1'}, {'vmid': 204, 'hostname': 'd', 'node': 'pve1'},
             {'vmid': 205, 'hostname': 'e', 'node': 'pve1', 'state': 'stopped'},
             {'vmid': 206, 'hostname': 'f', 'node': 'pve1', 'state': 'absent'}]
    # A read-only run (verify.yml): a container the check would create is missing, one it would start is stopped.
    read = {'checked_only': True, 'containers': [
        _ct(201, 'running'), _ct(202, 'running', created=True), _ct(203, 'running', power='start'),
        _ct(204, 'running'), _ct(205, 'stopped'), _ct(206, 'absent')]}
    good = {'host': 'a', 'node': 'pve1', 'vmid': 201, 'run': 'r1', 'ok': True, 'expected': {'device_count': 0},
            'torch': {'torch_version': '2.11.0', 'failures': []}, 'audit': {'healthy': True, 'findings': {}}}
    stale = dict(good, host='d', vmid=204, run='r0')
    out = _verdict.fleet([good, stale], fleet, read, {'id': 'r1', 'started': 't'})
    assert [(r['host'], r['state'], r['ok']) for r in out['containers']] == [
        ('a', 'verified', True), ('b', 'missing', False), ('c', 'stopped', False), ('d', 'unreached', False),
        ('e', 'stopped', None)]
    assert (out['ok'], out['verified'], out['expected'], out['run']['id']) == (False, 1, 4, 'r1')
    assert out['verdict'] == ('verified 1 of 4 container(s): b (CT 202 on pve1): missing; '
                              'c (CT 203 on pve1): stopped; d (CT 204 on pve1): unreached')
    assert out['containers'][1]['why'] == 'CT 202 does not exist on pve1'
    # Every container of the fleet gone (the lab reset): nothing verified, never ok.
    gone = {'checked_only': True, 'containers': [_ct(e['vmid'], 'running', created=True) for e in fleet[:5]]}
    out = _verdict.fleet([], fleet, gone, {'id': 'r2'})
    assert not out['ok'] and out['verified'] == 0 and out['expected'] == 5
    assert set(r['state'] for r in out['containers']) == {'missing'}
    # A site run (not read-only) judges the containers as it left them; the API not read at all: unread.
    done = {'containers': [_ct(201, 'running', created=True)]}
    assert _verdict.fleet([dict(good, run=None)], fleet[:1], done)['ok'] is True
    assert _verdict.fleet([], fleet[:1], {})['containers'][0]['state'] == 'unread'
    assert _verdict.fleet([], [], {})['ok'] is False  # an empty fleet is not a verified one


def test_drift_names_the_containers_that_run_but_were_not_verified():
    fleet = {'containers': [{'host': 'a', 'state': 'verified'}, {'host': 'd', 'state': 'unreached', 'why': 'w'},
                            {'host': 'b', 'state': 'missing', 'why': 'm'}]}
    assert _drift.unverified(fleet) == {'d': [{'stage': 'verify', 'item': 'unreached', 'detail': 'w'}]}


def test_the_fleet_drift_joins_what_each_stage_saw():
    definition = [{'vmid': 201, 'hostname': 'a', 'node': 'pve1'}, {'vmid': 202, 'hostname': 'b', 'node': 'pve1'}]
    reconcile = {'containers': [dict(_ct(201, 'running'), changed_keys=['cores']), _ct(202, 'running')],
                 'diff': [{'before_header': 'CT 201', 'before': {'cores': 2}, 'after': {'cores': 4}}]}
    devices = {'pve1': {'findings': [{'code': 'uvm_not_loaded', 'msg': 'nvidia-uvm is not loaded'}]}}
    running = {'a': {'driver': {'match': False, 'version': '570.1', 'node_version': '580.95.05'}}}
    verdict = {'containers': [{'host': 'b', 'state': 'unreached', 'why': 'w'}]}
    out = _drift.fleet(devices, reconcile, definition, running, verdict, check_mode=True)
    assert (out['mode'], out['drift'], out['count']) == ('check', True, 4)
    assert out['nodes'] == {'pve1': [{'stage': 'node', 'item': 'uvm_not_loaded', 'detail': 'nvidia-uvm is not loaded'}]}
    assert [(i['stage'], i['item']) for i in out['containers']['a']] == [('container', 'cores'),
                                                                        ('driver', 'userspace_driver')]
    assert out['containers']['a'][0]['before'] == 2 and out['containers']['a'][0]['after'] == 4
    assert out['containers']['b'] == [{'stage': 'verify', 'item': 'unreached', 'detail': 'w'}]
    # not judged (the verify stage skipped): no verification items
    assert _drift.fleet({}, reconcile, definition, {}, None, False)['containers']['b'] == []


def test_orphans_are_the_tagged_containers_the_definition_does_not_name_and_are_no_drift():
    guests = {201: {'type': 'lxc', 'node': 'pve1', 'name': 'a', 'status': 'running', 'tags': 'gpufleet;team-x'},
              205: {'type': 'lxc', 'node': 'pve2', 'name': 'old', 'status': 'running', 'tags': 'gpufleet'},
              206: {'type': 'lxc', 'node': 'pve2', 'name': 'mine', 'status': 'stopped', 'tags': 'gpufleet-dev'},
              207: {'type': 'lxc', 'node': 'pve1', 'name': 'b', 'status': 'stopped', 'tags': 'x, GPUFLEET'},
              300: {'type': 'qemu', 'node': 'pve1', 'name': 'vm', 'status': 'running', 'tags': 'gpufleet'}}
    assert _lxc.orphans(guests, 'gpufleet', {201}) == [
        {'vmid': 205, 'node': 'pve2', 'name': 'old', 'status': 'running'},
        {'vmid': 207, 'node': 'pve1', 'name': 'b', 'status': 'stopped'}]
    # the fleet's containers on a node the run does not reach (known) are the fleet's, not orphans
    assert [o['vmid'] for o in _lxc.orphans(guests, 'gpufleet', {201} | {205})] == [207]
    assert _lxc_config.tag_list('x, b;a') == ['a', 'b', 'x']
    definition = [{'vmid': 201, 'hostname': 'a', 'node': 'pve1'}]
    reconcile = {'containers': [_ct(201, 'running')],
                 'orphans': [{'vmid': 205, 'node': 'pve2', 'name': 'old', 'status': 'running'},
                             {'vmid': 209, 'node': 'pve1', 'name': 'a', 'status': 'stopped'}]}
    out = _drift.fleet({}, reconcile, definition, {}, None, True)
    # reported, left alone: neither drift nor anything a repair changes
    assert out['drift'] is False and out['count'] == 0 and out['containers']['a'] == []
    assert out['orphans'] == ['CT 209', 'old'] and out['containers']['old'][0]['left'] is True
    (old,) = out['containers']['old']
    assert (old['stage'], old['item'], old['vmid'], old['node']) == ('container', 'orphan', 205, 'pve2')
    assert 'CT 205 on pve2 (running) carries the fleet\'s tag' in old['detail']
    assert out['containers']['CT 209'][0]['item'] == 'orphan'  # its name is a container of the fleet's


def test_restart_turns_started_containers_into_restarted_ones():
    params = dict((k, None) for k in _lxc_config.CONTAINER_SPEC)
    params.update(restart=[201, 202], containers=[{'vmid': 200, 'state': 'started'}, {'vmid': 201, 'state': 'started'},
                                                  {'vmid': 202, 'state': 'stopped'}, {'vmid': 203}])
    assert [s['state'] for s in _lxc_config.container_specs(params)] == ['started', 'restarted', 'stopped', 'present']


@pytest.mark.parametrize('name,args', [('fleet_plan', {'containers': []}), ('fleet_report', {'dir': '/tmp'}),
                                       ('verify_container', {}), ('write_reports', {'dir': '/tmp', 'reports': {}})])
def test_an_action_only_module_refuses_to_run_without_its_action(name, args, tmp_path):
    """Where the action plugin is bypassed (the module shipped to a host as it is), it says why instead of running."""
    import subprocess
    path = tmp_path / 'args.json'
    path.write_text(json.dumps({'ANSIBLE_MODULE_ARGS': args}))
    module = os.path.join(ROOT, 'plugins', 'modules', name + '.py')
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, '.collections'))
    done = subprocess.run([sys.executable, module, str(path)], capture_output=True, text=True, env=env, check=False)
    result = json.loads(done.stdout)
    assert result['failed'] and result['msg'] == 'gpufleet.proxmox.{0} runs as an action plugin on the controller'.format(
        name), result


def test_a_fleet_checks_every_node_and_plans_only_the_reached_ones():
    nodes = {'pve1': {'indexes': [0, 1]}, 'pve2': {'indexes': None, 'reached': False}}
    entries = [{'vmid': 200, 'hostname': 'a', 'node': 'pve1', 'gpus': [1]},
               {'vmid': 201, 'hostname': 'b', 'node': 'pve2', 'gpus': [3]}]
    fleet = _fleet.Fleet(entries, nodes)
    fleet.check('9.0.3')  # pve2 is a node of the cluster: its entry is good, its GPUs unknown here
    plan = fleet.plan('9.0.3')
    assert [c['vmid'] for c in plan['containers']] == [200] and list(plan['hosts']) == [200]
    dup = _fleet.Fleet(entries + [dict(entries[0], node='pve2', hostname='c')], nodes)
    with pytest.raises(_fleet.FleetError, match='200 is also the vmid of containers'):
        dup.check('9.0.3')


def test_a_container_whose_node_is_down_is_unreached_not_unread():
    entries = [{'vmid': 223, 'hostname': 'c3', 'node': 'pve3'}, {'vmid': 224, 'hostname': 'c4', 'node': 'pve4'}]
    verdict = _verdict.fleet([], entries, {'containers': []}, unreachable={'pve3'})
    rows = dict((r['host'], r) for r in verdict['containers'])
    assert rows['c3']['state'] == 'unreached' and 'could not reach its node' in rows['c3']['why']
    assert rows['c4']['state'] == 'unread' and not verdict['ok']


def test_files_that_are_not_as_they_should_be_are_named(tmp_path):
    script, unit, link = tmp_path / 'script', tmp_path / 'unit', tmp_path / 'wants'
    want = [{'path': str(script), 'content': '#!/bin/sh\n', 'mode': '0755'},
            {'path': str(unit), 'content': '[Unit]\n', 'mode': '0644'},
            {'path': str(link), 'src': '../unit'}]
    assert [(f['code'], f['msg']) for f in _files.stale(want)] == [
        ('file_stale', '{0} is missing'.format(p)) for p in (script, unit, link)]
    script.write_text('#!/bin/sh\n')
    script.chmod(0o644)
    unit.write_text('[Unit]\nold\n')
    os.symlink('../other', str(link))
    assert [f['msg'] for f in _files.stale(want)] == [
        '{0} has mode 0644, not 0755'.format(script), '{0} differs from what it should hold'.format(unit),
        '{0} points to ../other, not ../unit'.format(link)]
    script.chmod(0o755)
    unit.write_text('[Unit]\n')
    os.unlink(str(link))
    os.symlink('../unit', str(link))
    assert _files.stale(want) == []


def test_an_entry_with_state_absent_is_destroyed_only_where_the_run_confirms_its_vmid():
    nodes = {'gpu01': {'indexes': [0, 1]}}
    entries = [{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': []},
               {'vmid': 201, 'hostname': 'b', 'node': 'gpu01', 'gpus': [], 'state': 'absent'},
               {'vmid': 202, 'hostname': 'c', 'node': 'gpu01', 'gpus': [], 'state': 'absent'}]
    with pytest.raises(_fleet.FleetError) as e:
        _fleet.Fleet(entries, nodes, remove_confirm=[201]).check()
    assert len(e.value.problems) == 1
    assert 'containers[2] (vmid 202).state: absent destroys CT 202' in str(e.value)
    assert '-e gpufleet_remove_confirm=201,202' in str(e.value)
    _fleet.Fleet(entries, nodes, remove_confirm=[201, 202]).check()
    _fleet.Fleet(entries, nodes).check()  # a check run destroys nothing: no confirmation
    specs = dict((s['vmid'], s) for s in _fleet.Fleet(entries, nodes, remove_confirm=[201, 202]).plan()['containers'])
    assert (specs[201]['state'], specs[201]['force']) == ('absent', True) and 'force' not in specs[200]


def test_venv_build_takes_what_its_profile_gives_unless_the_task_gives_it():
    from ansible_collections.gpufleet.proxmox.plugins.action.venv_build import from_profile
    profile = {'name': 'cu128', 'dir': '/p/cu128', 'lock': 'torch==2.11.0+cu128 \\\n    --hash=sha256:00\n',
               'meta': {'python': '3.11', 'overrides': ['nvidia-nccl-cu13'], 'expect': {'cuda': '12.8'}}}
    args = from_profile({'lock': '/opt/gpufleet/profiles/cu128/requirements.lock', 'profile': profile, 'keep': 1})
    assert args == {'lock': '/opt/gpufleet/profiles/cu128/requirements.lock', 'keep': 1,
                    'lock_content': profile['lock'], 'python_version': '3.11', 'overrides': ['nvidia-nccl-cu13'],
                    'imports': ['torch'],
                    'meta': {'profile': 'cu128', 'profile_dir': '/p/cu128',
                             'lock': '/opt/gpufleet/profiles/cu128/requirements.lock',
                             'overrides': ['nvidia-nccl-cu13'], 'imports': ['torch'], 'expect': {'cuda': '12.8'},
                             'floor': {'driver': '525.60.13', 'cuda': '12', 'wheel': 'torch==2.11.0+cu128',
                                       'wheels': ['torch==2.11.0+cu128'],
                                       'why': "torch==2.11.0+cu128 is torch's build for CUDA 12.8"}}}
    # what the task gives wins; a profile without python gives no python_version
    given = from_profile({'lock': '/l', 'profile': {'name': 'cpu', 'lock': 'x', 'meta': {}}, 'imports': ['numpy']})
    assert given['imports'] == ['numpy'] and 'python_version' not in given
    assert given['meta']['imports'] == ['numpy']
    # without a profile, nothing is added
    assert from_profile({'lock': '/l'}) == {'lock': '/l'}


def test_a_direct_program_runs_the_modules_entry_point_as_the_module_does(tmp_path):
    """plugin_utils _direct: the arguments checked with the module's spec (defaults filled, a bad one named as
    AnsibleModule names it), the program run with a Python of its own: paths expanded where it runs, the entry
    point's result printed (rc 1 where it failed), an unexpected error a module failure with its traceback."""
    import subprocess
    from ansible_collections.gpufleet.proxmox.plugins.modules.venv_build import ARGUMENT_SPEC, REQUIRED_IF
    from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _direct

    def check(args):
        return _direct.validated('gpufleet.proxmox.venv_build', ARGUMENT_SPEC, args, required_if=REQUIRED_IF)

    assert check({'audit_mode': 'quick', 'lock': '/l'})[2] == 'value of audit_mode must be one of: fast, full, got: quick'
    assert check({'lock': '/l', 'colour': 'x'})[2].startswith(
        'Unsupported parameters for (gpufleet.proxmox.venv_build) module: colour.')
    assert 'lock' in check({})[2]
    params, paths, error = check({'rollback': True, 'root': '$HOME/none', 'link': '~/l',
                                  'driver': {'node_version': '580.95.05'}})
    assert error is None and params['keep'] == 2 and params['root'] == '$HOME/none'
    assert params['driver']['mount'] == '/opt/nvidia-driver' and paths['root'] is True and paths['driver'] == {'mount': True}

    def run(entry, params):
        ran = subprocess.run([sys.executable, '-'], input=_direct.script(entry, params, paths, check=True),
                             env={'HOME': str(tmp_path)}, capture_output=True, text=True)
        return ran.returncode, json.loads(ran.stdout)

    params['driver'] = None
    rc, result = run('_venv_build:call', params)
    assert rc == 1 and result['failed'], result
    assert result['msg'] == 'venv_build: rollback: there is no previous venv under {0}/none to go back to'.format(
        tmp_path), result
    # a list of paths is expanded where the program runs too
    lists = _direct._unexpanded({'dirs': {'type': 'list', 'elements': 'path'}})
    assert lists == ({'dirs': {'type': 'list', 'elements': 'str'}}, {'dirs': True})
    rc, result = run('_venv_build:no_such_entry', params)
    assert rc == 1 and result['msg'].startswith('MODULE FAILURE: AttributeError') and 'Traceback' in result['exception']


def test_a_direct_program_carries_every_module_util_its_entry_point_imports():
    """plugin_utils _direct reads the imports of this collection's module_utils as text: for each of them, the same
    names as Python's parser finds (import lines anywhere, `from PACKAGE import a, b`, `from PACKAGE.a import (x,
    y)` over lines), so a program never lacks a module it imports."""
    import ast
    import glob
    from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _direct

    def parsed(name, found):
        if name not in found:
            with open(os.path.join(_direct.MODULE_UTILS, name.rpartition('.')[2] + '.py')) as fh:
                found[name] = tree = ast.parse(fh.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == _direct.PACKAGE:
                    for alias in node.names:
                        parsed(_direct.PACKAGE + '.' + alias.name, found)
                elif isinstance(node, ast.ImportFrom) and (node.module or '').startswith(_direct.PACKAGE + '.'):
                    parsed(node.module, found)
        return found

    names = sorted(os.path.basename(f)[:-3] for f in glob.glob(os.path.join(_direct.MODULE_UTILS, '_*.py')))
    assert '_venv_build' in names
    for name in names:
        module = _direct.PACKAGE + '.' + name
        assert sorted(_direct._imported(module)) == sorted(parsed(module, {})), name
    assert len(_direct._imported(_direct.PACKAGE + '._venv_build')) > 3
    text = 'x = 1\n    from {0} import (_a as b,\n        _c)  # two\nfrom {0}._d import e\n'.format(_direct.PACKAGE)
    assert [(inner, ' '.join(names.split())) for inner, names in _direct._IMPORT.findall(text)] == [
        ('', '(_a as b, _c)'), ('_d', 'e')]


def test_a_nodes_batch_of_pct_exec_calls():
    """module_utils _pct.run_calls (pct_batch's work on the node): each call's exit code and output by host, a pct exec
    that lxc-attach failed to start run again (and no more than retries times), a call without argv refused by its
    index, a pct that cannot run said so."""
    import subprocess
    from ansible_collections.gpufleet.proxmox.plugins.module_utils import _pct
    tries, pauses = {}, []

    def run(argv, input=None, **kwargs):
        host = argv[2]
        tries[host] = tries.get(host, 0) + 1
        if host == 'busy' and tries[host] < 3 or host == 'stuck':
            return subprocess.CompletedProcess(argv, 1, b'', b'lxc-attach: Failed to rexec as memfd')
        return subprocess.CompletedProcess(argv, 0 if host != 'bad' else 2, input.upper(), b'said')

    calls = [{'host': h, 'argv': ['pct', 'exec', h], 'stdin': 'x\u00e9'} for h in ('ok', 'busy', 'bad', 'stuck')]
    done = _pct.run_calls({'calls': calls, 'forks': 2, 'retries': 3}, run=run, pause=pauses.append)
    runs = done['runs']
    assert runs['ok'] == {'rc': 0, 'stdout': 'X\u00e9', 'stderr': 'said'} and tries['ok'] == 1
    assert runs['busy']['rc'] == 0 and tries['busy'] == 3
    assert runs['bad'] == {'rc': 2, 'stdout': 'X\u00e9', 'stderr': 'said'} and tries['bad'] == 1  # its command ran
    assert runs['stuck']['rc'] == 1 and 'rexec' in runs['stuck']['stderr'] and tries['stuck'] == 4
    assert len(pauses) == 2 + 3 and all(0 < p <= 12 for p in pauses)
    assert _pct.run_calls({'calls': [{'host': 'a', 'argv': 'pct exec'}]}) == {
        'failed': True, 'msg': 'pct_batch: calls[0] needs host and argv'}

    def missing(argv, **kwargs):
        raise OSError(2, 'No such file or directory')
    failed = _pct.run_calls({'calls': calls[:1]}, run=missing)
    assert failed['failed'] and failed['msg'].startswith('pct_batch: cannot run pct exec:')


def test_a_second_call_of_a_run_tells_what_both_did():
    earlier = {'containers': [{'vmid': 223, 'changed': True, 'changed_keys': ['node'], 'actions': ['shutdown', 'migrate'],
                               'status': 'stopped', 'pending': [], 'restart_required': False},
                              {'vmid': 224, 'changed': True, 'changed_keys': ['nameserver'], 'actions': ['config'],
                               'status': 'running', 'pending': ['nameserver'], 'restart_required': True}],
               'diff': [{'before_header': 'CT 223', 'before': {'node': 'pve1', 'status': 'running'},
                         'after': {'node': 'pve3'}}]}
    results = [{'vmid': 223, 'changed': True, 'changed_keys': [], 'actions': ['start'], 'power': 'start',
                'status': 'running', 'pending': [], 'restart_required': False,
                'diff': {'before_header': 'CT 223', 'before': {'status': 'stopped'}, 'after': {'status': 'running'}}},
               {'vmid': 224, 'changed': False, 'changed_keys': [], 'actions': [], 'status': 'running', 'pending': [],
                'restart_required': False, 'diff': {'before': {}, 'after': {}}}]
    _lxc.merge_earlier(results, earlier)
    moved, waiting = results
    assert moved['changed_keys'] == ['node'] and moved['actions'] == ['shutdown', 'migrate', 'start']
    assert moved['diff']['before'] == {'node': 'pve1', 'status': 'running'}
    assert moved['diff']['after'] == {'node': 'pve3', 'status': 'running'}
    # not restarted by the second call: its change still waits
    assert waiting['changed'] and waiting['pending'] == ['nameserver'] and waiting['restart_required']


def test_a_rolled_back_container_is_counted_as_such_with_both_verdicts():
    first = {'host': 'a', 'node': 'pve1', 'vmid': 1, 'ok': False, 'audit': {'healthy': True},
             'torch': {'failures': [{'check': 'torch_version', 'expected': '2', 'actual': '1'}]}}
    after = {'host': 'a', 'node': 'pve1', 'vmid': 1, 'ok': True, 'audit': {'healthy': True}, 'torch': {'failures': []},
             'rolled_back': _verdict.rolled_back({'snapshot': 'gpufleet-1', 'done': True, 'first': first})}
    row = _verdict.row(after)
    assert row['state'] == 'rolled_back' and row['ok'] is False
    assert row['failures'] == ['its change failed verification (torch_version: expected 2, got 1); rolled back to '
                               'gpufleet-1 and started; verified again: ok']
    # the change itself failed; the rollback could not be made
    told = {'snapshot': 'gpufleet-2', 'done': False, 'msg': 'CT 1 is locked', 'change': 'ldconfig failed'}
    row = _verdict.row(dict(after, ok=False, rolled_back=_verdict.rolled_back(told)))
    assert row['failures'] == ['its change failed (ldconfig failed); the rollback to gpufleet-2 failed: CT 1 is locked']
    verdict = _verdict.fleet([after], [{'hostname': 'a', 'vmid': 1}], {'containers': [
        {'vmid': 1, 'node': 'pve1', 'status': 'running'}]})
    assert not verdict['ok'] and verdict['verdict'].startswith(
        'verified 0 of 1 container(s): a (CT 1 on pve1): its change failed verification (')


def test_a_gpu_container_moved_behind_the_fleets_back_says_whether_its_node_gives_it_its_gpus():
    def node(driver, *indexes):
        return {'driver_version': driver, 'gpus': [{'index': i} for i in indexes]}
    devices = {'pve1': node('580.95.05', 0, 1), 'pve2': node('570.172.08', 0), 'pve3': node('580.95.05'),
               'pve4': node(None, 0, 1)}
    assert _drift.moved('pve1', 'pve3', [0, 1], devices) == (
        'node: expected pve1, found pve3; on pve3 it is without its GPUs (it has no GPU 0, 1 (it has none)); '
        'pve1 would fit (GPU 0, 1)')
    assert _drift.moved('pve1', 'pve4', [0, 1], devices) == (
        'node: expected pve1, found pve4; on pve4 it is without its GPUs (no NVIDIA driver is loaded there); '
        'pve1 would fit (GPU 0, 1, a driver loaded)')
    # the fleet's node no longer fits either: another that does is named; none, said
    gone = dict(devices, pve1=node('580.95.05'))
    assert _drift.moved('pve1', 'pve3', [0], gone).endswith('; pve2, pve4 would fit (GPU 0)') is False
    assert _drift.moved('pve1', 'pve3', [0], gone).endswith('; pve2 would fit (GPU 0)')
    assert _drift.moved('pve1', 'pve3', [3], gone).endswith('; no node the run read has GPU 3 with a driver loaded')
    # a container without GPUs, or moved to a node that has them, as before
    assert _drift.moved('pve1', 'pve3', [], devices) == 'node: expected pve1, found pve3'
    assert _drift.moved('pve2', 'pve1', [0], devices, 'cannot migrate local bind mount point \'mp0\'') == (
        "node: expected pve2, found pve1; pve2 would fit (GPU 0) (PVE cannot move it back: cannot migrate local bind "
        "mount point 'mp0')")


def test_a_running_container_is_destroyed_only_with_force():
    from ansible_collections.gpufleet.proxmox.plugins.module_utils import _lxc as lxc
    rec = lxc.Reconciler(client=None)

    def plan(status, force):
        return {'vmid': 301, 'node': 'pve1', 'exists': True, 'status': status, 'spec': {'force': force},
                'res': {'diff': {'before': {}, 'after': {}}}}
    with pytest.raises(_lxc_config.SpecError, match='vmid 301 is running on pve1: state absent destroys it only with force'):
        rec._plan_absent(plan('running', False))
    assert rec._plan_absent(plan('running', True))['destroy'] is True
    assert rec._plan_absent(plan('stopped', False))['destroy'] is True


def test_each_expectation_of_torch_is_compared_exactly():
    from ansible_collections.gpufleet.proxmox.plugins.module_utils import _torch_probe
    params = {'expect_torch_version': '2.11.0+cu128', 'expect_cuda_version': '12.8', 'expect_device_count': 2,
              'expect_cudnn_version': None}
    assert _torch_probe.expectations(params) == [('torch_version', '2.11.0+cu128', 'torch_version'),
                                                 ('cuda_version', '12.8', 'cuda_version'),
                                                 ('device_count', 2, 'device_count')]
    assert _torch_probe.same('2.11.0+cu128', '2.11.0+cu128') and _torch_probe.same(2, '2')
    for wrong in ('2.11.0+cu130', '2.11.0', '2.11.1+cu128', None):
        assert not _torch_probe.same('2.11.0+cu128', wrong), wrong


class RecordingPve:
    """The PVE API as a Reconciler meets it, recording each request: the config it reads is the plan's."""

    def __init__(self):
        self.calls = []

    def get(self, path):
        self.calls.append(('GET', path))
        return [] if path.endswith('/pending') else {'digest': 'd2'}

    def mutate(self, method, path, **params):
        self.calls.append((method, path, params))

    def run_task(self, method, path, node, what, accepted=None, **params):
        self.calls.append((method, path, what))
        if accepted:
            accepted()


@pytest.mark.parametrize('check_mode', [True, False])
def test_check_mode_sends_pve_no_change(check_mode):
    from ansible_collections.gpufleet.proxmox.plugins.module_utils import _lxc as lxc
    pve = RecordingPve()
    rec = lxc.Reconciler(pve, check_mode=check_mode)
    plan = {'vmid': 301, 'node': 'pve1', 'path': 'nodes/pve1/lxc/301', 'status': 'running', 'action': 'reboot',
            'spec': {'restart_on_pending': True}, 'sets': {'memory': 4096}, 'deletes': ['mp1'],
            'current': {'digest': 'd1'}, 'res': {'changed': True, 'restart_required': True}}
    res = rec.apply(plan)
    writes = [c for c in pve.calls if c[0] != 'GET']
    if check_mode:
        assert writes == [] and res['actions'] == []
    else:  # the same plan, run for real, is what check mode kept from PVE
        assert writes == [('PUT', 'nodes/pve1/lxc/301/config', {'memory': 4096, 'delete': 'mp1', 'digest': 'd1',
                                                                   'lock_timeout': 60}),
                          ('POST', 'nodes/pve1/lxc/301/status/reboot', 'reboot CT 301')]
        assert res['actions'] == ['config', 'reboot']
