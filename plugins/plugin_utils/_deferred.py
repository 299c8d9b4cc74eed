# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Module calls deferred to the container's node, so that a node runs all its containers' calls in one connection.

A module task of a container reached with the pct connection is made as Ansible makes it (ActionBase's
_execute_module: the command line with the module's interpreter, the environment, become), up to the point where the
command would run: there the command is recorded instead, its input the call as a plugin_utils _direct program
(record). The container's node runs the recorded
commands with pct exec, a few at a time, in one call (the pct_batch action and module). Each container then takes its
command's exit code and output through the same _execute_module, answered from the node's run instead of running
(replay): the result is parsed, and a container that could not be reached fails, exactly as they would have been.

This pays where the calls only read (check runs): each container costs a pct exec on its node, not a connection and a
task's round trip from the controller."""


import json
import os
import tempfile

from ansible import constants as C
from ansible.module_utils.common.text.converters import to_bytes, to_text

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _pct
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _direct

TRANSPORT = 'gpufleet.proxmox.pct'
# What the recorded call answers (the deferral itself is the task's result).
_RECORDED = b'{"changed": false}'


def can_defer(action):
    """Whether this task's module call can be deferred to the node: a container reached with the pct connection
    through SSH (not the node itself), the module pipelined, not async, and the direct path supported here."""
    conn = action._connection
    return (_direct.supported() and getattr(conn, 'transport', None) == TRANSPORT and not conn.get_option('local')
            and conn.is_pipelining_enabled(False) and not action._task.async_val)


def record(action, module, args, task_vars, program):
    """The deferral of module(args) in this task's container: the node it runs on (the container's gpufleet_node),
    its vmid, and a private file on the controller holding the call (call_of: the node's argv that runs it, pct exec
    <vmid> -- ..., and its input). The call is the module's as Ansible makes it (its interpreter, environment and
    become), and its input program (plugin_utils _direct's script of the same call)."""
    made = {}
    conn = action._connection

    def keep(cmd, in_data, sudoable):
        made['argv'] = _pct.exec_argv(conn.get_option('pct_executable'), conn.vmid(), conn.container_argv(cmd))
        made['stdin'] = to_bytes(program)
        return 0, _RECORDED, b''

    _direct.through(action, keep, module, args, task_vars)
    # the command line carries the task's environment (a proxy's credentials, say): it stays in a private file on
    # the controller, out of the task's result
    fd, path = tempfile.mkstemp(prefix='gpufleet-deferred-', dir=C.DEFAULT_LOCAL_TMP)
    with os.fdopen(fd, 'w') as fh:
        json.dump({'argv': made['argv'], 'stdin': to_text(made['stdin'], errors='surrogate_or_strict')}, fh)
    return {'module': module, 'args': args, 'node': task_vars.get('gpufleet_node'), 'vmid': conn.vmid(),
            'call': path}


def call_of(deferral):
    """A deferred call as its node runs it: {argv, stdin} (the node's argv, the module's payload)."""
    with open(deferral['call']) as fh:
        return json.load(fh)


def replay(action, deferral, ran, task_vars):
    """The result of a deferred call from what its node's run gave (ran: rc, stdout, stderr), parsed as Ansible
    parses a module's output; a container the node could not run it in raises the pct connection's error. Without
    ran (its node did not run it: the node play was limited away or failed), the call runs now over the task's own
    connection."""
    if not ran:
        return action._execute_module(module_name=deferral['module'], module_args=dict(deferral['args']),
                                      task_vars=task_vars)

    def answer(cmd, in_data, sudoable):
        out, err = to_bytes(ran.get('stdout') or ''), to_bytes(ran.get('stderr') or '')
        action._connection.check(ran['rc'], err)
        return ran['rc'], out, err

    return _direct.through(action, answer, deferral['module'], deferral['args'], task_vars)
