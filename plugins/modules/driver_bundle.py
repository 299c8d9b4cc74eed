#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: driver_bundle
short_description: Gather a node's NVIDIA userspace driver of one exact version into a directory
version_added: 0.1.0
description:
  - Copies the driver's libraries (C(<name>.so.<version>)) and programs into C(<dest>/<version>/lib) and
    C(<dest>/<version>/bin), and links each library's soname, so that containers can bind exactly the
    node's driver in read-only.
  - Copies only what differs, a file whose size or mtime is not its source's (a copy keeps its source's mtime).
    M(gpufleet.proxmox.gpu_devices) with O(gpufleet.proxmox.gpu_devices#module:bundle) tells the same way
    whether a bundle is current.
  - Fails naming the directories searched when C(libcuda) of that version is not on the node (its userspace
    does not match its kernel module).
  - Uses only the Python standard library.
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: Reports what it would copy and link.
  diff_mode:
    support: none
    description: Nothing to show.
options:
  version:
    description: The driver version (the loaded kernel module's).
    type: str
    required: true
  dest:
    description: Where bundles go, one directory per version.
    type: path
    required: true
  lib_dirs:
    description: Where the node's driver libraries are.
    type: list
    elements: path
    required: true
  bin_dirs:
    description: Where the node's driver programs are.
    type: list
    elements: path
    default: [/usr/bin]
  libs:
    description: Library names to the soname to link (an empty soname links none).
    type: dict
    required: true
  bins:
    description: Program names.
    type: list
    elements: str
    default: [nvidia-smi]
'''

EXAMPLES = r'''
- name: The node's driver, for containers to bind in
  gpufleet.proxmox.driver_bundle:
    version: 580.95.05
    dest: /opt/gpufleet/driver
    lib_dirs: [/usr/lib/x86_64-linux-gnu]
    libs: {libcuda: libcuda.so.1, libnvidia-ml: libnvidia-ml.so.1}
'''

RETURN = r'''
path:
  description: The bundle (C(<dest>/<version>)).
  returned: always
  type: str
files:
  description: The bundle's files, relative to it.
  returned: always
  type: list
  elements: str
'''

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _gpu


def main():
    vendor = _gpu.vendor()
    module = AnsibleModule(argument_spec=dict(vendor.bundle_spec, version=dict(type='str', required=True)),
                           supports_check_mode=True)
    p = module.params
    path = os.path.join(p['dest'], p['version'])
    try:
        wanted = vendor.bundle_files(p['version'], p['lib_dirs'], p['libs'], p['bin_dirs'], p['bins'])
    except vendor.bundle_error as e:
        module.fail_json(msg=str(e))
    changed = vendor.gather_bundle(path, wanted, module.check_mode)
    module.exit_json(changed=changed, path=path, files=sorted(rel for _s, rel, _l in wanted))


if __name__ == '__main__':
    main()
