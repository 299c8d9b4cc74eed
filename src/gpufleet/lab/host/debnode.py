"""Lab nodes on Debian's own NVIDIA packaging: a node whose root is a real Debian root (bookworm for a PVE 8 node,
trixie for a PVE 9 node) with Debian's own apt-get, apt-cache, apt-mark, dpkg and dkms, and the driver from
Debian's non-free packages (nvidia-kernel-dkms, firmware-nvidia-gsp, libcuda1, nvidia-smi, ... with their real
dependencies and maintainer scripts). DKMS really builds nvidia-current against the real headers of a Debian kernel
installed in the root: that kernel stands for the PVE kernel, whose headers cannot be installed here. What stays a
stand-in is the kernel side only (loading the module, /proc/driver/nvidia, what nvidia-smi reports, the device
nodes: host.gpus).

The packages come from a local repository that the lab fetches once into its cache (every version of SUITES with
what it depends on beyond the Debian base), so that a node is built, upgraded and rolled back offline afterwards.
A node's own repository (its /srv/gpufleet-lab-repo, its only apt source) offers the versions the lab says: the one
it starts with, and those offer() adds; a version withdrawn is not installable there any more, as on a mirror that
keeps only a suite's newest version.

A DKMS build of the NVIDIA module takes minutes on two cores. The node's commands run the compiler through ccache,
its cache kept in the lab's cache: the real build runs, and a (version, kernel) built once before compiles from the
cache in seconds."""

import glob
import json
import os
import re
import shutil
import subprocess

from ._util import LabError, _write, sh, version_key

MIRROR = os.environ.get('GPUFLEET_LAB_MIRROR', 'http://deb.debian.org/debian')
SECURITY = os.environ.get('GPUFLEET_LAB_SECURITY_MIRROR', 'http://deb.debian.org/debian-security')
KEYRING = '/usr/share/keyrings/debian-archive-keyring.gpg'
COMPONENTS = 'main contrib non-free non-free-firmware'
# The driver versions Debian offers each suite (its own suite, its security updates, backports), the one a lab node
# starts with first. bookworm's backports are older than its security update; trixie's is another Debian revision of
# the same upstream version.
SUITES = {
    'bookworm': {'pve': '8', 'versions': ['535.261.03-1', '535.309.01-0+deb12u1', '535.216.03-2~bpo12+1']},
    'trixie': {'pve': '9', 'versions': ['550.163.01-2', '550.163.01-4~bpo13+1']},
}
# What a GPU node installs of the driver (headless: no X, no OpenGL), and what DKMS builds with.
DRIVER = ('nvidia-kernel-dkms', 'nvidia-smi', 'libcuda1', 'libnvidia-ml1', 'firmware-nvidia-gsp')
TOOLCHAIN = ('linux-image-amd64', 'linux-headers-amd64', 'dkms', 'ccache')
# The node's commands that are Debian's own, run in its root (the lab's reboot stays the lab's).
COMMANDS = ('apt-get', 'apt-cache', 'apt-mark', 'dpkg', 'dkms')
REPO = 'srv/gpufleet-lab-repo'
CCACHE = 'var/cache/gpufleet-ccache'


def suite_of(version):
    """The suite (SUITES) whose Debian NVIDIA driver version this is, else None."""
    return next((s for s, about in SUITES.items() if version in about['versions']), None)


def upstream(version):
    return version.rsplit('-', 1)[0]


def cache_dir(lab, suite):
    return os.path.join(lab.cache, 'debian-nvidia', suite)


# -- the repository: fetched once ----------------------------------------------------------------------------------
def _apt_root(lab, suite):
    """An apt state of the host's apt-get for suite's Debian archives, over the lab's Debian base of that release:
    what a version needs beyond the base is what it resolves to."""
    root = os.path.join(cache_dir(lab, suite), 'apt')
    for d in ('etc/apt/sources.list.d', 'etc/apt/preferences.d', 'etc/apt/apt.conf.d', 'var/lib/apt/lists/partial',
              'var/cache/apt/archives/partial'):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    lines = ['deb [signed-by={0}] {1} {2} {3}'.format(KEYRING, MIRROR, s, COMPONENTS)
             for s in (suite, suite + '-updates', suite + '-backports')]
    lines.append('deb [signed-by={0}] {1} {2}-security {3}'.format(KEYRING, SECURITY, suite, COMPONENTS))
    _write(os.path.join(root, 'etc', 'apt', 'sources.list'), ('\n'.join(lines) + '\n').encode(), 0o644)
    return root


