"""What the tool says matches the state, without the lab: device keys that stay put, changes that wait for a restart
said as waiting, orphans with their own exit code, removals said, and the GPUs that any container of a node holds
(read from PVE's configs) never given out."""

import argparse

import pytest

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _gpu, _lxc_config, _pveconf
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _drift, _fleet
from gpufleet.cli import fleet as cli, gpumap, show


def devs(values):
    return dict((k, v) for k, v in values.items() if k.startswith('dev'))


def test_each_device_keeps_its_key_and_a_new_one_takes_a_key_never_used():
    current = {'dev0': 'mode=0666,path=/dev/nvidia3', 'dev1': 'mode=0666,path=/dev/nvidia2',
               'dev2': 'mode=0666,path=/dev/nvidiactl', 'dev3': 'mode=0666,path=/dev/nvidia-uvm', 'cores': 1}
    # the plan lists the GPUs first: a third GPU would push nvidiactl and nvidia-uvm to other keys
    wanted = {'dev0': 'mode=0666,path=/dev/nvidia3', 'dev1': 'mode=0666,path=/dev/nvidia2',
              'dev2': 'mode=0666,path=/dev/nvidia1', 'dev3': 'mode=0666,path=/dev/nvidiactl',
              'dev4': 'mode=0666,path=/dev/nvidia-uvm', 'cores': 1}
    kept = _lxc_config.keep_device_keys(wanted, current)
    assert devs(kept) == dict(devs(current), dev4='mode=0666,path=/dev/nvidia1')
    assert kept['cores'] == 1
    # a GPU taken away frees its key for a later run, not this one (its deletion may wait for a restart)
    fewer = {'dev0': 'mode=0666,path=/dev/nvidia3', 'dev1': 'mode=0666,path=/dev/nvidiactl',
             'dev2': 'mode=0666,path=/dev/nvidia-uvm', 'dev3': 'mode=0666,path=/dev/nvidia0'}
    kept = _lxc_config.keep_device_keys(fewer, current, pending=['dev5'])
    assert devs(kept) == {'dev0': 'mode=0666,path=/dev/nvidia3', 'dev2': 'mode=0666,path=/dev/nvidiactl',
                          'dev3': 'mode=0666,path=/dev/nvidia-uvm', 'dev4': 'mode=0666,path=/dev/nvidia0'}
    sets, deletes, _before, _after = _lxc_config.plan_update(kept, {'dev'}, current)
    assert sets == {'dev4': 'mode=0666,path=/dev/nvidia0'} and deletes == ['dev1']
    # a new container numbers them in order
    assert _lxc_config.keep_device_keys(wanted, {}) == wanted


CONF = """arch: amd64
hostname: old-job
dev0: /dev/nvidia4,mode=0666
dev1: mode=0666,path=/dev/nvidiactl
lxc.mount.entry: /dev/nvidia5 dev/nvidia5 none bind,optional,create=file
tags: gpufleet

[pve:pending]
dev2: path=/dev/nvidia6

[before-upgrade]
dev3: path=/dev/nvidia7
"""


def test_the_gpus_a_container_holds_are_read_from_its_config(tmp_path):
    assert _pveconf.held_nodes(CONF, _gpu.vendor().gpu_node) == ('old-job', ['/dev/nvidia4', '/dev/nvidia5', '/dev/nvidia6'])
    d = tmp_path / 'lxc'
    d.mkdir()
    (d / '299.conf').write_text(CONF)
    (d / '300.conf').write_text('hostname: other\ndev0: path=/dev/nvidia4\n')
    (d / 'notes.txt').write_text('dev0: path=/dev/nvidia0\n')
    held = _pveconf.gpu_holders(str(d), _gpu.vendor().gpu_node)
    assert held['/dev/nvidia4'] == [{'vmid': 299, 'name': 'old-job'}, {'vmid': 300, 'name': 'other'}]
    assert '/dev/nvidia7' not in held and '/dev/nvidia0' not in held  # a snapshot's, and not a config
    assert _pveconf.gpu_holders(str(tmp_path / 'none'), _gpu.vendor().gpu_node) == {}


