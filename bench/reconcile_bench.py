"""No-op reconcile of N lab containers: gpufleet.proxmox.lxc_container beside community.proxmox.

    python bench/reconcile_bench.py [--count 50] [--community-venv bench/.venv-community]

Creates N stopped containers on the lab (vmids 5000+), then times `ansible-playbook` bringing them to
the config they already have, and counts the API requests each made (from the lab's request log):

- gpufleet fleet: one lxc_container task with `containers:` (how the gpu_container role calls it);
- gpufleet loop: one lxc_container task per container (a loop);
- community.proxmox: the `proxmox` module in a loop with `update: true`, from PyPI's `ansible` package
  installed in a separate venv (make it with: python3 -m venv bench/.venv-community &&
  bench/.venv-community/bin/pip install ansible==12.3.0 proxmoxer requests).

Figures print as a table and go to bench/results/reconcile.json.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import yaml
from proxmoxer import ProxmoxAPI

from gpufleet.lab.control import Control
from gpufleet.lab.layout import TEMPLATE, Lab
from gpufleet.lab.testing import wait_task

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BASE = 5000


def fleet(count):
    return [{'vmid': BASE + i, 'hostname': 'bench{0}'.format(i), 'cores': 1, 'memory': 512} for i in range(count)]


def ensure_containers(creds, count):
    api = ProxmoxAPI(creds['api_host'], port=creds['api_port'], user='root@pam', password=creds['api_password'],
                     verify_ssl=creds['ca_path'])
    node = api.nodes(creds['node'])
    have = {g['vmid'] for g in api.cluster.resources.get(type='vm')}
    for c in fleet(count):
        if c['vmid'] not in have:
            upid = node.lxc.post(vmid=c['vmid'], hostname=c['hostname'], cores=1, memory=512,
                                 ostemplate='local:vztmpl/' + TEMPLATE, storage='local-lvm')
            wait_task(node, upid, poll=0.02, log=False)
    return api


def remove_containers(api, creds, count):
    node = api.nodes(creds['node'])
    for c in fleet(count):
        try:
            upid = node.lxc(c['vmid']).delete()
            wait_task(node, upid, poll=0.02, log=False)
        except Exception:  # noqa: BLE001 - already gone
            pass


def play(tasks, creds):
    api = {'api_host': creds['api_host'], 'api_port': creds['api_port'], 'api_user': 'root@pam',
           'api_password': creds['api_password']}
    return [{'name': 'bench', 'hosts': 'localhost', 'gather_facts': False, 'vars': {'api': api},
             'environment': {'REQUESTS_CA_BUNDLE': creds['ca_path']}, 'tasks': tasks}]


def run(playbook, ansible_playbook, control):
    with tempfile.NamedTemporaryFile('w', suffix='.yml', delete=False) as fh:
        yaml.safe_dump(playbook, fh, sort_keys=False)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               PATH=os.path.dirname(ansible_playbook) + ':' + os.environ['PATH'])
    control.clear_requests()
    started = time.monotonic()
    python = os.path.join(os.path.dirname(ansible_playbook), 'python')
    proc = subprocess.run([ansible_playbook, '-i', 'localhost,', '-c', 'local', '-e',
                           'ansible_python_interpreter=' + python, fh.name], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - started
    os.unlink(fh.name)
    if proc.returncode != 0:
        raise SystemExit('playbook failed:\n' + proc.stdout[-3000:])
    recap = [line for line in proc.stdout.splitlines() if line.startswith('localhost')][-1]
    requests = control.requests()
    mutating = [r for r in requests if r[0] != 'GET' and not r[1].endswith('/access/ticket')]
    return {'wall_s': round(wall, 2), 'requests': len(requests), 'mutating_requests': len(mutating),
            'recap': ' '.join(recap.split()[2:5])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--count', type=int, default=50)
    parser.add_argument('--community-venv', default=os.path.join(HERE, '.venv-community'))
    parser.add_argument('--keep', action='store_true', help='leave the containers on the lab')
    args = parser.parse_args()
    lab = Lab()
    creds = lab.credentials()
    control = Control(lab)
    api = ensure_containers(creds, args.count)
    ours = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
    common = dict(api_host='{{ api.api_host }}', api_port='{{ api.api_port }}', api_user='{{ api.api_user }}',
                  api_password='{{ api.api_password }}')
    results = {'containers': args.count}
    fleet_task = {'gpufleet.proxmox.lxc_container': dict(common, node=creds['node'], ca_path=creds['ca_path'],
                                                         containers=fleet(args.count))}
    results['gpufleet_fleet'] = run(play([fleet_task], creds), ours, control)
    loop_task = {'gpufleet.proxmox.lxc_container': dict(common, node=creds['node'], ca_path=creds['ca_path'],
                                                        vmid='{{ item.vmid }}', hostname='{{ item.hostname }}',
                                                        cores='{{ item.cores }}', memory='{{ item.memory }}'),
                 'loop': fleet(args.count)}
    results['gpufleet_loop'] = run(play([loop_task], creds), ours, control)
    theirs = os.path.join(args.community_venv, 'bin', 'ansible-playbook')
    if os.path.exists(theirs):
        cp_task = {'community.proxmox.proxmox': dict(common, node=creds['node'], validate_certs=True,
                                                     vmid='{{ item.vmid }}', hostname='{{ item.hostname }}',
                                                     cores='{{ item.cores }}', memory='{{ item.memory }}',
                                                     ostemplate='local:vztmpl/' + TEMPLATE, update=True,
                                                     state='present'),
                   'loop': fleet(args.count)}
        results['community_proxmox'] = run(play([cp_task], creds), theirs, control)
        version = subprocess.run([os.path.join(args.community_venv, 'bin', 'ansible-galaxy'), 'collection', 'list',
                                  'community.proxmox'], capture_output=True, text=True).stdout
        results['community_proxmox']['version'] = ' '.join(
            line.split()[1] for line in version.splitlines() if line.startswith('community.proxmox'))
    if not args.keep:
        remove_containers(api, creds, args.count)
    os.makedirs(os.path.join(HERE, 'results'), exist_ok=True)
    with open(os.path.join(HERE, 'results', 'reconcile.json'), 'w') as fh:
        json.dump(results, fh, indent=2)
    n = args.count
    print('no-op reconcile of {0} containers on the lab API'.format(n))
    print('  {0:<34} {1:>8} {2:>14} {3:>9}  {4}'.format('', 'wall s', 'requests/CT', 'mutating', 'recap'))
    for key, label in (('gpufleet_fleet', 'gpufleet lxc_container, fleet'), ('gpufleet_loop', 'gpufleet lxc_container, loop'),
                       ('community_proxmox', 'community.proxmox proxmox, loop')):
        if key in results:
            r = results[key]
            print('  {0:<34} {1:>8.2f} {2:>14.2f} {3:>9}  {4}'.format(label, r['wall_s'], r['requests'] / n,
                                                                    r['mutating_requests'], r['recap']))
    if 'community_proxmox' in results:
        print('  fleet wall time = {0:.1%} of community.proxmox\'s (goal <= 20%)'.format(
            results['gpufleet_fleet']['wall_s'] / results['community_proxmox']['wall_s']))
    return 0


if __name__ == '__main__':
    sys.exit(main())
