#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: fleet_plan
short_description: Check a fleet definition as a whole and expand it into the containers lxc_container reconciles
version_added: 0.1.0
description:
  - The gpu_container role's first step, once on the controller. It checks every entry of the fleet definition
    against the inventory's nodes and PVE's own schema - unknown keys, duplicate vmids or hostnames, a node the
    inventory lacks, a GPU the node lacks, a GPU given twice (unless O(gpu_sharing)), values PVE would refuse,
    passthrough with a token-only login, devN on PVE before 8.1 - and names every problem with its container and
    field, before any request that changes anything.
  - It then expands each entry into plain container options for M(gpufleet.proxmox.lxc_container) - the entry over
    O(defaults), its GPUs as C(devN) entries with the control nodes (nvidiactl, nvidia-uvm, nvidia-uvm-tools,
    nvidia-modeset), the node's driver bundle bound in at O(driver_mount), the node's shared directories - each
    extra mount on the highest free C(mpN), so the definition's own mounts keep theirs.
  - What it knows of the nodes comes from the inventory - gpu_node's facts on each host of the play
    (C(gpufleet_gpu_devices) for the GPU indexes and device majors, C(gpu_node_driver) for the driver bundle,
    C(gpu_node_shared) for the shared directories).
  - With GPUs in the fleet and O(passthrough) V(auto) or V(devn), it reads the version of each node with GPU
    containers (one login, and one request a node, with O(api)), since the nodes of a cluster being upgraded run
    different ones - V(auto) is V(devn) on a node from PVE 8.1 on and V(raw) on one before; V(devn) is refused for a
    node before 8.1.
  - With V(raw), the GPUs go in as raw C(lxc.*) lines for M(gpufleet.proxmox.lxc_raw) to write, and the containers
    to start are reconciled V(present) first, to start once their lines are written.
  - Changes nothing.
extends_documentation_fragment:
  - gpufleet.proxmox.controller_action
options:
  containers:
    description: The fleet's entries (C(gpu_container_fleet); see the gpu_container role's documentation).
    type: list
    elements: raw
    required: true
  defaults:
    description: Container options every entry starts from (C(ostemplate), C(storage), C(state), C(cores), ...).
    type: dict
    default: {}
  passthrough:
    description: How GPUs are passed through; V(auto) is V(devn) from PVE 8.1 on and V(raw) before.
    type: str
    choices: [auto, devn, raw]
    default: auto
  gpu_sharing:
    description: Whether a GPU may be given to more than one container.
    type: bool
    default: false
  gpu_mode:
    description:
      - The mode of the GPUs' device nodes in every container whose entry gives no C(gpu_mode) (devN passthrough;
        raw passthrough binds the node's own nodes in, with the node's modes).
      - PVE makes them V(0660) root:root where the devN entry gives none, so only root could use the GPUs; the
        default V(0666) lets every user of the container open them, as NVIDIA's driver does on the node.
    type: str
    default: '0666'
  gpu_gid:
    description: The group (a gid of the container) of the GPUs' device nodes where an entry gives no C(gpu_gid);
      with O(gpu_mode=0660), only that group's members (and root) may use the GPUs.
    type: int
  driver_mount:
    description: Where each node's driver bundle is bound into its GPU containers, read-only (empty for none).
    type: str
    default: ""
  nodes_group:
    description:
      - The inventory group of the cluster's nodes. Its nodes that are not in the play (a run limited to some nodes)
        are nodes of the fleet all the same - their containers are checked with the rest of the fleet, and left
        out of the plan.
    type: str
    default: pve_nodes
  override:
    description: Container options set on every container after the expansion, as V(state=absent) and V(force=true)
      to destroy the fleet.
    type: dict
    default: {}
  tag:
    description:
      - The fleet's tag, added to every container's C(tags), so that a container that carries it but is not in
        O(containers) is known as the fleet's (an orphan, which M(gpufleet.proxmox.lxc_container)'s C(orphan_tag)
        reports). Empty - no tag.
    type: str
    default: ''
  remove_confirm:
    description:
      - The vmids of the entries with C(state=absent) that this run may destroy (a running one is stopped first).
        An entry with C(state=absent) whose vmid is not here fails the check before anything changes, naming the
        confirmation to give. Check mode needs none (it destroys nothing).
    type: list
    elements: int
    default: []
  venv_profile:
    description:
      - The venv profile of the entries that name none (C(torch_venv_profile)), a shipped one's name or a directory.
        Each entry's template is held to its profile's Pythons - a template whose Python (C(debian-12-standard)
        3.11, C(ubuntu-24.04-standard) 3.12, C(debian-13-standard) 3.13) the profile's lock is not for is refused,
        naming the profile to lock for it.
    type: str
    default: default
  venv_profiles_dir:
    description: Where profiles named by name are (C(torch_venv_profiles_dir)); empty - the collection's own.
    type: str
    default: ''
  driver_floor:
    description:
      - Refuse a GPU container whose node runs an NVIDIA driver below its venv profile's floor (the oldest driver
        that runs every CUDA wheel of the profile's lock), naming the node, the profile, the wheel and the driver.
      - V(false) where the fleet is read to judge another driver (the driver upgrade's plan holds the new driver to
        the floor instead).
    type: bool
    default: true
  api:
    description:
      - The PVE API connection (M(gpufleet.proxmox.lxc_container)'s C(api_*) options, C(validate_certs), C(ca_path)),
        used only to read the nodes' versions where GPUs are passed through as V(devn) or V(auto), and to tell
        whether the login is C(root@pam) with its password (devN needs it).
    type: dict
    default: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: In check mode the containers keep the power states the fleet wants, also with raw passthrough.
author:
  - gpufleet maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Check the fleet and expand it
  gpufleet.proxmox.fleet_plan:
    containers:
      - {vmid: 200, hostname: train-0, node: pve1, gpus: [0, 1, 2, 3], cores: 32, memory: 262144}
      - {vmid: 201, hostname: utility, node: pve1}
    defaults: {ostemplate: "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst", storage: local-zfs, state: started}
    driver_mount: /opt/nvidia-driver
    api: "{{ gpu_container_api }}"
  run_once: true
  register: plan

- name: Reconcile them
  gpufleet.proxmox.lxc_container:
    containers: "{{ plan.containers }}"
  delegate_to: localhost
  run_once: true
'''

RETURN = r'''
passthrough:
  description: How the fleet's GPUs are passed through - V(devn) or V(raw) where every node has the same mode,
    V(mixed) where the nodes' versions differ across 8.1 in V(auto) mode.
  returned: success
  type: str
passthrough_nodes:
  description: The passthrough mode of each node of the plan (V(devn) or V(raw)).
  returned: success
  type: dict
pve_versions:
  description: Each node's own PVE version, where it was read (nodes with GPU containers, O(passthrough) V(auto)
    or V(devn)), by GET /nodes/<node>/version.
  returned: success
  type: dict
