# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVIDIA userspace driver in a container: the driver bundle bound in and put on the loader's path (bind mode), or
the libcuda the container's loader finds read (read mode), checked against the node's kernel module version
(standard library only: it runs with the container's system Python).
"""


import os
import re
import subprocess

from ansible_collections.gpufleet.proxmox.plugins.module_utils._files import read_text, replace_link, write_text


LOADER_CONF = '/etc/ld.so.conf.d/000-gpufleet-nvidia.conf'


# /usr/bin, where NVIDIA's container toolkit puts it too: `pct exec` runs commands with PATH=/sbin:/bin:/usr/sbin:/usr/bin
# (pve-common src/PVE/CLIHandler.pm), so a link in /usr/local/bin would not be found by `pct exec CT -- nvidia-smi`
SMI_LINK = '/usr/bin/nvidia-smi'


LIBCUDA_RE = re.compile(r'^\s*libcuda\.so\.1 \(([^)]*)\) => (\S+)$')


def loaded_libcuda(ldconfig='ldconfig'):
    """The libcuda.so.1 the loader resolves (its real file) and the driver version its file name carries,
    or (None, None): the first 64-bit entry of `ldconfig -p`, as the loader takes it."""
    try:
        out = subprocess.run([ldconfig, '-p'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    except OSError:
        return None, None
    for line in out.stdout.decode('utf-8', 'replace').splitlines():
        m = LIBCUDA_RE.match(line)
        if m and ('x86-64' in m.group(1) or 'AArch64' in m.group(1)):
            real = os.path.realpath(m.group(2))
            name = os.path.basename(real)
            version = name[len('libcuda.so.'):] if name.startswith('libcuda.so.') else None
            return real, version or None
    return None, None


def bind_userspace(mount, check=False, conf=LOADER_CONF, smi_link=SMI_LINK, ldconfig='ldconfig'):
    """A container's loader pointed at the node's driver bundle bound in at mount (mount/lib, and nvidia-smi
    linked from mount/bin); the loader's cache refreshed when its config changed. Returns what changed."""
    changed = []
    want = '{0}/lib\n'.format(mount.rstrip('/'))
    if read_text(conf) != want:
        changed.append(conf)
        if not check:
            write_text(conf, want)
            done = subprocess.run([ldconfig], check=False, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if done.returncode != 0:
                raise OSError('{0} failed: {1}'.format(ldconfig, done.stderr.decode('utf-8', 'replace').strip()))
    target = '{0}/bin/nvidia-smi'.format(mount.rstrip('/'))
    if not (os.path.islink(smi_link) and os.readlink(smi_link) == target):
        changed.append(smi_link)
        if not check:
            replace_link(smi_link, target)
    return changed


def userspace_driver(node_version, mode='bind', mount=None, check=False, ldconfig='ldconfig'):
    """A container's NVIDIA userspace driver against its node's kernel module: in bind mode the loader is first
    pointed at the bound-in bundle (in check mode only reported). Returns {node_version, version, library,
    match, changed_files}."""
    changed = bind_userspace(mount, check, ldconfig=ldconfig) if mode == 'bind' else []
    library, version = loaded_libcuda(ldconfig)  # in check mode: what the container loads now
    return {'node_version': node_version, 'version': version, 'library': library,
            'match': version is not None and version == node_version, 'changed_files': changed}


def driver_step(node_version, mode='bind', mount=None, require_match=False, check=False):
    """The driver step of a container (the userspace_driver module's, and venv_build's where it makes the driver in
    the same call): userspace_driver's result with changed, and msg where require_match and the versions differ.
    Returns (result, failed): a mismatch fails the step, except in check mode, where it is reported as a change."""
    result = userspace_driver(node_version, mode, mount, check)
    result['changed'] = bool(result['changed_files'])
    if require_match and not result['match']:
        result['msg'] = ('driver mismatch: the container loads libcuda {0} ({1}) but its node runs kernel module {2}; '
                         'NVML would answer "Driver/library version mismatch"').format(
                             result['version'] or 'none', result['library'] or 'not found', node_version)
        if not check:
            return result, True
        result['changed'] = True
    return result, False
