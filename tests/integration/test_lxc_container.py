"""gpufleet.proxmox.lxc_container, run through Ansible against the lab's PVE API."""

import os
import threading
import time

import pytest

pytestmark = pytest.mark.lab

TEMPLATE = 'local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst'


def ct(vmid, **options):
    """A lxc_container task for vmid on the lab node."""
    args = dict(vmid=vmid, node='pve1', ostemplate=TEMPLATE, storage='local-lvm')
    args.update(options)
    return {'gpufleet.proxmox.lxc_container': args, 'ignore_errors': True}


def only(play, task, *args, **kwargs):
    """The task's result, failed or not (the task runs with ignore_errors): check `failed` before anything else."""
    r = play([task], *args, **kwargs)
    return r.task(0)


def done(play, task, *args, **kwargs):
    """The task's result, which must not have failed (a failed module also says changed: false)."""
    res = only(play, task, *args, **kwargs)
    assert not res.get('failed'), res.get('msg')
    return res


def changes_to(control, *vmids):
    """The mutating requests the lab saw for these containers (other tests may share the lab meanwhile)."""
    return [r for r in control.mutating_requests() for v in vmids
            if '/lxc/{0}/'.format(v) in r[1] + '/' or r[1].endswith('/lxc') and 'vmid={0}'.format(v) in r[2]]


def props(text, default_key):
    """A PVE property string as a dict, the value without a key under default_key."""
    out = {}
    for part in text.split(','):
        key, eq, value = part.partition('=')
        out[key if eq else default_key] = value if eq else key
    return out


def test_create_in_check_mode_changes_nothing(play, pve, control):
    control.clear_requests()
    res = only(play, ct(961, hostname='c961', cores=2, devices=[{'path': '/dev/nvidia0'}], state='started'),
               '--check', '--diff')
    assert not res.get('failed'), res
    assert res['changed'] and res['containers'][0]['created']
    assert res['diff']['before'] == {'status': 'absent'}
    assert res['diff']['after']['cores'] == 2 and res['diff']['after']['dev0'] == 'path=/dev/nvidia0'
    assert res['diff']['after']['status'] == 'running'
    assert changes_to(control, 961) == []
    assert 961 not in [g['vmid'] for g in pve.api.cluster.resources.get(type='vm')]


def test_every_option_applied_then_second_run_changes_nothing(play, pve, control, lab):
    pve.made.append(962)
    task = ct(962, hostname='full962', cores=2, memory=1024, swap=256,
              net={'net0': {'name': 'eth0', 'bridge': 'vmbr0', 'ip': '10.77.0.62/24', 'gw': '10.77.0.1'}},
              features=['nesting=1', 'keyctl=1'], unprivileged=True, onboot=True, tags=['gpu', 'train'],
              description='training box\nsecond line', nameserver='10.77.0.1', searchdomain='lab.internal',
              ssh_public_keys='ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZha2Uga2V5IGZvciB0ZXN0cw== test',
              mounts={'mp0': lab.wheelhouse + ',mp=/opt/wheelhouse,ro=1', 'mp1': 'local-lvm:1,mp=/data'},
              devices=[{'path': '/dev/nvidia0', 'mode': '0666'}, {'path': '/dev/nvidiactl', 'uid': 0, 'gid': 0},
                       {'path': '/dev/nvidia-uvm', 'deny_write': False}],
              rootfs='local-lvm:6', state='started')
    first = only(play, task)
    assert not first.get('failed'), first
    assert first['changed'] and first['status'] == 'running'
    cfg = pve.ct(962).config.get()
    assert cfg['hostname'] == 'full962' and cfg['cores'] == 2 and cfg['memory'] == 1024 and cfg['swap'] == 256
    assert 'ip=10.77.0.62/24' in cfg['net0'] and 'hwaddr=' in cfg['net0']
    assert set(cfg['features'].split(',')) == {'nesting=1', 'keyctl=1'}
    assert int(cfg['onboot']) == 1 and set(cfg['tags'].split(';')) == {'gpu', 'train'}
    assert cfg['description'].rstrip('\n') == 'training box\nsecond line'
    assert cfg['nameserver'] == '10.77.0.1' and cfg['searchdomain'] == 'lab.internal'
    assert cfg['mp0'].startswith(lab.wheelhouse) and 'mp=/data' in cfg['mp1'] and 'size=1G' in cfg['mp1']
    assert props(cfg['dev0'], 'path') == {'path': '/dev/nvidia0', 'mode': '0666'}
    assert props(cfg['dev1'], 'path') == {'path': '/dev/nvidiactl', 'uid': '0', 'gid': '0'}
    assert props(cfg['dev2'], 'path') == {'path': '/dev/nvidia-uvm', 'deny-write': '0'}
    assert 'size=6G' in cfg['rootfs'] and int(cfg['unprivileged']) == 1
    assert pve.status(962) == 'running'
    control.clear_requests()
    second = done(play, task, '--diff')
    assert second['changed'] is False, second['diff']
    assert second['changed_keys'] == []
    assert changes_to(control, 962) == []
    # a no-op costs the login, the cluster's guests, the node's containers (their live power) and one config read
    assert second['api_requests'] == 4


