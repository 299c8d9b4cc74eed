# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verify role's decisions for one container, on the controller (the verify_container action): what to expect,
whether the last passing verification stands, the report and its problems in words."""


import base64
import hashlib
import json

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _profile


def state(facts):
    """What the verify role works out for one container before it audits and verifies, from the facts of this
    run (see roles/verify/vars/main.yml for what each one is): the venv's profile (meta), what torch must show
    (expect), whether CUDA is required (cuda), whether torch_venv audited this venv in this run and left it as it
    found it or as its repair left it (audited, with that audit; else the role audits), the fingerprint of everything a verification
    depends on, and whether the last passing verification (recorded in the venv) stands instead of importing
    torch again (reuse, with its result marked reused, verified_at and age_s)."""
    settings = facts.get('settings') or {}
    built = facts.get('built') or {}
    ran = 'id' in built  # torch_venv ran in this run (its venv_build result)
    # after a repair, the audit venv_build made of the repaired venv (a repair also makes the run changed, so a
    # record is never reused after one)
    built_audit = built.get('repair_audit') or built.get('audit') or {}
    if ran:
        meta = built.get('meta') or {}
    else:
        marker = facts.get('marker')
        try:
            meta = (json.loads(base64.b64decode(marker).decode('utf-8')) or {}).get('meta') or {} if marker else {}
        except (ValueError, TypeError, AttributeError):
            meta = {}
    venv, check_mode = facts.get('venv'), bool(facts.get('check_mode'))
    here = ran and built.get('link') == venv
    audited = ('healthy' in built_audit and settings.get('audit_mode', 'fast') == 'fast' and here
               and (bool(built_audit['healthy']) or check_mode))
    gpus = list(facts.get('gpus') or [])
    profile_expect = meta.get('expect') or {}
    require = settings.get('require_cuda', 'auto')
    if require == 'auto':
        cuda = bool(gpus) and profile_expect.get('cuda_version') is not None
    else:
        cuda = boolean(require, strict=False)  # as Jinja's bool filter reads it
    expect = dict((k, profile_expect.get(k)) for k in ('torch_version', 'cuda_version', 'cudnn_version', 'nccl_version'))
    expect.update(device_count=len(gpus) if cuda else None,
                  driver_version=facts.get('node_driver') if cuda else None)
    expect.update(settings.get('expect') or {})
    driver = facts.get('driver') or {}
    inputs = {'venv': built.get('id'), 'libcuda': [driver.get('version'), driver.get('library')],
              'node_driver': facts.get('node_driver'), 'gpus': gpus, 'devices': facts.get('devices') or [],
              'expect': expect,
              'options': [cuda, settings.get('smoke'), float(settings.get('min_tflops') or 0),
                          bool(settings.get('compile_check')), settings.get('compile_backend'), settings.get('user'),
                          bool(settings.get('collective')), float(settings.get('min_allreduce_gbps') or 0),
                          int(settings.get('min_shm_mb_per_gpu') or 0), bool(settings.get('train_step')),
                          settings.get('throughput_baseline'), float(settings.get('max_throughput_drop') or 0),
                          int(settings.get('min_nofile') or 0), bool(settings.get('rdma'))]}
    fingerprint = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode('utf-8')).hexdigest()
    record, max_age = built.get('verified'), int(settings.get('max_age') or 0)
    reuse = bool(max_age > 0 and isinstance(record, dict) and audited and built_audit.get('healthy')
                 and not built.get('changed', True) and not driver.get('changed')
                 and not facts.get('container_changed')
                 and record.get('fingerprint') == fingerprint and 0 <= int(record.get('age_s', -1)) <= max_age)
    result = None
    if reuse:
        result = dict(record.get('result') or {}, reused=True, verified_at=record.get('verified_at'),
                      age_s=record.get('age_s'))
    return {'meta': meta, 'expect': expect, 'cuda': cuda, 'audited': audited, 'audit': built_audit if audited else None,
            'fingerprint': fingerprint, 'reuse': reuse, 'result': result,
            'below_floor': below_floor(meta, facts.get('node_driver') if cuda else None)}


def below_floor(meta, node_driver):
    """A failure where the node's driver is older than the venv's floor (the oldest driver that runs every CUDA wheel
    of its lock, kept in the venv's marker when it was built), else None: the first cuDNN or NCCL call would fail
    even where torch imports and counts the devices."""
    floor = (meta or {}).get('floor')
    if not _profile.below_floor(node_driver, floor):
        return None
    return {'check': 'driver_floor', 'expected': 'an NVIDIA driver of at least ' + floor['driver'],
            'actual': node_driver, 'why': _profile.floor_words(meta.get('profile'), floor),
            'fix': "upgrade the node's driver to {0} or newer (gpufleet driver-upgrade), or rebuild this venv from a "
                   'profile whose wheels the driver runs'.format(floor['driver'])}


def with_failure(result, failure):
    """A verification result with one more failure, said in its message too (None: the result as it is)."""
    if not failure:
        return result
    said = '{0}: expected {1}, got {2} ({3})'.format(failure['check'], failure['expected'], failure['actual'],
                                                     failure['why'])
    return dict(result or {}, failures=list((result or {}).get('failures') or []) + [failure],
                msg='; '.join(m for m in ((result or {}).get('msg'), said) if m))


# What a task result holds besides the verification's own values.
INTERNAL = ('changed', 'failed', 'invocation', 'msg', 'failed_when_result', 'warnings', 'deprecations', 'recorded',
            'exception')


def plain(result):
    """A module's result as data to keep in facts: without its invocation, its captured error (an object a fact
    cache cannot store) and Ansible's own keys."""
    return dict((k, v) for k, v in (result or {}).items()
                if k not in ('invocation', 'exception') and not k.startswith('_ansible'))


