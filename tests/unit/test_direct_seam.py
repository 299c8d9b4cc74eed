"""plugin_utils _direct is the one place that leans on ansible-core's internals. Each of them is checked in the
ansible-core at hand (this test fails loudly on a release that changes one), and where one is missing, or
GPUFLEET_DIRECT=0 asks, every call takes Ansible's own path. The lab runs the same modules both ways
(tests/integration/test_gpu_devices.py, test_lxc_container.py)."""

import ansible.plugins.action as action_plugins

from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _direct


def test_this_ansible_core_has_what_the_direct_path_relies_on():
    assert _direct.relied_on() == []


def test_a_changed_internal_is_named(monkeypatch):
    monkeypatch.setattr(action_plugins, 'modify_module', lambda module_name, module_args: None)
    assert _direct.relied_on() == ['ansible.plugins.action.modify_module takes no module_path']


class Shell:
    tmpdir = '/tmp/x'


class Connection:
    transport = 'local'
    has_native_async = False
    _shell = Shell()


class Task:
    async_val = 0
    check_mode = False
    resolved_action = 'gpufleet.proxmox.gpu_devices'


class Action:
    """Ansible's ActionBase as _direct meets it, recording the module calls Ansible's own path makes."""

    def __init__(self):
        self._connection, self._task, self.calls = Connection(), Task(), []

    def _is_pipelining_enabled(self, kind):
        return True

    def _execute_module(self, **kwargs):
        self.calls.append(kwargs)
        return {'changed': False, 'ran': 'the module'}

    def _remove_tmp_path(self, path):
        self.calls.append(('removed', path))


def test_without_the_direct_path_every_call_is_the_modules_own(monkeypatch):
    monkeypatch.setenv('GPUFLEET_DIRECT', '0')
    assert _direct.supported() is False
    action = Action()
    assert _direct.execute(action, '_gpu:discover_node', {}, {'root': '/'}, {}) == {'changed': False,
                                                                                       'ran': 'the module'}
    assert action.calls == [{'module_name': 'gpufleet.proxmox.gpu_devices', 'module_args': {'root': '/'},
                             'task_vars': {}, 'wrap_async': False}, ('removed', '/tmp/x')]
    assert _direct.on_controller(action) is False  # lxc_container's action then runs the module too
    monkeypatch.setenv('GPUFLEET_DIRECT', '1')
    assert _direct.supported() is True
