# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A venv's installed distributions as their dist-info say (METADATA, RECORD), the integrity of their files against
their RECORD, and the lock they were installed from (standard library only: it runs with the target's system
Python)."""


import base64
import csv
import glob
import hashlib
import io
import os
import re


# Installers' own packages: never drift, never removed.
TOOLING = ('pip', 'setuptools', 'wheel', 'uv')


def canon(name):
    return re.sub(r'[-_.]+', '-', name).lower()


def _metadata(dist_info):
    """(Name, Version, [Requires-Dist]) from a dist-info's METADATA headers."""
    name = version = None
    requires = []
    try:
        with io.open(os.path.join(dist_info, 'METADATA'), encoding='utf-8', errors='replace') as fh:
            for line in fh:
                if not line.strip():
                    break
                if line.startswith('Name:'):
                    name = line.split(':', 1)[1].strip()
                elif line.startswith('Version:'):
                    version = line.split(':', 1)[1].strip()
                elif line.startswith('Requires-Dist:'):
                    requires.append(line.split(':', 1)[1].strip())
    except (IOError, OSError):
        pass
    return name, version, requires


def distributions(site):
    """[{name, key, version, dist_info, files: [(abs path, rel path, hash or None, size or None)], requires,
    record}]: record is False where the dist-info has no RECORD to read (a hollow dist-info: no installer can
    uninstall it, and nothing says which files are its)."""
    out = []
    for dist_info in sorted(glob.glob(os.path.join(site, '*.dist-info'))):
        name, version, requires = _metadata(dist_info)
        if not name:
            base = os.path.basename(dist_info)[:-len('.dist-info')]
            name, _sep, version = base.partition('-')
        files, record = [], True
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
            record = False
        out.append({'name': name, 'key': canon(name), 'version': version, 'dist_info': dist_info, 'files': files,
                    'requires': requires, 'record': record})
    return out


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


def claims(dists):
    """{path: [(distribution, digest, size)]}: every path a RECORD names, with each distribution that claims it (in
    the distributions' order) and the digest and size its RECORD gives."""
    owners = {}
    for d in dists:
        for path, _rel, digest, size in d['files']:
            owners.setdefault(path, []).append((d, digest, size))
    return owners


def broken_distributions(dists, mode):
    """RECORD integrity: [{name, version, missing, modified}] of the distributions with a file their RECORD names
    gone (missing) or not as it says (modified): its size in fast mode, its size and sha256 in full mode. Files the
    RECORD gives no hash (RECORD itself, .pyc files) are not checked. A dist-info without its RECORD is missing it."""
    broken = []
    for d in dists:
        missing, modified = [], []
        if not d.get('record', True):
            missing.append(os.path.basename(d['dist_info']) + '/RECORD')
        checked = [f for f in d['files'] if f[2] is not None]  # not RECORD itself, nor .pyc files
        stats = stat_files([f[0] for f in checked])  # one system call a file: fast mode's whole cost
        for (path, rel, digest, size), st in zip(checked, stats):
            if st is None:
                (modified if os.path.lexists(path) else missing).append(rel)  # a dangling link is not the file
            elif size is not None and st.st_size != size:
                modified.append(rel)
            elif mode == 'full' and file_digest(path) != digest:
                modified.append(rel)
        if missing or modified:
            broken.append({'name': d['name'], 'version': d['version'], 'missing': missing, 'modified': modified})
    return broken


def stat_files(paths):
    """os.stat of each path (None where it fails), in order. Consecutive paths in one directory (as a RECORD lists
    them) are stat'ed relative to it, opened once, which spares the kernel walking each path from the root: half
    the time on a venv of torch."""
    out, here, fd = [], None, None
    try:
        for path in paths:
            head, _sep, name = path.rpartition(os.sep)  # os.path.split's work for these paths, at a fifth of its cost
            if head != here:
                if fd is not None:
                    os.close(fd)
                here, fd = head, None
                try:
                    fd = os.open(head, os.O_RDONLY | os.O_DIRECTORY)
                except OSError:
                    pass
            try:
                out.append(os.stat(name, dir_fd=fd) if fd is not None else os.stat(path))
            except OSError:
                out.append(None)
    finally:
        if fd is not None:
            os.close(fd)
    return out


def lock_drift(dists, locked):
    """Drift against the lock ({canonical name: (name, version)}; None where there is no lock, and then no
    drift): {missing, extra, wrong_version}, the installers' own packages (TOOLING) never extra."""
    drift = {'missing': [], 'extra': [], 'wrong_version': []}
    if locked is None:
        return drift
    by_key = dict((d['key'], d) for d in dists)
    for key, (name, version) in sorted(locked.items()):
        have = by_key.get(key)
        if have is None:
            drift['missing'].append({'name': name, 'version': version})
        elif have['version'] != version:
            drift['wrong_version'].append({'name': name, 'installed': have['version'], 'locked': version})
    for d in dists:
        if d['key'] not in locked and d['key'] not in TOOLING:
            drift['extra'].append({'name': d['name'], 'version': d['version']})
    return drift
