# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A module's call as a short Python program that runs its module_utils entry point directly (script): the calls a
node runs for its containers in a check run (plugin_utils _deferred), and the node modules whose action runs them so
(execute: pct_batch, gpu_devices).

A module's call through Ansible makes its AnsiballZ payload on the controller, then unpacks it and imports and
compiles ansible.module_utils.basic in the target before the module's own work: about 0.15 s of CPU of a venv read's
0.41 s in each container. The program runs the same entry point that the module's main() calls (venv_build's
_venv_build.call, say), with the collection's module_utils (standard library only: the entry point's and those it
imports) given as source, and prints the result as the module does; the arguments are checked on the controller
first with the module's own argument spec and its validator (validated), so a bad argument fails the task with the
module's message before anything runs. Path arguments are expanded in the target, as the module does there (~ and
$VARS are the target's). The command line is the module's own, made by Ansible with a stand-in for the module
(through).

A module that would run on the controller (lxc_container, delegated to localhost) needs no program: here calls its
entry point in the task's own process, after the same checks, without a Python to start, a payload to make or
Ansible's module_utils to import again.

This is the one place that leans on ansible-core's internals (ActionBase's _execute_module and the modify_module it
calls, the argument validator's no_log values). relied_on checks each of them in the ansible-core at hand; where one
is not as this needs, or GPUFLEET_DIRECT=0 asks, supported() is False and every call takes Ansible's own path (the
module run as Ansible runs it): slower, never wrong. A unit test fails on an ansible-core release that changes them."""


import importlib
import inspect
import json
import os
import re
import tempfile

import ansible.plugins.action as action_plugins
from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ModuleArgumentSpecValidator
from ansible.module_utils.common.parameters import remove_values
from ansible.module_utils.common.text.converters import to_bytes
from ansible.module_utils.errors import UnsupportedError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

PACKAGE = 'ansible_collections.gpufleet.proxmox.plugins.module_utils'
MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'module_utils')
_SOURCES = {}  # {module_utils name: its sources and those it imports, as JSON}, in this process
# a line that imports from this collection's module_utils: the module named after the package, or the names imported
_IMPORT = re.compile(r'^[ \t]*from[ \t]+' + re.escape(PACKAGE) + r'(?:\.(\w+))?[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)', re.M)

# Runs in the target with its system Python (3.6 or newer): SOURCES are the entry point's module_utils and those it
# imports, by name, imported on demand; the entry point's result is printed as a module prints its result (rc 1 where it failed).
_PROGRAM = r'''
import importlib.util, json, os, sys
SOURCES = json.loads(%(sources)r)
PACKAGES = set()
for _name in SOURCES:
    _parts = _name.split('.')
    PACKAGES.update('.'.join(_parts[:i]) for i in range(1, len(_parts)))


class Finder(object):  # a finder and loader as the import system asks (importlib.abc's import is 15 ms)
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
    if isinstance(value, list):  # a list of dicts with path options
        return [expand(v, paths) for v in value]
    if isinstance(value, dict):
        return dict((k, expand(v, paths[k]) if k in paths else v) for k, v in value.items())
    return value


sys.meta_path.insert(0, Finder())
try:
    _module = __import__(%(module)r, fromlist=['_'])
    result = getattr(_module, %(function)r)(expand(json.loads(%(params)r), json.loads(%(paths)r)), %(check)r)
except Exception:
    import traceback
    result = {'failed': True, 'msg': 'MODULE FAILURE: ' + traceback.format_exc().strip().splitlines()[-1],
              'exception': traceback.format_exc()}
sys.stdout.write(json.dumps(result) + '\n')
sys.exit(1 if result.get('failed') else 0)
'''


def relied_on():
    """What of ansible-core's internals this module uses and finds changed, in words ([] where all is as it needs)."""
    changed = []
    if 'module_path' not in inspect.signature(action_plugins.modify_module).parameters:
        changed.append('ansible.plugins.action.modify_module takes no module_path')
    for name in ('_execute_module', '_configure_module', '_is_pipelining_enabled', '_compute_environment_string',
                 '_remove_tmp_path'):
        if not callable(getattr(ActionBase, name, None)):
            changed.append('ActionBase.{0} is gone'.format(name))
    try:  # through swaps the module-level modify_module: _configure_module must call it by that global name
        if 'modify_module(' not in inspect.getsource(ActionBase._configure_module):
            changed.append('ActionBase._configure_module no longer calls modify_module')
    except (AttributeError, OSError, TypeError):
        changed.append('ActionBase._configure_module cannot be read')
    checked = ModuleArgumentSpecValidator({'secret': {'type': 'str', 'no_log': True}}).validate({'secret': 'x1'})
    if getattr(checked, '_no_log_values', None) != {'x1'}:
        changed.append("the argument validator's result keeps no _no_log_values")
    return changed


