"""The gpufleet.proxmox.pct connection plugin: tasks in a lab container through pct exec on its node."""

import json
import os
import subprocess
import tempfile

import pytest
import yaml

from conftest import run_playbook

pytestmark = pytest.mark.lab


@pytest.fixture
def container(pve):
    pve.create(985, hostname='conn985')
    pve.start(985)
    return 985


def control_dir(tmp_path):
    """A short directory for the ssh control sockets (a socket path must stay under 108 bytes)."""
    link = tmp_path / 'cp'
    if not link.exists():
        link.symlink_to(tempfile.mkdtemp(prefix='cp', dir='/tmp'))
    return os.path.realpath(str(link))


def inventory(tmp_path, creds, vmid, **overrides):
    host = {'ansible_connection': 'gpufleet.proxmox.pct', 'ansible_pct_vmid': vmid,
            'ansible_pct_node': creds['ssh_host'], 'ansible_pct_node_port': creds['ssh_port'],
            'ansible_pct_private_key_file': creds['ssh_private_key_file'],
            'ansible_pct_ssh_args': '-o UserKnownHostsFile={0} -o StrictHostKeyChecking=yes'.format(
                creds['ssh_known_hosts_file']),
            'ansible_pct_control_path_dir': control_dir(tmp_path),
            'ansible_python_interpreter': '/usr/bin/python3'}
    host.update(overrides)
    path = tmp_path / 'containers.yml'
    path.write_text(yaml.safe_dump({'all': {'hosts': {'ct': host}}}))
    return str(path)


def run(tmp_path, inv, tasks, *args, gather=False, env=None):
    return run_playbook([{'name': 'in the container', 'hosts': 'ct', 'gather_facts': gather, 'tasks': tasks}],
                        tmp_path, *args, inventory=inv, env=env)


@pytest.mark.parametrize('pipelining', ['True', 'False'])
def test_commands_modules_and_facts(tmp_path, creds, container, pipelining):
    inv = inventory(tmp_path, creds, container)
    r = run(tmp_path, inv, [{'ansible.builtin.command': 'hostname', 'register': 'h'},
                            {'ansible.builtin.raw': 'echo raw-ok'},
                            {'ansible.builtin.stat': {'path': '/etc/debian_version'}}],
            gather=True, env={'ANSIBLE_PIPELINING': pipelining})
    assert r.rc == 0, r.stdout[-2000:]
    assert r.task(0, 'ct')['ansible_facts']['ansible_hostname'] == 'conn985'
    assert r.task(1, 'ct')['stdout'] == 'conn985'
    assert r.task(2, 'ct')['stdout'].strip() == 'raw-ok'
    assert r.task(3, 'ct')['stat']['exists'] is True
    # Ansible's remote temporary files went to root's home, not to a literal '~' directory
    leftovers = run(tmp_path, inv, [{'ansible.builtin.stat': {'path': '/~'}}])
    assert leftovers.task(0, 'ct')['stat']['exists'] is False
    # one multiplexed connection per container: its control socket is there after the run
    assert len(os.listdir(os.path.realpath(str(tmp_path / 'cp')))) == 1


def test_more_forks_than_the_nodes_sshd_takes_at_once(tmp_path, creds, container):
    # the lab's sshd has OpenSSH's defaults, MaxSessions 10 and MaxStartups 10:30:100: forty hosts starting at
    # once open more connections than sshd lets through unauthenticated, and it drops some of them at random
    inv = inventory(tmp_path, creds, container)
    one = yaml.safe_load(open(inv))['all']['hosts']['ct']
    hosts = dict(('ct{0}'.format(i), one) for i in range(40))
    (tmp_path / 'containers.yml').write_text(yaml.safe_dump({'all': {'children': {'ct': {'hosts': hosts}}}}))
    # (raw: forty Python modules at once would not fit in the container's memory)
    r = run(tmp_path, inv, [{'ansible.builtin.raw': 'sleep 2; echo done'}], '--forks', '40')
    failed = dict((h, r.task(0, h).get('msg')) for h in hosts if r.task(0, h).get('failed'))
    assert failed == {} and r.rc == 0
    assert all(r.task(0, h)['stdout'].strip() == 'done' for h in hosts)


