# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Content-addressed venvs: build one per (lock, overrides, Python) beside the active one, check it, then
switch a stable symlink to it atomically, keeping the previous ones for rollback.

    <root>/<id>/                 a venv; <id> = sha256 of the lock, the overrides and the Python version
    <root>/<id>/gpufleet-venv.json   written last: a venv without it is an unfinished build
    <root>/<id>/gpufleet-requirements.lock   the lock it was built from
    <root>/<id>/gpufleet-verified.json   torch_verify's record of the venv's last passing verification (_verify_record)
    <root>/history.json          the ids in the order they were made active, newest last
    <link> -> <root>/<id>        the stable path jobs use (/root/venv)

Store(root, link) is that layout: what is there, and the steps that change it. deploy(Request) is the venv's entry
point, call(params, check) the venv_build module's whole call (its driver step first). Standard library only: it runs
with the target's system Python.
"""


import contextlib
import fcntl
import hashlib
import io
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _gpu, _venv, _venv_dists, _venv_python, _verify_record
from ansible_collections.gpufleet.proxmox.plugins.module_utils._files import (
    read_json, read_text, replace_link, write_json, write_text)

MARKER = 'gpufleet-venv.json'
BROKEN = '.broken'  # <id>.broken: a venv that could not start, kept for inspection when it was built again
LOCK_COPY = 'gpufleet-requirements.lock'  # each venv keeps the lock it was built from
ID = re.compile(r'^[0-9a-f]{16}$')


class BuildError(Exception):
    """A build or check failed; the active venv was not touched."""

    def __init__(self, msg, **details):
        Exception.__init__(self, msg)
        self.details = details


class PythonNotLocked(ValueError):
    """The container's Python is not one the profile's lock was made for; finding says so, and how to lock it."""

    def __init__(self, finding):
        ValueError.__init__(self, '{0}; fix: {1}'.format(finding['msg'], finding['fix']))
        self.finding = finding


def not_locked(meta, wanted, python, have):
    """The finding of a container whose Python (have, of the interpreter python) no version of wanted (the Pythons of
    the profile that meta names, with its directory on the controller) covers."""
    where = meta.get('profile_dir') or '<its directory>'
    return {'check': 'python_not_locked', 'msg': 'the profile {0} is locked for Python {1}, but this container\'s '
            '{2} is Python {3}'.format(meta.get('profile') or '(given)', ', '.join(wanted), python, have),
            'fix': 'lock the profile for {0} too: add "{0}" to python in {1}/profile.yml, then: gpufleet profile lock '
            '{1}'.format('.'.join(have.split('.')[:2]), where)}


class RepairError(BuildError):
    """A step of the active venv's repair failed, or the repaired venv still has findings or does not import."""


# -- the lock -----------------------------------------------------------------------------
def phases(lock_text, overrides):
    """The lock split into the two installs, in order: everything else, then the declared overrides (so their
    bytes are the ones left at the paths they share). Raises ValueError naming every line that is not
    pinned with == and hashed, and every override the lock lacks."""
    options, reqs = _venv_dists.parse_lock(lock_text)
    problems = []
    for r in reqs:
        if r['key'] is None:
            problems.append('line {0}: {1!r} is not pinned with =='.format(r['line'], r['text']))
        elif not r['hashes']:
            problems.append('line {0}: {1}=={2} has no --hash'.format(r['line'], r['name'], r['version']))
    if not reqs:
        problems.append('it names no package')
    keys = set(r['key'] for r in reqs)
    wanted = [_venv_dists.canon(o) for o in overrides]
    for name, key in zip(overrides, wanted):
        if key not in keys:
            problems.append('overrides: {0} is not in the lock'.format(name))
    if problems:
        raise ValueError('the lock is not a full hash-locked pin set: ' + '; '.join(problems))
    head = ''.join(o + '\n' for o in options)
    first = head + ''.join(r['text'] + '\n' for r in reqs if r['key'] not in wanted)
    second = head + ''.join(r['text'] + '\n' for r in reqs if r['key'] in wanted)
    return [first] + ([second] if wanted else [])


