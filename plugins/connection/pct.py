# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
name: pct
short_description: Run tasks in a Proxmox VE container through pct exec on its node
version_added: 0.1.0
description:
  - Runs each command in an LXC container with C(pct exec <vmid> --) on the Proxmox node that hosts it.
  - The node is reached with OpenSSH, multiplexed with ControlPersist, so a play keeps one connection per node
    (ssh opens a connection of its own for a session the shared one cannot carry, past the node's C(MaxSessions));
    or directly when the controller is the node (O(local)).
  - Where the node's sshd turns a connection or a session away before the command starts (C(MaxStartups),
    C(MaxSessions)), or lxc-attach fails before it enters the container (its re-execution from a sealed memfd
    can fail for a moment with EBUSY, C(Failed to rexec as memfd)), the command is tried again, O(retries) times
    with a growing pause.
  - Files are copied both ways through the same channel (no temporary file on the node); pipelining is
    supported; C(become) works inside the container (pct exec runs as the container's root).
author:
  - gpufleet maintainers (@gpufleet)
options:
  vmid:
    description: The container's id. Defaults to the host's address (C(ansible_host)) when that is a number.
    type: int
    vars:
      - name: ansible_pct_vmid
  node:
    description: The address of the node the container runs on (not needed with O(local)).
    type: str
    vars:
      - name: ansible_pct_node
  node_user:
    description: The user to log in to the node as (it must be allowed to run pct).
    type: str
    default: root
    vars:
      - name: ansible_pct_node_user
  node_port:
    description: The node's SSH port.
    type: int
    default: 22
    vars:
      - name: ansible_pct_node_port
  private_key_file:
    description: The key to log in to the node with.
    type: path
    vars:
      - name: ansible_pct_private_key_file
  ssh_args:
    description: More arguments for ssh to the node (known hosts file, jump host, ...).
    type: str
    default: ''
    vars:
      - name: ansible_pct_ssh_args
  ssh_executable:
    description: The ssh client.
    type: str
    default: ssh
    vars:
      - name: ansible_pct_ssh_executable
  control_persist:
    description: How long an idle connection to a node is kept open for the next task (OpenSSH ControlPersist).
    type: str
    default: 60s
    vars:
      - name: ansible_pct_control_persist
  control_path_dir:
    description: Where the multiplexing sockets live.
    type: path
    default: ~/.ansible/cp
    vars:
      - name: ansible_pct_control_path_dir
  pct_executable:
    description: The pct command on the node.
    type: str
    default: pct
    vars:
      - name: ansible_pct_executable
  local:
    description: The controller is the node itself; run pct without SSH.
    type: bool
    default: false
    vars:
      - name: ansible_pct_local
  timeout:
    description: Seconds to wait for the SSH connection to the node.
    type: int
    default: 30
    vars:
      - name: ansible_pct_timeout
  retries:
    description: How often a command that was turned away before it started (by the node's sshd, or by
      lxc-attach before it entered the container) is tried again.
    type: int
    default: 6
    vars:
      - name: ansible_pct_retries
'''

EXAMPLES = r'''
# In an inventory: containers reached through their node.
# train-0:
#   ansible_connection: gpufleet.proxmox.pct
#   ansible_pct_vmid: 200
#   ansible_pct_node: gpu01.example.com
'''

import hashlib
import os
import random
import shlex
import subprocess
import time

from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _pct

display = Display()

# What ssh says when the node's sshd turned it away before the command started, so that trying again is safe:
# a connection dropped while it was being set up (sshd's MaxStartups, 10:30:100 by default, drops new connections
# at random past 10 unauthenticated ones: "kex_exchange_identification: Connection closed by remote host" or
# "... read: Connection reset by peer"), a session refused on a shared connection (MaxSessions: "Session open
# refused by peer", where ssh does not open its own connection instead).
TURNED_AWAY = ('kex_exchange_identification', 'Session open refused by peer')


def remote_path(path):
    """Paths Ansible gives with ~ are root's (pct exec runs as the container's root)."""
    if path == '~' or path.startswith('~/'):
        return '/root' + path[1:]
    return path


class Connection(ConnectionBase):
    transport = 'gpufleet.proxmox.pct'
    has_pipelining = True

    def __init__(self, *args, **kwargs):
        super(Connection, self).__init__(*args, **kwargs)
        self._connected = False

    # -- plumbing ------------------------------------------------------------------
    def vmid(self):
        vmid = self.get_option('vmid')
        if vmid is None:
            addr = self._play_context.remote_addr
            if addr is None or not str(addr).isdigit():
                raise AnsibleError('pct connection: no vmid for {0}: set ansible_pct_vmid'.format(addr))
            vmid = int(addr)
        return int(vmid)

    def _where(self):
        return 'local node' if self.get_option('local') else 'node {0}'.format(self.get_option('node'))

    def _ssh_argv(self):
        node = self.get_option('node')
        if not node:
            raise AnsibleError('pct connection: set ansible_pct_node (the node of CT {0}) or ansible_pct_local'.format(
                self.vmid()))
        cp_dir = os.path.expanduser(self.get_option('control_path_dir'))
        if not os.path.isdir(cp_dir):
            os.makedirs(cp_dir, 0o700)
        argv = [self.get_option('ssh_executable'), '-o', 'BatchMode=yes',
                '-o', 'ConnectTimeout={0}'.format(self.get_option('timeout')),
                '-o', 'ControlMaster=auto', '-o', 'ControlPersist={0}'.format(self.get_option('control_persist')),
                '-o', 'ControlPath={0}'.format(os.path.join(cp_dir, self._control_name(node))),
                '-p', str(self.get_option('node_port')), '-l', self.get_option('node_user')]
        if self.get_option('private_key_file'):
            argv += ['-i', os.path.expanduser(self.get_option('private_key_file'))]
        argv += shlex.split(self.get_option('ssh_args') or '')
        return argv + [node]

    def _control_name(self, node):
        """The socket's name for one login on one node: short, since a socket path has at most 107 bytes (ssh's %C
        alone is 40 characters, too many under a deep control_path_dir)."""
        login = '{0}@{1}:{2}'.format(self.get_option('node_user'), node, self.get_option('node_port'))
        return 'pct-' + hashlib.sha1(login.encode('utf-8')).hexdigest()[:12]

    def _argv(self, container_argv):
        """The local argv that runs container_argv in the container."""
        pct = _pct.exec_argv(self.get_option('pct_executable'), self.vmid(), container_argv)
        if self.get_option('local'):
            return pct
        return self._ssh_argv() + ['--', ' '.join(shlex.quote(a) for a in pct)]

    def _run(self, container_argv, stdin=None, stdout=subprocess.PIPE):
        argv = self._argv(container_argv)
        display.vvv('PCT EXEC {0}'.format(' '.join(shlex.quote(a) for a in argv)), host=self._play_context.remote_addr)
        retries = max(0, self.get_option('retries'))
        for attempt in range(retries + 1):
            for stream in (stdin, stdout):
                if hasattr(stream, 'seek'):  # a file given or taken whole: from its start again
                    stream.seek(0)
                    if stream is stdout:
                        stream.truncate()
            try:
                proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE,
                                        stdin=subprocess.PIPE if isinstance(stdin, bytes) or stdin is None else stdin)
            except OSError as e:
                raise AnsibleConnectionFailure('pct connection: cannot run {0}: {1}'.format(argv[0], e))
            out, err = proc.communicate(stdin if isinstance(stdin, bytes) else None)
            said = to_text(err, errors='replace').strip()
            turned_away = proc.returncode == 255 and not self.get_option('local') and any(m in said for m in TURNED_AWAY)
            not_started = _pct.not_started(proc.returncode, out, said)
            if not (turned_away or not_started) or attempt == retries:
                break
            pause = _pct.retry_pause(attempt, random.random())
            display.vvv('PCT: {0} turned the command away ({1}); again in {2:.1f} s'.format(self._where(), said, pause),
                        host=self._play_context.remote_addr)
            time.sleep(pause)
        if not_started:
            raise AnsibleConnectionFailure('pct exec of CT {0} on {1} failed before the command started, {2} times: '
                                           '{3}'.format(self.vmid(), self._where(), retries + 1, said))
        if turned_away:
            raise AnsibleConnectionFailure(
                '{0} turned CT {1}\'s command away {2} times: {3} (its sshd\'s MaxStartups or MaxSessions; fewer forks, '
                'or more ansible_pct_retries)'.format(self._where(), self.vmid(), retries + 1, said))
        self.check(proc.returncode, err)
        return proc.returncode, out or b'', err

    def container_argv(self, cmd):
        """What runs a command line of Ansible's in the container (after pct exec <vmid> --)."""
        return _pct.shell_argv(to_text(cmd, errors='surrogate_or_strict'))

    def check(self, rc, err):
        """Turn the node's or pct's own failures into connection errors that say what is wrong."""
        text = to_text(err, errors='surrogate_or_strict')
        vmid = self.vmid()
        # pve-container src/PVE/CLI/pct.pm exec: die "container '$vmid' not running!"
        if "container '{0}' not running!".format(vmid) in text:
            raise AnsibleConnectionFailure('CT {0} on {1} is not running: start it first'.format(vmid, self._where()))
        if "lxc/{0}.conf' does not exist".format(vmid) in text:
            raise AnsibleConnectionFailure('there is no CT {0} on {1}'.format(vmid, self._where()))
        if rc == 255 and not self.get_option('local'):
            # 255 is ssh's own failure, or the command's exit code: ask the node once more to tell which.
            probe = subprocess.run(self._ssh_argv() + ['--', 'true'], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
            if probe.returncode != 0:
                raise AnsibleConnectionFailure('cannot reach {0} over SSH to run CT {1}\'s command: {2}'.format(
                    self._where(), vmid, to_text(probe.stderr or err).strip()))
        if rc == 127 and ('pct: not found' in text or 'pct: command not found' in text):
            raise AnsibleConnectionFailure('{0} has no pct: is it a Proxmox node?'.format(self._where()))

    # -- the connection API -------------------------------------------------------------
    def _connect(self):
        self._connected = True
        return self

    def exec_command(self, cmd, in_data=None, sudoable=True):
        super(Connection, self).exec_command(cmd, in_data=in_data, sudoable=sudoable)
        rc, out, err = self._run(self.container_argv(cmd), stdin=to_bytes(in_data) if in_data is not None else b'')
        return rc, out, err

    def put_file(self, in_path, out_path):
        super(Connection, self).put_file(in_path, out_path)
        display.vvv('PUT {0} TO {1}'.format(in_path, out_path), host=self._play_context.remote_addr)
        if not os.path.exists(to_bytes(in_path, errors='surrogate_or_strict')):
            raise AnsibleFileNotFound('file or module does not exist: {0}'.format(in_path))
        with open(to_bytes(in_path, errors='surrogate_or_strict'), 'rb') as fh:
            rc, out, err = self._run(['/bin/sh', '-c', 'cat > "$1"', 'sh', remote_path(out_path)], stdin=fh)
        if rc != 0:
            raise AnsibleError('failed to put {0} into CT {1} at {2}: {3}'.format(
                in_path, self.vmid(), out_path, to_text(err).strip()))

    def fetch_file(self, in_path, out_path):
        super(Connection, self).fetch_file(in_path, out_path)
        display.vvv('FETCH {0} TO {1}'.format(in_path, out_path), host=self._play_context.remote_addr)
        tmp = '{0}.pct-fetch'.format(out_path)
        with open(to_bytes(tmp, errors='surrogate_or_strict'), 'wb') as fh:
            try:
                rc, out, err = self._run(['cat', '--', remote_path(in_path)], stdin=b'', stdout=fh)
            except Exception:
                os.unlink(tmp)
                raise
        if rc != 0:
            os.unlink(tmp)
            raise AnsibleError('failed to fetch {0} from CT {1}: {2}'.format(
                in_path, self.vmid(), to_text(err).strip()))
        os.rename(tmp, out_path)

    def close(self):
        self._connected = False
