# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's NVIDIA driver upgrade, planned (standard library only): whether the node needs it, whether the new
driver runs every venv profile of the node's GPU containers, and the steps, each named, that the roll makes."""


import re

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _nvidia_kernel
from ansible_collections.gpufleet.proxmox.plugins.module_utils._nvidia_kernel import version_key

# An NVIDIA driver version (580.105.08), or a Debian version of its packages in full (550.163.01-4~bpo13+1).
VERSION_RE = re.compile(r'^\d+\.\d+(\.\d+)?(-[0-9A-Za-z.+~]+)?$')
METHODS = {'apt': "Debian's packages", 'run': "NVIDIA's installer"}


class PlanError(ValueError):
    """A plan that must not run: its message names the field or the container."""


def upstream(version):
    """The upstream part of a Debian version (1:535.309.01-0+deb12u1: 535.309.01); an upstream version as it is."""
    version = str(version or '')
    version = version.split(':', 1)[1] if re.match(r'^\d+:', version) else version
    return version.rsplit('-', 1)[0] if '-' in version else version


def madison(text):
    """{package: [Debian versions]} from apt-cache madison's lines (" libcuda1 | 535.309.01-0+deb12u1 | http://...
    bookworm-security/non-free amd64 Packages")."""
    out = {}
    for line in (text or '').splitlines():
        parts = [p.strip() for p in line.split('|')]
        if len(parts) >= 3 and parts[0] and parts[1] and 'Sources' not in parts[2]:
            out.setdefault(parts[0], [])
            if parts[1] not in out[parts[0]]:
                out[parts[0]].append(parts[1])
    return out


def pick(version, offered, exact=None):
    """The Debian version apt offers (offered: a package's versions) for driver version: (version, None), else (None,
    []) where none is offered, (None, [several]) where the upstream version alone names several. version may be
    upstream (535.309.01) or a Debian version in full; exact: the Debian version asked for every package."""
    want = exact or (version if '-' in version else None)
    if want:
        return (want, None) if want in offered else (None, [])
    mine = [v for v in offered if upstream(v) == version]
    return (mine[0], None) if len(mine) == 1 else (None, mine)


def pins_of(moved, version, offered, exact=None):
    """Each package moved at the Debian version apt offers for version: ({package: Debian version}, problems)."""
    pins, missing, several = {}, [], {}
    for name in moved:
        chosen, others = pick(version, offered.get(name) or [], exact)
        if chosen:
            pins[name] = chosen
        elif others:
            several.setdefault(tuple(others), []).append(name)
        else:
            missing.append(name)
    problems = ['the node\'s sources offer no {0} of {1} (apt-cache madison {2} lists what they offer: apt-get update '
                'first, or add the suite that has it)'.format(exact or version, ', '.join(missing), missing[0])
                ] if missing else []
    problems += ['the node\'s sources offer {0} of {1} for {2}: give the version in full (gpu_node_driver_version={3})'
                 .format(' and '.join(others), version, ', '.join(names), others[0])
                 for others, names in sorted(several.items())]
    return pins, problems


def gpu_containers(fleet, node):
    """The fleet's entries on node that ask for GPUs and are not to be removed."""
    return [entry for entry in fleet if isinstance(entry, dict) and entry.get('node') == node and entry.get('gpus')
            and entry.get('state', 'present') != 'absent']


def refusals(version, containers):
    """Each container whose venv profile needs a newer driver than version (needs: its floor, the oldest driver
    that runs every CUDA wheel of its lock; floor: that said whole): 'CT <vmid> (<hostname>): ...'."""
    return ['CT {0} ({1}): {2}'.format(ct['vmid'], ct['hostname'], ct.get('floor') or 'its venv profile {0} needs an '
                                       'NVIDIA driver of at least {1}'.format(ct.get('profile'), ct['needs']))
            for ct in containers if ct.get('needs') and version_key(version) < version_key(ct['needs'])]


def unmade(node, containers, read):
    """Each GPU container of node (containers: [{vmid, hostname}]) that is not where the fleet says, from read (the
    fleet's containers as a check-mode reconcile reads them through the API: gpu_container's discover):
    'CT <vmid> (<hostname>) ...'. A container the read does not name is not judged."""
    found = dict((r.get('vmid'), r) for r in read or [] if isinstance(r, dict))
    out = []
    for ct in containers:
        got = found.get(ct['vmid'])
        if not got:
            continue
        if got.get('created'):
            out.append('CT {0} ({1}) does not exist'.format(ct['vmid'], ct['hostname']))
        elif got.get('node') != node:
            out.append('CT {0} ({1}) is on {2}, not on {3}'.format(ct['vmid'], ct['hostname'], got.get('node'), node))
    return out


