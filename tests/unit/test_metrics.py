"""`--metrics FILE`: the exposition text read back with prometheus_client's own parser, the file replaced whole and
kept coherent across commands, and the alert rules of docs/prometheus checked and unit-tested with promtool."""

import glob
import os
import re
import shutil
import stat
import subprocess

import pytest
import yaml

from gpufleet.cli import metrics
from gpufleet.lab.testing import ROOT, metric_values

RULES = os.path.join(ROOT, 'docs', 'prometheus')


def row(host, vmid, state, **kw):
    base = {'host': host, 'node': 'gpu01', 'vmid': vmid, 'state': state, 'expected': True, 'gpus': [0, 1],
            'drift': []}
    base.update(kw)
    return base


RESULT = {
    'exit_code': 2,
    'containers': [
        row('train-0', 101, 'verified', torch_version='2.11.0+cu128', cuda_version='12.8', driver_version='580.95.05',
            devices_seen=2, venv_findings=0, drift=[{'stage': 'container', 'item': 'cores'}],
            checks={'cudnn_conv': 'ok', 'cusparselt_24': 'not_applicable', 'allreduce': 'ok', 'shm': 'ok'},
            allreduce_gbps=141.2, tokens_per_s=20112.5, throughput_ratio=0.64),
        row('train-1', 102, 'failed', torch_version='2.11.0+cu128', cuda_version='12.8', driver_version='580.95.05',
            devices_seen=1, venv_findings=3, checks={'cudnn_conv': 'failed', 'allreduce': 'failed'},
            allreduce_gbps=None),
        row('train-2', 103, 'missing', drift=[{'stage': 'container', 'item': 'missing'}]),
        row('train-3', 104, 'stopped'),
        row('util-0', 105, 'unreached', gpus=[]),
        row('parked', 106, 'stopped', expected=False, gpus=[]),
        row('unread', 107, 'unread'),
    ],
    'node_info': {'gpu01': {'driver_version': '580.95.05', 'gpus': [{'index': i} for i in range(8)]},
                  'util01': {'driver_version': None, 'gpus': []}},
    'nodes': {'gpu01': [{'stage': 'node', 'item': 'module_build_failed', 'fix': 'read ...'},
                        {'stage': 'node', 'item': 'driver_not_held', 'fix': 'apt-mark hold libcuda1'}]},
}


def ct(host, vmid):
    return (('hostname', host), ('node', 'gpu01'), ('vmid', str(vmid)))


def written(tmp_path, result, command, name='gpufleet.prom', started=100.0, ended=112.5):
    path = str(tmp_path / name)
    metrics.write(path, result, command, started, ended)
    return metric_values(path)


