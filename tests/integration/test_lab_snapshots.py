"""The lab's snapshots as PVE's: a snapshot through the API keeps the container's volumes' content and a rollback puts
it back (the container stopped first, started again where asked), each under the container's lock; the config's
`parent` and the snapshot list follow; a snapshot is refused, as PVE refuses it, where a mount point is a host path
(a bind or device mpN), and taken where the same path comes in as a raw lxc.mount.entry line, which is no volume
(pve-container LXC/Config.pm has_feature, pve-storage Storage.pm volume_has_feature)."""

import json
import os

import pytest
from gpufleet.lab.containers import Containers

pytestmark = pytest.mark.lab

LAB = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'inventories', 'lab')


def task(pve, upid):
    """(exitstatus, log lines) of a task once it stopped."""
    st, log = pve.wait(upid)
    return st['exitstatus'], log


def read(node_ssh, vmid, path):
    r = node_ssh('pct exec {0} -- cat {1}'.format(vmid, path))
    return r.stdout if r.returncode == 0 else None


def test_a_snapshot_keeps_the_rootfs_and_a_rollback_puts_it_back(lab, pve, node_ssh):
    pve.create(951, hostname='snappy', unprivileged=1, rootfs='local-lvm:8', mp0='local-lvm:1,mp=/data')
    pve.start(951)
    assert node_ssh("pct exec 951 -- sh -c 'echo before > /root/kept; echo v1 > /data/d; rm /etc/debian_version'"
                    ).returncode == 0
    pve.ok(pve.ct(951).snapshot.post(snapname='first', description='before the change'))
    listed = dict((s['name'], s) for s in pve.ct(951).snapshot.get())
    assert listed['first']['description'] == 'before the change' and listed['current']['parent'] == 'first'
    assert pve.ct(951).config.get()['parent'] == 'first'
    assert 'first' in Containers(lab).snapshots(951)
    # the change: a file rewritten, one made, one of the base removed, the mount point's content changed
    assert node_ssh("pct exec 951 -- sh -c 'echo after > /root/kept; echo new > /root/new; rm /etc/os-release; "
                    "echo v2 > /data/d'").returncode == 0
    assert pve.status(951) == 'running'
    pve.ok(pve.ct(951).snapshot('first').rollback.post(start=1))
    assert pve.status(951) == 'running'
    assert read(node_ssh, 951, '/root/kept') == 'before\n'
    assert read(node_ssh, 951, '/root/new') is None
    assert read(node_ssh, 951, '/etc/debian_version') is None  # removed before the snapshot: still removed
    assert read(node_ssh, 951, '/etc/os-release') is not None  # removed after it: back
    assert read(node_ssh, 951, '/data/d') == 'v1\n'
    # without start, a rollback leaves the container stopped (PVE stops it first)
    pve.ok(pve.ct(951).snapshot('first').rollback.post())
    assert pve.status(951) == 'stopped'
    pve.ok(pve.ct(951).snapshot('first').delete())
    assert [s['name'] for s in pve.ct(951).snapshot.get()] == ['current']
    assert Containers(lab).snapshots(951) == []
    pve.ok(pve.ct(951).snapshot.post(snapname='first'))  # the name is free again
    status, log = task(pve, pve.ct(951).snapshot.post(snapname='first'))
    assert status != 'OK' and "snapshot name 'first' already used" in status + ' '.join(log)


