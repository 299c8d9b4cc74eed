# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.write_reports: JSON reports written on the controller, 0700 dir, 0600 files."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.proxmox.plugins.modules.write_reports import ARGUMENT_SPEC
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _reports


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]
        try:
            written, removed = _reports.write_all(args['dir'], args['reports'], args['prune'])
        except _reports.ReportError as e:
            raise AnsibleActionFail(str(e))
        result.update(changed=False, written=written, removed=removed)
        return result
