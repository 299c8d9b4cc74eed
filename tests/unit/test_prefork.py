"""The prefork callback, in real ansible-playbook runs on the controller (no lab): the plugins it loads when the
playbook starts are the forked workers' already, and its former name still finds it."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)

# Run in a task's worker before anything templates: which of the plugins prefork loads are there already.
LOADED = '''
import sys
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        names = sorted(sys.modules)
        return {'changed': False,
                'filters': [n for n in names if n.startswith('ansible.plugins.filter.core_')],
                'tests': [n for n in names if n.startswith('ansible.plugins.test.core_')],
                'connections': [n for n in names if n.endswith(('.plugins.connection.pct', '.plugins.connection.ssh'))],
                'lookups': [n for n in names if n.endswith('.plugins.lookup.env')]}
'''


def run(tmp_path, callbacks):
    (tmp_path / 'action_plugins').mkdir(exist_ok=True)
    (tmp_path / 'action_plugins' / 'loaded_here.py').write_text(LOADED)
    (tmp_path / 'play.yml').write_text('- hosts: localhost\n  gather_facts: false\n  tasks:\n'
                                       '    - loaded_here:\n      register: seen\n'
                                       '    - ansible.builtin.copy:\n        content: "{{ seen | to_json }}"\n'
                                       '        dest: ' + str(tmp_path / 'seen.json') + '\n')
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_CALLBACKS_ENABLED=callbacks,
               ANSIBLE_ACTION_PLUGINS=str(tmp_path / 'action_plugins'), ANSIBLE_LOCALHOST_WARNING='False',
               ANSIBLE_INVENTORY_UNPARSED_WARNING='False')
    done = subprocess.run([os.path.join(BIN, 'ansible-playbook'), '-i', 'localhost,', '-c', 'local', '-e',
                           'ansible_python_interpreter=' + sys.executable, str(tmp_path / 'play.yml')], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((tmp_path / 'seen.json').read_text()), done.stdout + done.stderr


def test_a_worker_finds_the_plugins_prefork_loaded_and_without_it_has_none(tmp_path):
    seen, _ = run(tmp_path, 'gpufleet.proxmox.prefork')
    assert len(seen['filters']) == 1 and len(seen['tests']) == 1, seen
    assert len(seen['connections']) == 2 and len(seen['lookups']) == 1, seen
    without, _ = run(tmp_path, 'ansible.builtin.timer')  # any other callback
    assert without['filters'] == [] and without['tests'] == [] and without['lookups'] == [], without
    assert not any(n.endswith('.pct') for n in without['connections']), without


def test_its_former_name_still_finds_it(tmp_path):
    seen, output = run(tmp_path, 'gpufleet.proxmox.gc_freeze')
    assert len(seen['filters']) == 1 and len(seen['connections']) == 2, seen
    assert 'gc_freeze' not in output, output  # no warning that it could not be loaded


def test_a_plugin_that_does_not_load_is_named_and_the_others_still_load(monkeypatch):
    from ansible.plugins.loader import init_plugin_loader
    init_plugin_loader([os.path.join(ROOT, '.collections')])
    from ansible_collections.gpufleet.proxmox.plugins.callback import prefork
    from ansible.plugins.loader import lookup_loader
    monkeypatch.setattr(prefork, 'PLUGINS', ((lookup_loader, 'gpufleet.proxmox.no_such_lookup'),
                                             (lookup_loader, 'ansible.builtin.env')))
    assert prefork.load_plugins() == ['gpufleet.proxmox.no_such_lookup']
    assert any(n.endswith('.plugins.lookup.env') for n in sys.modules)
