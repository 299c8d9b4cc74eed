# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.write_reports: JSON reports written on the controller, 0700 dir, 0600 files."""


from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.proxmox.plugins.modules.write_reports import ARGUMENT_SPEC
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _reports
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils._action import ControllerAction


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def act(self, args, task_vars):
        try:
            written, removed = _reports.write_all(args['dir'], args['reports'], args['prune'])
        except _reports.ReportError as e:
            raise AnsibleActionFail(str(e))
        return dict(changed=False, written=written, removed=removed)
