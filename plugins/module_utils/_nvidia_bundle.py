# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver bundle: the node's NVIDIA userspace libraries and programs of the loaded driver's version, gathered
into one directory that the node's GPU containers bind read-only (bind mode), and what is missing or stale in it
(standard library only: it runs with the node's system Python).
"""


import os
import re
import shutil
import stat

from ansible_collections.gpufleet.proxmox.plugins.module_utils._files import replace_link
from ansible_collections.gpufleet.proxmox.plugins.module_utils._nvidia_kernel import version_key


# The fix of a driver bundle that is out of date where the node's loaded driver can be gathered again (a run does it).
GATHER = 'gather it again (driver_bundle)'


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
