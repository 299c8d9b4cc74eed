# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a command runs in a container with pct exec on its node: the argv, and which failures happened before the
command started (so that running it again is safe). The pct connection plugin (on the controller) and the pct_batch
module (on the node) both run commands this way; run_calls is the pct_batch module's work (standard library only:
it also runs as a plugin_utils _direct program)."""

import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

# pct exec runs commands as the container's root with a cleared environment: give them root's.
ROOT_ENV = ['/usr/bin/env', 'HOME=/root', 'USER=root', 'LOGNAME=root', 'SHELL=/bin/sh']
# lxc-attach re-executes itself from a sealed memfd before it attaches (lxc src/lxc/rexec.c); sealing can fail for a
# moment with EBUSY while the copy's pages are still referenced. Nothing ran in the container then.
NOT_STARTED = ('Failed to rexec as memfd',)


def shell_argv(cmd):
    """The argv that runs a shell command line in a container, as root with root's environment."""
    return ROOT_ENV + ['/bin/sh', '-c', cmd]


def exec_argv(pct, vmid, argv):
    """The node's argv that runs argv in container vmid."""
    return [pct, 'exec', str(vmid), '--'] + list(argv)


def not_started(rc, out, said):
    """Whether a pct exec that exited rc, printed out and said (stderr, text) failed before its command started."""
    return rc != 0 and not out and any(m in said for m in NOT_STARTED)


def retry_pause(attempt, jitter):
    """Seconds to wait before try attempt + 1 (jitter: a number in [0, 1)): growing, at most 8 s."""
    return min(8.0, 0.25 * 2 ** attempt) * (0.5 + jitter)


def _run_one(call, retries, run, pause):
    for attempt in range(retries + 1):
        proc = run(call['argv'], input=call['stdin'].encode('utf-8', 'surrogateescape'), stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, check=False)
        said = proc.stderr.decode('utf-8', 'replace')
        if not not_started(proc.returncode, proc.stdout, said) or attempt == retries:
            break
        pause(retry_pause(attempt, random.random()))
    return {'rc': proc.returncode, 'stdout': proc.stdout.decode('utf-8', 'surrogateescape'), 'stderr': said}


def run_calls(params, check=False, run=subprocess.run, pause=time.sleep):
    """The pct_batch module's work (on the node): each of params' calls ({host, argv, stdin}) run, forks at a time,
    a pct exec that failed before its command started run again (retries times); {runs: {host: {rc, stdout,
    stderr}}}, or failed with the reason. The calls carry their own check mode."""
    calls, retries = params.get('calls') or [], max(0, params.get('retries', 6))
    for i, call in enumerate(calls):
        if not isinstance(call.get('argv'), list) or not call.get('host'):
            return {'failed': True, 'msg': 'pct_batch: calls[{0}] needs host and argv'.format(i)}
    try:
        with ThreadPoolExecutor(max_workers=max(1, params.get('forks', 8))) as pool:
            done = list(pool.map(lambda call: _run_one(call, retries, run, pause), calls))
    except OSError as e:
        return {'failed': True, 'msg': 'pct_batch: cannot run pct exec: {0}'.format(e)}
    return {'changed': False, 'runs': dict((call['host'], ran) for call, ran in zip(calls, done))}
