"""The controller as docs/operators.md installs it, with the guide's own commands: the checkout pip-installed into
a venv of its own, without extras, and linked onto PATH, is a working gpufleet (the command, Ansible,
ansible-runner, proxmoxer, requests, uv), which the guide's `gpufleet doctor` shows on the lab; the lab's own
packages are not in it. With the collection installed as the guide says, the same command runs from a directory
that is not the checkout (an operator's inventory repository: no ansible.cfg there)."""

import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

from conftest import ROOT, doc_block

pytestmark = pytest.mark.lab


def test_the_guides_install_in_a_venv_is_a_controller(lab, tmp_path, request):
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

    # the collection installed as the guide says (into ~/.ansible/collections: a HOME of the test's own), and the
    # command run from an inventory repository outside the checkout, which has no ansible.cfg to find it by
    # a short HOME: ssh's control sockets go under ~/.ansible/cp, and a socket's path has at most 107 bytes
    home = pathlib.Path(tempfile.mkdtemp(prefix='op-', dir='/tmp'))
    request.addfinalizer(lambda: shutil.rmtree(home, ignore_errors=True))
    block = doc_block('3. The gpufleet command', 'sh', having='ansible-galaxy collection install')
    # the guide's /tmp first: the test's own paths are under /tmp too
    script = (block.replace(' /tmp', ' ' + str(tmp_path / 'built')).replace('/opt/gpufleet', str(venv))
              .replace('/path/to/gpufleet.proxmox', ROOT))
    assert ROOT in script and str(venv) in script, script
    os.makedirs(tmp_path / 'built')
    env = dict(os.environ, PATH='{0}:/usr/bin:/bin'.format(bin_dir), HOME=str(home))
    env.pop('ANSIBLE_CONFIG', None)
    done = subprocess.run(['bash', '-ec', script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    installed = home / '.ansible' / 'collections' / 'ansible_collections' / 'gpufleet' / 'proxmox'
    assert (installed / 'MANIFEST.json').is_file() and (installed / 'playbooks' / 'doctor.yml').is_file()
    repo = tmp_path / 'fleet-inventories'
    shutil.copytree(os.path.join(ROOT, 'inventories', 'lab'), repo / 'inventories' / 'lab')
    done = subprocess.run(['gpufleet', 'doctor', '-i', 'inventories/lab', '--artifacts', str(tmp_path / 'home2')],
                          cwd=str(repo), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert 'ready: ' in done.stdout
    # ansible-runner's record of the run: the collection's playbook, from the repository, with pipelining on (no
    # ansible.cfg there sets it)
    (command,) = (tmp_path / 'home2' / 'artifacts').glob('*/command')
    command = json.loads(command.read_text())
    assert command['command'][-1] == 'gpufleet.proxmox.doctor' and command['cwd'] == str(repo)
    assert command['env']['ANSIBLE_PIPELINING'] == 'True'