def test_a_host_path_mount_point_blocks_snapshots_and_a_raw_mount_entry_does_not(lab, pve, node_ssh):
    share = os.path.join(lab.root, 'share-snap')
    os.makedirs(share, exist_ok=True)
    pve.create(952, hostname='bound', rootfs='local-lvm:8', mp0='{0},mp=/share'.format(share))
    status, log = task(pve, pve.ct(952).snapshot.post(snapname='one'))
    assert status == 'snapshot feature is not available', (status, log)
    assert [s['name'] for s in pve.ct(952).snapshot.get()] == ['current']
    assert Containers(lab).snapshots(952) == [] and not pve.ct(952).config.get().get('lock')
    # the same directory bound by a raw line (written into the node's config, as PVE's API cannot)
    pve.ct(952).config.put(delete='mp0')
    conf = lab.pve_conf(952)
    with open(conf, 'a') as fh:
        fh.write('lxc.mount.entry: {0} share none bind,create=dir 0 0\n'.format(share))
    pve.start(952)
    assert read(node_ssh, 952, '/proc/mounts') and '/share' in read(node_ssh, 952, '/proc/mounts')
    pve.ok(pve.ct(952).snapshot.post(snapname='one'))
    assert [s['name'] for s in pve.ct(952).snapshot.get()] == ['one', 'current']



def test_storage_that_cannot_snapshot_is_refused_and_the_lock_is_held_while_a_snapshot_runs(lab, pve, node_ssh):
    """A rootfs on a dir storage (a raw image; pve-storage's DirPlugin has snapshots for qcow2 only): PVE
    refuses the snapshot, as for a host path. And while a snapshot runs, the container's config holds the lock
    `snapshot` (pve-guest-common AbstractConfig.pm snapshot_prepare sets it, snapshot_commit clears it)."""
    import threading
    pve.api.storage.post(storage='dirct', type='dir', path=os.path.join(lab.root, 'dirct'), content='rootdir')
    try:
        pve.create(963, hostname='on-dir', rootfs='dirct:4')
        status, log = task(pve, pve.ct(963).snapshot.post(snapname='one'))
        assert status == 'snapshot feature is not available', (status, log)
        assert [s['name'] for s in pve.ct(963).snapshot.get()] == ['current']
    finally:
        pve.cleanup()
        pve.api.storage('dirct').delete()
    pve.create(964, hostname='slow-snap', rootfs='local-lvm:8')
    pve.start(964)
    # 1 GB written in the rootfs: the lab's snapshot copies it, long enough to be seen under its lock (the config is
    # read from before the request until the task ends)
    assert node_ssh('pct exec 964 -- sh -c "head -c 1000000000 /dev/urandom > /root/big"').returncode == 0
    seen, done = [], threading.Event()

    def watch():
        while not done.is_set():
            seen.append(pve.ct(964).config.get().get('lock'))
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        upid = pve.ct(964).snapshot.post(snapname='slow')
        assert task(pve, upid)[0] == 'OK'
    finally:
        done.set()
        watcher.join()
    assert 'snapshot' in seen, sorted(set(map(str, seen)))
    assert not pve.ct(964).config.get().get('lock')


def test_every_container_site_yml_makes_can_be_snapshotted_and_rolled_back(lab, creds, node_ssh, tmp_path):
    """A GPU container (the node's driver bundle bound in) and a CPU one (the node's shares bound in), as site.yml
    makes them: no host-path mount point, the binds raw lines; each is snapshotted through the API, changed, and
    rolled back with its binds in place."""
    from conftest import SITE, Pve, _api, run_playbook
    from test_gpu_container_role import entry
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    fleet = tmp_path / 'fleet.json'
    fleet.write_text(json.dumps({'gpufleet_containers': [entry(953, 'snap-gpu', [0]), entry(954, 'snap-cpu', [])]}))
    pve.made.extend([953, 954])
    try:
        made = run_playbook(open(SITE).read(), tmp_path, '-e', '@' + str(fleet), inventory=LAB)
        assert made.rc == 0, made.failures() or made.stdout[-3000:]
        shares = ('/var/cache/gpufleet/uv', '/opt/gpufleet/wheelhouse')  # the lab node's (gpu_node_shares)
        for vmid, bound in ((953, ('/opt/nvidia-driver',) + shares), (954, shares)):
            config = pve.ct(vmid).config.get()
            assert not [k for k in config if k.startswith('mp')], config
            targets = [line.split()[1] for key, line in config.get('lxc') or [] if key == 'lxc.mount.entry']
            assert sorted(targets) == sorted(t.lstrip('/') for t in bound), config.get('lxc')
            pve.ok(pve.ct(vmid).snapshot.post(snapname='before'))
            assert node_ssh('pct exec {0} -- touch /root/after-snapshot'.format(vmid)).returncode == 0
            pve.ok(pve.ct(vmid).snapshot('before').rollback.post(start=1))
            assert read(node_ssh, vmid, '/root/after-snapshot') is None
            mounts = read(node_ssh, vmid, '/proc/mounts')
            assert all(' {0} '.format(t) in mounts for t in bound), mounts
        assert 'libcuda.so.1' in node_ssh('pct exec 953 -- ls /opt/nvidia-driver/lib').stdout
        # a second run has nothing to change: the lines are there, the containers run
        again = run_playbook(open(SITE).read(), tmp_path, '-e', '@' + str(fleet), inventory=LAB)
        assert again.rc == 0, again.failures() or again.stdout[-3000:]
        raw = [t for t in again.tasks('pve1') if t['task'].endswith("Write the collection's raw lines into the "
                                                                    "configs of this node's containers")]
        assert raw and not raw[0].get('changed'), raw
    finally:
        pve.cleanup()


