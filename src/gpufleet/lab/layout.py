"""Where the lab keeps its files, and the fixed facts of the lab node.

One object, `Lab`, names every path and address so that the daemon, `pct`, the
CLI and the tests agree on them.  The lab's state lives under `root`
(`/var/lib/gpufleet-lab`, removed by `gpufleet lab down`); what is slow to make
and safe to keep (the Debian base, downloaded wheels) lives under `cache`
(`/var/cache/gpufleet-lab`).
"""

import json
import os
from dataclasses import dataclass, field

NODE = 'pve1'
TEMPLATE = 'debian-12-standard_12.12-1_amd64.tar.zst'
BRIDGE = 'vmbr0'
SUBNET_PREFIX = '10.77.0'
GATEWAY = SUBNET_PREFIX + '.1'
API_HOST = '127.0.0.1'
API_PORT = 8006
SSH_PORT = 2201
UNPRIV_BASE = 100000
UNPRIV_RANGE = 65536
GPU_COUNT = 8
# The kernel module version the stand-in driver reports in /proc/driver/nvidia/version.
DRIVER_VERSION = '580.95.05'
# The torch build the lab's CPU profile pins; its wheel is seeded into the node wheelhouse.
TORCH_PIN = 'torch==2.13.0+cpu'
# uv, seeded into the wheelhouse so containers can install it offline.
UV_PIN = 'uv==0.13.9'


@dataclass
class Lab:
    root: str = field(default_factory=lambda: os.environ.get('GPUFLEET_LAB_DIR', '/var/lib/gpufleet-lab'))
    cache: str = field(default_factory=lambda: os.environ.get('GPUFLEET_LAB_CACHE', '/var/cache/gpufleet-lab'))
    node: str = NODE
    api_host: str = API_HOST
    api_port: int = API_PORT
    ssh_port: int = SSH_PORT
    bridge: str = BRIDGE
    gpus: int = field(default_factory=lambda: int(os.environ.get('GPUFLEET_LAB_GPUS', GPU_COUNT)))
    dev_dir: str = '/dev'
    pct_link: str = '/usr/local/sbin/pct'

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    # -- lab state -------------------------------------------------------
    @property
    def lxcpath(self):
        return self.path('lxc')

    @property
    def state_file(self):
        return self.path('state.json')

    @property
    def credentials_file(self):
        return self.path('credentials.json')

    @property
    def pve_root(self):
        """The node's /etc/pve (the cluster's shared configs)."""
        return self.path('etc', 'pve')

    @property
    def pve_conf_dir(self):
        """/etc/pve/nodes/<node>/lxc: one PVE-format config file per container (/etc/pve/lxc links here)."""
        return os.path.join(self.pve_root, 'nodes', self.node, 'lxc')

    def pve_conf(self, vmid):
        return os.path.join(self.pve_conf_dir, '{0}.conf'.format(vmid))

    def ct_dir(self, vmid):
        return os.path.join(self.lxcpath, str(vmid))

    @property
    def tls_dir(self):
        return self.path('tls')

    @property
    def ca_file(self):
        return self.path('tls', 'ca.pem')

    @property
    def ssh_dir(self):
        return self.path('ssh')

    @property
    def proc_dir(self):
        """The lab's stand-in for the node's /proc: devices and driver/nvidia/version."""
        return self.path('proc')

    @property
    def wheelhouse(self):
        return self.path('wheelhouse')

    @property
    def daemon_pid(self):
        return self.path('run', 'pve.pid')

    @property
    def daemon_log(self):
        return self.path('log', 'pve.log')

    @property
    def host_record(self):
        """What `up` changed on the host, so that `down` can undo exactly that."""
        return self.path('host.json')

    # -- cache -----------------------------------------------------------
    @property
    def base_rootfs(self):
        return os.path.join(self.cache, 'base', 'rootfs')

    @property
    def base_rootfs_unpriv(self):
        return os.path.join(self.cache, 'base', 'rootfs-unpriv')

    @property
    def wheel_cache(self):
        return os.path.join(self.cache, 'wheels')

    # -- helpers ---------------------------------------------------------
    def credentials(self):
        with open(self.credentials_file) as fh:
            return json.load(fh)

    def record(self):
        try:
            with open(self.host_record) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return {}

    def save_record(self, data):
        write_json(self.host_record, data)


def write_json(path, data, mode=0o644):
    """Write JSON atomically (a reader never sees half a file)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = '{0}.tmp.{1}'.format(path, os.getpid())
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), 'w') as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write('\n')
    os.chmod(tmp, mode)
    os.replace(tmp, path)
