"""`--metrics FILE`: a run's result in Prometheus' text exposition format, for node_exporter's textfile collector.

One file holds the fleet as the last runs saw it. Each run writes it whole and atomically (a temporary file in the
same directory, then a rename: the collector never reads half a file): its containers and nodes as this run saw
them, the run's own time, exit code and duration under its `command` label, and from the file as it was, the other
commands' run series and the drift of each container where this run did not look for drift (`up` and `verify`
keep what the last drift run found), and the nodes' findings of the last drift check. docs/operators.md lists the
metrics.
"""

import re
import time

from . import files, gpumap

PREFIX = 'gpufleet_'

# name: (help, labels). The order is the file's.
CONTAINER = ('node', 'vmid', 'hostname')
METRICS = (
    ('container_present', 'Whether the container exists in PVE (0: missing).', CONTAINER),
    ('container_running', 'Whether the container runs.', CONTAINER),
    ('verify_ok', 'Whether the container was verified in the run (0: failed, missing, stopped or unreached).',
     CONTAINER),
    ('drift_items', 'Drift items of the container the last drift run found and left (repaired ones are gone).',
     CONTAINER),
    ('gpus_expected', 'GPUs the fleet gives the container.', CONTAINER),
    ('gpus_seen', 'GPUs torch saw in the container.', CONTAINER),
    ('venv_healthy', 'Whether the container\'s venv audit found nothing.', CONTAINER),
    ('check_ok', 'Whether a check of the container\'s verification passed (check: cudnn_conv, cusparselt_24, '
     'allreduce, shm, train_step; one that does not apply there has no sample).', CONTAINER + ('check',)),
    ('allreduce_gbps', 'The algorithm bandwidth of the all_reduce across the container\'s GPUs (gloo between two CPU '
     'processes without one), GB/s as nccl-tests reports it.', CONTAINER),
    ('train_tokens_per_second', 'Tokens per second of the verification\'s short training step (the slowest GPU\'s).',
     CONTAINER),
    ('train_throughput_ratio', 'The training step\'s tokens per second over the container\'s baseline (its first '
     'passing result).', CONTAINER),
    ('container_info', 'The container\'s torch, CUDA and userspace driver versions (always 1).',
     CONTAINER + ('torch_version', 'cuda_version', 'driver_version')),
    ('node_driver_info', 'The NVIDIA driver version loaded on the node (always 1).', ('node', 'driver_version')),
    ('node_gpus', 'GPUs on the node.', ('node',)),
    ('gpu_holders', 'Containers that hold the node\'s GPU (0: free), the fleet\'s and any other of the node.',
     ('node', 'index')),
    ('gpu_held', 'A container that holds the node\'s GPU (always 1; in_fleet says whether it is the fleet\'s).',
     ('node', 'index', 'vmid', 'hostname', 'in_fleet')),
    ('node_finding', 'A finding on the node that the last drift check made (always 1; item says which, such as '
     'module_build_failed: the kernel it boots next has no NVIDIA module).', ('node', 'item')),
    ('last_run_timestamp_seconds', 'When the last run of the command ended (Unix time).', ('command',)),
    ('last_run_exit_code', 'The last run\'s exit code (0 clean, 1 error, 2 drift, 3 orphans, 4 unreachable).',
     ('command',)),
    ('run_duration_seconds', 'How long the last run of the command took.', ('command',)),
)
HELP = dict((name, (text, labels)) for name, text, labels in METRICS)
RUN = ('last_run_timestamp_seconds', 'last_run_exit_code', 'run_duration_seconds')
SAMPLE = re.compile(r'^' + PREFIX + r'(\w+)\{(.*)\} (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def command_label(command, fix=False):
    """The `command` label of a run: up, verify, drift, drift-fix."""
    return command + ('-fix' if fix else '')


def escape(value):
    return str(value).replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n')


def unescape(value):
    return re.sub(r'\\(.)', lambda m: '\n' if m.group(1) == 'n' else m.group(1), value)


def read(text):
    """[(name without the prefix, {label: value}, value text)] of a file this module wrote (others' lines are
    ignored)."""
    out = []
    for line in (text or '').splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1) in HELP:
            out.append((m.group(1), dict((k, unescape(v)) for k, v in LABEL.findall(m.group(2))), m.group(3)))
    return out