def test_update_diff_shows_removals_and_check_mode_sends_nothing(play, pve, control):
    pve.create(963, features='nesting=1,keyctl=1', dev0='path=/dev/nvidia0', dev1='path=/dev/nvidia1', cores=1)
    control.clear_requests()
    task = ct(963, features=['nesting=1'], devices=[{'path': '/dev/nvidia0'}], cores=2)
    check = only(play, task, '--check', '--diff')
    assert check['changed'] and not check.get('failed'), check
    assert set(check['diff']['before']['features'].split(',')) == {'nesting=1', 'keyctl=1'}
    assert check['diff']['after']['features'] == 'nesting=1'
    assert check['diff']['before']['dev1'] == 'path=/dev/nvidia1' and check['diff']['after']['dev1'] is None
    assert check['diff']['before']['cores'] == 1 and check['diff']['after']['cores'] == 2
    assert 'dev0' not in check['diff']['after']  # unchanged keys are not in the diff
    assert sorted(check['changed_keys']) == ['cores', 'dev1', 'features']
    assert changes_to(control, 963) == []
    real = only(play, task)
    assert real['changed'] and not real.get('failed'), real
    puts = [r for r in changes_to(control, 963) if r[0] == 'PUT']
    assert len(puts) == 1 and 'digest=' in puts[0][2] and 'delete=dev1' in puts[0][2]
    cfg = pve.ct(963).config.get()
    assert 'dev1' not in cfg and cfg['features'] == 'nesting=1' and cfg['cores'] == 2
    assert done(play, task)['changed'] is False


def test_empty_means_none_and_left_out_means_unmanaged(play, pve):
    pve.create(964, tags='a;b', dev0='path=/dev/nvidia0', cores=3, features='nesting=1')
    res = only(play, ct(964, tags=[], devices=[], features=[]))
    assert res['changed'] and not res.get('failed'), res
    cfg = pve.ct(964).config.get()
    assert 'tags' not in cfg and 'dev0' not in cfg and 'features' not in cfg
    assert cfg['cores'] == 3  # not given: not managed


def test_property_strings_compare_parsed(play, pve):
    pve.create(965, dev0='mode=0666,path=/dev/nvidia0', features='keyctl=1,nesting=1',
               net0='name=eth0,bridge=vmbr0,ip=10.77.0.65/24')
    res = done(play, ct(965, devices=[{'path': '/dev/nvidia0', 'mode': '666'}], features=['nesting=1', 'keyctl=1'],
                       net={'net0': 'bridge=vmbr0,ip=10.77.0.65/24,name=eth0'}))
    assert res['changed'] is False, res.get('diff')


def test_running_container_pending_changes_and_restart(play, pve):
    pve.create(966, features='nesting=1', cores=1)
    pve.start(966)
    res = only(play, ct(966, features=['nesting=1', 'keyctl=1'], cores=2))
    assert res['changed'] and not res.get('failed'), res
    assert res['pending'] == ['features'] and res['restart_required'] is True
    assert pve.status(966) == 'running'
    assert pve.ct(966).config.get(current=1)['cores'] == 2  # hot-applied
    again = done(play, ct(966, features=['nesting=1', 'keyctl=1'], cores=2, restart_on_pending=True))
    assert again['changed'] and again['restart_required'] is False and again['pending'] == []
    assert pve.ct(966).config.get(current=1)['features'] in ('keyctl=1,nesting=1', 'nesting=1,keyctl=1')
    assert pve.ct(966).pending.get() and not [p for p in pve.ct(966).pending.get() if 'pending' in p]


