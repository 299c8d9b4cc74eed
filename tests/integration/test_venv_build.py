"""venv_build for real: uv builds content-addressed venvs from a hash-locked lock of real wheels (the
incident's cu12/cu13 pair), checks them, switches the link atomically, keeps old ones for rollback."""

import os
import subprocess
import sys

import pytest
from fakewheels import Index, lock, wheels  # noqa: F401 (a fixture)

pytestmark = pytest.mark.lab

UV = os.path.join(os.path.dirname(sys.executable), 'uv')
STACK = ('fake-rt-cu12==1.0', 'fake-rt-cu13==1.0', 'fake-torch==1.0')


@pytest.fixture
def build(play, tmp_path, wheels):
    def run(lock_path=None, check=False, fail=False, **options):
        options.setdefault('root', str(tmp_path / 'venvs'))
        options.setdefault('link', str(tmp_path / 'venv'))
        options.setdefault('uv', UV)
        options.setdefault('python', sys.executable)
        options.setdefault('overrides', ['fake-rt-cu13'])
        options.setdefault('imports', ['fake_torch'])
        options.setdefault('cache_dir', str(tmp_path / 'uv-cache'))
        options.setdefault('install_args', ['--offline', '--no-index', '--find-links', wheels])
        if lock_path:
            options['lock'] = lock_path
        task = {'gpufleet.proxmox.venv_build': options, 'check_mode': check}
        if fail:
            task['ignore_errors'] = True
        res = play([task]).task(0)
        assert bool(res.get('failed')) == fail, res
        return res
    return run


