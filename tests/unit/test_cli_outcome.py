"""The CLI's verdict and exit code from ansible-runner's stats and the reports; the scrubber."""

import os

import pytest

from gpufleet.cli import fleet, secrets

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROW = {'host': 'train-0', 'node': 'pve1', 'vmid': 200, 'ok': True, 'state': 'verified', 'torch_version': '2.11.0+cu128'}
FLEET = {'ok': True, 'verified': 1, 'expected': 1, 'verdict': 'verified 1 of 1 container(s)', 'containers': [ROW]}
ITEM = {'stage': 'container', 'item': 'cores', 'detail': 'config cores differs', 'before': 2, 'after': 1}


def stats(**kinds):
    base = {'ok': {'pve1': 20, 'train-0': 30}, 'changed': {}, 'failures': {}, 'dark': {}, 'skipped': {}}
    base.update(kinds)
    return base


@pytest.mark.parametrize('kinds, drift, rc, code, verdict', [
    ({}, None, 0, 0, 'clean: verified 1 of 1 container(s)'),
    ({}, {'drift': True, 'count': 1, 'containers': {'train-0': [ITEM]}, 'nodes': {'pve1': []}}, 0, 2,
     'drift: 1 item(s) found; `gpufleet drift --fix` repairs them'),
    ({'failures': {'train-0': 1}}, {'drift': True, 'count': 1}, 2, 1, 'error: failed on train-0'),
    ({'dark': {'pve1': 1}, 'failures': {'train-0': 1}}, None, 4, 4, 'unreachable: pve1'),
])
def test_exit_code_precedence(kinds, drift, rc, code, verdict):
    out = fleet.outcome('verify' if drift is None else 'drift', False, 'successful', rc, stats(**kinds),
                        FLEET, drift)
    assert (out['exit_code'], out['verdict']) == (code, verdict)


def test_no_stats_is_an_error_and_rows_join_verification_with_drift():
    assert fleet.outcome('up', False, 'failed', 1, None, None, None)['verdict'] == \
        'error: ansible-playbook exited 1 (failed)'
    out = fleet.outcome('drift', True, 'successful', 0, stats(), FLEET,
                        {'drift': True, 'count': 2, 'containers': {'train-0': [ITEM], 'util-0': [ITEM]},
                         'nodes': {'pve1': []}})
    assert out['verdict'] == 'drift: 2 item(s) repaired, and the fleet verified' and out['command'] == 'drift --fix'
    assert [(r['host'], r['ok'], len(r['drift'])) for r in out['containers']] == [('train-0', True, 1),
                                                                                 ('util-0', None, 1)]
    assert out['nodes'] == {} and out['hosts']['train-0']['ok'] == 30


def test_never_clean_unless_the_whole_fleet_was_verified():
    gone = {'host': 'train-1', 'node': 'pve1', 'vmid': 201, 'state': 'missing', 'ok': False, 'expected': True,
            'why': 'CT 201 does not exist on pve1', 'failures': ['CT 201 does not exist on pve1']}
    half = dict(FLEET, ok=False, expected=2, containers=[ROW, gone],
                verdict='verified 1 of 2 container(s): train-1 (CT 201 on pve1): missing')
    out = fleet.outcome('verify', False, 'successful', 0, stats(), half, None)
    assert (out['exit_code'], out['verdict']) == (1, 'error: verified 1 of 2 container(s): train-1 (CT 201 on pve1): missing')
    assert [(r['host'], r['state']) for r in out['containers']] == [('train-0', 'verified'), ('train-1', 'missing')]
    # The play failed too (the fleet's verdict fails localhost): the verdict names the fleet's gaps either way.
    out = fleet.outcome('verify', False, 'failed', 2, stats(failures={'localhost': 1}), half, None)
    assert out['verdict'] == 'error: failed on localhost; verified 1 of 2 container(s): train-1 (CT 201 on pve1): missing'
    # An empty fleet, no summary, or a summary another run wrote: never clean.
    empty = {'ok': False, 'verified': 0, 'expected': 0, 'verdict': 'verified 0 of 0 container(s)', 'containers': []}
    assert fleet.outcome('verify', False, 'successful', 0, stats(), empty, None)['exit_code'] == 1
    assert fleet.outcome('verify', False, 'successful', 0, stats(), None, None)['verdict'].startswith(
        'error: the run wrote no verdict')
    assert fleet.this_run(dict(FLEET, run={'id': 'old'}), 'new') is None
    assert fleet.this_run(dict(FLEET, run={'id': 'new'}), 'new')['ok'] is True


