# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Audit a Python venv in one pass: RECORD integrity, file collisions, ELF closure, drift against a lock,
and the commands that repair all of it (standard library only: it runs with the target's system Python).
"""


import base64
import csv
import glob
import hashlib
import io
import json
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


# -- whether the venv can start -----------------------------------------------------------------
# How CPython starts a venv (CPython Modules/getpath.py and Lib/site.py): bin/python is a link to the base
# interpreter; pyvenv.cfg, one level above it, names that interpreter's directory (home), and the base's prefix is
# searched upward from home for the standard library's landmark lib/pythonX.Y/os.py (STDLIB_LANDMARKS) and its
# exec_prefix for lib/pythonX.Y/lib-dynload (PLATSTDLIB_LANDMARK), X.Y being the interpreter's own version; site.py
# then makes the venv sys.prefix and puts its lib/pythonX.Y/site-packages on sys.path. A venv made for 3.11 that a
# 3.13 interpreter starts (a distribution upgrade replaced the base) runs without any of its packages.
PYTHON_NAME = re.compile(r'^python(\d+)\.(\d+)$')
# What the audit asks of a started interpreter: that it is this venv's (its sys.prefix) and which Python it is.
START_PROBE = ('import json, sys, sysconfig; print(json.dumps({"prefix": sys.prefix, "version": "%d.%d" % '
               'sys.version_info[:2], "purelib": sysconfig.get_paths()["purelib"]}))')


def pyvenv_cfg(venv):
    """pyvenv.cfg as {key, lowercased: value}; None where there is none."""
    try:
        with io.open(os.path.join(venv, 'pyvenv.cfg'), encoding='utf-8', errors='replace') as fh:
            lines = fh.read().splitlines()
    except (IOError, OSError):
        return None
    out = {}
    for line in lines:
        key, had, value = line.partition('=')
        if had:
            out[key.strip().lower()] = value.strip()
    return out


def _finding(check, msg, fix):
    return {'check': check, 'msg': msg, 'fix': fix}


def interpreter(venv, site, start=True, timeout=60):
    """Whether the venv can start, as CPython starts it (see above): (python, findings). python is what was found
    ({link, target, home, version: the base's X.Y, venv_version: the X.Y of the venv's lib/pythonX.Y, starts}); each
    finding is {check, msg, fix}. The files are read first; where they hold together (and start), bin/python is run
    once, isolated, to prove that it starts as this venv."""
    rebuild = 'a repair run rebuilds the venv from its lock beside it and switches to it once it verifies'
    link = os.path.join(venv, 'bin', 'python')
    venv_version = os.path.basename(os.path.dirname(site))[len('python'):]
    python = {'link': link, 'target': None, 'home': None, 'version': None, 'venv_version': venv_version,
              'starts': False}
    found = []
    if not os.path.lexists(link):
        return python, [_finding('no_interpreter', '{0} is missing: nothing can start the venv'.format(link), rebuild)]
    target = os.path.realpath(link)
    python['target'] = target
    named = PYTHON_NAME.match(os.path.basename(target))
    if named:
        python['version'] = '{0}.{1}'.format(*named.groups())
    if not os.path.isfile(target) or not os.access(target, os.X_OK):
        found.append(_finding(
            'base_python_missing', '{0} leads to {1}, which {2}: the Python the venv was made from is gone'.format(
                link, target, 'does not exist' if not os.path.lexists(target) else 'is not an executable file'),
            'reinstall that Python in the container (its distribution\'s package, such as python{0}-minimal), or '
            'let a repair run rebuild the venv for the container\'s Python'.format(python['version'] or '3')))
    cfg = pyvenv_cfg(venv)
    if cfg is None:
        found.append(_finding('no_pyvenv_cfg', '{0}/pyvenv.cfg is missing: the interpreter starts as the base Python, '
                              'without the venv\'s packages'.format(venv), rebuild))
    elif not cfg.get('home'):
        found.append(_finding('no_home', '{0}/pyvenv.cfg names no home (the base interpreter\'s directory)'.format(venv),
                              rebuild))
    else:
        python['home'] = cfg['home']
        if not os.path.isdir(cfg['home']):
            found.append(_finding('home_missing', 'pyvenv.cfg\'s home {0} does not exist'.format(cfg['home']),
                                  'reinstall the venv\'s base Python, or let a repair run rebuild the venv'))
    if python['version'] and python['version'] != venv_version:
        found.append(_finding(
            'python_changed', 'the venv was made for Python {0} (lib/python{0}) but {1} is now Python {2}, which '
            'does not see its packages'.format(venv_version, link, python['version']),
            'a repair run builds the venv for Python {0} where the profile\'s lock covers it'.format(python['version'])))
    if found:
        return python, found
    version = python['version'] or venv_version
    home = python['home'] or os.path.dirname(target)
    stdlib = 'lib/python{0}'.format(version)
    prefix = _search_up(home, stdlib + '/os.py') or _search_up(home, stdlib + '/os.pyc')
    if prefix is None:
        found.append(_finding(
            'no_stdlib', 'the standard library of Python {0} ({1}/os.py, looked for above {2}) is missing'.format(
                version, stdlib, home),
            'reinstall the Python {0} standard library in the container (Debian: libpython{0}-minimal and '
            'libpython{0}-stdlib)'.format(version)))
    else:
        for part, what in (('encodings/__init__.py', 'the encodings package, without which no interpreter starts'),):
            if not os.path.isfile(os.path.join(prefix, stdlib, part)):
                found.append(_finding('no_stdlib', '{0}/{1}/{2} is missing: {3}'.format(prefix, stdlib, part, what),
                                      'reinstall libpython{0}-minimal in the container'.format(version)))
    if _search_up(home, stdlib + '/lib-dynload', os.path.isdir) is None:
        found.append(_finding('no_stdlib', 'the extension modules of Python {0} ({1}/lib-dynload above {2}) are '
                              'missing'.format(version, stdlib, home),
                              'reinstall libpython{0}-minimal and libpython{0}-stdlib in the container'.format(version)))
    if found or not start:
        return python, found
    import subprocess
    try:
        out = subprocess.run([link, '-I', '-c', START_PROBE], capture_output=True, text=True, timeout=timeout,
                             check=False, cwd='/', env={'PATH': '/usr/bin:/bin', 'LC_ALL': 'C.UTF-8'})
    except (OSError, subprocess.TimeoutExpired) as e:
        return python, [_finding('does_not_start', '{0} does not start: {1}'.format(link, e), rebuild)]
    lines = [line for line in (out.stderr or '').strip().splitlines() if line.strip()]
    try:
        seen = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    except (ValueError, IndexError):
        seen = None
    if seen is None:
        return python, [_finding('does_not_start', '{0} does not start (exit {1}): {2}'.format(
            link, out.returncode, lines[-1] if lines else 'no message'), rebuild)]
    if seen.get('version') and seen['version'] != venv_version:
        python['version'] = seen['version']
        return python, [_finding(
            'python_changed', 'the venv was made for Python {0} (lib/python{0}) but {1} starts Python {2}, which '
            'does not see its packages'.format(venv_version, link, seen['version']),
            'a repair run builds the venv for Python {0} where the profile\'s lock covers it'.format(seen['version']))]
    python['version'] = seen.get('version') or python['version']
    if os.path.realpath(seen.get('prefix') or '') != os.path.realpath(venv) or \
            os.path.realpath(seen.get('purelib') or '') != os.path.realpath(site):
        return python, [_finding('not_this_venv', '{0} starts with sys.prefix {1} and site-packages {2}, not the '
                                 'venv\'s'.format(link, seen.get('prefix'), seen.get('purelib')), rebuild)]
    python['starts'] = True
    return python, []


def _search_up(start, landmark, test=os.path.isfile):
    """The first of start and its parents that holds landmark (getpath.py's search_up), or None."""
    here = start
    while here:
        if test(os.path.join(here, landmark)):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
    return None


# Files of site-packages that site.py runs at every start: a .pth file's lines that begin with `import`, and the
# sitecustomize and usercustomize modules (CPython Lib/site.py, addpackage and execsitecustomize). One that no
# distribution's RECORD names was put there by hand, and can break or change any import.
STARTUP_MODULES = ('sitecustomize', 'usercustomize')
SET_ASIDE = 'gpufleet-set-aside'  # where a repair moves them, in the venv


def startup_files(site, owners):
    """[{path, kind, lines}] of the files in site that run at start and that no RECORD names (owners: claims'
    answer): .pth files with import lines (kind pth) and sitecustomize/usercustomize (kind module). A .pth file of
    paths only adds directories after site-packages, which cannot stand in for the venv's own packages: it is not
    listed."""
    out = []
    try:
        names = sorted(os.listdir(site))
    except OSError:
        return out
    for name in names:
        path = os.path.join(site, name)
        if path in owners:
            continue
        if name.endswith('.pth') and os.path.isfile(path):
            try:
                with io.open(path, encoding='utf-8', errors='replace') as fh:
                    code = [line.rstrip() for line in fh if line.startswith(('import ', 'import\t'))]
            except (IOError, OSError):
                code = []
            if code:
                out.append({'path': name, 'kind': 'pth', 'lines': code[:5]})
        elif name.split('.', 1)[0] in STARTUP_MODULES and (name.endswith('.py') or os.path.isdir(path)):
            out.append({'path': name, 'kind': 'module', 'lines': []})
    return out


def activate_findings(venv):
    """The activate script must point at the venv itself: a job that sources it runs whatever Python is in the
    bin/ of the directory it names (VIRTUAL_ENV)."""
    path = os.path.join(venv, 'bin', 'activate')
    try:
        with io.open(path, encoding='utf-8', errors='replace') as fh:
            text = fh.read()
    except (IOError, OSError):
        return [_finding('no_activate', '{0} is missing: a job that sources it does not start'.format(path),
                         'a repair run rebuilds the venv from its lock beside it')]
    # the absolute paths it sets (uv's and CPython's scripts name the venv's directory; a line that computes it, as
    # the cygpath one for Windows shells, is not a path)
    named = re.findall(r'''^\s*(?:export\s+)?VIRTUAL_ENV=(['"]?)(/[^'"\n]*)\1\s*$''', text, re.M)
    elsewhere = [p for _q, p in named if os.path.realpath(p) != os.path.realpath(venv)]
    if elsewhere:
        return [_finding('activate_elsewhere', '{0} activates {1}, not this venv'.format(path, elsewhere[0]),
                         'a repair run rebuilds the venv from its lock beside it')]
    return []


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
    """[{name, version, dist_info, files: [(abs path, rel path, hash or None, size or None)]}]."""
    out = []
    for dist_info in sorted(glob.glob(os.path.join(site, '*.dist-info'))):
        name, version, requires = _metadata(dist_info)
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
        out.append({'name': name, 'key': canon(name), 'version': version, 'dist_info': dist_info, 'files': files,
                    'requires': requires})
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


def closure(site, resolver, providers, owner=None, requires=None, essential=None):
    """The venv's shared objects resolved as the loader would: (unresolved, optional), each a list of
    {soname, needed_by, provided_by}.

    providers: {soname: {distribution name: [paths of that name it installs]}}; owner: {real path of a shared
    object: its distribution's name}; requires: {distribution name: the names of every distribution it requires,
    transitively}; essential: the names of the distributions whose import must work (those of the venv's imports and
    what they require), None for every distribution.

    A soname that an object's distribution requires and whose file that requirement has installed is not missing:
    the distribution's Python imports its requirement first, and the loader takes a library already loaded by its
    soname (torchvision's and torchaudio's extensions need torch's libc10.so and have no path to it). Of the rest, a
    soname that a distribution of the venv lists but whose file is gone is unresolved (the venv's own library is
    lost), and so is one that an essential extension module needs (the DT_NEEDED closure of the extension modules
    of the essential distributions, which Python loads when it imports them). The rest are optional: system
    libraries that only objects loaded on demand need (plugins a library opens with dlopen, such as NCCL's and
    NVSHMEM's network transports or cuFile's RDMA support, which need their fabric's libraries only where that
    fabric is used), or that only another distribution's optional backends need (cupy's cuTENSOR, numba's TBB
    pool, mpi4py's MPICH variant: each package imports them on demand and does without). A library that Python code
    opens itself (ctypes) counts as one loaded on demand."""
    owner, requires = owner or {}, requires or {}
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
    todo = [real for real, info in infos.items() if info.module and (essential is None or owner.get(real) in essential)]
    while todo:
        real = todo.pop()
        if real not in loaded:
            loaded.add(real)
            todo.extend(edges.get(real, ()))
    unresolved, optional = [], []
    for soname, needers in sorted(missing.items()):
        listed = providers.get(soname, {})
        present = set(name for name, paths in listed.items() if any(os.path.exists(p) for p in paths))
        needers = [n for n in needers if not present.intersection(requires.get(owner.get(n), ()))]
        if not needers:
            continue
        item = {'soname': soname, 'needed_by': sorted(os.path.relpath(infos[n].path, site) for n in needers),
                'provided_by': sorted(listed)}
        (unresolved if (listed and not present) or loaded.intersection(needers) else optional).append(item)
    return unresolved, optional


def file_digest(path):
    h = hashlib.sha256()
    with open(path, 'rb') as fh:
        for block in iter(lambda: fh.read(1 << 20), b''):
            h.update(block)
    return 'sha256=' + base64.urlsafe_b64encode(h.digest()).rstrip(b'=').decode()


# -- Requires-Dist ------------------------------------------------------------------------
MARKER_TOKEN = re.compile(r'\s*(?:(?P<paren>[()])|(?P<op>===|==|!=|<=|>=|~=|<|>|not\s+in\b|in\b)|(?P<bool>and|or)\b|'
                          r"'(?P<sq>[^']*)'|\"(?P<dq>[^\"]*)\"|(?P<var>[A-Za-z_][A-Za-z0-9_.]*))")
VERSION_VARS = ('python_version', 'python_full_version', 'implementation_version', 'platform_release')


def _version(text):
    parts = re.match(r'^\s*(\d+(?:\.\d+)*)', text or '')
    return tuple(int(p) for p in parts.group(1).split('.')) if parts else None


def _compare(left, op, right, version):
    if op in ('in', 'not in') or re.sub(r'\s+', ' ', op) == 'not in':
        found = left in right
        return found if op == 'in' else not found
    if version:
        a, b = _version(left), _version(right.rstrip('.*'))
        if a is None or b is None:
            raise ValueError(right)
        if right.endswith('.*') and op in ('==', '!='):
            same = a[:len(b)] == b
            return same if op == '==' else not same
        size = max(len(a), len(b))
        a, b = a + (0,) * (size - len(a)), b + (0,) * (size - len(b))
        if op == '~=':
            return a >= b and a[:len(_version(right)) - 1] == b[:len(_version(right)) - 1]
    else:
        a, b = left, right
    return {'==': a == b, '===': left == right, '!=': a != b, '<': a < b, '<=': a <= b, '>': a > b,
            '>=': a >= b}.get(op, False) if op != '~=' else False


def marker_holds(marker, env, extras):
    """Whether a PEP 508 marker holds in env ({variable: value}) for a distribution asked for with extras (a set
    of canonical names). Raises ValueError for a marker it cannot read."""
    tokens, pos = [], 0
    marker = marker.strip()
    while pos < len(marker):
        m = MARKER_TOKEN.match(marker, pos)
        if not m or m.end() == pos:
            raise ValueError(marker)
        pos = m.end()
        kind = m.lastgroup
        value = m.group(kind)
        if kind in ('sq', 'dq'):
            tokens.append(('str', value))
        elif kind == 'op':
            tokens.append(('op', re.sub(r'\s+', ' ', value)))
        else:
            tokens.append((kind, value))
    tokens.append(('end', None))
    at = [0]

    def take():
        at[0] += 1
        return tokens[at[0] - 1]

    def value():
        kind, text = take()
        if kind == 'str':
            return text, None
        if kind == 'var':
            if text == 'extra':
                return None, 'extra'
            if text not in env:
                raise ValueError(text)
            return env[text], text
        raise ValueError(text)

    def atom():
        if tokens[at[0]] == ('paren', '('):
            take()
            out = either()
            if take() != ('paren', ')'):
                raise ValueError(marker)
            return out
        (left, lvar), (kind, op), (right, rvar) = value(), take(), value()
        if kind != 'op':
            raise ValueError(marker)
        if 'extra' in (lvar, rvar):
            wanted = canon(right if lvar == 'extra' else left)
            if op in ('==', '==='):
                return wanted in extras
            if op == '!=':
                return wanted not in extras
            raise ValueError(marker)
        return _compare(left, op, right, lvar in VERSION_VARS or rvar in VERSION_VARS)

    def both():
        out = atom()
        while tokens[at[0]] == ('bool', 'and'):
            take()
            out = atom() and out
        return out

    def either():
        out = both()
        while tokens[at[0]] == ('bool', 'or'):
            take()
            out = both() or out
        return out
    out = either()
    if tokens[at[0]][0] != 'end':
        raise ValueError(marker)
    return out


REQUIRES = re.compile(r'^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?')


def marker_env(venv, site):
    """The marker variables of the venv's Python (its version from pyvenv.cfg or its site-packages directory)."""
    import platform
    import sys
    short = os.path.basename(os.path.dirname(site))[len('python'):]
    full = short
    try:
        with io.open(os.path.join(venv, 'pyvenv.cfg'), encoding='utf-8') as fh:
            for line in fh:
                key, _sep, val = line.partition('=')
                if key.strip() in ('version', 'version_info') and _version(val.strip()):
                    full = val.strip()
    except (IOError, OSError):
        pass
    return {'os_name': os.name, 'sys_platform': sys.platform, 'platform_system': platform.system(),
            'platform_machine': platform.machine(), 'platform_release': platform.release(),
            'platform_version': platform.version(), 'platform_python_implementation': platform.python_implementation(),
            'implementation_name': sys.implementation.name, 'python_version': short,
            'python_full_version': full, 'implementation_version': full}


def requirement_edges(dists, env):
    """[(requirer's name, canonical name required, the requirement's text without its marker, holds)] for every
    Requires-Dist of the installed distributions, holds True where its marker holds (extras as the installed
    distributions ask for them), None where the marker cannot be read, and False where it does not hold."""
    parsed = {}
    for d in dists:
        reqs = []
        for text in d.get('requires') or ():
            spec, _sep, marker = text.partition(';')
            m = REQUIRES.match(spec)
            if m and canon(m.group(1)) != d['key']:
                extras = set(canon(e) for e in (m.group(2) or '').split(',') if e.strip())
                reqs.append((canon(m.group(1)), extras, marker.strip(), spec.strip()))
        parsed[d['key']] = reqs
    # the extras asked of each distribution grow until no holding requirement asks for more
    asked = dict((d['key'], set()) for d in dists)
    changed = True
    while changed:
        changed = False
        for d in dists:
            for key, extras, marker, _spec in parsed[d['key']]:
                if key in asked and not extras <= asked[key] and _holds(marker, env, asked[d['key']]) is not False:
                    asked[key] |= extras
                    changed = True
    edges = []
    for d in dists:
        for key, _extras, marker, spec in parsed[d['key']]:
            edges.append((d['name'], key, spec, _holds(marker, env, asked[d['key']])))
    return edges


def _holds(marker, env, extras):
    try:
        return not marker or marker_holds(marker, env, extras)
    except ValueError:
        return None


def required_by(edges):
    """{canonical name: [names of the installed distributions whose Requires-Dist names it]}, from
    requirement_edges' answer: each Requires-Dist taken where its marker holds (extras as the installed
    distributions ask for them). A marker it cannot read counts as holding."""
    out = {}
    for name, key, _spec, holding in edges:
        if holding is not False:
            names = out.setdefault(key, [])
            if name not in names:
                names.append(name)
    return dict((k, sorted(v)) for k, v in out.items())


def missing_requirements(dists, edges):
    """What `pip check` calls not installed: [{name, requirement, required_by}] for each distribution that an
    installed one requires (requirement_edges' answer: its marker holding for the venv; one that cannot be read is
    left out) and that is not installed. The incident's uninstall of the cu13 wheels that torch 2.11.0 requires is named here whole, without a
    lock (with one, the lock says what belongs in the venv, and its drift names what is missing)."""
    installed = set(d['key'] for d in dists)
    out = {}
    for name, key, spec, holding in edges:
        if holding is True and key not in installed:
            item = out.setdefault(key, {'name': REQUIRES.match(spec).group(1), 'requirement': spec, 'required_by': []})
            if name not in item['required_by']:
                item['required_by'].append(name)
    return [dict(item, required_by=sorted(item['required_by'])) for _key, item in sorted(out.items())]


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
    RECORD gives no hash (RECORD itself, .pyc files) are not checked."""
    broken = []
    for d in dists:
        missing, modified = [], []
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
            disk = file_digest(path)
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
        return set(canon(c['wins']) for c in self.found if c.get('wins') and c['on_disk'] != c['wins'])


def unsettled(broken, site, settled):
    """broken without the files whose bytes are the ones that belong there (settled: paths relative to site): such
    a file is not a broken distribution, nor one whose claimants nothing decides between (the collision is the
    finding). A distribution left with nothing missing or modified is dropped."""
    for b in broken:
        b['modified'] = [rel for rel in b['modified']
                         if os.path.relpath(os.path.normpath(os.path.join(site, rel)), site) not in settled]
    return [b for b in broken if b['missing'] or b['modified']]


def unresolved_libraries(site, dists, locked, edges=(), imports=()):
    """The shared-library closure (see closure), the loader's search path extended with the nvidia wheels'
    lib directories: (unresolved, optional), each unresolved library with in_lock, the names of the locked
    distributions that provide it. edges: requirement_edges' answer; imports: the modules whose import must work
    (their distributions and what those require are the essential ones), none for every distribution."""
    nvidia_dirs = sorted(glob.glob(os.path.join(site, 'nvidia', '*', 'lib')))
    resolver = _elf.Resolver(extra_dirs=nvidia_dirs)
    providers, owner = {}, {}
    for d in dists:
        for path, _rel, _digest, _size in d['files']:
            if '.so' in path:
                providers.setdefault(os.path.basename(path), {}).setdefault(d['name'], []).append(path)
                owner[os.path.realpath(path)] = d['name']
    requires = requirements(dists, edges)
    essential = None
    if imports:
        tops = set(name.split('.', 1)[0] for name in imports)
        essential = set()
        for d in dists:
            if any(rel.split('/', 1)[0].split('.', 1)[0] in tops for _path, rel, _digest, _size in d['files']):
                essential.add(d['name'])
                essential.update(requires[d['name']])
    unresolved, optional = closure(site, resolver, providers, owner, requires, essential)
    for u in unresolved:
        u['in_lock'] = sorted(locked[canon(p)][0] for p in u['provided_by'] if canon(p) in locked)
    return unresolved, optional


def requirements(dists, edges):
    """{distribution name: the names of the installed distributions it requires, transitively}, from
    requirement_edges' answer (a requirement whose marker cannot be read counts, as in required_by)."""
    names = dict((d['key'], d['name']) for d in dists)
    direct = {}
    for requirer, key, _spec, holding in edges:
        if holding is not False and key in names:
            direct.setdefault(requirer, set()).add(names[key])
    out = {}
    for name in names.values():
        seen, todo = set(), list(direct.get(name, ()))
        while todo:
            dep = todo.pop()
            if dep not in seen and dep != name:
                seen.add(dep)
                todo.extend(direct.get(dep, ()))
        out[name] = seen
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
    the files site-packages runs at start that no RECORD names (startup_files), RECORD integrity
    (broken_distributions), the paths several distributions claim (Collisions), the shared-library closure
    (unresolved_libraries), drift against the lock (lock_drift) and, in full mode, the imports (failed_imports),
    each of imports imported in a fresh interpreter of the venv (with env, within timeout seconds); fast mode reads
    files and starts the interpreter once, importing nothing. Then the plan that repairs it all in place
    (repair_plan; startup files moved aside into the venv's SET_ASIDE), or, where the venv cannot start, rebuild
    (why) and no plan: its installers need its interpreter."""
    check_imports(imports)
    site = site_packages(venv)
    dists = distributions(site)
    by_key = dict((d['key'], d) for d in dists)
    overrides = set(canon(o) for o in overrides)
    locked = read_lock(lock) if lock else {}
    edges = requirement_edges(dists, marker_env(venv, site))
    requirers = required_by(edges)
    owners = claims(dists)
    broken = broken_distributions(dists, mode)
    collisions = Collisions(site, by_key, mode, overrides, locked, requirers).check(owners)
    broken = unsettled(broken, site, collisions.settled)
    unresolved, optional = unresolved_libraries(site, dists, locked, edges, imports)
    drift = lock_drift(dists, locked if lock else None)
    absent = [] if lock else missing_requirements(dists, edges)
    python, starting = interpreter(venv, site)
    starting += activate_findings(venv)
    startup = startup_files(site, owners)
    failures = failed_imports(venv, mode, imports, env, timeout) if python['starts'] else []
    plan = repair_plan(venv, dists, broken, drift, locked, owners, installer=installer,
                       install_args=list(install_args), overrides=overrides, uv=uv, winners=collisions.winners,
                       restore=collisions.restore(), absent=absent)
    if startup:  # moved aside, not deleted: what someone put there is kept in the venv for them to read
        aside = os.path.join(venv, SET_ASIDE)
        plan = [['mkdir', '-p', aside]] + [['mv', '-f', '--', os.path.join(site, f['path']), aside + '/']
                                           for f in startup] + plan
    healthy = not (broken or collisions.found or unresolved or failures or absent or any(drift.values()) or starting
                   or startup)
    return {'healthy': healthy, 'site_packages': site, 'distributions': len(dists), 'python': python,
            # a venv that cannot start cannot be repaired in place (the installers run its interpreter): it is rebuilt
            'rebuild': '; '.join(f['msg'] for f in starting) or None,
            'findings': {'broken_distributions': broken, 'collisions': collisions.found,
                         'unresolved_libraries': unresolved, 'drift': drift, 'failed_imports': failures,
                         'missing_requirements': absent, 'interpreter': starting, 'startup_files': startup},
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
    paths they share (declared overrides, the one the venv's metadata requires) last, so their bytes end on disk."""
    winners = winners or {}
    python = os.path.join(venv, 'bin', 'python')
    by_key = dict((d['key'], d) for d in dists)
    extra = set(canon(e['name']) for e in drift['extra'])
    replaced = set(canon(w['name']) for w in drift['wrong_version'])
    reinstall = set(canon(b['name']) for b in broken) | set(restore)
    reinstall -= extra | replaced
    install = dict((canon(m['name']), '{0}=={1}'.format(m['name'], m['version'])) for m in drift['missing'])
    # a requirement that is not installed (without a lock): as the requirement says
    install.update((canon(a['name']), a['requirement']) for a in absent)
    install.update((canon(w['name']), '{0}=={1}'.format(w['name'], w['locked'])) for w in drift['wrong_version'])
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
    plan = []
    if installer == 'uv':
        gone = sorted(by_key[k]['name'] for k in extra | reinstall)
        if gone:
            plan.append([uv, 'pip', 'uninstall', '--python', python] + gone)
        for group in groups:
            if group:
                plan.append([uv, 'pip', 'install', '--python', python, '--no-deps'] + [specs[k] for k in group]
                            + install_args)
        return plan
    if extra:
        plan.append([python, '-m', 'pip', 'uninstall', '-y'] + sorted(by_key[k]['name'] for k in extra))
    for group in groups:
        if group:
            plan.append([python, '-m', 'pip', 'install', '--force-reinstall', '--no-deps'] + [specs[k] for k in group]
                        + install_args)
    return plan
