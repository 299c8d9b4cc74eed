#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
module: gpu_devices
short_description: Discover the NVIDIA device nodes and driver of a Proxmox node
version_added: 0.1.0
description:
  - Reads the NVIDIA device nodes (C(/dev/nvidiaN), C(nvidiactl), C(nvidia-modeset), C(nvidia-uvm),
    C(nvidia-uvm-tools), C(/dev/nvidia-caps/*)) with their majors and minors, the dynamic majors of
    C(nvidia-uvm) and C(nvidia-caps) from C(/proc/devices), the kernel module version from
    C(/proc/driver/nvidia/version), GPU index to PCI bus id where C(nvidia-smi) exists, and where
    C(nvidia-persistenced) is installed.
  - Reports findings that stop passthrough from working (C(nvidia-uvm) not loaded or its nodes missing or
    stale, no driver), each with the command that fixes it.
  - With O(shares), also reports each directory the node shares with its containers that is missing, not a
    directory, or owned or moded otherwise (C(share_missing), C(share_not_directory), C(share_owner),
    C(share_mode), each with its C(path)), so that a role makes or mends only those.
  - With O(bundle), also reports a driver bundle of the loaded version (see M(gpufleet.proxmox.driver_bundle))
    that lacks a file, holds another copy of one or lacks a soname link (C(bundle_stale), with its C(path));
    a bundle is current when each file has its source's size and mtime (read by stat alone, as rsync
    does), so that a role gathers it only when it is not.
  - A node whose userspace driver was upgraded but which still runs the old kernel module (not rebooted) has no
    libraries of the loaded version to gather. Where its bundle of that version is intact, that bundle keeps
    serving and the finding is C(driver_not_rebooted) (with C(installed), the versions on disk), else
    C(bundle_stale) saying the same.
  - With O(boot_files), also reports each of the node's own files (the device-node script, its boot unit and the
    link that enables it) that is missing, holds other text, has another mode or points elsewhere
    (C(file_stale), with its C(path)), so that a role writes only those. A node without a loaded driver makes no
    device nodes and they are not checked.
  - Changes nothing. Uses only the Python standard library.
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: Reads only; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing to show.
options:
  vendor:
    description:
      - The node's GPU vendor, whose discovery runs (module_utils C(_gpu), the GPU vendor seam). Its facts say it as
        C(vendor), and the fleet's plan asks that vendor for the device nodes of the node's containers.
    type: str
    choices: [nvidia]
    default: nvidia
  dev_dir:
    description: Where the device nodes are.
    type: path
    default: /dev
  proc_root:
    description: Where to read C(devices) and C(driver/nvidia/version) from.
    type: path
    default: /proc
  nvidia_smi:
    description: The nvidia-smi to ask for PCI bus ids; found on C(PATH) when not given.
    type: path
  root:
    description:
      - The node's root directory, where its kernels (C(boot/vmlinuz-*)), boot pins (C(etc/kernel/)), kernel
        modules (C(lib/modules/)), DKMS tree (C(var/lib/dkms/)) and package database (C(var/lib/dpkg/status)) are
        read. With a loaded driver, the module is checked for the running kernel (C(<proc_root>/sys/kernel/osrelease))
        and the one the node boots next - C(module_missing_running_kernel), C(module_missing_next_kernel),
        C(module_build_failed) (a DKMS build that failed, with its log), C(module_version_next_kernel) (built there for
        another version than the userspace driver) - each with its fix; the result's C(kernels) says what was read.
    type: path
    default: /
  driver_hold:
    description: The driver's Debian packages must be held from upgrades (C(apt-mark hold)); any that is not is the
      finding C(driver_not_held), with the command. A driver installed with NVIDIA's installer has no packages.
    type: bool
    default: false
  driver_optional:
    description:
      - The node may have no NVIDIA driver (a node without GPUs). Where none is loaded, that is no finding, nor are
        the device nodes it would make; the shares are still checked.
    type: bool
    default: false
  pve_root:
    description:
      - PVE's cluster file system, whose container config files say which containers of the node are given each GPU
        (the fact's C(held)).
    type: path
    default: /etc/pve
  node:
    description:
      - The node's name in the cluster (its configs are in O(pve_root)C(/nodes/<node>/lxc)); without it, the node's
        own C(/etc/pve/lxc).
    type: str
  shares:
    description:
      - The directories the node shares with its containers (gpu_node_shares). Each should be a directory of mode
        O(shares_mode), owned by O(shares_owner) unless it is O(shares[].read_only).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The directory on the node.
        type: path
        required: true
      mp:
        description: Where the containers mount it (not read here).
        type: str
      read_only:
        description: The containers only read it, so any owner will do.
        type: bool
        default: false
  shares_owner:
    description: The uid that owns the shared directories, as user and group (the containers' root); any when not given.
    type: int
  shares_mode:
    description: The mode of the shared directories, in octal.
    type: str
    default: '0755'
  boot_files:
    description: The node's own files as they should be.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file or link on the node.
        type: path
        required: true
      content:
        description: The text a file should hold.
        type: str
      mode:
        description: The mode a file should have, in octal.
        type: str
      src:
        description: Where a symbolic link should point (the entry is a link).
        type: str
  bundle:
    description:
      - What the node's driver bundle holds, as a dict of the options of M(gpufleet.proxmox.driver_bundle) but
        O(gpufleet.proxmox.driver_bundle#module:version), which is the loaded module's -
        O(gpufleet.proxmox.driver_bundle#module:dest) (required), O(gpufleet.proxmox.driver_bundle#module:lib_dirs)
        (required), O(gpufleet.proxmox.driver_bundle#module:libs) (required),
        O(gpufleet.proxmox.driver_bundle#module:bin_dirs) and O(gpufleet.proxmox.driver_bundle#module:bins) -
        checked as that module checks them.
    type: dict
'''

EXAMPLES = r'''
- name: What can this node pass through?
  gpufleet.proxmox.gpu_devices:
  register: gpus

- name: Fail on anything that would break passthrough
  ansible.builtin.assert:
    that: gpus.ansible_facts.gpufleet_gpu_devices.findings | length == 0
    fail_msg: "{{ gpus.ansible_facts.gpufleet_gpu_devices.findings | map(attribute='msg') }}"
'''

RETURN = r'''
ansible_facts:
  description: Facts about the node's NVIDIA devices.
  returned: always
  type: complex
  contains:
    gpufleet_gpu_devices:
      description:
        - C(vendor) (the GPU vendor that discovered them), C(gpus) (index, path, major, minor, mode, and pci_bus_id,
          uuid, name where nvidia-smi answers),
          C(count), C(control) (nvidiactl, nvidia-modeset, nvidia-uvm, nvidia-uvm-tools by name), C(caps),
          C(majors), C(uvm_major), C(driver_version), C(findings) (code, msg, fix, and path for a share, the
          bundle or a boot file), C(nvidia_smi) (the one that answered), C(persistenced) (the path of nvidia-persistenced where it is installed, else null),
          C(bundle) (C(version) and C(path) of the driver bundle of the loaded module; null without O(bundle) or
          a loaded driver), C(kernels) with a loaded driver (C(running_kernel), C(next_kernel) and why,
          C(modules) the module file per kernel, C(headers) per kernel whether its headers are installed,
          C(dkms) per version the kernels built for, a failed build's log and the module's DKMS name (C(nvidia), or
          Debian's C(nvidia-current)), C(packages) the driver's Debian packages with their version, source package,
          dpkg state and whether held, C(unfinished) every package dpkg has not finished (as C(dpkg --audit)),
          C(runfile) the files of NVIDIA's installer the node has), and with a loaded
          driver C(installed_versions), the userspace driver versions found in the bundle's C(lib_dirs), newest
          last; C(held), by GPU index, the containers of the node given that GPU's device node (vmid and name,
          whoever made them - a devN, pending or not, or a raw mount entry); C(pcie), the PCIe path between the GPUs
          as the node's sysfs shows it - C(iommu) (enabled, groups), C(gpus) by index (bus_id, and bridges, nearest
          first, each with its bdf and the ACS control bits set, null where it has no ACS capability; null where
          sysfs does not have the GPU) and C(redirecting), the bridges whose ACS redirects peer-to-peer (RR or CR)
          and so sends transfers between the GPUs below them up to the root complex.
      type: dict
      returned: always
'''

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _gpu

ARGUMENT_SPEC = dict(vendor=dict(type='str', choices=sorted(_gpu.VENDORS), default=_gpu.DEFAULT),
                     dev_dir=dict(type='path', default='/dev'),
                     proc_root=dict(type='path', default='/proc'),
                     nvidia_smi=dict(type='path'),
                     shares=dict(type='list', elements='dict', default=[], options=dict(
                         path=dict(type='path', required=True), mp=dict(type='str'),
                         read_only=dict(type='bool', default=False))),
                     shares_owner=dict(type='int'),
                     shares_mode=dict(type='str', default='0755'),
                     bundle=dict(type='dict'),
                     boot_files=dict(type='list', elements='dict', default=[], options=dict(
                         path=dict(type='path', required=True), content=dict(type='str'),
                         mode=dict(type='str'), src=dict(type='str'))),
                     root=dict(type='path', default='/'),
                     driver_hold=dict(type='bool', default=False),
                     driver_optional=dict(type='bool', default=False),
                     pve_root=dict(type='path', default='/etc/pve'),
                     node=dict(type='str'))


def checked_bundle(params):
    """(params with bundle, where given as a dict, checked against the driver bundle's spec and its defaults filled
    in, None), or (None, the message that names what is wrong)."""
    if not isinstance(params.get('bundle'), dict):
        return params, None
    checked = ArgumentSpecValidator(_gpu.vendor(params.get('vendor')).bundle_spec).validate(params['bundle'])
    if checked.error_messages:
        return None, 'bundle: {0}'.format('; '.join(checked.error_messages))
    return dict(params, bundle=checked.validated_parameters), None


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params, error = checked_bundle(module.params)
    if error:
        module.fail_json(msg=error)
    module.exit_json(**_gpu.discover_node(params, module.check_mode))


if __name__ == '__main__':
    main()
