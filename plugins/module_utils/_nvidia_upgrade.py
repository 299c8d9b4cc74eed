# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's NVIDIA driver upgrade, planned (standard library only): whether the node needs it, whether the new
driver runs every venv profile of the node's GPU containers, and the steps, each named, that the roll makes."""


import re

from ansible_collections.gpufleet.proxmox.plugins.module_utils._nvidia_kernel import version_key

VERSION_RE = re.compile(r'^\d+\.\d+(\.\d+)?$')
METHODS = {'apt': "Debian's packages", 'run': "NVIDIA's installer"}


class PlanError(ValueError):
    """A plan that must not run: its message names the field or the container."""


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


def plan(node, version, method, devices, containers, packages=(), package_version=None, read=None):
    """The upgrade of node to driver version with method (apt or run): {needed, from, to, kernels, containers,
    pins (each package at its new version, as apt-get takes it), steps, msg, rollback}. devices: gpu_devices' facts
    of the node; containers: [{vmid, hostname, profile, needs, floor}] of its GPU containers; read: the fleet's containers
    as the API has them (unmade). PlanError where the version or method is not one, a container's profile needs a
    newer driver, or (where the node needs the upgrade) a GPU container of the node is not made as the fleet says:
    the roll would stop, start and verify what is not there."""
    if not VERSION_RE.match(str(version or '')):
        raise PlanError('gpu_node_driver_version: {0!r} is not an NVIDIA driver version such as 580.105.08'.format(
            version))
    if method not in METHODS:
        raise PlanError('gpu_node_driver_install: {0!r} must be one of {1}'.format(method, ', '.join(METHODS)))
    refused = refusals(version, containers)
    if refused:
        raise PlanError('{0}: the NVIDIA driver {1} does not run the venv of every GPU container on it, nothing was '
                        'changed: {2}'.format(node, version, '; '.join(refused)))
    loaded = devices.get('driver_version')
    kernels = devices.get('kernels') or {}
    running, upcoming = kernels.get('running_kernel'), kernels.get('next_kernel')
    wanted = list(dict.fromkeys(k for k in (running, upcoming) if k))  # the two, once where they are the same
    installed = devices.get('installed_versions') or []
    built = built_for(kernels, version)
    needed = bool(loaded) and (loaded != version or installed[-1:] != [version]
                               or (bool(kernels.get('dkms')) and not set(wanted) <= built))
    missing = unmade(node, containers, read) if needed else []
    if missing:
        raise PlanError('{0}: its GPU containers are not as the fleet says, nothing was changed: {1}. Make the fleet '
                        'first (ansible-playbook site.yml), then upgrade'.format(node, '; '.join(missing)))
    cts = ', '.join('CT {0} ({1})'.format(ct['vmid'], ct['hostname']) for ct in containers) or 'no GPU container'
    pins = ['{0}={1}'.format(p, package_version or version + '-1') for p in packages]
    if method == 'apt':
        install = 'install the packages {0} (held again after)'.format(' '.join(pins) or '(none found)')
    else:
        install = "run NVIDIA's installer of {0} (--silent --dkms)".format(version)
    steps = ['stop {0}'.format(cts), install,
             'build the module for {0}'.format(' and '.join(
                 '{0} ({1})'.format(k, 'running' if k == running else 'boots next') for k in wanted) or 'the kernel'),
             'reboot the node (the module {0} loads)'.format(version),
             'make the device nodes and gather the driver bundle of {0}'.format(version),
             'start {0} with that bundle'.format(cts), 'verify {0} (torch and its GPUs)'.format(cts)]
    if not loaded:
        msg = '{0}: no NVIDIA driver is loaded (a node without GPUs): nothing to upgrade'.format(node)
    elif not needed:
        msg = '{0}: runs the NVIDIA driver {1} already: nothing to do'.format(node, version)
    else:
        msg = '{0}: NVIDIA driver {1} -> {2} with {3}; its GPU containers are down from the first step to the last: ' \
              '{4}'.format(node, loaded, version, METHODS[method],
                           '; '.join('{0}. {1}'.format(i + 1, s) for i, s in enumerate(steps)))
    # the way back pins each package to the version the node has now (dpkg's), else the driver's with -1
    now = dict((p, (kernels.get('packages') or {}).get(p, {}).get('version') or '{0}-1'.format(loaded))
               for p in packages)
    return {'needed': needed, 'node': node, 'from': loaded, 'to': version, 'method': method, 'kernels': wanted,
            'containers': containers, 'pins': pins, 'steps': steps if needed else [], 'msg': msg,
            'rollback': rollback(node, loaded, version, method, now, [ct['vmid'] for ct in containers])}


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
            'reboot the node, then run site.yml (it starts and verifies them). To go on with {4}: mend what failed '
            'and run the upgrade again').format(node, cts or 'none', old, back, new)