def test_a_gpu_a_container_outside_the_fleet_holds_is_refused_naming_it():
    nodes = {'gpu01': {'indexes': [0, 1, 2, 3], 'held': {'1': [{'vmid': 299, 'name': 'old-job'}],
                                                         '2': [{'vmid': 201, 'name': 'a'}]}}}
    entries = [{'vmid': 201, 'hostname': 'a', 'node': 'gpu01', 'gpus': [2]},
               {'vmid': 202, 'hostname': 'b', 'node': 'gpu01', 'gpus': [0, 1]}]
    with pytest.raises(_fleet.FleetError) as e:
        _fleet.Fleet(entries, nodes).check()
    assert e.value.problems == [
        'containers[1] (vmid 202).gpus: GPU 1 of node gpu01 is held by CT 299 (old-job), which is not in the fleet: '
        'give this container another GPU, or take the GPU from CT 299 (its devN, then a restart), add CT 299 to the '
        'fleet, or destroy it']
    _fleet.Fleet(entries, nodes, gpu_sharing=True).check()  # sharing asked for: allowed
    # a GPU moved within the fleet (201 held 2, the definition now gives it to 202) is the definition's to decide
    _fleet.Fleet([dict(entries[0], gpus=[3]), dict(entries[1], gpus=[0, 2])], nodes).check()


def test_pending_changes_are_said_as_waiting_and_removals_and_orphans_as_what_they_are():
    res = {'vmid': 201, 'node': 'pve1', 'changed_keys': ['dev6'], 'restart_required': True, 'pending': ['dev6'],
           'status': 'running', 'config': {'dev6': 'mode=0666,path=/dev/nvidia1'}}
    diff = {'before_header': 'CT 201', 'before': {}, 'after': {'dev6': 'mode=0666,path=/dev/nvidia1'}}
    gone = {'vmid': 202, 'node': 'pve1', 'changed': True, 'status': 'absent', 'changed_keys': []}
    reconcile = {'containers': [res, gone], 'diff': [diff, {'before_header': 'CT 202', 'before': {'status': 'running'},
                                                           'after': {'status': 'absent'}}],
                 'orphans': [{'vmid': 299, 'node': 'pve1', 'name': 'old-job', 'status': 'running'}]}
    fleet = [{'vmid': 201, 'hostname': 'a'}, {'vmid': 202, 'hostname': 'b', 'state': 'absent'}]
    check = _drift.fleet({}, reconcile, fleet, {}, None, True)
    a = check['containers']['a']
    assert [(i['item'], i.get('waits')) for i in a] == [('dev6', True), ('restart', True)]
    assert a[0]['detail'] == 'dev6 (/dev/nvidia1) is new; it would wait for a restart of CT 201'
    assert check['containers']['b'][0]['detail'] == 'CT 202 on pve1 is in the fleet with state absent: a run destroys it'
    assert (check['count'], check['waiting'], check['orphans']) == (3, 2, ['old-job'])
    repaired = _drift.fleet({}, reconcile, fleet, {}, None, False)
    assert repaired['containers']['a'][0]['detail'] == 'dev6 (/dev/nvidia1) is new; written, it waits for a restart ' \
        'of CT 201'
    assert repaired['containers']['b'][0]['detail'] == 'CT 202 on pve1 was destroyed (state absent in the fleet)'
    fixed = cli.outcome('drift', True, 'successful', 0, {}, {'ok': True, 'expected': 1, 'verified': 1, 'containers': []},
                        repaired)
    assert fixed['exit_code'] == 2 and fixed['verdict'] == (
        'drift: 1 item(s) repaired; 2 wait for a restart (a), which takes the changes written: restart when their jobs '
        'allow, or let a run do it (restart_on_pending), and the fleet verified as it runs now; 1 orphan(s) left alone '
        "(old-job): containers that carry the fleet's tag outside its definition, their GPUs held")
    only = cli.outcome('drift', True, 'successful', 0, {}, {'ok': True, 'expected': 1, 'verified': 1, 'containers': []},
                       _drift.summary({}, {'old-job': [{'item': 'orphan', 'left': True}]}, False))
    assert only['exit_code'] == 3 and only['verdict'].startswith('clean: verified 1 of 1 container(s), no drift; 1 orphan')


