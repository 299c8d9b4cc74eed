"""The pieces of the lab node on the host: each one made by `up` and taken away by `down`.

Every function here is idempotent.  What `up` changes outside the lab's own
directories (device nodes, the bridge, NAT, sysctls, /etc/subuid, the `pct`
link) is written down in the lab's host record, and `down` undoes exactly that.
"""

import datetime
import glob
import ipaddress
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid

from .layout import DRIVER_VERSION, GATEWAY, SUBNET_PREFIX, TORCH_PIN, UNPRIV_BASE, UNPRIV_RANGE, UV_PIN, write_json

BASE_PACKAGES = ('systemd-sysv', 'python3', 'python3-venv', 'ca-certificates', 'iproute2', 'procps')
BASE_STAMP = 'bookworm minbase ' + ' '.join(BASE_PACKAGES)
DEBIAN_MIRROR = os.environ.get('GPUFLEET_LAB_MIRROR', 'http://deb.debian.org/debian')
PYTORCH_CPU_INDEX = 'https://download.pytorch.org/whl/cpu'
NFT_TABLE = 'gpufleet_lab'


class LabError(Exception):
    """The lab cannot be brought up here; the message says why and what to do."""


def sh(argv, check=True, **kwargs):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    if check and proc.returncode != 0:
        raise LabError('{0} failed ({1}):\n{2}'.format(' '.join(argv), proc.returncode,
                                                       (proc.stderr or proc.stdout).strip()[-2000:]))
    return proc


# -- preflight ---------------------------------------------------------------------
def preflight():
    """What stops the lab from running on this host, as a list of plain sentences (empty: all good)."""
    problems = []
    if os.geteuid() != 0:
        problems.append('the lab needs root (it makes LXC containers, device nodes and a bridge)')
    for tool, package in (('lxc-start', 'lxc'), ('debootstrap', 'debootstrap'), ('sshd', 'openssh-server'),
                          ('nft', 'nftables'), ('ip', 'iproute2'), ('gcc', 'gcc')):
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
    """Debian 12 minbase with systemd and python3, built once with debootstrap, plus a copy owned
    by the unprivileged id range.  Both live in the cache and survive `down`."""
    stamp = os.path.join(os.path.dirname(lab.base_rootfs), 'stamp')
    if _read(stamp) != BASE_STAMP or not os.path.isfile(os.path.join(lab.base_rootfs_unpriv, 'sbin', 'init')):
        say('building the Debian 12 base with debootstrap (once; about 90 s)')
        parent = os.path.dirname(lab.base_rootfs)
        tmp = lab.base_rootfs + '.tmp'
        for path in (tmp, lab.base_rootfs, lab.base_rootfs_unpriv):
            shutil.rmtree(path, ignore_errors=True)
        os.makedirs(parent, exist_ok=True)
        sh(['debootstrap', '--variant=minbase', '--include=' + ','.join(BASE_PACKAGES), 'bookworm', tmp,
            DEBIAN_MIRROR])
        _prepare_base(tmp)
        os.rename(tmp, lab.base_rootfs)
        utmp = lab.base_rootfs_unpriv + '.tmp'
        shutil.rmtree(utmp, ignore_errors=True)
        sh(['cp', '-a', lab.base_rootfs, utmp])
        shift_ids(utmp, UNPRIV_BASE)
        os.rename(utmp, lab.base_rootfs_unpriv)
        with open(stamp, 'w') as fh:
            fh.write(BASE_STAMP)


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
def ensure_wheelhouse(lab, say):
    """The torch build the lab pins, its dependencies and uv, for cp311 on x86_64: downloaded once into
    the cache (the machine's local torch file where pip serves one, else the PyTorch CPU index), then
    linked into the node wheelhouse that containers bind-mount."""
    cache = lab.wheel_cache
    os.makedirs(cache, exist_ok=True)
    stamp = os.path.join(cache, 'stamp')
    want = '{0} {1}'.format(TORCH_PIN, UV_PIN)
    if _read(stamp) != want:
        say('seeding the node wheelhouse with {0} and {1}'.format(TORCH_PIN, UV_PIN))
        target = ['--only-binary=:all:', '--python-version', '3.11', '--implementation', 'cp', '--abi', 'cp311',
                  '--platform', 'manylinux_2_28_x86_64', '--platform', 'manylinux_2_17_x86_64',
                  '--platform', 'manylinux2014_x86_64', '--platform', 'linux_x86_64', '-d', cache]
        pip = [sys.executable, '-m', 'pip', 'download', '--disable-pip-version-check', '-q']
        got = sh(pip + target + ['--no-deps', TORCH_PIN], check=False)
        if got.returncode != 0:
            say('torch is not served locally; taking it from the PyTorch CPU index')
            sh(pip + target + ['--no-deps', '--index-url', PYTORCH_CPU_INDEX, TORCH_PIN])
        sh(pip + target + ['--find-links', cache, TORCH_PIN, UV_PIN])
        with open(stamp, 'w') as fh:
            fh.write(want)
    os.makedirs(lab.wheelhouse, exist_ok=True)
    for path in glob.glob(os.path.join(cache, '*.whl')):
        dest = os.path.join(lab.wheelhouse, os.path.basename(path))
        if not os.path.exists(dest):
            try:
                os.link(path, dest)
            except OSError:
                shutil.copy2(path, dest)


