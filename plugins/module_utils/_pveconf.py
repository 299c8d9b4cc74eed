# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Raw `lxc.*` lines of a container's config file on a node (/etc/pve/nodes/<node>/lxc/<vmid>.conf).

The PVE API shows these lines (as `lxc: [[key, value], ...]`) but cannot set them; they are edited in
the file. Comment lines there are the container's description, so no marker comments are written:
when raw lines are managed, the whole set of `lxc.*` lines of the main section is managed.
Standard library only: this runs on the node.
"""


import os
import re


# A raw line as PVE reads it: pve-container src/PVE/LXC/Config.pm parse_pct_config,
# m/^(lxc\.[a-z0-9_\-\.]+)(:|\s*=)\s*(.*?)\s*$/ - a key with dashes, then ':' or '=' ('lxc.key = value').
RAW_LINE = re.compile(r'^(lxc\.[a-z0-9_\-.]+)(?::|\s*=)\s*(.*?)\s*$')


class RawError(Exception):
    pass


def conf_path(pve_root, node, vmid):
    return os.path.join(pve_root, 'nodes', node, 'lxc', '{0}.conf'.format(vmid))


def normalize(entries):
    """[(key, value)] from 'lxc.key: value', 'lxc.key = value' or {key, value} entries."""
    out = []
    for i, entry in enumerate(entries or []):
        if isinstance(entry, dict):
            key, value = entry.get('key'), entry.get('value')
        else:
            m = RAW_LINE.match(str(entry).strip())
            key, value = (m.group(1), m.group(2)) if m else (None, None)
        if not key or not str(key).startswith('lxc.') or value is None or '\n' in str(value):
            raise RawError('lxc_raw[{0}]: {1!r} is not "lxc.<key>: <value>"'.format(i, entry))
        out.append((str(key), str(value)))
    return out


def read(text):
    """The raw lines of the main section, in order."""
    out = []
    for line in text.splitlines():
        if line.startswith('['):
            break
        m = RAW_LINE.match(line)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def replace(text, entries):
    """The file's text with the main section's raw lines replaced by entries (kept at its end)."""
    lines = text.splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith('[')), len(lines))
    main = [line for line in lines[:end] if not RAW_LINE.match(line)]
    while main and not main[-1].strip():
        main.pop()
    rest = lines[end:]
    new = main + ['{0}: {1}'.format(k, v) for k, v in entries]
    if rest:
        new += [''] + rest
    return '\n'.join(new) + '\n'


def apply(path, entries, check_mode=False):
    """(changed, before, after) for making the file's raw lines exactly entries."""
    try:
        with open(path) as fh:
            text = fh.read()
    except (IOError, OSError):
        raise RawError('raw lxc lines live in {0}, which is not here: run this on a node of the cluster '
                       '(delegate_to the node), with pve_root pointing at its /etc/pve'.format(path))
    before = read(text)
    if before == list(entries):
        return False, before, before
    if not check_mode:
        tmp = path + '.tmp.gpufleet'
        with open(tmp, 'w') as fh:
            fh.write(replace(text, entries))
        os.rename(tmp, path)
    return True, before, list(entries)
