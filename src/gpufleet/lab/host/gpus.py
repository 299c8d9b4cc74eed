"""The lab's stand-in GPUs: NVIDIA device nodes with the kernel's numbers, /proc entries, a stand-in userspace
driver and nvidia-smi."""

import glob
import json
import os
import re
import shutil
import sys
from ..layout import NODE

from . import debnode
from ._util import LabError, _read, _write, sh, version_key


# -- GPU stand-ins ------------------------------------------------------------------
def real_nvidia(dev_dir):
    return bool(glob.glob(os.path.join(dev_dir, 'nvidia[0-9]*'))) or os.path.exists('/proc/driver/nvidia/version')


def free_dynamic_major(exclude=()):
    """A character major that /proc/devices does not list (nor exclude), from the top of the dynamic range down,
    the way the kernel hands one to nvidia-uvm."""
    used = set(exclude)
    with open('/proc/devices') as fh:
        for line in fh:
            if line.startswith('Block'):
                break
            parts = line.split()
            if parts and parts[0].isdigit():
                used.add(int(parts[0]))
    for major in list(range(511, 383, -1)) + list(range(254, 233, -1)):
        if major not in used:
            return major
    raise LabError('no free character device major for the nvidia-uvm stand-in')


def gpu_record_key(lab):
    """Where the host record keeps this node's GPU stand-ins: 'gpus' for the first node, 'gpus:<node>' for others."""
    return 'gpus' if lab.node == NODE else 'gpus:' + lab.node


def ensure_gpus(lab, record, say):
    """The node's N /dev/nvidiaN (195:minor), nvidiactl (195:255), nvidia-modeset (195:254), nvidia-uvm and
    nvidia-uvm-tools on a dynamic major, listed in the node's /proc/devices with the stand-in driver's
    version file. Made only where no real NVIDIA device nodes exist; a node without GPUs has no NVIDIA driver."""
    key = gpu_record_key(lab)
    gpus = record.get(key)
    if gpus is None:
        if real_nvidia(lab.dev_dir):
            say('real NVIDIA device nodes found: the lab uses them and makes no stand-ins')
            record[key] = {'real': True, 'created': [], 'nodes': []}
            return
        uvm = free_dynamic_major()
        nodes = [('nvidia{0}'.format(i), 195, i) for i in range(lab.gpus)]
        if lab.gpus:
            nodes += [('nvidiactl', 195, 255), ('nvidia-modeset', 195, 254), ('nvidia-uvm', uvm, 0),
                      ('nvidia-uvm-tools', uvm, 1)]
        gpus = record[key] = {'real': False, 'created': [], 'uvm_major': uvm if lab.gpus else None,
                              'count': lab.gpus, 'nodes': [[os.path.join(lab.dev_dir, n), ma, mi] for n, ma, mi in nodes]}
    os.makedirs(lab.dev_dir, exist_ok=True)
    for path, major, minor in gpus['nodes']:
        # /dev is rebuilt at boot: make again whatever is gone.
        if not os.path.exists(path):
            os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
            os.chmod(path, 0o666)
            if path not in gpus['created']:
                gpus['created'].append(path)
    if not gpus['real']:
        write_proc(lab, gpus['uvm_major'])
    ensure_commands(lab)


def node_command(lab, path, *words):
    """One of the node's own commands (at path: apt-get, dkms, NVIDIA's installer...), the lab's stand-in for it:
    gpufleet.lab.nodecmd with words, run by the lab's Python as this node."""
    text = ('#!/bin/sh\n# gpufleet lab: {0} of lab node {1}\n'
            'GPUFLEET_LAB_DIR={2} GPUFLEET_LAB_NODE={1} exec {3} -m gpufleet.lab.nodecmd {4} "$@"\n').format(
                os.path.basename(path), lab.node, lab.root, sys.executable, ' '.join(words))
    _write(path, text.encode(), 0o755)


def ensure_commands(lab):
    """The node's commands for its driver's life in its bin_dir: on a Debian node Debian's own apt-get, apt-cache,
    apt-mark, dpkg and dkms run in its root (debnode), on the others the lab's stand-ins; the lab's reboot on both
    (the kernel side stays the lab's)."""
    if lab.debian:
        debnode.write_commands(lab.node_files, lab, lab.bin_dir)
    else:
        for name in ('apt-get', 'apt-cache', 'apt-mark', 'dkms'):
            node_command(lab, os.path.join(lab.bin_dir, name), name)
    node_command(lab, os.path.join(lab.bin_dir, 'reboot'), 'reboot')


