# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Declarative LXC containers on PVE: the reconcile (create, update with digest, power state, destroy) of one or many
containers, through the API, of the config _lxc_config makes and compares.

The rules:
- nothing is created, changed or destroyed in check mode, and every change is in the diff;
- an existing container is never destroyed or recreated unless `state: absent`.
"""


import os

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _lxc_config, _pveconf, _snapshot
from ansible_collections.gpufleet.proxmox.plugins.module_utils._pve import PveClient, PveError, missing_proxmoxer, pve_version


class Reconciler(object):
    """Reconcile containers with one client and one read of the cluster's guests.

    Two phases: `plan` reads and compares (and raises SpecError for anything PVE would refuse),
    `apply` sends the changes.  `reconcile_all` plans every container before it applies any.
    """

    def __init__(self, client, check_mode=False, lock_timeout=60, snapshots=None):
        self.client = client
        self.check_mode = check_mode
        self.lock_timeout = lock_timeout
        # {keep, optional}: a snapshot before a config change that a restart here makes effective (None: none)
        self.snapshots = snapshots
        self._storages = None
        self._guests = None
        self._live = {}
        self._hot_devices = {}

    def guests(self):
        if self._guests is None:
            self._guests = self.client.guests()
        return self._guests

    def check_nodes(self, specs):
        """Every node the containers name is a node of the cluster, before anything changes. A node that holds a
        guest is one; only where a container names another is the cluster's node list read (one request)."""
        known = set(g.get('node') for g in self.guests().values())
        unknown = [spec for spec in specs if spec.get('node') and spec['node'] not in known]
        if not unknown:
            return
        nodes = self.client.nodes()
        bad = ['vmid {0}: node {1} is not a node of the cluster (its nodes: {2})'.format(
            spec['vmid'], spec['node'], ', '.join(nodes)) for spec in unknown if spec['node'] not in nodes]
        if bad:
            raise _lxc_config.SpecError('; '.join(bad))

    def live_status(self, node, vmid, listed):
        """A container's power state as its node sees it now. /cluster/resources has it from pvestatd's last round,
        which lags behind a start or stop and says 'unknown' for a new guest (pve-manager PVE/API2/Cluster.pm
        resources), so power is decided on the node's own list, GET /nodes/<node>/lxc (pve-container
        src/PVE/API2/LXC.pm vmlist, PVE::LXC::vmstatus: read live): one request per node, where its containers are
        planned. listed: the cluster list's status, kept where the node does not answer."""
        if node not in self._live:
            try:
                self._live[node] = dict((int(c['vmid']), c.get('status')) for c in self.client.get(
                    'nodes/{0}/lxc'.format(node)))
            except PveError:
                self._live[node] = {}
        return self._live[node].get(vmid) or listed

    def hot_devices(self, node):
        """Whether a node hot-plugs a new devN into a running container, read once a node and only when a plan needs
        it: pve-container 6.0.4 (PVE 9) does; 5.x (PVE 8) keeps every devN change pending until a restart. The
        change is made on the container's node (API2/LXC/Config.pm: proxyto node), so that node's version decides."""
        if node not in self._hot_devices:
            self._hot_devices[node] = pve_version(self.client.node_version(node).get('version')) >= (9, 0)
        return self._hot_devices[node]

    def hot(self, key, sets, current, node):
        """Whether PVE applies this change to the running container at once (else it waits in pending): the keys it
        applies live, and a devN or mpN key that is new (an existing one is never hot-plugged over)."""
        if key in HOT_KEYS:
            return True
        if key not in sets or key in current:
            return False
        family = _lxc_config.key_family(key)
        return family == 'mp' or family == 'dev' and self.hot_devices(node)

    # -- phase 1: read and compare ------------------------------------------------------
    def plan(self, spec):
        vmid = spec['vmid']
        g = self.guests().get(vmid)
        if g is not None and g.get('type') != 'lxc':
            raise _lxc_config.SpecError('vmid {0} is a {1} guest, not a container'.format(vmid, g.get('type')))
        node = g['node'] if g else spec.get('node')
        status = self.live_status(node, vmid, g.get('status')) if g else None
        res = dict(vmid=vmid, node=node, changed=False, created=False, changed_keys=[], pending=[],
                   restart_required=False, status=status or 'absent',
                   diff=dict(before={}, after={}, before_header='CT {0}'.format(vmid),
                             after_header='CT {0}'.format(vmid)))
        plan = dict(spec=spec, vmid=vmid, node=node, status=status, res=res, exists=g is not None,
                    path='nodes/{0}/lxc/{1}'.format(node, vmid), action=None)
        if spec['state'] == 'absent':
            return self._plan_absent(plan)
        values, owned = _lxc_config.wanted_config(spec)
        if g is None:
            return self._plan_create(plan, values)
        current, pending_now = self.read_config(plan['path'], status)
        values = _lxc_config.keep_device_keys(values, current, pending_now)
        if spec.get('node') and spec['node'] != node:
            self._plan_move(plan, current)
        plan.update(current=current, values=values, owned=owned)
        res['config'] = dict((k, v) for k, v in current.items() if k != 'digest')
        unpriv = bool(int(current.get('unprivileged', 0)))
        if spec.get('unprivileged') is not None and unpriv != spec['unprivileged']:
            raise _lxc_config.SpecError('vmid {0}: unprivileged is {1} and cannot change on an existing container; '
                                        'remove it (state: absent) and create it again to change it'.format(vmid, unpriv))
        sets, deletes, before, after = _lxc_config.plan_update(values, owned, current)
        try:
            resize = _lxc_config.plan_resize(values, current)
        except _lxc_config.SpecError as e:
            raise _lxc_config.SpecError('vmid {0}: {1}'.format(vmid, e))
        self._check_passthrough(vmid, sets, deletes)
        plan.update(sets=sets, deletes=deletes, resize=resize)
        for key, value in sets.items():
            res['config'][key] = value
        for key in deletes:
            res['config'].pop(key, None)
        res['diff']['before'].update(before)
        res['diff']['after'].update(after)
        if resize:
            res['diff']['before']['rootfs'] = current.get('rootfs')
            res['diff']['after']['rootfs'] = 'size={0}'.format(resize)
        self._plan_raw(plan)
        res['changed_keys'] = sorted(list(sets) + deletes + (['rootfs'] if resize else []) +
                                     (['lxc'] if plan.get('raw') is not None else []) +
                                     (['node'] if plan.get('move') else []))
        res['changed'] = bool(res['changed_keys'])
        if plan['status'] == 'running':
            # What PVE will not apply live waits for a restart (known for sure after the change).
            res['pending'] = sorted(set(pending_now) | set(k for k in res['changed_keys'] if not self.hot(k, sets, current, node)))
            res['restart_required'] = bool(res['pending'])
        self._plan_power(plan)
        self._plan_snapshot(plan)
        if plan.get('move') and status == 'running' and plan['action'] == 'start':
            # started again on its node, as it ran before the move: part of the move, not a change of power
            res.pop('power', None)
            for side in ('before', 'after'):
                res['diff'][side].pop('status', None)
        return plan

    def _plan_move(self, plan, current):
        """A container found on another node than the fleet says: moved back (stopped, migrated offline, its config
        made right on its node, started there if it is to run), where PVE allows the move. PVE refuses to migrate a
        container with a bind or device mount point not marked shared=1 (pve-container src/PVE/LXC/Migrate.pm
        prepare: "cannot migrate local $type mount point '$ms'"), which is said here, before anything changes."""
        vmid, found, wanted = plan['vmid'], plan['node'], plan['spec']['node']
        res = plan['res']
        res['diff']['before']['node'], res['diff']['after']['node'] = found, wanted
        plan.update(move=wanted, was_running=plan['status'] == 'running')
        if plan['status'] == 'running':
            plan['status'] = 'stopped'  # the move stops it: every change lands at once, before it starts there
        for key in sorted((k for k in current if _lxc_config.key_family(k) == 'mp'), key=lambda k: int(k[2:])):
            props = _lxc_config.parse_props(current[key], 'volume')
            volume = props.get('volume', '')
            if volume.startswith('/') and not _lxc_config.pve_bool(props.get('shared', '0')):
                why = "cannot migrate local {0} mount point '{1}'".format(
                    'device' if volume.startswith('/dev/') else 'bind', key)
                res['move_refused'] = why
                if not self.check_mode:
                    raise _lxc_config.SpecError(
                        'vmid {0} is on node {1}, not {2} as the fleet says, and PVE cannot move it back: {3} '
                        '({4}). Mark that mount point shared=1 if its path is on {2} too, or remove it; or put the '
                        'container on node {1} in the fleet definition.'.format(vmid, found, wanted, why, current[key]))
                break

    def read_config(self, path, status):
        """(config as PVE will have it, keys waiting for a restart) in one request.

        A running container is read through /pending, which has the live value, the pending one and
        pending deletions of every key; a stopped one has nothing pending worth a request.
        """
        if status != 'running':
            return self.client.get(path + '/config'), []
        config, pending = {}, []
        for item in self.client.get(path + '/pending'):
            key = item['key']
            if item.get('delete'):
                pending.append(key)
                continue
            if 'pending' in item:
                pending.append(key)
                config[key] = item['pending']
            elif 'value' in item:
                config[key] = item['value']
        return config, sorted(pending)

    def _put_config(self, plan):
        """PUT the changes with the config digest; if the config changed under us, read and compare again."""
        path, current = plan['path'], plan['current']
        sets, deletes = plan['sets'], plan['deletes']
        for attempt in range(5):
            digest = current.get('digest')
            if digest is None:
                current = self.client.get(path + '/config')
                digest = current['digest']
                if attempt:
                    sets, deletes = _lxc_config.plan_update(plan['values'], plan['owned'], current)[:2]
                    if not sets and not deletes:
                        return
            params = dict(sets)
            if deletes:
                params['delete'] = ','.join(deletes)
            params['digest'] = digest
            try:
                self.client.mutate('PUT', path + '/config', lock_timeout=self.lock_timeout, **params)
                return
            except PveError as e:
                if 'detected modified configuration' not in e.message:
                    raise
                current = {}
        raise PveError('PUT /{0}/config: the config kept changing while it was being updated'.format(path))

    def _plan_raw(self, plan):
        """Raw lxc lines: compared with the node's config file, which this module must run beside."""
        spec = plan['spec']
        if spec.get('lxc_raw') is None:
            return
        entries = _pveconf.normalize(spec['lxc_raw'])
        path = _pveconf.conf_path(spec['pve_root'], plan['node'], plan['vmid'])
        if plan['exists']:
            try:
                with open(path) as fh:
                    before = _pveconf.read(fh.read())
            except (IOError, OSError):
                raise _lxc_config.SpecError(
                    'vmid {0}: lxc_raw edits {1}, which is not on this machine: run the task on a node of the cluster '
                    '(delegate_to), with pve_root pointing at its /etc/pve'.format(plan['vmid'], path))
        else:
            if not os.path.isdir(os.path.dirname(path)):
                raise _lxc_config.SpecError(
                    'vmid {0}: lxc_raw edits {1}, whose directory is not on this machine: run the task on a node of '
                    'the cluster'.format(plan['vmid'], path))
            before = []
        if before != entries:
            self._check_passthrough(plan['vmid'], ['lxc'], [])
            plan['raw'] = entries
            plan['res']['diff']['before']['lxc'] = ['{0}: {1}'.format(k, v) for k, v in before]
            plan['res']['diff']['after']['lxc'] = ['{0}: {1}'.format(k, v) for k, v in entries]

    def _check_passthrough(self, vmid, sets, deletes):
        touched = [k for k in list(sets) + list(deletes) if _lxc_config.key_family(k) == 'dev' or k == 'lxc']
        # a check run changes nothing: a token reads what a repair (with the password) would change
        if touched and not self.client.is_root_password and not self.check_mode:
            raise _lxc_config.SpecError(
                'vmid {0}: {1} (device passthrough) can only be set by root@pam logged in with its password; '
                'PVE refuses it to every API token, root@pam\'s included. Connected as {2}: give '
                'api_user: root@pam and api_password (from a vault) for passthrough runs.'.format(
                    vmid, ', '.join(sorted(touched)), self.client.auth_label()))

    def _plan_create(self, plan, values):
        spec, res, vmid = plan['spec'], plan['res'], plan['vmid']
        missing = [k for k in ('node', 'ostemplate') if not spec.get(k)]
        if missing:
            raise _lxc_config.SpecError('vmid {0} does not exist; creating it needs {1}'.format(vmid, ' and '.join(missing)))
        self._check_passthrough(vmid, values, [])
        params = dict(values)
        params.update(vmid=vmid, ostemplate=spec['ostemplate'], unprivileged=1 if spec['unprivileged'] else 0)
        if spec.get('storage'):
            params['storage'] = spec['storage']
        if 'rootfs' not in params and any(_lxc_config.key_family(k) == 'mp' for k in params):
            # PVE wants rootfs spelled out once there are mount points; give what it would default to.
            params['rootfs'] = '{0}:4'.format(spec.get('storage') or 'local')
        if spec.get('ssh_public_keys'):
            params['ssh-public-keys'] = spec['ssh_public_keys']
        plan['create'] = params
        self._plan_raw(plan)
        res['config'] = dict((k, v) for k, v in params.items() if k not in ('vmid', 'ostemplate', 'storage',
                                                                            'ssh-public-keys'))
        res.update(changed=True, created=True, changed_keys=sorted(values))
        res['diff']['after'] = dict((k, v) for k, v in params.items() if k != 'ssh-public-keys')
        plan['status'] = 'stopped'
        self._plan_power(plan)
        return plan

    def _plan_power(self, plan):
        spec, res, status = plan['spec'], plan['res'], plan['status']
        state = spec['state']
        action = None
        if state == 'started' and status != 'running':
            action = 'start'
        elif state == 'stopped' and status == 'running':
            action = 'shutdown'
        elif state == 'restarted':
            action = 'reboot' if status == 'running' else 'start'
        elif status == 'running' and res['restart_required'] and spec.get('restart_on_pending'):
            action = 'reboot'
        plan['action'] = action
        if action:
            res['changed'] = True
            res['power'] = action
            res['diff']['before']['status'] = plan['res']['status']
            res['diff']['after']['status'] = 'stopped' if action == 'shutdown' else 'running'
            res['status'] = res['diff']['after']['status']
        elif plan.get('create') or plan.get('was_running'):
            res['status'] = 'stopped'  # made, or moved (the move stops it), and not started here

    def _plan_snapshot(self, plan):
        """A running container whose config change is made effective by a restart here: a snapshot first (its name
        in the result; in check mode, the one that would be taken). Where PVE cannot snapshot it (_snapshot.refusal),
        the change is written but not restarted into, unless the snapshot is optional; the result says why. One
        whose entry asks for a host-path mount point has snapshots off (snapshot_off says why)."""
        res = plan['res']
        if not self.snapshots or plan['status'] != 'running' or plan['action'] != 'reboot' or not (
                plan.get('sets') or plan.get('deletes') or res.get('pending')):
            return
        current = plan['current']
        off = _snapshot.declared_off(plan['spec'].get('mounts')) or _snapshot.declared_off(
            dict((k, current[k]) for k in _snapshot.host_paths(current)))
        if off:  # a host-path mount point, the operator's (kept, or being removed): restarted without one, said
            res['snapshot_off'] = off
            return
        if self._storages is None:
            self._storages = _snapshot.storage_types(self.client)
        why = _snapshot.refusal(plan['current'], self._storages)
        if why and not self.snapshots.get('optional'):
            plan['action'] = None
            res['restart_refused'] = 'PVE cannot snapshot it first: {0}'.format(why)
            res.pop('power', None)
            for side in ('before', 'after'):
                res['diff'][side].pop('status', None)
            res['status'] = 'running'
            res['changed'] = bool(res['changed_keys'])
        elif not why:
            plan['snapshot'] = res['snapshot'] = _snapshot.name_at()

    def _plan_absent(self, plan):
        spec, res = plan['spec'], plan['res']
        if not plan['exists']:
            return plan
        if plan['status'] == 'running' and not spec.get('force'):
            raise _lxc_config.SpecError('vmid {0} is running on {1}: state absent destroys it only with force: true'.format(
                plan['vmid'], plan['node']))
        plan['destroy'] = True
        res.pop('config', None)
        res.update(changed=True, status='absent')
        res['diff']['before'] = {'status': plan['status']}
        res['diff']['after'] = {'status': 'absent'}
        return plan

    def status_now(self, plan):
        """The container's power state read again after a failure ('unknown' where that fails too)."""
        try:
            return self.client.get(plan['path'] + '/status/current').get('status') or 'unknown'
        except PveError:
            return 'unknown'

    # -- phase 2: change ------------------------------------------------------------------
    def apply(self, plan):
        res = plan['res']
        res['actions'] = []
        if self.check_mode or not (res['changed'] or (res['restart_required'] and plan['spec'].get('restart_on_pending'))):
            return res
        client, node, vmid, path = self.client, plan['node'], plan['vmid'], plan['path']
        lt = self.lock_timeout

        def done(action):
            # recorded once PVE has taken the request: what follows (the task, a status poll) may still fail
            return lambda: action in res['actions'] or res['actions'].append(action)
        if plan.get('destroy'):
            params = {'destroy-unreferenced-disks': 1}
            if plan['spec'].get('purge'):
                params['purge'] = 1
            if plan['status'] == 'running':
                params['force'] = 1
            client.run_task('DELETE', path, node, 'destroy CT {0}'.format(vmid), lock_timeout=lt,
                            accepted=done('destroy'), **params)
            return res
        if plan.get('create'):
            client.run_task('POST', 'nodes/{0}/lxc'.format(node), node, 'create CT {0}'.format(vmid),
                            lock_timeout=lt, accepted=done('create'), **plan['create'])
        if plan.get('move'):
            node, path = self._move(plan, done)
        if plan.get('snapshot'):
            _snapshot.run(client, vmid, name=plan['snapshot'], keep=self.snapshots.get('keep') or 0,
                          description='gpufleet: before a config change that needs a restart ({0})'.format(
                              ', '.join(res['changed_keys'])), lock_timeout=lt)
            res['actions'].append('snapshot')
        if plan.get('sets') or plan.get('deletes'):
            self._put_config(plan)
            res['actions'].append('config')
        if plan.get('resize'):
            upid = client.mutate('PUT', path + '/resize', lock_timeout=lt, disk='rootfs', size=plan['resize'])
            res['actions'].append('resize')
            if upid:
                client.wait_task(node, upid, 'resize rootfs of CT {0}'.format(vmid))
        if plan.get('raw') is not None:
            _pveconf.apply(_pveconf.conf_path(plan['spec']['pve_root'], node, vmid), plan['raw'])
            res['actions'].append('lxc_raw')
        if plan['status'] == 'running' and (plan.get('sets') or plan.get('deletes')):
            res['pending'] = sorted(p['key'] for p in client.get(path + '/pending') if 'pending' in p or p.get('delete'))
            res['restart_required'] = bool(res['pending'])
        action = plan['action']
        if action is None and res['restart_required'] and plan['spec'].get('restart_on_pending') and not res.get(
                'restart_refused'):
            action = 'reboot'
        if action:
            params = {'forceStop': 1} if action == 'shutdown' else {}
            client.run_task('POST', '{0}/status/{1}'.format(path, action), node, '{0} CT {1}'.format(action, vmid),
                            lock_timeout=lt, accepted=done(action), **params)
            if action == 'reboot':
                res['restart_required'] = False
                res['pending'] = []
        # What PVE holds now (its normalised values, generated volumes and MAC addresses).
        res['config'] = dict((k, v) for k, v in client.get(path + '/config').items() if k != 'digest')
        return res

    def _move(self, plan, done):
        """Stop the container where it is (if it runs), migrate it to the fleet's node and follow it there: (its
        node, its API path) from now on. A migration PVE refuses leaves it where it was, started again if it ran (as
        PVE's own restart mode does: pve-guest-common src/PVE/AbstractMigrate.pm, LXC/Migrate.pm final_cleanup)."""
        client, vmid, lt = self.client, plan['vmid'], self.lock_timeout
        source, target, path = plan['node'], plan['move'], plan['path']
        if plan['was_running']:
            client.run_task('POST', path + '/status/shutdown', source, 'shutdown CT {0} to move it'.format(vmid),
                            lock_timeout=lt, accepted=done('shutdown'), forceStop=1)
        try:
            client.run_task('POST', path + '/migrate', source, 'migrate CT {0} from {1} to {2}'.format(
                vmid, source, target), lock_timeout=lt, accepted=done('migrate'), target=target)
        except PveError as e:
            if plan['was_running']:
                try:
                    client.run_task('POST', path + '/status/start', source, 'start CT {0} again'.format(vmid),
                                    lock_timeout=lt)
                except PveError:
                    pass
            e.message = '{0}. It stays on {1}: fix what PVE names, or put it on node {1} in the fleet ' \
                        'definition'.format(e.message, source)
            raise
        plan['node'], plan['path'] = target, 'nodes/{0}/lxc/{1}'.format(target, vmid)
        plan['res']['node'] = target
        return plan['node'], plan['path']


