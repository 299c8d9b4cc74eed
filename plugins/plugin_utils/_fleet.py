# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet definition: checked as a whole, then turned into one lxc_container spec per container.

A fleet entry (see roles/gpu_container/meta/argument_specs.yml):
    {vmid, hostname, node, gpus: [0, 1] | 'all' | [], cores, memory, swap, rootfs, net, template,
     storage, unprivileged, features, tags, description, onboot, mounts, devices}
"""


import re

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _gpu, _pcie, _pvecheck, _snapshot
from ansible_collections.gpufleet.proxmox.plugins.module_utils._pve import pve_version, use_token
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _profile

# Device nodes every GPU container gets besides its /dev/nvidiaN.
ENTRY_KEYS = ('vmid', 'hostname', 'node', 'gpus', 'cores', 'memory', 'swap', 'rootfs', 'net', 'template',
              'storage', 'unprivileged', 'features', 'tags', 'description', 'onboot', 'mounts', 'devices',
              'state', 'venv_profile', 'nameserver', 'searchdomain', 'gpu_mode', 'gpu_gid', 'restart_on_pending',
              'shm_mb', 'nofile', 'rdma', 'engine')
# Checked against PVE's schema here (the rest after the expansion, by lxc_container's own check).
INT_KEYS = ('cores', 'memory', 'swap')
# The OCI engines a container may ask for, each from the container's own distribution's packages.
ENGINES = ('podman',)
# What an engine needs of its container: nesting (its own proc and sys mounts, user namespaces) and, in an unprivileged
# container, keyctl, which PVE's seccomp rules otherwise make fail with ENOSYS (pve-container src/PVE/LXC.pm
# make_seccomp_config). PVE lets only root@pam change a feature other than nesting, and any feature of a privileged
# container (LXC.pm check_ct_modify_config_perm: "changing feature flags (except nesting) is only allowed for root@pam").
ENGINE_FEATURES = ('nesting=1', 'keyctl=1')
# devN arrived in pve-container 5.0.7, shipped with PVE 8.1.
DEVN_SINCE = (8, 1)
# Who may open a container's GPU nodes by default: every user, as NVIDIA's driver makes them on the node. PVE itself
# makes a devN node 0660 root:root where the entry gives no mode (pve-container src/PVE/LXC.pm
# create_passthrough_device_node), which leaves a training job run by any other user without its GPUs.
GPU_MODE = '0666'


def gpu_list(entry, node_gpus):
    gpus = entry.get('gpus', [])
    if gpus == 'all':
        return sorted(node_gpus or [])
    return list(gpus or [])


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool)


# A GPU named as nvidia-smi -L and --query-gpu=uuid,pci.bus_id name it: its UUID, or its PCI bus id (domain optional).
GPU_UUID = re.compile(r'^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$', re.I)
PCI_BUS_ID = re.compile(r'^(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$', re.I)


def gpu_key(value):
    """How a GPU named by UUID or PCI bus id is known (the UUID lowercased; the bus id's numbers, so that
    00000000:3B:00.0, 0000:3b:00.0 and 3b:00.0 are one GPU), or None for anything else."""
    if not isinstance(value, str):
        return None
    if GPU_UUID.match(value):
        return value.lower()
    m = PCI_BUS_ID.match(value)
    return tuple(int(part or '0', 16) for part in m.groups()) if m else None


def named_gpus(gpus):
    """{gpu_key: index} of a node's GPUs (its gpu_devices entries, with uuid and pci_bus_id where nvidia-smi said)."""
    out = {}
    for g in gpus or []:
        for name in (g.get('uuid'), g.get('pci_bus_id')):
            if gpu_key(name) is not None and g.get('index') is not None:
                out[gpu_key(name)] = g['index']
    return out


def by_index(entry, names):
    """The entry with each GPU it names by UUID or PCI bus id given as the index its node has for it now (names:
    named_gpus of its node). A GPU that moved (a card swapped, the numbering changed) is followed by its name; a
    name the node does not have stays, for errors() to say so."""
    gpus = entry.get('gpus') if isinstance(entry, dict) else None
    keys = [gpu_key(g) for g in gpus] if isinstance(gpus, list) else []
    if not any(k is not None for k in keys):
        return entry
    return dict(entry, gpus=[g if k is None else names.get(k, g) for g, k in zip(gpus, keys)])


def _gpu_indexes(value):
    """A list of GPUs, each an index or a UUID or PCI bus id, or 'all'."""
    return value == 'all' or (isinstance(value, list) and all(
        (_whole(g) and g >= 0) or gpu_key(g) is not None for g in value))


# One check per key of an entry: (key, value) -> what is wrong with the value, or None. Each runs where the entry
# has the key (its value may be None), and the REQUIRED ones also where it lacks it (as None).
def _vmid(key, value):
    if not _whole(value) or not 100 <= value <= 999999999:
        return 'must be a whole number from 100 to 999999999, got {0!r}'.format(value)
    return None