def snap(play, *args, **options):
    """One lxc_snapshot task's result (it runs with ignore_errors: check failed first)."""
    return play([{'gpufleet.proxmox.lxc_snapshot': options, 'ignore_errors': True}], *args).task(0)


def test_lxc_snapshot_takes_keeps_the_last_n_refuses_first_and_rolls_back(play, pve, node_ssh, lab):
    pve.create(955, hostname='snaps', rootfs='local-lvm:8')
    pve.start(955)
    # the operator's own snapshot, which the collection never deletes
    pve.ok(pve.ct(955).snapshot.post(snapname='mine'))
    check = snap(play, '--check', vmid=955, keep=2)
    assert not check.get('failed'), check.get('msg')
    assert check['changed'] and check['name'].startswith('gpufleet-') and check['removed'] == []
    assert [s['name'] for s in pve.ct(955).snapshot.get()] == ['mine', 'current']  # check mode took none
    taken = []
    for n in range(3):
        res = snap(play, vmid=955, keep=2, name='gpufleet-20261207-00000{0}'.format(n), description='test')
        assert not res.get('failed'), res.get('msg')
        taken.append(res)
        node_ssh('pct exec 955 -- sh -c "echo {0} > /root/step"'.format(n))
    # the third took the first away: the last two of the collection's are kept, and the operator's
    assert taken[2]['removed'] == ['gpufleet-20261207-000000']
    assert sorted(s['name'] for s in pve.ct(955).snapshot.get()) == [
        'current', 'gpufleet-20261207-000001', 'gpufleet-20261207-000002', 'mine']
    # rolled back to the collection's newest (taken when /root/step said 1), started again
    back = snap(play, vmid=955, state='rolled_back')
    assert not back.get('failed') and back['name'] == 'gpufleet-20261207-000002', back
    assert pve.status(955) == 'running' and read(node_ssh, 955, '/root/step') == '1\n'
    # to a named one; and one it does not have is refused, naming those it has
    assert not snap(play, vmid=955, state='rolled_back', name='gpufleet-20261207-000001').get('failed')
    assert read(node_ssh, 955, '/root/step') == '0\n'
    gone = snap(play, vmid=955, state='rolled_back', name='nope')
    assert gone.get('failed') and 'CT 955 has no snapshot nope (it has: mine, gpufleet-' in gone['msg'], gone
    # a host-path mount point: refused before PVE is asked, saying why and what to do
    share = os.path.join(lab.root, 'share-snap')
    os.makedirs(share, exist_ok=True)
    pve.ct(955).config.put(mp0='{0},mp=/share'.format(share))
    refused = snap(play, vmid=955)
    assert refused.get('failed') and refused['msg'] == (
        'CT 955 cannot be snapshotted: its mount point mp0 ({0}) is a host path, which PVE cannot snapshot ("snapshot '
        'feature is not available"): bind the path by a raw lxc.mount.entry line instead, or remove it'.format(share))


