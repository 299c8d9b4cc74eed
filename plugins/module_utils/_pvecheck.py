# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PVE's parameter check of container options, done here before anything is sent.

The rules are PVE's own schema (`_pve_schema`, generated from the official API schema): types, minima and
maxima, patterns, enums, lengths, the keys of property strings (netN, mpN, devN, features, rootfs) and the
named formats, modelled on pve-common src/PVE/JSONSchema.pm (parse_property_string, check_type and the
registered formats) and pve-container src/PVE/LXC/Config.pm (pve-lxc-dev-string, pve-lxc-mp-string,
lxc-ip-with-ll-iface). Where the collection is stricter than PVE it says so.
Standard library only.
"""


import re
import socket

from ansible_collections.gpufleet.proxmox.plugins.module_utils._pve_schema import INDEXED, PROPERTIES

# -- named formats (pve-common src/PVE/JSONSchema.pm unless said otherwise) -------------------------------
_OCTET = r'(?:25[0-5]|(?:2[0-4]|1[0-9]|[1-9])?[0-9])'
_IPV4 = re.compile(r'^{0}(?:\.{0}){{3}}$'.format(_OCTET))
_LABEL = r'[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?'
_DNS_NAME = re.compile(r'^(?:{0}\.)*{0}$'.format(_LABEL))


def _ipv4(text):
    return bool(_IPV4.match(text))


def _ipv6(text):
    if not text or '/' in text or '%' in text:
        return False
    try:
        socket.inet_pton(socket.AF_INET6, text)
    except (socket.error, ValueError):
        return False
    return True


def _cidr(text, check, longest):
    # pve_verify_cidrv4 / pve_verify_cidrv6: a prefix length above 7
    addr, slash, bits = text.partition('/')
    return bool(slash) and bits.isdigit() and 7 < int(bits) <= longest and check(addr)


def _iface(text):
    return re.match(r'^[a-z][a-z0-9_]{1,20}(?:[:.]\d+)?$', text, re.I) is not None


def _ip_with_ll_iface(text):
    # pve-container src/PVE/LXC/Config.pm verify_ip_with_ll_iface
    m = re.match(r'^(fe80:[^%]+)%(.*)$', text)
    if m and _ipv6(m.group(1)) and _iface(m.group(2)):
        return True
    return _ipv4(text) or _ipv6(text)


def _dev_path(text):
    # pve-container src/PVE/LXC/Config.pm verify_lxc_dev_string: under /dev/, no /./ or /../ component
    return text.startswith('/dev/') and re.search(r'/\.\.?(?:/|$)', text) is None


def _mp_path(text):
    # pve-container src/PVE/LXC/Config.pm verify_lxc_mp_string
    return not (re.search(r'/\.\.?/', text) or re.search(r'/\.\.?$', text) or text.startswith('../'))


FORMATS = {
    'pve-lxc-dev-string': (_dev_path, 'is not a valid device path (a path under /dev/ without . or .. components)'),
    'pve-lxc-mp-string': (_mp_path, 'contains illegal character sequences (/./ or /../)'),
    'pve-ipv4-config': (lambda v: v in ('dhcp', 'manual') or _cidr(v, _ipv4, 32),
                        'is not a valid ipv4 network configuration (dhcp, manual or an address/prefix '
                        'like 10.0.0.5/24)'),
    'pve-ipv6-config': (lambda v: v in ('auto', 'dhcp', 'manual') or _cidr(v, _ipv6, 128),
                        'is not a valid ipv6 network configuration (auto, dhcp, manual or an address/prefix)'),
    'ipv4': (_ipv4, 'is not a valid IPv4 address'),
    'ipv6': (_ipv6, 'is not a valid IPv6 address'),
    'mac-addr': (lambda v: re.match(r'^[a-f0-9][02468ace](?::[a-f0-9]{2}){5}$', v, re.I) is not None,
                 'is not a valid unicast MAC address'),
    'dns-name': (lambda v: _DNS_NAME.match(v) is not None, 'is not a valid DNS name'),
    'lxc-ip-with-ll-iface': (_ip_with_ll_iface, 'is not a valid IP address'),
    'pve-tag': (lambda v: re.match(r'^[a-z0-9_][a-z0-9_\-+.]*$', v, re.I) is not None,
                'has characters a tag cannot have (letters, digits, _ - + .)'),
    'disk-size': (lambda v: re.match(r'^\d+(?:\.\d+)?[KMGT]?$', v) is not None,
                  'is not a disk size (a number with K, M, G or T)'),
    'pve-storage-id': (lambda v: re.match(r'^[a-z][a-z0-9\-_.]*[a-z0-9]$', v, re.I) is not None,
                       'is not a valid storage ID'),
    'pve-vmid': (lambda v: re.match(r'^[1-9][0-9]{2,8}$', v) is not None, 'is not a valid VM ID'),
    'pve-node': (lambda v: re.match(r'^{0}$'.format(_LABEL), v) is not None or _ipv4(v),
                 'is not a valid node name'),
}


def split_list(text):
    """PVE's split_list: NUL, or commas, semicolons and white space, separate items."""
    if '\0' in text:
        return [item for item in text.split('\0') if item]
    return re.split(r'[\s,;]+', text.strip()) if text.strip() else []


def format_problem(name, value):
    """Why value is not of the named format (with PVE's -list suffix), or None. Unknown formats pass."""
    base, is_list = (name[:-5], True) if name.endswith('-list') else (name, False)
    if base not in FORMATS:
        return None
    check, why = FORMATS[base]
    for item in split_list(value) if is_list else [value]:
        if not check(item):
            return '{0!r} {1}'.format(item, why)
    return None