def _apt(lab, suite, *args, check=True, cwd=None):
    """The host's apt-get or apt-cache (args[0]) on the suite's apt state (_apt_root) over its Debian base."""
    root = os.path.join(cache_dir(lab, suite), 'apt')
    status = os.path.join(lab.base_rootfs_of(suite, False), 'var', 'lib', 'dpkg', 'status')
    argv = [args[0], '-o', 'Dir=' + root, '-o', 'Dir::State::status=' + status, '-o', 'APT::Architecture=amd64',
            '-o', 'Debug::NoLocking=1'] + list(args[1:])
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    if check and done.returncode:
        raise LabError('{0} failed ({1}):\n{2}'.format(' '.join(args[:3]), done.returncode, done.stdout[-3000:]))
    return done


def resolve(lab, suite, version):
    """{package: version} that installs the driver of version (every package of its source named at that version,
    as apt needs them: asked alone it picks the newest of the others) and the toolchain onto the Debian base."""
    pins = dict((p, version) for p in DRIVER)
    for _ in range(8):
        done = _apt(lab, suite, 'apt-get', 'install', '-s', '--no-install-recommends', *(
            list(TOOLCHAIN) + ['{0}={1}'.format(p, v) for p, v in sorted(pins.items())]), check=False)
        if done.returncode == 0:
            return dict(re.findall(r'^Inst (\S+) (?:\[\S+\] )?\((\S+) ', done.stdout, re.M))
        # " P : Depends: X (= V) but W is to be installed": a P named here needs X at V too; a P not named is one of
        # the source's that apt took at its newest, and is named at this version
        before, owner = dict(pins), None
        for line in done.stdout.splitlines():
            m = re.match(r'^\s*(?:(\S+) : )?Depends: (\S+) \(= ([^)]+)\)', line)
            if not m:
                continue
            owner = m.group(1) or owner
            if owner in pins:
                pins[m.group(2)] = m.group(3)
            else:
                pins[owner] = version
        if pins == before:
            raise LabError('apt cannot install the NVIDIA driver {0} of {1}:\n{2}'.format(
                version, suite, done.stdout[-3000:]))
    raise LabError('apt cannot install the NVIDIA driver {0} of {1}'.format(version, suite))


def fetch(lab, suite, say=print):
    """The suite's driver versions and what they need beyond the base, downloaded once into the lab's cache
    (pool/), with each version's list (versions/<version>.json: packages, what installing it takes; also, the other
    packages of the driver's source that the archive has at that version, as a mirror offers them, so that a move
    to it pins them too); kept by `down`."""
    base = cache_dir(lab, suite)
    pool, lists = os.path.join(base, 'pool'), os.path.join(base, 'versions')
    versions = SUITES[suite]['versions']
    if all('also' in _read_json(os.path.join(lists, v + '.json')) for v in versions):
        return
    say("fetching Debian {0}'s NVIDIA driver packages ({1}) into the lab's cache (once)".format(
        suite, ', '.join(versions)))
    _apt_root(lab, suite)
    _apt(lab, suite, 'apt-get', 'update')
    os.makedirs(pool, exist_ok=True)
    os.makedirs(lists, exist_ok=True)
    needed = dict((v, resolve(lab, suite, v)) for v in versions)
    # the driver's own packages: those at one of the suite's versions in some version's set
    own = sorted(set(p for v in versions for p, pv in needed[v].items() if pv in versions))
    offered = _madison(lab, suite, own)
    for version in versions:
        packages, also = needed[version], also_offered(needed[version], own, offered, version)
        # one package may be in both at two versions (apt took bookworm's nvidia-legacy-check at the security
        # update's for the first driver, as a real node's apt does): both are downloaded and offered
        _download(lab, suite, pool, packages)
        _download(lab, suite, pool, also)
        files = sorted(set(_deb_file(pool, p, v) for p, v in list(packages.items()) + list(also.items())))
        _write(os.path.join(lists, version + '.json'), json.dumps(
            {'version': version, 'packages': packages, 'also': also, 'files': files}, indent=1,
            sort_keys=True).encode(), 0o644)


