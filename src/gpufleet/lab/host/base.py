"""The lab's base: the host's preflight, subordinate ids for unprivileged containers, the Debian base that
containers are made from, the local wheelhouse, and each node's template file."""

import glob
import hashlib
import os
import shutil
import subprocess
import sys
from ..layout import RELEASES, UNPRIV_BASE, UNPRIV_RANGE, UV_PIN

from ._util import LabError, _read, sh


# What the containers' base holds, as PVE's debian-12-standard template does in what matters here: python3 but not
# python3-venv (ensurepip, priority optional; the template is dab's required, important and standard priorities:
# proxmox/dab DAB.pm) and no compiler.
BASE_PACKAGES = ('systemd-sysv', 'python3', 'ca-certificates', 'iproute2', 'procps')


def base_stamp(release):
    return '{0} minbase {1}'.format(release, ' '.join(BASE_PACKAGES))


DEBIAN_MIRROR = os.environ.get('GPUFLEET_LAB_MIRROR', 'http://deb.debian.org/debian')


PYTORCH_CPU_INDEX = 'https://download.pytorch.org/whl/cpu'


# -- preflight ---------------------------------------------------------------------
def preflight():
    """What stops the lab from running on this host, as a list of plain sentences (empty: all good)."""
    problems = []
    if os.geteuid() != 0:
        problems.append('the lab needs root (it makes LXC containers, device nodes and a bridge)')
    for tool, package in (('lxc-start', 'lxc'), ('debootstrap', 'debootstrap'), ('sshd', 'openssh-server'),
                          ('nft', 'nftables'), ('ip', 'iproute2'), ('gcc', 'gcc'), ('zstd', 'zstd')):
        if not shutil.which(tool) and not os.path.exists('/usr/sbin/' + tool):
            problems.append('{0} is missing (apt-get install {1})'.format(tool, package))
    try:
        with open('/proc/filesystems') as fh:
            if 'overlay' not in fh.read():
                problems.append('the kernel has no overlayfs (modprobe overlay)')
    except OSError:
        problems.append('/proc/filesystems cannot be read')
    if not os.path.exists('/proc/self/ns/user'):
        problems.append('the kernel has no user namespaces, which unprivileged containers need')
    if not os.path.isdir('/sys/fs/cgroup'):
        problems.append('no cgroup filesystem at /sys/fs/cgroup')
    return problems


# -- ids --------------------------------------------------------------------------
def ensure_subids(record):
    line = 'root:{0}:{1}'.format(UNPRIV_BASE, UNPRIV_RANGE)
    for path in ('/etc/subuid', '/etc/subgid'):
        try:
            with open(path) as fh:
                text = fh.read()
        except FileNotFoundError:
            text = ''
        if line not in text.split('\n'):
            with open(path, 'a') as fh:
                if text and not text.endswith('\n'):
                    fh.write('\n')
                fh.write(line + '\n')
            record.setdefault('subids', []).append(path)


def remove_subids(record):
    line = 'root:{0}:{1}'.format(UNPRIV_BASE, UNPRIV_RANGE)
    for path in record.get('subids', []):
        try:
            with open(path) as fh:
                lines = fh.read().split('\n')
        except FileNotFoundError:
            continue
        with open(path, 'w') as fh:
            fh.write('\n'.join(x for x in lines if x != line).strip('\n') + '\n')


# -- the Debian base --------------------------------------------------------------
def ensure_base(lab, say):
    """For each release the lab offers (RELEASES: Debian 12 and 13), a minbase with systemd and python3, built once
    with debootstrap, plus a copy owned by the unprivileged id range. Both live in the cache and survive `down`."""
    for release, about in sorted(RELEASES.items(), key=lambda r: r[1]['debian']):
        rootfs, unpriv = lab.base_rootfs_of(release, False), lab.base_rootfs_of(release, True)
        stamp = os.path.join(lab.base_dir(release), 'stamp')
        if _read(stamp) == base_stamp(release) and os.path.isfile(os.path.join(unpriv, 'sbin', 'init')):
            continue
        say('building the Debian {0} base with debootstrap (once; about 90 s)'.format(about['debian']))
        tmp = rootfs + '.tmp'
        for path in (tmp, rootfs, unpriv):
            shutil.rmtree(path, ignore_errors=True)
        os.makedirs(lab.base_dir(release), exist_ok=True)
        sh(['debootstrap', '--variant=minbase', '--include=' + ','.join(BASE_PACKAGES), release, tmp, DEBIAN_MIRROR])
        _prepare_base(tmp)
        os.rename(tmp, rootfs)
        utmp = unpriv + '.tmp'
        shutil.rmtree(utmp, ignore_errors=True)
        sh(['cp', '-a', rootfs, utmp])
        shift_ids(utmp, UNPRIV_BASE)
        os.rename(utmp, unpriv)
        with open(stamp, 'w') as fh:
            fh.write(base_stamp(release))


