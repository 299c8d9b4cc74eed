#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: venv_audit
short_description: Everything wrong with a Python venv at once, and the commands that repair it
version_added: 0.1.0
description:
  - Checks, in one pass, every distribution's RECORD against the files on disk (sizes; sha256 too in
    O(mode=full)), files claimed by more than one distribution and whose bytes are on disk (a file that every
    claimant installs with the same bytes, such as the C(nvidia/__init__.py) of every cu12 runtime wheel, conflicts
    with nothing and is listed in RV(shared_files)), the ELF closure
    of every shared object (each DT_NEEDED resolved as the loader would, through DT_RPATH/DT_RUNPATH with
    C($ORIGIN), the venv's C(nvidia/*/lib), then the system's directories), and drift against a lock.
  - A library that is not found is a finding when a distribution provides it (the venv should have it) or when
    Python loads what needs it on an import (the DT_NEEDED closure of every extension module). A system library
    that only a plugin needs (an object no extension module needs, which its library opens with dlopen, such as
    NVSHMEM's and NCCL's network transports or cuFile's RDMA support) is reported in RV(optional_libraries)
    instead, since it matters only where that plugin is used. A library that Python code opens itself (with
    ctypes) counts as one loaded on demand; the import check of a build is what proves those.
  - Returns a plan, the exact commands (argv lists) that repair all of it in a safe order; a removal that
    would delete files another distribution needs comes with the reinstall that restores them.
  - Changes nothing. Uses only the Python standard library, so it runs with the target's system Python.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - gpufleet.proxmox.read_only
options:
  venv:
    description: The venv (its directory, or the symlink to it).
    type: path
    required: true
  lock:
    description: A pinned requirements or lock file on the target (C(name==version) lines; hashes are ignored).
    type: path
  mode:
    description:
      - V(fast) compares sizes, and tells whose bytes a file claimed by several distributions holds by its size
        (by sha256 only where the claimants' sizes are the same).
      - V(full) also compares sha256 hashes, of every file.
    type: str
    choices: [fast, full]
    default: fast
  installer:
    description: What the repair commands use.
    type: str
    choices: [uv, pip]
    default: uv
  uv:
    description: The uv executable for the plan.
    type: str
    default: uv
  install_args:
    description: Extra arguments for every install command of the plan (V(--no-index), V(--find-links=DIR)).
    type: list
    elements: str
    default: []
  overrides:
    description:
      - Distributions whose bytes are meant to win a collision (the cu13 runtime wheels installed over
        torch's cu12 ones); such collisions are reported under RV(overrides), not as findings.
    type: list
    elements: str
    default: []
  fail_on_findings:
    description: Fail when the venv is not healthy.
    type: bool
    default: false
'''

EXAMPLES = r'''
- name: Audit the training venv against its lock
  gpufleet.proxmox.venv_audit:
    venv: /root/venv
    lock: /opt/gpufleet/locks/default.txt
    overrides: [nvidia-cudnn-cu13, nvidia-cusparselt-cu13, nvidia-nccl-cu13, nvidia-nvshmem-cu13]
  register: audit
'''

RETURN = r'''
healthy:
  description: True when there is no finding.
  returned: always
  type: bool
findings:
  description:
    - C(broken_distributions) (name, version, missing, modified), C(collisions) (path, claimed_by, on_disk),
      C(unresolved_libraries) (soname, needed_by, provided_by, in_lock), C(drift) (missing, extra, wrong_version).
  returned: always
  type: dict
overrides:
  description: Collisions that a declared override explains.
  returned: always
  type: list
  elements: dict
shared_files:
  description:
    - Files that more than one distribution claims with the same bytes (path, claimed_by); not findings. The
      plan still counts them, so removing one claimant comes with the reinstall of the others.
  returned: always
  type: list
  elements: dict
optional_libraries:
  description:
    - System libraries that are not found and that only plugins need (soname, needed_by, provided_by), for
      example C(libfabric.so.1) for NVSHMEM's libfabric transport. Not findings.
  returned: always
  type: list
  elements: dict
plan:
  description: The repair commands, argv lists, in order.
  returned: always
  type: list
  elements: list
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _venv


def main():
    module = AnsibleModule(argument_spec=dict(
        venv=dict(type='path', required=True), lock=dict(type='path'),
        mode=dict(type='str', choices=['fast', 'full'], default='fast'),
        installer=dict(type='str', choices=['uv', 'pip'], default='uv'), uv=dict(type='str', default='uv'),
        install_args=dict(type='list', elements='str', default=[]),
        overrides=dict(type='list', elements='str', default=[]),
        fail_on_findings=dict(type='bool', default=False)), supports_check_mode=True)
    p = module.params
    try:
        result = _venv.audit(p['venv'], p['lock'], p['mode'], p['installer'], p['install_args'], p['overrides'], p['uv'])
    except (ValueError, IOError, OSError) as e:
        module.fail_json(msg='venv_audit: {0}'.format(e))
    if p['fail_on_findings'] and not result['healthy']:
        module.fail_json(msg='the venv {0} is not healthy'.format(p['venv']), **result)
    module.exit_json(changed=False, **result)


if __name__ == '__main__':
    main()