def report(now, audit, result, host, node=None, vmid=None, run=None):
    """One container's verification report: the run that made it, what was expected, what torch showed (the result
    without the task's own keys), the venv's audit, and ok (the audit is healthy and the verification has no
    failures; a result without failures at all - the probe did not run - is not ok)."""
    audit, result = audit or {}, result or {}
    healthy = bool(audit.get('healthy', False))
    return {'host': host, 'node': node, 'vmid': vmid, 'run': run, 'profile': (now.get('meta') or {}).get('profile'),
            'ok': healthy and not result.get('failures', ['probe']), 'expected': now.get('expect'),
            'torch': dict((k, v) for k, v in result.items() if k not in INTERNAL),
            'audit': {'healthy': healthy, 'findings': audit.get('findings') or {},
                      'error': audit.get('msg') if 'healthy' not in audit else None}}


def problems(audit, result):
    """What is wrong with one container, in words: the verification's message where it has failures or did not
    run, and the venv audit's message or findings where it is not healthy."""
    audit, result = audit or {}, result or {}
    found = [result.get('msg') or 'torch was not verified'] if result.get('failures', ['probe']) else []
    if not audit.get('healthy', False):
        found.append('venv audit: ' + (audit.get('msg') or json.dumps(audit.get('findings') or {}, sort_keys=True)))
    return found


def audit_count(findings):
    """How many findings a venv audit has (whether it starts, its startup files, what its activation sets for a job,
    broken distributions, collisions, unresolved libraries, drift)."""
    findings = findings or {}
    drift = findings.get('drift') or {}
    kinds = ('broken_distributions', 'collisions', 'unresolved_libraries', 'failed_imports', 'missing_requirements',
             'interpreter', 'startup_files', 'job_env')
    return sum(len(findings.get(k) or []) for k in kinds) + sum(len(v) for v in drift.values())


