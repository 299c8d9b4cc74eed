"""The verdicts, whole: each row, report, count and state compared as the complete dict the reports, the CLI and the
HTML page read, so that a key renamed, a default flipped or a boundary moved fails here (make mutants found each of
these unwatched)."""

import copy

import pytest

from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _verdict

TORCH = {'torch_version': '2.11.0+cu128', 'cuda_version': '12.8', 'cuda_available': True,
         'driver_version': '580.95.05', 'device_count': 2, 'failures': [],
         'checks': [{'name': 'cudnn_conv', 'device': 0, 'status': 'ok'}, {'name': 'cudnn_conv', 'device': 1, 'status': 'ok'},
                    {'name': 'cusparselt_24', 'device': 0, 'status': 'not_applicable', 'why': 'no cuSPARSELt'},
                    {'name': 'cusparselt_24', 'device': 1, 'status': 'not_applicable', 'why': 'no cuSPARSELt'},
                    {'name': 'shm', 'status': 'ok'},
                    {'name': 'allreduce', 'backend': 'nccl', 'world': 2, 'status': 'ok', 'algbw_gbps': 141.2}],
         'throughput': {'tokens_per_s': 20112.5, 'baseline': {'tokens_per_s': 20250.0}, 'ratio': 0.993}}
GOOD = {'host': 'train-0', 'node': 'pve1', 'vmid': 200, 'profile': 'default', 'ok': True, 'run': 'r1',
        'expected': {'device_count': 2}, 'torch': TORCH, 'audit': {'healthy': True, 'findings': {}}}
ROW = {'host': 'train-0', 'node': 'pve1', 'vmid': 200, 'profile': 'default', 'state': 'verified', 'ok': True,
       'torch_version': '2.11.0+cu128', 'cuda_version': '12.8', 'cuda_available': True, 'driver_version': '580.95.05',
       'devices_seen': 2, 'devices_expected': 2, 'failures': [], 'venv_findings': 0,
       'checks': {'allreduce': 'ok', 'cudnn_conv': 'ok', 'cusparselt_24': 'not_applicable', 'shm': 'ok'},
       'allreduce_gbps': 141.2, 'tokens_per_s': 20112.5, 'throughput_ratio': 0.993}
FINDINGS = {'broken_distributions': [{'name': 'a'}], 'collisions': [{}, {}], 'unresolved_libraries': [{}],
            'failed_imports': [{}], 'missing_requirements': [{}], 'interpreter': [{}], 'startup_files': [{}],
            'drift': {'missing': [{}, {}], 'extra': [{}], 'wrong_version': []}}


def bad_report():
    bad = copy.deepcopy(GOOD)
    bad.update(ok=False, audit={'healthy': False, 'findings': FINDINGS})
    bad['torch']['failures'] = [{'check': 'device_count', 'expected': 2, 'actual': 1}]
    return bad


def test_a_rows_every_field_comes_from_its_report():
    assert _verdict.row(GOOD) == ROW
    assert _verdict.row(bad_report()) == dict(ROW, state='failed', ok=False, failures=['device_count: expected 2, got 1'],
                                              venv_findings=11)


def test_a_checks_status_is_the_worst_of_its_devices():
    assert _verdict.checks([{'name': 'cudnn_conv', 'device': 0, 'status': 'ok'},
                            {'name': 'cudnn_conv', 'device': 1, 'status': 'failed'},
                            {'name': 'cudnn_conv', 'device': 2, 'status': 'ok'},
                            {'name': 'cusparselt_24', 'device': 0, 'status': 'not_applicable'},
                            {'name': 'cusparselt_24', 'device': 1, 'status': 'ok'},
                            {'name': 'shm', 'status': 'something new'}]) == {
        'cudnn_conv': 'failed', 'cusparselt_24': 'ok', 'shm': 'failed'}
    assert _verdict.checks(None) == {}
    failed = dict(GOOD, torch=dict(TORCH, checks=[{'name': 'allreduce', 'status': 'failed', 'error': 'x'}]))
    assert _verdict.row(failed)['allreduce_gbps'] is None


