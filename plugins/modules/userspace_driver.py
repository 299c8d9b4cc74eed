#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: userspace_driver
short_description: A container's NVIDIA userspace driver, pointed at its node's and read back
version_added: 0.1.0
description:
  - Runs in a container. In O(mode=bind) it points the loader at the node's driver bundle bound in at O(mount)
    (C(/etc/ld.so.conf.d/000-gpufleet-nvidia.conf) holds C(<mount>/lib), and the loader's cache is refreshed
    when that changed) and links C(/usr/bin/nvidia-smi) to C(<mount>/bin/nvidia-smi).
  - Then reads which C(libcuda.so.1) the loader resolves and the driver version its file name carries, and
    compares it with O(node_version). With O(require_match=true) a mismatch fails (NVML would answer "Driver/library
    version mismatch"); in check mode it is reported as a change instead. Otherwise the caller decides.
  - Uses only the Python standard library.
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: Reports the files it would write; the driver read is what the container loads now.
  diff_mode:
    support: none
    description: The result lists the files changed.
options:
  node_version:
    description: The node's kernel module version (the driver the container must load).
    type: str
    required: true
  mode:
    description: V(bind) points the loader at O(mount); V(read) only reads (a driver installed in the container).
    type: str
    choices: [bind, read]
    default: bind
  mount:
    description: Where the node's driver bundle is bound into the container (C(lib/), C(bin/)).
    type: path
    default: /opt/nvidia-driver
  require_match:
    description: Fail when the container does not load exactly O(node_version) (in check mode, report a change).
    type: bool
    default: false
'''

EXAMPLES = r'''
- name: Point the container at its node's driver and read it back
  gpufleet.proxmox.userspace_driver:
    node_version: 580.95.05
    mount: /opt/nvidia-driver
  register: driver
'''

RETURN = r'''
node_version:
  description: The node's kernel module version, as given.
  returned: always
  type: str
version:
  description: The version of the libcuda the loader resolves (from its file name), or null when none.
  returned: always
  type: str
library:
  description: The real file of that libcuda, or null.
  returned: always
  type: str
match:
  description: Whether the container loads exactly the node's driver.
  returned: always
  type: bool
changed_files:
  description: The loader config and the nvidia-smi link when they were (would be) written.
  returned: always
  type: list
  elements: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _gpu


def main():
    module = AnsibleModule(argument_spec=dict(
        node_version=dict(type='str', required=True), mode=dict(type='str', choices=['bind', 'read'], default='bind'),
        mount=dict(type='path', default='/opt/nvidia-driver'), require_match=dict(type='bool', default=False)),
        supports_check_mode=True)
    p = module.params
    try:
        result, failed = _gpu.vendor().driver_step(p['node_version'], p['mode'], p['mount'], p['require_match'],
                                                   module.check_mode)
    except (IOError, OSError) as e:
        module.fail_json(msg='userspace_driver: {0}'.format(e))
    if failed:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
