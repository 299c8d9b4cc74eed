"""`gpufleet lab up | down | status | reset | reboot-node`."""

import glob
import json
import os
import shlex
import shutil
import subprocess
import time

from . import host
from .host import debnode
from .containers import Containers
from .control import Control
from .layout import DRIVER_VERSION, MAX_NODES, NODE, RELEASES, SSH_PORT, Lab, NodeError, TEMPLATE, write_json


def _per_node(option, text, count, default):
    """A comma-separated value per node (one value: every node the same)."""
    values = [v.strip() for v in str(text).split(',')]
    if len(values) == 1:
        values = values * count
    if len(values) != count or not all(values):
        raise host.LabError('{0} needs one value, or one per node ({1}), got {2!r}'.format(option, count, text))
    return [default(v) for v in values]


# The driver of a node that --nodes adds without --drivers: pve2 a PVE 8 node on Debian bookworm's own 535 packages,
# pve3 a PVE 9 node on trixie's 550 (host.debnode), the others the lab's stand-in packaging of DRIVER_VERSION.
DEFAULT_DRIVERS = {'pve2': '535.261.03-1', 'pve3': '550.163.01-2'}


def plan_nodes(lab, count=None, gpus=None, drivers=None):
    """The cluster `up` makes: [{name, ssh_port, gpus, driver, debian}], pve1 first. Without options, the one the
    lab has; with them, count nodes (1 to MAX_NODES), each with its GPU count and driver version (--gpus 8,4,0,
    --drivers 580.95.05,570.172.08,...; one value for all; a Debian version such as 535.261.03-1 makes the node one
    on Debian's own packaging; a node added without --drivers takes DEFAULT_DRIVERS'). A node that holds containers
    is not taken away."""
    current = lab.node_specs()
    if count is None and gpus is None and drivers is None:
        return current
    count = len(current) if count is None else count
    if not isinstance(count, int) or not 1 <= count <= MAX_NODES:
        raise host.LabError('--nodes must be from 1 to {0}, got {1!r}'.format(MAX_NODES, count))

    def gpu_count(text):
        if not text.isdigit() or int(text) > 16:
            raise host.LabError('--gpus takes GPU counts from 0 to 16, got {0!r}'.format(text))
        return int(text)

    def version(text):
        suite = debnode.suite_of(text)
        if suite:  # a Debian version: the node runs Debian's own packages of it (host.debnode)
            first = debnode.SUITES[suite]['versions'][0]
            if text != first:
                raise host.LabError('--drivers: a Debian {0} node starts on {1} (offer {2} to it later: '
                                    'manager.offer_driver), got {2!r}'.format(suite, first, text))
            return text
        parts = text.split('.')
        if len(parts) < 2 or not all(p.isdigit() for p in parts):
            raise host.LabError('--drivers takes NVIDIA driver versions such as 580.95.05, or a Debian version of '
                                "Debian's own packages ({0}), got {1!r}".format(
                                    ', '.join(s['versions'][0] for s in debnode.SUITES.values()), text))
        return text
    old = dict((spec['name'], spec) for spec in current)
    names = ['pve{0}'.format(i + 1) for i in range(count)]
    counts = _per_node('--gpus', gpus, count, gpu_count) if gpus is not None else [
        old.get(n, {}).get('gpus', lab.gpus) for n in names]
    versions = _per_node('--drivers', drivers, count, version) if drivers is not None else [
        debnode.SUITES[old[n]['debian']]['versions'][0] if old.get(n, {}).get('debian') else
        old[n]['driver'] if n in old else DEFAULT_DRIVERS.get(n, DRIVER_VERSION) for n in names]
    held = sorted(set(item.get('node') for item in _saved_state(lab).get('cts') or []) - set(names) - {None})
    if held:
        raise host.LabError('node(s) {0} hold containers: destroy them (or gpufleet lab reset) before taking the '
                            'node away'.format(', '.join(held)))
    return [node_spec(n, SSH_PORT + i, counts[i], versions[i]) for i, n in enumerate(names)]


def node_spec(name, port, gpus, driver):
    """A node of the cluster: a driver given as a Debian version (535.261.03-1) makes it a node on Debian's own
    packaging of that suite, its driver the upstream version."""
    suite = debnode.suite_of(driver)
    spec = {'name': name, 'ssh_port': port, 'gpus': gpus, 'driver': debnode.upstream(driver) if suite else driver}
    if suite:
        spec['debian'] = suite
    return spec