def also_offered(needed, own, offered, version):
    """The packages of the driver's own source that the archive offers at version and that installing it does not
    take at that version (not needed at all, or taken at another: apt, not asked for one by version, takes the
    newest), {package: version}: a move to the version pins them too."""
    return dict((p, version) for p in own if needed.get(p) != version and version in offered.get(p, []))


def _read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _madison(lab, suite, packages):
    """{package: [versions the suite's archives offer]}."""
    out = {}
    for line in _apt(lab, suite, 'apt-cache', 'madison', *packages).stdout.splitlines():
        parts = [p.strip() for p in line.split('|')]
        if len(parts) >= 3 and 'Sources' not in parts[2]:
            out.setdefault(parts[0], []).append(parts[1])
    return out


def _download(lab, suite, pool, wanted):
    """Each package version of wanted ({package: version}) into pool, where it is not there yet."""
    get = ['{0}={1}'.format(p, v) for p, v in sorted(wanted.items()) if not _deb_file(pool, p, v)]
    if get:
        _apt(lab, suite, 'apt-get', 'download', *get, cwd=pool)
    absent = ['{0}={1}'.format(p, v) for p, v in sorted(wanted.items()) if not _deb_file(pool, p, v)]
    if absent:
        raise LabError('apt-get download left out {0}'.format(', '.join(absent)))


def _deb_file(pool, package, version):
    """The file name apt-get download gave a package version in pool (<package>_<version>_<arch>.deb, an epoch's
    colon as %3a), else None."""
    found = glob.glob(os.path.join(pool, '{0}_{1}_*.deb'.format(package, version.replace(':', '%3a'))))
    return os.path.basename(found[0]) if found else None


def versions_file(lab, suite, version):
    with open(os.path.join(cache_dir(lab, suite), 'versions', version + '.json')) as fh:
        return json.load(fh)


# -- a node's root: built once per suite, copied for each node ----------------------------------------------------
def offer(root, lab, suite, versions):
    """The node's own repository (its only apt source) offers these driver versions, with what they need: the
    files hard-linked from the cache's pool, indexed with dpkg-scanpackages; the node's apt lists read it again."""
    repo = os.path.join(root, REPO)
    shutil.rmtree(repo, ignore_errors=True)
    os.makedirs(repo)
    pool = os.path.join(cache_dir(lab, suite), 'pool')
    files = sorted(set(f for v in versions for f in versions_file(lab, suite, v)['files']))
    for name in files:
        try:
            os.link(os.path.join(pool, name), os.path.join(repo, name))
        except OSError:
            shutil.copy2(os.path.join(pool, name), os.path.join(repo, name))
    with open(os.path.join(repo, 'Packages'), 'w') as fh:
        subprocess.run(['dpkg-scanpackages', '--multiversion', '.', '/dev/null'], cwd=repo, stdout=fh,
                       stderr=subprocess.DEVNULL, check=True)
    _write(os.path.join(root, 'etc', 'apt', 'sources.list'),
           '# gpufleet lab: the node\'s own repository of Debian {0} packages\ndeb [trusted=yes] file:/{1} ./\n'.format(
               suite, REPO).encode(), 0o644)
    for extra in glob.glob(os.path.join(root, 'etc', 'apt', 'sources.list.d', '*')):
        os.unlink(extra)
    _write(os.path.join(root, REPO + '.json'), json.dumps(sorted(versions)).encode(), 0o644)
    run(root, lab, 'apt-get', 'update', '-qq')


def offered(root):
    """The driver versions the node's repository offers."""
    try:
        with open(os.path.join(root, REPO + '.json')) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return []


def wrapper(root, lab, command):
    """The text of a node command that runs Debian's own command in the node's root: in a mount namespace of its
    own, with /proc, /sys, /dev and the lab's ccache mounted in the root (gone when it exits), the compiler through
    ccache."""
    ccache = os.path.join(lab.cache, 'debian-nvidia', 'ccache')
    return ('#!/bin/sh\n# gpufleet lab: {command} of this lab node, Debian\'s own, run in the node\'s Debian root\n'
            'exec unshare --mount --propagation private /bin/sh -c \'\n'
            'root=$0\n'
            'mount -t proc proc "$root/proc" && mount --rbind /sys "$root/sys" && mount --rbind /dev "$root/dev" &&\n'
            'mkdir -p {ccache} "$root/{ccache_in}" && mount --bind {ccache} "$root/{ccache_in}" &&\n'
            'exec chroot "$root" /usr/bin/env -i PATH=/usr/lib/ccache:/usr/local/sbin:/usr/local/bin:/usr/sbin:'
            '/usr/bin:/sbin:/bin CCACHE_DIR=/{ccache_in} DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 HOME=/root '
            '{command} "$@"\' {root} "$@"\n').format(command=command, ccache=ccache, ccache_in=CCACHE, root=root)


