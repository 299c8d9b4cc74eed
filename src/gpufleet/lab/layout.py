"""Where the lab keeps its files, and the fixed facts of the lab node.

One object, `Lab`, names every path and address so that the daemon, `pct`, the
CLI and the tests agree on them.  The lab's state lives under `root`
(`/var/lib/gpufleet-lab`, removed by `gpufleet lab down`); what is slow to make
and safe to keep (the Debian base, downloaded wheels) lives under `cache`
(`/var/cache/gpufleet-lab`).
"""

import json
import os
import re
from dataclasses import dataclass, field, replace

NODE = 'pve1'
# The container templates every lab node offers, each backed by a Debian base of its release and named as PVE's
# appliance index names them (proxmox/dab-pve-appliances: debian-12-bookworm-std-64 and debian-13-trixie-std-64,
# dab.conf Name and Version), with the Python its python3 is (Debian's python3-defaults: bookworm 3.11, trixie 3.13).
RELEASES = {
    'bookworm': {'template': 'debian-12-standard_12.12-1_amd64.tar.zst', 'debian': '12', 'python': '3.11'},
    'trixie': {'template': 'debian-13-standard_13.1-2_amd64.tar.zst', 'debian': '13', 'python': '3.13'},
}
TEMPLATE = RELEASES['bookworm']['template']  # the one the lab's fleets use
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
# uv, seeded into the wheelhouse so containers can install it offline.
UV_PIN = 'uv==0.13.9'
# A cluster of up to this many nodes (`gpufleet lab up --nodes N`): pve1, pve2, ... with sshd on 2201, 2202, ...
MAX_NODES = 4
# The first node's /dev is the host's (its containers bind the host's device nodes).
HOST_DEV = '/dev'
NODE_NAME = re.compile(r'^pve([1-9][0-9]*)$')


class NodeError(ValueError):
    """A lab node that is not there, or a cluster the lab cannot be."""


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
    dev_dir: str = HOST_DEV
    pct_link: str = '/usr/local/sbin/pct'
    pvesm_link: str = '/usr/local/sbin/pvesm'
    driver_version: str = DRIVER_VERSION
    # '' for a node on the lab's stand-in packaging; else the Debian suite whose own NVIDIA packages the node runs
    # (host.debnode: bookworm, a PVE 8 node; trixie, a PVE 9 node)
    debian: str = ''

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    # -- the cluster's nodes ---------------------------------------------------
    # The first node (pve1) keeps its files where a one-node lab has them (the lab's root, the host's /dev); every
    # other node has its own directory, nodes/<name>/, with its own /dev, /proc, driver, sshd and node files. The
    # API, the containers' storage and the cluster's /etc/pve are shared, as in a PVE cluster.
    @property
    def nodes_file(self):
        """[{name, ssh_port, gpus, driver, debian}]: the cluster `up` made (absent: one node, pve1)."""
        return self.path('nodes.json')

    def node_specs(self):
        try:
            with open(self.nodes_file) as fh:
                specs = json.load(fh)
        except (OSError, ValueError):
            specs = None
        return specs or self.one_node()

    def one_node(self):
        """The cluster of a lab made without --nodes: pve1 alone (no nodes.json is written for it)."""
        return [{'name': NODE, 'ssh_port': SSH_PORT, 'gpus': self.gpus, 'driver': DRIVER_VERSION}]

    def on(self, name):
        """This lab as node `name` sees it (its sshd, /dev, /proc, driver, node files and /etc/pve/nodes/<name>)."""
        for spec in self.node_specs():
            if spec['name'] == name:
                first = name == NODE
                return replace(self, node=name, ssh_port=spec['ssh_port'], gpus=spec['gpus'],
                               driver_version=spec['driver'], debian=spec.get('debian') or '',
                               dev_dir=HOST_DEV if first else self.path('nodes', name, 'dev'))
        raise NodeError('the lab has no node {0!r} (it has {1})'.format(
            name, ', '.join(s['name'] for s in self.node_specs())))

    def cluster(self):
        """Every node of the lab, each as it sees itself."""
        return [self.on(spec['name']) for spec in self.node_specs()]

    @classmethod
    def here(cls):
        """The lab as the node this process runs on sees it: the node's sshd names it (GPUFLEET_LAB_NODE), a
        process started on the host itself is on the first node."""
        lab = cls()
        return lab.on(os.environ.get('GPUFLEET_LAB_NODE') or lab.node)

    @property
    def node_root(self):
        """Where this node's own files live."""
        return self.root if self.node == NODE else self.path('nodes', self.node)

    @property
    def node_files(self):
        """The node's own /: the files the collection writes on the node (boot units, scripts, caches)."""
        return os.path.join(self.node_root, 'node')

    def storage_path(self, sid):
        """The directory of the node's own dir storage sid ('local', as /var/lib/vz on a PVE node): the files
        `pvesm path` names, such as its templates under template/cache."""
        return os.path.join(self.node_root, 'storage', sid)

    @property
    def bin_dir(self):
        """The node's commands for its driver's life (apt-get, apt-cache, apt-mark, dkms, reboot): the lab's
        stand-ins, or Debian's own run in the node's Debian root (host.debnode)."""
        return os.path.join(self.node_root, 'bin')

    @property
    def driver_dir(self):
        """The node's stand-in driver: lib/ (libcuda.so.<version>, ...) and bin/ (nvidia-smi)."""
        return os.path.join(self.node_root, 'driver')

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
        """The lab's ssh keys (one client key and one host key for every node) and the first node's sshd."""
        return self.path('ssh')

    @property
    def sshd_dir(self):
        """This node's sshd: its config and pid file."""
        return self.ssh_dir if self.node == NODE else os.path.join(self.node_root, 'ssh')

    @property
    def proc_dir(self):
        """The lab's stand-in for the node's /proc: devices and driver/nvidia/version."""
        return os.path.join(self.node_root, 'proc')

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
    def base_dir(self, release='bookworm'):
        """The Debian base of a release (RELEASES): rootfs, and rootfs-unpriv owned by the unprivileged range."""
        return os.path.join(self.cache, 'base' if release == 'bookworm' else 'base-' + release)

    def base_rootfs_of(self, release, unprivileged):
        return os.path.join(self.base_dir(release), 'rootfs-unpriv' if unprivileged else 'rootfs')

    @property
    def base_rootfs(self):
        return self.base_rootfs_of('bookworm', False)

    @property
    def base_rootfs_unpriv(self):
        return self.base_rootfs_of('bookworm', True)

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


def release_of(volid):
    """The lab release (RELEASES) a template volume is made from: the one whose template file it names, else
    bookworm (a template the lab does not know is one of its own files, made from the Debian 12 base)."""
    name = str(volid or '').rsplit('/', 1)[-1]
    return next((release for release, r in RELEASES.items() if r['template'] == name), 'bookworm')


def write_json(path, data, mode=0o644):
    """Write JSON atomically (a reader never sees half a file)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = '{0}.tmp.{1}'.format(path, os.getpid())
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), 'w') as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write('\n')
    os.chmod(tmp, mode)
    os.replace(tmp, path)
