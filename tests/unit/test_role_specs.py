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
