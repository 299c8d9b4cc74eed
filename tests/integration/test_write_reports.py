"""gpufleet.proxmox.write_reports through Ansible on the controller: private directory and files, check mode,
a bad file name refused before anything is written."""

import json
import os
import stat

from conftest import run_playbook


def write(tmp_path, reports, *args):
    task = {'gpufleet.proxmox.write_reports': {'dir': str(tmp_path / 'out'), 'reports': reports}, 'register': 'r'}
    return run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [task]}], tmp_path,
                        *args, inventory='localhost,')


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_reports_are_written_privately_even_in_check_mode(tmp_path):
    (tmp_path / 'out').mkdir(mode=0o755)
    (tmp_path / 'out' / 'a.json').write_text('old')
    r = write(tmp_path, {'a': {'ok': True, 'n': [1, 2]}, 'summary': {'hosts': ['a']}}, '--check')
    assert r.rc == 0, r.stdout[-2000:]
    result = r.task(0)
    assert result['changed'] is False
    assert result['written'] == [str(tmp_path / 'out' / 'a.json'), str(tmp_path / 'out' / 'summary.json')]
    assert mode(tmp_path / 'out') == 0o700
    assert [mode(p) for p in result['written']] == [0o600, 0o600]
    assert json.loads((tmp_path / 'out' / 'a.json').read_text()) == {'ok': True, 'n': [1, 2]}
    assert sorted(os.listdir(tmp_path / 'out')) == ['a.json', 'summary.json']  # no temporary file left


def test_a_name_that_is_not_a_file_name_is_refused_before_writing(tmp_path):
    r = write(tmp_path, {'good': {}, '../escape': {}, '.hidden': {}})
    assert r.rc != 0
    msg = r.task(0)['msg']
    assert msg.startswith('reports: not a file name:') and "'../escape'" in msg and "'.hidden'" in msg
    assert not (tmp_path / 'out').exists() and not (tmp_path / 'escape.json').exists()


def test_prune_removes_the_reports_of_earlier_runs_only(tmp_path):
    out = tmp_path / 'out'
    (out / 'drift').mkdir(parents=True)
    for name in ('gone.json', 'a.json', 'notes.txt', 'drift/summary.json'):
        (out / name).write_text('{}')
    task = {'gpufleet.proxmox.write_reports': {'dir': str(out), 'reports': {'a': {'ok': True}, 'summary': {}},
                                               'prune': True}, 'register': 'r'}
    r = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [task]}], tmp_path, inventory='localhost,')
    assert r.rc == 0, r.stdout[-2000:]
    assert not r.task(0).get('failed') and r.task(0)['removed'] == [str(out / 'gone.json')]
    assert sorted(os.listdir(out)) == ['a.json', 'drift', 'notes.txt', 'summary.json']
    assert json.loads((out / 'a.json').read_text()) == {'ok': True}
    assert (out / 'drift' / 'summary.json').exists()
