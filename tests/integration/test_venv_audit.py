"""venv_audit on real venvs, with real pip and uv and real ELF files: the incident at small scale.

Two flavours of a runtime ("cu12" and "cu13") install the same nvidia/fakert/lib/lib{a,b,c}.so.1; an
extension needs all three through an $ORIGIN RPATH, as torch's libraries do.
"""

import os
import subprocess
import sys

import pytest
from conftest import ROOT
from fakewheels import LIBDIR, LIBS, SAME_BYTES, wheels  # noqa: F401 (a fixture)

sys.path.insert(0, os.path.join(ROOT, '.collections'))  # the checkout's module_utils, as the unit tests import them
from ansible_collections.gpufleet.proxmox.plugins.module_utils import _venv_python  # noqa: E402

pytestmark = pytest.mark.lab
UV = os.path.join(os.path.dirname(sys.executable), 'uv')


def make_venv(tmp_path, wheels, *steps):
    venv = str(tmp_path / 'venv')
    subprocess.run([sys.executable, '-m', 'venv', venv], check=True)
    _venv_python.write_job_env(venv)  # its activation as venv_build leaves it
    for step in steps:
        pip(venv, *step, wheels=wheels)
    return venv


def pip(venv, *args, wheels):
    argv = [os.path.join(venv, 'bin', 'python'), '-m', 'pip', '--disable-pip-version-check'] + list(args)
    if args[0] == 'install':
        argv += ['--no-index', '--find-links', wheels]
    subprocess.run(argv, check=True, capture_output=True)


def imports(venv):
    return subprocess.run([os.path.join(venv, 'bin', 'python'), '-c', 'import fake_torch; print(fake_torch.FLAVOUR)'],
                          capture_output=True, text=True)


def audit(play, venv, **options):
    options['venv'] = venv
    r = play([{'gpufleet.proxmox.venv_audit': options}])
    res = r.task(0)
    assert not res.get('failed'), res
    assert res['changed'] is False
    return res


def run_plan(plan):
    for argv in plan:
        subprocess.run(argv, check=True, capture_output=True)


def test_the_incident_every_missing_library_named_at_once_and_repaired(play, tmp_path, wheels):
    venv = make_venv(tmp_path, wheels, ('install', 'fake-rt-cu12'), ('install', 'fake-rt-cu13'), ('install', 'fake-torch'))
    assert imports(venv).stdout.strip() == 'cu13'  # the cu13 bytes are the ones on disk
    healthy = audit(play, venv, overrides=['fake-rt-cu13'])
    assert healthy['healthy'] and len(healthy['overrides']) == 3
    assert {o['on_disk'] for o in healthy['overrides']} == {'fake-rt-cu13'}
    # files both flavours install with the same bytes conflict with nothing, whoever installed last
    shared = [s for s in healthy['shared_files'] if not s['path'].endswith('.pyc')]
    assert shared == [{'path': p, 'claimed_by': ['fake-rt-cu12', 'fake-rt-cu13']} for p in sorted(SAME_BYTES)]
    # The "cleaning": uninstalling the cu13 set deletes the shared files.
    pip(venv, 'uninstall', '-y', 'fake-rt-cu13', wheels=wheels)
    broken = imports(venv)
    assert broken.returncode != 0 and 'libfakea.so.1' in broken.stderr  # the loader names only the first
    res = audit(play, venv, installer='pip', install_args=['--no-index', '--find-links', wheels])
    assert res['healthy'] is False
    unresolved = res['findings']['unresolved_libraries']
    assert [u['soname'] for u in unresolved] == list(LIBS)  # three missing -> three named
    assert all(u['needed_by'] == ['fake_torch/_C.so'] and u['provided_by'] == ['fake-rt-cu12'] for u in unresolved)
    (dist,) = res['findings']['broken_distributions']
    assert dist['name'] == 'fake-rt-cu12'
    assert sorted(dist['missing']) == sorted(
        [LIBDIR + '/' + lib for lib in LIBS] + list(SAME_BYTES))
    python = os.path.join(venv, 'bin', 'python')
    assert res['plan'] == [[python, '-m', 'pip', 'install', '--force-reinstall', '--no-deps', 'fake-rt-cu12==1.0',
                            '--no-index', '--find-links', wheels]]
    run_plan(res['plan'])
    assert imports(venv).stdout.strip() == 'cu12'
    assert audit(play, venv)['healthy']


