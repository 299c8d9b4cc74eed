"""Whether a venv can start, without the lab: the audit's interpreter findings on venvs made here (a real one of this
machine's Python, and laid-out ones whose base Python is gone, of another version, or without its standard library),
the startup files no RECORD names, the activate script, the rebuild of a venv that cannot start (Store.rebuild with a
build that succeeds and one that fails), and the container's own Python as the probe reports it."""

import os
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _venv, _venv_build, _venv_python
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _container_python, _doctor, _drift, _profile
from fixtures import make_venv


def laid_out(tmp_path, version='3.11', base_version=None):
    """A venv made for Python `version` whose bin/python leads to a base Python named python<base_version> under a
    prefix with that version's standard library landmarks (nothing here runs: audit with start=False)."""
    base_version = base_version or version
    prefix = tmp_path / 'usr'
    (prefix / 'bin').mkdir(parents=True)
    real = prefix / 'bin' / ('python' + base_version)
    real.write_text('#!/bin/sh\n')
    real.chmod(0o755)
    stdlib = prefix / 'lib' / ('python' + base_version)
    (stdlib / 'encodings').mkdir(parents=True)
    (stdlib / 'lib-dynload').mkdir()
    (stdlib / 'os.py').write_text('')
    (stdlib / 'encodings' / '__init__.py').write_text('')
    venv = tmp_path / 'venv'
    site = venv / 'lib' / ('python' + version) / 'site-packages'
    site.mkdir(parents=True)
    (venv / 'bin').mkdir()
    os.symlink(str(real), str(venv / 'bin' / 'python'))
    (venv / 'pyvenv.cfg').write_text('home = {0}\nversion_info = {1}.2\n'.format(prefix / 'bin', version))
    (venv / 'bin' / 'activate').write_text("VIRTUAL_ENV='{0}'\nexport VIRTUAL_ENV\n".format(venv))
    return venv, str(site), real, stdlib


def checks(found):
    return [f['check'] for f in found]


def test_a_real_venv_of_this_python_starts_as_itself(tmp_path):
    venv, site = make_venv(tmp_path / 'real')
    python, found = _venv_python.interpreter(venv, site)
    assert found == [] and python['starts'] is True
    assert python['version'] == '{0}.{1}'.format(*sys.version_info[:2]) == python['venv_version']


def test_a_venv_whose_files_hold_together_is_found_startable_before_it_runs(tmp_path):
    venv, site, _real, _stdlib = laid_out(tmp_path)
    python, found = _venv_python.interpreter(str(venv), site, start=False)
    assert found == [] and python['version'] == '3.11' and python['home'] == str(tmp_path / 'usr' / 'bin')


def test_each_way_a_venv_cannot_start_is_named_with_its_fix(tmp_path):
    # a version no Python of this machine has: getpath's search for the landmark goes up to / as CPython's does
    venv, site, real, stdlib = laid_out(tmp_path, version='3.97')
    (stdlib / 'encodings' / '__init__.py').unlink()
    assert checks(_venv_python.interpreter(str(venv), site, start=False)[1]) == ['no_stdlib']
    (stdlib / 'os.py').unlink()
    found = _venv_python.interpreter(str(venv), site, start=False)[1]
    assert checks(found) == ['no_stdlib'] and 'lib/python3.97/os.py' in found[0]['msg']
    assert 'libpython3.97-minimal' in found[0]['fix']
    real.unlink()  # the base Python gone: a link that leads nowhere
    found = _venv_python.interpreter(str(venv), site, start=False)[1]
    assert checks(found) == ['base_python_missing'] and 'python3.97-minimal' in found[0]['fix']
    (venv / 'pyvenv.cfg').unlink()
    assert checks(_venv_python.interpreter(str(venv), site, start=False)[1]) == ['base_python_missing', 'no_pyvenv_cfg']
    (venv / 'bin' / 'python').unlink()
    found = _venv_python.interpreter(str(venv), site, start=False)[1]
    assert checks(found) == ['no_interpreter'] and 'rebuilds the venv from its lock' in found[0]['fix']


