"""Files laid out as a real node and a real venv have them, for unit tests that run the code on them (no lab):
ELF shared objects with their sonames and DT_NEEDED, distributions installed into a venv's site-packages with their
METADATA and RECORD (sizes and sha256 as installers write them), a node's /proc and /dev of NVIDIA's driver."""

import base64
import hashlib
import os
import struct
import subprocess
import sys

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _elf, _venv_python

MACHINE = _elf.read(os.path.realpath(sys.executable)).machine  # this machine's: the loader takes no other


def elf(soname=None, needed=(), module=None, runpath=()):
    """A 64-bit little-endian ELF shared object of this machine: one PT_LOAD of the whole file, a PT_DYNAMIC with
    DT_NEEDED for each of needed, DT_SONAME, DT_RUNPATH; module: the name Python imports it as (its PyInit_ symbol
    is in its strings, as a C extension's is)."""
    names = list(needed) + ([soname] if soname else []) + ([':'.join(runpath)] if runpath else [])
    strings = b'\0'
    offsets = {}
    for name in names + (['PyInit_' + module] if module else []):
        offsets[name] = len(strings)
        strings += name.encode() + b'\0'
    strtab = 64 + 2 * 56
    dynamic = (strtab + len(strings) + 7) // 8 * 8
    entries = [(_elf.DT_NEEDED, offsets[n]) for n in needed]
    entries += [(_elf.DT_SONAME, offsets[soname])] if soname else []
    entries += [(_elf.DT_RUNPATH, offsets[':'.join(runpath)])] if runpath else []
    entries += [(_elf.DT_STRTAB, strtab), (_elf.DT_STRSZ, len(strings)), (_elf.DT_NULL, 0)]
    body = b''.join(struct.pack('<qQ', tag, value) for tag, value in entries)
    size = dynamic + len(body)
    header = b'\x7fELF' + bytes([2, 1, 1, 0]) + b'\0' * 8 + struct.pack(
        '<HHIQQQIHHHHHH', 3, MACHINE, 1, 0, 64, 0, 0, 64, 56, 2, 64, 0, 0)
    load = struct.pack('<IIQQQQQQ', _elf.PT_LOAD, 5, 0, 0, 0, size, size, 0x1000)
    dyn = struct.pack('<IIQQQQQQ', _elf.PT_DYNAMIC, 6, dynamic, dynamic, dynamic, len(body), len(body), 8)
    image = header + load + dyn + strings
    return image + b'\0' * (dynamic - len(image)) + body


def record_hash(data):
    return 'sha256=' + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()


def make_venv(path):
    """A real venv of this machine's Python (no pip), its activation scripts as venv_build leaves them (with
    _venv_python.JOB_ENV): (venv, its site-packages)."""
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(path)], check=True)
    _venv_python.write_job_env(str(path))
    return str(path), _venv_python.site_packages(str(path))


def install(site, name, version, files, requires=()):
    """A distribution installed into site as an installer leaves it: its files ({path under site: bytes}), its
    dist-info with METADATA (Name, Version, Requires-Dist) and RECORD (each file's sha256 and size, RECORD's own
    row without them). Returns the dist-info's path."""
    dist_info = os.path.join(site, '{0}-{1}.dist-info'.format(name.replace('-', '_'), version))
    os.makedirs(dist_info)
    rows = []
    for rel, data in sorted(files.items()):
        path = os.path.join(site, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'wb') as fh:
            fh.write(data)
        rows.append('{0},{1},{2}'.format(rel, record_hash(data), len(data)))
    meta = 'Metadata-Version: 2.1\nName: {0}\nVersion: {1}\n'.format(name, version) + ''.join(
        'Requires-Dist: {0}\n'.format(r) for r in requires) + '\n'
    for rel, text in (('METADATA', meta), ('INSTALLER', 'uv\n')):
        with open(os.path.join(dist_info, rel), 'w') as fh:
            fh.write(text)
        rows.append('{0}/{1},{2},{3}'.format(os.path.basename(dist_info), rel, record_hash(text.encode()),
                                             len(text.encode())))
    rows.append('{0}/RECORD,,'.format(os.path.basename(dist_info)))
    with open(os.path.join(dist_info, 'RECORD'), 'w') as fh:
        fh.write('\n'.join(rows) + '\n')
    return dist_info


