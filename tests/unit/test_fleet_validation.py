"""_fleet.errors: the exact sentences and their order (users and the role's messages depend on the wording)."""

import os

import pytest

from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _fleet, _verdict

NODES = {'gpu01': [0, 1, 2, 3], 'util01': [], 'nogpu': None}
KNOWN = ('vmid, hostname, node, gpus, cores, memory, swap, rootfs, net, template, storage, unprivileged, features, '
         'tags, description, onboot, mounts, devices, state, venv_profile, nameserver, searchdomain, gpu_mode, gpu_gid, '
         'restart_on_pending, shm_mb, nofile, rdma, engine')


def test_every_key_checked_in_order_unknown_keys_first():
    entry = {'vmid': 'x', 'hostname': 5, 'node': '', 'cores': '4', 'memory': 8, 'swap': True,
             'devices': ['/dev/nvidia0'], 'features': 'nesting=1', 'tags': {}, 'unprivileged': 'yes', 'onboot': None,
             'nameserver': ' ', 'searchdomain': ['a'], 'net': 'name=eth0', 'rootfs': 0, 'gpus': 'first',
             'gpu_mode': 666, 'gpu_gid': -1, 'zzz': 1, 'cpu': 2}
    assert _fleet.errors([entry], NODES) == [
        'containers[0] (vmid x).cpu: unknown key (known: {0})'.format(KNOWN),
        'containers[0] (vmid x).zzz: unknown key (known: {0})'.format(KNOWN),
        "containers[0] (vmid x).vmid: must be a whole number from 100 to 999999999, got 'x'",
        'containers[0] (vmid x).hostname: must be a string, got 5',
        'containers[0] (vmid x).node: required',
        "containers[0] (vmid x).cores: must be a whole number, got '4'",
        'containers[0] (vmid x).memory: must be a whole number of at least 16, got 8',
        'containers[0] (vmid x).swap: must be a whole number, got True',
        "containers[0] (vmid x).devices: must be a list of dicts with a path ([{path: /dev/nvidia0}]), "
        "got ['/dev/nvidia0']",
        "containers[0] (vmid x).features: must be a list, got 'nesting=1'",
        'containers[0] (vmid x).tags: must be a list, got {}',
        "containers[0] (vmid x).unprivileged: must be true or false, got 'yes'",
        'containers[0] (vmid x).onboot: must be true or false, got None',
        "containers[0] (vmid x).nameserver: must be a string (space-separated for several), got ' '",
        "containers[0] (vmid x).searchdomain: must be a string (space-separated for several), got ['a']",
        "containers[0] (vmid x).net: 'name=eth0' names no bridge (bridge=vmbr0)",
        'containers[0] (vmid x).rootfs: a size in GiB or a PVE volume spec, got 0',
        "containers[0] (vmid x).gpus: must be a list of GPUs (each an index as nvidia-smi counts them, a UUID GPU-... "
        "or a PCI bus id such as 0000:3b:00.0) or 'all', got 'first'",
        "containers[0] (vmid x).gpu_mode: must be an octal mode as a string, as '0666' or '0660', got 666",
        'containers[0] (vmid x).gpu_gid: must be a group id of the container (a whole number, 0 or more), got -1',
    ]


def test_required_keys_are_named_the_others_only_where_given():
    assert _fleet.errors([{}], NODES) == ['containers[0].vmid: must be a whole number from 100 to 999999999, got None',
                                          'containers[0].hostname: required', 'containers[0].node: required']
    assert _fleet.errors([{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'cores': None, 'net': None}], NODES) == []
    assert _fleet.errors('x', NODES) == ['containers must be a list of container definitions']


