"""The lab node's own commands for its driver's life, acting on the node's stand-in files (host.gpus):

    apt-get update | install [-y] [-s] [--allow-change-held-packages] [--allow-downgrades] [-o OPT] PKG=VERSION ...
    apt-cache madison PKG ...
    apt-mark hold|unhold|showhold [PKG ...]
    dkms install nvidia/VERSION -k KERNEL | dkms status
    nvidia-installer VERSION --silent [--dkms] [--kernel-name=KERNEL] [--allow-installation-with-running-driver]
        (NVIDIA-Linux-x86_64-VERSION.run)
    reboot

Each answers as Debian's and DKMS's do where the collection reads the answer: apt-get refuses held packages without
--allow-change-held-packages, a version the node's sources do not offer, a downgrade without --allow-downgrades,
and fails where DKMS's build for the running kernel fails (dpkg's postinst); NVIDIA's installer refuses while
something holds the loaded module; `reboot` reboots the lab node
(manager.reboot_node). The node's sshd names the node (GPUFLEET_LAB_NODE), as for `pct`.
"""

import os
import sys

from . import host
from .host._util import _read, _write
from .layout import Lab


def _apt_get(lab, args):
    if args[:1] == ['update']:
        return 0
    if args[:1] != ['install']:
        print('E: the lab node\'s apt-get knows update and install', file=sys.stderr)
        return 100
    words, wanted, skip = args[1:], {}, False
    for word in words:
        if skip:
            skip = False
        elif word == '-o':
            skip = True
        elif not word.startswith('-'):
            name, _, version = word.partition('=')
            wanted[name] = version
    flags = set(w for w in words if w.startswith('-'))
    packages = host.read_dpkg(lab)
    offered = host.offers(lab)
    for name, version in sorted(wanted.items()):
        if name not in packages:
            print('E: Unable to locate package {0}'.format(name), file=sys.stderr)
            return 100
        if not version or not version.endswith('-1') or version[:-2] not in offered and version != packages[name][0]:
            print("E: Version '{0}' for '{1}' was not found".format(version, name), file=sys.stderr)
            return 100
    changed = dict((n, v) for n, v in wanted.items() if v != packages[n][0])
    if not changed:
        print('0 upgraded, 0 newly installed, 0 to remove and 0 not upgraded.')
        return 0
    versions = set(v[:-2] for v in wanted.values())
    if len(versions) > 1 or set(changed) != set(n for n in packages if n in host.DRIVER_PACKAGES):
        # the driver's packages depend on each other at one version (nvidia-driver Depends on libcuda1 (= ...))
        print('E: Unable to correct problems, you have held broken packages.', file=sys.stderr)
        return 100
    if any(packages[n][1] for n in changed) and '--allow-change-held-packages' not in flags:
        print('E: Held packages were changed and -y was used without --allow-change-held-packages.', file=sys.stderr)
        return 100
    (version,) = versions
    if host.version_key(version) < host.version_key(host.installed_version(lab)) and '--allow-downgrades' not in flags:
        print('E: Packages were downgraded and -y was used without --allow-downgrades.', file=sys.stderr)
        return 100
    # the node's other packages apt moves with the driver for the new packages' dependencies (offer_driver's moves)
    moved = dict((n, v) for n, v in (offered.get(version) or {}).get('moves', {}).items() if n in packages)
    if any(packages[n][1] for n in moved) and '--allow-change-held-packages' not in flags:
        print('E: Held packages were changed and -y was used without --allow-change-held-packages.', file=sys.stderr)
        return 100
    if flags & {'-s', '--simulate', '--dry-run'}:
        for name in sorted(set(changed) | set(moved)):
            print('Inst {0} [{1}] ({2} lab:stable [amd64])'.format(name, packages[name][0],
                                                                  changed.get(name) or moved[name]))
        return 0
    errors = host.install_driver(lab, version)
    host.write_dpkg(lab, dict((n, (wanted.get(n, moved.get(n, v)), held)) for n, (v, held) in packages.items()))
    running = host.running_kernel(lab)
    for error in errors:
        print(error, file=sys.stderr)
    if any(running and 'kernel: {0} '.format(running) in e for e in errors):
        print('dpkg: error processing package nvidia-kernel-dkms (--configure):\n installed nvidia-kernel-dkms package '
              'post-installation script subprocess returned error exit status 10\nE: Sub-process /usr/bin/dpkg '
              'returned an error code (1)', file=sys.stderr)
        return 100
    print('{0} upgraded, 0 newly installed, 0 to remove and 0 not upgraded.'.format(len(changed)))
    return 0


def _apt_cache(lab, args):
    """madison: each version the node's sources offer of each package (the offered drivers and the one installed,
    numbered -1 as NVIDIA's CUDA repository numbers them), a line each as apt-cache(8) madison prints them, and
    nothing for a package the sources do not have (both as the real apt-cache 2.6 answers in a Debian node's root,
    host.debnode, which runs the real one; this stand-in stays for the nodes that model NVIDIA's CUDA repository)."""
    if args[:1] != ['madison']:
        print('E: the lab node\'s apt-cache knows madison', file=sys.stderr)
        return 100
    packages = host.read_dpkg(lab)
    versions = sorted(set(v + '-1' for v in host.offers(lab)) | set([host.installed_version(lab) + '-1']),
                      key=host.version_key, reverse=True)
    for name in args[1:]:
        for version in versions if name in packages else []:
            print('{0:>20} | {1} | file:/var/lib/gpufleet-lab/repo lab/main amd64 Packages'.format(name, version))
    return 0


