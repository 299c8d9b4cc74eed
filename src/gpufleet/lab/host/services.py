"""The lab's services: the node's sshd, its `pct` and `pvesm`, and the daemon that serves the PVE API."""

import glob
import os
import re
import signal
import subprocess
import sys
import time

from ._util import LabError, _alive, _kill, _pid, _read, _tail, _wait_pidfile, _write, sh


# -- sshd -------------------------------------------------------------------------------
def ensure_sshd(lab):
    """A real sshd on a loopback port that takes the lab's key for root: the node as Ansible reaches it. Each node of
    the cluster has its own (its port, its config and pid file), and names its node to what runs in its sessions
    (GPUFLEET_LAB_NODE: the lab's `pct` there sees that node's containers)."""
    d = lab.ssh_dir
    os.makedirs(d, mode=0o700, exist_ok=True)
    os.makedirs(lab.sshd_dir, mode=0o700, exist_ok=True)
    host_key = os.path.join(d, 'ssh_host_ed25519_key')
    client_key = os.path.join(d, 'id_ed25519')
    for key in (host_key, client_key):
        if not os.path.exists(key):
            sh(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-C', 'gpufleet-lab', '-f', key])
    with open(client_key + '.pub') as fh:
        _write(os.path.join(d, 'authorized_keys'), fh.read().encode(), 0o600)
    with open(host_key + '.pub') as fh:
        host_pub = fh.read().split()
    known = ''.join('[127.0.0.1]:{0} {1} {2}\n'.format(node['ssh_port'], host_pub[0], host_pub[1])
                    for node in lab.node_specs())
    _write(os.path.join(d, 'known_hosts'), known.encode(), 0o644)
    pidfile = os.path.join(lab.sshd_dir, 'sshd.pid')
    config = '\n'.join([
        'ListenAddress 127.0.0.1:{0}'.format(lab.ssh_port),
        'HostKey ' + host_key,
        'PidFile ' + pidfile,
        'AuthorizedKeysFile ' + os.path.join(d, 'authorized_keys'),
        'PermitRootLogin prohibit-password',
        'PasswordAuthentication no',
        'KbdInteractiveAuthentication no',
        'UsePAM no',
        # OpenSSH's defaults, as a Proxmox node has them (sshd_config(5): MaxSessions 10, MaxStartups 10:30:100)
        'MaxSessions 10',
        'MaxStartups 10:30:100',
        'AcceptEnv LANG LC_*',
        'SetEnv GPUFLEET_LAB_NODE={0}'.format(lab.node),
        'Subsystem sftp /usr/lib/openssh/sftp-server',
    ]) + '\n'
    conf = os.path.join(lab.sshd_dir, 'sshd_config')
    before = _read(conf) if os.path.exists(conf) else None
    _write(conf, config.encode(), 0o600)
    if _alive(pidfile):
        if before != config:  # a lab made with other settings: sshd reads its config again on SIGHUP
            os.kill(_pid(pidfile), signal.SIGHUP)
            time.sleep(0.3)
            for _ in range(100):  # it re-executes itself under the same pid; wait until it listens again
                if subprocess.run(['ss', '-Hltn', 'sport = :{0}'.format(lab.ssh_port)], stdout=subprocess.PIPE,
                                  text=True).stdout.strip():
                    break
                time.sleep(0.05)
        return
    os.makedirs('/run/sshd', mode=0o755, exist_ok=True)
    sh(['/usr/sbin/sshd', '-f', conf])
    _wait_pidfile(pidfile)


def stop_sshd(lab, sessions=False):
    """Stop the node's sshd; sessions: its open connections too, as a node that goes down takes them with it (a
    client's multiplexed connection, Ansible's ControlPersist, would otherwise outlive it): every process that holds
    a connection to the node's port."""
    pidfile = os.path.join(lab.sshd_dir, 'sshd.pid')
    _kill(pidfile)
    if sessions:
        held = subprocess.run(['ss', '-Htnp', 'state', 'established', '( sport = :{0} )'.format(lab.ssh_port)],
                              stdout=subprocess.PIPE, text=True, check=False).stdout
        for pid in set(int(p) for p in re.findall(r'pid=(\d+)', held)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


# -- pct and pvesm ------------------------------------------------------------------------
def ensure_commands(lab, record):
    """`pct` and `pvesm` on the node's PATH, each running the lab's implementation with this Python."""
    for name, link in (('pct', lab.pct_link), ('pvesm', lab.pvesm_link)):
        text = '#!/bin/sh\n# gpufleet lab: {0} for the lab node\nexec {1} -m gpufleet.lab.{0} "$@"\n'.format(
            name, sys.executable)
        if os.path.exists(link) and _read(link) != text and name not in record:
            raise LabError('{0} exists and is not the lab\'s: is this a real Proxmox node?'.format(link))
        _write(link, text.encode(), 0o755)
        record[name] = link


def remove_commands(record):
    for name in ('pct', 'pvesm'):
        path = record.get(name)
        if path and os.path.exists(path) and 'gpufleet lab' in _read(path):
            os.unlink(path)


# -- the API daemon -----------------------------------------------------------------------
def code_version():
    """A hash of the lab's own code (every .py of the gpufleet.lab package): a daemon running older code is
    restarted by `up`."""
    import hashlib
    lab_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for root, dirs, files in os.walk(lab_dir):
        dirs[:] = sorted(d for d in dirs if d != '__pycache__')
        for name in sorted(files):
            if name.endswith('.py'):
                path = os.path.join(root, name)
                with open(path, 'rb') as fh:
                    h.update(os.path.relpath(path, lab_dir).encode() + fh.read())
    return h.hexdigest()[:16]


def daemon_version(lab):
    """What the running daemon must have been started with: the lab's code, the cluster's nodes (it serves
    the nodes it found at its start) and the API's certificate (it loads it at its start)."""
    import hashlib
    import json
    try:
        with open(os.path.join(lab.tls_dir, 'server.pem'), 'rb') as fh:
            cert = hashlib.sha256(fh.read()).hexdigest()[:16]
    except OSError:
        cert = None
    return '{0} {1} {2}'.format(code_version(), json.dumps(lab.node_specs(), sort_keys=True), cert)


def start_daemon(lab):
    version_file = lab.path('run', 'pve.version')
    if _alive(lab.daemon_pid):
        if _read(version_file) == daemon_version(lab):
            return False
        stop_daemon(lab)
    os.makedirs(os.path.dirname(lab.daemon_pid), exist_ok=True)
    os.makedirs(os.path.dirname(lab.daemon_log), exist_ok=True)
    env = dict(os.environ, GPUFLEET_LAB_DIR=lab.root, GPUFLEET_LAB_CACHE=lab.cache, PYTHONUNBUFFERED='1')
    # Fork twice so that the daemon is nobody's child: it outlives this process and is reaped by init.
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            with open(lab.daemon_log, 'ab') as log:
                proc = subprocess.Popen([sys.executable, '-m', 'gpufleet.lab.daemon'], stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT, env=env, close_fds=True)
            with open(lab.daemon_pid, 'w') as fh:
                fh.write(str(proc.pid))
            with open(version_file, 'w') as fh:
                fh.write(daemon_version(lab))
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    return True


def wait_api(lab, timeout=30):
    import socket
    import ssl
    ctx = ssl.create_default_context(cafile=lab.ca_file)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((lab.api_host, lab.api_port), timeout=1) as raw:
                with ctx.wrap_socket(raw, server_hostname=lab.api_host):
                    return
        except (OSError, ssl.SSLError):
            if not _alive(lab.daemon_pid):
                raise LabError('the lab API did not start; its log:\n' + _tail(lab.daemon_log))
            if time.monotonic() > deadline:
                raise LabError('the lab API did not answer within {0} s; its log:\n{1}'.format(
                    timeout, _tail(lab.daemon_log)))
            time.sleep(0.1)


def stop_daemon(lab):
    _kill(lab.daemon_pid)


def daemon_running(lab):
    return _alive(lab.daemon_pid)


def sshd_running(lab):
    return _alive(os.path.join(lab.sshd_dir, 'sshd.pid'))


# -- cgroups LXC leaves behind ---------------------------------------------------------------
def remove_lxc_cgroups():
    """Empty `lxc.*` cgroups the lab's containers leave in every controller (cgroup v1 and v2)."""
    for path in sorted(glob.glob('/sys/fs/cgroup/*/lxc.*') + glob.glob('/sys/fs/cgroup/lxc.*'),
                       key=len, reverse=True):
        for sub in sorted((p for p, _, _ in os.walk(path)), key=len, reverse=True):
            try:
                os.rmdir(sub)
            except OSError:
                pass