def python_version(python):
    """'<implementation> <version> <machine>' of python: this interpreter's own where python is the one running
    (no second process), else python's, asked."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return '{0} {1} {2}'.format(sys.implementation.name, platform.python_version(), platform.machine())
    out = subprocess.run([python, '-c', 'import platform, sys; print(sys.implementation.name, '
                          'platform.python_version(), platform.machine())'],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ValueError('python {0} does not run: {1}'.format(python, (out.stderr or out.stdout).strip()))
    return out.stdout.strip()


def venv_id(lock_text, overrides, python):
    h = hashlib.sha256()
    for part in (lock_text, '\n'.join(_venv_dists.canon(o) for o in overrides), python):
        h.update(part.encode('utf-8') + b'\0')
    return h.hexdigest()[:16]


# -- building ---------------------------------------------------------------------------------
def run(argv, env, timeout, what):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise BuildError('{0} did not finish in {1} s'.format(what, timeout), argv=argv)
    except OSError as e:
        raise BuildError('{0} could not run: {1}'.format(what, e), argv=argv)
    if out.returncode != 0:
        raise BuildError('{0} failed (exit {1}): {2}'.format(what, out.returncode, tail(out.stderr or out.stdout)),
                         argv=argv, stderr=out.stderr)
    return out


def uv_wheel(names, version, machine=None):
    """The name of the uv wheel of this version for this machine (manylinux, x86_64 or aarch64) among names, or
    None."""
    machine = machine or platform.machine()
    found = sorted(n for n in names if n.startswith('uv-{0}-'.format(version)) and 'manylinux' in n
                   and n.endswith('_{0}.whl'.format(machine)))
    return found[0] if found else None


def uv_index(env=None):
    """The package index uv is fetched from: the one the build's environment names for uv or pip, else PyPI."""
    env = os.environ if env is None else env
    for name in ('UV_DEFAULT_INDEX', 'UV_INDEX_URL', 'PIP_INDEX_URL'):
        if env.get(name):
            return env[name]
    return 'https://pypi.org/simple'


def fetch_uv_wheel(index, version, dest, timeout=600, env=None):
    """Download the uv wheel of this version from a PEP 503 index into dest, checked against the sha256 the index
    gives; its path. Through the environment's proxy, with SSL_CERT_FILE (or PIP_CERT) as the CA bundle."""
    try:
        from urllib.parse import unquote, urljoin, urlsplit
    except ImportError:  # pragma: no cover - Python 2
        raise BuildError('installing uv needs Python 3')
    from ansible.module_utils.urls import ConnectionError as UrlError, open_url
    env = os.environ if env is None else env
    cafile = env.get('SSL_CERT_FILE') or env.get('PIP_CERT') or None

    def get(url):
        return open_url(url, timeout=timeout, ca_path=cafile, http_agent='gpufleet venv_build').read()
    page = index.rstrip('/') + '/uv/'
    try:
        html = get(page).decode('utf-8', 'replace')
    except (IOError, OSError, ValueError, UrlError) as e:
        raise BuildError('uv {0} could not be fetched: reading {1} failed: {2}'.format(version, page, e))
    links = dict((unquote(urlsplit(urljoin(page, h)).path.rsplit('/', 1)[-1]), urljoin(page, h))
                 for h in re.findall(r'href="([^"]+)"', html.replace('&amp;', '&')))
    name = uv_wheel(links, version)
    if not name:
        raise BuildError('the index {0} has no uv {1} wheel for {2} (manylinux)'.format(
            index, version, platform.machine()))
    url, fragment = (links[name].split('#', 1) + [''])[:2]
    try:
        data = get(url)
    except (IOError, OSError, ValueError, UrlError) as e:
        raise BuildError('uv {0} could not be fetched from {1}: {2}'.format(version, url, e))
    want = fragment[len('sha256='):] if fragment.startswith('sha256=') else None
    if want and hashlib.sha256(data).hexdigest() != want:
        raise BuildError('uv {0} from {1} does not match the sha256 the index gives'.format(version, url))
    path = os.path.join(dest, name)
    with open(path, 'wb') as fh:
        fh.write(data)
    return path


