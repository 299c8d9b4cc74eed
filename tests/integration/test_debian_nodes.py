"""Nodes on Debian's own NVIDIA packaging (gpufleet lab up --nodes 3, its default: pve2 a PVE 8 node on bookworm with
Debian's 535 driver, pve3 a PVE 9 node on trixie with its 550). Each node's root is a real Debian root: its
apt-get, apt-cache, apt-mark, dpkg and dkms are Debian's own, the packages Debian's (from the lab's local repository
of them), and DKMS really builds nvidia-current against the headers of the Debian kernel installed there; only the
kernel side (loading the module, /proc/driver/nvidia, nvidia-smi's answers, the device nodes) is the lab's.

Through Ansible, as an operator runs it: discovery reads the node as Debian made it; driver_upgrade.yml refuses,
before any container stops, a version the node's sources do not offer, a way back they no longer offer, the
running kernel without headers, the next one (a PVE kernel) without headers and an unfinished dpkg, each with its fix; it moves the bookworm node to Debian's security update
and back (each package at the Debian version apt offers, the real DKMS build for the node's kernel), and the trixie
node to the backports' revision of the same upstream version."""

import json
import os

import pytest
from gpufleet.lab import host, manager
from gpufleet.lab.host import debnode

from conftest import ROOT, SITE, Pve, _api, run_playbook
from test_gpu_container_role import entry

pytestmark = pytest.mark.lab

LAB = os.path.join(ROOT, 'inventories', 'lab')
UPGRADE = os.path.join(ROOT, 'playbooks', 'driver_upgrade.yml')
BOOKWORM, SECURITY, BACKPORTS = '535.261.03-1', '535.309.01-0+deb12u1', '535.216.03-2~bpo12+1'
TRIXIE, TRIXIE_BPO = '550.163.01-2', '550.163.01-4~bpo13+1'
NEXT_PVE = '6.8.12-16-pve'  # a PVE 8 kernel, newer than bookworm's own 6.1: the one the node boots next
# the packages of the driver's source that a headless node has, as apt installs them
MOVED = ('firmware-nvidia-gsp', 'libcuda1', 'libnvidia-ml1', 'libnvidia-pkcs11-openssl3', 'libnvidia-ptxjitcompiler1',
         'nvidia-alternative', 'nvidia-kernel-dkms', 'nvidia-kernel-support', 'nvidia-smi')


@pytest.fixture(scope='module')
def debian(lab, creds):
    """The lab as `gpufleet lab up --nodes 3` makes it by default (2 GPUs on each Debian node), back to one node after
    (its containers gone first)."""
    manager.up(lab, say=lambda msg: None, nodes=3, gpus='8,2,2', drivers=None)
    specs = dict((s['name'], s) for s in lab.node_specs())
    for node, first in (('pve2', BOOKWORM), ('pve3', TRIXIE)):  # as the lab makes them (an earlier run moved them)
        on = lab.on(node)
        if debnode.offered(on.node_files) != [first] or host.read_dpkg(on).get('libcuda1', [None])[0] != first:
            manager.restore_kernel(lab, node)
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    try:
        yield {'lab': lab, 'pve': pve, 'specs': specs}
    finally:
        pve.cleanup()
        manager.up(lab, say=lambda msg: None, nodes=1)


def node_run(debian, node, *argv):
    """One of Debian's commands on a node, as the node runs it (in its root)."""
    on = debian['lab'].on(node)
    return debnode.run(on.node_files, on, *argv, check=False)


def dpkg(debian, node, names=MOVED):
    """{package: (version, held)} of the driver's packages in the node's dpkg status."""
    found = host.read_dpkg(debian['lab'].on(node))
    return dict((n, found.get(n)) for n in names)


def upgrade(tmp_path, version, *args):
    return run_playbook(open(UPGRADE).read(), tmp_path, '-e', 'gpu_node_driver_version=' + version, *args,
                        inventory=LAB)


def said(result, node):
    (task,) = [t for t in result.tasks(node) if t['task'].endswith('Say what the upgrade does on this node')]
    return task['msg']


