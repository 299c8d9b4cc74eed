"""Translate a PVE container config into the real LXC config of a lab container.

Pure functions, so that what the lab makes of each PVE key can be read and tested
in one place.  PVE itself writes `lxc.cgroup2.*` lines; the lab writes the keys
for the host's cgroup version (`cgroup_v2=False` on a cgroup v1 host) and
translates raw `lxc.cgroup2.*` entries the same way.
"""

import os
import re
import stat

from .layout import UNPRIV_BASE, UNPRIV_RANGE

# The device rules LXC's common.conf sets, restated after the includes because
# userns.conf empties them: deny all, then what every container needs.
BASE_DEVICE_RULES = ('c *:* m', 'b *:* m', 'c 1:3 rwm', 'c 1:5 rwm', 'c 1:7 rwm', 'c 1:8 rwm', 'c 1:9 rwm',
                     'c 5:0 rwm', 'c 5:1 rwm', 'c 5:2 rwm', 'c 136:* rwm', 'c 10:229 rwm')


# The raw keys PVE passes on to LXC (pve-container src/PVE/LXC/Config.pm is_valid_lxc_conf_key: its list, and every
# lxc.cgroup2.*, lxc.prlimit.* and lxc.net.* key; lxc.cgroup.*, lxc.limit.* and the keys LXC 3.0 renamed pass with a
# warning, and LXC itself then refuses the renamed ones). Any other line parse_pct_config warns about and drops when
# it loads the config: the container starts without it.
PVE_RAW_KEYS = frozenset((
    'lxc.apparmor.profile', 'lxc.apparmor.allow_incomplete', 'lxc.apparmor.allow_nesting', 'lxc.apparmor.raw',
    'lxc.selinux.context', 'lxc.include', 'lxc.arch', 'lxc.uts.name', 'lxc.signal.halt', 'lxc.signal.reboot',
    'lxc.signal.stop', 'lxc.init.cmd', 'lxc.init.cwd', 'lxc.init.uid', 'lxc.init.gid', 'lxc.init.groups', 'lxc.pty.max',
    'lxc.console.logfile', 'lxc.console.path', 'lxc.tty.max', 'lxc.devtty.dir', 'lxc.hook.autodev', 'lxc.autodev',
    'lxc.kmsg', 'lxc.mount.fstab', 'lxc.mount.entry', 'lxc.mount.auto', 'lxc.rootfs.mount', 'lxc.cap.drop',
    'lxc.cap.keep', 'lxc.seccomp.profile', 'lxc.seccomp.notify.proxy', 'lxc.seccomp.notify.cookie', 'lxc.idmap',
    'lxc.hook.pre-start', 'lxc.hook.pre-mount', 'lxc.hook.mount', 'lxc.hook.start', 'lxc.hook.stop',
    'lxc.hook.post-stop', 'lxc.hook.clone', 'lxc.hook.destroy', 'lxc.hook.version', 'lxc.log.level', 'lxc.log.file',
    'lxc.start.auto', 'lxc.start.delay', 'lxc.start.order', 'lxc.group', 'lxc.environment',
    'lxc.environment.hooks', 'lxc.sysctl.fs.mqueue', 'lxc.sysctl.kernel.msgmax', 'lxc.sysctl.kernel.msgmnb',
    'lxc.sysctl.kernel.msgmni', 'lxc.sysctl.kernel.sem', 'lxc.sysctl.kernel.shmall', 'lxc.sysctl.kernel.shmmax',
    'lxc.sysctl.kernel.shmmni', 'lxc.sysctl.kernel.shm_rmid_forced',
    # renamed by LXC 3.0 ($deprecated_lxc_conf_keys)
    'lxc.aa_profile', 'lxc.aa_allow_incomplete', 'lxc.console', 'lxc.devttydir', 'lxc.haltsignal', 'lxc.rebootsignal',
    'lxc.stopsignal', 'lxc.id_map', 'lxc.init_cmd', 'lxc.loglevel', 'lxc.logfile', 'lxc.mount', 'lxc.network.type',
    'lxc.network.flags', 'lxc.network.link', 'lxc.network.mtu', 'lxc.network.name', 'lxc.network.hwaddr',
    'lxc.network.ipv4', 'lxc.network.ipv4.gateway', 'lxc.network.ipv6', 'lxc.network.ipv6.gateway',
    'lxc.network.script.up', 'lxc.network.script.down', 'lxc.pts', 'lxc.se_context', 'lxc.seccomp', 'lxc.tty',
    'lxc.utsname'))
