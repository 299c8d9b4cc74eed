# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.write_reports: JSON reports written on the controller, 0700 dir, 0600 files."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.proxmox.plugins.modules.write_reports import ARGUMENT_SPEC


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


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]
        bad = sorted(n for n in args['reports'] if not n or '/' in n or n.startswith('.'))
        if bad:
            raise AnsibleActionFail('reports: not a file name: {0}'.format(', '.join(repr(n) for n in bad)))
        directory = args['dir']
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            os.chmod(directory, 0o700)
            written = [write_private(directory, name, args['reports'][name]) for name in sorted(args['reports'])]
            removed = prune(directory, written) if args['prune'] else []
        except (OSError, TypeError, ValueError) as e:
            raise AnsibleActionFail('dir: cannot write the reports in {0}: {1}'.format(directory, e))
        result.update(changed=False, written=written, removed=removed)
        return result
