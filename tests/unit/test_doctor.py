"""The doctor's verdicts (plugin_utils _doctor) and the CLI's exit code from its report. The doctor itself runs on
the lab in tests/integration/test_doctor.py."""

import pytest

from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _doctor
from gpufleet.cli import fleet

GIB = 1024 ** 3


@pytest.mark.parametrize('msg, fix', [
    ('Host key verification failed.', 'ssh-keyscan -p 2201 10.0.0.5 >> ~/.ssh/known_hosts'),
    ('root@10.0.0.5: Permission denied (publickey).', 'ssh-copy-id -p 2201 root@10.0.0.5'),
    ('ssh: connect to host 10.0.0.5 port 2201: Connection refused', 'ssh -p 2201 root@10.0.0.5 true'),
])
def test_an_unreached_node_gets_the_fix_its_message_asks_for(msg, fix):
    r = _doctor.ssh_row('pve1', {'unreachable': True, 'msg': msg}, 'root@10.0.0.5:2201')
    assert not r['ok'] and fix in r['fix'] and r['detail'].startswith('not reached: ')
    assert _doctor.ssh_row('pve1', {'changed': False}, 'root@10.0.0.5:2201') == {
        'where': 'pve1', 'check': 'ssh', 'ok': True, 'detail': 'logged in as root@10.0.0.5:2201', 'fix': ''}


def test_gpu_checks_apply_only_where_containers_ask_for_gpus():
    none = {'driver_version': None, 'gpus': [], 'findings': [{'code': 'driver_not_loaded', 'msg': 'no module'}]}
    assert [r['ok'] for r in _doctor.driver_rows('util01', none, 0)] == [True]
    missing = _doctor.driver_rows('gpu01', none, 2)
    assert [(r['check'], r['ok']) for r in missing] == [('driver', False)] and 'modprobe nvidia' in missing[0]['fix']
    # what the first run makes by itself is not a reason to wait; a driver it cannot gather is
    seen = {'driver_version': '580.95.05', 'gpus': [{}, {}], 'findings': [
        {'code': 'uvm_node_missing', 'msg': '/dev/nvidia-uvm is missing'},
        {'code': 'file_stale', 'msg': '/usr/local/sbin/gpufleet-nvidia-nodes is missing'},
        {'code': 'bundle_stale', 'fix': 'install the userspace driver of the loaded module', 'msg': 'no libcuda'}]}
    rows = _doctor.driver_rows('gpu01', seen, 1)
    assert [(r['check'], r['ok']) for r in rows] == [('driver', True), ('devices', True), ('bundle_stale', False)]
    # a fresh node's boot script and unit too: the first run writes them
    assert rows[1]['detail'] == ('the first run makes: /dev/nvidia-uvm is missing; /usr/local/sbin/gpufleet-nvidia-nodes '
                                 'is missing')


def test_storage_room_is_counted_per_storage_for_the_new_root_disks():
    wanted = {'local-lvm': 64.0, 'fast': 8.0}
    status = {'local-lvm': {'avail': 40 * GIB, 'active': 1, 'enabled': 1}, 'fast': {'avail': 100 * GIB}}
    rows = _doctor.storage_rows('gpu01', wanted, status)
    assert [(r['detail'].split()[0], r['ok']) for r in rows] == [('fast:', True), ('local-lvm', False)]
    assert '40.0 GiB free' in rows[1]['detail'] and '64 GiB' in rows[1]['detail']
    gone = _doctor.storage_rows('gpu01', {'nvme': 1.0}, {'nvme': 'GET /nodes/gpu01/storage/nvme/status: 500 no storage'})
    assert not gone[0]['ok'] and 'gpufleet_storage' in gone[0]['fix']
    assert _doctor.rootfs_gib('local-lvm:32,mountoptions=noatime', 'x') == ('local-lvm', 32.0)


def test_a_template_missing_from_a_node_says_how_to_download_it():
    volid = 'local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst'
    assert _doctor.template_row('gpu01', volid, {volid})['ok']
    r = _doctor.template_row('gpu01', volid, set())
    assert not r['ok'] and r['fix'] == 'pveam update && pveam download local debian-12-standard_12.12-1_amd64.tar.zst'


def test_what_a_run_would_change_is_counted():
    changes = {'containers': [{'created': True, 'changed_keys': ['cores'], 'power': 'start'},
                              {'created': False, 'changed_keys': ['memory']}, {'created': False, 'changed_keys': []}],
               'orphans': [{'vmid': 999}]}
    assert _doctor.changes_row(changes)['detail'] == \
        'a run would change 1, create 1, start 1; 1 orphan(s) left alone (999)'


def test_the_cli_exit_code_follows_the_doctors_report():
    ok = {'where': 'pve1', 'check': 'ssh', 'ok': True, 'detail': 'x', 'fix': ''}
    bad = dict(ok, check='template', ok=False, fix='pveam download ...')
    assert fleet.doctor_outcome('successful', 0, {}, {'ready': True, 'rows': [ok]})['exit_code'] == 0
    out = fleet.doctor_outcome('failed', 2, {}, {'ready': False, 'rows': [ok, bad]})
    assert out['exit_code'] == 1 and out['verdict'] == 'not ready: 1 of 2 check(s) failed (pve1 template)'
    assert fleet.doctor_outcome('failed', 2, None, None)['verdict'].startswith('error: the doctor wrote no verdict')


def test_a_refused_login_gets_the_fix_for_why_it_was_refused():
    ca = 'cannot log in ...: Could not find a suitable TLS CA certificate bundle, invalid path: /x/pve-root-ca.pem'
    assert 'gpufleet_api_ca_path' in _doctor.login_fix(ca, 'root@pam')
    assert 'gpufleet_api_ca_path' in _doctor.login_fix(ca, 'root@pam', 'gpufleet')
    assert "pveum acl modify / --tokens 'root@pam!gpufleet'" in _doctor.login_fix('GET /nodes: 401', 'root@pam', 'gpufleet')
    assert 'gpufleet_api_password' in _doctor.login_fix("Couldn't authenticate user: root@pam ... code: 401", 'root@pam')


def test_the_template_python3_row_follows_what_the_node_found():
    volid = 'local:vztmpl/alpine-3.22-default_20250617_amd64.tar.xz'
    assert _doctor.python_row('pve1', volid, None) is None  # not looked into: the node's ssh row says why
    assert _doctor.python_row('pve1', volid, {'unreachable': True, 'msg': 'refused'}) is None
    ok = _doctor.python_row('pve1', volid, {'rc': 0, 'stdout': 'python3\n'})
    assert ok == {'where': 'pve1', 'check': 'template python3', 'ok': True, 'fix': '',
                  'detail': volid + ' holds /usr/bin/python3'}
    none = _doctor.python_row('pve1', volid, {'rc': 0, 'stdout': 'none\n'})
    assert not none['ok'] and 'holds no /usr/bin/python3' in none['detail'] and 'pveam available' in none['fix']
    path = _doctor.python_row('pve1', volid, {'rc': 3, 'stdout': '', 'stderr': "storage 'local' does not exist\n"})
    assert (path['ok'], path['detail'], path['fix']) == (
        False, "pvesm path {0}: storage 'local' does not exist".format(volid),
        'check the volume id and its storage on the node: pvesm path ' + volid)
    unread = _doctor.python_row('pve1', volid, {'rc': 4, 'stdout': '', 'stderr': 'tar: xz: Cannot exec'})
    assert not unread['ok'] and unread['detail'] == volid + ' could not be read: tar: xz: Cannot exec'