# What PVE applies to a running container without a restart (used to predict in check mode): pve-container
# src/PVE/LXC/Config.pm $LXC_FASTPLUG_OPTIONS and the keys vmconfig_hotplug_pending applies (memory, swap, cpulimit,
# cpuunits). nameserver and searchdomain are neither: they wait in pending.
HOT_KEYS = ('cores', 'memory', 'swap', 'cpulimit', 'cpuunits', 'description', 'onboot', 'tags', 'hostname',
            'protection', 'startup')


def orphans(guests, tag, wanted):
    """The containers of the cluster (guests: {vmid: /cluster/resources entry}) that carry tag but are not among
    wanted (vmids): [{vmid, node, name, status}] by vmid. Tags are told apart without case, as PVE's datacenter
    default (tag-style case-sensitive=0) does."""
    tag = tag.lower()
    return [{'vmid': vmid, 'node': g.get('node'), 'name': g.get('name'), 'status': g.get('status')}
            for vmid, g in sorted(guests.items())
            if g.get('type', 'lxc') == 'lxc' and vmid not in wanted
            and tag in [t.lower() for t in _lxc_config.tag_list(g.get('tags'))]]


def reconcile_all(client, specs, check_mode, lock_timeout=60, orphan_tag=None, known=(), snapshots=None):
    """Validate every definition, plan every container (reads only), then apply the plans. Returns (results,
    orphans): with orphan_tag, the containers that carry it but are neither among specs nor known (vmids of the
    fleet's other containers, on nodes the run does not reach) (see orphans), else None. snapshots: {keep, optional}
    where a running container is snapshotted before a config change that its restart here makes effective."""
    _lxc_config.validate(specs)
    rec = Reconciler(client, check_mode, lock_timeout, snapshots)
    rec.check_nodes(specs)
    plans = [rec.plan(spec) for spec in specs]
    left = orphans(rec.guests(), orphan_tag, set(s['vmid'] for s in specs) | set(known or ())) if orphan_tag else None
    results = []
    for n, plan in enumerate(plans):
        try:
            results.append(rec.apply(plan))
        except PveError as e:
            e.message = 'CT {0}: {1}'.format(plan['vmid'], e.message)
            # What was done before the failure is reported as done, the failed container with its failure, and
            # the containers not reached as such.
            res = plan['res']
            res.update(changed=bool(res['actions']), failed=True, msg=e.message)
            if res['actions']:
                res['status'] = rec.status_now(plan)
            e.done = results + [res] + [dict(p['res'], changed=False, actions=[], skipped=True,
                                             msg='not reached: CT {0} failed first'.format(plan['vmid']))
                                        for p in plans[n + 1:]]
            raise
    return results, left