def built_for(found, version):
    """The kernels DKMS built the module of version for (found: gpu_devices' kernels)."""
    return set(((found or {}).get('dkms') or {}).get(version, {}).get('built') or [])


def plan(node, version, method, devices, containers, packages=(), package_version=None, read=None, offered=None,
         need_rollback=True):
    """The upgrade of node to driver version with method (apt or run): {needed, from, to, kernels, containers,
    pins (each package at the Debian version apt offers for it, as apt-get takes it), steps, msg, rollback}.
    devices: gpu_devices' facts of the node; containers: [{vmid, hostname, profile, needs, floor}] of its GPU
    containers; packages: the driver's packages (the ones of one source and version move together: _nvidia_kernel.driver_set);
    offered: {package: [Debian versions the node's apt offers, its cache's included]} (apt-cache madison's);
    read: the fleet's containers as the API has them (unmade). version is upstream (580.105.08) or a Debian version
    in full (550.163.01-4~bpo13+1, another revision of the same upstream). PlanError, before anything changes, where
    the version or method is not one, a container's profile needs a newer driver, or (where the node needs the
    upgrade) a GPU container of the node is not made as the fleet says, or the node cannot take the change: a version
    its sources do not offer, dpkg not finished, no headers for a kernel the module is built for, the way back not
    installable (unless need_rollback is false), Debian's packages and NVIDIA's installer both on the node."""
    if not VERSION_RE.match(str(version or '')):
        raise PlanError('gpu_node_driver_version: {0!r} is not an NVIDIA driver version such as 580.105.08'.format(
            version))
    if method not in METHODS:
        raise PlanError('gpu_node_driver_install: {0!r} must be one of {1}'.format(method, ', '.join(METHODS)))
    target = upstream(version)
    refused = refusals(target, containers)
    if refused:
        raise PlanError('{0}: the NVIDIA driver {1} does not run the venv of every GPU container on it, nothing was '
                        'changed: {2}'.format(node, version, '; '.join(refused)))
    loaded = devices.get('driver_version')
    kernels = devices.get('kernels') or {}
    running, upcoming = kernels.get('running_kernel'), kernels.get('next_kernel')
    wanted = list(dict.fromkeys(k for k in (running, upcoming) if k))  # the two, once where they are the same
    installed = devices.get('installed_versions') or []
    found = dict((n, p) for n, p in (kernels.get('packages') or {}).items() if n in set(packages))
    moved = _nvidia_kernel.driver_set(found) if found else sorted(packages)
    offered = offered or {}
    chosen, problems = pins_of(moved, version, offered, package_version) if method == 'apt' else ({}, [])
    pins = ['{0}={1}'.format(name, v) for name, v in sorted(chosen.items())]
    built = built_for(kernels, target)
    repacked = any(found.get(name, {}).get('version') not in (None, v) for name, v in chosen.items())
    needed = bool(loaded) and (loaded != target or installed[-1:] != [target] or repacked
                               or (bool(kernels.get('dkms')) and not set(wanted) <= built))
    missing = unmade(node, containers, read) if needed else []
    if missing:
        raise PlanError('{0}: its GPU containers are not as the fleet says, nothing was changed: {1}. Make the fleet '
                        'first (ansible-playbook site.yml), then upgrade'.format(node, '; '.join(missing)))
    if needed:
        problems += preflight(method, kernels, wanted, found, moved, offered, need_rollback)
        if problems:
            raise PlanError('{0}: the upgrade to {1} cannot start, nothing was changed: {2}'.format(
                node, version, '; '.join(problems)))
    cts = ', '.join('CT {0} ({1})'.format(ct['vmid'], ct['hostname']) for ct in containers) or 'no GPU container'
    if method == 'apt':
        install = 'install the packages {0} (held again after)'.format(' '.join(pins) or '(none found)')
    else:
        install = "run NVIDIA's installer of {0} (--silent --dkms)".format(target)
    steps = ['stop {0}'.format(cts), install,
             'build the module for {0}'.format(' and '.join(
                 '{0} ({1})'.format(k, 'running' if k == running else 'boots next') for k in wanted) or 'the kernel'),
             'reboot the node (the module {0} loads)'.format(target),
             'make the device nodes and gather the driver bundle of {0}'.format(target),
             'start {0} with that bundle'.format(cts), 'verify {0} (torch and its GPUs)'.format(cts)]
    if not loaded:
        msg = '{0}: no NVIDIA driver is loaded (a node without GPUs): nothing to upgrade'.format(node)
    elif not needed:
        msg = '{0}: runs the NVIDIA driver {1} already: nothing to do'.format(node, version)
    else:
        msg = '{0}: NVIDIA driver {1} -> {2} with {3}; its GPU containers are down from the first step to the last: ' \
              '{4}'.format(node, loaded, version, METHODS[method],
                           '; '.join('{0}. {1}'.format(i + 1, s) for i, s in enumerate(steps)))
    # the way back pins each package moved to the version the node has now (dpkg's)
    now = dict((p, found.get(p, {}).get('version') or '{0}-1'.format(loaded)) for p in moved)
    return {'needed': needed, 'node': node, 'from': loaded, 'to': target, 'method': method, 'kernels': wanted,
            'containers': containers, 'pins': pins, 'steps': steps if needed else [], 'msg': msg,
            'rollback': rollback(node, loaded, target, method, now, [ct['vmid'] for ct in containers])}


