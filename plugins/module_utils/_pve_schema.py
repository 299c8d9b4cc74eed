# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PVE's parameter schema for the container options lxc_container sends: GENERATED, do not edit.

Made by tests/unit/gen_pve_schema.py from
Proxmox VE 9.1 API schema (pve-docs api-viewer/apidata.js, schema update of 2026-04-30), subset for LXC
provisioning.
Indexed keys (net, mp, dev) are under their family name; INDEXED says how many of each PVE defines.
"""

INDEXED = {'net': 32, 'mp': 256, 'dev': 256}

PROPERTIES = {
    'cores': {'type': 'integer', 'minimum': 1, 'maximum': 8192, 'optional': True},
    'description': {'type': 'string', 'maxLength': 8192, 'optional': True},
    'dev': {
        'format': {
            'deny-write': {'type': 'boolean', 'optional': True},
            'gid': {'type': 'integer', 'minimum': 0, 'optional': True},
            'mode': {'type': 'string', 'pattern': '0[0-7]{3}', 'optional': True},
            'path': {'type': 'string', 'format': 'pve-lxc-dev-string', 'optional': True, 'default_key': True},
            'uid': {'type': 'integer', 'minimum': 0, 'optional': True},
        },
        'optional': True,
        'type': 'string',
    },
    'features': {
        'format': {
            'force_rw_sys': {'type': 'boolean', 'optional': True},
            'fuse': {'type': 'boolean', 'optional': True},
            'keyctl': {'type': 'boolean', 'optional': True},
            'mknod': {'type': 'boolean', 'optional': True},
            'mount': {'type': 'string', 'pattern': '(?:[a-zA-Z0-9_; ]+)', 'optional': True},
            'nesting': {'type': 'boolean', 'optional': True},
        },
        'optional': True,
        'type': 'string',
    },
    'hostname': {'type': 'string', 'maxLength': 255, 'format': 'dns-name', 'optional': True},
    'memory': {'type': 'integer', 'minimum': 16, 'optional': True},
    'mp': {
        'format': {
            'acl': {'type': 'boolean', 'optional': True},
            'backup': {'type': 'boolean', 'optional': True},
            'keepattrs': {'type': 'boolean', 'optional': True},
            'mountoptions': {
                'optional': True,
                'pattern': '(?:(?:(discard|lazytime|noatime|nodev|noexec|nosuid))(;(?:(discard|lazytime|noatime|nodev|noexec|nosuid)))*)',
                'type': 'string',
            },
            'mp': {'type': 'string', 'format': 'pve-lxc-mp-string'},
            'quota': {'type': 'boolean', 'optional': True},
            'replicate': {'type': 'boolean', 'optional': True},
            'ro': {'type': 'boolean', 'optional': True},
            'shared': {'type': 'boolean', 'optional': True},
            'size': {'type': 'string', 'format': 'disk-size', 'optional': True},
            'volume': {'type': 'string', 'format': 'pve-lxc-mp-string', 'default_key': True},
        },
        'optional': True,
        'type': 'string',
    },
    'nameserver': {'type': 'string', 'format': 'lxc-ip-with-ll-iface-list', 'optional': True},
    'net': {
        'format': {
            'bridge': {'type': 'string', 'pattern': '[-_.\\w\\d]+', 'optional': True},
            'firewall': {'type': 'boolean', 'optional': True},
            'gw': {'type': 'string', 'format': 'ipv4', 'optional': True},
            'gw6': {'type': 'string', 'format': 'ipv6', 'optional': True},
            'host-managed': {'type': 'boolean', 'optional': True},
            'hwaddr': {'type': 'string', 'format': 'mac-addr', 'optional': True},
            'ip': {'type': 'string', 'format': 'pve-ipv4-config', 'optional': True},
            'ip6': {'type': 'string', 'format': 'pve-ipv6-config', 'optional': True},
            'link_down': {'type': 'boolean', 'optional': True},
            'mtu': {'type': 'integer', 'minimum': 64, 'maximum': 65535, 'optional': True},
            'name': {'type': 'string', 'pattern': '[-_.\\w\\d]+'},
            'rate': {'type': 'number', 'optional': True},
            'tag': {'type': 'integer', 'minimum': 1, 'maximum': 4094, 'optional': True},
            'trunks': {'type': 'string', 'pattern': '(?:\\d+(?:;\\d+)*)', 'optional': True},
            'type': {'type': 'string', 'enum': ['veth'], 'optional': True},
        },
        'optional': True,
        'type': 'string',
    },
    'node': {'type': 'string', 'format': 'pve-node'},
    'onboot': {'type': 'boolean', 'optional': True},
    'ostemplate': {'type': 'string', 'maxLength': 255},
    'rootfs': {
        'format': {
            'acl': {'type': 'boolean', 'optional': True},
            'mountoptions': {
                'optional': True,
                'pattern': '(?:(?:(discard|lazytime|noatime|nodev|noexec|nosuid))(;(?:(discard|lazytime|noatime|nodev|noexec|nosuid)))*)',
                'type': 'string',
            },
            'quota': {'type': 'boolean', 'optional': True},
            'replicate': {'type': 'boolean', 'optional': True},
            'ro': {'type': 'boolean', 'optional': True},
            'shared': {'type': 'boolean', 'optional': True},
            'size': {'type': 'string', 'format': 'disk-size', 'optional': True},
            'volume': {'type': 'string', 'format': 'pve-lxc-mp-string', 'default_key': True},
        },
        'optional': True,
        'type': 'string',
    },
    'searchdomain': {'type': 'string', 'format': 'dns-name-list', 'optional': True},
    'ssh-public-keys': {'type': 'string', 'optional': True},
    'storage': {'type': 'string', 'format': 'pve-storage-id', 'optional': True},
    'swap': {'type': 'integer', 'minimum': 0, 'optional': True},
    'tags': {'type': 'string', 'format': 'pve-tag-list', 'optional': True},
    'unprivileged': {'type': 'boolean', 'optional': True},
    'vmid': {'type': 'integer', 'minimum': 100, 'maximum': 999999999, 'format': 'pve-vmid'},
}
