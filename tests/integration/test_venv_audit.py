"""venv_audit on real venvs, with real pip and uv and real ELF files: the incident at small scale.

Two flavours of a runtime ("cu12" and "cu13") install the same nvidia/fakert/lib/lib{a,b,c}.so.1; an
extension needs all three through an $ORIGIN RPATH, as torch's libraries do.
"""

import os
import subprocess
import sys

import pytest
from fakewheels import LIBDIR, LIBS, SAME_BYTES, wheels  # noqa: F401 (a fixture)

pytestmark = pytest.mark.lab


def make_venv(tmp_path, wheels, *steps):
    venv = str(tmp_path / 'venv')
    subprocess.run([sys.executable, '-m', 'venv', venv], check=True)
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
    # the removal comes first, with the reinstall of what it would delete, then the missing install
    assert res['plan'][0] == [uv, 'pip', 'uninstall', '--python', python, 'fake-contaminant']
    assert res['plan'][1][:7] == [uv, 'pip', 'install', '--python', python, '--no-deps', '--reinstall-package']
    assert res['plan'][1][7:9] == ['fake-rt-cu12', 'fake-rt-cu12==1.0']
    assert res['plan'][2][6] == 'fake-rt-cu13==1.0'
    run_plan(res['plan'])
    assert imports(venv).stdout.strip() == 'cu13'
    after = audit(play, venv, lock=str(lock), overrides=['fake-rt-cu13'], mode='full')
    assert after['healthy'], after['findings']


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
