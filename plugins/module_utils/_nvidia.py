# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's NVIDIA discovery, read from /dev, /proc and nvidia-smi: its GPUs (each joined to its device minor), the
control and nvidia-uvm nodes, the loaded driver's version, and every finding that stops passthrough, with its fix;
with the driver bundle's (_nvidia_bundle) and the shared directories' (standard library only: it runs with the node's
system Python).
"""


import os
import re
import stat
import subprocess

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _files, _nvidia_bundle, _nvidia_kernel, _pcie, _pveconf
from ansible_collections.gpufleet.proxmox.plugins.module_utils._devnodes import char_majors, node_info
from ansible_collections.gpufleet.proxmox.plugins.module_utils._nvidia_devices import CONTROL_NODES, GPU_NODE, UVM_NODES, gpu_indexes


VERSION_RE = re.compile(r'Kernel Module(?: for [^ ]+)?\s+(\d+\.\d+(?:\.\d+)?)')


def driver_version(proc_root='/proc'):
    """The kernel module's version from /proc/driver/nvidia/version, or None without a driver."""
    try:
        with open(os.path.join(proc_root, 'driver', 'nvidia', 'version')) as fh:
            m = VERSION_RE.search(fh.read())
    except (IOError, OSError):
        return None
    return m.group(1) if m else None


def nvidia_smi(executable):
    """[{index, pci_bus_id, uuid, name}] from nvidia-smi, or None when it is absent or fails."""
    if not executable or not os.path.exists(executable):
        return None
    try:
        out = subprocess.check_output([executable, '--query-gpu=index,pci.bus_id,uuid,name',
                                       '--format=csv,noheader'], stderr=subprocess.STDOUT)
    except (OSError, subprocess.CalledProcessError):
        return None
    gpus = []
    for line in out.decode('utf-8', 'replace').splitlines():
        parts = [p.strip() for p in line.split(',')]
        if len(parts) >= 4 and parts[0].isdigit():
            gpus.append({'index': int(parts[0]), 'pci_bus_id': parts[1], 'uuid': parts[2], 'name': parts[3]})
    return gpus


bus_id = _pcie.bus_id  # nvidia-smi's '00000000:18:00.0' as the driver's /proc writes it, '0000:18:00.0'


def driver_minors(proc_root='/proc'):
    """{PCI bus id: device minor} as the driver reports each GPU (/proc/driver/nvidia/gpus/<bus>/information,
    'Device Minor'): a GPU's /dev/nvidiaN is its minor, which need not be its nvidia-smi (and CUDA) index."""
    out = {}
    base = os.path.join(proc_root, 'driver', 'nvidia', 'gpus')
    try:
        buses = os.listdir(base)
    except OSError:
        return out
    for bus in buses:
        try:
            with open(os.path.join(base, bus, 'information')) as fh:
                m = re.search(r'^Device Minor:\s*(\d+)', fh.read(), re.M)
        except (IOError, OSError):
            continue
        if m:
            out[bus_id(bus)] = int(m.group(1))
    return out


def find_program(name, explicit=None):
    """explicit, else the first `name` on PATH or in the usual program directories; None where there is none."""
    if explicit:
        return explicit
    for d in os.environ.get('PATH', '/usr/bin:/bin').split(os.pathsep) + ['/usr/bin', '/usr/sbin', '/usr/local/bin']:
        candidate = os.path.join(d, name)
        if os.path.exists(candidate):
            return candidate
    return None


