# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVIDIA kernel module across a node's kernels, read from its files (standard library only): the kernel that
runs, the one the node boots next, whether the module is built for each (a DKMS build, or a module file), and
whether the driver's Debian packages are held from upgrades. Each gap is a finding with the command that closes it.

A node boots, unless pinned, the newest kernel installed (grub's menu and proxmox-boot-tool's loader entries sort by
version); proxmox-boot-tool's pins are /etc/kernel/next-boot-pin (the next boot only, which wins) and
/etc/kernel/proxmox-boot-pin (proxmox-kernel-helper, proxmox-boot/functions: NEXT_BOOT_PIN, PINNED_KERNEL_CONF).
DKMS keeps a module built for a kernel under /var/lib/dkms/<module>/<version>/<kernel>/<arch>/module/, and a failed
build's log at /var/lib/dkms/<module>/<version>/build/make.log; installed, the module is under
/lib/modules/<kernel>/updates/dkms/. NVIDIA's installer without DKMS puts it under kernel/drivers/video/.

The DKMS module's name is the packaging's: NVIDIA's installer (--dkms) registers `nvidia`; Debian's
nvidia-kernel-dkms registers `nvidia-current` (its dkms.conf: PACKAGE_NAME="nvidia-current", the module files
nvidia-current.ko, nvidia-current-uvm.ko, ...). It is read from the node, never assumed."""


import glob
import os
import re

from ansible_collections.gpufleet.proxmox.plugins.module_utils._files import read_text

MODULE_FILES = tuple(name + ext for name in ('nvidia.ko', 'nvidia-current.ko') for ext in ('', '.xz', '.zst', '.gz'))
DKMS_MODULES = ('nvidia', 'nvidia-current')
MODULE_DIRS = ('updates/dkms', 'kernel/drivers/video', 'extra', 'updates')
# The driver's Debian packages (NVIDIA's CUDA repository and Debian's own) that an upgrade must not move alone, and
# that a driver upgrade moves together to one version; not NVIDIA's container toolkit, which is versioned apart.
PACKAGE_RE = re.compile(r'^(?!nvidia-container-|libnvidia-container)'
                        r'(nvidia-.*|libnvidia-.*|libcuda1|xserver-xorg-video-nvidia.*|cuda-drivers.*|firmware-nvidia-.*)$')
# The files NVIDIA's installer (.run) leaves: its uninstaller and its manifest (nvidia-installer(1): "--uninstall").
RUNFILE_MARKS = ('usr/bin/nvidia-uninstall', 'var/lib/nvidia/.manifest')
# dpkg's states of a package that is installed and finished (dpkg(1), "Package states"); any other state of an
# installed package is one dpkg --audit names, which a driver change must not start on.
DONE_STATES = ('installed', 'config-files', 'not-installed')


def version_key(version):
    """A kernel or driver version as a sortable key (6.14.11-4-pve before 6.17.2-1-pve)."""
    return [int(part) if part.isdigit() else part for part in re.split(r'(\d+)', version)]


def _first_line(path):
    """The file's first line, stripped; None where it is missing or empty."""
    lines = (read_text(path) or '').splitlines()
    return (lines[0].strip() or None) if lines else None


def running_kernel(proc_root='/proc'):
    """The release of the kernel that runs (uname -r)."""
    return _first_line(os.path.join(proc_root, 'sys', 'kernel', 'osrelease'))


def installed_kernels(root='/'):
    """The kernels installed, newest first (their /boot/vmlinuz-<release>)."""
    found = [os.path.basename(p)[len('vmlinuz-'):] for p in glob.glob(os.path.join(root, 'boot', 'vmlinuz-*'))]
    return sorted(found, key=version_key, reverse=True)


def next_kernel(root='/', running=None):
    """(release, why) of the kernel the node boots next: a next-boot pin, else a pin, else the newest installed
    (else the running one)."""
    for name, why in (('next-boot-pin', 'pinned for the next boot'), ('proxmox-boot-pin', 'pinned')):
        pinned = _first_line(os.path.join(root, 'etc', 'kernel', name))
        if pinned:
            return pinned, why
    kernels = installed_kernels(root)
    if kernels:
        return kernels[0], 'the newest installed'
    return running, 'the running one'


