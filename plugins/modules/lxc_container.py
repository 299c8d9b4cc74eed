#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: lxc_container
short_description: Declarative Proxmox VE LXC containers, one or a whole fleet per call
version_added: 0.1.0
description:
  - Creates a container that does not exist, and brings an existing one to the given config and power
    state through the PVE API, sending only what differs (with the config C(digest)).
  - An option left out is not managed. An option given empty (O(devices=[]), O(features=[]), O(tags=[]),
    O(net={}), O(mounts={})) means "none" and removes what is there.
  - Property strings (C(netN), C(mpN), C(devN), C(features), C(rootfs)) are compared parsed, so order and
    PVE's own additions (a generated MAC address) are not differences.
  - Never destroys or recreates an existing container unless O(state=absent).
  - With O(containers), one call reconciles many containers with one login and one read of the cluster's
    guests; the top-level container options are the defaults for each entry. Every container is read and
    checked before any is changed.
  - A fleet definition (GPUs, nodes, shared directories) is for the M(gpufleet.proxmox.fleet_plan) action, which
    checks the definition as a whole and expands it into the plain containers this module reconciles.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - gpufleet.proxmox.pve
attributes:
  check_mode:
    support: full
    description: Reports every change it would make and sends no change to PVE.
  diff_mode:
    support: full
    description: Shows each changed key before and after, removals included.
