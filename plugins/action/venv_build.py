# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.venv_build: the module runs in the container as any module does, except that with
defer, in a check run of a container reached with the pct connection, the call is recorded for its node to run with
its other containers' (plugin_utils _deferred; the pct_batch action runs them, pct_batch_result takes each result).
The recorded call runs the module's entry point without Ansible's module wrapper (plugin_utils _direct), its
arguments checked here first with the module's argument spec."""


from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.vars import merge_hash

from ansible_collections.gpufleet.proxmox.plugins.modules.venv_build import ARGUMENT_SPEC, REQUIRED_IF
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _container_python, _deferred, _direct, _profile


def from_profile(args):
    """The module's arguments with what the profile (profile: the venv_profile lookup's answer) gives filled in: the
    lock's text, the Python version, the overrides, the imports and what to remember (meta: the profile's name, the
    lock's path, its overrides, imports and expectations, its driver floor). Given once, the profile is templated once per task."""
    profile = args.pop('profile', None)
    if not profile:
        return args
    meta = profile.get('meta') or {}
    filled = dict(lock_content=profile.get('lock'), overrides=meta.get('overrides') or [],
                  imports=meta.get('imports') or ['torch'])
    if meta.get('python') is not None:
        filled['python_version'] = meta['python']
    filled.update(args)
    try:
        floor = _profile.driver_floor(profile.get('lock'))
    except ValueError:
        floor = None  # a CUDA gpufleet knows no driver for: the plan and the driver upgrade name it
    filled.setdefault('meta', dict(profile=profile.get('name'), profile_dir=profile.get('dir'), lock=filled.get('lock'),
                                   overrides=filled['overrides'], imports=filled['imports'],
                                   expect=meta.get('expect') or {}, floor=floor))
    return filled


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = dict(self._task.args)
        defer = boolean(args.pop('defer', False), strict=False)
        args = from_profile(args)
        module = _direct.module_of(self)
        if defer and self._task.check_mode and _deferred.can_defer(self):
            program, error = _direct.program(self, '_venv_build:call', ARGUMENT_SPEC, args, True, required_if=REQUIRED_IF)
            if error:
                return dict(result, failed=True, msg=error)
            result.update(changed=False, deferred=_deferred.record(self, module, args, task_vars, program=program))
            return result
        ran = _direct.the_module(self, args, task_vars)
        if _container_python.unreadable(ran):
            ran = self.container_python(ran, args, task_vars)
        return merge_hash(result, ran)

    def container_python(self, ran, args, task_vars):
        """A call that came back unreadable: where the container's Python is missing or does not start, the
        finding (container_python) and, in a repair run, the Python put back and the call made again."""
        found = _container_python.diagnose(self, _container_python.interpreter_of(self, task_vars))
        if found is None:
            return ran
        repair = boolean(args.get('repair', False), strict=False) and not self._task.check_mode
        if repair:
            ok, said = _container_python.repair(self, found)
            if ok:
                again = _direct.the_module(self, args, task_vars)
                if not _container_python.unreadable(again):
                    return dict(again, changed=True, python_repaired=found)
                said = again.get('msg') or said
            return dict(failed=True, container_python=found, msg='venv_build: {0}; putting it back failed: {1}'.format(
                found['msg'], said))
        return _container_python.result(found, self._task.check_mode, 'venv_build')
