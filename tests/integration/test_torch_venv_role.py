"""The torch_venv role end to end in a lab container, with the real CPU torch from the node's wheelhouse:
build, second run changed=0, drift reported in check mode and repaired, a failed build that leaves the
active venv alone, rollback, and a profile without its lock refused."""

import os
import shutil
import subprocess

import pytest

from conftest import ONE_STORE, ROOT, Pve, _api, site
from gpufleet.lab.layout import UV_PIN
from gpufleet.lab.testing import Index
from fakewheels import wheel
from test_gpu_container_role import entry

pytestmark = pytest.mark.lab

VMID = 321
CPU = os.path.join(ROOT, 'roles', 'torch_venv', 'files', 'profiles', 'cpu')
FLEET = [entry(VMID, 'venv-a', [0], memory=2048)]


def venv_site(tmp_path, *args, **extra):
    """site.yml, the venv stage included."""
    return site(tmp_path, FLEET, *args, venv=True, **extra)


def sh(cmd):
    return subprocess.run(['pct', 'exec', str(VMID), '--', 'sh', '-c', cmd], capture_output=True, text=True)


def torch_version():
    out = sh('/root/venv/bin/python -c "import torch; print(torch.__version__)" 2>&1')
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 else 'FAILED: ' + out.stdout[-300:]


def link():
    return sh('readlink /root/venv').stdout.strip()


def task(result, host, name):
    return [t for t in result.tasks(host) if t['task'].endswith(name)]


def profile(tmp_path, name, lock_text):
    d = tmp_path / name
    d.mkdir()
    for f in ('pyproject.toml', 'profile.yml'):
        shutil.copy(os.path.join(CPU, f), d / f)
    (d / 'requirements.lock').write_text(lock_text)
    return str(d)


@pytest.fixture(scope='module')
def built(tmp_path_factory, creds, lab):
    """The container, made and given its venv once for this module's tests, destroyed after them."""
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.append(VMID)
    first = venv_site(tmp_path_factory.mktemp('venv-site'))
    assert first.rc == 0, first.stdout[-4000:]
    yield first
    pve.cleanup()


def test_build_then_nothing_to_do(built, tmp_path, lab):
    assert torch_version() == '2.13.0+cpu'
    assert link().startswith('/opt/gpufleet/venvs/') and len(os.path.basename(link())) == 16
    # the node's uv cache is bound in and holds what the build downloaded: the next container reuses it
    cache = os.path.join(lab.root, 'node', 'var', 'cache', 'gpufleet', 'uv')
    assert sh('mountpoint -q /var/cache/gpufleet/uv && ls /var/cache/gpufleet/uv').returncode == 0
    assert any(n.startswith('archive') for n in os.listdir(cache))
    assert os.stat(cache).st_uid == 100000  # written by the unprivileged container's root
    again = venv_site(tmp_path)
    assert again.rc == 0 and all(s['changed'] == 0 for s in again.stats.values()), again.stats
    # the first run installed the pinned uv (venv_build does, where it is missing); the second found it
    (first,) = task(built, 'venv-a', 'audit the active venv and repair it')
    (second,) = task(again, 'venv-a', 'audit the active venv and repair it')
    assert first['uv_installed'] and not second['uv_installed'] and second['audit']['healthy']


def test_uv_comes_from_the_index_in_a_container_without_ensurepip(built, tmp_path, lab):
    # as PVE's debian-12-standard template: python3, but no python3-venv (ensurepip), so no pip to install uv with
    assert sh('python3 -c "import ensurepip"').returncode != 0 and sh('python3 -m pip --version').returncode != 0
    index = Index(lab.wheelhouse, str(tmp_path / 'index'), host='10.77.0.1')  # the node, as the container sees it
    try:
        online = venv_site(tmp_path, torch_venv_offline=False, torch_venv_uv_dir='/opt/gpufleet/uv-online',
                           torch_venv_environment={'PIP_INDEX_URL': index.url})
    finally:
        index.stop()
    assert online.rc == 0, online.stdout[-3000:]
    (build,) = task(online, 'venv-a', 'audit the active venv and repair it')
    assert build['uv_installed'] and not build['built'] and build['audit']['healthy']
    assert [w.split('-')[0] for w in index.wheels] == ['uv']  # uv's wheel alone; the venv was there already
    version = sh('/opt/gpufleet/uv-online/{0}/bin/uv --version'.format(UV_PIN.split('==')[1]))
    assert version.returncode == 0 and version.stdout.split()[1] == UV_PIN.split('==')[1]


