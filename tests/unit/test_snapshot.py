"""The collection's snapshots: their names, which are kept, and what PVE would refuse."""

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _snapshot


def listed(*names):
    return [{'name': n, 'snaptime': 0} for n in names] + [{'name': 'current', 'running': 1}]


def test_a_snapshot_is_named_by_the_collection_and_the_utc_time():
    import calendar
    assert _snapshot.name_at(calendar.timegm((2026, 12, 3, 9, 5, 7))) == 'gpufleet-20261203-090507'
    assert _snapshot.NAME.match(_snapshot.name_at()) and len(_snapshot.name_at()) <= 40


def test_the_last_n_of_the_collections_snapshots_are_kept_and_the_operators_never_removed():
    snaps = listed('before-upgrade', 'gpufleet-20261201-100000', 'gpufleet-20261203-090000', 'gpufleet-20261202-120000',
                   'gpufleet-manual')
    assert _snapshot.ours(snaps) == ['gpufleet-20261201-100000', 'gpufleet-20261202-120000', 'gpufleet-20261203-090000']
    assert _snapshot.newest(snaps) == 'gpufleet-20261203-090000' and _snapshot.newest(listed('mine')) is None
    # taking a fourth: with keep 3 the oldest goes, with keep 2 the two oldest
    assert _snapshot.to_remove(snaps, 3, 'gpufleet-20261204-080000') == ['gpufleet-20261201-100000']
    assert _snapshot.to_remove(snaps, 2, 'gpufleet-20261204-080000') == ['gpufleet-20261201-100000',
                                                                          'gpufleet-20261202-120000']
    assert _snapshot.to_remove(snaps, 5, 'gpufleet-20261204-080000') == []
    assert _snapshot.to_remove(snaps, 0, 'gpufleet-20261204-080000') == []  # 0: none removed


def test_what_pve_cannot_snapshot_is_named():
    ours = {'rootfs': 'local-lvm:vm-201-disk-0,size=32G', 'mp0': 'local-lvm:vm-201-disk-1,mp=/data,size=8G',
            'dev0': '/dev/nvidia0', 'lxc': [['lxc.mount.entry', '/opt/gpufleet/driver/580 opt/nvidia-driver none bind']]}
    assert _snapshot.refusal(ours, {'local-lvm': 'lvmthin'}) is None
    bound = dict(ours, mp1='/srv/data,mp=/data2', mp10='/dev/sdb1,mp=/disk')
    assert _snapshot.refusal(bound, {'local-lvm': 'lvmthin'}) == (
        'its mount points mp1 (/srv/data), mp10 (/dev/sdb1) are a host path, which PVE cannot snapshot ("snapshot '
        'feature is not available"): bind the path by a raw lxc.mount.entry line instead, or remove it')
    on_dir = dict(ours, rootfs='local:201/vm-201-disk-0.raw,size=8G')
    assert _snapshot.refusal(on_dir, {'local-lvm': 'lvmthin', 'local': 'dir'}) == (
        "rootfs is on storage local (dir), which cannot snapshot a container's volume (lvmthin, zfspool, rbd and "
        'btrfs can)')


def test_snapshots_are_off_where_the_entry_itself_asks_for_a_host_path_mount_point():
    assert _snapshot.declared_off({'mp0': '/srv/data,mp=/data', 'mp1': 'local-lvm:4,mp=/scratch'}) == (
        'it mounts a host path (mp0 /srv/data), which PVE cannot snapshot')
    assert _snapshot.declared_off({'mp0': 'local-lvm:4,mp=/scratch'}) is None
    assert _snapshot.declared_off(None) is None and _snapshot.declared_off({}) is None