PVE_RAW_PREFIXES = ('lxc.cgroup2.', 'lxc.cgroup.', 'lxc.prlimit.', 'lxc.limit.', 'lxc.net.')


def pve_passes(key):
    """Whether PVE passes a raw key of the config on to LXC (see PVE_RAW_KEYS)."""
    return key in PVE_RAW_KEYS or key.startswith(PVE_RAW_PREFIXES)


class ConfigError(Exception):
    """The PVE config cannot be made into a container on this node."""


def split_props(text, default_key=None):
    """Parse a PVE property string ('a=1,b=2', or a leading value for default_key) into a dict."""
    out = {}
    for part in str(text).split(','):
        if not part:
            continue
        key, eq, value = part.partition('=')
        if not eq:
            if default_key is None:
                raise ConfigError('cannot parse {0!r}: {1!r} has no key'.format(text, part))
            key, value = default_key, part
        out[key.strip()] = value.strip()
    return out


def cgroup_key(name, cgroup_v2):
    """`lxc.cgroup2.NAME` or `lxc.cgroup.NAME` with the v1 name of the same limit."""
    if cgroup_v2:
        return 'lxc.cgroup2.' + name
    v1 = {'memory.max': 'memory.limit_in_bytes', 'cpu.max': 'cpu.cfs_quota_us'}.get(name, name)
    return 'lxc.cgroup.' + v1


def translate_raw(key, value, cgroup_v2):
    """A raw lxc.* entry as this host needs it (cgroup2 keys become cgroup keys on a v1 host)."""
    if not cgroup_v2 and key.startswith('lxc.cgroup2.'):
        return cgroup_key(key[len('lxc.cgroup2.'):], False), value
    if cgroup_v2 and key.startswith('lxc.cgroup.'):
        return 'lxc.cgroup2.' + key[len('lxc.cgroup.'):], value
    return key, value


def devices(config):
    """The devN entries, parsed, in index order: [(key, {path, mode?, uid?, gid?, deny-write?})]."""
    found = []
    for key in config:
        m = re.fullmatch(r'dev(\d+)', key)
        if m:
            found.append((int(m.group(1)), key, split_props(config[key], 'path')))
    return [(key, props) for _, key, props in sorted(found)]


# What a devN node is inside the container where its entry gives no mode, uid or gid: 0660 root:root, whatever
# the node's own node is (pve-container src/PVE/LXC.pm create_passthrough_device_node: $passthrough_mode = 0660,
# $uid = $gid = 0), at start and when hot-plugged alike.
DEVN_MODE = 0o660


def device_node(props, dev_dir='/dev'):
    """(char|block, major, minor, mode in the container) of the host node behind a devN entry, or ConfigError
    with PVE's words: pve-container src/PVE/LXC/Tools.pm get_device_mode_and_rdev ("Device $path does not
    exist", "$path is not a device"), which the config change, the create and the start all call."""
    path = props['path']
    if not path.startswith('/dev/'):
        raise ConfigError("device path '{0}' is not under /dev".format(path))
    host = os.path.join(dev_dir, path[len('/dev/'):])
    try:
        st = os.stat(host)
    except FileNotFoundError:
        raise ConfigError("Device {0} does not exist".format(path)) from None
    if stat.S_ISCHR(st.st_mode):
        kind = 'c'
    elif stat.S_ISBLK(st.st_mode):
        kind = 'b'
    else:
        raise ConfigError('{0} is not a device'.format(path))
    mode = int(props['mode'], 8) if props.get('mode') else DEVN_MODE
    return kind, os.major(st.st_rdev), os.minor(st.st_rdev), mode


# LXC's own seccomp profile (common.conf's), which PVE's rules for an unprivileged container extend.
COMMON_SECCOMP = '/usr/share/lxc/config/common.seccomp'


def seccomp_rules(config):
    """The seccomp rules PVE appends to COMMON_SECCOMP for an unprivileged container (pve-container src/PVE/LXC.pm
    make_seccomp_config): keyctl fails with ENOSYS (errno 38) unless its features have keyctl=1 (the feature Docker
    and Podman need there), btrfs ioctls with EPERM, AF_ALG sockets with EAFNOSUPPORT. None for a privileged
    container (LXC's own profile) or one whose raw lines name a profile of its own (which takes precedence)."""
    if str(config.get('unprivileged', '0')) != '1' or any(k == 'lxc.seccomp.profile' for k, _v in config.get('lxc') or []):
        return None
    rules = {'ioctl': ['errno 1 [1,0x9400,SCMP_CMP_MASKED_EQ,0xff00]'], 'socket': ['errno 97 [0,38,SCMP_CMP_EQ]']}
    if split_props(config.get('features') or '').get('keyctl') != '1':
        rules['keyctl'] = ['errno 38']
    return ''.join('{0} {1}\n'.format(name, rule) for name in sorted(rules) for rule in rules[name])