pve_version:
  description: The version of those nodes where they all run the same one (else null).
  returned: success
  type: str
containers:
  description: The containers to reconcile now, as M(gpufleet.proxmox.lxc_container)'s C(containers) takes them
    (with raw passthrough and outside check mode, those to start are V(present) until their raw lines are written).
  returned: success
  type: list
  elements: dict
wanted:
  description: Every container with the power state the fleet wants (what raw passthrough reconciles once the raw
    lines are written).
  returned: success
  type: list
  elements: dict
raw:
  description: With raw passthrough, each node to the raw C(lxc.*) lines of each of its GPU containers, by vmid.
  returned: success
  type: dict
not_reached:
  description:
    - The nodes whose containers are not in the plan - those of O(nodes_group) outside the play (a run limited
      to some nodes), and the play's nodes that dropped out of it (RV(nodes_down)).
  returned: success
  type: list
  elements: str
nodes_down:
  description:
    - The play's nodes that dropped out of it before the plan (unreachable, or a task failed there). Their
      containers are judged unreached, not left out.
  returned: success
  type: list
  elements: str
hosts:
  description:
    - What the inventory host of each container carries, by vmid - C(hostname), C(entry) (its fleet entry),
      C(gpus) (its GPU indexes on its node) and C(gpu_info) (the node's M(gpufleet.proxmox.gpu_devices) entries
      for those GPUs).
  returned: success
  type: dict
vmids:
  description: The vmids of every container of the definition, those of nodes this run does not reach included.
  returned: success
  type: list
  elements: int
venv_pythons:
  description:
    - The venv profile of each container, by vmid, where it could be read on the controller - C(name), C(dir) and
      C(pythons), the Pythons its lock is for (the doctor holds each running container's Python to them).
  returned: success
  type: dict
'''

from ansible_collections.gpufleet.proxmox.plugins.module_utils._action_only import refuse

# The options, here beside DOCUMENTATION so that sanity checks one against the other; the action plugin
# (plugins/action/fleet_plan.py) validates its task's arguments with this same spec.
ARGUMENT_SPEC = {
    'containers': {'type': 'list', 'elements': 'raw', 'required': True},
    'defaults': {'type': 'dict', 'default': {}},
    'passthrough': {'type': 'str', 'choices': ['auto', 'devn', 'raw'], 'default': 'auto'},
    'nodes_group': {'type': 'str', 'default': 'pve_nodes'},
    'gpu_sharing': {'type': 'bool', 'default': False},
    'driver_mount': {'type': 'str', 'default': ''},
    'gpu_mode': {'type': 'str', 'default': '0666'},
    'gpu_gid': {'type': 'int'},
    'override': {'type': 'dict', 'default': {}},
    'tag': {'type': 'str', 'default': ''},
    'remove_confirm': {'type': 'list', 'elements': 'int', 'default': []},
    'api': {'type': 'dict', 'default': {}, 'no_log': True},
    'venv_profile': {'type': 'str', 'default': 'default'},
    'venv_profiles_dir': {'type': 'str', 'default': ''},
    'driver_floor': {'type': 'bool', 'default': True},
}


def main():
    refuse('fleet_plan', ARGUMENT_SPEC)


if __name__ == '__main__':
    main()
