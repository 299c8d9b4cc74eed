"""`gpufleet lab down` leaves nothing behind; `up` afterwards brings the lab back."""

import glob
import os
import subprocess
import sys
import time

import pytest
from gpufleet.lab import manager

pytestmark = [pytest.mark.lab, pytest.mark.last]


def test_reset_empties_the_lab_and_keeps_it_up(lab, pve, control, creds):
    from conftest import _api
    pve.create(952)
    pve.start(952)
    pve.made.clear()
    manager.reset(lab, say=lambda m: None)
    st = manager.status(lab)
    assert st['api_running'] and st['sshd_running'] and st['containers'] == []
    assert control.state() == []
    fresh = _api(creds, user='root@pam', password=creds['api_password'])  # a reset forgets the old sessions
    assert 952 not in [g['vmid'] for g in fresh.cluster.resources.get(type='vm')]
    assert not os.path.exists(lab.ct_dir(952)) and not os.path.exists(lab.pve_conf(952))


def running(pid):
    """True while the process exists and is not a zombie waiting for init to reap it."""
    try:
        with open('/proc/{0}/stat'.format(pid)) as fh:
            return fh.read().rsplit(') ', 1)[1][0] != 'Z'
    except OSError:
        return False


def test_down_leaves_nothing_then_up_restores(lab, pve):
    pve.create(951, dev0='/dev/nvidia0')
    pve.start(951)
    record = lab.record()
    assert record['gpus']['created'] or record['gpus']['real']
    pids = [open(lab.daemon_pid).read().strip(), open(os.path.join(lab.ssh_dir, 'sshd.pid')).read().strip()]
    pve.made.clear()
    manager.down(lab, say=lambda m: None)
    assert not os.path.exists(lab.root)
    for path in record['gpus']['created']:
        assert not os.path.exists(path), path
    assert not os.path.exists('/sys/class/net/' + lab.bridge)
    assert subprocess.run(['nft', 'list', 'table', 'ip', 'gpufleet_lab'], capture_output=True).returncode != 0
    assert not os.path.exists(lab.pct_link) and not os.path.exists(lab.pvesm_link)
    for pid in pids:
        assert not running(pid), 'process {0} still running'.format(pid)
    with open('/proc/self/mountinfo') as fh:
        assert lab.root not in fh.read()
    assert not glob.glob('/sys/fs/cgroup/*/lxc.payload.*') and not glob.glob('/sys/fs/cgroup/*/lxc.monitor.*')
    assert 'veth951i0' not in os.listdir('/sys/class/net')
    # A molecule scenario starts from the stopped lab: its destroy has nothing to destroy, its create brings the
    # lab up again.
    from conftest import ROOT
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH'])
    for action in ('destroy', 'create'):
        started = time.monotonic()
        done = subprocess.run(['molecule', action, '-s', 'drift'], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, (action, done.stdout[-3000:], done.stderr[-3000:])
        if action == 'destroy':
            assert 'nothing to destroy' in done.stdout + done.stderr
    assert time.monotonic() - started < 30
    st = manager.status(lab)
    assert st['api_running'] and st['sshd_running'] and st['containers'] == []


def test_up_without_root_says_so_and_changes_nothing():
    """As nobody (a forked child that drops root), `up` names what is missing and makes nothing."""
    import pathlib
    import pwd
    import shutil
    import tempfile
    from gpufleet.lab.host import LabError
    from gpufleet.lab.layout import Lab
    work = pathlib.Path(tempfile.mkdtemp(prefix='labroot', dir='/tmp'))
    os.chmod(str(work), 0o777)  # nobody could make the lab's directories here: nothing must be made
    root, cache, report = work / 'lab', work / 'cache', work / 'report'
    nobody = pwd.getpwnam('nobody')
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            manager.up(Lab(root=str(root), cache=str(cache)), say=lambda m: None)
        except LabError as e:
            with open(str(report), 'w') as fh:
                fh.write(str(e))
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 1
    text = report.read_text()
    assert 'the lab cannot run on this host' in text and 'the lab needs root' in text
    assert not root.exists() and not cache.exists()
    shutil.rmtree(str(work))
