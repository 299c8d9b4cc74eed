"""Generate plugins/module_utils/_pve_schema.py from PVE's official API schema.

    python tests/unit/gen_pve_schema.py [SCHEMA_JSON] > plugins/module_utils/_pve_schema.py

SCHEMA_JSON is the API schema as pve-docs' api-viewer publishes it (apidata.js as JSON), by default its LXC paths
kept in tests/unit/data/pve-9.1-lxc-api.json (PVE 9.1's, as published). The table keeps, for each container option that
lxc_container sends (the parameters of POST /nodes/{node}/lxc), what PVE's parameter check looks at: type,
minimum, maximum, pattern, enum, maxLength, format (a named format, or the keys of a property string) and
whether it is optional; descriptions are left out. tests/unit/test_pve_schema.py checks that the committed
table is what this script makes of the schema.
"""

import json
import os
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, 'data', 'pve-9.1-lxc-api.json')
# The parameters of POST /nodes/{node}/lxc (and PUT .../config) that lxc_container sends.
KEYS = ('vmid', 'node', 'hostname', 'ostemplate', 'storage', 'rootfs', 'cores', 'memory', 'swap', 'net[n]',
        'features', 'unprivileged', 'onboot', 'tags', 'description', 'nameserver', 'searchdomain',
        'ssh-public-keys', 'mp[n]', 'dev[n]')
KEEP = ('type', 'minimum', 'maximum', 'pattern', 'enum', 'maxLength', 'minLength', 'format', 'optional',
        'default_key')
# How many of each indexed key PVE defines; the schema only says "[n]". From pve-container
# src/PVE/LXC/Config.pm ($MAX_LXC_NETWORKS, $MAX_MOUNT_POINTS, $MAX_DEVICES) of PVE 9.
INDEXED = {'net': 32, 'mp': 256, 'dev': 256}


def number(value):
    """The schema writes some bounds as strings ("0"); the table holds numbers."""
    if isinstance(value, str):
        return float(value) if '.' in value else int(value)
    return value


def entry(prop):
    out = {}
    for key in KEEP:
        if key not in prop:
            continue
        value = prop[key]
        if key == 'format' and isinstance(value, dict):
            value = dict((k, entry(v)) for k, v in sorted(value.items()))
        elif key in ('minimum', 'maximum', 'maxLength', 'minLength'):
            value = number(value)
        elif key in ('optional', 'default_key'):
            value = bool(value)
        elif key == 'pattern':
            # Perl's (?^:...) (a group with default flags) is Python's (?:...); PVE anchors it: ^(?:...)$
            value = value.replace('(?^:', '(?:')
        out[key] = value
    return out


def table(schema):
    props = schema['paths']['/nodes/{node}/lxc']['POST']['parameters']['properties']
    return dict((key.replace('[n]', ''), entry(props[key])) for key in KEYS)


def literal(value, indent=0, width=110):
    """A Python literal of value, a dict broken over lines where one line would be wider than width."""
    flat = repr(value)
    if not isinstance(value, dict) or indent + len(flat) <= width:
        return flat
    pad = ' ' * (indent + 4)
    items = ['{0}{1!r}: {2},'.format(pad, k, literal(v, indent + 4, width))
             for k, v in sorted(value.items())]
    return '{\n' + '\n'.join(items) + '\n' + ' ' * indent + '}'


def render(schema, source):
    head = '''# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PVE's parameter schema for the container options lxc_container sends: GENERATED, do not edit.

Made by tests/unit/gen_pve_schema.py from
{0}.
Indexed keys (net, mp, dev) are under their family name; INDEXED says how many of each PVE defines.
"""

'''.format(textwrap.fill(source, 110))
    body = 'INDEXED = {0}\n\nPROPERTIES = {1}\n'.format(literal(INDEXED), literal(table(schema)))
    return head + body


def main(argv):
    path = argv[1] if len(argv) > 1 else DEFAULT
    with open(path) as fh:
        schema = json.load(fh)
    sys.stdout.write(render(schema, schema.get('source', os.path.basename(path))))


if __name__ == '__main__':
    main(sys.argv)
