"""Benchmark the fleet's runs over N lab containers (default 20), side by side with Ansible's floor.

    python bench/fleet_bench.py [--containers N]

Makes N containers with their venvs (site.yml, the lab's CPU profile, one GPU stand-in each where the lab has
them), then times, each the median of 3 runs made in rounds (one of each series a round):
  - `ansible -m ping` over the N containers (through the pct connection): touching each host once;
  - a no-op site.yml (nothing to change);
  - drift.yml --check (every stage in check mode, plus the reports; each container's last passing verification
    is reused while nothing it depended on changed, as drift.yml does by default);
  - the same with -e verify_max_age=0: torch imported in every container;
  - the same without the verify stage (--skip-tags verify).
Goal: the drift check within 3x the ping run. Results print and go to bench/results/fleet.json.
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
BASE = 501


def fleet(n):
    return [{'vmid': BASE + i, 'hostname': 'fleet-{0:02d}'.format(i), 'node': 'pve1', 'gpus': [i] if i < 8 else [],
             'cores': 1, 'memory': 1024, 'net': 'name=eth0,bridge=vmbr0,ip=10.77.0.{0}/24,gw=10.77.0.1'.format(100 + i)}
            for i in range(n)]


def run(argv, env, tmp):
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit('{0} failed:\n{1}'.format(' '.join(argv), done.stdout[-4000:]))
    return took


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--containers', type=int, default=20)
    parser.add_argument('--runs', type=int, default=3)
    parser.add_argument('--keep', action='store_true', help='leave the containers for another run')
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix='fleet-bench-')
    lab_dir = os.environ.get('GPUFLEET_LAB_DIR', '/var/lib/gpufleet-lab')
    with open(os.path.join(lab_dir, 'credentials.json')) as fh:
        creds = json.load(fh)
    the_fleet = fleet(args.containers)
    extra = os.path.join(tmp, 'fleet.json')
    with open(extra, 'w') as fh:
        json.dump({'gpufleet_containers': the_fleet}, fh)
    hosts = {}
    for c in the_fleet:
        hosts[c['hostname']] = {
            'ansible_connection': 'gpufleet.proxmox.pct', 'ansible_pct_vmid': c['vmid'],
            'ansible_pct_node': creds['ssh_host'], 'ansible_pct_node_port': creds['ssh_port'],
            'ansible_pct_private_key_file': creds['ssh_private_key_file'],
            'ansible_pct_ssh_args': '-o UserKnownHostsFile={0} -o StrictHostKeyChecking=yes'.format(
                creds['ssh_known_hosts_file']),
            'ansible_python_interpreter': '/usr/bin/python3'}
    inventory = os.path.join(tmp, 'containers.yml')
    with open(inventory, 'w') as fh:
        yaml.safe_dump({'all': {'hosts': hosts}}, fh)
    env = dict(os.environ, PATH=BIN + ':' + os.environ['PATH'], ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'),
               GPUFLEET_REPORT_DIR=os.path.join(tmp, 'reports'))
    playbook = [os.path.join(BIN, 'ansible-playbook'), '-i', os.path.join(ROOT, 'inventories', 'lab'), '-e', '@' + extra]
    figures = {'containers': args.containers, 'forks': 10}
    try:
        figures['first_site_s'] = round(run(playbook + ['site.yml'], env, tmp), 1)
        series = {'ping': [os.path.join(BIN, 'ansible'), '-i', inventory, 'all', '-m', 'ansible.builtin.ping'],
                  'site_noop': playbook + ['site.yml'],
                  'drift_check': playbook + ['playbooks/drift.yml', '--check', '--diff'],
                  'drift_check_fresh_verify': playbook + ['playbooks/drift.yml', '--check', '--diff',
                                                          '-e', 'verify_max_age=0'],
                  'drift_check_without_verify': playbook + ['playbooks/drift.yml', '--check', '--diff',
                                                            '--skip-tags', 'verify']}
        times = dict((name, []) for name in series)
        for _ in range(args.runs):  # in rounds, so that a machine slower for a while weighs on every series alike
            for name, argv in series.items():
                times[name].append(run(argv, env, tmp))
        for name in series:
            figures[name + '_s'] = round(statistics.median(times[name]), 2)
            figures[name + '_runs_s'] = [round(t, 2) for t in times[name]]
        figures['drift_check_over_ping'] = round(figures['drift_check_s'] / figures['ping_s'], 2)
        figures['drift_check_fresh_verify_over_ping'] = round(figures['drift_check_fresh_verify_s'] / figures['ping_s'], 2)
        figures['drift_check_without_verify_over_ping'] = round(
            figures['drift_check_without_verify_s'] / figures['ping_s'], 2)
        figures['site_noop_over_ping'] = round(figures['site_noop_s'] / figures['ping_s'], 2)
    finally:
        if not args.keep:
            confirm = ','.join(str(c['vmid']) for c in the_fleet)
            subprocess.run(playbook + ['playbooks/teardown.yml', '-e', 'gpufleet_teardown_confirm=' + confirm],
                           cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    figures_file.save('fleet', figures)


if __name__ == '__main__':
    main()
