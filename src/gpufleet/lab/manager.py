"""`gpufleet lab up | down | status | reset | reboot-node`."""

import glob
import json
import os
import shlex
import shutil
import subprocess
import time

from . import host
from .containers import Containers
from .control import Control
from .layout import Lab, TEMPLATE


def up(lab=None, say=print):
    """Bring the lab node up, or make sure it is; returns what `status` returns."""
    lab = lab or Lab()
    problems = host.preflight()
    if problems:
        raise host.LabError('the lab cannot run on this host:\n  - ' + '\n  - '.join(problems))
    started = time.monotonic()
    os.makedirs(lab.root, mode=0o755, exist_ok=True)
    record = lab.record()
    try:
        host.ensure_subids(record)
        host.ensure_base(lab, say)
        host.ensure_wheelhouse(lab, say)
        host.ensure_gpus(lab, record, say)
        host.ensure_network(lab, record)
        host.ensure_tls(lab)
        host.ensure_credentials(lab)
        host.ensure_sshd(lab)
        host.ensure_pct(lab, record)
        os.makedirs(lab.lxcpath, exist_ok=True)
        host.start_daemon(lab)
        host.wait_api(lab)
    finally:
        lab.save_record(record)
    say('lab up in {0:.1f} s: PVE API https://{1}:{2}, node {3}, ssh root@127.0.0.1:{4}'.format(
        time.monotonic() - started, lab.api_host, lab.api_port, lab.node, lab.ssh_port))
    return status(lab)


def down(lab=None, say=print):
    """Take everything the lab made away: containers, API, sshd, bridge and NAT, device nodes, `pct`."""
    lab = lab or Lab()
    record = lab.record()
    host.stop_daemon(lab)
    containers = Containers(lab)
    for vmid in containers.all():
        containers.destroy(vmid)
    host.stop_sshd(lab)
    host.remove_pct(record)
    host.remove_gpus(record)
    host.remove_network(record)
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
    if os.path.isdir(lab.pve_conf_dir):
        shutil.rmtree(lab.pve_conf_dir)
    host.remove_lxc_cgroups()
    say('lab reset: no containers')
    return up(lab, say)


def run_boot_units(lab):
    """The node's own boot: each unit enabled under the lab node's /etc/systemd/system (multi-user.target.wants, in
    name order) run as systemd would, before pve-guests starts the onboot containers; {unit: [exit code, output]}."""
    wants = lab.path('node', 'etc', 'systemd', 'system', 'multi-user.target.wants')
    ran = {}
    for unit in sorted(glob.glob(os.path.join(wants, '*.service'))):
        with open(unit) as fh:
            commands = [line.split('=', 1)[1].strip() for line in fh if line.startswith('ExecStart=')]
        for command in commands:
            out = subprocess.run(shlex.split(command.lstrip('-')), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, timeout=120, check=False)
            ran[os.path.basename(unit)] = [out.returncode, out.stdout.strip()]
    return ran


def reboot_node(lab=None, say=print):
    """The node reboots, as its containers and GPUs see it: every container stops; the NVIDIA device nodes are gone
    and nvidia-uvm comes back on another major; the node's boot units run; then the containers with onboot start
    as pve-guests starts them, each failing where a device it passes through is missing. Returns {uvm_major,
    units, started: [{vmid, exitstatus}]}."""
    lab = lab or Lab()
    record = lab.record()
    control = Control(lab)
    control.call('POST', '/node', {'phase': 'down'})
    try:
        uvm = host.lose_gpu_nodes(lab, record)
    finally:
        lab.save_record(record)
    units = run_boot_units(lab)
    started = control.call('POST', '/node', {'phase': 'up'})
    for unit, (code, out) in sorted(units.items()):
        say('boot: {0} exited {1}{2}'.format(unit, code, ': ' + out.splitlines()[-1] if out else ''))
    for item in started:
        say('onboot CT {0}: {1}'.format(item['vmid'], item['exitstatus']))
    return {'uvm_major': uvm, 'units': units, 'started': started}


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
             '  sshd     {0}'.format('running' if st['sshd_running'] else 'not running'),
             '  bridge   {0}'.format('present' if st['bridge'] else 'absent')]
    gpus = st.get('gpus') or {}
    if gpus:
        lines.append('  GPUs     {0}'.format('real NVIDIA nodes' if gpus.get('real') else
                                             '{0} stand-ins (nvidia-uvm major {1})'.format(gpus.get('count'),
                                                                                         gpus.get('uvm_major'))))
    lines.append('')
    lines.append('  {0:<6} {1:<20} {2:<9} {3:<9} {4}'.format('VMID', 'HOSTNAME', 'API', 'LXC', 'AGREE'))
    for ct in st['containers']:
        agree = ct.get('api') == (ct.get('real') or 'absent')
        lines.append('  {0:<6} {1:<20} {2:<9} {3:<9} {4}'.format(ct['vmid'], ct.get('hostname') or '-',
                                                                ct.get('api') or '-', ct.get('real') or '-',
                                                                'yes' if agree else 'NO'))
    if not st['containers']:
        lines.append('  (no containers)')
    return '\n'.join(lines)


def dumps(st):
    return json.dumps(st, indent=2, sort_keys=True)
