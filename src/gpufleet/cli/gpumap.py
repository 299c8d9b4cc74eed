"""Each node's GPUs and who holds them, from a run's result: the containers the fleet gives each GPU (its rows) and
every container of the node that is given its device node, whoever made it (the node's discovery, node_info's
held_by). A GPU is free only where nothing holds it. What the page, the text and JSON of `gpufleet report` and the
metrics show."""


def gpu_map(result):
    """[{node, index, uuid, pci_bus_id, name, holders: [{vmid, name, in_fleet, state}], free}], by node and index."""
    rows = result.get('containers') or []
    info = result.get('node_info') or {}
    out = []
    for node in sorted(set(info) | set(r.get('node') for r in rows if r.get('node') and r.get('gpus'))):
        gpus = dict((g.get('index'), g) for g in (info.get(node) or {}).get('gpus') or [] if g.get('index') is not None)
        holders = {}
        for r in rows:
            if r.get('node') != node or r.get('state') == 'removed':
                continue
            for index in r.get('gpus') or []:
                holders.setdefault(index, {})[r.get('vmid')] = {
                    'vmid': r.get('vmid'), 'name': r.get('host'), 'in_fleet': True, 'state': r.get('state')}
        for index, gpu in gpus.items():
            for h in gpu.get('held_by') or []:
                mine = holders.setdefault(index, {})
                if h.get('vmid') not in mine:  # a container the fleet does not give it: an orphan, one made by hand
                    mine[h.get('vmid')] = {'vmid': h.get('vmid'), 'name': h.get('name'), 'in_fleet': False,
                                           'state': 'not in the fleet'}
        for index in sorted(set(gpus) | set(holders)):
            gpu = gpus.get(index) or {}
            held = sorted((holders.get(index) or {}).values(), key=lambda h: (not h['in_fleet'], str(h['vmid'])))
            out.append({'node': node, 'index': index, 'uuid': gpu.get('uuid'), 'pci_bus_id': gpu.get('pci_bus_id'),
                        'name': gpu.get('name'), 'holders': held, 'free': not held})
    return out


def holder_label(h):
    """A holder as a line says it: the fleet's by its host name, another by its vmid and why it is not the fleet's."""
    if h['in_fleet']:
        return '{0} (CT {1}{2})'.format(h['name'], h['vmid'], ', ' + h['state'] if h.get('state') in (
            'missing', 'stopped', 'unreached', 'failed', 'rolled_back') else '')
    return 'CT {0}{1}, not in the fleet'.format(h['vmid'], ' ' + h['name'] if h.get('name') else '')


def lines(result):
    """The map as text, a line a GPU: node, index, UUID (or bus id), and its holders or free."""
    out = []
    for g in gpu_map(result):
        which = g['uuid'] or g['pci_bus_id'] or ''
        who = '; '.join(holder_label(h) for h in g['holders']) if g['holders'] else 'free'
        shared = ' (shared)' if len(g['holders']) > 1 else ''
        out.append('{0} GPU {1}{2}: {3}{4}'.format(g['node'], g['index'], ' ' + which if which else '', who, shared))
    return out
