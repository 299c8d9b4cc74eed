# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The venv audit in one pass (audit): whether it can start (_venv_python), RECORD integrity and drift against its lock
(_venv_dists), what its distributions require (_venv_requires), the paths several distributions claim (Collisions),
its shared libraries (_venv_libs) and, in full mode, its imports; and the commands that repair all of it in place
(repair_plan). Standard library only: it runs with the target's system Python.
"""


import os
import re

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _venv_dists, _venv_libs, _venv_python, _venv_requires


def decide(keys, overrides, locked, requirers):
    """Which of a path's claimants (canonical names) is the one whose bytes belong there: (key, why), why being
    'overrides' (declared), 'lock' (the only one the lock has) or 'requirements' (the only one that an installed
    distribution requires); (None, what the operator must decide) where nothing decides it."""
    ours = sorted(k for k in keys if k in overrides)
    if ours:
        return ours[0], 'overrides'
    candidates = keys
    if locked:
        in_lock = [k for k in keys if k in locked]
        if len(in_lock) == 1:
            return in_lock[0], 'lock'
        candidates = in_lock or keys
    required = [k for k in candidates if requirers.get(k)]
    if len(required) == 1:
        return required[0], 'requirements'
    if required:
        why = 'each is required ({0})'.format('; '.join('{0} by {1}'.format(k, ', '.join(requirers[k])) for k in required))
    else:
        why = 'no installed distribution requires {0}'.format('either' if len(candidates) == 2 else 'any of them')
    ask = 'or remove all but one from the lock' if locked else 'or give a lock'
    return None, '{0} install this path with different bytes and {1}: declare one in `overrides`, {2}'.format(
        ' and '.join(candidates), why, ask)


MODULE_NAME = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$')


def check_imports(imports):
    bad = [name for name in imports if not isinstance(name, str) or not MODULE_NAME.match(name)]
    if bad:
        raise ValueError('imports: {0} {1} not a module name'.format(', '.join(repr(b) for b in bad),
                                                                     'is' if len(bad) == 1 else 'are'))


class Collisions:
    """The paths several distributions claim, each sorted into one of the audit's lists.

    A path several distributions claim with the same bytes (a namespace package's __init__.py, a header that two
    builds of one release share) conflicts with nothing: it goes to shared. The repair plan still knows its
    claimants, so a removal of one comes with the reinstall of the others.
    Where the bytes differ, one claimant's belong there: a declared override's (declared), else the only one the
    lock has, else the only one an installed distribution requires (decided). Where nothing decides it, the plan
    leaves the path as it is (a reinstall of either would be undone by the next plan) and the finding says what to
    declare. found holds the findings: the paths nothing decides, and those whose bytes are not the winner's (or
    that the lock decides: its other claimants are removed).
    winners is {path: the key whose bytes belong there}, settled the paths (relative to site) whose bytes are as
    they should be."""

    def __init__(self, site, by_key, mode, overrides, locked, requirers):
        self.site, self.by_key, self.mode = site, by_key, mode
        self.overrides, self.locked, self.requirers = overrides, locked, requirers
        self.found, self.declared, self.decided, self.shared = [], [], [], []
        self.winners, self.settled = {}, set()

    def check(self, owners):
        """Each path of owners ({path: [(distribution, digest, size)]}) that more than one distribution claims,
        in path order."""
        for path in sorted(p for p, claimants in owners.items() if len(claimants) > 1):
            self.check_path(path, owners[path])
        return self

    def on_disk(self, path, claims_of_path):
        """The names of the claimants whose bytes are at path: by size where that tells them apart (fast mode),
        else by sha256."""
        size = os.stat(path).st_size
        on_disk = sorted(set(d['name'] for d, _dg, sz in claims_of_path if sz == size))
        if self.mode == 'full' or len(on_disk) != 1:
            disk = _venv_dists.file_digest(path)
            on_disk = sorted(set(d['name'] for d, dg, _sz in claims_of_path if dg == disk))
        return on_disk

    def check_path(self, path, claims_of_path):
        names = sorted(set(d['name'] for d, _dg, _sz in claims_of_path))
        if len(names) < 2:
            return
        rel = os.path.relpath(path, self.site)
        item = {'path': rel, 'claimed_by': names}
        if os.path.isfile(path):
            if all(dg is None for _d, dg, _sz in claims_of_path):  # a .pyc the installers wrote: no bytes to tell apart
                self.shared.append(item)
                return
            on_disk = self.on_disk(path, claims_of_path)
            if on_disk == names:
                self.shared.append(item)
                return
        else:
            on_disk = []
        keys = sorted(set(d['key'] for d, _dg, _sz in claims_of_path))
        wins, why = decide(keys, self.overrides, self.locked, self.requirers)
        if wins is None:
            item.update(on_disk=(on_disk or [None])[0], decide=why)
            self.settled.add(rel)
            self.found.append(item)
            return
        if why != 'lock':  # the lock's other claimants are removed: nothing to order
            self.winners[path] = wins
        winner = self.by_key[wins]['name']
        item['on_disk'] = winner if winner in on_disk else (on_disk or [None])[0]
        if why == 'requirements':
            item['required_by'] = self.requirers[wins]
        if item['on_disk'] == winner and why != 'lock':
            self.settled.add(rel)
            (self.declared if why == 'overrides' else self.decided).append(item)
        else:
            item['wins'] = winner
            self.found.append(item)

    def restore(self):
        """The keys of the distributions whose bytes belong at a path and are not there: reinstalled, even where
        their sizes are the same as what is on disk (fast mode finds such a file through the collision, not
        through its RECORD)."""
        return set(_venv_dists.canon(c['wins']) for c in self.found if c.get('wins') and c['on_disk'] != c['wins'])


def unsettled(broken, site, settled):
    """broken without the files whose bytes are the ones that belong there (settled: paths relative to site): such
    a file is not a broken distribution, nor one whose claimants nothing decides between (the collision is the
    finding). A distribution left with nothing missing or modified is dropped."""
    for b in broken:
        b['modified'] = [rel for rel in b['modified']
                         if os.path.relpath(os.path.normpath(os.path.join(site, rel)), site) not in settled]
    return [b for b in broken if b['missing'] or b['modified']]


def failed_imports(venv, mode, imports, env=None, timeout=600):
    """Full mode's imports: import_failures of each of imports in a fresh interpreter of the venv. Fast mode
    imports nothing (it reads files only)."""
    if mode != 'full' or not imports:
        return []
    return import_failures(os.path.join(venv, 'bin', 'python'), imports, env, timeout)


def audit(venv, lock=None, mode='fast', installer='uv', install_args=(), overrides=(), uv='uv', imports=(),
          env=None, timeout=600):
    """The venv's audit (see the venv_audit module), in its parts: whether it can start (interpreter: its
    interpreter, pyvenv.cfg, the base Python's version and standard library, one isolated start; activate_findings),
    the files site-packages runs at start that no RECORD names (startup_files), what its activation scripts set for
    a job (job_env: _venv_python.JOB_ENV), RECORD integrity
    (broken_distributions), the paths several distributions claim (Collisions), the shared-library closure
    (unresolved_libraries), drift against the lock (lock_drift) and, in full mode, the imports (failed_imports),
    each of imports imported in a fresh interpreter of the venv (with env, within timeout seconds); fast mode reads
    files and starts the interpreter once, importing nothing. Then the plan that repairs it all in place
    (repair_plan; startup files moved aside into the venv's SET_ASIDE; JOB_ENV appended), or, where the venv cannot start, rebuild
    (why) and no plan: its installers need its interpreter."""
    check_imports(imports)
    site = _venv_python.site_packages(venv)
    dists = _venv_dists.distributions(site)
    by_key = dict((d['key'], d) for d in dists)
    overrides = set(_venv_dists.canon(o) for o in overrides)
    locked = _venv_dists.read_lock(lock) if lock else {}
    edges = _venv_requires.requirement_edges(dists, _venv_requires.marker_env(venv, site))
    requirers = _venv_requires.required_by(edges)
    owners = _venv_dists.claims(dists)
    broken = _venv_dists.broken_distributions(dists, mode)
    collisions = Collisions(site, by_key, mode, overrides, locked, requirers).check(owners)
    broken = unsettled(broken, site, collisions.settled)
    unresolved, optional = _venv_libs.unresolved_libraries(site, dists, locked, edges, imports)
    drift = _venv_dists.lock_drift(dists, locked if lock else None)
    absent = [] if lock else _venv_requires.missing_requirements(dists, edges)
    python, starting = _venv_python.interpreter(venv, site)
    starting += _venv_python.activate_findings(venv)
    startup = _venv_python.startup_files(site, owners)
    job_env = _venv_python.job_env_findings(venv)
    failures = failed_imports(venv, mode, imports, env, timeout) if python['starts'] else []
    plan = repair_plan(venv, dists, broken, drift, locked, owners, installer=installer,
                       install_args=list(install_args), overrides=overrides, uv=uv, winners=collisions.winners,
                       restore=collisions.restore(), absent=absent)
    if startup:  # moved aside, not deleted: what someone put there is kept in the venv for them to read
        aside = os.path.join(venv, _venv_python.SET_ASIDE)
        plan = [['mkdir', '-p', aside]] + [['mv', '-f', '--', os.path.join(site, f['path']), aside + '/']
                                           for f in startup] + plan
    plan += _venv_python.job_env_plan(job_env)
    healthy = not (broken or collisions.found or unresolved or failures or absent or any(drift.values()) or starting
                   or startup or job_env)
    return {'healthy': healthy, 'site_packages': site, 'distributions': len(dists), 'python': python,
            # a venv that cannot start cannot be repaired in place (the installers run its interpreter): it is rebuilt
            'rebuild': '; '.join(f['msg'] for f in starting) or None,
            'findings': {'broken_distributions': broken, 'collisions': collisions.found,
                         'unresolved_libraries': unresolved, 'drift': drift, 'failed_imports': failures,
                         'missing_requirements': absent, 'interpreter': starting, 'startup_files': startup,
                         'job_env': job_env},
            'overrides': collisions.declared, 'required': collisions.decided, 'shared_files': collisions.shared,
            'optional_libraries': optional, 'plan': [] if starting else plan}


LOADER_MESSAGE = re.compile(r'([^\s:\'"]+\.so(?:\.[0-9A-Za-z_]+)*): cannot open shared object file')


def import_failures(python, imports, env=None, timeout=600):
    """Each module imported in a fresh interpreter (isolated: no PYTHON* variables, no user site, not the working
    directory): [{module, message, library}] for those that fail, message the error's last line (the loader's,
    which names the library it could not open: library)."""
    import subprocess
    failed = []
    for name in imports:
        try:
            out = subprocess.run([python, '-I', '-c', 'import ' + name], capture_output=True, text=True, env=env,
                                 timeout=timeout, check=False, cwd='/')
        except subprocess.TimeoutExpired:
            failed.append({'module': name, 'message': 'import {0} did not finish in {1} s'.format(name, timeout),
                           'library': None})
            continue
        except OSError as e:
            failed.append({'module': name, 'message': 'the venv\'s Python could not run: {0}'.format(e),
                           'library': None})
            continue
        if out.returncode != 0:
            lines = [line for line in (out.stderr or out.stdout or '').strip().splitlines() if line.strip()]
            message = lines[-1].strip() if lines else 'exit {0}'.format(out.returncode)
            found = LOADER_MESSAGE.search(out.stderr or '')
            failed.append({'module': name, 'message': message, 'library': found.group(1) if found else None})
    return failed


def repair_plan(venv, dists, broken, drift, locked, owners, *, installer, install_args, overrides, uv, winners=None,
                restore=(), absent=()):
    """argv lists, in a safe order: removals (and, with uv, the distributions to reinstall, so that their install
    comes from the cache: uv's --reinstall-package would fetch them again), then everything their removal would
    break, broken, missing and other-version distributions installed; the distributions whose bytes belong at the
    paths they share (declared overrides, the one the venv's metadata requires) last, so their bytes end on disk.
    A distribution whose dist-info has no RECORD cannot be uninstalled by any installer: its dist-info is removed
    first (its files, which nothing names, are overwritten by its reinstall)."""
    winners = winners or {}
    python = os.path.join(venv, 'bin', 'python')
    by_key = dict((d['key'], d) for d in dists)
    extra = set(_venv_dists.canon(e['name']) for e in drift['extra'])
    replaced = set(_venv_dists.canon(w['name']) for w in drift['wrong_version'])
    reinstall = set(_venv_dists.canon(b['name']) for b in broken) | set(restore)
    reinstall -= extra | replaced
    install = dict((_venv_dists.canon(m['name']), '{0}=={1}'.format(m['name'], m['version'])) for m in drift['missing'])
    # a requirement that is not installed (without a lock): as the requirement says
    install.update((_venv_dists.canon(a['name']), a['requirement']) for a in absent)
    install.update((_venv_dists.canon(w['name']), '{0}=={1}'.format(w['name'], w['locked'])) for w in drift['wrong_version'])
    # What the plan uninstalls loses every file of its RECORD. A removal's files are gone: whoever else claims one
    # needs a reinstall. A reinstall (or another version) writes its own bytes back: a distribution whose bytes
    # belong at a path it shares with different bytes needs a reinstall after it.
    todo = sorted(extra | reinstall | replaced)
    while todo:
        key = todo.pop()
        for path, _rel, digest, _sz in by_key[key]['files']:
            for other, dg, _sz in owners.get(path, []):
                k = other['key']
                if k in extra or k in reinstall or k in install:
                    continue
                if key in extra or (dg is not None and dg != digest and winners.get(path) == k):
                    reinstall.add(k)
                    todo.append(k)
    last = set(overrides) | set(winners.values())

    def pin(key):
        if key in locked:
            return '{0}=={1}'.format(*locked[key])
        return '{0}=={1}'.format(by_key[key]['name'], by_key[key]['version'])
    specs = dict((k, pin(k)) for k in reinstall)
    specs.update(install)
    groups = [sorted(k for k in specs if k not in last), sorted(k for k in specs if k in last)]
    hollow = sorted(by_key[k]['dist_info'] for k in extra | reinstall if not by_key[k].get('record', True))
    plan = [['rm', '-rf', '--'] + hollow] if hollow else []
    if installer == 'uv':
        gone = sorted(by_key[k]['name'] for k in extra | reinstall if by_key[k].get('record', True))
        if gone:
            plan.append([uv, 'pip', 'uninstall', '--python', python] + gone)
        for group in groups:
            if group:
                plan.append([uv, 'pip', 'install', '--python', python, '--no-deps'] + [specs[k] for k in group]
                            + install_args)
        return plan
    extra_recorded = sorted(by_key[k]['name'] for k in extra if by_key[k].get('record', True))
    if extra_recorded:
        plan.append([python, '-m', 'pip', 'uninstall', '-y'] + extra_recorded)
    for group in groups:
        if group:
            plan.append([python, '-m', 'pip', 'install', '--force-reinstall', '--no-deps'] + [specs[k] for k in group]
                        + install_args)
    return plan
