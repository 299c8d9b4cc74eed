# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Raw `lxc.*` lines of a container's config file on a node (/etc/pve/nodes/<node>/lxc/<vmid>.conf).

The PVE API shows these lines (as `lxc: [[key, value], ...]`) but cannot set them; they are edited in
the file. Comment lines there are the container's description, so no marker comments are written:
when raw lines are managed, the whole set of `lxc.*` lines of the main section is managed, or only those
the collection writes (ours).
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


def ours(is_device, targets=(), majors=()):
    """A test of the raw lines the collection writes, which it manages while leaving the others alone: a bind of a
    GPU vendor's device node (is_device(path): raw passthrough), a bind at one of the fleet's mount targets (its driver bundle's, its
    shares'; relative, as lxc.mount.entry names them) and a cgroup rule for a device of one of the GPUs' majors."""
    targets = set(t.strip('/') for t in targets)
    majors = set(str(m) for m in majors)

    def test(entry):
        key, words = entry[0], entry[1].split()
        if key == 'lxc.mount.entry' and words:
            return bool(is_device(words[0])) or (len(words) > 1 and words[1].strip('/') in targets)
        if key.endswith('.devices.allow') and len(words) > 1:
            return words[1].split(':')[0] in majors
        return False
    return test


def slot(entry):
    """Where a raw line sits that only one line may fill: a mount entry's target, a prlimit's key (LXC keeps the last
    of each); None for the lines of which a container has many (cgroup rules)."""
    key, words = entry[0], entry[1].split()
    if key == 'lxc.mount.entry' and len(words) > 1:
        return key, words[1].strip('/')
    if key.startswith('lxc.prlimit.'):
        return key, None
    return None


def apply(path, entries, check_mode=False, owned=None):
    """(changed, before, after) for making the file's raw lines exactly entries, or with owned (a test of a line,
    see ours) the lines it owns: the others stay as they are, entries follow them."""
    try:
        with open(path) as fh:
            text = fh.read()
    except (IOError, OSError):
        raise RawError('raw lxc lines live in {0}, which is not here: run this on a node of the cluster '
                       '(delegate_to the node), with pve_root pointing at its /etc/pve'.format(path))
    found = read(text)
    # a line in the slot of one of entries is replaced by it: the entry's, not a second one beside it
    taken = set(slot(e) for e in entries) - {None}
    kept = [e for e in found if owned is not None and not owned(e) and slot(e) not in taken]
    before = [e for e in found if e not in kept]
    if found == kept + list(entries):
        return False, before, before
    if not check_mode:
        tmp = path + '.tmp.gpufleet'
        with open(tmp, 'w') as fh:
            fh.write(replace(text, kept + list(entries)))
        os.rename(tmp, path)
    return True, before, list(entries)


# A GPU's device node as a container gets it: a devN (path=/dev/nvidiaN, or the path alone, its default key) or a raw
# mount entry of it (PVE before 8.1, and hand-made configs); which paths are a GPU's is its vendor's (_gpu gpu_node).
DEVN = re.compile(r'^dev\d+:\s*(.*)$')
CONF = re.compile(r'^(\d+)\.conf$')


def held_nodes(text, gpu_node):
    """(hostname, [GPU device node paths]: those gpu_node matches) of a container's config file: its devN and raw
    mount entries in the main section and in its pending changes ([pve:pending], which take effect at its next
    start); snapshots' sections are not the container's now. pve-container src/PVE/LXC/Config.pm parse_pct_config reads these sections."""
    name, paths, section = None, [], ''
    for line in text.splitlines():
        if line.startswith('['):
            section = line.strip()
            continue
        if section not in ('', '[pve:pending]'):
            continue
        if line.startswith('hostname:') and section == '':
            name = line.split(':', 1)[1].strip()
        m = DEVN.match(line)
        if m:
            parts = m.group(1).split(',')
            path = next((p[len('path='):] for p in parts if p.startswith('path=')), None)
            if path is None and parts and '=' not in parts[0]:
                path = parts[0]  # the default key (devN: /dev/nvidia0)
            if path and gpu_node.match(path.strip()):
                paths.append(path.strip())
        raw = RAW_LINE.match(line)
        if raw and raw.group(1) == 'lxc.mount.entry':
            source = raw.group(2).split()[0] if raw.group(2).split() else ''
            if gpu_node.match(source):
                paths.append(source)
    return name, sorted(set(paths))


def gpu_holders(conf_dir, gpu_node):
    """{/dev/nvidiaN: [{vmid, name}]}: the containers of a node (its PVE config files, conf_dir: /etc/pve/lxc or
    /etc/pve/nodes/<node>/lxc) that are given each GPU device node, whoever made them."""
    out = {}
    try:
        names = sorted(os.listdir(conf_dir))
    except OSError:
        return out
    for file_name in names:
        m = CONF.match(file_name)
        if not m:
            continue
        try:
            with open(os.path.join(conf_dir, file_name)) as fh:
                name, paths = held_nodes(fh.read(), gpu_node)
        except (IOError, OSError):
            continue
        for path in paths:
            out.setdefault(path, []).append({'vmid': int(m.group(1)), 'name': name})
    return out
