"""A venv that cannot start is never "clean", and the container's own Python is served (the CLI on the lab, as an
operator runs it): the venv's interpreter removed, then with a file of torch gone and a hand-made startup file too,
then the container's Python removed. Each is found by `gpufleet drift` (exit 2, the container named, its neighbour
still judged), `drift --fix` ends with a venv that imports torch and is verified afresh, and the next check is
clean."""

import json
import subprocess

import pytest

from conftest import Pve, _api
from test_cli import as_json, gpufleet
from test_gpu_container_role import entry

pytestmark = pytest.mark.lab

A, B = 381, 382
VENVS = '/opt/gpufleet/venvs'


def sh(vmid, cmd):
    return subprocess.run(['pct', 'exec', str(vmid), '--', 'sh', '-c', cmd], capture_output=True, text=True)


def imports_torch(vmid):
    out = sh(vmid, '/root/venv/bin/python -c "import torch; print(torch.__version__)"')
    return out.returncode == 0 and out.stdout.strip() == '2.13.0+cpu'


def items(result, host):
    row = next(r for r in result['containers'] if r['host'] == host)
    return [(i['stage'], i['item']) for i in row['drift']], row


@pytest.fixture(scope='module')
def fleet(tmp_path_factory, creds, lab):
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.extend([A, B])
    tmp = tmp_path_factory.mktemp('starts')
    fleet_file = tmp / 'fleet.json'
    fleet_file.write_text(json.dumps({'gpufleet_containers': [entry(A, 'starts-a', [0], memory=2048),
                                                              entry(B, 'starts-b', [], memory=2048)]}))
    home = tmp / 'home'
    up = gpufleet(home, fleet_file, 'up', '--json')
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    yield {'file': fleet_file, 'home': home}
    pve.cleanup()


def check(fleet):
    done = gpufleet(fleet['home'], fleet['file'], 'drift', '--json')
    return done.returncode, as_json(done)


def fix(fleet):
    done = gpufleet(fleet['home'], fleet['file'], 'drift', '--fix', '--json')
    return done.returncode, as_json(done)


def active(vmid):
    return sh(vmid, 'readlink /root/venv').stdout.strip()


def test_a_venv_without_its_interpreter_is_found_and_built_again(fleet):
    before = active(A)
    assert sh(A, 'rm /root/venv/bin/python').returncode == 0
    assert not imports_torch(A)
    rc, result = check(fleet)
    found, row = items(result, 'starts-a')
    assert rc == 2 and result['exit_code'] == 2 and ('venv', 'no_interpreter') in found, result
    assert row['ok'] is False and not imports_torch(A)  # the check changed nothing and reused no verification
    assert items(result, 'starts-b')[1]['ok'] is True  # its neighbour is judged as it is
    verify = gpufleet(fleet['home'], fleet['file'], 'verify', '--json')
    row = next(r for r in as_json(verify)['containers'] if r['host'] == 'starts-a')
    assert verify.returncode == 1 and row['ok'] is False
    assert 'interpreter: expected the venv starts, got /root/venv/bin/python is missing: nothing can start the venv' \
        in row['failures'], row

    rc, result = fix(fleet)
    found, row = items(result, 'starts-a')
    assert rc == 2 and result['verdict'] == 'drift: 2 item(s) repaired, and the fleet verified', result
    assert ('venv', 'rebuilt') in found and row['ok'] is True
    kept = next(i for i in row['drift'] if i['item'] == 'rebuilt')['kept']
    assert kept == before + '.broken' and sh(A, 'test -d {0} && test ! -e {0}/bin/python'.format(kept)).returncode == 0
    assert active(A) == before and imports_torch(A)
    report = json.loads(open('{0}/starts-a.json'.format(result['reports'])).read())
    assert report['ok'] and not report['torch'].get('reused')  # verified afresh, not from the broken venv's record
    assert check(fleet)[0] == 0


def test_a_venv_that_cannot_start_is_never_mended_in_place(fleet):
    site = '/root/venv/lib/python3.11/site-packages'
    hand = 'import os; os.environ.setdefault("GPUFLEET_TEST", "1")'
    assert sh(A, "rm /root/venv/bin/python {0}/torch/version.py && echo '{1}' > {0}/zz-hand.pth".format(
        site, hand)).returncode == 0
    rc, result = check(fleet)
    found, _row = items(result, 'starts-a')
    assert rc == 2 and {('venv', 'no_interpreter'), ('venv', 'startup_file'),
                        ('venv', 'broken_distribution')} <= set(found), found
    rc, result = fix(fleet)
    found, row = items(result, 'starts-a')
    assert rc == 2 and row['ok'] is True and ('venv', 'rebuilt') in found, result
    assert imports_torch(A) and sh(A, 'test ! -e {0}/zz-hand.pth'.format(site)).returncode == 0
    assert check(fleet)[0] == 0


def test_a_startup_file_no_distribution_installed_is_moved_aside(fleet):
    site = '/root/venv/lib/python3.11/site-packages'
    assert sh(A, "echo 'import sys' > {0}/zz-hand.pth && echo 'x = 1' > {0}/sitecustomize.py".format(
        site)).returncode == 0
    rc, result = check(fleet)
    found, _row = items(result, 'starts-a')
    assert rc == 2 and found.count(('venv', 'startup_file')) == 2, found
    rc, result = fix(fleet)
    assert rc == 2 and items(result, 'starts-a')[1]['ok'] is True, result
    aside = sh(A, 'ls /root/venv/gpufleet-set-aside').stdout.split()
    assert sorted(aside) == ['sitecustomize.py', 'zz-hand.pth'] and imports_torch(A)
    assert check(fleet)[0] == 0


def test_the_containers_own_python_missing_is_a_finding_and_put_back(fleet):
    assert sh(A, 'mv /usr/bin/python3.11 /root/python3.11.moved').returncode == 0
    rc, result = check(fleet)
    found, row = items(result, 'starts-a')
    assert rc == 2 and ('container', 'python') in found, result
    item = next(i for i in row['drift'] if i['item'] == 'python')
    assert item['detail'] == "the container's Python /usr/bin/python3 is missing (a link to python3.11, which is gone)"
    assert 'apt-get install --reinstall -y python3 ' in item['fix'] and 'python3.11-minimal' in item['fix']
    assert item['fix'].endswith('(gpufleet drift --fix does it)')
    assert row['ok'] is False and items(result, 'starts-b')[1]['ok'] is True
    # verify says it for the container (the rest verified), and so does the doctor
    verify = gpufleet(fleet['home'], fleet['file'], 'verify', '--json')
    rows = dict((r['host'], r) for r in as_json(verify)['containers'])
    assert verify.returncode == 1 and rows['starts-b']['ok'] is True
    assert rows['starts-a']['failures'] == ["container_python: expected the container's Python starts, got " + item['detail']]
    doctor = as_json(gpufleet(fleet['home'], fleet['file'], 'doctor', '--json'))
    checks = dict((r['where'], r) for r in doctor['checks'] if r['check'] == 'container python')
    assert checks['starts-a (CT {0} on pve1)'.format(A)]['ok'] is False
    assert checks['starts-a (CT {0} on pve1)'.format(A)]['detail'] == item['detail']
    assert checks['starts-b (CT {0} on pve1)'.format(B)]['ok'] is True

    rc, result = fix(fleet)
    assert rc == 2 and items(result, 'starts-a')[1]['ok'] is True, result
    assert imports_torch(A) and sh(A, 'test -x /usr/bin/python3.11').returncode == 0
    assert check(fleet)[0] == 0
