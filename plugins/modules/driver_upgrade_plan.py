#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: driver_upgrade_plan
short_description: Plan a GPU node's NVIDIA driver upgrade, and refuse one its containers' venvs cannot run on
version_added: 0.2.0
description:
  - The first step of C(playbooks/driver_upgrade.yml) on each node, on the controller, before anything changes.
  - It finds the fleet's GPU containers on the node (O(fleet)), reads each one's venv profile (its C(venv_profile),
    else O(profile)) and takes the profile's driver floor from its lock - the newest CUDA major any of its wheels is
    built for (torch's C(+cuNNN), an NVIDIA wheel's C(-cuNN), a CUDA component's version), and the oldest driver
    that runs it (NVIDIA's minor version compatibility - CUDA 11 from 450.80.02, 12 from 525.60.13, 13 from
    580.65.06) - and fails, naming every container, profile, the wheel that sets the floor and the driver it needs,
    where the new driver is older.
  - Before anything changes it also refuses what keeps the node from the change, each with its fix - a version the
    node's sources do not offer, packages dpkg has not finished, a kernel without the headers the module is built
    against, Debian's packages beside NVIDIA's installer's files (or the other method than the node's), and (with
    O(rollback)) a way back that the node's sources no longer offer.
  - It says whether the node needs the upgrade (its loaded module, its userspace and the module built for its
    running and next kernels are not all of O(version) yet) and each step the roll makes there, with the
    containers it stops.
  - Changes nothing.
extends_documentation_fragment:
  - gpufleet.proxmox.controller_action
options:
  version:
    description:
      - The NVIDIA driver version the node is to run (C(gpu_node_driver_version)), such as V(580.105.08), or a Debian
        version of its packages in full, such as V(550.163.01-4~bpo13+1) (another Debian revision of the same
        upstream version; where the node's sources offer several revisions of an upstream version, the full one is
        needed).
    type: str
    required: true
  method:
    description: How the driver is installed - V(apt), Debian's packages (NVIDIA's CUDA repository or Debian's own), or
      V(run), NVIDIA's C(.run) installer with DKMS.
    type: str
    choices: [apt, run]
    default: apt
  node:
    description: The node (its inventory name, as the fleet's entries name it); the task's host by default.
    type: str
  fleet:
    description: The fleet's entries (C(gpufleet_containers)).
    type: list
    elements: raw
    default: []
  devices:
    description: The node's discovery (C(gpufleet_gpu_devices) of M(gpufleet.proxmox.gpu_devices)).
    type: dict
    required: true
  profile:
    description: The venv profile of a container whose entry names none (C(torch_venv_profile)).
    type: str
    default: default
  profiles_dir:
    description: Where profiles named without a C(/) are (C(torch_venv_profiles_dir)); the torch_venv role's shipped
      profiles by default.
    type: path
  packages:
    description: The driver's Debian packages the install moves (V(apt)); named in the steps.
    type: list
    elements: str
    default: []
  package_version:
    description: Their Debian version, for every package alike; by default each package's version is the one the
      node's sources offer for O(version) (O(offers)).
    type: str
  offers:
    description:
      - What the node's apt offers of the driver's packages, as C(apt-cache madison) prints it (one C(package |
        version | source) line a version). Each package moved is pinned to the Debian version offered for
        O(version); one that is not offered refuses the plan before anything changes (V(apt)).
    type: str
    default: ''
  rollback:
    description: Refuse the upgrade where the node's sources no longer offer the versions it has now (the way back
      could not be installed). V(false) goes on without a way back.
    type: bool
    default: true
  read:
    description:
      - The fleet's containers as the API has them (the C(containers) of a check-mode reconcile, as the
        C(gpu_container) role's C(discover) tasks read them). Where the node needs the upgrade and one of its GPU
        containers does not exist, or is on another node, the plan is refused, naming it - the roll would stop,
        start and verify what is not there. Without it, that is not checked.
    type: list
    elements: dict
attributes:
  check_mode:
    description: Changes nothing in any mode.
    support: full
author:
  - gpufleet maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Plan this node's upgrade to 580.105.08
  gpufleet.proxmox.driver_upgrade_plan:
    version: 580.105.08
    fleet: "{{ gpufleet_containers }}"
    devices: "{{ gpufleet_gpu_devices }}"
  register: upgrade
'''

RETURN = r'''
needed:
  description: Whether the node needs the upgrade.
  returned: always
  type: bool
from:
  description: The version of the node's loaded module (null where none is loaded).
  returned: always
  type: str
to:
  description: O(version).
  returned: always
  type: str
kernels:
  description: The running kernel and the one the node boots next, for which the module is built.
  returned: always
  type: list
  elements: str
containers:
  description: The node's GPU containers, each with C(vmid), C(hostname), C(profile), C(needs) (the oldest driver
    its profile's wheels run on, null for a CPU profile) and C(floor) (that said whole, with the wheel that sets it).
  returned: always
  type: list
  elements: dict
pins:
  description: Each of O(packages) at its new version, as apt-get takes it (C(<package>=<Debian version>)).
  returned: always
  type: list
  elements: str
steps:
  description: The steps of the node's roll, in order (empty where it needs none).
  returned: always
  type: list
  elements: str
msg:
  description: The plan in one line.
  returned: always
  type: str
rollback:
  description: What the node is left as where its upgrade fails, and the way back (each package pinned to the
    version it has now) or on.
  returned: always
  type: str
'''

from ansible_collections.gpufleet.proxmox.plugins.module_utils._action_only import refuse

# The options, here beside DOCUMENTATION so that sanity checks one against the other; the action plugin
# (plugins/action/driver_upgrade_plan.py) validates its task's arguments with this same spec.
ARGUMENT_SPEC = {
    'version': {'type': 'str', 'required': True},
    'method': {'type': 'str', 'choices': ['apt', 'run'], 'default': 'apt'},
    'node': {'type': 'str'},
    'fleet': {'type': 'list', 'elements': 'raw', 'default': []},
    'devices': {'type': 'dict', 'required': True},
    'profile': {'type': 'str', 'default': 'default'},
    'profiles_dir': {'type': 'path'},
    'packages': {'type': 'list', 'elements': 'str', 'default': []},
    'package_version': {'type': 'str'},
    'offers': {'type': 'str', 'default': ''},
    'rollback': {'type': 'bool', 'default': True},
    'read': {'type': 'list', 'elements': 'dict'},
}


def main():
    refuse('driver_upgrade_plan', ARGUMENT_SPEC)


if __name__ == '__main__':
    main()