@pytest.mark.parametrize('version, waits', [('8.4.1', ['dev1', 'nameserver']), ('9.0.10', ['nameserver'])])
def test_check_mode_predicts_what_waits_for_a_restart_by_pve_version(play, pve, control, version, waits):
    # PVE 8 never hot-plugs devN, PVE 9 a new devN key; nameserver always waits; cores is applied at once
    vmid = 990 if version.startswith('8') else 991
    pve.create(vmid, cores=1, dev0='path=/dev/nvidia0,mode=0666')
    pve.start(vmid)
    task = ct(vmid, cores=2, nameserver='10.77.0.53', devices=[{'path': '/dev/nvidia0', 'mode': '0666'},
                                                               {'path': '/dev/nvidia1', 'mode': '0666'}])
    control.set_version(version)
    try:
        check = done(play, task, '--check')
        assert check['changed'] and check['pending'] == waits and check['restart_required'] is True
        real = done(play, task)
    finally:
        control.set_version('9.0.10')
    assert real['pending'] == waits and real['restart_required'] is True  # what check mode said
    assert pve.ct(vmid).config.get(current=1)['cores'] == 2


def test_power_is_decided_on_the_nodes_own_list_not_the_lagging_cluster_list(play, pve, control):
    # /cluster/resources has the status from pvestatd's last round: 'unknown' for a new guest, then behind
    control.set_status_lag(60)
    try:
        pve.create(987)
        pve.start(987)
        assert [g['status'] for g in pve.api.cluster.resources.get(type='vm') if g['vmid'] == 987] == ['unknown']
        started = done(play, ct(987, state='started'))  # taking the list's word would start it again: refused
        assert started['changed'] is False and started['status'] == 'running'
        stopped = done(play, ct(987, state='stopped'))  # taking the list's word would leave it running
        assert stopped['changed'] is True and pve.status(987) == 'stopped'
        assert [g['status'] for g in pve.api.cluster.resources.get(type='vm') if g['vmid'] == 987] == ['unknown']
    finally:
        control.set_status_lag(0)


def test_a_second_factor_is_asked_for_before_anything_changes(play, pve, control):
    pve.made.append(986)
    control.set_tfa(True)
    try:
        res = only(play, ct(986, state='started'))
        with_code = only(play, ct(986, state='started', api_otp='123456'))
        token = only(play, ct(986, state='started'), token=True)  # a token has no second factor
    finally:
        control.set_tfa(False)
    assert res.get('failed') and 'root@pam has two-factor authentication and no code was given' in res['msg'], res
    assert 'give api_otp (gpufleet_api_otp) a current one-time code' in res['msg'] and not res.get('changed')
    assert with_code.get('failed') and 'the code in api_otp was refused' in with_code['msg'], with_code
    assert not token.get('failed'), token.get('msg')
    assert pve.status(986) == 'running'


@pytest.mark.parametrize('lag', [0, 30])
def test_power_states(play, pve, control, lag):
    # with the cluster list lagging as pvestatd's does, each step sees what the step before it did
    control.set_status_lag(lag)
    try:
        pve.create(967)
        assert done(play, ct(967, state='started'))['status'] == 'running'
        assert pve.status(967) == 'running'
        assert done(play, ct(967, state='started'))['changed'] is False
        stopped = done(play, ct(967, state='stopped'))
        assert stopped['changed'] and pve.status(967) == 'stopped'
        assert done(play, ct(967, state='stopped'))['changed'] is False
        restarted = done(play, ct(967, state='restarted'))
        assert restarted['changed'] and pve.status(967) == 'running'
    finally:
        control.set_status_lag(0)


