"""The lab's network: its bridge, NAT and forwarding."""

import ipaddress
import os
from ..layout import GATEWAY, SUBNET_PREFIX

from ._util import _read, sh


NFT_TABLE = 'gpufleet_lab'


# -- network ---------------------------------------------------------------------------
def ensure_network(lab, record):
    """The lab bridge (vmbr0, as on a PVE node) with the gateway address and NAT to the host."""
    if not os.path.isdir('/sys/class/net/{0}'.format(lab.bridge)):
        sh(['ip', 'link', 'add', lab.bridge, 'type', 'bridge'])
        record['bridge'] = lab.bridge
    addrs = sh(['ip', '-4', '-o', 'addr', 'show', 'dev', lab.bridge]).stdout
    if GATEWAY + '/' not in addrs:
        sh(['ip', 'addr', 'add', GATEWAY + '/24', 'dev', lab.bridge])
    sh(['ip', 'link', 'set', lab.bridge, 'up'])
    if 'ip_forward' not in record:
        record['ip_forward'] = _read('/proc/sys/net/ipv4/ip_forward').strip()
    with open('/proc/sys/net/ipv4/ip_forward', 'w') as fh:
        fh.write('1')
    subnet = str(ipaddress.ip_network(SUBNET_PREFIX + '.0/24'))
    if sh(['nft', 'list', 'table', 'ip', NFT_TABLE], check=False).returncode != 0:
        rules = ('table ip {0} {{\n chain postrouting {{\n  type nat hook postrouting priority 100;\n'
                 '  ip saddr {1} ip daddr != {1} masquerade\n }}\n}}\n').format(NFT_TABLE, subnet)
        sh(['nft', '-f', '-'], input=rules)
        record['nat'] = True


def remove_network(record):
    if record.get('nat'):
        sh(['nft', 'delete', 'table', 'ip', NFT_TABLE], check=False)
    if record.get('bridge'):
        sh(['ip', 'link', 'del', record['bridge']], check=False)
    if record.get('ip_forward') in ('0', '1'):
        with open('/proc/sys/net/ipv4/ip_forward', 'w') as fh:
            fh.write(record['ip_forward'])


# -- the kernel limits a PVE node runs its containers with ------------------------------
# pve-container installs src/10-pve-ct-inotify-limits.conf as /usr/lib/sysctl.d/10-pve-ct-inotify-limits.conf:
# the kernel's defaults would let only a few dozen systemd containers start (each takes inotify instances and
# keys under its owner's uid, and every unprivileged container of a node maps to the same host uid).
PVE_SYSCTLS = {
    'fs/inotify/max_queued_events': 8388608,
    'fs/inotify/max_user_instances': 65536,
    'fs/inotify/max_user_watches': 4194304,
    'vm/max_map_count': 262144,
    'net/ipv4/neigh/default/gc_thresh3': 8192,
    'kernel/keys/maxkeys': 2000,
}


def ensure_sysctls(record):
    """Raise the host's limits to a PVE node's where they are lower (never lower one); down puts back the old."""
    saved = record.setdefault('sysctls', {})
    for key, value in sorted(PVE_SYSCTLS.items()):
        path = os.path.join('/proc/sys', key)
        try:
            now = int(_read(path).split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if now < value:
            saved.setdefault(key, now)
            with open(path, 'w') as fh:
                fh.write(str(value))


def remove_sysctls(record):
    for key, value in sorted((record.pop('sysctls', None) or {}).items()):
        try:
            with open(os.path.join('/proc/sys', key), 'w') as fh:
                fh.write(str(value))
        except OSError:
            pass