def test_a_row_without_its_torch_failures_says_the_audits_problems():
    r = dict(GOOD, ok=False, torch={}, audit={'healthy': False, 'msg': 'no venv at /root/venv'})
    assert _verdict.row(r)['failures'] == ['torch was not verified', 'venv audit: no venv at /root/venv']
    assert _verdict.row(dict(GOOD, ok=False, torch={'failures': [], 'msg': 'x'}, audit={'healthy': False, 'findings': {
        'drift': {'missing': [1]}}}))['failures'] == ['venv audit: {"drift": {"missing": [1]}}']


def test_every_kind_of_audit_finding_is_counted_once():
    assert _verdict.audit_count(FINDINGS) == 11
    assert _verdict.audit_count({}) == _verdict.audit_count(None) == 0
    for kind in FINDINGS:
        assert _verdict.audit_count({kind: FINDINGS[kind]}) == (3 if kind == 'drift' else len(FINDINGS[kind])), kind


def test_a_report_is_healthy_only_where_its_audit_says_so():
    now = {'meta': {'profile': 'default'}, 'expect': {'device_count': 2}}
    result = dict(TORCH, changed=False, failed=False, msg='ok', invocation={})
    assert _verdict.report(now, {'healthy': True, 'findings': {}}, result, 'train-0', 'pve1', 200, 'r1') == {
        'host': 'train-0', 'node': 'pve1', 'vmid': 200, 'run': 'r1', 'profile': 'default', 'ok': True,
        'expected': {'device_count': 2}, 'torch': TORCH, 'audit': {'healthy': True, 'findings': {}, 'error': None}}
    unsaid = _verdict.report(now, {'findings': {}}, result, 'train-0')  # an audit that does not say healthy
    assert unsaid['ok'] is False and unsaid['audit'] == {'healthy': False, 'findings': {}, 'error': None}


def test_a_failure_is_added_to_the_result_and_its_message():
    failure = {'check': 'driver_floor', 'expected': 'at least 580', 'actual': '550', 'why': 'cu13'}
    said = 'driver_floor: expected at least 580, got 550 (cu13)'
    assert _verdict.with_failure({'failures': [{'check': 'x'}], 'msg': 'first', 'torch_version': 't'}, failure) == {
        'failures': [{'check': 'x'}, failure], 'msg': 'first; ' + said, 'torch_version': 't'}
    assert _verdict.with_failure(None, failure) == {'failures': [failure], 'msg': said}
    assert _verdict.with_failure({'a': 1}, None) == {'a': 1}


def facts(**over):
    built = {'id': 'v1', 'link': '/root/venv', 'meta': {'profile': 'default'}, 'changed': False,
             'audit': {'healthy': True, 'findings': {}}}
    out = {'settings': {'audit_mode': 'fast', 'max_age': 3600, 'require_cuda': 'auto'}, 'built': built,
           'venv': '/root/venv', 'gpus': [0], 'node_driver': '580.95.05', 'driver': {'version': '580.95.05'}}
    out.update(over)
    return out


def recorded(age, fingerprint=None):
    f = facts()
    stamp = fingerprint or _verdict.state(f)['fingerprint']
    return facts(built=dict(f['built'], verified={'fingerprint': stamp, 'age_s': age, 'verified_at': 't',
                                                  'result': {'torch_version': 'x', 'failures': []}}))


@pytest.mark.parametrize('given, reuse', [
    (recorded(0), True), (recorded(3600), True), (recorded(3601), False), (recorded(-1), False),
    (recorded(10, fingerprint='other'), False),
    (dict(recorded(10), settings={'audit_mode': 'fast', 'max_age': 0}), False),
    (dict(recorded(10), container_changed=True), False),
    (dict(recorded(10), driver={'version': '580.95.05', 'changed': True}), False),
])
def test_a_passing_verification_stands_only_within_its_age_and_for_the_same_inputs(given, reuse):
    now = _verdict.state(given)
    assert now['reuse'] is reuse
    if reuse:
        assert now['result'] == {'torch_version': 'x', 'failures': [], 'reused': True, 'verified_at': 't',
                                 'age_s': given['built']['verified']['age_s']}


def test_a_record_is_not_reused_after_a_build_that_does_not_say_it_changed_nothing():
    given = recorded(10)
    del given['built']['changed']
    assert _verdict.state(given)['reuse'] is False