def test_files_both_ways(tmp_path, creds, container):
    src = tmp_path / 'big.bin'
    src.write_bytes(os.urandom(3 * 1024 * 1024))
    inv = inventory(tmp_path, creds, container)
    r = run(tmp_path, inv, [
        {'ansible.builtin.copy': {'src': str(src), 'dest': '/root/big.bin', 'mode': '0640'}},
        {'ansible.builtin.fetch': {'src': '/root/big.bin', 'dest': str(tmp_path / 'back.bin'), 'flat': True}},
        {'ansible.builtin.stat': {'path': '/root/big.bin'}}])
    assert r.rc == 0, r.stdout[-2000:]
    assert (tmp_path / 'back.bin').read_bytes() == src.read_bytes()
    assert r.task(2, 'ct')['stat']['mode'] == '0640'


def test_become_another_user_inside(tmp_path, creds, container):
    inv = inventory(tmp_path, creds, container)
    r = run(tmp_path, inv, [{'ansible.builtin.command': 'id -un', 'become': True, 'become_user': 'nobody',
                             'become_method': 'ansible.builtin.su', 'become_flags': '-s /bin/sh'},
                            {'ansible.builtin.command': 'id -un'}])
    assert r.rc == 0, r.stdout[-2000:]
    assert r.task(0, 'ct')['stdout'] == 'nobody'
    assert r.task(1, 'ct')['stdout'] == 'root'


def test_local_mode_when_the_controller_is_the_node(tmp_path, creds, container):
    inv = inventory(tmp_path, creds, container, ansible_pct_local=True, ansible_pct_node=None)
    r = run(tmp_path, inv, [{'ansible.builtin.command': 'hostname'}])
    assert r.rc == 0 and r.task(0, 'ct')['stdout'] == 'conn985'


def test_clear_errors(tmp_path, creds, pve):
    pve.create(986)
    stopped = run(tmp_path, inventory(tmp_path, creds, 986), [{'ansible.builtin.command': 'true'}])
    assert stopped.task(0, 'ct').get('unreachable')
    assert 'CT 986 on node 127.0.0.1 is not running' in stopped.task(0, 'ct')['msg']
    missing = run(tmp_path, inventory(tmp_path, creds, 987), [{'ansible.builtin.command': 'true'}])
    assert 'there is no CT 987' in missing.task(0, 'ct')['msg']
    unreachable = run(tmp_path, inventory(tmp_path, creds, 986, ansible_pct_node_port=1),
                      [{'ansible.builtin.command': 'true'}])
    assert unreachable.task(0, 'ct').get('unreachable')
    assert 'cannot reach node 127.0.0.1 over SSH' in unreachable.task(0, 'ct')['msg']


def test_a_command_that_lxc_attach_failed_to_start_is_tried_again(tmp_path, creds, container):
    """lxc-attach can fail before it enters the container ("Failed to rexec as memfd", a moment's EBUSY): nothing ran,
    so the command is tried again. Here a pct that fails so once, then is the node's own."""
    count = tmp_path / 'tries'
    pct = tmp_path / 'pct'
    pct.write_text('#!/bin/sh\nn=$(cat {0} 2>/dev/null || echo 0); echo $((n + 1)) > {0}\n'
                   'if [ "$n" = 0 ]; then echo "Device or resource busy - Failed to rexec as memfd" >&2; exit 1; fi\n'
                   'exec pct "$@"\n'.format(count))
    pct.chmod(0o755)
    inv = inventory(tmp_path, creds, container, ansible_pct_local=True, ansible_pct_executable=str(pct))
    r = run(tmp_path, inv, [{'ansible.builtin.raw': 'hostname'}])
    assert r.rc == 0 and r.task(0, 'ct')['stdout'].strip() == 'conn985', r.stdout[-2000:]
    assert int(count.read_text()) == 2


