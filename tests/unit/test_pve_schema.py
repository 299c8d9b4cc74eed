"""Container definitions checked against PVE's own schema (_pve_schema, generated; _pvecheck; _lxc_config.validate)."""

import json
import os
import re

import pytest

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _lxc_config, _pve_schema, _pvecheck
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _fleet

HERE = os.path.dirname(os.path.abspath(__file__))
# PVE 9.1's API schema of the LXC paths, as pve-docs publishes it, kept with the tests (they fail without it)
SCHEMA = os.path.join(HERE, 'data', 'pve-9.1-lxc-api.json')
BASE = dict(vmid=977, hostname='ok977', node='pve1', ostemplate='local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst',
            storage='local-lvm', state='present', pve_root='/etc/pve')


def test_the_table_is_what_the_generator_makes_of_the_schema():
    import gen_pve_schema
    with open(SCHEMA) as fh:
        schema = json.load(fh)
    with open(_pve_schema.__file__.replace('.pyc', '.py')) as fh:
        assert fh.read() == gen_pve_schema.render(schema, schema['source'])


def test_every_format_the_table_names_is_checked():
    names = set()

    def walk(entry):
        fmt = entry.get('format')
        if isinstance(fmt, dict):
            for sub in fmt.values():
                walk(sub)
        elif fmt:
            names.add(re.sub(r'-list$', '', fmt))
    for entry in _pve_schema.PROPERTIES.values():
        walk(entry)
    assert names - set(_pvecheck.FORMATS) == set()


@pytest.mark.parametrize('fmt,good,bad', [
    ('pve-lxc-dev-string', ['/dev/nvidia0', '/dev/dri/renderD128', '/dev/..x'],
     ['/dev/../etc/shadow', '/dev/./nvidia0', '/dev/nvidia0/..', '/etc/passwd', 'dev/nvidia0']),
    ('pve-ipv4-config', ['dhcp', 'manual', '10.0.0.5/24', '255.255.255.255/32'],
     ['10.0.0.300/24', '10.0.0.5', '10.0.0.5/33', '10.0.0.5/7', 'static', '010.0.0.5/24']),
    ('pve-ipv6-config', ['auto', 'dhcp', 'fd00::5/64'], ['fd00::5', 'fd00::g/64', 'static']),
    ('mac-addr', ['BC:24:11:00:00:01'], ['BD:24:11:00:00:01', 'BC:24:11:00:00']),
    ('dns-name-list', ['lab.internal', 'a.example b.example'], ['a_b.example', '-a.example']),
    ('lxc-ip-with-ll-iface-list', ['10.0.0.1', '10.0.0.1 fd00::1', 'fe80::1%eth0'], ['10.0.0.256', 'fe80::1%0eth']),
    ('pve-tag-list', ['gpu;train', 'a+b.c'], ['gpu!', 'gpu;-x']),
    ('disk-size', ['8', '8G', '1.5T'], ['8GB', 'G', '-1']),
    ('pve-storage-id', ['local-lvm', 'tank.fast'], ['l', '1local', 'local-']),
])
def test_named_formats_as_pve_checks_them(fmt, good, bad):
    for value in good:
        assert _pvecheck.format_problem(fmt, value) is None, value
    for value in bad:
        assert _pvecheck.format_problem(fmt, value), value