def rolled_back(told):
    """What a container's report keeps of its rollback in this run (told: the verify role's verify_rolled_back -
    snapshot, done, msg, and change: the message of the change that failed, or first: the report of the verification
    that failed after it): the snapshot, whether the rollback was made (error: why not), what failed (the change or
    its verification) and its failures in words."""
    first = told.get('first') or {}
    failed = [str(told['change'])] if told.get('change') else _row(first)['failures'] if first else [
        'its verification after the change failed']
    return {'snapshot': told.get('snapshot'), 'done': bool(told.get('done')), 'error': told.get('msg') or None,
            'failed': 'change' if told.get('change') else 'verification', 'change_failed': failed}


def _rolled_back_words(r, failures):
    """The failures of a rolled-back container's row, in words: both verdicts."""
    back = r['rolled_back']
    then = ('rolled back to {0} and started; verified again: '.format(back['snapshot']) +
            ('ok' if r.get('ok') else '; '.join(failures) or 'failed')) if back['done'] else \
        'the rollback to {0} failed: {1}'.format(back['snapshot'], back['error'])
    what = ' verification' if back.get('failed') != 'change' else ''
    return ['its change failed{0} ({1}); {2}'.format(what, '; '.join(back['change_failed']), then)]


def row(r):
    """One verified container's row of the summary, from its report. A container rolled back in this run to the
    snapshot taken before its change is rolled_back, not ok, whatever its verification after the rollback said."""
    out = _row(r)
    if r.get('rolled_back'):
        out.update(state='rolled_back', ok=False, failures=_rolled_back_words(r, out['failures']))
    return out


def _row(r):
    """One verified container's row of the summary, from its report (its rollback left aside: row)."""
    torch = r.get('torch') or {}
    ok = bool(r.get('ok'))
    return {
        'host': r.get('host'), 'node': r.get('node'), 'vmid': r.get('vmid'), 'profile': r.get('profile'),
        'state': 'verified' if ok else 'failed', 'ok': ok, 'torch_version': torch.get('torch_version'),
        'cuda_version': torch.get('cuda_version'), 'cuda_available': torch.get('cuda_available'),
        'driver_version': torch.get('driver_version'), 'devices_seen': torch.get('device_count'),
        'devices_expected': (r.get('expected') or {}).get('device_count'),
        'failures': ['{0}: expected {1}, got {2}'.format(f.get('check'), f.get('expected'), f.get('actual'))
                     for f in torch.get('failures') or []] or ([] if ok else problems(r.get('audit'), r.get('torch'))),
        'venv_findings': audit_count((r.get('audit') or {}).get('findings')),
        'checks': checks(torch.get('checks')),
        'allreduce_gbps': next((c.get('algbw_gbps') for c in torch.get('checks') or []
                                if c.get('name') == 'allreduce' and c.get('status') == 'ok'), None),
        'tokens_per_s': (torch.get('throughput') or {}).get('tokens_per_s'),
        'throughput_ratio': (torch.get('throughput') or {}).get('ratio'),
    }


def checks(found):
    """{check: its status} of a verification's checks (each CUDA library's, the collective's, /dev/shm's, the
    training step's), the worst of a check's devices: failed over ok over not_applicable."""
    order = ('not_applicable', 'ok', 'failed')
    out = {}
    for c in found or []:
        status = c.get('status') if c.get('status') in order else 'failed'
        if order.index(status) >= order.index(out.get(c.get('name'), 'not_applicable')):
            out[c.get('name')] = status
    return out


# Why a container of the fleet was not verified, by its state.
NOT_VERIFIED = {
    'missing': 'CT {vmid} does not exist on {node}',
    'stopped': 'CT {vmid} on {node} is {status}, not running',
    'unreached': 'CT {vmid} runs on {node} but was not verified: it was unreachable or an earlier task failed on it',
    'unread': 'CT {vmid} was not read through the API: the containers stage did not run or failed',
    'node_unreachable': 'CT {vmid} on {node} was not reached: the run could not reach its node (unreachable, or a '
                        'task failed there)',
    'limited': 'CT {vmid} runs on {node} but was not verified: this run\'s --limit ({limit}) leaves its container out '
               '(gpufleet --node {node}, or add {group}_{node} to --limit)',
}


