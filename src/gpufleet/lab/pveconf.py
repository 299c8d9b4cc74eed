"""The node's `/etc/pve/lxc/<vmid>.conf` format: read and written the way PVE does.

    #description, one line each
    arch: amd64
    cores: 2
    lxc.cgroup2.devices.allow: c 195:* rwm
    [pve:pending]
    memory: 4096
    delete: dev1

Raw `lxc.*` keys are kept in the config as PVE's API shows them: a list of
`[key, value]` under the key `lxc`.
"""

import re
from urllib.parse import quote, unquote

PENDING = 'pve:pending'
# A raw line as pve-container src/PVE/LXC/Config.pm parse_pct_config reads it: keys with dashes, and ':' or '='.
RAW_LINE = re.compile(r'^(lxc\.[a-z0-9_\-.]+)(?::|\s*=)\s*(.*?)\s*$')


def dump(config, pending=None):
    lines = []
    desc = config.get('description')
    if desc:
        lines += ['#' + quote(line, safe=' !"#$&\'()*+,-./:;<=>?@[\\]^_`{|}~') for line in str(desc).split('\n')]
    for key in sorted(config):
        if key in ('description', 'lxc', 'digest'):
            continue
        lines.append('{0}: {1}'.format(key, config[key]))
    for key, value in config.get('lxc', []) or []:
        lines.append('{0}: {1}'.format(key, value))
    pending = pending or {}
    if pending:
        lines.append('')
        lines.append('[{0}]'.format(PENDING))
        deletes = sorted(k for k, v in pending.items() if v is None)
        for key in sorted(k for k, v in pending.items() if v is not None):
            lines.append('{0}: {1}'.format(key, pending[key]))
        if deletes:
            lines.append('delete: {0}'.format(','.join(deletes)))
    return '\n'.join(lines) + '\n'


def parse(text):
    """(config, pending) from a .conf file's text; snapshot sections are skipped."""
    config, pending = {}, {}
    section = config
    desc = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith('[') and line.endswith(']'):
            section = pending if line[1:-1] == PENDING else None
            continue
        if section is None:
            continue
        if line.startswith('#'):
            if section is config:
                desc.append(unquote(line[1:]))
            continue
        raw = RAW_LINE.match(line)
        if raw:
            section.setdefault('lxc', []).append([raw.group(1), raw.group(2)])
            continue
        key, sep, value = line.partition(':')
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key.startswith('lxc.'):
            continue  # not a key PVE reads (upper case, or no ':'/'=' after it)
        elif section is pending and key == 'delete':
            for name in value.split(','):
                if name:
                    pending[name] = None
        else:
            section[key] = int(value) if value.isdigit() and (value == '0' or value[0] != '0') else value
    if desc:
        config['description'] = '\n'.join(desc)
    return config, pending