# What PVE refuses (or, for a device path, what real PVE refuses and the lab's fakepve lets through), each with
# the field the message must name.
BAD = [
    ({'features': ['foo=1']}, "features: unknown key 'foo'"),
    ({'features': ['nesting=maybe']}, 'features: nesting: must be a boolean'),
    ({'net': {'net0': 'name=eth0,bridge=vmbr0,ipp=dhcp'}}, "net.net0: unknown key 'ipp'"),
    ({'net': {'net0': 'name=eth0,bridge=vmbr0,ip=10.0.0.300/24'}}, 'net.net0: ip:'),
    ({'net': {'net0': 'bridge=vmbr0,ip=dhcp'}}, 'net.net0: name missing'),
    ({'net': {'net0': {'name': 'eth0', 'tag': 5000}}}, 'net.net0: tag: must be a whole number from 1 to 4094'),
    ({'net': {'net32': 'name=eth0'}}, 'net.net32: PVE has net0 to net31 only'),
    ({'devices': [{'path': '/dev/../etc/shadow'}]}, "devices[0] (dev0): path: '/dev/../etc/shadow' is not a valid"),
    ({'devices': [{'path': '/etc/passwd'}]}, 'devices[0] (dev0): path:'),
    ({'devices': [{'path': '/dev/nvidia0'}, {'path': '/dev/nvidia1', 'mode': '4755'}]}, 'devices[1] (dev1): mode:'),
    ({'devices': [{'path': '/dev/nvidia0', 'uid': -1}]}, 'devices[0] (dev0): uid: must be a whole number of at least 0'),
    ({'devices': ['/dev/nvidia0']}, "devices[0] must be a dict with at least path"),
    ({'devices': '/dev/nvidia0'}, 'devices must be a list of dicts'),
    ({'devices': [{'mode': '0666'}]}, 'devices[0].path: a device under /dev/ is required'),
    ({'memory': 8}, 'memory: must be a whole number of at least 16, got 8'),
    ({'cores': 0}, 'cores: must be a whole number from 1 to 8192'),
    ({'swap': -1}, 'swap: must be a whole number of at least 0'),
    ({'rootfs': '8', 'storage': None}, "rootfs: '8' is a size but names no storage"),
    ({'rootfs': 'size=8G'}, 'rootfs: names no volume'),
    ({'mounts': {'mp0': '8,mp=/data'}}, "mounts.mp0: volume '8' names no storage"),
    ({'mounts': {'mp0': 'local-lvm:8'}}, 'mounts.mp0: mp missing'),
    ({'mounts': {'mp0': '/srv/../etc,mp=/data'}}, 'mounts.mp0: volume:'),
    ({'hostname': 'bad_name!'}, 'hostname:'),
    ({'hostname': 'a' * 64 + '.example'}, 'hostname: '),
    ({'nameserver': '10.0.0.256'}, 'nameserver:'),
    ({'searchdomain': 'lab_internal'}, 'searchdomain:'),
    ({'tags': ['gpu!']}, 'tags:'),
    ({'description': 'x' * 8193}, 'description: may be at most 8192 characters'),
    ({'vmid': 42}, 'vmid: must be a whole number from 100 to 999999999'),
    ({'node': 'pve_1'}, 'node:'),
    ({'lxc_raw': ['cgroup: nope']}, 'lxc_raw[0]'),
]


@pytest.mark.parametrize('bad,words', BAD, ids=[w for _, w in BAD])
def test_bad_values_are_refused_naming_the_container_and_the_field(bad, words):
    spec = dict(BASE, **bad)
    with pytest.raises(_lxc_config.SpecError) as e:
        _lxc_config.validate([spec])
    assert str(e.value).startswith('container (vmid {0}'.format(spec['vmid'])), str(e.value)
    assert words in str(e.value)


def test_good_values_pass():
    _lxc_config.validate([dict(BASE, hostname='train-0.lab.internal', cores=8192, memory=16, swap=0, onboot=True,
                        features=['nesting=1', 'keyctl=yes', 'mount=nfs;cifs'], tags=['gpu', 'train'],
                        net={'net0': 'name=eth0,bridge=vmbr0,ip=10.0.0.5/24,gw=10.0.0.1,ip6=auto',
                             'net31': {'name': 'eth1', 'bridge': 'vmbr1', 'ip': 'dhcp', 'tag': 4094}},
                        mounts={'mp0': '/srv/data,mp=/data,ro=1', 'mp1': 'local-lvm:8,mp=/scratch'},
                        devices=[{'path': '/dev/nvidia0', 'mode': '666', 'uid': 0, 'gid': 0, 'deny_write': False}],
                        rootfs='local-lvm:16', nameserver='10.0.0.1 fe80::1%eth0', searchdomain='lab.internal',
                        lxc_raw=['lxc.cgroup2.devices.allow: c 195:* rw'])])


