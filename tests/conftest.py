"""Shared fixtures: the lab, brought up once per session, and API helpers."""

import json
import os
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE_VOLID = 'local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst'
# site.yml's variables for one store per lab node (docs/venv.md): one bind mount holds the uv cache and the venvs,
# so uv can hard-link one into the other.
ONE_STORE = {
    'gpu_node_shares': [{'path': '{{ gpufleet_lab_dir }}/node/var/lib/gpufleet/store', 'mp': '/var/lib/gpufleet/store'},
                        {'path': '{{ gpufleet_lab_dir }}/wheelhouse', 'mp': '/opt/gpufleet/wheelhouse',
                         'read_only': True}],
    'torch_venv_uv_cache': '/var/lib/gpufleet/store/uv',
    'torch_venv_root': '/var/lib/gpufleet/store/venvs/{{ inventory_hostname }}',
    'torch_venv_link_mode': 'hardlink',
}


@pytest.fixture(scope='session')
def lab():
    """The lab node, up (bringing it up is idempotent).  The lab is required: if it cannot run
    here, the tests fail with the lab's own explanation rather than skip."""
    from gpufleet.lab import manager
    from gpufleet.lab.layout import Lab
    lab = Lab()
    manager.up(lab, say=lambda msg: print(msg))
    return lab


@pytest.fixture(scope='session')
def creds(lab):
    return lab.credentials()


@pytest.fixture(scope='session')
def control(lab):
    from gpufleet.lab.control import Control
    return Control(lab)


class Pve:
    """A thin proxmoxer wrapper for tests: wait on tasks, create and clean up containers."""

    def __init__(self, api, node):
        self.api = api
        self.node = node
        self.made = []

    @property
    def n(self):
        return self.api.nodes(self.node)

    def wait(self, upid, timeout=60):
        end = time.monotonic() + timeout
        while True:
            st = self.n.tasks(upid).status.get()
            if st['status'] == 'stopped':
                return st, [line['t'] for line in self.n.tasks(upid).log.get(limit=500)]
            assert time.monotonic() < end, 'task {0} still running after {1} s'.format(upid, timeout)
            time.sleep(0.05)

    def ok(self, upid):
        st, log = self.wait(upid)
        assert st['exitstatus'] == 'OK', (st, log)
        return log

    def create(self, vmid, **params):
        params.setdefault('hostname', 'ct{0}'.format(vmid))
        params.setdefault('storage', 'local-lvm')
        params.setdefault('net0', 'name=eth0,bridge=vmbr0,ip=10.77.0.{0}/24,gw=10.77.0.1'.format(vmid % 200 + 2))
        self.made.append(vmid)
        return self.ok(self.n.lxc.post(vmid=vmid, ostemplate=TEMPLATE_VOLID, **params))

    def ct(self, vmid):
        return self.n.lxc(vmid)

    def start(self, vmid):
        return self.ok(self.ct(vmid).status.start.post())

    def stop(self, vmid):
        return self.ok(self.ct(vmid).status.stop.post())

    def status(self, vmid):
        return self.ct(vmid).status.current.get()['status']

    def cleanup(self):
        for vmid in self.made:
            try:
                if self.status(vmid) == 'running':
                    self.stop(vmid)
                self.ok(self.ct(vmid).delete())
            except Exception:  # noqa: BLE001 - already gone
                pass


def _api(creds, **auth):
    from proxmoxer import ProxmoxAPI
    return ProxmoxAPI(creds['api_host'], port=creds['api_port'], verify_ssl=creds['ca_path'], timeout=60, **auth)


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


# -- running Ansible for real -----------------------------------------------------------
API_DEFAULTS = {
    'api_host': '{{ gpufleet_api_host }}', 'api_port': '{{ gpufleet_api_port }}',
    'api_user': '{{ gpufleet_api_user }}', 'api_password': '{{ gpufleet_api_password }}',
    'ca_path': '{{ gpufleet_api_ca_path }}',
}
TOKEN_DEFAULTS = {
    'api_host': '{{ gpufleet_api_host }}', 'api_port': '{{ gpufleet_api_port }}',
    'api_user': '{{ gpufleet_api_user }}', 'api_token_id': '{{ gpufleet_api_token_id }}',
    'api_token_secret': '{{ gpufleet_api_token_secret }}', 'ca_path': '{{ gpufleet_api_ca_path }}',
}


class PlayResult:
    def __init__(self, proc, data):
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.data = data

    def task(self, index, host='localhost'):
        """The result of the index-th task for host (a dict as the module returned it)."""
        return self.data['plays'][-1]['tasks'][index]['hosts'][host]

    def tasks(self, host):
        """Every task result of host in the run, in order, each with its task's name under 'task'."""
        return [dict(t['hosts'][host], task=t['name']) for p in self.data['plays'] for t in p['tasks']
                if host in t['hosts']]

    @property
    def stats(self):
        return self.data['stats']

    def failures(self):
        """'task on host: msg' for every failed task of the run."""
        return ['{0} on {1}: {2}'.format(t['name'], host, res.get('msg')) for p in self.data['plays']
                for t in p['tasks'] for host, res in t['hosts'].items() if res.get('failed')]


def run_playbook(playbook, tmp_path, *args, inventory=None, env=None):
    import yaml
    path = tmp_path / 'play-{0}.yml'.format(len(list(tmp_path.glob('play-*.yml'))))
    if not isinstance(playbook, str):
        playbook = yaml.safe_dump(playbook, sort_keys=False)
    path.write_text(playbook)
    bin_dir = os.path.dirname(__import__('sys').executable)
    full_env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_STDOUT_CALLBACK='results_json',
                    ANSIBLE_CALLBACK_PLUGINS=os.path.join(ROOT, 'tests', 'plugins', 'callback'), PATH=bin_dir + ':' + os.environ.get('PATH', ''),
                    ANSIBLE_NOCOLOR='1', GPUFLEET_REPORT_DIR=str(tmp_path / 'reports'))
    full_env.update(env or {})
    argv = [os.path.join(bin_dir, 'ansible-playbook'), '-i', inventory or os.path.join(ROOT, 'inventories', 'lab'),
            str(path)] + list(args)
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=full_env,
                          timeout=900)
    try:
        data = json.loads(proc.stdout[proc.stdout.index('{'):])
    except ValueError:
        raise AssertionError('ansible-playbook printed no JSON (rc {0}):\n{1}\n{2}'.format(
            proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))
    return PlayResult(proc, data)


SITE = os.path.join(ROOT, 'playbooks', 'site.yml')


def site(tmp_path, fleet, *args, venv=False, **extra):
    """site.yml on this fleet (gpufleet_containers) with extra vars; the venv and verify stages only with venv=True
    (their own tests cover them)."""
    extra['gpufleet_containers'] = fleet
    if not venv:
        args = ('--skip-tags', 'venv,verify') + args
    path = tmp_path / 'vars-{0}.json'.format(len(list(tmp_path.glob('vars-*.json'))))
    path.write_text(json.dumps(extra))
    return run_playbook(open(SITE).read(), tmp_path, '-e', '@' + str(path), *args)


@pytest.fixture
def play(lab, tmp_path):
    """play(tasks, *ansible_args, token=False): run tasks on localhost with the lab's API logins."""
    def run(tasks, *args, token=False, hosts='localhost'):
        playbook = [{'name': 'test', 'hosts': hosts, 'gather_facts': False,
                     'module_defaults': {'group/gpufleet.proxmox.pve': TOKEN_DEFAULTS if token else API_DEFAULTS},
                     'tasks': tasks}]
        return run_playbook(playbook, tmp_path, *args)
    return run