def ensure_uv(uv, version, find_links=None, check=False, timeout=600):
    """Put uv of this version at uv (<dir>/<version>/bin/uv) when it is not there yet, from its wheel: the one in
    find_links (offline), else the one the package index serves. The wheel is unpacked, not installed with pip, so
    that neither pip nor ensurepip is needed: a container made from PVE's debian-12-standard template has python3
    but not python3-venv. True when it was put there (in check mode: would be)."""
    if not version or os.path.exists(uv):
        return False
    if check:
        return True
    tmp = tempfile.mkdtemp(prefix='gpufleet-uv-')
    try:
        if find_links:
            name = uv_wheel(os.listdir(find_links), version) if os.path.isdir(find_links) else None
            if not name:
                raise BuildError('{0} has no uv {1} wheel for {2} (manylinux): add it to the wheelhouse'.format(
                    find_links, version, platform.machine()))
            wheel = os.path.join(find_links, name)
        else:
            wheel = fetch_uv_wheel(uv_index(), version, tmp, timeout)
        with zipfile.ZipFile(wheel) as z:
            member = [n for n in z.namelist() if n.endswith('.data/scripts/uv')]
            if not member:
                raise BuildError('{0} holds no uv executable (.data/scripts/uv)'.format(wheel))
            os.makedirs(os.path.dirname(uv), exist_ok=True)
            part = uv + '.part'
            with z.open(member[0]) as src, open(part, 'wb') as dst:
                shutil.copyfileobj(src, dst)
            os.chmod(part, 0o755)
            os.rename(part, uv)
    except (IOError, OSError, zipfile.BadZipfile) as e:
        raise BuildError('uv {0} could not be put at {1}: {2}'.format(version, uv, e))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def mount_of(path):
    """The mount point that holds path (its nearest existing ancestor), from /proc/self/mountinfo."""
    path = os.path.realpath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    best = '/'
    with io.open('/proc/self/mountinfo', encoding='utf-8', errors='replace') as fh:
        for line in fh:
            point = re.sub(r'\\([0-7]{3})', lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if (path == point or path.startswith(point.rstrip('/') + '/')) and len(point) >= len(best):
                best = point
    return best


def check_same_mount(root, cache_dir):
    """Hard links cannot cross mounts (a bind mount of the same filesystem included); uv would copy instead."""
    if not cache_dir:
        raise ValueError('link_mode: hardlink needs cache_dir (the uv cache the venvs link to)')
    root_mount, cache_mount = mount_of(root), mount_of(cache_dir)
    if root_mount != cache_mount:
        raise ValueError('link_mode: hardlink needs root ({0}, on the mount {1}) on the same mount as cache_dir '
                         '({2}, on {3}): hard links cannot cross mounts'.format(root, root_mount, cache_dir,
                                                                                cache_mount))


def tail(text, lines=20):
    return '\n'.join((text or '').strip().splitlines()[-lines:])


def uv_env(cache_dir=None, link_mode='copy'):
    """The environment every uv command of a build or a repair runs with."""
    env = dict(os.environ, UV_LINK_MODE=link_mode, UV_PYTHON_DOWNLOADS='never', UV_NO_PROGRESS='1')
    if cache_dir:
        env['UV_CACHE_DIR'] = cache_dir
    return env


def import_check(py, imports, env, timeout):
    """Each of imports imported in a fresh interpreter of the venv; raises BuildError naming each that fails and
    why (the loader's message names the library it could not open)."""
    failed = _venv.import_failures(py, imports, env, timeout)
    if failed:
        raise BuildError('; '.join('import {0} failed: {1}'.format(f['module'], f['message']) for f in failed),
                         failed_imports=failed)


def summary(findings):
    parts = [f['msg'] for f in findings.get('interpreter') or ()]
    parts += ['{0} runs at every start and no distribution installed it'.format(f['path'])
              for f in findings.get('startup_files') or ()]
    parts += [f['msg'] for f in findings.get('job_env') or ()]
    for b in findings['broken_distributions']:
        parts.append('{0} {1} lacks {2} file(s)'.format(b['name'], b['version'], len(b['missing']) + len(b['modified'])))
    by_claimants, ask = {}, {}
    for c in findings['collisions']:
        by_claimants.setdefault(', '.join(c['claimed_by']), []).append(c['path'])
        if c.get('decide'):
            ask[', '.join(c['claimed_by'])] = c['decide'].split(': ', 1)[-1]
    for names, paths in sorted(by_claimants.items()):  # one part per set of claimants: two wheels can share 100 files
        part = ('{0} is claimed by {1}'.format(paths[0], names) if len(paths) == 1 else
                '{0} files ({1}, ...) are claimed by {2}'.format(len(paths), ', '.join(paths[:2]), names))
        parts.append(part + (' ({0})'.format(ask[names]) if names in ask else ''))
    for u in findings['unresolved_libraries']:
        parts.append('{0} (needed by {1}) is not found'.format(u['soname'], ', '.join(u['needed_by'][:3])))
    for m in findings.get('missing_requirements') or ():
        parts.append('{0} (required by {1}) is not installed'.format(m['requirement'], ', '.join(m['required_by'])))
    for f in findings.get('failed_imports') or ():
        parts.append('import {0} failed: {1}'.format(f['module'], f['message']))
    for kind, items in sorted(findings['drift'].items()):
        for item in items:
            parts.append('{0} {1}'.format(kind.replace('_', ' '), item['name']))
    return '; '.join(parts) or 'none'


# -- the store --------------------------------------------------------------------------------
class Store:
    """The venvs under root and the link to the active one, laid out as above: which venv is active, which were,
    which are complete, and the steps that change them (a build, the switch of the link, the history, the prune, a
    repair). deploy makes its changes to the history, the link and the venvs under locked()."""

    def __init__(self, root, link):
        self.root, self.link = root, link

    def path(self, vid):
        """The directory of the venv vid."""
        return os.path.join(self.root, vid)

    def marker(self, vid):
        """The marker of the venv vid (None while its build is unfinished, or when there is none)."""
        return read_json(os.path.join(self.path(vid), MARKER))

    def complete(self, vid):
        return self.marker(vid) is not None

    def active(self):
        """The id the link points at (None when it is missing or points outside root)."""
        if not os.path.islink(self.link):
            return None
        target = os.path.realpath(self.link)
        if os.path.dirname(target) != os.path.realpath(self.root):
            return None
        return os.path.basename(target)

    def history(self):
        """The ids in the order they were made active, newest last ([] when there is no history.json)."""
        history = read_json(os.path.join(self.root, 'history.json'))
        return [h for h in history if isinstance(h, str)] if isinstance(history, list) else []

    def check_link(self):
        """Raises ValueError when the link is a real file or directory, which is never replaced."""
        link = self.link
        if os.path.lexists(link) and not os.path.islink(link):
            raise ValueError('link: {0} is a real {1}, not a symlink this module manages; move it away first '
                             '(mv {0} {0}.old) and run again'.format(link, 'directory' if os.path.isdir(link) else
                                                                     'file'))

    def kept(self, history, now, keep):
        """The id now plus the `keep` most recently active others of history that still exist."""
        previous = []
        for vid in reversed(history):
            if vid != now and vid not in previous and self.complete(vid):
                previous.append(vid)
        return [now] + previous[:keep]

    def plan_prune(self, keep_ids):
        """Venv directories under root to remove: finished ones not kept, and unfinished builds."""
        out = []
        if not os.path.isdir(self.root):
            return out
        for name in sorted(os.listdir(self.root)):
            if ID.match(name) and os.path.isdir(self.path(name)) and name not in keep_ids:
                out.append(name)
        return out

    @contextlib.contextmanager
    def locked(self):
        """Holds root's lock (<root>/.lock, root made where missing) for the changes made in the with block."""
        if not os.path.isdir(self.root):
            os.makedirs(self.root, 0o755)
        with io.open(os.path.join(self.root, '.lock'), 'w') as lock_fh:
            fcntl.flock(lock_fh, fcntl.LOCK_EX)
            yield

    def build(self, vid, req, *, lock_text, env):
        """Make the venv vid of lock_text (the lock's text, which req may only name by its lock_path) with req's
        python, uv, overrides, install_args, imports and timeout, and env (uv_env's) for uv: an unfinished build
        there removed first, the marker written last. Returns (timings, its audit); raises BuildError (the venv
        removed) when any step or check fails."""
        target = self.path(vid)
        if os.path.exists(target):
            shutil.rmtree(target)  # an unfinished build of an earlier run
        timings = {}
        try:
            started = time.time()
            run([req.uv, 'venv', '--quiet', '--allow-existing', '--python', req.python, target], env, req.timeout,
                'uv venv')
            _venv_python.write_job_env(target)
            py = os.path.join(target, 'bin', 'python')
            for n, text in enumerate(phases(lock_text, req.overrides)):
                part = os.path.join(target, 'gpufleet-lock-{0}.txt'.format(n))
                with io.open(part, 'w', encoding='utf-8') as fh:
                    fh.write(text)
                run([req.uv, 'pip', 'install', '--python', py, '--require-hashes', '--no-deps', '-r', part]
                    + list(req.install_args), env, req.timeout,
                    'installing the lock' if n == 0 else
                    'installing the overrides ({0})'.format(', '.join(req.overrides)))
                os.unlink(part)
            timings['install_s'] = round(time.time() - started, 2)
            started = time.time()
            own_lock = os.path.join(target, LOCK_COPY)  # the venv keeps the lock it was built from
            write_text(own_lock, lock_text)
            report = _venv.audit(target, own_lock, 'fast', 'uv', req.install_args, req.overrides, req.uv, list(req.imports))
            timings['audit_s'] = round(time.time() - started, 2)
            if not report['healthy']:
                raise BuildError('the new venv failed its audit: {0}'.format(summary(report['findings'])),
                                 findings=report['findings'])
            started = time.time()
            import_check(py, list(req.imports), env, req.timeout)
            timings['import_s'] = round(time.time() - started, 2)
        except BuildError:
            shutil.rmtree(target, ignore_errors=True)
            raise
        write_json(os.path.join(target, MARKER), {
            'id': vid, 'lock_sha256': hashlib.sha256(lock_text.encode('utf-8')).hexdigest(),
            'overrides': list(req.overrides), 'python': req.python, 'built_at': int(time.time()),
            'meta': req.meta or {}})
        return timings, report

    def switch(self, vid):
        """The link pointed at the venv vid, in one rename: a job starting at any moment sees the old venv or the
        new one."""
        replace_link(self.link, self.path(vid))

    def record(self, history):
        """history (ids, newest last) written as root's history.json."""
        write_json(os.path.join(self.root, 'history.json'), history)

    def remove(self, vids):
        """The venvs vids removed (plan_prune's)."""
        for name in vids:
            shutil.rmtree(self.path(name), ignore_errors=True)

    def rebuild(self, vid, req, *, lock_text, env):
        """The venv vid, which cannot start, built again from lock_text beside itself, as a first build is: the
        broken one renamed to <id>.broken (an older one of that name removed) and the link pointed at it, so that a
        job sees what it saw before and never a half-built venv; the new one built, audited and imported; then the
        link switched to it. A build that fails puts the broken venv and the link back as they were and raises
        RepairError. Returns (the broken venv's path, the build's timings, its audit)."""
        kept = self.path(vid) + BROKEN
        if os.path.lexists(kept):
            shutil.rmtree(kept)
        os.rename(self.path(vid), kept)
        replace_link(self.link, kept)
        try:
            timings, report = self.build(vid, req, lock_text=lock_text, env=env)
        except BuildError as e:
            os.rename(kept, self.path(vid))
            self.switch(vid)
            raise RepairError('the venv cannot start and building it again failed: {0}; it is as it was'.format(e),
                              **e.details)
        self.switch(vid)
        return kept, timings, report

    def mend(self, plan, req, *, lock, env):
        """Apply an audit's repair plan to the venv at the link, in its order, then audit it again against lock
        (with req's install_args, overrides and uv) and import req's imports with it, env (uv_env's) for each
        command. Returns the audit after the repair; raises RepairError naming the step or the findings left."""
        try:
            for argv in plan:
                run(argv, env, req.timeout, 'the repair step {0}'.format(' '.join(argv)))
            after = _venv.audit(self.link, lock, 'fast', 'uv', req.install_args, req.overrides, req.uv, list(req.imports))
            if not after['healthy']:
                raise BuildError('the repaired venv still has findings: {0}'.format(summary(after['findings'])),
                                 findings=after['findings'])
            import_check(os.path.join(self.link, 'bin', 'python'), list(req.imports), env, req.timeout)
        except BuildError as e:
            raise RepairError(str(e), **e.details)
        return after


class Request:
    """What deploy is asked to do: venv_build's options, each by name (keyword arguments only, so that no caller
    can give two in the wrong order) with the module's default. The module's lock, lock_content and python_version
    are lock_path, lock_text and python_version_wanted here; check is check mode. from_params makes one of the
    module's params."""

    def __init__(self, *, root, link, lock_path=None, python='/usr/bin/python3', uv='uv', overrides=(),
                 install_args=(), cache_dir=None, keep=2, imports=('torch',), rollback=False, check=False,
                 timeout=3600, python_version_wanted=None, meta=None, lock_text=None, uv_version=None,
                 uv_find_links=None, audit=False, repair=False, link_mode='copy', audit_mode='fast', hold=False):
        self.root, self.link, self.lock_path, self.lock_text = root, link, lock_path, lock_text
        self.python, self.python_version_wanted = python, python_version_wanted
        self.uv, self.uv_version, self.uv_find_links = uv, uv_version, uv_find_links
        self.overrides, self.install_args, self.imports = overrides, install_args, imports
        self.cache_dir, self.link_mode = cache_dir, link_mode
        self.keep, self.rollback, self.check, self.timeout, self.meta = keep, rollback, check, timeout, meta
        self.audit, self.audit_mode, self.repair = audit, audit_mode, repair
        self.hold = hold and not check

    @classmethod
    def from_params(cls, params, check=False):
        """The request of venv_build's params (module.params), in check mode where check."""
        return cls(root=params['root'], link=params['link'], lock_path=params['lock'], python=params['python'],
                   uv=params['uv'], overrides=params['overrides'], install_args=params['install_args'],
                   cache_dir=params['cache_dir'], keep=params['keep'], imports=params['imports'],
                   rollback=params['rollback'], check=check, timeout=params['timeout'],
                   python_version_wanted=params['python_version'], meta=params['meta'],
                   lock_text=params['lock_content'], uv_version=params['uv_version'],
                   uv_find_links=params['uv_find_links'], audit=params['audit'], repair=params['repair'],
                   link_mode=params['link_mode'], audit_mode=params['audit_mode'], hold=params['hold'])


def call(params, check):
    """The venv_build module's call with its validated params, in check mode where check: the container's NVIDIA
    userspace driver step first (params['driver']; a mismatch fails before the venv is touched), then deploy. Returns
    the module's result; a failure's has failed and msg (and what is known, e.g. the driver step's result)."""
    driver, extra = params['driver'], {}
    hold = params['hold'] and not check and os.path.lexists(params['link'])
    if driver:
        try:
            step = (driver['node_version'], driver['mode'], driver['mount'], driver['require_match'])
            if hold:
                ahead = _gpu.vendor().driver_step(*step, check=True)[0]
                if ahead['changed']:
                    # the driver the container loads would change: held before anything is touched
                    return dict(changed=True, held={'driver': True, 'venv': None}, driver=ahead, link=params['link'])
            extra['driver'], failed = _gpu.vendor().driver_step(*step, check=check)
        except (IOError, OSError) as e:
            return dict(failed=True, msg='venv_build: the driver step: {0}'.format(e))
        if failed:
            return dict(extra, failed=True, msg='venv_build: {0}; the venv was not touched'.format(extra['driver']['msg']))
    try:
        result = deploy(Request.from_params(params, check))
    except RepairError as e:
        return dict(e.details, failed=True, msg='venv_build: the repair of {0} failed: {1}'.format(params['link'], e),
                    **extra)
    except BuildError as e:
        return dict(e.details, failed=True, msg='venv_build: {0}; the active venv is unchanged'.format(e), **extra)
    except (ValueError, IOError, OSError) as e:
        return dict(extra, failed=True, msg='venv_build: {0}'.format(e))
    if extra:
        result.update(extra, changed=result.get('changed') or extra['driver']['changed'])
    return result


def deploy(req):
    """Make the lock's venv active at link (building it when it does not exist yet), or roll back, as req (a
    Request) asks. With lock_text, that is the lock, and it is written to lock_path once its venv is active (so the
    lock on the target always describes the active venv). With uv_version, uv is installed first where it is
    missing. With audit, the result also holds the active venv's audit against its own lock and its last
    verification (when the lock's venv is the active one, or would be without check mode); with repair too, an
    audit with findings is acted on: its plan applied, the venv audited and imported again (repaired, repair_audit;
    in check mode only changed). Returns the result dict; raises ValueError for bad input (nothing changed),
    BuildError for a failed build (the active venv and the lock file untouched) and RepairError for a failed repair.
    link_mode is uv's: copy, or hardlink from the uv cache (root and cache_dir on one mount). audit_mode is the
    active venv's audit's: fast, or full (sha256 of every file, and the imports imported)."""
    _venv.check_imports(req.imports)
    env = uv_env(req.cache_dir, req.link_mode)
    if req.link_mode == 'hardlink':
        check_same_mount(req.root, req.cache_dir)
    store = Store(req.root, req.link)
    try:
        result, built_report = deploy_venv(store, req, env)
    except PythonNotLocked as e:
        if not req.check or not store.active():
            raise
        # a check run reports it and audits the venv that is active (made for another Python, it cannot start)
        current = store.active()
        result, built_report = {'changed': False, 'built': False, 'switched': False, 'previous': current,
                                'removed': [], 'timings': {}, 'link': store.link, 'id': current,
                                'venv': store.path(current), 'meta': (store.marker(current) or {}).get('meta', {}),
                                'python_not_locked': e.finding}, None
    if req.audit and not result.get('held') and not (req.check and (result['built'] or result['switched'])):
        venv = result['venv']
        own = os.path.join(venv, LOCK_COPY)
        # A venv built in this run was audited by its build, against the same lock, moments ago.
        lock = own if os.path.exists(own) else req.lock_path
        result['audit'] = built_report or _venv.audit(store.link, lock, req.audit_mode, 'uv', req.install_args,
                                                      req.overrides, req.uv, list(req.imports), env, req.timeout)
        result['verified'] = _verify_record.read_record(venv)
        if req.repair and not result['audit']['healthy']:
            # a venv that cannot start is built again (its installers need its interpreter); the rest is mended
            rebuild = bool(result['audit'].get('rebuild'))
            result.update(changed=True, repaired=not req.check, rebuilt=rebuild)
            if req.check:
                return result
            if rebuild:
                with store.locked():
                    lock_text = read_text(lock) or req.lock_text
                    kept, timings, report = store.rebuild(result['id'], req, lock_text=lock_text, env=env)
                result.update(kept_broken=kept, repair_audit=report, verified=None)
                result['timings'].update(timings)
            else:
                result['repair_audit'] = store.mend(result['audit']['plan'], req, lock=lock, env=env)
    return result


def deploy_venv(store, req, env):
    """deploy's venv part in store (a Store): the lock's venv built where it is missing (or the previous one picked,
    for a rollback), the link switched to it, old venvs removed and the lock written, with env (uv_env's) for uv.
    Returns (the result dict, the new venv's audit or None)."""
    store.check_link()
    lock_text = req.lock_text
    given = lock_text is not None and not req.rollback
    if req.keep < 0:
        raise ValueError('keep: must be 0 or more, got {0}'.format(req.keep))
    history = store.history()
    current = store.active()
    if current and current not in history:
        history.append(current)
    result = {'changed': False, 'built': False, 'switched': False, 'previous': current, 'removed': [],
              'timings': {}, 'link': store.link}
    if req.rollback:
        candidates = [v for v in reversed(history) if v != current and store.complete(v)]
        if not candidates:
            raise ValueError('rollback: there is no previous venv under {0} to go back to'.format(store.root))
        vid = candidates[0]
    else:
        if lock_text is None:
            with io.open(req.lock_path, encoding='utf-8') as fh:
                lock_text = fh.read()
        phases(lock_text, req.overrides)  # validates before anything changes
        interpreter = python_version(req.python)
        have = interpreter.split()[1] if len(interpreter.split()) > 1 else ''
        wanted = [str(w) for w in req.python_version_wanted or ()]
        if wanted and not any((have + '.').startswith(w + '.') for w in wanted):
            raise PythonNotLocked(not_locked(req.meta or {}, wanted, req.python, have))
        vid = venv_id(lock_text, req.overrides, interpreter)
    result.update(id=vid, venv=store.path(vid), meta=(store.marker(vid) or {}).get('meta', req.meta or {}))
    if not req.rollback and current and current != vid:
        # the venv that is active was made for another Python (a distribution upgrade replaced the container's)
        made_for = '.'.join(((_venv_python.pyvenv_cfg(store.path(current)) or {}).get('version_info') or '').split('.')[:2])
        now = '.'.join(have.split('.')[:2])
        if made_for and made_for != now:
            result['python_changed'] = {'from': made_for, 'to': now}
    need_build = not req.rollback and not store.complete(vid)
    need_switch = current != vid
    if need_switch or history[-1:] != [vid]:
        history = [h for h in history if h != vid] + [vid]
    remove = [r for r in store.plan_prune(store.kept(history, vid, req.keep)) if r != vid]
    write_lock = given and read_text(req.lock_path) != lock_text
    work = bool(need_build or need_switch or remove or write_lock)
    result['uv_installed'] = ensure_uv(req.uv, req.uv_version, req.uv_find_links, req.check)
    result.update(changed=work or result['uv_installed'], built=need_build, switched=need_switch, removed=remove,
                  lock_written=bool(write_lock))
    report = None
    if req.check or not work:
        return result, report
    if req.hold and need_switch and current:
        # the active venv would change: the new one is built beside it, and nothing the container uses is touched
        result.update(switched=False, removed=[], lock_written=False, held={'driver': False, 'venv': vid})
        if need_build:
            with store.locked():
                result['timings'], report = store.build(vid, req, lock_text=lock_text, env=env)
                result['distributions'] = report['distributions']
        return result, report
    with store.locked():
        if need_build:
            timings, report = store.build(vid, req, lock_text=lock_text, env=env)
            result['timings'] = timings
            result['distributions'] = report['distributions']
        if need_switch:
            store.switch(vid)
        store.record(history)
        store.remove(remove)
        if write_lock:
            write_text(req.lock_path, lock_text)
    return result, report
