# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A container's config as the collection wants it and as PVE holds it: the options (CONTAINER_SPEC) checked, the wanted
config made from them, each property string (netN, mpN, devN, features, rootfs) compared parsed and
order-insensitive, and the update (sets, deletes, a resize) that makes PVE's config the wanted one. No API call:
_lxc's Reconciler reads and writes.

- an option left out is not managed; an option given empty (`devices: []`, `features: []`) means "none", and removes
  what is there.
"""


import re

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _pvecheck, _pveconf


# Per-container options (PVE's names where PVE has one).
CONTAINER_SPEC = dict(
    vmid=dict(type='int'),
    node=dict(type='str'),
    hostname=dict(type='str'),
    ostemplate=dict(type='str'),
    storage=dict(type='str'),
    rootfs=dict(type='str'),
    cores=dict(type='int'),
    memory=dict(type='int'),
    swap=dict(type='int'),
    net=dict(type='dict'),
    features=dict(type='list', elements='str'),
    unprivileged=dict(type='bool'),
    onboot=dict(type='bool'),
    tags=dict(type='list', elements='str'),
    description=dict(type='str'),
    nameserver=dict(type='str'),
    searchdomain=dict(type='str'),
    ssh_public_keys=dict(type='str', no_log=False),
    mounts=dict(type='dict'),
    devices=dict(type='list', elements='dict'),
    lxc_raw=dict(type='list', elements='str'),
    pve_root=dict(type='path'),
    state=dict(type='str', choices=['present', 'started', 'stopped', 'restarted', 'absent']),
    restart_on_pending=dict(type='bool'),
    force=dict(type='bool'),
    purge=dict(type='bool'),
)


DEFAULTS = dict(unprivileged=True, state='present', restart_on_pending=False, force=False, purge=False,
                pve_root='/etc/pve')


DEVICE_KEYS = ('path', 'mode', 'uid', 'gid', 'deny_write')


# Keys PVE fills in on its own inside a netN value: not a difference unless asked for.
NET_GENERATED = ('hwaddr', 'type')


DEFAULT_KEY = {'net': 'name', 'mp': 'volume', 'dev': 'path', 'rootfs': 'volume', 'unused': 'volume'}


NEW_VOLUME = re.compile(r'^([^:/]+):(\d+(?:\.\d+)?)$')


class SpecError(Exception):
    """A container definition that cannot be right: names the container and the field."""


# -- property strings ------------------------------------------------------------------
def parse_props(text, default_key=None):
    """A property string as a dict, split as PVE splits it (_pvecheck.property_pairs; a key given twice: the last)."""
    try:
        return dict(_pvecheck.property_pairs(text, default_key))
    except ValueError as e:
        raise SpecError('cannot parse {0!r}: {1}'.format(text, e))


def format_props(props, default_key=None):
    parts = []
    if default_key and default_key in props:
        parts.append(str(props[default_key]))
    for key in sorted(props):
        if key != default_key:
            parts.append('{0}={1}'.format(key, props[key]))
    return ','.join(parts)


def key_family(key):
    m = re.match(r'^(net|mp|dev|unused)\d+$', key)
    return m.group(1) if m else key


def _size_gb(text):
    m = re.match(r'^(\d+(?:\.\d+)?)([KMGT]?)$', str(text))
    if not m:
        return None
    factor = {'K': 1.0 / 1024 ** 2, 'M': 1.0 / 1024, 'G': 1.0, 'T': 1024.0, '': 1.0}[m.group(2)]
    return float(m.group(1)) * factor


def pve_bool(text):
    """A boolean as PVE's JSONSchema takes it (1, yes, on, true; anything else is false)."""
    return str(text).lower() in ('1', 'true', 'on', 'yes')


def canonical(key, value):
    """A value in a form where equal means equal to PVE."""
    family = key_family(key)
    if family in ('net', 'mp', 'dev') or key in ('rootfs', 'features'):
        props = parse_props(value, DEFAULT_KEY.get(family if family != key else key))
        if family == 'dev' and 'mode' in props:
            props['mode'] = '{0:04o}'.format(int(props['mode'], 8))
        if family == 'net':
            props = dict((k, v.lower() if k == 'hwaddr' else v) for k, v in props.items())
        if key == 'features':
            props = dict((k, '1' if pve_bool(v) else '0') for k, v in props.items())
        return props
    if key == 'tags':
        return tag_list(value)
    if key in ('cores', 'memory', 'swap', 'onboot', 'unprivileged'):
        return int(value)
    if key == 'description':
        return str(value).rstrip('\n')
    return str(value)