def _hostname(key, value):
    if value is None:
        return 'required'
    if not isinstance(value, str):
        return 'must be a string, got {0!r}'.format(value)
    return _pvecheck.hostname_problem(value)


def _node(key, value):
    if not value:
        return 'required'
    return None if isinstance(value, str) else 'must be the name of a node, got {0!r}'.format(value)


def _whole_number(key, value):
    if value is None:
        return None
    if not _whole(value):
        return 'must be a whole number, got {0!r}'.format(value)
    return _pvecheck.problem(key, value)


def _devices(key, value):
    if value is None or isinstance(value, list) and all(isinstance(d, dict) and d.get('path') for d in value):
        return None
    return 'must be a list of dicts with a path ([{{path: /dev/nvidia0}}]), got {0!r}'.format(value)


def _list(key, value):
    return None if value is None or isinstance(value, list) else 'must be a list, got {0!r}'.format(value)


# PVE's tag format (pve-common src/PVE/JSONSchema.pm, pve-tag): letters, digits and _ first, then also - + .
TAG = re.compile(r'^[a-z0-9_][a-z0-9_+.-]*$', re.I)


def _tag(key, value):
    return None if not value or TAG.match(str(value)) else \
        'must be a PVE tag (letters, digits, _, then also - + .), got {0!r}'.format(value)


def _bool(key, value):
    return None if isinstance(value, bool) else 'must be true or false, got {0!r}'.format(value)


def _words(key, value):
    if isinstance(value, str) and value.strip():
        return None
    return 'must be a string (space-separated for several), got {0!r}'.format(value)


def _gpu_mode(key, value):
    """A device node mode as PVE's devN schema takes it (an octal string, '0666')."""
    if isinstance(value, str) and re.match(r'^0?[0-7]{3}$', value):
        return None
    return "must be an octal mode as a string, as '0666' or '0660', got {0!r}".format(value)


def _at_least(least, what):
    """The check of a whole number of at least least, said as what it is (or None: not given)."""
    def check(key, value):
        if value is None or _whole(value) and value >= least:
            return None
        return 'must be {0} (a whole number, {1} or more), got {2!r}'.format(what, least, value)
    return check


_gpu_gid = _at_least(0, 'a group id of the container')


def _net(key, value):
    if value is not None and not isinstance(value, (str, dict)):
        return 'must be a net0 property string or a dict of netN, got {0!r}'.format(value)
    if isinstance(value, str) and 'bridge=' not in value:
        return '{0!r} names no bridge (bridge=vmbr0)'.format(value)
    return None


def _engine(key, value):
    if value is None or value in ENGINES:
        return None
    return 'must be one of {0} (an OCI engine from the container\'s own packages), got {1!r}'.format(
        ', '.join(ENGINES), value)


def engine_features(features):
    """A container's features (PVE's list, 'key=value' each) with what its engine needs set."""
    names = set(f.split('=', 1)[0] for f in ENGINE_FEATURES)
    kept = [f for f in features or [] if str(f).split('=', 1)[0] not in names]
    return kept + list(ENGINE_FEATURES)


def _rootfs(key, value):
    if value is None or isinstance(value, int) and value > 0 or isinstance(value, str):
        return None
    return 'a size in GiB or a PVE volume spec, got {0!r}'.format(value)


def _gpus(key, value):
    if not _gpu_indexes(value):
        return ("must be a list of GPUs (each an index as nvidia-smi counts them, a UUID GPU-... or a PCI bus id "
                "such as 0000:3b:00.0) or 'all', got {0!r}".format(value))
    if isinstance(value, list) and len(set(value)) != len(value):
        return 'lists a GPU twice: {0}'.format(value)
    return None


REQUIRED_KEYS = ('vmid', 'hostname', 'node')
# In the order errors() reports them.
ENTRY_CHECKS = (('vmid', _vmid), ('hostname', _hostname), ('node', _node),
                ('cores', _whole_number), ('memory', _whole_number), ('swap', _whole_number),
                ('devices', _devices), ('features', _list), ('tags', _list), ('unprivileged', _bool),
                ('onboot', _bool), ('restart_on_pending', _bool), ('nameserver', _words), ('searchdomain', _words), ('net', _net),
                ('rootfs', _rootfs), ('gpus', _gpus), ('gpu_mode', _gpu_mode), ('gpu_gid', _gpu_gid),
                ('shm_mb', _at_least(1, "the size of the container's /dev/shm in MiB")),
                ('nofile', _at_least(1024, "the container's open-file limit")), ('rdma', _bool),
                ('engine', _engine))


