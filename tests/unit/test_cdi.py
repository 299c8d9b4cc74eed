"""The CDI spec of a container's GPUs, made from a /dev and a driver bundle laid out as a container has them (the
container's own nodes, the bundle bound in at /opt/nvidia-driver): what an engine gets, and a spec of another driver or
of other GPUs found stale."""

import json
import os

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _cdi, _gpu

NVIDIA = _gpu.vendor('nvidia')


def container(root, gpus=(2, 5), version='580.95.05'):
    """A container's /dev (GPU nodes by minor, the control nodes) and its bundle: (dev, mount)."""
    dev = root / 'dev'
    dev.mkdir(parents=True)
    for name in ['nvidia{0}'.format(m) for m in gpus] + ['nvidiactl', 'nvidia-uvm', 'nvidia-uvm-tools']:
        (dev / name).write_text('')  # the spec reads paths only; the engine reads the real node's numbers
    (dev / 'nvidia-caps').mkdir()
    mount = root / 'opt' / 'nvidia-driver'
    (mount / 'lib').mkdir(parents=True)
    (mount / 'bin').mkdir()
    for name, soname in (('libcuda', 'libcuda.so.1'), ('libnvidia-ml', 'libnvidia-ml.so.1'),
                         ('libnvidia-ptxjitcompiler', 'libnvidia-ptxjitcompiler.so.1')):
        (mount / 'lib' / '{0}.so.{1}'.format(name, version)).write_text('')
        os.symlink('{0}.so.{1}'.format(name, version), str(mount / 'lib' / soname))
    (mount / 'bin' / 'nvidia-smi').write_text('')
    return str(dev), str(mount)


def test_the_spec_gives_each_gpu_all_of_them_the_control_nodes_and_the_drivers_files(tmp_path):
    dev, mount = container(tmp_path)
    spec = _cdi.of_container(NVIDIA, mount, dev, machine='x86_64')
    assert spec['cdiVersion'] == '0.5.0' and spec['kind'] == 'nvidia.com/gpu'
    # numbered as the container numbers them (by minor), and all of them
    assert [(d['name'], [n['path'] for n in d['containerEdits']['deviceNodes']]) for d in spec['devices']] == [
        ('0', ['/dev/nvidia2']), ('1', ['/dev/nvidia5']), ('all', ['/dev/nvidia2', '/dev/nvidia5'])]
    edits = spec['containerEdits']
    assert [n['path'] for n in edits['deviceNodes']] == ['/dev/nvidia-uvm', '/dev/nvidia-uvm-tools', '/dev/nvidiactl']
    lib = mount + '/lib/'
    assert [(m['hostPath'], m['containerPath']) for m in edits['mounts']] == [
        (lib + 'libcuda.so.580.95.05', '/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05'),
        (lib + 'libcuda.so.580.95.05', '/usr/lib/x86_64-linux-gnu/libcuda.so.1'),
        (lib + 'libnvidia-ml.so.580.95.05', '/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05'),
        (lib + 'libnvidia-ml.so.580.95.05', '/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1'),
        (lib + 'libnvidia-ptxjitcompiler.so.580.95.05',
         '/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.580.95.05'),
        (lib + 'libnvidia-ptxjitcompiler.so.580.95.05', '/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1'),
        (mount + '/bin/nvidia-smi', '/usr/bin/nvidia-smi')]
    assert all(m['options'] == ['ro', 'nosuid', 'nodev', 'bind'] for m in edits['mounts'])
    assert _cdi.spec_path('nvidia.com/gpu') == '/etc/cdi/nvidia.com-gpu.json'


def test_a_spec_of_another_driver_or_of_other_gpus_is_stale_and_apply_makes_it_current(tmp_path):
    dev, mount = container(tmp_path / 'now')
    path = str(tmp_path / 'etc' / 'cdi' / 'nvidia.com-gpu.json')
    first = _cdi.apply(NVIDIA, mount, path, dev, check=True)
    assert first['changed'] and [f['check'] for f in first['findings']] == ['cdi_missing'] and not os.path.exists(path)
    done = _cdi.apply(NVIDIA, mount, path, dev)
    assert done['changed'] and json.loads(open(path).read()) == done['spec']
    assert _cdi.apply(NVIDIA, mount, path, dev) == dict(done, changed=False, findings=[])
    # the spec an engine read before the node's driver moved to 580.95.05, and of a container that had GPU 3
    _dev, old_mount = container(tmp_path / 'before', gpus=(2, 3), version='570.172.08')
    old = _cdi.of_container(NVIDIA, old_mount, _dev)
    for m in old['containerEdits']['mounts']:
        m['hostPath'] = m['hostPath'].replace(old_mount, mount)
    with open(path, 'w') as fh:
        fh.write(_cdi.text(old))
    stale = _cdi.apply(NVIDIA, mount, path, dev, check=True)
    assert stale['findings'] == [
        {'check': 'cdi_stale', 'msg': 'the CDI spec mounts libcuda.so.570.172.08, libnvidia-ml.so.570.172.08, '
                                      'libnvidia-ptxjitcompiler.so.570.172.08 that the driver bound in no longer has '
                                      '(a spec of another driver)'},
        {'check': 'cdi_devices', 'msg': 'the CDI spec gives /dev/nvidia2, /dev/nvidia3, the container has '
                                        '/dev/nvidia2, /dev/nvidia5'}]
    assert _cdi.text(old) == open(path).read()  # check mode wrote nothing
    assert _cdi.apply(NVIDIA, mount, path, dev)['changed'] and _cdi.apply(NVIDIA, mount, path, dev)['findings'] == []
    with open(path, 'w') as fh:
        fh.write('{')
    assert [f['check'] for f in _cdi.apply(NVIDIA, mount, path, dev)['findings']] == ['cdi_unreadable']
