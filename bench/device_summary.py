"""Print one module result of bench/device_check.sh compactly: device_summary.py RESULT.json module name rc t0 t1"""
import json
import sys

path, mod, name, rc, t0, t1 = sys.argv[1:]
secs = '%.2f' % (float(t1) - float(t0))
try:
    r = json.load(open(path))
except Exception as e:  # noqa
    print('==', name, mod, 'rc', rc, 'unreadable:', e, open(path.replace('.json', '.err')).read()[-800:])
    sys.exit()


def short(k, v):
    if k == 'broken_distributions':
        return [(d['name'], len(d['missing']), d['modified'][:2]) for d in v]
    if k in ('unresolved_libraries', 'optional_libraries'):
        return [(u['soname'], u['needed_by'][:2], u['provided_by']) for u in v]
    return v


keep = dict((k, r.get(k)) for k in ('failed', 'msg', 'healthy', 'failures', 'torch_version', 'cuda_version',
            'cuda_available', 'device_count', 'cudnn_version', 'nccl_version', 'driver_version',
            'unresolved_libraries', 'import_error', 'timings', 'device_access', 'devices') if k in r)
for k in ('unresolved_libraries',):
    if k in keep:
        keep[k] = short(k, keep[k])
if 'findings' in r:
    keep['findings'] = dict((k, short(k, v)) for k, v in r['findings'].items()
                            if v and v != {'missing': [], 'extra': [], 'wrong_version': []})
    keep['optional_libraries'] = short('optional_libraries', r.get('optional_libraries') or [])
    keep['plan'] = str(r.get('plan'))[:700]
print('==', name, '(' + mod + ')', 'rc', rc, secs + ' s')
print(json.dumps(keep, default=str)[:4000])
