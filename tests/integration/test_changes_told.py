"""What a run says is so, on the lab through the CLI (issue: every sentence the tool prints is true): a GPU added to a
running container is one new devN key, hot-plugged in one run on PVE 9 and waiting for a restart on PVE 8, which is
said as waiting (never repaired) until a run may restart it; an orphan is reported with its own exit code and never
as repaired; a removal is said before and when it happens."""

import json
import subprocess

import pytest

from conftest import Pve, _api, gpu_node
from test_cli import BIN, as_json, gpufleet
from test_gpu_container_role import entry
from test_venv_starts import items

pytestmark = pytest.mark.lab

A, B, ORPHAN = 411, 412, 419


def nodes_in(vmid):
    out = subprocess.run(['pct', 'exec', str(vmid), '--', 'sh', '-c', 'ls /dev | grep nvidia'], capture_output=True,
                         text=True)
    return sorted(out.stdout.split())


def devices(pve, vmid):
    return dict((k, v) for k, v in pve.ct(vmid).config.get().items() if k.startswith('dev'))


def run(fleet_file, home, command, *args):
    done = gpufleet(home, fleet_file, command, '--json', *args)
    return done.returncode, as_json(done)


@pytest.fixture(scope='module')
def fleet(tmp_path_factory, creds, lab):
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.extend([A, B, ORPHAN])
    tmp = tmp_path_factory.mktemp('told')
    yield {'pve': pve, 'tmp': tmp, 'home': tmp / 'home'}
    pve.cleanup()


def write(fleet, containers, name='fleet.json'):
    path = fleet['tmp'] / name
    path.write_text(json.dumps({'gpufleet_containers': containers}))
    return path


def test_a_gpu_added_to_a_running_container_is_one_new_key_hot_plugged_on_pve_9(fleet):
    pve = fleet['pve']
    two = write(fleet, [entry(A, 'told-a', [4, 5], memory=1024)])
    rc, _result = run(two, fleet['home'], 'up')
    assert rc == 0
    before = devices(pve, A)
    three = write(fleet, [entry(A, 'told-a', [4, 5, 6], memory=1024)])
    rc, result = run(three, fleet['home'], 'drift')
    found, row = items(result, 'told-a')
    assert rc == 2 and found == [('container', 'dev6')], found
    assert row['drift'][0]['detail'] == 'dev6 ({0}) is new'.format(gpu_node(6))
    rc, result = run(three, fleet['home'], 'up')
    assert rc == 0, result['verdict']
    after = devices(pve, A)
    # every device keeps its key; the new GPU is the one new key, and the running container has it at once
    assert dict((k, v) for k, v in after.items() if k in before) == before
    assert set(after) - set(before) == {'dev6'} and gpu_node(6) in after['dev6']
    assert gpu_node(6)[len('/dev/'):] in nodes_in(A)
    assert [p for p in pve.ct(A).pending.get() if 'pending' in p or p.get('delete')] == []