def node_inventory(tmp_path, creds, container, **overrides):
    """The container (ct, on node 'node') and its node as an SSH host (node)."""
    inv = inventory(tmp_path, creds, container, gpufleet_node='node', **overrides)
    hosts = yaml.safe_load(open(inv))
    hosts['all']['hosts']['node'] = {
        'ansible_host': creds['ssh_host'], 'ansible_port': creds['ssh_port'], 'ansible_user': 'root',
        'ansible_ssh_private_key_file': creds['ssh_private_key_file'], 'ansible_python_interpreter': '/usr/bin/python3',
        'ansible_ssh_common_args': '-o UserKnownHostsFile={0} -o StrictHostKeyChecking=yes'.format(
            creds['ssh_known_hosts_file'])}
    with open(inv, 'w') as fh:
        yaml.safe_dump(hosts, fh)
    return inv


def deferred_build(args):
    """A play that records ct's venv_build call (defer, in a check run) as built."""
    return {'name': 'record', 'hosts': 'ct', 'gather_facts': False, 'tasks': [
        {'gpufleet.proxmox.venv_build': dict(args, defer=True), 'ignore_errors': True,
         'environment': {'HTTPS_PROXY': 'http://user:SECRET@proxy:3128'}, 'register': 'built'}]}


BATCH = {'name': 'the node', 'hosts': 'node', 'gather_facts': False, 'tasks': [
    {'gpufleet.proxmox.pct_batch': {'hosts': ['ct'], 'var': 'built'}, 'register': 'ran'}]}


def take(given):
    return {'name': 'take', 'hosts': 'ct', 'gather_facts': False, 'tasks': [
        {'gpufleet.proxmox.pct_batch_result': {'deferred': '{{ built }}', 'batch': given}, 'register': 'built'}]}


def test_a_deferred_call_runs_on_its_node_and_each_container_takes_its_result(tmp_path, creds, container):
    """venv_build with defer, in a check run, records its call; pct_batch runs the node's recorded calls with pct
    exec (a pct exec that lxc-attach failed to start is tried again); pct_batch_result gives each container its
    result as the pct connection would have: a container stopped in between is unreachable, with the connection's
    message, and so it is where the node's run is missing and the call runs over the container's own connection."""
    count = tmp_path / 'tries'
    pct = tmp_path / 'pct'  # fails once as lxc-attach can, before anything ran, then is the node's own pct
    pct.write_text('#!/bin/sh\nn=$(cat {0} 2>/dev/null || echo 0); echo $((n + 1)) > {0}\n'
                   'if [ "$n" = 0 ]; then echo "Device or resource busy - Failed to rexec as memfd" >&2; exit 1; fi\n'
                   'exec pct "$@"\n'.format(count))
    pct.chmod(0o755)
    inv = node_inventory(tmp_path, creds, container, ansible_pct_executable=str(pct))
    record = deferred_build({'rollback': True, 'root': '/tmp/none', 'link': '/tmp/none/l'})
    node_batch = "{{ hostvars['node'].ran }}"
    r = run_playbook([record, BATCH, take(node_batch)], tmp_path, '--check', inventory=inv)
    recorded, ran, took = [p['tasks'][0]['hosts'][h] for p, h in zip(r.data['plays'], ('ct', 'node', 'ct'))]
    assert not recorded.get('failed'), recorded  # (the record ignores errors: a bad argument's case needs it)
    assert recorded['deferred']['node'] == 'node' and recorded['deferred']['vmid'] == container, recorded
    assert 'argv' not in recorded['deferred'] and 'SECRET' not in json.dumps(r.data)  # the environment stays private
    assert 'invocation' not in ran  # the calls are not in the node's result either
    assert 'there is no previous venv' in ran['runs']['ct']['stdout'] and int(count.read_text()) == 2  # tried again once
    # rollback with no venv before: the module's own failure, parsed from the node's run
    assert took.get('failed') and 'there is no previous venv under /tmp/none' in took['msg'], took
    # the same call made in the container directly says the same
    plain = run(tmp_path, inv, [{'gpufleet.proxmox.venv_build': {'rollback': True, 'root': '/tmp/none',
                                                                 'link': '/tmp/none/l'}, 'ignore_errors': True}], '--check')
    assert plain.task(0, 'ct').get('failed') and plain.task(0, 'ct')['msg'] == took['msg']

    subprocess.run(['pct', 'stop', str(container)], check=True, capture_output=True)
    for given in (node_batch, {}):  # from the node's run, and run over the container's connection
        r = run_playbook([record, BATCH, take(given)], tmp_path, '--check', inventory=inv)
        took = r.data['plays'][-1]['tasks'][0]['hosts']['ct']
        assert took.get('unreachable') and 'CT {0} on node 127.0.0.1 is not running'.format(container) in took['msg']
    # a result that was not deferred (the call ran in the container) is taken as it is
    ran_here = {'changed': True, 'id': 'abc', 'venv': '/opt/gpufleet/venvs/abc'}
    not_deferred = run(tmp_path, inv, [{'gpufleet.proxmox.pct_batch_result': {'deferred': ran_here}}])
    taken = not_deferred.task(0, 'ct')
    assert not taken.get('failed'), taken
    assert (taken['changed'], taken['id'], taken['venv']) == (True, 'abc', '/opt/gpufleet/venvs/abc')


