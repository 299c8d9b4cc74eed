#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: cdi_spec
short_description: The CDI spec of a container's GPUs, for the OCI engine that runs inside it
version_added: 0.1.0
description:
  - Runs in a container. Writes the Container Device Interface spec (C(/etc/cdi/nvidia.com-gpu.json), kind
    C(nvidia.com/gpu)) that Podman and Docker read, so that C(podman run --device nvidia.com/gpu=all) gives a nested
    container exactly the container's GPUs.
  - The spec is made from what the container has - the GPU vendor's device nodes under O(dev_dir) (one device per GPU,
    named by its number in the container, and C(all); the control nodes shared) and the driver bundle bound in at
    O(mount), each of its libraries mounted by its versioned file name and its soname in the image's library
    directory, its programs in C(/usr/bin).
  - A spec that differs is a finding that names why - a spec of another driver (files the bundle no longer has), of
    other GPUs, or not gpufleet's - and is written again; in check mode only reported.
  - Uses only the Python standard library.
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: Reports the findings and writes nothing.
  diff_mode:
    support: none
    description: The findings say what differs.
options:
  mount:
    description: Where the node's driver bundle is bound into the container (C(lib/), C(bin/)).
    type: path
    default: /opt/nvidia-driver
  path:
    description: The spec's file (by default C(/etc/cdi/) and the vendor's kind).
    type: path
  dev_dir:
    description: Where the container's device nodes are.
    type: path
    default: /dev
  vendor:
    description: The GPU vendor.
    type: str
    default: nvidia
'''

EXAMPLES = r'''
- name: Give the container's Podman its GPUs
  gpufleet.proxmox.cdi_spec:
    mount: /opt/nvidia-driver
'''

RETURN = r'''
path:
  description: The spec's file.
  returned: always
  type: str
spec:
  description: The spec, as written (or as it would be, in check mode).
  returned: always
  type: dict
findings:
  description: What was wrong with the spec before (check - cdi_missing, cdi_unreadable, cdi_stale, cdi_devices or cdi_differs; msg).
  returned: always
  type: list
  elements: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _cdi, _gpu


def main():
    module = AnsibleModule(argument_spec=dict(
        mount=dict(type='path', default='/opt/nvidia-driver'), path=dict(type='path'),
        dev_dir=dict(type='path', default='/dev'), vendor=dict(type='str', default='nvidia')),
        supports_check_mode=True)
    p = module.params
    try:
        result = _cdi.apply(_gpu.vendor(p['vendor']), p['mount'], p['path'], p['dev_dir'], module.check_mode)
    except _gpu.UnknownVendor as e:
        module.fail_json(msg='vendor: {0}'.format(e))
    except (IOError, OSError) as e:
        module.fail_json(msg='cdi_spec: {0}'.format(e))
    module.exit_json(**result)


if __name__ == '__main__':
    main()