def test_absent_refuses_a_running_container_without_force(play, pve, control):
    pve.create(968)
    pve.start(968)
    control.clear_requests()
    refused = only(play, {'gpufleet.proxmox.lxc_container': {'vmid': 968, 'state': 'absent'}, 'ignore_errors': True})
    assert refused.get('failed') and 'force: true' in refused['msg']
    assert changes_to(control, 968) == [] and pve.status(968) == 'running'
    gone = only(play, {'gpufleet.proxmox.lxc_container': {'vmid': 968, 'state': 'absent', 'force': True,
                                                          'purge': True}})
    assert gone['changed'] and not gone.get('failed'), gone
    assert 968 not in [g['vmid'] for g in pve.api.cluster.resources.get(type='vm')]
    assert done(play, {'gpufleet.proxmox.lxc_container': {'vmid': 968, 'state': 'absent'}})['changed'] is False


def test_token_with_devn_is_refused_before_any_change(play, pve, control):
    pve.create(969, cores=1)
    control.clear_requests()
    res = only(play, ct(969, cores=2, devices=[{'path': '/dev/nvidia0'}]), token=True)
    assert res.get('failed')
    assert 'root@pam' in res['msg'] and 'dev0' in res['msg'] and 'API token' in res['msg']
    assert changes_to(control, 969) == []
    assert pve.ct(969).config.get()['cores'] == 1
    # a check run sets nothing: the token reads what a run with root@pam's password would change
    check = only(play, ct(969, cores=2, devices=[{'path': '/dev/nvidia0'}]), '--check', token=True)
    assert not check.get('failed'), check.get('msg')
    assert check['changed'] and sorted(check['changed_keys']) == ['cores', 'dev0'] and changes_to(control, 969) == []
    ok = only(play, ct(969, cores=2), token=True)
    assert ok['changed'] and not ok.get('failed') and pve.ct(969).config.get()['cores'] == 2


def test_locked_container_is_retried_then_given_up_on(play, pve, control):
    pve.create(970, cores=1)
    control.lock(970, 'backup')
    gave_up = only(play, ct(970, cores=2, lock_timeout=2))
    assert gave_up.get('failed')
    assert 'CT is locked (backup)' in gave_up['msg'] and 'still locked after' in gave_up['msg']
    # A lock that goes away while the module waits: it retries and succeeds.
    timer = threading.Timer(1.5, control.lock, (970, None))
    timer.start()
    started = time.monotonic()
    res = only(play, ct(970, cores=2, lock_timeout=30))
    timer.join()
    assert res['changed'] and not res.get('failed'), res
    assert time.monotonic() - started >= 1.5
    assert pve.ct(970).config.get()['cores'] == 2


def test_start_waits_for_a_backup_lock_to_go(play, pve, control):
    """PVE checks the lock inside the start task (the request is taken, the task fails): the start is retried."""
    pve.create(940)
    control.lock(940, 'backup')
    try:
        gave_up = only(play, ct(940, state='started', lock_timeout=2))
    finally:
        control.lock(940, None)
    assert gave_up.get('failed'), gave_up
    assert 'CT is locked (backup)' in gave_up['msg'] and 'still locked after' in gave_up['msg']
    assert pve.status(940) == 'stopped'
    control.lock(940, 'backup')
    timer = threading.Timer(2.0, control.lock, (940, None))
    timer.start()
    started = time.monotonic()
    try:
        res = only(play, ct(940, state='started', lock_timeout=30))
    finally:
        timer.join()
    assert not res.get('failed'), res.get('msg')
    assert res['changed'] and res['status'] == 'running' and res['containers'][0]['actions'] == ['start']
    assert time.monotonic() - started >= 2.0
    assert pve.status(940) == 'running'


def test_a_failure_after_a_create_reports_the_create(play, pve, control):
    """PVE took the create, then one task-status poll failed: the result says the container was created."""
    pve.made.append(941)
    # one failure, taken by the create's first poll (failures of others' tests are left alone)
    control.fail('GET', '/nodes/{node}/tasks/{upid}/status', status=500, message='proxy lost', times=1)
    res = only(play, ct(941, hostname='c941', state='started'))
    assert res.get('failed') and 'CT 941' in res['msg'] and 'proxy lost' in res['msg'], res.get('msg')
    assert res['changed'] is True
    [one] = res['containers']
    assert one['vmid'] == 941 and one['created'] and one['actions'] == ['create'] and one['changed'] is True
    assert one['failed'] and 'proxy lost' in one['msg'] and one['status'] in ('stopped', 'unknown')
    assert 941 in [g['vmid'] for g in pve.api.cluster.resources.get(type='vm')]


