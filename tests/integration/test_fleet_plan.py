"""gpufleet.proxmox.fleet_plan through Ansible: the nodes' facts read from the inventory, the whole definition
checked before any request, the cluster's version read only where the passthrough mode depends on it, and the
plain containers lxc_container takes."""

from conftest import API_DEFAULTS, TEMPLATE_VOLID

NODE_FACTS = {
    'gpufleet_gpu_devices': {'indexes': [0, 1], 'majors': {'nvidia-uvm': 509}},
    'gpu_node_driver': {'path': '/opt/gpufleet/driver/580.95.05'},
    'gpu_node_shared': [{'path': '/var/cache/gpufleet/uv', 'mp': '/var/cache/gpufleet/uv'}],
}
AWAY = {'api_host': '127.0.0.1', 'api_port': 9, 'api_user': 'root@pam', 'api_password': 'x'}


def plan_tasks(containers, api=None, **options):
    """The node's facts set on pve1 (the play's only host, so the plan's only node), then the plan."""
    args = dict(containers=containers, defaults={'ostemplate': TEMPLATE_VOLID, 'storage': 'local-lvm',
                                                 'state': 'started'},
                api=api or API_DEFAULTS, **options)
    return [{'ansible.builtin.set_fact': NODE_FACTS},
            {'gpufleet.proxmox.fleet_plan': args, 'register': 'plan', 'ignore_errors': True}]


def planned(play, containers, *args, **options):
    return play(plan_tasks(containers, **options), *args, hosts='pve1').task(1, 'pve1')


def entry(vmid, **extra):
    return dict({'vmid': vmid, 'hostname': 'plan{0}'.format(vmid), 'node': 'pve1'}, **extra)


def test_a_fleet_expands_into_plain_containers_by_the_clusters_version(play, control):
    control.clear_requests()
    res = planned(play, [entry(990, gpus=[1]), entry(991)], driver_mount='/opt/nvidia-driver')
    assert not res.get('failed'), res.get('msg')
    assert res['changed'] is False and res['passthrough'] == 'devn' and res['pve_version'] == '9.0.10'
    gpu, plain = res['containers']
    assert [d['path'] for d in gpu['devices']] == ['/dev/nvidia1', '/dev/nvidiactl', '/dev/nvidia-uvm',
                                                    '/dev/nvidia-uvm-tools', '/dev/nvidia-modeset']
    # the driver bundle into GPU containers only, the node's shares into all, as raw binds (no mount point, so
    # PVE can snapshot the containers); the containers' own mount points are the fleet's (none here)
    assert gpu['mounts'] == {} and plain['mounts'] == {} and plain['devices'] == []
    assert res['raw'] == {'pve1': {
        '990': ['lxc.mount.entry: /opt/gpufleet/driver/580.95.05 opt/nvidia-driver none bind,ro,create=dir 0 0',
                'lxc.mount.entry: /var/cache/gpufleet/uv var/cache/gpufleet/uv none bind,create=dir 0 0'],
        '991': ['lxc.mount.entry: /var/cache/gpufleet/uv var/cache/gpufleet/uv none bind,create=dir 0 0']}}
    assert res['raw_owned']['pve1']['targets'] == ['/opt/nvidia-driver', '/var/cache/gpufleet/uv']
    # made, not started, until their raw lines are written (a check run only reads)
    assert (gpu['ostemplate'], gpu['state']) == (TEMPLATE_VOLID, 'present')
    assert res['wanted'][0]['state'] == 'started' 
    assert control.mutating_requests() == []


def test_a_node_without_the_optional_control_nodes_gives_its_containers_the_rest(play):
    bare = dict(NODE_FACTS, gpufleet_gpu_devices=dict(NODE_FACTS['gpufleet_gpu_devices'], control={
        'nvidiactl': {'path': '/dev/nvidiactl'}, 'nvidia-uvm': {'path': '/dev/nvidia-uvm'}}))
    tasks = plan_tasks([entry(990, gpus=[0])])
    tasks[0] = {'ansible.builtin.set_fact': bare}
    res = play(tasks, hosts='pve1').task(1, 'pve1')
    assert not res.get('failed'), res.get('msg')
    assert [d['path'] for d in res['containers'][0]['devices']] == ['/dev/nvidia0', '/dev/nvidiactl', '/dev/nvidia-uvm']
    assert all(d['mode'] == '0666' for d in res['containers'][0]['devices'])


def test_raw_passthrough_starts_the_containers_after_their_lines(play, control):
    control.set_version('8.0.4')
    try:
        res = planned(play, [entry(990, gpus=[1]), entry(991, state='stopped')])
        assert not res.get('failed'), res.get('msg')
        assert res['passthrough'] == 'raw' and res['pve_version'] == '8.0.4'
        # the one to run is made, not started, until its lines are written; the one to stay stopped is made stopped
        assert [c['state'] for c in res['containers']] == ['present', 'stopped']
        assert [c['state'] for c in res['wanted']] == ['started', 'stopped']
        assert res['containers'][0]['devices'] == []
        lines = res['raw']['pve1']['990']  # by vmid (a string key once the result is JSON)
        assert 'lxc.cgroup2.devices.allow: c 195:1 rw' in lines and 'lxc.cgroup2.devices.allow: c 509:0 rw' in lines
        # in check mode the states stay as the fleet wants them
        checked = planned(play, [entry(990, gpus=[1])], '--check')
        assert not checked.get('failed') and checked['containers'][0]['state'] == 'started'
    finally:
        control.set_version('9.0.10')


