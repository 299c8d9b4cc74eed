"""Benchmark the venv stage on the lab.

    python bench/venv_bench.py                  # the cpu profile, offline from the node's wheelhouse
    python bench/venv_bench.py --profile cu130  # the cu130 profile (a real CUDA torch), from PyPI
    ... --link-mode hardlink                    # venvs hard-linked to the node's uv cache (one store a node)

(a) The first and the second container's venv build on one node, through site.yml (the torch_venv role):
    the first fills the node's uv cache (emptied beforehand), the second reuses it. Goal: second <= 20% of first.
    With the cpu profile the first build downloads nothing (the lab's wheelhouse is on the node), so the cache
    saves only unpacking; with cu130 the first build downloads the whole stack (about 3 GB) through the lab's NAT,
    as a node's first container does on a real cluster.
(b) cpu only: in one container, the same lock into a new venv each time (none deleted until all have run) by
    `pip install -r` (with and without its .pyc compilation, which uv does not do) and by `uv pip install -r`
    (both --require-hashes, offline from the node's wheelhouse; uv with an empty cache and with the node's), the
    four in turn, three rounds.
    Goal: uv <= 33% of pip.
(c) In that container, venv_audit's audit (the module's code, fast and full mode) on the torch venv, against
    `python -c "import torch"` there. Goal: fast <= 2x the import. With cu130 the audit's findings on the
    real CUDA stack are recorded too.
(d) cpu only: the bytes a repair downloads with the node's cache warm (goal: 0). The node's wheelhouse is served
    as an index (PEP 503, over HTTP from the node's bridge address, counting the wheels' bytes it sends); in the
    container a venv is installed from the lock through it and the node's cache, torch's largest library is deleted,
    and venv_audit's plan (through the same index) is applied. uv's --reinstall-package would fetch torch again
    (it implies --refresh-package; measured too, as d_reinstall_package_download_bytes); the plan's uninstall and
    install take it from the cache.
    `--repair-only` builds one container and runs (d) alone.
Each in-container figure is the median of 3. Results print as a table and go to bench/results/venv.json
(venv-cu130.json for cu130; venv-repair.json for --repair-only).
"""

import argparse
import glob

import json
import os
import pathlib
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

from gpufleet.lab import manager  # noqa: E402
from gpufleet.lab.layout import Lab  # noqa: E402
import figures as figures_file  # noqa: E402
from gpufleet.lab.testing import ONE_STORE, Index, Pve, api as _api, site  # noqa: E402

VMIDS = (341, 342)
LOCKS = '/opt/gpufleet/profiles/{0}/requirements.lock'
UV = '/opt/gpufleet/uv/0.13.9/bin/uv'
WHEELS = '/opt/gpufleet/wheelhouse'
CA_BUNDLE = os.environ.get('SSL_CERT_FILE') or '/etc/ssl/certs/ca-certificates.crt'
CA_DIR = '/opt/bench-ca'


def entry(vmid, profile):
    ct = {'vmid': vmid, 'hostname': 'bench-{0}'.format(vmid), 'node': 'pve1', 'gpus': [], 'cores': 2,
          'memory': 2048, 'net': 'name=eth0,bridge=vmbr0,ip=10.77.0.{0}/24,gw=10.77.0.1'.format(vmid % 200 + 2),
          'venv_profile': profile}
    if profile != 'cpu':
        ct['nameserver'] = ' '.join(nameservers())  # the machine's own, reached through the lab's NAT
        # The machine's CA bundle, for a network whose gateway inspects TLS (see site_run()).
        ct['mounts'] = {'mp0': '{0},mp={1},ro=1'.format(os.path.dirname(CA_BUNDLE), CA_DIR)}
    return ct


def nameservers():
    with open('/etc/resolv.conf') as fh:
        return [line.split()[1] for line in fh if line.startswith('nameserver ')]


