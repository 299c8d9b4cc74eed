"""playbooks/drift.yml on the lab: the incident (the cu13-flavour runtime wheels uninstalled from a venv
holding the real CPU torch and a fake torch extension built with gcc), a contaminant package, cores changed
through the API, a devN deleted and a container stopped. --check reports every item and changes nothing;
a plain run repairs all of it and verifies; the next check is clean."""

import json
import os
import shutil
import subprocess

import pytest

from conftest import ROOT, Pve, _api, run_playbook
from fakewheels import FAKES, incident_profile, wheels  # noqa: F401 (a fixture)
from test_gpu_container_role import entry

pytestmark = pytest.mark.lab

A, B = 351, 352
DRIFT = os.path.join(ROOT, 'playbooks', 'drift.yml')
INSTALL = '/opt/gpufleet/uv/0.13.9/bin/uv pip install --python /root/venv/bin/python --offline --no-index ' \
    '--find-links /opt/gpufleet/wheelhouse --no-deps {0}'


def drift(tmp_path, fleet, *args):
    path = tmp_path / 'drift-vars.json'
    path.write_text(json.dumps({'gpufleet_containers': fleet}))
    return run_playbook(open(DRIFT).read(), tmp_path, '-e', '@' + str(path), *args)


def sh(vmid, cmd):
    return subprocess.run(['pct', 'exec', str(vmid), '--', 'sh', '-c', cmd], capture_output=True, text=True)


def flavour():
    out = sh(A, '/root/venv/bin/python -c "import torch, fake_torch; print(fake_torch.FLAVOUR)"')
    return out.stdout.strip() if out.returncode == 0 else 'FAILED'


def summary(tmp_path):
    return json.loads((tmp_path / 'reports' / 'drift' / 'summary.json').read_text())


@pytest.fixture(scope='module')
def fleet(tmp_path_factory, wheels, creds, lab):
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.extend([A, B])
    tmp = tmp_path_factory.mktemp('drift')
    for name in os.listdir(wheels):  # the incident's wheels, into the node's wheelhouse
        shutil.copy(os.path.join(wheels, name), lab.wheelhouse)
    fleet = [entry(A, 'drift-a', [0, 1], memory=2048, venv_profile=incident_profile(str(tmp / 'incident'), wheels)),
             entry(B, 'drift-b', [2], memory=2048)]
    first = drift(tmp, fleet)
    assert first.rc == 0, first.stdout[-4000:]
    yield {'fleet': fleet, 'pve': pve}
    pve.cleanup()
    for name in os.listdir(lab.wheelhouse):
        if name.startswith(FAKES):
            os.unlink(os.path.join(lab.wheelhouse, name))


