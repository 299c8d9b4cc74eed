"""playbooks/driver_upgrade.yml over the three-node lab (inventories/lab-cluster: GPU containers on pve1 and pve2,
a CPU container on pve3): a driver too old for a venv refused before any change, the check run naming each node,
container and step, a roll stopping at a node whose module does not build for the kernel it boots next with the
nodes after it untouched, the roll going on once that is mended, a second run changing nothing, and NVIDIA's
installer on one node."""

import json
import os

import pytest
from gpufleet.lab import host, manager

from conftest import ROOT, SITE, run_playbook
from test_cluster import CLUSTER, DRIFT, cluster, on, ssh  # noqa: F401 - the module's three-node lab

pytestmark = pytest.mark.lab

UPGRADE = os.path.join(ROOT, 'playbooks', 'driver_upgrade.yml')
NEW, NEWER, NEXT_KERNEL = '580.105.08', '580.126.09', '6.17.2-1-pve'
OLD = {'pve1': '580.95.05', 'pve2': '570.172.08'}


def upgrade(tmp_path, version, *args):
    return run_playbook(open(UPGRADE).read(), tmp_path, '-e', 'gpu_node_driver_version=' + version, *args,
                        inventory=CLUSTER)


def loaded(cluster, node):
    return host.loaded_version(cluster['lab'].on(node))


def status(cluster, node, vmid):
    return on(cluster, node).lxc(vmid).status.current.get()['status']


def ran(result, node, name):
    """The results of the task called name (a role's task's name is prefixed with its role) on node."""
    return [t for t in result.tasks(node) if t['task'].split(' : ')[-1] == name]


def said(result, node):
    """What the plan said on node."""
    (task,) = ran(result, node, 'Say what the upgrade does on this node')
    return task['msg']


def smi(cluster, node):
    import subprocess
    out = subprocess.run([os.path.join(cluster['lab'].on(node).driver_dir, 'bin', 'nvidia-smi')],
                         stdout=subprocess.PIPE, text=True)
    return out.returncode, out.stdout


@pytest.fixture
def nodes(cluster):
    """After the test, its containers gone (they bind the driver bundle of the version they were verified on) and
    the nodes' kernels, drivers and packages as the lab made them."""
    yield cluster
    cluster['pve'].cleanup()
    del cluster['pve'].made[:]
    for name in ('pve1', 'pve2', 'pve3'):
        manager.restore_kernel(cluster['lab'], name)