def found(container, as_found):
    """A container's status as lxc_container's result says: as it was found (check mode, or a read-only run: a
    container the run would create is absent, one it would start is stopped, one it would shut down runs), or as
    the run left it."""
    if container is None:
        return None
    if as_found:
        if container.get('created'):
            return 'absent'
        if container.get('power') in ('start', 'shutdown'):
            return 'stopped' if container['power'] == 'start' else 'running'
    return container.get('status') or 'absent'


def nodes(devices):
    """{node: {driver_version, gpus}} of the nodes discovery read (devices: {node: its gpu_devices fact}): the loaded
    driver's version and each GPU (index, pci_bus_id, uuid, name, where nvidia-smi said them, and held_by: the
    containers of the node given it, [{vmid, name}], whoever made them)."""
    def held(found, index):
        by = found.get('held') or {}
        return sorted(by.get(index) or by.get(str(index)) or [], key=lambda h: h.get('vmid') or 0)
    return dict((node, {'driver_version': found.get('driver_version'),
                        'gpus': [dict([(k, g.get(k)) for k in ('index', 'pci_bus_id', 'uuid', 'name')],
                                      held_by=held(found, g.get('index')))
                                 for g in found.get('gpus') or []]})
                for node, found in sorted(devices.items()) if found)


def fleet(reports, containers, reconcile, run=None, check_mode=False, unreachable=(), gpus=None, failed=None,
          limit=None, group='gpufleet_running'):
    """The fleet's verification as one verdict over every container of the fleet definition, not only the ones
    this run reached. reports: the verify role's reports of this run (others, from an earlier run, are ignored
    where run is given); containers: the fleet definition's entries; reconcile: gpu_container's lxc_container
    result (what the API said of each container; read-only where checked_only). Each container is verified,
    failed (its own findings), missing, stopped, unreached (running, but no report of this run) or unread (the API
    was not read), unreached also where their node is in unreachable (nodes the run could not reach). Containers
    that the fleet declares stopped are listed and not counted, unless they are missing. Each row has gpus, the
    GPU indexes the container is given: gpus ({vmid: indexes}, the run's plan) where it has them, else the entry's
    own list. failed: {host: the message of the task that failed on it} - a running container without a report whose
    task failed is failed, with that message, not unreached. limit: the run's --limit, which is said where it left a
    running container unverified (group: the containers' inventory group)."""
    run, gpus = run or {}, gpus or {}

    def given(vmid, entry):
        listed = (entry or {}).get('gpus')
        return list(gpus[vmid]) if vmid in gpus else list(listed) if isinstance(listed, list) else []

    mine = [r for r in reports or [] if isinstance(r, dict) and (not run.get('id') or r.get('run') == run['id'])]
    by_host = dict((r.get('host'), r) for r in mine)
    read = dict((c.get('vmid'), c) for c in (reconcile or {}).get('containers') or [])
    as_found = bool(check_mode or (reconcile or {}).get('checked_only'))
    rows, seen = [], set()
    for entry in containers or []:
        declared = entry.get('state') or 'started'
        if declared == 'absent':
            c = read.get(entry.get('vmid'))
            if c is not None and c.get('status') == 'absent' and c.get('changed'):
                # said, not counted: the run destroys it (check mode: would)
                why = ('CT {0} on {1} is removed by a run (state absent)' if as_found else
                       'CT {0} on {1} was destroyed (state absent)').format(entry.get('vmid'), c.get('node'))
                rows.append({'host': entry.get('hostname'), 'node': c.get('node'), 'vmid': entry.get('vmid'),
                             'profile': None, 'state': 'removed', 'ok': None, 'expected': False, 'why': why,
                             'failures': [], 'gpus': []})
            continue
        host, vmid = entry.get('hostname'), entry.get('vmid')
        seen.add(host)
        if host in by_host:
            rows.append(dict(row(by_host[host]), expected=True, gpus=given(vmid, entry)))
            continue
        c = read.get(vmid)
        status = found(c, as_found)
        node = (c or {}).get('node') or entry.get('node')
        why = None
        if c is None and node in unreachable:
            state, why = 'unreached', NOT_VERIFIED['node_unreachable']
        elif c is None:
            state = 'unread'
        elif status == 'absent':
            state = 'missing'
        elif status != 'running':
            state = 'stopped'
        elif (failed or {}).get(host):
            state, why = 'failed', 'CT {vmid} on {node}: ' + failed[host].replace('{', '{{').replace('}', '}}')
        else:
            state = 'unreached'
            if limit:  # the run was limited: most likely to its nodes without their containers
                why = NOT_VERIFIED['limited']
        why = (why or NOT_VERIFIED[state]).format(vmid=vmid, node=node, status=status, limit=limit, group=group)
        expected = declared != 'stopped' or state == 'missing'
        rows.append({'host': host, 'node': node, 'vmid': vmid, 'profile': entry.get('venv_profile'), 'state': state,
                     'ok': False if expected else None, 'expected': expected, 'why': why,
                     'failures': [why] if expected else [], 'gpus': given(vmid, entry)})
    rows.extend(dict(row(r), expected=True, gpus=given(r.get('vmid'), None)) for h, r in sorted(by_host.items())
                if h not in seen)
    counted = [row for row in rows if row['expected']]
    verified = sum(1 for row in counted if row['state'] == 'verified')
    bad = [row for row in counted if row['state'] != 'verified']
    verdict = 'verified {0} of {1} container(s)'.format(verified, len(counted))
    if bad:
        verdict += ': ' + '; '.join('{0} (CT {1} on {2}): {3}'.format(
            row['host'], row['vmid'], row['node'],
            row['failures'][0] if row['state'] == 'rolled_back' else row['state']) for row in bad)
    return {'run': run, 'mode': 'check' if check_mode else 'verify', 'ok': bool(counted) and not bad,
            'verified': verified, 'expected': len(counted), 'verdict': verdict,
            'fleet': [row['host'] for row in rows], 'containers': rows}


