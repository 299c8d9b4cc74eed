"""A cluster of three nodes, in one lab brought up once for this module (`gpufleet lab up --nodes 3`).

The lab: one API that knows every node, and per node its own sshd, its own `pct` that sees only its containers,
its own device nodes and driver, its own /etc/pve/nodes/<node>/lxc; a node that goes down and comes back as PVE
shows it. The collection: site.yml and drift.yml over a fleet across the three nodes (inventories/lab-cluster)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest
import yaml
from gpufleet.lab import host, manager
from gpufleet.lab.layout import TEMPLATE
from proxmoxer.core import ResourceException

from conftest import ROOT, SITE, Pve, _api, doc_block, run_playbook
from test_doctor import doctor, failing, rows
from test_gpu_container_role import OPEN, entry

pytestmark = pytest.mark.lab

# pve1: 8 GPUs and the lab's driver; pve2: 4 GPUs and an older driver; pve3: no GPU (a CPU node)
GPUS = {'pve1': 8, 'pve2': 4, 'pve3': 0}
CLUSTER = os.path.join(ROOT, 'inventories', 'lab-cluster')
DRIVERS = {'pve1': '580.95.05', 'pve2': '570.172.08', 'pve3': '580.95.05'}


@pytest.fixture(scope='module')
def cluster(lab, creds):
    """The lab grown to three nodes for this module, and back to one after it (its containers gone first)."""
    manager.up(lab, say=lambda msg: None, nodes=3, gpus=','.join(str(GPUS[n]) for n in sorted(GPUS)),
               drivers=','.join(DRIVERS[n] for n in sorted(DRIVERS)))
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    try:
        yield {'lab': lab, 'pve': pve}
    finally:
        for node in ('pve2', 'pve3'):
            if not manager.status(lab)['nodes'][int(node[-1]) - 1]['sshd_running']:
                manager.node_up(lab, node, say=lambda msg: None)
        pve.cleanup()
        manager.up(lab, say=lambda msg: None, nodes=1)


def on(cluster, node):
    """The API's view of one node."""
    return cluster['pve'].api.nodes(node)


def make(cluster, node, vmid, **params):
    """A container on a node, through the API (cleaned up by the module)."""
    pve = cluster['pve']
    params.setdefault('hostname', 'ct{0}'.format(vmid))
    params.setdefault('storage', 'local-lvm')
    params.setdefault('net0', 'name=eth0,bridge=vmbr0,ip=10.77.0.{0}/24,gw=10.77.0.1'.format(vmid % 200 + 2))
    pve.made.append(vmid)
    return pve.ok(on(cluster, node).lxc.post(vmid=vmid, ostemplate='local:vztmpl/debian-12-standard_12.12-1_amd64'
                                                                  '.tar.zst', **params))


def ssh(creds, node, command):
    """A command on one node of the lab, over that node's own sshd."""
    port = 2200 + int(node[len('pve'):])
    argv = ['ssh', '-i', creds['ssh_private_key_file'], '-o', 'UserKnownHostsFile=' + creds['ssh_known_hosts_file'],
            '-o', 'StrictHostKeyChecking=yes', '-o', 'BatchMode=yes', '-o', 'ConnectTimeout=5', '-p', str(port),
            'root@127.0.0.1', command]
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)


def test_one_api_knows_every_node_and_where_each_guest_is(cluster, creds):
    pve = cluster['pve']
    assert sorted((n['node'], n['status']) for n in pve.api.nodes.get()) == [
        ('pve1', 'online'), ('pve2', 'online'), ('pve3', 'online')]
    make(cluster, 'pve2', 961)
    make(cluster, 'pve3', 962)
    where = dict((r['vmid'], r['node']) for r in pve.api.cluster.resources.get(type='vm'))
    assert (where[961], where[962]) == ('pve2', 'pve3')
    # each node's /etc/pve/nodes/<node>/lxc holds its own containers' configs
    assert os.path.exists(os.path.join(cluster['lab'].pve_root, 'nodes', 'pve2', 'lxc', '961.conf'))
    assert not os.path.exists(os.path.join(cluster['lab'].pve_root, 'nodes', 'pve1', 'lxc', '961.conf'))
    # a container is asked for on its own node: another node's API path does not have it
    with pytest.raises(ResourceException) as e:
        on(cluster, 'pve1').lxc(961).config.get()
    assert "Configuration file 'nodes/pve1/lxc/961.conf' does not exist" in str(e.value)


def listed(lines):
    """The vmids of `pct list` output."""
    return [line.split()[0] for line in lines if line.split() and line.split()[0].isdigit()]


def test_each_nodes_pct_sees_only_its_own_containers(cluster, creds):
    make(cluster, 'pve2', 963)
    cluster['pve'].wait(on(cluster, 'pve2').lxc(963).status.start.post())
    mine = ssh(creds, 'pve2', 'echo $GPUFLEET_LAB_NODE; pct list; pct exec 963 -- hostname')
    assert mine.returncode == 0, mine.stderr
    lines = mine.stdout.splitlines()
    assert lines[0] == 'pve2' and '963' in listed(lines[1:-1]) and lines[-1] == 'ct963'
    other = ssh(creds, 'pve1', 'pct list; pct exec 963 -- hostname')
    assert '963' not in listed(other.stdout.splitlines())
    assert other.returncode != 0 and "Configuration file 'nodes/pve1/lxc/963.conf' does not exist" in other.stderr
    # pct's power actions go to its own node's API path
    stopped = ssh(creds, 'pve2', 'pct stop 963 && pct status 963')
    assert stopped.returncode == 0 and stopped.stdout.strip() == 'status: stopped', stopped.stderr


