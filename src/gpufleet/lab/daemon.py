"""The lab node's PVE API: fakepve, with every container backed by a real LXC container.

    python -m gpufleet.lab.daemon

fakepve answers the API (auth, permissions, schema checks, tasks, locks, pending
changes); this subclass makes each container task real before the task ends:
create, start, stop, reboot, migrate and destroy act on the LXC container named
by the vmid (a migrated one runs again with its new node's devices, and is
refused where PVE refuses it), and a config change on a running container is hot-plugged the way PVE does
(new devN and mpN, memory, cores, hostname).  What cannot be applied live is put
back into pending, so the API never claims what the container does not have.
The state is saved after every change and the node's `/etc/pve/lxc/<vmid>.conf`
files are written from it, which is what `pct` reads.

A control socket (`run/control.sock`, root only) lets tests reach the fake's own
levers: the request log, failure injection and config locks.
"""

import asyncio
import copy
import json
import os
import re
import signal
import sys
import time

from aiohttp import web
from fakepve.model import PveError, TaskError
from fakepve.shapes import ROLES
from fakepve.server import FakePve

from . import lxcconf, pveconf
from .containers import BackendError, Containers
from .layout import RELEASES, Lab, release_of, write_json

# What the lab's API token may do on '/': an administrator's token, still not root@pam.
TOKEN_PRIVILEGES = ('VM.Allocate', 'VM.Audit', 'VM.Config.CPU', 'VM.Config.Memory', 'VM.Config.Disk',
                    'VM.Config.Network', 'VM.Config.Options', 'VM.Config.HWType', 'VM.Config.Cloudinit',
                    'VM.PowerMgmt', 'VM.Console', 'VM.Backup', 'VM.Snapshot', 'VM.Migrate',
                    'Datastore.Allocate', 'Datastore.AllocateSpace', 'Datastore.AllocateTemplate',
                    'Datastore.Audit', 'Sys.Audit', 'Sys.Modify', 'Sys.Console', 'SDN.Use', 'Pool.Audit')

# A template's file name in a dir storage's template/cache (pve-storage src/PVE/Storage.pm VZTMPL_EXT_RE_1).
TEMPLATE_FILE = re.compile(r'^[^/]+\.tar\.(gz|xz|zst|bz2)$')

# Container tasks whose outcome the real container must follow.
CT_TASKS = ('vzcreate', 'vzrestore', 'vzstart', 'vzstop', 'vzshutdown', 'vzreboot', 'vzdestroy',
            'vzsuspend', 'vzresume', 'vzmigrate')
# Snapshot tasks, whose volumes' content the lab keeps and restores (LabPve._snapshot_task).
SNAPSHOT_TASKS = ('vzsnapshot', 'vzrollback', 'vzdelsnapshot')


def pve_version(text):
    """(major, minor) of a version string ('8.4.1')."""
    m = re.match(r'(\d+)\.(\d+)', str(text))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


