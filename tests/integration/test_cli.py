"""The gpufleet CLI on the lab (ansible-runner underneath): up, drift, drift --fix and verify with their exit
codes and JSON; unreachable hosts; secrets kept out of everything printed and kept at -vvvv; and AWX's job
model, ansible-runner transmit | worker | process, against a direct run."""

import json
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest
import yaml

from conftest import ROOT, Pve, _api, metric_values
from test_gpu_container_role import entry

pytestmark = pytest.mark.lab

VMID = 361
BIN = os.path.dirname(sys.executable)
CT = (('hostname', 'cli-a'), ('node', 'pve1'), ('vmid', str(VMID)))


def ran(values, command):
    """The run series of one command in a metrics file: (exit code, seconds it took > 0, ended within a minute)."""
    key = (('command', command),)
    return (values[('gpufleet_last_run_exit_code', key)], values[('gpufleet_run_duration_seconds', key)] > 0,
            abs(time.time() - values[('gpufleet_last_run_timestamp_seconds', key)]) < 60)


def gpufleet(home, fleet_file, *args, env=None):
    argv = [os.path.join(BIN, 'gpufleet')] + list(args[:1]) + ['-i', 'inventories/lab', '-e', '@' + str(fleet_file),
                                                               '--artifacts', str(home)] + list(args[1:])
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, **(env or {})))


