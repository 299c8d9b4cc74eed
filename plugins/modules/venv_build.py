#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: venv_build
short_description: Build a hash-locked venv beside the active one, check it, and switch to it atomically
version_added: 0.1.0
description:
  - Each venv lives at C(<root>/<id>), where C(<id>) is a hash of the lock, the declared overrides and the
    Python version, so a lock is built once and the same lock always gives the same path. O(link) (the path
    jobs use, C(/root/venv)) is a symlink to the active one.
  - A new venv is built beside the active one with uv, C(--require-hashes --no-deps), in two installs - first
    everything but the O(overrides), then the overrides, so that their bytes are the ones left at the paths
    they share with other distributions. It is then audited as M(gpufleet.proxmox.venv_audit) does (RECORD
    files, undeclared collisions, the ELF closure, drift against the lock) and the O(imports) are imported
    with its Python. Only then is the link switched, in one rename.
  - A failed build or check removes the new venv, leaves the active one untouched and fails saying why.
  - Keeps the O(keep) venvs that were active before, for O(rollback); removes older ones and unfinished builds.
  - Runs with the target's system Python and the standard library. uv must be on the target, or
    O(uv_version) given, and then it is installed at O(uv) first.
  - With O(audit=true) it also returns the active venv's audit (RV(audit)) and its last verification
    (RV(verified)), so one call tells a drift run all it needs to know about the venv. With O(repair=true) as
    well, it repairs what that audit found (the audit's plan applied in its order, then the venv audited and its
    O(imports) imported again). A failed repair step, findings left, or a failed import fail the task saying which.
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: Reports whether it would build, switch and remove, and changes nothing.
  diff_mode:
    support: none
    description: The result says what changed.
