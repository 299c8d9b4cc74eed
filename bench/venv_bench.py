"""Benchmark the venv stage on the lab, with the real CPU torch of the node's wheelhouse.

    python bench/venv_bench.py

(a) The first and the second container's venv build on one node, through site.yml (the torch_venv role):
    the first fills the node's uv cache (emptied beforehand), the second reuses it. Goal: second <= 20% of first.
(b) In one container, the same lock into a fresh venv by `pip install -r` (with and without its .pyc
    compilation, which uv does not do) and by `uv pip install -r` (both --require-hashes, offline from the
    node's wheelhouse; uv with an empty cache and with the node's).
    Goal: uv <= 33% of pip.
(c) In that container, venv_audit's audit (the module's code, fast and full mode) on the torch venv, against
    `python -c "import torch"` there. Goal: fast <= 2x the import.
Each in-container figure is the median of 3. Results print as a table and go to bench/results/venv.json.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, 'tests'))

from conftest import Pve, _api, run_playbook  # noqa: E402
from gpufleet.lab import manager  # noqa: E402
from gpufleet.lab.layout import Lab  # noqa: E402
import figures as figures_file  # noqa: E402

VMIDS = (341, 342)
SITE = os.path.join(ROOT, 'playbooks', 'site.yml')
LOCK = '/opt/gpufleet/profiles/cpu/requirements.lock'
UV = '/opt/gpufleet/uv/0.13.9/bin/uv'
WHEELS = '/opt/gpufleet/wheelhouse'


def entry(vmid):
    return {'vmid': vmid, 'hostname': 'bench-{0}'.format(vmid), 'node': 'pve1', 'gpus': [], 'cores': 2,
            'memory': 2048, 'net': 'name=eth0,bridge=vmbr0,ip=10.77.0.{0}/24,gw=10.77.0.1'.format(vmid % 200 + 2)}


def site(tmp, fleet):
    path = os.path.join(tmp, 'vars-{0}.json'.format(len(fleet)))
    with open(path, 'w') as fh:
        json.dump({'gpufleet_containers': fleet}, fh)
    r = run_playbook(open(SITE).read(), _Tmp(tmp), '-e', '@' + path)
    assert r.rc == 0, r.stdout[-3000:]
    return r


class _Tmp(str):
    """run_playbook wants a pathlib-like tmp_path."""

    def __truediv__(self, name):
        import pathlib
        return pathlib.Path(self) / name

    def glob(self, pattern):
        import pathlib
        return pathlib.Path(self).glob(pattern)


def build_time(result, host):
    (res,) = [t for t in result.tasks(host) if t['task'].endswith('switch to it')]
    assert res['built'], res
    return res['timings']['install_s']


def sh(vmid, cmd):
    out = subprocess.run(['pct', 'exec', str(vmid), '--', 'sh', '-c', cmd], capture_output=True, text=True)
    assert out.returncode == 0, (cmd, out.stdout[-2000:], out.stderr[-2000:])
    return out.stdout


TIMER = ('import subprocess, sys, time\nt = time.monotonic()\n'
         'subprocess.run(sys.argv[1], shell=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n'
         'print(time.monotonic() - t)\n')


def timed_in(vmid, cmd, setup='true', runs=3):
    """Median seconds of cmd in the container (setup runs before each, untimed)."""
    times = []
    for _ in range(runs):
        sh(vmid, setup)
        out = subprocess.run(['pct', 'exec', str(vmid), '--', '/usr/bin/python3', '-c', TIMER, cmd],
                             capture_output=True, text=True)
        assert out.returncode == 0, (cmd, out.stdout[-2000:], out.stderr[-2000:])
        times.append(float(out.stdout.strip()))
    return round(statistics.median(times), 2)


def push_collection(vmid):
    """The collection's module_utils into the container, to time venv_audit's own code there."""
    src = os.path.join(ROOT, 'plugins', 'module_utils')
    for name in ('__init__.py', '_venv.py', '_elf.py'):
        path = os.path.join(src, name)
        if os.path.exists(path):
            sh(vmid, 'mkdir -p /tmp/gp/ansible_collections/gpufleet/proxmox/plugins/module_utils')
            subprocess.run(['pct', 'push', str(vmid), path,
                            '/tmp/gp/ansible_collections/gpufleet/proxmox/plugins/module_utils/' + name], check=True)
    for pkg in ('ansible_collections', 'ansible_collections/gpufleet', 'ansible_collections/gpufleet/proxmox',
                'ansible_collections/gpufleet/proxmox/plugins'):
        sh(vmid, 'touch /tmp/gp/{0}/__init__.py'.format(pkg))


def main():
    lab = Lab()
    manager.up(say=lambda m: None)
    with open(os.path.join(lab.root, 'credentials.json')) as fh:
        creds = json.load(fh)
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.extend(VMIDS)
    pve.cleanup()
    pve.made.extend(VMIDS)
    cache = os.path.join(lab.root, 'node', 'var', 'cache', 'gpufleet', 'uv')
    shutil.rmtree(cache, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix='venv-bench-')
    figures = {}
    try:
        started = time.monotonic()
        first = site(tmp, [entry(VMIDS[0])])
        figures['site_first_container_s'] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        second = site(tmp, [entry(v) for v in VMIDS])
        figures['site_second_container_s'] = round(time.monotonic() - started, 1)
        figures['a_first_build_s'] = build_time(first, 'bench-{0}'.format(VMIDS[0]))
        figures['a_second_build_s'] = build_time(second, 'bench-{0}'.format(VMIDS[1]))
        figures['a_ratio'] = round(figures['a_second_build_s'] / figures['a_first_build_s'], 3)

        ct = VMIDS[1]
        fresh = 'rm -rf /tmp/b /tmp/uvc && /usr/bin/python3 -m venv /tmp/b'
        figures['b_pip_s'] = timed_in(ct, '/tmp/b/bin/pip install -q --disable-pip-version-check --no-deps '
                                          '--require-hashes --no-index --find-links {0} -r {1}'.format(WHEELS, LOCK),
                                      fresh)
        figures['b_pip_no_compile_s'] = timed_in(ct, '/tmp/b/bin/pip install -q --disable-pip-version-check '
                                                     '--no-compile --no-deps --require-hashes --no-index --find-links '
                                                     '{0} -r {1}'.format(WHEELS, LOCK), fresh)
        uv = ('UV_LINK_MODE=copy {0} pip install -q --python /tmp/b/bin/python --no-deps --require-hashes --offline '
              '--no-index --find-links {1} -r {2}'.format(UV, WHEELS, LOCK))
        figures['b_uv_cold_cache_s'] = timed_in(ct, 'UV_CACHE_DIR=/tmp/uvc ' + uv, fresh)
        figures['b_uv_node_cache_s'] = timed_in(ct, 'UV_CACHE_DIR=/var/cache/gpufleet/uv ' + uv, fresh)
        figures['b_ratio_cold'] = round(figures['b_uv_cold_cache_s'] / figures['b_pip_s'], 3)
        figures['b_ratio_node_cache'] = round(figures['b_uv_node_cache_s'] / figures['b_pip_s'], 3)

        push_collection(ct)
        audit = ('cd /tmp/gp && /usr/bin/python3 -c "from ansible_collections.gpufleet.proxmox.plugins.module_utils '
                 'import _venv; r = _venv.audit(\'/root/venv\', \'{0}\', \'{{0}}\'); assert r[\'healthy\'], r"'.format(LOCK))
        figures['c_import_torch_s'] = timed_in(ct, '/root/venv/bin/python -c "import torch"')
        figures['c_audit_fast_s'] = timed_in(ct, audit.format('fast'))
        figures['c_audit_full_s'] = timed_in(ct, audit.format('full'))
        figures['c_ratio_fast'] = round(figures['c_audit_fast_s'] / figures['c_import_torch_s'], 3)
        figures['venv_files'] = int(sh(ct, 'find /root/venv/ -type f | wc -l').strip())
        figures['venv_mb'] = int(sh(ct, 'du -sm /root/venv/ | cut -f1').strip())
    finally:
        pve.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    figures_file.save('venv', figures)


if __name__ == '__main__':
    main()