def test_the_fingerprint_is_of_every_input_in_any_order():
    base = _verdict.state(facts())['fingerprint']
    assert _verdict.state(facts(gpus=[0]))['fingerprint'] == base
    for changed in (facts(gpus=[0, 1]), facts(node_driver='590.1'), facts(driver={'version': '590.1'}),
                    facts(settings={'audit_mode': 'fast', 'max_age': 3600, 'smoke': 'matmul'}),
                    facts(settings={'audit_mode': 'fast', 'max_age': 3600, 'min_tflops': 5}),
                    facts(settings={'audit_mode': 'fast', 'max_age': 3600, 'user': 'train'}),
                    facts(settings={'audit_mode': 'fast', 'max_age': 3600, 'compile_check': True}),
                    facts(devices=['/dev/nvidia1'])):
        assert _verdict.state(changed)['fingerprint'] != base


@pytest.mark.parametrize('require, gpus, cuda', [('auto', [0], True), ('auto', [], False), ('false', [0], False),
                                                 ('yes', [], True), (True, [], True)])
def test_cuda_is_required_where_asked_or_where_the_container_has_gpus_and_the_profile_cuda(require, gpus, cuda):
    meta = {'profile': 'default', 'expect': {'torch_version': '2.11.0+cu128', 'cuda_version': '12.8'}}
    f = facts(gpus=gpus, settings={'require_cuda': require})
    f['built']['meta'] = meta
    now = _verdict.state(f)
    assert now['cuda'] is cuda
    assert now['expect'] == {'torch_version': '2.11.0+cu128', 'cuda_version': '12.8', 'cudnn_version': None,
                             'nccl_version': None, 'device_count': len(gpus) if cuda else None,
                             'driver_version': '580.95.05' if cuda else None}


def test_a_repaired_venv_is_audited_by_its_repair_and_a_full_audit_mode_audits_again():
    f = facts()
    f['built'].update(audit={'healthy': False}, repair_audit={'healthy': True, 'findings': {}})
    assert _verdict.state(f)['audit'] == {'healthy': True, 'findings': {}}
    assert _verdict.state(facts(settings={'audit_mode': 'full'}))['audited'] is False
    assert _verdict.state(facts(settings={}))['audited'] is True  # fast is the default


def test_each_node_with_its_gpus_and_who_holds_them():
    devices = {'pve1': {'driver_version': '580', 'held': {'0': [{'vmid': 7, 'name': 'b'}, {'vmid': 3, 'name': 'a'}]},
                        'gpus': [{'index': 0, 'pci_bus_id': 'b0', 'uuid': 'u0', 'name': 'H100', 'minor': 1},
                                 {'index': 1, 'pci_bus_id': 'b1', 'uuid': 'u1', 'name': 'H100'}]},
               'pve2': {}}
    assert _verdict.nodes(devices) == {'pve1': {'driver_version': '580', 'gpus': [
        {'index': 0, 'pci_bus_id': 'b0', 'uuid': 'u0', 'name': 'H100',
         'held_by': [{'vmid': 3, 'name': 'a'}, {'vmid': 7, 'name': 'b'}]},
        {'index': 1, 'pci_bus_id': 'b1', 'uuid': 'u1', 'name': 'H100', 'held_by': []}]}}
    assert _verdict.nodes({'pve1': {'gpus': [{'index': 2}], 'held': {2: [{'vmid': 1}]}}})['pve1']['gpus'][0][
        'held_by'] == [{'vmid': 1}]


def test_a_driver_upgrade_is_judged_node_by_node():
    reports = {'pve1': {'from': '550', 'to': '580', 'needed': True, 'state': 'upgraded', 'down_seconds': 90,
                        'containers': [{'vmid': 1}], 'steps': ['install']},
               'pve2': {'from': '550', 'to': '580', 'needed': True},
               'pve3': {'from': None},
               'pve4': {'from': '580', 'to': '580', 'needed': False}}
    done = _verdict.upgrade(reports, check=False)
    assert done['rows'][0] == {'node': 'pve1', 'state': 'upgraded', 'from': '550', 'to': '580', 'containers': [1],
                               'steps': ['install'], 'down_seconds': 90, 'msg': None}
    assert [r['state'] for r in done['rows']] == ['upgraded', 'not reached', 'no driver', 'unchanged']
    assert done['said'] == 'upgraded: pve1; not reached: pve2; unchanged: pve4; no driver: pve3'
    assert done['version'] == '580' and done['by']['not reached'] == ['pve2']
    assert [r['state'] for r in _verdict.upgrade(reports, check=True)['rows']][1] == 'planned'