def test_a_device_the_node_lacks_is_refused_before_the_create(play, pve):
    pve.made.append(970)
    res = only(play, ct(970, devices=[{'path': '/dev/nvidia-caps/nvidia-cap9'}], state='started'))
    assert res.get('failed') and 'Device /dev/nvidia-caps/nvidia-cap9 does not exist' in res['msg'], res.get('msg')
    assert res['changed'] is False and 970 not in [g['vmid'] for g in pve.api.cluster.resources.get(type='vm')]


def test_failed_task_is_surfaced_with_its_log(play, pve, node_ssh):
    # a device that was there at the create and is gone at the start (as after a node reboot) fails the start task
    pve.made.append(971)
    assert node_ssh('mknod -m 0666 /dev/gpufleet-test-971 c 1 3').returncode == 0
    try:
        done(play, ct(971, devices=[{'path': '/dev/gpufleet-test-971'}], state='present'))
    finally:
        node_ssh('rm -f /dev/gpufleet-test-971')
    res = only(play, ct(971, devices=[{'path': '/dev/gpufleet-test-971'}], state='started'))
    assert res.get('failed')
    assert 'start CT 971 failed' in res['msg'] and 'Device /dev/gpufleet-test-971 does not exist' in res['msg']
    assert res['task_log'][-1].startswith('TASK ERROR')
    assert pve.status(971) == 'stopped'


def test_fleet_in_one_call(play, pve, control):
    fleet = [{'vmid': 972 + i, 'hostname': 'fleet{0}'.format(i), 'devices': [{'path': '/dev/nvidia{0}'.format(i)}]}
             for i in range(3)]
    pve.made.extend(c['vmid'] for c in fleet)
    task = {'gpufleet.proxmox.lxc_container': {'node': 'pve1', 'ostemplate': TEMPLATE, 'storage': 'local-lvm',
                                               'cores': 1, 'containers': fleet, 'state': 'started'}}
    first = play([task], '--diff').task(0)
    assert not first.get('failed'), first.get('msg')
    assert first['changed'] and [c['status'] for c in first['containers']] == ['running'] * 3
    assert len(first['diff']) == 3
    control.clear_requests()
    second = play([task]).task(0)
    assert not second.get('failed'), second.get('msg')
    assert second['changed'] is False
    assert changes_to(control, 972, 973, 974) == []
    # one login, one read of the cluster's guests, one of their node's containers (live power), one config read each
    assert second['api_requests'] == 3 + len(fleet)


def test_unprivileged_cannot_flip_and_nothing_changes(play, pve, control):
    pve.create(975, cores=1)
    control.clear_requests()
    res = only(play, ct(975, unprivileged=False, cores=2))
    assert res.get('failed') and 'unprivileged' in res['msg'] and 'cannot change' in res['msg']
    assert changes_to(control, 975) == []


def test_rootfs_grows_but_never_shrinks(play, pve):
    pve.create(976, rootfs='local-lvm:4')
    grown = only(play, ct(976, rootfs='local-lvm:8'))
    assert grown['changed'] and not grown.get('failed'), grown
    assert 'size=8G' in pve.ct(976).config.get()['rootfs']
    shrink = only(play, ct(976, rootfs='local-lvm:2'))
    assert shrink.get('failed') and 'cannot shrink' in shrink['msg']


