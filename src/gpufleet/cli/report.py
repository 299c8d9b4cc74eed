"""`gpufleet report`: the fleet as one self-contained HTML page (inline CSS, nothing fetched), from the last run's
result or from a drift check made now (-i).

Per node: its GPUs as a grid (index and PCI bus id), each coloured by the container that holds it (striped where
containers share it, grey where it is free), the node's driver and drift; per container: its state (verified,
failed, missing, stopped, unreached), torch, CUDA and driver versions, its GPUs (or CPU only), why it failed and its
drift items. The run's command, verdict and time head the page.
"""

import glob
import html
import json
import os
import time

from . import files, gpumap, show

# colours told apart on a white page and in grey print; a container's is its place in the sorted fleet
# (no red: red is for failed)
FOREIGN = '#3b4252'  # a container outside the fleet that holds a GPU
PALETTE = ('#4e79a7', '#f28e2b', '#59a14f', '#76b7b2', '#edc948', '#b07aa1', '#9c755f', '#2f4b7c', '#a05195',
           '#665191', '#3d8b8b', '#8c6d31')
STATES = {'verified': 'ok', 'failed': 'bad', 'missing': 'bad', 'stopped': 'off', 'unreached': 'warn',
          'unread': 'off', 'rolled_back': 'warn'}
STYLE = '''
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px;color:#1d2330}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px}
.run{color:#4a5366;margin-bottom:8px}.verdict{font-weight:600;margin-bottom:16px}
.exit0{color:#1b7a3a}.exit1,.exit4{color:#b3261e}.exit2{color:#a15c00}
.grid{display:flex;flex-wrap:wrap;gap:8px;margin:8px 0 12px}
.gpu{width:124px;min-height:64px;border-radius:6px;padding:6px;box-sizing:border-box;color:#fff;font-size:12px;
border:1px solid rgba(0,0,0,.15)}
.gpu .ix{font-size:16px;font-weight:700}.gpu.failed{outline:3px solid #b3261e;outline-offset:1px}.gpu.free{background:#d9dce3;color:#4a5366}
.gpu .who{overflow-wrap:anywhere}
table{border-collapse:collapse;font-size:13px;margin-bottom:8px}
th,td{border-bottom:1px solid #e3e6ec;padding:5px 10px;text-align:left;vertical-align:top}
th{background:#f4f5f8}.sw{display:inline-block;width:12px;height:12px;border-radius:3px;margin-right:6px;
vertical-align:-1px}.state{border-radius:10px;padding:1px 8px;font-weight:600;font-size:12px}
.ok{background:#d7f0df;color:#1b7a3a}.bad{background:#fadcd9;color:#b3261e}.warn{background:#fdebc8;color:#8a4b00}
.off{background:#e6e8ee;color:#4a5366}ul{margin:0;padding-left:18px}.muted{color:#6b7385}
'''


def esc(value):
    return html.escape('' if value is None else str(value), quote=True)


def colours(rows):
    hosts = sorted(set(r.get('host') or '' for r in rows))
    return dict((h, PALETTE[i % len(PALETTE)]) for i, h in enumerate(hosts))