UPGRADE_STATES = ('planned', 'upgraded', 'failed', 'not reached', 'unchanged', 'no driver')


def upgrade(reports, check):
    """A driver upgrade judged from each node's report ({node: its plan (driver_upgrade_plan's), with the roll's
    state and msg where the roll reached it}): {rows, by, version, said}. Each node's row has its state - planned (a
    check run), upgraded, failed (with why and the way back), not reached (after a node that failed), unchanged
    (already on the version), no driver; by is {state: [nodes]}, said the states in words."""
    rows = []
    for node, rep in sorted((reports or {}).items()):
        if not rep.get('from'):
            state = 'no driver'
        elif rep.get('state'):
            state = rep['state']
        elif not rep.get('needed'):
            state = 'unchanged'
        else:
            state = 'planned' if check else 'not reached'
        rows.append({'node': node, 'state': state, 'from': rep.get('from'), 'to': rep.get('to'),
                     'containers': [c.get('vmid') for c in rep.get('containers') or []], 'steps': rep.get('steps') or [],
                     'down_seconds': rep.get('down_seconds'), 'msg': rep.get('msg')})
    by = dict((state, [r['node'] for r in rows if r['state'] == state]) for state in set(r['state'] for r in rows))
    said = '; '.join('{0}: {1}'.format(state, ', '.join(by[state])) for state in UPGRADE_STATES if by.get(state))
    return {'rows': rows, 'by': by, 'version': next((r['to'] for r in rows if r['to']), None), 'said': said}