def test_every_problem_is_named_before_any_request(play):
    bad = [entry(990, gpus=[7]), entry(990, hostname='dup_'), entry(992, cpus=2), entry(993, memory=8)]
    res = planned(play, bad, api=AWAY)
    assert res.get('failed') and 'The fleet definition has 5 problem(s)' in res['msg'], res.get('msg')
    for words in ('containers[0] (vmid 990).gpus: node pve1 has no GPU 7 (it has [0, 1])',
                  'containers[1] (vmid 990).vmid: 990 is also the vmid of containers[0]',
                  'containers[1] (vmid 990).hostname:', 'containers[2] (vmid 992).cpus: unknown key',
                  'containers[3] (vmid 993).memory:'):
        assert words in res['msg'], words
    # a node the inventory lacks
    res = planned(play, [dict(entry(994), node='pve9')], api=AWAY)
    assert res.get('failed') and 'pve9 is not a node of the inventory' in res['msg'], res.get('msg')


def test_the_version_is_read_only_where_the_mode_depends_on_it(play):
    # no GPUs, or an explicit mode, or a teardown: no request at all (the API here is unreachable)
    res = planned(play, [entry(990)], api=AWAY)
    assert not res.get('failed') and res['passthrough'] == 'devn', res.get('msg')
    res = planned(play, [entry(990, gpus=[0])], api=AWAY, passthrough='raw')
    assert not res.get('failed') and res['passthrough'] == 'raw' and res['pve_version'] is None
    res = planned(play, [entry(990, gpus=[0])], api=AWAY, override={'state': 'absent', 'force': True})
    assert not res.get('failed') and [(c['state'], c['force']) for c in res['containers']] == [('absent', True)]
    # auto with GPUs needs the version: the login's failure is said
    res = planned(play, [entry(990, gpus=[0])], api=AWAY)
    assert res.get('failed') and 'cannot log in' in res['msg'], res.get('msg')
    # devN needs root@pam with its password: a token login is refused before any request
    token = dict(AWAY, api_token_id='t', api_token_secret='s')
    token.pop('api_password')
    res = planned(play, [entry(990, gpus=[0])], api=token, passthrough='devn')
    assert res.get('failed') and 'root@pam' in res['msg'], res.get('msg')


def test_an_engine_gets_its_features_and_a_login_that_may_not_set_them_is_refused_before_any_request(play):
    res = planned(play, [entry(990, features=['mount=nfs', 'nesting=0'], engine='podman')])
    assert not res.get('failed'), res.get('msg')
    assert res['containers'][0]['features'] == ['mount=nfs', 'nesting=1', 'keyctl=1']
    token = dict(AWAY, api_token_id='t', api_token_secret='s')
    token.pop('api_password')
    res = planned(play, [entry(990, engine='podman')], api=token)
    assert res.get('failed') and 'containers[0] (vmid 990).engine: podman needs the features nesting=1,keyctl=1, and ' \
        'PVE lets only root@pam with its password set keyctl' in res['msg'], res.get('msg')


def test_the_first_node_of_api_host_that_answers_serves_the_run(play):
    """api_host may list several nodes: one that does not answer (127.0.0.2: nothing listens there) is passed over;
    where none answers, each is named."""
    res = planned(play, [entry(990, gpus=[0])], api=dict(API_DEFAULTS, api_host=['127.0.0.2', '{{ gpufleet_api_host }}']))
    assert not res.get('failed') and res['pve_version'] == '9.0.10', res.get('msg')
    res = planned(play, [entry(990, gpus=[0])], api=dict(API_DEFAULTS, api_host='127.0.0.2,127.0.0.3'))
    assert res.get('failed') and res['msg'].startswith(
        'cannot log in to the PVE API as root@pam: no node of api_host answers: https://127.0.0.2:8006 ('), res['msg']
    assert 'https://127.0.0.3:8006 (' in res['msg']


def test_a_node_that_the_cluster_does_not_have_is_named_before_any_change(play, control):
    """The inventory may name a host that is no node of the cluster (here localhost, a node of the play): the plan
    reads the cluster's nodes where it reads their versions, and lxc_container where a container names a node that
    holds no guest; each names the node and the cluster's nodes, and nothing is changed."""
    control.clear_requests()
    res = play(plan_tasks([dict(entry(990, gpus=[0]), node='localhost')])).task(1)
    assert res.get('failed') and ('containers[0] (vmid 990).node: localhost is not a node of the cluster '
                                  '(its nodes: pve1)') in res['msg'], res.get('msg')
    res = play([{'gpufleet.proxmox.lxc_container': {'containers': [
        {'vmid': 990, 'node': 'pve9', 'hostname': 'x', 'ostemplate': TEMPLATE_VOLID}]},
        'ignore_errors': True}]).task(0)
    assert res.get('failed') and res['msg'] == 'vmid 990: node pve9 is not a node of the cluster (its nodes: pve1)'
    assert control.mutating_requests() == []
