# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files and links replaced in one rename, so a reader sees the old one or the new one, never half of one; and
files and links compared with what they should be (standard library only)."""


import io
import json
import os


def read_text(path):
    """The file's text, or None when it cannot be read."""
    try:
        with io.open(path, encoding='utf-8') as fh:
            return fh.read()
    except (IOError, OSError):
        return None


def read_json(path):
    """The file's JSON document, or None when it cannot be read or parsed."""
    text = read_text(path)
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return None


def write_text(path, text, mode=0o644):
    """text at path, replaced in one rename (the directory made when missing)."""
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        os.makedirs(parent, 0o755)
    tmp = '{0}.tmp{1}'.format(path, os.getpid())
    with io.open(tmp, 'w', encoding='utf-8') as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.rename(tmp, path)


def write_json(path, data):
    """data as indented JSON at path, replaced in one rename."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + '\n')


def replace_link(link, target):
    """link pointing at target, replaced in one rename."""
    tmp = '{0}.gpufleet-{1}'.format(link, os.getpid())
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.rename(tmp, link)


def stale(files):
    """What differs between the node and the files it should have: [{path, code: file_stale, msg, fix}] for each
    of files ({path, content, mode} for a file, {path, src} for a symbolic link) that is missing, holds other text,
    has another mode or points elsewhere. Reads only."""
    out = []
    for item in files:
        path = item['path']
        if item.get('src') is not None:
            try:
                target = os.readlink(path)
            except (IOError, OSError):
                target = None
            why = None if target == item['src'] else (
                'is missing' if target is None else 'points to {0}, not {1}'.format(target, item['src']))
        else:
            text = read_text(path)
            why = None
            if text is None:
                why = 'is missing'
            elif text != item.get('content', ''):
                why = 'differs from what it should hold'
            elif item.get('mode'):
                mode = os.stat(path).st_mode & 0o7777
                if mode != int(str(item['mode']), 8):
                    why = 'has mode {0:04o}, not {1}'.format(mode, item['mode'])
        if why:
            out.append({'code': 'file_stale', 'path': path, 'msg': '{0} {1}'.format(path, why),
                        'fix': 'gpufleet up, or gpufleet drift --fix (the node stage writes it)'})
    return out
