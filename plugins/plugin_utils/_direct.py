# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A module's call as a short Python program that runs its module_utils entry point directly (script), for the
calls a node runs for its containers in a check run (plugin_utils _deferred).

A module's call through Ansible unpacks its payload and imports and compiles ansible.module_utils.basic in the
target before the module's own work: about 0.15 s of CPU of a venv read's 0.41 s in each container. The read runs the
same entry point that the module's main() calls (venv_build's _venv_build.call), with the collection's module_utils
(standard library only: the entry point's and those it imports) given as source, and prints the result as the module does; the arguments are checked on the
controller first with the module's own argument spec and its validator (validated), so a bad argument fails the task
with the module's message before anything runs. Path arguments are expanded in the target, as the module does
there (~ and $VARS are the target's)."""


import ast
import json
import os
import tempfile

from ansible import constants as C
from ansible.module_utils.common.arg_spec import ModuleArgumentSpecValidator
from ansible.module_utils.errors import UnsupportedError

PACKAGE = 'ansible_collections.gpufleet.proxmox.plugins.module_utils'
MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'module_utils')
_SOURCES = {}  # {module_utils name: its sources and those it imports, as JSON}, in this process

# Runs in the target with its system Python (3.6 or newer): SOURCES are the entry point's module_utils and those it
# imports, by name, imported on demand; the entry point's result is printed as a module prints its result (rc 1 where it failed).
_PROGRAM = r'''
import importlib.abc, importlib.util, json, os, sys, traceback
SOURCES = json.loads(%(sources)r)
PACKAGES = set()
for _name in SOURCES:
    _parts = _name.split('.')
    PACKAGES.update('.'.join(_parts[:i]) for i in range(1, len(_parts)))


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name in SOURCES or name in PACKAGES:
            return importlib.util.spec_from_loader(name, self, is_package=name in PACKAGES)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        if module.__name__ in PACKAGES:
            module.__path__ = []
        else:
            exec(compile(SOURCES[module.__name__], module.__name__ + '.py', 'exec'), module.__dict__)


def expand(value, paths):
    if paths is True and isinstance(value, list):
        return [expand(v, True) for v in value]
    if paths is True:
        return os.path.expanduser(os.path.expandvars(value)) if isinstance(value, str) else value
    if isinstance(value, dict):
        return dict((k, expand(v, paths[k]) if k in paths else v) for k, v in value.items())
    return value


sys.meta_path.insert(0, Finder())
try:
    _module = __import__(%(module)r, fromlist=['_'])
    result = getattr(_module, %(function)r)(expand(json.loads(%(params)r), json.loads(%(paths)r)), %(check)r)
except Exception:
    result = {'failed': True, 'msg': 'MODULE FAILURE: ' + traceback.format_exc().strip().splitlines()[-1],
              'exception': traceback.format_exc()}
sys.stdout.write(json.dumps(result) + '\n')
sys.exit(1 if result.get('failed') else 0)
'''


def _sources(module):
    """{name: source} of module (a module_utils name of this collection) and the module_utils it imports, itself or
    through another, as JSON: found once a run. Each task of a host runs in its own process, so the first to need it
    keeps it in the run's private directory on the controller (as Ansible keeps a module's payload) for the others."""
    if module not in _SOURCES:
        kept = os.path.join(C.DEFAULT_LOCAL_TMP, 'gpufleet-direct-{0}.json'.format(module.rpartition('.')[2]))
        try:
            with open(kept) as fh:
                _SOURCES[module] = fh.read()
        except (IOError, OSError):
            _SOURCES[module] = json.dumps(_imported(module))
            fd, path = tempfile.mkstemp(prefix='.gpufleet-direct-', dir=C.DEFAULT_LOCAL_TMP)
            with os.fdopen(fd, 'w') as fh:
                fh.write(_SOURCES[module])
            os.rename(path, kept)  # whole or not at all for a process that reads it meanwhile
    return _SOURCES[module]


def _imported(module):
    """{name: source} of module and the module_utils of this collection it imports, itself or through another."""
    found, todo = {}, [module]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        with open(os.path.join(MODULE_UTILS, name.rpartition('.')[2] + '.py')) as fh:
            found[name] = fh.read()
        for node in ast.walk(ast.parse(found[name])):
            if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
                todo.extend(PACKAGE + '.' + alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or '').startswith(PACKAGE + '.'):
                todo.append(node.module)
    return found


def _unexpanded(spec):
    """spec with its path options as strings (expanded in the target instead), and where they are: {name: True, or
    the same for a dict option's own options}."""
    plain, paths = {}, {}
    for name, option in spec.items():
        option = dict(option)
        if option.get('type') == 'path':
            option['type'], paths[name] = 'str', True
        elif option.get('elements') == 'path':  # a list of paths
            option['elements'], paths[name] = 'str', True
        if option.get('options'):
            option['options'], inner = _unexpanded(option['options'])
            if inner:
                paths[name] = inner
        plain[name] = option
    return plain, paths


def validated(name, spec, args, **constraints):
    """(params, paths, None), or (None, None, the module's message) where args do not pass the module's argument spec
    (its constraints too: required_if and the like), as AnsibleModule says it."""
    plain, paths = _unexpanded(spec)
    checked = ModuleArgumentSpecValidator(plain, **constraints).validate(dict(args))
    if checked.errors.errors:
        msg = checked.errors.msg
        if isinstance(checked.errors[0], UnsupportedError):
            msg = 'Unsupported parameters for ({0}) module: {1}'.format(name, msg)
        return None, None, msg
    return checked.validated_parameters, paths, None


def script(entry, params, paths, check):
    """The program (source) that runs entry ('_module:function' of this collection's module_utils) with params
    (validated's, their paths expanded in the target) in check mode where check, and prints its result."""
    module, function = entry.split(':')
    return _PROGRAM % dict(sources=_sources(PACKAGE + '.' + module), module=PACKAGE + '.' + module, function=function,
                           params=json.dumps(params), paths=json.dumps(paths), check=bool(check))
