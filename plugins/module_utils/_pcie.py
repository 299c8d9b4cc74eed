# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The PCIe path between a node's GPUs, as its sysfs shows it: whether the IOMMU is on, the bridges above each GPU
and their Access Control Services (ACS) control bits. A bridge that redirects peer-to-peer requests or completions
(ACS RR, CR) sends every transfer between two GPUs below it up to the root complex, where the IOMMU may refuse it:
NCCL then falls back to shared memory or the network, at a fraction of the speed. Standard library only; no GPU
vendor's knowledge (the GPUs are named by their PCI bus ids).

The ACS extended capability (ID 0x000d) and its control register's bits are as the PCI Express Base Specification
lays them out, and as Linux's drivers/pci/pci.c and include/uapi/linux/pci_regs.h (PCI_ACS_*) read them: the control
register is the 16 bits at offset 6 of the capability.
"""


import os
import re
import struct

BDF = re.compile(r'^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$')
ACS_ID = 0x000d
# PCI_ACS_SV, TB, RR, CR, UF, EC, DT: the control register's bits, by name
ACS_BITS = (('SV', 0x01), ('TB', 0x02), ('RR', 0x04), ('CR', 0x08), ('UF', 0x10), ('EC', 0x20), ('DT', 0x40))
REDIRECTS = ('RR', 'CR')


def bus_id(text):
    """A PCI bus id as the kernel names it ('0000:18:00.0'), from a longer domain ('00000000:18:00.0', nvidia-smi's)."""
    parts = str(text).strip().lower().split(':')
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, '0')
    return ':'.join(parts)


def iommu(sys_root='/sys'):
    """{'enabled': whether an IOMMU translates DMA (an entry in /sys/class/iommu), 'groups': how many IOMMU groups}."""
    def count(path):
        try:
            return len(os.listdir(path))
        except OSError:
            return 0
    return {'enabled': count(os.path.join(sys_root, 'class', 'iommu')) > 0,
            'groups': count(os.path.join(sys_root, 'kernel', 'iommu_groups'))}


def upstream(sys_root, bdf):
    """The bridges above the device bdf, nearest first (None where sysfs does not have it): its sysfs path's parents."""
    real = os.path.realpath(os.path.join(sys_root, 'bus', 'pci', 'devices', bdf))
    if not os.path.isdir(real):
        return None
    parts = [p for p in real.split(os.sep) if BDF.match(p)]
    return list(reversed(parts[:-1])) if parts and parts[-1] == bdf else None


def acs_control(sys_root, bdf):
    """The names of the ACS control bits set on bdf (its config space's ACS capability), [] where it has ACS with none
    set, None where it has no ACS capability or its extended config space cannot be read (not root)."""
    try:
        with open(os.path.join(sys_root, 'bus', 'pci', 'devices', bdf, 'config'), 'rb') as fh:
            config = fh.read(4096)
    except (IOError, OSError):
        return None
    offset, seen = 0x100, set()
    while 0x100 <= offset <= len(config) - 8 and offset not in seen:
        seen.add(offset)
        header = struct.unpack_from('<I', config, offset)[0]
        if header in (0, 0xffffffff):
            return None
        if header & 0xffff == ACS_ID:
            control = struct.unpack_from('<H', config, offset + 6)[0]
            return [name for name, bit in ACS_BITS if control & bit]
        offset = header >> 20 & 0xffc
    return None


def describe(bus_ids, sys_root='/sys'):
    """What the node's PCIe says about its GPUs (bus_ids: {index: PCI bus id as /proc writes it}): {iommu, gpus:
    {index: {bus_id, bridges: [{bdf, acs}]}}, redirecting: [bridges above some GPU whose ACS redirects peer to peer]}.
    A GPU sysfs does not have (a lab's stand-in) has bridges None."""
    gpus, redirecting = {}, set()
    for index, bus in sorted(bus_ids.items()):
        above = upstream(sys_root, bus)
        bridges = None if above is None else [{'bdf': b, 'acs': acs_control(sys_root, b)} for b in above]
        gpus[index] = {'bus_id': bus, 'bridges': bridges}
        redirecting.update(b['bdf'] for b in bridges or [] if set(b['acs'] or ()) & set(REDIRECTS))
    return {'iommu': iommu(sys_root), 'gpus': gpus, 'redirecting': sorted(redirecting)}


def p2p_blocked(pcie, indexes):
    """The pairs of GPUs (of indexes, given to one container) whose transfers a redirecting bridge sends up to the
    root complex: [{gpus: [a, b], bridge, acs}] for each bridge above one of the two that is below their nearest
    common bridge (the switch port each goes through). Unknown paths are left out."""
    out = []
    known = dict((i, (pcie.get('gpus') or {}).get(i) or (pcie.get('gpus') or {}).get(str(i))) for i in indexes)
    chosen = sorted(i for i in indexes if (known[i] or {}).get('bridges') is not None)
    for n, a in enumerate(chosen):
        for b in chosen[n + 1:]:
            up_a, up_b = known[a]['bridges'], known[b]['bridges']
            common = set(x['bdf'] for x in up_a) & set(x['bdf'] for x in up_b)
            for bridge in [x for x in up_a if x['bdf'] not in common] + [x for x in up_b if x['bdf'] not in common]:
                if set(bridge['acs'] or ()) & set(REDIRECTS):
                    out.append({'gpus': [a, b], 'bridge': bridge['bdf'], 'acs': bridge['acs']})
    return out
