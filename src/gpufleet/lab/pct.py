"""`pct` for the lab node: the subcommands the collection uses, with PVE's output shapes.

    pct list
    pct status <vmid>
    pct config <vmid> [--current]
    pct exec <vmid> [--keep-env 0|1] [--] <command> [args...]
    pct push <vmid> <file> <destination> [--user U] [--group G] [--perms MODE]
    pct pull <vmid> <path> <destination> [--user U] [--group G] [--perms MODE]
    pct start|stop|shutdown|reboot <vmid>
    pct set <vmid> [--KEY VALUE ...] [--delete KEYS]

Configs are read from the node's /etc/pve/nodes/<node>/lxc/<vmid>.conf (the lab daemon writes them; the node
is the one whose sshd runs this pct, see Lab.here), so pct sees only its node's containers, as PVE's does; exec,
push and pull enter the real container with lxc-attach; power actions and `set` go through the node's API as
root@pam, as PVE's own pct does.
"""

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request

from . import pveconf
from .containers import Containers
from .layout import Lab

USAGE = __doc__.split('\n\n')[1]


class PctError(Exception):
    pass


def conf(lab, vmid):
    path = lab.pve_conf(vmid)
    try:
        with open(path) as fh:
            return pveconf.parse(fh.read())
    except FileNotFoundError:
        raise PctError("Configuration file 'nodes/{0}/lxc/{1}.conf' does not exist".format(lab.node, vmid)) from None


def vmid_arg(text):
    if not str(text).isdigit() or int(text) < 100:
        raise PctError("400 Parameter verification failed.\nvmid: value must be at least 100 or a valid VM ID")
    return int(text)


# What PVE's CLI handler sets before any command runs (pve-common src/PVE/CLIHandler.pm, run_cli_handler).
CLI_PATH = '/sbin:/bin:/usr/sbin:/usr/bin'


def attach(lab, vmid, argv, keep_env=False, **kwargs):
    """argv in the container through lxc-attach. keep_env: as `pct exec` does by default (pve-container
    src/PVE/CLI/pct.pm, exec: `--keep-env` defaults to 1 on PVE 8 and 9), the caller's environment with PCT's PATH
    and without SSL_CERT_FILE/SSL_CERT_DIR (clean_environment); else lxc's cleared one (with lxc's own PATH)."""
    if keep_env:
        env = dict((k, v) for k, v in os.environ.items() if k not in ('SSL_CERT_FILE', 'SSL_CERT_DIR'))
        env['PATH'] = CLI_PATH
        return subprocess.run(['lxc-attach', '-P', lab.lxcpath, '-n', str(vmid), '--keep-env', '--'] + list(argv),
                              env=env, **kwargs)
    return subprocess.run(['lxc-attach', '-P', lab.lxcpath, '-n', str(vmid), '--clear-env', '--keep-var', 'TERM',
                           '--'] + list(argv), **kwargs)


def need_running(lab, vmid, message):
    conf(lab, vmid)
    if Containers(lab).state(vmid) != 'running':
        raise PctError(message.format(vmid))


def options(args, names):
    """--name value pairs out of args; returns (positional, {name: value})."""
    pos, opts = [], {}
    it = iter(args)
    for arg in it:
        if arg.startswith('--') and arg[2:] in names:
            try:
                opts[arg[2:]] = next(it)
            except StopIteration:
                raise PctError('option {0} needs a value'.format(arg)) from None
        else:
            pos.append(arg)
    return pos, opts


def cmd_list(lab, args):
    rows = []
    if os.path.isdir(lab.pve_conf_dir):
        containers = Containers(lab)
        for name in sorted(os.listdir(lab.pve_conf_dir), key=lambda n: int(n.split('.')[0])
                           if n.split('.')[0].isdigit() else 0):
            if not name.endswith('.conf'):
                continue
            vmid = int(name[:-5])
            config, _ = conf(lab, vmid)
            rows.append((vmid, containers.state(vmid) or 'stopped', config.get('lock', ''),
                         config.get('hostname', 'CT{0}'.format(vmid))))
    if rows:
        print('{0:<10} {1:<10} {2:<12} {3:<20}'.format('VMID', 'Status', 'Lock', 'Name'))
        for row in rows:
            print('{0:<10} {1:<10} {2:<12} {3:<20}'.format(*row))
    return 0


