# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A CDI spec of a container's GPUs, for the OCI engine that runs inside it (Podman or Docker read /etc/cdi/), made
from what gpufleet knows: the GPU vendor's device nodes the container was given and the driver bundle bound into it
(standard library only: it runs with the container's system Python).

The Container Device Interface (cncf-tags/container-device-interface, SPEC.md): a JSON or YAML file with cdiVersion,
kind (vendor.com/class), devices (each a name and its containerEdits) and containerEdits shared by all of them: env,
deviceNodes ({path}: the engine reads the node's type and numbers from the path), mounts ({hostPath, containerPath,
options}). An engine given --device nvidia.com/gpu=all applies the shared edits and those of device "all".

The driver's libraries are mounted by their versioned file names, as NVIDIA's own generator mounts them: a spec of
another driver names files the bundle no longer has, and is stale (findings). Each is mounted at its file name and at
its soname in the image's multiarch library directory, where the loader looks without a cache entry.
"""


import json
import os
import platform

from ansible_collections.gpufleet.proxmox.plugins.module_utils._files import read_text, write_text

CDI_VERSION = '0.5.0'
SPEC_DIR = '/etc/cdi'
MOUNT_OPTIONS = ['ro', 'nosuid', 'nodev', 'bind']
MULTIARCH = {'x86_64': 'x86_64-linux-gnu', 'aarch64': 'aarch64-linux-gnu'}


def spec_path(kind, spec_dir=SPEC_DIR):
    """Where the spec of a kind lives: nvidia.com/gpu in /etc/cdi/nvidia.com-gpu.json."""
    return os.path.join(spec_dir, kind.replace('/', '-') + '.json')


def bundle_libraries(mount):
    """[(file name, soname or None)] of the libraries in the bundle bound in at mount (mount/lib: each versioned file
    and the soname links to it), in name order."""
    lib = os.path.join(mount, 'lib')
    try:
        names = sorted(os.listdir(lib))
    except OSError:
        return []
    links, files = {}, []
    for name in names:
        path = os.path.join(lib, name)
        if os.path.islink(path):
            links[os.readlink(path)] = name
        elif os.path.isfile(path):
            files.append(name)
    return [(name, links.get(name)) for name in files]


def make(vendor, gpu_nodes, control_nodes, mount, machine=None):
    """The spec (a dict) of a container whose GPUs' own device nodes are gpu_nodes (paths, in the order the container
    numbers them), whose other device nodes of the vendor are control_nodes, and whose driver bundle is bound in at
    mount (its lib/ and bin/). Devices: one per GPU, named by its number in the container, and all."""
    libdir = '/usr/lib/' + MULTIARCH.get(machine or platform.machine(), 'x86_64-linux-gnu')
    mounts = []
    for name, soname in bundle_libraries(mount):
        host = os.path.join(mount, 'lib', name)
        for target in [name] + ([soname] if soname else []):
            mounts.append({'hostPath': host, 'containerPath': os.path.join(libdir, target), 'options': MOUNT_OPTIONS})
    bindir = os.path.join(mount, 'bin')
    for name in sorted(os.listdir(bindir)) if os.path.isdir(bindir) else []:
        mounts.append({'hostPath': os.path.join(bindir, name), 'containerPath': os.path.join('/usr/bin', name),
                       'options': MOUNT_OPTIONS})
    devices = [{'name': str(i), 'containerEdits': {'deviceNodes': [{'path': p}]}} for i, p in enumerate(gpu_nodes)]
    if gpu_nodes:
        devices.append({'name': 'all', 'containerEdits': {'deviceNodes': [{'path': p} for p in gpu_nodes]}})
    return {'cdiVersion': CDI_VERSION, 'kind': vendor.cdi_kind, 'devices': devices,
            'containerEdits': {'deviceNodes': [{'path': p} for p in control_nodes], 'mounts': mounts}}


def of_container(vendor, mount, dev_dir='/dev', machine=None):
    """The spec of this container (make), its device nodes read under dev_dir."""
    # the paths the nested container sees are the container's own /dev ones
    nodes = ['/dev/' + os.path.relpath(p, dev_dir) for p in vendor.container_nodes(dev_dir)]
    gpus = sorted((p for p in nodes if vendor.gpu_node.match(p)), key=lambda p: int(vendor.gpu_node.match(p).group(1)))
    return make(vendor, gpus, sorted(p for p in nodes if p not in gpus), mount, machine)


def _host_paths(spec):
    return set(m.get('hostPath') for m in (spec.get('containerEdits') or {}).get('mounts') or [])


def _gpu_paths(spec):
    """The device nodes of the spec's device all (every GPU)."""
    return sorted(n.get('path') for d in spec.get('devices') or [] if d.get('name') == 'all'
                  for n in (d.get('containerEdits') or {}).get('deviceNodes') or [])


def findings(found, wanted):
    """What makes the spec on disk (found: its text, or None) other than wanted: [{check, msg}], empty when current."""
    if found is None:
        return [{'check': 'cdi_missing', 'msg': 'there is no CDI spec of the GPUs: an engine in the container sees none'}]
    try:
        have = json.loads(found)
    except ValueError as e:
        return [{'check': 'cdi_unreadable', 'msg': 'the CDI spec is not JSON: {0}'.format(e)}]
    out = []
    gone = sorted(p for p in _host_paths(have) - _host_paths(wanted) if p)
    if gone:
        out.append({'check': 'cdi_stale', 'msg': 'the CDI spec mounts {0} that the driver bound in no longer has '
                    '(a spec of another driver)'.format(', '.join(os.path.basename(p) for p in gone[:4]))})
    if _gpu_paths(have) != _gpu_paths(wanted):
        out.append({'check': 'cdi_devices', 'msg': 'the CDI spec gives {0}, the container has {1}'.format(
            ', '.join(_gpu_paths(have)) or 'no GPU', ', '.join(_gpu_paths(wanted)) or 'no GPU')})
    if not out and have != wanted:
        out.append({'check': 'cdi_differs', 'msg': 'the CDI spec is not the one gpufleet makes of the container'})
    return out


def text(spec):
    return json.dumps(spec, indent=2, sort_keys=True) + '\n'


def apply(vendor, mount, path=None, dev_dir='/dev', check=False):
    """The container's CDI spec made current at path (spec_path's by default): {changed, path, spec, findings: what
    was wrong before}. In check mode only reported."""
    path = path or spec_path(vendor.cdi_kind)
    wanted = of_container(vendor, mount, dev_dir)
    found = findings(read_text(path), wanted)
    if found and not check:
        write_text(path, text(wanted))
    return {'changed': bool(found), 'path': path, 'spec': wanted, 'findings': found}