def _devn_problem(pve, is_root_password, passthrough, node=None):
    """Why GPUs cannot go in as this run would pass them (devN needs PVE 8.1 and root@pam's password), or None."""
    if passthrough not in ('auto', 'devn'):
        return None
    if pve is not None and pve_version(pve) < DEVN_SINCE:
        if passthrough == 'devn':
            return ('passthrough devn needs PVE 8.1 or later; node {0} runs {1} '
                    '(use gpu_container_passthrough: raw, or auto)'.format(node, pve))
        return None  # auto: raw lxc lines instead (plan())
    if not is_root_password:
        return ('GPU passthrough (devN) can only be set by root@pam with its password; the API login is a token. '
                'Set gpufleet_api_user: root@pam and gpufleet_api_password (from a vault) for provisioning runs.')
    return None


def per_node(value, node):
    """A node's own value of something given per node ({node: value}, as the nodes' versions or passthrough modes)
    or once for every node; None for a node a dict does not name."""
    if isinstance(value, dict):
        return value.get(node) if isinstance(node, str) else None
    return value


def errors(fleet, nodes, pve=None, is_root_password=True, gpu_sharing=False, passthrough='auto'):
    """Every problem with the fleet definition, as 'containers[i] (vmid N).field: what' sentences.

    nodes: {node name: [GPU indexes it has]} for the nodes the inventory knows.
    pve: the nodes' versions ({node: '8.4.1'}), one version for all, or None when unknown.
    Each entry's keys are checked by ENTRY_CHECKS, in that order; where a value passes, the checks across
    entries follow it (a vmid or hostname, case-insensitively, given twice; a node the inventory lacks);
    then, where the gpus are good, the GPUs against the node's and the other containers', and the passthrough.
    """
    if not isinstance(fleet, list):
        return ['containers must be a list of container definitions']
    out = []
    seen = {'vmid': {}, 'hostname': {}}  # {key: {value: index of the entry that gave it first}}
    owner = {}  # {(node, GPU index): index of the entry given it first}

    def across(key, value, i):
        if key in seen:
            name = value.lower() if key == 'hostname' else value
            if name in seen[key]:
                return '{0} is also the {1} of containers[{2}]'.format(value, key, seen[key][name])
            seen[key][name] = i
        elif key == 'node' and value not in nodes:
            return '{0} is not a node of the inventory (pve_nodes: {1})'.format(
                value, ', '.join(sorted(nodes)) or 'none')
        return None

    for i, entry in enumerate(fleet):
        if not isinstance(entry, dict):
            out.append('containers[{0}] must be a dict, got {1}'.format(i, type(entry).__name__))
            continue
        problems = [(key, 'unknown key (known: {0})'.format(', '.join(ENTRY_KEYS)))
                    for key in sorted(set(entry) - set(ENTRY_KEYS))]
        for key, check in ENTRY_CHECKS:
            if key in entry or key in REQUIRED_KEYS:
                problems.append((key, check(key, entry.get(key)) or across(key, entry.get(key), i)))
        if not _gpus('gpus', entry.get('gpus', [])):
            node = entry.get('node')
            node_gpus = nodes.get(node) if isinstance(node, str) else None
            for g in gpu_list(entry, node_gpus) if node_gpus is not None else []:
                if g not in node_gpus:
                    wanted = gpu_list(entry, node_gpus)
                    fits = sorted(n for n, have in nodes.items()
                                  if n != node and have and all(w in have for w in wanted))
                    problems.append(('gpus', 'node {0} has no GPU {1} (it has {2}){3}'.format(
                        node, g, sorted(node_gpus) or 'none',
                        '; {0} would fit (GPU {1})'.format(', '.join(fits), ', '.join(str(w) for w in wanted))
                        if fits else '')))
                elif not gpu_sharing and (node, g) in owner:
                    problems.append(('gpus', 'GPU {0} of node {1} is already given to containers[{2}] '
                                             '(set gpu_container_gpu_sharing: true to share GPUs)'.format(
                                                 g, node, owner[(node, g)])))
                elif not gpu_sharing:
                    owner[(node, g)] = i
            devn_problem = _devn_problem(per_node(pve, node), is_root_password, passthrough, node)
            if devn_problem and (gpu_list(entry, node_gpus or []) or entry.get('devices')):
                problems.append(('gpus', devn_problem))
        where = 'containers[{0}]'.format(i) + ('' if entry.get('vmid') is None else ' (vmid {0})'.format(entry['vmid']))
        out.extend('{0}.{1}: {2}'.format(where, key, problem) for key, problem in problems if problem)
    return out


def gpu_nodes(entry, node_gpus, mode=GPU_MODE, gid=None, control=None, minors=None, vendor=None):
    """The device nodes a container's GPUs need: its /dev/nvidiaN, then the control nodes (none without GPUs; the
    optional ones only where the node has them, control being the names it has or None), each with the mode (and
    group) the container's users open them with: the entry's gpu_mode/gpu_gid over the fleet's. vendor: the node's GPU
    vendor's name (_gpu; the default's where None)."""
    access = {'mode': entry.get('gpu_mode') or mode}
    gid = entry.get('gpu_gid', gid)
    if gid is not None:
        access['gid'] = gid
    paths = _gpu.vendor(vendor).passthrough_paths(gpu_list(entry, node_gpus), control, minors)
    return [dict(access, path=p) for p in paths]