def same(key, wanted, current):
    """Does the live value satisfy the wanted one?"""
    if current is None:
        return wanted is None
    if wanted is None:
        return False
    w, c = canonical(key, wanted), canonical(key, current)
    family = key_family(key)
    if family == 'net':
        c = dict((k, v) for k, v in c.items() if k in w or k not in NET_GENERATED)
    if family == 'mp' or key == 'rootfs':
        new = NEW_VOLUME.match(w.get('volume', ''))
        if new:
            # "local-lvm:8" asks for a new 8 GiB volume; PVE answers with its name and size=8G.
            storage, size = new.groups()
            vol = c.get('volume', '')
            if not vol.startswith(storage + ':') or _size_gb(c.get('size', '')) != float(size):
                return False
            w = dict((k, v) for k, v in w.items() if k != 'volume')
            c = dict((k, v) for k, v in c.items() if k not in ('volume', 'size'))
    return w == c


# -- the wanted config -------------------------------------------------------------------
def device_value(index, dev):
    """A devices entry as PVE's devN string; its values are checked against PVE's schema by validate()."""
    if not isinstance(dev, dict):
        raise SpecError('devices[{0}] must be a dict with at least path (devices: [{{path: /dev/nvidia0}}]), '
                        'got {1!r}'.format(index, dev))
    unknown = sorted(set(dev) - set(DEVICE_KEYS))
    if unknown:
        raise SpecError('devices[{0}]: unknown key(s) {1}; known: {2}'.format(
            index, ', '.join(unknown), ', '.join(DEVICE_KEYS)))
    path = dev.get('path')
    if not path or not isinstance(path, str):
        raise SpecError('devices[{0}].path: a device under /dev/ is required, got {1!r}'.format(index, path))
    props = {'path': path}
    if dev.get('mode') is not None:
        mode = str(dev['mode'])
        # 666 means 0666; anything else goes to PVE's pattern as it is
        props['mode'] = '0' + mode if re.match(r'^[0-7]{3}$', mode) else mode
    for key in ('uid', 'gid'):
        if dev.get(key) is not None:
            props[key] = str(dev[key])
    if dev.get('deny_write') is not None:
        props['deny-write'] = '1' if dev['deny_write'] in (True, 1, '1', 'true', 'yes') else '0'
    return format_props(props)


def _indexed(option, values, family):
    if not isinstance(values, dict):
        raise SpecError('{0} must be a dict of {1}N: value, got {2!r}'.format(option, family, values))
    out = {}
    for key, value in values.items():
        if not re.match(r'^{0}\d+$'.format(family), str(key)):
            raise SpecError('{0}: key {1!r} is not {2}N'.format(option, key, family))
        if isinstance(value, dict):
            # Only mpN has a default key (volume) in PVE's schema; netN is all key=value.
            value = format_props(dict((k, str(v)) for k, v in value.items()),
                                 'volume' if family == 'mp' and 'volume' in value else None)
        out[str(key)] = str(value)
        parse_props(out[str(key)], DEFAULT_KEY[family])
    return out


def wanted_config(spec):
    """(values, managed families): the PVE keys the spec sets, and which key families it owns whole."""
    values, owned = {}, set()
    for key in ('hostname', 'cores', 'memory', 'swap', 'description', 'nameserver', 'searchdomain'):
        if spec.get(key) is not None:
            values[key] = spec[key]
    if spec.get('onboot') is not None:
        values['onboot'] = 1 if spec['onboot'] else 0
    if spec.get('tags') is not None:
        owned.add('tags')
        if spec['tags']:
            values['tags'] = ';'.join(sorted(set(spec['tags'])))
    if spec.get('features') is not None:
        owned.add('features')
        feats = {}
        for item in spec['features']:
            k, eq, v = str(item).partition('=')
            if not eq:
                raise SpecError('features: {0!r} must be key=value (e.g. nesting=1)'.format(item))
            feats[k.strip()] = v.strip()
        if feats:
            values['features'] = format_props(feats)
    if spec.get('net') is not None:
        owned.add('net')
        values.update(_indexed('net', spec['net'], 'net'))
    if spec.get('mounts') is not None:
        owned.add('mp')
        values.update(_indexed('mounts', spec['mounts'], 'mp'))
    if spec.get('devices') is not None:
        owned.add('dev')
        if not isinstance(spec['devices'], list):
            raise SpecError('devices must be a list of dicts (devices: [{{path: /dev/nvidia0}}]), got {0!r}'.format(
                spec['devices']))
        for i, dev in enumerate(spec['devices']):
            values['dev{0}'.format(i)] = device_value(i, dev)
    if spec.get('rootfs') is not None:
        values['rootfs'] = rootfs_value(spec['rootfs'], spec.get('storage'))
    return values, owned


