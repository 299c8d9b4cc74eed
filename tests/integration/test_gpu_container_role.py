"""The gpu_node and gpu_container roles through playbooks/site.yml, against the lab."""

import os
import subprocess

import pytest

from conftest import gpu_node, run_playbook, site
from gpufleet.lab import manager

pytestmark = pytest.mark.lab

OPEN = ('import errno, glob, os\n'
        'for p in sorted(glob.glob("/dev/nvidia*")):\n'
        '    try:\n'
        '        os.close(os.open(p, os.O_RDWR)); print(p, "OK")\n'
        '    except OSError as e:\n'
        '        print(p, errno.errorcode[e.errno])\n')


def recap(result, host):
    return result.stats[host]


def entry(vmid, hostname, gpus, **kw):
    e = {'vmid': vmid, 'hostname': hostname, 'node': 'pve1', 'gpus': gpus, 'cores': 1, 'memory': 512,
         'net': 'name=eth0,bridge=vmbr0,ip=10.77.0.{0}/24,gw=10.77.0.1'.format(vmid % 200 + 2)}
    e.update(kw)
    return e


def devices_seen(vmid):
    out = subprocess.run(['pct', 'exec', str(vmid), '--', 'python3', '-c', OPEN], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return dict(line.split() for line in out.stdout.splitlines())


def node_play(**role_vars):
    """A play of the gpu_node role alone on the lab's nodes (without the driver bundle), with role_vars."""
    return {'name': 'node', 'hosts': 'pve_nodes', 'gather_facts': False,
            'roles': [dict({'role': 'gpufleet.proxmox.gpu_node', 'gpu_node_driver_bundle': False}, **role_vars)]}


CONTROL = {'/dev/nvidiactl': 'ENXIO', '/dev/nvidia-uvm': 'ENXIO', '/dev/nvidia-uvm-tools': 'ENXIO',
           '/dev/nvidia-modeset': 'ENXIO'}


def test_two_containers_each_see_only_their_gpus(tmp_path, pve, control):
    fleet = [entry(311, 'train-lo', [0, 1, 2, 3], nameserver='10.77.0.1', searchdomain='lab.example'),
             entry(312, 'train-hi', [4, 5, 6, 7])]
    pve.made.extend([311, 312])
    first = site(tmp_path, fleet)
    assert first.rc == 0, first.stdout[-4000:]
    # each GPU's node is the minor the driver gives it, not its index (the lab's are reversed)
    assert devices_seen(311) == dict(CONTROL, **{gpu_node(i): 'ENXIO' for i in range(4)})
    assert devices_seen(312) == dict(CONTROL, **{gpu_node(i): 'ENXIO' for i in range(4, 8)})
    assert gpu_node(0) == '/dev/nvidia7' and '/dev/nvidia0' in devices_seen(312)
    for vmid in (311, 312):
        smi = subprocess.run(['pct', 'exec', str(vmid), '--', 'nvidia-smi'], capture_output=True, text=True)
        assert 'Driver Version: 580.95.05' in smi.stdout
    assert recap(first, 'train-lo')['failures'] == 0 and recap(first, 'train-hi')['failures'] == 0
    # the fleet entry's DNS is the container's
    config = pve.api.nodes('pve1').lxc(311).config.get()
    assert (config['nameserver'], config['searchdomain']) == ('10.77.0.1', 'lab.example')
    resolv = subprocess.run(['pct', 'exec', '311', '--', 'cat', '/etc/resolv.conf'], capture_output=True, text=True)
    assert 'nameserver 10.77.0.1' in resolv.stdout
    control.clear_requests()
    second = site(tmp_path, fleet)
    assert second.rc == 0
    assert all(s['changed'] == 0 for s in second.stats.values()), second.stats
    assert control.mutating_requests() == []


def test_gpus_named_by_uuid_and_bus_id_get_those_cards(tmp_path, pve):
    """A fleet entry naming its GPUs as nvidia-smi does (a UUID, a PCI bus id) gets those cards' device nodes: the
    lab's GPU 5 by its UUID and GPU 6 by its bus id (domain left out), each at the minor its driver gave it."""
    fleet = [entry(313, 'train-named', ['GPU-1ab0c0de-0000-4000-8000-000000000005', '78:00.0'])]
    pve.made.append(313)
    first = site(tmp_path, fleet)
    assert first.rc == 0, first.stdout[-4000:]
    assert devices_seen(313) == dict(CONTROL, **{gpu_node(5): 'ENXIO', gpu_node(6): 'ENXIO'})
    second = site(tmp_path, fleet)  # the names are the same cards again: nothing to change
    assert second.rc == 0 and all(s['changed'] == 0 for s in second.stats.values()), second.stats


def test_a_gpu_named_by_uuid_follows_its_card_when_cards_swap_slots(tmp_path, pve, lab):
    """Cards 2 and 5 of pve1 swap slots in a maintenance (the node down, then up): a container that names card 5 by
    its UUID is drift in a check run (its devN is the card's old slot's), and a repair gives it the card's new device
    node; a container given index 3 keeps slot 3, whatever card is in it, as an index says."""
    from test_drift import drift, summary
    card5 = 'GPU-1ab0c0de-0000-4000-8000-000000000005'
    fleet = [entry(314, 'by-card', [card5]), entry(315, 'by-slot', [3])]
    pve.made.extend([314, 315])
    assert site(tmp_path, fleet).rc == 0
    assert devices_seen(314) == dict(CONTROL, **{gpu_node(5): 'ENXIO'})
    try:
        manager.swap_gpus(lab, 'pve1', 2, 5, say=lambda msg: None)
        check = drift(tmp_path, fleet, '--check', '--diff', '--skip-tags', 'venv,verify')
        assert check.rc == 0, check.stdout[-3000:]
        items = dict((h, sorted(i['item'] for i in found)) for h, found in summary(tmp_path)['containers'].items())
        assert 'dev0' in items['by-card'] and 'dev0' not in items['by-slot'], items
        # the containers started again at boot (onboot), by-card on slot 5's card: PVE 9 hot-plugs the new device, and
        # the old one goes only at a restart: a repair not allowed to restart says it waits, never that it repaired it
        waits = drift(tmp_path, fleet, '--skip-tags', 'venv,verify')
        assert waits.rc == 0, waits.stdout[-3000:]
        told = summary(tmp_path)
        assert told['waiting_hosts'] == ['by-card'] and told['waiting'] >= 1, told
        assert [i['item'] for i in told['containers']['by-card'] if i.get('waits')][-1] == 'restart'
        # which the repair makes where it is told to
        fixed = drift(tmp_path, fleet, '--skip-tags', 'venv,verify', '-e', 'gpu_container_restart_on_pending=true')
        assert fixed.rc == 0, fixed.stdout[-3000:]
        # card 5 is in slot 2 now: slot 2's device node, the minor the driver gives that slot
        assert devices_seen(314) == dict(CONTROL, **{gpu_node(2): 'ENXIO'})
        assert devices_seen(315) == dict(CONTROL, **{gpu_node(3): 'ENXIO'})
    finally:
        manager.swap_gpus(lab, 'pve1', 2, 5, say=lambda msg: None)


def test_check_mode_on_a_new_fleet_changes_nothing(tmp_path, pve, control):
    control.clear_requests()
    r = site(tmp_path, [entry(313, 'dry-run', [0])], '--check', '--diff')
    assert r.rc == 0, r.stdout[-3000:]
    assert control.mutating_requests() == []
    assert 313 not in [g['vmid'] for g in pve.api.cluster.resources.get(type='vm')]


def test_one_container_is_removed_with_state_absent_only_where_the_run_confirms_it(tmp_path, pve, control):
    pve.made.append(318)
    keep, gone = entry(317, 'keeps', []), entry(318, 'leaves', [])
    pve.made.append(317)
    first = site(tmp_path, [keep, gone])
    assert first.rc == 0, first.failures()
    assert pve.status(318) == 'running'
    gone['state'] = 'absent'
    control.clear_requests()
    refused = site(tmp_path, [keep, gone])
    assert refused.rc != 0 and any('-e gpufleet_remove_confirm=318' in f for f in refused.failures()), refused.failures()
    assert control.mutating_requests() == [] and pve.status(318) == 'running'
    check = site(tmp_path, [keep, gone], '--check')  # a check run destroys nothing, and needs no confirmation
    assert check.rc == 0, check.failures()
    assert control.mutating_requests() == [] and pve.status(318) == 'running'
    done = site(tmp_path, [keep, gone], gpufleet_remove_confirm='318')
    assert done.rc == 0, done.failures()
    assert 318 not in [g['vmid'] for g in pve.api.cluster.resources.get(type='vm')]
    assert pve.status(317) == 'running'


def test_driver_mismatch_is_reported(tmp_path, pve, lab):
    pve.made.append(314)
    fleet = [entry(314, 'old-driver', [0])]
    ok = site(tmp_path, fleet, gpu_container_driver_mode='none')
    # mode none: nothing gives the container a driver, so the check fails, naming what it found
    msg = ok.task(-1, 'old-driver')['msg'] if ok.rc else ''
    assert ok.rc != 0 and 'driver mismatch' in msg and 'libcuda none' in msg and '580.95.05' in msg
    # an older userspace driver inside the container is named with its version
    lib = tmp_path / 'libcuda.so.570.172.08'
    src = tmp_path / 'x.c'
    src.write_text('int x(void) { return 0; }\n')
    subprocess.run(['gcc', '-shared', '-fPIC', '-Wl,-soname,libcuda.so.1', '-o', str(lib), str(src)], check=True)
    node_copy = os.path.join(lab.root, 'libcuda.so.570.172.08')
    subprocess.run(['cp', str(lib), node_copy], check=True)
    subprocess.run(['pct', 'push', '314', node_copy, '/usr/lib/x86_64-linux-gnu/libcuda.so.570.172.08'], check=True)
    subprocess.run(['pct', 'exec', '314', '--', 'ldconfig'], check=True)
    os.unlink(node_copy)
    bad = site(tmp_path, fleet, gpu_container_driver_mode='none')
    msg = bad.task(-1, 'old-driver')['msg']
    assert 'loads libcuda 570.172.08' in msg and 'kernel module 580.95.05' in msg


BAD = [
    ('unknown key', [{'vmid': 321, 'hostname': 'a', 'node': 'pve1', 'gpus': [0], 'cpu': 2}], 'containers[0] (vmid 321).cpu'),
    ('vmid missing', [{'hostname': 'a', 'node': 'pve1'}], 'containers[0].vmid'),
    ('vmid too small', [{'vmid': 99, 'hostname': 'a', 'node': 'pve1'}], 'containers[0] (vmid 99).vmid'),
    ('vmid not a number', [{'vmid': 'x321', 'hostname': 'a', 'node': 'pve1'}], '.vmid: must be a whole number'),
    ('duplicate vmid', [{'vmid': 321, 'hostname': 'a', 'node': 'pve1'}, {'vmid': 321, 'hostname': 'b', 'node': 'pve1'}],
     'containers[1] (vmid 321).vmid: 321 is also the vmid of containers[0]'),
    ('duplicate hostname', [{'vmid': 321, 'hostname': 'a', 'node': 'pve1'}, {'vmid': 322, 'hostname': 'A', 'node': 'pve1'}],
     'containers[1] (vmid 322).hostname: A is also the hostname of containers[0]'),
    ('bad hostname', [{'vmid': 321, 'hostname': 'train_0', 'node': 'pve1'}], 'containers[0] (vmid 321).hostname'),
    ('node missing', [{'vmid': 321, 'hostname': 'a'}], 'containers[0] (vmid 321).node: required'),
    ('unknown node', [{'vmid': 321, 'hostname': 'a', 'node': 'pve9'}], 'node: pve9 is not a node of the inventory'),
    ('GPU the node lacks', [{'vmid': 321, 'hostname': 'a', 'node': 'pve1', 'gpus': [8]}], 'node pve1 has no GPU 8'),
    ('GPU given twice', [{'vmid': 321, 'hostname': 'a', 'node': 'pve1', 'gpus': [0, 1]},
                         {'vmid': 322, 'hostname': 'b', 'node': 'pve1', 'gpus': [1]}],
     'containers[1] (vmid 322).gpus: GPU 1 of node pve1 is already given to containers[0]'),
    ('GPU listed twice', [{'vmid': 321, 'hostname': 'a', 'node': 'pve1', 'gpus': [2, 2]}], 'gpus: lists a GPU twice'),
    ('gpus not a list', [{'vmid': 321, 'hostname': 'a', 'node': 'pve1', 'gpus': 'first'}], ".gpus: must be a list of GPUs (each an index"),
    ('GPU name the node lacks', [{'vmid': 321, 'hostname': 'a', 'node': 'pve1',
                                  'gpus': ['GPU-1ab0c0de-0000-4000-8000-000000000099']}],
     'node pve1 has no GPU GPU-1ab0c0de-0000-4000-8000-000000000099 (it has [0, 1, 2, 3, 4, 5, 6, 7])'),
    ('negative memory', [{'vmid': 321, 'hostname': 'a', 'node': 'pve1', 'memory': -1}], '.memory: must be a whole number of at least 16'),
    ('cores not a number', [{'vmid': 321, 'hostname': 'a', 'node': 'pve1', 'cores': 'many'}], '.cores: must be a whole number'),
    ('unprivileged not a bool', [{'vmid': 321, 'hostname': 'a', 'node': 'pve1', 'unprivileged': 'yes'}], '.unprivileged: must be true or false'),
    ('net without bridge', [{'vmid': 321, 'hostname': 'a', 'node': 'pve1', 'net': 'name=eth0,ip=dhcp'}], '.net:'),
    ('nameserver not a string', [{'vmid': 321, 'hostname': 'a', 'node': 'pve1', 'nameserver': ['1.1.1.1']}],
     'containers[0] (vmid 321).nameserver: must be a string'),
    ('entry not a dict', ['train-0'], "option 'gpu_container_fleet' is of type str"),
]


def test_bad_fleets_are_rejected_naming_the_field_with_zero_mutations(tmp_path, control):
    """Each bad definition goes through the real role in a play of its own (one ansible-playbook run
    for all of them, after one gpu_node run); each must be refused before any API change."""
    plays = [node_play()]
    for name, fleet, _ in BAD:
        plays.append({'name': name, 'hosts': 'pve_nodes', 'gather_facts': False,
                      'vars': {'gpu_container_fleet': fleet},
                      'tasks': [{'block': [{'ansible.builtin.include_role': {'name': 'gpufleet.proxmox.gpu_container'}}],
                                 'rescue': [{'name': 'rejected', 'ansible.builtin.debug': {
                                     'msg': '{{ ansible_failed_result.msg }}'}}]}]})
    control.clear_requests()
    r = run_playbook(plays, tmp_path)
    assert r.rc == 0, r.stdout[-3000:]
    by_play = dict((p['name'], p) for p in r.data['plays'])
    for name, _, field in BAD:
        rejected = [t['hosts']['pve1'] for t in by_play[name]['tasks'] if t['name'] == 'rejected']
        assert rejected, '{0}: not rejected'.format(name)
        assert field in rejected[0]['msg'], (name, rejected[0]['msg'])
    assert control.mutating_requests() == []


def test_token_only_login_with_gpus_is_rejected(tmp_path, control, creds):
    control.clear_requests()
    api = {'api_host': creds['api_host'], 'api_port': creds['api_port'], 'api_user': creds['api_user'],
           'api_token_id': creds['api_token_id'], 'api_token_secret': creds['api_token_secret'],
           'ca_path': creds['ca_path']}
    r = site(tmp_path, [entry(323, 'tok', [0])], '--tags', 'node,containers', gpu_container_api=api,
             gpu_node_driver_bundle=False)
    assert r.rc != 0
    assert 'can only be set by root@pam with its password' in r.stdout
    assert control.mutating_requests() == []


def test_all_problems_are_reported_at_once(tmp_path, control):
    fleet = [{'vmid': 99, 'hostname': 'bad_name', 'node': 'pve9', 'gpus': [0], 'ram': 1}]
    r = site(tmp_path, fleet, '--tags', 'node,containers', gpu_node_driver_bundle=False)
    assert r.rc != 0
    assert '4 problem(s)' in r.stdout


def test_raw_passthrough_on_a_pve_older_than_8_1(tmp_path, pve, control, lab):
    """PVE 8.0 has no devN: the role passes GPUs through as raw lxc lines in the node's config."""
    pve.made.append(315)
    control.set_version('8.0.4')
    try:
        fleet = [entry(315, 'old-pve', [5])]
        first = site(tmp_path, fleet)
        assert first.rc == 0, first.stdout[-3000:]
        cfg = pve.ct(315).config.get()
        assert not [k for k in cfg if k.startswith('dev')]
        node = gpu_node(5)  # GPU 5's node: the driver's minor for it (2 in the lab)
        minor = node[len('/dev/nvidia'):]
        assert ['lxc.cgroup2.devices.allow', 'c 195:{0} rw'.format(minor)] in cfg['lxc']
        assert ['lxc.mount.entry', '{0} nvidia{1} none bind,optional,create=file'.format(node, minor)] not in cfg['lxc']
        assert ['lxc.mount.entry', '{0} dev/nvidia{1} none bind,optional,create=file'.format(node, minor)] in cfg['lxc']
        assert devices_seen(315) == dict(CONTROL, **{node: 'ENXIO'})
        second = site(tmp_path, fleet)
        assert second.rc == 0 and all(s['changed'] == 0 for s in second.stats.values()), second.stats
        forced = site(tmp_path, fleet, '--tags', 'node,containers', gpu_container_passthrough='devn',
                      gpu_node_driver_bundle=False)
        assert forced.rc != 0 and 'passthrough devn needs PVE 8.1 or later; node pve1 runs 8.0.4' in forced.stdout
    finally:
        control.set_version('9.0.10')


RUNFILE = '''#!/bin/sh
# A stand-in for NVIDIA-Linux-x86_64-580.95.05.run: installs the userspace libraries only when told
# to leave the kernel module alone, as the real installer must be in a container.
case " $* " in *" --no-kernel-module "*) ;; *) echo "refusing to build a kernel module" >&2; exit 1 ;; esac
base64 -d > /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05 <<'LIB'
{lib}
LIB
ln -sf libcuda.so.580.95.05 /usr/lib/x86_64-linux-gnu/libcuda.so.1
'''


def test_runfile_mode_installs_the_matching_userspace(tmp_path, pve):
    import base64
    pve.made.append(316)
    src = tmp_path / 'x.c'
    src.write_text('int x(void) { return 0; }\n')
    lib = tmp_path / 'libcuda.so'
    subprocess.run(['gcc', '-shared', '-fPIC', '-Wl,-soname,libcuda.so.1', '-o', str(lib), str(src)], check=True)
    runfile = tmp_path / 'NVIDIA-Linux-x86_64-580.95.05.run'
    runfile.write_text(RUNFILE.replace('{lib}', base64.encodebytes(lib.read_bytes()).decode()))
    fleet = [entry(316, 'runfile', [6])]
    first = site(tmp_path, fleet, gpu_container_driver_mode='runfile', gpu_container_driver_runfile=str(runfile))
    assert first.rc == 0, first.stdout[-3000:]
    out = subprocess.run(['pct', 'exec', '316', '--', 'sh', '-c', 'ldconfig -p | grep libcuda.so.1'],
                         capture_output=True, text=True, check=True)
    assert 'lib/x86_64-linux-gnu/libcuda.so.1' in out.stdout and 'nvidia-driver' not in out.stdout
    second = site(tmp_path, fleet, gpu_container_driver_mode='runfile', gpu_container_driver_runfile=str(runfile))
    assert second.rc == 0 and second.stats['runfile']['changed'] == 0


def test_gpu_node_remakes_a_missing_uvm_node(tmp_path, lab):
    uvm = lab.record()['gpus']['uvm_major']
    os.unlink('/dev/nvidia-uvm-tools')
    try:
        r = run_playbook([node_play()], tmp_path)
        assert r.rc == 0, r.stdout[-3000:]
        st = os.stat('/dev/nvidia-uvm-tools')
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (uvm, 1)
        assert r.stats['pve1']['changed'] >= 1
    finally:
        if not os.path.exists('/dev/nvidia-uvm-tools'):
            os.mknod('/dev/nvidia-uvm-tools', 0o666 | 0o020000, os.makedev(uvm, 1))
            os.chmod('/dev/nvidia-uvm-tools', 0o666)  # mknod's mode passes through the umask


def test_a_node_without_a_loaded_driver_is_refused_before_anything_on_it_is_mended(tmp_path, lab):
    """A node whose containers ask for GPUs but that has no NVIDIA module loaded fails with the fix, and discovery's
    other findings (here its device-node script edited by hand and a shared directory with another owner) are left
    as they are."""
    assert run_playbook([node_play()], tmp_path).rc == 0  # its boot files written
    script = lab.path('node', 'usr', 'local', 'sbin', 'gpufleet-nvidia-nodes')
    cache = lab.path('node', 'var', 'cache', 'gpufleet', 'uv')  # the lab's first gpu_node_shares
    owner = os.stat(cache)
    proc = tmp_path / 'proc'  # no driver/nvidia/version: no module loaded
    proc.mkdir()
    with open(script, 'a') as fh:
        fh.write('# edited by hand\n')
    os.chown(cache, 0, 0)
    try:
        r = run_playbook([node_play(gpu_node_proc_root=str(proc), gpu_node_require_driver=True)], tmp_path)
        assert r.rc != 0 and r.stats['pve1']['failures'] == 1, r.stdout[-3000:]
        (refused,) = [t for t in r.tasks('pve1') if t.get('failed')]
        assert refused['task'].endswith('Refuse a node without a loaded NVIDIA driver'), refused
        assert 'pve1 has no NVIDIA kernel module loaded' in refused['msg'] and 'modprobe nvidia' in refused['msg']
        assert r.stats['pve1']['changed'] == 0
        with open(script) as fh:
            assert fh.read().endswith('# edited by hand\n')  # not mended: the run stopped first
        assert os.stat(cache).st_uid == 0
    finally:
        os.chown(cache, owner.st_uid, owner.st_gid)
        assert run_playbook([node_play()], tmp_path).rc == 0  # the script put back


def test_gpu_node_writes_its_boot_files_only_where_they_are_wanting(tmp_path, lab):
    """Discovery compares the device-node script, its unit and the link that enables it with what the role writes:
    on a node where they are as they should be no task of boot.yml runs; one changed by hand is a finding
    (file_stale) in check mode, and a plain run puts it back."""
    node = [node_play()]
    first = run_playbook(node, tmp_path)
    assert first.rc == 0, first.stdout[-3000:]
    boot_tasks = ('Put the script that makes the NVIDIA device nodes on the node', 'Put its boot unit on the node')

    def ran(result):
        return [t['task'] for t in result.tasks('pve1') if t['task'].endswith(boot_tasks)]
    again = run_playbook(node, tmp_path)
    assert again.rc == 0 and again.stats['pve1']['changed'] == 0 and ran(again) == [], again.stats
    script = lab.path('node', 'usr', 'local', 'sbin', 'gpufleet-nvidia-nodes')
    with open(script, 'a') as fh:
        fh.write('# edited by hand\n')
    check = run_playbook(node, tmp_path, '--check')
    found = [t for t in check.tasks('pve1') if t['task'].endswith("Discover the node's NVIDIA devices and driver")]
    findings = found[0]['ansible_facts']['gpufleet_gpu_devices']['findings']
    assert [(f['code'], f['path']) for f in findings if f['code'] == 'file_stale'] == [('file_stale', script)]
    with open(script) as fh:
        assert fh.read().endswith('# edited by hand\n')  # check mode changes nothing
    fixed = run_playbook(node, tmp_path)
    assert fixed.rc == 0 and len(ran(fixed)) == 2
    with open(script) as fh:
        assert 'edited by hand' not in fh.read()


def test_after_a_node_reboot_its_boot_unit_makes_the_nodes_before_the_containers_start(tmp_path, pve, lab):
    from gpufleet.lab import manager
    fleet = [entry(316, 'boot-gpu', [2, 3]), entry(317, 'boot-cpu', [])]  # onboot, as gpu_container's defaults
    pve.made.extend([316, 317])
    first = site(tmp_path, fleet)
    assert first.rc == 0, first.stdout[-4000:]
    wants = lab.path('node', 'etc', 'systemd', 'system', 'multi-user.target.wants', 'gpufleet-nvidia-nodes.service')
    assert os.path.exists(wants)  # enabled, as systemctl enable leaves it
    uvm = lab.record()['gpus']['uvm_major']
    done = manager.reboot_node(lab, say=lambda msg: None)
    # the device nodes went with the reboot and nvidia-uvm came back on another major; the unit made them again
    assert done['uvm_major'] != uvm
    code, out = done['units']['gpufleet-nvidia-nodes.service']
    assert code == 0 and 'made /dev/nvidia-uvm ({0}:0)'.format(done['uvm_major']) in out and 'made /dev/nvidia3' in out
    mine = [(s['vmid'], s['exitstatus']) for s in done['started'] if s['vmid'] in (316, 317)]  # other onboot ones may be in the lab
    assert sorted(mine) == [(316, 'OK'), (317, 'OK')]
    assert devices_seen(316) == dict(CONTROL, **{gpu_node(2): 'ENXIO', gpu_node(3): 'ENXIO'})
    again = site(tmp_path, fleet)
    assert again.rc == 0 and all(s['changed'] == 0 for s in again.stats.values()), again.stats