def module_file(root, kernel):
    """The NVIDIA module file installed for kernel, or None."""
    for d in MODULE_DIRS:
        for name in MODULE_FILES:
            path = os.path.join(root, 'lib', 'modules', kernel, d, name)
            if os.path.isfile(path):
                return path
    return None


def dkms(root='/'):
    """DKMS's state of the NVIDIA module, whichever name its packaging gives it (DKMS_MODULES): {version: {'built':
    [kernels], 'make_log': path or None, 'module': its DKMS name}}."""
    state = {}
    for module in DKMS_MODULES:
        for vdir in glob.glob(os.path.join(root, 'var', 'lib', 'dkms', module, '*')):
            version = os.path.basename(vdir)
            if not os.path.isdir(vdir) or not version[:1].isdigit():
                continue
            built = sorted({os.path.basename(os.path.dirname(os.path.dirname(m)))
                            for m in glob.glob(os.path.join(vdir, '*', '*', 'module'))}, key=version_key)
            log = os.path.join(vdir, 'build', 'make.log')
            state[version] = {'built': built, 'make_log': log if os.path.isfile(log) else None, 'module': module}
    return state


def dkms_name(found, version):
    """The DKMS name of the driver's module for version (found: state()), else of the newest version DKMS has,
    else nvidia (NVIDIA's installer's)."""
    known = found.get('dkms') or {}
    if version in known:
        return known[version]['module']
    newest = sorted(known, key=version_key)[-1:]
    return known[newest[0]]['module'] if newest else 'nvidia'


def dpkg_status(root='/'):
    """dpkg's status file, read once: [(package, its fields, its Status words)]."""
    out = []
    for stanza in (read_text(os.path.join(root, 'var', 'lib', 'dpkg', 'status')) or '').split('\n\n'):
        fields = dict(line.split(': ', 1) for line in stanza.splitlines() if ': ' in line and not line[:1].isspace())
        if fields.get('Package'):
            out.append((fields['Package'], fields, fields.get('Status', '').split()))
    return out


def packages(root='/', status=None):
    """The driver's Debian packages installed: {name: {'version', 'held', 'source', 'state'}} (dpkg's status file, or
    status: dpkg_status's; source: the source package, whose binary packages move together at one version)."""
    found = {}
    for name, fields, status in dpkg_status(root) if status is None else status:
        if PACKAGE_RE.match(name) and status[-1:] and status[-1] not in ('not-installed', 'config-files'):
            found[name] = {'version': fields.get('Version'), 'held': status[0] == 'hold',
                           'source': (fields.get('Source') or name).split(' ', 1)[0], 'state': status[-1]}
    return found


def driver_set(found):
    """The driver's packages that move together (found: packages(), {name: {version, source, ...}}): those of the
    source that builds libcuda1 (else the source with the most of them), at that package's version. The others
    (Debian's nvidia-modprobe, nvidia-kernel-common, nvidia-legacy-check: other sources, or other versions) move as
    apt resolves their dependencies."""
    found = found or {}
    if not found:
        return []
    lead = found.get('libcuda1') or max(found.values(), key=lambda p: sum(
        1 for q in found.values() if q.get('source') == p.get('source')))
    return sorted(n for n, p in found.items()
                  if p.get('source') == lead.get('source') and p.get('version') == lead.get('version'))


def unfinished(root='/', status=None):
    """Every package dpkg has not finished (half-configured, unpacked, half-installed, triggers awaited or pending),
    of the whole node: {name: state}, as dpkg --audit reads them from its status file (or status: dpkg_status's)."""
    return dict((name, words[-1]) for name, _fields, words in (dpkg_status(root) if status is None else status)
                if words[-1:] and words[-1] not in DONE_STATES)


def headers(root, kernel):
    """Whether kernel's headers are installed where DKMS builds against them (/lib/modules/<kernel>/build, a link to
    /usr/src/linux-headers-<kernel> or proxmox-headers', read within root)."""
    path = os.path.join(root, 'lib', 'modules', kernel, 'build')
    if os.path.islink(path) and os.path.isabs(os.readlink(path)):
        path = os.path.join(root, os.readlink(path).lstrip('/'))
    return os.path.isdir(path)


