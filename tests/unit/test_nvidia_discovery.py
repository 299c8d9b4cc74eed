"""gpu_devices' discovery on a node laid out here as NVIDIA's driver makes one (tests/unit/fixtures.py: /proc/devices,
/proc/driver/nvidia, character nodes made with mknod, an nvidia-smi that lists the GPUs): the GPUs joined to their
device minors through the PCI bus id, and each stale or missing node found with its fix."""

import os

import pytest

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _devnodes, _nvidia, _nvidia_devices

from fixtures import nvidia_node

# nvidia-smi index 0 is the GPU on bus 0000:3b:00.0, whose device node is /dev/nvidia1 (its minor), and index 1 the
# one on 0000:18:00.0 at /dev/nvidia0: the driver numbers minors in probe order, CUDA and nvidia-smi by bus order
# (CUDA_DEVICE_ORDER=PCI_BUS_ID) or as the driver enumerates. Each must be read, never assumed equal.
CROSSED = [(0, '0000:3b:00.0', 1), (1, '0000:18:00.0', 0)]


def test_gpus_are_joined_to_their_device_minor_through_the_pci_bus_id(tmp_path):
    dev, proc, smi = nvidia_node(str(tmp_path), CROSSED)
    found = _nvidia.discover(dev_dir=dev, proc_root=proc, smi=smi)
    assert found['findings'] == []
    assert [(g['index'], g['minor'], g['pci_bus_id']) for g in found['gpus']] == [
        (0, 1, '00000000:3B:00.0'), (1, 0, '00000000:18:00.0')]
    assert found['indexes'] == [0, 1] and found['uvm_major'] == 511 and found['driver_version'] == '550.163.01'
    assert _nvidia.driver_minors(proc) == {'0000:3b:00.0': 1, '0000:18:00.0': 0}
    # what a container given GPU index 0 gets passed through: the node of minor 1
    minors = dict((g['index'], g['minor']) for g in found['gpus'])
    assert _nvidia_devices.passthrough_paths([0], ['nvidiactl', 'nvidia-uvm'], minors) == [
        '/dev/nvidia1', '/dev/nvidiactl', '/dev/nvidia-uvm']


def test_a_gpu_nvidia_smi_lists_without_its_node_is_named_by_index_and_node(tmp_path):
    dev, proc, smi = nvidia_node(str(tmp_path), CROSSED)
    os.remove(os.path.join(dev, 'nvidia0'))  # the node of index 1
    found = _nvidia.discover(dev_dir=dev, proc_root=proc, smi=smi)
    assert [(f['code'], f['fix']) for f in found['findings']] == [('gpu_nodes_missing', 'nvidia-modprobe -c 0')]
    assert '[1]' in found['findings'][0]['msg'] and '/dev/nvidia0' in found['findings'][0]['msg']


@pytest.mark.parametrize('major, minors, stale', [(510, (0, 1), ['nvidia-uvm', 'nvidia-uvm-tools']),
                                                  (511, (0, 7), ['nvidia-uvm-tools']),
                                                  (511, (1, 0), ['nvidia-uvm', 'nvidia-uvm-tools'])])
def test_a_uvm_node_left_from_before_a_reload_is_stale_by_its_major_or_its_minor(tmp_path, major, minors, stale):
    dev, proc, smi = nvidia_node(str(tmp_path), CROSSED, uvm_major=major, uvm_minors=minors)
    with open(os.path.join(proc, 'devices'), 'w') as fh:  # the module reloaded: its major is now 511
        fh.write('Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n')
    found = _nvidia.discover(dev_dir=dev, proc_root=proc, smi=smi)
    assert [(f['code'], f['node']) for f in found['findings']] == [('uvm_node_stale', n) for n in stale]
    assert found['findings'][0]['fix'] == 'rm {0}/{1} && nvidia-modprobe -u -c 0'.format(dev, stale[0])


def test_a_containers_config_lines_carry_the_uvm_major_the_node_has_now(tmp_path):
    dev, proc, _smi = nvidia_node(str(tmp_path), CROSSED, uvm_major=236, smi=False)
    majors = _devnodes.char_majors(proc)
    assert _nvidia_devices.numbers('/dev/nvidia-uvm', majors) == (236, 0)
    assert _nvidia_devices.numbers('/dev/nvidia-uvm-tools', majors) == (236, 1)
    assert _nvidia_devices.numbers('/dev/nvidia1', majors) == (195, 1)
    assert _nvidia_devices.numbers('/dev/nvidiactl', majors) == (195, 255)
    assert _nvidia_devices.numbers('/dev/nvidia-uvm', {}) == (None, 0)  # not loaded: no rule for a major not known


def test_no_driver_loaded_is_a_finding_unless_the_node_may_have_none(tmp_path):
    dev, proc = str(tmp_path / 'dev'), str(tmp_path / 'proc')
    os.makedirs(dev)
    os.makedirs(proc)
    found = _nvidia.discover(dev_dir=dev, proc_root=proc)
    assert [f['code'] for f in found['findings']] == ['driver_not_loaded', 'nvidiactl_missing', 'uvm_not_loaded']
    assert _nvidia.discover(dev_dir=dev, proc_root=proc, driver_optional=True)['findings'] == []