# -- types -------------------------------------------------------------------------------------------------
_TRUE = ('1', 'on', 'yes', 'true')
_FALSE = ('0', 'off', 'no', 'false')


def _text(value):
    if isinstance(value, bool):
        return '1' if value else '0'
    return str(value)


def value_problem(schema, value):
    """Why one value does not pass its schema entry (check_type, then the checks of check_prop), or None."""
    kind = schema.get('type')
    text = _text(value)
    if kind == 'boolean':
        if text.lower() not in _TRUE + _FALSE:
            return 'must be a boolean (1 or 0), got {0!r}'.format(value)
        return None
    if kind in ('integer', 'number'):
        pattern = r'^[+-]?\d+$' if kind == 'integer' else r'^[+-]?(?:\d+|\d*\.\d+)(?:[eE][+-]?\d+)?$'
        if isinstance(value, float) and kind == 'integer' or not re.match(pattern, text.strip()):
            return 'must be {0}, got {1!r}'.format('a whole number' if kind == 'integer' else 'a number', value)
        number = float(text)
        low, high = schema.get('minimum'), schema.get('maximum')
        what = 'a whole number' if kind == 'integer' else 'a number'
        if low is not None and number < low or high is not None and number > high:
            if high is None:
                return 'must be {0} of at least {1}, got {2}'.format(what, low, text)
            return 'must be {0} from {1} to {2}, got {3}'.format(what, low, high, text)
        return None
    if isinstance(value, (dict, list)):
        return 'must be a string, got {0!r}'.format(value)
    if schema.get('maxLength') is not None and len(text) > schema['maxLength']:
        return 'may be at most {0} characters long, got {1}'.format(schema['maxLength'], len(text))
    if schema.get('minLength') is not None and len(text) < schema['minLength']:
        return 'must be at least {0} characters long'.format(schema['minLength'])
    if schema.get('enum') and text not in schema['enum']:
        return 'must be one of {0}, got {1!r}'.format(', '.join(schema['enum']), text)
    if schema.get('pattern') and not re.match(r'^(?:{0})$'.format(schema['pattern']), text):
        return '{0!r} does not match {1}'.format(text, schema['pattern'])
    fmt = schema.get('format')
    if isinstance(fmt, dict):
        return props_problem(fmt, text)
    if fmt:
        return format_problem(fmt, text)
    return None


def property_pairs(text, default_key=None):
    """The (key, value) pairs of a property string as PVE's parse_property_string splits it (pve-common
    src/PVE/JSONSchema.pm): comma-separated parts, blank ones skipped; key=value where both are non-empty (nothing
    stripped); a part without '=' the value of the default key; anything else refused. The one reading of PVE's
    property strings in the collection. Raises ValueError with what is wrong."""
    pairs = []
    for part in str(text).split(','):
        if re.match(r'^\s*$', part):
            continue
        m = re.match(r'^([^=]+)=(.+)$', part)
        if m:
            pairs.append((m.group(1), m.group(2)))
        elif '=' not in part and default_key is not None:
            pairs.append((default_key, part))
        elif '=' not in part:
            raise ValueError('{0!r} has no key (key=value)'.format(part))
        else:
            raise ValueError('{0!r} has no key or no value (key=value)'.format(part))
    return pairs


def props_problem(fmt, text):
    """Why a property string does not parse as PVE's parse_property_string would, or None."""
    default_key = next((k for k, v in fmt.items() if v.get('default_key')), None)
    seen = {}
    try:
        pairs = property_pairs(text, default_key)
    except ValueError as e:
        return str(e)
    for key, value in pairs:
        if key not in fmt:
            return 'unknown key {0!r} in {1!r} (known: {2})'.format(key, text, ', '.join(sorted(fmt)))
        if key in seen:
            return 'key {0!r} given twice in {1!r}'.format(key, text)
        seen[key] = value
        why = value_problem(fmt[key], value)
        if why:
            return '{0}: {1}'.format(key, why)
    missing = sorted(k for k, v in fmt.items() if not v.get('optional') and k not in seen)
    if missing:
        return '{0} missing in {1!r}'.format(' and '.join(missing), text)
    return None


def schema_for(key):
    """The schema entry of a config key (net3 -> net, with its index checked), or None for an unknown key."""
    m = re.match(r'^([a-z]+)(\d+)$', key)
    if m and m.group(1) in INDEXED:
        if int(m.group(2)) >= INDEXED[m.group(1)]:
            return None
        return PROPERTIES[m.group(1)]
    return PROPERTIES.get(key)


def hostname_problem(name):
    """PVE's dns-name (at most 255 characters), and each label at most 63 characters: the collection is
    stricter than PVE here, as a resolver and the container's own hostname are (RFC 1035)."""
    why = problem('hostname', name)
    if why is None and any(len(label) > 63 for label in str(name).split('.')):
        why = '{0!r} has a label longer than 63 characters'.format(name)
    return why


def problem(key, value):
    """Why PVE would refuse value for config key, or None."""
    schema = schema_for(key)
    if schema is None:
        m = re.match(r'^([a-z]+)(\d+)$', key)
        if m and m.group(1) in INDEXED:
            return 'PVE has {0}0 to {0}{1} only'.format(m.group(1), INDEXED[m.group(1)] - 1)
        return 'not a container option PVE knows'
    return value_problem(schema, value)
