# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVIDIA device nodes and driver facts of a machine, read from /dev and /proc (standard library only).

Used on a node (what can be passed through) and inside a container (what was passed through).
"""


import os
import re
import shutil
import stat
import subprocess

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _files, _nvidia_kernel, _pveconf
from ansible_collections.gpufleet.proxmox.plugins.module_utils._files import read_text, replace_link, write_text
from ansible_collections.gpufleet.proxmox.plugins.module_utils._nvidia_devices import (
    CONTROL_NODES, UVM_NODES, char_majors, gpu_indexes, node_info)
from ansible_collections.gpufleet.proxmox.plugins.module_utils._nvidia_kernel import version_key

VERSION_RE = re.compile(r'Kernel Module(?: for [^ ]+)?\s+(\d+\.\d+(?:\.\d+)?)')


# The fix of a driver bundle that is out of date where the node's loaded driver can be gathered again (a run does it).
GATHER = 'gather it again (driver_bundle)'


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


def bus_id(text):
    """A PCI bus id as the driver's /proc writes it ('0000:18:00.0'), from nvidia-smi's form ('00000000:18:00.0')."""
    parts = str(text).strip().lower().split(':')
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, '0')
    return ':'.join(parts)


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
        findings.extend(bundle_findings(gathered['path'], version, **dict(
            (k, v) for k, v in bundle.items() if k != 'dest')))
    return {'gpus': gpus, 'count': len(gpus), 'indexes': [g['index'] for g in gpus], 'control': control, 'caps': caps,
            'majors': dict((k, v) for k, v in majors.items() if k.startswith('nvidia')),
            'uvm_major': uvm_major, 'driver_version': version, 'findings': findings,
            'nvidia_smi': smi if listed is not None else None, 'persistenced': persistenced, 'bundle': gathered}


def _find(dirs, name):
    for d in dirs:
        path = os.path.join(d, name)
        if os.path.isfile(path):
            return path
    return None


# The options that say what a driver bundle holds and where bundles go (driver_bundle; gpu_devices' bundle).
BUNDLE_SPEC = dict(dest=dict(type='path', required=True),
                   lib_dirs=dict(type='list', elements='path', required=True),
                   bin_dirs=dict(type='list', elements='path', default=['/usr/bin']),
                   libs=dict(type='dict', required=True),
                   bins=dict(type='list', elements='str', default=['nvidia-smi']))


def bundle_files(version, lib_dirs, libs, bin_dirs=('/usr/bin',), bins=('nvidia-smi',)):
    """The node's driver files of one version that a bundle holds: [(source, path in the bundle, soname to
    link or None)] - each library <name>.so.<version> (libs: name to soname) found in lib_dirs, each program
    found in bin_dirs. Raises BundleError when libcuda of that version is not among them."""
    wanted = []
    for name, soname in sorted(libs.items()):
        filename = '{0}.so.{1}'.format(name, version)
        src = _find(lib_dirs, filename)
        if src:
            wanted.append((src, os.path.join('lib', filename), soname or None))
    if not any(rel.startswith('lib/libcuda.so.') for _s, rel, _l in wanted):
        raise BundleError('no libcuda.so.{0} in {1}: the node\'s userspace driver does not match its kernel '
                          'module {0}'.format(version, ', '.join(lib_dirs)))
    for name in bins:
        src = _find(bin_dirs, name)
        if src:
            wanted.append((src, os.path.join('bin', name), None))
    return wanted


class BundleError(Exception):
    pass


def _same_file(src, dest):
    """dest is a current copy of src: a file of the same size and mtime (to the second), as gather_bundle leaves
    it - confirmed by stat alone, as rsync does, so that a look at a current bundle reads none of its bytes."""
    try:
        a, b = os.stat(src), os.lstat(dest)
    except OSError:
        return False
    return stat.S_ISREG(b.st_mode) and a.st_size == b.st_size and int(a.st_mtime) == int(b.st_mtime)


def bundle_stale(path, wanted):
    """What of wanted (bundle_files) the bundle at path lacks or holds otherwise, in the order to mend it:
    [(path in the bundle, the source file to copy there, or None for a soname link to make, pointing at target)]."""
    stale = []
    for src, rel, soname in wanted:
        dest = os.path.join(path, rel)
        if not _same_file(src, dest):
            stale.append((rel, src, None))
        if soname:
            link = os.path.join(os.path.dirname(dest), soname)
            if not (os.path.islink(link) and os.readlink(link) == os.path.basename(dest)):
                stale.append((os.path.join(os.path.dirname(rel), soname), None, os.path.basename(dest)))
    return stale


def installed_versions(lib_dirs):
    """The versions of the libcuda.so.<version> files in lib_dirs (the userspace drivers installed), oldest first
    (by version: 580.105.08 after 580.95.05)."""
    found = set()
    for d in lib_dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            m = re.match(r'^libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$', name)
            if m and os.path.isfile(os.path.join(d, name)):
                found.add(m.group(1))
    return sorted(found, key=version_key)


def bundle_intact(path, version, libs):
    """The bundle at path holds the driver of version as gathered: each library's file and soname link of libs
    that it has, libcuda among them (its sources may be gone: the driver was upgraded since)."""
    lib = os.path.join(path, 'lib')
    if not os.path.isfile(os.path.join(lib, 'libcuda.so.{0}'.format(version))):
        return False
    for name, soname in libs.items():
        filename = '{0}.so.{1}'.format(name, version)
        if soname and os.path.isfile(os.path.join(lib, filename)) and os.path.realpath(
                os.path.join(lib, soname)) != os.path.realpath(os.path.join(lib, filename)):
            return False
    return True


def bundle_findings(path, version, **files):
    """A bundle_stale finding where the bundle at path is not what the node's driver of version makes of it
    (files: the options of bundle_files), or where that driver has no libcuda to gather. A node whose userspace
    driver was upgraded but which still runs the old kernel module (not rebooted) has no libcuda.so.<loaded
    version>: where its bundle of the loaded version is intact, it keeps serving the containers and the finding
    is driver_not_rebooted, which asks for nothing to be gathered; else bundle_stale, saying the same."""
    try:
        stale = bundle_stale(path, bundle_files(version, **files))
    except BundleError as e:
        installed = [v for v in installed_versions(files.get('lib_dirs') or []) if v != version]
        if not installed:
            return [{'code': 'bundle_stale', 'path': path, 'fix': 'install the userspace driver of the loaded module',
                     'msg': str(e)}]
        upgraded = ('the node runs the NVIDIA kernel module {0} but its userspace driver is {1} (upgraded without '
                    'a reboot)'.format(version, ', '.join(installed)))
        if bundle_intact(path, version, files.get('libs') or {}):
            return [{'code': 'driver_not_rebooted', 'path': path, 'installed': installed,
                     'fix': 'reboot the node (or reload the nvidia modules) to run {0}'.format(installed[-1]),
                     'msg': '{0}: its containers keep the bundle of {1} gathered before ({2}) until the node '
                            'is rebooted'.format(upgraded, version, path)}]
        return [{'code': 'bundle_stale', 'path': path, 'installed': installed,
                 'fix': 'reboot the node (or reload the nvidia modules) to run {0}'.format(installed[-1]),
                 'msg': '{0}, and no bundle of {1} was gathered before: containers cannot get a driver that matches '
                        'the module until the node is rebooted'.format(upgraded, version)}]
    if not stale:
        return []
    return [{'code': 'bundle_stale', 'path': path, 'fix': GATHER,
             'msg': 'the driver bundle {0} lacks or holds another copy of {1}'.format(
                 path, ', '.join(rel for rel, _src, _target in stale))}]


def gather_bundle(path, wanted, check=False):
    """Copy into the bundle at path what it lacks or holds otherwise of wanted (bundle_files) and link the
    sonames (bundle_stale; in check mode only report). Copies keep their source's mtime. Returns whether anything
    changed."""
    stale = bundle_stale(path, wanted)
    for rel, src, target in [] if check else stale:
        dest = os.path.join(path, rel)
        if src is None:
            replace_link(dest, target)
            continue
        st = os.stat(src)
        os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
        shutil.copyfile(src, dest + '.tmp')
        os.chmod(dest + '.tmp', 0o755)
        os.utime(dest + '.tmp', ns=(st.st_atime_ns, st.st_mtime_ns))
        os.rename(dest + '.tmp', dest)
    return bool(stale)


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


LOADER_CONF = '/etc/ld.so.conf.d/000-gpufleet-nvidia.conf'
# /usr/bin, where NVIDIA's container toolkit puts it too: `pct exec` runs commands with PATH=/sbin:/bin:/usr/sbin:/usr/bin
# (pve-common src/PVE/CLIHandler.pm), so a link in /usr/local/bin would not be found by `pct exec CT -- nvidia-smi`
SMI_LINK = '/usr/bin/nvidia-smi'
LIBCUDA_RE = re.compile(r'^\s*libcuda\.so\.1 \(([^)]*)\) => (\S+)$')


def loaded_libcuda(ldconfig='ldconfig'):
    """The libcuda.so.1 the loader resolves (its real file) and the driver version its file name carries,
    or (None, None): the first 64-bit entry of `ldconfig -p`, as the loader takes it."""
    try:
        out = subprocess.run([ldconfig, '-p'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    except OSError:
        return None, None
    for line in out.stdout.decode('utf-8', 'replace').splitlines():
        m = LIBCUDA_RE.match(line)
        if m and ('x86-64' in m.group(1) or 'AArch64' in m.group(1)):
            real = os.path.realpath(m.group(2))
            name = os.path.basename(real)
            version = name[len('libcuda.so.'):] if name.startswith('libcuda.so.') else None
            return real, version or None
    return None, None


def bind_userspace(mount, check=False, conf=LOADER_CONF, smi_link=SMI_LINK, ldconfig='ldconfig'):
    """A container's loader pointed at the node's driver bundle bound in at mount (mount/lib, and nvidia-smi
    linked from mount/bin); the loader's cache refreshed when its config changed. Returns what changed."""
    changed = []
    want = '{0}/lib\n'.format(mount.rstrip('/'))
    if read_text(conf) != want:
        changed.append(conf)
        if not check:
            write_text(conf, want)
            done = subprocess.run([ldconfig], check=False, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if done.returncode != 0:
                raise OSError('{0} failed: {1}'.format(ldconfig, done.stderr.decode('utf-8', 'replace').strip()))
    target = '{0}/bin/nvidia-smi'.format(mount.rstrip('/'))
    if not (os.path.islink(smi_link) and os.readlink(smi_link) == target):
        changed.append(smi_link)
        if not check:
            replace_link(smi_link, target)
    return changed


def userspace_driver(node_version, mode='bind', mount=None, check=False, ldconfig='ldconfig'):
    """A container's NVIDIA userspace driver against its node's kernel module: in bind mode the loader is first
    pointed at the bound-in bundle (in check mode only reported). Returns {node_version, version, library,
    match, changed_files}."""
    changed = bind_userspace(mount, check, ldconfig=ldconfig) if mode == 'bind' else []
    library, version = loaded_libcuda(ldconfig)  # in check mode: what the container loads now
    return {'node_version': node_version, 'version': version, 'library': library,
            'match': version is not None and version == node_version, 'changed_files': changed}


def driver_step(node_version, mode='bind', mount=None, require_match=False, check=False):
    """The driver step of a container (the userspace_driver module's, and venv_build's where it makes the driver in
    the same call): userspace_driver's result with changed, and msg where require_match and the versions differ.
    Returns (result, failed): a mismatch fails the step, except in check mode, where it is reported as a change."""
    result = userspace_driver(node_version, mode, mount, check)
    result['changed'] = bool(result['changed_files'])
    if require_match and not result['match']:
        result['msg'] = ('driver mismatch: the container loads libcuda {0} ({1}) but its node runs kernel module {2}; '
                         'NVML would answer "Driver/library version mismatch"').format(
                             result['version'] or 'none', result['library'] or 'not found', node_version)
        if not check:
            return result, True
        result['changed'] = True
    return result, False


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
    by_path = _pveconf.gpu_holders(conf_dir)
    facts['held'] = dict((g['index'], by_path['/dev/nvidia{0}'.format(g['minor'])]) for g in facts.get('gpus') or []
                         if g.get('index') is not None and g.get('minor') is not None
                         and '/dev/nvidia{0}'.format(g['minor']) in by_path)
    if facts['driver_version'] is not None:
        facts['findings'].extend(_files.stale(p['boot_files']))
        facts['kernels'] = _nvidia_kernel.state(p['proc_root'], p['root'])
        facts['installed_versions'] = installed_versions((p['bundle'] or {}).get('lib_dirs') or [])
        facts['findings'].extend(_nvidia_kernel.findings(facts['kernels'], facts['driver_version'],
                                                         facts['installed_versions'], p['driver_hold']))
    return {'changed': False, 'ansible_facts': {'gpufleet_gpu_devices': facts}}