def cmd_status(lab, args):
    vmid = vmid_arg(args[0])
    conf(lab, vmid)
    print('status: {0}'.format(Containers(lab).state(vmid) or 'stopped'))
    return 0


def cmd_config(lab, args):
    current = '--current' in args
    args = [a for a in args if a != '--current']
    vmid = vmid_arg(args[0])
    config, pending = conf(lab, vmid)
    if not current:
        for key, value in pending.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
    for key in sorted(config):
        if key in ('lxc',):
            continue
        value = config[key]
        if key == 'description':
            value = str(value).replace('\n', '\\n')
        print('{0}: {1}'.format(key, value))
    for key, value in config.get('lxc', []):
        print('{0}: {1}'.format(key, value))
    return 0


def cmd_exec(lab, args):
    """As pve-container src/PVE/CLI/pct.pm exec: the options are parsed first (Getopt: a dash argument of the
    command before `--` is an option, and an unknown one fails the call), then the config must exist, the container
    must run (`container '200' not running!`), and a command must be given."""
    vmid = vmid_arg(args[0])
    rest, keep_env, argv = list(args[1:]), True, None
    while rest:
        arg = rest.pop(0)
        if arg == '--':
            argv = rest
            break
        if arg in ('--keep-env', '-keep-env'):
            value = rest.pop(0) if rest else ''
            if value not in ('0', '1'):
                raise PctError("400 Parameter verification failed.\nkeep-env: type check ('boolean') failed - got "
                               "'{0}'".format(value))
            keep_env = value == '1'
        elif arg.startswith('-'):
            raise PctError('Unknown option: {0}\n400 unable to parse option'.format(arg.lstrip('-')))
        else:
            argv = [arg] + rest
            bad = [a for a in rest if a.startswith('-')]
            if bad:
                raise PctError('Unknown option: {0}\n400 unable to parse option'.format(bad[0].lstrip('-')))
            break
    need_running(lab, vmid, "container '{0}' not running!")
    if not argv:
        # PVE dies without a newline here, so Perl adds " at .../PVE/CLI/pct.pm line N." (N varies by release)
        raise PctError('missing command')
    return attach(lab, vmid, argv, keep_env=keep_env).returncode


def cmd_push(lab, args):
    pos, opts = options(args, ('user', 'group', 'perms'))
    if len(pos) != 3:
        raise PctError('usage: pct push <vmid> <file> <destination> [--user U] [--group G] [--perms MODE]')
    vmid, src, dest = vmid_arg(pos[0]), pos[1], pos[2]
    need_running(lab, vmid, 'can only push files to a running CT')  # pct.pm push
    try:
        fh = open(src, 'rb')
    except OSError as e:
        raise PctError('unable to open file {0!r} - {1}'.format(src, e.strerror)) from None
    with fh:
        script = ('umask 077; cat > "$1" || exit 1; chown "$2:$3" "$1" || exit 1; chmod "$4" "$1"')
        proc = attach(lab, vmid, ['sh', '-c', script, 'sh', dest, opts.get('user', '0'), opts.get('group', '0'),
                                  opts.get('perms', '0644')], stdin=fh, stderr=subprocess.PIPE, text=False)
    if proc.returncode != 0:
        raise PctError('failed to push {0} to {1}: {2}'.format(src, dest, proc.stderr.decode().strip()))
    return 0