def test_check_reports_every_injected_item_and_changes_nothing_then_a_run_repairs(fleet, tmp_path, control):
    pve = fleet['pve']
    assert flavour() == 'cu13'
    # the incident, then a contaminant
    assert sh(A, '/opt/gpufleet/uv/0.13.9/bin/uv pip uninstall --python /root/venv/bin/python fake-rt-cu13').returncode == 0
    assert flavour() == 'FAILED'
    assert sh(A, INSTALL.format('fake-contaminant==2.0')).returncode == 0
    # the venv's activate as uv writes it: a job that sources it numbers the GPUs fastest first
    assert sh(A, "grep -qx 'export CUDA_DEVICE_ORDER=PCI_BUS_ID' /root/venv/bin/activate").returncode == 0
    assert sh(A, "sed -i '/CUDA_DEVICE_ORDER/d' /root/venv/bin/activate").returncode == 0
    # cores changed through the API, a devN deleted, a container stopped
    pve.ct(A).config.put(cores=2)  # the fleet says 1
    pve.ct(B).config.put(delete='dev0')
    pve.stop(B)
    # mount points made by hand: mp1 the fleet does not declare, mp2 its entry declares from now on (kept)
    pve.ct(B).config.put(mp1='/tmp,mp=/mnt/hand', mp2='/tmp,mp=/mnt/kept')
    fleet['fleet'][1]['mounts'] = {'mp2': '/tmp,mp=/mnt/kept'}
    control.clear_requests()

    check = drift(tmp_path, fleet['fleet'], '--check', '--diff')
    assert check.rc == 0, check.stdout[-4000:]
    assert control.mutating_requests() == []
    assert flavour() == 'FAILED' and pve.status(B) == 'stopped' and pve.ct(A).config.get()['cores'] == 2
    report = summary(tmp_path)
    assert report['drift'] is True and report['mode'] == 'check'
    a = [(i['stage'], i['item']) for i in report['containers']['drift-a']]
    assert ('container', 'cores') in a
    assert [i['detail'].split()[0] for i in report['containers']['drift-a'] if i['item'] == 'unresolved_library'] == \
        ['libfakeb.so.1', 'libfakec.so.1']  # libfakea.so.1 is there again: the contaminant's bytes
    (collision,) = [i for i in report['containers']['drift-a'] if i['item'] == 'collision']
    assert collision['detail'] == ('nvidia/fakert/lib/libfakea.so.1 is claimed by fake-contaminant, fake-rt-cu12, '
                                   'bytes of fake-contaminant')
    assert ('venv', 'broken_distribution') in a
    assert ('venv', 'extra') in a and ('venv', 'missing_package') in a
    (order,) = [i for i in report['containers']['drift-a'] if i['item'] == 'job_env']
    assert order['detail'].endswith('/bin/activate does not set CUDA_DEVICE_ORDER=PCI_BUS_ID: a job that sources it '
                                    'numbers the GPUs otherwise than nvidia-smi'), order
    cores = [i for i in report['containers']['drift-a'] if i['item'] == 'cores'][0]
    assert (cores['before'], cores['after']) == (2, 1)
    b = [(i['stage'], i['item']) for i in report['containers']['drift-b']]
    assert ('container', 'dev0') in b and ('container', 'power') in b
    (hand,) = [i for i in report['containers']['drift-b'] if i['item'] == 'mp1']
    assert hand['detail'] == ("mp1 (/tmp,mp=/mnt/hand) is not in the fleet definition: a repair removes it; declare it "
                              "in the entry's mounts to keep it")
    assert ('container', 'mp2') not in b
    per_host = json.loads((tmp_path / 'reports' / 'drift' / 'drift-b.json').read_text())
    assert per_host['drift'] is True and per_host['kind'] == 'container'

    fix = drift(tmp_path, fleet['fleet'])
    assert fix.rc == 0, fix.stdout[-4000:]
    assert flavour() == 'cu13'
    assert sh(A, '. /root/venv/bin/activate && test "$CUDA_DEVICE_ORDER" = PCI_BUS_ID').returncode == 0
    assert pve.status(B) == 'running' and pve.ct(A).config.get()['cores'] == 1
    config = pve.ct(B).config.get()
    assert 'dev0' in config and 'mp1' not in config and config['mp2'] == '/tmp,mp=/mnt/kept'
    verified = json.loads((tmp_path / 'reports' / 'summary.json').read_text())
    assert verified['ok'] is True and {r['host'] for r in verified['containers']} == {'drift-a', 'drift-b'}
    assert 'reused' not in host_report(tmp_path, 'drift-a')['torch']  # a repaired venv is verified afresh
    assert 'reused' not in host_report(tmp_path, 'drift-b')['torch']  # and so is a container started again

    clean = drift(tmp_path, fleet['fleet'], '--check')
    assert clean.rc == 0
    assert summary(tmp_path)['drift'] is False, summary(tmp_path)
    assert all(s['changed'] == 0 for s in clean.stats.values()), clean.stats

    # the host-path mount point given up again: PVE can snapshot drift-b before the changes of the tests that follow
    del fleet['fleet'][1]['mounts']
    gone = drift(tmp_path, fleet['fleet'], '-e', 'gpu_container_restart_on_pending=true')
    assert gone.rc == 0 and 'mp2' not in pve.ct(B).config.get(), gone.failures()


def host_report(tmp_path, host):
    return json.loads((tmp_path / 'reports' / (host + '.json')).read_text())


BUILD = "Build the lock's venv beside the active one, switch to it, audit the active venv and repair it"
TAKE = "Take the container's venv read from its node's call"


