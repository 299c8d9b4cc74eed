# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVIDIA device nodes: their fixed numbers, which a GPU container needs, and what /dev and /proc show of them.

The one home of these facts. Small and standard library only, so that it travels cheaply: the node's modules
(gpu_devices, driver_bundle), the container's verification (torch_verify) and the fleet's plan (lxc_container)
all import it.

Numbers: the NVIDIA frontend is character major 195; /dev/nvidiaN is minor N, nvidiactl 255 and nvidia-modeset
254 (nvidia-modprobe's NV_CTL_DEVICE_MINOR and NV_MODESET_MINOR); nvidia-uvm takes a dynamic major, read from
/proc/devices, with nvidia-uvm minor 0 and nvidia-uvm-tools minor 1.
"""


import errno
import json
import os
import pwd
import re
import stat

FRONTEND_MAJOR = 195
CONTROL_NODES = {'nvidiactl': 255, 'nvidia-modeset': 254}
UVM_NODES = {'nvidia-uvm': 0, 'nvidia-uvm-tools': 1}
# what a GPU container gets besides its /dev/nvidiaN, in the order its devN entries are written
PASSTHROUGH_CONTROL = ('/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools', '/dev/nvidia-modeset')
# Those a container does without where the node lacks them: CUDA needs only nvidiactl and nvidia-uvm, and NVIDIA's
# own container tooling passes these through only where they exist (libnvidia-container src/nvc_info.c
# lookup_devices: a missing nvidia-uvm-tools is a warning, "missing device"). PVE refuses a devN whose node is
# missing, so passing one the node lacks would block the container's create, change and start.
OPTIONAL_CONTROL = ('nvidia-uvm-tools', 'nvidia-modeset')


def passthrough_paths(gpus, present=None, minors=None):
    """The device nodes a container with these GPU indexes needs: its /dev/nvidiaN, then the control nodes (none
    without GPUs); present: the names of the control nodes the node has (None where unknown), without which the
    optional ones are left out; minors: {GPU index: its device minor}, which names its /dev/nvidiaN (the index
    where the minor is not known)."""
    if not gpus:
        return []
    minors = minors or {}
    skipped = set() if present is None else set(OPTIONAL_CONTROL) - set(present)
    return ['/dev/nvidia{0}'.format(minors.get(g, g)) for g in gpus] + [
        p for p in PASSTHROUGH_CONTROL if p[len('/dev/'):] not in skipped]


def numbers(path, majors):
    """(major, minor) of an NVIDIA device node by its path, majors being /proc/devices' {name: major} (for
    nvidia-uvm's dynamic major); (None, None) when it cannot be told."""
    name = path[len('/dev/'):] if path.startswith('/dev/') else path
    if name in UVM_NODES:
        return majors.get('nvidia-uvm'), UVM_NODES[name]
    if name in CONTROL_NODES:
        return FRONTEND_MAJOR, CONTROL_NODES[name]
    index = name[len('nvidia'):]
    if name.startswith('nvidia') and index.isdigit():
        return FRONTEND_MAJOR, int(index)
    return None, None


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


def gpu_indexes(dev_dir='/dev'):
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return []
    return sorted(int(n[6:]) for n in names if re.match(r'^nvidia\d+$', n))
