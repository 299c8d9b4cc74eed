# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.fleet_doctor: the API read with each login given, the nodes' own findings taken from
the inventory, each turned into rows by plugin_utils _doctor, and doctor.json written."""


from ansible_collections.gpufleet.proxmox.plugins.module_utils import _pve, _snapshot
from ansible_collections.gpufleet.proxmox.plugins.modules.fleet_doctor import ARGUMENT_SPEC
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _doctor, _reports
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils._action import ControllerAction, host_var

PASSWORD_KEYS = ('api_password', 'api_otp')
TOKEN_KEYS = ('api_token_id', 'api_token_secret')


def given(api):
    """The API options without those a role left out (omit)."""
    return dict((k, v) for k, v in api.items() if not (isinstance(v, str) and v.startswith('__omit_place_holder__')))


def login_rows(api):
    """A row per login given (the password, the token), each logged in and used for a read; and a client that
    reads (the token's where it works), or None."""
    rows, reader = [], None
    tries = []
    if api.get('api_password'):
        tries.append(('api password', dict((k, v) for k, v in api.items() if k not in TOKEN_KEYS), False))
    if api.get('api_token_id'):
        tries.append(('api token', dict((k, v) for k, v in api.items() if k not in PASSWORD_KEYS), True))
    if not tries:
        return [_doctor.row('api', 'login', False, 'neither a password nor a token is given',
                            'set gpufleet_api_password (vaulted) for runs that change the fleet and '
                            'gpufleet_api_token_id/gpufleet_api_token_secret for read-only runs')], None
    for check, params, token in tries:
        try:
            client = _pve.PveClient(params, read_only=token)
            client.nodes()  # a token is not checked until it is used
        except _pve.PveError as e:
            why = e.result().get('msg') or str(e)
            fix = _doctor.login_fix(why, params.get('api_user'), params.get('api_token_id') if token else None)
            rows.append(_doctor.row('api', check, False, _doctor.short(why), fix))
            continue
        if token:
            rows.append(_doctor.row('api', check, True, '{0} reads the cluster (drift --check and verify use it)'.format(
                client.auth_label())))
            reader = client
        else:
            rows.append(_doctor.row('api', check, True, '{0}{1}'.format(client.auth_label(), (
                ' with its password: devN passthrough allowed' if client.is_root_password else
                ': not root@pam, so PVE refuses devN passthrough (GPU containers)'))))
            reader = reader or client
    return rows, reader


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def act(self, args, task_vars):
        hostvars = task_vars.get('hostvars') or {}
        # the nodes of this run (a --limit leaves the others out: they are not checked, nor counted as unreached)
        play = set(task_vars.get('ansible_play_hosts_all') or [])
        nodes = [n for n in (task_vars.get('groups') or {}).get(args['nodes_group']) or [] if not play or n in play]
        rows, client = login_rows(given(args['api']))
        cluster = None
        if client is not None:
            try:
                cluster = dict((n['node'], n) for n in client.get('nodes'))
            except _pve.PveError as e:
                rows.append(_doctor.row('api', 'nodes', False, _doctor.short(e.result().get('msg') or str(e)),
                                        'give the login Sys.Audit on / (PVEAuditor)'))
        asked = {}
        for entry in args['fleet']:
            if entry.get('gpus') and entry.get('state', 'present') != 'absent':
                asked[entry.get('node')] = asked.get(entry.get('node'), 0) + 1
        for node in nodes:
            rows.extend(self.node_rows(node, host_var(hostvars, node, 'gpufleet_doctor_node', {}), asked.get(node, 0),
                                       cluster, client))
        if args['failure']:
            rows.append(_doctor.row('fleet', 'definition', False, _doctor.short(args['failure'], 1000),
                                    'correct the fleet definition (gpufleet_containers) or the inventory as the message '
                                    'says; docs/fleet.md has every key'))
        elif args['changes']:
            rows.append(_doctor.row('fleet', 'definition', True, '{0} container(s), checked against PVE\'s schema'.format(
                len(args['plan'].get('containers') or []))))
            rows.append(_doctor.changes_row(args['changes']))
            if client is not None:
                looked = dict((node, dict((r.get('item'), r) for r in host_var(
                    hostvars, node, 'gpu_container_doctor_templates', {}).get('results') or [])) for node in nodes)
                rows.extend(self.new_containers(args['plan'], args['changes'], client, looked))
                try:
                    storages = _snapshot.storage_types(client)
                except _pve.PveError:
                    storages = {}  # (a login without Datastore.Audit: the mount points are judged alone)
                rows.extend(_doctor.snapshot_rows(args['plan'], storages))
            for node in nodes:
                asked = host_var(hostvars, node, 'gpu_container_doctor_pythons', {})
                rows.extend(_doctor.python_rows(node, asked.get('stdout') if asked.get('rc') == 0 else None,
                                                args['fleet'], args['plan'].get('venv_pythons')))
        out = {'ready': _doctor.ready(rows), 'rows': rows}
        try:
            written, _removed = _reports.write_all(args['report_dir'], {'doctor': out})
        except _reports.ReportError as e:
            written = []
            out['rows'].append(_doctor.row('controller', 'report', False, str(e), 'give a writable report directory'))
            out['ready'] = False
        return dict(out, changed=False, report=(written or [''])[0])

    @staticmethod
    def node_rows(node, seen, gpus_asked, cluster, client):
        rows = []
        if cluster is not None:
            if node not in cluster:
                rows.append(_doctor.row(node, 'pve node', False, 'the cluster has no node {0} (it has {1})'.format(
                    node, ', '.join(sorted(cluster))), 'name the inventory host as the PVE node is named (its '
                    'hostname; pvecm nodes), and reach it with ansible_host'))
            elif cluster[node].get('status') != 'online':
                rows.append(_doctor.row(node, 'pve node', False, 'the cluster shows {0} {1}'.format(
                    node, cluster[node].get('status')), 'start the node, or leave it out of this run (--limit)'))
            else:
                try:
                    version = client.node_version(node).get('version')
                    rows.append(_doctor.row(node, 'pve node', True, 'online, PVE {0}'.format(version)))
                except _pve.PveError as e:
                    rows.append(_doctor.row(node, 'pve node', False, _doctor.short(e.result().get('msg') or str(e)),
                                            'give the login Sys.Audit on /nodes/{0}'.format(node)))
        reach = seen.get('reach') or {'unreachable': True, 'msg': 'the doctor did not reach this node'}
        rows.append(_doctor.ssh_row(node, reach, seen.get('address', node)))
        if reach.get('unreachable'):
            return rows
        rows.append(_doctor.pct_row(node, seen.get('pct')))
        rows.extend(_doctor.driver_rows(node, seen.get('devices') or {}, gpus_asked))
        packages = seen.get('packages')
        if packages:
            rows.append(_doctor.wheelhouse_row(node, packages.get('offline'), packages.get('wheels'),
                                               packages.get('where'), packages.get('index'),
                                               packages.get('index_error')))
        return rows

    @staticmethod
    def new_containers(plan, changes, client, looked):
        """The template (there, and holding python3) and the room on the storage on each node for the containers a
        first run creates. looked: {node: {template: what the node's look into it found}}."""
        created = set((c.get('vmid'), c.get('node')) for c in changes.get('containers') or [] if c.get('created'))
        per_node = {}
        for spec in plan.get('containers') or []:
            if (spec.get('vmid'), spec.get('node')) not in created:
                continue
            node = per_node.setdefault(spec['node'], {'templates': set(), 'wanted': {}})
            if spec.get('ostemplate'):
                node['templates'].add(spec['ostemplate'])
            sid, gib = _doctor.rootfs_gib(spec.get('rootfs', ''), spec.get('storage') or 'local-lvm')
            node['wanted'][sid] = node['wanted'].get(sid, 0.0) + gib
        rows = []
        for name in sorted(per_node):
            want = per_node[name]
            contents = {}
            for volid in sorted(want['templates']):
                sid = volid.split(':')[0]
                if sid not in contents:
                    try:
                        contents[sid] = set(v['volid'] for v in client.get(
                            'nodes/{0}/storage/{1}/content'.format(name, sid), content='vztmpl'))
                    except _pve.PveError as e:
                        contents[sid] = e.result().get('msg') or str(e)
                got = contents[sid]
                rows.append(_doctor.template_row(name, volid, got if isinstance(got, set) else set(),
                                                 None if isinstance(got, set) else got))
                python = (_doctor.python_row(name, volid, looked.get(name, {}).get(volid))
                          if isinstance(got, set) and volid in got else None)
                if python:
                    rows.append(python)
            status = {}
            for sid in want['wanted']:
                try:
                    status[sid] = client.get('nodes/{0}/storage/{1}/status'.format(name, sid))
                except _pve.PveError as e:
                    status[sid] = e.result().get('msg') or str(e)
            rows.extend(_doctor.storage_rows(name, want['wanted'], status))
        return rows