def keep_device_keys(values, current, pending=()):
    """values (wanted_config's) with its devN keys given so that each device keeps the key it has in current (the
    same path), and each new one takes the lowest key that neither current nor pending (keys waiting for a restart,
    deletions included) holds. The devices list numbers its entries dev0, dev1, ...; without this, a GPU added before
    the control nodes would move nvidiactl and the rest to other keys: a one-GPU change would become a change of
    several keys, which PVE never hot-plugs over an existing one (pve-container src/PVE/LXC/Config.pm
    vmconfig_hotplug_pending: "don't try to hotplug over existing dev"), and a new key for a path the container
    already has fails the whole change (src/PVE/LXC.pm create_passthrough_device_node: mknod of a node that exists).
    A key no longer wanted is deleted and stays free until a later run."""
    wanted = sorted((k for k in values if key_family(k) == 'dev'), key=lambda k: int(k[3:]))
    if not wanted:
        return values
    held = {}
    for key in sorted((k for k in current if key_family(k) == 'dev'), key=lambda k: int(k[3:])):
        held.setdefault(parse_props(current[key], 'path').get('path'), key)
    out = dict((k, v) for k, v in values.items() if key_family(k) != 'dev')
    new = []
    for key in wanted:
        kept = held.pop(parse_props(values[key], 'path').get('path'), None)
        if kept is None:
            new.append(values[key])
        else:
            out[kept] = values[key]
    used = set(k for k in list(current) + list(pending) + list(out) if key_family(k) == 'dev')
    free = (n for n in range(10 ** 6) if 'dev{0}'.format(n) not in used)
    for value in new:
        out['dev{0}'.format(next(free))] = value
    return out


def rootfs_value(rootfs, storage):
    """rootfs as PVE takes it: a bare size (8) is a new volume on `storage` (local-lvm:8)."""
    text = str(rootfs).strip()
    if re.match(r'^\d+(?:\.\d+)?$', text):
        if not storage:
            raise SpecError('rootfs: {0!r} is a size but names no storage: give STORAGE:SIZE_IN_GiB '
                            '(local-lvm:{0}) or the storage option'.format(text))
        return '{0}:{1}'.format(storage, text)
    return text


# Where a PVE config key comes from in the options, for messages.
def option_name(key):
    m = re.match(r'^(net|mp|dev)(\d+)$', key)
    if m:
        return {'net': 'net.{0}', 'mp': 'mounts.{0}', 'dev': 'devices[{1}] ({0})'}[m.group(1)].format(key, m.group(2))
    return {'ssh-public-keys': 'ssh_public_keys'}.get(key, key)


def volume_problem(key, value):
    """A rootfs or mpN volume PVE cannot take: not a path (bind mount, device) and no STORAGE: in front.

    pve-container src/PVE/LXC/Config.pm classify_mountpoint makes anything not starting with / a storage
    volume, which pve-storage src/PVE/Storage.pm parse_volume_id refuses without STORAGE: in front.
    """
    volume = parse_props(value, 'volume').get('volume')
    if volume is None:
        return 'names no volume: a new one is STORAGE:SIZE_IN_GiB (local-lvm:8), got {0!r}'.format(value)
    if not volume.startswith('/') and ':' not in volume:
        return 'volume {0!r} names no storage: a new one is STORAGE:SIZE_IN_GiB (local-lvm:8)'.format(volume)
    return None


def plan_update(values, owned, current):
    """(set, delete, diff_before, diff_after) to turn current into what the spec wants."""
    sets, deletes = {}, []
    before, after = {}, {}
    for key, value in sorted(values.items()):
        if key == 'rootfs':
            continue  # create-time; a size change is a resize (see plan_resize)
        if not same(key, value, current.get(key)):
            if key_family(key) == 'net' and key in current:
                # Keep what PVE generated (the MAC address) unless the spec says otherwise.
                props = parse_props(value, 'name')
                for gen in NET_GENERATED:
                    old = parse_props(current[key], 'name').get(gen)
                    if gen not in props and old:
                        props[gen] = old
                value = format_props(props)
            sets[key] = value
            before[key] = current.get(key)
            after[key] = value
    for key in sorted(current):
        family = key_family(key)
        owned_here = family in owned and family != key or key in owned
        if owned_here and key not in values and key not in ('digest',):
            deletes.append(key)
            before[key] = current[key]
            after[key] = None
    return sets, deletes, before, after


