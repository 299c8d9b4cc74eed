# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor's verdicts: what a first run needs, from what the doctor playbook read on each node and through the
API, as rows {where, check, ok, detail, fix}. Pure: the reading is the action's (fleet_doctor) and the nodes'
tasks'. A row that is not ok stops a first run; its fix says what to do."""

import re

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _snapshot
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _container_python, _drift, _profile

GIB = 1024 ** 3


def row(where, check, ok, detail, fix=''):
    return {'where': where, 'check': check, 'ok': bool(ok), 'detail': detail, 'fix': '' if ok else fix}


def ssh_row(node, reach, address):
    """Whether the node answered over SSH (reach: the registered result of the doctor's first task on it)."""
    if not reach.get('unreachable'):
        return row(node, 'ssh', True, 'logged in as {0}'.format(address))
    msg = (reach.get('msg') or '').strip()
    if 'Host key verification failed' in msg or 'REMOTE HOST IDENTIFICATION HAS CHANGED' in msg:
        fix = ("add the node's host key to the controller's known_hosts, after checking its fingerprint on the node "
               "(ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub): ssh-keyscan -p {port} {host} >> ~/.ssh/known_hosts")
    elif 'Permission denied' in msg:
        fix = "install the controller's public key for the node's user: ssh-copy-id -p {port} {user}@{host}"
    else:
        fix = ('check the address (ansible_host, ansible_port) and that sshd runs on the node: '
               'ssh -p {port} {user}@{host} true')
    return row(node, 'ssh', False, 'not reached: ' + short(msg), fix.format(**address_parts(address)))


def address_parts(address):
    m = re.match(r'^(?:(?P<user>[^@]+)@)?(?P<host>[^:]+)(?::(?P<port>\d+))?$', address or '')
    parts = m.groupdict() if m else {}
    return {'user': parts.get('user') or 'root', 'host': parts.get('host') or address, 'port': parts.get('port') or 22}


def short(text, limit=300):
    text = ' '.join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + '...'


def login_fix(why, user, token_id=None):
    """What to do about a login PVE refused (why: the error), for the password or, with token_id, the token."""
    if 'CA certificate' in why or 'CERTIFICATE_VERIFY_FAILED' in why or 'certificate verify failed' in why:
        return ("give the cluster's CA: copy /etc/pve/pve-root-ca.pem from a node and point gpufleet_api_ca_path at "
                'it (certificate checks stay on)')
    if token_id:
        return ('check the token (pveum user token list {0}); a token with privilege separation needs its own ACL: '
                "pveum acl modify / --tokens '{0}!{1}' --roles PVEAuditor".format(user, token_id))
    return ('check gpufleet_api_user and gpufleet_api_password (a PAM user is user@pam); devN passthrough needs '
            'root@pam with its password')


def pct_row(node, found):
    if found:
        return row(node, 'pct', True, found)
    return row(node, 'pct', False, 'pct is not on the PATH of the node\'s login',
               'log in as root on a PVE node (pct is pve-container\'s); a non-root user needs sudo rights for pct')


def driver_rows(node, devices, gpus_asked):
    """The node's NVIDIA side (devices: gpu_devices' result) against what the fleet asks of it (gpus_asked: how many
    containers ask it for GPUs)."""
    if not gpus_asked:
        return [row(node, 'gpus', True, 'no container of the fleet asks this node for a GPU' + (
            ' (driver {0} loaded)'.format(devices['driver_version']) if devices.get('driver_version') else ''))]
    version = devices.get('driver_version')
    if not version:
        return [row(node, 'driver', False, 'no NVIDIA kernel module is loaded, and {0} container(s) of the fleet ask '
                    'this node for GPUs'.format(gpus_asked),
                    'install the NVIDIA driver on the node and load it (modprobe nvidia), or move those containers '
                    'to a GPU node')]
    out = [row(node, 'driver', True, 'NVIDIA {0}, {1} GPU(s)'.format(version, len(devices.get('gpus') or [])))]
    findings = devices.get('findings') or []
    made = [f for f in findings if _drift.mended_by_a_run(f)]  # what a site run makes by itself: no reason to wait
    blocking = [f for f in findings if f not in made and f.get('code') != 'driver_not_loaded']
    if made:
        out.append(row(node, 'devices', True, 'the first run makes: ' + '; '.join(f.get('msg', f['code']) for f in made)))
    for f in blocking:
        out.append(row(node, f['code'], False, f.get('msg', f['code']), f.get('fix', '')))
    if not made and not blocking:
        out.append(row(node, 'devices', True, 'device nodes and driver bundle as the containers need them'))
    return out


