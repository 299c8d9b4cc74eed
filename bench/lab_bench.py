"""Benchmark the lab: `up` (cold, warm after `down`, and already up) and a container cycle.

    python bench/lab_bench.py [--cycles N] [--cold]

A cycle is create -> start -> `pct exec` over SSH -> stop -> destroy, through the PVE API as
the collection drives it.  --cold also clears the lab's cache (Debian base, wheels) first: that
takes minutes and downloads again.  Results print as a table and go to bench/results/lab.json.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from proxmoxer import ProxmoxAPI

from gpufleet.lab import manager
from gpufleet.lab.layout import Lab, TEMPLATE
from gpufleet.lab.testing import wait_task

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(fn):
    started = time.monotonic()
    fn()
    return time.monotonic() - started


def wait(node, upid):
    st = wait_task(node, upid, poll=0.02, log=False)[0]
    assert st['exitstatus'] == 'OK', st


def cycle(lab, creds, vmid):
    api = ProxmoxAPI(creds['api_host'], port=creds['api_port'], user='root@pam', password=creds['api_password'],
                     verify_ssl=creds['ca_path'])
    node = api.nodes(creds['node'])
    ssh = ['ssh', '-i', creds['ssh_private_key_file'], '-o', 'UserKnownHostsFile=' + creds['ssh_known_hosts_file'],
           '-o', 'BatchMode=yes', '-p', str(creds['ssh_port']), 'root@127.0.0.1']
    steps = {}
    t = time.monotonic()
    wait(node, node.lxc.post(vmid=vmid, ostemplate='local:vztmpl/' + TEMPLATE, storage='local-lvm',
                             hostname='bench{0}'.format(vmid), dev0='/dev/nvidia0',
                             net0='name=eth0,bridge=vmbr0,ip=10.77.0.250/24,gw=10.77.0.1'))
    steps['create'] = time.monotonic() - t
    t = time.monotonic()
    wait(node, node.lxc(vmid).status.start.post())
    steps['start'] = time.monotonic() - t
    t = time.monotonic()
    out = subprocess.run(ssh + ['pct exec {0} -- hostname'.format(vmid)], capture_output=True, text=True)
    assert out.stdout.strip() == 'bench{0}'.format(vmid), out
    steps['exec'] = time.monotonic() - t
    t = time.monotonic()
    wait(node, node.lxc(vmid).status.stop.post())
    wait(node, node.lxc(vmid).delete())
    steps['stop+destroy'] = time.monotonic() - t
    steps['total'] = sum(steps.values())
    return steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--cycles', type=int, default=10)
    parser.add_argument('--cold', action='store_true')
    args = parser.parse_args()
    lab = Lab()
    quiet = lambda msg: None  # noqa: E731
    results = {'machine': {'cpus': os.cpu_count(), 'kernel': os.uname().release}}
    if args.cold:
        manager.down(lab, say=quiet)
        shutil.rmtree(lab.cache, ignore_errors=True)
        results['up_cold_s'] = timed(lambda: manager.up(lab, say=quiet))
    manager.up(lab, say=quiet)
    manager.down(lab, say=quiet)
    results['up_after_down_warm_cache_s'] = timed(lambda: manager.up(lab, say=quiet))
    results['up_already_up_s'] = timed(lambda: manager.up(lab, say=quiet))
    creds = lab.credentials()
    cycles = [cycle(lab, creds, 990) for _ in range(args.cycles)]
    results['cycle'] = {step: {'median_s': statistics.median(c[step] for c in cycles),
                               'max_s': max(c[step] for c in cycles)} for step in cycles[0]}
    results['cycles'] = args.cycles
    os.makedirs(os.path.join(HERE, 'results'), exist_ok=True)
    with open(os.path.join(HERE, 'results', 'lab.json'), 'w') as fh:
        json.dump(results, fh, indent=2)
    print('lab benchmark ({0} CPUs)'.format(os.cpu_count()))
    if 'up_cold_s' in results:
        print('  up, cold (debootstrap + wheels)     {0:8.2f} s'.format(results['up_cold_s']))
    print('  up after down, cache warm           {0:8.2f} s   goal < 10 s'.format(results['up_after_down_warm_cache_s']))
    print('  up, already up                      {0:8.2f} s'.format(results['up_already_up_s']))
    print('  container cycle ({0} runs)            median      max'.format(args.cycles))
    for step, fig in results['cycle'].items():
        print('    {0:<30} {1:8.3f} s {2:8.3f} s'.format(step, fig['median_s'], fig['max_s']))
    print('  goal: cycle < 5 s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
