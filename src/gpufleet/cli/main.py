"""`gpufleet`: run the fleet's playbooks and the local lab.

    gpufleet up            provision the fleet (site.yml)
    gpufleet drift [--fix] report the fleet's drift (check mode), or repair it and verify
    gpufleet verify        verify every container (read only)
                           each with -i, --limit, --forks, -e, --vault-password-file, --json, -v;
                           exit codes: 0 clean, 1 error, 2 drift found, 4 hosts unreachable
    gpufleet lab up        bring the local Proxmox lab node up (idempotent)
    gpufleet lab status    the lab's services and its containers, API and LXC side by side
    gpufleet lab reset     destroy every lab container; the lab stays up
    gpufleet lab reboot-node [NODE]   reboot the lab node: containers stop, the NVIDIA device nodes go (uvm's
                           major changes), the node's boot units run, onboot containers start
    gpufleet lab down      take the lab away, leaving nothing behind
    gpufleet profile lock DIR [--find-links WHEELHOUSE]   regenerate a venv profile's hash-locked lock
    gpufleet profile check DIR                            a profile's input and lock agree
"""

import argparse
import sys

from .. import __version__


def lab_command(args):
    from ..lab import manager
    from ..lab.host import LabError
    say = (lambda *a: None) if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        if args.action == 'up':
            st = manager.up(say=say)
        elif args.action == 'down':
            manager.down(say=say)
            return 0
        elif args.action == 'reset':
            st = manager.reset(say=say)
        elif args.action == 'reboot-node':
            lab = manager.Lab()
            if args.node not in (None, lab.node):
                raise LabError('the lab has one node, {0}, not {1}'.format(lab.node, args.node))
            done = manager.reboot_node(lab, say=say)
            st = manager.status(lab)
            if args.json:
                st['reboot'] = done
        else:
            st = manager.status()
    except LabError as e:
        print('gpufleet lab {0}: {1}'.format(args.action, e), file=sys.stderr)
        return 1
    print(manager.dumps(st) if args.json else manager.render_status(st))
    if args.action == 'status' and not st['api_running']:
        return 3
    return 0


def profile_command(args):
    from .. import profiles
    return profiles.main(args)


def build_parser():
    parser = argparse.ArgumentParser(prog='gpufleet', description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split('\n\n', 1)[1])
    parser.add_argument('--version', action='version', version='gpufleet ' + __version__)
    sub = parser.add_subparsers(dest='command', required=True)
    from . import fleet
    fleet.add_parsers(sub)
    lab = sub.add_parser('lab', help='the local Proxmox lab node')
    lab.add_argument('action', choices=('up', 'down', 'status', 'reset', 'reboot-node'))
    lab.add_argument('node', nargs='?', help='reboot-node: the node (the lab has one)')
    lab.add_argument('--json', action='store_true', help='print the status as JSON')
    lab.set_defaults(func=lab_command)
    profile = sub.add_parser('profile', help="a venv profile's lock")
    profile.add_argument('action', choices=('lock', 'check'))
    profile.add_argument('directory', help='the profile directory (pyproject.toml, profile.yml)')
    profile.add_argument('--find-links', help='resolve offline from this wheelhouse only')
    profile.set_defaults(func=profile_command)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == '__main__':
    sys.exit(main())