def test_each_node_has_its_own_gpus_and_driver(cluster, creds):
    lab = cluster['lab']
    # pve2 has four GPUs: a fifth is not a device of that node, whatever pve1 has
    with pytest.raises(ResourceException) as e:
        make(cluster, 'pve2', 964, dev0='/dev/nvidia5')
    assert 'Device /dev/nvidia5 does not exist' in str(e.value)
    with pytest.raises(ResourceException) as e:
        make(cluster, 'pve3', 965, dev0='/dev/nvidia0')  # the CPU node has none
    assert 'Device /dev/nvidia0 does not exist' in str(e.value)
    make(cluster, 'pve2', 966, dev0='path=/dev/nvidia3,mode=0666', dev1='path=/dev/nvidiactl,mode=0666')
    cluster['pve'].wait(on(cluster, 'pve2').lxc(966).status.start.post())
    seen = ssh(creds, 'pve2', "pct exec 966 -- python3 -c '{0}'".format(OPEN))
    assert seen.returncode == 0, seen.stderr
    assert dict(line.split() for line in seen.stdout.splitlines()) == {'/dev/nvidia3': 'ENXIO',
                                                                      '/dev/nvidiactl': 'ENXIO'}
    # each node's driver answers with its own version, in its own /proc
    for node, version in DRIVERS.items():
        proc = os.path.join(lab.on(node).proc_dir, 'driver', 'nvidia', 'version')
        if GPUS[node]:
            with open(proc) as fh:
                assert '  {0}  '.format(version) in fh.read()
        else:
            assert not os.path.exists(proc)  # no GPU, no NVIDIA driver
    smi = ssh(creds, 'pve2', '{0}/bin/nvidia-smi --query-gpu=index,driver_version --format=csv,noheader'.format(
        lab.on('pve2').driver_dir))
    assert smi.stdout.splitlines() == ['{0}, 570.172.08'.format(i) for i in range(4)]


def test_a_migration_moves_the_container_where_pve_allows_it_and_is_refused_where_pve_refuses(cluster, creds):
    """POST .../migrate as pve-container's LXC/Migrate.pm does it: a running container only in restart mode (the
    API refuses it otherwise), a bind mount point not marked shared=1 refuses the move inside the task (nothing
    moves), an offline target cannot be reached; a move takes the config to the target's /etc/pve/nodes/<node>/lxc
    and the real container runs again there with that node's devices."""
    pve, lab = cluster['pve'], cluster['lab']
    make(cluster, 'pve1', 969, dev0='path=/dev/nvidia3,mode=0666', rootfs='local-lvm:4', mp0='/srv,mp=/mnt/srv')
    pve.wait(on(cluster, 'pve1').lxc(969).status.start.post())
    with pytest.raises(ResourceException) as e:
        on(cluster, 'pve1').lxc(969).migrate.post(target='pve2')
    assert "can't migrate running container without --online or --restart" in str(e.value)
    st, log = pve.wait(on(cluster, 'pve1').lxc(969).migrate.post(target='pve2', restart=1))
    assert st['exitstatus'] == 'migration aborted', (st, log)
    assert any("cannot migrate local bind mount point 'mp0'" in line for line in log), log
    assert on(cluster, 'pve1').lxc(969).status.current.get()['status'] == 'running'  # nothing moved
    on(cluster, 'pve1').lxc(969).config.put(mp0='/srv,mp=/mnt/srv,shared=1')  # pending: it runs
    pve.wait(on(cluster, 'pve1').lxc(969).status.reboot.post())
    manager.node_down(lab, 'pve3', say=lambda msg: None)
    try:
        st, log = pve.wait(on(cluster, 'pve1').lxc(969).migrate.post(target='pve3', restart=1))
        assert st['exitstatus'] == 'migration aborted', (st, log)
        assert any("Can't connect to destination address" in line for line in log), log
    finally:
        manager.node_up(lab, 'pve3', say=lambda msg: None)
    pve.ok(on(cluster, 'pve1').lxc(969).migrate.post(target='pve2', restart=1))
    where = dict((r['vmid'], r['node']) for r in pve.api.cluster.resources.get(type='vm'))
    assert where[969] == 'pve2'
    assert os.path.exists(os.path.join(lab.pve_root, 'nodes', 'pve2', 'lxc', '969.conf'))
    assert not os.path.exists(os.path.join(lab.pve_root, 'nodes', 'pve1', 'lxc', '969.conf'))
    # it runs again on pve2, with pve2's /dev/nvidia3
    seen = ssh(creds, 'pve2', "pct status 969 && pct exec 969 -- python3 -c '{0}'".format(OPEN))
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.splitlines() == ['status: running', '/dev/nvidia3 ENXIO']
    assert '969' not in listed(ssh(creds, 'pve1', 'pct list').stdout.splitlines())
    # devN is not checked by the move: a device the target does not have stops the start there, and the container
    # stays moved, stopped ("migration finished with problems")
    make(cluster, 'pve1', 970, dev0='/dev/nvidia6')
    pve.wait(on(cluster, 'pve1').lxc(970).status.start.post())
    st, log = pve.wait(on(cluster, 'pve1').lxc(970).migrate.post(target='pve2', restart=1))
    assert st['exitstatus'] == 'migration problems', (st, log)
    assert on(cluster, 'pve2').lxc(970).status.current.get()['status'] == 'stopped'


