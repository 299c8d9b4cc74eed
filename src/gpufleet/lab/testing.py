"""What the tests and the benchmarks share to work with the lab: a proxmoxer client with helpers for
containers and tasks, ansible-playbook run from this checkout with its results as data, and a local package index
that counts what it serves. For this checkout only (ROOT is the checkout the package is installed from)."""

import functools
import hashlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
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


def wait_task(node, upid, timeout=60, poll=0.05, log=True):
    """(status, log lines) of a PVE task once it stopped (log None with log=False); node is proxmoxer's
    api.nodes(name). The one task wait of the tests and the benchmarks (the collection's is module_utils/_pve's)."""
    end = time.monotonic() + timeout
    while True:
        st = node.tasks(upid).status.get()
        if st['status'] == 'stopped':
            return st, [line['t'] for line in node.tasks(upid).log.get(limit=500)] if log else None
        assert time.monotonic() < end, 'task {0} still running after {1} s'.format(upid, timeout)
        time.sleep(poll)


def doc_block(section, lang, having=''):
    """The first ```lang block (holding having) of docs/operators.md under the heading that starts with section: the
    tests run the guide's own commands."""
    with open(os.path.join(ROOT, 'docs', 'operators.md')) as fh:
        text = fh.read()
    part = text[text.index('\n## ' + section):]
    while True:
        start = part.index('```' + lang + '\n') + len(lang) + 4
        block, part = part[start:part.index('```', start)], part[part.index('```', start) + 3:]
        if having in block:
            return block


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
        """A task is asked after on the node that runs it (UPID:<node>:...)."""
        return wait_task(self.api.nodes(upid.split(':')[1]), upid, timeout)

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
        """Every container this test made, wherever it is in the cluster now (and made is empty again)."""
        made, self.made[:] = list(self.made), []
        if not made:
            return
        try:
            where = dict((r['vmid'], r['node']) for r in self.api.cluster.resources.get(type='vm'))
        except Exception:  # noqa: BLE001 - the API forgot this session (a lab reset): nothing of it is left
            return
        for vmid in made:
            try:
                ct = self.api.nodes(where.get(vmid, self.node)).lxc(vmid)
                if ct.status.current.get()['status'] == 'running':
                    self.wait(ct.status.stop.post())
                self.ok(ct.delete())
            except Exception:  # noqa: BLE001 - already gone
                pass


def api(creds, **auth):
    from proxmoxer import ProxmoxAPI
    return ProxmoxAPI(creds['api_host'], port=creds['api_port'], verify_ssl=creds['ca_path'], timeout=60, **auth)


# -- running Ansible for real ---------------------------------------------------------------
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
    bin_dir = os.path.dirname(sys.executable)
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


def sha256(path):
    h = hashlib.sha256()
    with open(path, 'rb') as fh:
        for block in iter(lambda: fh.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


class Index:
    """A PEP 503 index of the wheels in a directory (linked from root), served over HTTP from this process, that counts
    the bytes of the wheels it sends (wheel_bytes). stop() makes it unreachable. Its pages are dated a year back, so
    that an installer may keep the ones it fetched as fresh (as it keeps PyPI's for their max-age)."""

    def __init__(self, wheels_dir, root, host='127.0.0.1'):
        old = os.path.getmtime(wheels_dir) - 365 * 86400
        by_name = {}
        for name in sorted(os.listdir(wheels_dir)):
            if name.endswith('.whl'):
                by_name.setdefault(re.sub(r'[-_.]+', '-', name.split('-')[0]).lower(), []).append(name)
        for project, names in by_name.items():
            d = os.path.join(root, 'simple', project)
            os.makedirs(d, exist_ok=True)
            links = []
            for name in names:
                os.symlink(os.path.abspath(os.path.join(wheels_dir, name)), os.path.join(d, name))
                links.append('<a href="{0}#sha256={1}">{0}</a><br>'.format(name, sha256(os.path.join(d, name))))
            with open(os.path.join(d, 'index.html'), 'w') as fh:
                fh.write('<!DOCTYPE html><html><body>{0}</body></html>\n'.format(''.join(links)))
            os.utime(os.path.join(d, 'index.html'), (old, old))
        self.wheel_bytes = 0
        self.wheels = []
        index = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def copyfile(self, source, outputfile):
                wheel = self.path.split('?')[0].endswith('.whl')
                if wheel:
                    index.wheels.append(os.path.basename(self.path))
                for block in iter(lambda: source.read(1 << 16), b''):
                    if wheel:
                        index.wheel_bytes += len(block)
                    outputfile.write(block)

            def log_message(self, *args):
                pass
        self.server = http.server.ThreadingHTTPServer((host, 0), functools.partial(Handler, directory=root))
        self.url = 'http://{0}:{1}/simple'.format(host, self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()


def metric_values(path):
    """{(name, ((label, value), ...)): value} of a Prometheus textfile, read with prometheus_client's own parser
    (which fails on a file the exposition format does not allow)."""
    from prometheus_client.parser import text_string_to_metric_families
    with open(path) as fh:
        text = fh.read()
    return dict(((s.name, tuple(sorted(s.labels.items()))), s.value)
                for family in text_string_to_metric_families(text) for s in family.samples)