# -- GPU stand-ins ------------------------------------------------------------------
def real_nvidia(dev_dir):
    return bool(glob.glob(os.path.join(dev_dir, 'nvidia[0-9]*'))) or os.path.exists('/proc/driver/nvidia/version')


def free_dynamic_major():
    """A character major that /proc/devices does not list, from the top of the dynamic range down,
    the way the kernel hands one to nvidia-uvm."""
    used = set()
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


def ensure_gpus(lab, record, say):
    """N /dev/nvidiaN (195:N), nvidiactl (195:255), nvidia-modeset (195:254), nvidia-uvm and
    nvidia-uvm-tools on a dynamic major, listed in the lab's /proc/devices with the stand-in driver's
    version file.  Made only where no real NVIDIA device nodes exist."""
    gpus = record.get('gpus')
    if gpus is None:
        if real_nvidia(lab.dev_dir):
            say('real NVIDIA device nodes found: the lab uses them and makes no stand-ins')
            record['gpus'] = {'real': True, 'created': [], 'nodes': []}
            return
        uvm = free_dynamic_major()
        nodes = [('nvidia{0}'.format(i), 195, i) for i in range(lab.gpus)]
        nodes += [('nvidiactl', 195, 255), ('nvidia-modeset', 195, 254), ('nvidia-uvm', uvm, 0),
                  ('nvidia-uvm-tools', uvm, 1)]
        gpus = record['gpus'] = {'real': False, 'created': [], 'uvm_major': uvm, 'count': lab.gpus,
                                 'nodes': [[os.path.join(lab.dev_dir, n), ma, mi] for n, ma, mi in nodes]}
    for path, major, minor in gpus['nodes']:
        # /dev is rebuilt at boot: make again whatever is gone.
        if not os.path.exists(path):
            os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
            os.chmod(path, 0o666)
            if path not in gpus['created']:
                gpus['created'].append(path)
    if not gpus['real']:
        write_proc(lab, gpus['uvm_major'])


