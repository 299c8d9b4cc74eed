# -*- coding: utf-8 -*-
"""The drift report in words (plugin_utils _drift), judged whole: every item of a node, of a container's config and
power, of a running container's driver, venv and verification, and the summary's counts, in check mode and in a
repair run. A renamed key, a flipped flag or a lost item fails here."""

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _gpu
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _drift

FLEET = [{'vmid': 201, 'hostname': 'train-a'}, {'vmid': 202, 'hostname': 'train-b'}, {'vmid': 203, 'hostname': 'util'}]
DEVICES = {'pve1': {'gpus': [{'index': 0}, {'index': 1}], 'driver_version': '580.95.05'},
           'pve2': {'gpus': [{'index': 0}], 'driver_version': '580.95.05'},
           'pve3': {'gpus': [{'index': 0}, {'index': 1}]}}
# lxc_container's result: CT 201 moved to pve3 (no driver there) with config drift, one change pending; CT 202 to be
# made; CT 203 to be destroyed; CT 204 (outside the definition's names) rebooted into a pending change; two orphans,
# one of them named as a container of the fleet
RECONCILE = {
    'containers': [
        {'vmid': 201, 'changed': True, 'status': 'running', 'changed_keys': ['cores', 'dev0', 'dev1', 'lxc', 'mp0', 'node'],
         'pending': ['cores'], 'restart_required': True},
        {'vmid': 202, 'changed': True, 'created': True, 'status': 'running', 'power': 'start'},
        {'vmid': 203, 'changed': True, 'status': 'absent', 'node': 'pve2'},
        {'vmid': 204, 'changed': True, 'status': 'running', 'changed_keys': ['dev2', 'memory'], 'pending': ['memory'],
         'restart_required': False, 'power': 'reboot', 'config': {'dev2': '/dev/nvidia-uvm-tools,mode=0666'}}],
    'diff': [
        {'before_header': 'CT 201',
         'before': {'cores': 2, 'dev0': 'path=/dev/nvidia3,mode=0666', 'dev1': '/dev/fuse', 'mp0': '/srv/data,mp=/data',
                    'lxc': ['lxc.mount.entry: /old opt/old none bind 0 0', 'keep'], 'node': 'pve3', 'status': 'running'},
         'after': {'cores': 4, 'dev0': None, 'dev1': None, 'mp0': None, 'node': 'pve1',
                   'lxc': ['keep', 'lxc.mount.entry: /new opt/new none bind 0 0']}},
        {'before_header': 'CT 203', 'before': {'status': 'stopped'}, 'after': {}},
        {'before_header': 'CT 204', 'before': {'status': 'running'},
         'after': {'dev2': '/dev/nvidia-uvm-tools,mode=0666', 'memory': 4096}}],
    'orphans': [{'vmid': 299, 'name': 'train-a', 'node': 'pve1', 'status': 'running'},
                {'vmid': 298, 'node': 'pve2', 'status': 'stopped'}]}
HOW = 'a run restarts it only where allowed: restart_on_pending: true in its entry, or ' \
      'gpu_container_restart_on_pending: true for the fleet'


def orphan(vmid, node, status):
    return {'stage': 'container', 'item': 'orphan', 'vmid': vmid, 'node': node, 'left': True, 'detail': (
        "CT {0} on {1} ({2}) carries the fleet's tag but is not in its definition: it is left as it is, its GPUs held "
        "(add it to gpufleet_containers, or take the tag off, or destroy it)").format(vmid, node, status)}


