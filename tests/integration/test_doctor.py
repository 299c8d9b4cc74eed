"""gpufleet doctor on the lab: ready when everything a first run needs is there (and nothing changes), and each
missing prerequisite named, with its fix, in a run that exits 1."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from gpufleet.lab import host
from gpufleet.lab.layout import TEMPLATE
from test_gpu_container_role import entry

pytestmark = pytest.mark.lab

BIN = os.path.dirname(sys.executable)
VMID = 371


def doctor(tmp_path, fleet, *extra, inventories=(), args=()):
    fleet_file = tmp_path / 'fleet.json'
    fleet_file.write_text(json.dumps({'gpufleet_containers': fleet}))
    argv = [os.path.join(BIN, 'gpufleet'), 'doctor', '-i', 'inventories/lab', '-e', '@' + str(fleet_file),
            '--artifacts', str(tmp_path / 'home'), '--json']
    for inv in inventories:
        argv[4:4] = ['-i', str(inv)]
    for e in extra:
        argv += ['-e', e]
    argv += list(args)
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.stdout.strip().startswith('{'), (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    out = json.loads(done.stdout)
    assert out['exit_code'] == done.returncode
    return out


def rows(out):
    return dict(((r['where'], r['check']), r) for r in out['checks'])


def failing(out):
    return sorted((r['where'], r['check']) for r in out['checks'] if not r['ok'])


def test_a_lab_ready_for_its_fleet_says_so_and_nothing_changes(tmp_path, pve):
    out = doctor(tmp_path, [entry(VMID, 'doc-a', [0, 1])])
    assert (out['exit_code'], failing(out)) == (0, []), out['checks']
    got = rows(out)
    assert got[('api', 'api password')]['detail'].startswith('root@pam with its password')
    assert got[('api', 'api token')]['ok'] and got[('pve1', 'pve node')]['detail'].startswith('online, PVE ')
    assert got[('pve1', 'ssh')]['ok'] and got[('pve1', 'pct')]['detail'].endswith('/pct')
    assert got[('pve1', 'driver')]['detail'] == 'NVIDIA 580.95.05, 8 GPU(s)'
    assert got[('pve1', 'wheelhouse')]['detail'].endswith('wheelhouse') and 'wheel(s) in' in got[('pve1', 'wheelhouse')]['detail']
    assert got[('fleet', 'plan')]['detail'] == 'a run would create 1, start 1'
    assert got[('pve1', 'template')]['detail'] == 'local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst'
    assert got[('pve1', 'template python3')]['detail'] == \
        'local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst holds /usr/bin/python3'
    assert got[('pve1', 'storage')]['detail'].startswith('local-lvm: ') and '32 GiB of new root disks' in \
        got[('pve1', 'storage')]['detail']
    assert got[('pve1', 'snapshots')]['detail'] == 'PVE can snapshot each of its 1 container(s)'
    assert out['verdict'].startswith('ready: ')
    assert VMID not in [c['vmid'] for c in pve.api.cluster.resources.get(type='vm')]  # the doctor made nothing


def test_a_container_pve_cannot_snapshot_is_said_and_does_not_stop_a_first_run(tmp_path, lab):
    share = os.path.join(lab.root, 'share-doc')
    os.makedirs(share, exist_ok=True)
    out = doctor(tmp_path, [entry(VMID, 'doc-a', [0], mounts={'mp0': '{0},mp=/data'.format(share)})])
    assert (out['exit_code'], failing(out)) == (0, []), out['checks']
    assert rows(out)[('pve1', 'snapshots')]['detail'] == (
        'PVE cannot snapshot CT {0} (doc-a): its mount point mp0 ({1}) is a host path, which PVE cannot snapshot '
        '("snapshot feature is not available"): bind the path by a raw lxc.mount.entry line instead, or remove '
        'it'.format(VMID, share))


def test_a_missing_template_no_room_no_driver_and_no_wheels_are_each_named_with_the_fix(tmp_path):
    fleet = [entry(VMID, 'doc-a', [0], template='local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst',
                   rootfs=900000)]
    out = doctor(tmp_path, fleet, 'gpu_node_proc_root=/nonexistent', 'torch_venv_wheelhouse=/opt/elsewhere')
    assert out['exit_code'] == 1
    assert failing(out) == [('pve1', 'driver'), ('pve1', 'storage'), ('pve1', 'template'), ('pve1', 'wheelhouse')]
    got = rows(out)
    assert got[('pve1', 'template')]['fix'] == \
        'pveam update && pveam download local ubuntu-24.04-standard_24.04-2_amd64.tar.zst'
    assert 'new containers\' root disks need 900000 GiB' in got[('pve1', 'storage')]['detail']
    assert 'modprobe nvidia' in got[('pve1', 'driver')]['fix']
    assert got[('pve1', 'wheelhouse')]['detail'] == 'offline mode, and /opt/elsewhere holds no wheels'
    assert out['verdict'] == 'not ready: 4 of {0} check(s) failed (pve1 driver, pve1 storage, pve1 template, ' \
        'pve1 wheelhouse)'.format(len(out['checks']))


def test_a_template_without_python3_or_one_that_cannot_be_read_is_named_with_the_fix(tmp_path, lab):
    """The node's template file itself (the API lists it either way): python3 in it, or the archive unreadable."""
    path = os.path.join(lab.storage_path('local'), 'template', 'cache', TEMPLATE)
    try:
        host.make_template(path, python3=False)
        out = doctor(tmp_path, [entry(VMID, 'doc-a', [0])])
        assert (out['exit_code'], failing(out)) == (1, [('pve1', 'template python3')]), out['checks']
        got = rows(out)[('pve1', 'template python3')]
        assert got['detail'].startswith('local:vztmpl/{0} holds no /usr/bin/python3'.format(TEMPLATE))
        assert got['fix'].startswith('use a template that has it (pveam available --section system')
        with open(path, 'wb') as fh:
            fh.write(b'not an archive')
        out = doctor(tmp_path, [entry(VMID, 'doc-a', [0])])
        got = rows(out)[('pve1', 'template python3')]
        assert not got['ok'] and got['detail'].startswith('local:vztmpl/{0} could not be read: '.format(TEMPLATE))
        assert got['fix'] == 'check the file on the node: tar -tf "$(pvesm path local:vztmpl/{0})" (zstd, xz or ' \
            'gzip installed)'.format(TEMPLATE)
    finally:
        host.make_template(path)


