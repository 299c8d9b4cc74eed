# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.fleet_plan: the nodes' facts read from the inventory, the fleet checked and
expanded by plugin_utils _fleet, every value checked against PVE's schema by _lxc, and the cluster's version read
through _pve only where the plan depends on it."""


from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _lxc_config, _pve, _pve_options, _snapshot
from ansible_collections.gpufleet.proxmox.plugins.modules.fleet_plan import ARGUMENT_SPEC
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _fleet, _profile
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils._action import ControllerAction, host_var


def nodes_seen(hostvars, nodes):
    """What gpu_node left on each node of the play: GPU indexes (None where it did not run), each one's device
    minor, its gpu_devices entries, device majors, the control nodes it has (None where unknown), the driver
    bundle's path, the shared directories, the containers that hold each GPU, and the PCIe path between them."""
    out = {}
    for name in nodes:
        devices = host_var(hostvars, name, 'gpufleet_gpu_devices', {})
        control = devices.get('control')
        out[name] = {'indexes': devices.get('indexes'), 'majors': devices.get('majors') or {},
                     'minors': dict((g['index'], g['minor']) for g in devices.get('gpus') or []
                                    if 'index' in g and 'minor' in g),
                     'gpus': devices.get('gpus') or [],
                     'control': sorted(control) if isinstance(control, dict) else None,
                     'driver': host_var(hostvars, name, 'gpu_node_driver', {}).get('path') or '',
                     'shares': host_var(hostvars, name, 'gpu_node_shared', []),
                     'held': devices.get('held') or {}, 'driver_version': devices.get('driver_version'),
                     'vendor': devices.get('vendor'), 'pcie': devices.get('pcie') or {}}
    return out


def profiles(containers, default, profiles_dir):
    """{profile as an entry names it ('' for default): {name, dir, pythons, floor}} of the venv profiles the fleet
    uses, read on the controller (a profile that cannot be read is left to the venv build, which names it); floor: the
    oldest driver its lock's CUDA wheels run on (_profile.driver_floor), None for a CPU profile."""
    named = set(e.get('venv_profile') or '' for e in containers or [] if isinstance(e, dict))
    out = {}
    for key in named:
        if not isinstance(key, str):
            continue
        path = _profile.directory(key or default, profiles_dir)
        try:
            out[key] = {'name': key or default, 'dir': path, 'pythons': _profile.pythons(_profile.read_meta(path)),
                        'floor': _profile.driver_floor(_profile.read_lock(path))}
        except ValueError:
            continue
    return out


def connection(api):
    """The API options as lxc_container takes them, checked (an error names api.<field>)."""
    result = ArgumentSpecValidator(_pve_options.CONNECTION_SPEC, required_one_of=_pve_options.CONNECTION_REQUIRED_ONE_OF,
                                   required_together=_pve_options.CONNECTION_REQUIRED_TOGETHER).validate(dict(api))
    if result.error_messages:
        raise AnsibleActionFail('api: {0}'.format('; '.join(result.error_messages)))
    return result.validated_parameters


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def act(self, args, task_vars):
        play = task_vars.get('ansible_play_hosts_all') or []
        active = set(task_vars.get('ansible_play_hosts') or play)
        # a play with serial plans its batch's nodes (a driver upgrade's roll: one node at a time)
        batch = set(task_vars.get('ansible_play_batch') or active)
        seen = nodes_seen(task_vars.get('hostvars') or {}, [name for name in play if name in active and name in batch])
        # the play's nodes that dropped out of it (unreachable, or a task failed there), and the nodes outside the
        # play or its batch (a run limited to some nodes, a roll's other nodes): their containers are checked with
        # the fleet and left out of the plan
        down = sorted(name for name in play if name not in active)
        for name in down:
            seen[name] = {'indexes': None, 'reached': False}
        for name in (task_vars.get('groups') or {}).get(args['nodes_group']) or []:
            if name not in seen:
                seen[name] = {'indexes': None, 'reached': False}
        fleet = _fleet.Fleet(args['containers'], seen, defaults=args['defaults'], passthrough=args['passthrough'],
                             gpu_sharing=args['gpu_sharing'], driver_mount=args['driver_mount'],
                             override=args['override'], gpu_mode=args['gpu_mode'], gpu_gid=args['gpu_gid'],
                             tag=args['tag'],
                             remove_confirm=None if self._task.check_mode else args['remove_confirm'],
                             profiles=profiles(args['containers'], args['venv_profile'], args['venv_profiles_dir']),
                             driver_floor=args['driver_floor'])
        # what a role leaves out of the connection options (omit) is not an option
        api = dict((k, v) for k, v in args['api'].items()
                   if not (isinstance(v, str) and v.startswith('__omit_place_holder__')))
        try:
            # every problem of the definition and every value PVE would refuse, before the login (in auto mode, a
            # token login is a problem only where the cluster has devN: that waits for its version)
            check_mode = bool(self._task.check_mode)
            root = fleet.root_login(api, check_mode)
            fleet.check(is_root_password=root or fleet.passthrough == 'auto', root=root)
            _lxc_config.validate(_lxc_config.container_specs({'containers': fleet.expand('devn')}))
            versions, storages = {}, None
            if fleet.needs_version():
                # each node's own version (a cluster being upgraded runs several), one request a node
                client = _pve.PveClient(connection(api), read_only=check_mode)
                fleet.check_cluster(client.nodes())
                versions = dict((node, client.node_version(node).get('version')) for node in fleet.version_nodes())
                fleet.check(versions, root, root=root)
                # and, in the same session, the storages' types: which containers PVE cannot snapshot for them
                storages = _snapshot.storage_types(client)
            plan = fleet.plan(versions, bool(self._task.check_mode), storages)
        except (_fleet.FleetError, _lxc_config.SpecError) as e:
            raise AnsibleActionFail(str(e))
        except _pve.PveError as e:
            raise AnsibleActionFail(e.result().get('msg') or str(e))
        same = set(versions.values())
        return dict(plan, changed=False, pve_versions=versions, pve_version=same.pop() if len(same) == 1 else None,
                    nodes_down=down,
                    not_reached=sorted(name for name, node in seen.items() if node.get('reached') is False))