def test_a_bare_rootfs_size_goes_on_the_storage_option():
    assert _lxc_config.wanted_config(dict(BASE, rootfs='8'))[0]['rootfs'] == 'local-lvm:8'
    assert _lxc_config.wanted_config(dict(BASE, rootfs=8, storage='tank'))[0]['rootfs'] == 'tank:8'


def test_every_problem_of_every_container_at_once():
    fleet = [dict(BASE, vmid=200, memory=8), dict(BASE, vmid=201, hostname='b', devices=['/dev/nvidia0']),
             dict(BASE, vmid=200, hostname='c')]
    with pytest.raises(_lxc_config.SpecError) as e:
        _lxc_config.validate(fleet)
    msg = str(e.value)
    assert msg.startswith('3 problems, nothing was changed: ')
    assert 'containers[0] (vmid 200, hostname ok977): memory: must be a whole number of at least 16' in msg
    assert 'containers[1] (vmid 201, hostname b): devices[0] must be a dict' in msg
    assert 'containers[2]: vmid 200 is also given by containers[0]' in msg


def test_fleet_and_lxc_container_keep_one_set_of_rules():
    nodes = {'gpu01': [0]}
    entry = {'vmid': 200, 'node': 'gpu01'}
    for host in ('train-0', 'train-0.lab.internal'):
        assert _fleet.errors([dict(entry, hostname=host)], nodes) == []
        _lxc_config.validate([dict(BASE, hostname=host)])
    for host in ('a_b', 'a' * 64):
        assert [e.split(':')[0] for e in _fleet.errors([dict(entry, hostname=host)], nodes)] == [
            'containers[0] (vmid 200).hostname']
        with pytest.raises(_lxc_config.SpecError):
            _lxc_config.validate([dict(BASE, hostname=host)])
    assert _fleet.errors([dict(entry, hostname='a', memory=8)], nodes) == [
        'containers[0] (vmid 200).memory: must be a whole number of at least 16, got 8']
    assert _fleet.errors([dict(entry, hostname='a', cores=9000)], nodes) == [
        'containers[0] (vmid 200).cores: must be a whole number from 1 to 8192, got 9000']
    assert _fleet.errors([dict(entry, hostname='a', devices=['/dev/nvidia0'])], nodes)[0].startswith(
        'containers[0] (vmid 200).devices: must be a list of dicts with a path')


def test_one_reading_of_a_property_string_as_pve_splits_it():
    """pve-common JSONSchema.pm parse_property_string: blank parts skipped, key=value with both non-empty and
    nothing stripped, a bare part the default key's value, `key=` refused; _lxc and the schema check read alike."""
    assert _pvecheck.property_pairs('local-lvm:8,mp=/data,,backup=1', 'volume') == [
        ('volume', 'local-lvm:8'), ('mp', '/data'), ('backup', '1')]
    assert _pvecheck.property_pairs('name=eth0, bridge=vmbr0') == [('name', 'eth0'), (' bridge', 'vmbr0')]
    for bad, words in (('name=eth0,bridge=', "'bridge=' has no key or no value"), ('eth0', "'eth0' has no key"),
                       ('=x', "'=x' has no key or no value")):
        with pytest.raises(ValueError, match=re.escape(words)):
            _pvecheck.property_pairs(bad)
        with pytest.raises(_lxc_config.SpecError, match=re.escape(words)):
            _lxc_config.parse_props(bad)
    assert _lxc_config.parse_props('local-lvm:8,mp=/data', 'volume') == {'volume': 'local-lvm:8', 'mp': '/data'}
    net = _pve_schema.PROPERTIES['net']['format']
    assert "'bridge=' has no key or no value" in _pvecheck.props_problem(net, 'name=eth0,bridge=')