_SUPPORTED = []


def supported():
    """Whether the direct path runs here: this ansible-core's internals as relied_on needs them, and GPUFLEET_DIRECT
    not turning it off. Else every call is the module's, run as Ansible runs it."""
    if os.environ.get('GPUFLEET_DIRECT') not in (None, '') and not boolean(os.environ['GPUFLEET_DIRECT'], strict=False):
        return False
    if not _SUPPORTED:
        _SUPPORTED.append(not relied_on())
    return _SUPPORTED[0]


def _sources(module):
    """{name: source} of module (a module_utils name of this collection) and the module_utils it imports, itself or
    through another, as JSON (once a process)."""
    if module not in _SOURCES:
        _SOURCES[module] = json.dumps(_imported(module))
    return _SOURCES[module]


def _imported(module):
    """{name: source} of module and the module_utils of this collection it imports, itself or through another: the
    names its `from <PACKAGE> import a, b` and `from <PACKAGE>.a import x` lines give (read as text, not parsed: a
    few milliseconds where parsing the sources took a tenth of a second in every task's process)."""
    found, todo = {}, [module]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        with open(os.path.join(MODULE_UTILS, name.rpartition('.')[2] + '.py')) as fh:
            found[name] = fh.read()
        for inner, names in _IMPORT.findall(found[name]):
            if inner:
                todo.append(PACKAGE + '.' + inner)
                continue
            for alias in names.strip('()').replace('\\', ' ').split(','):
                if alias.strip():
                    todo.append(PACKAGE + '.' + alias.split()[0])
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


def _checked(name, spec, args, **constraints):
    """(ModuleArgumentSpecValidator's result for args against spec and constraints, None), or (it, the module's
    message as AnsibleModule says it) where they do not pass."""
    checked = ModuleArgumentSpecValidator(spec, **constraints).validate(dict(args))
    if not checked.errors.errors:
        return checked, None
    msg = checked.errors.msg
    if isinstance(checked.errors[0], UnsupportedError):
        msg = 'Unsupported parameters for ({0}) module: {1}'.format(name, msg)
    return checked, msg


def validated(name, spec, args, **constraints):
    """(params, paths, None), or (None, None, the module's message) where args do not pass the module's argument spec
    (its constraints too: required_if and the like), as AnsibleModule says it."""
    plain, paths = _unexpanded(spec)
    checked, error = _checked(name, plain, args, **constraints)
    if error:
        return None, None, error
    return checked.validated_parameters, paths, None


def script(entry, params, paths, check):
    """The program (source) that runs entry ('_module:function' of this collection's module_utils) with params
    (validated's, their paths expanded in the target) in check mode where check, and prints its result."""
    module, function = entry.split(':')
    return _PROGRAM % dict(sources=_sources(PACKAGE + '.' + module), module=PACKAGE + '.' + module, function=function,
                           params=json.dumps(params), paths=json.dumps(paths), check=bool(check))


# In a module's place while its call is made (its payload is not sent: the program is, or the command is answered
# from elsewhere): a module of the JSON-arguments kind, whose payload Ansible makes by writing the arguments into it,
# with a Python module's interpreter line. The command line comes out as the module's own (its interpreter as Ansible
# finds it, the task's environment, become), without making the module's AnsiballZ payload (a fifth of a second of
# the controller's CPU for each module a run calls, and the other hosts' tasks waiting on its lock meanwhile). Its
# mark tells the module's command (whose input is the stand-in's payload) from the others Ansible may run first (the
# interpreter's discovery, where the host's Python is not given): only the module's is answered.
_MARK = b'# gpufleet.proxmox: a stand-in for a module whose call is made as a program'
_STAND_IN = b'#!/usr/bin/python\n' + _MARK + b'\n# <<INCLUDE_ANSIBLE_MODULE_JSON_ARGS>>\n'


class _Answered(object):
    """A task's connection whose module command answer(cmd, in_data, sudoable) answers; any other command (the
    interpreter's discovery) runs as it would."""

    def __init__(self, real, answer):
        self._real, self._answer = real, answer

    def __getattr__(self, name):
        return getattr(self._real, name)

    def exec_command(self, cmd, in_data=None, sudoable=True):
        if in_data is not None and _MARK in to_bytes(in_data):
            return self._answer(cmd, in_data, sudoable)
        return self._real.exec_command(cmd, in_data=in_data, sudoable=sudoable)

    def put_file(self, in_path, out_path):
        raise AnsibleError('a module call made as a program cannot copy files: it needs pipelining')