NVIDIA_SMI = """#!/bin/sh
# gpufleet lab: nvidia-smi for the GPU stand-ins (no GPU, no driver behind them). Like NVIDIA's, it talks to the
# loaded kernel module: none loaded, or one of another version than this userspace, and it fails as NVIDIA's does.
# (In a container, where the node's stand-in /proc is not, it cannot tell, and answers.)
version={version}
count={count}
cards="{cards}"
loaded=$(sed -n 's/.*Kernel Module  *\\([0-9.]*\\).*/\\1/p' {proc}/driver/nvidia/version 2>/dev/null)
if [ ! -d {proc} ]; then
  loaded=$version
elif [ -z "$loaded" ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
  exit 9
elif [ "$loaded" != "$version" ]; then
  echo "Failed to initialize NVML: Driver/library version mismatch"
  echo "NVML library version: ${{version%.*}}"
  exit 18
fi
case "$*" in
  *--query-gpu=*)
    fields=$(printf '%s\n' "$@" | sed -n 's/^--query-gpu=//p')
    i=0
    while [ $i -lt $count ]; do
      line=""
      for f in $(echo "$fields" | tr ',' ' '); do
        case $f in
          index) v=$i ;;
          pci.bus_id) v=$(printf '00000000:%02X:00.0' $((0x18 + i * 0x10))) ;;
          uuid) v=$(printf 'GPU-1ab0c0de-0000-4000-8000-%012d' $(echo $cards | cut -d' ' -f$((i + 1)))) ;;
          name) v="NVIDIA H100 80GB HBM3 (lab stand-in)" ;;
          driver_version) v=$version ;;
          *) v="[N/A]" ;;
        esac
        line="${{line:+$line, }}$v"
      done
      echo "$line"
      i=$((i + 1))
    done ;;
  *--version*) echo "NVIDIA-SMI version  : $version"; echo "DRIVER version      : $version" ;;
  *) echo "NVIDIA-SMI $version   Driver Version: $version   (lab stand-in, $count GPUs)" ;;
esac
"""


def cards_file(lab):
    return os.path.join(lab.node_root, 'gpu-cards.json')


def cards(lab):
    """The serial of the card in each of the node's GPU slots (slot i: PCI bus 0x18 + 0x10 * i, nvidia-smi index i),
    its UUID's last part: the slot's own number unless cards were swapped (swap_cards)."""
    try:
        with open(cards_file(lab)) as fh:
            serials = json.load(fh)
    except (IOError, OSError, ValueError):
        serials = None
    return serials if isinstance(serials, list) and len(serials) == lab.gpus else list(range(lab.gpus))


def swap_cards(lab, a, b):
    """Swap the cards in slots a and b of the node (what its driver and nvidia-smi say from its next boot on)."""
    if not (0 <= a < lab.gpus and 0 <= b < lab.gpus):
        raise LabError('node {0} has GPU slots 0 to {1}, not {2} and {3}'.format(lab.node, lab.gpus - 1, a, b))
    serials = cards(lab)
    serials[a], serials[b] = serials[b], serials[a]
    with open(cards_file(lab), 'w') as fh:
        json.dump(serials, fh)
    return serials


def device_minor(index, count):
    """The device minor (/dev/nvidiaN) the lab's driver gives the GPU that nvidia-smi lists at index. On a real node
    they need not agree: the driver numbers the GPUs in the order it probes them at boot, nvidia-smi (and CUDA with
    CUDA_DEVICE_ORDER=PCI_BUS_ID) counts them in PCI bus order (NVIDIA/nvidia-docker issues 1432 and 376,
    NVIDIA/nvidia-installer issue 21). The lab's driver probes them in reverse bus order, so that only code that
    reads the minor the driver reports finds a GPU's node."""
    return count - 1 - index