def flavour(link):
    return subprocess.run([os.path.join(link, 'bin', 'python'), '-c', 'import fake_torch; print(fake_torch.FLAVOUR)'],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_build_switch_idempotence_failure_and_rollback(build, tmp_path, wheels):
    link, root = str(tmp_path / 'venv'), str(tmp_path / 'venvs')
    first = lock(wheels, tmp_path / 'a.lock', *STACK)
    planned = build(first, check=True)
    assert planned['changed'] and planned['built'] and not os.path.exists(root) and not os.path.lexists(link)

    one = build(first)
    assert one['changed'] and one['built'] and one['switched'] and one['previous'] is None
    assert os.readlink(link) == os.path.join(root, one['id']) and len(one['id']) == 16
    assert flavour(link) == 'cu13'  # the override's bytes are the ones on disk
    assert set(one['timings']) == {'install_s', 'audit_s', 'import_s'}

    again = build(first)
    assert not again['changed'] and not again['built'] and again['id'] == one['id']

    # A lock whose stack cannot import (the runtime wheels left out): the audit names every missing library,
    # the new venv is removed and the active one keeps working.
    broken = lock(wheels, tmp_path / 'broken.lock', 'fake-torch==1.0')
    failed = build(broken, fail=True, overrides=[])
    assert 'the active venv is unchanged' in failed['msg']
    assert [u['soname'] for u in failed['findings']['unresolved_libraries']] == \
        ['libfakea.so.1', 'libfakeb.so.1', 'libfakec.so.1']
    assert os.readlink(link) == os.path.join(root, one['id']) and flavour(link) == 'cu13'
    assert sorted(os.listdir(root)) == sorted([one['id'], 'history.json', '.lock'])

    # A hash that does not match the wheel: uv refuses it, nothing changes.
    tampered = tmp_path / 'tampered.lock'
    lines = open(first).read().splitlines()
    lines[2] = '    --hash=sha256:' + '0' * 64  # fake-rt-cu12's hash
    tampered.write_text('\n'.join(lines) + '\n')
    failed = build(str(tampered), fail=True)
    assert 'hash' in failed['msg'].lower() and os.readlink(link) == os.path.join(root, one['id'])

    # A new lock: built beside, switched, the old one kept.
    second = lock(wheels, tmp_path / 'b.lock', *(STACK + ('fake-extra==1.0',)))
    two = build(second)
    assert two['built'] and two['switched'] and two['previous'] == one['id'] and two['removed'] == []
    assert os.path.isdir(os.path.join(root, one['id']))

    back = build(rollback=True)
    assert back['changed'] and back['id'] == one['id'] and back['previous'] == two['id']
    assert os.readlink(link) == os.path.join(root, one['id']) and flavour(link) == 'cu13'

    # keep: 0 removes everything but the active venv.
    pruned = build(first, keep=0)
    assert pruned['removed'] == [two['id']] and not pruned['built'] and not pruned['switched']
    nothing = build(rollback=True, fail=True)
    assert 'no previous venv' in nothing['msg']


def test_a_lock_given_as_content_is_written_only_once_its_venv_is_active(build, tmp_path, wheels):
    target = tmp_path / 'profiles' / 'p' / 'requirements.lock'  # its directory does not exist yet
    text = open(lock(wheels, tmp_path / 'a.lock', *STACK)).read()
    planned = build(str(target), check=True, lock_content=text)
    assert planned['built'] and planned['lock_written'] and not target.exists()
    one = build(str(target), lock_content=text)
    assert one['built'] and one['lock_written'] and target.read_text() == text
    assert (tmp_path / 'venv' / 'gpufleet-requirements.lock').read_text() == text  # the venv keeps its own
    assert not build(str(target), lock_content=text)['changed']
    target.write_text(text + '# edited by hand\n')
    rewritten = build(str(target), lock_content=text)
    assert rewritten['changed'] and rewritten['lock_written'] and not rewritten['built']
    assert target.read_text() == text
    # A lock that fails its build leaves the lock file as it was.
    broken = open(lock(wheels, tmp_path / 'broken.lock', 'fake-torch==1.0')).read()
    build(str(target), fail=True, lock_content=broken, overrides=[])
    assert target.read_text() == text and flavour(str(tmp_path / 'venv')) == 'cu13'


def test_bad_input_is_refused_before_anything_changes(build, tmp_path, wheels):
    link = tmp_path / 'venv'
    unpinned = tmp_path / 'unpinned.lock'
    unpinned.write_text('fake-torch>=1.0\nfake-rt-cu12==1.0\n')
    res = build(str(unpinned), fail=True)
    assert "line 1: 'fake-torch>=1.0' is not pinned with ==" in res['msg']
    assert 'line 2: fake-rt-cu12==1.0 has no --hash' in res['msg']
    assert 'overrides: fake-rt-cu13 is not in the lock' in res['msg']
    assert not (tmp_path / 'venvs').exists()

    res = build(lock(wheels, tmp_path / 'a.lock', *STACK), fail=True, python_version=['2.7', '3.99'])
    assert "is locked for Python 2.7, 3.99, but this container's {0} is Python 3.".format(sys.executable) in res['msg']
    assert 'fix: lock the profile for {0}.{1} too: add "{0}.{1}" to python in <its directory>/profile.yml'.format(
        *sys.version_info[:2]) in res['msg']
    assert not (tmp_path / 'venvs').exists()

    link.mkdir()
    (link / 'keep-me').write_text('data')
    res = build(lock(wheels, tmp_path / 'a.lock', *STACK), fail=True)
    assert 'link: {0} is a real directory'.format(link) in res['msg']
    assert (link / 'keep-me').read_text() == 'data' and not (tmp_path / 'venvs').exists()


def test_the_lab_lock_is_what_its_command_makes(lab, tmp_path):
    """The cpu profile's lock, regenerated offline from the lab's wheelhouse for Python 3.11 (the wheels it holds), is
    the committed one: the same pins, each with the committed hashes (which add the cp312 and cp313 wheels')."""
    import shutil
    from conftest import ROOT
    from gpufleet import profiles
    shipped = os.path.join(ROOT, 'roles', 'torch_venv', 'files', 'profiles', 'cpu')
    mine = tmp_path / 'cpu'
    shutil.copytree(shipped, mine)
    (mine / 'requirements.lock').unlink()
    gpufleet = os.path.join(os.path.dirname(sys.executable), 'gpufleet')
    made = subprocess.run([gpufleet, 'profile', 'lock', str(mine), '--find-links', lab.wheelhouse, '--python', '3.11'],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    ours, committed = profiles.read_lock(str(mine / 'requirements.lock')), profiles.read_lock(
        os.path.join(shipped, 'requirements.lock'))
    assert ours[1] == committed[1] == [] and set(ours[0]) == set(committed[0])
    for key, (version, hashes) in ours[0].items():
        assert committed[0][key][0] == version and set(hashes) <= set(committed[0][key][1]), key
    assert len(committed[0]['torch'][1]) == 3 and len(ours[0]['torch'][1]) == 1  # cp311, cp312, cp313
    with open(os.path.join(shipped, 'requirements.lock')) as fh:
        assert '--find-links /var/lib/gpufleet-lab/wheelhouse --python 3.11\n' in fh.read(400)


def test_repair_applies_the_audits_plan_and_a_failed_step_is_named(build, tmp_path, wheels):
    link = str(tmp_path / 'venv')
    first = lock(wheels, tmp_path / 'a.lock', *STACK)
    assert build(first, audit=True, repair=True)['audit']['healthy']
    # the incident: the cu13 set uninstalled takes the files it shared with cu12 along
    subprocess.run([UV, 'pip', 'uninstall', '--python', os.path.join(link, 'bin', 'python'), 'fake-rt-cu13'],
                   check=True, capture_output=True)
    planned = build(first, check=True, audit=True, repair=True)
    assert planned['changed'] and planned['repaired'] is False and not planned['audit']['healthy']
    assert planned['audit']['findings']['drift']['missing'] == [{'name': 'fake-rt-cu13', 'version': '1.0'}]
    assert 'repair_audit' not in planned and flavour_fails(link)

    # a plan whose reinstall cannot find its wheels: the failed step is named and the task fails
    empty = tmp_path / 'empty'
    empty.mkdir()
    failed = build(first, fail=True, audit=True, repair=True,
                   install_args=['--offline', '--no-index', '--find-links', str(empty)])
    assert 'the repair of {0} failed: the repair step '.format(link) in failed['msg'] and 'fake-rt' in failed['msg']

    fixed = build(first, audit=True, repair=True)
    assert fixed['changed'] and fixed['repaired'] and not fixed['built'] and not fixed['audit']['healthy']
    assert fixed['repair_audit']['healthy'] and flavour(link) == 'cu13'
    again = build(first, audit=True, repair=True)
    assert not again['changed'] and again['audit']['healthy'] and 'repaired' not in again


def flavour_fails(link):
    return subprocess.run([os.path.join(link, 'bin', 'python'), '-c', 'import fake_torch'],
                          capture_output=True).returncode != 0


def test_a_repair_installs_from_the_cache_and_downloads_nothing(build, tmp_path, wheels):
    """The incident repaired through an index with the cache warm from the build: no wheel is fetched again (uv's
    --reinstall-package would fetch each one it reinstalls), and with the index gone the repair still succeeds."""
    link = str(tmp_path / 'venv')
    index = Index(wheels, str(tmp_path / 'index'))
    try:
        online = {'install_args': ['--index-url', index.url], 'audit': True, 'repair': True}
        first = lock(wheels, tmp_path / 'a.lock', *STACK)
        assert build(first, **online)['audit']['healthy']
        fetched = index.wheel_bytes
        assert sorted(index.wheels) == ['fake_rt_cu12-1.0-py3-none-any.whl', 'fake_rt_cu13-1.0-py3-none-any.whl',
                                        'fake_torch-1.0-py3-none-any.whl']
        for reachable in (True, False):
            subprocess.run([UV, 'pip', 'uninstall', '--python', os.path.join(link, 'bin', 'python'), 'fake-rt-cu13'],
                           check=True, capture_output=True)
            assert flavour_fails(link)
            if not reachable:
                index.stop()
            fixed = build(first, **online)
            assert fixed['repaired'] and fixed['repair_audit']['healthy'] and flavour(link) == 'cu13', reachable
            assert 'fake-rt-cu12' in ' '.join(' '.join(argv) for argv in fixed['audit']['plan'])
            assert index.wheel_bytes == fetched, index.wheels
    finally:
        index.stop()


def test_a_full_audit_of_the_active_venv_imports_its_imports(build, tmp_path, wheels):
    """A library that only an import opens (with ctypes) is missing: the fast audit cannot see it, the full audit
    of the active venv imports the imports and names it, and a repair that cannot fix it fails saying so."""
    stack = lock(wheels, tmp_path / 'a.lock', *(STACK + ('fake-globaldeps==1.0',)))
    assert build(stack, audit=True)['audit']['healthy']  # imports: fake_torch only
    imports = ['fake_torch', 'fake_globaldeps']
    fast = build(stack, audit=True, imports=imports)
    assert fast['audit']['healthy'] and not fast['changed']
    full = build(stack, audit=True, audit_mode='full', imports=imports)
    assert not full['audit']['healthy'] and full['audit']['plan'] == []
    assert [(f['module'], f['library']) for f in full['audit']['findings']['failed_imports']] == \
        [('fake_globaldeps', 'libfakeglobal.so.1')]
    failed = build(stack, fail=True, audit=True, repair=True, audit_mode='full', imports=imports)
    assert 'import fake_globaldeps failed: OSError: libfakeglobal.so.1: cannot open shared object file' in failed['msg']
    assert failed['failed_imports'][0]['library'] == 'libfakeglobal.so.1'


def test_hold_builds_the_new_venv_beside_and_switches_only_when_called_again(build, tmp_path, wheels):
    link, root = str(tmp_path / 'venv'), str(tmp_path / 'venvs')
    first = lock(wheels, tmp_path / 'a.lock', *STACK)
    # a container without a venv yet has nothing to keep: not held
    one = build(first, hold=True)
    assert one['switched'] and 'held' not in one and os.readlink(link) == os.path.join(root, one['id'])
    # nothing to change: nothing held
    assert not build(first, hold=True)['changed']
    second = lock(wheels, tmp_path / 'b.lock', *(STACK + ('fake-extra==1.0',)))
    held = build(second, hold=True, audit=True)
    assert held['changed'] and held['held'] == {'driver': False, 'venv': held['id']} and held['built']
    assert not held['switched'] and 'audit' not in held and held['removed'] == []
    assert os.readlink(link) == os.path.join(root, one['id'])  # the active venv is untouched
    assert os.path.isfile(os.path.join(root, held['id'], 'gpufleet-venv.json'))  # the new one is complete
    # in check mode nothing is held: the switch is reported as a change
    planned = build(second, hold=True, check=True)
    assert planned['switched'] and 'held' not in planned
    # the same call without hold: the switch, without building again
    made = build(second, audit=True)
    assert made['switched'] and not made['built'] and made['previous'] == one['id'] and 'held' not in made
    assert os.readlink(link) == os.path.join(root, held['id']) and made['audit']['healthy']
