#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: driver_bundle
short_description: Gather a node's NVIDIA userspace driver of one exact version into a directory
version_added: 0.1.0
description:
  - Copies the driver's libraries (C(<name>.so.<version>)) and programs into C(<dest>/<version>/lib) and
    C(<dest>/<version>/bin), and links each library's soname, so that containers can bind exactly the
    node's driver in read-only.
  - Copies only what differs. Fails naming the directories searched when C(libcuda) of that version is
    not on the node (its userspace does not match its kernel module).
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

import filecmp
import os
import shutil

from ansible.module_utils.basic import AnsibleModule


def find(dirs, name):
    for d in dirs:
        path = os.path.join(d, name)
        if os.path.isfile(path):
            return path
    return None


def main():
    module = AnsibleModule(argument_spec=dict(
        version=dict(type='str', required=True), dest=dict(type='path', required=True),
        lib_dirs=dict(type='list', elements='path', required=True),
        bin_dirs=dict(type='list', elements='path', default=['/usr/bin']),
        libs=dict(type='dict', required=True), bins=dict(type='list', elements='str', default=['nvidia-smi'])),
        supports_check_mode=True)
    p = module.params
    bundle = os.path.join(p['dest'], p['version'])
    wanted = []  # (source, relative destination, soname link or None)
    for name, soname in sorted(p['libs'].items()):
        filename = '{0}.so.{1}'.format(name, p['version'])
        src = find(p['lib_dirs'], filename)
        if src:
            wanted.append((src, os.path.join('lib', filename), soname or None))
    if not any(rel.startswith('lib/libcuda.so.') for _s, rel, _l in wanted):
        module.fail_json(msg='no libcuda.so.{0} in {1}: the node\'s userspace driver does not match its kernel '
                             'module {0}'.format(p['version'], ', '.join(p['lib_dirs'])))
    for name in p['bins']:
        src = find(p['bin_dirs'], name)
        if src:
            wanted.append((src, os.path.join('bin', name), None))
    changed = False
    for src, rel, soname in wanted:
        dest = os.path.join(bundle, rel)
        if not (os.path.isfile(dest) and filecmp.cmp(src, dest, shallow=False)):
            changed = True
            if not module.check_mode:
                os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
                shutil.copyfile(src, dest + '.tmp')
                os.chmod(dest + '.tmp', 0o755)
                os.rename(dest + '.tmp', dest)
        if soname:
            link = os.path.join(os.path.dirname(dest), soname)
            if os.path.islink(link) and os.readlink(link) == os.path.basename(dest):
                continue
            changed = True
            if not module.check_mode:
                if os.path.lexists(link):
                    os.unlink(link)
                os.symlink(os.path.basename(dest), link)
    module.exit_json(changed=changed, path=bundle, files=sorted(rel for _s, rel, _l in wanted))


if __name__ == '__main__':
    main()