def _stand_in():
    path = os.path.join(C.DEFAULT_LOCAL_TMP, 'gpufleet-direct-stand-in')
    if not os.path.exists(path):
        fd, made = tempfile.mkstemp(prefix='.gpufleet-direct-', dir=C.DEFAULT_LOCAL_TMP)
        with os.fdopen(fd, 'wb') as fh:
            fh.write(_STAND_IN)
        os.rename(made, path)  # whole or not at all for a process that reads it meanwhile
    return path


def through(action, answer, module, args, task_vars):
    """action's _execute_module of module(args), its payload the stand-in's, the module's command (with input) answered
    by answer(cmd, in_data, sudoable) -> (rc, stdout, stderr); the result parsed as Ansible parses a module's."""
    real, make, path = action._connection, action_plugins.modify_module, _stand_in()

    def stand_in(*given, **kwargs):
        if 'module_path' in kwargs:
            kwargs['module_path'] = path
        else:  # ansible-core 2.18 gives it second
            given = given[:1] + (path,) + given[2:]
        return make(*given, **kwargs)

    action._connection, action_plugins.modify_module = _Answered(real, answer), stand_in
    try:
        return action._execute_module(module_name=module, module_args=dict(args), task_vars=task_vars)
    finally:
        action._connection, action_plugins.modify_module = real, make


def module_of(action):
    """The module this action's task calls (its resolved name)."""
    return action._task.resolved_action or action._task.action


def program(action, entry, spec, args, check, **constraints):
    """(the program of this task's module call, args, as entry's script in check mode where check, None), or (None,
    the module's message) where args do not pass spec (the module's argument spec, and constraints: validated)."""
    params, paths, error = validated(module_of(action), spec, args, **constraints)
    if error:
        return None, error
    return script(entry, params, paths, check), None


def execute(action, entry, spec, args, task_vars, **constraints):
    """This task's module call, args, run over the task's connection as the program of its entry point (program);
    the result parsed as the module's. Where the task's connection does not pipeline modules, the module itself
    runs, and so it does where the direct path is not supported here."""
    if not supported() or not action._is_pipelining_enabled('new'):
        return the_module(action, args, task_vars)
    made, error = program(action, entry, spec, args, action._task.check_mode, **constraints)
    if error:
        return {'failed': True, 'msg': error}
    made = to_bytes(made)
    real = action._connection
    return through(action, lambda cmd, in_data, sudoable: real.exec_command(cmd, in_data=made, sudoable=sudoable),
                   module_of(action), args, task_vars)


def the_module(action, args, task_vars):
    """The task's module itself, run with args as Ansible's own action for modules runs it (asynchronously where the
    task asks, its temporary directory removed after it otherwise)."""
    wrap_async = action._task.async_val and not action._connection.has_native_async
    result = action._execute_module(module_name=module_of(action), module_args=dict(args), task_vars=task_vars,
                                    wrap_async=wrap_async)
    if not wrap_async:
        action._remove_tmp_path(action._connection._shell.tmpdir)
    return result


def on_controller(action):
    """Can here make this task's call: its module would run on the controller, as the controller's user (a local
    connection, no become), and the direct path is supported here?"""
    return supported() and getattr(action._connection, 'transport', None) == 'local' and not action._play_context.become


def here(action, entry, spec, args, **constraints):
    """This task's module call, args, made in this process (the task's worker on the controller) for a module that
    would run on the controller (on_controller): entry ('_module:function' of this collection's module_utils) is
    called with the arguments as AnsibleModule makes them (spec and constraints checked, defaults, fallbacks read
    with the task's environment in place) and the module's check mode, and the values the spec marks no_log are
    taken out of its result, as AnsibleModule does. The task's environment is the process's meanwhile (the libraries
    the entry point uses read theirs, as a proxy's, from there)."""
    environment = {}
    action._compute_environment_string(environment)
    saved = dict(os.environ)
    os.environ.update((str(k), str(v)) for k, v in environment.items())
    try:
        checked, error = _checked(module_of(action), spec, args, **constraints)
        if error:
            return {'failed': True, 'msg': error}
        module, function = entry.split(':')
        work = getattr(importlib.import_module(PACKAGE + '.' + module), function)
        result = work(checked.validated_parameters, bool(action._task.check_mode))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return remove_values(result, checked._no_log_values)