def test_drift_against_a_lock_and_a_contaminant_removed_without_breaking_the_import(play, tmp_path, wheels):
    uv = os.path.join(os.path.dirname(sys.executable), 'uv')
    venv = make_venv(tmp_path, wheels, ('install', 'fake-rt-cu12'), ('install', 'fake-torch'),
                     ('install', 'fake-contaminant'))
    lock = tmp_path / 'lock.txt'
    lock.write_text('fake-rt-cu12==1.0 \\\n    --hash=sha256:00\nfake-rt-cu13==1.0\nfake-torch==1.0\n')
    res = audit(play, venv, lock=str(lock), installer='uv', uv=uv, mode='full', overrides=['fake-rt-cu13'],
                install_args=['--offline', '--no-index', '--find-links', wheels])
    drift = res['findings']['drift']
    assert drift['extra'] == [{'name': 'fake-contaminant', 'version': '2.0'}]
    assert drift['missing'] == [{'name': 'fake-rt-cu13', 'version': '1.0'}]
    assert [c['path'] for c in res['findings']['collisions']] == [LIBDIR + '/libfakea.so.1']
    assert res['findings']['collisions'][0]['on_disk'] == 'fake-contaminant'
    python = os.path.join(venv, 'bin', 'python')
    # the removal comes first, with what its removal would delete uninstalled too (so uv installs it from its cache),
    # then what is missing; the declared override last
    assert res['plan'][0] == [uv, 'pip', 'uninstall', '--python', python, 'fake-contaminant', 'fake-rt-cu12']
    assert res['plan'][1][:7] == [uv, 'pip', 'install', '--python', python, '--no-deps', 'fake-rt-cu12==1.0']
    assert res['plan'][2][6] == 'fake-rt-cu13==1.0' and len(res['plan']) == 3
    assert not any('--reinstall-package' in argv or '--reinstall' in argv for argv in res['plan'])
    run_plan(res['plan'])
    assert imports(venv).stdout.strip() == 'cu13'
    after = audit(play, venv, lock=str(lock), overrides=['fake-rt-cu13'], mode='full')
    assert after['healthy'], after['findings']


def test_a_requirement_uninstalled_is_named_without_a_lock_and_installed_by_the_plan(play, tmp_path, wheels):
    """As the incident's uninstall of the four cu13 wheels that torch 2.11.0 from PyPI requires: the requirement is
    named whole (pip check's "not installed"), with who requires it, without a lock; the plan installs it as
    the requirement says, and the import works again."""
    venv = make_venv(tmp_path, wheels, ('install', 'fake-rt-cu13', 'fake-torch-cu13'))
    pip(venv, 'uninstall', '-y', 'fake-rt-cu13', wheels=wheels)
    python = os.path.join(venv, 'bin', 'python')
    assert subprocess.run([python, '-c', 'import fake_torch_cu13'], capture_output=True).returncode != 0
    res = audit(play, venv, installer='pip', install_args=['--no-index', '--find-links', wheels],
                imports=['fake_torch_cu13'])
    assert not res['healthy']
    assert res['findings']['missing_requirements'] == [
        {'name': 'fake-rt-cu13', 'requirement': 'fake-rt-cu13==1.0', 'required_by': ['fake-torch-cu13']}]
    assert [u['soname'] for u in res['findings']['unresolved_libraries']] == list(LIBS)
    assert res['plan'] == [[python, '-m', 'pip', 'install', '--force-reinstall', '--no-deps', 'fake-rt-cu13==1.0',
                            '--no-index', '--find-links', wheels]]
    run_plan(res['plan'])
    assert subprocess.run([python, '-c', 'import fake_torch_cu13'], capture_output=True).returncode == 0
    after = audit(play, venv, imports=['fake_torch_cu13'])
    assert after['healthy'], after['findings']
    # with a lock, the lock says what belongs in the venv: its drift names what is missing
    lock = tmp_path / 'lock.txt'
    lock.write_text('fake-rt-cu13==1.0\nfake-torch-cu13==1.0\n')
    pip(venv, 'uninstall', '-y', 'fake-rt-cu13', wheels=wheels)
    locked = audit(play, venv, lock=str(lock))
    assert locked['findings']['drift']['missing'] == [{'name': 'fake-rt-cu13', 'version': '1.0'}]
    assert locked['findings']['missing_requirements'] == []