def _saved_state(lab):
    """What the API saved last: its containers (cts, each with its node) and the nodes node-down took (offline)."""
    try:
        with open(lab.state_file) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def set_nodes(lab, specs, record):
    """Write the cluster down; the nodes it no longer has are taken away (their sshd, device nodes and files), and
    a node whose GPUs or driver change gets its stand-ins made again."""
    before = dict((spec['name'], spec) for spec in lab.node_specs())
    wanted = dict((spec['name'], spec) for spec in specs)
    if before == wanted:
        return
    host.stop_daemon(lab)  # it serves the nodes it started with (and would write the old nodes' files back)
    for name, spec in before.items():
        if wanted.get(name) == spec:
            continue
        old = lab.on(name)
        host.remove_gpus(record, old)
        if name in wanted and (wanted[name].get('debian') or '') != old.debian:
            # another packaging: the node's own files, driver and commands are made again for it
            for path in (old.node_files, old.driver_dir, old.bin_dir, old.proc_dir):
                shutil.rmtree(path, ignore_errors=True)
        if name not in wanted:
            host.stop_sshd(old)
            for path in (old.node_root, os.path.join(lab.pve_root, 'nodes', name)):
                if os.path.isdir(path):
                    shutil.rmtree(path)
    if os.path.isdir(lab.path('nodes')) and not os.listdir(lab.path('nodes')):
        os.rmdir(lab.path('nodes'))
    if specs == lab.one_node():
        if os.path.exists(lab.nodes_file):
            os.unlink(lab.nodes_file)
    else:
        write_json(lab.nodes_file, specs)


def up(lab=None, say=print, nodes=None, gpus=None, drivers=None):
    """Bring the lab up, or make sure it is; returns what `status` returns. nodes, gpus, drivers: the cluster to
    make (see plan_nodes); without them, the one the lab has (one node, pve1, at first)."""
    lab = lab or Lab()
    problems = host.preflight()
    if problems:
        raise host.LabError('the lab cannot run on this host:\n  - ' + '\n  - '.join(problems))
    started = time.monotonic()
    os.makedirs(lab.root, mode=0o755, exist_ok=True)
    record = lab.record()
    try:
        specs = plan_nodes(lab, nodes, gpus, drivers)
        host.ensure_subids(record)
        host.ensure_base(lab, say)
        host.ensure_wheelhouse(lab, say, cluster=len(specs) > 1)
        set_nodes(lab, specs, record)
        for node in lab.cluster():
            host.ensure_gpus(node, record, say)
        host.ensure_network(lab, record)
        host.ensure_sysctls(record)
        host.ensure_tls(lab)
        host.ensure_credentials(lab)
        offline = set(_saved_state(lab).get('offline') or [])  # the nodes node-down took stay down
        for node in lab.cluster():
            if node.node not in offline:
                host.ensure_sshd(node)
        host.ensure_commands(lab, record)
        host.ensure_templates(lab)
        os.makedirs(lab.lxcpath, exist_ok=True)
        host.start_daemon(lab)
        host.wait_api(lab)
    finally:
        lab.save_record(record)
    say('lab up in {0:.1f} s: PVE API https://{1}:{2}, {3}'.format(
        time.monotonic() - started, lab.api_host, lab.api_port, ', '.join(
            'node {0} (ssh root@127.0.0.1:{1}, {2} GPUs)'.format(n.node, n.ssh_port, n.gpus) for n in lab.cluster())))
    return status(lab)


def down(lab=None, say=print):
    """Take everything the lab made away: containers, API, sshd, bridge and NAT, device nodes, `pct` and `pvesm`."""
    lab = lab or Lab()
    record = lab.record()
    host.stop_daemon(lab)
    containers = Containers(lab)
    for vmid in containers.all():
        containers.destroy(vmid)
    for node in lab.cluster():
        host.stop_sshd(node)
    host.remove_commands(record)
    host.remove_gpus(record)
    host.remove_network(record)
    host.remove_sysctls(record)
    host.remove_subids(record)
    host.remove_lxc_cgroups()
    if os.path.isdir(lab.root):
        shutil.rmtree(lab.root)
    say('lab down: nothing of it is left (the base image and wheels stay cached in {0})'.format(lab.cache))


def reset(lab=None, say=print):
    """Back to an empty node: every container destroyed, the API's state cleared; the lab stays up."""
    lab = lab or Lab()
    host.stop_daemon(lab)
    containers = Containers(lab)
    for vmid in containers.all():
        containers.destroy(vmid)
    for path in (lab.state_file,):
        if os.path.exists(path):
            os.unlink(path)
    for node in lab.cluster():
        if os.path.isdir(node.pve_conf_dir):
            shutil.rmtree(node.pve_conf_dir)
        host.reset_kernel(node)  # each node's kernel, module and packages as a node starts (up makes them)
    host.remove_lxc_cgroups()
    say('lab reset: no containers')
    return up(lab, say)


