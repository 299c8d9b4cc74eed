#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: write_reports
short_description: Write JSON reports on the controller, privately, in one step
version_added: 0.1.0
description:
  - Writes each report as indented JSON into O(dir) on the controller, whatever host the task runs for.
    It runs in the controller's Ansible process (an action plugin), so one task writes a whole fleet's reports
    without a module run per file.
  - O(dir) is made with mode 0700 (and set to it if it exists); each file gets mode 0600 and is replaced
    atomically (written beside, then renamed).
  - Reports are the run's output, not a change to any host, so they are written in check mode too and the task
    never reports changed.
extends_documentation_fragment:
  - gpufleet.proxmox.controller_action
options:
  dir:
    description: The directory on the controller.
    type: path
    required: true
  reports:
    description: File name (without C(.json), no C(/)) to the data to write.
    type: dict
    required: true
  prune:
    description:
      - Remove every other C(*.json) file directly in O(dir) (reports an earlier run wrote and this one did not),
        so that no report there can be read as this run's. Subdirectories and other files are left alone.
    type: bool
    default: false
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Writes the reports in check mode too (they describe the run; nothing on a host changes).
author:
  - gpufleet maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Write every container's verification report and the summary
  gpufleet.proxmox.write_reports:
    dir: "{{ verify_report_dir }}"
    reports: "{{ {'summary': summary} | combine(per_host) }}"
  run_once: true
'''

RETURN = r'''
written:
  description: The paths written, in file name order.
  returned: success
  type: list
  elements: str
removed:
  description: The earlier reports removed with O(prune), in file name order.
  returned: success
  type: list
  elements: str
'''

from ansible_collections.gpufleet.proxmox.plugins.module_utils._action_only import refuse

# The options, here beside DOCUMENTATION so that sanity checks one against the other; the action plugin
# (plugins/action/write_reports.py) validates its task's arguments with this same spec.
ARGUMENT_SPEC = {
    'dir': {'type': 'path', 'required': True},
    'reports': {'type': 'dict', 'required': True},
    'prune': {'type': 'bool', 'default': False},
}


def main():
    refuse('write_reports', ARGUMENT_SPEC)


if __name__ == '__main__':
    main()