def gpu_cells(node, gpus, colour):
    """The node's GPUs as cells (gpus: gpumap's entries of the node): each coloured by the fleet's container that
    holds it, striped where several do, dark where a container outside the fleet holds it, grey where it is free."""
    out = []
    for g in gpus:
        who = g['holders']
        bus = g.get('pci_bus_id') or ''
        names = [gpumap.holder_label(h) if not h['in_fleet'] or h.get('state') in ('missing', 'stopped')
                 else h['name'] for h in who]
        tones = [colour.get(h['name']) if h['in_fleet'] else FOREIGN for h in who]
        if not who:
            style, cls, label = '', 'gpu free', 'free'
        elif len(who) == 1:
            style, cls, label = 'background:{0}'.format(tones[0]), 'gpu', names[0]
        else:  # shared (gpu_sharing, or by accident with a container outside the fleet): stripes of every holder's
            stops = ','.join('{0} {1}% {2}%'.format(t, 100 * i // len(who), 100 * (i + 1) // len(who))
                             for i, t in enumerate(tones))
            style, cls, label = 'background:linear-gradient(135deg,{0})'.format(stops), 'gpu', 'shared: ' + ', '.join(names)
        if who and all(h.get('state') in ('missing', 'stopped') for h in who):
            style += ';opacity:.5'
        if any(h.get('state') in ('failed', 'unreached', 'rolled_back') for h in who) or any(not h['in_fleet'] for h in who):
            cls += ' failed'  # a holder runs but was not verified, or is not the fleet's
        out.append('<div class="{0}" style="{1}" title="{2}" data-gpu="{3}" data-holders="{4}"><div class="ix">GPU {3}'
                   '</div><div class="who">{5}</div><div>{6}</div></div>'.format(
                       cls, style, esc('GPU {0} of {1}{2}: {3}'.format(g['index'], node, ' ' + bus if bus else '',
                                                                       label)),
                       esc(g['index']), esc(' '.join(str(h['name'] if h['in_fleet'] else 'CT {0}'.format(h['vmid']))
                                                     for h in who)), esc(label), esc(short_bus(bus))))
    return out


def short_bus(bus):
    """A PCI bus id without its domain where that is 0 (00000000:18:00.0 is 18:00.0)."""
    return bus.split(':', 1)[1] if bus.count(':') == 2 and not bus.split(':', 1)[0].strip('0') else bus


def container_row(r, colour):
    state = r.get('state') or ('verified' if r.get('ok') else 'failed')
    gpus = r.get('gpus')
    drift = [show.drift_line(i) for i in r.get('drift') or []]
    problems = [] if state == 'verified' else (r.get('failures') or ([r['why']] if r.get('why') else []))
    cells = [
        '<span class="sw" style="background:{0}"></span>{1}'.format(colour.get(r.get('host')), esc(r.get('host'))),
        esc(r.get('vmid')),
        '<span class="state {0}">{1}</span>'.format(STATES.get(state, 'off'), esc(state)),
        esc(r.get('torch_version') or '-'), esc(r.get('cuda_version') or '-'), esc(r.get('driver_version') or '-'),
        ('CPU only' if gpus == [] else esc(', '.join(str(g) for g in gpus)) if gpus else '-') + (
            ' <span class="muted">(torch saw {0})</span>'.format(esc(r['devices_seen']))
            if r.get('devices_seen') is not None and gpus else ''),
        ', '.join('<span class="state {0}">{1}</span>'.format(
            {'ok': 'ok', 'failed': 'bad'}.get(status, 'off'), esc(check if status != 'not_applicable' else check + ' n/a'))
            for check, status in sorted((r.get('checks') or {}).items())) + (
            ' <span class="muted">(all_reduce {0} GB/s)</span>'.format(esc(r['allreduce_gbps']))
            if r.get('allreduce_gbps') is not None else '') + (
            ' <span class="muted">({0} tokens/s{1})</span>'.format(esc(r['tokens_per_s']), '' if r.get(
                'throughput_ratio') is None else ', {0:.0%} of its baseline'.format(r['throughput_ratio']))
            if r.get('tokens_per_s') is not None else ''),
        '<ul>{0}</ul>'.format(''.join('<li>{0}</li>'.format(esc(p)) for p in problems)) if problems else '',
        '<ul>{0}</ul>'.format(''.join('<li>{0}</li>'.format(esc(d)) for d in drift)) if drift else 'none',
    ]
    return '<tr data-host="{0}">{1}</tr>'.format(esc(r.get('host')), ''.join('<td>{0}</td>'.format(c) for c in cells))


def page(result):
    """The HTML page of a run's result (the CLI's: containers with their gpus and drift, node_info, nodes' drift)."""
    rows = result.get('containers') or []
    colour = colours(rows)
    info = result.get('node_info') or {}
    node_drift = result.get('nodes') or {}
    nodes = sorted(set(info) | set(r.get('node') for r in rows if r.get('node')) | set(node_drift))
    gpus = gpumap.gpu_map(result)
    ended = result.get('ended')
    when = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(ended)) if ended else 'unknown time'
    parts = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>gpufleet: the fleet</title>',
             '<style>{0}</style></head><body>'.format(STYLE),
             '<h1>gpufleet: the fleet</h1>',
             '<div class="run">gpufleet {0}, ended {1}, exit code {2}</div>'.format(
                 esc(result.get('command')), esc(when), esc(result.get('exit_code'))),
             '<div class="verdict exit{0}">{1}</div>'.format(esc(result.get('exit_code')), esc(result.get('verdict')))]
    for node in nodes:
        mine = [r for r in rows if r.get('node') == node]
        seen = info.get(node)
        parts.append('<section data-node="{0}"><h2>{0}</h2>'.format(esc(node)))
        parts.append('<div class="muted">{0}</div>'.format(
            ('NVIDIA driver {0}, {1} GPU(s)'.format(esc(seen['driver_version']), len(seen.get('gpus') or []))
             if seen.get('driver_version') else 'no NVIDIA driver loaded, no GPU') if seen else
            'the run did not read this node (unreachable, or limited out of the run)'))
        cells = gpu_cells(node, [g for g in gpus if g['node'] == node], colour)
        if cells:
            parts.append('<div class="grid">{0}</div>'.format(''.join(cells)))
        if node_drift.get(node):
            parts.append('<div>node drift:<ul>{0}</ul></div>'.format(''.join(
                '<li>{0}</li>'.format(esc(show.drift_line(i))) for i in node_drift[node])))
        if mine:
            parts.append('<table><tr>{0}</tr>{1}</table>'.format(''.join('<th>{0}</th>'.format(h) for h in (
                'container', 'vmid', 'state', 'torch', 'CUDA', 'driver', 'GPUs', 'checks', 'why not verified',
                'drift')),
                ''.join(container_row(r, colour) for r in sorted(mine, key=lambda r: str(r.get('host')))))
            )
        parts.append('</section>')
    parts.append('</body></html>\n')
    return ''.join(parts)


