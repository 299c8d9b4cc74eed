# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drift in words: what each stage of a site run found different from the fleet definition (in check mode:
what a repair run would change), as items {stage, item, detail} per node and per container."""

import re

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _gpu, _pvecheck

# A container's mount points and devices (mpN, devN): the fleet's, all of them.
HAND_MADE = re.compile(r'^(mp|dev)[0-9]+$')


def _item(stage, item, detail, **extra):
    out = {'stage': stage, 'item': item, 'detail': detail}
    out.update(extra)
    return out


# What a run's node stage (gpu_node) mends of discovery's findings: the device nodes and nvidia-uvm, the boot files,
# the driver bundle, the shared directories. Any other finding (a driver not held, a module not built for the kernel
# the node boots next, a driver not loaded) is the operator's: a run never says it repaired one.
NODE_MENDED = ('nvidiactl_missing', 'gpu_nodes_missing', 'uvm_not_loaded', 'uvm_node_missing', 'uvm_node_stale',
               'file_stale', 'share_missing', 'share_owner', 'share_mode')


def _devn_path(value):
    """The device path of a devN value ('' where it has none or is no property string)."""
    try:
        return dict(_pvecheck.property_pairs(value or '', 'path')).get('path', '')
    except ValueError:
        return ''


def mended_by_a_run(finding):
    """Whether a run's node stage mends this discovery finding (NODE_MENDED, or a driver bundle it can gather)."""
    return finding.get('code') in NODE_MENDED or (finding.get('code') == 'bundle_stale'
                                                  and finding.get('fix') in [v.gather_fix for v in _gpu.VENDORS.values()])


def node(gpu_devices):
    """A node's drift: gpu_devices' findings (nvidia-uvm not loaded, its nodes missing or stale, no driver, a
    shared directory missing or not as it should be, the driver bundle out of date, the driver across the node's
    kernels and its packages), each with its fix where it has one; those a run does not mend (NODE_MENDED) marked
    yours (the fix is the operator's)."""
    out = []
    for f in (gpu_devices or {}).get('findings') or []:
        extra = {'fix': f['fix']} if f.get('fix') else {}
        if not mended_by_a_run(f):
            extra['yours'] = True
        out.append(_item('node', f.get('code'), f.get('msg') or f.get('fix') or '', **extra))
    return out


def _named(key, config):
    """A config key as the operator knows it: a devN with its device's path."""
    if key == 'lxc':
        return 'its raw lines (lxc)'
    path = _devn_path((config or {}).get(key)) if key.startswith('dev') else ''
    return '{0} ({1})'.format(key, path) if path else key


def unfit(found, indexes):
    """Why a node (found: its gpu_devices facts) cannot give a container these GPU indexes, or None where it can: GPUs
    it does not have, or no NVIDIA driver loaded."""
    found = found or {}
    have = sorted(g.get('index') for g in found.get('gpus') or [] if g.get('index') is not None)
    lacking = [i for i in indexes if i not in have]
    if lacking:
        return 'it has no GPU {0} (it has {1})'.format(
            ', '.join(str(i) for i in lacking), ', '.join(str(i) for i in have) or 'none')
    if not found.get('driver_version'):
        return 'no NVIDIA driver is loaded there'
    return None


def moved(wanted, found, indexes, devices, refused=None):
    """A container found on another node than the fleet's (moved by a migration or an HA recovery) in words: whether
    the node it runs on now gives it its GPUs, and which node would (the fleet's first, then any other the run read),
    or that PVE cannot move it back."""
    detail = 'node: expected {0}, found {1}'.format(wanted, found)
    if indexes and devices and found in devices:
        why = unfit(devices.get(found), indexes)
        fits = [n for n in [wanted] + sorted(n for n in devices if n not in (wanted, found))
                if n in devices and unfit(devices[n], indexes) is None]
        if why:
            detail += '; on {0} it is without its GPUs ({1})'.format(found, why)
        if fits:
            detail += '; {0} would fit (GPU {1}{2})'.format(
                ', '.join(fits), ', '.join(str(i) for i in indexes),
                ', a driver loaded' if why == 'no NVIDIA driver is loaded there' else '')
        else:
            detail += '; no node the run read has GPU {0} with a driver loaded'.format(
                ', '.join(str(i) for i in indexes))
    if refused:
        detail += ' (PVE cannot move it back: {0})'.format(refused)
    return detail


