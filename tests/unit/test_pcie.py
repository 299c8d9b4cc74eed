"""The PCIe path between a node's GPUs, read from a sysfs laid out as a real node's: two GPUs below one PCIe switch
(root port 00:01.0, the switch's upstream port 01:00.0, its downstream ports 02:00.0 and 02:01.0), a third on
another root port; config spaces with an AER capability first and ACS after it, as real bridges chain them."""

import os
import struct

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _pcie

GPU0, GPU1, GPU2 = '0000:03:00.0', '0000:04:00.0', '0000:81:00.0'
TREE = {GPU0: ['0000:00:01.0', '0000:01:00.0', '0000:02:00.0'], GPU1: ['0000:00:01.0', '0000:01:00.0', '0000:02:01.0'],
        GPU2: ['0000:80:01.0']}
RR_CR = 0x04 | 0x08
SV_UF = 0x01 | 0x10


def config(acs=None):
    """4096 bytes of extended config space: AER (ID 1) at 0x100 pointing at ACS (ID 0xd) at 0x148, or AER alone."""
    data = bytearray(4096)
    struct.pack_into('<I', data, 0x100, 0x0001 | 1 << 16 | (0x148 if acs is not None else 0) << 20)
    if acs is not None:
        struct.pack_into('<I', data, 0x148, 0x000d | 1 << 16)
        struct.pack_into('<HH', data, 0x14c, 0x5f, acs)  # capability, control
    return bytes(data)


def node_sys(root, acs, iommu=True):
    """root/sys with the tree above; acs: {bdf: control bits} (a bridge not named has no ACS capability)."""
    sys_root = os.path.join(str(root), 'sys')
    devices = os.path.join(sys_root, 'bus', 'pci', 'devices')
    os.makedirs(devices)
    for gpu, bridges in TREE.items():
        path = os.path.join(sys_root, 'devices', 'pci{0}:{1}'.format(gpu[:4], bridges[0][5:7]))
        for bdf in bridges + [gpu]:
            path = os.path.join(path, bdf)
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, 'config'), 'wb') as fh:
                fh.write(config(acs.get(bdf)) if bdf != gpu else config())
            if not os.path.lexists(os.path.join(devices, bdf)):
                os.symlink(os.path.relpath(path, devices), os.path.join(devices, bdf))
    for d in (['class/iommu/dmar0'] if iommu else ['class/iommu']) + ['kernel/iommu_groups/{0}'.format(g) for g in
                                                                      range(3 if iommu else 0)]:
        os.makedirs(os.path.join(sys_root, d), exist_ok=True)
    return sys_root


def test_a_switch_that_redirects_peer_to_peer_is_named_between_the_gpus_below_it(tmp_path):
    sys_root = node_sys(tmp_path, {'0000:02:00.0': RR_CR | SV_UF, '0000:02:01.0': RR_CR | SV_UF,
                                   '0000:01:00.0': 0, '0000:00:01.0': SV_UF})
    pcie = _pcie.describe({0: GPU0, 1: GPU1, 2: GPU2}, sys_root)
    assert pcie['iommu'] == {'enabled': True, 'groups': 3}
    assert pcie['gpus'][0] == {'bus_id': GPU0, 'bridges': [
        {'bdf': '0000:02:00.0', 'acs': ['SV', 'RR', 'CR', 'UF']}, {'bdf': '0000:01:00.0', 'acs': []},
        {'bdf': '0000:00:01.0', 'acs': ['SV', 'UF']}]}
    assert pcie['gpus'][2]['bridges'] == [{'bdf': '0000:80:01.0', 'acs': None}]  # no ACS capability
    assert pcie['redirecting'] == ['0000:02:00.0', '0000:02:01.0']
    assert _pcie.p2p_blocked(pcie, [0, 1]) == [
        {'gpus': [0, 1], 'bridge': '0000:02:00.0', 'acs': ['SV', 'RR', 'CR', 'UF']},
        {'gpus': [0, 1], 'bridge': '0000:02:01.0', 'acs': ['SV', 'RR', 'CR', 'UF']}]
    assert _pcie.p2p_blocked(pcie, [0]) == [] and _pcie.p2p_blocked(pcie, [0, 2])[0]['bridge'] == '0000:02:00.0'


def test_a_switch_that_lets_peer_to_peer_through_blocks_nothing(tmp_path):
    sys_root = node_sys(tmp_path, {'0000:02:00.0': SV_UF, '0000:02:01.0': SV_UF, '0000:00:01.0': RR_CR}, iommu=False)
    pcie = _pcie.describe({0: GPU0, 1: GPU1}, sys_root)
    assert pcie['iommu'] == {'enabled': False, 'groups': 0}
    # the root port above both redirects, but a transfer between the two turns in the switch below it
    assert pcie['redirecting'] == ['0000:00:01.0'] and _pcie.p2p_blocked(pcie, [0, 1]) == []


def test_a_gpu_sysfs_does_not_have_is_unknown_not_blocked(tmp_path):
    sys_root = node_sys(tmp_path, {})
    pcie = _pcie.describe({0: GPU0, 7: '0000:99:00.0'}, sys_root)
    assert pcie['gpus'][7] == {'bus_id': '0000:99:00.0', 'bridges': None}
    assert _pcie.p2p_blocked(pcie, [0, 7]) == []
    unreadable = tmp_path / 'cfg'
    unreadable.mkdir()
    assert _pcie.acs_control(str(unreadable), GPU0) is None
