"""Venv profiles: a directory holding the input (pyproject.toml), its hash-locked lock (requirements.lock,
written by `uv pip compile --generate-hashes` for the profile's Python and platform) and profile.yml (the
declared overrides, install arguments and what verify expects).

    gpufleet profile lock DIR [--find-links WHEELHOUSE]   regenerate DIR/requirements.lock
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


def lock_argv(directory, find_links=None):
    """The one command that regenerates a profile's lock (offline from a wheelhouse with find_links)."""
    meta = load(directory)
    shown = 'gpufleet profile lock {0}'.format(os.path.relpath(directory))
    argv = [uv(), 'pip', 'compile', os.path.join(directory, 'pyproject.toml'), '--generate-hashes', '--quiet',
            '--python-version', str(meta['python']), '--python-platform', meta['platform'],
            '--output-file', os.path.join(directory, 'requirements.lock')]
    if find_links:
        # The sources' explicit indexes are not reachable then: resolve from the wheelhouse alone.
        argv += ['--no-sources', '--no-index', '--find-links', find_links]
        shown += ' --find-links {0}'.format(find_links)
    return argv + ['--custom-compile-command', shown]


def collection_venv():
    """The collection's lock parser (module_utils _venv): the one that venv_build and venv_audit use. From the
    collections path (a checkout's .collections, or where the collection is installed)."""
    try:
        from ansible_collections.gpufleet.proxmox.plugins.module_utils import _venv
        return _venv
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
        from ansible_collections.gpufleet.proxmox.plugins.module_utils import _venv
    except ImportError:
        raise SystemExit('gpufleet: the gpufleet.proxmox collection is not on the collections path ({0}); install it '
                         '(ansible-galaxy collection install gpufleet.proxmox) or run from its checkout'.format(
                             ':'.join(paths)))
    return _venv


def collection_dir():
    """The root of the gpufleet.proxmox collection in use (its roles and profiles)."""
    module_utils = os.path.dirname(os.path.abspath(collection_venv().__file__))
    return os.path.dirname(os.path.dirname(module_utils))


def read_lock(path):
    """{canonical name: (version, [hashes])} of a lock, with the entries that are not pinned and hashed."""
    with open(path) as fh:
        _options, reqs = collection_venv().parse_lock(fh.read())
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
    canon = collection_venv().canon
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
    return problems


def main(args):
    if args.action == 'lock':
        argv = lock_argv(args.directory, args.find_links)
        done = subprocess.run(argv, check=False)
        if done.returncode != 0:
            return 1
    problems = check(args.directory)
    for p in problems:
        print('{0}: {1}'.format(args.directory, p), file=sys.stderr)
    return 1 if problems else 0
