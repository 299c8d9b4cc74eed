# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Audit a Python venv in one pass: RECORD integrity, file collisions, ELF closure, drift against a lock,
and the commands that repair all of it (standard library only: it runs with the target's system Python).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import csv
import glob
import hashlib
import io
import os
import re

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _elf

# Installers' own packages: never drift, never removed.
TOOLING = ('pip', 'setuptools', 'wheel', 'uv')


def canon(name):
    return re.sub(r'[-_.]+', '-', name).lower()


def site_packages(venv):
    found = sorted(glob.glob(os.path.join(venv, 'lib', 'python3*', 'site-packages')))
    if not found:
        raise ValueError('{0} is not a venv: no lib/python3*/site-packages'.format(venv))
    return found[0]


def _metadata(dist_info):
    name = version = None
    try:
        with io.open(os.path.join(dist_info, 'METADATA'), encoding='utf-8', errors='replace') as fh:
            for line in fh:
                if not line.strip():
                    break
                if line.startswith('Name:'):
                    name = line.split(':', 1)[1].strip()
                elif line.startswith('Version:'):
                    version = line.split(':', 1)[1].strip()
    except (IOError, OSError):
        pass
    return name, version


def distributions(site):
    """[{name, version, dist_info, files: [(abs path, rel path, hash or None, size or None)]}]."""
    out = []
    for dist_info in sorted(glob.glob(os.path.join(site, '*.dist-info'))):
        name, version = _metadata(dist_info)
        if not name:
            base = os.path.basename(dist_info)[:-len('.dist-info')]
            name, _sep, version = base.partition('-')
        files = []
        try:
            with io.open(os.path.join(dist_info, 'RECORD'), encoding='utf-8', errors='replace') as fh:
                for row in csv.reader(fh):
                    if not row or not row[0]:
                        continue
                    rel = row[0]
                    # most entries are plain paths under site-packages: normalise only those that need it
                    plain = not rel.startswith('/') and '..' not in rel and './' not in rel and '//' not in rel
                    path = site + os.sep + rel if plain else os.path.normpath(os.path.join(site, rel))
                    digest = row[1] if len(row) > 1 and row[1] else None
                    size = int(row[2]) if len(row) > 2 and row[2].isdigit() else None
                    files.append((path, rel, digest, size))
        except (IOError, OSError):
            pass
        out.append({'name': name, 'key': canon(name), 'version': version, 'dist_info': dist_info, 'files': files})
    return out


def shared_objects(top):
    """Every shared object under top: regular files (not links) named *.so or *.so.N..., in no set order."""
    found, dirs = [], [top]
    while dirs:
        try:
            entries = os.scandir(dirs.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                name = entry.name
                if entry.is_dir(follow_symlinks=False):
                    dirs.append(entry.path)
                elif '.so' in name and (name.endswith('.so') or '.so.' in name) and entry.is_file(follow_symlinks=False):
                    found.append(entry.path)
    return found


def closure(site, resolver, providers):
    """The venv's shared objects resolved as the loader would: (unresolved, optional), each a list of
    {soname, needed_by, provided_by}. A soname that a distribution provides (it is the venv's to have), or that an
    object needs which Python loads when it imports an extension module (the DT_NEEDED closure of every extension
    module), is unresolved: a finding. The rest are optional: system libraries that only objects loaded on demand
    need (plugins a library opens with dlopen, such as NCCL's and NVSHMEM's network transports or cuFile's RDMA
    support, which need their fabric's libraries only where that fabric is used). A library that Python code opens
    itself (ctypes) counts as one loaded on demand."""
    infos = {}
    for path in shared_objects(site):
        info = _elf.read(path)
        if info is not None:
            infos[os.path.realpath(path)] = info
    edges, missing = {}, {}
    for real, info in infos.items():
        found = edges[real] = []
        for needed in info.needed:
            where = resolver.find(needed, info)
            if where is None:
                missing.setdefault(needed, []).append(real)
            else:
                found.append(os.path.realpath(where))
    loaded = set()
    todo = [real for real, info in infos.items() if info.module]
    while todo:
        real = todo.pop()
        if real not in loaded:
            loaded.add(real)
            todo.extend(edges.get(real, ()))
    unresolved, optional = [], []
    for soname, needers in sorted(missing.items()):
        item = {'soname': soname, 'needed_by': sorted(os.path.relpath(infos[n].path, site) for n in needers),
                'provided_by': sorted(providers.get(soname, ()))}
        (unresolved if item['provided_by'] or loaded.intersection(needers) else optional).append(item)
    return unresolved, optional


def file_digest(path):
    h = hashlib.sha256()
    with open(path, 'rb') as fh:
        for block in iter(lambda: fh.read(1 << 20), b''):
            h.update(block)
    return 'sha256=' + base64.urlsafe_b64encode(h.digest()).rstrip(b'=').decode()


REQUIREMENT = re.compile(r'^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*(===?)\s*([^\s;\\]+)')


def parse_lock(text):
    """A requirements/lock file as (options, requirements): options are its '--flag' lines; each requirement is
    {key, name, version, hashes, line, text} with text its whole entry (continuations joined, comments dropped).
    Lines that are neither are requirements without an exact pin: {key: None, name: None, line, text}."""
    options, reqs = [], []
    entry, start = [], 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(' #', 1)[0].rstrip() if not raw.lstrip().startswith('#') else ''
        if not entry:
            start = number
        if not line.strip() and not entry:
            continue
        entry.append(line.strip().rstrip('\\').strip())
        if line.endswith('\\'):
            continue
        joined = ' '.join(p for p in entry if p)
        entry = []
        if not joined:
            continue
        if joined.startswith('-'):
            options.append(joined)
            continue
        m = REQUIREMENT.match(joined)
        hashes = re.findall(r'--hash[= ](\S+)', joined)
        if m:
            reqs.append({'key': canon(m.group(1)), 'name': m.group(1), 'version': m.group(3), 'hashes': hashes,
                         'line': start, 'text': joined})
        else:
            reqs.append({'key': None, 'name': None, 'hashes': hashes, 'line': start, 'text': joined})
    return options, reqs


def read_lock(path):
    """{canonical name: (name, version)} of a pinned requirements/lock file (hashes and options ignored)."""
    with io.open(path, encoding='utf-8') as fh:
        _options, reqs = parse_lock(fh.read())
    return dict((r['key'], (r['name'], r['version'])) for r in reqs if r['key'])


def audit(venv, lock=None, mode='fast', installer='uv', install_args=(), overrides=(), uv='uv'):
    site = site_packages(venv)
    dists = distributions(site)
    by_key = dict((d['key'], d) for d in dists)
    overrides = set(canon(o) for o in overrides)
    # -- integrity ------------------------------------------------------------------
    broken = []
    owners = {}
    for d in dists:
        missing, modified = [], []
        for path, rel, digest, size in d['files']:
            owners.setdefault(path, []).append((d, digest, size))
            if digest is None:
                continue  # RECORD itself, .pyc files
            try:
                st = os.stat(path)  # one system call a file: fast mode's whole cost
            except OSError:
                (modified if os.path.lexists(path) else missing).append(rel)  # a dangling link is not the file
                continue
            if size is not None and st.st_size != size:
                modified.append(rel)
            elif mode == 'full' and file_digest(path) != digest:
                modified.append(rel)
        if missing or modified:
            broken.append({'name': d['name'], 'version': d['version'], 'missing': missing, 'modified': modified})
    # -- collisions ------------------------------------------------------------------
    # A path several distributions claim with the same bytes (a namespace package's __init__.py, a header that two
    # builds of one release share) conflicts with nothing: it goes to shared_files. The repair plan still knows its
    # claimants, so a removal of one comes with the reinstall of the others.
    collisions, declared, shared = [], [], []
    for path in sorted(p for p, claimants in owners.items() if len(claimants) > 1):
        claims = owners[path]
        names = sorted(set(d['name'] for d, _dg, _sz in claims))
        if len(names) < 2 or not os.path.isfile(path):
            if len(names) >= 2:
                collisions.append({'path': os.path.relpath(path, site), 'claimed_by': names, 'on_disk': None})
            continue
        item = {'path': os.path.relpath(path, site), 'claimed_by': names}
        if all(dg is None for _d, dg, _sz in claims):  # a .pyc the installers wrote: no bytes to tell apart
            shared.append(item)
            continue
        # Whose bytes are on disk: by size where that tells them apart (fast mode), else by sha256.
        size = os.stat(path).st_size
        on_disk = sorted(set(d['name'] for d, _dg, sz in claims if sz == size))
        if mode == 'full' or len(on_disk) != 1:
            disk = file_digest(path)
            on_disk = sorted(set(d['name'] for d, dg, _sz in claims if dg == disk))
        if on_disk == names:
            shared.append(item)
            continue
        ours = [n for n in on_disk if canon(n) in overrides]
        item['on_disk'] = (ours or on_disk or [None])[0]
        (declared if ours else collisions).append(item)
    # A file whose bytes are a declared override's is intended, not a broken distribution.
    intended = set(item['path'] for item in declared)
    for b in broken:
        b['modified'] = [rel for rel in b['modified']
                         if os.path.relpath(os.path.normpath(os.path.join(site, rel)), site) not in intended]
    broken = [b for b in broken if b['missing'] or b['modified']]
    # -- ELF closure -------------------------------------------------------------------
    nvidia_dirs = sorted(glob.glob(os.path.join(site, 'nvidia', '*', 'lib')))
    resolver = _elf.Resolver(extra_dirs=nvidia_dirs)
    providers = {}
    for d in dists:
        for path, rel, digest, size in d['files']:
            if '.so' in path:
                providers.setdefault(os.path.basename(path), set()).add(d['name'])
    unresolved, optional = closure(site, resolver, providers)
    # -- drift against the lock ----------------------------------------------------------
    drift = {'missing': [], 'extra': [], 'wrong_version': []}
    locked = read_lock(lock) if lock else {}
    if lock:
        for key, (name, version) in sorted(locked.items()):
            have = by_key.get(key)
            if have is None:
                drift['missing'].append({'name': name, 'version': version})
            elif have['version'] != version:
                drift['wrong_version'].append({'name': name, 'installed': have['version'], 'locked': version})
        for d in dists:
            if d['key'] not in locked and d['key'] not in TOOLING:
                drift['extra'].append({'name': d['name'], 'version': d['version']})
    for u in unresolved:
        u['in_lock'] = sorted(locked[canon(p)][0] for p in u['provided_by'] if canon(p) in locked)
    plan = repair_plan(venv, dists, broken, drift, locked, owners, installer, list(install_args), overrides, uv)
    healthy = not (broken or collisions or unresolved or any(drift.values()))
    return {'healthy': healthy, 'site_packages': site, 'distributions': len(dists),
            'findings': {'broken_distributions': broken, 'collisions': collisions,
                         'unresolved_libraries': unresolved, 'drift': drift},
            'overrides': declared, 'shared_files': shared, 'optional_libraries': optional, 'plan': plan}


def repair_plan(venv, dists, broken, drift, locked, owners, installer, install_args, overrides, uv):
    """argv lists, in a safe order: removals first, then everything their removal would break, broken and
    missing distributions reinstalled (declared overrides last, so their bytes end on disk)."""
    python = os.path.join(venv, 'bin', 'python')
    by_key = dict((d['key'], d) for d in dists)
    extra = set(canon(e['name']) for e in drift['extra'])
    reinstall = set(canon(b['name']) for b in broken if canon(b['name']) not in extra)
    for key in extra:
        # Removing it deletes every file of its RECORD: whoever else claims one of them needs a reinstall.
        for path, _rel, _dg, _sz in by_key[key]['files']:
            for other, _dg, _sz in owners.get(path, []):
                if other['key'] not in extra:
                    reinstall.add(other['key'])
    install = dict((canon(m['name']), '{0}=={1}'.format(m['name'], m['version'])) for m in drift['missing'])
    install.update((canon(w['name']), '{0}=={1}'.format(w['name'], w['locked'])) for w in drift['wrong_version'])

    def pin(key):
        if key in locked:
            return '{0}=={1}'.format(*locked[key])
        return '{0}=={1}'.format(by_key[key]['name'], by_key[key]['version'])
    plan = []
    if extra:
        names = sorted(by_key[k]['name'] for k in extra)
        plan.append([uv, 'pip', 'uninstall', '--python', python] + names if installer == 'uv'
                    else [python, '-m', 'pip', 'uninstall', '-y'] + names)
    ordered = sorted(reinstall, key=lambda k: (k in overrides, k))
    for key in ordered:
        if installer == 'uv':
            plan.append([uv, 'pip', 'install', '--python', python, '--no-deps', '--reinstall-package',
                         by_key[key]['name'], pin(key)] + install_args)
        else:
            plan.append([python, '-m', 'pip', 'install', '--force-reinstall', '--no-deps', pin(key)] + install_args)
    if install:
        specs = [install[k] for k in sorted(install)]
        plan.append([uv, 'pip', 'install', '--python', python, '--no-deps'] + specs + install_args if installer == 'uv'
                    else [python, '-m', 'pip', 'install', '--no-deps'] + specs + install_args)
    return plan