def write_proc(lab, uvm_major, boot=False):
    """The node's /proc as its NVIDIA driver shows it (none where the node has no GPUs, or where the kernel it runs
    has no NVIDIA module to load), its nvidia-smi and its userspace driver's libraries (installed_version). The
    loaded module stays what it is until a boot (boot=True), which loads the module installed for the kernel the
    node runs, of whatever version that is (module_version)."""
    os.makedirs(lab.proc_dir, exist_ok=True)
    if lab.gpus:
        ensure_kernel(lab)
    version_file = os.path.join(lab.proc_dir, 'driver', 'nvidia', 'version')
    loaded = None
    if lab.gpus:
        loaded = loaded_version(lab) if not boot and os.path.exists(version_file) else boot_module(lab)
    ensure_boot_id(lab)
    with open(os.path.join(lab.proc_dir, 'devices'), 'w') as fh:
        fh.write('Character devices:\n  1 mem\n  5 /dev/tty\n136 pts\n' +
                 ('195 nvidia-frontend\n{0} nvidia-uvm\n'.format(uvm_major) if loaded else '') +
                 '\nBlock devices:\n  7 loop\n')
    with open(os.path.join(lab.proc_dir, 'modules'), 'w') as fh:
        fh.write('nvidia_uvm 1966080 0 - Live 0x0000000000000000 (PO)\n'
                 'nvidia_modeset 1568768 0 - Live 0x0000000000000000 (PO)\n'
                 'nvidia 104071168 2 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (PO)\n' if loaded else '')
    if lab.gpus:
        write_userspace(lab)
    if not loaded:
        shutil.rmtree(os.path.join(lab.proc_dir, 'driver', 'nvidia'), ignore_errors=True)
        return
    os.makedirs(os.path.join(lab.proc_dir, 'driver', 'nvidia'), exist_ok=True)
    serials = cards(lab)
    # /proc/driver/nvidia/gpus/<bus>/information: where the driver says each GPU's device minor (/dev/nvidiaN), the
    # GPU at nvidia-smi's index i sitting on bus 0x18 + 0x10 * i, the card in that slot named by its UUID
    gpus_dir = os.path.join(lab.proc_dir, 'driver', 'nvidia', 'gpus')
    for i in range(lab.gpus):
        bus = '0000:{0:02x}:00.0'.format(0x18 + i * 0x10)
        os.makedirs(os.path.join(gpus_dir, bus), exist_ok=True)
        with open(os.path.join(gpus_dir, bus, 'information'), 'w') as fh:
            fh.write('Model: \t\t NVIDIA H100 80GB HBM3 (lab stand-in)\nGPU UUID: \t GPU-1ab0c0de-0000-4000-8000-{0:012d}\n'
                     'Bus Type: \t PCIe\nBus Location: \t {1}\nDevice Minor: \t {2}\nGPU Excluded:\t No\n'.format(
                         serials[i], bus, device_minor(i, lab.gpus)))
    write_loaded(lab, loaded)


def write_loaded(lab, version):
    """/proc/driver/nvidia/version: the module of version is the one loaded."""
    _write(os.path.join(lab.proc_dir, 'driver', 'nvidia', 'version'),
           'NVRM version: NVIDIA UNIX x86_64 Kernel Module  {0}  Tue Sep 30 12:00:00 UTC 2025\n'
           'GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n'.format(version).encode(), 0o644)


def loaded_version(lab):
    """The version of the loaded NVIDIA module (None: none is loaded)."""
    found = re.search(r'Kernel Module\s+(\S+)', _read(os.path.join(lab.proc_dir, 'driver', 'nvidia', 'version')))
    return found.group(1) if found else None


def write_userspace(lab):
    """The userspace driver installed (its libraries and nvidia-smi), of installed_version."""
    version = installed_version(lab)
    _write(os.path.join(lab.driver_dir, 'bin', 'nvidia-smi'), NVIDIA_SMI.format(
        version=version, count=lab.gpus, cards=' '.join(str(c) for c in cards(lab)), proc=lab.proc_dir).encode(),
        0o755)
    if not lab.debian:  # a Debian node's libraries are its packages' own
        build_driver_libs(os.path.join(lab.driver_dir, 'lib'), version)


def installed_version(lab):
    """The version of the node's userspace driver: on a Debian node the one its packages installed, else the one an
    install left (install_driver), else the node's own."""
    if lab.debian:
        return debnode.userspace_version(lab.node_files) or lab.driver_version
    return _first_line(os.path.join(lab.driver_dir, 'installed')) or lab.driver_version


def ensure_boot_id(lab, new=False):
    """/proc/sys/kernel/random/boot_id, a new one at each boot (what Ansible's reboot compares)."""
    path = os.path.join(lab.proc_dir, 'sys', 'kernel', 'random', 'boot_id')
    if new or not os.path.exists(path):
        import uuid
        _write(path, (str(uuid.uuid4()) + '\n').encode(), 0o444)


