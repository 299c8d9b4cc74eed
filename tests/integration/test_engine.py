"""An OCI engine inside a GPU container, given the container's GPUs through CDI, for real: a fleet entry with
engine: podman gets the features it needs and Debian's Podman installed with apt in its unprivileged lab container,
and the spec written by cdi_spec from the container's device nodes and its driver bundle, and a nested container, from an image built here from Debian's busybox, started with
--device nvidia.com/gpu=all: it sees exactly the container's GPU nodes (which open with ENXIO, as the lab's GPUs do)
and the driver's libraries; a spec of another driver is found stale and written again."""

import json
import subprocess

import pytest

from conftest import Pve, _api, site
from test_drift import drift, summary
from test_gpu_container_role import entry
from test_pct_connection import inventory, run

pytestmark = pytest.mark.lab

VMID = 361
FLEET = [entry(VMID, 'engine-a', [1, 4], memory=1024, engine='podman')]
# This host's cgroups are v1 and read-only in the container: crun cannot make the nested container's cgroup there,
# so the lab runs it without one (PVE 8 and 9 run cgroup v2 with a delegated subtree, where Podman makes it).
PODMAN = 'podman run --rm --cgroups=disabled --network=none --device nvidia.com/gpu=all localhost/gpufleet-probe '
# The lab's rootfs is an overlay, on which Podman's overlay storage cannot stack ("'overlay' is not supported over
# overlayfs"): its images are kept with vfs here (on PVE's ext4 or ZFS rootfs, overlay).
IMAGE = ("set -e; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends busybox-static "
         ">/dev/null; printf '[storage]\\ndriver = \"vfs\"\\nrunroot = \"/run/containers/storage\"\\n"
         "graphroot = \"/var/lib/containers/storage\"\\n' > /etc/containers/storage.conf; "
         "rm -rf /var/lib/containers/storage /tmp/img; mkdir -p /tmp/img/bin /tmp/img/dev /tmp/img/proc "
         "/tmp/img/sys /tmp/img/usr/lib/x86_64-linux-gnu /tmp/img/usr/bin; cp /bin/busybox /tmp/img/bin/; "
         "for a in sh ls cat true; do ln -s busybox /tmp/img/bin/$a; done; "
         "tar -C /tmp/img -c . | podman import --quiet - localhost/gpufleet-probe >/dev/null")


def sh(cmd):
    return subprocess.run(['pct', 'exec', str(VMID), '--', 'sh', '-c', cmd], capture_output=True, text=True)


@pytest.fixture(scope='module')
def container(tmp_path_factory, creds, lab):
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.append(VMID)
    tmp = tmp_path_factory.mktemp('engine-site')
    result = site(tmp, FLEET)
    assert result.rc == 0, result.failures()
    assert set(pve.ct(VMID).config.get()['features'].split(',')) == {'nesting=1', 'keyctl=1'}
    assert sh('podman --version').stdout.startswith('podman version ')
    built = sh(IMAGE)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    yield pve
    pve.cleanup()


def cdi(tmp_path, creds, check=False):
    inv = inventory(tmp_path, creds, VMID)
    res = run(tmp_path, inv, [{'gpufleet.proxmox.cdi_spec': {}, 'register': 'spec'}], *(['--check'] if check else []))
    return res.task(0, 'ct')