def as_json(done):
    assert done.stdout.strip().startswith('{'), (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return json.loads(done.stdout)


@pytest.fixture(scope='module')
def fleet(tmp_path_factory, creds, lab):
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.append(VMID)
    tmp = tmp_path_factory.mktemp('cli')
    fleet_file = tmp / 'fleet.json'
    fleet_file.write_text(json.dumps({'gpufleet_containers': [entry(VMID, 'cli-a', [0], memory=2048)]}))
    home = tmp / 'home'
    up = gpufleet(home, fleet_file, 'up', '--json', '--metrics', str(tmp / 'up.prom'))
    result = as_json(up)
    assert up.returncode == 0 and result['exit_code'] == 0, (result['verdict'], up.stderr[-3000:])
    assert ran(metric_values(tmp / 'up.prom'), 'up') == (0, True, True)
    yield {'pve': pve, 'file': fleet_file, 'home': home, 'up': result, 'creds': creds}
    pve.cleanup()


def test_up_provisions_and_tells_what_it_verified(fleet):
    up = fleet['up']
    assert up['command'] == 'up' and up['status'] == 'successful'
    (row,) = up['containers']
    assert (row['host'], row['vmid'], row['ok'], row['torch_version'], row['drift']) == ('cli-a', VMID, True,
                                                                                         '2.13.0+cpu', [])
    assert up['hosts']['cli-a']['failures'] == 0 and up['hosts']['pve1']['unreachable'] == 0
    assert up['verdict'] == 'clean: verified 1 of 1 container(s)'
    assert os.path.isfile(os.path.join(up['reports'], 'cli-a.json'))


def test_drift_exit_codes_check_then_fix(fleet):
    pve = fleet['pve']
    clean = gpufleet(fleet['home'], fleet['file'], 'drift')
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
    assert 'clean: verified 1 of 1 container(s), no drift' in clean.stdout

    pve.ct(VMID).config.put(cores=2)  # the fleet says 1
    prom = fleet['home'].parent / 'textfile' / 'gpufleet.prom'
    prom.parent.mkdir()
    found = gpufleet(fleet['home'], fleet['file'], 'drift', '--json', '--metrics', str(prom))
    result = as_json(found)
    # the drift in the metrics too, as Prometheus' own parser reads them, in a file the collector may read
    values = metric_values(prom)
    assert values[('gpufleet_drift_items', CT)] == 1 and values[('gpufleet_verify_ok', CT)] == 1
    assert ran(values, 'drift') == (2, True, True) and result['metrics'] == str(prom)
    assert stat.S_IMODE(os.stat(prom).st_mode) == 0o644 and os.listdir(prom.parent) == ['gpufleet.prom']
    assert found.returncode == 2 and result['exit_code'] == 2 and result['drift'] is True
    assert [(i['stage'], i['item'], i['before'], i['after']) for i in result['containers'][0]['drift']] == \
        [('container', 'cores', 2, 1)]
    assert pve.ct(VMID).config.get()['cores'] == 2  # the check changed nothing

    # and on the page of that run
    page = fleet['home'].parent / 'drift.html'
    shown = subprocess.run([os.path.join(BIN, 'gpufleet'), 'report', '--artifacts', str(fleet['home']), '--html',
                            str(page)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and 'drift: 1 item(s) found' in shown.stdout, shown.stderr
    assert '<li>container cores: config cores differs (2 -&gt; 1)</li>' in chromium('--dump-dom', page.as_uri())

    table = gpufleet(fleet['home'], fleet['file'], 'drift')  # the same, as lines (stdout is not a terminal)
    assert table.returncode == 2
    assert 'cli-a (node pve1, CT 361): torch 2.13.0+cpu, cuda -, gpus 1 (not counted: a CPU torch), ok yes\n' \
        '  container cores: config cores differs (2 -> 1)\n' in table.stdout and 'drift: 1 item(s) found' in table.stdout

    fixed = gpufleet(fleet['home'], fleet['file'], 'drift', '--fix', '--json', '--metrics', str(prom))
    result = as_json(fixed)
    assert fixed.returncode == 2 and result['verdict'] == 'drift: 1 item(s) repaired, and the fleet verified'
    assert pve.ct(VMID).config.get()['cores'] == 1
    values = metric_values(prom)
    assert values[('gpufleet_drift_items', CT)] == 0  # repaired
    assert ran(values, 'drift-fix') == (2, True, True) and ran(values, 'drift')[0] == 2  # the check's run is kept
    assert gpufleet(fleet['home'], fleet['file'], 'drift').returncode == 0

    # a finding on the node: its line with its fix, and in the metrics until a check no longer finds it
    from gpufleet.lab import manager
    finding = ('gpufleet_node_finding', (('item', 'driver_not_held'), ('node', 'pve1')))
    manager.hold_driver(name='pve1', held=False)
    try:
        loose = gpufleet(fleet['home'], fleet['file'], 'drift', '--metrics', str(prom))
        assert loose.returncode == 2 and metric_values(prom)[finding] == 1
        assert 'node pve1: node driver_not_held: the driver packages ' in loose.stdout
        assert '(fix: apt-mark hold libcuda1 libnvidia-ml1 nvidia-driver nvidia-kernel-dkms)' in loose.stdout
    finally:
        manager.hold_driver(name='pve1', held=True)
    held = gpufleet(fleet['home'], fleet['file'], 'drift', '--metrics', str(prom))
    assert held.returncode == 0 and finding not in metric_values(prom)


def test_a_failed_verification_is_an_error(fleet):
    prom = fleet['home'].parent / 'verify.prom'
    done = gpufleet(fleet['home'], fleet['file'], 'verify', '--json', '-e', '{"verify_expect": {"torch_version": "9.9"}}',
                    '--metrics', str(prom))
    result = as_json(done)
    assert done.returncode == 1 and result['verdict'] == \
        'error: failed on cli-a; verified 0 of 1 container(s): cli-a (CT {0} on pve1): failed'.format(VMID)
    (row,) = result['containers']
    assert row['ok'] is False and row['failures'] == ['torch_version: expected 9.9, got 2.13.0+cpu']
    values = metric_values(prom)
    assert (values[('gpufleet_verify_ok', CT)], values[('gpufleet_container_running', CT)],
            values[('gpufleet_venv_healthy', CT)], values[('gpufleet_gpus_expected', CT)]) == (0, 1, 1, 1)
    assert values[('gpufleet_container_info', tuple(sorted(CT + (
        ('cuda_version', ''), ('driver_version', '580.95.05'), ('torch_version', '2.13.0+cpu')))))] == 1
    assert values[('gpufleet_node_driver_info', (('driver_version', '580.95.05'), ('node', 'pve1')))] == 1
    assert values[('gpufleet_node_gpus', (('node', 'pve1'),))] == 8
    assert ran(values, 'verify') == (1, True, True)
    assert ('gpufleet_drift_items', CT) not in values  # verify does not look for drift


def chromium(*args):
    """Headless Chromium (Debian's package, as `make deps` installs it) with args; its stdout."""
    assert shutil.which('chromium'), 'chromium is not installed (make deps installs it)'
    done = subprocess.run(['chromium', '--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars'] + list(args),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_fleet_page_of_the_last_run_and_of_a_check_now_in_a_browser(fleet, tmp_path):
    """gpufleet report --html from the last run (the failed verification before this test) and from a drift check
    made now (-i), each rendered by a real browser: its DOM names the node, the container and their state, and it
    renders to a PNG. The docs' example (a GPU shared by two, a CPU-only, a missing and a stopped container) too."""
    page = tmp_path / 'fleet.html'
    done = subprocess.run([os.path.join(BIN, 'gpufleet'), 'report', '--artifacts', str(fleet['home']), '--html',
                           str(page)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith('wrote {0}: error: failed on cli-a'.format(page)), done
    dom = chromium('--dump-dom', page.as_uri())
    assert 'data-node="pve1"' in dom and 'data-host="cli-a"' in dom and 'gpufleet verify, ended ' in dom
    assert '>failed</span>' in dom and 'torch_version: expected 9.9, got 2.13.0+cpu' in dom
    assert 'data-gpu="0" data-holders="cli-a"' in dom and 'class="gpu failed"' in dom
    chromium('--window-size=1200,800', '--screenshot=' + str(tmp_path / 'fleet.png'), page.as_uri())
    with open(tmp_path / 'fleet.png', 'rb') as fh:
        png = fh.read()
    assert png.startswith(b'\x89PNG\r\n\x1a\n') and len(png) > 10000
    now = gpufleet(fleet['home'], fleet['file'], 'report', '--html', str(tmp_path / 'now.html'))
    assert now.returncode == 0 and 'clean: verified 1 of 1 container(s), no drift' in now.stdout, now.stdout[-2000:]
    dom = chromium('--dump-dom', (tmp_path / 'now.html').as_uri())
    assert 'gpufleet drift, ended ' in dom and '>verified</span>' in dom and 'data-host="cli-a"' in dom
    example = tmp_path / 'example' / 'artifacts' / 'run'
    example.mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, 'tests', 'unit', 'data', 'report-example.json'), str(example / 'result.json'))
    done = subprocess.run([os.path.join(BIN, 'gpufleet'), 'report', '--artifacts', str(tmp_path / 'example'),
                           '--html', str(tmp_path / 'example.html')], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    dom = chromium('--dump-dom', (tmp_path / 'example.html').as_uri())
    for node in ('gpu01', 'gpu02', 'util01'):
        assert 'data-node="{0}"'.format(node) in dom
    assert 'shared: nb-a, nb-b' in dom and 'CPU only' in dom and 'train-2 (CT 201, missing)' in dom and '>stopped</span>' in dom


def test_an_unreachable_node_exits_4(fleet):
    done = gpufleet(fleet['home'], fleet['file'], 'verify', '--json', '-e', 'ansible_port=2299')
    result = as_json(done)
    assert done.returncode == 4 and result['verdict'] == 'unreachable: pve1'
    assert result['hosts']['pve1']['unreachable'] == 1


def test_no_secret_is_printed_or_kept_at_vvvv(fleet, tmp_path):
    creds = fleet['creds']
    password, secret, vault_password = creds['api_password'], creds['api_token_secret'], 'vault-pw-for-the-test'
    home = tmp_path / 'home'
    # The API password also comes from a vault file, as on a real cluster ...
    (tmp_path / 'vault-pw').write_text(vault_password + '\n')
    (tmp_path / 'vault.yml').write_text(yaml.safe_dump({'gpufleet_api_password': password}))
    subprocess.run([os.path.join(BIN, 'ansible-vault'), 'encrypt', '--vault-password-file', str(tmp_path / 'vault-pw'),
                    str(tmp_path / 'vault.yml')], check=True, capture_output=True)
    # ... and the secrets come in the ways that put them in ansible-runner's artifacts: the environment and -e.
    done = gpufleet(home, fleet['file'], 'verify', '-vvvv', '-e', 'gpufleet_api_token_secret=' + secret,
                    '-e', '@' + str(tmp_path / 'vault.yml'), '--vault-password-file', str(tmp_path / 'vault-pw'),
                    '--limit', 'pve1,cli-a', '--forks', '3', env={'PROXMOX_PASSWORD': password})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert 'PCT EXEC' in done.stderr and 'SSH: EXEC' in done.stderr  # -vvvv: Ansible's own output, shown
    for text in (done.stdout, done.stderr):
        assert password not in text and secret not in text and vault_password not in text
    files = [os.path.join(root, f) for root, _, names in os.walk(home) for f in names]
    assert any(f.endswith('/command') for f in files) and any('/job_events/' in f for f in files)
    for path in files:
        with open(path, 'rb') as fh:
            data = fh.read()
        for value in (password, secret, vault_password):
            assert value.encode() not in data, path
    command = json.loads(open([f for f in files if f.endswith('/command')][0]).read())
    assert command['env']['PROXMOX_PASSWORD'] == '********'
    argv = command['command']
    assert argv[argv.index('--limit') + 1] == 'pve1,cli-a' and argv[argv.index('--forks') + 1] == '3'
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700


def streamed_and_direct(tmp_path, fleet_file):
    """drift.yml --check through transmit | worker | process, and the same directly; each run's events."""
    import ansible_runner
    runs = {}
    for how in ('streamed', 'direct'):
        pd = tmp_path / how
        (pd / 'project').mkdir(parents=True)
        (pd / 'env').mkdir()
        (pd / 'project' / 'drift.yml').write_text(yaml.safe_dump([{
            'name': 'drift', 'ansible.builtin.import_playbook': 'gpufleet.proxmox.drift'}]))
        (pd / 'env' / 'envvars').write_text(yaml.safe_dump({
            'ANSIBLE_CONFIG': os.path.join(ROOT, 'ansible.cfg'), 'PATH': BIN + ':' + os.environ['PATH'],
            'GPUFLEET_REPORT_DIR': str(pd / 'reports')}))
        (pd / 'env' / 'cmdline').write_text('--check -e @{0}'.format(fleet_file))
        args = dict(playbook='drift.yml', inventory=os.path.join(ROOT, 'inventories', 'lab'), ident='run')
        if how == 'direct':
            ansible_runner.run(private_data_dir=str(pd), quiet=True, **args)
        else:
            stream = subprocess.run([os.path.join(BIN, 'ansible-runner'), 'transmit', str(pd), '-p', 'drift.yml',
                                     '--inventory', args['inventory'], '--ident', 'run'],
                                    capture_output=True, check=True).stdout
            worked = subprocess.run([os.path.join(BIN, 'ansible-runner'), 'worker'], input=stream,
                                    capture_output=True, check=True, env=dict(os.environ, PATH=BIN + ':' +
                                                                              os.environ['PATH'])).stdout
            out = tmp_path / 'processed'
            subprocess.run([os.path.join(BIN, 'ansible-runner'), 'process', str(out), '--ident', 'run'],
                           input=worked, capture_output=True, check=True)
            pd = out  # what process wrote
        events = []
        for name in sorted(os.listdir(pd / 'artifacts' / 'run' / 'job_events'),
                           key=lambda n: int(n.split('-', 1)[0])):
            e = json.loads((pd / 'artifacts' / 'run' / 'job_events' / name).read_text())
            data = e.get('event_data') or {}
            if e['event'].startswith('runner_on_'):
                events.append((e['event'], data.get('host'), data.get('task'), (data.get('res') or {}).get('changed')))
        status = (pd / 'artifacts' / 'run' / 'status').read_text().strip()
        rc = (pd / 'artifacts' / 'run' / 'rc').read_text().strip()
        runs[how] = (status, rc, sorted(events, key=str))
    return runs


def test_awx_job_model_transmit_worker_process_matches_a_direct_run(fleet, tmp_path):
    runs = streamed_and_direct(tmp_path, fleet['file'])
    assert runs['streamed'][:2] == runs['direct'][:2] == ('successful', '0')
    assert len(runs['direct'][2]) > 50
    assert runs['streamed'][2] == runs['direct'][2]


def test_verify_judges_the_whole_fleet_not_only_what_it_reached(fleet, tmp_path):
    """A stopped container, then none at all: verify fails, names each container of the fleet with its state, and
    no report of an earlier run is left to read as current (issue: verify said clean with the fleet gone)."""
    pve, reports = fleet['pve'], tmp_path / 'reports'
    reports.mkdir()
    (reports / 'cli-a.json').write_text('{"ok": true}')  # an earlier run's report
    (reports / 'summary.json').write_text('{"ok": true}')
    pve.ok(pve.ct(VMID).status.stop.post())
    for gone in ('stopped', 'missing'):
        if gone == 'missing':
            pve.ok(pve.ct(VMID).delete())
        done = gpufleet(fleet['home'], fleet['file'], 'verify', '--json', '--metrics', str(tmp_path / 'f.prom'))
        result = as_json(done)
        assert done.returncode == 1, result['verdict']
        values = metric_values(tmp_path / 'f.prom')
        assert (values[('gpufleet_container_present', CT)], values[('gpufleet_container_running', CT)],
                values[('gpufleet_verify_ok', CT)]) == ((0 if gone == 'missing' else 1), 0, 0)
        assert result['verdict'].endswith('verified 0 of 1 container(s): cli-a (CT {0} on pve1): {1}'.format(VMID, gone))
        (row,) = result['containers']
        assert (row['host'], row['state'], row['ok']) == ('cli-a', gone, False)
        # The playbook alone, as a cron job would run it: it fails, and summary.json is this run's.
        env = dict(os.environ, GPUFLEET_REPORT_DIR=str(reports), PATH=BIN + ':' + os.environ['PATH'])
        plain = subprocess.run([os.path.join(BIN, 'ansible-playbook'), '-i', 'inventories/lab', '-e',
                                '@' + str(fleet['file']), 'playbooks/verify.yml'], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=900)
        assert plain.returncode != 0
        summary = json.loads((reports / 'summary.json').read_text())
        assert summary['ok'] is False and (summary['verified'], summary['expected']) == (0, 1)
        assert summary['containers'][0]['state'] == gone and summary['run']['id']
        assert sorted(os.listdir(reports)) == ['summary.json']  # cli-a.json of the earlier run is gone


def test_a_driver_upgrade_from_the_cli_planned_rolled_then_nothing_to_do(fleet, lab):
    """gpufleet driver-upgrade: --check plans it (the node, its container, the steps; nothing changes), the roll
    upgrades pve1 and verifies CT 361 on the new driver, a second run has nothing to do, and a version too old for a
    container's venv is refused with the reason as the verdict."""
    from gpufleet.lab import host, manager
    # the fleet as the module's first run made it (a test before this one destroys CT 361)
    up = as_json(gpufleet(fleet['home'], fleet['file'], 'up', '--json'))
    assert up['exit_code'] == 0, up['verdict']
    manager.offer_driver(lab, 'pve1', '580.105.08')
    try:
        check = gpufleet(fleet['home'], fleet['file'], 'driver-upgrade', '--version', '580.105.08', '--check', '--json')
        result = as_json(check)
        assert (check.returncode, result['verdict']) == (0, 'plan for 580.105.08: planned: pve1'), check.stderr[-2000:]
        (row,) = result['upgrade']
        assert row['state'] == 'planned' and row['containers'] == [VMID] and row['steps'][0] == 'stop CT 361 (cli-a)'
        assert host.loaded_version(lab) == '580.95.05'
        rolled = gpufleet(fleet['home'], fleet['file'], 'driver-upgrade', '--version', '580.105.08')
        lines = rolled.stdout.strip().splitlines()
        assert rolled.returncode == 0, (rolled.stdout[-3000:], rolled.stderr[-3000:])
        assert lines[-2].startswith('pve1: upgraded 580.95.05 -> 580.105.08, CT 361 verified (down ') and \
            lines[-1] == 'driver 580.105.08: upgraded: pve1', lines
        assert host.loaded_version(lab) == '580.105.08'
        again = as_json(gpufleet(fleet['home'], fleet['file'], 'driver-upgrade', '--version', '580.105.08', '--json'))
        assert (again['exit_code'], again['verdict']) == (0, 'driver 580.105.08: unchanged: pve1')
        refused = gpufleet(fleet['home'], fleet['file'], 'driver-upgrade', '--version', '520.61.05', '--json',
                           '-e', 'torch_venv_profile=default')
        verdict = as_json(refused)['verdict']
        assert refused.returncode == 1 and verdict.startswith(
            'error: pve1: the NVIDIA driver 520.61.05 does not run the venv of every GPU container on it, '
            'nothing was changed: CT 361 (cli-a): the venv profile default needs an NVIDIA driver of at least '
            "580.65.06: its lock's nvidia-cudnn-cu13==9.19.0.56 is built for CUDA 13"), verdict
    finally:
        # the node's own driver again, and CT 361 onto its bundle (restarted to take the mount)
        manager.restore_kernel(lab, 'pve1')
        back = as_json(gpufleet(fleet['home'], fleet['file'], 'up', '--json', '-e', 'gpu_container_restart_on_pending=true'))
    assert back['exit_code'] == 0, back['verdict']
