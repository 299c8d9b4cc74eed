"""Every Python the templates bring, on the lab, with the real CUDA 13 torch from PyPI (the cu130 profile, one lock
for Python 3.11, 3.12 and 3.13): a container made from PVE's debian-13-standard gets a venv on its Python 3.13,
verified; a debian-12 container whose Python a distribution upgrade replaced (3.11 by 3.13) is found by `gpufleet
drift` and gets its venv built for 3.13 by `drift --fix`, verified; a profile whose lock does not cover a container's
Python is a finding that names the profile, and is refused before anything changes for a template that brings it.

The containers install from PyPI through the lab's NAT (the machine's resolvers and CA bundle, as bench/venv_bench.py
does it): the first build fetches the stack's 4.5 GB once into the node's uv cache."""

import json
import os
import shutil
import subprocess

import pytest

from conftest import ROOT, Pve, _api
from test_cli import as_json, gpufleet
from test_gpu_container_role import entry
from test_venv_starts import items

pytestmark = pytest.mark.lab

A, B, C = 393, 394, 395
DEBIAN_13 = 'local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst'
CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt'
CA_DIR = '/opt/host-ca'


def nameservers():
    with open('/etc/resolv.conf') as fh:
        return ' '.join(line.split()[1] for line in fh if line.startswith('nameserver '))


def online(vmid, hostname, **kw):
    """A CPU container that installs the cu130 profile from PyPI: the machine's resolvers, its CA bundle bound in."""
    return entry(vmid, hostname, [], cores=2, memory=4096, venv_profile='cu130', nameserver=nameservers(),
                 mounts={'mp0': '{0},mp={1},ro=1'.format(os.path.dirname(CA_BUNDLE), CA_DIR)}, **kw)


def write(path, containers):
    ca = os.path.join(CA_DIR, os.path.basename(CA_BUNDLE))
    path.write_text(json.dumps({'gpufleet_containers': containers, 'torch_venv_offline': False,
                                'torch_venv_environment': {'SSL_CERT_FILE': ca, 'PIP_CERT': ca}}))
    return path


def sh(vmid, cmd):
    return subprocess.run(['pct', 'exec', str(vmid), '--', 'sh', '-c', cmd], capture_output=True, text=True)


def report(result, host):
    with open(os.path.join(result['reports'], host + '.json')) as fh:
        return json.load(fh)


@pytest.fixture(scope='module')
def fleet(tmp_path_factory, creds, lab):
    pve = Pve(_api(creds, user='root@pam', password=creds['api_password']), creds['node'])
    pve.made.extend([A, B, C])
    tmp = tmp_path_factory.mktemp('pythons')
    containers = [online(A, 'py-upgrade'), online(B, 'py-trixie', template=DEBIAN_13)]
    fleet_file = write(tmp / 'fleet.json', containers)
    home = tmp / 'home'
    up = gpufleet(home, fleet_file, 'up', '--json')
    result = as_json(up)
    assert up.returncode == 0, (result.get('verdict'), up.stderr[-3000:])
    yield {'pve': pve, 'tmp': tmp, 'file': fleet_file, 'home': home, 'up': result, 'containers': containers, 'lab': lab}
    pve.cleanup()


def test_a_container_made_from_debian_13_gets_a_verified_venv_on_its_python_3_13(fleet):
    rows = dict((r['host'], r) for r in fleet['up']['containers'])
    assert rows['py-trixie']['ok'] and rows['py-trixie']['torch_version'] == '2.11.0+cu130'
    assert report(fleet['up'], 'py-trixie')['torch']['python_version'].startswith('3.13.')
    assert report(fleet['up'], 'py-upgrade')['torch']['python_version'].startswith('3.11.')
    assert sh(B, 'ls /root/venv/lib').stdout.split() == ['python3.13']
    assert sh(B, '. /etc/os-release && echo $VERSION_ID').stdout.strip() == '13'


