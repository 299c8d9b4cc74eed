"""Bind a host file or directory into a running container: the lab's hotplug.

    python -m gpufleet.lab.inject PID SOURCE TARGET [--dir] [--owner UID]

PVE hot-applies a new devN or mpN to a running container.  The lab does the same
with the mount API: clone the host node (open_tree), enter the container's mount
namespace (setns), create the mount point as the container's root (owner UID on
the host) and attach the clone there (move_mount).  It runs as its own process
because setns needs a single-threaded caller.
"""

import argparse
import ctypes
import os
import sys

SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = 0o2000000
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
CLONE_NEWNS = 0x00020000


def fail(what):
    err = ctypes.get_errno()
    sys.exit('inject: {0}: {1}'.format(what, os.strerror(err)))


def main(argv=None):
    parser = argparse.ArgumentParser(prog='gpufleet.lab.inject')
    parser.add_argument('pid', type=int)
    parser.add_argument('source')
    parser.add_argument('target')
    parser.add_argument('--dir', action='store_true')
    parser.add_argument('--owner', type=int, default=0)
    args = parser.parse_args(argv)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (AT_RECURSIVE if args.dir else 0)
    tree = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, args.source.encode(), flags)
    if tree < 0:
        fail('open_tree ' + args.source)
    ns = os.open('/proc/{0}/ns/mnt'.format(args.pid), os.O_RDONLY)
    if libc.setns(ns, CLONE_NEWNS) != 0:
        fail('setns')
    os.chdir('/')
    if not os.path.lexists(args.target):
        # The mount point belongs to the container's root, whose id on the host is --owner.
        os.setegid(args.owner)
        os.seteuid(args.owner)
        try:
            if args.dir:
                os.makedirs(args.target, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(args.target), exist_ok=True)
                open(args.target, 'a').close()
        finally:
            os.seteuid(0)
            os.setegid(0)
    elif not args.dir and os.path.isdir(args.target):
        # as LXC.pm device_passthrough_hotplug's sysopen(O_CREAT) of the file to bind the node onto
        sys.exit("failed to create '{0}': {1}".format(args.target, os.strerror(21)))
    if libc.syscall(SYS_MOVE_MOUNT, tree, b'', AT_FDCWD, args.target.encode(), MOVE_MOUNT_F_EMPTY_PATH) < 0:
        fail('move_mount ' + args.target)
    return 0


if __name__ == '__main__':
    sys.exit(main())