def last_result(home):
    """The result of the newest run kept under home that has one (up, drift, verify; not the doctor's), or None."""
    found = sorted(glob.glob(os.path.join(home, 'artifacts', '*', 'result.json')), key=os.path.getmtime)
    for path in reversed(found):
        try:
            with open(path) as fh:
                result = json.load(fh)
        except (IOError, OSError, ValueError):
            continue
        if 'checks' not in result:
            return result
    return None


def command(args):
    """gpufleet report: the page of the last run (or, with -i, of a drift check made now), written to --html; without
    it, the run's table and each node's GPUs with who holds them (with --json, the run's result and that map as
    JSON)."""
    from . import fleet
    if args.inventory:
        result = fleet.execute(args, command='drift')
    else:
        home = os.path.abspath(os.path.expanduser(args.artifacts or fleet.default_home()))
        result = last_result(home)
        if result is None:
            show.error('no run with a result is kept under {0}: run gpufleet up, drift or verify first, or give '
                       '-i INVENTORY for a drift check now'.format(home))
            return 1
    if getattr(args, 'json', False) and not args.html:
        print(json.dumps(dict(result, gpus=gpumap.gpu_map(result)), indent=2, sort_keys=True))
        return 0
    if not args.html:
        show.render(result)
        for line in gpumap.lines(result):
            print(line)
        return 0
    files.publish(args.html, page(result))
    print('wrote {0}: {1}'.format(args.html, result.get('verdict')))
    return 0