# The kernel the lab's nodes run (a PVE 9 kernel). A node's driver starts as a Debian/DKMS install: the module built
# for this kernel, the driver's packages held, so that a node has no finding until a test gives it one
# (add_kernel, hold_driver).
KERNEL = '6.14.11-4-pve'
DRIVER_PACKAGES = ('nvidia-kernel-dkms', 'nvidia-driver', 'libcuda1', 'libnvidia-ml1')


def ensure_kernel(lab):
    """The node's running kernel (its /proc/sys/kernel/osrelease) with the driver's module built for it, and the
    driver's packages, made once: a test's changes stay until the lab is made again."""
    osrelease = _osrelease(lab)
    if os.path.exists(osrelease):
        return
    if lab.debian:
        debnode.ensure_node(lab)
        _write(osrelease, (debnode.kernel(lab.node_files) + '\n').encode(), 0o644)
        return
    add_kernel(lab, KERNEL)
    hold_driver(lab, True)
    _write(osrelease, (KERNEL + '\n').encode(), 0o644)


def _osrelease(lab):
    return os.path.join(lab.proc_dir, 'sys', 'kernel', 'osrelease')


def _first_line(path):
    lines = _read(path).splitlines()
    return (lines[0].strip() or None) if lines else None


def running_kernel(lab):
    return _first_line(_osrelease(lab))


def installed_kernels(lab):
    """The kernels installed on the node (its /boot/vmlinuz-<release>)."""
    return sorted(os.path.basename(p)[len('vmlinuz-'):]
                  for p in glob.glob(os.path.join(lab.node_files, 'boot', 'vmlinuz-*')))


def dkms_built(lab):
    """{version: [kernels]} DKMS built the NVIDIA module of version for."""
    built = {}
    for path in glob.glob(os.path.join(lab.node_files, 'var', 'lib', 'dkms', 'nvidia*', '*', '*', '*', 'module')):
        parts = path.split(os.sep)
        built.setdefault(parts[-4], []).append(parts[-3])
    return dict((v, sorted(k, key=version_key)) for v, k in built.items())


# Where a kernel's NVIDIA module can be: DKMS installs it under updates/dkms, NVIDIA's installer without DKMS under
# kernel/drivers/video (modprobe finds either through modules.dep).
MODULE_PLACES = ('updates/dkms', 'kernel/drivers/video', 'extra', 'updates')


def module_version(lab, release):
    """The version of the NVIDIA module installed for kernel release (None: none is)."""
    for place in MODULE_PLACES:
        for name in ('nvidia.ko*', 'nvidia-current.ko*'):
            for path in glob.glob(os.path.join(lab.node_files, 'lib', 'modules', release, place, name)):
                real = debnode.module_version(path)  # a module DKMS built (Debian's nvidia-current)
                if real:
                    return real
                with open(path, 'rb') as fh:  # 'lab stand-in module <version>'
                    words = fh.read(200).decode('utf-8', 'replace').split()
                return words[3] if len(words) > 3 and words[:3] == ['lab', 'stand-in', 'module'] else \
                    lab.driver_version
    return None


def boot_module(lab):
    """The version of the NVIDIA module a boot loads: the one installed for the kernel the node runs (None: the
    kernel has none, and no driver loads)."""
    release = running_kernel(lab)
    if not release:
        return lab.driver_version  # a node made before the lab knew kernels: its driver loads as it always did
    return module_version(lab, release)


def boot_kernel(lab):
    """The kernel a boot runs, as proxmox-boot-tool sets the boot up: the next-boot pin (which the boot uses up:
    proxmox-boot-cleanup.service removes /etc/kernel/next-boot-pin once the node is up), else the pin
    (/etc/kernel/proxmox-boot-pin), else the newest kernel installed (proxmox-kernel-helper proxmox-boot/functions;
    grub and systemd-boot list kernels newest first). Returns it."""
    kernel_dir = os.path.join(lab.node_files, 'etc', 'kernel')
    once = os.path.join(kernel_dir, 'next-boot-pin')
    installed = installed_kernels(lab)
    release = (_first_line(once) or _first_line(os.path.join(kernel_dir, 'proxmox-boot-pin'))
               or (max(installed, key=version_key) if installed else None))
    if os.path.exists(once):
        os.unlink(once)
    if release:
        _write(_osrelease(lab), (release + '\n').encode(), 0o644)
    return release