def test_a_driver_upgrade_is_planned_refused_rolled_stopped_at_a_failing_node_and_finished(nodes, tmp_path):
    cluster, lab = nodes, nodes['lab']
    cluster['pve'].made.extend([221, 222, 223])
    first = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
    assert first.rc == 0, first.failures() or first.stdout[-3000:]
    for name in ('pve1', 'pve2'):
        manager.offer_driver(lab, name, NEW, fails_on=[NEXT_KERNEL] if name == 'pve2' else [])
    # pve2 boots a newer kernel next (the newest installed), for which its current module is built
    manager.install_kernel(lab, 'pve2', NEXT_KERNEL, module='built')
    packages = dict((n, host.read_dpkg(lab.on(n))) for n in ('pve1', 'pve2'))

    # a driver below a profile's floor is refused on the nodes' read, before any change anywhere: the default
    # profile's torch is the CUDA 12.8 build, but its cu13 wheels need the R580 driver, so 570 (above CUDA 12's
    # 525.60.13) is refused too, naming the wheel
    refused = upgrade(tmp_path, '570.172.08', '-e', 'torch_venv_profile=default')
    assert refused.rc != 0
    assert ('pve1: the NVIDIA driver 570.172.08 does not run the venv of every GPU container on it, nothing was '
            "changed: CT 221 (train-c1): the venv profile default needs an NVIDIA driver of at least 580.65.06: its "
            "lock's nvidia-cudnn-cu13==9.19.0.56 is built for CUDA 13") in refused.stdout, refused.failures()
    assert not [t for t in refused.tasks('pve1') + refused.tasks('pve2') if t.get('changed')]
    bad = upgrade(tmp_path, 'latest')
    assert bad.rc != 0 and "gpu_node_driver_version: 'latest' is not an NVIDIA driver version" in bad.stdout
    assert status(cluster, 'pve1', 221) == 'running' and loaded(cluster, 'pve1') == OLD['pve1']
    # a version the nodes' package sources do not offer (apt-cache madison) is refused on every node's read, before
    # anything stops anywhere
    missing = upgrade(tmp_path, NEWER)
    assert missing.rc != 0
    assert ("pve2: the upgrade to 580.126.09 cannot start, nothing was changed: the node's sources offer no 580.126.09 "
            'of libcuda1, libnvidia-ml1, nvidia-driver, nvidia-kernel-dkms (apt-cache madison libcuda1 lists what they '
            'offer') in missing.stdout, missing.failures()
    assert not [t for t in missing.tasks('pve1') + missing.tasks('pve2') if t.get('changed')]
    assert status(cluster, 'pve2', 222) == status(cluster, 'pve1', 221) == 'running'
    assert dict((n, host.read_dpkg(lab.on(n))) for n in ('pve1', 'pve2')) == packages
    # a package of another source that apt would move with the driver (nvidia-modprobe, held by the operator):
    # refused after apt's dry run, before anything stops, saying how to release it
    pve1 = lab.on('pve1')
    host.write_dpkg(pve1, dict(packages['pve1'], **{'nvidia-modprobe': (OLD['pve1'] + '-1', True)}))
    manager.offer_driver(lab, 'pve1', NEW, moves={'nvidia-modprobe': NEW + '-1'})
    held = upgrade(tmp_path, NEW, '--limit', 'pve1')
    assert held.rc != 0
    assert ('apt would move nvidia-modprobe, held on pve1 and not one of the driver\'s packages that the upgrade '
            'moves: release it (apt-mark unhold nvidia-modprobe) or give gpu_node_driver_packages') in held.stdout, \
        held.failures()
    assert status(cluster, 'pve1', 221) == 'running' and loaded(cluster, 'pve1') == OLD['pve1']  # (never stopped)
    assert host.read_dpkg(pve1)['nvidia-modprobe'] == (OLD['pve1'] + '-1', True)
    host.write_dpkg(pve1, packages['pve1'])
    manager.offer_driver(lab, 'pve1', NEW)

    # the check run names each node, its containers and every step, and changes nothing
    check = upgrade(tmp_path, NEW, '--check')
    assert check.rc == 0, check.failures()
    assert said(check, 'pve2').startswith(
        "pve2: NVIDIA driver 570.172.08 -> 580.105.08 with Debian's packages; its GPU containers are down from the "
        'first step to the last: 1. stop CT 222 (train-c2); 2. install the packages libcuda1=580.105.08-1 '
        'libnvidia-ml1=580.105.08-1 nvidia-driver=580.105.08-1 nvidia-kernel-dkms=580.105.08-1 (held again after); '
        '3. build the module for 6.14.11-4-pve (running) and 6.17.2-1-pve (boots next); 4. reboot the node')
    assert 'stop CT 221 (train-c1)' in said(check, 'pve1') and 'verify CT 221 (train-c1)' in said(check, 'pve1')
    assert said(check, 'pve3') == 'pve3: no NVIDIA driver is loaded (a node without GPUs): nothing to upgrade'
    assert [loaded(cluster, n) for n in ('pve1', 'pve2')] == [OLD['pve1'], OLD['pve2']]
    assert dict((n, host.read_dpkg(lab.on(n))) for n in ('pve1', 'pve2')) == packages
    assert status(cluster, 'pve1', 221) == status(cluster, 'pve2', 222) == 'running'

    # the roll (inventory order: pve2, pve3, pve1) stops at pve2, whose module does not build for its next kernel:
    # pve2 keeps its loaded module with its container stopped; pve1 is untouched
    failed = upgrade(tmp_path, NEW)
    assert failed.rc != 0
    why = [f for f in failed.failures() if 'Stop the roll at this node' in f]
    assert len(why) == 1, failed.failures() or failed.stdout[-3000:]
    why = why[0]
    assert ('pve2: the upgrade of its NVIDIA driver to 580.105.08 failed at "Build the module of the new version for '
            'the running kernel and the next one where the install did not"') in why, why
    assert 'Error! Bad return status for module build on kernel: 6.17.2-1-pve (x86_64)' in why
    assert ('The roll stops here: the nodes after it are untouched. pve2 is left as the failed step left it, its GPU '
            'containers (222) stopped. To go back') in why
    assert ('To go back to 570.172.08: apt-get install -y --allow-change-held-packages --allow-downgrades '
            'libcuda1=570.172.08-1 libnvidia-ml1=570.172.08-1 nvidia-driver=570.172.08-1 '
            'nvidia-kernel-dkms=570.172.08-1, reboot the node') in why
    assert status(cluster, 'pve2', 222) == 'stopped' and loaded(cluster, 'pve2') == OLD['pve2']
    # snapshotted before it stopped: after going back to the old driver, gpufleet rollback puts it back as it was
    snaps = [x for x in on(cluster, 'pve2').lxc(222).snapshot.get() if x['name'].startswith('gpufleet-')]
    assert len(snaps) == 1 and snaps[0]['description'].strip() == (
        'gpufleet: before the NVIDIA driver of pve2 moved from 570.172.08 to 580.105.08'), snaps
    assert 'each container was snapshotted before it stopped, where PVE could: gpufleet rollback CT' in why
    assert smi(cluster, 'pve2')[0] == 18  # its userspace is the new one: NVML says "Driver/library version mismatch"
    assert status(cluster, 'pve1', 221) == 'running' and loaded(cluster, 'pve1') == OLD['pve1']
    assert host.read_dpkg(lab.on('pve1')) == packages['pve1']
    assert not [t for t in failed.tasks('pve1') if t.get('changed')]
    # each node's plan and outcome in the run's reports (the gpufleet CLI reads them)
    reports = dict((n, json.loads((tmp_path / 'reports' / 'driver-upgrade' / (n + '.json')).read_text()))
                   for n in ('pve1', 'pve2', 'pve3'))
    assert (reports['pve2']['state'], reports['pve2']['msg']) == ('failed', why.split(' on pve2: ', 1)[1])
    assert 'state' not in reports['pve1'] and reports['pve1']['needed']  # planned, not reached
    assert reports['pve3']['from'] is None
    # a drift check sees what the next boot of pve2 would do
    drift = run_playbook(open(DRIFT).read(), tmp_path, '--check', inventory=CLUSTER)
    found = json.loads((tmp_path / 'reports' / 'drift' / 'summary.json').read_text())
    assert {'module_build_failed', 'driver_not_rebooted'} <= set(item['item'] for item in found['nodes']['pve2']), (
        found, drift.failures())

    # mended as the finding says (the running kernel pinned), the roll goes on: pve2, then pve1, each verified
    manager.install_kernel(lab, 'pve2', host.KERNEL, module=None, pin='pin')
    rolled = upgrade(tmp_path, NEW)
    assert rolled.rc == 0, rolled.failures() or rolled.stdout[-3000:]
    for name, ct in (('pve1', 'train-c1'), ('pve2', 'train-c2')):
        (audit,) = ran(rolled, name, "Audit the container's venv and verify torch")
        report = audit['ansible_facts']['verify_report']
        assert report['ok'] and report['host'] == ct and report['torch']['driver_version'] == NEW, report
    for name, vmid in (('pve1', 221), ('pve2', 222)):
        assert loaded(cluster, name) == NEW and smi(cluster, name)[0] == 0
        assert status(cluster, name, vmid) == 'running'
        assert set(v for v, _held in host.read_dpkg(lab.on(name)).values()) == {NEW + '-1'}
        assert all(held for _v, held in host.read_dpkg(lab.on(name)).values())  # held again
    done = json.loads((tmp_path / 'reports' / 'driver-upgrade' / 'pve1.json').read_text())
    record = json.loads(open(os.path.join(lab.on('pve1').node_files, 'var/lib/gpufleet/driver-upgrade.json')).read())
    assert (done['state'], done['down_seconds']) == ('upgraded', record['down_seconds'])
    assert (record['from'], record['to'], record['containers']) == (OLD['pve1'], NEW, [221])
    assert int(record['down_seconds']) > 0

    # a second run changes nothing; the check run says how long the last upgrade kept the containers down
    again = upgrade(tmp_path, NEW)
    assert again.rc == 0 and all(s['changed'] == 0 for s in again.stats.values()), again.stats
    assert said(again, 'pve1') == ('pve1: runs the NVIDIA driver 580.105.08 already: nothing to do. The last upgrade '
                                   'here (580.95.05 -> 580.105.08) kept its containers down {0} s'.format(
                                       record['down_seconds']))
    # the fleet is whole on the new driver: site changes nothing, the drift check finds nothing
    site = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
    assert site.rc == 0 and all(s['changed'] == 0 for s in site.stats.values()), site.stats
    report = json.loads((tmp_path / 'reports' / 'train-c2.json').read_text())
    assert report['torch']['driver_version'] == NEW
    drift = run_playbook(open(DRIFT).read(), tmp_path, '--check', inventory=CLUSTER)
    found = json.loads((tmp_path / 'reports' / 'drift' / 'summary.json').read_text())
    assert drift.rc == 0 and found['drift'] is False, found


