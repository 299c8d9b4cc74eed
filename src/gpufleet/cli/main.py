"""`gpufleet`: run the fleet's playbooks and the local lab.

    gpufleet up            provision the fleet (site.yml)
    gpufleet drift [--fix] report the fleet's drift (check mode), or repair it and verify
    gpufleet verify        verify every container (read only)
    gpufleet doctor        before a first run: what the fleet needs that is missing, each with its fix
                           (changes nothing; exit 0 ready, 1 not ready)
    gpufleet driver-upgrade [--version V] [--check]
                           roll the nodes' NVIDIA driver one node at a time (driver_upgrade.yml); --check
                           says, node by node, the containers it stops and every step (exit 0 done or
                           planned, 1 a node failed: the roll stopped there)
                           each with -i, --limit or --node NODE (a node and its containers), --forks, -e,
                           --vault-password-file, --json, -v;
                           exit codes: 0 clean, 1 error, 4 hosts unreachable, and for drift 2 drift found
    gpufleet lab up [--nodes N] [--gpus 8,4,0] [--drivers V1,V2,V3]
                           bring the local Proxmox lab up (idempotent): one node, pve1, or a cluster of N
                           (pve1..pveN, sshd on 2201..), each with its GPU count and driver version
    gpufleet lab status    the lab's nodes, services and containers, API and LXC side by side
    gpufleet lab reset     destroy every lab container; the lab stays up
    gpufleet lab reboot-node [NODE]   reboot a node: its containers stop, its NVIDIA device nodes go (uvm's
                           major changes), its boot units run, its onboot containers start
    gpufleet lab node-down NODE       the node goes down: its containers and sshd stop, the cluster sees it offline
    gpufleet lab node-up NODE         the node boots again (as reboot-node's second half)
    gpufleet lab down      take the lab away, leaving nothing behind
    gpufleet profile lock DIR [--find-links WHEELHOUSE] [--python X.Y]   regenerate a venv profile's hash-locked lock
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
        if args.action != 'up' and (args.nodes, args.gpus, args.drivers) != (None, None, None):
            raise LabError('--nodes, --gpus and --drivers are options of gpufleet lab up')
        if args.action in ('node-down', 'node-up') and not args.node:
            raise LabError('which node? (gpufleet lab {0} NODE)'.format(args.action))
        done = None
        if args.action == 'up':
            try:
                import fakepve  # noqa: F401 - the lab's PVE API
            except ImportError:
                raise LabError("the lab's packages are not installed: pip install 'gpufleet[lab]' (a controller "
                               "of a real cluster does not need them)")
            st = manager.up(say=say, nodes=args.nodes, gpus=args.gpus, drivers=args.drivers)
        elif args.action == 'down':
            manager.down(say=say)
            return 0
        elif args.action == 'reset':
            st = manager.reset(say=say)
        elif args.action in ('reboot-node', 'node-down', 'node-up'):
            step = {'reboot-node': manager.reboot_node, 'node-down': manager.node_down,
                    'node-up': manager.node_up}[args.action]
            done = step(name=args.node, say=say)
            st = manager.status()
        else:
            st = manager.status()
    except LabError as e:
        print('gpufleet lab {0}: {1}'.format(args.action, e), file=sys.stderr)
        return 1
    if args.json and done is not None:
        st[args.action.replace('-', '_')] = done
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
    lab = sub.add_parser('lab', help='the local Proxmox lab')
    lab.add_argument('action', choices=('up', 'down', 'status', 'reset', 'reboot-node', 'node-down', 'node-up'))
    lab.add_argument('node', nargs='?', help='reboot-node, node-down, node-up: the node (reboot-node: pve1 by default)')
    lab.add_argument('--nodes', type=int, help='up: how many nodes the cluster has (1 to 4; default: as it is)')
    lab.add_argument('--gpus', help='up: GPU stand-ins per node, one count or one per node (8,4,0)')
    lab.add_argument('--drivers', help='up: the NVIDIA driver version per node, one or one per node; a Debian '
                     'version (535.261.03-1 of bookworm, 550.163.01-2 of trixie) makes a node on Debian\'s own '
                     'packages (default for --nodes 3: 580.95.05,535.261.03-1,550.163.01-2)')
    lab.add_argument('--json', action='store_true', help='print the status as JSON')
    lab.set_defaults(func=lab_command)
    profile = sub.add_parser('profile', help="a venv profile's lock")
    profile.add_argument('action', choices=('lock', 'check'))
    profile.add_argument('directory', help='the profile directory (pyproject.toml, profile.yml)')
    profile.add_argument('--find-links', help='resolve offline from this wheelhouse only')
    profile.add_argument('--python', action='append', metavar='X.Y',
                         help='lock for this one of the profile\'s Pythons only (repeat it for more); default: all')
    profile.set_defaults(func=profile_command)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == '__main__':
    sys.exit(main())