def expected_containers(check):
    def c(item, detail, **extra):
        return dict({'stage': 'container', 'item': item, 'detail': detail}, **extra)
    return {
        'train-a': [
            c('cores', 'config cores differs; ' + ('it would wait for a restart of CT 201' if check else
                                                   'written, it waits for a restart of CT 201'),
              before=2, after=4, waits=True),
            c('dev0', 'dev0 (/dev/nvidia3) is no longer given to CT 201: a repair removes it',
              before='path=/dev/nvidia3,mode=0666', after=None),
            c('dev1', "dev1 (/dev/fuse) is not in the fleet definition: a repair removes it; declare it in the entry's "
                      "devices to keep it", before='/dev/fuse', after=None),
            c('lxc', 'its raw lines differ: lxc.mount.entry: /old opt/old none bind 0 0 (not in the fleet); '
                     'lxc.mount.entry: /new opt/new none bind 0 0 (missing)',
              before=['lxc.mount.entry: /old opt/old none bind 0 0', 'keep'],
              after=['keep', 'lxc.mount.entry: /new opt/new none bind 0 0']),
            c('mp0', "mp0 (/srv/data,mp=/data) is not in the fleet definition: a repair removes it; declare it in the "
                     "entry's mounts to keep it", before='/srv/data,mp=/data', after=None),
            c('node', 'node: expected pve1, found pve3; on pve3 it is without its GPUs (no NVIDIA driver is loaded '
                      'there); pve1 would fit (GPU 1, a driver loaded)', before='pve3', after='pve1'),
            c('restart', ('CT 201 would take the change of cores only when it restarts; ' if check else
                          'CT 201 takes the change of cores only when it restarts: restart it when its jobs allow '
                          '(pct reboot 201), or ') + HOW, waits=True, keys=['cores'])],
        'train-b': [c('missing', 'CT 202 does not exist'),
                    c('power', 'CT 202 is absent: start it' if check else 'CT 202 was absent: started',
                      before='absent', after='running')],
        'util': [c('removal', 'CT 203 on pve2 is in the fleet with state absent: a run destroys it' if check else
                   'CT 203 on pve2 was destroyed (state absent in the fleet)', before='stopped', after='absent')],
        '204': [c('dev2', 'dev2 (/dev/nvidia-uvm-tools) is new', before=None, after='/dev/nvidia-uvm-tools,mode=0666'),
                c('memory', 'config memory differs', before=None, after=4096),
                c('power', 'CT 204 is running: reboot it to apply memory' if check else
                  'CT 204 was running: rebooted to apply memory', before='running', after='running')],
        'CT 299': [orphan(299, 'pve1', 'running')],
        'CT 298': [orphan(298, 'pve2', 'stopped')]}


def test_a_containers_config_power_and_orphans_in_words_in_check_mode_and_in_a_repair():
    for check in (True, False):
        assert _drift.containers(RECONCILE, FLEET, check, DEVICES, {201: [1]}) == expected_containers(check)
    assert _drift.containers(None, FLEET) == {}


def test_a_nodes_findings_are_a_runs_to_mend_or_the_operators():
    found = {'findings': [
        {'code': 'uvm_not_loaded', 'msg': 'nvidia-uvm is not loaded', 'fix': 'modprobe nvidia-uvm'},
        {'code': 'bundle_stale', 'msg': 'the bundle lacks libcuda.so.1', 'fix': _gpu.vendor().gather_fix},
        {'code': 'bundle_stale', 'msg': 'no libraries of 580 to gather', 'fix': 'reboot the node'},
        {'code': 'driver_not_held', 'fix': 'apt-mark hold nvidia-driver'},
        {'code': 'module_build_failed'}]}
    assert _drift.node(found) == [
        {'stage': 'node', 'item': 'uvm_not_loaded', 'detail': 'nvidia-uvm is not loaded', 'fix': 'modprobe nvidia-uvm'},
        {'stage': 'node', 'item': 'bundle_stale', 'detail': 'the bundle lacks libcuda.so.1',
         'fix': 'gather it again (driver_bundle)'},
        {'stage': 'node', 'item': 'bundle_stale', 'detail': 'no libraries of 580 to gather', 'fix': 'reboot the node',
         'yours': True},
        {'stage': 'node', 'item': 'driver_not_held', 'detail': 'apt-mark hold nvidia-driver',
         'fix': 'apt-mark hold nvidia-driver', 'yours': True},
        {'stage': 'node', 'item': 'module_build_failed', 'detail': '', 'yours': True}]
    assert _drift.node(None) == [] and _drift.node({}) == []
    for code in _drift.NODE_MENDED:
        assert _drift.mended_by_a_run({'code': code})
    assert not _drift.mended_by_a_run({'code': 'driver_not_loaded'})