def test_fail_on_findings_and_not_a_venv(play, tmp_path):
    r = play([{'gpufleet.proxmox.venv_audit': {'venv': str(tmp_path)}, 'ignore_errors': True}]).task(0)
    assert r.get('failed') and 'is not a venv' in r['msg']


def test_system_libraries_only_plugins_need_are_optional(play, tmp_path, wheels):
    """A system library that no wheel ships is a finding where an extension module needs it (here through a
    library of its own, as torch/_C needs libtorch); where only a plugin needs it (a library that nothing
    imports and no extension module needs: a dlopen loads it), it is reported as optional, as a real CUDA
    torch's NVSHMEM transports need libfabric, UCX and the rest only on clusters with that fabric."""
    venv = make_venv(tmp_path, wheels, ('install', 'fake-plugins'))
    res = audit(play, venv)
    assert not res['healthy']
    assert res['findings']['unresolved_libraries'] == [
        {'soname': 'libfakesys.so.1', 'needed_by': ['fake_plugins/libfakehelper.so.1'], 'provided_by': [],
         'in_lock': []}]
    assert res['optional_libraries'] == [
        {'soname': 'libfakefabric.so.1', 'needed_by': ['fake_plugins/transport_fabric.so.3'], 'provided_by': []}]


def test_a_requirements_library_and_another_packages_optional_backend_are_not_findings(play, tmp_path, wheels):
    """As on a real training venv (seen on an H200 with torch, torchvision, torchaudio, cupy, numba and mpi4py):
    fake-vision's extension needs fake-core's libfakecore.so.1 with no path to it, as torchvision's needs torch's
    libc10.so, and imports (its __init__ imports fake_core first); fake-plugins' extension needs a system library
    that is not there, as cupy's cuTENSOR module does. Held to the imports that matter, neither is a finding; the
    requirement's library deleted is, and so is fake-plugins' system library where fake_plugins is one of them."""
    venv = make_venv(tmp_path, wheels, ('install', 'fake-vision', 'fake-core', 'fake-plugins'))
    python = os.path.join(venv, 'bin', 'python')
    works = subprocess.run([python, '-c', 'import fake_vision; print(fake_vision.probe())'], capture_output=True, text=True)
    assert works.returncode == 0 and works.stdout.strip() == '7', works.stderr
    for mode in ('fast', 'full'):
        held = audit(play, venv, imports=['fake_vision'], mode=mode)
        assert held['healthy'], held['findings']
        assert held['optional_libraries'] == [
            {'soname': 'libfakefabric.so.1', 'needed_by': ['fake_plugins/transport_fabric.so.3'], 'provided_by': []},
            {'soname': 'libfakesys.so.1', 'needed_by': ['fake_plugins/libfakehelper.so.1'], 'provided_by': []}]
    # every extension module counts without imports: fake_plugins' system library is a finding, torchvision's is not
    every = audit(play, venv)
    assert [u['soname'] for u in every['findings']['unresolved_libraries']] == ['libfakesys.so.1']
    both = audit(play, venv, imports=['fake_vision', 'fake_plugins'])
    assert [u['soname'] for u in both['findings']['unresolved_libraries']] == ['libfakesys.so.1']
    # the requirement's own library gone: a finding, as the import fails
    os.unlink(os.path.join(site_packages(venv), 'fake_core', 'lib', 'libfakecore.so.1'))
    assert subprocess.run([python, '-c', 'import fake_vision'], capture_output=True).returncode != 0
    gone = audit(play, venv, imports=['fake_vision'])
    assert not gone['healthy']
    (lost,) = gone['findings']['unresolved_libraries']
    assert lost['soname'] == 'libfakecore.so.1' and lost['provided_by'] == ['fake-core']
    assert lost['needed_by'] == ['fake_core/_C.so', 'fake_vision/_C.so']