def test_a_check_reads_each_nodes_venvs_in_one_call_and_says_what_each_container_would(fleet, tmp_path):
    """In a check run each container's venv_build call is recorded and its node runs them all in one call
    (torch_venv_batch); the check reports what the containers' own calls report (torch_venv_batch=false), the
    findings and a failure alike."""
    uninstall = '/opt/gpufleet/uv/0.13.9/bin/uv pip uninstall --python /root/venv/bin/python fake-rt-cu13'
    assert sh(A, uninstall).returncode == 0  # the incident again

    def items():
        return sorted((h, i['stage'], i['item'], i.get('detail')) for h, found in summary(tmp_path)['containers'].items()
                      for i in found)

    def step(run, host, name):
        (found,) = [t for t in run.tasks(host) if t['task'].endswith(name)]
        return found

    batched = drift(tmp_path, fleet['fleet'], '--check')
    assert batched.rc == 0, batched.stdout[-3000:]
    node = step(batched, 'pve1', "Read this node's containers' venvs in one call to the node (the calls they recorded)")
    assert sorted(node['runs']) == ['drift-a', 'drift-b']
    assert all('deferred' in step(batched, h, BUILD) for h in ('drift-a', 'drift-b'))
    took = step(batched, 'drift-a', TAKE)
    assert took['audit']['healthy'] is False and took['changed'] is True
    found = items()
    assert ('drift-a', 'venv', 'missing_package') in [i[:3] for i in found], found

    direct = drift(tmp_path, fleet['fleet'], '--check', '-e', 'torch_venv_batch=false')
    assert direct.rc == 0, direct.stdout[-3000:]
    assert step(direct, 'pve1', "Read this node's containers' venvs in one call to the node (the calls they recorded)"
                )['runs'] == {}  # nothing recorded: each container ran its own call
    built = step(direct, 'drift-a', BUILD)
    assert 'deferred' not in built and built['audit']['findings'] == took['audit']['findings']
    # the node ran the module's entry point without Ansible's module wrapper: the same result all through (but the
    # age of the last verification, read seconds apart)
    def result(r):
        return dict({k: v for k, v in r.items() if k not in ('task', 'invocation')},
                    verified=dict(r['verified'], age_s=None))
    assert result(took) == result(built), (took, built)
    assert items() == found

    # a container whose module cannot run (its python gone): the same finding, from the node's call or its own (a
    # check run reports it as what a repair would change, and goes on with the rest of the fleet)
    assert sh(B, 'mv /usr/bin/python3 /usr/bin/python3.away').returncode == 0
    try:
        failures = []
        for run, name in ((drift(tmp_path, fleet['fleet'], '--check'), TAKE),
                          (drift(tmp_path, fleet['fleet'], '--check', '-e', 'torch_venv_batch=false'), BUILD)):
            found = step(run, 'drift-b', name)
            assert not found.get('failed') and found['changed'] is True, found
            failures.append(found['container_python']['msg'])
            assert not step(run, 'drift-a', name).get('failed')
        assert failures[0] == failures[1] == "the container's Python /usr/bin/python3 is missing", failures
    finally:
        sh(B, 'mv /usr/bin/python3.away /usr/bin/python3')
    fix = drift(tmp_path, fleet['fleet'])
    assert fix.rc == 0, fix.stdout[-3000:]
    assert flavour() == 'cu13'