def render(vmid, config, lab, cgroup_v2, rootfs, passthrough, cpus=None):
    """The LXC config text for a container whose root file system is mounted at rootfs (Containers.mount_rootfs).

    passthrough: {devN key: host path of the node the lab made for it}. cpus: the CPUs a container with cores runs
    on (Containers.balanced_cpus); without, its first cores CPUs.
    """
    unpriv = str(config.get('unprivileged', '0')) == '1'
    ct_dir = lab.ct_dir(vmid)
    lines = ['# Written by the gpufleet lab from /etc/pve/lxc/{0}.conf; do not edit.'.format(vmid),
             'lxc.include = /usr/share/lxc/config/common.conf']
    if unpriv:
        lines += ['lxc.include = /usr/share/lxc/config/userns.conf',
                  'lxc.idmap = u 0 {0} {1}'.format(UNPRIV_BASE, UNPRIV_RANGE),
                  'lxc.idmap = g 0 {0} {1}'.format(UNPRIV_BASE, UNPRIV_RANGE)]
    lines += ['lxc.arch = amd64',
              'lxc.uts.name = {0}'.format(config.get('hostname') or 'CT{0}'.format(vmid)),
              'lxc.rootfs.path = dir:{0}'.format(rootfs),
              'lxc.console.logfile = {0}'.format(os.path.join(ct_dir, 'console.log')),
              'lxc.signal.halt = SIGRTMIN+3',
              'lxc.apparmor.profile = unconfined']
    if seccomp_rules(config) is not None:  # Containers.start writes it
        lines.append('lxc.seccomp.profile = {0}'.format(os.path.join(ct_dir, 'rules.seccomp')))
    prefix = 'lxc.cgroup2.' if cgroup_v2 else 'lxc.cgroup.'
    lines.append(prefix + 'devices.deny = a')
    lines += [prefix + 'devices.allow = ' + rule for rule in BASE_DEVICE_RULES]
    lines += network_lines(vmid, config)
    lines += limit_lines(config, cgroup_v2, cpus)
    lines += mount_lines(vmid, config, lab)
    for key, props in devices(config):
        kind, major, minor, _mode = device_node(props, lab.dev_dir)
        access = 'r' if props.get('deny-write') in ('1', 'true') else 'rw'
        target = props['path'].lstrip('/')
        lines.append('lxc.mount.entry = {0} {1} none bind,create=file 0 0'.format(passthrough[key], target))
        lines.append('{0}devices.allow = {1} {2}:{3} {4}'.format(prefix, kind, major, minor, access))
    for key, value in config.get('lxc', []) or []:
        if not pve_passes(key):
            continue
        key, value = translate_raw(key, value, cgroup_v2)
        source = value.split(' ', 1)[0]
        if key == 'lxc.mount.entry' and source.startswith('/dev/'):
            # a raw bind of a device node binds the node's own /dev (each lab node has its own)
            value = os.path.join(lab.dev_dir, source[len('/dev/'):]) + value[len(source):]
        lines.append('{0} = {1}'.format(key, value))
    return '\n'.join(lines) + '\n'


def networks(config):
    """The netN entries, parsed: [(index, props)]."""
    found = []
    for key in config:
        m = re.fullmatch(r'net(\d+)', key)
        if m:
            found.append((int(m.group(1)), split_props(config[key], 'name')))
    return sorted(found, key=lambda x: x[0])


def network_lines(vmid, config):
    lines = []
    for n, (index, props) in enumerate(networks(config)):
        bridge = props.get('bridge')
        if not bridge:
            raise ConfigError('net{0}: no bridge given'.format(index))
        if not os.path.isdir('/sys/class/net/{0}/bridge'.format(bridge)):
            raise ConfigError("bridge '{0}' does not exist".format(bridge))
        p = 'lxc.net.{0}.'.format(n)
        lines += [p + 'type = veth', p + 'link = ' + bridge, p + 'flags = up',
                  p + 'name = ' + props.get('name', 'eth{0}'.format(index)),
                  p + 'veth.pair = veth{0}i{1}'.format(vmid, index)]
        if props.get('hwaddr'):
            lines.append(p + 'hwaddr = ' + props['hwaddr'])
        if props.get('mtu'):
            lines.append(p + 'mtu = ' + props['mtu'])
        ip = props.get('ip')
        if ip and ip not in ('dhcp', 'manual'):
            lines.append(p + 'ipv4.address = ' + ip)
            if props.get('gw'):
                lines.append(p + 'ipv4.gateway = ' + props['gw'])
    return lines


