"""The controller as docs/operators.md installs it: the checkout pip-installed into a venv of its own, without
extras, is a working gpufleet (the command, Ansible, ansible-runner, proxmoxer, requests, uv), which the guide's
`gpufleet doctor` shows on the lab; the lab's own packages are not in it."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.lab


def test_a_plain_install_in_a_venv_is_a_controller(lab, tmp_path):
    venv = tmp_path / 'controller'
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True)
    pip = subprocess.run([str(venv / 'bin' / 'pip'), 'install', '-q', '--disable-pip-version-check', ROOT],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    python = str(venv / 'bin' / 'python')
    have = subprocess.run([python, '-c', 'import ansible, ansible_runner, proxmoxer, requests, rich, yaml; '
                                         'import importlib.util as u; print(u.find_spec("fakepve") is None)'],
                          capture_output=True, text=True)
    assert have.returncode == 0 and have.stdout.strip() == 'True', have.stderr
    assert os.path.exists(venv / 'bin' / 'uv') and os.path.exists(venv / 'bin' / 'ansible-playbook')
    env = dict(os.environ, PATH='{0}:/usr/bin:/bin'.format(venv / 'bin'))
    done = subprocess.run(['gpufleet', 'doctor', '-i', 'inventories/lab', '--artifacts', str(tmp_path / 'home')],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert 'ready: ' in done.stdout
    # the lab is the lab extra's: a controller of a real cluster is told how to get it, not a traceback
    lab_up = subprocess.run(['gpufleet', 'lab', 'up'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert lab_up.returncode == 1 and "pip install 'gpufleet[lab]'" in lab_up.stderr