def test_a_base_python_of_another_version_is_a_changed_python(tmp_path):
    venv, site, _real, _stdlib = laid_out(tmp_path, version='3.11', base_version='3.13')
    python, found = _venv_python.interpreter(str(venv), site, start=False)
    assert checks(found) == ['python_changed'] and python['version'] == '3.13'
    assert found[0]['msg'].startswith('the venv was made for Python 3.11 (lib/python3.11) but ')
    assert found[0]['fix'] == "a repair run builds the venv for Python 3.13 where the profile's lock covers it"


def test_startup_files_no_record_names_and_the_activate_script(tmp_path):
    venv, site, _real, _stdlib = laid_out(tmp_path)
    owned = os.path.join(site, 'distutils-precedence.pth')
    for name, text in (('distutils-precedence.pth', 'import os; x = 1\n'), ('paths.pth', '/srv/code\n'),
                       ('hand.pth', 'import sys\n'), ('sitecustomize.py', 'x = 1\n')):
        with open(os.path.join(site, name), 'w') as fh:
            fh.write(text)
    found = _venv_python.startup_files(site, {owned: []})
    assert found == [{'path': 'hand.pth', 'kind': 'pth', 'lines': ['import sys']},
                     {'path': 'sitecustomize.py', 'kind': 'module', 'lines': []}]
    assert _venv_python.activate_findings(str(venv)) == []
    # CPython 3.13's script (export, unquoted) and uv's line for Windows shells (computed, not a path)
    (venv / 'bin' / 'activate').write_text('    export VIRTUAL_ENV={0}\nVIRTUAL_ENV=$(cygpath -u "$VIRTUAL_ENV")\n'.format(
        venv))
    assert _venv_python.activate_findings(str(venv)) == []
    (venv / 'bin' / 'activate').write_text("VIRTUAL_ENV='/opt/other'\n")
    assert checks(_venv_python.activate_findings(str(venv))) == ['activate_elsewhere']
    (venv / 'bin' / 'activate').unlink()
    assert checks(_venv_python.activate_findings(str(venv))) == ['no_activate']


class Req(object):
    """What Store.rebuild reads of a request."""
    uv, python, overrides, install_args, imports, timeout, meta = 'uv', '/usr/bin/python3', (), (), (), 60, {}


def test_a_rebuild_keeps_the_broken_venv_and_puts_it_back_when_the_build_fails(tmp_path, monkeypatch):
    store = _venv_build.Store(str(tmp_path / 'venvs'), str(tmp_path / 'venv'))
    vid = 'a' * 16
    os.makedirs(os.path.join(store.path(vid), 'bin'))
    open(os.path.join(store.path(vid), 'broken-marker'), 'w').close()
    store.switch(vid)
    seen = []

    def failing(self, vid, req, lock_text, env):
        seen.append(os.path.realpath(self.link))  # jobs see the broken venv while it builds, never a half-built one
        raise _venv_build.BuildError('installing the lock failed')
    monkeypatch.setattr(_venv_build.Store, 'build', failing)
    with pytest.raises(_venv_build.RepairError) as e:
        store.rebuild(vid, Req(), lock_text='x', env={})
    assert 'building it again failed: installing the lock failed; it is as it was' in str(e.value)
    assert seen == [store.path(vid) + '.broken'] and os.path.realpath(store.link) == store.path(vid)
    assert os.path.exists(os.path.join(store.path(vid), 'broken-marker'))  # put back as it was

    def building(self, vid, req, lock_text, env):
        os.makedirs(self.path(vid))
        return {'install_s': 1.0}, {'healthy': True}
    monkeypatch.setattr(_venv_build.Store, 'build', building)
    kept, timings, report = store.rebuild(vid, Req(), lock_text='x', env={})
    assert kept == store.path(vid) + '.broken' and os.path.exists(os.path.join(kept, 'broken-marker'))
    assert os.path.realpath(store.link) == store.path(vid) and report == {'healthy': True}
    assert store.plan_prune([vid]) == []  # the kept one is not a venv of the store: never pruned as one


def test_a_python_no_lock_covers_names_the_profile_and_how_to_lock_it():
    found = _venv_build.not_locked({'profile': 'cpu', 'profile_dir': '/srv/profiles/cpu'}, ['3.11'], '/usr/bin/python3',
                                   '3.13.5')
    assert found['msg'] == "the profile cpu is locked for Python 3.11, but this container's /usr/bin/python3 is Python 3.13.5"
    assert found['fix'] == ('lock the profile for 3.13 too: add "3.13" to python in /srv/profiles/cpu/profile.yml, then: '
                            'gpufleet profile lock /srv/profiles/cpu')