def raw_lines(devices, majors, vendor=None):
    """The PVE < 8.1 way: raw lxc.* lines for the same device nodes (mount entries and cgroup2 rules)."""
    lines = []
    for dev in devices:
        path = dev['path']
        name = path[len('/dev/'):]
        major, minor = _gpu.vendor(vendor).device_numbers(path, majors)
        if major is not None and minor is not None:
            lines.append('lxc.cgroup2.devices.allow: c {0}:{1} rw'.format(major, minor))
        lines.append('lxc.mount.entry: {0} dev/{1} none bind,optional,create=file'.format(path, name))
    return lines


def job_lines(entry):
    """The raw lines of what the entry asks of the container for its training jobs (written as LXC takes them, set
    when LXC starts the container): shm_mb, the size of its /dev/shm, mounted as PVE mounts it for a container
    without an init of its own (pve-container src/PVE/LXC.pm update_lxc_config: "lxc.mount.entry = shm dev/shm
    tmpfs rw,nosuid,nodev,create=dir 0 0"; systemd, finding /dev/shm mounted, leaves it); nofile, the open-file
    limit of its init and so of every process in it, and rdma, locked memory unlimited, as NCCL over InfiniBand or
    RoCE pins its buffers (lxc.prlimit.*, which pve-container LXC/Config.pm is_valid_lxc_conf_key allows)."""
    lines = []
    if entry.get('shm_mb'):
        lines.append('lxc.mount.entry: shm dev/shm tmpfs rw,nosuid,nodev,size={0}m,create=dir 0 0'.format(entry['shm_mb']))
    if entry.get('nofile'):
        lines.append('lxc.prlimit.nofile: {0}'.format(entry['nofile']))
    if entry.get('rdma'):
        lines.append('lxc.prlimit.memlock: unlimited')
    return lines


def mount_line(share):
    """A node path ({path, mp, read_only}: the driver bundle, a node share) bound into a container as a raw
    lxc.mount.entry, not as an mpN. PVE snapshots (and backs up) a container only where every mount point is a
    volume of a storage that can: pve-guest-common AbstractConfig.pm snapshot_prepare dies "snapshot feature is not
    available" unless pve-container LXC/Config.pm has_feature passes, which asks PVE::Storage::volume_has_feature of
    the rootfs and each mpN, and a host path has none (pve-storage Storage.pm). Raw lines are no volumes, and
    LXC/Migrate.pm does not check them: the path must be on the target node too (gpu_node makes it on every node)."""
    return 'lxc.mount.entry: {0} {1} none bind,{2}create=dir 0 0'.format(
        share['path'], share['mp'].strip('/'), 'ro,' if share.get('read_only') else '')


class FleetError(Exception):
    """The fleet definition has problems: every one of them, as errors() words them."""

    def __init__(self, problems):
        self.problems = problems
        super(FleetError, self).__init__('The fleet definition has {0} problem(s): {1}'.format(
            len(problems), '; '.join(problems)))