def test_each_container_state_is_what_its_metrics_say(tmp_path):
    got = written(tmp_path, RESULT, 'drift')
    state = dict(((name[len('gpufleet_'):], dict(labels)['hostname']), value) for (name, labels), value in got.items()
                 if 'hostname' in dict(labels) and name not in ('gpufleet_container_info', 'gpufleet_gpu_held',
                                                                'gpufleet_check_ok'))

    def of(host):
        return dict((name, value) for (name, h), value in state.items() if h == host)

    assert of('train-0') == {'container_present': 1, 'container_running': 1, 'verify_ok': 1, 'drift_items': 1,
                             'gpus_expected': 2, 'gpus_seen': 2, 'venv_healthy': 1, 'allreduce_gbps': 141.2,
                             'train_tokens_per_second': 20112.5, 'train_throughput_ratio': 0.64}
    # each check that applies to the container, passed (1) or failed (0); one that does not apply has no sample
    checks = dict(((dict(labels)['hostname'], dict(labels)['check']), value) for (name, labels), value in got.items()
                  if name == 'gpufleet_check_ok')
    assert checks == {('train-0', 'cudnn_conv'): 1, ('train-0', 'allreduce'): 1, ('train-0', 'shm'): 1,
                      ('train-1', 'cudnn_conv'): 0, ('train-1', 'allreduce'): 0}
    assert of('train-1') == {'container_present': 1, 'container_running': 1, 'verify_ok': 0, 'drift_items': 0,
                             'gpus_expected': 2, 'gpus_seen': 1, 'venv_healthy': 0}
    assert of('train-2') == {'container_present': 0, 'container_running': 0, 'verify_ok': 0, 'drift_items': 1,
                             'gpus_expected': 2}
    assert of('train-3') == {'container_present': 1, 'container_running': 0, 'verify_ok': 0, 'drift_items': 0,
                             'gpus_expected': 2}
    assert of('util-0') == {'container_present': 1, 'container_running': 1, 'verify_ok': 0, 'drift_items': 0,
                            'gpus_expected': 0}
    # declared stopped: not expected to verify, so no verify_ok to alert on
    assert of('parked') == {'container_present': 1, 'container_running': 0, 'drift_items': 0, 'gpus_expected': 0}
    # the API was not read: neither present nor running is known
    assert of('unread') == {'verify_ok': 0, 'drift_items': 0, 'gpus_expected': 2}
    info = tuple(sorted(ct('train-0', 101) + (('cuda_version', '12.8'), ('driver_version', '580.95.05'),
                                              ('torch_version', '2.11.0+cu128'))))
    assert got[('gpufleet_container_info', info)] == 1
    assert got[('gpufleet_node_driver_info', (('driver_version', '580.95.05'), ('node', 'gpu01')))] == 1
    assert (got[('gpufleet_node_gpus', (('node', 'gpu01'),))], got[('gpufleet_node_gpus', (('node', 'util01'),))]) == \
        (8, 0)
    assert not [k for k in got if k[0] == 'gpufleet_node_driver_info' and ('node', 'util01') in k[1]]
    # each GPU's holders, the fleet's (by the rows' gpus) and any other of the node (discovery's held_by)
    holders = dict((tuple(v for k, v in labels), value) for (name, labels), value in got.items()
                   if name == 'gpufleet_gpu_holders')
    # GPU 0: train-0, -1, -3 and unread (train-2 is missing: it holds nothing yet); GPU 7: nobody
    assert holders[('0', 'gpu01')] == 4 and holders[('7', 'gpu01')] == 0
    assert got[('gpufleet_gpu_held', (('hostname', 'train-0'), ('in_fleet', 'yes'), ('index', '0'), ('node', 'gpu01'),
                                      ('vmid', '101')))] == 1
    run = (('command', 'drift'),)
    assert (got[('gpufleet_last_run_timestamp_seconds', run)], got[('gpufleet_last_run_exit_code', run)],
            got[('gpufleet_run_duration_seconds', run)]) == (112.5, 2, 12.5)


def test_one_file_across_commands_each_run_replacing_what_it_saw(tmp_path):
    written(tmp_path, RESULT, 'drift')
    verify = {'exit_code': 1, 'containers': [row('train-0', 101, 'failed', venv_findings=1),
                                             row('train-1', 102, 'verified', venv_findings=0)]}
    got = written(tmp_path, verify, 'verify', started=200.0, ended=203.0)
    # this run's containers only (train-2.. are gone from the definition's verify), with the drift the check found
    assert sorted(dict(k[1])['hostname'] for k in got if k[0] == 'gpufleet_verify_ok') == ['train-0', 'train-1']
    assert (got[('gpufleet_verify_ok', ct('train-0', 101))], got[('gpufleet_drift_items', ct('train-0', 101))]) == (0, 1)
    assert got[('gpufleet_last_run_exit_code', (('command', 'drift'),))] == 2  # the drift run's series are kept
    assert got[('gpufleet_last_run_exit_code', (('command', 'verify'),))] == 1
    # the nodes' findings are the last drift check's, kept by other commands
    found = sorted(dict(k[1])['item'] for k in got if k[0] == 'gpufleet_node_finding')
    assert found == ['driver_not_held', 'module_build_failed']
    # a repair that verified the fleet leaves no drift, whatever it found
    fixed = dict(RESULT, exit_code=2)
    got = written(tmp_path, fixed, 'drift-fix', started=300.0, ended=310.0)
    assert got[('gpufleet_drift_items', ct('train-0', 101))] == 0
    assert sorted(dict(k[1])['command'] for k in got if k[0] == 'gpufleet_last_run_exit_code') == \
        ['drift', 'drift-fix', 'verify']
    assert len([k for k in got if k[0] == 'gpufleet_node_finding']) == 2
    got = written(tmp_path, dict(RESULT, nodes={}), 'drift', started=400.0, ended=405.0)
    assert not [k for k in got if k[0] == 'gpufleet_node_finding']  # the next check found none