def test_on_pve_8_it_waits_for_a_restart_and_is_never_said_repaired_until_a_run_may_restart(fleet, control):
    pve = fleet['pve']
    four = write(fleet, [entry(A, 'told-a', [4, 5, 6, 7], memory=1024)])
    control.set_version('8.4.1')
    try:
        rc, result = run(four, fleet['home'], 'drift')
        found, _row = items(result, 'told-a')
        assert rc == 2 and ('container', 'restart') in found, found
        assert '2 take effect only when told-a restart(s)' in result['verdict'], result['verdict']
        rc, result = run(four, fleet['home'], 'drift', '--fix')
        assert rc == 2 and result['verdict'].startswith('drift: 0 item(s) repaired; 2 wait for a restart (told-a)'), \
            result['verdict']
        assert gpu_node(7)[len('/dev/'):] not in nodes_in(A)  # written, not applied: the container runs as before
        restart = next(i for i in items(result, 'told-a')[1]['drift'] if i['item'] == 'restart')
        assert restart['detail'].startswith('CT {0} takes the change of dev7 ({1}) only when it restarts'.format(
            A, gpu_node(7)))
        # the entry allows a restart: the run restarts it through the API and verifies it
        allowed = write(fleet, [entry(A, 'told-a', [4, 5, 6, 7], memory=1024, restart_on_pending=True)])
        rc, result = run(allowed, fleet['home'], 'drift', '--fix')
        assert rc == 2 and result['verdict'] == 'drift: 1 item(s) repaired, and the fleet verified', result['verdict']
        power = next(i for i in items(result, 'told-a')[1]['drift'] if i['item'] == 'power')
        assert power['detail'] == 'CT {0} was running: rebooted'.format(A)
        assert gpu_node(7)[len('/dev/'):] in nodes_in(A)
        assert run(allowed, fleet['home'], 'drift')[0] == 0
    finally:
        control.set_version('9.0.10')


def test_an_orphan_has_its_own_exit_code_is_never_said_repaired_and_its_gpus_are_never_given_out(fleet):
    pve = fleet['pve']
    mine = write(fleet, [entry(A, 'told-a', [4, 5, 6, 7], memory=1024)])
    # once the fleet's, since taken out of the list: it still runs with GPU 3
    pve.create(ORPHAN, hostname='told-orphan', tags='gpufleet', dev0=gpu_node(3))
    pve.start(ORPHAN)
    for args in ((), ('--fix',)):
        rc, result = run(mine, fleet['home'], 'drift', *args)
        assert rc == 3, (args, result['verdict'])
        assert result['verdict'] == (
            'clean: verified 1 of 1 container(s), no drift; 1 orphan(s) left alone (told-orphan): containers that '
            "carry the fleet's tag outside its definition, their GPUs held"), result['verdict']
        assert 'repaired' not in result['verdict'] and result['drift'] is False
    # the GPU map says who holds GPU 3, in text and JSON
    shown = subprocess.run([BIN + '/gpufleet', 'report', '--artifacts', str(fleet['home'])],
                           capture_output=True, text=True)
    assert 'pve1 GPU 3 GPU-1ab0c0de-0000-4000-8000-000000000003: CT {0} told-orphan, not in the fleet'.format(
        ORPHAN) in shown.stdout.splitlines(), shown.stdout
    mapped = json.loads(subprocess.run([BIN + '/gpufleet', 'report', '--json', '--artifacts',
                                        str(fleet['home'])], capture_output=True, text=True).stdout)
    three = next(g for g in mapped['gpus'] if (g['node'], g['index']) == ('pve1', 3))
    assert three['holders'] == [{'vmid': ORPHAN, 'name': 'told-orphan', 'in_fleet': False, 'state': 'not in the fleet'}]
    # giving GPU 3 to the fleet's container is refused before anything changes, naming its holder; the doctor too
    taken = write(fleet, [entry(A, 'told-a', [3, 4, 5, 6, 7], memory=1024)], 'taken.json')
    why = ('containers[0] (vmid {0}).gpus: GPU 3 of node pve1 is held by CT {1} (told-orphan), which is not in the '
           'fleet'.format(A, ORPHAN))
    before = devices(pve, A)
    up = gpufleet(fleet['home'], taken, 'up')
    assert up.returncode == 1 and why in up.stdout + up.stderr, up.stdout[-2000:]
    assert devices(pve, A) == before
    rc, doctor = run(taken, fleet['home'], 'doctor')
    assert rc == 1 and any(why in c['detail'] for c in doctor['checks'] if not c['ok']), doctor['verdict']
    pve.stop(ORPHAN)
    pve.ok(pve.ct(ORPHAN).delete())
    pve.made.remove(ORPHAN)
    assert run(mine, fleet['home'], 'drift')[0] == 0