def cmd_pull(lab, args):
    pos, opts = options(args, ('user', 'group', 'perms'))
    if len(pos) != 3:
        raise PctError('usage: pct pull <vmid> <path> <destination> [--user U] [--group G] [--perms MODE]')
    vmid, src, dest = vmid_arg(pos[0]), pos[1], pos[2]
    need_running(lab, vmid, 'can only pull files from a running VM')  # pct.pm pull (Perl adds its line there)
    if os.path.isdir(dest):
        dest = os.path.join(dest, os.path.basename(src))
    tmp = '{0}.pct-pull.{1}'.format(dest, os.getpid())
    try:
        with open(tmp, 'wb') as out:
            proc = attach(lab, vmid, ['cat', '--', src], stdout=out, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            raise PctError('failed to pull {0}: {1}'.format(src, proc.stderr.decode().strip()))
        if 'perms' in opts:
            os.chmod(tmp, int(opts['perms'], 8))
        if 'user' in opts or 'group' in opts:
            os.chown(tmp, int(opts.get('user', -1)), int(opts.get('group', -1)))
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return 0


# -- through the node's API ------------------------------------------------------------
class Api:
    def __init__(self, lab):
        creds = lab.credentials()
        self.base = 'https://{0}:{1}/api2/json'.format(creds['api_host'], creds['api_port'])
        self.ctx = ssl.create_default_context(cafile=creds['ca_path'])
        data = self._call('POST', '/access/ticket', {'username': 'root@pam', 'password': creds['api_password']})
        self.headers = {'Cookie': 'PVEAuthCookie=' + data['ticket'], 'CSRFPreventionToken': data['CSRFPreventionToken']}
        self.node = lab.node

    def _call(self, method, path, params=None, headers=None):
        body = urllib.parse.urlencode(params or {}).encode() if method != 'GET' else None
        url = self.base + path
        if method == 'GET' and params:
            url += '?' + urllib.parse.urlencode(params)
        req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, context=self.ctx) as resp:
                return json.load(resp)['data']
        except urllib.error.HTTPError as e:
            raise PctError('{0} {1}'.format(e.code, e.reason)) from None

    def call(self, method, path, params=None):
        return self._call(method, path, params, self.headers)

    def wait(self, upid):
        while True:
            st = self.call('GET', '/nodes/{0}/tasks/{1}/status'.format(self.node, urllib.parse.quote(upid)))
            if st['status'] == 'stopped':
                if st.get('exitstatus') != 'OK':
                    log = self.call('GET', '/nodes/{0}/tasks/{1}/log'.format(self.node, urllib.parse.quote(upid)))
                    for line in log:
                        print(line['t'], file=sys.stderr)
                    raise PctError(st.get('exitstatus') or 'task failed')
                return
            time.sleep(0.1)


def cmd_power(action):
    def run(lab, args):
        vmid = vmid_arg(args[0])
        conf(lab, vmid)
        api = Api(lab)
        api.wait(api.call('POST', '/nodes/{0}/lxc/{1}/status/{2}'.format(api.node, vmid, action)))
        return 0
    return run


def cmd_set(lab, args):
    vmid = vmid_arg(args[0])
    conf(lab, vmid)
    params = {}
    rest = args[1:]
    if len(rest) % 2:
        raise PctError('usage: pct set <vmid> [--KEY VALUE ...]')
    for key, value in zip(rest[::2], rest[1::2]):
        if not key.startswith('--'):
            raise PctError('unexpected argument {0!r}'.format(key))
        params[key[2:]] = value
    if not params:
        raise PctError('no options specified')
    api = Api(lab)
    api.call('PUT', '/nodes/{0}/lxc/{1}/config'.format(api.node, vmid), params)
    return 0


COMMANDS = {'list': cmd_list, 'status': cmd_status, 'config': cmd_config, 'exec': cmd_exec, 'push': cmd_push,
            'pull': cmd_pull, 'start': cmd_power('start'), 'stop': cmd_power('stop'),
            'shutdown': cmd_power('shutdown'), 'reboot': cmd_power('reboot'), 'set': cmd_set}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ('help', '-h', '--help') or argv[0] not in COMMANDS:
        print(USAGE, file=sys.stderr)
        return 0 if argv and argv[0] in ('help', '-h', '--help') else 2
    name, args = argv[0], argv[1:]
    if name != 'list' and not args:
        print('400 not enough arguments\n' + USAGE, file=sys.stderr)
        return 2
    try:
        return COMMANDS[name](Lab.here(), args)
    except PctError as e:
        print(e, file=sys.stderr)
        return 255


if __name__ == '__main__':
    sys.exit(main())
