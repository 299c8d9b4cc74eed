# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Venv profiles on the controller: where a profile is, the Pythons its lock is for, the Python each PVE template
brings, and the oldest NVIDIA driver that runs every CUDA wheel of its lock (its driver floor), so that a container
whose Python no lock covers, or whose node's driver is below its profile's floor, is refused before anything changes
(the fleet plan, the doctor, the driver upgrade) rather than found by its build or its first CUDA call."""

import os
import re

import yaml

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _gpu

FILES = ('profile.yml', 'requirements.lock')

# The oldest Linux driver that runs a CUDA major's runtime, any minor of it: NVIDIA's CUDA Compatibility guide
# (docs.nvidia.com/deploy/cuda-compatibility, minor version compatibility: "CUDA 12.x: >= 525", "CUDA 13.x: >= 580")
# and the CUDA Toolkit release notes' table of the minimum driver for minor version compatibility (11.x 450.80.02,
# 12.x 525.60.13, 13.x 580.65.06, the 13.0 GA driver). cuDNN 9 for CUDA 13 asks the same 580.65.06 (its support
# matrix). A wheel built for CUDA 13 (cuDNN, NCCL, cuSPARSELt, NVSHMEM -cu13, torch +cu130) loads libcuda.so.1 and
# fails at its first CUDA call below that ("CUDA driver version is insufficient for CUDA runtime version").
CUDA_MIN_DRIVER = {'11': '450.80.02', '12': '525.60.13', '13': '580.65.06'}
# A lock's pins (name==version), as uv pip compile writes them.
PIN = re.compile(r'^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)', re.M)
# NVIDIA's CUDA 13 component wheels carry no -cuNN suffix; those versioned as CUDA itself (the runtime, NVRTC,
# nvJitLink, CUPTI, NVTX, cuBLAS, and the cuda-toolkit metapackage) say its major in their version's first number.
CUDA_VERSIONED = ('nvidia-cuda-runtime', 'nvidia-cuda-nvrtc', 'nvidia-nvjitlink', 'nvidia-cuda-cupti', 'nvidia-nvtx',
                  'nvidia-cublas', 'cuda-toolkit')
# The collection's own profiles (roles/torch_venv/files/profiles), beside this file in an installed collection too.
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'roles',
                       'torch_venv', 'files', 'profiles')

# The python3 of PVE's system templates, by the name pveam gives them (proxmox/dab-pve-appliances: each template
# is its Debian or Ubuntu release's standard system; python3 is the release's python3-defaults).
TEMPLATE_PYTHONS = (
    (re.compile(r'^debian-11-standard_'), '3.9'),
    (re.compile(r'^debian-12-standard_'), '3.11'),
    (re.compile(r'^debian-13-standard_'), '3.13'),
    (re.compile(r'^ubuntu-22\.04-standard_'), '3.10'),
    (re.compile(r'^ubuntu-24\.04-standard_'), '3.12'),
    (re.compile(r'^ubuntu-25\.04-standard_'), '3.13'),
)


def template_python(volid):
    """The Python (X.Y) a PVE template brings, from its volume id (local:vztmpl/debian-13-standard_13.1-2_amd64...),
    or None for a template this table does not know."""
    name = str(volid or '').rsplit('/', 1)[-1]
    return next((python for pattern, python in TEMPLATE_PYTHONS if pattern.match(name)), None)


def pythons(meta):
    """The Pythons (X.Y) a profile's lock is for: profile.yml's python, one version or a list of them."""
    given = (meta or {}).get('python')
    listed = [given] if isinstance(given, (str, int, float)) else list(given or [])
    return [str(v) for v in listed]


def directory(profile, profiles_dir=''):
    """A profile's directory: profile itself where it is a path, else the shipped (or profiles_dir's) one of that
    name."""
    profile = str(profile)
    return profile if '/' in profile else os.path.join(profiles_dir or SHIPPED, profile)


def read_meta(path):
    """A profile directory's profile.yml (a dict); raises ValueError where it is missing or not a mapping."""
    try:
        with open(os.path.join(path, 'profile.yml'), 'rb') as fh:
            meta = yaml.safe_load(fh) or {}
    except (IOError, OSError) as e:
        raise ValueError('{0} is not a venv profile: {1}'.format(path, e))
    if not isinstance(meta, dict):
        raise ValueError('{0}/profile.yml is not a mapping'.format(path))
    return meta