def wheelhouse_row(node, offline, wheels, where, index=None, index_error=None):
    """The containers' packages: in offline mode the node's wheelhouse (wheels: how many *.whl files at where);
    else the index, as the node reaches it (index_error: why not)."""
    if offline:
        if wheels:
            return row(node, 'wheelhouse', True, '{0} wheel(s) in {1}'.format(wheels, where))
        return row(node, 'wheelhouse', False, 'offline mode, and {0} holds no wheels'.format(where),
                   "put the profile's wheels there (docs/venv.md, the air-gapped download), or set "
                   'torch_venv_offline: false where the containers reach an index')
    if index_error is None:
        return row(node, 'index', True, '{0} answers'.format(index))
    return row(node, 'index', False, '{0} does not answer from the node: {1}'.format(index, short(index_error)),
               "give the containers a way out (a proxy in torch_venv_environment) or go offline with a wheelhouse "
               '(torch_venv_offline: true, docs/venv.md)')


def rootfs_gib(value, storage):
    """(storage, GiB) of a rootfs value of the plan ('local-lvm:32' or 'local-lvm:32,mountoptions=...')."""
    volume = str(value).split(',', maxsplit=1)[0]
    sid, _sep, size = volume.partition(':')
    try:
        return sid or storage, float(size)
    except ValueError:
        return sid or storage, 0.0


def storage_rows(node, wanted, status):
    """Room for the root disks of the containers a first run creates on node. wanted: {storage: GiB}, status:
    {storage: the API's storage status, or an error string}."""
    out = []
    for sid in sorted(wanted):
        got = status.get(sid)
        if isinstance(got, str) or not got:
            out.append(row(node, 'storage', False, '{0}: {1}'.format(sid, got or 'not on this node'),
                           'add the storage to the node (Datacenter > Storage, nodes) or set gpufleet_storage to one it '
                           'has (pvesm status on the node lists them)'))
            continue
        if not got.get('active', 1) or not got.get('enabled', 1):
            out.append(row(node, 'storage', False, '{0} is not active on the node'.format(sid),
                           'enable and activate it (pvesm set {0} --disable 0; pvesm status)'.format(sid)))
            continue
        avail = float(got.get('avail') or 0) / GIB
        if avail < wanted[sid]:
            out.append(row(node, 'storage', False, '{0} has {1:.1f} GiB free; the new containers\' root disks need '
                           '{2:.0f} GiB'.format(sid, avail, wanted[sid]),
                           'free space on {0}, give smaller rootfs sizes, or another storage (gpufleet_storage)'.format(
                               sid)))
        else:
            out.append(row(node, 'storage', True, '{0}: {1:.1f} GiB free for {2:.0f} GiB of new root disks'.format(
                sid, avail, wanted[sid])))
    return out


def snapshot_rows(plan, storages):
    """Whether PVE can snapshot each container of the plan, a row a node (storages: {id: type} from the API). A
    container it cannot snapshot is said, with why and how to change that; a first run still makes it (the row is
    not a failure)."""
    found = {}
    for spec in plan.get('wanted') or []:
        if spec.get('state') == 'absent':
            continue
        found.setdefault(spec['node'], []).append((spec['vmid'], spec.get('hostname'),
                                                   _snapshot.spec_refusal(spec, storages)))
    out = []
    for node in sorted(found):
        no = ['CT {0} ({1}): {2}'.format(v, h, why) for v, h, why in found[node] if why]
        out.append(row(node, 'snapshots', True, (
            'PVE cannot snapshot {0}'.format('; '.join(no)) if no else
            'PVE can snapshot each of its {0} container(s)'.format(len(found[node])))))
    return out