def torch_like_venv(path):
    """A venv shaped as torch's with its NVIDIA wheels: torchlike (an __init__.py and an extension module _C whose
    DT_NEEDED is libcudnnx.so.9) requiring nvidia-cudnnx, which installs that library under nvidia/cudnnx/lib, where
    the venv's loader path for the nvidia wheels finds it. (venv, site)."""
    venv, site = make_venv(path)
    install(site, 'nvidia-cudnnx', '9.19.0', {'nvidia/cudnnx/lib/libcudnnx.so.9': elf(soname='libcudnnx.so.9'),
                                              'nvidia/cudnnx/__init__.py': b''})
    install(site, 'torchlike', '2.11.0', {'torchlike/__init__.py': b'VERSION = "2.11.0"\n',
                                          'torchlike/_C.so': elf(needed=['libcudnnx.so.9'], module='_C')},
            requires=['nvidia-cudnnx==9.19.0'])
    return venv, site


def nvidia_node(root, gpus, uvm_major=511, uvm_minors=(0, 1), version='550.163.01', smi=True):
    """A node's /proc and /dev of NVIDIA's driver under root: gpus is [(nvidia-smi index, PCI bus id, device
    minor)]; /proc/devices with nvidia-uvm's major, /proc/driver/nvidia/version and gpus/<bus>/information (its
    Device Minor), character nodes /dev/nvidiaN (major 195, minor N), nvidiactl and nvidia-uvm(-tools) with
    uvm_minors, and an nvidia-smi that lists the GPUs by index as the real one does. (dev, proc, smi path or None)."""
    dev, proc = os.path.join(root, 'dev'), os.path.join(root, 'proc')
    os.makedirs(dev)
    os.makedirs(os.path.join(proc, 'driver', 'nvidia', 'gpus'))
    with open(os.path.join(proc, 'devices'), 'w') as fh:
        fh.write('Character devices:\n  1 mem\n195 nvidia-frontend\n{0} nvidia-uvm\n\nBlock devices:\n'
                 '  8 sd\n'.format(uvm_major))
    with open(os.path.join(proc, 'driver', 'nvidia', 'version'), 'w') as fh:
        fh.write('NVRM version: NVIDIA UNIX x86_64 Kernel Module  {0}  Release Build\n'.format(version))
    for _index, bus, minor in gpus:
        os.makedirs(os.path.join(proc, 'driver', 'nvidia', 'gpus', bus))
        with open(os.path.join(proc, 'driver', 'nvidia', 'gpus', bus, 'information'), 'w') as fh:
            fh.write('Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nDevice Minor: \t {0}\n'.format(minor))
        os.mknod(os.path.join(dev, 'nvidia{0}'.format(minor)), 0o20666, os.makedev(195, minor))
    os.mknod(os.path.join(dev, 'nvidiactl'), 0o20666, os.makedev(195, 255))
    for name, minor in zip(('nvidia-uvm', 'nvidia-uvm-tools'), uvm_minors):
        os.mknod(os.path.join(dev, name), 0o20666, os.makedev(uvm_major, minor))
    if not smi:
        return dev, proc, None
    path = os.path.join(root, 'nvidia-smi')
    lines = ''.join('{0}, 00000000:{1}, GPU-{0:08d}-aaaa, NVIDIA H100 80GB HBM3\\n'.format(index, bus[5:].upper())
                    for index, bus, _minor in sorted(gpus))
    with open(path, 'w') as fh:
        fh.write('#!/bin/sh\nprintf "{0}"\n'.format(lines))
    os.chmod(path, 0o755)
    return dev, proc, path