def test_gpufleet_rollback_rolls_a_fleet_container_back_and_verifies_the_fleet(lab, creds, node_ssh, tmp_path):
    import subprocess
    import sys
    from conftest import ROOT, SITE, Pve, _api, run_playbook
    from test_gpu_container_role import entry
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    fleet = tmp_path / 'fleet.json'
    fleet.write_text(json.dumps({'gpufleet_containers': [entry(956, 'roll-a', [0])]}))
    pve.made.append(956)
    try:
        made = run_playbook(open(SITE).read(), tmp_path, '-e', '@' + str(fleet), inventory=LAB)
        assert made.rc == 0, made.failures() or made.stdout[-3000:]
        pve.ok(pve.ct(956).snapshot.post(snapname='gpufleet-20261207-010000'))
        # the venv's torch broken after the snapshot: the rollback brings it back, and the fleet verifies
        assert node_ssh("pct exec 956 -- sh -c 'rm /root/venv/lib/python3*/site-packages/torch/version.py'"
                        ).returncode == 0
        cli = [os.path.join(os.path.dirname(sys.executable), 'gpufleet'), 'rollback', '956', '-i', 'inventories/lab',
               '-e', '@' + str(fleet), '--artifacts', str(tmp_path / 'home'), '--json']
        done = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True, timeout=900)
        result = json.loads(done.stdout)
        assert done.returncode == 0 and result['exit_code'] == 0, (result['verdict'], done.stderr[-3000:])
        assert result['verdict'].startswith('clean: verified 1 of 1')
        assert node_ssh('pct exec 956 -- sh -c "ls /root/venv/lib/python3*/site-packages/torch/version.py"'
                        ).returncode == 0
        # none to roll back to: said, nothing changed
        none = subprocess.run(cli[:2] + ['956', 'nope'] + cli[3:], cwd=ROOT, capture_output=True, text=True,
                              timeout=900)
        assert none.returncode == 1 and 'CT 956 has no snapshot nope' in none.stdout + none.stderr
    finally:
        pve.cleanup()