def test_logins_that_pve_refuses_are_each_named(tmp_path):
    out = doctor(tmp_path, [entry(VMID, 'doc-a', [0])], 'gpufleet_api_password=wrong',
                 'gpufleet_api_token_secret=00000000-0000-0000-0000-000000000000')
    assert out['exit_code'] == 1
    assert [c for c in failing(out) if c[0] == 'api'] == [('api', 'api password'), ('api', 'api token')]
    got = rows(out)
    assert 'gpufleet_api_password' in got[('api', 'api password')]['fix']
    assert 'pveum acl modify' in got[('api', 'api token')]['fix']


@pytest.mark.parametrize('extra, says, fix', [
    ('ansible_port=2299', 'Connection refused', 'ssh -p 2299 root@127.0.0.1 true'),
    # (a connection of its own: an earlier run's master connection to the node would be reused, host key and all)
    ('{"ansible_ssh_common_args": "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes", '
     '"ansible_control_path_dir": "TMP"}',
     'Host key verification failed', 'ssh-keyscan -p 2201 127.0.0.1 >> ~/.ssh/known_hosts'),
])
def test_a_node_that_ssh_does_not_reach_is_named_with_the_fix(tmp_path, extra, says, fix):
    out = doctor(tmp_path, [entry(VMID, 'doc-a', [0])], extra.replace('TMP', str(tmp_path)))
    assert out['exit_code'] == 1 and ('pve1', 'ssh') in failing(out)
    row = rows(out)[('pve1', 'ssh')]
    assert says in row['detail'] and fix in row['fix']


def test_an_inventory_node_the_cluster_does_not_have_is_named(tmp_path):
    extra = tmp_path / 'more.yml'
    extra.write_text(json.dumps({'all': {'children': {'pve_nodes': {'hosts': {'pve9': {
        'ansible_host': '127.0.0.1', 'ansible_port': 2201, 'ansible_user': 'root',
        'ansible_ssh_private_key_file': '{{ gpufleet_lab_dir }}/ssh/id_ed25519',
        'ansible_ssh_common_args': '-o UserKnownHostsFile={{ gpufleet_lab_dir }}/ssh/known_hosts '
                                   '-o StrictHostKeyChecking=yes', 'ansible_python_interpreter': '/usr/bin/python3'}}}}}}))
    out = doctor(tmp_path, [entry(VMID, 'doc-a', [0])], inventories=[extra])
    assert out['exit_code'] == 1 and ('pve9', 'pve node') in failing(out)
    assert rows(out)[('pve9', 'pve node')]['detail'] == 'the cluster has no node pve9 (it has pve1)'


def test_a_fleet_definition_with_a_problem_is_named(tmp_path):
    out = doctor(tmp_path, [entry(VMID, 'doc-a', [0], cores=0)])
    assert out['exit_code'] == 1 and failing(out) == [('fleet', 'definition')]
    assert 'cores' in rows(out)[('fleet', 'definition')]['detail']


def test_a_run_limited_to_some_nodes_checks_only_those(tmp_path):
    """--limit: the nodes left out are not checked (nor named unreached); the fleet is still checked as a whole."""
    extra = tmp_path / 'more.yml'
    extra.write_text(json.dumps({'all': {'children': {'pve_nodes': {'hosts': {'pve9': {'ansible_host': '127.0.0.1',
                                                                                        'ansible_port': 2299}}}}}}))
    out = doctor(tmp_path, [entry(VMID, 'doc-a', [0])], inventories=[extra], args=['--limit', 'pve1'])
    assert (out['exit_code'], failing(out)) == (0, []), out['checks']
    assert not [r for r in out['checks'] if r['where'] == 'pve9']
