"""README's tables name every plugin of the collection and every top-level directory of the project."""

import glob
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme():
    with open(os.path.join(ROOT, 'README.md')) as fh:
        return fh.read()


def test_every_plugin_has_a_row():
    rows = set(re.findall(r'^\| `gpufleet\.proxmox\.([a-z_]+)`', readme(), re.M))
    plugins = set()
    for kind in ('modules', 'action', 'connection', 'lookup', 'filter', 'inventory', 'callback'):
        for path in glob.glob(os.path.join(ROOT, 'plugins', kind, '*.py')):
            name = os.path.basename(path)[:-3]
            if not name.startswith('_'):
                plugins.add(name)
    assert plugins - rows == set(), 'README.md has no row for these plugins'
    assert rows - plugins == set(), 'README.md names plugins that do not exist'


def test_every_top_level_directory_has_a_row():
    text = readme()
    layout = text[text.index('| path | what |'):]
    named = set(re.findall(r'`([^`/]+)/', layout))
    # the project's own directories (what git tracks), not what runs leave behind (reports, venvs)
    tracked = subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    dirs = set(path.split('/')[0] for path in tracked.splitlines() if '/' in path and not path.startswith('.'))
    assert dirs - named == set(), 'README.md\'s layout table misses these directories'