NVIDIA_SMI = """#!/bin/sh
# gpufleet lab: nvidia-smi for the GPU stand-ins (no GPU, no driver behind them).
version={version}
count={count}
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
          uuid) v=$(printf 'GPU-1ab0c0de-0000-4000-8000-%012d' $i) ;;
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


def write_proc(lab, uvm_major):
    os.makedirs(os.path.join(lab.proc_dir, 'driver', 'nvidia'), exist_ok=True)
    with open(os.path.join(lab.proc_dir, 'devices'), 'w') as fh:
        fh.write('Character devices:\n  1 mem\n  5 /dev/tty\n136 pts\n195 nvidia-frontend\n'
                 '{0} nvidia-uvm\n\nBlock devices:\n  7 loop\n'.format(uvm_major))
    smi = lab.path('driver', 'bin', 'nvidia-smi')
    _write(smi, NVIDIA_SMI.format(version=DRIVER_VERSION, count=lab.gpus).encode(), 0o755)
    build_driver_libs(lab.path('driver', 'lib'), DRIVER_VERSION)
    with open(os.path.join(lab.proc_dir, 'driver', 'nvidia', 'version'), 'w') as fh:
        fh.write('NVRM version: NVIDIA UNIX x86_64 Kernel Module  {0}  Tue Sep 30 12:00:00 UTC 2025\n'
                 'GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n'.format(DRIVER_VERSION))


# The userspace half of the stand-in driver: real ELF libraries with NVIDIA's names and sonames,
# so that a container can be given "the node's driver" and its version checked, as on a real node.
DRIVER_LIBS = {'libcuda': 'libcuda.so.1', 'libnvidia-ml': 'libnvidia-ml.so.1',
               'libnvidia-ptxjitcompiler': 'libnvidia-ptxjitcompiler.so.1'}


def build_driver_libs(directory, version):
    os.makedirs(directory, exist_ok=True)
    src = os.path.join(directory, 'standin.c')
    with open(src, 'w') as fh:
        fh.write('/* gpufleet lab: a stand-in for the NVIDIA userspace driver (no GPU behind it). */\n'
                 'const char *gpufleet_standin_driver_version(void) { return "%s"; }\n' % version)
    for name, soname in DRIVER_LIBS.items():
        target = os.path.join(directory, '{0}.so.{1}'.format(name, version))
        if not os.path.exists(target):
            sh(['gcc', '-shared', '-fPIC', '-Wl,-soname,' + soname, '-o', target, src])
    os.unlink(src)


def remove_gpus(record):
    for path in record.get('gpus', {}).get('created', []):
        if os.path.exists(path):
            os.unlink(path)


# -- network ---------------------------------------------------------------------------
def ensure_network(lab, record):
    """The lab bridge (vmbr0, as on a PVE node) with the gateway address and NAT to the host."""
    if not os.path.isdir('/sys/class/net/{0}'.format(lab.bridge)):
        sh(['ip', 'link', 'add', lab.bridge, 'type', 'bridge'])
        record['bridge'] = lab.bridge
    addrs = sh(['ip', '-4', '-o', 'addr', 'show', 'dev', lab.bridge]).stdout
    if GATEWAY + '/' not in addrs:
        sh(['ip', 'addr', 'add', GATEWAY + '/24', 'dev', lab.bridge])
    sh(['ip', 'link', 'set', lab.bridge, 'up'])
    if 'ip_forward' not in record:
        record['ip_forward'] = _read('/proc/sys/net/ipv4/ip_forward').strip()
    with open('/proc/sys/net/ipv4/ip_forward', 'w') as fh:
        fh.write('1')
    subnet = str(ipaddress.ip_network(SUBNET_PREFIX + '.0/24'))
    if sh(['nft', 'list', 'table', 'ip', NFT_TABLE], check=False).returncode != 0:
        rules = ('table ip {0} {{\n chain postrouting {{\n  type nat hook postrouting priority 100;\n'
                 '  ip saddr {1} ip daddr != {1} masquerade\n }}\n}}\n').format(NFT_TABLE, subnet)
        sh(['nft', '-f', '-'], input=rules)
        record['nat'] = True


def remove_network(record):
    if record.get('nat'):
        sh(['nft', 'delete', 'table', 'ip', NFT_TABLE], check=False)
    if record.get('bridge'):
        sh(['ip', 'link', 'del', record['bridge']], check=False)
    if record.get('ip_forward') in ('0', '1'):
        with open('/proc/sys/net/ipv4/ip_forward', 'w') as fh:
            fh.write(record['ip_forward'])


# -- TLS and credentials ------------------------------------------------------------------
def ensure_tls(lab):
    """A lab CA and a server certificate it signs, for the API address: clients verify it with ca_path."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    server = os.path.join(lab.tls_dir, 'server.pem')
    now = datetime.datetime.now(datetime.timezone.utc)
    if os.path.exists(server) and os.path.exists(lab.ca_file):
        with open(server, 'rb') as fh:
            cert = x509.load_pem_x509_certificate(fh.read())
        if cert.not_valid_after_utc > now + datetime.timedelta(days=7):
            return
    os.makedirs(lab.tls_dir, mode=0o700, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'gpufleet lab CA')])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName('localhost'), x509.DNSName(lab.node),
             x509.IPAddress(ipaddress.ip_address(lab.api_host))]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, lab.node)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=825))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    _write(lab.ca_file, ca.public_bytes(pem), 0o644)
    _write(server, cert.public_bytes(pem), 0o644)
    _write(os.path.join(lab.tls_dir, 'server.key'),
           key.private_bytes(pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()),
           0o600)