def discover(dev_dir='/dev', proc_root='/proc', smi=None, persistenced=None, shares=(), bundle=None,
             driver_optional=False):
    """Everything a node offers for passthrough, and what is wrong with it (findings with a fix), the
    directories it shares with its containers included (see share_findings), and, given bundle (the options of
    bundle_files and dest), the driver bundle of the loaded version (see bundle_findings). driver_optional: the node
    may have no NVIDIA driver (a node without GPUs); where none is loaded, that and the device nodes it would make
    are no finding."""
    majors = char_majors(proc_root)
    version = driver_version(proc_root)
    uvm_major = majors.get('nvidia-uvm')
    findings = []
    gpus = []
    for index in gpu_indexes(dev_dir):
        info = node_info(os.path.join(dev_dir, 'nvidia{0}'.format(index)))
        if info:
            info['index'] = index
            gpus.append(info)
    control = {}
    for name in list(CONTROL_NODES) + list(UVM_NODES):
        info = node_info(os.path.join(dev_dir, name))
        if info:
            control[name] = info
    caps = []
    caps_dir = os.path.join(dev_dir, 'nvidia-caps')
    if os.path.isdir(caps_dir):
        for name in sorted(os.listdir(caps_dir)):
            info = node_info(os.path.join(caps_dir, name))
            if info:
                caps.append(info)
    if version is None:
        findings.append({'code': 'driver_not_loaded', 'fix': 'modprobe nvidia',
                         'msg': 'no NVIDIA kernel module: {0}/driver/nvidia/version is missing'.format(proc_root)})
    if 'nvidiactl' not in control:
        findings.append({'code': 'nvidiactl_missing', 'fix': 'nvidia-modprobe -c 0',
                         'msg': '{0}/nvidiactl is missing'.format(dev_dir)})
    if uvm_major is None:
        findings.append({'code': 'uvm_not_loaded', 'fix': 'nvidia-modprobe -u -c 0',
                         'msg': 'nvidia-uvm is not loaded (not in {0}/devices): CUDA cannot run and the '
                                'container cannot start with /dev/nvidia-uvm passed through'.format(proc_root)})
    for name, minor in sorted(UVM_NODES.items()):
        info = control.get(name)
        if uvm_major is not None and info is None:
            findings.append({'code': 'uvm_node_missing', 'fix': 'nvidia-modprobe -u -c 0', 'node': name,
                             'msg': '{0}/{1} is missing although nvidia-uvm is loaded (major {2})'.format(
                                 dev_dir, name, uvm_major)})
        elif uvm_major is not None and (info['major'], info['minor']) != (uvm_major, minor):
            findings.append({'code': 'uvm_node_stale', 'fix': 'rm {0}/{1} && nvidia-modprobe -u -c 0'.format(
                dev_dir, name), 'node': name,
                'msg': '{0}/{1} is {2}:{3} but nvidia-uvm has major {4} (a node left from before a reload)'.format(
                    dev_dir, name, info['major'], info['minor'], uvm_major)})
    listed = nvidia_smi(smi) if smi else None
    if listed is not None:
        # nvidia-smi's index (the one operators and CUDA count by) to the device minor (/dev/nvidiaN) through the
        # PCI bus id, where the driver reports the minors; else the index is taken for the minor
        minors = driver_minors(proc_root)
        by_minor = dict((minors.get(bus_id(g['pci_bus_id']), g['index']), g) for g in listed)
        for gpu in gpus:
            extra = by_minor.get(gpu['minor'])
            if extra:
                gpu.update(index=extra['index'], pci_bus_id=extra['pci_bus_id'], uuid=extra['uuid'],
                           name=extra['name'])
        gpus.sort(key=lambda g: g['index'])
        present = set(g['minor'] for g in gpus)
        missing = sorted((m, g['index']) for m, g in by_minor.items() if m not in present)
        if missing:
            findings.append({'code': 'gpu_nodes_missing', 'fix': 'nvidia-modprobe -c {0}'.format(missing[0][0]),
                             'msg': 'nvidia-smi lists GPU(s) {0} without their /dev/nvidiaN node ({1})'.format(
                                 [i for _m, i in missing], ', '.join('/dev/nvidia{0}'.format(m) for m, _i in missing))})
    if version is None and driver_optional:
        findings = []  # no driver, no GPUs: nothing to pass through, nothing wanting
    findings.extend(share_findings(shares))
    gathered = None
    if bundle and version:
        gathered = {'version': version, 'path': os.path.join(bundle['dest'], version)}
        findings.extend(_nvidia_bundle.bundle_findings(gathered['path'], version, **dict(
            (k, v) for k, v in bundle.items() if k != 'dest')))
    return {'gpus': gpus, 'count': len(gpus), 'indexes': [g['index'] for g in gpus], 'control': control, 'caps': caps,
            'majors': dict((k, v) for k, v in majors.items() if k.startswith('nvidia')),
            'uvm_major': uvm_major, 'driver_version': version, 'findings': findings,
            'nvidia_smi': smi if listed is not None else None, 'persistenced': persistenced, 'bundle': gathered}