def site_run(tmp, fleet, link_mode, *args):
    online = fleet[0]['venv_profile'] != 'cpu'
    # Any profile but the lab's cpu one installs from its indexes, not the node's wheelhouse alone, with the
    # machine's CA bundle (uv reads SSL_CERT_FILE; the pip that installs uv, PIP_CERT).
    ca = os.path.join(CA_DIR, os.path.basename(CA_BUNDLE))
    extra = {'torch_venv_offline': not online,
             'torch_venv_environment': {'SSL_CERT_FILE': ca, 'PIP_CERT': ca} if online else {}}
    if link_mode == 'hardlink':
        extra.update(ONE_STORE)
    r = site(tmp, fleet, *args, venv=True, **extra)
    assert r.rc == 0, '\n'.join(r.failures()) or r.stdout[-3000:]
    return r


def build_result(result, host):
    """The torch_venv role's venv_build result for host in a site.yml run."""
    (res,) = [t for t in result.tasks(host) if 'switch to it' in t['task']]
    return res


def build_timings(result, host):
    res = build_result(result, host)
    assert res['built'], res
    return res['timings']


def audit_command(lock, mode, overrides=(), healthy=False):
    """The shell command that runs venv_audit's own code (push_collection() puts it there) on /root/venv and
    prints its JSON; with healthy, it fails where the venv is not."""
    return ('cd /tmp/gp && /usr/bin/python3 -c "import json; from ansible_collections.gpufleet.proxmox.plugins.'
            'module_utils import _venv; r = _venv.audit(\'/root/venv\', \'{0}\', \'{1}\', overrides={2}); '
            'print(json.dumps(r)){3}"').format(lock, mode, list(overrides),
                                                "; assert r[\'healthy\'], r" if healthy else '')


def sh(vmid, cmd):
    out = subprocess.run(['pct', 'exec', str(vmid), '--', 'sh', '-c', cmd], capture_output=True, text=True)
    assert out.returncode == 0, (cmd, out.stdout[-2000:], out.stderr[-2000:])
    return out.stdout


TIMER = ('import subprocess, sys, time\nt = time.monotonic()\n'
         'subprocess.run(sys.argv[1], shell=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n'
         'print(time.monotonic() - t)\n')


def timed_in(vmid, cmd, setup='true', runs=3):
    """Median seconds of cmd in the container (setup runs before each, untimed)."""
    return round(statistics.median(once_in(vmid, cmd, setup) for _ in range(runs)), 2)


def once_in(vmid, cmd, setup='true'):
    sh(vmid, setup)
    out = subprocess.run(['pct', 'exec', str(vmid), '--', '/usr/bin/python3', '-c', TIMER, cmd],
                         capture_output=True, text=True)
    assert out.returncode == 0, (cmd, out.stdout[-2000:], out.stderr[-2000:])
    return float(out.stdout.strip())


def interleaved_in(vmid, cmds, rounds=3):
    """{name: median seconds} of each command, each into a new venv ({target}), run in turn round after round.
    Nothing is deleted until all have run: on a file system that delays the reuse of freed inodes (ext4 without a
    journal, as on the lab's machine: docs/venv.md), writing many files right after deleting as many costs
    seconds of kernel time that would be the file system's, not the installer's."""
    times = dict((name, []) for name in cmds)
    for r in range(rounds):
        for i, (name, cmd) in enumerate(cmds.items()):
            target = '/var/tmp/b-{0}-{1}'.format(r, i)
            times[name].append(once_in(vmid, cmd.format(target=target),
                                       '/usr/bin/python3 -m venv {0} && sync'.format(target)))
    return dict((name, round(statistics.median(t), 2)) for name, t in times.items())


def lab_with(vmids):
    """The lab, up, and the PVE API as root, with the containers vmids destroyed and destroyed again by cleanup()."""
    lab = Lab()
    manager.up(say=lambda m: None)
    with open(os.path.join(lab.root, 'credentials.json')) as fh:
        creds = json.load(fh)
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.extend(vmids)
    pve.cleanup()
    pve.made.extend(vmids)
    return lab, pve


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


NODE_CACHE = '/var/cache/gpufleet/uv'
BRIDGE = '10.77.0.1'  # the node on the lab's bridge, as the containers reach it