def test_a_removal_is_said_in_the_check_and_in_the_run_that_makes_it(fleet):
    both = write(fleet, [entry(A, 'told-a', [4, 5, 6, 7], memory=1024), entry(B, 'told-b', [], memory=1024)])
    assert run(both, fleet['home'], 'up')[0] == 0
    gone = write(fleet, [entry(A, 'told-a', [4, 5, 6, 7], memory=1024),
                         entry(B, 'told-b', [], memory=1024, state='absent')], 'gone.json')
    rc, result = run(gone, fleet['home'], 'drift')
    found, row = items(result, 'told-b')
    assert rc == 2 and found == [('container', 'removal')], result
    assert row['drift'][0]['detail'] == 'CT {0} on pve1 is in the fleet with state absent: a run destroys it'.format(B)
    assert (row['state'], row['why']) == ('removed', 'CT {0} on pve1 is removed by a run (state absent)'.format(B))
    rc, result = run(gone, fleet['home'], 'up', '-e', 'gpufleet_remove_confirm={0}'.format(B))
    row = next(r for r in result['containers'] if r['host'] == 'told-b')
    assert rc == 0 and (row['state'], row['why']) == ('removed', 'CT {0} on pve1 was destroyed (state absent)'.format(B))
    assert B not in [r['vmid'] for r in fleet['pve'].api.cluster.resources.get(type='vm')]


def test_what_stops_a_run_says_what_to_do(fleet, tmp_path):
    import shutil
    from conftest import ROOT
    mine = write(fleet, [entry(A, 'told-a', [4, 5, 6, 7], memory=1024)])
    # --metrics into a directory that is not there: said before anything runs
    missing = gpufleet(fleet['home'], mine, 'drift', '--metrics', str(tmp_path / 'nowhere' / 'x.prom'))
    assert missing.returncode == 1 and missing.stdout == ''
    assert 'is not a directory this user can write to; make it (mkdir -p {0})'.format(tmp_path / 'nowhere') in \
        missing.stderr
    # a node the inventory does not have
    rc, result = run(mine, fleet['home'], 'drift', '--node', 'pve9')
    assert rc == 1 and result['verdict'] == ("error: --node pve9: no such node in the inventory's pve_nodes "
                                             '(ansible-inventory --graph pve_nodes lists them)')
    # a vaulted login without the vault's password
    vaulted = tmp_path / 'inventory'
    shutil.copytree(ROOT + '/inventories/lab', str(vaulted), symlinks=True)
    (tmp_path / 'pass').write_text('secret\n')
    enc = subprocess.run([BIN + '/ansible-vault', 'encrypt_string', '--vault-password-file', str(tmp_path / 'pass'),
                          'x', '--name', 'gpufleet_api_password'], capture_output=True, text=True, check=True)
    (vaulted / 'group_vars' / 'all' / 'vault.yml').write_text(enc.stdout)
    for command in ('drift', 'doctor'):
        done = subprocess.run([BIN + '/gpufleet', command, '-i', str(vaulted), '-e', '@' + str(mine), '--json',
                               '--artifacts', str(fleet['home'])], cwd=ROOT, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 1 and json.loads(done.stdout)['verdict'] == (
            'error: the inventory holds vaulted values and no vault password was given: add --vault-password-file '
            'FILE (or set ANSIBLE_VAULT_PASSWORD_FILE)'), (command, done.stdout[-2000:])
    # --limit to the node alone leaves its containers out: said so, with the way to include them
    rc, result = run(mine, fleet['home'], 'verify', '--limit', 'pve1')
    row = next(r for r in result['containers'] if r['host'] == 'told-a')
    assert rc == 1 and row['state'] == 'unreached'
    assert row['why'] == ("CT {0} runs on pve1 but was not verified: this run's --limit (pve1) leaves its container "
                          'out (gpufleet --node pve1, or add gpufleet_running_pve1 to --limit)'.format(A))