def limit_lines(config, cgroup_v2, cpus=None):
    lines = []
    if config.get('memory'):
        lines.append('{0} = {1}'.format(cgroup_key('memory.max', cgroup_v2), int(config['memory']) * 1024 * 1024))
    if config.get('cores'):
        cpus = cpus or list(range(min(int(config['cores']), os.cpu_count() or 1)))
        lines.append('{0} = {1}'.format(cgroup_key('cpuset.cpus', cgroup_v2), cpu_list(cpus)))
    return lines


def parse_cpus(text):
    """A cpuset list (0-3,6) as CPU numbers."""
    cpus = []
    for part in text.strip().split(','):
        if '-' in part:
            first, last = part.split('-', 1)
            cpus += range(int(first), int(last) + 1)
        elif part:
            cpus.append(int(part))
    return cpus


def cpu_list(cpus):
    """CPU numbers as a cpuset list."""
    return ','.join(str(c) for c in sorted(cpus))


def balanced(cores, taken, all_cpus):
    """The cores CPUs a container gets where the node's other running containers hold taken (a list of their
    CPU lists): those with the fewest containers, lower numbers first. pvestatd leaves a node so within 10 s of a
    start (pve-manager PVE/Service/pvestatd.pm rebalance_lxc_containers: a container with cores gets that many
    CPUs, each moved to a CPU with fewer containers on it); a container without cores runs on every CPU."""
    count = dict((c, 0) for c in all_cpus)
    for cpus in taken:
        for c in cpus:
            if c in count:
                count[c] += 1
    return sorted(sorted(all_cpus, key=lambda c: (count[c], c))[:min(cores, len(all_cpus))])


def mount_lines(vmid, config, lab):
    """mpN: a host path is bind-mounted; a storage volume is a directory of the container's."""
    lines = []
    found = sorted((int(k[2:]), k) for k in config if re.fullmatch(r'mp\d+', k))
    for _, key in found:
        props = split_props(config[key], 'volume')
        volume, target = props.get('volume', ''), props.get('mp')
        if not target:
            raise ConfigError('{0}: no mount point (mp=) given'.format(key))
        if volume.startswith('/'):
            source = volume
            if not os.path.exists(source):
                raise ConfigError("{0}: '{1}' does not exist on the node".format(key, source))
        else:
            source = volume_dir(lab, vmid, volume)
        opts = 'bind,create=dir'
        if props.get('ro') in ('1', 'true'):
            opts += ',ro'
        lines.append('lxc.mount.entry = {0} {1} none {2} 0 0'.format(source, target.lstrip('/'), opts))
    return lines


def volume_dir(lab, vmid, volume):
    """The directory standing in for a storage volume ('local-lvm:vm-101-disk-1')."""
    return os.path.join(lab.ct_dir(vmid), 'volumes', volume.replace(':', '_').replace('/', '_'))


def network_files(config):
    """Files the lab writes into the container at start, as PVE does: {path: text}."""
    files = {}
    for index, props in networks(config):
        name = props.get('name', 'eth{0}'.format(index))
        ip = props.get('ip')
        body = ['[Match]', 'Name={0}'.format(name), '', '[Network]']
        if ip == 'dhcp':
            body.append('DHCP=ipv4')
        elif ip and ip != 'manual':
            body.append('Address={0}'.format(ip))
            if props.get('gw'):
                body.append('Gateway={0}'.format(props['gw']))
        else:
            continue
        files['/etc/systemd/network/{0}.network'.format(name)] = '\n'.join(body) + '\n'
    hostname = config.get('hostname')
    if hostname:
        files['/etc/hostname'] = hostname + '\n'
        files['/etc/hosts'] = ('127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n'
                               '127.0.1.1 {0}\n'.format(hostname))
    if config.get('nameserver'):
        files['/etc/resolv.conf'] = ''.join('nameserver {0}\n'.format(ns) for ns in config['nameserver'].split())
    return files
