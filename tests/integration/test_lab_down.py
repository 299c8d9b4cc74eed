"""`gpufleet lab down` leaves nothing behind; `up` afterwards brings the lab back."""

import glob
import os
import subprocess
import time

import pytest
from gpufleet.lab import manager

pytestmark = [pytest.mark.lab, pytest.mark.last]


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
    assert not os.path.exists(lab.pct_link)
    for pid in pids:
        assert not running(pid), 'process {0} still running'.format(pid)
    with open('/proc/self/mountinfo') as fh:
        assert lab.root not in fh.read()
    assert not glob.glob('/sys/fs/cgroup/*/lxc.payload.*') and not glob.glob('/sys/fs/cgroup/*/lxc.monitor.*')
    assert 'veth951i0' not in os.listdir('/sys/class/net')
    started = time.monotonic()
    manager.up(lab, say=lambda m: None)
    assert time.monotonic() - started < 30
    assert manager.status(lab)['containers'] == []