def ensure_credentials(lab):
    """The lab's logins (kept across `up`s): root@pam's password, an API token, and how to reach the node."""
    if os.path.exists(lab.credentials_file):
        return lab.credentials()
    creds = {
        'api_host': lab.api_host, 'api_port': lab.api_port, 'api_user': 'root@pam',
        'api_password': secrets.token_urlsafe(18), 'api_token_id': 'gpufleet',
        'api_token_secret': str(uuid.uuid4()), 'ca_path': lab.ca_file, 'node': lab.node,
        'ssh_host': '127.0.0.1', 'ssh_port': lab.ssh_port, 'ssh_user': 'root',
        'ssh_private_key_file': os.path.join(lab.ssh_dir, 'id_ed25519'),
        'ssh_known_hosts_file': os.path.join(lab.ssh_dir, 'known_hosts'),
        'wheelhouse': lab.wheelhouse, 'bridge': lab.bridge, 'gateway': GATEWAY,
        'subnet': SUBNET_PREFIX + '.0/24', 'proc_root': lab.proc_dir,
    }
    write_json(lab.credentials_file, creds, mode=0o600)
    return creds


# -- sshd -------------------------------------------------------------------------------
def ensure_sshd(lab):
    """A real sshd on a loopback port that takes the lab's key for root: the node as Ansible reaches it."""
    d = lab.ssh_dir
    os.makedirs(d, mode=0o700, exist_ok=True)
    host_key = os.path.join(d, 'ssh_host_ed25519_key')
    client_key = os.path.join(d, 'id_ed25519')
    for key in (host_key, client_key):
        if not os.path.exists(key):
            sh(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-C', 'gpufleet-lab', '-f', key])
    with open(client_key + '.pub') as fh:
        _write(os.path.join(d, 'authorized_keys'), fh.read().encode(), 0o600)
    with open(host_key + '.pub') as fh:
        host_pub = fh.read().split()
    known = '[127.0.0.1]:{0} {1} {2}\n'.format(lab.ssh_port, host_pub[0], host_pub[1])
    _write(os.path.join(d, 'known_hosts'), known.encode(), 0o644)
    config = '\n'.join([
        'ListenAddress 127.0.0.1:{0}'.format(lab.ssh_port),
        'HostKey ' + host_key,
        'PidFile ' + os.path.join(d, 'sshd.pid'),
        'AuthorizedKeysFile ' + os.path.join(d, 'authorized_keys'),
        'PermitRootLogin prohibit-password',
        'PasswordAuthentication no',
        'KbdInteractiveAuthentication no',
        'UsePAM no',
        'MaxSessions 64',
        'MaxStartups 64:30:128',
        'AcceptEnv LANG LC_*',
        'Subsystem sftp /usr/lib/openssh/sftp-server',
    ]) + '\n'
    _write(os.path.join(d, 'sshd_config'), config.encode(), 0o600)
    if _alive(os.path.join(d, 'sshd.pid')):
        return
    os.makedirs('/run/sshd', mode=0o755, exist_ok=True)
    sh(['/usr/sbin/sshd', '-f', os.path.join(d, 'sshd_config')])
    _wait_pidfile(os.path.join(d, 'sshd.pid'))


def stop_sshd(lab):
    _kill(os.path.join(lab.ssh_dir, 'sshd.pid'))


# -- pct ----------------------------------------------------------------------------------
def ensure_pct(lab, record):
    """`pct` on the node's PATH, running the lab's implementation with this Python."""
    text = '#!/bin/sh\n# gpufleet lab: pct for the lab node\nexec {0} -m gpufleet.lab.pct "$@"\n'.format(
        sys.executable)
    if os.path.exists(lab.pct_link) and _read(lab.pct_link) != text and 'pct' not in record:
        raise LabError('{0} exists and is not the lab\'s: is this a real Proxmox node?'.format(lab.pct_link))
    _write(lab.pct_link, text.encode(), 0o755)
    record['pct'] = lab.pct_link


def remove_pct(record):
    path = record.get('pct')
    if path and os.path.exists(path) and 'gpufleet lab' in _read(path):
        os.unlink(path)


# -- the API daemon -----------------------------------------------------------------------
def code_version():
    """A hash of the lab's own code: a daemon running older code is restarted by `up`."""
    import hashlib
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in sorted(os.listdir(here)):
        if name.endswith('.py'):
            with open(os.path.join(here, name), 'rb') as fh:
                h.update(name.encode() + fh.read())
    return h.hexdigest()[:16]


def start_daemon(lab):
    version_file = lab.path('run', 'pve.version')
    if _alive(lab.daemon_pid):
        if _read(version_file) == code_version():
            return False
        stop_daemon(lab)
    os.makedirs(os.path.dirname(lab.daemon_pid), exist_ok=True)
    os.makedirs(os.path.dirname(lab.daemon_log), exist_ok=True)
    env = dict(os.environ, GPUFLEET_LAB_DIR=lab.root, GPUFLEET_LAB_CACHE=lab.cache, PYTHONUNBUFFERED='1')
    # Fork twice so that the daemon is nobody's child: it outlives this process and is reaped by init.
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            with open(lab.daemon_log, 'ab') as log:
                proc = subprocess.Popen([sys.executable, '-m', 'gpufleet.lab.daemon'], stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT, env=env, close_fds=True)
            with open(lab.daemon_pid, 'w') as fh:
                fh.write(str(proc.pid))
            with open(version_file, 'w') as fh:
                fh.write(code_version())
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    return True


def wait_api(lab, timeout=30):
    import socket
    import ssl
    ctx = ssl.create_default_context(cafile=lab.ca_file)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((lab.api_host, lab.api_port), timeout=1) as raw:
                with ctx.wrap_socket(raw, server_hostname=lab.api_host):
                    return
        except (OSError, ssl.SSLError):
            if not _alive(lab.daemon_pid):
                raise LabError('the lab API did not start; its log:\n' + _tail(lab.daemon_log))
            if time.monotonic() > deadline:
                raise LabError('the lab API did not answer within {0} s; its log:\n{1}'.format(
                    timeout, _tail(lab.daemon_log)))
            time.sleep(0.1)


def stop_daemon(lab):
    _kill(lab.daemon_pid)


def daemon_running(lab):
    return _alive(lab.daemon_pid)


def sshd_running(lab):
    return _alive(os.path.join(lab.ssh_dir, 'sshd.pid'))


# -- cgroups LXC leaves behind ---------------------------------------------------------------
def remove_lxc_cgroups():
    """Empty `lxc.*` cgroups the lab's containers leave in every controller (cgroup v1 and v2)."""
    for path in sorted(glob.glob('/sys/fs/cgroup/*/lxc.*') + glob.glob('/sys/fs/cgroup/lxc.*'),
                       key=len, reverse=True):
        for sub in sorted((p for p, _, _ in os.walk(path)), key=len, reverse=True):
            try:
                os.rmdir(sub)
            except OSError:
                pass


# -- small helpers ----------------------------------------------------------------------
def _read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ''


def _tail(path, n=20):
    return '\n'.join(_read(path).splitlines()[-n:])


def _write(path, data, mode):
    """path holding data with mode, replaced in one rename; left as it is (its mtime too) when it holds them already,
    as a real node's driver files stay put while nothing upgrades them (a driver bundle is current by mtime)."""
    try:
        st = os.stat(path)
        if stat.S_IMODE(st.st_mode) == mode and st.st_size == len(data):
            with open(path, 'rb') as fh:
                if fh.read() == data:
                    return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with os.fdopen(os.open(path + '.tmp', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), 'wb') as fh:
        fh.write(data)
    os.chmod(path + '.tmp', mode)
    os.replace(path + '.tmp', path)


def _pid(pidfile):
    try:
        return int(_read(pidfile).strip())
    except ValueError:
        return None


def _alive(pidfile):
    pid = _pid(pidfile)
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open('/proc/{0}/stat'.format(pid)) as fh:
            return fh.read().split(') ')[-1][0] != 'Z'
    except OSError:
        return False


def _wait_pidfile(pidfile, timeout=10):
    deadline = time.monotonic() + timeout
    while not _alive(pidfile):
        if time.monotonic() > deadline:
            raise LabError('{0} did not appear'.format(pidfile))
        time.sleep(0.05)


def _kill(pidfile, timeout=15):
    pid = _pid(pidfile)
    if pid and _alive(pidfile):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pidfile) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pidfile):
            os.kill(pid, signal.SIGKILL)
    if os.path.exists(pidfile):
        os.unlink(pidfile)