def test_the_gpu_map_names_every_holder_and_says_free():
    result = {'containers': [{'host': 'a', 'node': 'pve1', 'vmid': 201, 'state': 'verified', 'gpus': [0, 1]},
                             {'host': 'b', 'node': 'pve1', 'vmid': 202, 'state': 'missing', 'gpus': [2]}],
              'node_info': {'pve1': {'gpus': [{'index': i, 'uuid': 'GPU-{0}'.format(i), 'held_by': held}
                                              for i, held in ((0, [{'vmid': 201, 'name': 'a'}]), (1, []),
                                                              (2, []), (3, [{'vmid': 299, 'name': 'old-job'}]))]}}}
    assert gpumap.lines(result) == ['pve1 GPU 0 GPU-0: a (CT 201)', 'pve1 GPU 1 GPU-1: a (CT 201)',
                                    'pve1 GPU 2 GPU-2: b (CT 202, missing)',
                                    'pve1 GPU 3 GPU-3: CT 299 old-job, not in the fleet']
    assert [g['free'] for g in gpumap.gpu_map(result)] == [False, False, False, False]
    del result['containers'][1]
    assert gpumap.gpu_map(result)[2]['free'] is True and gpumap.lines(result)[2] == 'pve1 GPU 2 GPU-2: free'
    assert show.drift_line({'stage': 'container', 'item': 'power', 'detail': 'CT 1 is stopped: start it',
                            'before': 'stopped', 'after': 'running'}) == 'container power: CT 1 is stopped: start it'


def test_what_a_run_does_not_mend_is_never_said_repaired():
    found = {'findings': [{'code': 'uvm_node_missing', 'msg': '/dev/nvidia-uvm is missing'},
                          {'code': 'driver_not_held', 'msg': 'the driver packages are not held',
                           'fix': 'apt-mark hold nvidia-driver'}]}
    nodes = {'pve1': _drift.node(found)}
    assert [i.get('yours') for i in nodes['pve1']] == [None, True]
    fixed = cli.outcome('drift', True, 'successful', 0, {}, {'ok': True, 'expected': 1, 'verified': 1, 'containers': []},
                        _drift.summary(nodes, {}, False))
    assert fixed['verdict'] == ('drift: 1 item(s) repaired; 1 left for you to fix, as their lines say (pve1), and the '
                                'fleet verified')
    check = cli.outcome('drift', False, 'successful', 0, {}, {'ok': True, 'expected': 1, 'verified': 1,
                                                               'containers': []}, _drift.summary(nodes, {}, True))
    assert check['verdict'] == ('drift: 2 item(s) found; `gpufleet drift --fix` repairs 1 of them; 1 for you to fix, as '
                                'their lines say (pve1)')


def test_a_limit_naming_a_container_that_joins_during_the_run_is_no_error():
    """Ansible warns of a --limit name it lacks at the start (a container joins the inventory during the run); only
    a pattern that leaves no host at all stops the run, and only that is said as the --limit's or --node's fault."""
    warned = '[WARNING]: Could not match supplied host pattern, ignoring: cli-a\nPLAY RECAP'
    assert cli.known_cause(warned, argparse.Namespace(node=None), 'pve1,cli-a') is None
    stopped = '[ERROR]: Specified inventory, host pattern and/or --limit leaves us with no hosts to target.'
    assert cli.known_cause(stopped, argparse.Namespace(node=None), 'nosuch').startswith('--limit nosuch matches no host')
    assert cli.known_cause(stopped, argparse.Namespace(node=['pve9']), 'x').startswith('--node pve9: no such node')
    assert 'add --vault-password-file' in cli.known_cause('Attempting to decrypt but no vault secrets found', None, None)