def test_a_moved_container_is_told_where_its_gpus_are():
    devices = dict(DEVICES, pve3=dict(DEVICES['pve3'], driver_version='580.95.05'))
    assert _drift.moved('pve1', 'pve2', [1], devices) == (
        'node: expected pve1, found pve2; on pve2 it is without its GPUs (it has no GPU 1 (it has 0)); '
        'pve1, pve3 would fit (GPU 1)')
    assert _drift.moved('pve1', 'pve2', [5], devices, 'a bind mount point not marked shared=1') == (
        'node: expected pve1, found pve2; on pve2 it is without its GPUs (it has no GPU 5 (it has 0)); no node the run '
        'read has GPU 5 with a driver loaded (PVE cannot move it back: a bind mount point not marked shared=1)')
    assert _drift.moved('pve1', 'pve3', [1], devices) == 'node: expected pve1, found pve3; pve1 would fit (GPU 1)'
    # a node the run did not read, or a container without GPUs: where it is, nothing more
    assert _drift.moved('pve1', 'pve9', [1], devices) == 'node: expected pve1, found pve9'
    assert _drift.moved('pve1', 'pve2', [], devices) == 'node: expected pve1, found pve2'
    assert _drift.unfit(None, [0]) == 'it has no GPU 0 (it has none)'
    assert _drift.unfit({'gpus': [{'index': 0}, {'index': None}]}, [0]) == 'no NVIDIA driver is loaded there'
    assert _drift.unfit(devices['pve1'], [0, 1]) is None


FINDINGS = {
    'interpreter': [{'check': 'python_missing', 'msg': 'bin/python is gone', 'fix': 'rebuild'}],
    'startup_files': [{'path': 'evil.pth', 'kind': 'pth', 'lines': ['import os', 'print(1)']},
                      {'path': 'sitecustomize.py', 'kind': 'sitecustomize'}],
    'broken_distributions': [{'name': 'torch', 'version': '2.11.0', 'missing': ['a.so'], 'modified': ['b.py', 'c.py']}],
    'collisions': [{'path': 'x/__init__.py', 'claimed_by': ['a', 'b'], 'on_disk': 'b'}],
    'unresolved_libraries': [{'soname': 'libcudnn.so.9', 'needed_by': ['t1.so', 't2.so', 't3.so', 't4.so'],
                              'provided_by': ['nvidia-cudnn-cu13']},
                             {'soname': 'libx.so', 'needed_by': ['y.so']}],
    'missing_requirements': [{'name': 'filelock', 'required_by': ['torch'], 'requirement': 'filelock>=3'}],
    'failed_imports': [{'module': 'torch', 'message': 'libcudnn.so.9: cannot open'}],
    'drift': {'missing': [{'name': 'numpy', 'version': '2.3.0'}],
              'wrong_version': [{'name': 'torch', 'installed': '2.10.0', 'locked': '2.11.0'}],
              'extra': [{'name': 'left-pad', 'version': '1.0'}]}}


def venv(item, detail, **extra):
    return dict({'stage': 'venv', 'item': item, 'detail': detail}, **extra)


def test_a_running_containers_driver_venv_and_verification_in_words():
    assert _drift.container(
        driver={'match': False, 'version': None, 'node_version': '580.95.05'},
        build={'kept_broken': '/root/venvs/abc.broken', 'audit': {'findings': FINDINGS},
               'python_not_locked': {'msg': 'py 3.14 not locked', 'fix': 'lock it'},
               'container_python': {'msg': 'no python3', 'fix': 'apt install python3'}},
        report={'torch': {'failures': [{'check': 'cuda_available', 'expected': True, 'actual': False}]}}) == [
        {'stage': 'driver', 'item': 'userspace_driver', 'detail': 'libcuda none but the node runs 580.95.05'},
        venv('python_not_locked', 'py 3.14 not locked', fix='lock it'),
        {'stage': 'container', 'item': 'python', 'detail': 'no python3', 'fix': 'apt install python3'},
        venv('rebuilt', 'the venv could not start, so it was built again from its lock beside it and switched to once '
                        'it imported; the broken one is kept at /root/venvs/abc.broken', kept='/root/venvs/abc.broken'),
        venv('python_missing', 'bin/python is gone', fix='rebuild'),
        venv('startup_file', 'evil.pth in site-packages runs at every start (import os; print(1)) and no distribution '
                             'installed it: a repair moves it aside'),
        venv('startup_file', 'sitecustomize.py in site-packages runs at every start (sitecustomize) and no '
                             'distribution installed it: a repair moves it aside'),
        venv('broken_distribution', 'torch 2.11.0: 1 file(s) missing, 2 changed', files=['a.so', 'b.py', 'c.py']),
        venv('collision', 'x/__init__.py is claimed by a, b, bytes of b'),
        venv('unresolved_library', 'libcudnn.so.9 needed by t1.so, t2.so, t3.so is not found (provided by '
                                   'nvidia-cudnn-cu13)'),
        venv('unresolved_library', 'libx.so needed by y.so is not found (provided by nothing installed)'),
        venv('missing_requirement', 'filelock is not installed (required by torch: filelock>=3)'),
        venv('failed_import', 'import torch fails: libcudnn.so.9: cannot open'),
        venv('extra', 'left-pad 1.0'),
        venv('missing_package', 'numpy 2.3.0'),
        venv('wrong_version', 'torch 2.10.0 (locked 2.11.0)'),
        {'stage': 'verify', 'item': 'cuda_available', 'detail': 'expected True, got False'}]