def test_a_nested_container_sees_exactly_the_containers_gpus_and_the_drivers_libraries(container, tmp_path, creds):
    # the run wrote the spec
    again = cdi(tmp_path, creds)
    assert not again.get('failed') and again['changed'] is False and again['findings'] == [], again
    assert again['path'] == '/etc/cdi/nvidia.com-gpu.json'
    assert sh('rm /etc/cdi/nvidia.com-gpu.json').returncode == 0
    written = cdi(tmp_path, creds)
    assert not written.get('failed') and written['changed'] is True, written
    assert [f['check'] for f in written['findings']] == ['cdi_missing']
    # the engine reads the spec: the GPU nodes the container has (its GPUs 1 and 4 of the node, whose minors the node
    # chose), its control nodes, and the driver's libraries at its version
    mine = sorted(n for n in sh('ls /dev').stdout.split() if n.startswith('nvidia'))
    gpus = sorted((n for n in mine if n[len('nvidia'):].isdigit()), key=lambda n: int(n[len('nvidia'):]))
    assert len(gpus) == 2 and len(mine) == 6, mine
    seen = sh(PODMAN + "sh -c 'ls /dev; ls /usr/lib/x86_64-linux-gnu; cat /dev/{0} 2>&1; true'".format(gpus[0]))
    assert seen.returncode == 0, seen.stderr[-2000:]
    names = seen.stdout.split()
    assert sorted(n for n in names if n.startswith('nvidia')) == mine
    assert 'libcuda.so.1' in names and 'libcuda.so.580.95.05' in names
    assert 'No such device or address' in seen.stdout  # ENXIO: the lab's GPUs have no driver behind them
    # one GPU: the container's second, by its number there
    one = sh(PODMAN.replace('gpu=all', 'gpu=1') + "ls /dev")
    assert one.returncode == 0, one.stderr
    assert sorted(n for n in one.stdout.split() if n.startswith('nvidia')) == sorted(set(mine) - {gpus[0]})
    # without the spec the engine knows no such device
    assert sh('mv /etc/cdi/nvidia.com-gpu.json /root/spec.json').returncode == 0
    refused = sh(PODMAN + 'true')
    assert refused.returncode != 0 and 'nvidia.com/gpu=all' in refused.stderr, refused.stderr
    assert sh('mv /root/spec.json /etc/cdi/nvidia.com-gpu.json').returncode == 0


def test_a_spec_of_another_driver_is_stale_in_check_mode_and_written_again(container, tmp_path, creds):
    assert not cdi(tmp_path, creds).get('failed')
    old = sh("sed -i 's/580.95.05/570.172.08/g' /etc/cdi/nvidia.com-gpu.json && " + PODMAN + 'true')
    assert old.returncode != 0 and '570.172.08' in old.stderr  # the engine cannot mount what is gone
    check = cdi(tmp_path, creds, check=True)
    assert not check.get('failed') and check['changed'] is True
    assert check['findings'][0]['check'] == 'cdi_stale' and 'libcuda.so.570.172.08' in check['findings'][0]['msg']
    assert '570.172.08' in sh('cat /etc/cdi/nvidia.com-gpu.json').stdout  # check mode wrote nothing
    fixed = cdi(tmp_path, creds)
    assert not fixed.get('failed') and fixed['changed'] is True
    spec = json.loads(sh('cat /etc/cdi/nvidia.com-gpu.json').stdout)
    assert spec == fixed['spec'], (spec, fixed['spec'])
    assert sh(PODMAN + 'true').returncode == 0


def test_a_stale_spec_is_drift_that_a_check_reports_and_a_plain_run_repairs(container, tmp_path):
    assert sh("sed -i 's/580.95.05/570.172.08/g' /etc/cdi/nvidia.com-gpu.json").returncode == 0
    check = drift(tmp_path, FLEET, '--check', '--skip-tags', 'venv,verify')
    assert check.rc == 0, check.failures()
    items = summary(tmp_path)['containers']['engine-a']
    assert [(i['stage'], i['item']) for i in items] == [('engine', 'cdi_stale')], items
    assert 'libcuda.so.570.172.08' in items[0]['detail']
    assert '570.172.08' in sh('cat /etc/cdi/nvidia.com-gpu.json').stdout  # a check changes nothing
    fix = drift(tmp_path, FLEET, '--skip-tags', 'venv,verify')
    assert fix.rc == 0, fix.failures()
    assert [(i['stage'], i['item']) for i in summary(tmp_path)['containers']['engine-a']] == [('engine', 'cdi_stale')]
    assert '570.172.08' not in sh('cat /etc/cdi/nvidia.com-gpu.json').stdout and sh(PODMAN + 'true').returncode == 0
    clean = drift(tmp_path, FLEET, '--check', '--skip-tags', 'venv,verify')
    assert clean.rc == 0 and summary(tmp_path)['containers'].get('engine-a', []) == [], summary(tmp_path)
