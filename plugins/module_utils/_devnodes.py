# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Character device nodes, whoever makes them: the majors /proc/devices lists, a node's numbers and mode, and what
opening one gives (as this process, or as a user of the system). Standard library only; no GPU vendor's knowledge
(that is _gpu's and its vendors').
"""


import errno
import json
import os
import pwd
import stat


def char_majors(proc_root='/proc'):
    """{name: major} of the character devices /proc/devices lists."""
    out = {}
    try:
        with open(os.path.join(proc_root, 'devices')) as fh:
            for line in fh:
                if line.startswith('Block'):
                    break
                parts = line.split()
                if len(parts) == 2 and parts[0].isdigit():
                    out[parts[1]] = int(parts[0])
    except (IOError, OSError):
        pass
    return out


def node_info(path):
    """{path, major, minor, mode} of a character node, or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return {'path': path, 'major': os.major(st.st_rdev), 'minor': os.minor(st.st_rdev),
            'mode': '{0:04o}'.format(stat.S_IMODE(st.st_mode))}


def probe_open(path):
    """What opening a device node gives: ok, EPERM/EACCES (cgroup or permissions), ENXIO/ENODEV (no driver
    behind it), ENOENT (no node)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    os.close(fd)
    return 'ok'


def probe_open_as(paths, user):
    """{path: probe_open(path)} as a user of this system (a name or a uid), in a child process that takes that
    user's uid, gid and groups: what a training job run by that user gets. KeyError where there is no such user."""
    entry = pwd.getpwuid(int(user)) if str(user).isdigit() else pwd.getpwnam(str(user))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the user, open each node, say what happened, and leave
        code = 1
        try:
            os.close(read)
            os.initgroups(entry.pw_name, entry.pw_gid)
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            with os.fdopen(write, 'w') as fh:
                json.dump(dict((p, probe_open(p)) for p in paths), fh)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as fh:
        text = fh.read()
    os.waitpid(pid, 0)
    if not text:
        raise OSError('could not take the identity of user {0}'.format(user))
    return json.loads(text)