def test_the_fleets_verdict_names_each_container_that_is_not_verified_and_why():
    containers = [{'hostname': 'train-0', 'vmid': 200, 'node': 'pve1'},
                  {'hostname': 'train-1', 'vmid': 201, 'node': 'pve1', 'gpus': [1]},
                  {'hostname': 'train-2', 'vmid': 202, 'node': 'pve1'},
                  {'hostname': 'idle', 'vmid': 203, 'node': 'pve1', 'state': 'stopped'}]
    reconcile = {'containers': [{'vmid': 200, 'node': 'pve1', 'status': 'running'},
                                {'vmid': 201, 'node': 'pve1', 'status': 'stopped'},
                                {'vmid': 203, 'node': 'pve1', 'status': 'stopped'}]}
    verdict = _verdict.fleet([GOOD, dict(GOOD, host='other', run='r0')], containers, reconcile, run={'id': 'r1'},
                             gpus={200: [0]})
    assert verdict['ok'] is False and (verdict['verified'], verdict['expected']) == (1, 3)
    assert verdict['verdict'] == ('verified 1 of 3 container(s): train-1 (CT 201 on pve1): stopped; '
                                  'train-2 (CT 202 on pve1): unread')
    assert verdict['fleet'] == ['train-0', 'train-1', 'train-2', 'idle'] and verdict['mode'] == 'verify'
    assert verdict['containers'][0] == dict(ROW, expected=True, gpus=[0])
    assert verdict['containers'][1] == {
        'host': 'train-1', 'node': 'pve1', 'vmid': 201, 'profile': None, 'state': 'stopped', 'ok': False,
        'expected': True, 'why': 'CT 201 on pve1 is stopped, not running', 'gpus': [1],
        'failures': ['CT 201 on pve1 is stopped, not running']}
    assert verdict['containers'][3]['expected'] is False and verdict['containers'][3]['ok'] is None
    alone = _verdict.fleet([GOOD], containers[:1], reconcile, run={'id': 'r1'}, check_mode=True)
    assert alone['ok'] is True and alone['mode'] == 'check' and alone['verdict'] == 'verified 1 of 1 container(s)'
    assert _verdict.fleet([], [], {})['ok'] is False  # nothing verified is no clean verdict


def test_each_way_a_container_goes_unverified_is_its_own_state_and_words():
    containers = [{'hostname': 'gone', 'vmid': 300, 'node': 'pve1', 'state': 'absent'},
                  {'hostname': 'far', 'vmid': 301, 'node': 'pve2'},
                  {'hostname': 'broke', 'vmid': 302, 'node': 'pve1'},
                  {'hostname': 'left', 'vmid': 303, 'node': 'pve1'},
                  {'hostname': 'new', 'vmid': 304, 'node': 'pve1'},
                  {'hostname': 'waking', 'vmid': 305, 'node': 'pve1'}]
    reconcile = {'containers': [{'vmid': 300, 'node': 'pve1', 'status': 'absent', 'changed': True},
                                {'vmid': 302, 'node': 'pve1', 'status': 'running'},
                                {'vmid': 303, 'node': 'pve1', 'status': 'running'},
                                {'vmid': 304, 'node': 'pve1', 'status': 'running', 'created': True},
                                {'vmid': 305, 'node': 'pve1', 'status': 'running', 'power': 'start'}]}
    why = {
        'gone': 'CT 300 on pve1 is removed by a run (state absent)',
        'far': 'CT 301 on pve2 was not reached: the run could not reach its node (unreachable, or a task failed there)',
        'broke': 'CT 302 on pve1: venv_build: {bad} lock',
        'left': "CT 303 runs on pve1 but was not verified: this run's --limit (pve1) leaves its container out "
                '(gpufleet --node pve1, or add gpufleet_running_pve1 to --limit)',
        'new': 'CT 304 does not exist on pve1',  # a check run: as found, before the run would create it
        'waking': 'CT 305 on pve1 is stopped, not running'}  # ... and before it would start it
    checked = _verdict.fleet([], containers, reconcile, check_mode=True, unreachable=('pve2',),
                             failed={'broke': 'venv_build: {bad} lock'}, limit='pve1')
    assert [(r['host'], r['state'], r['why'], r['expected'], r['ok']) for r in checked['containers']] == [
        ('gone', 'removed', why['gone'], False, None), ('far', 'unreached', why['far'], True, False),
        ('broke', 'failed', why['broke'], True, False), ('left', 'unreached', why['left'], True, False),
        ('new', 'missing', why['new'], True, False), ('waking', 'stopped', why['waking'], True, False)]
    assert all(r['failures'] == ([r['why']] if r['expected'] else []) for r in checked['containers'])
    assert checked['verdict'] == ('verified 0 of 5 container(s): far (CT 301 on pve2): unreached; broke (CT 302 on '
                                  'pve1): failed; left (CT 303 on pve1): unreached; new (CT 304 on pve1): missing; '
                                  'waking (CT 305 on pve1): stopped')
    ran = _verdict.fleet([], containers, reconcile, group='ct')  # the run made and started them
    assert [r['state'] for r in ran['containers']] == ['removed', 'unread', 'unreached', 'unreached', 'unreached',
                                                       'unreached']
    assert ran['containers'][0]['why'] == 'CT 300 on pve1 was destroyed (state absent)'