def headers_package(kernel):
    """The package with a kernel's headers: PVE's proxmox-headers-<release> for its kernels, Debian's
    linux-headers-<release> for the others."""
    return ('proxmox-headers-' if kernel.endswith('-pve') else 'linux-headers-') + kernel


def runfile_installed(root='/'):
    """The files of NVIDIA's installer (RUNFILE_MARKS) the node has."""
    return [m for m in RUNFILE_MARKS if os.path.exists(os.path.join(root, m))]


def state(proc_root='/proc', root='/'):
    """What the node's files say of its driver across kernels."""
    running = running_kernel(proc_root)
    upcoming, why = next_kernel(root, running)
    status = dpkg_status(root)
    return {'running_kernel': running, 'next_kernel': upcoming, 'next_kernel_why': why,
            'modules': dict((k, module_file(root, k)) for k in (running, upcoming) if k),
            'headers': dict((k, headers(root, k)) for k in (running, upcoming) if k),
            'dkms': dkms(root), 'packages': packages(root, status), 'unfinished': unfinished(root, status),
            'runfile': runfile_installed(root)}


def findings(found, loaded, installed, hold=True):
    """The gaps in found (state()) for a node that runs module version loaded with userspace versions installed
    (_nvidia_bundle.installed_versions: newest last): no module for the running kernel, none (or a failed DKMS build) for
    the kernel it boots next, a module built for that kernel of another version than the newest userspace, and, with
    hold, driver packages not held."""
    out = []
    running, upcoming = found['running_kernel'], found['next_kernel']
    if not running:  # not a node's /proc: nothing to compare with
        return out
    target = installed[-1] if installed else loaded
    built = dict((k, v) for v, d in found['dkms'].items() for k in d['built'])
    if loaded and not found['modules'].get(running):
        out.append({'code': 'module_missing_running_kernel', 'kernel': running,
                    'fix': 'dkms install {0}/{1} -k {2}'.format(dkms_name(found, loaded), loaded, running),
                    'msg': 'the running kernel {0} has no NVIDIA module installed (the loaded {1} cannot be loaded '
                           'again)'.format(running, loaded)})
    if upcoming and target and upcoming != running:
        failed = (found['dkms'].get(target) or {}).get('make_log')
        if not found['modules'].get(upcoming) and upcoming not in built:
            if failed:
                out.append({'code': 'module_build_failed', 'kernel': upcoming, 'log': failed,
                            'fix': 'read {0}, then install a driver that builds for {1}, or keep the running kernel: '
                                   'proxmox-boot-tool kernel pin {2}'.format(failed, upcoming, running),
                            'msg': 'the DKMS build of the NVIDIA module {0} for kernel {1}, which the node boots next '
                                   '({2}), failed: after a reboot the node has no GPUs'.format(
                                       target, upcoming, found['next_kernel_why'])})
            else:
                build = ('dkms install {2}/{1} -k {0}' if found['dkms'] else
                         'sh NVIDIA-Linux-x86_64-{1}.run --silent --kernel-name={0}').format(
                             upcoming, target, dkms_name(found, target))
                out.append({'code': 'module_missing_next_kernel', 'kernel': upcoming,
                            'fix': 'apt install {0} && {1}'.format(headers_package(upcoming), build),
                            'msg': 'the kernel {0}, which the node boots next ({1}), has no NVIDIA module: after a '
                                   'reboot the node has no GPUs'.format(upcoming, found['next_kernel_why'])})
        elif upcoming in built and built[upcoming] != target:
            out.append({'code': 'module_version_next_kernel', 'kernel': upcoming,
                        'fix': 'dkms install {0}/{1} -k {2}'.format(dkms_name(found, target), target, upcoming),
                        'msg': 'the NVIDIA module built for kernel {0}, which the node boots next, is {1}, but the '
                               'userspace driver is {2}: after a reboot every GPU container fails with "driver/library '
                               'version mismatch"'.format(upcoming, built[upcoming], target)})
    loose = [name for name in driver_set(found['packages']) if not found['packages'][name]['held']]
    if hold and loose:
        out.append({'code': 'driver_not_held', 'packages': loose,
                    'fix': 'apt-mark hold {0}'.format(' '.join(loose)),
                    'msg': 'the driver packages {0} are not held: an unattended upgrade can replace the driver under '
                           'running containers'.format(', '.join(loose))})
    return out