def _apt_mark(lab, args):
    packages = host.read_dpkg(lab)
    if args[:1] == ['showhold']:
        print('\n'.join(n for n, (_v, held) in sorted(packages.items()) if held))
        return 0
    if args[:1] not in (['hold'], ['unhold']) or len(args) < 2:
        print('E: the lab node\'s apt-mark knows hold, unhold and showhold', file=sys.stderr)
        return 100
    hold = args[0] == 'hold'
    for name in args[1:]:
        if name not in packages:
            print('E: Unable to locate package {0}'.format(name), file=sys.stderr)
            return 100
        print('{0} {1}.'.format(name, ('was already set on hold' if packages[name][1] else 'set on hold') if hold else
                                ('Canceled hold on' if packages[name][1] else 'was already not on hold')))
        packages[name] = (packages[name][0], hold)
    host.write_dpkg(lab, packages)
    return 0


def _dkms(lab, args):
    if args[:1] == ['status']:
        for version, built in sorted(host.dkms_built(lab).items()):
            for release in built:
                print('nvidia/{0}, {1}, x86_64: installed'.format(version, release))
        return 0
    if len(args) == 4 and args[0] == 'install' and args[1].startswith('nvidia/') and args[2] == '-k':
        error = host.dkms_build(lab, args[1][len('nvidia/'):], args[3].split('/')[0])
        if error:
            print(error, file=sys.stderr)
            return 10
        return 0
    print('Error! the lab node\'s dkms knows: dkms install nvidia/VERSION -k KERNEL, dkms status', file=sys.stderr)
    return 2


def _module_users(lab):
    """What holds the node's loaded NVIDIA module, so that it cannot be unloaded: its running containers with the
    GPUs' device nodes (a CUDA program's open files, as far as the lab can tell) and nvidia-persistenced (its pid
    file, /var/run/nvidia-persistenced/nvidia-persistenced.pid, naming a live process)."""
    from .containers import Containers
    found = []
    ours = Containers(lab)
    for name in sorted(os.listdir(lab.pve_conf_dir)) if os.path.isdir(lab.pve_conf_dir) else ():
        vmid = name[:-len('.conf')]
        if name.endswith('.conf') and vmid.isdigit() and '/dev/nvidia' in _read(lab.pve_conf(vmid)) \
                and ours.state(int(vmid)) == 'running':
            found.append('CT {0}'.format(vmid))
    pid = _read(os.path.join(lab.node_files, 'run', 'nvidia-persistenced', 'nvidia-persistenced.pid')).strip()
    if pid.isdigit() and os.path.exists('/proc/' + pid):
        found.append('nvidia-persistenced (pid {0})'.format(pid))
    return found


def _nvidia_installer(lab, args):
    """NVIDIA's installer: the driver of its version over the node's, the module built for the running kernel (or
    --kernel-name) with DKMS (--dkms) or into kernel/drivers/video; the loaded module stays until a reboot.

    Like NVIDIA's (nvidia-installer kernel.c, check_for_unloaded_kernel_module, as of 590.48.01), it first unloads
    the loaded NVIDIA modules; one that something holds (a CUDA program, nvidia-persistenced) stays loaded, and a
    silent install then aborts (the question's default is to abort) unless --allow-installation-with-running-driver
    (option_table.h: an installer of 545 or newer knows it; an older one refuses an option it does not know)."""
    version, options = args[0], args[1:]
    if not {'-s', '--silent'} & set(options):
        print('ERROR: the lab\'s installer runs only with --silent', file=sys.stderr)
        return 1
    allowed = '--allow-installation-with-running-driver' in options
    if allowed and host.version_key(version) < host.version_key('545.23.06'):
        print('ERROR: Unrecognized option: "--allow-installation-with-running-driver"', file=sys.stderr)
        return 1
    users = _module_users(lab) if host.loaded_version(lab) else []
    if users and not allowed:
        print("WARNING: An NVIDIA kernel module 'nvidia' appears to be already loaded in your kernel.  This may be "
              'because it is in use (for example, by an X server, a CUDA program, or the NVIDIA Persistence Daemon), '
              'but this may also happen if your kernel was configured without support for module unloading.  '
              '(lab: held by {0})\nERROR: Installation has failed.  Please see the file '
              "'/var/log/nvidia-installer.log' for details.".format(', '.join(users)), file=sys.stderr)
        return 1
    named = [o.split('=', 1)[1] for o in options if o.startswith('--kernel-name=')]
    release = named[0] if named else host.running_kernel(lab)
    if '--dkms' in options:
        errors = host.install_driver(lab, version, [release])
    else:
        errors = host.install_driver(lab, version, [])
        host.add_kernel(lab, release, module=None)
        _write(os.path.join(lab.node_files, 'lib', 'modules', release, 'kernel', 'drivers', 'video', 'nvidia.ko'),
               'lab stand-in module {0}\n'.format(version).encode(), 0o644)
    if errors:
        print('ERROR: Failed to install the kernel module through DKMS. ' + ' '.join(errors), file=sys.stderr)
        return 1
    print('Installation of the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: {0}) is now '
          'complete.'.format(version))
    return 0


def _reboot(lab, args):
    from . import manager
    manager.reboot_node(Lab(), lab.node, say=lambda text: print(text, file=sys.stderr))
    return 0


COMMANDS = {'apt-get': _apt_get, 'apt-cache': _apt_cache, 'apt-mark': _apt_mark, 'dkms': _dkms, 'nvidia-installer': _nvidia_installer,
            'reboot': _reboot}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](Lab.here(), argv[1:])


if __name__ == '__main__':
    sys.exit(main())