def test_a_template_is_on_the_nodes_it_was_downloaded_to_only(cluster, creds, tmp_path):
    """PVE's `local` is each node's own disk: the template the API lists on a node is the file in that node's
    storage, a create on a node without it fails in its task (nothing left behind), and the doctor names that node."""
    pve, lab = cluster['pve'], cluster['lab']
    volid = 'local:vztmpl/' + TEMPLATE
    path = os.path.join(lab.on('pve2').storage_path('local'), 'template', 'cache', TEMPLATE)
    os.unlink(path)
    try:
        for node, has in (('pve1', True), ('pve2', False), ('pve3', True)):
            listed_there = [c['volid'] for c in on(cluster, node).storage('local').content.get(content='vztmpl')]
            assert (volid in listed_there) == has, (node, listed_there)
        assert ssh(creds, 'pve2', 'test -e "$(pvesm path {0})"'.format(volid)).returncode == 1
        pve.made.append(981)
        st, log = pve.wait(on(cluster, 'pve2').lxc.post(
            vmid=981, ostemplate=volid, hostname='ct981', storage='local-lvm',
            net0='name=eth0,bridge=vmbr0,ip=10.77.0.183/24,gw=10.77.0.1'))
        assert st['exitstatus'] == "unable to create CT 981 - volume '{0}' does not exist".format(volid), (st, log)
        assert 981 not in [r['vmid'] for r in pve.api.cluster.resources.get(type='vm')]
        out = doctor(tmp_path, [entry(981, 'tmpl-a', [], node='pve2'), entry(982, 'tmpl-b', [], node='pve3')])
        assert failing(out) == [('pve2', 'template')], out['checks']
        assert rows(out)[('pve3', 'template python3')]['ok']
    finally:
        host.make_template(path)
    assert volid in [c['volid'] for c in on(cluster, 'pve2').storage('local').content.get(content='vztmpl')]


def test_a_gpu_container_on_a_node_below_its_profiles_driver_floor_is_refused_before_anything_changes(cluster,
                                                                                                      tmp_path):
    """pve2 runs the driver 570.172.08: above CUDA 12's floor (525.60.13), below the R580 driver that the default
    profile's cu13 wheels need though its torch is the CUDA 12.8 build. The doctor and a site run refuse a GPU
    container there with that profile, naming the node, the profile, the wheel and the driver, before the container
    is made."""
    asked = [entry(984, 'floor-a', [0], node='pve2', venv_profile='default')]
    said = ('containers[0] (vmid 984).venv_profile: node pve2 runs the NVIDIA driver 570.172.08, and the venv profile '
            "default needs an NVIDIA driver of at least 580.65.06: its lock's nvidia-cudnn-cu13==9.19.0.56 is built "
            'for CUDA 13')
    out = doctor(tmp_path, asked)
    assert failing(out) == [('fleet', 'definition')], out['checks']
    assert said in rows(out)[('fleet', 'definition')]['detail']
    fleet = tmp_path / 'floor.json'
    fleet.write_text(json.dumps({'gpufleet_containers': asked}))
    cluster['pve'].made.append(984)
    site = run_playbook(open(SITE).read(), tmp_path, '-e', '@' + str(fleet), inventory=CLUSTER)
    assert site.rc != 0 and [f for f in site.failures() if said in f], site.failures()
    assert 984 not in [r['vmid'] for r in cluster['pve'].api.cluster.resources.get(type='vm')]


