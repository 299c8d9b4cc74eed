"""The real LXC containers behind the lab's API: one per PVE container, named by its vmid.

`Containers.reconcile(vmid, wanted)` makes the real container match what the API
holds (`None` once it is destroyed): created as an overlay over the cached Debian
base, started with its config applied, hot-plugged while running, stopped,
destroyed.  Whatever it cannot do raises `BackendError` with LXC's own last lines.
"""

import json
import os
import shutil
import stat
import subprocess
import sys

from . import lxcconf
from .layout import UNPRIV_BASE


class BackendError(Exception):
    def __init__(self, message, log=()):
        super().__init__(message)
        self.log = list(log)


def cgroup_v2():
    """True when the devices controller is cgroup v2 (as on every current Proxmox node)."""
    return not os.path.isdir('/sys/fs/cgroup/devices')


def run(argv, check=True, **kwargs):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    if check and proc.returncode != 0:
        raise BackendError('{0} failed ({1}): {2}'.format(argv[0], proc.returncode, proc.stderr.strip()))
    return proc


class Containers:
    def __init__(self, lab):
        self.lab = lab
        self.cgroup_v2 = cgroup_v2()

    def _lxc(self, tool, vmid, *args, check=True):
        return run(['lxc-' + tool, '-P', self.lab.lxcpath, '-n', str(vmid)] + list(args), check=check)

    # -- queries ----------------------------------------------------------
    def exists(self, vmid):
        return os.path.isdir(os.path.join(self.lab.ct_dir(vmid), 'delta0'))

    def state(self, vmid):
        """'running', 'stopped', or None when there is no such container."""
        if not os.path.isfile(os.path.join(self.lab.ct_dir(vmid), 'config')):
            return None if not self.exists(vmid) else 'stopped'
        out = self._lxc('info', vmid, '-s', '-H', check=False).stdout.strip()
        return 'running' if out == 'RUNNING' else 'stopped'

    def cpus(self, vmid):
        """The CPUs a running container runs on (its cpuset cgroup), or None."""
        base = '/sys/fs/cgroup' if self.cgroup_v2 else '/sys/fs/cgroup/cpuset'
        try:
            with open(os.path.join(base, 'lxc.payload.{0}'.format(vmid), 'cpuset.cpus')) as fh:
                return lxcconf.parse_cpus(fh.read())
        except (OSError, ValueError):
            return None

    def balanced_cpus(self, vmid, config):
        """The CPUs for a container with cores, balanced against this node's other running containers (as pvestatd
        balances them); None without cores."""
        if not config.get('cores'):
            return None
        others = [n for n in os.listdir(self.lab.lxcpath) if n.isdigit() and int(n) != int(vmid)]
        taken = [c for c in (self.cpus(n) for n in others) if c]
        return lxcconf.balanced(int(config['cores']), taken, list(range(os.cpu_count() or 1)))

    def pid(self, vmid):
        out = self._lxc('info', vmid, '-p', '-H', check=False).stdout.strip()
        return int(out) if out.isdigit() else None

    def all(self):
        if not os.path.isdir(self.lab.lxcpath):
            return []
        return sorted(int(n) for n in os.listdir(self.lab.lxcpath) if n.isdigit())

    # -- reconcile ----------------------------------------------------------
    def reconcile(self, vmid, wanted):
        """Make the real container match `wanted` ({status, config}) or remove it (None).

        Returns (the keys of a running container that PVE does not apply live, {key: why} of those whose hotplug
        failed).
        """
        if wanted is None:
            self.destroy(vmid)
            return [], {}
        config = wanted['config']
        self.ensure(vmid, config)
        real = self.state(vmid)
        if wanted['status'] == 'running':
            if real != 'running':
                self.start(vmid, config)
                return [], {}
            return self.hotplug(vmid, config)
        if real == 'running':
            self.stop(vmid)
        return [], {}

    @staticmethod
    def unprivileged(config):
        return str(config.get('unprivileged', '0')) == '1'

    def owner(self, config):
        return UNPRIV_BASE if self.unprivileged(config) else 0

    def ensure(self, vmid, config):
        d = self.lab.ct_dir(vmid)
        owner = self.owner(config)
        for sub in ('delta0', 'work'):
            path = os.path.join(d, sub)
            if not os.path.isdir(path):
                os.makedirs(path, mode=0o755)
                os.chown(path, owner, owner)
        for key in config:
            if key.startswith('mp') and key[2:].isdigit():
                volume = lxcconf.split_props(config[key], 'volume').get('volume', '')
                if volume and not volume.startswith('/'):
                    path = lxcconf.volume_dir(self.lab, vmid, volume)
                    if not os.path.isdir(path):
                        os.makedirs(path, mode=0o755)
                        os.chown(path, owner, owner)

    def set_release(self, vmid, release):
        """The Debian release (layout.RELEASES) whose base a new container's root file system is made from (its
        template's), kept beside the container so that it moves with it."""
        os.makedirs(self.lab.ct_dir(vmid), exist_ok=True)
        with open(os.path.join(self.lab.ct_dir(vmid), 'release'), 'w') as fh:
            fh.write(release + '\n')

    def release(self, vmid):
        try:
            with open(os.path.join(self.lab.ct_dir(vmid), 'release')) as fh:
                return fh.read().strip() or 'bookworm'
        except OSError:
            return 'bookworm'

    # -- the root file system -------------------------------------------------
    # PVE's rootfs is a volume of the container's storage, a real file system (an LVM-thin ext4, a ZFS subvolume, a
    # directory), where anything can be renamed: dpkg renames the directories it replaces. The lab's is an overlay of
    # its release's base (delta0 its upper layer, the volume its snapshots keep), mounted here by the host's root with
    # redirect_dir=on, so that a directory of the base is renamed as on a real file system: mounted by LXC in an
    # unprivileged container's user namespace, an overlay can only keep its own xattrs in user.* (userxattr), which
    # allows no redirect_dir, and dpkg failed with EXDEV ("Invalid cross-device link"). LXC is given the directory.
    def rootfs(self, vmid):
        return os.path.join(self.lab.ct_dir(vmid), 'rootfs')

    def mount_rootfs(self, vmid, lower):
        """The container's overlay (lower: its release's base) mounted at rootfs(vmid), where it is not yet."""
        target = self.rootfs(vmid)
        if os.path.ismount(target):
            return target
        d = self.lab.ct_dir(vmid)
        os.makedirs(target, exist_ok=True)
        run(['mount', '-t', 'overlay', 'overlay', '-o', 'lowerdir={0},upperdir={1},workdir={2},redirect_dir=on'.format(
            lower, os.path.join(d, 'delta0'), os.path.join(d, 'work')), target])
        return target

    def unmount_rootfs(self, vmid):
        """The container's overlay unmounted (its layers are then only files: written, copied or removed)."""
        target = self.rootfs(vmid)
        if os.path.ismount(target) and run(['umount', target], check=False).returncode != 0:
            run(['umount', '-l', target])

    def start(self, vmid, config):
        d = self.lab.ct_dir(vmid)
        lower = self.lab.base_rootfs_of(self.release(vmid), self.unprivileged(config))
        self.unmount_rootfs(vmid)  # (a container that stopped itself) its network files go into the upper layer
        try:
            passthrough = self._passthrough(vmid, config, lxcconf.devices(config), fresh=True)
            for path, body in lxcconf.network_files(config).items():
                self._write_rootfs(vmid, config, lower, path, body)
            text = lxcconf.render(vmid, config, self.lab, self.cgroup_v2, self.mount_rootfs(vmid, lower), passthrough,
                                  self.balanced_cpus(vmid, config))
            rules = lxcconf.seccomp_rules(config)
            if rules is not None:
                with open(lxcconf.COMMON_SECCOMP) as fh:
                    common = fh.read()
                with open(os.path.join(d, 'rules.seccomp'), 'w') as fh:
                    fh.write(common.rstrip('\n') + '\n' + rules)
        except lxcconf.ConfigError as e:
            raise BackendError(str(e)) from None
        with open(os.path.join(d, 'config'), 'w') as fh:
            fh.write(text)
        log = os.path.join(d, 'lxc-start.log')
        if os.path.exists(log):
            os.unlink(log)
        proc = self._lxc('start', vmid, '-d', '-o', log, '-l', 'ERROR', check=False)
        if proc.returncode == 0:
            proc = self._lxc('wait', vmid, '-s', 'RUNNING', '-t', '15', check=False)
        if proc.returncode != 0 or self.state(vmid) != 'running':
            lines = []
            if os.path.exists(log):
                with open(log) as fh:
                    lines = [line.rstrip() for line in fh if line.strip()][-20:]
            raise BackendError("startup for container '{0}' failed".format(vmid), lines)
        self.save_applied(vmid, config)

    def stop(self, vmid):
        if self.state(vmid) == 'running':
            self._lxc('stop', vmid, '-k', check=False)
            self._lxc('wait', vmid, '-s', 'STOPPED', '-t', '15', check=False)
        if self.state(vmid) != 'running':
            self.unmount_rootfs(vmid)

    def destroy(self, vmid):
        d = self.lab.ct_dir(vmid)
        if not os.path.isdir(d):
            return
        self.stop(vmid)
        self.unmount_rootfs(vmid)
        shutil.rmtree(d)

    # -- snapshots ------------------------------------------------------------
    # A PVE storage that snapshots a container's volumes (lvmthin, zfspool, rbd, btrfs) keeps each volume's content
    # as it was, and a rollback puts it back (pve-container src/PVE/LXC/Config.pm __snapshot_create_vol_snapshot and
    # __snapshot_rollback_vol_rollback, through PVE::Storage::volume_snapshot and volume_snapshot_rollback). The
    # lab's volumes are directories (the rootfs's upper layer, delta0, and each mpN volume's), so its snapshot is a
    # copy of them, made whole (cp -a keeps owners, modes, xattrs and the overlay's whiteouts) and put back whole.
    VOLUME_DIRS = ('delta0', 'volumes')

    def _snapshot_dir(self, vmid, name):
        return os.path.join(self.lab.ct_dir(vmid), 'snapshots', name)

    def snapshot(self, vmid, name):
        """Keep the content of the container's volumes as snapshot name."""
        target = self._snapshot_dir(vmid, name)
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target)
        for sub in self.VOLUME_DIRS:
            source = os.path.join(self.lab.ct_dir(vmid), sub)
            if os.path.isdir(source):
                run(['cp', '-a', '--reflink=auto', source, os.path.join(target, sub)])

    def rollback(self, vmid, name):
        """Put the content of snapshot name back in the (stopped) container's volumes; the snapshot stays."""
        d = self.lab.ct_dir(vmid)
        kept = self._snapshot_dir(vmid, name)
        if not os.path.isdir(kept):
            raise BackendError("snapshot '{0}' of CT {1} has no content in the lab".format(name, vmid))
        self.stop(vmid)
        for sub in self.VOLUME_DIRS + ('work',):
            path = os.path.join(d, sub)
            if os.path.isdir(path):
                owner = os.stat(path)
                shutil.rmtree(path)
                if sub == 'work':  # the overlay's work directory, empty again as the overlay needs it
                    os.mkdir(path, 0o755)
                    os.chown(path, owner.st_uid, owner.st_gid)
        for sub in self.VOLUME_DIRS:
            source = os.path.join(kept, sub)
            if os.path.isdir(source):
                run(['cp', '-a', '--reflink=auto', source, os.path.join(d, sub)])

    def delete_snapshot(self, vmid, name):
        shutil.rmtree(self._snapshot_dir(vmid, name), ignore_errors=True)

    def snapshots(self, vmid):
        """The names of the snapshots whose content the lab keeps."""
        path = os.path.join(self.lab.ct_dir(vmid), 'snapshots')
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    # -- live changes --------------------------------------------------------
    def applied(self, vmid):
        try:
            with open(os.path.join(self.lab.ct_dir(vmid), 'applied.json')) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return {}

    def save_applied(self, vmid, config):
        with open(os.path.join(self.lab.ct_dir(vmid), 'applied.json'), 'w') as fh:
            json.dump(config, fh, sort_keys=True)

    def hotplug(self, vmid, config):
        """Apply to a running container what PVE applies live: (the keys it does not apply live, {key: why} of those
        whose hotplug failed, which PVE answers with a 400 writing nothing)."""
        before = self.applied(vmid)
        changed = sorted(k for k in set(config) | set(before) if config.get(k) != before.get(k))
        if not changed:
            return [], {}
        pid = self.pid(vmid)
        owner = self.owner(config)
        refused, failed = [], {}
        done = dict(before)
        for key in changed:
            try:
                if key.startswith('dev') and key[3:].isdigit() and key not in before:
                    self._hot_device(vmid, pid, owner, key, config)
                elif key.startswith('mp') and key[2:].isdigit() and key not in before:
                    self._hot_mount(vmid, pid, owner, key, config)
                elif key == 'memory' and key in config:
                    self._cgroup_set(vmid, 'memory.max', int(config['memory']) * 1024 * 1024)
                elif key == 'cores' and key in config:
                    self._cgroup_set(vmid, 'cpuset.cpus', lxcconf.cpu_list(self.balanced_cpus(vmid, config)))
                elif key == 'hostname' and key in config:
                    name = config['hostname']
                    self._lxc('attach', vmid, '--clear-env', '--', 'sh', '-c',
                              'echo "$1" > /etc/hostname && hostname "$1"', 'sh', name)
                elif key in ('description', 'tags', 'onboot', 'startup', 'protection', 'swap', 'cpulimit',
                             'cpuunits', 'lock', 'digest', 'lxc'):
                    pass
                else:
                    refused.append(key)
                    continue
            except (BackendError, lxcconf.ConfigError, OSError) as e:
                print('lab: CT {0}: cannot apply {1} live: {2}'.format(vmid, key, e), file=sys.stderr, flush=True)
                failed[key] = str(e)
                continue
            if key in config:
                done[key] = config[key]
            else:
                done.pop(key, None)
        self.save_applied(vmid, done)
        return refused, failed

    def _cgroup_set(self, vmid, name, value):
        key = lxcconf.cgroup_key(name, self.cgroup_v2)[len('lxc.cgroup2.' if self.cgroup_v2 else 'lxc.cgroup.'):]
        self._lxc('cgroup', vmid, key, str(value))

    def _hot_device(self, vmid, pid, owner, key, config):
        props = lxcconf.split_props(config[key], 'path')
        node = self._passthrough(vmid, config, [(key, props)])[key]
        kind, major, minor, _ = lxcconf.device_node(props, self.lab.dev_dir)
        access = 'r' if props.get('deny-write') in ('1', 'true') else 'rw'
        # the node bound in first, then the cgroup rule (LXC.pm device_passthrough_hotplug)
        bound = run([sys.executable, '-m', 'gpufleet.lab.inject', str(pid), node, props['path'], '--owner', str(owner)],
                    check=False)
        if bound.returncode != 0:
            raise BackendError(bound.stderr.strip())
        self._cgroup_set(vmid, 'devices.allow', '{0} {1}:{2} {3}'.format(kind, major, minor, access))

    def _hot_mount(self, vmid, pid, owner, key, config):
        props = lxcconf.split_props(config[key], 'volume')
        volume = props.get('volume', '')
        source = volume if volume.startswith('/') else lxcconf.volume_dir(self.lab, vmid, volume)
        self.ensure(vmid, config)
        run([sys.executable, '-m', 'gpufleet.lab.inject', str(pid), source, props['mp'], '--dir',
             '--owner', str(owner)])

    # -- files -------------------------------------------------------------------
    def _passthrough(self, vmid, config, devices, fresh=False):
        """Make the device nodes a container gets, as PVE does: mknod with the entry's mode/uid/gid, in the
        container's passthrough directory, which a start makes afresh (fresh: lxc-pve-prestart-hook mounts a new
        tmpfs there) and a hotplug adds to. A path whose node is there already fails as PVE's mknod does (src/PVE/LXC.pm
        create_passthrough_device_node), so two devN of one path stop a start, and a new devN for a path the running
        container has fails its hotplug."""
        base = os.path.join(self.lab.ct_dir(vmid), 'passthrough')
        if fresh:
            shutil.rmtree(base, ignore_errors=True)
        shift = self.owner(config)
        out = {}
        for key, props in devices:
            kind, major, minor, mode = lxcconf.device_node(props, self.lab.dev_dir)
            path = os.path.join(base, props['path'].lstrip('/'))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.lexists(path):
                raise BackendError('failed to mknod /var/lib/lxc/{0}/passthrough{1}: File exists'.format(
                    vmid, props['path']))
            os.mknod(path, mode | (stat.S_IFCHR if kind == 'c' else stat.S_IFBLK), os.makedev(major, minor))
            os.chmod(path, mode)
            os.chown(path, int(props.get('uid', 0)) + shift, int(props.get('gid', 0)) + shift)
            out[key] = path
        return out

    def _write_rootfs(self, vmid, config, lower, path, body):
        """Write a file into the container's upper layer, owned by its root, mirroring the lower dirs."""
        upper = os.path.join(self.lab.ct_dir(vmid), 'delta0')
        owner = self.owner(config)
        parts = path.strip('/').split('/')
        cur_upper, cur_lower = upper, lower
        for part in parts[:-1]:
            cur_upper = os.path.join(cur_upper, part)
            cur_lower = os.path.join(cur_lower, part)
            if not os.path.isdir(cur_upper):
                if os.path.isdir(cur_lower):
                    st = os.stat(cur_lower)
                    os.mkdir(cur_upper, st.st_mode & 0o7777)
                    os.chown(cur_upper, st.st_uid, st.st_gid)
                else:
                    os.mkdir(cur_upper, 0o755)
                    os.chown(cur_upper, owner, owner)
        target = os.path.join(upper, *parts)
        if os.path.lexists(target) and not os.path.isfile(target):
            os.unlink(target)
        with open(target, 'w') as fh:
            fh.write(body)
        os.chown(target, owner, owner)
        os.chmod(target, 0o644)