def test_a_rolled_back_container_is_named_with_both_verdicts_in_the_fleets():
    back = dict(GOOD, rolled_back={'snapshot': 'gpufleet-1', 'done': True, 'error': None, 'failed': 'verification',
                                   'change_failed': ['torch_version: expected 2, got 1']})
    verdict = _verdict.fleet([back], [{'hostname': 'train-0', 'vmid': 200, 'node': 'pve1'}], {}, run={'id': 'r1'})
    said = ('its change failed verification (torch_version: expected 2, got 1); rolled back to gpufleet-1 and started; '
            'verified again: ok')
    assert verdict['containers'][0]['state'] == 'rolled_back' and verdict['containers'][0]['failures'] == [said]
    assert verdict['verdict'] == 'verified 0 of 1 container(s): train-0 (CT 200 on pve1): ' + said
    failed = dict(back, rolled_back=dict(back['rolled_back'], done=False, error='snapshot gone'))
    assert _verdict.row(failed)['failures'] == [
        'its change failed verification (torch_version: expected 2, got 1); the rollback to gpufleet-1 failed: '
        'snapshot gone']


def test_what_a_report_keeps_of_its_rollback():
    assert _verdict.rolled_back({'snapshot': 's', 'done': True, 'change': 'uv failed'}) == {
        'snapshot': 's', 'done': True, 'error': None, 'failed': 'change', 'change_failed': ['uv failed']}
    assert _verdict.rolled_back({'snapshot': 's', 'done': False, 'msg': 'locked', 'first': bad_report()}) == {
        'snapshot': 's', 'done': False, 'error': 'locked', 'failed': 'verification',
        'change_failed': ['device_count: expected 2, got 1']}
    assert _verdict.rolled_back({'snapshot': 's'})['change_failed'] == ['its verification after the change failed']


def test_below_the_venvs_driver_floor_is_a_failure_with_its_fix():
    meta = {'profile': 'cu13', 'floor': {'driver': '580.65.06', 'cuda': '13', 'wheels': ['nvidia-cudnn-cu13'],
                                         'why': 'nvidia-cudnn-cu13 is built for CUDA 13.0'}}
    failure = _verdict.below_floor(meta, '550.163.01')
    assert failure['check'] == 'driver_floor' and failure['actual'] == '550.163.01'
    assert failure['why'] == ('the venv profile cu13 needs an NVIDIA driver of at least 580.65.06: its lock\'s '
                              'nvidia-cudnn-cu13 is built for CUDA 13.0, and CUDA 13.x runs on 580.65.06 or newer')
    assert failure['expected'] == 'an NVIDIA driver of at least 580.65.06'
    assert failure['fix'] == ("upgrade the node's driver to 580.65.06 or newer (gpufleet driver-upgrade), or rebuild "
                              'this venv from a profile whose wheels the driver runs')
    assert _verdict.below_floor(meta, '580.65.06') is None and _verdict.below_floor(meta, None) is None
    assert _verdict.below_floor({}, '550.163.01') is None
