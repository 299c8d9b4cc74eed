"""Shared fixtures: the lab, brought up once per session, and API helpers."""

import os
import stat
import subprocess

import pytest

# the helpers live in the package, where the benchmarks use them too; the tests import them from here
from gpufleet.lab.testing import (  # noqa: F401
    API_DEFAULTS, ONE_STORE, ROOT, SITE, TEMPLATE_VOLID, TOKEN_DEFAULTS, PlayResult, Pve, api as _api, doc_block,
    metric_values, run_playbook, site)


def gpu_node(index):
    """The device node of the lab's GPU at nvidia-smi index `index`: its driver's minor, which is not the index."""
    from gpufleet.lab.host.gpus import device_minor
    from gpufleet.lab.layout import Lab
    return '/dev/nvidia{0}'.format(device_minor(index, Lab().gpus))


@pytest.fixture(scope='session')
def lab():
    """The lab node, up (bringing it up is idempotent).  The lab is required: if it cannot run
    here, the tests fail with the lab's own explanation rather than skip."""
    from gpufleet.lab import manager
    from gpufleet.lab.layout import Lab
    from gpufleet.lab.containers import Containers
    lab = Lab()
    # the suite starts from an empty node: a container left by an interrupted run (a molecule scenario's, a test's)
    # carries the fleet's tag and would be every drift check's orphan. A reset ends with the lab up.
    left = Containers(lab).all()
    if left:
        print('the lab holds containers from before this run ({0}): reset to an empty node'.format(
            ', '.join(map(str, left))))
        manager.reset(lab, say=lambda msg: print(msg))
    else:
        manager.up(lab, say=lambda msg: print(msg))
    before = cached(lab.cache)
    yield lab
    after = cached(lab.cache)
    changed = sorted(p for p in before if after.get(p) != before[p])
    assert not changed, 'a test changed or removed {0} file(s) of the lab\'s cache, which every lab (and the next ' \
        'run) shares: {1}'.format(len(changed), ', '.join(changed[:5]))


def cached(cache):
    """{path: (size, mtime, type)} of each file of the lab's cache that the lab only reads once it has it: the Debian
    bases its containers' overlays stand on and the downloaded wheels. (The lab may add to its cache during a run;
    its compiler cache changes as it builds.)"""
    out = {}
    for name in sorted(os.listdir(cache)) if os.path.isdir(cache) else ():
        if name.startswith('base') or name == 'wheels':
            for where, _dirs, files in os.walk(os.path.join(cache, name)):
                for f in files:
                    st = os.lstat(os.path.join(where, f))
                    out[os.path.join(where, f)] = (st.st_size, st.st_mtime_ns, stat.S_IFMT(st.st_mode))
    return out


@pytest.fixture(scope='session')
def creds(lab):
    return lab.credentials()


@pytest.fixture(scope='session')
def control(lab):
    from gpufleet.lab.control import Control
    return Control(lab)


@pytest.fixture
def pve(creds):
    """root@pam with its password (what device passthrough needs)."""
    p = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    yield p
    p.cleanup()


@pytest.fixture
def pve_token(creds):
    """The lab's API token (root@pam!gpufleet): administrator rights, but not root@pam itself."""
    return Pve(_api(creds, user=creds['api_user'], token_name=creds['api_token_id'],
                    token_value=creds['api_token_secret']), creds['node'])


@pytest.fixture(scope='session')
def node_ssh(creds):
    """Run a command on the lab node over its real sshd, as Ansible would reach it."""
    def run(command, **kwargs):
        argv = ['ssh', '-i', creds['ssh_private_key_file'], '-o', 'UserKnownHostsFile=' + creds['ssh_known_hosts_file'],
                '-o', 'StrictHostKeyChecking=yes', '-o', 'BatchMode=yes', '-p', str(creds['ssh_port']),
                '{0}@{1}'.format(creds['ssh_user'], creds['ssh_host']), command]
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120, **kwargs)
    return run


def pytest_collection_modifyitems(items):
    """Tests marked `last` (taking the lab down and up again) run after all others."""
    items.sort(key=lambda item: item.get_closest_marker('last') is not None)


@pytest.fixture
def play(lab, tmp_path):
    """play(tasks, *ansible_args, token=False): run tasks on localhost with the lab's API logins."""
    def run(tasks, *args, token=False, hosts='localhost'):
        playbook = [{'name': 'test', 'hosts': hosts, 'gather_facts': False,
                     'module_defaults': {'group/gpufleet.proxmox.pve': TOKEN_DEFAULTS if token else API_DEFAULTS},
                     'tasks': tasks}]
        return run_playbook(playbook, tmp_path, *args)
    return run
