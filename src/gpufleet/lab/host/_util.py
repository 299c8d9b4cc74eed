"""What the lab's host pieces share: running commands, files written only when they differ, pid files."""

import os
import re
import signal
import stat
import subprocess
import time


class LabError(Exception):
    """The lab cannot be brought up here; the message says why and what to do."""


def sh(argv, check=True, **kwargs):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    if check and proc.returncode != 0:
        raise LabError('{0} failed ({1}):\n{2}'.format(' '.join(argv), proc.returncode,
                                                       (proc.stderr or proc.stdout).strip()[-2000:]))
    return proc


def version_key(release):
    """A kernel or driver version as a sortable key (6.1.0-9 before 6.1.0-10)."""
    return [int(p) if p.isdigit() else p for p in re.split(r'(\d+)', release)]


# -- small helpers ----------------------------------------------------------------------
def _read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ''


def _tail(path, n=20):
    return '\n'.join(_read(path).splitlines()[-n:])


def _write(path, data, mode):
    """path holding data with mode, replaced in one rename; left as it is (its mtime too) when it holds them already,
    as a real node's driver files stay put while nothing upgrades them (a driver bundle is current by mtime)."""
    try:
        st = os.stat(path)
        if stat.S_IMODE(st.st_mode) == mode and st.st_size == len(data):
            with open(path, 'rb') as fh:
                if fh.read() == data:
                    return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with os.fdopen(os.open(path + '.tmp', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), 'wb') as fh:
        fh.write(data)
    os.chmod(path + '.tmp', mode)
    os.replace(path + '.tmp', path)


def _pid(pidfile):
    try:
        return int(_read(pidfile).strip())
    except ValueError:
        return None


def _alive(pidfile):
    pid = _pid(pidfile)
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open('/proc/{0}/stat'.format(pid)) as fh:
            return fh.read().split(') ')[-1][0] != 'Z'
    except OSError:
        return False


def _wait_pidfile(pidfile, timeout=10):
    deadline = time.monotonic() + timeout
    while not _alive(pidfile):
        if time.monotonic() > deadline:
            raise LabError('{0} did not appear'.format(pidfile))
        time.sleep(0.05)


def _kill(pidfile, timeout=15):
    pid = _pid(pidfile)
    if pid and _alive(pidfile):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pidfile) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pidfile):
            os.kill(pid, signal.SIGKILL)
    if os.path.exists(pidfile):
        os.unlink(pidfile)