def site_packages(venv):
    (site,) = [os.path.join(venv, 'lib', d, 'site-packages') for d in os.listdir(os.path.join(venv, 'lib'))]
    return site


CU12, CU13 = 'fake-rt-cu12', 'fake-rt-cu13'
DECIDE = 'declare one in `overrides`, or give a lock'


@pytest.mark.parametrize('installs,lock,overrides,outcome', [
    # torch 2.11.0 from PyPI requires the cu13 wheels; the cu12 siblings installed over them are required by nothing
    ([CU13, CU12, 'fake-torch-cu13'], None, [], 'cu13'),
    ([CU12, CU13, 'fake-torch-cu13'], None, [], 'cu13'),
    # each flavour required by something installed, or neither: the operator decides
    ([CU13, CU12, 'fake-torch-cu13', 'fake-torch-cu12'], None, [], DECIDE),
    ([CU12, CU13, 'fake-torch-cu13', 'fake-torch-cu12'], None, [], DECIDE),
    ([CU13, CU12, 'fake-torch'], None, [], 'no installed distribution requires either: ' + DECIDE),
    ([CU13, CU12, 'fake-torch-cu13', 'fake-torch-cu12'], [CU12, CU13, 'fake-torch-cu13', 'fake-torch-cu12'], [],
     'declare one in `overrides`, or remove all but one from the lock'),
    # a lock with one of them decides it (the other is removed)
    ([CU13, CU12, 'fake-torch-cu13'], [CU13, 'fake-torch-cu13'], [], 'cu13'),
    ([CU12, CU13, 'fake-torch-cu13'], [CU12, 'fake-torch-cu13'], [], 'cu12'),
    # a lock with both: the venv's metadata decides it
    ([CU13, CU12, 'fake-torch-cu13'], [CU12, CU13, 'fake-torch-cu13'], [], 'cu13'),
    # a declared override wins over what the metadata says, with a lock (the default profile's shape) or without
    ([CU13, CU12, 'fake-torch-cu13'], None, [CU12], 'cu12'),
    ([CU12, CU13, 'fake-torch-cu13'], None, [CU12], 'cu12'),
    ([CU13, CU12, 'fake-torch'], [CU12, CU13, 'fake-torch'], [CU13], 'cu13'),
    ([CU12, CU13, 'fake-torch'], [CU12, CU13, 'fake-torch'], [CU13], 'cu13'),
], ids=['required-cu12-over', 'required-cu13-over', 'both-required-cu12-over', 'both-required-cu13-over',
        'none-required', 'both-required-both-locked', 'lock-cu13', 'lock-cu12', 'lock-both-required-cu13',
        'override-cu12-over', 'override-cu13-over', 'lock-override-cu12-over', 'lock-override-cu13-over'])