def test_a_venv_build_says_what_a_repair_builds_switches_or_writes():
    assert _drift.container(driver={'match': 'False', 'version': '570', 'node_version': '580'},
                            build={'built': True, 'id': 'abc', 'python_changed': {'from': '3.11', 'to': '3.13'}}) == [
        {'stage': 'driver', 'item': 'userspace_driver', 'detail': 'libcuda 570 but the node runs 580'},
        venv('python_changed', "the container's Python is now 3.13, and the active venv was made for 3.11: build abc "
                               "for 3.13 from its lock")]
    assert _drift.container(driver={'match': True, 'node_version': '580'}, build={'built': True, 'id': 'abc'}) == [
        venv('lock', 'no venv of its lock yet: build abc')]
    assert _drift.container(driver={'match': False}, build={'switched': True, 'id': 'abc',
                                                            'python_repaired': {'msg': 'm', 'fix': 'f'}}) == [
        venv('active', "the active venv is not its lock's: switch to abc"),
        {'stage': 'container', 'item': 'python', 'detail': 'm', 'fix': 'f'}]
    assert _drift.container(build={'lock_written': True}) == [
        venv('lock_file', "the lock file in the container is not the profile's")]
    assert _drift.container() == []


def test_a_stale_cdi_spec_is_the_engines_item_and_a_current_one_none():
    stale = {'check': 'cdi_stale', 'msg': 'the CDI spec mounts libcuda.so.570.172.08 that the driver bound in no longer '
                                          'has (a spec of another driver)'}
    assert _drift.container(driver={'match': True, 'node_version': '580'}, engine={'changed': True, 'findings': [stale]}) == [
        {'stage': 'engine', 'item': 'cdi_stale', 'detail': stale['msg']}]
    assert _drift.container(engine={'changed': False, 'findings': []}) == []