def repair_download(vmid, wheelhouse, lock):
    """(d): {d_fill_download_bytes, d_repair_download_bytes, d_repair_s, d_plan, d_repaired_healthy}."""
    root = tempfile.mkdtemp(prefix='venv-bench-index-')
    index = Index(wheelhouse, root, host=BRIDGE)
    target = '/var/tmp/repair-venv'
    env = 'UV_CACHE_DIR={0} UV_LINK_MODE=copy UV_NO_PROGRESS=1 '.format(NODE_CACHE)
    out = {}
    try:
        sh(vmid, 'rm -rf {0} && {1} venv -q --python /usr/bin/python3 {0}'.format(target, UV))
        sh(vmid, env + '{0} pip install -q --python {1}/bin/python --no-deps --require-hashes --index-url {2} '
                       '-r {3}'.format(UV, target, index.url, lock))
        out['d_fill_download_bytes'] = index.wheel_bytes
        sh(vmid, 'rm {0}/lib/python3*/site-packages/torch/lib/libtorch_cpu.so'.format(target))
        audit = ('cd /tmp/gp && /usr/bin/python3 -c "import json; from ansible_collections.gpufleet.proxmox.plugins.'
                 'module_utils import _venv; print(json.dumps(_venv.audit(\'{0}\', \'{1}\', uv=\'{2}\', '
                 'install_args=[\'--index-url\', \'{3}\'])))"').format(target, lock, UV, index.url)
        report = json.loads(sh(vmid, audit))
        out['d_plan'] = report['plan']
        before, fetched = index.wheel_bytes, len(index.wheels)
        started = time.monotonic()
        for argv in report['plan']:
            sh(vmid, env + ' '.join(shlex.quote(a) for a in argv))
        out['d_repair_s'] = round(time.monotonic() - started, 2)
        out['d_repair_download_bytes'] = index.wheel_bytes - before
        out['d_repair_downloaded'] = index.wheels[fetched:]
        out['d_repaired_healthy'] = json.loads(sh(vmid, audit))['healthy']
        # The same repair as plans made it before: uv's --reinstall-package (it implies --refresh-package).
        sh(vmid, 'rm {0}/lib/python3*/site-packages/torch/lib/libtorch_cpu.so'.format(target))
        before = index.wheel_bytes
        sh(vmid, env + '{0} pip install --python {1}/bin/python --no-deps --reinstall-package torch {2} '
                       '--index-url {3}'.format(UV, target, shlex.quote(report['plan'][-1][6]), index.url))
        out['d_reinstall_package_download_bytes'] = index.wheel_bytes - before
    finally:
        index.stop()
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(['pct', 'exec', str(vmid), '--', 'rm', '-rf', target], capture_output=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--profile', default='cpu', choices=('cpu', 'cu130'))
    parser.add_argument('--link-mode', default='copy', choices=('copy', 'hardlink'))
    parser.add_argument('--repair-only', action='store_true', help='one container, and (d) alone (cpu profile)')
    args = parser.parse_args()
    profile, link_mode = args.profile, args.link_mode
    lock = LOCKS.format(profile)
    if args.repair_only:
        lab, pve = lab_with(VMIDS[:1])
        tmp = pathlib.Path(tempfile.mkdtemp(prefix='venv-bench-'))
        try:
            site_run(tmp, [entry(VMIDS[0], 'cpu')], 'copy')
            push_collection(VMIDS[0])
            figures = repair_download(VMIDS[0], lab.wheelhouse, LOCKS.format('cpu'))
        finally:
            pve.cleanup()
            shutil.rmtree(tmp, ignore_errors=True)
        figures_file.save('venv-repair', figures)
        return
    lab, pve = lab_with(VMIDS)
    cache = os.path.join(lab.root, 'node', 'var', 'cache', 'gpufleet', 'uv')
    store = os.path.join(lab.root, 'node', 'var', 'lib', 'gpufleet', 'store')
    if link_mode == 'hardlink':
        cache = os.path.join(store, 'uv')
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(store, ignore_errors=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix='venv-bench-'))
    figures = {'profile': profile, 'link_mode': link_mode}
    try:
        started = time.monotonic()
        first = site_run(tmp, [entry(VMIDS[0], profile)], link_mode)
        figures['site_first_container_s'] = round(time.monotonic() - started, 1)
        figures['a_node_cache_mb'] = int(subprocess.run(['du', '-sm', cache], capture_output=True, text=True,
                                                        check=True).stdout.split()[0])
        started = time.monotonic()
        second = site_run(tmp, [entry(v, profile) for v in VMIDS], link_mode)
        figures['site_second_container_s'] = round(time.monotonic() - started, 1)
        figures['a_node_disk_mb'] = int(subprocess.run(['du', '-smc', cache] + glob.glob(os.path.join(
            lab.root, 'lxc', '*')) + [store], capture_output=True, text=True).stdout.split()[-2])
        figures['a_first_timings'] = build_timings(first, 'bench-{0}'.format(VMIDS[0]))
        figures['a_second_timings'] = build_timings(second, 'bench-{0}'.format(VMIDS[1]))
        # The install is what the node's cache is for; the audit and the import check cost the same either way.
        figures['a_first_build_s'] = figures['a_first_timings']['install_s']
        figures['a_second_build_s'] = figures['a_second_timings']['install_s']
        figures['a_ratio'] = round(figures['a_second_build_s'] / figures['a_first_build_s'], 3)

        ct = VMIDS[1]
        if profile == 'cpu' and link_mode == 'copy':  # (b) is the same whatever the layout
            pip = ('{{target}}/bin/pip install -q --disable-pip-version-check --no-deps --require-hashes --no-index '
                   '--find-links {0} -r {1}'.format(WHEELS, lock))
            uv = ('UV_LINK_MODE=copy {0} pip install -q --python {{target}}/bin/python --no-deps --require-hashes '
                  '--offline --no-index --find-links {1} -r {2}'.format(UV, WHEELS, lock))
            figures.update(('b_{0}_s'.format(name), s) for name, s in interleaved_in(ct, {
                'pip': pip, 'pip_no_compile': pip.replace(' install ', ' install --no-compile '),
                'uv_cold_cache': 'UV_CACHE_DIR={target}.uvc ' + uv,
                'uv_node_cache': 'UV_CACHE_DIR=/var/cache/gpufleet/uv ' + uv}).items())
            figures['b_ratio_cold'] = round(figures['b_uv_cold_cache_s'] / figures['b_pip_s'], 3)
            figures['b_ratio_node_cache'] = round(figures['b_uv_node_cache_s'] / figures['b_pip_s'], 3)
            sh(ct, 'rm -rf /var/tmp/b-*')

        push_collection(ct)
        if profile == 'cpu' and link_mode == 'copy':
            figures.update(repair_download(ct, lab.wheelhouse, lock))
        figures['c_import_torch_s'] = timed_in(ct, '/root/venv/bin/python -c "import torch"')
        figures['c_audit_fast_s'] = timed_in(ct, audit_command(lock, 'fast', healthy=True))
        figures['c_audit_full_s'] = timed_in(ct, audit_command(lock, 'full', healthy=True))
        figures['c_ratio_fast'] = round(figures['c_audit_fast_s'] / figures['c_import_torch_s'], 3)
        report = json.loads(sh(ct, audit_command(lock, 'full', healthy=True)))
        figures['c_audit_healthy'] = report['healthy']
        figures['c_audit_findings'] = {kind: len(items) if isinstance(items, list) else sum(map(len, items.values()))
                                       for kind, items in report['findings'].items()}
        figures['c_distributions'] = report['distributions']
        figures['c_optional_libraries'] = {o['soname']: o['needed_by'] for o in report['optional_libraries']}
        figures['c_torch'] = sh(ct, '/root/venv/bin/python -c "import torch; '
                                    'print(torch.__version__, torch.version.cuda, torch.cuda.is_available())"').strip()
        figures['venv_files'] = int(sh(ct, 'find /root/venv/ -type f | wc -l').strip())
        figures['venv_mb'] = int(sh(ct, 'du -sm /root/venv/ | cut -f1').strip())
    finally:
        pve.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
    figures_file.save('-'.join(['venv'] + ([profile] if profile != 'cpu' else []) +
                               ([link_mode] if link_mode != 'copy' else [])), figures)


if __name__ == '__main__':
    main()