def test_a_venv_switch_that_fails_verification_is_rolled_back_to_the_snapshot_taken_before_it(lab, creds, node_ssh,
                                                                                                tmp_path):
    """site.yml switches a container's venv to a profile whose torch is not what the profile expects: the switch
    waits for a snapshot (check mode names the one it would take), the verification after it fails, the container
    goes back to the snapshot, is started and verified again, and the run fails saying both verdicts."""
    import shutil
    from conftest import ROOT, Pve, _api, site
    from test_gpu_container_role import entry
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.append(957)
    base = os.path.join(ROOT, 'roles', 'torch_venv', 'files', 'profiles', 'cpu')  # the lab's (its wheelhouse's)
    wrong = tmp_path / 'wrong'
    wrong.mkdir()
    shutil.copy(os.path.join(base, 'pyproject.toml'), str(wrong / 'pyproject.toml'))
    # the same wheels under another lock (a new venv, built from the node's warm cache) that promises another torch
    (wrong / 'requirements.lock').write_text(open(os.path.join(base, 'requirements.lock')).read() + '# newer\n')
    (wrong / 'profile.yml').write_text(open(os.path.join(base, 'profile.yml')).read().replace(
        'torch_version: 2.13.0+cpu', 'torch_version: 2.14.0+cpu'))

    def link():
        return node_ssh('pct exec 957 -- readlink /root/venv').stdout.strip()

    try:
        made = site(tmp_path, [entry(957, 'roll-b', [0])], venv=True)
        assert made.rc == 0, made.failures() or made.stdout[-3000:]
        before = link()
        assert [s['name'] for s in pve.ct(957).snapshot.get()] == ['current']  # a first venv: nothing to keep
        fleet = [entry(957, 'roll-b', [0], venv_profile=str(wrong))]
        # check mode names the snapshot a run would take, and takes none
        check = site(tmp_path, fleet, '--check', venv=True)
        said = [t for t in check.tasks('pve1') if 'Say which snapshot each changing container got' in t['task']]
        assert said and 'roll-b (CT 957): would be snapshotted as gpufleet-' in json.dumps(said), said
        assert [s['name'] for s in pve.ct(957).snapshot.get()] == ['current'] and link() == before
        broken = site(tmp_path, fleet, venv=True)
        assert broken.rc != 0
        snaps = [s['name'] for s in pve.ct(957).snapshot.get() if s['name'] != 'current']
        assert len(snaps) == 1 and snaps[0].startswith('gpufleet-'), snaps
        # the switch was made (held, snapshotted, then made), then undone by the rollback
        held = [t for t in broken.tasks('roll-b') if t['task'].endswith('audit the active venv and repair it')]
        assert held[0]['held']['venv'] == held[0]['id'] and held[1]['switched'], held
        assert link() == before and pve.status(957) == 'running'
        summary = json.load(open(str(tmp_path / 'reports' / 'summary.json')))
        (row,) = [r for r in summary['containers'] if r['vmid'] == 957]
        assert row['state'] == 'rolled_back' and not row['ok'], row
        (words,) = row['failures']
        assert words.startswith('its change failed verification (torch_version: expected 2.14.0+cpu, got '
                                '2.13.0+cpu') and words.endswith(
            'rolled back to {0} and started; verified again: ok'.format(snaps[0])), words
        report = json.load(open(str(tmp_path / 'reports' / 'roll-b.json')))
        assert report['ok'] and report['rolled_back']['snapshot'] == snaps[0] and report['rolled_back']['done']
        assert "roll-b (CT 957 on pve1): its change failed verification (" in summary["verdict"], summary["verdict"]
    finally:
        pve.cleanup()


def test_a_driver_change_that_fails_is_rolled_back_to_the_snapshot_taken_before_it(lab, creds, node_ssh, tmp_path):
    """The container's loader config differs from the one its driver step writes (a change of the driver it loads):
    the change waits for a snapshot; the change then fails in the container (its ldconfig cannot write the cache),
    the container goes back to the snapshot - the config the failed change wrote is gone - and is verified again."""
    from conftest import Pve, _api, site
    from test_gpu_container_role import entry
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.append(958)
    conf = '/etc/ld.so.conf.d/000-gpufleet-nvidia.conf'
    fleet = [entry(958, 'roll-c', [0])]
    try:
        made = site(tmp_path, fleet, venv=True)
        assert made.rc == 0, made.failures() or made.stdout[-3000:]
        # the loader's config edited by hand (libcuda still found), and an ldconfig that fails to write its cache
        breaking = ("echo '# edited' >> {0} && mv /sbin/ldconfig /sbin/ldconfig.orig && printf '%s\\n' '#!/bin/sh' "
                    "'case \"$1\" in -p) exec /sbin/ldconfig.orig \"$@\";; esac' "
                    "'echo \"ldconfig: cannot write the cache\" >&2; exit 1' > /sbin/ldconfig && chmod 755 /sbin/ldconfig"
                    ).format(conf)
        assert node_ssh("pct exec 958 -- sh -c '{0}'".format(breaking.replace("'", "'\\''"))).returncode == 0
        edited = read(node_ssh, 958, conf)
        assert edited.endswith('# edited\n')
        broken = site(tmp_path, fleet, venv=True)
        assert broken.rc != 0
        steps = [t for t in broken.tasks('roll-c') if t['task'].endswith('audit the active venv and repair it')]
        assert steps[0]['held'] == {'driver': True, 'venv': None}, steps[0]
        assert steps[1]['failed'] and 'ldconfig failed: ldconfig: cannot write the cache' in steps[1]['msg'], steps[1]
        snaps = [s['name'] for s in pve.ct(958).snapshot.get() if s['name'] != 'current']
        assert len(snaps) == 1 and snaps[0].startswith('gpufleet-'), snaps
        # back at the snapshot: the config the failed change wrote is gone, the hand-edited one is back
        assert read(node_ssh, 958, conf) == edited and pve.status(958) == 'running'
        summary = json.load(open(str(tmp_path / 'reports' / 'summary.json')))
        (row,) = [r for r in summary['containers'] if r['vmid'] == 958]
        assert row['state'] == 'rolled_back', row
        (words,) = row['failures']
        assert words.startswith('its change failed (venv_build: the driver step: ldconfig failed') and words.endswith(
            'rolled back to {0} and started; verified again: ok'.format(snaps[0])), words
    finally:
        pve.cleanup()


