"""A variable that nothing writes is always undefined, and code that reads it sees None and says nothing: every host
variable fleet_report reads (its reads' defaults) has a writer in the collection - a task's register, a set_fact, a
module's ansible_facts - or is the fleet definition the operator writes (docs/fleet.md)."""

import ast
import glob
import os

import yaml

from ansible_collections.gpufleet.proxmox.plugins.modules import fleet_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def written():
    """The names the collection's tasks register, set_fact or give a host with add_host, and its modules return as
    ansible_facts."""
    names = set()

    def walk(node):
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            if isinstance(node.get('register'), str):
                names.add(node['register'])
            for key in ('ansible.builtin.set_fact', 'set_fact', 'ansible.builtin.add_host', 'add_host'):
                if isinstance(node.get(key), dict):
                    names.update(k for k in node[key] if k not in ('cacheable', 'name', 'hostname', 'groups', 'group'))
            for value in node.values():
                walk(value)
    for pattern in ('playbooks/*.yml', 'roles/*/tasks/*.yml'):
        for path in glob.glob(os.path.join(ROOT, pattern)):
            with open(path) as fh:
                walk(yaml.safe_load(fh))
    for path in glob.glob(os.path.join(ROOT, 'plugins', 'modules', '*.py')):
        with open(path) as fh:
            tree = ast.parse(fh.read())
        returns = [n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                   and [getattr(t, 'id', None) for t in n.targets] == ['RETURN']]
        facts = (yaml.safe_load(returns[0] if returns else '') or {}).get('ansible_facts') or {}
        names.update((facts.get('contains') or {}).keys())
    return names


def test_every_variable_fleet_report_reads_has_a_writer():
    reads = dict((k, v['default']) for k, v in fleet_report.ARGUMENT_SPEC['reads']['options'].items())
    with open(os.path.join(ROOT, 'docs', 'fleet.md')) as fh:
        operators = set(line.split(':')[0] for line in fh if line.startswith('gpufleet_'))
    have = written() | operators
    assert sorted(name for name in reads.values() if name not in have) == []
    assert reads['definition'] in operators and reads['reconcile'] in have - operators  # the walk found writers


def test_the_reads_are_documented_with_their_defaults():
    doc = yaml.safe_load(fleet_report.DOCUMENTATION)['options']['reads']['suboptions']
    spec = fleet_report.ARGUMENT_SPEC['reads']['options']
    assert dict((k, v['default']) for k, v in doc.items()) == dict((k, v['default']) for k, v in spec.items())
