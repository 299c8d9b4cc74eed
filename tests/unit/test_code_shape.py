"""The code's shape, read from its source: no function takes more than 10 positional parameters (more are given by
name, so that no caller can give two in the wrong order), and docs/architecture.md names every file of the
collection's code and the CLI, and only files that exist."""

import ast
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CODE = ('plugins/**/*.py', 'src/gpufleet/**/*.py')


def sources():
    return sorted(p for pattern in CODE for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)
                  if '__pycache__' not in p)


def test_no_function_takes_more_than_ten_positional_parameters():
    wide = []
    for path in sources():
        with open(path) as fh:
            tree = ast.parse(fh.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = len(node.args.posonlyargs) + len(node.args.args)
                if count > 10:
                    wide.append('{0}:{1} {2} ({3})'.format(os.path.relpath(path, ROOT), node.lineno, node.name, count))
    assert len(sources()) > 50 and wide == []


def test_the_architecture_page_names_every_file_of_the_code_and_only_files_that_exist():
    with open(os.path.join(ROOT, 'docs', 'architecture.md')) as fh:
        page = fh.read()
    files = [p for p in sources() if not p.endswith('__init__.py')]
    stems = set(os.path.splitext(os.path.basename(p))[0] for p in files)
    unnamed = [os.path.relpath(p, ROOT) for p in files
               if not re.search(r'(?<![\w.])' + re.escape(os.path.splitext(os.path.basename(p))[0]) + r'(?!\w)', page)]
    assert unnamed == []
    # a module_utils or plugin_utils file it names (`_name` or `_name.py`) exists
    named = set(re.findall(r'`(_[a-z][a-z_]*)(?:\.py)?`', page))
    assert named and sorted(named - stems) == []


def test_every_action_and_module_of_the_collection_imports():
    """Each action plugin and module imports with what it imports (a module_utils or plugin_utils file moved or
    renamed fails here, not first in a lab run)."""
    import importlib
    names = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(ROOT, 'plugins', 'action',
                                                                                            '*.py')))
    modules = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(ROOT, 'plugins',
                                                                                              'modules', '*.py')))
    assert names and modules
    for name in names:
        importlib.import_module('ansible_collections.gpufleet.proxmox.plugins.action.' + name)
    for name in modules:
        importlib.import_module('ansible_collections.gpufleet.proxmox.plugins.modules.' + name)
