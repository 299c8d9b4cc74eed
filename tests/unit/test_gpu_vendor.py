# -*- coding: utf-8 -*-
"""The GPU vendor seam (module_utils _gpu): every vendor implements the whole interface, nothing outside a vendor's
own files reaches into them, and a second vendor plugs in without the fleet, the reconcile, the node's raw lines or
the drift knowing more than its name."""

import ast
import os
import re

import pytest

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _gpu, _pveconf
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _drift, _fleet

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))

# the NVIDIA driver's rolling upgrade is NVIDIA's alone (Debian's nvidia-driver packages, NVIDIA's installer): its
# planner and the action that runs it are the vendor's own files, as the _nvidia* module_utils are
VENDOR_OWN = re.compile(r'(^|/)_nvidia[a-z_]*\.py$|^plugins/action/driver_upgrade_plan\.py$')


def interface():
    return [name for name in vars(_gpu.Vendor) if not name.startswith('_')]


def test_every_vendor_implements_the_whole_interface():
    assert set(interface()) >= {'discover_node', 'passthrough_paths', 'device_numbers', 'container_nodes',
                                'bundle_files', 'gather_bundle', 'driver_step', 'version_key'}
    for name, vendor in _gpu.VENDORS.items():
        assert vendor.name == name
        for member in interface():
            mine = getattr(type(vendor), member)
            assert mine is not getattr(_gpu.Vendor, member) or member == 'bundle_error', (name, member)
            assert mine is not None, (name, member)


def test_an_unknown_vendor_is_refused_by_name():
    with pytest.raises(_gpu.UnknownVendor, match=r"unknown GPU vendor 'amd' \(known: nvidia\)"):
        _gpu.vendor('amd')
    assert _gpu.vendor() is _gpu.vendor('nvidia') is _gpu.VENDORS['nvidia']


def test_nothing_outside_a_vendors_own_files_imports_them():
    found = []
    for top in ('plugins', 'src'):
        for dirpath, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if not name.endswith('.py'):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, ROOT)
                if VENDOR_OWN.search(rel) or rel == 'plugins/module_utils/_gpu.py':
                    continue
                with open(path) as fh:
                    tree = ast.parse(fh.read())
                for node in ast.walk(tree):
                    names = []
                    if isinstance(node, ast.ImportFrom):
                        names = [node.module or ''] + [a.name for a in node.names]
                    elif isinstance(node, ast.Import):
                        names = [a.name for a in node.names]
                    found.extend((rel, n) for n in names if re.search(r'(^|\.)_nvidia', n))
    assert found == []


class Toy(_gpu.Vendor):
    """A second vendor, laid out as AMD's ROCm is: one /dev/kfd for compute, a render node per GPU (major 226,
    minors from 128)."""

    name = 'toy'
    bundle_spec = {}
    gather_fix = 'gather the toy bundle again'
    required_nodes = ('kfd',)
    gpu_node = re.compile(r'^/dev/dri/renderD(\d+)$')
    device_node = re.compile(r'^/dev/(kfd|dri/)')
    cdi_kind = 'amd.com/gpu'

    def discover_node(self, params, check=False):
        return {'changed': False, 'ansible_facts': {'gpufleet_gpu_devices': {}}}

    def version_key(self, version):
        return [int(p) for p in version.split('.')]

    def bundle_files(self, version, lib_dirs, libs, bin_dirs, bins):
        return []

    def gather_bundle(self, path, wanted, check=False):
        return False

    def driver_step(self, node_version, mode, mount, require_match, check=False):
        return {'changed': False}, False

    def passthrough_paths(self, gpus, present=None, minors=None):
        minors = minors or {}
        return ['/dev/dri/renderD{0}'.format(minors.get(g, 128 + g)) for g in gpus] + (['/dev/kfd'] if gpus else [])

    def device_numbers(self, path, majors):
        m = self.gpu_node.match(path)
        if m:
            return 226, int(m.group(1))
        return (majors.get('kfd'), 0) if path == '/dev/kfd' else (None, None)

    def container_nodes(self, dev_dir='/dev'):
        return []


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(_gpu.VENDORS, 'toy', Toy())
    return _gpu.VENDORS['toy']


def test_a_second_vendor_plugs_in_and_the_fleet_asks_it_for_its_nodes_devices(toy, tmp_path):
    entry = {'vmid': 300, 'hostname': 'rocm', 'node': 'mi01', 'gpus': [1]}
    nvidia = {'vmid': 301, 'hostname': 'cuda', 'node': 'gpu01', 'gpus': [1]}
    nodes = {'mi01': {'indexes': [0, 1], 'majors': {'kfd': 235}, 'minors': {0: 128, 1: 129}, 'vendor': 'toy'},
             'gpu01': {'indexes': [0, 1], 'majors': {'nvidia-uvm': 509}, 'minors': {0: 0, 1: 1}}}
    fleet = _fleet.Fleet([entry, nvidia], nodes)
    assert [d['path'] for d in fleet.device_nodes(entry)] == ['/dev/dri/renderD129', '/dev/kfd']
    # a node of no stated vendor is the default's (NVIDIA), beside it in the same fleet
    assert [d['path'] for d in fleet.device_nodes(nvidia)][:2] == ['/dev/nvidia1', '/dev/nvidiactl']
    raw = fleet.raw('raw')
    assert raw['mi01'][300] == ['lxc.cgroup2.devices.allow: c 226:129 rw',
                                'lxc.mount.entry: /dev/dri/renderD129 dev/dri/renderD129 none bind,optional,create=file',
                                'lxc.cgroup2.devices.allow: c 235:0 rw',
                                'lxc.mount.entry: /dev/kfd dev/kfd none bind,optional,create=file']
    assert 'lxc.cgroup2.devices.allow: c 195:1 rw' in raw['gpu01'][301]
    # the node's raw lines of that vendor's devices are the collection's, and its GPUs' holders are read by its pattern
    owned = _pveconf.ours(_gpu.any_device_node)
    assert owned(('lxc.mount.entry', '/dev/kfd dev/kfd none bind,optional,create=file'))
    assert owned(('lxc.mount.entry', '/dev/nvidia0 dev/nvidia0 none bind,optional,create=file'))
    assert not owned(('lxc.mount.entry', '/srv/data srv/data none bind 0 0'))
    (tmp_path / '300.conf').write_text('hostname: rocm\ndev0: /dev/dri/renderD129\ndev1: /dev/kfd\n')
    assert _pveconf.gpu_holders(str(tmp_path), toy.gpu_node) == {
        '/dev/dri/renderD129': [{'vmid': 300, 'name': 'rocm'}]}
    # drift: its bundle's fix is one a run makes; a devN of its node no longer wanted is named as a GPU's
    assert _drift.mended_by_a_run({'code': 'bundle_stale', 'fix': toy.gather_fix})
    assert not _drift.mended_by_a_run({'code': 'bundle_stale', 'fix': 'reinstall the driver'})
    # discovery: the vendor's facts, its name, and its GPUs' PCIe path (none here: the toy discovers no GPU)
    assert _gpu.discover_node({'vendor': 'toy', 'root': str(tmp_path)}) == {
        'changed': False, 'ansible_facts': {'gpufleet_gpu_devices': {'vendor': 'toy', 'pcie': {
            'iommu': {'enabled': False, 'groups': 0}, 'gpus': {}, 'redirecting': []}}}}
