"""Stand-in for pip's get-pip.py bootstrap script, for ansible-test's --venv on a host that cannot reach
its download site: ensurepip gives the venv a pip, which then installs what get-pip was asked for."""

import subprocess
import sys

subprocess.check_call([sys.executable, '-m', 'ensurepip', '--upgrade', '--default-pip'])
args = [a for a in sys.argv[1:] if not a.startswith('--no-') or a in ('--no-cache-dir',)]
if args:
    subprocess.check_call([sys.executable, '-m', 'pip', 'install', '--disable-pip-version-check'] + args)
