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