def test_a_check_reuses_the_last_verification_only_while_what_it_saw_holds(fleet, tmp_path):
    recorded = json.loads(sh(A, 'cat /root/venv/gpufleet-verified.json').stdout)
    # nothing changed since the last passing verification: the check reuses it (no torch import)
    check = drift(tmp_path, fleet['fleet'], '--check')
    assert check.rc == 0, check.stdout[-3000:]
    a = host_report(tmp_path, 'drift-a')
    assert a['ok'] and a['torch']['reused'] is True and a['torch']['verified_at'] == recorded['verified_at']
    assert a['torch']['torch_version'] == recorded['result']['torch_version'] and 0 <= a['torch']['age_s'] <= 3600
    # another expectation is another fingerprint: torch is imported again, and the check reports the failure
    other = drift(tmp_path, fleet['fleet'], '--check', '-e', '{"verify_expect": {"torch_version": "0.0.1"}}')
    assert other.rc == 0, other.stdout[-3000:]
    a = host_report(tmp_path, 'drift-a')
    assert 'reused' not in a['torch'] and not a['ok']
    assert [f['check'] for f in a['torch']['failures']] == ['torch_version']
    assert ('verify', 'torch_version') in [(i['stage'], i['item']) for i in summary(tmp_path)['containers']['drift-a']]
    # verify_max_age=0: always imported
    fresh = drift(tmp_path, fleet['fleet'], '--check', '-e', 'verify_max_age=0')
    assert fresh.rc == 0, fresh.stdout[-3000:]
    a = host_report(tmp_path, 'drift-a')
    assert a['ok'] and 'reused' not in a['torch'] and a['torch']['timings']['import_s'] > 0
    # check mode recorded nothing
    assert json.loads(sh(A, 'cat /root/venv/gpufleet-verified.json').stdout) == recorded


def test_check_reports_the_nodes_uvm_and_share_and_a_containers_driver_then_a_run_repairs(fleet, tmp_path, lab):
    uvm = lab.record()['gpus']['uvm_major']
    cache = lab.path('node', 'var', 'cache', 'gpufleet', 'uv')  # the lab's first gpu_node_shares
    ldconf = '/etc/ld.so.conf.d/000-gpufleet-nvidia.conf'
    os.unlink('/dev/nvidia-uvm-tools')  # the node lost a uvm node
    os.chown(cache, 0, 0)  # and its containers can no longer write to the uv cache they share
    try:
        # B no longer loads the node's driver: its loader config is gone
        assert sh(B, 'rm {0} && ldconfig'.format(ldconf)).returncode == 0
        check = drift(tmp_path, fleet['fleet'], '--check')
        assert check.rc == 0, check.stdout[-4000:]
        assert not os.path.exists('/dev/nvidia-uvm-tools') and sh(B, 'test -e ' + ldconf).returncode != 0
        report = summary(tmp_path)
        assert report['drift'] is True
        assert [i['item'] for i in report['nodes']['pve1']] == ['uvm_node_missing', 'share_owner'], report['nodes']
        assert report['nodes']['pve1'][1]['detail'] == \
            'the shared directory {0} belongs to 0:0, not 100000:100000'.format(cache)
        assert os.stat(cache).st_uid == 0
        (driver,) = [i for i in report['containers']['drift-b'] if i['stage'] == 'driver']
        assert driver['item'] == 'userspace_driver' and driver['detail'] == 'libcuda none but the node runs 580.95.05'
        assert not [i for i in report['containers']['drift-a'] if i['stage'] == 'driver']
        # one entry into the container for its driver and its venv: the venv build's call (recorded, run by the
        # node, taken by the container) made the driver step, handed to it when the container was added; the driver
        # play ran nothing in it
        steps = check.tasks('drift-b')
        (driver_play,) = [p for p in check.data['plays'] if p['name'].startswith('Give each container with GPUs')]
        assert driver_play['tasks'] == [], driver_play['tasks']
        (recorded,) = [t for t in steps if t['task'].endswith(BUILD)]
        (build,) = [t for t in steps if t['task'].endswith(TAKE)]
        assert 'deferred' in recorded, recorded
        assert not build.get('failed') and build['changed'] is True, build
        assert build['driver']['match'] is False and build['driver']['version'] is None
        assert 'driver mismatch' in build['driver']['msg'] and build['driver']['changed_files'] == [ldconf]

        fix = drift(tmp_path, fleet['fleet'])
        assert fix.rc == 0, fix.stdout[-4000:]
        st = os.stat('/dev/nvidia-uvm-tools')
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (uvm, 1)
        assert (os.stat(cache).st_uid, os.stat(cache).st_gid) == (100000, 100000)
        assert sh(B, 'ldconfig -p | grep -q libcuda.so.1').returncode == 0
        assert drift(tmp_path, fleet['fleet'], '--check').rc == 0 and summary(tmp_path)['drift'] is False
    finally:
        os.chown(cache, 100000, 100000)
        if not os.path.exists('/dev/nvidia-uvm-tools'):
            os.mknod('/dev/nvidia-uvm-tools', 0o666 | 0o020000, os.makedev(uvm, 1))
            os.chmod('/dev/nvidia-uvm-tools', 0o666)  # mknod's mode passes through the umask


