# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reports on the controller: JSON files in a private directory (0700), each 0600 and replaced in one rename, and
the reports of earlier runs removed. The write_reports and fleet_report actions write through here."""


import json
import os
import tempfile


class ReportError(Exception):
    """The reports could not be written: the message names the field (reports, or dir)."""


def write_all(directory, reports, prune_others=False):
    """Write each {name: data} of reports as <directory>/<name>.json; with prune_others, remove every other *.json
    file directly in directory. (written paths, removed paths), in file name order."""
    bad = sorted(n for n in reports if not n or '/' in n or n.startswith('.'))
    if bad:
        raise ReportError('reports: not a file name: {0}'.format(', '.join(repr(n) for n in bad)))
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)
        written = [write_private(directory, name, reports[name]) for name in sorted(reports)]
        removed = prune(directory, written) if prune_others else []
    except (OSError, TypeError, ValueError) as e:
        raise ReportError('dir: cannot write the reports in {0}: {1}'.format(directory, e))
    return written, removed


def write_private(directory, name, data):
    """data as indented JSON in directory/name.json (mode 0600), replaced in one rename."""
    fd, tmp = tempfile.mkstemp(prefix='.' + name + '.', dir=directory)
    try:
        with os.fdopen(fd, 'w') as fh:
            json.dump(data, fh, indent=4, sort_keys=True, default=str)
            fh.write('\n')
        os.chmod(tmp, 0o600)
        path = os.path.join(directory, name + '.json')
        os.rename(tmp, path)
    except Exception:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def prune(directory, written):
    """Remove the *.json files directly in directory that are not in written (regular files only)."""
    removed = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.endswith('.json') and path not in written and os.path.isfile(path) and not os.path.islink(path):
            os.unlink(path)
            removed.append(path)
    return removed
