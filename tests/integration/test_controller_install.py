"""The controller as docs/operators.md installs it, with the guide's own commands: the checkout pip-installed into
a venv of its own, without extras, and linked onto PATH, is a working gpufleet (the command, Ansible,
ansible-runner, proxmoxer, requests, uv), which the guide's `gpufleet doctor` shows on the lab; the lab's own
packages are not in it."""

import os
import subprocess

import pytest

from conftest import ROOT, doc_block

pytestmark = pytest.mark.lab


def test_the_guides_install_in_a_venv_is_a_controller(lab, tmp_path):
    venv, bin_dir = tmp_path / 'controller', tmp_path / 'bin'
    bin_dir.mkdir()
    # section 3's install block, run as written: its paths here (the venv, the checkout, the link's directory)
    block = doc_block('3. The gpufleet command', 'sh', having='pip install')
    script = (block.replace('/opt/gpufleet', str(venv)).replace('/path/to/gpufleet.proxmox', ROOT)
              .replace('/usr/local/bin/gpufleet', str(bin_dir / 'gpufleet')))
    assert str(venv) in script and ROOT in script and str(bin_dir) in script, script
    done = subprocess.run(['bash', '-ec', script], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    python = str(venv / 'bin' / 'python')
    have = subprocess.run([python, '-c', 'import ansible, ansible_runner, proxmoxer, requests, rich, yaml; '
                                         'import importlib.util as u; print(u.find_spec("fakepve") is None)'],
                          capture_output=True, text=True)
    assert have.returncode == 0 and have.stdout.strip() == 'True', have.stderr
    assert os.path.exists(venv / 'bin' / 'uv') and os.path.exists(venv / 'bin' / 'ansible-playbook')
    # the link on PATH is the command: nothing of the venv's bin is on it
    env = dict(os.environ, PATH='{0}:/usr/bin:/bin'.format(bin_dir))
    done = subprocess.run(['gpufleet', 'doctor', '-i', 'inventories/lab', '--artifacts', str(tmp_path / 'home')],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert 'ready: ' in done.stdout
    # the lab is the lab extra's: a controller of a real cluster is told how to get it, not a traceback
    lab_up = subprocess.run(['gpufleet', 'lab', 'up'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert lab_up.returncode == 1 and "pip install 'gpufleet[lab]'" in lab_up.stderr