def test_the_python_each_template_brings():
    assert _profile.template_python('local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst') == '3.11'
    assert _profile.template_python('local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst') == '3.13'
    assert _profile.template_python('nfs:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst') == '3.12'
    assert _profile.template_python('local:vztmpl/my-own.tar.zst') is None
    assert _profile.pythons({'python': '3.11'}) == ['3.11'] and _profile.pythons({'python': ['3.12', 3.13]}) == [
        '3.12', '3.13']


PROBE_GONE = """link=python3.11
pkg=python3 ii
pkg=python3-minimal ii
pkg=python3.11 ii
pkg=python3.11-minimal ii
pkg=libpython3.11-minimal:amd64 ii
pkg=python3.11-venv un
os=debian 12
"""


def test_the_containers_python_as_the_probe_reports_it():
    found = _container_python.finding(_container_python.parse(PROBE_GONE, '/usr/bin/python3'))
    assert found['msg'] == "the container's Python /usr/bin/python3 is missing (a link to python3.11, which is gone)"
    assert found['repair'] == 'apt-get install --reinstall -y python3 python3-minimal python3.11 python3.11-minimal'
    broken = _container_python.parse('exists=1\nrc=1\nout=ModuleNotFoundError: No module named \'encodings\'\n'
                                     'os=alpine 3.20\n', '/usr/bin/python3')
    found = _container_python.finding(broken)
    assert found['msg'].endswith("does not start: ModuleNotFoundError: No module named 'encodings'")
    assert found['repair'] is None and 'its package manager' in found['fix']
    good = _container_python.parse('link=python3.13\nexists=1\nrc=0\nout=3.13\nos=debian 13\n', '/usr/bin/python3')
    assert _container_python.finding(good) is None and good['version'] == '3.13'
    assert _container_python.unreadable({'failed': True, '_ansible_parsed': False})
    assert not _container_python.unreadable({'failed': True, 'msg': 'a module failed as modules do'})


def test_the_doctor_asks_each_running_containers_python():
    answered = '== 201\nlink=python3.11\nexists=1\nrc=0\nout=3.11\n== 202\n' + PROBE_GONE
    rows = _doctor.python_rows('pve1', answered, [{'vmid': 201, 'hostname': 'train-a'}])
    assert [(r['where'], r['ok'], r['detail']) for r in rows] == [
        ('train-a (CT 201 on pve1)', True, 'Python 3.11 starts'),
        ('CT 202 (CT 202 on pve1)', False, "the container's Python /usr/bin/python3 is missing (a link to python3.11, "
                                           "which is gone)")]
    assert rows[1]['fix'].startswith('reinstall it in the container: apt-get install --reinstall -y python3 ')
    assert _doctor.python_rows('pve1', None, []) == []
    held = _doctor.python_rows('pve1', answered.split('== 202')[0], [], {201: {'name': 'mine', 'dir': '/srv/mine',
                                                                               'pythons': ['3.12', '3.13']}})
    assert [(r['ok'], r['detail'], r['fix']) for r in held] == [
        (False, 'Python 3.11 starts, but the profile mine is locked for Python 3.12, 3.13',
         'add "3.11" to python in /srv/mine/profile.yml, then: gpufleet profile lock /srv/mine')]
    assert _doctor.changes_row({'containers': []})['detail'] == 'a run would change nothing'


def test_drift_says_what_cannot_start_what_was_rebuilt_and_the_containers_python():
    audit = {'findings': {'interpreter': [{'check': 'no_interpreter', 'msg': 'bin/python is missing', 'fix': 'rebuild'}],
                          'startup_files': [{'path': 'hand.pth', 'kind': 'pth', 'lines': ['import sys']}]}}
    items = _drift.container(build={'audit': audit, 'kept_broken': '/opt/gpufleet/venvs/x.broken',
                                    'python_not_locked': {'msg': 'not locked', 'fix': 'lock it'},
                                    'container_python': {'msg': 'python gone', 'fix': 'apt'}})
    assert [(i['stage'], i['item']) for i in items] == [
        ('venv', 'python_not_locked'), ('container', 'python'), ('venv', 'rebuilt'), ('venv', 'no_interpreter'),
        ('venv', 'startup_file')]
    assert items[2]['kept'] == '/opt/gpufleet/venvs/x.broken'
    changed = _drift.container(build={'built': True, 'id': 'f' * 16, 'python_changed': {'from': '3.11', 'to': '3.13'}})
    assert changed[0]['detail'] == ("the container's Python is now 3.13, and the active venv was made for 3.11: build "
                                    + 'f' * 16 + ' for 3.13 from its lock')


