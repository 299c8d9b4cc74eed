"""Venv profiles: a directory holding the input (pyproject.toml), its hash-locked lock (requirements.lock,
written by `uv pip compile --generate-hashes` for each of the profile's Pythons on its platform) and profile.yml
(the Pythons and platform the lock is for, the declared overrides, install arguments and what verify expects).

One lock serves every Python the profile lists: it is resolved for each of them, the resolutions must pin the same
versions (a profile whose packages differ by Python is split into one profile per Python), and it holds the hashes
of every one's wheels, so that a container installs the wheel of its own Python and no other.

    gpufleet profile lock DIR [--find-links WHEELHOUSE] [--python X.Y ...]   regenerate DIR/requirements.lock
                                                          (for some of its Pythons only, with --python)
    gpufleet profile check DIR                            input and lock agree
"""

import os
import re
import shutil
import subprocess
import sys
import tomllib

import yaml

PIN = re.compile(r'^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;]+)$')


def load(directory):
    with open(os.path.join(directory, 'profile.yml')) as fh:
        meta = yaml.safe_load(fh) or {}
    with open(os.path.join(directory, 'pyproject.toml'), 'rb') as fh:
        meta['dependencies'] = tomllib.load(fh)['project']['dependencies']
    return meta


def uv():
    here = os.path.join(os.path.dirname(sys.executable), 'uv')
    return here if os.path.exists(here) else shutil.which('uv') or 'uv'


PYTHON = re.compile(r'^3\.\d+$')


def pythons(meta):
    """The Pythons (X.Y) a profile's lock is for (the collection's reading of profile.yml's python)."""
    collection_dists()  # the collection on the path
    from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _profile
    return _profile.pythons(meta)


def lock_argv(directory, python, output, find_links=None, constraints=None, only=None):
    """The command that resolves a profile's input for one of its Pythons into output (offline from a wheelhouse
    with find_links; held to the versions of a constraints file where given; only: the --python the lock was asked
    for, shown in its header)."""
    meta = load(directory)
    shown = 'gpufleet profile lock {0}'.format(os.path.relpath(directory))
    argv = [uv(), 'pip', 'compile', os.path.join(directory, 'pyproject.toml'), '--generate-hashes', '--quiet',
            '--python-version', python, '--python-platform', meta['platform'], '--output-file', output]
    if constraints:
        argv += ['--constraint', constraints]
    if find_links:
        # The sources' explicit indexes are not reachable then: resolve from the wheelhouse alone.
        argv += ['--no-sources', '--no-index', '--find-links', find_links]
        shown += ' --find-links {0}'.format(find_links)
    shown += ''.join(' --python {0}'.format(p) for p in only or ())
    return argv + ['--custom-compile-command', shown]


def merge(locks):
    """One lock from the resolutions of several Pythons ({python: lock text}, in order): the first's text with each
    requirement's hashes the union of all of them. Raises ValueError naming every package whose pin differs between
    them (or that one of them lacks)."""
    parse = collection_dists().parse_lock
    order = list(locks)
    pins = dict((py, dict((r['key'], r) for r in parse(text)[1] if r['key'])) for py, text in locks.items())
    first = pins[order[0]]
    problems = []
    for key in sorted(set().union(*(set(p) for p in pins.values()))):
        seen = dict((py, pins[py][key]['version'] if key in pins[py] else None) for py in order)
        if len(set(seen.values())) > 1:
            problems.append('{0}: {1}'.format(key, ', '.join('{0} for Python {1}'.format(v or 'nothing', py)
                                                              for py, v in seen.items())))
    if problems:
        raise ValueError('the resolutions differ by Python ({0}): make one profile per Python'.format(
            '; '.join(problems)))
    canon, out = collection_dists().canon, []
    for line in locks[order[0]].splitlines():
        if line.startswith('    --hash='):
            continue  # each requirement's hashes are written after its pin, those of every resolution
        out.append(line)
        pin = PIN_LINE.match(line)
        if pin and canon(pin.group(1)) in first:
            hashes = sorted(set(h for py in order for h in pins[py][canon(pin.group(1))]['hashes']))
            out[-1] = line if line.endswith('\\') else line + ' \\'
            out += ['    --hash={0}{1}'.format(h, ' \\' if i < len(hashes) - 1 else '') for i, h in enumerate(hashes)]
    return '\n'.join(out) + '\n'


PIN_LINE = re.compile(r'^([A-Za-z0-9][A-Za-z0-9._-]*)==\S+')