BAD = [
    ({'hostname': 'bad_name!'}, 'hostname'),
    ({'devices': [{'path': '/etc/passwd'}]}, 'devices[0] (dev0): path'),
    ({'devices': [{'path': '/dev/nvidia0', 'mode': 'rwx'}]}, 'devices[0] (dev0): mode'),
    ({'features': ['nesting']}, 'features'),
    ({'net': {'eth0': 'bridge=vmbr0'}}, 'net'),
    ({'mounts': {'disk0': '/srv,mp=/srv'}}, 'mounts'),
    ({'memory': 0}, 'memory'),
    ({'vmid': 42}, 'vmid'),
    # What PVE's own parameter check refuses (lxc_container used to send them and fail half-way through a fleet)
    ({'features': ['foo=1']}, "features: unknown key 'foo'"),
    ({'net': {'net0': 'name=eth0,bridge=vmbr0,ipp=dhcp'}}, "net.net0: unknown key 'ipp'"),
    ({'net': {'net0': 'name=eth0,bridge=vmbr0,ip=10.0.0.300/24'}}, 'net.net0: ip:'),
    # the lab's fakepve does not check pve-lxc-dev-string: it made a container with this path; real PVE
    # (pve-container src/PVE/LXC/Config.pm verify_lxc_dev_string) refuses it, and so does lxc_container
    ({'devices': [{'path': '/dev/../etc/shadow'}]}, 'devices[0] (dev0): path'),
    ({'devices': [{'path': '/dev/nvidia0', 'mode': '4755'}]}, 'devices[0] (dev0): mode'),
    ({'memory': 8}, 'memory: must be a whole number of at least 16'),
    ({'rootfs': '8', 'storage': None}, "rootfs: '8' is a size but names no storage"),
    ({'rootfs': 'size=8G'}, 'rootfs: names no volume'),
]


@pytest.mark.parametrize('bad,field', BAD, ids=[b[1] for b in BAD])
def test_bad_input_names_the_field_and_changes_nothing(play, pve, control, bad, field):
    control.clear_requests()
    options = dict(hostname='ok977')
    options.update(bad)
    vmid = options.pop('vmid', 977)
    res = only(play, ct(vmid, **options))
    assert res.get('failed') and field in res['msg'], res.get('msg')
    assert 'vmid {0}'.format(vmid) in res['msg']
    assert changes_to(control, 977, 978, 979) == []
    assert 977 not in [g['vmid'] for g in pve.api.cluster.resources.get(type='vm')]


def test_a_device_given_as_a_string_is_named(play, pve, control):
    control.clear_requests()
    top = only(play, ct(977, devices=['/dev/nvidia0']))
    assert top.get('failed') and "option 'devices'" in top['msg'], top.get('msg')
    many = only(play, {'gpufleet.proxmox.lxc_container': {'node': 'pve1', 'ostemplate': TEMPLATE, 'containers': [
        {'vmid': 977, 'hostname': 'a977'}, {'vmid': 978, 'hostname': 'b978', 'devices': ['/dev/nvidia0']}]},
        'ignore_errors': True})
    assert many.get('failed') and 'containers[1]' in many['msg'] and 'devices' in many['msg'], many.get('msg')
    assert changes_to(control, 977, 978, 979) == []


def test_bad_input_is_reported_before_the_login(play, pve, control):
    """An option error needs no API: it is reported even when the API cannot be reached."""
    away = dict(api_host='127.0.0.1', api_port=9)
    res = only(play, ct(977, hostname='ok977', memory=8, **away))
    assert res.get('failed') and 'memory: must be a whole number of at least 16' in res['msg'], res.get('msg')
    # a fleet definition (fleet_plan, whose node here is the play's host): the same, before it asks the version
    plan = {'containers': [{'vmid': 977, 'hostname': 'ok977', 'node': 'localhost', 'devices': [{'path': '/dev/../x'}]}],
            'defaults': {'ostemplate': TEMPLATE, 'storage': 'local-lvm'}, 'api': dict(api_user='root@pam',
                                                                                    api_password='x', **away)}
    res = only(play, {'gpufleet.proxmox.fleet_plan': plan, 'ignore_errors': True})
    assert res.get('failed') and 'devices[0] (dev0): path' in res['msg'], res.get('msg')
    # the same call with good options does try the API, and says it cannot log in
    res = only(play, ct(977, hostname='ok977', **away))
    assert res.get('failed') and 'cannot log in' in res['msg'], res.get('msg')