def test_a_distribution_upgrade_that_replaces_the_python_gets_the_venv_built_for_the_new_one(fleet):
    from gpufleet.lab import manager
    pve = fleet['pve']
    before = sh(A, 'readlink /root/venv').stdout.strip()
    pve.stop(A)
    manager.upgrade_release(fleet['lab'], A, 'trixie')
    pve.start(A)
    assert sh(A, 'readlink -f /usr/bin/python3').stdout.strip() == '/usr/bin/python3.13'
    assert sh(A, '/root/venv/bin/python -c "import torch"').returncode != 0  # 3.13 does not see the 3.11 packages

    check = gpufleet(fleet['home'], fleet['file'], 'drift', '--json')
    result = as_json(check)
    found, row = items(result, 'py-upgrade')
    assert check.returncode == 2 and ('venv', 'python_changed') in found and row['ok'] is False, result
    item = next(i for i in row['drift'] if i['item'] == 'python_changed')
    assert item['detail'].startswith("the container's Python is now 3.13, and the active venv was made for 3.11: build ")
    assert items(result, 'py-trixie')[0] == []  # its neighbour has nothing to repair

    fix = gpufleet(fleet['home'], fleet['file'], 'drift', '--fix', '--json')
    result = as_json(fix)
    assert fix.returncode == 2 and items(result, 'py-upgrade')[1]['ok'] is True, result
    assert report(result, 'py-upgrade')['torch']['python_version'].startswith('3.13.')
    after = sh(A, 'readlink /root/venv').stdout.strip()
    assert after != before and sh(A, 'test -d {0}'.format(before)).returncode == 0  # the 3.11 venv is kept
    assert gpufleet(fleet['home'], fleet['file'], 'drift').returncode == 0


def test_a_profile_that_does_not_cover_the_containers_python_is_named(fleet):
    mine = fleet['tmp'] / 'cu130-py311'
    shutil.copytree(os.path.join(ROOT, 'roles', 'torch_venv', 'files', 'profiles', 'cu130'), mine)
    meta = (mine / 'profile.yml').read_text()
    (mine / 'profile.yml').write_text(meta.replace('python: ["3.11", "3.12", "3.13"]', 'python: ["3.11"]'))
    containers = [dict(e) for e in fleet['containers']]
    containers[0]['venv_profile'] = str(mine)  # py-upgrade runs Python 3.13 now, its template is debian-12's
    narrow = write(fleet['tmp'] / 'narrow.json', containers)

    check = gpufleet(fleet['home'], narrow, 'drift', '--json')
    result = as_json(check)
    found, row = items(result, 'py-upgrade')
    assert check.returncode == 2 and ('venv', 'python_not_locked') in found, result
    item = next(i for i in row['drift'] if i['item'] == 'python_not_locked')
    assert item['detail'] == "the profile cu130-py311 is locked for Python 3.11, but this container's /usr/bin/python3 " \
        "is Python {0}".format(sh(A, 'python3 -c "import platform; print(platform.python_version())"').stdout.strip())
    assert item['fix'] == 'lock the profile for 3.13 too: add "3.13" to python in {0}/profile.yml, then: gpufleet ' \
        'profile lock {0}'.format(mine)
    fix = gpufleet(fleet['home'], narrow, 'drift', '--fix', '--json')
    failed = items(as_json(fix), 'py-upgrade')[1]
    assert fix.returncode == 1 and failed['state'] == 'failed', failed
    assert 'is locked for Python 3.11, but this container' in failed['failures'][0], failed

    # a new container whose template brings 3.13: refused before anything changes
    fresh = write(fleet['tmp'] / 'fresh.json', containers + [dict(online(C, 'py-new', template=DEBIAN_13),
                                                                  venv_profile=str(mine))])
    up = gpufleet(fleet['home'], fresh, 'up')
    assert up.returncode == 1, up.stdout[-3000:]
    assert ('containers[2] (vmid {0}).venv_profile: the profile {1} is locked for Python 3.11, but the template '
            'debian-13-standard_13.1-2_amd64.tar.zst brings Python 3.13: add "3.13" to python in {1}/profile.yml, '
            'then: gpufleet profile lock {1}'.format(C, mine)) in up.stdout + up.stderr
    assert C not in [r['vmid'] for r in fleet['pve'].api.cluster.resources.get(type='vm')]