def test_the_fleets_report_counts_what_a_run_repairs_what_waits_and_what_is_the_operators():
    verdict = {'containers': [{'host': 'train-b', 'state': 'unreached', 'why': 'its node was not reached'},
                              {'host': 'util', 'state': 'unread'}, {'host': 'train-a', 'state': 'verified'}]}
    running = {'train-a': {'build': {'built': True, 'id': 'abc'}}}
    devices = dict(DEVICES, pve1=dict(DEVICES['pve1'], findings=[{'code': 'driver_not_held',
                                                                   'fix': 'apt-mark hold nvidia-driver'}]))
    for check in (True, False):
        report = _drift.fleet(devices, RECONCILE, FLEET, running, verdict, check, {201: [1]})
        containers = expected_containers(check)
        containers['train-a'].append(venv('lock', 'no venv of its lock yet: build abc'))
        containers['train-b'].append({'stage': 'verify', 'item': 'unreached', 'detail': 'its node was not reached'})
        containers['util'].append({'stage': 'verify', 'item': 'unread', 'detail': ''})
        nodes = {'pve1': [{'stage': 'node', 'item': 'driver_not_held', 'detail': 'apt-mark hold nvidia-driver',
                           'fix': 'apt-mark hold nvidia-driver', 'yours': True}], 'pve2': [], 'pve3': []}
        assert report == {'mode': 'check' if check else 'repair', 'drift': True, 'count': 17, 'waiting': 2, 'yours': 1,
                          'yours_hosts': ['pve1'], 'waiting_hosts': ['train-a'], 'orphans': ['CT 298', 'CT 299'],
                          'nodes': nodes, 'containers': containers}
        files = _drift.reports(report)
        assert files['summary'] is report and sorted(files) == [
            '204', 'CT 298', 'CT 299', 'pve1', 'pve2', 'pve3', 'summary', 'train-a', 'train-b', 'util']
        assert files['pve2'] == {'host': 'pve2', 'kind': 'node', 'mode': report['mode'], 'drift': False, 'items': []}
        assert files['util'] == {'host': 'util', 'kind': 'container', 'mode': report['mode'], 'drift': True,
                                 'items': containers['util']}
    clean = _drift.fleet({'pve1': {}}, None, FLEET, {}, None, True)
    assert clean == {'mode': 'check', 'drift': False, 'count': 0, 'waiting': 0, 'yours': 0, 'yours_hosts': [],
                     'waiting_hosts': [], 'orphans': [], 'nodes': {'pve1': []}, 'containers': {}}
    # orphans alone are no drift of the fleet's
    alone = _drift.summary({}, {'CT 298': [orphan(298, 'pve2', 'stopped')]}, False)
    assert (alone['drift'], alone['count'], alone['orphans']) == (False, 0, ['CT 298'])


