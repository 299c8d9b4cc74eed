"""How the fleet's runs cost as the fleet grows: per container and per node, side by side with Ansible's floor.

    python bench/scale_bench.py [--sizes 1x5,1x20,3x12] [--runs 1]

For each size (nodes x containers per node), on a lab emptied of containers and brought up with that many nodes
(8 GPU stand-ins each), a fleet of that many containers (the lab's CPU profile; the first 8 of each node with a GPU
each) is made with site.yml and timed:
  - ping: `ansible -m ping` over the containers, each through pct on its own node (touching each host once);
  - first_site: site.yml making the fleet (once);
  - site_noop: site.yml again, nothing to change (it imports torch in every container: its verification);
  - drift_check: playbooks/drift.yml --check (a container's last passing verification is reused);
  - torch_floor: `import torch` in every container's venv, through the same connection (the CPU work a no-op
    site cannot avoid; the lab's containers share its cores, a real cluster spreads it over its nodes);
each the median of --runs runs made in rounds. Reported per size: seconds, each over ping, the site's cost above
the torch floor over ping, and where the time goes (the tasks that took most, from the task_times callback);
across sizes: the marginal seconds per container (the slope between one size and the next). The lab is left
with one node and no containers of the benchmark. Results print and go to bench/results/scale.json.

Disk: each container holds its own venv (copy mode, the default), about 1.2 GB with the CPU profile, so 3x20 needs
about 75 GB free; the project's machines have about 60 GB, hence 3x12 by default.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

import figures as figures_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, os.path.join(ROOT, 'src'))

from gpufleet.lab import manager  # noqa: E402
from gpufleet.lab.layout import Lab  # noqa: E402

BASE = 601
FORKS = 10
VENV_PYTHON = '/root/venv/bin/python'


def fleet(nodes, per_node):
    out = []
    for n in range(nodes):
        for i in range(per_node):
            index = n * per_node + i
            out.append({'vmid': BASE + n * 100 + i, 'hostname': 'scale-{0}-{1:02d}'.format(n + 1, i),
                        'node': 'pve{0}'.format(n + 1), 'gpus': [i] if i < 8 else [], 'cores': 1, 'memory': 1024,
                        'net': 'name=eth0,bridge=vmbr0,ip=10.77.0.{0}/24,gw=10.77.0.1'.format(30 + index)})
    return out


def container_inventory(lab, creds, the_fleet, path):
    hosts = {}
    for c in the_fleet:
        node = lab.on(c['node'])
        hosts[c['hostname']] = {
            'ansible_connection': 'gpufleet.proxmox.pct', 'ansible_pct_vmid': c['vmid'],
            'ansible_pct_node': creds['ssh_host'], 'ansible_pct_node_port': node.ssh_port,
            'ansible_pct_private_key_file': creds['ssh_private_key_file'],
            'ansible_pct_ssh_args': '-o UserKnownHostsFile={0} -o StrictHostKeyChecking=yes'.format(
                creds['ssh_known_hosts_file']),
            'ansible_python_interpreter': '/usr/bin/python3'}
    with open(path, 'w') as fh:
        yaml.safe_dump({'all': {'hosts': hosts}}, fh)


class RunFailed(Exception):
    pass


def run(argv, env, times_file=None):
    started = time.monotonic()
    if times_file:
        env = dict(env, GPUFLEET_TASK_TIMES=times_file)
    done = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise RunFailed('{0} failed:\n{1}'.format(' '.join(argv), done.stdout[-4000:]))
    return took


def top_tasks(path, count=8):
    with open(path) as fh:
        tasks = json.load(fh)
    return [{'task': t['task'], 's': round(t['s'], 1), 'hosts': t['hosts']} for t in tasks[:count]]


def measure(lab, nodes, per_node, runs, tmp):
    name = '{0}x{1}'.format(nodes, per_node)
    # the first site makes the whole fleet: the lab starts without containers (any left by a run before, whatever
    # their vmids, are destroyed), then has this size's nodes
    manager.reset(lab, say=lambda msg: None)
    manager.up(lab, say=lambda msg: None, nodes=nodes, gpus=','.join(['8'] * nodes))
    creds = lab.credentials()
    the_fleet = fleet(nodes, per_node)
    work = os.path.join(tmp, name)
    os.makedirs(work)
    extra = os.path.join(work, 'fleet.json')
    with open(extra, 'w') as fh:
        json.dump({'gpufleet_containers': the_fleet}, fh)
    inventory = os.path.join(work, 'containers.yml')
    container_inventory(lab, creds, the_fleet, inventory)
    env = dict(os.environ, PATH=BIN + ':' + os.environ['PATH'], ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'),
               GPUFLEET_REPORT_DIR=os.path.join(work, 'reports'), ANSIBLE_FORKS=str(FORKS),
               ANSIBLE_CALLBACK_PLUGINS=os.path.join(HERE, 'callback_plugins'),
               # this replaces ansible.cfg's list, so it names the collection's callback that the checkout enables too
               ANSIBLE_CALLBACKS_ENABLED='task_times,gpufleet.proxmox.prefork')
    playbook = [os.path.join(BIN, 'ansible-playbook'), '-i', os.path.join(ROOT, 'inventories', 'lab'), '-e', '@' + extra]
    adhoc = [os.path.join(BIN, 'ansible'), '-i', inventory, 'all']
    out = {'nodes': nodes, 'containers': nodes * per_node}
    try:
        out['first_site_s'] = round(run(playbook + ['site.yml'], env, os.path.join(work, 'first_site.json')), 1)
        out['first_site_tasks'] = top_tasks(os.path.join(work, 'first_site.json'))
        series = {'ping': adhoc + ['-m', 'ansible.builtin.ping'],
                  'site_noop': playbook + ['site.yml'],
                  'drift_check': playbook + ['playbooks/drift.yml', '--check', '--diff'],
                  'torch_floor': adhoc + ['-m', 'ansible.builtin.command', '-a',
                                          '{0} -c "import torch"'.format(VENV_PYTHON)]}
        times = dict((key, []) for key in series)
        for _ in range(runs):  # in rounds, so that a machine slower for a while weighs on every series alike
            for key, argv in series.items():
                times[key].append(run(argv, env, os.path.join(work, key + '.json')))
        for key in series:
            out[key + '_s'] = round(statistics.median(times[key]), 2)
            if runs > 1:
                out[key + '_runs_s'] = [round(t, 2) for t in times[key]]
        for key in ('first_site', 'site_noop', 'drift_check', 'torch_floor'):
            out[key + '_over_ping'] = round(out[key + '_s'] / out['ping_s'], 2)
        # the site's cost above the floor it cannot avoid (torch imported everywhere), against ping
        out['site_noop_above_floor_over_ping'] = round((out['site_noop_s'] - out['torch_floor_s']) / out['ping_s'], 2)
        for key in ('site_noop', 'drift_check'):
            out[key + '_tasks'] = top_tasks(os.path.join(work, key + '.json'))
    finally:
        confirm = ','.join(str(c['vmid']) for c in the_fleet)
        subprocess.run(playbook + ['playbooks/teardown.yml', '-e', 'gpufleet_teardown_confirm=' + confirm],
                       cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    return name, out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--sizes', default='1x5,1x20,3x12', help='nodes x containers per node, comma-separated')
    parser.add_argument('--runs', type=int, default=1)
    args = parser.parse_args()
    lab = Lab()
    tmp = tempfile.mkdtemp(prefix='scale-bench-')
    sizes = [tuple(int(x) for x in size.split('x')) for size in args.sizes.split(',')]
    results = {'forks': FORKS, 'runs': args.runs, 'cores': os.cpu_count(), 'sizes': {}}
    try:
        for nodes, per_node in sizes:
            try:
                name, out = measure(lab, nodes, per_node, args.runs, tmp)
            except RunFailed as e:  # said in the results, and the other sizes still measured
                name, out = '{0}x{1}'.format(nodes, per_node), {'failed': str(e)[-2000:]}
            results['sizes'][name] = out
            print(name, json.dumps(dict((k, v) for k, v in out.items() if not k.endswith('_tasks'))), flush=True)
    finally:
        manager.up(lab, say=lambda msg: None, nodes=1)
    # marginal seconds per container from one size to the next
    names = list(results['sizes'])
    slopes = {}
    for a, b in zip(names, names[1:]):
        fa, fb = results['sizes'][a], results['sizes'][b]
        if 'failed' in fa or 'failed' in fb:
            continue
        more = fb['containers'] - fa['containers']
        if more > 0:
            slopes['{0}->{1}'.format(a, b)] = dict(
                (key, round((fb[key + '_s'] - fa[key + '_s']) / more, 2))
                for key in ('ping', 'first_site', 'site_noop', 'drift_check', 'torch_floor'))
    results['per_container_slope_s'] = slopes
    figures_file.save('scale', results)


if __name__ == '__main__':
    main()