def lock(directory, find_links=None, only=None):
    """Resolve the profile for each of its Pythons and write the merged lock (merge). The first Python's resolution
    is free; the others are held to its versions (a newer release that only newer Pythons install is not taken), so
    that where one set of versions serves them all, the lock has it. 0 when it was written."""
    import tempfile
    meta = load(directory)
    texts = {}
    with tempfile.TemporaryDirectory() as tmp:
        held = os.path.join(tmp, 'held.txt')
        wanted = pythons(meta)
        unknown = [p for p in only or () if p not in wanted]
        if unknown:
            print('{0}: --python {1}: the profile is for Python {2}'.format(directory, ', '.join(unknown),
                                                                           ', '.join(wanted)), file=sys.stderr)
            return 1
        for python in [p for p in wanted if not only or p in only]:
            out = os.path.join(tmp, python + '.lock')
            argv = lock_argv(directory, python, out, find_links, held if texts else None, only)
            if subprocess.run(argv, check=False).returncode != 0:
                print('{0}: resolving for Python {1} failed'.format(directory, python), file=sys.stderr)
                return 1
            with open(out) as fh:
                texts[python] = fh.read()
            if len(texts) == 1:
                with open(held, 'w') as fh:
                    fh.writelines('{0}=={1}\n'.format(r['name'], r['version'])
                                  for r in collection_dists().parse_lock(texts[python])[1] if r['key'])
    try:
        merged = merge(texts)
    except ValueError as e:
        print('{0}: {1}'.format(directory, e), file=sys.stderr)
        return 1
    head = '# Resolved for Python {0} on {1}{2}.'.format(', '.join(texts), meta['platform'],
                                                      '; one lock for all of them' if len(texts) > 1 else '')
    lines = merged.splitlines()
    at = next((i + 1 for i, line in enumerate(lines[:3]) if line.startswith('#    ')), 0)  # after uv's command line
    with open(os.path.join(directory, 'requirements.lock'), 'w') as fh:
        fh.write('\n'.join(lines[:at] + [head] + lines[at:]) + '\n')
    return 0


def collection_dists():
    """The collection's lock parser (module_utils _venv_dists): the one that venv_build and venv_audit use. From the
    collections path (a checkout's .collections, or where the collection is installed)."""
    try:
        from ansible_collections.gpufleet.proxmox.plugins.module_utils import _venv_dists
        return _venv_dists
    except ImportError:
        pass
    # Ansible's own collection loader, as its CLI sets it up (the checkout's .collections first)
    from ansible import constants
    from ansible.plugins.loader import init_plugin_loader
    checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            '.collections')
    paths = ([checkout] if os.path.isdir(checkout) else []) + list(constants.COLLECTIONS_PATHS)
    init_plugin_loader(paths)
    try:
        from ansible_collections.gpufleet.proxmox.plugins.module_utils import _venv_dists
    except ImportError:
        raise SystemExit('gpufleet: the gpufleet.proxmox collection is not on the collections path ({0}); install it '
                         '(ansible-galaxy collection install gpufleet.proxmox) or run from its checkout'.format(
                             ':'.join(paths)))
    return _venv_dists


def collection_dir():
    """The root of the gpufleet.proxmox collection in use (its roles and profiles)."""
    module_utils = os.path.dirname(os.path.abspath(collection_dists().__file__))
    return os.path.dirname(os.path.dirname(module_utils))


def read_lock(path):
    """{canonical name: (version, [hashes])} of a lock, with the entries that are not pinned and hashed."""
    with open(path) as fh:
        _options, reqs = collection_dists().parse_lock(fh.read())
    pins, problems = {}, []
    for r in reqs:
        if r['key'] is None or not r['hashes']:
            problems.append('{0}: {1!r} is not pinned with == and hashed'.format(os.path.basename(path), r['text'][:80]))
            continue
        pins[r['key']] = (r['version'], r['hashes'])
    return pins, problems


def check(directory):
    """Every way the profile's input, lock and profile.yml disagree (empty when they agree)."""
    meta = load(directory)
    lock = os.path.join(directory, 'requirements.lock')
    if not os.path.exists(lock):
        return ['no requirements.lock yet; make it with: gpufleet profile lock {0}'.format(directory)]
    pins, problems = read_lock(lock)
    canon = collection_dists().canon
    for dep in meta['dependencies']:
        m = PIN.match(dep.strip())
        if not m:
            problems.append('pyproject.toml: {0!r} is not pinned with =='.format(dep))
            continue
        got = pins.get(canon(m.group(1)))
        if got is None:
            problems.append('{0} is in pyproject.toml but not in the lock'.format(m.group(1)))
        elif got[0] != m.group(2):
            problems.append('{0}: pyproject.toml pins {1}, the lock {2}'.format(m.group(1), m.group(2), got[0]))
    for name in meta.get('overrides') or []:
        if canon(name) not in pins:
            problems.append('profile.yml overrides {0}, which the lock does not hold'.format(name))
    for key in ('python', 'platform', 'expect'):
        if key not in meta:
            problems.append('profile.yml: {0} is missing'.format(key))
    bad = [v for v in pythons(meta) if not PYTHON.match(v)]
    if 'python' in meta and (bad or not pythons(meta)):
        problems.append('profile.yml: python must be Python versions such as "3.11" (or a list of them), got {0!r}'.format(
            meta['python']))
    return problems


def main(args):
    if args.action == 'lock' and lock(args.directory, args.find_links, args.python) != 0:
        return 1
    problems = check(args.directory)
    for p in problems:
        print('{0}: {1}'.format(args.directory, p), file=sys.stderr)
    return 1 if problems else 0