def test_the_plan_converges_applied_twice(play, tmp_path, wheels, installs, lock, overrides, outcome):
    """cu12 over cu13 or cu13 over cu12, audited, the plan applied, audited, applied again, audited: the venv ends
    healthy with the bytes that its overrides, its lock or its own Requires-Dist decide, or, where nothing decides,
    with an empty plan from the first audit on and a finding that says what to declare. No plan undoes another."""
    venv = str(tmp_path / 'venv')
    cache = {'UV_CACHE_DIR': str(tmp_path / 'uv')}
    subprocess.run([UV, 'venv', '--quiet', venv], check=True, env=dict(os.environ, **cache))
    _venv_python.write_job_env(venv)
    offline = ['--offline', '--no-index', '--find-links', wheels]
    for name in installs:  # one at a time, in this order
        subprocess.run([UV, 'pip', 'install', '--quiet', '--python', venv, '--no-deps', name] + offline, check=True,
                       env=dict(os.environ, **cache))
    options = {'venv': venv, 'uv': UV, 'overrides': overrides, 'install_args': offline}
    if lock:
        (tmp_path / 'lock.txt').write_text(''.join('{0}==1.0\n'.format(name) for name in lock))
        options['lock'] = str(tmp_path / 'lock.txt')
    apply = {'ansible.builtin.command': {'argv': '{{ item }}'}, 'environment': cache}
    r = play([{'gpufleet.proxmox.venv_audit': options, 'register': 'first'}, dict(apply, loop='{{ first.plan }}'),
              {'gpufleet.proxmox.venv_audit': options, 'register': 'second'}, dict(apply, loop='{{ second.plan }}'),
              {'gpufleet.proxmox.venv_audit': options}])
    assert r.rc == 0, r.failures()
    first, second, third = r.task(0), r.task(2), r.task(4)
    assert second['plan'] == [] and third['plan'] == []
    assert (second['healthy'], second['findings']) == (third['healthy'], third['findings'])
    if outcome in ('cu12', 'cu13'):
        assert second['healthy'], second['findings']
        module = 'fake_torch_cu13' if 'fake-torch-cu13' in installs else 'fake_torch'
        loaded = subprocess.run([os.path.join(venv, 'bin', 'python'), '-c',
                                 'import {0}; print({0}.FLAVOUR)'.format(module)], capture_output=True, text=True)
        assert loaded.stdout.strip() == outcome, loaded.stderr
    else:
        assert first['plan'] == [] and not first['healthy']
        collisions = third['findings']['collisions']
        assert {c['path'] for c in collisions} == {LIBDIR + '/' + lib for lib in LIBS}
        assert all(c['decide'].endswith(outcome) for c in collisions), collisions
        assert third['findings']['broken_distributions'] == []


def test_a_library_only_an_import_opens_is_proven_by_the_imports_of_a_full_audit(play, tmp_path, wheels):
    """fake_globaldeps' __init__ opens a library of its own with ctypes (as torch's opens libtorch_global_deps.so),
    and that library needs a system library that is not there. No extension module needs it, so the ELF closure
    calls it optional and the fast audit is healthy; the import fails, and the full audit with imports says so,
    naming the library."""
    venv = str(tmp_path / 'venv')
    subprocess.run([UV, 'venv', '--quiet', venv], check=True)
    _venv_python.write_job_env(venv)
    subprocess.run([UV, 'pip', 'install', '--quiet', '--python', venv, '--no-deps', '--offline', '--no-index',
                    '--find-links', wheels, 'fake-globaldeps', 'fake-rt-cu13', 'fake-torch'], check=True,
                   env=dict(os.environ, UV_CACHE_DIR=str(tmp_path / 'uv')))
    loaded = subprocess.run([os.path.join(venv, 'bin', 'python'), '-c', 'import fake_globaldeps'],
                            capture_output=True, text=True)
    assert loaded.returncode != 0 and 'libfakeglobal.so.1: cannot open shared object file' in loaded.stderr
    modules = ['fake_torch', 'fake_globaldeps', 'json']
    fast = audit(play, venv, imports=modules)
    assert fast['healthy'] and fast['findings']['failed_imports'] == []
    assert [o['soname'] for o in fast['optional_libraries']] == ['libfakeglobal.so.1']
    full = audit(play, venv, mode='full', imports=modules)
    assert not full['healthy'] and full['plan'] == []
    assert full['findings']['failed_imports'] == [{
        'module': 'fake_globaldeps', 'library': 'libfakeglobal.so.1',
        'message': 'OSError: libfakeglobal.so.1: cannot open shared object file: No such file or directory'}]
    bad = play([{'gpufleet.proxmox.venv_audit': {'venv': venv, 'mode': 'full', 'imports': ['json; import os']},
                 'ignore_errors': True}]).task(0)
    assert bad.get('failed') and "imports: 'json; import os' is not a module name" in bad['msg']
