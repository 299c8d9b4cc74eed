"""What AWX needs from the repository, without AWX: collections/requirements.yml installs the collection
from a checkout used as a project, and ansible-builder makes an execution environment's build context from
meta/execution-environment.yml whose galaxy step installs the collection, whose Python and system
requirements ansible-builder's introspection then finds."""

import os
import subprocess
import sys

import ansible_builder
import yaml

from conftest import ROOT

BIN = os.path.dirname(sys.executable)


def galaxy_install(requirements, cwd, into):
    done = subprocess.run([os.path.join(BIN, 'ansible-galaxy'), 'collection', 'install', '--force', '-r', requirements,
                           '-p', str(into)], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return into / 'ansible_collections' / 'gpufleet' / 'proxmox'


def test_project_requirements_install_the_collection_from_the_checkout(tmp_path):
    installed = galaxy_install('collections/requirements.yml', ROOT, tmp_path / 'collections')
    for path in ('playbooks/drift.yml', 'plugins/modules/venv_audit.py', 'roles/verify/tasks/main.yml',
                 'meta/runtime.yml', 'MANIFEST.json'):
        assert (installed / path).is_file(), path
    assert not (installed / 'gpufleet-reports').exists() and not (installed / 'src').exists()


def test_ansible_builder_creates_a_context_that_installs_the_collection(tmp_path):
    context = tmp_path / 'context'
    done = subprocess.run([os.path.join(BIN, 'ansible-builder'), 'create', '-f', 'meta/execution-environment.yml',
                           '-c', str(context)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and 'Complete!' in done.stdout, done.stdout + done.stderr
    containerfile = (context / 'Dockerfile').read_text()
    assert 'ansible-galaxy collection install' in containerfile and 'ansible-core>=2.18' in containerfile
    assert 'ansible-runner>=2.4' in containerfile
    # The image's galaxy step (cwd /build, the context's _build) installs the checkout's collection ...
    build = context / '_build'
    assert yaml.safe_load((build / 'requirements.yml').read_text()) == {
        'collections': [{'name': 'collection', 'type': 'dir'}]}
    installed = galaxy_install('requirements.yml', build, tmp_path / 'image')
    assert (installed / 'plugins' / 'connection' / 'pct.py').is_file()
    # ... and introspection of it, as the image's builder stage runs it, finds its requirements.
    introspect = os.path.join(os.path.dirname(ansible_builder.__file__), '_target_scripts', 'introspect.py')
    found = subprocess.run([sys.executable, introspect, 'introspect', str(tmp_path / 'image')],
                           capture_output=True, text=True, check=True).stdout
    deps = yaml.safe_load(found[found.index('---'):])
    assert [d.split()[0] for d in deps['python']] == ['proxmoxer>=2.2', 'requests>=2.31']
    assert [d.split()[0] for d in deps['system']] == ['openssh-client', 'openssh-clients']
