# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A container's PVE snapshots as the collection takes them: named by the collection and the time, the last N
kept and only its own removed, refused before PVE refuses them, and rolled back.

PVE snapshots a container only where every mount point is a volume of a storage that can snapshot it
(pve-guest-common src/PVE/AbstractConfig.pm snapshot_prepare: "snapshot feature is not available" unless
pve-container src/PVE/LXC/Config.pm has_feature('snapshot') passes; it asks PVE::Storage::volume_has_feature of the
rootfs and of each mpN, which answers undef for a host path, pve-storage src/PVE/Storage.pm). devN entries and raw
lxc.* lines are not volumes. A rollback stops the container first (LXC/Config.pm __snapshot_rollback_vm_stop) and
starts it after only when asked (start=1).
"""

import re
import time

# The collection's snapshots: gpufleet-<UTC date>-<time>, a valid PVE snapshot name (pve-guest-common
# src/PVE/GuestHelpers.pm: the 'pve-configid' format, a letter first, then letters, digits, '_' and '-', at most 40).
NAME = re.compile(r'^gpufleet-(\d{8})-(\d{6})$')
# The storage types whose container volumes PVE snapshots (their plugins' volume_has_feature 'snapshot' for a
# container's raw or subvol volume: LvmThinPlugin, ZFSPoolPlugin, RBDPlugin, BTRFSPlugin; a dir, lvm or nfs storage
# snapshots qcow2 images only, which containers do not use).
SNAPSHOT_STORAGE = ('lvmthin', 'zfspool', 'rbd', 'btrfs')
MOUNT_KEY = re.compile(r'^(rootfs|mp\d+)$')


class Refused(ValueError):
    """PVE cannot snapshot the container: kind is host_path (a mount point of its own that is a host path: the
    operator's choice, with which its snapshots are off) or storage (a volume on a storage that cannot snapshot)."""

    def __init__(self, msg, kind):
        super(Refused, self).__init__(msg)
        self.kind = kind


def name_at(when=None):
    """The name of a snapshot the collection takes at when (seconds since the epoch; now by default)."""
    return time.strftime('gpufleet-%Y%m%d-%H%M%S', time.gmtime(time.time() if when is None else when))


def ours(snapshots):
    """The collection's snapshots among PVE's list (GET .../snapshot: dicts with name, 'current' among them),
    oldest first."""
    return sorted(s['name'] for s in snapshots or [] if NAME.match(str(s.get('name', ''))))


def to_remove(snapshots, keep, taking=None):
    """The collection's snapshots to delete so that keep of them remain (with taking, the one about to be taken,
    counted among them); the operator's own are never among them."""
    names = ours(snapshots) + ([taking] if taking else [])
    return sorted(names)[:max(len(names) - keep, 0)] if keep > 0 else []


def _volume(value):
    return str(value or '').split(',', maxsplit=1)[0]


def mount_keys(config):
    """The mount points of a config (rootfs, then mpN in order), as PVE's foreach_volume walks them."""
    return sorted((k for k in config or {} if MOUNT_KEY.match(k)), key=lambda k: -1 if k == 'rootfs' else int(k[2:]))


def host_paths(config):
    """The mount points of a config that are a host path (a bind or device mount point), in order."""
    return [k for k in mount_keys(config) if _volume(config[k]).startswith('/')]


def storage_types(client):
    """{storage id: type} of the cluster's storages (GET /storage through client, a _pve.PveClient): what refusal
    judges a volume's storage by."""
    return dict((s['storage'], s.get('type')) for s in client.get('storage'))


def refusal(config, storages=None):
    """Why PVE cannot snapshot the container (its current config: GET .../config), or None: each mount point that
    is a host path (a bind or device mount point), then each volume on a storage that cannot snapshot (storages:
    {storage id: type}, GET /storage; a storage not listed is not judged)."""
    keys = mount_keys(config)
    paths = ['{0} ({1})'.format(k, _volume(config[k])) for k in host_paths(config)]
    if paths:
        return ('its mount point{0} {1} {2} a host path, which PVE cannot snapshot ("snapshot feature is not '
                'available"): bind the path by a raw lxc.mount.entry line instead, or remove it'.format(
                    's' if len(paths) > 1 else '', ', '.join(paths), 'are' if len(paths) > 1 else 'is'))
    for key in keys:
        storage = _volume(config[key]).split(':')[0]
        kind = (storages or {}).get(storage)
        if kind is not None and kind not in SNAPSHOT_STORAGE:
            return ('{0} is on storage {1} ({2}), which cannot snapshot a container\'s volume (lvmthin, zfspool, '
                    'rbd and btrfs can)'.format(key, storage, kind))
    return None


def declared_off(mounts):
    """Why snapshots are off for a container whose definition asks for a host-path mount point (mounts: its
    entry's {mpN: value}), or None: the operator asked for what PVE cannot snapshot, so its changes are made
    without one (the plan says so), where a storage that cannot snapshot refuses them unless the operator says."""
    paths = host_paths(dict(mounts or {}))
    if not paths:
        return None
    return 'it mounts a host path ({0}), which PVE cannot snapshot'.format(
        ', '.join('{0} {1}'.format(k, _volume(mounts[k])) for k in paths))


def spec_refusal(spec, storages=None):
    """refusal() of the container an lxc_container spec (a fleet plan's) makes: its own mount points and rootfs (the
    collection's binds are raw lines, which never stop a snapshot)."""
    config = dict(spec.get('mounts') or {})
    if spec.get('rootfs'):
        config['rootfs'] = spec['rootfs']
    return refusal(config, storages)


def newest(snapshots):
    """The newest of the collection's snapshots, or None."""
    found = ours(snapshots)
    return found[-1] if found else None


def run(client, vmid, state='present', name=None, keep=0, start=True, description=None, check_mode=False,
        lock_timeout=60):
    """The lxc_snapshot module's work through client (_pve.PveClient): state present takes a snapshot (name, or the
    collection's name for now) and removes the collection's beyond keep; rolled_back rolls the container back to
    name (the collection's newest by default), started again unless start is false; absent deletes name. Returns
    the module's result; raises _pve.PveError, or ValueError for what cannot be done (nothing changed then)."""
    guest = client.guests().get(int(vmid))
    if guest is None:
        raise ValueError('CT {0} does not exist'.format(vmid))
    node = guest['node']
    path = 'nodes/{0}/lxc/{1}/snapshot'.format(node, vmid)
    listed = client.get(path)
    names = [s['name'] for s in listed if s.get('name') != 'current']
    res = dict(changed=False, vmid=int(vmid), node=node, name=name, removed=[], snapshots=names)
    if state == 'present':
        config = client.get('nodes/{0}/lxc/{1}/config'.format(node, vmid))
        storages = storage_types(client)
        why = refusal(config, storages)
        if why:
            raise Refused('CT {0} cannot be snapshotted: {1}'.format(vmid, why),
                          'host_path' if host_paths(config) else 'storage')
        res['name'] = name = name or name_at()
        if name in names:
            return res
        res.update(changed=True, removed=to_remove(listed, keep, name))
        if not check_mode:
            params = dict(snapname=name, description=description) if description else dict(snapname=name)
            client.run_task('POST', path, node, 'snapshot {0} of CT {1}'.format(name, vmid), lock_timeout, **params)
            for old in res['removed']:
                client.run_task('DELETE', '{0}/{1}'.format(path, old), node,
                                'delete snapshot {0} of CT {1}'.format(old, vmid), lock_timeout)
        res['snapshots'] = [n for n in names if n not in res['removed']] + [name]
    elif state == 'rolled_back':
        res['name'] = name = name or newest(listed)
        if name is None:
            raise ValueError('CT {0} has no snapshot the collection took (gpufleet-<date>-<time>): name the one to '
                             'roll back to (it has: {1})'.format(vmid, ', '.join(names) or 'none'))
        if name not in names:
            raise ValueError('CT {0} has no snapshot {1} (it has: {2})'.format(vmid, name, ', '.join(names) or 'none'))
        res.update(changed=True, started=bool(start))
        if not check_mode:
            client.run_task('POST', '{0}/{1}/rollback'.format(path, name), node,
                            'rollback of CT {0} to {1}'.format(vmid, name), lock_timeout, **({'start': 1} if start else {}))
    elif state == 'absent':
        if not name:
            raise ValueError('name: the snapshot to delete is required')
        if name in names:
            res.update(changed=True, removed=[name], snapshots=[n for n in names if n != name])
            if not check_mode:
                client.run_task('DELETE', '{0}/{1}'.format(path, name), node,
                                'delete snapshot {0} of CT {1}'.format(name, vmid), lock_timeout)
    return res