def share_findings(shares):
    """Each directory the node shares with its containers ({path, owner, mode}; owner a uid that owns it as
    user and group, or None for any) that is missing, not a directory, or not owned or moded so: a finding with
    its path, so that only those are made or mended."""
    findings = []
    for share in shares or ():
        path, owner, mode = share['path'], share.get('owner'), share.get('mode')
        try:
            st = os.stat(path)
        except OSError:
            findings.append({'code': 'share_missing', 'path': path, 'fix': 'mkdir -p {0}'.format(path),
                             'msg': 'the shared directory {0} is missing'.format(path)})
            continue
        if not stat.S_ISDIR(st.st_mode):
            findings.append({'code': 'share_not_directory', 'path': path, 'fix': 'rm {0}'.format(path),
                             'msg': '{0} is not a directory, so it cannot be shared'.format(path)})
        elif owner is not None and (st.st_uid, st.st_gid) != (owner, owner):
            findings.append({'code': 'share_owner', 'path': path, 'fix': 'chown {0}:{0} {1}'.format(owner, path),
                             'msg': 'the shared directory {0} belongs to {1}:{2}, not {3}:{3}'.format(
                                 path, st.st_uid, st.st_gid, owner)})
        elif mode is not None and stat.S_IMODE(st.st_mode) != int(str(mode), 8):
            findings.append({'code': 'share_mode', 'path': path, 'fix': 'chmod {0} {1}'.format(mode, path),
                             'msg': 'the shared directory {0} has mode {1:04o}, not {2}'.format(
                                 path, stat.S_IMODE(st.st_mode), mode)})
    return findings


def discover_node(params, check=False):
    """The gpu_devices module's work (params: its options, the bundle checked): {changed, ansible_facts:
    {gpufleet_gpu_devices}} - discover's facts, and where a driver is loaded the boot files that are not as given,
    the kernels' state and the installed driver versions with their findings. Reads only."""
    p = params
    facts = discover(p['dev_dir'], p['proc_root'], find_program('nvidia-smi', p['nvidia_smi']),
                     find_program('nvidia-persistenced'),
                     [{'path': share['path'], 'owner': None if share['read_only'] else p['shares_owner'],
                       'mode': p['shares_mode']} for share in p['shares']], p['bundle'], p['driver_optional'])
    # who holds each GPU: every container of the node given its device node (the fleet's, an orphan, or one made by
    # hand), read from PVE's own config files
    conf_dir = os.path.join(p['pve_root'], 'nodes', p['node'], 'lxc') if p.get('node') else os.path.join(
        p['pve_root'], 'lxc')
    by_path = _pveconf.gpu_holders(conf_dir, GPU_NODE)
    facts['held'] = dict((g['index'], by_path['/dev/nvidia{0}'.format(g['minor'])]) for g in facts.get('gpus') or []
                         if g.get('index') is not None and g.get('minor') is not None
                         and '/dev/nvidia{0}'.format(g['minor']) in by_path)
    if facts['driver_version'] is not None:
        facts['findings'].extend(_files.stale(p['boot_files']))
        facts['kernels'] = _nvidia_kernel.state(p['proc_root'], p['root'])
        facts['installed_versions'] = _nvidia_bundle.installed_versions((p['bundle'] or {}).get('lib_dirs') or [])
        facts['findings'].extend(_nvidia_kernel.findings(facts['kernels'], facts['driver_version'],
                                                         facts['installed_versions'], p['driver_hold']))
    return {'changed': False, 'ansible_facts': {'gpufleet_gpu_devices': facts}}