def template_row(node, volid, have, error=None):
    if error is not None:
        return row(node, 'template', False, '{0}: {1}'.format(volid, short(error)),
                   'check the template storage on the node: pveam list {0}'.format(volid.split(':')[0]))
    if volid in have:
        return row(node, 'template', True, volid)
    return row(node, 'template', False, '{0} is not on the node'.format(volid),
               'pveam update && pveam download {0} {1}'.format(volid.split(':')[0], volid.split('/')[-1]))


def python_row(node, volid, looked):
    """Whether a template that new containers are made from holds python3, which Ansible's modules and the venv
    build run on in the container. looked: the node's look into it (the doctor's task on the node: rc 0 with
    stdout python3 or none, 3 where `pvesm path` failed, 4 where tar could not list the file), None where the node
    did not look (it was not reached: its ssh row says so)."""
    if not looked or looked.get('unreachable') or looked.get('skipped'):
        return None
    said = short(looked.get('stderr') or looked.get('msg') or '')
    out = (looked.get('stdout') or '').strip()
    if looked.get('rc') == 0 and out == 'python3':
        return row(node, 'template python3', True, '{0} holds /usr/bin/python3'.format(volid))
    if looked.get('rc') == 0 and out == 'none':
        return row(node, 'template python3', False, '{0} holds no /usr/bin/python3: Ansible\'s modules and the venv '
                   'build run on the container\'s python3'.format(volid),
                   'use a template that has it (pveam available --section system: debian-12-standard or '
                   'ubuntu-24.04-standard), or make one: a container from this template with python3 installed, '
                   'then vzdump of it into the template storage (gpufleet_template)')
    if looked.get('rc') == 3:
        return row(node, 'template python3', False, 'pvesm path {0}: {1}'.format(volid, said),
                   'check the volume id and its storage on the node: pvesm path {0}'.format(volid))
    return row(node, 'template python3', False, '{0} could not be read: {1}'.format(volid, said),
               'check the file on the node: tar -tf "$(pvesm path {0})" (zstd, xz or gzip installed)'.format(volid))


def python_rows(node, answered, fleet, profiles=None):
    """Whether the Python of each running container of the fleet on node starts and is one its venv profile's lock
    is for (answered: the node's run of the python probe over them, None where it did not run; profiles: the plan's
    venv_pythons, {vmid: {name, dir, pythons}}), one row each, named by its hostname in fleet (the definition's
    entries)."""
    names = dict((e.get('vmid'), e.get('hostname')) for e in fleet or [] if isinstance(e, dict) and e.get('hostname'))
    rows = []
    for vmid, text in sorted(_container_python.each(answered).items()):
        found = _container_python.parse(text, '/usr/bin/python3')
        bad = _container_python.finding(found)
        where = '{0} (CT {1} on {2})'.format(names.get(vmid, 'CT {0}'.format(vmid)), vmid, node)
        profile = (profiles or {}).get(vmid) or (profiles or {}).get(str(vmid)) or {}
        if bad:
            rows.append(row(where, 'container python', False, bad['msg'], bad['fix']))
        elif profile.get('pythons') and found['version'] not in profile['pythons']:
            rows.append(row(where, 'container python', False, 'Python {0} starts, but the profile {1} is locked for '
                            'Python {2}'.format(found['version'], profile['name'], ', '.join(profile['pythons'])),
                            _profile.relock_fix(profile['name'], found['version'], profile['dir'])))
        else:
            rows.append(row(where, 'container python', True, 'Python {0} starts'.format(found['version'])))
    return rows


def changes_row(result):
    """What the fleet's check run would do (lxc_container's containers and orphans, in check mode), as one row."""
    counts = {}

    def count(what):
        counts[what] = counts.get(what, 0) + 1
    for c in result.get('containers') or []:
        if c.get('created'):
            count('create')
        elif c.get('status') == 'absent' and c.get('changed'):
            count('destroy')
        elif c.get('changed_keys'):
            count('change')
        if c.get('power'):
            count(c['power'])
    said = ('a run would ' + ', '.join('{0} {1}'.format(what, n) for what, n in sorted(counts.items()))
            if counts else 'a run would change nothing')
    orphans = result.get('orphans') or []
    if orphans:
        said += '; {0} orphan(s) left alone ({1})'.format(len(orphans), ', '.join(str(o['vmid']) for o in orphans))
    return row('fleet', 'plan', True, said)


def ready(rows):
    return all(r['ok'] for r in rows)