RESTART_HOW = ('a run restarts it only where allowed: restart_on_pending: true in its entry, or '
               'gpu_container_restart_on_pending: true for the fleet')


def containers(reconcile, fleet, check_mode=True, devices=None, gpus=None):
    """{container hostname: items} from gpu_container's lxc_container result: config keys that differ (before
    and after), a container to create or destroy, a power state to change, changes waiting for a restart, and the
    orphans. Each item that is not applied to the running container is marked waits (PVE keeps it pending until a
    restart: never repaired while it waits), and each orphan left (reported, never repaired). A container found on
    another node says whether that node gives it its GPUs (devices: {node: gpu_devices facts}; gpus: {vmid: its
    GPU indexes}) and which node would."""
    names = dict((e.get('vmid'), e.get('hostname')) for e in fleet or [])
    diffs = (reconcile or {}).get('diff') or []
    diffs = dict((d.get('before_header'), d) for d in ([diffs] if isinstance(diffs, dict) else diffs))
    out = {}
    for res in (reconcile or {}).get('containers') or []:
        vmid = res.get('vmid')
        items = []
        diff = diffs.get('CT {0}'.format(vmid)) or {}
        before, after = diff.get('before') or {}, diff.get('after') or {}
        pending = set(res.get('pending') or []) if res.get('restart_required') else set()
        if res.get('created'):
            items.append(_item('container', 'missing', 'CT {0} does not exist'.format(vmid)))
        elif res.get('status') == 'absent' and res.get('changed'):
            items.append(_item('container', 'removal', (
                'CT {0} on {1} is in the fleet with state absent: a run destroys it' if check_mode else
                'CT {0} on {1} was destroyed (state absent in the fleet)').format(vmid, res.get('node')),
                before=before.get('status'), after='absent'))
        else:
            for key in res.get('changed_keys') or []:
                if key == 'node':
                    detail = moved(after.get(key), before.get(key), (gpus or {}).get(vmid) or [], devices,
                                   res.get('move_refused'))
                elif key.startswith('dev') and after.get(key) is None and _gpu.any_device_node(_devn_path(before.get(key))):
                    detail = '{0} is no longer given to CT {1}: a repair removes it'.format(_named(key, before), vmid)
                elif HAND_MADE.match(key) and after.get(key) is None and before.get(key) is not None:
                    # the fleet owns a container's mount points and devices: one it does not declare is removed
                    kind = 'mounts' if key.startswith('mp') else 'devices'
                    detail = ('{0} ({1}) is not in the fleet definition: a repair removes it; declare it in the '
                              'entry\'s {2} to keep it'.format(key, before[key], kind))
                elif before.get(key) is None and key.startswith('dev'):
                    detail = '{0} is new'.format(_named(key, after))
                elif key == 'lxc':
                    # the binds of its node's driver bundle and shares, and raw GPU passthrough (fleet_plan's raw)
                    gone = [line for line in before.get(key) or [] if line not in (after.get(key) or [])]
                    new = [line for line in after.get(key) or [] if line not in (before.get(key) or [])]
                    detail = 'its raw lines differ: {0}'.format('; '.join(
                        ['{0} (not in the fleet)'.format(line) for line in gone] +
                        ['{0} (missing)'.format(line) for line in new]))
                else:
                    detail = 'config {0} differs'.format(key)
                extra = {}
                if key in pending:
                    detail += ('; it would wait for a restart of CT {0}' if check_mode else
                               '; written, it waits for a restart of CT {0}').format(vmid)
                    extra['waits'] = True
                items.append(_item('container', key, detail, before=before.get(key), after=after.get(key), **extra))
        if res.get('power'):
            was = before.get('status') or 'absent'
            done = {'start': 'started', 'shutdown': 'shut down', 'reboot': 'rebooted', 'stop': 'stopped'}
            detail = ('CT {0} is {1}: {2} it'.format(vmid, was, res['power']) if check_mode else
                      'CT {0} was {1}: {2}'.format(vmid, was, done.get(res['power'], res['power'])))
            if res['power'] == 'reboot' and res.get('pending'):
                detail += ' to apply {0}'.format(', '.join(_named(k, res.get('config') or after) for k in res['pending']))
            items.append(_item('container', 'power', detail, before=was, after=after.get('status') or 'running'))
        if pending:
            keys = ', '.join(_named(k, dict(before, **(res.get('config') or after))) for k in sorted(pending))
            items.append(_item('container', 'restart', (
                'CT {0} would take the change of {1} only when it restarts; {2}' if check_mode else
                'CT {0} takes the change of {1} only when it restarts: restart it when its jobs allow (pct reboot {0}), '
                'or {2}').format(vmid, keys, RESTART_HOW), waits=True, keys=sorted(pending)))
        out[names.get(vmid) or str(vmid)] = items
    # the cluster's containers that carry the fleet's tag but are not in its definition: reported, left alone
    for orphan in (reconcile or {}).get('orphans') or []:
        name = orphan.get('name') or 'CT {0}'.format(orphan['vmid'])
        out['CT {0}'.format(orphan['vmid']) if name in out else name] = [_item(
            'container', 'orphan', 'CT {0} on {1} ({2}) carries the fleet\'s tag but is not in its definition: it is '
            'left as it is, its GPUs held (add it to gpufleet_containers, or take the tag off, or destroy it)'.format(
                orphan['vmid'], orphan.get('node'), orphan.get('status')), vmid=orphan['vmid'], node=orphan.get('node'),
            left=True)]
    return out