class Fleet(object):
    """A fleet definition over what the inventory knows of its nodes: checked as a whole, then expanded into the
    plain containers lxc_container reconciles (the fleet_plan action).

    nodes: {node: {indexes: [GPU indexes] or None where gpu_node did not run, minors: {GPU index: device minor},
    gpus: [gpu_devices' entry per GPU], majors: {name: major}, control: [names of the GPU control nodes it has]
    or None, driver: the driver bundle's path on the node or '', shares: [{path, mp, read_only}], reached: False for
    a node of the cluster that this run does not reach (its containers are checked, and left out of the plan)}}.
    driver_mount: where a node's driver bundle is bound into its GPU containers ('' for none).
    gpu_mode, gpu_gid: how the GPUs' device nodes are made in every container whose entry does not say (devN)."""

    def __init__(self, containers, nodes, *, defaults=None, passthrough='auto', gpu_sharing=False, driver_mount='',
                 override=None, gpu_mode=GPU_MODE, gpu_gid=None, tag='', remove_confirm=None, profiles=None,
                 driver_floor=True):
        self.nodes = nodes or {}
        self.driver_floor = driver_floor  # hold each GPU container's node driver to its profile's floor
        # {profile as an entry names it ('' for the default): {dir, pythons}} (or {dir, error}) of the venv profiles
        self.profiles = profiles or {}
        # GPUs named by UUID or PCI bus id, as the indexes their nodes have for them in this run
        self.containers = [by_index(e, named_gpus(self.nodes.get(e.get('node'), {}).get('gpus')))
                           if isinstance(e, dict) and isinstance(e.get('node'), str) else e
                           for e in containers] if isinstance(containers, list) else containers
        # the vmids of entries with state absent that the run may destroy (None: a check run, which destroys none)
        self.remove_confirm = None if remove_confirm is None else set(remove_confirm)
        self.tag = tag or ''  # the fleet's tag, on every container of it (orphans are found by it)
        self.defaults = defaults or {}
        self.passthrough = passthrough or 'auto'
        self.gpu_sharing = bool(gpu_sharing)
        self.override = override or {}
        self.gpu_mode, self.gpu_gid = gpu_mode, gpu_gid
        self.gpus = dict((name, node.get('indexes')) for name, node in self.nodes.items())
        # the nodes this run reaches (all but those marked reached: False, of a run limited to some nodes)
        self.reached = set(name for name, node in self.nodes.items() if node.get('reached', True))
        self.driver_mount = driver_mount
        self.shares = dict((name, node.get('shares') or []) for name, node in self.nodes.items())

    @staticmethod
    def root_login(api, read_only=False):
        """Whether the run's API login may set devN: root@pam with its password (PVE refuses it to every token);
        a run that changes nothing (read_only: check mode) may use a token. No request needed to tell."""
        api = api or {}
        if read_only:
            return True
        return (api.get('api_user') or 'root@pam') == 'root@pam' and not use_token(api)

    def check(self, pve=None, is_root_password=True, root=None):
        """Raise FleetError naming every problem of the definition (pve: the cluster's version where known;
        is_root_password: whether devN may be set, as far as known; root: whether this run logs in as root@pam with
        its password, where known)."""
        # the fleet-wide values by the checks an entry's own gpu_mode and gpu_gid get
        problems = ['{0}: {1}'.format(key, check(key, value)) for key, check, value in (
            ('gpu_mode', _gpu_mode, self.gpu_mode), ('gpu_gid', _gpu_gid, self.gpu_gid), ('tag', _tag, self.tag))
            if check(key, value)]
        problems += self.unparsed_versions(pve)
        problems += errors(self.containers, self.gpus, pve, is_root_password, self.gpu_sharing, self.passthrough)
        problems += self.host_paths() + self.engine_logins() if root is False else []
        problems += self.unlocked()
        problems += self.below_floor() if self.driver_floor else []
        problems += self.held_elsewhere()
        problems += self.unconfirmed()
        if problems:
            raise FleetError(problems)

    def engine_logins(self):
        """Each entry that asks for an OCI engine, for a run whose login is not root@pam's password: its features
        (ENGINE_FEATURES) are refused to it at the change, so it is refused here, before anything changes."""
        return ['containers[{0}] (vmid {1}).engine: {2} needs the features {3}, and PVE lets only root@pam with its '
                'password set keyctl (and any feature of a privileged container); the API login is another. Set '
                'gpufleet_api_user: root@pam and gpufleet_api_password (from a vault) for provisioning runs.'.format(
                    i, e.get('vmid'), e['engine'], ','.join(ENGINE_FEATURES))
                for i, e in enumerate(self.containers if isinstance(self.containers, list) else [])
                if isinstance(e, dict) and e.get('engine') in ENGINES and e.get('state') != 'absent']

    def host_paths(self):
        """Each mount point of an entry that is a host path, for a run whose login is not root@pam's password: PVE
        refuses it at the change (pve-container src/PVE/LXC.pm check_ct_modify_config_perm: "mount point type bind
        is only allowed for root@pam"), so it is refused here, before anything changes."""
        out = []
        for i, e in enumerate(self.containers if isinstance(self.containers, list) else []):
            mounts = e.get('mounts') if isinstance(e, dict) and isinstance(e.get('mounts'), dict) else {}
            for key in _snapshot.host_paths(mounts):
                out.append('containers[{0}] (vmid {1}).mounts: {2} is a host path, which only root@pam with its '
                           'password may set (PVE: "mount point type bind is only allowed for root@pam"), and this '
                           'run logs in with a token: give gpufleet_api_password, or bind the path by a raw '
                           'lxc.mount.entry line'.format(i, e.get('vmid'), key))
        return out

    @staticmethod
    def unparsed_versions(pve):
        """Each node whose PVE version (pve: {node: version} or one for all) is not one: how GPUs go in, and what
        PVE applies live, follow from it, so it is never guessed."""
        found = (['node {0}'.format(n), v, 'nodes/{0}/version'.format(n)] for n, v in sorted(pve.items())) \
            if isinstance(pve, dict) else ([['the cluster', pve, 'version']] if pve is not None else [])
        return ['{0}: its PVE version {1!r} (GET /{2}) is not one this collection can read (it reads major.minor, '
                'as 9.0.10)'.format(who, text, path) for who, text, path in found
                if not re.match(r'^\d+\.\d+', str(text or ''))]

    def held_elsewhere(self):
        """Each GPU an entry is given that a container outside the fleet holds on the entry's node (an orphan, or one
        made by hand: discovery's held, read from the node's PVE configs), unless GPUs may be shared: two containers
        would share it by accident. Refused before anything changes, naming the holder."""
        if self.gpu_sharing or not isinstance(self.containers, list):
            return []
        fleet = set(e.get('vmid') for e in self.containers if isinstance(e, dict))
        out = []
        for i, e in enumerate(self.containers):
            if not isinstance(e, dict) or e.get('state') == 'absent' or not isinstance(e.get('node'), str):
                continue
            held = (self.nodes.get(e['node']) or {}).get('held') or {}
            try:
                given = gpu_list(e, self.gpus.get(e['node']) or [])
            except (TypeError, ValueError):
                continue  # errors() names what is wrong with its gpus
            for g in given:
                holders = [h for h in held.get(g) or held.get(str(g)) or [] if h.get('vmid') not in fleet]
                for h in holders:
                    out.append('containers[{0}] (vmid {1}).gpus: GPU {2} of node {3} is held by CT {4}{5}, which is '
                               'not in the fleet: give this container another GPU, or take the GPU from CT {4} (its '
                               'devN, then a restart), add CT {4} to the fleet, or destroy it'.format(
                                   i, e.get('vmid'), g, e['node'], h.get('vmid'),
                                   ' ({0})'.format(h['name']) if h.get('name') else ''))
        return out

    def unlocked(self):
        """Each entry whose template brings a Python (_profile.template_python) that its venv profile's lock is not
        for: its venv cannot be built, so it is refused before anything changes, naming the profile to lock."""
        out = []
        for i, e in enumerate(self.containers if isinstance(self.containers, list) else []):
            if not isinstance(e, dict) or e.get('state') == 'absent':
                continue
            template = e.get('template') or self.defaults.get('ostemplate')
            python = _profile.template_python(template)
            profile = self.profiles.get(e.get('venv_profile') or '') or {}
            if python and profile.get('pythons') and python not in profile['pythons']:
                out.append('containers[{0}] (vmid {1}).venv_profile: the profile {2} is locked for Python {3}, but the '
                           'template {4} brings Python {5}: {6}'.format(
                               i, e.get('vmid'), profile['name'], ', '.join(profile['pythons']),
                               str(template).rsplit('/', 1)[-1], python,
                               _profile.relock_fix(profile['name'], python, profile['dir'])))
        return out

    def below_floor(self):
        """Each entry with GPUs whose node runs an NVIDIA driver older than its venv profile's floor (the oldest
        driver that runs every CUDA wheel of the profile's lock: _profile.driver_floor): its first CUDA call would
        fail, so it is refused before anything changes, naming the node, the profile, the wheel and the driver."""
        out = []
        for i, e in enumerate(self.containers if isinstance(self.containers, list) else []):
            if not isinstance(e, dict) or e.get('state') == 'absent' or not e.get('gpus'):
                continue
            driver = (self.nodes.get(e.get('node')) or {}).get('driver_version')
            profile = self.profiles.get(e.get('venv_profile') or '') or {}
            if _profile.below_floor(driver, profile.get('floor')):
                out.append('containers[{0}] (vmid {1}).venv_profile: node {2} runs the NVIDIA driver {3}, and {4}: '
                           'upgrade the node\'s driver to {5} or newer (gpufleet driver-upgrade --node {2} --version '
                           'VERSION), or give this container a profile whose wheels that driver runs'.format(
                               i, e.get('vmid'), e['node'], driver,
                               _profile.floor_words(profile['name'], profile['floor']), profile['floor']['driver']))
        return out

    def unconfirmed(self):
        """Each entry with state absent that the run would destroy without its vmid in remove_confirm."""
        if self.remove_confirm is None:
            return []
        absent = [(i, e) for i, e in enumerate(self.containers or [])
                  if isinstance(e, dict) and e.get('state') == 'absent' and e.get('vmid') not in self.remove_confirm]
        every = ','.join(str(e.get('vmid')) for e in self.containers or []
                         if isinstance(e, dict) and e.get('state') == 'absent')
        return ['containers[{0}] (vmid {1}).state: absent destroys CT {1} and everything in it (stopped first where it '
                'runs); to go on, run again with -e gpufleet_remove_confirm={2}'.format(i, e.get('vmid'), every)
                for i, e in absent]

    def check_cluster(self, cluster):
        """Raise FleetError naming every planned entry whose node is not one of the cluster's (cluster: its node
        names, as GET /nodes lists them)."""
        problems = ['containers[{0}] (vmid {1}).node: {2} is not a node of the cluster (its nodes: {3})'.format(
            i, e.get('vmid'), e['node'], ', '.join(sorted(cluster))) for i, e in enumerate(self.containers)
            if isinstance(e, dict) and e.get('node') in self.reached and e['node'] not in cluster]
        if problems:
            raise FleetError(problems)

    def version_nodes(self):
        """The nodes whose PVE version the plan depends on, sorted: those with a container that stays with GPUs or
        devices, passed through as devN (which PVE has from 8.1 on) or in auto mode (devN from 8.1 on, raw lines
        before). Each node's own version counts: a cluster being upgraded runs several."""
        if self.passthrough == 'raw' or self.override.get('state') == 'absent':
            return []
        return sorted(set(e['node'] for e in self.planned()
                          if gpu_list(e, self.gpus.get(e.get('node')) or []) or e.get('devices')))

    def needs_version(self):
        return bool(self.version_nodes())

    def planned(self):
        """The entries of the nodes this run reaches (after check(): every entry is a dict with a node)."""
        return [e for e in self.containers or [] if isinstance(e, dict) and e.get('node') in self.reached]

    def node(self, entry):
        return self.nodes.get(entry['node']) or {}

    def gpus_of(self, entry):
        return gpu_list(entry, self.gpus.get(entry['node']))

    def device_nodes(self, entry):
        """The device nodes the entry's GPUs need on its node (see gpu_nodes)."""
        node = self.node(entry)
        return gpu_nodes(entry, self.gpus.get(entry['node']), self.gpu_mode, self.gpu_gid, node.get('control'),
                         node.get('minors'), node.get('vendor'))

    def node_mounts(self, entry):
        """[{path, mp, read_only}]: the node paths the fleet binds into the entry's container (see mount_line): its
        node's driver bundle where it has GPUs, then the node's shares."""
        node = self.node(entry)
        out = []
        if self.driver_mount and node.get('driver') and self.gpus_of(entry):
            out.append({'path': node['driver'], 'mp': self.driver_mount, 'read_only': True})
        return out + list(self.shares.get(entry['node']) or [])

    def spec(self, entry, mode):
        """One lxc_container entry: the fleet entry's values over the role's defaults, its own mount points (all of
        the container's mpN, where the fleet binds node paths into it too: those go in as raw lines, see raw), its
        GPUs' device nodes as devN (mode devn) or none (mode raw: they go in as raw lines)."""
        spec = dict((k, v) for k, v in self.defaults.items() if v is not None)
        for key in ('vmid', 'hostname', 'node', 'cores', 'memory', 'swap', 'unprivileged', 'features', 'tags',
                    'description', 'onboot', 'storage', 'state', 'nameserver', 'searchdomain', 'restart_on_pending'):
            if entry.get(key) is not None:
                spec[key] = entry[key]
        if entry.get('engine'):
            spec['features'] = engine_features(spec.get('features'))
        if entry.get('template'):
            spec['ostemplate'] = entry['template']
        if self.tag:
            spec['tags'] = sorted(set(spec.get('tags') or []) | set([self.tag]))
        if entry.get('state') == 'absent':
            spec['force'] = True  # confirmed (see unconfirmed): a running container is stopped, then destroyed
        rootfs = entry.get('rootfs', spec.get('rootfs'))  # the entry's, else the role's default size
        if isinstance(rootfs, int):
            spec['rootfs'] = '{0}:{1}'.format(spec.get('storage') or 'local-lvm', rootfs)
        elif rootfs:
            spec['rootfs'] = rootfs
        net = entry.get('net')
        if isinstance(net, str):
            spec['net'] = {'net0': net}
        elif isinstance(net, dict):
            spec['net'] = net
        mounts = dict(entry.get('mounts') or {})
        if mounts or entry.get('mounts') is not None or self.node_mounts(entry):
            spec['mounts'] = mounts  # (an mpN an older release made for a node path goes: its raw line replaces it)
        devices = list(entry.get('devices') or [])
        spec['devices'] = devices if mode == 'raw' else self.device_nodes(entry) + devices
        return spec

    def expand(self, modes):
        """One lxc_container entry per container, for passthrough mode devn or raw (one for every node, or {node:
        mode}), with the override on top."""
        return [dict(self.spec(entry, per_node(modes, entry['node'])), **self.override) for entry in self.planned()]

    def raw(self, modes='raw'):
        """{node: {vmid: [raw lxc lines]}} of every container planned to exist: the node paths bound into it
        (node_mounts), what its entry asks for its jobs (job_lines), and its GPUs' device nodes where its node is passed through raw (PVE before 8.1, without
        devN; modes: one for every node, or {node: mode}). An empty list takes the collection's lines away."""
        out = {}
        for entry in self.planned():
            if entry.get('state') == 'absent':
                continue
            node = self.node(entry)
            lines = []
            if per_node(modes, entry['node']) == 'raw':
                devices = gpu_nodes(entry, self.gpus.get(entry['node']), minors=node.get('minors'),
                                    vendor=node.get('vendor'))
                lines = raw_lines(devices, node.get('majors') or {}, node.get('vendor'))
            out.setdefault(entry['node'], {})[entry['vmid']] = (lines + [mount_line(m) for m in self.node_mounts(entry)]
                                                                + job_lines(entry))
        return out

    def snapshots(self, wanted, storages=None):
        """{vmid: why PVE cannot snapshot the container, or None} for the containers of wanted (lxc_container
        specs): a mount point of the entry's own that is a host path, or a volume on a storage that cannot snapshot
        (storages: {id: type}, where known). The collection's own binds are raw lines, which never stop it."""
        return dict((spec['vmid'], _snapshot.spec_refusal(spec, storages)) for spec in wanted
                    if spec.get('state') != 'absent')

    def raw_owned(self):
        """{node: {targets, majors}}: the raw lines of the collection on each planned node (_pveconf.ours), the
        ones lxc_raw manages, leaving a container's others alone."""
        out = {}
        for name in sorted(set(e['node'] for e in self.planned())):
            node = self.nodes.get(name) or {}
            targets = ([self.driver_mount] if self.driver_mount else []) + [s['mp'] for s in self.shares.get(name) or []]
            out[name] = {'targets': targets, 'majors': sorted(set(str(m) for m in (node.get('majors') or {}).values()))}
        return out

    def hosts(self):
        """{vmid: what each container's inventory host carries}: its hostname and fleet entry, its GPUs (indexes),
        its node's gpu_devices entries for them, and snapshots_off (why its changes are made without a snapshot:
        its entry asks for a host-path mount point, _snapshot.declared_off; or None)."""
        out = {}
        for entry in self.planned():
            gpus = self.gpus_of(entry)
            out[entry['vmid']] = {'hostname': entry['hostname'], 'entry': entry, 'gpus': gpus,
                                  'gpu_info': [g for g in self.node(entry).get('gpus') or [] if g.get('index') in gpus],
                                  'snapshots_off': _snapshot.declared_off(entry.get('mounts'))}
        return out

    def p2p_blocked(self):
        """{vmid: [{gpus, bridge, acs}]}: the containers given two GPUs or more that a bridge redirecting peer to peer
        (ACS RR or CR, in their node's PCIe path as gpu_devices read it) stands between: NCCL's transfers between
        those GPUs go up to the root complex, or through shared memory."""
        out = {}
        for entry in self.planned():
            gpus = self.gpus_of(entry) or []
            found = _pcie.p2p_blocked(self.node(entry).get('pcie') or {}, gpus) if len(gpus) > 1 else []
            if found:
                out[entry['vmid']] = found
        return out

    def modes(self, pve=None):
        """{node: devn or raw} for the planned nodes: O(passthrough) where it is not auto; in auto mode devN where
        the node runs PVE 8.1 or later (pve: {node: version}, or one version for all) or has nothing to pass
        through, raw lines before."""
        needs = self.version_nodes()
        out = {}
        for node in sorted(set(e['node'] for e in self.planned())):
            if self.passthrough != 'auto':
                out[node] = self.passthrough
            else:
                out[node] = 'devn' if node not in needs or pve_version(per_node(pve, node)) >= DEVN_SINCE else 'raw'
        return out

    def plan(self, pve=None, check_mode=False, storages=None):
        """{passthrough, passthrough_nodes, wanted, containers, raw, raw_owned, hosts}: passthrough is devn or raw
        where every planned node has the same mode, else mixed; passthrough_nodes the mode of each node. Outside
        check mode, the containers that get raw lines are reconciled present first, for their raw lines to be
        written before they start; raw: {node: {vmid: lines}} (see raw, raw_owned); hosts: {vmid: inventory host}
        (see hosts()); snapshots: {vmid: why PVE cannot snapshot it, or None} (storages: {id: type}, where the API
        was read)."""
        modes = self.modes(pve)
        wanted = self.expand(modes)
        raw = self.raw(modes)
        first = [dict(spec, state='present') if (raw.get(spec['node']) or {}).get(spec['vmid']) and not check_mode
                 and spec.get('state', 'started') == 'started' else spec for spec in wanted]
        kinds = set(modes.values())
        summary = kinds.pop() if len(kinds) == 1 else ('mixed' if kinds else (
            self.passthrough if self.passthrough != 'auto' else 'devn'))
        return {'passthrough': summary, 'passthrough_nodes': modes, 'wanted': wanted, 'containers': first,
                'raw': raw, 'raw_owned': self.raw_owned(), 'snapshots': self.snapshots(wanted, storages),
                'hosts': self.hosts(), 'venv_pythons': self.venv_pythons(), 'p2p_blocked': self.p2p_blocked(),
                'vmids': sorted(e['vmid'] for e in self.containers if isinstance(e, dict) and 'vmid' in e)}

    def venv_pythons(self):
        """{vmid: {name, dir, pythons}}: the venv profile of each entry, where it could be read, and the Pythons its
        lock is for (the doctor holds each running container's own Python to it)."""
        return dict((e['vmid'], self.profiles[e.get('venv_profile') or ''])
                    for e in self.containers if isinstance(e, dict) and (e.get('venv_profile') or '') in self.profiles)