def test_a_change_of_a_container_pve_cannot_snapshot_is_refused_unless_the_operator_says_so(lab, creds, node_ssh,
                                                                                              tmp_path):
    """A rootfs on a dir storage, which cannot snapshot: the container's venv switch is refused, saying why and how
    to go on, and the rest of the run is not; with gpu_container_snapshot_optional the switch is made without one.
    A container whose entry asks for a host-path mount point has snapshots off: its switch is made without one."""
    import shutil
    from conftest import ROOT, Pve, _api, site
    from test_gpu_container_role import entry
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.extend([959, 960])
    share = os.path.join(lab.root, 'share-snap')
    os.makedirs(share, exist_ok=True)
    base = os.path.join(ROOT, 'roles', 'torch_venv', 'files', 'profiles', 'cpu')
    newer = tmp_path / 'newer'
    newer.mkdir()
    for f in ('pyproject.toml', 'profile.yml'):
        shutil.copy(os.path.join(base, f), str(newer / f))
    (newer / 'requirements.lock').write_text(open(os.path.join(base, 'requirements.lock')).read() + '# newer\n')
    mounts = {'mp0': '{0},mp=/share'.format(share)}

    def link(vmid):
        return node_ssh('pct exec {0} -- readlink /root/venv'.format(vmid)).stdout.strip()

    pve.api.storage.post(storage='dirct', type='dir', path=os.path.join(lab.root, 'dirct'), content='rootdir')
    try:
        first = [entry(959, 'roll-e', [0], rootfs='dirct:8'), entry(960, 'roll-f', [], mounts=mounts)]
        made = site(tmp_path, first, venv=True)
        assert made.rc == 0, made.failures() or made.stdout[-3000:]
        before = dict((v, link(v)) for v in (959, 960))
        fleet = [dict(e, venv_profile=str(newer)) for e in first]
        refused = site(tmp_path, fleet, venv=True)
        assert refused.rc != 0 and link(959) == before[959]
        (said,) = [t for t in refused.tasks('roll-e') if 'Say that the change is refused' in t['task']]
        assert ("CT 959: its change (the switch of its venv) was not made, since PVE cannot snapshot it first: CT 959 "
                "cannot be snapshotted: rootfs is on storage dirct (dir)") in said['msg'], said
        assert 'gpu_container_snapshot_optional=true makes it without a snapshot' in said['msg']
        summary = json.load(open(str(tmp_path / 'reports' / 'summary.json')))
        rows = dict((r['vmid'], r) for r in summary['containers'])
        assert rows[959]['state'] == 'failed' and 'its change was refused: PVE cannot snapshot it first' in \
            rows[959]['why'] and 'gpu_container_snapshot_optional=true makes it without one' in rows[959]['why']
        # roll-f: snapshots off (its own host-path mount point): switched without one, verified
        assert rows[960]['state'] == 'verified' and link(960) != before[960], rows[960]
        assert [s['name'] for s in pve.ct(960).snapshot.get()] == ['current']
        made = site(tmp_path, fleet, '-e', 'gpu_container_snapshot_optional=true', venv=True)
        assert made.rc == 0, made.failures() or made.stdout[-3000:]
        assert link(959) != before[959] and [s['name'] for s in pve.ct(959).snapshot.get()] == ['current']
    finally:
        pve.cleanup()
        pve.api.storage('dirct').delete()