def test_the_file_is_replaced_whole_and_readable_by_the_collector(tmp_path):
    os.umask(0o077)  # as the CLI runs
    try:
        path = str(tmp_path / 'gpufleet.prom')
        with open(path, 'w') as fh:
            fh.write('# a file of the collector\nother_metric 1\n')
        metrics.write(path, RESULT, 'up', 1.0, 2.0)
    finally:
        os.umask(0o022)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert os.listdir(str(tmp_path)) == ['gpufleet.prom']  # no temporary file left beside it
    with open(path) as fh:
        text = fh.read()
    assert 'other_metric' not in text and text.endswith('\n')
    # every family has its HELP and TYPE gauge once
    assert sorted(re.findall(r'^# TYPE (\S+) gauge$', text, re.M)) == sorted(set(re.findall(r'^(gpufleet_\w+)\{', text,
                                                                                          re.M)))


def test_label_values_are_escaped_and_read_back(tmp_path):
    odd = row('a"b\\c', 101, 'verified', torch_version='2.11.0+cu128', cuda_version='a\nb', driver_version='1',
              venv_findings=0, drift=[{'stage': 'container', 'item': 'cores'}])
    written(tmp_path, {'exit_code': 2, 'containers': [odd]}, 'drift')
    got = written(tmp_path, {'exit_code': 0, 'containers': [odd]}, 'verify')  # the drift, read back from the file
    (labels,) = [dict(k[1]) for k in got if k[0] == 'gpufleet_container_info']
    assert (labels['hostname'], labels['cuda_version']) == ('a"b\\c', 'a\nb')
    assert got[('gpufleet_drift_items', (('hostname', 'a"b\\c'), ('node', 'gpu01'), ('vmid', '101')))] == 1


def test_every_metric_the_rules_use_is_one_the_cli_writes():
    with open(os.path.join(RULES, 'gpufleet.rules.yml')) as fh:
        rules = yaml.safe_load(fh)
    names = set(re.findall(r'\bgpufleet_\w+', ' '.join(r['expr'] for g in rules['groups'] for r in g['rules'])))
    assert names and names <= set('gpufleet_' + name for name, _text, _labels in metrics.METRICS)


@pytest.fixture(scope='module')
def promtool(tmp_path_factory):
    """promtool from PATH, else from Debian's package of it (promtool from Debian 13, prometheus before), unpacked (not
    installed) into the user's cache (not the lab's, which the tests only read)."""
    if shutil.which('promtool'):
        return shutil.which('promtool')
    cache = os.path.join(os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'), 'gpufleet', 'promtool')
    tool = os.path.join(cache, 'usr', 'bin', 'promtool')
    for package in ('promtool', 'prometheus') if shutil.which('apt-get') else ():
        if os.path.exists(tool):
            break
        work = str(tmp_path_factory.mktemp('deb'))
        got = subprocess.run(['apt-get', 'download', package], cwd=work, capture_output=True, text=True, timeout=300)
        debs = glob.glob(os.path.join(work, package + '_*.deb'))
        if got.returncode == 0 and debs:
            os.makedirs(cache, exist_ok=True)
            subprocess.run(['dpkg-deb', '-x', debs[0], cache], check=True)
    if not os.path.exists(tool):
        pytest.skip("promtool is not on PATH and Debian's promtool or prometheus package could not be downloaded")
    return tool


def test_the_alert_rules_are_valid_and_fire_as_their_tests_say(promtool):
    for argv in (['check', 'rules', 'gpufleet.rules.yml'], ['test', 'rules', 'gpufleet.rules.test.yml']):
        done = subprocess.run([promtool] + argv, cwd=RULES, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert 'SUCCESS' in done.stdout