def read_lock(path):
    """A profile directory's lock, as text ('' where it has none yet: the venv build names what is missing)."""
    try:
        with open(os.path.join(path, 'requirements.lock'), 'rb') as fh:
            return fh.read().decode('utf-8', 'replace')
    except (IOError, OSError):
        return ''


def relock_fix(profile, python, path):
    """What makes a profile's lock cover one more Python."""
    return 'add "{0}" to python in {1}/profile.yml, then: gpufleet profile lock {1}'.format(python, path)


def lock_cudas(lock):
    """Each pin of a lock built for a CUDA version, as (pin, CUDA major, why): torch's local version (+cu128: 12,
    +cu130: 13), an NVIDIA wheel's -cuNN suffix (nvidia-cudnn-cu13: 13), a CUDA-versioned component wheel's major
    (nvidia-cuda-runtime 13.0.96: 13)."""
    out = []
    for name, version in PIN.findall(lock or ''):
        low, pin = name.lower().replace('_', '-'), '{0}=={1}'.format(name, version)
        local = re.search(r'\+cu(\d+)(\d)$', version)
        suffix = re.search(r'-cu(\d+)$', low)
        if low == 'torch' and local:
            out.append((pin, local.group(1), "is torch's build for CUDA {0}.{1}".format(local.group(1), local.group(2))))
        elif low.startswith('nvidia-') and suffix:
            out.append((pin, suffix.group(1), 'is built for CUDA {0}'.format(suffix.group(1))))
        elif low in CUDA_VERSIONED and re.match(r'^\d+\.', version):
            major = version.split('.', 1)[0]
            out.append((pin, major, 'is a component of CUDA {0}'.format(major)))
    return out


def driver_floor(lock):
    """The oldest NVIDIA driver that runs every CUDA wheel of a lock (its text): {driver, cuda (the major that sets
    it), wheel (the pin that names it, a -cuNN wheel first), wheels (every pin of that major), why}, or None for a
    lock without CUDA (a CPU torch). ValueError naming the wheel for a CUDA major CUDA_MIN_DRIVER does not know."""
    found = lock_cudas(lock)
    unknown = [(pin, major) for pin, major, _why in found if major not in CUDA_MIN_DRIVER]
    if unknown:
        raise ValueError('{0} is built for CUDA {1}, whose oldest driver gpufleet does not know (it knows CUDA {2})'
                         .format(unknown[0][0], unknown[0][1], ', '.join(sorted(CUDA_MIN_DRIVER, key=int))))
    if not found:
        return None
    top = max((major for _pin, major, _why in found), key=int)
    mine = [(pin, why) for pin, major, why in found if major == top]
    first = sorted(mine, key=lambda pw: (not re.search(r'-cu\d+==', pw[0]), pw[0]))[0]
    return {'driver': CUDA_MIN_DRIVER[top], 'cuda': top, 'wheel': first[0], 'wheels': sorted(p for p, _w in mine),
            'why': '{0} {1}'.format(first[0], first[1])}


def below_floor(driver, floor):
    """Whether a node's driver version (580.95.05) is older than a profile's floor (driver_floor's); False where
    either is unknown."""
    if not driver or not floor:
        return False
    key = _gpu.vendor().version_key
    return key(str(driver)) < key(floor['driver'])


def floor_words(profile, floor):
    """A profile's floor said whole: what needs it and which driver satisfies it."""
    others = len(floor['wheels']) - 1
    return ("the venv profile {0} needs an NVIDIA driver of at least {1}: its lock's {2}{3}, and CUDA {4}.x runs on "
            "{1} or newer").format(profile, floor['driver'], floor['why'],
                                   ' (as are {0} other wheel(s) of it)'.format(others) if others else '', floor['cuda'])
