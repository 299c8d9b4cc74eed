# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The module side of a module that is an action plugin on the controller (fleet_plan, fleet_report,
verify_container, write_reports): its options are checked, then it refuses to run, which it does only where the
action plugin was bypassed."""

from ansible.module_utils.basic import AnsibleModule


def refuse(name, argument_spec):
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    module.fail_json(msg='gpufleet.proxmox.{0} runs as an action plugin on the controller'.format(name))