def test_the_lab_inventory_lists_every_node_with_its_own_files(cluster, tmp_path):
    """inventories/lab describes the cluster the lab has: gpu_devices on each node finds that node's GPUs."""
    bin_dir = os.path.join(ROOT, '.venv', 'bin')
    listed = subprocess.run([os.path.join(bin_dir, 'ansible-inventory'), '-i', 'inventories/lab', '--list'],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    assert sorted(json.loads(listed.stdout)['pve_nodes']['hosts']) == ['pve1', 'pve2', 'pve3']
    found = run_playbook([{'hosts': 'pve_nodes', 'gather_facts': False, 'tasks': [{'gpufleet.proxmox.gpu_devices': {
        'dev_dir': "{{ gpu_node_dev_dir | default('/dev') }}", 'proc_root': '{{ gpu_node_proc_root }}',
        'nvidia_smi': '{{ gpu_node_nvidia_smi }}'}}]}], tmp_path)
    assert found.rc == 0, found.stdout[-3000:]
    for node in ('pve1', 'pve2', 'pve3'):
        facts = found.task(0, node)['ansible_facts']['gpufleet_gpu_devices']
        assert facts['indexes'] == list(range(GPUS[node]))
        assert facts['driver_version'] == (DRIVERS[node] if GPUS[node] else None)
    # the GPU at index 0 of pve2 is its driver's minor 3 (/dev/nvidia3 of pve2's own /dev)
    assert found.task(0, 'pve2')['ansible_facts']['gpufleet_gpu_devices']['gpus'][0]['path'].endswith('/nvidia3')


def test_a_node_that_goes_down_is_offline_to_the_cluster_and_comes_back(cluster, creds):
    pve = cluster['pve']
    make(cluster, 'pve3', 967, onboot=1)
    make(cluster, 'pve3', 968)
    for vmid in (967, 968):
        pve.wait(on(cluster, 'pve3').lxc(vmid).status.start.post())
    manager.node_down(cluster['lab'], 'pve3', say=lambda msg: None)
    assert dict((n['node'], n['status']) for n in pve.api.nodes.get())['pve3'] == 'offline'
    status = dict((r['vmid'], r['status']) for r in pve.api.cluster.resources.get(type='vm'))
    assert (status[967], status[968]) == ('unknown', 'unknown')
    with pytest.raises(ResourceException) as e:
        on(cluster, 'pve3').lxc.get()
    assert e.value.status_code == 595
    assert ssh(creds, 'pve3', 'true').returncode == 255  # its sshd is gone with it
    real = dict((c['vmid'], c['real']) for c in manager.status(cluster['lab'])['containers'])
    assert (real[967], real[968]) == ('stopped', 'stopped')
    # the rest of the cluster carries on
    assert on(cluster, 'pve1').lxc.get() is not None
    back = manager.node_up(cluster['lab'], 'pve3', say=lambda msg: None)
    assert [(s['vmid'], s['exitstatus']) for s in back['started'] if s['vmid'] in (967, 968)] == [(967, 'OK')]
    assert dict((n['node'], n['status']) for n in pve.api.nodes.get())['pve3'] == 'online'
    assert ssh(creds, 'pve3', 'pct status 967; pct status 968').stdout.split('\n')[:2] == [
        'status: running', 'status: stopped']


DRIFT = os.path.join(ROOT, 'playbooks', 'drift.yml')


def test_a_fleet_across_the_nodes_converges_and_a_second_run_changes_nothing(cluster, tmp_path):
    """inventories/lab-cluster: GPU containers on pve1 and on pve2 (4 GPUs, an older driver), a CPU container on
    pve3 (no GPU, no NVIDIA driver) made from debian-13-standard, with the CUDA 13 torch on its Python 3.13. Every
    container joins the inventory through its own node, gets its own node's GPUs and driver, and is verified; a second
    run and a drift check find nothing to do. Before it, a run in which pve1's raw lines cannot be written: pve1's
    container is made and left stopped (never started without the driver bundle's bind), the other nodes' go on."""
    # The lab's own containers above go first: one of them holds pve2's first GPU, and a GPU that a container
    # outside the fleet holds is never given to the fleet's (fleet_plan refuses, naming it).
    cluster['pve'].cleanup()
    cluster['pve'].made.extend([221, 222, 223])
    broken = tmp_path / 'pve1-without-its-configs.yml'
    broken.write_text(yaml.safe_dump({'all': {'hosts': {'pve1': {'gpu_container_pve_root': str(tmp_path / 'none')}}}}))
    cut = run_playbook(open(SITE).read(), tmp_path, '-i', str(broken), inventory=CLUSTER)
    assert cut.rc != 0 and any("Write the collection's raw lines" in f and ' on pve1: ' in f and 'not here' in f
                               for f in cut.failures()), cut.failures()
    assert on(cluster, 'pve1').lxc(221).status.current.get()['status'] == 'stopped'
    assert on(cluster, 'pve2').lxc(222).status.current.get()['status'] == 'running'
    first = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
    assert first.rc == 0, first.failures() or first.stdout[-3000:]
    assert sorted(h for h in first.stats if h.startswith(('train', 'util'))) == ['train-c1', 'train-c2', 'util-c3']
    summary = json.loads((tmp_path / 'reports' / 'summary.json').read_text())
    assert summary['ok'] and summary['verdict'] == 'verified 3 of 3 container(s)'
    assert dict((r['host'], r['node']) for r in summary['containers']) == {
        'train-c1': 'pve1', 'train-c2': 'pve2', 'util-c3': 'pve3'}
    # pve2's container: pve2's GPU 0 (its driver's minor 3) and pve2's own driver
    report = json.loads((tmp_path / 'reports' / 'train-c2.json').read_text())
    assert report['torch']['driver_version'] == DRIVERS['pve2']
    assert set(report['torch']['device_access']['nodes']) == {
        '/dev/nvidia3', '/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools', '/dev/nvidia-modeset'}
    c3 = json.loads((tmp_path / 'reports' / 'util-c3.json').read_text())
    assert (c3['torch']['torch_version'], c3['torch']['python_version'][:5]) == ('2.11.0+cu130', '3.13.')
    c1 = json.loads((tmp_path / 'reports' / 'train-c1.json').read_text())
    assert c1['torch']['driver_version'] == DRIVERS['pve1'] and '/dev/nvidia7' in c1['torch']['device_access']['nodes']
    again = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
    assert again.rc == 0 and all(s['changed'] == 0 for s in again.stats.values()), again.stats
    # the CPU node has no NVIDIA driver and needs none: no drift on any node or container
    drift = run_playbook(open(DRIFT).read(), tmp_path, '--check', inventory=CLUSTER)
    assert drift.rc == 0, drift.failures() or drift.stdout[-3000:]
    found = json.loads((tmp_path / 'reports' / 'drift' / 'summary.json').read_text())
    assert found['drift'] is False and found['count'] == 0, found


def test_a_run_limited_to_some_nodes_leaves_the_others_alone(cluster, tmp_path):
    """--limit to pve1 and pve3 (and their containers' groups): their containers are reconciled and verified, the
    fleet is still checked as a whole, and pve2's container is not touched (its drift stays for a run that
    reaches it)."""
    pve = cluster['pve']
    pve.made.extend([221, 222, 223])
    full = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
    assert full.rc == 0, full.failures() or full.stdout[-3000:]
    on(cluster, 'pve2').lxc(222).config.put(cores=2)  # drift on the node the next run does not reach
    on(cluster, 'pve1').lxc(221).config.put(cores=2)  # and on one it does
    limited = run_playbook(open(SITE).read(), tmp_path, '--limit',
                           'pve1,pve3,gpufleet_running_pve1,gpufleet_running_pve3', inventory=CLUSTER)
    assert limited.rc == 0, limited.failures() or limited.stdout[-3000:]
    assert sorted(h for h in limited.stats if not h.startswith('pve')) == ['train-c1', 'util-c3']
    summary = json.loads((tmp_path / 'reports' / 'summary.json').read_text())
    assert summary['verdict'] == 'verified 2 of 2 container(s)'
    assert on(cluster, 'pve1').lxc(221).config.get()['cores'] == 1  # repaired
    assert on(cluster, 'pve2').lxc(222).config.get()['cores'] == 2  # left alone
    # the fleet is checked as a whole all the same: a problem on the node the run does not reach stops it
    bad = run_playbook(open(SITE).read(), tmp_path, '--limit', 'pve1', '-e', json.dumps({'gpufleet_containers': [
        {'vmid': 221, 'hostname': 'train-c1', 'node': 'pve1', 'gpus': [0, 1]},
        {'vmid': 221, 'hostname': 'dup', 'node': 'pve2', 'gpus': []}]}), inventory=CLUSTER)
    assert bad.rc != 0 and 'containers[1] (vmid 221).vmid: 221 is also the vmid of containers[0]' in bad.stdout
    again = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
    assert again.rc == 0 and on(cluster, 'pve2').lxc(222).config.get()['cores'] == 1


def test_a_node_that_is_down_is_reported_and_the_rest_of_the_fleet_carries_on(cluster, tmp_path):
    """pve3 is down: it is unreachable, its container is judged unreached (its node named), and the containers of
    pve1 and pve2 are still reconciled and verified; once pve3 is back, the fleet is whole again."""
    pve = cluster['pve']
    pve.made.extend([221, 222, 223])
    full = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
    assert full.rc == 0, full.failures() or full.stdout[-3000:]
    on(cluster, 'pve1').lxc(221).config.put(cores=2)  # drift where the run still reaches
    manager.node_down(cluster['lab'], 'pve3', say=lambda msg: None)
    try:
        down = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
        assert down.rc != 0 and down.stats['pve3']['unreachable'] > 0, down.stats
        # the one failure is the verdict's, at the end: the fleet is not whole
        (failure,) = down.failures()
        assert 'verified 2 of 3 container(s): util-c3 (CT 223 on pve3): unreached' in failure, failure
        assert down.stats['train-c1']['failures'] == 0 and down.stats['train-c2']['failures'] == 0
        assert on(cluster, 'pve1').lxc(221).config.get()['cores'] == 1  # repaired all the same
        summary = json.loads((tmp_path / 'reports' / 'summary.json').read_text())
        rows = dict((r['host'], r) for r in summary['containers'])
        assert summary['ok'] is False and summary['verified'] == 2 and summary['expected'] == 3
        assert (rows['util-c3']['state'], rows['util-c3']['node']) == ('unreached', 'pve3')
        assert rows['util-c3']['why'] == ('CT 223 on pve3 was not reached: the run could not reach its node '
                                          '(unreachable, or a task failed there)')
        # a drift check says the same: the down node's container is the fleet's, unreached, never an orphan
        check = run_playbook(open(DRIFT).read(), tmp_path, '--check', inventory=CLUSTER)
        found = json.loads((tmp_path / 'reports' / 'drift' / 'summary.json').read_text())
        assert found['orphans'] == [] and [i['item'] for i in found['containers']['util-c3']] == ['unreached'], found
        assert check.stats['pve3']['unreachable'] > 0
    finally:
        manager.node_up(cluster['lab'], 'pve3', say=lambda msg: None)
    back = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
    assert back.rc == 0, back.failures() or back.stdout[-3000:]
    assert json.loads((tmp_path / 'reports' / 'summary.json').read_text())['verdict'] == 'verified 3 of 3 container(s)'


def test_a_container_found_on_another_node_is_drift_and_a_repair_moves_it_back(cluster, tmp_path):
    """util-c3 (CT 223) belongs on pve3 and is migrated to pve1 behind the fleet's back: a drift check names it
    (node: expected pve3, found pve1) and moves nothing; where PVE would refuse the move back (a bind mount point
    not marked shared=1), a repair says so before anything changes; once that is fixed, a repair moves it back to
    pve3 (stopped, migrated, started there) and the fleet is verified whole."""
    pve = cluster['pve']
    pve.made.extend([221, 222, 223])
    full = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
    assert full.rc == 0, full.failures() or full.stdout[-3000:]
    # the fleet's own bind mounts (uv cache, wheelhouse) are marked shared=1, so PVE lets it move
    pve.ok(on(cluster, 'pve3').lxc(223).migrate.post(target='pve1', restart=1))

    def where_is(vmid):
        return dict((r['vmid'], r['node']) for r in pve.api.cluster.resources.get(type='vm'))[vmid]

    def where():
        return where_is(223)

    def node_items():
        found = json.loads((tmp_path / 'reports' / 'drift' / 'summary.json').read_text())
        return [i for i in found['containers']['util-c3'] if i['item'] == 'node']

    check = run_playbook(open(DRIFT).read(), tmp_path, '--check', inventory=CLUSTER)
    assert check.rc == 0, check.failures() or check.stdout[-3000:]
    assert [i['detail'] for i in node_items()] == ['node: expected pve3, found pve1']
    assert where() == 'pve1'  # a check moves nothing
    # a bind mount point of its own, not marked shared: PVE would refuse to migrate it, so nothing is changed
    pve.ok(on(cluster, 'pve1').lxc(223).status.stop.post())
    on(cluster, 'pve1').lxc(223).config.put(mp0='/srv,mp=/mnt/srv')
    refused = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
    assert refused.rc != 0
    assert ("vmid 223 is on node pve1, not pve3 as the fleet says, and PVE cannot move it back: cannot migrate "
            "local bind mount point 'mp0'") in refused.stdout, refused.failures()
    assert where() == 'pve1' and on(cluster, 'pve1').lxc(223).status.current.get()['status'] == 'stopped'
    check = run_playbook(open(DRIFT).read(), tmp_path, '--check', inventory=CLUSTER)
    assert [i['detail'] for i in node_items()] == [
        "node: expected pve3, found pve1 (PVE cannot move it back: cannot migrate local bind mount point 'mp0')"]
    on(cluster, 'pve1').lxc(223).config.put(delete='mp0')
    pve.ok(on(cluster, 'pve1').lxc(223).status.start.post())  # running where it should not be
    repair = run_playbook(open(DRIFT).read(), tmp_path, inventory=CLUSTER)
    assert repair.rc == 0, repair.failures() or repair.stdout[-3000:]
    assert where() == 'pve3' and on(cluster, 'pve3').lxc(223).status.current.get()['status'] == 'running'
    assert [i['detail'] for i in node_items()] == ['node: expected pve3, found pve1']  # found, and repaired
    summary = json.loads((tmp_path / 'reports' / 'summary.json').read_text())
    assert summary['verdict'] == 'verified 3 of 3 container(s)'
    assert dict((r['host'], r['node']) for r in summary['containers'])['util-c3'] == 'pve3'

    # a GPU container moved to the node without GPUs (as an HA recovery might): the finding says it is without its
    # GPUs there and which node would give them; a repair moves it back, where it is verified with its GPU
    # (PVE moves it, then cannot start it there: its GPU's device node is missing; it stays there, stopped)
    st, log = pve.wait(on(cluster, 'pve2').lxc(222).migrate.post(target='pve3', restart=1))
    assert st['exitstatus'] == 'migration problems' and where_is(222) == 'pve3', (st, log)
    check = run_playbook(open(DRIFT).read(), tmp_path, '--check', inventory=CLUSTER)
    found = json.loads((tmp_path / 'reports' / 'drift' / 'summary.json').read_text())
    assert [i['detail'] for i in found['containers']['train-c2'] if i['item'] == 'node'] == [
        'node: expected pve2, found pve3; on pve3 it is without its GPUs (it has no GPU 0 (it has none)); '
        'pve2, pve1 would fit (GPU 0)'], found['containers']['train-c2']
    repair = run_playbook(open(DRIFT).read(), tmp_path, inventory=CLUSTER)
    assert repair.rc == 0, repair.failures() or repair.stdout[-3000:]
    summary = json.loads((tmp_path / 'reports' / 'summary.json').read_text())
    assert summary['verdict'] == 'verified 3 of 3 container(s)'
    assert dict((r['host'], r['node']) for r in summary['containers'])['train-c2'] == 'pve2'
    # the fleet definition moving it to that node itself: refused before anything changes, naming the nodes that fit
    # (the node, which has no driver loaded, is refused by gpu_node; where it had one, fleet_plan would refuse the GPU)
    fleet = yaml.safe_load(open(os.path.join(CLUSTER, 'group_vars', 'all', 'fleet.yml')))['gpufleet_containers']
    moved_vars = tmp_path / 'moved.json'
    moved_vars.write_text(json.dumps({'gpufleet_containers': [dict(e, node='pve3') if e['vmid'] == 222 else e
                                                              for e in fleet]}))
    refused = run_playbook(open(SITE).read(), tmp_path, '-e', '@' + str(moved_vars), inventory=CLUSTER)
    assert refused.rc != 0 and where_is(222) == 'pve2'
    (why,) = [f for f in refused.failures() if 'Refuse a node without a loaded NVIDIA driver on pve3' in f]
    assert why.endswith('Nodes of this run with a driver loaded, which could take them: pve1, pve2.'), why


def test_a_cluster_half_upgraded_passes_each_nodes_gpus_the_way_that_node_can_take_them(cluster, control, tmp_path):
    """pve2 still runs PVE 8.0, which has no devN (its API refuses dev0 as PVE::JSONSchema does), while pve1 runs
    9: in auto mode each node's version is read (GET /nodes/<node>/version) and train-c2 on pve2 gets its GPU as raw
    lxc lines while train-c1 on pve1 keeps devN; both are verified, and a second run changes nothing."""
    pve = cluster['pve']
    pve.made.extend([221, 222, 223])
    if 222 in [r['vmid'] for r in pve.api.cluster.resources.get(type='vm')]:  # made afresh on the old node
        old = on(cluster, 'pve2').lxc(222)
        if old.status.current.get()['status'] == 'running':
            pve.ok(old.status.stop.post())
        pve.ok(old.delete())
    control.set_version('8.0.4', node='pve2')
    try:
        assert on(cluster, 'pve2').version.get()['version'] == '8.0.4'
        assert on(cluster, 'pve1').version.get()['version'] == pve.api.version.get()['version'] == '9.0.10'
        with pytest.raises(ResourceException) as e:
            make(cluster, 'pve2', 971, dev0='/dev/nvidia0')
        assert e.value.status_code == 400 and 'dev0' in str(e.value)
        first = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
        assert first.rc == 0, first.failures() or first.stdout[-3000:]
        c2 = on(cluster, 'pve2').lxc(222).config.get()
        assert not [k for k in c2 if k.startswith('dev')], c2
        assert 'lxc.mount.entry: /dev/nvidia3 dev/nvidia3 none bind,optional,create=file' in [
            '{0}: {1}'.format(*line) for line in c2.get('lxc') or []], c2
        assert 'dev0' in on(cluster, 'pve1').lxc(221).config.get()
        summary = json.loads((tmp_path / 'reports' / 'summary.json').read_text())
        assert summary['verdict'] == 'verified 3 of 3 container(s)'
        report = json.loads((tmp_path / 'reports' / 'train-c2.json').read_text())
        assert '/dev/nvidia3' in report['torch']['device_access']['nodes']
        again = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
        assert again.rc == 0 and all(s['changed'] == 0 for s in again.stats.values()), again.stats
    finally:
        control.set_version('9.0.10')


def test_the_cli_limited_to_a_node_verifies_that_nodes_containers(cluster, tmp_path):
    """gpufleet verify --node pve2: the node and its containers' group, nothing else."""
    cluster['pve'].made.extend([221, 222, 223])
    full = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
    assert full.rc == 0, full.failures() or full.stdout[-3000:]
    done = subprocess.run([os.path.join(ROOT, '.venv', 'bin', 'gpufleet'), 'verify', '-i', CLUSTER, '--node', 'pve2',
                           '--json', '--artifacts', str(tmp_path / 'home')], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    result = json.loads(done.stdout)
    assert done.returncode == 0 and result['exit_code'] == 0, result.get('verdict')
    assert result['verdict'] == 'clean: verified 1 of 1 container(s)'
    assert sorted(result['hosts']) == ['pve2', 'train-c2']


def test_the_operators_walkthrough_from_the_copied_example_to_a_clean_drift_from_cron(cluster, creds, tmp_path):
    """docs/operators.md followed on the lab, shaped as the example is (an 8-GPU node, pve1, for gpu01 and a CPU node,
    pve3, for util01): the example copied and its vault made with the guide's own commands, its files filled in
    for the lab as an operator fills them for a cluster, then the guide's gpufleet doctor and gpufleet up, and its
    cron line run as cron runs it (PATH=/usr/bin:/bin), which finds the fleet clean."""
    # a new cluster: the module's other containers (the fleet's tag on them: orphans of this fleet) gone first
    cluster['pve'].cleanup()
    cluster['pve'].made.clear()
    # a home as short as an operator's: ssh's control sockets live under it and a socket path has at most 107 bytes
    home, mine = pathlib.Path(tempfile.mkdtemp(prefix='gf-home-')), tmp_path / 'mycluster'
    bin_dir = os.path.dirname(sys.executable)

    def local(text):
        # the guide's paths, here: the inventory in tmp beside the lab's inventory (which reaches the lab's nodes)
        return (text.replace('inventories/mycluster', str(mine)).replace('/root/.gpufleet-vault', '~/.gpufleet-vault')
                .replace('/usr/local/bin/gpufleet', os.path.join(bin_dir, 'gpufleet'))
                .replace('cd /srv/gpufleet', 'cd ' + ROOT).replace('/var/log/gpufleet', str(tmp_path / 'log')))

    env = dict(os.environ, HOME=str(home), PATH=bin_dir + ':' + os.environ['PATH'],
               EDITOR="sh -c 'cat {0} > \"$0\"'".format(tmp_path / 'secrets.yml'))
    (tmp_path / 'secrets.yml').write_text(
        'vault_gpufleet_api_password: {0}\nvault_gpufleet_api_token_secret: {1}\n'.format(
            creds['api_password'], creds['api_token_secret']))
    # section 2: copy the example, make the vault password file and the vault (the editor step is ours: below)
    lines = [line for line in local(doc_block('2. An inventory', 'sh')).splitlines()
             if line.strip() and not line.lstrip().startswith('#')]
    edit = [i for i, line in enumerate(lines) if line.startswith('$EDITOR')][0]
    lines = lines[:edit] + lines[edit + 2:]  # $EDITOR and its continuation line
    (tmp_path / 'section2.sh').write_text('\n'.join(lines) + '\n')
    # on a terminal, as an operator types them (ansible-vault create opens an editor only on one)
    done = subprocess.run(['script', '-qec', 'bash -e ' + str(tmp_path / 'section2.sh'), '/dev/null'], cwd=ROOT, env=env,
                          input='lab-vault-pw\n', capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (home / '.gpufleet-vault').read_text() == 'lab-vault-pw\n' and (home / '.gpufleet-vault').stat().st_mode & 0o077 == 0
    assert (mine / 'group_vars' / 'all' / 'vault.yml').read_text().startswith('$ANSIBLE_VAULT;')
    # what an operator fills in: the nodes (the lab inventory, given first, says how to reach them), the API and its
    # CA, the fleet's nodes, addresses and sizes for this machine, the lab's offline CPU profile
    (mine / 'hosts.yml').write_text(yaml.safe_dump({'all': {'children': {'pve_nodes': {
        'hosts': {'pve1': None, 'pve3': None}, 'vars': {'ansible_user': 'root'}}}}}))
    api = (mine / 'group_vars' / 'all' / 'api.yml').read_text()
    # (the CA by its path: with the lab's inventory given first, inventory_dir is the lab's)
    (mine / 'group_vars' / 'all' / 'api.yml').write_text(api.replace('10.1.2.6', creds['api_host']).replace(
        'gpufleet_api_token_id: gpufleet', 'gpufleet_api_token_id: ' + creds['api_token_id']).replace(
        '{{ inventory_dir }}/pve-root-ca.pem', str(mine / 'pve-root-ca.pem')))
    shutil.copy(creds['ca_path'], mine / 'pve-root-ca.pem')
    fleet_file = mine / 'group_vars' / 'all' / 'fleet.yml'
    fleet = yaml.safe_load(fleet_file.read_text())
    for n, item in enumerate(fleet['gpufleet_containers']):
        item.update(node={'gpu01': 'pve1', 'util01': 'pve3'}[item['node']], cores=1, memory=2048, rootfs=8,
                    net='name=eth0,bridge=vmbr0,ip=10.77.0.{0}/24,gw=10.77.0.1'.format(180 + n))
        cluster['pve'].made.append(item['vmid'])
    fleet.update(gpufleet_storage='local-lvm', torch_venv_profile='cpu', torch_venv_offline=True)
    fleet_file.write_text(yaml.safe_dump(fleet))
    # section 3: the doctor, then the first run
    guide = doc_block('3. The gpufleet command', 'sh', having='gpufleet doctor')
    for command in ('gpufleet doctor', 'gpufleet up '):
        (line,) = [local(x).split('#')[0] for x in guide.splitlines() if x.startswith(command)]
        argv = line.replace('-i ' + str(mine), '-i inventories/lab -i ' + str(mine)).split()
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (command, done.stdout, done.stderr[-3000:])
        if command == 'gpufleet doctor':
            assert done.stdout.strip().endswith('a first run (gpufleet up) can start')
        else:
            assert 'clean: verified 3 of 3 container(s)' in done.stdout
    # section 4: the cron line, as cron runs it
    (cron,) = [x for x in doc_block('4. Drift checks', 'cron').splitlines() if x.strip()]
    command = local(cron.split(None, 5)[5]).replace('-i ' + str(mine), '-i inventories/lab -i ' + str(mine))
    (tmp_path / 'log').mkdir()
    done = subprocess.run(['/bin/sh', '-c', command], env={'PATH': '/usr/bin:/bin', 'HOME': str(home)},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / 'log' / 'drift.json').read_text())
    assert (report['exit_code'], report['verdict']) == (0, 'clean: verified 3 of 3 container(s), no drift')
    shutil.rmtree(home)