options:
  vmid:
    description: The container's id.
    type: int
  node:
    description:
      - The node to create the container on. For an existing container, where it must be. One found on another
        node is moved back (C(changed_keys) has C(node)) - stopped if it runs, migrated, its config made right
        there and started again - where PVE can migrate it. A bind or device mount point without C(shared=1) makes
        PVE refuse the move, and then the call fails before anything changes, naming the mount point and the fix
        (in check mode the result's C(move_refused) says so).
    type: str
  hostname:
    description: The container's hostname.
    type: str
  ostemplate:
    description: The template volume to create from (V(local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst)).
    type: str
  storage:
    description: The storage for the root disk when O(rootfs) names no storage.
    type: str
  rootfs:
    description:
      - The root disk (V(local-lvm:8) for a new 8 GiB volume). On an existing container a larger size
        grows the disk; a smaller one is refused.
    type: str
  cores:
    description: CPU cores.
    type: int
  memory:
    description: Memory in MiB.
    type: int
  swap:
    description: Swap in MiB.
    type: int
  net:
    description:
      - Network interfaces, C(netN) to a PVE property string or a dict of its properties
        (V(net0=name=eth0,bridge=vmbr0,ip=dhcp) as a string, or the same as a dict).
    type: dict
  features:
    description: Feature flags (V(nesting=1), V(keyctl=1)).
    type: list
    elements: str
  unprivileged:
    description:
      - Create the container unprivileged (the default, as in PVE). Cannot change on an existing container.
    type: bool
  onboot:
    description: Start the container when its node boots.
    type: bool
  tags:
    description: Tags.
    type: list
    elements: str
  description:
    description: The container's notes.
    type: str
  nameserver:
    description: DNS servers, space separated.
    type: str
  searchdomain:
    description: DNS search domain.
    type: str
  ssh_public_keys:
    description: Public keys for root, set at creation.
    type: str
  mounts:
    description: Mount points, C(mpN) to a PVE property string (V(/srv/data,mp=/data)) or a dict of its properties.
    type: dict
  devices:
    description:
      - Device passthrough entries (C(dev0), C(dev1), ... in this order). Needs V(root@pam) with a password.
    type: list
    elements: dict
    suboptions:
      path:
        description: The device node under C(/dev/) on the node.
        type: str
        required: true
      mode:
        description: Access mode of the node in the container (octal, V(0666)).
        type: str
      uid:
        description: Owner of the node in the container.
        type: int
      gid:
        description: Group of the node in the container.
        type: int
      deny_write:
        description: Allow reading only.
        type: bool
  lxc_raw:
    description:
      - Raw C(lxc.*) lines in the config file's own form (key, colon, value), exactly these; an empty list removes all.
        PVE cannot set them through its API, so they are written into the node's
        C(<pve_root>/nodes/<node>/lxc/<vmid>.conf), and the task must run on a node of the cluster.
        Needs V(root@pam) with a password, like O(devices).
    type: list
    elements: str
  pve_root:
    description: The cluster's configuration directory on the node, for O(lxc_raw).
    type: path
    default: /etc/pve
  state:
    description:
      - V(present) creates or updates it and leaves its power state alone; V(started) and V(stopped)
        also set the power state; V(restarted) restarts it (or starts it); V(absent) destroys it.
    type: str
    choices: [present, started, stopped, restarted, absent]
    default: present
  restart_on_pending:
    description:
      - Restart a running container when a change could not be applied live and waits in pending.
        Off by default; the result says RV(restart_required) either way.
    type: bool
    default: false
  force:
    description: With O(state=absent), destroy a running container (it is stopped first).
    type: bool
    default: false
  purge:
    description: With O(state=absent), also remove the container from jobs, HA and ACLs.
    type: bool
    default: false
  restart:
    description:
      - Containers (vmids) to restart where their O(state) is V(started), as if it were V(restarted) (one that is
        stopped is started). For a change that PVE applies only at start and that its API does not see, such as
        raw lines written on the node.
    type: list
    elements: int
    default: []
  earlier:
    description:
      - The whole result of an earlier call of the same run (a run that writes raw lines between two calls, where
        the first makes and moves the containers and the second starts them). Each container's result then says
        what both calls did.
    type: dict
    default: {}
  raw_changed:
    description:
      - The containers (by vmid) whose raw lines lxc_raw changed on their node in this run, with the lines
        C(before) and C(after) (the RV(gpufleet.proxmox.lxc_raw#module:lines) of lxc_raw). Each is reported changed
        (key C(lxc)), and a running one that is not restarted here waits for its restart (raw lines take effect at
        start).
    type: dict
    default: {}
  containers:
    description:
      - Many containers in one call, each a dict of the container options above (O(vmid) required).
        Top-level container options are defaults for every entry.
    type: list
    elements: dict
  snapshot_before_restart:
    description:
      - Where a running container's config change is made effective by a restart in this call (O(restart_on_pending),
        O(state=restarted)), take a PVE snapshot of it first (C(gpufleet-<date>-<time>), its result's C(snapshot) in
        RV(containers); check mode names it). Where PVE cannot snapshot it, the change is written but the restart is
        not made (its result's C(restart_refused) says why), unless O(snapshot_before_restart.optional).
    type: dict
    suboptions:
      keep:
        description: How many of the collection's snapshots the container keeps, the new one counted.
        type: int
        default: 3
      optional:
        description: Restart without a snapshot where PVE cannot take one.
        type: bool
        default: false
  lock_timeout:
    description:
      - Seconds to keep retrying while the container is locked (backup, snapshot, ...) - every request that can meet
        the lock is retried in that time, a config change, create, destroy, resize, and the start, stop, shutdown and
        reboot tasks, which PVE fails when they find the lock.
    type: int
    default: 60
  orphan_tag:
    description:
      - Report the cluster's containers that carry this tag but are not among the call's (RV(orphans)), from the
        guest list the call reads anyway. They are left as they are.
    type: str
  orphan_known:
    description:
      - Vmids of containers that belong with the call's though it does not reconcile them (the fleet's containers on a
        node the run does not reach - down, or outside C(--limit)), never reported as orphans.
    type: list
    elements: int
    default: []
'''

EXAMPLES = r'''
- name: A training container with GPUs 0-3 (devN needs root@pam with its password)
  gpufleet.proxmox.lxc_container:
    api_host: pve1.example.com
    api_user: root@pam
    api_password: "{{ vault_pve_root_password }}"
    ca_path: /etc/ssl/pve-root-ca.pem
    node: pve1
    vmid: 200
    hostname: train-0
    ostemplate: local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst
    storage: local-zfs
    cores: 32
    memory: 262144
    net:
      net0: name=eth0,bridge=vmbr0,ip=10.1.2.20/24,gw=10.1.2.1
    devices:
      - {path: /dev/nvidia0}
      - {path: /dev/nvidia1}
      - {path: /dev/nvidia2}
      - {path: /dev/nvidia3}
      - {path: /dev/nvidiactl}
      - {path: /dev/nvidia-uvm}
      - {path: /dev/nvidia-uvm-tools}
    state: started

- name: The whole fleet in one call, read-only token, reporting drift only
  gpufleet.proxmox.lxc_container:
    api_host: pve1.example.com
    api_user: root@pam
    api_token_id: audit
    api_token_secret: "{{ vault_pve_audit_token }}"
    containers: "{{ fleet }}"
  check_mode: true
'''

RETURN = r'''
vmid:
  description: The container's id (single-container calls).
  returned: when O(vmid) is given
  type: int
node:
  description: The node it is on after the call (in check mode, where it is now).
  returned: when O(vmid) is given
  type: str
config:
  description: The container's config after the call (predicted in check mode).
  returned: when O(vmid) is given and the container exists
  type: dict
changed_keys:
  description: The config keys that were (or would be) changed.
  returned: always
  type: list
  elements: str
pending:
  description: Keys changed on a running container that wait for its next restart.
  returned: always
  type: list
  elements: str
restart_required:
  description: True when a running container has pending changes it was not restarted for.
  returned: always
  type: bool
status:
  description: The power state after the call (V(running), V(stopped) or V(absent)).
  returned: when O(vmid) is given
  type: str
containers:
  description:
    - One result per container (the keys above, and the C(actions) sent), in the order given. With
      O(snapshot_before_restart), C(snapshot) names the snapshot taken before a config change and its restart (or
      that would be), and C(restart_refused) says why a restart was not made.
    - When the call fails after a change, the containers are here too - those done, the one that failed with
      C(failed) and C(msg) (and C(changed) true when PVE took a request for it, as a create before its task failed),
      and those not reached with C(skipped).
  returned: always
  type: list
  elements: dict
api_requests:
  description: How many API requests the call made.
  returned: always
  type: int
orphans:
  description: The containers that carry O(orphan_tag) but are not among the call's - vmid, node, name, status.
  returned: when O(orphan_tag) is given
  type: list
  elements: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _lxc, _lxc_config, _pve_options


def argument_spec():
    spec = dict(_pve_options.CONNECTION_SPEC)
    spec.update(_lxc_config.CONTAINER_SPEC)
    # the defaults a call's top-level options get are the ones each container entry gets (_lxc_config.DEFAULTS)
    for key in ('state', 'restart_on_pending', 'force', 'purge'):
        spec[key] = dict(_lxc_config.CONTAINER_SPEC[key], default=_lxc_config.DEFAULTS[key])
    # the entries' keys are checked with every other value of the container (see _lxc_config.validate), so that a wrong
    # entry is named: Ansible's own check of suboptions says only "dictionary requested"
    spec['devices'] = dict(type='list', elements='dict')
    spec['pve_root'] = dict(type='path', default=_lxc_config.DEFAULTS['pve_root'])
    spec['containers'] = dict(type='list', elements='dict')
    spec['restart'] = dict(type='list', elements='int', default=[])
    spec['raw_changed'] = dict(type='dict', default={})
    spec['earlier'] = dict(type='dict', default={})
    spec['lock_timeout'] = dict(type='int', default=60)
    spec['snapshot_before_restart'] = dict(type='dict', options=dict(
        keep=dict(type='int', default=3), optional=dict(type='bool', default=False)))
    spec['orphan_tag'] = dict(type='str')
    spec['orphan_known'] = dict(type='list', elements='int', default=[])
    return spec


# AnsibleModule's constraints on the arguments beside the spec (the action checks them alike)
CONSTRAINTS = dict(required_one_of=_pve_options.CONNECTION_REQUIRED_ONE_OF + [('vmid', 'containers')],
                   required_together=_pve_options.CONNECTION_REQUIRED_TOGETHER,
                   mutually_exclusive=[('vmid', 'containers')])


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True, **CONSTRAINTS)
    result = _lxc.run(module.params, module.check_mode)
    if result.get('failed'):
        result.pop('failed')
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