def play(name, tmp_path, fleet, *args):
    path = tmp_path / 'play-vars.json'
    path.write_text(json.dumps({'gpufleet_containers': fleet}))
    return run_playbook(open(os.path.join(ROOT, 'playbooks', name)).read(), tmp_path, '-e', '@' + str(path), *args)


def test_verify_playbook_changes_nothing(fleet, tmp_path, control):
    control.clear_requests()
    r = play('verify.yml', tmp_path, fleet['fleet'])
    assert r.rc == 0, r.stdout[-3000:]
    assert control.mutating_requests() == []
    assert all(s['changed'] == 0 for s in r.stats.values()), r.stats
    verified = json.loads((tmp_path / 'reports' / 'summary.json').read_text())
    assert verified['ok'] and sorted(c['host'] for c in verified['containers']) == ['drift-a', 'drift-b']


def test_a_container_with_the_fleets_tag_that_the_definition_does_not_name_is_reported_and_left_alone(fleet, tmp_path):
    pve = fleet['pve']
    pve.create(359, hostname='forgotten', tags='gpufleet;team-x')  # once the fleet's, since taken out of the list
    check = drift(tmp_path, fleet['fleet'], '--check')
    assert check.rc == 0, check.stdout[-3000:]
    report = summary(tmp_path)
    assert report['drift'] is False and report['count'] == 0 and report['orphans'] == ['forgotten']  # no drift
    (orphan,) = report['containers']['forgotten']
    assert orphan['left'] is True
    assert (orphan['item'], orphan['vmid'], orphan['node']) == ('orphan', 359, 'pve1')
    assert [i for i in report['containers']['drift-a'] if i['item'] == 'tags'] == []  # the fleet's own carry the tag
    # a repair leaves it as it is: the definition does not name it, so nothing of the run decides its fate
    fix = drift(tmp_path, fleet['fleet'])
    assert fix.rc == 0, fix.stdout[-3000:]
    assert pve.ct(359).config.get()['tags'] == 'gpufleet;team-x'
    assert summary(tmp_path)['containers']['forgotten'][0]['item'] == 'orphan'
    pve.ok(pve.ct(359).delete())
    pve.made.remove(359)
    assert drift(tmp_path, fleet['fleet'], '--check').rc == 0 and summary(tmp_path)['drift'] is False


def test_a_check_and_a_verification_need_only_a_read_only_token(fleet, tmp_path, control):
    # a token as the operators' guide makes it: privilege-separated, PVEAuditor on / (it can read, nothing more)
    control.add_token('auditor', 'auditor-secret', 'PVEAuditor')
    token_only = ['-e', json.dumps({'gpufleet_api_password': '', 'gpufleet_api_token_id': 'auditor',
                                    'gpufleet_api_token_secret': 'auditor-secret'})]
    control.clear_requests()
    check = drift(tmp_path, fleet['fleet'], '--check', *token_only)
    assert check.rc == 0, check.stdout[-3000:]
    assert summary(tmp_path)['drift'] is False
    seen = control.requests()
    # read through the token alone: no password login (a ticket), no request that changes anything
    assert seen and all(method == 'GET' for method, _path, _body in seen), seen
    verified = play('verify.yml', tmp_path, fleet['fleet'], *token_only)
    assert verified.rc == 0, verified.stdout[-3000:]
    assert json.loads((tmp_path / 'reports' / 'summary.json').read_text())['ok']
    # a run that may change things needs root@pam's password (devN): refused before any request that changes
    control.clear_requests()
    repair = drift(tmp_path, fleet['fleet'], *token_only)
    assert repair.rc != 0 and any('root@pam with its password' in f for f in repair.failures()), repair.failures()
    assert control.mutating_requests() == []