def reset_kernel(lab):
    """Forget what tests did to the node's kernels, modules, packages and driver installs; the next write_proc makes
    them anew, and a module of another version loaded since is the node's own again (as after a reload)."""
    if lab.debian:  # the node's Debian root as it started
        debnode.ensure_node(lab, again=True)
    for rel in ('boot', 'lib/modules', 'etc/kernel', 'var/lib/dkms', 'var/lib/dpkg') if not lab.debian else ():
        shutil.rmtree(os.path.join(lab.node_files, rel), ignore_errors=True)
    # (and the collection's record of the node's last driver upgrade)
    for path in (_osrelease(lab), os.path.join(lab.driver_dir, 'installed'), offers_file(lab),
                 os.path.join(lab.node_files, 'var', 'lib', 'gpufleet', 'driver-upgrade.json')):
        if os.path.exists(path):
            os.unlink(path)
    if loaded_version(lab):
        write_loaded(lab, lab.driver_version)


def add_kernel(lab, release, module='built', version=None, pin=None, headers=True):
    """A kernel installed on the node (its /boot/vmlinuz), with the NVIDIA module of version (the node's installed
    driver by default) as DKMS leaves it: 'built' (the module under lib/modules/<release>/updates/dkms and DKMS's
    tree), 'failed' (no module; the build's make.log, as DKMS keeps it after a failed build) or None (not built at all);
    pin: 'pin' or 'next-boot' pins it as proxmox-boot-tool kernel pin [--next-boot] does (/etc/kernel/...);
    headers: its headers installed (lib/modules/<release>/build, to usr/src/linux-headers-<release>)."""
    version = version or installed_version(lab)
    root = lab.node_files
    _write(os.path.join(root, 'boot', 'vmlinuz-' + release), b'lab stand-in kernel\n', 0o644)
    # the headers DKMS builds against: Debian's linux-headers-<release> and PVE's proxmox-headers-<release> link
    # /lib/modules/<release>/build to /usr/src/linux-headers-<release>; without it dkms stops with "Your kernel
    # headers for kernel <release> cannot be found" (dkms's own message; a Debian node runs the real dkms)
    if headers:
        _write(os.path.join(root, 'usr', 'src', 'linux-headers-' + release, 'Makefile'), b'# lab stand-in\n', 0o644)
        link = os.path.join(root, 'lib', 'modules', release, 'build')
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if not os.path.lexists(link):
            os.symlink('/usr/src/linux-headers-' + release, link)
    if pin:
        _write(os.path.join(root, 'etc', 'kernel', 'next-boot-pin' if pin == 'next-boot' else 'proxmox-boot-pin'),
               (release + '\n').encode(), 0o644)
    dkms = os.path.join(root, 'var', 'lib', 'dkms', 'nvidia', version)
    if module == 'built':
        for path in (os.path.join(root, 'lib', 'modules', release, 'updates', 'dkms', 'nvidia.ko'),
                     os.path.join(dkms, release, 'x86_64', 'module', 'nvidia.ko')):
            _write(path, 'lab stand-in module {0}\n'.format(version).encode(), 0o644)
    elif module == 'failed':
        _write(os.path.join(dkms, 'build', 'make.log'),
               'DKMS make.log for nvidia-{0} for kernel {1} (x86_64)\n'
               "nvidia/nv.c:1234:5: error: implicit declaration of function 'pci_enable_msix'\n"
               'make[1]: *** [Makefile:1234: nvidia/nv.o] Error 1\n'.format(version, release).encode(), 0o644)


def remove_kernel(lab, release):
    """A kernel that add_kernel installed, gone again (its /boot/vmlinuz, its module tree and any pin to it)."""
    root = lab.node_files
    for path in (os.path.join(root, 'boot', 'vmlinuz-' + release),
                 os.path.join(root, 'etc', 'kernel', 'next-boot-pin'), os.path.join(root, 'etc', 'kernel', 'proxmox-boot-pin')):
        if os.path.exists(path) and (path.endswith(release) or _read(path).strip() == release):
            os.unlink(path)
    for tree in (os.path.join(root, 'lib', 'modules', release), os.path.join(root, 'usr', 'src', 'linux-headers-' + release)):
        shutil.rmtree(tree, ignore_errors=True)


