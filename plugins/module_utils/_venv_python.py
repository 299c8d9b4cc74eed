# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether a venv can start (the venv audit's first part): its site-packages, pyvenv.cfg, its interpreter and the
base Python behind it, the files site-packages runs at every start that no distribution installed, and its activate
script (standard library only: it runs with the target's system Python)."""


import glob
import io
import json
import os
import re


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


# -- what a job gets from activating the venv ---------------------------------------------------
# CUDA numbers the GPUs fastest first unless CUDA_DEVICE_ORDER says PCI_BUS_ID, the order of nvidia-smi and of the
# container's /dev/nvidiaN: without it, on a node of mixed GPUs, a job told to use GPU 1 (or CUDA_VISIBLE_DEVICES=1)
# gets another GPU than the one nvidia-smi calls 1. Each activation script exports it, in its shell's words.
JOB_ENV = (('CUDA_DEVICE_ORDER', 'PCI_BUS_ID'),)
ACTIVATE_SYNTAX = (('activate', 'export {0}={1}'), ('activate.fish', 'set -gx {0} {1}'),
                   ('activate.csh', 'setenv {0} {1}'))
JOB_ENV_NOTE = '# the GPUs numbered as nvidia-smi numbers them (gpufleet)'


def job_env_missing(venv):
    """[(script path, [(name, value) of JOB_ENV], [the lines that set them])] for the venv's activation scripts that
    exist and do not set all of JOB_ENV."""
    out = []
    for script, syntax in ACTIVATE_SYNTAX:
        path = os.path.join(venv, 'bin', script)
        try:
            with io.open(path, encoding='utf-8', errors='replace') as fh:
                have = set(line.strip() for line in fh)
        except (IOError, OSError):
            continue
        lacking = [(k, v) for k, v in JOB_ENV if syntax.format(k, v) not in have]
        if lacking:
            out.append((path, lacking, [syntax.format(k, v) for k, v in lacking]))
    return out


def job_env_findings(venv):
    """A finding (job_env) for each activation script that does not set JOB_ENV."""
    return [dict(_finding('job_env', '{0} does not set {1}: a job that sources it numbers the GPUs otherwise than '
                          'nvidia-smi'.format(path, ', '.join('{0}={1}'.format(k, v) for k, v in lacking)),
                          'a repair run appends {0} to it'.format('; '.join(lines))), path=path, lines=lines)
            for path, lacking, lines in job_env_missing(venv)]


def job_env_plan(findings):
    """The repair steps (argv lists) that append what each job_env finding names to its script."""
    return [['sh', '-c', 'printf "%s\\n" "$@" >> "$0"', f['path'], JOB_ENV_NOTE] + f['lines'] for f in findings]


def write_job_env(venv):
    """JOB_ENV appended to each of the venv's activation scripts that lacks it (a new venv's, from uv venv)."""
    for path, _lacking, lines in job_env_missing(venv):
        with io.open(path, 'a', encoding='utf-8') as fh:
            fh.write('\n'.join([JOB_ENV_NOTE] + lines) + '\n')
