# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files and links replaced in one rename, so a reader sees the old one or the new one, never half of one
(standard library only)."""


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