def run_boot_units(lab):
    """The node's own boot: each unit enabled under the node's /etc/systemd/system (multi-user.target.wants, in
    name order) whose program is one of the node's own files (the ones written there, as gpu_node's boot unit is),
    run as systemd would, before pve-guests starts the onboot containers; {unit: [exit code, output]}. A node on
    Debian's own packaging has its distribution's units too (networkd, cron...): the lab does not boot that system,
    only its kernel side."""
    wants = os.path.join(lab.node_files, 'etc', 'systemd', 'system', 'multi-user.target.wants')
    ran = {}
    for unit in sorted(glob.glob(os.path.join(wants, '*.service'))):
        with open(unit) as fh:
            commands = [line.split('=', 1)[1].strip() for line in fh if line.startswith('ExecStart=')]
        for command in commands:
            argv = shlex.split(command.lstrip('-@:+!'))
            if not argv or not argv[0].startswith(lab.node_files + os.sep):
                continue
            out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, timeout=120, check=False)
            ran[os.path.basename(unit)] = [out.returncode, out.stdout.strip()]
    return ran


def _node(lab, name):
    try:
        return lab.on(name or lab.node)
    except NodeError as e:
        raise host.LabError(str(e)) from None


def node_down(lab=None, name=None, offline=True, say=print):
    """The node goes down (off, or cut off from the cluster): its containers stop, its sshd stops, its NVIDIA device
    nodes go with its /dev; the cluster sees it offline (the API answers requests for it with 595 and shows its
    guests' status as unknown). offline=False: it is going down to come straight back (a reboot). Returns
    {node, uvm_major}: the major nvidia-uvm will have when it is back."""
    lab = lab or Lab()
    node = _node(lab, name)
    record = lab.record()
    Control(lab).call('POST', '/node', {'node': node.node, 'phase': 'down', 'offline': bool(offline)})
    if offline:
        host.stop_sshd(node, sessions=True)
    try:
        uvm = host.lose_gpu_nodes(node, record) if node.gpus else None
    finally:
        lab.save_record(record)
    if offline:
        say('node {0} is down'.format(node.node))
    return {'node': node.node, 'uvm_major': uvm}


def node_up(lab=None, name=None, say=print):
    """The node boots: its sshd starts, its boot units run (none of the lab's own stand-ins: what makes the NVIDIA
    device nodes is the node's business), the cluster sees it online, and its containers with onboot start as
    pve-guests starts them, each failing where a device it passes through is missing. Returns {node, units,
    started: [{vmid, exitstatus}]}."""
    lab = lab or Lab()
    node = _node(lab, name)
    host.ensure_boot_id(node, new=True)
    host.ensure_sshd(node)
    units = run_boot_units(node)
    started = Control(lab).call('POST', '/node', {'node': node.node, 'phase': 'up'})
    for unit, (code, out) in sorted(units.items()):
        say('boot: {0} exited {1}{2}'.format(unit, code, ': ' + out.splitlines()[-1] if out else ''))
    for item in started:
        say('onboot CT {0}: {1}'.format(item['vmid'], item['exitstatus']))
    return {'node': node.node, 'units': units, 'started': started}


def reboot_node(lab=None, name=None, say=print):
    """The node reboots, as its containers and GPUs see it: every container of it stops; the NVIDIA device nodes
    are gone and nvidia-uvm comes back on another major; the node's boot units run; then the containers with
    onboot start as pve-guests starts them. Returns {node, uvm_major, units, started: [{vmid, exitstatus}]}."""
    down = node_down(lab, name, offline=False, say=say)
    return dict(down, **node_up(lab, name, say=say))


def swap_gpus(lab=None, name=None, a=0, b=1, say=print):
    """Two of a node's GPU cards change slots, as in a maintenance that swaps them: the node goes down, the cards
    move (each slot keeps its bus, index and device minor; the UUIDs move with the cards), and the node boots again
    (reboot_node's result)."""
    lab = lab or Lab()
    host.swap_cards(_node(lab, name), a, b)
    return reboot_node(lab, name, say=say)


def install_kernel(lab=None, name=None, release='6.17.2-1-pve', module='built', version=None, pin=None,
                   headers=True):
    """A kernel installed on a node beside the one it runs, as an upgrade installs it, with the NVIDIA module of
    version (the node's driver by default) 'built' for it by DKMS, 'failed' (its make.log) or None (not built); pin:
    'pin' or 'next-boot' to pin release as proxmox-boot-tool kernel pin [--next-boot] does (/etc/kernel/...);
    headers: False for a PVE kernel installed without its proxmox-headers package (PVE's default)."""
    host.add_kernel(_node(lab or Lab(), name), release, module, version, pin, headers)
    return release


def remove_kernel(lab=None, name=None, release='6.17.2-1-pve'):
    """A kernel that install_kernel installed, gone again (the node's other kernels and packages untouched)."""
    host.remove_kernel(_node(lab or Lab(), name), release)