def test_the_default_cluster_has_a_bookworm_and_a_trixie_node_read_as_debian_packaged_them(debian, tmp_path):
    assert (debian['specs']['pve2'].get('debian'), debian['specs']['pve3'].get('debian')) == ('bookworm', 'trixie')
    assert debian['specs']['pve1'].get('debian') is None
    found = run_playbook([{'hosts': 'pve2,pve3', 'gather_facts': False, 'tasks': [
        {'ansible.builtin.include_role': {'name': 'gpufleet.proxmox.gpu_node', 'tasks_from': 'discover',
                                          'public': True}}]}], tmp_path, inventory=LAB)
    assert found.rc == 0, found.failures() or found.stdout[-3000:]
    for node, version, package in (('pve2', '535.261.03', BOOKWORM), ('pve3', '550.163.01', TRIXIE)):
        facts = [t for t in found.tasks(node) if t['task'].endswith('Discover the node\'s NVIDIA devices and driver')][
            0]['ansible_facts']['gpufleet_gpu_devices']
        kernels = facts['kernels']
        running = kernels['running_kernel']
        assert running == debnode.kernel(debian['lab'].on(node).node_files) and running.endswith('-amd64')
        assert facts['driver_version'] == version and facts['installed_versions'] == [version]
        # DKMS built Debian's module, named as Debian's packaging names it, against the kernel's real headers
        assert kernels['dkms'] == {version: {'built': [running], 'make_log': None, 'module': 'nvidia-current'}}
        # (trixie's DKMS compresses it as the kernel's own modules are: .ko.xz)
        assert kernels['modules'][running].endswith(('/updates/dkms/nvidia-current.ko', '/nvidia-current.ko.xz'))
        assert kernels['headers'] == {running: True} and kernels['unfinished'] == {} and kernels['runfile'] == []
        assert kernels['packages']['nvidia-kernel-dkms'] == {'version': package, 'held': True,
                                                             'source': 'nvidia-graphics-drivers', 'state': 'installed'}
        assert set(MOVED) <= set(kernels['packages'])
        codes = [f['code'] for f in facts['findings']]
        assert not [c for c in codes if c.startswith('module_') or c in ('driver_not_held', 'driver_not_loaded')], codes