def container(driver=None, build=None, report=None, engine=None):
    """A running container's own drift: its userspace driver, the CDI spec of its GPUs for its OCI engine (engine:
    cdi_spec's result), its venv against its lock (the build's result and the audit it returned), its
    verification."""
    items = []
    if driver and driver.get('match') in (False, 'False') and driver.get('node_version'):
        items.append(_item('driver', 'userspace_driver', 'libcuda {0} but the node runs {1}'.format(
            driver.get('version') or 'none', driver.get('node_version'))))
    for f in (engine or {}).get('findings') or []:
        items.append(_item('engine', f.get('check'), f.get('msg')))
    if build and build.get('built') and build.get('python_changed'):
        items.append(_item('venv', 'python_changed', 'the container\'s Python is now {to}, and the active venv was made for '
                           '{from}: build {id} for {to} from its lock'.format(id=build.get('id'), **build['python_changed'])))
    elif build and build.get('built'):
        items.append(_item('venv', 'lock', 'no venv of its lock yet: build {0}'.format(build.get('id'))))
    elif build and build.get('switched'):
        items.append(_item('venv', 'active', 'the active venv is not its lock\'s: switch to {0}'.format(build.get('id'))))
    elif build and build.get('lock_written'):
        items.append(_item('venv', 'lock_file', 'the lock file in the container is not the profile\'s'))
    unlocked = (build or {}).get('python_not_locked')
    if unlocked:
        items.append(_item('venv', 'python_not_locked', unlocked['msg'], fix=unlocked['fix']))
    python = (build or {}).get('container_python') or (build or {}).get('python_repaired')
    if python:
        items.append(_item('container', 'python', python['msg'], fix=python['fix']))
    audit = (build or {}).get('audit') or {}
    findings = audit.get('findings') or {}
    if build and build.get('kept_broken'):
        items.append(_item('venv', 'rebuilt', 'the venv could not start, so it was built again from its lock beside '
                           'it and switched to once it imported; the broken one is kept at {0}'.format(
                               build['kept_broken']), kept=build['kept_broken']))
    for f in findings.get('interpreter') or []:
        items.append(_item('venv', f.get('check'), f.get('msg'), fix=f.get('fix')))
    for f in findings.get('startup_files') or []:
        runs = '; '.join(f.get('lines') or []) or f['kind']
        items.append(_item('venv', 'startup_file', '{0} in site-packages runs at every start ({1}) and no distribution '
                           'installed it: a repair moves it aside'.format(f['path'], runs)))
    for f in findings.get('job_env') or []:
        items.append(_item('venv', 'job_env', f['msg'], fix=f['fix']))
    for b in findings.get('broken_distributions') or []:
        items.append(_item('venv', 'broken_distribution', '{0} {1}: {2} file(s) missing, {3} changed'.format(
            b['name'], b['version'], len(b['missing']), len(b['modified'])), files=b['missing'] + b['modified']))
    for c in findings.get('collisions') or []:
        items.append(_item('venv', 'collision', '{0} is claimed by {1}, bytes of {2}'.format(
            c['path'], ', '.join(c['claimed_by']), c.get('on_disk'))))
    for u in findings.get('unresolved_libraries') or []:
        items.append(_item('venv', 'unresolved_library', '{0} needed by {1} is not found (provided by {2})'.format(
            u['soname'], ', '.join(u['needed_by'][:3]), ', '.join(u.get('provided_by') or []) or 'nothing installed')))
    for m in findings.get('missing_requirements') or []:
        items.append(_item('venv', 'missing_requirement', '{0} is not installed (required by {1}: {2})'.format(
            m['name'], ', '.join(m['required_by']), m['requirement'])))
    for f in findings.get('failed_imports') or []:
        items.append(_item('venv', 'failed_import', 'import {0} fails: {1}'.format(f['module'], f.get('message'))))
    for kind, entries in sorted((findings.get('drift') or {}).items()):
        for e in entries:
            items.append(_item('venv', kind if kind != 'missing' else 'missing_package',
                               '{0} {1}'.format(e['name'], e.get('version') or '{0} (locked {1})'.format(
                                   e.get('installed'), e.get('locked')))))
    for f in ((report or {}).get('torch') or {}).get('failures') or []:
        items.append(_item('verify', f.get('check'), 'expected {0}, got {1}'.format(f.get('expected'), f.get('actual'))))
    return items


