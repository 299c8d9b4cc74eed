#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

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
  - A library that is not found is a finding when a distribution lists it and its file is gone (the venv should
    have it) or when Python loads what needs it on an import (the DT_NEEDED closure of the extension modules of
    O(imports)' distributions and what they require; of every extension module without O(imports)). A library that
    a distribution's requirement installs is found (its Python imports the requirement first, and the loader takes
    a library already loaded by its soname, as torchvision's extensions take torch's C(libc10.so)). A system library
    that only a plugin needs (an object no extension module needs, which its library opens with dlopen, such as
    NVSHMEM's and NCCL's network transports or cuFile's RDMA support) is reported in RV(optional_libraries)
    instead, since it matters only where that plugin is used. A library that Python code opens itself (with
    ctypes, as torch's C(__init__) opens C(libtorch_global_deps.so)) counts as one loaded on demand, as the ELF closure
    cannot see that an import needs it; O(imports) in O(mode=full) proves the import instead.
  - Where distributions install one path with different bytes, the bytes that belong there are a declared
    O(overrides)' bytes, else those of the only claimant the O(lock) has, else those of the only claimant that an
    installed distribution requires (its C(Requires-Dist), markers and extras evaluated for the venv; torch 2.11.0
    from PyPI requires C(nvidia-nccl-cu13), so a C(nvidia-nccl-cu12) installed over it loses). Where none of these
    decides it, the collision is a finding whose C(decide) says what to declare, and the plan leaves the path as it
    is, so that no plan undoes the previous one.
  - Returns a plan, the exact commands (argv lists) that repair all of it in a safe order; a removal that
    would delete files another distribution needs comes with the reinstall that restores them. Applied, the
    plan leaves the venv healthy, or with only findings that an operator must decide (and an empty plan).
  - With uv, a distribution to reinstall is uninstalled and installed again (C(uv pip install
    --reinstall-package) would fetch it again, as it implies C(--refresh-package)), so a repair installs from
    the uv cache and downloads nothing the cache holds.
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
  imports:
    description:
      - Modules to import (such as V(torch)), in O(mode=full) only, each in a fresh interpreter of the venv (isolated,
        so without C(PYTHON*) variables, the user site or the working directory). A failed import is a finding,
        C(failed_imports), with the error's last line, which names a library that the loader cannot open (as in
        C(libcudnn.so.9 - cannot open shared object file)), and that library.
      - V(fast) mode reads files only and imports none of them.
      - In both modes they are also what the library check holds to. A system library that no distribution of the
        venv ships is a finding, C(unresolved_libraries), where the extension modules of their distributions (and of
        what those require) need it; where only another distribution's extension modules need it (cupy's cuTENSOR,
        numba's TBB pool, mpi4py's MPICH variant, which their packages import on demand and do without), it is
        reported under RV(optional_libraries). Without O(imports), every extension module of the venv counts.
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

- name: Audit every file's sha256 and prove that torch imports
  gpufleet.proxmox.venv_audit:
    venv: /root/venv
    mode: full
    imports: [torch]
    fail_on_findings: true
'''

RETURN = r'''
healthy:
  description: True when there is no finding.
  returned: always
  type: bool
findings:
  description:
    - C(broken_distributions) (name, version, missing, modified), C(collisions) (path, claimed_by, on_disk;
      C(wins) and, where the venv's metadata decides it, C(required_by), for the claimant whose bytes belong there;
      C(decide), what the operator must declare, where nothing decides it),
      C(unresolved_libraries) (soname, needed_by, provided_by, in_lock), C(drift) (missing, extra, wrong_version),
      C(failed_imports) (module, message, and library, the shared library the loader could not open or null; only in
      O(mode=full) with O(imports)), C(missing_requirements) (name, requirement, required_by; what C(pip check) calls
      not installed, each distribution that an installed one requires for this venv and that is not installed;
      without O(lock) only, as with one the lock says what belongs in the venv and C(drift) names what is missing),
      C(interpreter) and C(startup_files) (whether it starts, and what runs at every start), C(job_env) (check, msg,
      fix, path, lines; an activation script of the venv that does not export C(CUDA_DEVICE_ORDER=PCI_BUS_ID), so
      that a job numbers the GPUs as C(nvidia-smi) does; the repair appends the lines).
  returned: always
  type: dict
overrides:
  description: Collisions that a declared override explains.
  returned: always
  type: list
  elements: dict
required:
  description:
    - Paths that several distributions install with different bytes, where the bytes on disk are those of the
      only claimant an installed distribution requires (path, claimed_by, on_disk, required_by). Not findings.
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
        overrides=dict(type='list', elements='str', default=[]), imports=dict(type='list', elements='str', default=[]),
        fail_on_findings=dict(type='bool', default=False)), supports_check_mode=True)
    p = module.params
    try:
        result = _venv.audit(p['venv'], p['lock'], p['mode'], p['installer'], p['install_args'], p['overrides'], p['uv'],
                             p['imports'])
    except (ValueError, IOError, OSError) as e:
        module.fail_json(msg='venv_audit: {0}'.format(e))
    if p['fail_on_findings'] and not result['healthy']:
        module.fail_json(msg='the venv {0} is not healthy'.format(p['venv']), **result)
    module.exit_json(changed=False, **result)


if __name__ == '__main__':
    main()