def test_a_bookworm_node_moves_to_debians_security_update_and_back_refused_first_where_it_cannot(debian, tmp_path):
    lab, pve = debian['lab'], debian['pve']
    fleet = tmp_path / 'fleet.json'
    fleet.write_text(json.dumps({'gpufleet_containers': [entry(372, 'deb-a', [0], node='pve2', venv_profile='cpu')]}))
    pve.made.append(372)
    made = run_playbook(open(SITE).read(), tmp_path, '-e', '@' + str(fleet), inventory=LAB)
    assert made.rc == 0, made.failures() or made.stdout[-3000:]
    on = lab.on('pve2')
    running = debnode.kernel(on.node_files)

    def refused(version, why):
        before = dpkg(debian, 'pve2')
        out = upgrade(tmp_path, version, '-e', '@' + str(fleet), '--limit', 'pve2')
        assert out.rc != 0 and why in out.stdout, out.failures() or out.stdout[-3000:]
        assert not [t for t in out.tasks('pve2') if t.get('changed')]
        assert pve.api.nodes('pve2').lxc(372).status.current.get()['status'] == 'running'
        assert dpkg(debian, 'pve2') == before

    # the node's sources (its own repository, as the lab offers them) do not offer the security update yet
    refused('535.309.01', "pve2: the upgrade to 535.309.01 cannot start, nothing was changed: the node's sources "
                          'offer no 535.309.01 of ' + ', '.join(MOVED))
    manager.offer_driver(lab, 'pve2', SECURITY)
    # the suite moved on: the version it runs is no longer offered, so there would be no way back
    debnode.withdraw_version(on, BOOKWORM)
    refused('535.309.01', 'the way back needs ' + ' '.join('{0}={1}'.format(p, BOOKWORM) for p in MOVED))
    manager.offer_driver(lab, 'pve2', BOOKWORM)
    # no headers for the kernel the module is built for (Debian's own apt-get removes them)
    gone = node_run(debian, 'pve2', 'apt-get', 'remove', '-y', 'linux-headers-amd64', 'linux-headers-' + running)
    assert gone.returncode == 0, gone.stdout
    refused('535.309.01', 'kernel {0} has no headers to build the module against: apt install linux-headers-{0}'
            .format(running))
    back = node_run(debian, 'pve2', 'apt-get', 'install', '-y', 'linux-headers-' + running, 'linux-headers-amd64')
    assert back.returncode == 0, back.stdout
    # a PVE kernel installed without its headers (PVE ships them apart, in proxmox-headers-<release>): the node boots
    # it next, and DKMS would have nothing to build the new module against for it
    manager.install_kernel(lab, 'pve2', NEXT_PVE, module=None, headers=False)
    try:
        refused('535.309.01', 'kernel {0} has no headers to build the module against: apt install '
                              'proxmox-headers-{0}'.format(NEXT_PVE))
    finally:
        manager.remove_kernel(lab, 'pve2', NEXT_PVE)
    # dpkg not finished: a package unpacked, not configured (dpkg --audit names it)
    half = node_run(debian, 'pve2', 'dpkg', '--unpack', '/' + debnode.REPO + '/nvidia-smi_{0}_amd64.deb'.format(BOOKWORM))
    assert half.returncode == 0, half.stdout
    refused('535.309.01', 'dpkg has not finished nvidia-smi (unpacked): run dpkg --configure -a')
    assert node_run(debian, 'pve2', 'dpkg', '--configure', '-a').returncode == 0

    # asked first: every package pinned to the Debian version apt offers, the real build for the node's kernel
    before = dpkg(debian, 'pve2')
    check = upgrade(tmp_path, '535.309.01', '-e', '@' + str(fleet), '--limit', 'pve2', '--check')
    assert check.rc == 0, check.failures()
    assert ('install the packages {0} (held again after); 3. build the module for {1} (running)'.format(
        ' '.join('{0}={1}'.format(p, SECURITY) for p in MOVED), running)) in said(check, 'pve2')
    assert dpkg(debian, 'pve2') == before
    # the move: Debian's apt and dpkg, DKMS's real build of nvidia-current 535.309.01, the node rebooted onto it
    rolled = upgrade(tmp_path, '535.309.01', '-e', '@' + str(fleet), '--limit', 'pve2')
    assert rolled.rc == 0, rolled.failures() or rolled.stdout[-3000:]
    after = dpkg(debian, 'pve2')
    assert all(after[p] == (SECURITY, True) for p in MOVED), after
    status = node_run(debian, 'pve2', 'dkms', 'status').stdout
    assert 'nvidia-current/535.309.01, {0}, x86_64: installed'.format(running) in status, status
    assert host.loaded_version(on) == '535.309.01' and debnode.userspace_version(on.node_files) == '535.309.01'
    assert pve.api.nodes('pve2').lxc(372).status.current.get()['status'] == 'running'
    # and back: a downgrade, the module of 535.261.03 built again
    rolled = upgrade(tmp_path, '535.261.03', '-e', '@' + str(fleet), '--limit', 'pve2')
    assert rolled.rc == 0, rolled.failures() or rolled.stdout[-3000:]
    assert all(dpkg(debian, 'pve2')[p] == (BOOKWORM, True) for p in MOVED)
    assert host.loaded_version(on) == '535.261.03'
    assert 'nvidia-current/535.261.03, {0}, x86_64: installed'.format(running) in node_run(
        debian, 'pve2', 'dkms', 'status').stdout


def test_a_trixie_node_moves_to_the_backports_revision_of_the_same_driver(debian, tmp_path):
    lab = debian['lab']
    on = lab.on('pve3')
    manager.offer_driver(lab, 'pve3', TRIXIE_BPO)
    # one upstream version, two Debian builds of it: the node runs it already, and asking for it says so
    same = upgrade(tmp_path, '550.163.01', '--limit', 'pve3')
    assert same.rc == 0 and said(same, 'pve3') == 'pve3: runs the NVIDIA driver 550.163.01 already: nothing to do'
    rolled = upgrade(tmp_path, TRIXIE_BPO, '--limit', 'pve3')
    assert rolled.rc == 0, rolled.failures() or rolled.stdout[-3000:]
    after = dpkg(debian, 'pve3')
    assert all(after[p] == (TRIXIE_BPO, True) for p in MOVED), after
    assert host.loaded_version(on) == '550.163.01'
    again = upgrade(tmp_path, TRIXIE_BPO, '--limit', 'pve3')
    assert again.rc == 0 and 'nothing to do' in said(again, 'pve3')