def preflight(method, kernels, wanted, found, moved, offered, need_rollback=True):
    """What keeps a node from taking a driver change, each with its fix, checked before any container stops: dpkg
    not finished, the headers of a kernel the module must be built for, Debian's packages beside NVIDIA's installer
    (or the other method than the node's), and (apt) a way back that apt can no longer install."""
    out = []
    unfinished = kernels.get('unfinished') or {}
    if unfinished:
        out.append('dpkg has not finished {0}: run dpkg --configure -a (dpkg --audit names them)'.format(
            ', '.join('{0} ({1})'.format(n, st) for n, st in sorted(unfinished.items()))))
    for k in wanted:
        if (kernels.get('headers') or {}).get(k) is False:
            out.append('kernel {0} has no headers to build the module against: apt install {1}'.format(
                k, _nvidia_kernel.headers_package(k)))
    runfile = kernels.get('runfile') or []
    if found and runfile:
        out.append("the driver is both Debian's packages ({0}) and NVIDIA's installer's files ({1}): remove one of "
                   "them first (nvidia-uninstall, or apt purge of the packages)".format(
                       ', '.join(sorted(found)), ', '.join('/' + r for r in runfile)))
    elif method == 'apt' and runfile and not found:
        out.append("the driver was installed with NVIDIA's installer ({0}): set gpu_node_driver_install: run".format(
            '/' + runfile[0]))
    elif method == 'run' and found:
        out.append("the driver is Debian's packages ({0}): set gpu_node_driver_install: apt".format(
            ', '.join(sorted(found))))
    if method == 'apt' and need_rollback:
        gone = ['{0}={1}'.format(n, found[n]['version']) for n in moved
                if n in found and found[n].get('version') not in (offered.get(n) or [])]
        if gone:
            out.append('the way back needs {0}, which the node\'s sources no longer offer and its apt cache does not '
                       'hold: keep them in /var/cache/apt/archives (apt-get download while they are offered, or from '
                       'snapshot.debian.org), or go on without a way back (gpu_node_driver_rollback: false)'.format(
                           ' '.join(gone)))
    return out


def rollback(node, old, new, method, packages=None, stopped=()):
    """What a node whose upgrade failed is left as, and how to go back to driver old (packages: {package: its
    version now}) or on to new."""
    if method == 'apt':
        back = 'apt-get install -y --allow-change-held-packages --allow-downgrades {0}'.format(
            ' '.join('{0}={1}'.format(p, v) for p, v in (packages or {}).items()))
    else:
        back = 'sh NVIDIA-Linux-x86_64-{0}.run --silent --dkms'.format(old)
    cts = ' '.join(str(v) for v in stopped)
    return ('{0} is left as the failed step left it, its GPU containers ({1}) stopped. To go back to {2}: {3}, '
            'reboot the node, then run site.yml (it starts and verifies them; each container was snapshotted before '
            'it stopped, where PVE could: gpufleet rollback CT puts one back as it was). To go on with {4}: mend what '
            'failed and run the upgrade again').format(node, cts or 'none', old, back, new)