def _prepare_base(root):
    """What a PVE template has and debootstrap leaves out: networkd on, no getty storm, a clean machine-id."""
    wants = os.path.join(root, 'etc/systemd/system/multi-user.target.wants')
    os.makedirs(wants, exist_ok=True)
    link = os.path.join(wants, 'systemd-networkd.service')
    if not os.path.lexists(link):
        os.symlink('/lib/systemd/system/systemd-networkd.service', link)
    for unit in ('getty@tty1.service', 'console-getty.service'):
        masked = os.path.join(root, 'etc/systemd/system', unit)
        if not os.path.lexists(masked):
            os.symlink('/dev/null', masked)
    with open(os.path.join(root, 'etc/machine-id'), 'w'):
        pass
    with open(os.path.join(root, 'etc/hostname'), 'w') as fh:
        fh.write('localhost\n')
    sh(['chroot', root, 'apt-get', 'clean'], check=False)


def shift_ids(root, offset):
    """Shift every owner under root by offset (the rootfs of an unprivileged container)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [dirpath] + [os.path.join(dirpath, n) for n in filenames + dirnames]:
            if name != dirpath and os.path.isdir(name) and not os.path.islink(name):
                continue  # the walk visits it as a dirpath
            st = os.lstat(name)
            os.lchown(name, st.st_uid + offset, st.st_gid + offset)
            if not os.path.islink(name):
                os.chmod(name, st.st_mode & 0o7777)  # chown clears setuid bits


# -- the node wheelhouse ----------------------------------------------------------------
def lab_lock(profile='cpu'):
    """The lock of one of the collection's profiles, which the lab's containers build their venvs from: the
    wheelhouse holds exactly its pins (not whatever the index serves as their newest dependencies)."""
    from ...profiles import collection_dir
    return os.path.join(collection_dir(), 'roles', 'torch_venv', 'files', 'profiles', profile, 'requirements.lock')


# What the lab's containers build offline: the CPU profile for Debian 12's Python (inventories/lab), and in a cluster
# lab also the cu130 profile (the CUDA 13 torch from PyPI, 4.5 GB) for Debian 13's, which its PVE 9 node's container
# runs (inventories/lab-cluster: util-c3 on pve3).
WHEELHOUSE = (('cpu', '3.11', False), ('cu130', '3.13', True))
# The profiles' platform, x86_64-manylinux_2_28: every manylinux tag it runs (PEP 600's glibc 2.28 and below, and
# the older names of 2.17, 2.12 and 2.5), for pip download.
PLATFORMS = [arg for tag in ['manylinux_2_{0}_x86_64'.format(m) for m in range(28, 4, -1)] +
             ['manylinux2014_x86_64', 'manylinux2010_x86_64', 'manylinux1_x86_64', 'linux_x86_64']
             for arg in ('--platform', tag)]


def ensure_wheelhouse(lab, say, cluster=False):
    """The wheels of the locks the lab builds from (WHEELHOUSE: a profile and a Python each; the cluster's only in a
    cluster lab) and uv, hash-checked, for x86_64: each set downloaded once into its own directory of the cache (from
    the indexes pip is configured with where they serve them, else torch from the PyTorch CPU index), then linked into
    the node wheelhouse that containers bind-mount, which holds exactly the sets of this lab (a cluster's set leaves it
    when the lab is one node again, and stays in the cache). A lock that changed replaces its set."""
    seeds = [(profile, python) for profile, python, of_cluster in WHEELHOUSE if cluster or not of_cluster]
    earlier = glob.glob(os.path.join(lab.wheel_cache, '*.whl')) + glob.glob(os.path.join(lab.wheel_cache, 'stamp'))
    if earlier:  # the cache's earlier layout, one set in the cache itself, whose wheels were all the wheelhouse's
        for path in earlier + glob.glob(os.path.join(lab.wheelhouse, '*.whl')):
            os.unlink(path)
    pip = [sys.executable, '-m', 'pip', 'download', '--disable-pip-version-check', '-q', '--only-binary=:all:',
           '--no-deps'] + PLATFORMS
    sets = []
    for profile, python in seeds:
        lock = lab_lock(profile)
        with open(lock, 'rb') as fh:
            want = hashlib.sha256(fh.read()).hexdigest()
        where = _wheel_set(lab, '{0}-{1}'.format(profile, python), want, say,
                           'the {0} profile\'s wheels for Python {1}'.format(profile, python))
        if where is not None:
            target = pip + ['--python-version', python, '--implementation', 'cp', '--abi',
                            'cp' + python.replace('.', ''), '-d', where]
            got = sh(target + ['--require-hashes', '-r', lock], check=False)
            if got.returncode != 0:
                say('the {0} lock\'s torch is not served locally; taking it from the PyTorch CPU index'.format(profile))
                sh(target + ['--require-hashes', '--extra-index-url', PYTORCH_CPU_INDEX, '-r', lock])
            _wheel_set_done(where, want)
        sets.append(os.path.join(lab.wheel_cache, '{0}-{1}'.format(profile, python)))
    where = _wheel_set(lab, 'uv', UV_PIN, say, UV_PIN)
    if where is not None:
        sh(pip + ['-d', where, UV_PIN])
        _wheel_set_done(where, UV_PIN)
    sets.append(os.path.join(lab.wheel_cache, 'uv'))
    wanted = dict((os.path.basename(p), p) for d in sets for p in glob.glob(os.path.join(d, '*.whl')))
    ours = set(os.path.basename(p) for p in glob.glob(os.path.join(lab.wheel_cache, '*', '*.whl')))
    os.makedirs(lab.wheelhouse, exist_ok=True)
    for path in glob.glob(os.path.join(lab.wheelhouse, '*.whl')):
        name = os.path.basename(path)
        if name in ours and name not in wanted:
            os.unlink(path)  # a set this lab does not use now, or of an older lock (a test's own wheels stay)
    for name, path in wanted.items():
        dest = os.path.join(lab.wheelhouse, name)
        if not os.path.exists(dest):
            try:
                os.link(path, dest)
            except OSError:
                shutil.copy2(path, dest)


def _wheel_set(lab, name, want, say, what):
    """The cache's directory of one set of wheels, emptied for a download where its stamp is not want (None where it
    is complete)."""
    where = os.path.join(lab.wheel_cache, name)
    if _read(os.path.join(where, 'stamp')) == want:
        return None
    say('downloading {0} into the lab\'s cache (once)'.format(what))
    shutil.rmtree(where, ignore_errors=True)
    os.makedirs(where)
    return where


def _wheel_set_done(where, want):
    with open(os.path.join(where, 'stamp'), 'w') as fh:
        fh.write(want)


def make_template(path, python3=True, release='bookworm'):
    """A small container template at path, as `pveam download` leaves one: a zstd-compressed tar of a root file
    system whose entries start with ./ (PVE's templates are made so). It holds the release's (RELEASES) top
    directories, its os-release, and /usr/bin/python3 as Debian has it (a link to python3.11 in Debian 12, python3.13
    in 13) unless python3 is False. The lab's containers are made from the release's Debian base, not from this file:
    the file is what a node's template looks like to a check that reads it (`pvesm path`, then its list of files)."""
    about = RELEASES[release]
    import io
    import tarfile
    import time
    data = io.BytesIO()
    now = int(time.time())

    def add(name, kind=tarfile.DIRTYPE, text=b'', target='', mode=0o755):
        info = tarfile.TarInfo('./' + name if name else '.')
        info.type, info.mode, info.mtime, info.linkname, info.size = kind, mode, now, target, len(text)
        tar.addfile(info, io.BytesIO(text) if kind == tarfile.REGTYPE else None)

    with tarfile.open(fileobj=data, mode='w', format=tarfile.GNU_FORMAT) as tar:
        add('')
        for name in ('etc', 'root', 'tmp', 'usr', 'usr/bin', 'usr/lib', 'usr/sbin', 'var'):
            add(name)
        for name in ('bin', 'lib', 'sbin'):
            add(name, tarfile.SYMTYPE, target='usr/' + name)
        add('etc/os-release', tarfile.REGTYPE, 'PRETTY_NAME="Debian GNU/Linux {0} ({1})"\nID=debian\n'
            'VERSION_ID="{0}"\n'.format(about['debian'], release).encode(), mode=0o644)
        add('usr/bin/sh', tarfile.SYMTYPE, target='dash')
        add('usr/bin/dash', tarfile.REGTYPE, b'\x7fELF', mode=0o755)
        if python3:
            add('usr/bin/python3', tarfile.SYMTYPE, target='python' + about['python'])
            add('usr/bin/python' + about['python'], tarfile.REGTYPE, b'\x7fELF', mode=0o755)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    part = path + '.part'
    made = subprocess.run(['zstd', '-q', '-f', '-o', part], input=data.getvalue(), stderr=subprocess.PIPE)
    if made.returncode != 0:
        raise LabError('zstd could not write {0}: {1}'.format(part, made.stderr.decode(errors='replace').strip()))
    os.replace(part, path)


def ensure_templates(lab):
    """Each node's templates (one per release the lab offers, which fakepve lists in its storage `local`) as files in
    the node's own `local` storage, where `pvesm path` finds them: made where they are missing."""
    for node in lab.cluster():
        for release, about in RELEASES.items():
            path = os.path.join(node.storage_path('local'), 'template', 'cache', about['template'])
            if not os.path.exists(path):
                make_template(path, release=release)