def test_checks_across_entries_follow_the_value_they_concern():
    fleet = [{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': [0, 1]},
             {'vmid': 200, 'hostname': 'A', 'node': 'gpu01', 'gpus': [1, 7]},
             {'vmid': 201, 'hostname': 'b', 'node': 'pve9', 'gpus': 'all'},
             {'vmid': 202, 'hostname': 'c', 'node': 'util01', 'gpus': [0]},
             {'vmid': 203, 'hostname': 'd', 'node': 'nogpu', 'gpus': [2, 2]},
             'train-0']
    assert _fleet.errors(fleet, NODES) == [
        'containers[1] (vmid 200).vmid: 200 is also the vmid of containers[0]',
        'containers[1] (vmid 200).hostname: A is also the hostname of containers[0]',
        'containers[1] (vmid 200).gpus: GPU 1 of node gpu01 is already given to containers[0] '
        '(set gpu_container_gpu_sharing: true to share GPUs)',
        'containers[1] (vmid 200).gpus: node gpu01 has no GPU 7 (it has [0, 1, 2, 3])',
        'containers[2] (vmid 201).node: pve9 is not a node of the inventory (pve_nodes: gpu01, nogpu, util01)',
        'containers[3] (vmid 202).gpus: node util01 has no GPU 0 (it has none); gpu01 would fit (GPU 0)',
        'containers[4] (vmid 203).gpus: lists a GPU twice: [2, 2]',
        'containers[5] must be a dict, got str',
    ]


DEVN_OLD = 'passthrough devn needs PVE 8.1 or later; node {node} runs 8.0.2 (use gpu_container_passthrough: raw, or auto)'
TOKEN = ('GPU passthrough (devN) can only be set by root@pam with its password; the API login is a token. '
         'Set gpufleet_api_user: root@pam and gpufleet_api_password (from a vault) for provisioning runs.')


@pytest.mark.parametrize('pve,passthrough,is_root_password,problem', [
    ('8.0.2', 'devn', True, DEVN_OLD),
    ('8.0.2', 'auto', False, None),   # raw lines there
    ('8.0.2', 'raw', False, None),
    ('8.4.1', 'auto', False, TOKEN),
    (None, 'devn', False, TOKEN),
    ('8.4.1', 'devn', True, None),
])
def test_passthrough_is_checked_for_containers_with_gpus_or_devices(pve, passthrough, is_root_password, problem):
    fleet = [{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': [0]},
             {'vmid': 201, 'hostname': 'b', 'node': 'util01', 'devices': [{'path': '/dev/fuse'}]},
             {'vmid': 202, 'hostname': 'c', 'node': 'util01'}]
    got = _fleet.errors(fleet, NODES, pve, is_root_password, False, passthrough)
    assert got == ([] if problem is None else ['containers[0] (vmid 200).gpus: ' + problem.format(node='gpu01'),
                                               'containers[1] (vmid 201).gpus: ' + problem.format(node='util01')])


def test_each_node_is_checked_against_its_own_version():
    """A cluster being upgraded: gpu01 runs PVE 8.0 (no devN), util01 PVE 9; in auto mode each node gets its own
    passthrough, and devn is refused only for the node that cannot have it."""
    fleet = [{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': [0]},
             {'vmid': 201, 'hostname': 'b', 'node': 'util01', 'devices': [{'path': '/dev/fuse'}]}]
    versions = {'gpu01': '8.0.2', 'util01': '9.1.1'}
    assert _fleet.errors(fleet, NODES, versions, True, False, 'devn') == [
        'containers[0] (vmid 200).gpus: ' + DEVN_OLD.format(node='gpu01')]
    assert _fleet.errors(fleet, NODES, versions, True, False, 'auto') == []
    plan = _fleet.Fleet(fleet, {'gpu01': {'indexes': [0, 1]}, 'util01': {'indexes': []}},
                        defaults={'state': 'started'}).plan(versions)
    assert plan['passthrough'] == 'mixed' and plan['passthrough_nodes'] == {'gpu01': 'raw', 'util01': 'devn'}
    assert [c['state'] for c in plan['containers']] == ['present', 'started']  # raw lines first, on gpu01 only
    assert plan['raw'] == {'gpu01': {200: plan['raw']['gpu01'][200]}, 'util01': {201: []}}
    assert plan['raw']['gpu01'][200] and plan['wanted'][0]['devices'] == []
    assert plan['wanted'][1]['devices'] == [{'path': '/dev/fuse'}]


def test_a_node_that_is_not_a_name_is_a_problem_not_a_crash():
    nodes = {'pve1': [0, 1]}
    for node in (['pve1'], {'name': 'pve1'}):
        problems = _fleet.errors([{'vmid': 200, 'hostname': 'a', 'node': node, 'gpus': [0]}], nodes)
        assert problems == ['containers[0] (vmid 200).node: must be the name of a node, got {0!r}'.format(node)]
    assert _fleet.errors([{'vmid': 200, 'hostname': 'a', 'node': [], 'gpus': [0]}], nodes) == [
        'containers[0] (vmid 200).node: required']


def gpu(index, minor):
    return {'index': index, 'minor': minor, 'uuid': 'GPU-1ab0c0de-0000-4000-8000-{0:012d}'.format(index),
            'pci_bus_id': '00000000:{0:02X}:00.0'.format(0x18 + index * 0x10)}


def test_gpus_named_by_uuid_or_bus_id_are_their_nodes_indexes_this_run():
    node = {'indexes': [0, 1, 2, 3], 'minors': {0: 3, 1: 2, 2: 1, 3: 0}, 'gpus': [gpu(i, 3 - i) for i in range(4)]}
    fleet = [{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': ['GPU-1AB0C0DE-0000-4000-8000-000000000002', 0]},
             {'vmid': 201, 'hostname': 'b', 'node': 'gpu01', 'gpus': ['0000:28:00.0', '48:00.0']}]
    plan = _fleet.Fleet(fleet, {'gpu01': node})
    plan.check()
    assert [plan.gpus_of(e) for e in plan.containers] == [[2, 0], [1, 3]]
    # their device nodes are the minors of those cards
    assert plan.hosts()[200]['gpus'] == [2, 0] and [g['index'] for g in plan.hosts()[201]['gpu_info']] == [1, 3]
    # the cards renumbered (the card at index 2 is now at index 0 and the other way round): a name follows its card,
    # an index stays a position
    named = {'vmid': 202, 'hostname': 'c', 'node': 'gpu01', 'gpus': ['GPU-1ab0c0de-0000-4000-8000-000000000002', 3]}
    swapped = dict(node, gpus=[dict(gpu(i, 3 - i), uuid=gpu({0: 2, 2: 0}.get(i, i), 0)['uuid']) for i in range(4)])
    assert [_fleet.Fleet([named], {'gpu01': n}).containers[0]['gpus'] for n in (node, swapped)] == [[2, 3], [0, 3]]


def test_a_gpu_name_the_node_lacks_or_one_card_twice_is_refused_before_anything_changes():
    node = {'indexes': [0, 1], 'minors': {0: 1, 1: 0}, 'gpus': [gpu(0, 1), gpu(1, 0)]}
    fleet = [{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': ['GPU-1ab0c0de-0000-4000-8000-000000000009']},
             {'vmid': 201, 'hostname': 'b', 'node': 'gpu01', 'gpus': [1, '00000000:28:00.0']},
             {'vmid': 202, 'hostname': 'c', 'node': 'gpu01', 'gpus': ['GPU-nope']}]
    with pytest.raises(_fleet.FleetError) as e:
        _fleet.Fleet(fleet, {'gpu01': node}).check()
    assert e.value.problems == [
        'containers[0] (vmid 200).gpus: node gpu01 has no GPU GPU-1ab0c0de-0000-4000-8000-000000000009 (it has [0, 1])',
        'containers[1] (vmid 201).gpus: lists a GPU twice: [1, 1]',
        "containers[2] (vmid 202).gpus: must be a list of GPUs (each an index as nvidia-smi counts them, a UUID GPU-... "
        "or a PCI bus id such as 0000:3b:00.0) or 'all', got ['GPU-nope']",
    ]


def test_a_node_version_that_cannot_be_read_is_named_not_guessed():
    fleet = [{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': [0]}]
    with pytest.raises(_fleet.FleetError) as e:
        _fleet.Fleet(fleet, {'gpu01': {'indexes': [0]}}).check({'gpu01': 'pve-manager/unknown'})
    assert e.value.problems[0] == ("node gpu01: its PVE version 'pve-manager/unknown' (GET /nodes/gpu01/version) is "
                                   'not one this collection can read (it reads major.minor, as 9.0.10)')
    _fleet.Fleet(fleet, {'gpu01': {'indexes': [0]}}).check({'gpu01': '9.1.1'})


def test_a_host_path_mount_point_is_refused_before_pve_refuses_a_token():
    fleet = [{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': [],
              'mounts': {'mp0': '/srv/data,mp=/data', 'mp1': 'local-lvm:8,mp=/scratch'}}]
    nodes = {'gpu01': {'indexes': [0]}}
    with pytest.raises(_fleet.FleetError) as e:
        _fleet.Fleet(fleet, nodes).check('9.1.1', root=False)
    assert e.value.problems == [
        'containers[0] (vmid 200).mounts: mp0 is a host path, which only root@pam with its password may set (PVE: '
        '"mount point type bind is only allowed for root@pam"), and this run logs in with a token: give '
        'gpufleet_api_password, or bind the path by a raw lxc.mount.entry line']
    _fleet.Fleet(fleet, nodes).check('9.1.1', root=True)
    plan = _fleet.Fleet(fleet, nodes).plan('9.1.1')
    assert plan['snapshots'][200].startswith('its mount point mp0 (/srv/data) is a host path')


def test_every_key_the_controller_reads_of_a_fleet_entry_is_one_an_entry_can_have():
    """A fleet entry is read as `entry` (and `e`, `planned.entry`) wherever the controller's code reads one: each key
    read so is one of ENTRY_KEYS, so that a key no entry carries (the profile read as `profile` where the entry says
    `venv_profile`) fails here instead of reading None for ever."""
    import glob
    import re
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    files = [p for pattern in ('plugins/plugin_utils/*.py', 'plugins/action/*.py', 'src/gpufleet/cli/*.py')
             for p in glob.glob(os.path.join(root, pattern))]
    read = re.compile(r"\bentry(?:\.get\(|\[)'([a-z_]+)'")
    seen = {}
    for path in files:
        with open(path) as fh:
            for key in read.findall(fh.read()):
                seen.setdefault(key, set()).add(os.path.basename(path))
    assert len(seen) > 8  # the scan finds them
    unknown = dict((k, sorted(v)) for k, v in seen.items() if k not in _fleet.ENTRY_KEYS)
    assert unknown == {}


def test_an_unverified_containers_row_names_its_entrys_venv_profile():
    verdict = _verdict.fleet([], [{'hostname': 'a', 'vmid': 1, 'node': 'pve1', 'venv_profile': 'cpu'}],
                             {'containers': [{'vmid': 1, 'node': 'pve1', 'status': 'stopped'}]})
    assert verdict['containers'][0]['profile'] == 'cpu' and verdict['containers'][0]['state'] == 'stopped'


def test_a_container_whose_gpus_a_redirecting_bridge_stands_between_is_named_in_the_plan():
    # gpu_devices' pcie as Ansible hands it back (its GPU indexes as strings): GPUs 0 and 1 below one switch whose
    # downstream ports redirect peer to peer, GPU 2 and 3 below another that does not
    rr = ['SV', 'RR', 'CR', 'UF']
    pcie = {'gpus': {'0': {'bridges': [{'bdf': '0000:02:00.0', 'acs': rr}, {'bdf': '0000:01:00.0', 'acs': []}]},
                     '1': {'bridges': [{'bdf': '0000:02:01.0', 'acs': rr}, {'bdf': '0000:01:00.0', 'acs': []}]},
                     '2': {'bridges': [{'bdf': '0000:82:00.0', 'acs': ['SV']}, {'bdf': '0000:81:00.0', 'acs': []}]},
                     '3': {'bridges': [{'bdf': '0000:82:01.0', 'acs': ['SV']}, {'bdf': '0000:81:00.0', 'acs': []}]}}}
    node = {'indexes': [0, 1, 2, 3], 'pcie': pcie}
    fleet = [{'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'gpus': [0, 1]},
             {'vmid': 201, 'hostname': 'b', 'node': 'gpu01', 'gpus': [2, 3]},
             {'vmid': 202, 'hostname': 'c', 'node': 'gpu01', 'gpus': [0]}]
    plan = _fleet.Fleet(fleet, {'gpu01': node}).plan()
    assert plan['p2p_blocked'] == {200: [{'gpus': [0, 1], 'bridge': '0000:02:00.0', 'acs': rr},
                                         {'gpus': [0, 1], 'bridge': '0000:02:01.0', 'acs': rr}]}
    assert _fleet.Fleet(fleet, {'gpu01': {'indexes': [0, 1, 2, 3]}}).plan()['p2p_blocked'] == {}  # path unknown


def test_an_engine_is_one_the_collection_installs_and_needs_a_login_that_may_set_its_features():
    entry = {'vmid': 200, 'hostname': 'a', 'node': 'gpu01', 'engine': 'podman'}
    assert _fleet.errors([entry], NODES) == []
    assert _fleet.errors([dict(entry, engine='lxd')], NODES) == [
        "containers[0] (vmid 200).engine: must be one of podman (an OCI engine from the container's own packages), "
        "got 'lxd'"]
    with pytest.raises(_fleet.FleetError) as refused:
        _fleet.Fleet([entry], {'gpu01': {'indexes': []}}).check(root=False)
    assert str(refused.value).count('engine: ') == 1
    assert 'containers[0] (vmid 200).engine: podman needs the features nesting=1,keyctl=1' in str(refused.value)
    _fleet.Fleet([entry], {'gpu01': {'indexes': []}}).check(root=True)
    assert _fleet.engine_features(['nesting=0', 'fuse=1']) == ['fuse=1', 'nesting=1', 'keyctl=1']
    spec = _fleet.Fleet([entry], {'gpu01': {'indexes': []}}).spec(entry, 'devn')
    assert spec['features'] == ['nesting=1', 'keyctl=1']