def test_scrubber_masks_plain_and_json_escaped_forms_longest_first(tmp_path):
    s = secrets.Scrubber(['s3cr"et', 's3cr"et-longer', 'abc', ''])
    assert s.text('a s3cr"et-longer b s3cr"et') == 'a ******** b ********'
    (tmp_path / 'ev.json').write_text('{"x": "s3cr\\"et"}')
    (tmp_path / 'keep').write_text('abc is too short to mask')
    assert s.tree(tmp_path) == [str(tmp_path / 'ev.json')]
    assert (tmp_path / 'ev.json').read_text() == '{"x": "********"}'
    assert (tmp_path / 'keep').read_text() == 'abc is too short to mask'
    assert s.count == 3


def test_secret_values_from_extra_vars_and_names():
    assert secrets.extra_var_secrets(['gpufleet_api_token_secret=t0ken cores=2', '{"db": {"password": "pw12"}}']) == \
        ['t0ken', 'pw12']
    assert secrets.named_secrets([('PROXMOX_PASSWORD', 'x1'), ('HOME', '/root'), ('GH_TOKEN', 'y')]) == ['x1', 'y']


def test_a_terminal_gets_a_table_and_a_log_gets_lines():
    from rich.console import Console
    from gpufleet.cli import show
    result = fleet.outcome('drift', False, 'successful', 0, stats(dark={'pve2': 1}),
                           {'containers': [dict(ROW, devices_seen=4, devices_expected=4, cuda_version='12.8',
                                                gpus=[0, 1, 2, 3])]},
                           {'drift': True, 'count': 1, 'containers': {'train-0': [ITEM]}, 'nodes': {}})
    term = Console(force_terminal=True, width=200, record=True)
    show.render(result, term)
    text = term.export_text()
    assert '┃ container ┃' in text and '│ train-0   │ pve1 │ 200  │ 2.11.0+cu128 │ 12.8 │ gpus 4 (torch sees 4)' in text
    assert 'container cores: config cores differs (2 -> 1)' in text and 'pve2: unreachable' in text
    log = Console(file=open('/dev/null', 'w'), force_terminal=False, width=80, record=True)
    show.render(result, log)
    assert log.export_text().splitlines() == [
        'train-0 (node pve1, CT 200): torch 2.11.0+cu128, cuda 12.8, gpus 4 (torch sees 4), ok yes',
        '  container cores: config cores differs (2 -> 1)', 'pve2: unreachable', 'unreachable: pve2']
    # a CPU torch in a container given GPUs counts none of them: said so, not "0 of 4"
    cpu = dict(ROW, torch_version='2.13.0+cpu', devices_seen=0, devices_expected=None, gpus=[4, 5, 6, 7])
    assert show._devices(cpu) == 'gpus 4 (not counted: a CPU torch)' and show._devices(dict(ROW, gpus=[])) == 'gpus 0'


def events():
    yield {'event': 'playbook_on_play_start', 'event_data': {'play': 'Verify each container'}}
    for host in ('train-0', 'train-1'):
        yield {'event': 'runner_on_start', 'event_data': {'host': host, 'task': 'Verify torch'}}
    yield {'event': 'runner_on_ok', 'event_data': {'host': 'train-0', 'task': 'Verify torch', 'res': {'changed': True}}}
    yield {'event': 'runner_on_failed', 'event_data': {'host': 'train-1', 'task': 'Verify torch',
                                                       'res': {'msg': 'token s3cret-token refused'}}}
    yield {'event': 'runner_on_unreachable', 'event_data': {'host': 'pve2', 'res': {'msg': 'no route'}}}


def test_progress_follows_the_events_per_host():
    from rich.console import Console
    from gpufleet.cli import show
    console = Console(force_terminal=True, width=120, record=True)
    progress = show.Progress(secrets.Scrubber(['s3cret-token']).text, console=console)
    with progress:
        assert all(progress.event(e) is True for e in events())
        table = progress._table()
    assert progress.hosts == {
        'train-0': {'task': 'Verify torch', 'ok': 0, 'changed': 1, 'failed': 0, 'unreachable': 0},
        'train-1': {'task': 'Verify torch', 'ok': 0, 'changed': 0, 'failed': 1, 'unreachable': 0},
        'pve2': {'task': '', 'ok': 0, 'changed': 0, 'failed': 0, 'unreachable': 1}}
    assert table.title == 'Verify each container' and table.row_count == 3
    assert progress.failures == ['train-1: token ******** refused']  # each failed task's message, scrubbed
    # Not a terminal: one line per play and per failed or unreachable host, secrets masked.
    log = Console(file=open('/dev/null', 'w'), force_terminal=False, width=200, record=True)
    with show.Progress(secrets.Scrubber(['s3cret-token']).text, console=log) as plain:
        for e in events():
            plain.event(e)
    assert log.export_text().splitlines() == [
        'PLAY Verify each container', '  failed: train-1: Verify torch: token ******** refused',
        '  unreachable: pve2: no route']