options:
  lock:
    description:
      - A lock on the target in requirements format, every package pinned with C(==) and hashed
        (C(uv pip compile --generate-hashes) writes one). Required unless O(rollback=true).
      - With O(lock_content), where that lock is written once its venv is active.
    type: path
  lock_content:
    description:
      - The lock itself, given by the controller (for example with C(lookup('file', ..., rstrip=false))). It is
        checked and built from, and written to O(lock) only after its venv is active, so a failed build leaves
        the lock file as it was. Saves putting the file there with a task of its own.
    type: str
  profile:
    description:
      - A venv profile as the P(gpufleet.proxmox.venv_profile#lookup) lookup reads it (C(name), C(meta), C(lock)).
        The action plugin takes from it what is not given - O(lock_content) (its lock), O(python_version) (its
        C(python)), O(overrides), O(imports) and O(meta) (the profile's name, O(lock), its overrides, imports and
        C(expect)) - so that a task names its profile once.
    type: dict
  root:
    description: The directory holding the venvs.
    type: path
    default: /opt/gpufleet/venvs
  link:
    description: The stable path, a symlink to the active venv. A real directory there is never replaced.
    type: path
    default: /root/venv
  python:
    description: The interpreter the venvs are made with.
    type: path
    default: /usr/bin/python3
  python_version:
    description:
      - The Python versions the lock was made for (V(3.11), or a list such as V([3.11, 3.12, 3.13])); an interpreter of
        any other version is refused, naming the profile to make a lock for it (in check mode, the result's
        RV(python_not_locked) says so, and the active venv is still audited).
    type: list
    elements: str
  uv:
    description: The uv executable.
    type: path
    default: uv
  uv_version:
    description:
      - Put uv of this version at O(uv) (C(<dir>/<version>/bin/uv)) where it is missing, unpacked from its wheel
        (checked against the index's sha256), so that neither pip nor ensurepip is needed (PVE's debian-12-standard
        template has python3 but not python3-venv). Nothing is installed when O(uv) exists.
      - The wheel comes from the index the environment names (E(UV_DEFAULT_INDEX), E(UV_INDEX_URL) or
        E(PIP_INDEX_URL), else PyPI), through its proxy, with E(SSL_CERT_FILE) as the CA bundle; or from
        O(uv_find_links).
    type: str
  uv_find_links:
    description: Take uv's wheel from this wheelhouse alone (offline), not from the package index.
    type: path
  audit:
    description:
      - Also audit the active venv against the lock it was built from, as M(gpufleet.proxmox.venv_audit) does in
        fast mode (the plan uses O(uv) and O(install_args)), and read its last verification. In check mode only
        when the lock's venv is already the active one.
    type: bool
    default: false
  audit_mode:
    description:
      - The mode of the active venv's audit (O(audit=true)), as M(gpufleet.proxmox.venv_audit)'s O(gpufleet.proxmox.venv_audit#module:mode).
      - V(full) also compares sha256 hashes and imports the O(imports), each in a fresh interpreter of the venv (a
        failed import is a finding, C(failed_imports), with the loader's message). A new venv is always audited in
        V(fast) mode and its O(imports) imported.
    type: str
    choices: [fast, full]
    default: fast
  repair:
    description:
      - With O(audit=true), apply the audit's repair plan where it found anything (in check mode, report a change),
        then audit and import again.
    type: bool
    default: false
  overrides:
    description:
      - Distributions installed after all the others, whose files are meant to win where they share paths
        with another distribution (the cu13 runtime wheels over torch's cu12 ones).
    type: list
    elements: str
    default: []
  install_args:
    description: Extra arguments for every uv install (V(--no-index), V(--find-links=DIR), V(--offline)).
    type: list
    elements: str
    default: []
  cache_dir:
    description: The uv cache (the node's, bound into its containers, so each package is fetched once a node).
    type: path
  link_mode:
    description:
      - How uv puts a package's files from its cache into a venv.
      - V(copy) gives each venv its own files.
      - V(hardlink) links them to the cache's, so a venv built from a warm cache costs no copy and no disk.
        The venvs and the cache then share their files (an in-place edit of one is an edit of all), and
        O(root) must be on the same mount as O(cache_dir), or the module fails before anything changes.
    type: str
    choices: [copy, hardlink]
    default: copy
  imports:
    description: Modules the new venv's Python must import before it is made active.
    type: list
    elements: str
    default: [torch]
  meta:
    description: What to remember with a new venv (its profile, what verify expects); returned as RV(meta).
    type: dict
    default: {}
  keep:
    description: How many previously active venvs to keep for rollback.
    type: int
    default: 2
  rollback:
    description: Make the most recently active other venv active again (nothing is built).
    type: bool
    default: false
  timeout:
    description: Seconds each step (an install, the import check) may take.
    type: int
    default: 3600
  driver:
    description:
      - The container's NVIDIA userspace driver, made and read first in the same call, as
        M(gpufleet.proxmox.userspace_driver) does with these options, so that a run enters the container once for
        its driver and its venv. Returned as RV(driver).
      - With O(driver.require_match=true), a container that does not load its node's driver fails here, before its
        venv is touched (in check mode the mismatch is reported as a change).
    type: dict
    suboptions:
      node_version:
        description: The node's kernel module version.
        type: str
        required: true
      mode:
        description: V(bind) points the loader at O(driver.mount); V(read) only reads.
        type: str
        choices: [bind, read]
        default: bind
      mount:
        description: Where the node's driver bundle is bound into the container.
        type: path
        default: /opt/nvidia-driver
      require_match:
        description: Fail when the container does not load exactly O(driver.node_version).
        type: bool
        default: false
  hold:
    description:
      - Stop before the first change to what the container uses, where it already has a venv at O(link) - the driver
        it loads (O(driver)), or the active venv (a switch to another) - and say so in RV(held); a new venv is built
        beside the active one first. The same call without O(hold) then makes the change (the playbooks take a PVE
        snapshot of the container in between). A container without a venv yet, a repair, and check mode are not held.
    type: bool
    default: false
  defer:
    description:
      - In a check run of a container reached with the P(gpufleet.proxmox.pct#connection) connection over SSH (the
        module pipelined), record the call for the container's node instead of running it; the result is then
        C(deferred). M(gpufleet.proxmox.pct_batch) on the node runs the node's recorded calls in one connection,
        and M(gpufleet.proxmox.pct_batch_result) gives each container its call's result, as if it had run here.
      - The recorded call runs this module's code without Ansible's module wrapper (a short program that gives the
        same result, for less of the container's CPU); its arguments are checked on the controller first, with this
        module's argument spec and messages.
      - Taken by the action plugin; elsewhere (not a check run, another connection) the call runs as usual.
    type: bool
    default: false
'''

EXAMPLES = r'''
- name: Build and activate the venv of the default profile
  gpufleet.proxmox.venv_build:
    lock: /opt/gpufleet/profiles/default/requirements.lock
    uv: /opt/gpufleet/uv/0.13.9/bin/uv
    overrides: [nvidia-cudnn-cu13, nvidia-cusparselt-cu13, nvidia-nccl-cu13, nvidia-nvshmem-cu13]
    cache_dir: /var/cache/gpufleet/uv

- name: Go back to the venv that was active before
  gpufleet.proxmox.venv_build:
    rollback: true
'''

RETURN = r'''
held:
  description:
    - With O(hold), what was held - C(driver) (true where the driver the container loads would change; nothing else
      was done then) and C(venv) (the venv built beside the active one, not switched to, or null).
  returned: when a change was held
  type: dict
deferred:
  description:
    - With O(defer), where the call was recorded for the node (no other key then) - the module, its arguments, the
      container's node and vmid, and the private file on the controller that holds the call.
  returned: when deferred
  type: dict
id:
  description: The active venv's id after the run.
  returned: success
  type: str
venv:
  description: The active venv's directory.
  returned: success
  type: str
previous:
  description: The id that was active before (null when there was none).
  returned: always
  type: str
built:
  description: Whether a venv was built (would be, in check mode).
  returned: always
  type: bool
switched:
  description: Whether the link was switched.
  returned: always
  type: bool
uv_installed:
  description: Whether uv was (would be, in check mode) installed.
  returned: success
  type: bool
audit:
  description: The active venv's audit, with the keys M(gpufleet.proxmox.venv_audit) returns (healthy, findings, plan).
  returned: with O(audit=true), unless check mode would build or switch
  type: dict
verified:
  description:
    - The record M(gpufleet.proxmox.torch_verify) left in the active venv at its last passing verification
      (C(fingerprint), C(verified_at), C(result)), with C(age_s), its age on the target's clock; null when
      there is none.
  returned: with O(audit=true), unless check mode would build or switch
  type: dict
repaired:
  description: Whether the active venv was repaired (false in check mode, where a repair is reported as a change).
  returned: with O(repair=true), where the audit found anything
  type: bool
repair_audit:
  description: The active venv's audit after its repair (healthy).
  returned: when repaired
  type: dict
rebuilt:
  description:
    - Whether the active venv could not start (its audit's C(rebuild) says why) and was built again from its lock
      beside itself, audited and imported, then switched to (would be, in check mode) - its installers need its
      interpreter, so it cannot be repaired in place.
  returned: with O(repair=true), where the audit found anything
  type: bool
kept_broken:
  description: Where the venv that could not start is kept for inspection (C(<id>.broken) beside the venvs).
  returned: when rebuilt
  type: str
python_not_locked:
  description:
    - In check mode, where the container's Python is not one O(python_version) lists - C(check), C(msg) (the
      profile, the versions its lock covers and the container's) and C(fix) (the command that makes its lock).
      Outside check mode, the module fails with that message.
  returned: when the container's Python is not locked
  type: dict
lock_written:
  description: Whether O(lock_content) was (would be, in check mode) written to O(lock); false without it.
  returned: always
  type: bool
removed:
  description: Ids of old venvs and unfinished builds removed.
  returned: always
  type: list
  elements: str
timings:
  description: Seconds spent installing, auditing and importing (when built).
  returned: always
  type: dict
meta:
  description: What was remembered with the active venv when it was built (O(meta)).
  returned: success
  type: dict
findings:
  description: The new venv's audit findings, when that check failed.
  returned: failure
  type: dict
driver:
  description:
    - The driver step's result (as M(gpufleet.proxmox.userspace_driver) returns it - node_version, version,
      library, match, changed_files, changed, msg on a mismatch).
  returned: when O(driver) is given
  type: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _venv_build

# The action plugin checks a deferred call's arguments against these too (its check run's read runs without them).
ARGUMENT_SPEC = dict(
    lock=dict(type='path'), root=dict(type='path', default='/opt/gpufleet/venvs'),
    link=dict(type='path', default='/root/venv'), python=dict(type='path', default='/usr/bin/python3'),
    uv=dict(type='path', default='uv'), overrides=dict(type='list', elements='str', default=[]),
    install_args=dict(type='list', elements='str', default=[]), cache_dir=dict(type='path'),
    imports=dict(type='list', elements='str', default=['torch']), keep=dict(type='int', default=2),
    rollback=dict(type='bool', default=False), timeout=dict(type='int', default=3600),
    python_version=dict(type='list', elements='str'), meta=dict(type='dict', default={}), lock_content=dict(type='str'),
    uv_version=dict(type='str'), uv_find_links=dict(type='path'), audit=dict(type='bool', default=False),
    repair=dict(type='bool', default=False), link_mode=dict(type='str', default='copy', choices=['copy', 'hardlink']),
    audit_mode=dict(type='str', default='fast', choices=['fast', 'full']), defer=dict(type='bool', default=False),
    profile=dict(type='dict'), hold=dict(type='bool', default=False),
    driver=dict(type='dict', options=dict(
        node_version=dict(type='str', required=True),
        mode=dict(type='str', choices=['bind', 'read'], default='bind'),
        mount=dict(type='path', default='/opt/nvidia-driver'), require_match=dict(type='bool', default=False))))
REQUIRED_IF = [('rollback', False, ('lock',))]


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, required_if=REQUIRED_IF, supports_check_mode=True)
    result = _venv_build.call(module.params, module.check_mode)
    if result.get('failed'):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