def test_a_bad_third_container_stops_the_first_two(play, pve, control):
    control.clear_requests()
    fleet = [{'vmid': 977, 'hostname': 'good977'}, {'vmid': 978, 'hostname': 'good978'},
             {'vmid': 979, 'hostname': 'bad979', 'net': {'net0': 'name=eth0,bridge=vmbr0,ipp=dhcp'}}]
    pve.made.extend([977, 978, 979])
    res = play([{'gpufleet.proxmox.lxc_container': {'node': 'pve1', 'ostemplate': TEMPLATE, 'storage': 'local-lvm',
                                                    'containers': fleet}, 'ignore_errors': True}]).task(0)
    assert res.get('failed') and "containers[2] (vmid 979, hostname bad979): net.net0: unknown key 'ipp'" in res['msg']
    assert changes_to(control, 977, 978, 979) == []
    assert not {977, 978, 979} & set(g['vmid'] for g in pve.api.cluster.resources.get(type='vm'))


def test_bad_fleet_entry_stops_the_whole_fleet(play, pve, control):
    control.clear_requests()
    fleet = [{'vmid': 978, 'hostname': 'good'}, {'vmid': 978, 'hostname': 'dup'},
             {'vmid': 979, 'cpus': 4}]
    res = play([{'gpufleet.proxmox.lxc_container': {'node': 'pve1', 'ostemplate': TEMPLATE, 'containers': fleet},
                 'ignore_errors': True}]).task(0)
    assert res.get('failed') and 'containers[2]' in res['msg'] and 'cpus' in res['msg']
    fleet.pop()
    res = play([{'gpufleet.proxmox.lxc_container': {'node': 'pve1', 'ostemplate': TEMPLATE, 'containers': fleet},
                 'ignore_errors': True}]).task(0)
    assert res.get('failed') and 'vmid 978 is also given by containers[0]' in res['msg']
    assert changes_to(control, 978, 979) == []


def test_lxc_raw_lines_in_the_nodes_config(play, pve, lab, control):
    pve.create(980, description='keep me')
    conf = os.path.join(lab.pve_root, 'nodes', 'pve1', 'lxc', '980.conf')
    raw = ['lxc.cgroup2.devices.allow: c 195:7 rw', 'lxc.mount.entry = /dev/nvidia7 dev/nvidia7 none bind,optional,create=file']
    control.clear_requests()
    check = done(play, ct(980, lxc_raw=raw, pve_root=lab.pve_root), '--check', '--diff')
    assert check['changed'] and check['diff']['after']['lxc'][0] == 'lxc.cgroup2.devices.allow: c 195:7 rw'
    assert 'lxc.' not in open(conf).read()
    res = only(play, ct(980, lxc_raw=raw, pve_root=lab.pve_root))
    assert res['changed'] and not res.get('failed'), res
    cfg = pve.ct(980).config.get()
    assert cfg['lxc'] == [['lxc.cgroup2.devices.allow', 'c 195:7 rw'],
                          ['lxc.mount.entry', '/dev/nvidia7 dev/nvidia7 none bind,optional,create=file']]
    assert cfg['description'].rstrip() == 'keep me'
    assert done(play, ct(980, lxc_raw=raw, pve_root=lab.pve_root))['changed'] is False
    assert changes_to(control, 980) == []  # raw lines are a file on the node, not an API call
    gone = done(play, ct(980, lxc_raw=[], pve_root=lab.pve_root))
    assert gone['changed'] and 'lxc' not in pve.ct(980).config.get()
    away = only(play, ct(980, lxc_raw=raw, pve_root='/nonexistent'))
    assert away.get('failed') and 'run the task on a node of the cluster' in away['msg']
    token = only(play, ct(980, lxc_raw=raw, pve_root=lab.pve_root), token=True)
    assert token.get('failed') and 'root@pam' in token['msg']
    bad = only(play, ct(980, lxc_raw=['cgroup: nope'], pve_root=lab.pve_root))
    assert bad.get('failed') and 'lxc_raw[0]' in bad['msg']


