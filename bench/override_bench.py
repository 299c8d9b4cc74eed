"""The default profile's cu12 -> cu13 override with NVIDIA's own wheels, in a lab container.

    python bench/override_bench.py

The default profile's torch (2.11.0+cu128) is on the PyTorch cu128 index only; everything else in its lock is on
PyPI: torch's cu12 runtime wheels and the four cu13 wheels installed over them. This run builds that lock without
torch (and so without the import of torch: the profile imports nothing) through site.yml, from PyPI, in one lab
container, then:
1. records what venv_audit (full mode) says of the venv: the files the cu12 and cu13 wheels share, whose bytes
   are on disk, and that each is a declared override;
2. does what the incident did, `uv pip uninstall` of the four cu13 wheels, and records the check run's report
   (site.yml --check) and its repair plan;
3. repairs it with a plain site.yml run and audits again (the cu13 bytes must be back on the shared paths);
4. runs site.yml once more, which must change nothing.
Timings of each step and the findings go to bench/results/override.json.
"""

import json
import os
import pathlib
import shutil
import tempfile
import time

from venv_bench import (LOCKS, ROOT, UV, audit_command, build_result, entry, figures_file, lab_with, push_collection,
                        sh, site_run)

VMID = 343
DEFAULT = os.path.join(ROOT, 'roles', 'torch_venv', 'files', 'profiles', 'default')
NAME = 'default-runtime'
CU13 = ['nvidia-cudnn-cu13', 'nvidia-cusparselt-cu13', 'nvidia-nccl-cu13', 'nvidia-nvshmem-cu13']
AUDIT = audit_command(LOCKS.format(NAME), 'full', CU13)


def without_torch(lock_text):
    """The lock less torch's entry (its requirement line, hashes and comments)."""
    out, skipping = [], False
    for line in lock_text.splitlines(True):
        if not line.startswith((' ', '\t')):
            skipping = line.startswith('torch==')
        if not skipping:
            out.append(line)
    return ''.join(out)


def make_profile(tmp):
    d = tmp / NAME
    d.mkdir()
    shutil.copy(os.path.join(DEFAULT, 'pyproject.toml'), d / 'pyproject.toml')
    lock = open(os.path.join(DEFAULT, 'requirements.lock')).read()
    (d / 'requirements.lock').write_text(without_torch(lock))
    meta = open(os.path.join(DEFAULT, 'profile.yml')).read()
    meta = meta.replace('imports: [torch]', 'imports: []')
    meta = '\n'.join('description: the default profile without torch, all from PyPI' if line.startswith('description:')
                     else line for line in meta.splitlines() if not line.startswith('install_args:')) + '\n'
    (d / 'profile.yml').write_text(meta)
    return str(d)


def summary(audit):
    """Counts of each finding, the declared overrides by distribution, the plan."""
    f = audit['findings']
    by_dist = {}
    for o in audit['overrides']:
        by_dist.setdefault(o['on_disk'], []).append(o['path'])
    return {'healthy': audit['healthy'], 'distributions': audit['distributions'],
            'broken_distributions': {b['name']: len(b['missing']) + len(b['modified'])
                                     for b in f['broken_distributions']},
            'collisions': len(f['collisions']),
            'unresolved_libraries': sorted(u['soname'] for u in f['unresolved_libraries']),
            'drift': {k: sorted(i['name'] for i in v) for k, v in f['drift'].items()},
            'overrides_on_disk': {k: len(v) for k, v in sorted(by_dist.items())},
            'shared_files': len(audit['shared_files']),
            'shared_examples': sorted(s['path'] for s in audit['shared_files'])[:3],
            'override_examples': {k: sorted(v)[:3] for k, v in sorted(by_dist.items())},
            'plan': [' '.join(argv[2:]) if argv[0].endswith('uv') else ' '.join(argv) for argv in audit['plan']]}


def timed(fn, *args, **kw):
    started = time.monotonic()
    out = fn(*args, **kw)
    return out, round(time.monotonic() - started, 1)


def main():
    _lab, pve = lab_with([VMID])
    tmp = pathlib.Path(tempfile.mkdtemp(prefix='override-bench-'))
    host = 'bench-{0}'.format(VMID)
    fig = {}
    try:
        fleet = [entry(VMID, make_profile(tmp))]
        first, fig['build_site_s'] = timed(site_run, tmp, fleet, 'copy', '--skip-tags', 'verify')
        res = build_result(first, host)
        fig['build_timings'] = res['timings']
        fig['build_audit'] = summary(res['audit'])
        fig['venv_mb'] = int(sh(VMID, 'du -sm /root/venv/ | cut -f1').strip())
        push_collection(VMID)
        full, fig['audit_full_s'] = timed(lambda: json.loads(sh(VMID, AUDIT)))
        fig['audit_full'] = summary(full)
        assert full['healthy'] and full['overrides'], fig['audit_full']
        assert set(o['on_disk'] for o in full['overrides']) == set(CU13), fig['audit_full']

        # The incident: the four cu13 wheels "cleaned" away.
        sh(VMID, '{0} pip uninstall --python /root/venv/bin/python {1}'.format(UV, ' '.join(CU13)))
        broken = json.loads(sh(VMID, AUDIT))
        fig['after_uninstall'] = summary(broken)
        check, fig['check_site_s'] = timed(site_run, tmp, fleet, 'copy', '--skip-tags', 'verify', '--check')
        fig['check_report'] = summary(build_result(check, host)['audit'])
        assert not fig['check_report']['healthy']

        fix, fig['repair_site_s'] = timed(site_run, tmp, fleet, 'copy', '--skip-tags', 'verify')
        res = build_result(fix, host)
        fig['repaired'] = res['repaired']
        fig['repair_audit'] = summary(res['repair_audit'])
        after = json.loads(sh(VMID, AUDIT))
        fig['audit_full_after_repair'] = summary(after)
        assert after['healthy'] and set(o['on_disk'] for o in after['overrides']) == set(CU13), fig
        again, fig['again_site_s'] = timed(site_run, tmp, fleet, 'copy', '--skip-tags', 'verify')
        fig['again_changed'] = sum(s['changed'] for s in again.stats.values())
    finally:
        pve.cleanup()
        shutil.rmtree(str(tmp), ignore_errors=True)
        print(json.dumps(fig, indent=1))
    figures_file.save('override', fig)


if __name__ == '__main__':
    main()
