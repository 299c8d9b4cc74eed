"""Every role's meta/argument_specs.yml documents exactly its defaults, with the same default values."""

import glob
import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLES = sorted(os.path.basename(os.path.dirname(os.path.dirname(p)))
               for p in glob.glob(os.path.join(ROOT, 'roles', '*', 'defaults', 'main.yml')))


@pytest.mark.parametrize('role', ROLES)
def test_argument_specs_match_defaults(role):
    with open(os.path.join(ROOT, 'roles', role, 'defaults', 'main.yml')) as fh:
        defaults = yaml.safe_load(fh)
    with open(os.path.join(ROOT, 'roles', role, 'meta', 'argument_specs.yml')) as fh:
        options = yaml.safe_load(fh)['argument_specs']['main']['options']
    assert sorted(options) == sorted(defaults)
    for name, spec in options.items():
        assert spec.get('description'), name
        value = defaults[name]
        if '{{' in repr(value):
            continue  # computed from other variables: documented, not repeated
        assert 'default' in spec and spec['default'] == value, name


def role_uses(with_main=False):
    """(file, role, tasks_from) of every include_role/import_role with tasks_from (with_main: and those without, as
    main) in the playbooks, the roles and the molecule scenarios, read as YAML (tasks, blocks and plays walked)."""
    found = []

    def walk(node, path):
        if isinstance(node, list):
            for item in node:
                walk(item, path)
        elif isinstance(node, dict):
            for key in ('ansible.builtin.include_role', 'ansible.builtin.import_role', 'include_role', 'import_role'):
                call = node.get(key)
                if isinstance(call, dict) and (call.get('tasks_from') or with_main):
                    found.append((os.path.relpath(path, ROOT), call['name'].split('.')[-1],
                                  call.get('tasks_from') or 'main'))
            for value in node.values():
                walk(value, path)
    for pattern in ('playbooks/*.yml', 'site.yml', 'roles/*/tasks/*.yml', 'molecule/*/*.yml'):
        for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
            with open(path) as fh:
                walk(yaml.safe_load(fh), path)
    return found


def test_every_entry_point_a_playbook_or_role_uses_has_an_argument_spec():
    uses = role_uses()
    assert len(uses) > 20  # the walk finds them (site.yml alone has seven)
    missing = []
    for path, role, entry in uses:
        with open(os.path.join(ROOT, 'roles', role, 'meta', 'argument_specs.yml')) as fh:
            specs = yaml.safe_load(fh)['argument_specs']
        if os.path.splitext(entry)[0] not in specs:
            missing.append('{0}: {1} tasks_from {2}'.format(path, role, entry))
    assert missing == []


def test_no_role_includes_another_the_playbooks_orchestrate_them():
    # a role that includes another knows its variables and its order: the playbook that runs both says that once
    upward = ['{0} includes {1} ({2})'.format(path, role, entry) for path, role, entry in role_uses(with_main=True)
              if path.startswith('roles/') and path.split('/')[1] != role]
    assert upward == []


def test_the_running_containers_group_has_one_name_and_is_not_the_fleet_definition():
    import inspect
    import re
    from gpufleet.cli import fleet as cli
    from ansible_collections.gpufleet.proxmox.plugins.modules import fleet_report
    from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _verdict
    with open(os.path.join(ROOT, 'roles', 'gpu_container', 'vars', 'main.yml')) as fh:
        group = yaml.safe_load(fh)['__gpu_container_group']
    assert group == cli.CONTAINERS_GROUP == fleet_report.ARGUMENT_SPEC['containers_group']['default'] == \
        inspect.signature(_verdict.fleet).parameters['group'].default == 'gpufleet_running'
    named = []
    for pattern in ('playbooks/*.yml', 'molecule/*/*.yml', 'roles/*/tasks/*.yml'):
        for path in glob.glob(os.path.join(ROOT, pattern)):
            with open(path) as fh:
                for line in fh:
                    named += [(os.path.relpath(path, ROOT), g) for g in re.findall(r'\bgpufleet_\w+', line)
                              if 'hosts:' in line or 'groups[' in line or ' in groups' in line]
    assert named and all(g == group or g.startswith(group + '_') for _path, g in named), named