def restore_kernel(lab=None, name=None):
    """A node's kernels, NVIDIA module and driver packages as the node started with them (what install_kernel and
    hold_driver and driver installs did undone; a module of another version loaded since is the node's own again)."""
    lab = lab or Lab()
    node = _node(lab, name)
    host.reset_kernel(node)
    host.ensure_kernel(node)
    if node.gpus:
        host.write_userspace(node)


def offer_driver(lab=None, name=None, version='580.105.08', fails_on=(), moves=None):
    """A node's package sources offer the NVIDIA driver of version (Debian's packages, version-1), whose module
    does not build for the kernels in fails_on, and with which apt moves the node's packages in moves ({package:
    version}): `apt-get install` on the node installs it beside the loaded one, and the node's next boot loads it."""
    host.offer_driver(_node(lab or Lab(), name), version, fails_on, moves)
    return version


def upgrade_release(lab=None, vmid=None, release='trixie'):
    """What a distribution upgrade inside a stopped container (apt full-upgrade to the next Debian) leaves, made in
    seconds: its root file system's base is now release's (layout.RELEASES: the other Python among it), its own files
    (its venvs, /root, /etc as it changed it) kept. It takes effect at the container's next start."""
    lab = lab or Lab()
    if release not in RELEASES:
        raise NodeError('no release {0} (the lab has {1})'.format(release, ', '.join(sorted(RELEASES))))
    for node in lab.cluster():
        backend = Containers(node)
        if backend.exists(vmid):
            if backend.state(vmid) == 'running':
                raise NodeError('CT {0} runs: stop it first'.format(vmid))
            backend.set_release(vmid, release)
            return release
    raise NodeError('there is no CT {0} in the lab'.format(vmid))


def hold_driver(lab=None, name=None, held=True):
    """A node's driver packages held from upgrades (apt-mark hold) or not."""
    lab = lab or Lab()
    host.hold_driver(_node(lab, name), held)


def status(lab=None):
    lab = lab or Lab()
    record = lab.record()
    out = {
        'root': lab.root,
        'api': 'https://{0}:{1}'.format(lab.api_host, lab.api_port),
        'api_running': host.daemon_running(lab),
        'sshd_running': host.sshd_running(lab),
        'bridge': os.path.isdir('/sys/class/net/{0}'.format(lab.bridge)),
        'gpus': record.get('gpus', {}),
        'nodes': [{'name': n.node, 'ssh_port': n.ssh_port, 'sshd_running': host.sshd_running(n), 'gpus': n.gpus,
                   'driver': n.driver_version, 'debian': n.debian or None,
                   'uvm_major': (record.get(host.gpu_record_key(n)) or {}).get('uvm_major')}
                  for n in lab.cluster()],
        'template': 'local:vztmpl/' + TEMPLATE,
        'containers': [],
    }
    if out['api_running']:
        try:
            out['containers'] = Control(lab).get('/state')
        except OSError as e:
            out['error'] = str(e)
    else:
        containers = Containers(lab)
        out['containers'] = [{'vmid': v, 'api': None, 'real': containers.state(v)} for v in containers.all()]
    return out


def render_status(st):
    lines = ['lab: {0}'.format('up' if st['api_running'] else 'down'),
             '  PVE API  {0}  ({1})'.format(st['api'], 'running' if st['api_running'] else 'not running'),
             '  bridge   {0}'.format('present' if st['bridge'] else 'absent')]
    gpus = st.get('gpus') or {}
    for node in st.get('nodes') or []:
        real = node['name'] == NODE and gpus.get('real')
        lines.append('  node {0}  sshd 127.0.0.1:{1} {2}, {3}'.format(
            node['name'], node['ssh_port'], 'running' if node['sshd_running'] else 'not running',
            'real NVIDIA nodes' if real else '{0} GPU stand-ins, driver {1}{2}{3}'.format(
                node['gpus'], node['driver'], " (Debian {0}'s own packages)".format(node['debian'])
                if node.get('debian') else '', ' (nvidia-uvm major {0})'.format(node['uvm_major'])
                if node['uvm_major'] else '')))
    lines.append('')
    lines.append('  {0:<6} {1:<6} {2:<20} {3:<9} {4:<9} {5}'.format('VMID', 'NODE', 'HOSTNAME', 'API', 'LXC', 'AGREE'))
    for ct in st['containers']:
        agree = ct.get('api') == (ct.get('real') or 'absent') or ct.get('api') == 'unknown'
        lines.append('  {0:<6} {1:<6} {2:<20} {3:<9} {4:<9} {5}'.format(
            ct['vmid'], ct.get('node') or '-', ct.get('hostname') or '-', ct.get('api') or '-', ct.get('real') or '-',
            'yes' if agree else 'NO'))
    if not st['containers']:
        lines.append('  (no containers)')
    return '\n'.join(lines)


def dumps(st):
    return json.dumps(st, indent=2, sort_keys=True)