def hold_driver(lab, held=True, version=None):
    """The driver's Debian packages in the node's dpkg status: held from upgrades (apt-mark hold) or not (on a
    Debian node by its own apt-mark)."""
    if lab.debian:
        names = sorted(read_dpkg(lab))
        debnode.run(lab.node_files, lab, 'apt-mark', 'hold' if held else 'unhold',
                    *[n for n in names if re.match(r'^(nvidia-|libnvidia-|libcuda1|firmware-nvidia-)', n)])
        return
    version = version or installed_version(lab)
    write_dpkg(lab, dict((name, (version + '-1', held)) for name in DRIVER_PACKAGES))


def dpkg_file(lab):
    return os.path.join(lab.node_files, 'var', 'lib', 'dpkg', 'status')


def read_dpkg(lab):
    """{package: (version, held)} of the node's dpkg status."""
    found = {}
    for stanza in _read(dpkg_file(lab)).split('\n\n'):
        fields = dict(line.split(': ', 1) for line in stanza.splitlines() if ': ' in line)
        if 'Package' in fields:
            found[fields['Package']] = (fields.get('Version'), fields.get('Status', '').startswith('hold'))
    return found


def write_dpkg(lab, packages):
    """The node's dpkg status: each driver package built from one source package (nvidia-graphics-drivers), as
    NVIDIA's CUDA repository and Debian build them (dpkg's Source field)."""
    _write(dpkg_file(lab), '\n'.join(
        'Package: {0}\nStatus: {1} ok installed\nArchitecture: amd64\n{3}Version: {2}\n'.format(
            name, 'hold' if held else 'install', version,
            'Source: nvidia-graphics-drivers\n' if name in DRIVER_PACKAGES and name != 'nvidia-graphics-drivers' else '')
        for name, (version, held) in sorted(packages.items())).encode(), 0o644)


# -- a new driver offered to a node and installed ---------------------------------------------------------------
# A node's package sources offer driver versions (offer_driver); apt-get installs one as Debian's packages do
# (install_driver): the userspace libraries are replaced, DKMS's postinst removes the old module and builds the new
# one for every installed kernel, and the loaded module stays until the node reboots (its userspace then answers
# "Driver/library version mismatch"). The node's stand-in commands (node_command) run these.
def offers_file(lab):
    return os.path.join(lab.driver_dir, 'offered.json')