def test_drift_reported_in_check_mode_then_repaired(built, tmp_path):
    site_packages = '/root/venv/lib/python3.11/site-packages'
    # a file of a locked distribution deleted (import torch breaks) and a package the lock does not hold
    assert sh('rm {0}/typing_extensions.py'.format(site_packages)).returncode == 0
    assert torch_version().startswith('FAILED')
    whl = wheel(str(tmp_path), 'stray', '1.0', {'stray/__init__.py': b''})
    subprocess.run(['pct', 'push', str(VMID), whl, '/tmp/' + os.path.basename(whl)], check=True)
    installed = sh('/opt/gpufleet/uv/0.13.9/bin/uv pip install --quiet --python /root/venv/bin/python --offline '
                   '--no-deps /tmp/' + os.path.basename(whl))
    assert installed.returncode == 0, installed.stderr

    check = venv_site(tmp_path, '--check')
    assert check.rc == 0, check.stdout[-3000:]
    # the check run's call was recorded in the container's task and run by its node (site.yml's batch plays)
    (recorded,) = task(check, 'venv-a', 'audit the active venv and repair it')
    (build,) = task(check, 'venv-a', "Take the container's venv read from its node's call")
    assert recorded['deferred']['node'] == 'pve1'
    audit = build['audit']
    assert not audit['healthy'] and not build['built'] and not build['switched']
    assert build['changed']  # what a repair run would change
    assert [b['name'] for b in audit['findings']['broken_distributions']] == ['typing_extensions']
    assert audit['findings']['drift']['extra'] == [{'name': 'stray', 'version': '1.0'}]
    assert torch_version().startswith('FAILED')  # check mode changed nothing

    fix = venv_site(tmp_path)
    assert fix.rc == 0, fix.stdout[-3000:]
    (build,) = task(fix, 'venv-a', 'audit the active venv and repair it')
    assert build['changed'] and build['repaired'] and not build['audit']['healthy']  # found, then repaired
    assert build['repair_audit']['healthy'] and build['repair_audit']['findings']['drift']['extra'] == []
    assert torch_version() == '2.13.0+cpu'
    assert sh('test -e {0}/stray'.format(site_packages)).returncode != 0
    clean = venv_site(tmp_path, '--check')
    assert all(s['changed'] == 0 for s in clean.stats.values()), clean.stats