def plan_resize(values, current):
    """The rootfs size to grow to (e.g. '16G'), None, or SpecError for a shrink."""
    want = values.get('rootfs')
    if not want or 'rootfs' not in current:
        return None
    new = NEW_VOLUME.match(str(want))
    size = new.group(2) if new else parse_props(want, 'volume').get('size')
    if not size:
        return None
    have = _size_gb(parse_props(current['rootfs'], 'volume').get('size', '')) or 0
    want_gb = _size_gb(size if not new else size + 'G')
    if want_gb is None or want_gb == have:
        return None
    if want_gb < have:
        raise SpecError('rootfs: cannot shrink from {0:g}G to {1:g}G'.format(have, want_gb))
    return '{0:g}G'.format(want_gb)


def spec_problems(spec):
    """Every problem of one container definition as 'field: why', checked against PVE's schema."""
    out = []
    vmid = spec.get('vmid')
    if vmid is None:
        out.append('vmid: required')
    else:
        why = _pvecheck.problem('vmid', vmid)
        if why:
            out.append('vmid: {0}'.format(why))
    if spec.get('hostname') is not None:
        why = _pvecheck.hostname_problem(spec['hostname'])
        if why:
            out.append('hostname: {0}'.format(why))
    for option, key in (('node', 'node'), ('ostemplate', 'ostemplate'), ('storage', 'storage'),
                        ('ssh_public_keys', 'ssh-public-keys')):
        if spec.get(option) is not None:
            why = _pvecheck.problem(key, spec[option])
            if why:
                out.append('{0}: {1}'.format(option, why))
    try:
        values = wanted_config(spec)[0]
    except SpecError as e:
        out.append(str(e))
        values = {}
    for key, value in sorted(values.items(), key=lambda kv: (re.sub(r'\d+$', '', kv[0]), len(kv[0]), kv[0])):
        if key == 'hostname':
            continue
        why = volume_problem(key, value) if key == 'rootfs' or key_family(key) == 'mp' else None
        why = why or _pvecheck.problem(key, value)
        if why:
            out.append('{0}: {1}'.format(option_name(key), why))
    try:
        _pveconf.normalize(spec.get('lxc_raw'))
    except _pveconf.RawError as e:
        out.append(str(e))
    return out


def validate(specs):
    """Check every value of every container against PVE's schema before anything is asked of PVE (the
    login included); raise SpecError naming each container (index, vmid, hostname) and field."""
    seen, problems = {}, []
    for i, spec in enumerate(specs):
        where = 'containers[{0}]'.format(i) if len(specs) > 1 else 'container'
        vmid = spec.get('vmid')
        label = where if vmid is None else '{0} (vmid {1}{2})'.format(
            where, vmid, ', hostname {0}'.format(spec['hostname']) if spec.get('hostname') else '')
        if vmid is not None and vmid in seen:
            problems.append('{0}: vmid {1} is also given by containers[{2}]'.format(where, vmid, seen[vmid]))
        elif vmid is not None:
            seen[vmid] = i
        problems.extend('{0}: {1}'.format(label, why) for why in spec_problems(spec))
    if len(problems) == 1:
        raise SpecError(problems[0])
    if problems:
        raise SpecError('{0} problems, nothing was changed: {1}'.format(len(problems), '; '.join(problems)))


def tag_list(value):
    """PVE's tags as a sorted list (it keeps them ';'-separated; ',' and spaces separate them on input too)."""
    return sorted(t for t in re.split(r'[;, ]+', str(value or '')) if t)


def container_specs(params):
    """The containers a module call asks for: its own options, or each of `containers` on top of them; those the
    call's `restart` names are restarted where they are to run."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
    top = dict((k, params.get(k)) for k in CONTAINER_SPEC)
    if params.get('containers') is None:
        entries = [top]
    else:
        validator = ArgumentSpecValidator(CONTAINER_SPEC)
        entries = []
        for i, entry in enumerate(params['containers']):
            if not isinstance(entry, dict):
                raise SpecError('containers[{0}] must be a dict of container options'.format(i))
            unknown = sorted(set(entry) - set(CONTAINER_SPEC))
            if unknown:
                raise SpecError('containers[{0}]: unknown option(s) {1}'.format(i, ', '.join(unknown)))
            result = validator.validate(entry)
            if result.error_messages:
                raise SpecError('containers[{0}]: {1}'.format(i, '; '.join(result.error_messages)))
            spec = dict((k, v) for k, v in top.items() if k != 'vmid')
            spec.update((k, v) for k, v in result.validated_parameters.items() if v is not None)
            entries.append(spec)
    restart = set(params.get('restart') or [])
    for spec in entries:
        for key, value in DEFAULTS.items():
            if spec.get(key) is None:
                spec[key] = value
        if spec['vmid'] in restart and spec['state'] == 'started':
            spec['state'] = 'restarted'
    return entries