def test_nvidias_installer_on_one_node_and_a_container_that_fails_its_verification_on_the_new_driver(
        nodes, creds, tmp_path):
    """gpu_node_driver_install: run on pve2 alone (--limit): NVIDIA's installer builds its module with DKMS for the
    running kernel only; the upgrade builds it for the kernel the node boots next and reboots. CT 222's venv was
    broken before: it fails its verification on the new driver, so the node fails with CT 222 stopped again; once
    site.yml has repaired the venv, the upgrade has nothing left to do on pve2. Before the fleet is made, the upgrade
    is refused, naming the GPU container that does not exist, and creates nothing."""
    cluster, lab = nodes, nodes['lab']
    cluster['pve'].made.extend([221, 222, 223])
    early = upgrade(tmp_path, NEWER, '-e', 'gpu_node_driver_install=run', '--limit', 'pve2')
    assert early.rc != 0
    assert any('pve2: its GPU containers are not as the fleet says, nothing was changed: CT 222 (train-c2) does not '
               'exist. Make the fleet first (ansible-playbook site.yml), then upgrade' in f
               for f in early.failures()), early.failures() or early.stdout[-3000:]
    assert not ran(early, 'pve2', 'Stop the containers') and loaded(cluster, 'pve2') == OLD['pve2']
    assert 222 not in [g['vmid'] for g in cluster['pve'].api.cluster.resources.get(type='vm')]
    first = run_playbook(open(SITE).read(), tmp_path, inventory=CLUSTER)
    assert first.rc == 0, first.failures() or first.stdout[-3000:]
    pve2 = lab.on('pve2')
    host.write_dpkg(pve2, {})  # a node whose driver came from NVIDIA's installer: no driver packages
    manager.offer_driver(lab, 'pve2', NEWER)
    manager.install_kernel(lab, 'pve2', NEXT_KERNEL, module='built')
    broken = ssh(creds, 'pve2', "pct exec 222 -- sh -c 'rm /root/venv/lib/python3*/site-packages/torch/version.py'")
    assert broken.returncode == 0, broken.stderr
    # NVIDIA's installer cannot unload a module that a running GPU container holds: run by hand, it aborts and
    # changes nothing (the upgrade stops the node's GPU containers, and nvidia-persistenced, before it runs)
    runfile = os.path.join(pve2.node_files, 'root', 'NVIDIA-Linux-x86_64-{0}.run'.format(NEWER))
    held = ssh(creds, 'pve2', 'sh {0} --silent --dkms'.format(runfile))
    assert held.returncode == 1 and "An NVIDIA kernel module 'nvidia' appears to be already loaded" in held.stderr
    assert '(lab: held by CT 222' in held.stderr, held.stderr
    assert host.installed_version(pve2) == OLD['pve2'] and loaded(cluster, 'pve2') == OLD['pve2']
    rolled = upgrade(tmp_path, NEWER, '-e', 'gpu_node_driver_install=run', '--limit', 'pve2')
    assert rolled.rc != 0
    (installer,) = ran(rolled, 'pve2',
                       "Run NVIDIA's installer (run; it builds the module with DKMS for the running kernel)")
    assert installer['changed']
    (built,) = ran(rolled, 'pve2', 'Build the module of the new version for the running kernel and the next one where '
                                   'the install did not')
    assert [r['item'] for r in built['results']] == [NEXT_KERNEL]
    assert host.dkms_built(pve2) == {NEWER: [host.KERNEL, NEXT_KERNEL]}
    why = [f for f in rolled.failures() if 'Stop the roll at this node' in f]
    assert len(why) == 1, rolled.failures() or rolled.stdout[-3000:]
    assert ('pve2: the upgrade of its NVIDIA driver to 580.126.09 failed at "Fail where the container\'s venv or torch '
            'has findings on the new driver": train-c2:') in why[0], why
    assert 'sh NVIDIA-Linux-x86_64-570.172.08.run --silent --dkms' in why[0]
    # the node runs the new driver; its container that failed is stopped again; pve1 was not in the run
    assert loaded(cluster, 'pve2') == NEWER and status(cluster, 'pve2', 222) == 'stopped'
    assert loaded(cluster, 'pve1') == OLD['pve1'] and status(cluster, 'pve1', 221) == 'running'
    # site.yml repairs the venv and starts the container on the new driver; the upgrade has nothing left to do
    repaired = run_playbook(open(SITE).read(), tmp_path, '--limit', 'pve2,gpufleet_running_pve2', inventory=CLUSTER)
    assert repaired.rc == 0, repaired.failures() or repaired.stdout[-3000:]
    assert status(cluster, 'pve2', 222) == 'running'
    again = upgrade(tmp_path, NEWER, '-e', 'gpu_node_driver_install=run', '--limit', 'pve2')
    assert again.rc == 0 and said(again, 'pve2') == 'pve2: runs the NVIDIA driver 580.126.09 already: nothing to do'
    assert all(s['changed'] == 0 for s in again.stats.values()), again.stats