def samples(result, command, ended, took, before=()):
    """[(name, labels, value)] of a run: result is the CLI's (rows per container, node_info, exit code, drift);
    command its label; ended and took its end (Unix time) and duration; before what the file held (read's)."""
    out = []
    looked_for_drift = command.startswith('drift')
    drift_before = dict(((s[1].get('node'), s[1].get('vmid'), s[1].get('hostname')), s[2])
                        for s in before if s[0] == 'drift_items')
    for row in result.get('containers') or []:
        if not row.get('vmid'):
            continue
        ids = {'node': row.get('node') or '', 'vmid': str(row['vmid']), 'hostname': row.get('host') or ''}
        state = row.get('state')
        if state not in (None, 'unread'):  # unread: the API was not read, so neither is known
            out.append(('container_present', ids, 0 if state == 'missing' else 1))
            out.append(('container_running', ids, 1 if state in ('verified', 'failed', 'unreached', 'rolled_back')
                        else 0))
        if row.get('expected'):
            out.append(('verify_ok', ids, 1 if state == 'verified' else 0))
        if looked_for_drift:
            # a repair run leaves no drift where it verified the fleet but what waits for a restart; what it could not
            # repair stays. An orphan's item is no drift (it is left alone).
            items = [i for i in row.get('drift') or [] if not i.get('left')]
            if command == 'drift-fix' and result.get('exit_code') in (0, 2, 3):
                items = [i for i in items if i.get('waits')]
            out.append(('drift_items', ids, len(items)))
        elif (ids['node'], ids['vmid'], ids['hostname']) in drift_before:
            out.append(('drift_items', ids, drift_before[(ids['node'], ids['vmid'], ids['hostname'])]))
        if row.get('gpus') is not None:
            out.append(('gpus_expected', ids, len(row['gpus'])))
        if state in ('verified', 'failed', 'rolled_back') and 'venv_findings' in row:  # judged by its verification's report
            if row.get('devices_seen') is not None:
                out.append(('gpus_seen', ids, row['devices_seen']))
            out.append(('venv_healthy', ids, 0 if row.get('venv_findings') else 1))
            for check, status in sorted((row.get('checks') or {}).items()):
                if status in ('ok', 'failed'):
                    out.append(('check_ok', dict(ids, check=check), 1 if status == 'ok' else 0))
            for name, key in (('allreduce_gbps', 'allreduce_gbps'), ('train_tokens_per_second', 'tokens_per_s'),
                              ('train_throughput_ratio', 'throughput_ratio')):
                if row.get(key) is not None:
                    out.append((name, ids, row[key]))
            versions = dict((k, row.get(k) or '') for k in ('torch_version', 'cuda_version', 'driver_version'))
            if any(versions.values()):
                out.append(('container_info', dict(ids, **versions), 1))
    for node, info in sorted((result.get('node_info') or {}).items()):
        if info.get('driver_version'):
            out.append(('node_driver_info', {'node': node, 'driver_version': info['driver_version']}, 1))
        out.append(('node_gpus', {'node': node}, len(info.get('gpus') or [])))
    for g in gpumap.gpu_map(result):
        where = {'node': g['node'], 'index': str(g['index'])}
        held = [h for h in g['holders'] if h.get('state') != 'missing']  # a container yet to be made holds nothing
        out.append(('gpu_holders', where, len(held)))
        for h in held:
            out.append(('gpu_held', dict(where, vmid=str(h['vmid']), hostname=h.get('name') or '',
                                         in_fleet='yes' if h['in_fleet'] else 'no'), 1))
    if command == 'drift':
        for node, items in sorted((result.get('nodes') or {}).items()):
            for item in sorted({i.get('item') for i in items if i.get('item')}):
                out.append(('node_finding', {'node': node, 'item': item}, 1))
    else:  # a repair run's findings are those it started from: the next check says what is left
        out.extend(s for s in before if s[0] == 'node_finding')
    runs = dict(((s[0], s[1].get('command')), s) for s in before if s[0] in RUN and s[1].get('command') != command)
    runs.update(((name, command), (name, {'command': command}, value)) for name, value in (
        ('last_run_timestamp_seconds', round(ended, 3)), ('last_run_exit_code', result.get('exit_code', 1)),
        ('run_duration_seconds', round(took, 3))))
    out.extend(runs[key] for key in sorted(runs, key=lambda k: (RUN.index(k[0]), k[1])))
    return out


def render(found):
    """The exposition text of samples' answer: each metric's HELP and TYPE (gauge), then its samples."""
    lines = []
    for name, text, labels in METRICS:
        mine = [s for s in found if s[0] == name]
        if not mine:
            continue
        lines += ['# HELP {0}{1} {2}'.format(PREFIX, name, text), '# TYPE {0}{1} gauge'.format(PREFIX, name)]
        for _name, values, value in mine:
            lines.append('{0}{1}{{{2}}} {3}'.format(PREFIX, name, ','.join(
                '{0}="{1}"'.format(k, escape(values.get(k, ''))) for k in labels), value))
    return '\n'.join(lines) + '\n'


def write(path, result, command, started, ended=None):
    """Write the run's metrics to path (files.publish: whole, readable by the collector), keeping from the file as
    it was what samples keeps. Returns the path."""
    ended = time.time() if ended is None else ended
    try:
        with open(path) as fh:
            before = read(fh.read())
    except (IOError, OSError):
        before = []
    return files.publish(path, render(samples(result, command, ended, ended - started, before)))