def run(params, check_mode):
    """The lxc_container module's work: params (its validated arguments) reconciled, in check mode where check_mode;
    the module's result (failed, with msg, where it fails)."""
    missing = missing_proxmoxer()
    if missing:
        return missing
    try:
        # every value of every container is checked before the login
        specs = _lxc_config.container_specs(params)
        _lxc_config.validate(specs)
        client = PveClient(params, read_only=check_mode)
        results, left = reconcile_all(client, specs, check_mode, params['lock_timeout'], params['orphan_tag'],
                                      params.get('orphan_known') or (), params.get('snapshot_before_restart'))
    except _lxc_config.SpecError as e:
        return {'failed': True, 'changed': False, 'msg': str(e)}
    except PveError as e:
        done = getattr(e, 'done', [])
        for r in done:
            r.pop('diff', None)
        return dict(e.result(), failed=True, changed=any(r['changed'] for r in done), containers=done)
    merge_earlier(results, params.get('earlier'))
    raw_told(results, params.get('raw_changed'))
    out = {} if left is None else {'orphans': left}
    out.update(changed=any(r['changed'] for r in results), containers=results, api_requests=client.requests,
               changed_keys=sorted(set(k for r in results for k in r['changed_keys'])),
               pending=sorted(set(k for r in results for k in r['pending'])),
               restart_required=any(r['restart_required'] for r in results))
    diffs = [r.pop('diff') for r in results]
    if params['vmid'] is not None:
        one = results[0]
        out.update(vmid=one['vmid'], node=one['node'], status=one['status'], pending=one['pending'],
                   changed_keys=one['changed_keys'])
        if 'config' in one:
            out['config'] = one['config']
        out['diff'] = diffs[0]
    else:
        out['diff'] = [d for d, r in zip(diffs, results) if r['changed']]
    return out