def test_failed_build_keeps_the_active_venv_and_rollback(built, tmp_path):
    before = link()
    lock = open(os.path.join(CPU, 'requirements.lock')).read()
    bad = lock.replace(lock.split('--hash=sha256:')[1][:64], '0' * 64, 1)
    failed = venv_site(tmp_path, torch_venv_profile=profile(tmp_path, 'tampered', bad))
    assert failed.rc != 0
    (res,) = task(failed, 'venv-a', 'audit the active venv and repair it')
    assert res['failed'] and 'the active venv is unchanged' in res['msg'] and 'hash' in res['msg'].lower()
    assert link() == before and torch_version() == '2.13.0+cpu'

    # the same packages under another lock: a new venv beside (the node's cache is warm), then back. This
    # build runs with torch_venv_environment, here uv's setting to compile bytecode at install: a module that
    # `import torch` never loads has its .pyc in the new venv and none in the old one.
    newer = venv_site(tmp_path, torch_venv_profile=profile(tmp_path, 'newer', lock + '# rebuilt\n'),
                      torch_venv_environment={'UV_COMPILE_BYTECODE': '1'})
    assert newer.rc == 0, newer.stdout[-3000:]
    # built beside and held, the container snapshotted, then switched (site.yml's snapshot before a change)
    held, res = task(newer, 'venv-a', 'audit the active venv and repair it')
    assert held['built'] and held['held'] == {'driver': False, 'venv': res['id']} and not held['switched']
    assert res['switched'] and not res['built'] and res['previous'] == os.path.basename(before)
    assert link() != before
    pyc = 'lib/python3.11/site-packages/torch/utils/tensorboard/__pycache__/writer.cpython-311.pyc'
    assert sh('test -f /root/venv/{0}'.format(pyc)).returncode == 0
    assert sh('test -f /opt/gpufleet/venvs/{0}/{1}'.format(os.path.basename(before), pyc)).returncode != 0
    back = venv_site(tmp_path, torch_venv_rollback=True)
    assert back.rc == 0, back.stdout[-3000:]
    assert link() == before and torch_version() == '2.13.0+cpu'
    kept = sh('ls /opt/gpufleet/venvs').stdout.split()
    assert os.path.basename(before) in kept and res['id'] in kept


def test_a_profile_without_its_lock_is_refused(built, tmp_path):
    d = tmp_path / 'nolock'
    d.mkdir()
    for f in ('pyproject.toml', 'profile.yml'):
        shutil.copy(os.path.join(CPU, f), d / f)
    before = link()
    r = venv_site(tmp_path, torch_venv_profile=str(d))
    assert r.rc != 0
    # refused while the build task's arguments are worked out, before anything runs in the container
    (res,) = task(r, 'venv-a', 'audit the active venv and repair it')
    assert res['failed'] and 'invocation' not in res
    assert 'torch_venv_profile' in res['msg'] and 'gpufleet profile lock {0}'.format(d) in res['msg']
    assert 'requirements.lock missing' in res['msg']
    assert link() == before


def test_hardlink_mode_refuses_a_root_off_the_caches_mount(built, tmp_path):
    before = link()
    r = venv_site(tmp_path, torch_venv_link_mode='hardlink')
    assert r.rc != 0
    (res,) = task(r, 'venv-a', 'audit the active venv and repair it')
    assert res['failed'] and 'link_mode: hardlink needs root (/opt/gpufleet/venvs' in res['msg']
    assert 'same mount as cache_dir (/var/cache/gpufleet/uv' in res['msg']
    assert link() == before and torch_version() == '2.13.0+cpu'


def test_hardlink_mode_links_the_venv_to_the_nodes_cache(tmp_path, pve, lab):
    store = os.path.join(lab.root, 'node', 'var', 'lib', 'gpufleet', 'store')
    pve.made.append(323)
    try:
        r = site(tmp_path, [entry(323, 'venv-hl', [], memory=2048)], venv=True, **ONE_STORE)
        assert r.rc == 0, r.stdout[-3000:]
        (res,) = task(r, 'venv-hl', 'audit the active venv and repair it')
        assert res['built'] and res['venv'].startswith('/var/lib/gpufleet/store/venvs/venv-hl/')
        lib = os.path.join(res['venv'], 'lib/python3.11/site-packages/torch/lib/libtorch_cpu.so')
        out = subprocess.run(['pct', 'exec', '323', '--', 'stat', '-c', '%h', lib], capture_output=True, text=True)
        assert int(out.stdout) >= 2, out  # the venv's copy and the cache's are one file
        again = site(tmp_path, [entry(323, 'venv-hl', [], memory=2048)], venv=True, **ONE_STORE)
        assert again.rc == 0 and all(s['changed'] == 0 for s in again.stats.values()), again.stats
    finally:
        pve.cleanup()
        shutil.rmtree(store, ignore_errors=True)