def test_teardown_needs_its_confirmation(fleet, tmp_path, control):
    pve = fleet['pve']
    control.clear_requests()
    refused = play('teardown.yml', tmp_path, fleet['fleet'])
    assert refused.rc != 0 and 'gpufleet_teardown_confirm={0},{1}'.format(A, B) in refused.stdout
    wrong = play('teardown.yml', tmp_path, fleet['fleet'], '-e', 'gpufleet_teardown_confirm={0}'.format(A))
    assert wrong.rc != 0 and '(got {0})'.format(A) in wrong.stdout
    # the entry point's argument spec: a confirmation that is not vmids is refused by name
    odd = play('teardown.yml', tmp_path, fleet['fleet'], '-e', 'gpufleet_teardown_confirm=all')
    assert odd.rc != 0 and 'Validation of arguments failed' in odd.stdout, odd.stdout[-3000:]
    assert 'gpufleet_teardown_confirm' in odd.stdout
    dry = play('teardown.yml', tmp_path, fleet['fleet'], '--check')
    assert dry.rc == 0 and dry.stats['pve1']['changed'] == 1
    assert control.mutating_requests() == [] and pve.status(A) == 'running' and pve.status(B) == 'running'
    done = play('teardown.yml', tmp_path, fleet['fleet'], '-e', 'gpufleet_teardown_confirm={0},{1}'.format(A, B))
    assert done.rc == 0, done.stdout[-3000:]
    vmids = [g['vmid'] for g in pve.api.cluster.resources.get(type='vm')]
    assert A not in vmids and B not in vmids


def test_a_node_that_would_lose_its_gpus_at_its_next_boot_or_whose_driver_is_not_held(fleet, tmp_path, lab):
    """The kernel a node boots next without the NVIDIA module (a DKMS build that failed, or none), and driver
    packages an unattended upgrade may replace, are node findings of a check run, each with its fix; a module built
    for that kernel, or the running kernel pinned, is none."""
    from gpufleet.lab import host, manager
    node, upcoming = lab.on('pve1'), '6.17.2-1-pve'

    def node_items():
        check = drift(tmp_path, fleet['fleet'], '--check')
        assert check.rc == 0, check.stdout[-3000:]
        return summary(tmp_path)['nodes'].get('pve1') or []

    try:
        manager.install_kernel(lab, 'pve1', upcoming, module='failed')
        (failed,) = node_items()
        assert failed['item'] == 'module_build_failed' and upcoming in failed['detail'] and 'failed' in failed['detail']
        assert failed['fix'].startswith('read ' + os.path.join(node.node_files, 'var/lib/dkms/nvidia'))
        assert failed['fix'].endswith('proxmox-boot-tool kernel pin ' + host.KERNEL)

        manager.install_kernel(lab, 'pve1', upcoming, module=None)
        shutil.rmtree(os.path.join(node.node_files, 'var/lib/dkms/nvidia', node.driver_version, 'build'))  # none tried
        (missing,) = node_items()
        assert missing['item'] == 'module_missing_next_kernel'
        assert missing['fix'] == 'apt install proxmox-headers-{0} && dkms install nvidia/{1} -k {0}'.format(
            upcoming, node.driver_version)

        manager.install_kernel(lab, 'pve1', host.KERNEL, pin='pin')  # the running kernel pinned: it boots again
        assert node_items() == []
        shutil.rmtree(os.path.join(node.node_files, 'etc', 'kernel'))  # unpinned
        manager.install_kernel(lab, 'pve1', upcoming, module='built')
        assert node_items() == []

        manager.hold_driver(lab, 'pve1', held=False)
        (loose,) = node_items()
        assert loose['item'] == 'driver_not_held'
        assert loose['fix'] == 'apt-mark hold libcuda1 libnvidia-ml1 nvidia-driver nvidia-kernel-dkms'
        # the operator's to act on: a repair run reports it and changes nothing of the node's packages
        fix = drift(tmp_path, fleet['fleet'])
        assert fix.rc == 0 and [i['item'] for i in summary(tmp_path)['nodes']['pve1']] == ['driver_not_held']
    finally:
        manager.restore_kernel(lab, 'pve1')
    assert node_items() == []