def test_a_deferred_venv_read_says_what_the_module_says(tmp_path, creds, container):
    """The node runs a deferred venv_build's entry point without Ansible's module wrapper, its arguments checked on
    the controller with the module's spec: a bad argument fails the task that records the call, with the module's
    own message, and nothing runs; paths are expanded in the container (~ is the container's HOME), as the module
    expands them; and the result is the module's."""
    inv = node_inventory(tmp_path, creds, container)
    for bad, named in (({'audit_mode': 'quick'}, 'audit_mode'), ({'colour': 'blue'}, 'colour'),
                       ({'rollback': False}, 'lock')):
        args = dict({'rollback': True, 'root': '/tmp/none', 'link': '/tmp/none/l'}, **bad)
        r = run_playbook([deferred_build(args), BATCH], tmp_path, '--check', inventory=inv)
        recorded, ran = r.data['plays'][0]['tasks'][0]['hosts']['ct'], r.data['plays'][1]['tasks'][0]['hosts']['node']
        plain = run(tmp_path, inv, [{'gpufleet.proxmox.venv_build': args, 'ignore_errors': True}], '--check')
        direct = plain.task(0, 'ct')
        assert recorded.get('failed') and 'deferred' not in recorded and ran['runs'] == {}, (recorded, ran)
        assert direct.get('failed') and recorded['msg'] == direct['msg'] and named in direct['msg'], (recorded, direct)
    args = {'rollback': True, 'root': '~/none', 'link': '~/none/l'}
    r = run_playbook([deferred_build(args), BATCH, take("{{ hostvars['node'].ran }}")], tmp_path, '--check',
                     inventory=inv)
    recorded, took = r.data['plays'][0]['tasks'][0]['hosts']['ct'], r.data['plays'][-1]['tasks'][0]['hosts']['ct']
    assert not recorded.get('failed') and 'deferred' in recorded, recorded
    plain = run(tmp_path, inv, [{'gpufleet.proxmox.venv_build': args, 'ignore_errors': True}], '--check')
    assert took.get('failed') and 'there is no previous venv under /root/none' in took['msg'], took
    assert took['msg'] == plain.task(0, 'ct')['msg']