def test_the_words_of_each_kind_of_change_power_and_restart():
    """What the first test's fleet does not have: a devN or mpN changed (not removed), a GPU's devN in PVE's default
    key form, a move PVE refuses, each power action, a start with changes pending, several keys pending (the raw
    lines among them), a reconcile of one container (its diff one dict)."""
    reconcile = {'containers': [
        {'vmid': 211, 'status': 'running', 'changed_keys': ['dev0', 'dev1', 'mp0', 'node'], 'pending': [],
         'move_refused': 'a bind mount point not marked shared=1'},
        {'vmid': 212, 'status': 'running', 'changed_keys': ['lxc', 'swap'], 'pending': ['dev4', 'dev6', 'lxc', 'swap'],
         'restart_required': True, 'config': {'dev4': 'path=/dev/nvidia-uvm-tools'}},
        {'vmid': 213, 'status': 'stopped', 'power': 'shutdown'},
        {'vmid': 214, 'status': 'stopped', 'power': 'stop'},
        {'vmid': 215, 'status': 'running', 'power': 'start', 'pending': ['cores']},
        {'vmid': 216, 'status': 'running', 'power': 'reboot', 'pending': ['cores', 'dev0'],
         'config': {'dev0': '/dev/nvidia2,mode=0666'}},
        {'vmid': 217, 'status': 'running', 'power': 'reboot', 'pending': ['dev1']}],
        'diff': [
            {'before_header': 'CT 211', 'before': {'dev0': '/dev/nvidia3,mode=0666', 'dev1': '/dev/nvidia5',
                                                   'mp0': '/srv/a,mp=/a', 'node': 'pve2'},
             'after': {'dev0': '/dev/nvidia4,mode=0666', 'dev1': None, 'mp0': '/srv/b,mp=/a', 'node': 'pve1'}},
            {'before_header': 'CT 212', 'before': {'dev4': 'path=/dev/nvidia-uvm', 'dev6': '/dev/nvidia7', 'swap': 0,
                                                   'lxc': []},
             'after': {'swap': 512, 'lxc': ['lxc.mount.entry: /new opt/new none bind 0 0']}},
            {'before_header': 'CT 213', 'before': {'status': 'running'}, 'after': {'status': 'stopped'}},
            {'before_header': 'CT 214', 'before': {'status': 'running'}, 'after': {'status': 'stopped'}},
            {'before_header': 'CT 216', 'before': {'status': 'running', 'dev0': '/dev/nvidia1'}, 'after': {}},
            {'before_header': 'CT 217', 'before': {'status': 'running'}, 'after': {'dev1': 'path=/dev/nvidia6'}}]}
    devices = {'pve1': {'gpus': [{'index': 0}, {'index': 1}, {'index': 2}], 'driver_version': '580.95.05'},
               'pve2': {'gpus': [{'index': 0}], 'driver_version': '580.95.05'}}
    got = _drift.containers(reconcile, [], False, devices, {211: [1, 2]})
    assert [(i['item'], i['detail']) for i in got['211']] == [
        ('dev0', 'config dev0 differs'),
        ('dev1', 'dev1 (/dev/nvidia5) is no longer given to CT 211: a repair removes it'),
        ('mp0', 'config mp0 differs'),
        ('node', 'node: expected pve1, found pve2; on pve2 it is without its GPUs (it has no GPU 1, 2 (it has 0)); '
                 'pve1 would fit (GPU 1, 2) (PVE cannot move it back: a bind mount point not marked shared=1)')]
    assert got['212'][-1] == {
        'stage': 'container', 'item': 'restart', 'waits': True, 'keys': ['dev4', 'dev6', 'lxc', 'swap'],
        'detail': 'CT 212 takes the change of dev4 (/dev/nvidia-uvm-tools), dev6 (/dev/nvidia7), its raw lines (lxc), '
                  'swap only when it restarts: '
                  'restart it when its jobs allow (pct reboot 212), or ' + HOW}
    assert [(i['item'], i['detail'], i['before'], i['after']) for i in got['213'] + got['214'] + got['215']] == [
        ('power', 'CT 213 was running: shut down', 'running', 'stopped'),
        ('power', 'CT 214 was running: stopped', 'running', 'stopped'),
        ('power', 'CT 215 was absent: started', 'absent', 'running')]
    assert got['216'] == [{'stage': 'container', 'item': 'power', 'before': 'running', 'after': 'running',
                           'detail': 'CT 216 was running: rebooted to apply cores, dev0 (/dev/nvidia2)'}]
    assert got['217'][0]['detail'] == 'CT 217 was running: rebooted to apply dev1 (/dev/nvidia6)'
    # a key the config does not hold is named alone
    assert _drift.containers({'containers': [{'vmid': 218, 'power': 'reboot', 'pending': ['dev7']}]}, [], True)[
        '218'][0]['detail'] == 'CT 218 is absent: reboot it to apply dev7'
    one = {'containers': [reconcile['containers'][2]], 'diff': reconcile['diff'][2]}
    assert _drift.containers(one, [], True)['213'][0]['detail'] == 'CT 213 is running: shutdown it'
    assert _drift.containers(one, []) == _drift.containers(one, [], True)  # a check unless told otherwise
    assert _drift.unfit(devices['pve2'], [1, 2]) == 'it has no GPU 1, 2 (it has 0)'
    assert _drift.unfit({'gpus': [{'index': 0}, {'index': 3}]}, [1]) == 'it has no GPU 1 (it has 0, 3)'
    assert _drift.moved('pve1', 'pve2', [5, 6], devices) == (
        'node: expected pve1, found pve2; on pve2 it is without its GPUs (it has no GPU 5, 6 (it has 0)); no node the '
        'run read has GPU 5, 6 with a driver loaded')


def test_a_hosts_items_from_the_run_alone_and_the_lists_in_a_venvs_words():
    # a container the run verified or read that the reconcile did not name has its own items all the same
    report = _drift.fleet({}, None, [], {'solo': {'build': {'built': True, 'id': 'abc'}}},
                          {'containers': [{'host': 'far', 'state': 'unreached', 'why': 'not reached'}]}, True)
    assert report['containers'] == {'solo': [venv('lock', 'no venv of its lock yet: build abc')],
                                    'far': [{'stage': 'verify', 'item': 'unreached', 'detail': 'not reached'}]}
    found = {'unresolved_libraries': [{'soname': 'libnccl.so.2', 'needed_by': ['a.so'],
                                       'provided_by': ['nvidia-nccl-cu12', 'nvidia-nccl-cu13']}],
             'missing_requirements': [{'name': 'sympy', 'required_by': ['torch', 'onnx'], 'requirement': 'sympy>=1.13'}]}
    assert [i['detail'] for i in _drift.container(build={'audit': {'findings': found}})] == [
        'libnccl.so.2 needed by a.so is not found (provided by nvidia-nccl-cu12, nvidia-nccl-cu13)',
        'sympy is not installed (required by torch, onnx: sympy>=1.13)']