def write_commands(root, lab, bin_dir):
    """The node's Debian commands (COMMANDS) in bin_dir, each a wrapper into root."""
    for command in COMMANDS:
        _write(os.path.join(bin_dir, command), wrapper(root, lab, command).encode(), 0o755)


def run(root, lab, *argv, check=True):
    """One of Debian's commands in the root, as the node's own wrapper runs it."""
    tmp = os.path.join(lab.cache, 'debian-nvidia', '.run-{0}'.format(os.getpid()))
    _write(tmp, wrapper(root, lab, argv[0]).encode(), 0o755)
    try:
        done = subprocess.run([tmp] + list(argv[1:]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finally:
        os.unlink(tmp)
    if check and done.returncode:
        raise LabError('{0} in {1} failed ({2}):\n{3}'.format(' '.join(argv), root, done.returncode,
                                                            done.stdout[-4000:]))
    return done


def pristine(lab, suite):
    """The suite's node root with its first driver version installed, built once (about 6 minutes: the real DKMS
    build of nvidia-current) and kept in the lab's cache."""
    return os.path.join(cache_dir(lab, suite), 'root')


def ensure_root(lab, suite, say=print):
    """pristine(): the Debian base of the suite, the toolchain and a kernel with its headers, the first driver
    version of SUITES installed from the node's repository with apt (DKMS builds nvidia-current), its packages held
    as gpufleet holds them."""
    done = pristine(lab, suite)
    if os.path.exists(os.path.join(done, '.gpufleet-lab-stamp')):
        return done
    fetch(lab, suite, say)
    first = SUITES[suite]['versions'][0]
    say('building a Debian {0} node root with the NVIDIA driver {1} (once; DKMS builds its module, minutes)'.format(
        suite, first))
    work = done + '.tmp'
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    sh(['cp', '-a', lab.base_rootfs_of(suite, False) + '/.', work + '/'])
    offer(work, lab, suite, [first])
    needed = versions_file(lab, suite, first)['packages']
    run(work, lab, 'apt-get', 'install', '-y', '--no-install-recommends', *TOOLCHAIN)
    compile_through_ccache(work, lab)
    # a lab node never boots its kernel: no initramfs to make again at each driver change (a real setting)
    _write(os.path.join(work, 'etc', 'initramfs-tools', 'update-initramfs.conf'),
           b'# gpufleet lab: the node never boots this kernel\nupdate_initramfs=no\nbackup_initramfs=no\n', 0o644)
    source = driver_packages(needed, first)
    run(work, lab, 'apt-get', 'install', '-y', '--no-install-recommends',
        *['{0}={1}'.format(p, first) for p in source])
    run(work, lab, 'apt-mark', 'hold', *source)
    # each node gets its own repository (offer: hard links into the cache's pool), not a copy of this one's
    shutil.rmtree(os.path.join(work, REPO), ignore_errors=True)
    _write(os.path.join(work, '.gpufleet-lab-stamp'), (first + '\n').encode(), 0o644)
    shutil.rmtree(done, ignore_errors=True)
    os.rename(work, done)
    return done


def compile_through_ccache(root, lab):
    """The root's C compiler runs through ccache (its cache in the lab's cache): the compiler is diverted with
    dpkg-divert, as Debian lets a local administrator replace a packaged file, and a wrapper takes its name. DKMS's
    builds run with a PATH of their own, so ccache's masquerading directory would not be used."""
    compilers = [os.path.basename(p) for p in glob.glob(os.path.join(root, 'usr', 'bin', 'x86_64-linux-gnu-gcc-[0-9]*'))
                 if not p.endswith('.real')]
    for name in compilers:
        path = '/usr/bin/' + name
        run(root, lab, 'dpkg-divert', '--local', '--rename', '--divert', path + '.real', '--add', path)
        _write(os.path.join(root, path.lstrip('/')), '#!/bin/sh\n# gpufleet lab: {0} through ccache\nexec ccache '
               '{0}.real "$@"\n'.format(path).encode(), 0o755)
    _write(os.path.join(root, 'etc', 'ccache.conf'),
           '# gpufleet lab: the DKMS builds of every lab node share one cache (the lab\'s)\ncache_dir = /{0}\n'
           'sloppiness = time_macros,include_file_mtime,include_file_ctime\nhash_dir = false\n'
           'max_size = 5G\n'.format(CCACHE).encode(), 0o644)


def driver_packages(needed, version):
    """The packages of the driver's source at version, among what a version needs (the ones apt needs named)."""
    return sorted(p for p, v in needed.items() if v == version)


def kernel(root):
    """The newest kernel installed in the root (its /boot/vmlinuz-<release>)."""
    found = [os.path.basename(p)[len('vmlinuz-'):] for p in glob.glob(os.path.join(root, 'boot', 'vmlinuz-*'))]
    if not found:
        raise LabError('{0} has no kernel'.format(root))
    return sorted(found, key=version_key)[-1]


def module_version(path):
    """The version of a real kernel module file (its .modinfo section's version=; DKMS compresses it as the
    kernel's modules are, .ko.xz on trixie), else None."""
    try:
        with open(path, 'rb') as fh:
            data = fh.read()
        if path.endswith('.xz'):
            import lzma
            data = lzma.decompress(data)
        elif path.endswith('.gz'):
            import gzip
            data = gzip.decompress(data)
        elif path.endswith('.zst'):
            data = subprocess.run(['zstd', '-dc', path], stdout=subprocess.PIPE, check=True).stdout
    except (OSError, ValueError, subprocess.CalledProcessError):
        return None
    found = re.search(rb'(?:^|\x00)version=([0-9][0-9.]*)\x00', data)
    return found.group(1).decode() if found else None


def userspace_version(root):
    """The version of the userspace driver the packages installed (libcuda.so.<version> in nvidia/current)."""
    for path in glob.glob(os.path.join(root, 'usr', 'lib', 'x86_64-linux-gnu', 'nvidia', 'current', 'libcuda.so.*')):
        m = re.match(r'^libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$', os.path.basename(path))
        if m:
            return m.group(1)
    return None


# What a node's driver changes touch, taken back to the pristine root when the lab restores a node's kernels.
DRIVER_TREES = ('var/lib/dkms', 'lib/modules', 'usr/src', 'boot', 'etc/kernel', 'usr/lib/x86_64-linux-gnu/nvidia')


def ensure_node(lab, again=False):
    """The node's root (lab.node_files) is its suite's pristine root (ensure_root), copied once; again: its driver
    and kernels taken back to it (DRIVER_TREES and every file the pristine root has), the collection's own files
    (boot units, driver bundles) kept."""
    suite = lab.debian
    if suite not in SUITES:
        raise LabError('node {0}: no Debian suite {1!r} (the lab knows {2})'.format(
            lab.node, suite, ', '.join(sorted(SUITES))))
    root = lab.node_files
    stamp = os.path.join(root, '.gpufleet-lab-stamp')
    if os.path.exists(stamp) and not again:
        return root
    source = ensure_root(lab, suite)
    if os.path.exists(stamp):
        for rel in DRIVER_TREES + (REPO,):
            shutil.rmtree(os.path.join(root, rel), ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    shutil.rmtree(os.path.join(source, REPO), ignore_errors=True)  # (a root built before that was so)
    sh(['cp', '-a', source + '/.', root + '/'])
    offer(root, lab, suite, [SUITES[suite]['versions'][0]])
    return root


def offer_version(lab, version):
    """The node's repository offers version too (a Debian version of its suite), and apt's lists say so."""
    if version not in SUITES[lab.debian]['versions']:
        raise LabError('node {0}: Debian {1} has no NVIDIA driver {2} the lab knows (it knows {3})'.format(
            lab.node, lab.debian, version, ', '.join(SUITES[lab.debian]['versions'])))
    offer(lab.node_files, lab, lab.debian, sorted(set(offered(lab.node_files)) | {version}))


def withdraw_version(lab, version):
    """The node's repository no longer offers version (its suite moved on)."""
    offer(lab.node_files, lab, lab.debian, [v for v in offered(lab.node_files) if v != version])