class LabPve(FakePve):
    def __init__(self, lab, creds):
        super().__init__(user='root@pam', password=creds['api_password'], host=lab.api_host, port=lab.api_port)
        self.lab = lab
        # one backend per node: the containers share the host's LXC, each node has its own device nodes
        self.backends = dict((node.node, Containers(node)) for node in lab.cluster())
        self.backend = self.backends[lab.node]
        self.time_scale = 0.0
        self.nodes = dict((name, {'online': True}) for name in self.backends)
        token = '{0}!{1}'.format(creds['api_user'], creds['api_token_id'])
        self.apitokens[token] = creds['api_token_secret']
        self.grant(token, '/', *TOKEN_PRIVILEGES)
        for about in RELEASES.values():
            self.store_file('local', about['template'], 130 * 1024 ** 2, content='vztmpl')
        self._ct_locks = {}
        self.node_versions = {}  # {node: version} where a node runs another version than the API's node
        self._migrating = {}  # {vmid: target} of the migrations asked for, until their task runs
        self._creating = {}  # {vmid: ostemplate} of the creates asked for, until their task runs
        self._snapping = {}  # {vmid: snapname} of the snapshot tasks asked for (take, roll back, delete)
        self.status_lag = 0.0
        self._statd = {}  # {vmid: [(since, status)]}: what pvestatd would have seen, and from when

    # -- state ---------------------------------------------------------------
    def load(self):
        """Take the saved containers back, with the status their real containers have now."""
        try:
            with open(self.lab.state_file) as fh:
                saved = json.load(fh)
        except (OSError, ValueError):
            saved = {'cts': []}
        # Tickets stay valid across a restart, as they do across a pveproxy restart on PVE.
        self.tickets.update(saved.get('tickets') or {})
        for name in saved.get('offline') or []:
            if name in self.nodes:
                self.nodes[name]['online'] = False
        for item in saved['cts']:
            real = self.backend.state(item['vmid'])
            ct = self.add_ct(item['vmid'], node=item.get('node', self.lab.node),
                             status='running' if real == 'running' else 'stopped',
                             config=item['config'], pending=item.get('pending') or {}, defaults=False)
            if real is None:
                self.backend_of(ct.vmid).ensure(ct.vmid, ct.config)
        self.save()

    def save(self):
        cts = [{'vmid': ct.vmid, 'node': ct.node, 'status': ct.status, 'config': ct.config,
                'pending': ct.pending} for ct in sorted(self.cts, key=lambda c: c.vmid)]
        write_json(self.lab.state_file, {'cts': cts, 'tickets': self.tickets, 'offline': sorted(
            name for name, node in self.nodes.items() if not node.get('online', True))}, mode=0o600)
        for name in self.nodes:
            os.makedirs(self.conf_dir(name), exist_ok=True)
        link = os.path.join(self.lab.pve_root, 'lxc')
        if os.path.isdir(link) and not os.path.islink(link):
            # A lab made before configs moved under nodes/<node>/lxc: move them there.
            for name in os.listdir(link):
                os.replace(os.path.join(link, name), os.path.join(self.lab.pve_conf_dir, name))
            os.rmdir(link)
        if not os.path.islink(link):
            os.symlink(os.path.join('nodes', self.lab.node, 'lxc'), link)
        keep = set()
        for ct in self.cts:
            path = self.conf_path(ct)
            keep.add(path)
            text = pveconf.dump(ct.config, ct.pending)
            try:
                with open(path) as fh:
                    if fh.read() == text:
                        continue
            except OSError:
                pass
            with open(path + '.tmp', 'w') as fh:
                fh.write(text)
            os.replace(path + '.tmp', path)
        # a container lives in its node's directory only (a migrated one leaves the old node's)
        for name in self.nodes:
            for entry in os.listdir(self.conf_dir(name)):
                path = os.path.join(self.conf_dir(name), entry)
                if entry.endswith('.conf') and path not in keep:
                    os.unlink(path)

    def conf_dir(self, node):
        """/etc/pve/nodes/<node>/lxc."""
        return os.path.join(self.lab.pve_root, 'nodes', node, 'lxc')

    def conf_path(self, ct):
        return os.path.join(self.conf_dir(ct.node), '{0}.conf'.format(ct.vmid))

    def backend_of(self, vmid):
        """The backend of the node the container is on (the first node's for one the API no longer has)."""
        ct = self.ct(vmid)
        return self.backends.get(ct.node, self.backend) if ct is not None else self.backend

    def absorb_raw(self, ct):
        """Raw `lxc.*` lines edited into the node's .conf file are part of the config, as on PVE."""
        try:
            with open(self.conf_path(ct)) as fh:
                raw = pveconf.parse(fh.read())[0].get('lxc', [])
        except OSError:
            return
        if raw:
            ct.config['lxc'] = raw
        else:
            ct.config.pop('lxc', None)

    # -- /cluster/resources as pvestatd fills it ----------------------------------
    def note_status(self, now=None):
        """Record each container's status as it is now (after every container task and at every read)."""
        now = time.monotonic() if now is None else now
        for ct in self.cts:
            seen = self._statd.setdefault(ct.vmid, [])
            if not seen or seen[-1][1] != ct.status:
                seen.append((now, ct.status))
        for vmid in set(self._statd) - set(ct.vmid for ct in self.cts):
            del self._statd[vmid]

    def listed_status(self, vmid, now):
        """The status /cluster/resources shows with status_lag on: the one the container had status_lag seconds ago,
        'unknown' for one that did not exist then. PVE fills the list from pvestatd's rounds (pve-manager
        PVE/Service/pvestatd.pm, every 10 s; PVE/API2/Cluster.pm resources reads its RRD data), and shows a guest
        it has no data for yet as 'unknown'."""
        shown = 'unknown'
        for since, status in self._statd.get(vmid, []):
            if since <= now - self.status_lag:
                shown = status
        return shown

    def ct_resources(self, user, kind=None):
        data = super().ct_resources(user, kind)
        if self.status_lag:
            now = time.monotonic()
            self.note_status(now)
            for item in data:
                if item['status'] != 'unknown':  # an offline node's guests stay unknown
                    item['status'] = self.listed_status(item['vmid'], now)
        return data

    # -- the real side of tasks and config changes ----------------------------
    def _ct_lock(self, vmid):
        return self._ct_locks.setdefault(vmid, asyncio.Lock())

    async def _sync(self, vmid):
        ct = self.ct(vmid)
        if ct is not None:
            self.absorb_raw(ct)
        wanted = None if ct is None else {'status': ct.status, 'config': dict(ct.config)}
        loop = asyncio.get_running_loop()
        backend = self.backend_of(vmid)
        async with self._ct_lock(vmid):
            try:
                refused, failed = await loop.run_in_executor(None, backend.reconcile, vmid, wanted)
            except BackendError:
                if ct is not None and ct.status == 'running' and backend.state(vmid) != 'running':
                    ct.status, ct.pid = 'stopped', None
                self.save()
                raise
        if ct is not None:
            applied = backend.applied(vmid)
            for key in refused:
                ct.pending[key] = ct.config.get(key)
                if key in applied:
                    ct.config[key] = applied[key]
                else:
                    ct.config.pop(key, None)
        self.save()
        return failed

    async def task(self, node, ttype, tid, user, body, vm=None, lock=True, log=()):
        if ttype in SNAPSHOT_TASKS and str(tid).isdigit():
            return await super().task(node, ttype, tid, user, self._snapshot_task(ttype, int(tid), body),
                                      vm=vm, lock=lock, log=log)
        if ttype not in CT_TASKS or not str(tid).isdigit():
            return await super().task(node, ttype, tid, user, body, vm=vm, lock=lock, log=log)
        vmid = int(tid)

        def to_log(lines):
            # The task's own record: the one running task of this type on this container.
            for record in reversed(self.tasklog):
                if record['status'] == 'running' and record['type'] == ttype and record['id'] == str(vmid):
                    record['log'].extend(lines)
                    break

        async def real():
            loop = asyncio.get_running_loop()
            source = self.backend_of(vmid)
            was_running = self.ct(vmid) is not None and self.ct(vmid).status == 'running'
            if ttype == 'vzcreate':
                volid = self._creating.pop(vmid, None)
                if self.missing_template(node, volid):
                    # the template is unpacked on the container's node, from that node's own storage
                    self._drop(self.ct(vmid))
                    raise TaskError("unable to create CT {0} - volume '{1}' does not exist".format(vmid, volid))
                # the root file system is the template's: the lab's base of the release it names
                source.set_release(vmid, release_of(volid))
            if ttype == 'vzmigrate':
                why = self.migrate_refusal(self.ct(vmid), self._migrating.pop(vmid, None))
                if why:
                    # AbstractMigrate.pm (pve-guest-common): the reason in the log, "migration aborted" as the status
                    to_log(['ERROR: migration aborted (duration 00:00:00): {0}'.format(why)])
                    raise TaskError('migration aborted')
            note = await body()
            self.note_status()
            try:
                if ttype == 'vzreboot' or ttype == 'vzmigrate' and was_running:
                    # A reboot is a stop and a start: the real container starts again with the new config. A
                    # migration in restart mode stops it on its node and starts it on the target, with that
                    # node's devices.
                    await loop.run_in_executor(None, source.stop, vmid)
                await self._sync(vmid)
            except BackendError as e:
                to_log(e.log)
                if ttype == 'vzmigrate':
                    # moved, but it does not start on the target: the migration "finished with problems"
                    to_log(['ERROR: {0}'.format(e), 'ERROR: migration finished with problems (duration 00:00:01)'])
                    raise TaskError('migration problems') from None
                raise TaskError(str(e)) from None
            return note
        return await super().task(node, ttype, tid, user, real, vm=vm, lock=lock, log=log)

    # -- snapshots: their content on disk, and PVE's refusals --------------------
    async def _lxc_snapshot(self, user, v):
        self._snapping[int(v['vmid'])] = v.get('snapname')
        return await super()._lxc_snapshot(user, v)

    async def _lxc_rollback(self, user, v):
        self._snapping[int(v['vmid'])] = v.get('snapname')
        return await super()._lxc_rollback(user, v)

    async def _lxc_snapshot_delete(self, user, v):
        self._snapping[int(v['vmid'])] = v.get('snapname')
        return await super()._lxc_snapshot_delete(user, v)

    @staticmethod
    def snapshot_refusal(ct):
        """Why PVE cannot snapshot this container, or None. pve-guest-common src/PVE/AbstractConfig.pm
        snapshot_prepare dies "snapshot feature is not available" unless has_feature('snapshot'), and pve-container
        src/PVE/LXC/Config.pm has_feature asks PVE::Storage::volume_has_feature of every volume in
        foreach_volume's order (rootfs, mp0, mp1, ...); pve-storage src/PVE/Storage.pm volume_has_feature answers
        undef for a path (a bind or device mount point). devN entries and raw lxc.* lines are not volumes. (The
        storage types that cannot snapshot, fakepve refuses itself.)"""
        for key in ['rootfs'] + sorted((k for k in ct.config if re.fullmatch(r'mp\d+', k)), key=lambda k: int(k[2:])):
            volume = lxcconf.split_props(ct.config.get(key) or '', 'volume').get('volume', '')
            if volume.startswith('/'):
                return 'snapshot feature is not available'
        return None

    def _snapshot_task(self, ttype, vmid, body):
        """The task of a snapshot, rollback or snapshot delete, made real on the container's volumes under the
        container's lock (AbstractConfig.pm: the lock 'snapshot', 'rollback' or 'snapshot-delete' is held while
        the volumes change)."""
        name = self._snapping.pop(vmid, None)

        async def real():
            loop = asyncio.get_running_loop()
            ct, source = self.ct(vmid), self.backend_of(vmid)
            ready = ct is not None and not ct.lock and not ct.template
            if ttype == 'vzsnapshot' and ready and name not in ct.snapshots:
                why = self.snapshot_refusal(ct)
                if why:
                    raise TaskError(why)
                await self._locked(ct, 'snapshot', loop.run_in_executor(None, source.snapshot, vmid, name))
                try:
                    return await body()
                except Exception:
                    await loop.run_in_executor(None, source.delete_snapshot, vmid, name)
                    raise
            if ttype == 'vzrollback' and ready and not (ct.snapshots.get(name) or {'snapstate': 'none'}).get(
                    'snapstate'):
                # PVE stops the container first (LXC/Config.pm __snapshot_rollback_vm_stop), then rolls each volume
                await self._locked(ct, 'rollback', loop.run_in_executor(None, source.rollback, vmid, name))
                note = await body()
                self.note_status()
                await self._sync(vmid)  # the config of the snapshot, and started where the rollback asked for it
                return note
            note = await body()
            if ttype == 'vzdelsnapshot':
                await loop.run_in_executor(None, source.delete_snapshot, vmid, name)
            return note
        return real

    async def _locked(self, ct, lock, work):
        ct.lock = lock
        self.save()
        try:
            await work
        except BackendError as e:
            raise TaskError(str(e)) from None
        finally:
            ct.lock = None
            self.save()

    async def _lxc_migrate(self, user, v):
        self._migrating[int(v['vmid'])] = v.get('target')
        return await super()._lxc_migrate(user, v)

    def migrate_refusal(self, ct, target):
        """Why PVE's migration of this container stops before it moves anything, or None (pve-container
        src/PVE/LXC/Migrate.pm prepare). Every mount point in key order (LXC/Config.pm valid_volume_keys: rootfs,
        mp0, mp1, ...) that is a bind or device mount (classify_mountpoint: a path, under /dev/ for a device) must
        be marked shared=1, else "cannot migrate local $type mount point '$ms'"; devN entries are not mount points
        and pass (the target's prestart hook finds a missing device at the start). Then the target node must
        answer over ssh: "Can't connect to destination address using public key"."""
        if ct is None:
            return None
        for key in sorted((k for k in ct.config if re.fullmatch(r'mp\d+', k)), key=lambda k: int(k[2:])):
            props = lxcconf.split_props(ct.config[key], 'volume')
            volume = props.get('volume', '')
            shared = str(props.get('shared', '0')).lower() in ('1', 'yes', 'on', 'true')
            if volume.startswith('/') and not shared:
                kind = 'device' if volume.startswith('/dev/') else 'bind'
                return "cannot migrate local {0} mount point '{1}'".format(kind, key)
        if target in self.nodes and not self.nodes[target].get('online', True):
            return "Can't connect to destination address using public key"
        return None

    async def _lxc_config_get(self, user, v):
        ct = self.ct(int(v['vmid']))
        if ct is not None:
            self.absorb_raw(ct)
        return await super()._lxc_config_get(user, v)

    def check_devices(self, node, values):
        """A devN whose path is not a device of the node is refused before anything is written, at create and at
        a config change: pve-container src/PVE/LXC/Config.pm update_pct_config ("Validate device"), which
        API2/LXC.pm's create calls before the task and API2/LXC/Config.pm's PUT under the config lock; the die
        is the API's 500."""
        if pve_version(self.node_version(node)) < (8, 1):
            # devN came with pve-container 5.0.7 (PVE 8.1; commit ce1976b, "Add device passthrough"): an older
            # node's API schema has no such parameter, and PVE::JSONSchema refuses what it does not define
            old = sorted(key for key in values if re.fullmatch(r'dev\d+', key))
            if old:
                raise PveError(400, 'Parameter verification failed.', dict(
                    (key, 'property is not defined in schema and the schema does not allow additional properties')
                    for key in old))
        for key, value in values.items():
            if re.fullmatch(r'dev\d+', key):
                try:
                    lxcconf.device_node(lxcconf.split_props(value, 'path'), self.backends[node].lab.dev_dir)
                except lxcconf.ConfigError as e:
                    raise PveError(500, str(e)) from None

    # -- each node's own PVE version ---------------------------------------------
    def node_version(self, node):
        """The pve-manager version a node runs: nodes of one cluster may run different ones during an upgrade."""
        return self.node_versions.get(node) or self.version

    def _routes_lab_nodes(self):
        return [('GET', '/nodes/{node}/version', self._node_version)]

    async def _node_version(self, values, user):
        """GET /nodes/{node}/version: the node's own version (pve-manager PVE/API2/Nodes.pm 'version', proxyto
        node, any user: PVE::pvecfg::version_info of that node)."""
        version = self.node_version(values['node'])
        return {'version': version, 'release': '.'.join(version.split('.')[:2]), 'repoid': 'fakepve'}

    def hotplugs_devices(self, node):
        """Whether a node's PVE hot-plugs a new devN into a running container: pve-container 6.0.4 (PVE 9) does
        (commit c702167, "implement device hotplug"); 5.x (PVE 8, branch stable-bookworm) has no devN branch in
        LXC/Config.pm vmconfig_hotplug_pending, so every devN change of a running container stays pending. The
        config change is made on the container's node (API2/LXC/Config.pm: proxyto node), so its version decides."""
        return pve_version(self.node_version(node)) >= (9, 0)

    async def _lxc_create(self, user, v):
        if v.get('node') in self.backends:
            self.check_devices(v['node'], v)
        vmid = int(v['vmid'])
        self._creating[vmid] = v.get('ostemplate')
        try:
            return await super()._lxc_create(user, v)
        except PveError:
            self._creating.pop(vmid, None)  # refused before its task: nothing to unpack
            raise

    # -- each node's own `local` -----------------------------------------------
    # fakepve's storages are the cluster's: one list of volumes for every node. PVE's `local` is a dir storage on
    # each node's own disk (/var/lib/vz), so a template downloaded on one node is not on the others. The lab reads
    # each node's `local` templates from that node's directory (Lab.storage_path), as PVE's dir plugin lists them.
    def local_templates(self, node):
        """{volname: volume} of the templates in node's `local`: pve-storage src/PVE/Storage/Plugin.pm
        get_subdir_files (vztmpl/<file>, format t<compression>, the file's size and ctime)."""
        cache = os.path.join(self.lab.on(node).storage_path('local'), 'template', 'cache')
        out = {}
        for name in sorted(os.listdir(cache)) if os.path.isdir(cache) else ():
            m = TEMPLATE_FILE.match(name)
            path = os.path.join(cache, name)
            if m and os.path.isfile(path):
                st = os.stat(path)
                out['vztmpl/' + name] = {'content': 'vztmpl', 'format': 't' + m.group(1), 'size': st.st_size,
                                         'ctime': int(st.st_ctime)}
        return out

    def missing_template(self, node, volid):
        """Whether volid is a template of `local` that node does not have."""
        sid, _colon, volname = str(volid or '').partition(':')
        return sid == 'local' and volname.startswith('vztmpl/') and node in self.backends and \
            volname not in self.local_templates(node)

    async def _content_list(self, v, user):
        out = await super()._content_list(v, user)
        if v['storage'] != 'local' or v['node'] not in self.backends or v.get('content') not in (None, 'vztmpl'):
            return out
        out = [item for item in out if item['content'] != 'vztmpl']
        for volname, vol in self.local_templates(v['node']).items():
            try:
                self._check_access(user, 'local', 'vztmpl', None, 'local:' + volname)
            except PveError:
                continue
            out.append(self._item('local', volname, vol))
        return sorted(out, key=lambda item: item['volid'].lower())

    async def _lxc_config_put(self, user, v):
        ct = self.ct(int(v['vmid']))
        if ct is not None:
            self.absorb_raw(ct)
            self.check_devices(ct.node, v)
        before = (copy.deepcopy(ct.config), copy.deepcopy(ct.pending)) if ct is not None else ({}, {})
        applied = self.backend_of(ct.vmid).applied(ct.vmid) if ct is not None else {}
        result = await super()._lxc_config_put(user, v)
        ct = self.ct(int(v['vmid']))
        if ct is not None and ct.status == 'running':
            if not self.hotplugs_devices(ct.node):
                for key in [k for k in ct.config if re.fullmatch(r'dev\d+', k) and k not in before[0]]:
                    ct.pending[key] = ct.config.pop(key)
            failed = await self._sync(ct.vmid)
            if failed:
                # A hotplug that fails fails the whole change, and nothing of it is written (API2/LXC/Config.pm:
                # "don't write to config if we get any errors", raise_param_exc; Config.pm vmconfig_hotplug_pending
                # words each "unable to hotplug $opt: $msg"). What was applied live stays so, as on PVE.
                ct.config, ct.pending = before
                self.backend_of(ct.vmid).save_applied(ct.vmid, applied)
                self.save()
                raise PveError(400, 'Parameter verification failed.', dict(
                    (key, 'unable to hotplug {0}: {1}'.format(key, why)) for key, why in sorted(failed.items())))
        else:
            self.save()
        return result

    def allowed(self, user, path, priv):
        """What PVE lets user do on path. A token with privilege separation (the lab's are such, as the operators'
        guide makes them) holds only what its own ACL grants, intersected with its user's, and root@pam's tokens
        are no exception: only root@pam itself skips the ACL (pve-access-control src/PVE/RPCEnvironment.pm,
        permissions() and compile_acl_path). fakepve lets every root@pam token do anything, and a token what its
        user may."""
        if '!' not in user or self.acl is None:
            return super().allowed(user, path, priv)
        owner = user.split('!')[0]
        # the token's own grants, looked up as those of a token whose user is not root@pam (whom fakepve lets do
        # anything) and has no grants of its own
        acl, self.acl = self.acl, {'token@lab!own': self.acl.get(user, [])}
        try:
            own = super().allowed('token@lab!own', path, priv)
        finally:
            self.acl = acl
        return own and (owner == 'root@pam' or super().allowed(owner, path, priv))

    # -- control socket --------------------------------------------------------
    def control_app(self):
        app = web.Application()
        r = app.router
        r.add_get('/requests', self._c_requests)
        r.add_delete('/requests', self._c_requests_clear)
        r.add_post('/fail', self._c_fail)
        r.add_delete('/fail', self._c_fail_clear)
        r.add_post('/lock', self._c_lock)
        r.add_get('/state', self._c_state)
        r.add_post('/version', self._c_version)
        r.add_post('/status_lag', self._c_status_lag)
        r.add_post('/node', self._c_node)
        r.add_post('/tfa', self._c_tfa)
        r.add_post('/token', self._c_token)
        return app

    async def _c_node(self, request):
        """{node, phase, offline}: down - the node goes down, every container of it with it (offline: and the
        cluster sees it offline, as a node that is off or cut off: requests for it fail with 595, its guests'
        status is unknown); up - the node is back (online): its containers with onboot start in their startup
        order, then by vmid, each in a vzstart task of its own, as pve-guests.service starts them (pve-manager
        PVE/API2/Nodes.pm startall, get_start_stop_list: onboot guests sorted by their startup order). Returns
        [{vmid, upid, exitstatus}] for up."""
        spec = await request.json()
        node = spec.get('node') or self.lab.node
        if node not in self.backends:
            raise web.HTTPNotFound(text='no node {0}'.format(node))
        mine = [ct for ct in self.cts if ct.node == node]
        loop = asyncio.get_running_loop()
        if spec['phase'] == 'down':
            for ct in mine:
                async with self._ct_lock(ct.vmid):
                    await loop.run_in_executor(None, self.backends[node].stop, ct.vmid)
                ct.status, ct.pid = 'stopped', None
            if spec.get('offline'):
                self.set_node_offline(node)
            self.note_status()
            self.save()
            return web.json_response(True)
        self.set_node_offline(node, False)
        self.save()

        def order(ct):
            startup = lxcconf.split_props(ct.config['startup'], 'order') if ct.config.get('startup') else {}
            return (int(startup['order']) if str(startup.get('order', '')).isdigit() else 1 << 30, ct.vmid)
        started = []
        for ct in sorted((c for c in mine if str(c.config.get('onboot', 0)) in ('1', 'True', 'true')), key=order):
            upid = await self._lxc_start('root@pam', {'node': ct.node, 'vmid': ct.vmid})
            record = self.tasks.get(upid) or {}
            started.append({'vmid': ct.vmid, 'upid': upid, 'exitstatus': record.get('exitstatus')})
        return web.json_response(started)

    async def _c_status_lag(self, request):
        """{seconds}: how far /cluster/resources' status lags behind the containers' (0: not at all)."""
        self.note_status()
        self.status_lag = float((await request.json())['seconds'])
        return web.json_response(True)

    async def _c_token(self, request):
        """{user, tokenid, secret, role}: an API token of user with privilege separation, holding role (fakepve's
        ROLES: PVEAuditor, Administrator, NoAccess) on '/', as `pveum user token add USER ID --privsep 1` and
        `pveum acl modify / --tokens USER!ID --roles ROLE` make it."""
        spec = await request.json()
        if spec['role'] not in ROLES:
            raise web.HTTPBadRequest(text='no role {0}'.format(spec['role']))
        token = '{0}!{1}'.format(spec.get('user') or 'root@pam', spec['tokenid'])
        self.apitokens[token] = spec['secret']
        self.acl = dict(self.acl or {}, **{token: []})
        self.grant(token, '/', *ROLES[spec['role']])
        return web.json_response(True)

    async def _c_tfa(self, request):
        """{on}: root@pam has a second factor: its password login is answered with NeedTFA (fakepve's own)."""
        self.tfa = bool((await request.json())['on'])
        return web.json_response(True)

    async def _c_version(self, request):
        """{version, node}: the PVE version a node runs (an older PVE for tests of the pre-8.1 paths). Without a
        node: every node's (and /version's, which the API's own node answers)."""
        spec = await request.json()
        if spec.get('node'):
            if spec['node'] not in self.nodes:
                raise web.HTTPNotFound(text='no node {0}'.format(spec['node']))
            self.node_versions[spec['node']] = spec['version']
            if spec['node'] != self.lab.node:
                return web.json_response(True)
        else:
            self.node_versions.clear()
        self.version = spec['version']
        self.release_version = '.'.join(spec['version'].split('.')[:2])
        return web.json_response(True)

    async def _c_requests(self, request):
        return web.json_response([list(item[:2]) + [item[2].decode('utf-8', 'replace')
                                                    if isinstance(item[2], bytes) else item[2]]
                                  for item in self.requests])

    async def _c_requests_clear(self, request):
        del self.requests[:]
        return web.json_response(True)

    async def _c_fail(self, request):
        spec = await request.json()
        self.fail(spec['method'], spec['suffix'], status=spec.get('status'), message=spec.get('message'),
                  error=spec.get('error'), times=spec.get('times'))
        return web.json_response(True)

    async def _c_fail_clear(self, request):
        self.failures.clear()
        return web.json_response(True)

    async def _c_lock(self, request):
        """{vmid, lock}: set a config lock (backup, snapshot, ...); lock null or '' clears it."""
        spec = await request.json()
        ct = self.ct(int(spec['vmid']))
        if ct is None:
            raise web.HTTPNotFound(text='no CT {0}'.format(spec['vmid']))
        ct.lock = spec.get('lock') or None
        self.save()
        return web.json_response(True)

    async def _c_state(self, request):
        out = []
        for ct in sorted(self.cts, key=lambda c: c.vmid):
            out.append({'vmid': ct.vmid, 'node': ct.node, 'api': ct.status, 'real': self.backend.state(ct.vmid),
                        'hostname': ct.name, 'lock': ct.lock})
        return web.json_response(out)


async def serve(lab):
    creds = lab.credentials()
    pve = LabPve(lab, creds)
    pve.load()
    await pve.start(os.path.join(lab.tls_dir, 'server.pem'), os.path.join(lab.tls_dir, 'server.key'))
    sock = lab.path('run', 'control.sock')
    if os.path.exists(sock):
        os.unlink(sock)
    runner = web.AppRunner(pve.control_app())
    await runner.setup()
    old = os.umask(0o077)
    try:
        await web.UnixSite(runner, sock).start()
    finally:
        os.umask(old)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print('lab: PVE API on {0}, node(s) {1}, {2} containers'.format(pve.url, ', '.join(pve.nodes), len(pve.cts)),
          flush=True)
    await stop.wait()
    await runner.cleanup()
    await pve.stop()
    pve.save()
    print('lab: stopped', flush=True)


def main():
    lab = Lab()
    try:
        asyncio.run(serve(lab))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == '__main__':
    sys.exit(main())