def offers(lab):
    """{version: {'fails_on': [kernels whose module build fails]}} that the node's package sources offer."""
    try:
        with open(offers_file(lab)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def offer_driver(lab, version, fails_on=(), moves=None):
    """The node's package sources offer the driver of version, and NVIDIA's installer of it lies in the node's
    /root (NVIDIA-Linux-x86_64-<version>.run); its module does not build for the kernels in fails_on; moves:
    {package: version} of other packages of the node that apt moves with it to satisfy the new packages'
    dependencies (nvidia-modprobe is a source of its own: the real nvidia-kernel-support 535.309.01-0+deb12u1 in the
    lab's bookworm pool Depends on nvidia-modprobe (>= 535), so apt moves it only where the installed one is older). A
    Debian node's own repository offers a Debian version of its suite (debnode.offer_version; fails_on and moves are
    the stand-in's)."""
    if lab.debian:
        debnode.offer_version(lab, version)
        return
    found = offers(lab)
    found[version] = {'fails_on': list(fails_on), 'moves': dict(moves or {})}
    _write(offers_file(lab), json.dumps(found, indent=1).encode(), 0o644)
    node_command(lab, os.path.join(lab.node_files, 'root', 'NVIDIA-Linux-x86_64-{0}.run'.format(version)),
                 'nvidia-installer', version)


def dkms_build(lab, version, release):
    """DKMS builds and installs the module of version for kernel release; returns None, or DKMS's error."""
    dkms = os.path.join(lab.node_files, 'var', 'lib', 'dkms', 'nvidia', version)
    if version != installed_version(lab):
        return 'Error! The module/version combo: nvidia-{0} is not located in the DKMS tree.'.format(version)
    if not os.path.exists(os.path.join(lab.node_files, 'usr', 'src', 'linux-headers-' + release)):
        return 'Error! Your kernel headers for kernel {0} cannot be found.'.format(release)
    if release in (offers(lab).get(version) or {}).get('fails_on', []):
        add_kernel(lab, release, module='failed', version=version, headers=False)
        return ('Error! Bad return status for module build on kernel: {0} (x86_64)\nConsult '
                '/var/lib/dkms/nvidia/{1}/build/make.log for more information.'.format(release, version))
    for old in glob.glob(os.path.join(lab.node_files, 'lib', 'modules', release, '*', '*', 'nvidia.ko*')):
        os.unlink(old)
    add_kernel(lab, release, module='built', version=version, headers=False)
    shutil.rmtree(os.path.join(dkms, 'build'), ignore_errors=True)
    return None


def install_driver(lab, version, kernels=None):
    """The driver of version installed over the node's: the userspace replaced, the old module removed from every
    kernel (dkms remove --all), the new one built by DKMS for kernels (Debian's packages: every installed kernel;
    NVIDIA's installer: the running one). The loaded module stays. Returns the DKMS errors ([] where every build
    succeeded)."""
    old = installed_version(lab)
    _write(os.path.join(lab.driver_dir, 'installed'), (version + '\n').encode(), 0o644)
    write_userspace(lab)
    if old != version:
        shutil.rmtree(os.path.join(lab.node_files, 'var', 'lib', 'dkms', 'nvidia', old), ignore_errors=True)
        for path in glob.glob(os.path.join(lab.node_files, 'lib', 'modules', '*', '*', '*', 'nvidia.ko*')):
            os.unlink(path)
    errors = []
    for release in installed_kernels(lab) if kernels is None else kernels:
        error = dkms_build(lab, version, release)
        if error:
            errors.append(error)
    return errors


# The userspace half of the stand-in driver: real ELF libraries with NVIDIA's names and sonames,
# so that a container can be given "the node's driver" and its version checked, as on a real node.
DRIVER_LIBS = {'libcuda': 'libcuda.so.1', 'libnvidia-ml': 'libnvidia-ml.so.1',
               'libnvidia-ptxjitcompiler': 'libnvidia-ptxjitcompiler.so.1'}


def build_driver_libs(directory, version):
    """The stand-in libraries of this version; those of another version (a node given another driver) go."""
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        if any(name.startswith(lib + '.so.') for lib in DRIVER_LIBS) and not name.endswith('.so.' + version):
            os.unlink(os.path.join(directory, name))
    src = os.path.join(directory, 'standin.c')
    with open(src, 'w') as fh:
        fh.write('/* gpufleet lab: a stand-in for the NVIDIA userspace driver (no GPU behind it). */\n'
                 'const char *gpufleet_standin_driver_version(void) { return "%s"; }\n' % version)
    for name, soname in DRIVER_LIBS.items():
        target = os.path.join(directory, '{0}.so.{1}'.format(name, version))
        if not os.path.exists(target):
            sh(['gcc', '-shared', '-fPIC', '-Wl,-soname,' + soname, '-o', target, src])
    os.unlink(src)


def lose_gpu_nodes(lab, record):
    """What a reboot does to the stand-ins: the device nodes are gone (/dev is a fresh devtmpfs, and the NVIDIA
    driver makes none when it loads: nvidia-modprobe or udev does), nvidia-uvm loads on another major (the
    kernel's pick), and the node runs the kernel its boot set-up names (boot_kernel): without an NVIDIA module for
    it, no driver loads. Returns the new major."""
    gpus = record.get(gpu_record_key(lab)) or {}
    if gpus.get('real'):
        raise LabError('the lab uses real NVIDIA device nodes here; it does not reboot them')
    if not gpus.get('uvm_major'):
        return None  # a node without GPUs
    for path, _major, _minor in gpus.get('nodes', []):
        if os.path.lexists(path):
            os.unlink(path)
    uvm = free_dynamic_major(exclude=[gpus['uvm_major']])
    for node in gpus['nodes']:
        if node[1] == gpus['uvm_major']:
            node[1] = uvm
    gpus['uvm_major'] = uvm
    boot_kernel(lab)
    write_proc(lab, uvm, boot=True)
    return uvm


def remove_gpus(record, lab=None):
    """Take the stand-in device nodes away: every node's, or one node's (lab)."""
    keys = [gpu_record_key(lab)] if lab is not None else [k for k in record if k == 'gpus' or k.startswith('gpus:')]
    for key in keys:
        for path in (record.pop(key, None) or {}).get('created', []):
            if os.path.exists(path):
                os.unlink(path)
