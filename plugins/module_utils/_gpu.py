# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU vendor seam: everything the collection asks of a GPU vendor, as one interface (Vendor), with NVIDIA its
implementation (the _nvidia*.py files hold its knowledge). The fleet, the reconcile, the venv build, the drift and
the verification call only this: a vendor's device nodes, discovery, userspace driver and its bundle reach them as
data (GPU indexes and minors, device paths, findings).

Another vendor (AMD's ROCm: /dev/kfd, /dev/dri/renderD*, the amdgpu module) is a class here that implements Vendor
over its own files, and an entry of VENDORS; gpu_devices reports each node's vendor (its facts' `vendor`), and the
fleet's plan asks that vendor for the node's device nodes. Nothing else changes.
"""


import os

from ansible_collections.gpufleet.proxmox.plugins.module_utils import (
    _nvidia, _nvidia_bundle, _nvidia_devices, _nvidia_kernel, _nvidia_userspace, _pcie)

DEFAULT = 'nvidia'


class Vendor(object):
    """What the collection asks of a GPU vendor. Each method says what it answers; an implementation overrides
    every one (a unit test checks that each vendor of VENDORS does)."""

    name = None

    # -- the node --------------------------------------------------------------------------------------------------
    def discover_node(self, params, check=False):
        """gpu_devices' work (params: its options): {changed: False, ansible_facts: {gpufleet_gpu_devices: {indexes,
        gpus: [{index, minor, ...}], majors, control, driver_version, held, findings}}} (discover_node below adds the
        vendor's name). Reads only."""
        raise NotImplementedError

    def version_key(self, version):
        """A sort key of the vendor's driver versions (newest last)."""
        raise NotImplementedError

    # -- the userspace driver and its bundle (the node's libraries, bound into the containers) ---------------------
    bundle_spec = None  # the options of a bundle (an Ansible argument spec)
    bundle_error = Exception  # what bundle_files raises where the node's driver cannot be gathered

    def bundle_files(self, version, lib_dirs, libs, bin_dirs, bins):
        """[(source, relative path in the bundle, link target or None)] of the driver version's bundle."""
        raise NotImplementedError

    def gather_bundle(self, path, wanted, check=False):
        """Makes the bundle at path hold exactly wanted (bundle_files'); whether it changed."""
        raise NotImplementedError

    gather_fix = None  # the fix a stale bundle's finding names where a run gathers it again

    def driver_step(self, node_version, mode, mount, require_match, check=False):
        """(result, failed): a container's userspace driver made to match the node's (bind: the bundle at mount)."""
        raise NotImplementedError

    # -- a container's device nodes ---------------------------------------------------------------------------------
    required_nodes = ()  # the names a GPU container must have besides its GPUs' own nodes
    gpu_node = None  # a compiled pattern of a GPU's own device node path, group 1 its minor
    device_node = None  # a compiled pattern of any of the vendor's device node paths

    def passthrough_paths(self, gpus, present=None, minors=None):
        """The device node paths a container with these GPU indexes needs (none without GPUs); present: the names of
        the node's control nodes (None where unknown); minors: {GPU index: device minor}."""
        raise NotImplementedError

    def device_numbers(self, path, majors):
        """(major, minor) of one of the vendor's device nodes by its path; majors: /proc/devices' {name: major};
        (None, None) where it cannot be told."""
        raise NotImplementedError

    def container_nodes(self, dev_dir='/dev'):
        """The vendor's device node paths under dev_dir (in a container: those it was given)."""
        raise NotImplementedError

    # -- an OCI engine in a container (_cdi) ---------------------------------------------------------------------
    cdi_kind = None  # the kind of the vendor's GPUs in a CDI spec (vendor.com/class)


class Nvidia(Vendor):
    """NVIDIA: character major 195 and nvidia-uvm's dynamic one (_nvidia_devices), discovery from /dev, /proc and
    nvidia-smi (_nvidia), the kernel module and its packages (_nvidia_kernel), the bundle (_nvidia_bundle), the
    container's userspace (_nvidia_userspace)."""

    name = 'nvidia'
    bundle_spec = _nvidia_bundle.BUNDLE_SPEC
    bundle_error = _nvidia_bundle.BundleError
    gather_fix = _nvidia_bundle.GATHER
    required_nodes = _nvidia_devices.REQUIRED_CONTROL
    gpu_node = _nvidia_devices.GPU_NODE
    device_node = _nvidia_devices.DEVICE_NODE
    cdi_kind = 'nvidia.com/gpu'  # as NVIDIA's container toolkit names them: podman run --device nvidia.com/gpu=all

    def discover_node(self, params, check=False):
        return _nvidia.discover_node(params, check)

    def version_key(self, version):
        return _nvidia_kernel.version_key(version)

    def bundle_files(self, version, lib_dirs, libs, bin_dirs, bins):
        return _nvidia_bundle.bundle_files(version, lib_dirs, libs, bin_dirs, bins)

    def gather_bundle(self, path, wanted, check=False):
        return _nvidia_bundle.gather_bundle(path, wanted, check)

    def driver_step(self, node_version, mode, mount, require_match, check=False):
        return _nvidia_userspace.driver_step(node_version, mode, mount, require_match, check)

    def passthrough_paths(self, gpus, present=None, minors=None):
        return _nvidia_devices.passthrough_paths(gpus, present, minors)

    def device_numbers(self, path, majors):
        return _nvidia_devices.numbers(path, majors)

    def container_nodes(self, dev_dir='/dev'):
        return _nvidia_devices.container_nodes(dev_dir)


VENDORS = {'nvidia': Nvidia()}


class UnknownVendor(ValueError):
    pass


def vendor(name=None):
    """The vendor of that name (the default's where None or empty)."""
    try:
        return VENDORS[name or DEFAULT]
    except KeyError:
        raise UnknownVendor('unknown GPU vendor {0!r} (known: {1})'.format(name, ', '.join(sorted(VENDORS))))


def any_device_node(path):
    """Whether path is a device node of one of the vendors (a raw line binding it is the collection's)."""
    return any(v.device_node.match(path) for v in VENDORS.values())


def discover_node(params, check=False):
    """gpu_devices' entry point: the node discovered by its vendor (params['vendor'], the default's where absent),
    its facts saying which vendor that is."""
    found = vendor(params.get('vendor'))
    out = found.discover_node(params, check)
    facts = out['ansible_facts']['gpufleet_gpu_devices']
    facts['vendor'] = found.name
    # the PCIe path between its GPUs (IOMMU, the bridges above each and their ACS bits), whoever made them
    facts['pcie'] = _pcie.describe(dict((g['index'], _pcie.bus_id(g['pci_bus_id'])) for g in facts.get('gpus') or []
                                        if g.get('index') is not None and g.get('pci_bus_id')),
                                   os.path.join(params.get('root') or '/', 'sys'))
    return out