def test_a_template_whose_python_the_profile_is_not_locked_for_is_refused_before_anything_changes():
    from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _fleet
    nodes = {'pve1': {'indexes': []}}
    entries = [{'vmid': 200, 'hostname': 'a', 'node': 'pve1', 'gpus': []},
               {'vmid': 201, 'hostname': 'b', 'node': 'pve1', 'gpus': [], 'venv_profile': '/srv/p311',
                'template': 'local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst'},
               {'vmid': 202, 'hostname': 'c', 'node': 'pve1', 'gpus': [], 'venv_profile': '/srv/p311'},
               {'vmid': 203, 'hostname': 'd', 'node': 'pve1', 'gpus': [], 'venv_profile': '/srv/p311', 'state': 'absent',
                'template': 'local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst'}]
    profiles = {'': {'name': 'default', 'dir': '/p/default', 'pythons': ['3.11', '3.12', '3.13']},
                '/srv/p311': {'name': '/srv/p311', 'dir': '/srv/p311', 'pythons': ['3.11']}}
    fleet = _fleet.Fleet(entries, nodes, defaults={'ostemplate': 'local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst'},
                         profiles=profiles, remove_confirm=[203])
    with pytest.raises(_fleet.FleetError) as e:
        fleet.check()
    assert e.value.problems == [
        'containers[1] (vmid 201).venv_profile: the profile /srv/p311 is locked for Python 3.11, but the template '
        'debian-13-standard_13.1-2_amd64.tar.zst brings Python 3.13: add "3.13" to python in /srv/p311/profile.yml, '
        'then: gpufleet profile lock /srv/p311']


def test_activation_that_does_not_number_the_gpus_as_nvidia_smi_is_a_finding_its_plan_repairs(tmp_path):
    venv, _site = make_venv(tmp_path / 'real')
    for script in ('activate', 'activate.fish', 'activate.csh'):
        assert os.path.exists(os.path.join(venv, 'bin', script)), script
    assert _venv_python.job_env_findings(venv) == []
    # a job that sources the venv's activate gets the order
    got = subprocess.run(['bash', '-c', '. "$0/bin/activate" && echo "$CUDA_DEVICE_ORDER"', venv],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert got == 'PCI_BUS_ID'
    # an activate written again by hand (or by an older gpufleet): found, and the audit's plan puts it back
    for script, text in (('activate', 'VIRTUAL_ENV={0}\nexport VIRTUAL_ENV\n'.format(venv)),
                         ('activate.fish', 'set -gx VIRTUAL_ENV {0}\n'.format(venv))):
        with open(os.path.join(venv, 'bin', script), 'w') as fh:
            fh.write(text)
    audit = _venv.audit(venv)
    found = audit['findings']['job_env']
    assert [(os.path.basename(f['path']), f['lines']) for f in found] == [
        ('activate', ['export CUDA_DEVICE_ORDER=PCI_BUS_ID']), ('activate.fish', ['set -gx CUDA_DEVICE_ORDER PCI_BUS_ID'])]
    assert 'CUDA_DEVICE_ORDER=PCI_BUS_ID' in found[0]['msg'] and audit['healthy'] is False
    assert audit['findings']['interpreter'] == [] and audit['rebuild'] is None  # appended, not rebuilt
    for argv in audit['plan']:
        subprocess.run(argv, check=True)
    after = _venv.audit(venv)
    assert after['healthy'] is True and after['plan'] == []
    with open(os.path.join(venv, 'bin', 'activate')) as fh:
        assert fh.read().startswith('VIRTUAL_ENV={0}\nexport VIRTUAL_ENV\n'.format(venv))  # kept, then the lines
    # written once: a second write adds nothing
    _venv_python.write_job_env(venv)
    with open(os.path.join(venv, 'bin', 'activate.csh')) as fh:
        assert fh.read().count('setenv CUDA_DEVICE_ORDER PCI_BUS_ID') == 1
