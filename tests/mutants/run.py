"""Mutation testing of the core modules with mutmut: every small change mutmut makes to their code (an operator
flipped, a constant changed, a call dropped) is run against the unit suite, and a change the suite does not notice
(a survivor) is a test missing or code that does nothing. `make mutants` (python tests/mutants/run.py [module ...]);
docs/testing.md lists the survivors and why each is harmless.

mutmut names a mutant by its file's path, and our tests import the collection as ansible_collections.gpufleet.
proxmox: so the checkout is copied to <stage>/ansible_collections/gpufleet/proxmox and mutmut runs in <stage>."""

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, 'tests', 'planted'))
from run import checkout_copy  # noqa: E402  (the planted bugs' copy of the checkout)

CORE = ('plugins/module_utils/_venv.py', 'plugins/module_utils/_venv_python.py', 'plugins/module_utils/_venv_dists.py',
        'plugins/module_utils/_venv_requires.py', 'plugins/module_utils/_venv_libs.py',
        'plugins/module_utils/_venv_build.py', 'plugins/module_utils/_lxc.py', 'plugins/module_utils/_lxc_config.py',
        'plugins/module_utils/_nvidia.py', 'plugins/module_utils/_nvidia_devices.py', 'plugins/plugin_utils/_verdict.py',
        'plugins/plugin_utils/_drift.py', 'plugins/plugin_utils/_fleet.py')
PREFIX = 'ansible_collections/gpufleet/proxmox/'
# tests that ask git or the checkout's layout about the project (the stage is no checkout), and those that run a
# module file as Ansible would, in a process of its own that does not import the stage's collection
NOT_HERE = ('test_readme_tables.py', 'test_code_shape.py', 'test_prefork.py')
NOT_RUN = 'not refuses_to_run_without_its_action and not direct_program'


def main(argv):
    modules = [m for m in CORE if not argv or any(a in m for a in argv)]
    stage = os.environ.get('GPUFLEET_MUTANTS_DIR', '/tmp/gpufleet-mutants')
    subprocess.run(['rm', '-rf', stage], check=True)
    checkout_copy(os.path.join(stage, PREFIX))
    tests = PREFIX + 'tests/unit'
    with open(os.path.join(stage, 'setup.cfg'), 'w') as fh:
        fh.write('[mutmut]\nsource_paths=\n    ansible_collections\nonly_mutate=\n{0}\n'
                 'pytest_add_cli_args_test_selection=\n    {1}\n{2}\npytest_add_cli_args=\n    -p\n    no:cacheprovider\n    -k\n    {3}\n'
                 .format('\n'.join('    ' + PREFIX + m for m in modules), tests,
                         '\n'.join('    --ignore={0}/{1}'.format(tests, t) for t in NOT_HERE), NOT_RUN))
    started = time.time()
    children = os.environ.get('GPUFLEET_MUTANTS_CHILDREN', str(os.cpu_count() or 1))
    run = subprocess.run([sys.executable, '-m', 'mutmut', 'run', '--max-children', children], cwd=stage, check=False)
    took = time.time() - started
    results = subprocess.run([sys.executable, '-m', 'mutmut', 'results'], cwd=stage, capture_output=True, text=True,
                             check=False)
    print(results.stdout)
    print('mutmut on {0} module(s) in {1:.0f} s; the stage is {2} (mutmut show <name> there)'.format(
        len(modules), took, stage))
    return run.returncode


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