def test_a_config_change_that_needs_a_restart_is_snapshotted_before_the_restart(lab, creds, tmp_path):
    """nameserver waits in pending on a running container: with restart_on_pending the run snapshots it before it
    writes the change and restarts it (check mode names the snapshot); one on a storage that cannot snapshot gets
    the change written but is not restarted into it, saying why; one whose entry asks for a host-path mount point
    has snapshots off, and is restarted without one."""
    from conftest import Pve, _api, site
    from test_gpu_container_role import entry
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.extend([961, 962, 965])
    share = os.path.join(lab.root, 'share-snap')
    os.makedirs(share, exist_ok=True)
    first = [entry(961, 'cfg-a', [0]), entry(962, 'cfg-b', [], mounts={'mp0': '{0},mp=/share'.format(share)}),
             entry(965, 'cfg-c', [], rootfs='dirct:8')]
    pve.api.storage.post(storage='dirct', type='dir', path=os.path.join(lab.root, 'dirct'), content='rootdir')
    try:
        made = site(tmp_path, first)
        assert made.rc == 0, made.failures() or made.stdout[-3000:]
        # the plan says which containers PVE cannot snapshot, and what follows for each
        (plan,) = [t for t in made.tasks('pve1') if 'Say which containers PVE cannot snapshot' in t['task']]
        said = json.dumps(plan)
        assert 'CT 962: PVE cannot snapshot it (its mount point mp0 ({0}) is a host path'.format(share) in said
        assert 'snapshots are off for it, and its changes are made without one' in said
        assert 'CT 965: PVE cannot snapshot it (rootfs is on storage dirct (dir)' in said
        assert 'a change that needs a snapshot is refused (gpu_container_snapshot_optional=true' in said
        assert 'CT 961' not in said
        changed = [dict(e, nameserver='10.77.0.1', restart_on_pending=True) for e in first]

        def told(result):
            (task,) = [t for t in result.tasks('pve1') if 'Say which containers are snapshotted before the restart'
                       in t['task']]
            return json.dumps(task)
        check = site(tmp_path, changed, '--check')
        assert check.rc == 0, check.failures()
        assert 'CT 961 on pve1: would be snapshotted as gpufleet-' in told(check)
        assert [s['name'] for s in pve.ct(961).snapshot.get()] == ['current']
        run = site(tmp_path, changed)
        assert run.rc == 0, run.failures() or run.stdout[-3000:]
        snaps = [s for s in pve.ct(961).snapshot.get() if s['name'] != 'current']
        assert len(snaps) == 1 and snaps[0]['name'].startswith('gpufleet-'), snaps
        assert 'before a config change that needs a restart (nameserver)' in snaps[0]['description']
        assert pve.ct(961).config.get()['nameserver'] == '10.77.0.1' and pve.status(961) == 'running'
        # the snapshot holds the config from before the change
        assert 'nameserver' not in pve.ct(961).snapshot(snaps[0]['name']).config.get()
        # cfg-b: its own host-path mount point turns snapshots off; restarted into the change without one
        assert ('CT 962 on pve1: restarted into its config change without a snapshot: snapshots are off for it, as '
                'it mounts a host path (mp0 {0})').format(share) in told(run), told(run)
        assert pve.ct(962).config.get()['nameserver'] == '10.77.0.1'
        assert [s['name'] for s in pve.ct(962).snapshot.get()] == ['current']
        # cfg-c: its rootfs on a storage that cannot snapshot: written, not restarted into, said
        assert ('CT 965 on pve1: not restarted into its config change: PVE cannot snapshot it first: rootfs is on '
                'storage dirct (dir)') in told(run), told(run)
        assert [p['key'] for p in pve.ct(965).pending.get() if 'pending' in p] == ['nameserver']
    finally:
        pve.cleanup()
        pve.api.storage('dirct').delete()