def test_node_is_a_limit_to_the_node_and_its_containers():
    assert fleet.node_limit(['pve1']) == 'pve1,gpufleet_running_pve1'
    assert fleet.node_limit(['gpu-01', 'util.02']) == ('gpu-01,gpufleet_running_gpu_01,'
                                                      'util.02,gpufleet_running_util_02')
    from gpufleet.cli.main import build_parser as parser
    with pytest.raises(SystemExit):
        parser().parse_args(['verify', '--node', 'pve1', '--limit', 'pve1'])
    assert parser().parse_args(['verify', '--node', 'pve1', '--node', 'pve2']).node == ['pve1', 'pve2']


def test_pipelining_is_on_where_no_config_sets_it_and_as_configured_where_one_does(tmp_path, monkeypatch):
    for name in ('ANSIBLE_CONFIG', 'ANSIBLE_PIPELINING', 'ANSIBLE_HOST_KEY_CHECKING', 'ANSIBLE_CALLBACKS_ENABLED'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('HOME', str(tmp_path))  # no ~/.ansible.cfg
    bare = tmp_path / 'inventories-repo'
    bare.mkdir()
    monkeypatch.chdir(bare)
    assert fleet.ansible_settings() == {'ANSIBLE_HOST_KEY_CHECKING': 'True', 'ANSIBLE_PIPELINING': 'True',
                                        'ANSIBLE_CALLBACKS_ENABLED': 'gpufleet.proxmox.prefork'}
    (bare / 'ansible.cfg').write_text('[defaults]\nhost_key_checking = False\ncallbacks_enabled = gpufleet.proxmox.prefork\n'
                                      '[connection]\npipelining = False\n')
    assert fleet.ansible_settings() == {'ANSIBLE_HOST_KEY_CHECKING': 'False'}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('ANSIBLE_PIPELINING', 'False')
    assert 'ANSIBLE_PIPELINING' not in fleet.ansible_settings()


def test_the_cli_adds_the_prefork_callback_to_those_the_operator_enables(tmp_path, monkeypatch):
    for name in ('ANSIBLE_CONFIG', 'ANSIBLE_CALLBACKS_ENABLED'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('HOME', str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'ansible.cfg').write_text('[defaults]\ncallbacks_enabled = ansible.posix.profile_tasks, timer\n')
    assert fleet.ansible_settings()['ANSIBLE_CALLBACKS_ENABLED'] == \
        'ansible.posix.profile_tasks,timer,gpufleet.proxmox.prefork'
    monkeypatch.setenv('ANSIBLE_CALLBACKS_ENABLED', 'timer')
    assert fleet.ansible_settings()['ANSIBLE_CALLBACKS_ENABLED'] == 'timer,gpufleet.proxmox.prefork'
    # enabled by its former name: not added again
    monkeypatch.setenv('ANSIBLE_CALLBACKS_ENABLED', 'timer,gpufleet.proxmox.gc_freeze')
    assert 'ANSIBLE_CALLBACKS_ENABLED' not in fleet.ansible_settings()


def test_the_checkouts_ansible_cfg_enables_the_prefork_callback(monkeypatch):
    from ansible.config.manager import ConfigManager
    monkeypatch.delenv('ANSIBLE_CALLBACKS_ENABLED', raising=False)
    config = ConfigManager(os.path.join(ROOT, 'ansible.cfg'))
    assert 'gpufleet.proxmox.prefork' in config.get_config_value('CALLBACKS_ENABLED')


def test_the_prefork_callback_freezes_the_controllers_objects_at_each_play_and_task():
    import gc
    from ansible_collections.gpufleet.proxmox.plugins.callback.prefork import CallbackModule
    callback = CallbackModule()
    try:
        for start, args in ((callback.v2_playbook_on_play_start, ('play',)),
                            (callback.v2_playbook_on_task_start, ('task', False)),
                            (callback.v2_playbook_on_handler_task_start, ('handler',))):
            gc.unfreeze()
            kept = [[n] for n in range(1000)]  # tracked by the collector
            assert gc.get_freeze_count() == 0
            start(*args)
            assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()


def test_a_node_finding_shows_its_fix():
    from gpufleet.cli import show
    from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _drift
    (item,) = _drift.node({'findings': [{'code': 'driver_not_held', 'msg': 'the driver packages libcuda1 are not held',
                                         'fix': 'apt-mark hold libcuda1'}]})
    assert show.drift_line(item) == ('node driver_not_held: the driver packages libcuda1 are not held '
                                     '(fix: apt-mark hold libcuda1)')
    assert show.drift_line(dict(item, fix=None)) == 'node driver_not_held: the driver packages libcuda1 are not held'


def plan(node, needed=True, loaded='580.95.05', **extra):
    return dict({'node': node, 'needed': needed, 'from': loaded, 'to': '580.105.08',
                 'containers': [{'vmid': 221, 'hostname': 'train-c1'}], 'steps': ['stop CT 221 (train-c1)', 'reboot']},
                **extra)


def test_a_driver_upgrade_says_each_nodes_state_and_fails_where_a_node_failed():
    from gpufleet.cli import show
    nodes = {'pve1': plan('pve1'), 'pve2': plan('pve2', loaded='570.172.08'), 'pve3': plan('pve3', False, None)}
    ok = stats(ok={'pve1': 5, 'pve2': 5, 'pve3': 5})
    checked = fleet.upgrade_outcome(True, 'successful', 0, ok, nodes)
    assert (checked['exit_code'], checked['verdict']) == (0, 'plan for 580.105.08: planned: pve1, pve2; no driver: pve3')
    assert show.upgrade_line(checked['upgrade'][0]) == \
        'pve1: planned 580.95.05 -> 580.105.08: 1. stop CT 221 (train-c1); 2. reboot'
    # the roll stopped at pve2 (its report says why), pve1 after it was not reached
    nodes['pve2'].update(state='failed', msg='pve2: the upgrade failed at "Reboot the node": timed out. The roll stops')
    stopped = fleet.upgrade_outcome(False, 'failed', 2, stats(ok={'pve1': 5}, failures={'pve2': 1}), nodes)
    assert (stopped['exit_code'], stopped['verdict']) == (1, 'error: failed: pve2; not reached: pve1; no driver: pve3')
    lines = [show.upgrade_line(r) for r in stopped['upgrade']]
    assert lines == ['pve1: not reached (580.95.05 -> 580.105.08 waits for the node that failed)',
                     'pve2: FAILED: pve2: the upgrade failed at "Reboot the node": timed out. The roll stops',
                     'pve3: no NVIDIA driver loaded (no GPUs): nothing to upgrade']
    # mended and run again: each node upgraded, or already on the version
    nodes['pve1'].update(state='upgraded', down_seconds=42)
    nodes['pve2'] = plan('pve2', False, '580.105.08')
    done = fleet.upgrade_outcome(False, 'successful', 0, ok, nodes)
    assert (done['exit_code'], done['verdict']) == (0, 'driver 580.105.08: upgraded: pve1; unchanged: pve2; no driver: pve3')
    assert show.upgrade_line(done['upgrade'][0]) == 'pve1: upgraded 580.95.05 -> 580.105.08, CT 221 verified (down 42 s)'
    assert show.upgrade_line(done['upgrade'][1]) == 'pve2: on 580.105.08 already'
    # a version refused before any plan was written: the verdict is the refusal
    refused = fleet.upgrade_outcome(False, 'failed', 2, stats(failures={'pve1': 1}), {}, [
        'pve1: the NVIDIA driver 520.61.05 does not run the venv of every GPU container on it'] * 2)
    assert (refused['exit_code'], refused['verdict']) == (
        1, 'error: pve1: the NVIDIA driver 520.61.05 does not run the venv of every GPU container on it')


@pytest.mark.parametrize('argv, check', [(['drift'], True), (['drift', '--fix'], False), (['up'], False),
                                         (['verify'], False)])
def test_only_a_drift_without_fix_is_a_check_run(argv, check):
    from gpufleet.cli.main import build_parser
    args = build_parser().parse_args(argv + ['-i', 'inventories/lab', '-e', 'a=1'])
    options = fleet.playbook_options(args, args.command)
    assert options[:4] == ['-i', os.path.abspath('inventories/lab') if os.path.exists('inventories/lab') else
                           'inventories/lab', '-e', 'a=1']
    assert ('--check' in options) is check and ('--diff' in options) is check