def merge_earlier(results, earlier):
    """Each result with what an earlier call of this run did to the same container (earlier: that call's whole
    result; a run that writes raw lines between the two calls: the first makes and moves, the second starts): its
    changed keys, actions, creation and refused move, its config before (the earlier call's) and after (this one's),
    and its changes still pending unless this call (re)started the container; the snapshot taken before its restart
    (or why it was not restarted) where this call says none."""
    if not earlier:
        return
    old = dict((r.get('vmid'), r) for r in earlier.get('containers') or [])
    diffs = earlier.get('diff') or []
    diffs = dict((d.get('before_header'), d) for d in ([diffs] if isinstance(diffs, dict) else diffs))
    for res in results:
        was = old.get(res.get('vmid'))
        if not was:
            continue
        res['changed'] = bool(res.get('changed') or was.get('changed'))
        res['changed_keys'] = sorted(set(res.get('changed_keys') or []) | set(was.get('changed_keys') or []))
        res['actions'] = list(was.get('actions') or []) + list(res.get('actions') or [])
        for key in ('created', 'move_refused', 'snapshot', 'restart_refused', 'snapshot_off'):
            if was.get(key) and not res.get(key):
                res[key] = was[key]
        if res.get('power') not in ('start', 'reboot'):
            res['pending'] = sorted(set(res.get('pending') or []) | set(was.get('pending') or []))
            res['restart_required'] = bool(res['pending']) and res.get('status') == 'running'
        first = diffs.get('CT {0}'.format(res['vmid']))
        if first:
            diff = res.setdefault('diff', {'before_header': 'CT {0}'.format(res['vmid'])})
            diff['before'] = dict(diff.get('before') or {}, **(first.get('before') or {}))
            diff['after'] = dict(first.get('after') or {}, **(diff.get('after') or {}))


def raw_told(results, raw_changed):
    """Each result whose container's raw lines changed on its node in this run (raw_changed: {vmid: {before,
    after}}, lxc_raw's lines) told so: changed, key lxc, its lines in the diff; raw lines take effect when LXC
    starts the container, so one that runs on and was not (re)started here waits for a restart."""
    by_vmid = dict((int(k), v) for k, v in (raw_changed or {}).items())
    for res in results:
        lines = by_vmid.get(res.get('vmid'))
        if lines is None or res.get('status') == 'absent':
            continue
        res['changed'] = True
        res['changed_keys'] = sorted(set(res.get('changed_keys') or []) | set(['lxc']))
        diff = res.setdefault('diff', {'before_header': 'CT {0}'.format(res['vmid'])})
        diff.setdefault('before', {})['lxc'] = list(lines.get('before') or [])
        diff.setdefault('after', {})['lxc'] = list(lines.get('after') or [])
        if res.get('status') == 'running' and res.get('power') not in ('start', 'reboot'):
            res['pending'] = sorted(set(res.get('pending') or []) | set(['lxc']))
            res['restart_required'] = True
