# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVIDIA device nodes: their fixed numbers, which a GPU container needs, and what /dev and /proc show of them.

The one home of these facts, NVIDIA's part of the GPU vendor seam (_gpu). Small and standard library only, so that
it travels cheaply.

Numbers: the NVIDIA frontend is character major 195; /dev/nvidiaN is minor N, nvidiactl 255 and nvidia-modeset
254 (nvidia-modprobe's NV_CTL_DEVICE_MINOR and NV_MODESET_MINOR); nvidia-uvm takes a dynamic major, read from
/proc/devices, with nvidia-uvm minor 0 and nvidia-uvm-tools minor 1.
"""


import os
import re

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
# those without which CUDA cannot start in a container that has GPUs
REQUIRED_CONTROL = ('nvidiactl', 'nvidia-uvm')
# a GPU's own device node (its minor), and any NVIDIA device node, by path
GPU_NODE = re.compile(r'^/dev/nvidia(\d+)$')
DEVICE_NODE = re.compile(r'^/dev/nvidia')


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


def gpu_indexes(dev_dir='/dev'):
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return []
    return sorted(int(n[6:]) for n in names if re.match(r'^nvidia\d+$', n))


def container_nodes(dev_dir='/dev'):
    """The /dev/nvidia* nodes under dev_dir (not the nvidia-caps directory)."""
    try:
        names = sorted(os.listdir(dev_dir))
    except OSError:
        return []
    return [os.path.join(dev_dir, n) for n in names
            if n.startswith('nvidia') and not os.path.isdir(os.path.join(dev_dir, n))]