def unverified(fleet):
    """{container hostname: items} for the containers of the fleet's verdict (the verify role's verify_fleet) that
    run but were not verified in this run (unreached) or were not read through the API (unread): the other
    states are drift of their own already (missing, stopped) or the container's verification items."""
    return dict((row['host'], [_item('verify', row['state'], row.get('why') or '')])
                for row in (fleet or {}).get('containers') or [] if row.get('state') in ('unreached', 'unread'))


def fleet(devices, reconcile, definition, running, verdict, check_mode, gpus=None):
    """The fleet's drift report from what a run saw: devices {node: its gpu_devices facts}; reconcile and
    definition: gpu_container's lxc_container result and the fleet's entries; running {container hostname:
    {driver, build, report}} (its userspace_driver and venv_build results, its verify report); verdict: the fleet's
    verification (plugin_utils/_verdict.fleet), or None where it was not judged; gpus: {vmid: the GPU indexes the
    run's plan gives it}."""
    hosts = containers(reconcile, definition, check_mode, devices, gpus)
    for host, seen in sorted((running or {}).items()):
        hosts.setdefault(host, []).extend(container(**seen))
    for host, items in unverified(verdict).items():
        hosts.setdefault(host, []).extend(items)
    return summary(dict((name, node(found)) for name, found in (devices or {}).items()), hosts, check_mode)


def summary(nodes, containers, check_mode):
    """The fleet's drift report: every node's and container's items, and counts: count, the drift a run repairs (in
    repair mode, repaired), of which waiting wait for a restart (in repair mode: written, not applied) and yours are
    the operator's to fix (a run never mends them); orphans, the containers left alone, which are no drift of the
    fleet's."""
    hosts = dict(('node/' + k, v) for k, v in (nodes or {}).items())
    hosts.update(('container/' + k, v) for k, v in (containers or {}).items())
    every = [i for v in hosts.values() for i in v]
    drift = [i for i in every if not i.get('left')]
    return {'mode': 'check' if check_mode else 'repair', 'drift': bool(drift), 'count': len(drift),
            'waiting': sum(1 for i in drift if i.get('waits')),
            'yours': sum(1 for i in drift if i.get('yours')),
            'yours_hosts': sorted(h.split('/', 1)[1] for h, v in hosts.items() if any(i.get('yours') for i in v)),
            'waiting_hosts': sorted(h.split('/', 1)[1] for h, v in hosts.items() if any(i.get('waits') for i in v)),
            'orphans': sorted(h.split('/', 1)[1] for h, v in hosts.items() if any(i.get('left') for i in v)),
            'nodes': nodes or {}, 'containers': containers or {}}


def reports(fleet):
    """The files of a drift run from its summary: one report per host ({host, kind, mode, drift, items}) and
    the summary itself under 'summary'."""
    out = {'summary': fleet}
    for kind, group in (('node', 'nodes'), ('container', 'containers')):
        for host, items in (fleet.get(group) or {}).items():
            out[host] = {'host': host, 'kind': kind, 'mode': fleet.get('mode'), 'drift': bool(items), 'items': items}
    return out