def test_connection_from_proxmox_environment_variables(lab, pve, tmp_path, creds):
    """With no connection options, the PROXMOX_* environment variables are used (community.proxmox's names)."""
    from conftest import run_playbook
    pve.create(981, cores=1)
    env = {'PROXMOX_HOST': creds['api_host'], 'PROXMOX_PORT': str(creds['api_port']), 'PROXMOX_USER': 'root@pam',
           'PROXMOX_PASSWORD': creds['api_password'], 'PROXMOX_CA_PATH': creds['ca_path']}
    r = run_playbook([{'name': 'env', 'hosts': 'localhost', 'gather_facts': False,
                       'tasks': [{'gpufleet.proxmox.lxc_container': {'vmid': 981, 'cores': 2}}]}], tmp_path, env=env)
    assert r.rc == 0, r.stdout[-2000:]
    assert r.task(0)['changed'] and pve.ct(981).config.get()['cores'] == 2
    # certificate verification stays on: without the CA the login is refused, and says why
    env.pop('PROXMOX_CA_PATH')
    r = run_playbook([{'name': 'env', 'hosts': 'localhost', 'gather_facts': False,
                       'tasks': [{'gpufleet.proxmox.lxc_container': {'vmid': 981, 'cores': 2}}]}], tmp_path, env=env)
    assert r.rc != 0 and 'CERTIFICATE_VERIFY_FAILED' in r.task(0)['msg']


def test_in_the_tasks_process_and_as_the_module_alike(lab, creds, tmp_path, pve, control):
    """On the controller (a local connection, as gpu_container's delegated task) the action does the module's work
    in the task's own process; elsewhere (here the lab node over SSH, with a Python that has proxmoxer) the module
    runs. Both take their logins from PROXMOX_* in the task's environment, plan the same, and hide the values that
    are no_log (the password, here also given as the description) in what they return."""
    import json
    import sys
    from gpufleet.lab.testing import run_playbook
    secret = creds['api_password']
    task = {'gpufleet.proxmox.lxc_container': dict(vmid=962, node='pve1', ostemplate=TEMPLATE, storage='local-lvm',
                                                   hostname='c962', cores=2, description=secret, state='started'),
            'environment': {'PROXMOX_HOST': '{{ gpufleet_api_host }}', 'PROXMOX_PORT': '{{ gpufleet_api_port }}',
                            'PROXMOX_USER': 'root@pam', 'PROXMOX_PASSWORD': '{{ gpufleet_api_password }}',
                            'PROXMOX_CA_PATH': '{{ gpufleet_api_ca_path }}'},
            'ignore_errors': True}
    module = dict(task, delegate_to='pve1', vars={'ansible_python_interpreter': sys.executable})
    without = dict(task, delegate_to='pve1', vars={'ansible_python_interpreter': '/usr/bin/python3'})
    control.clear_requests()
    r = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [task, module, without]}], tmp_path,
                     '--check', '--diff')
    here, there, bare = r.task(0), r.task(1), r.task(2)
    assert not here.get('failed') and not there.get('failed'), (here.get('msg'), there.get('msg'))
    assert 'invocation' in there and 'invocation' not in here  # the module's own wrapper ran only for the second
    keys = ('changed', 'containers', 'changed_keys', 'pending', 'restart_required', 'diff', 'vmid', 'node', 'status')
    assert dict((k, here[k]) for k in keys) == dict((k, there[k]) for k in keys)
    assert here['changed'] and here['containers'][0]['created']
    assert here['diff']['after']['description'] == 'VALUE_SPECIFIED_IN_NO_LOG_PARAMETER'  # as AnsibleModule hides it
    assert secret not in json.dumps(here) and secret not in json.dumps(there)
    assert changes_to(control, 962) == []
    # the module where its Python lacks proxmoxer: says so, and where to install it
    assert bare.get('failed') and 'proxmoxer' in bare['msg'] and '/usr/bin/python3' in bare['msg'], bare


def test_an_async_task_runs_the_module(play, control):
    """async: the action hands the task to the module, which Ansible runs in the background and polls."""
    control.clear_requests()
    res = done(play, dict(ct(964, state='absent'), **{'async': 60, 'poll': 1}))
    assert res['changed'] is False and res['finished'] == 1 and 'ansible_job_id' in res
    assert res['containers'][0]['vmid'] == 964 and 'invocation' in res  # the module's own wrapper ran it
    assert changes_to(control, 964) == []
