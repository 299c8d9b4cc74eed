"""`pvesm` for a lab node: `pvesm path VOLUME`, answered as PVE's own for the node's dir storage `local`.

PVE (pve-storage src/PVE/CLI/pvesm.pm, `path`) prints PVE::Storage::path of the volume: the volume id parsed
(src/PVE/Storage.pm parse_volume_id: "unable to parse volume ID"), its storage looked up in storage.cfg ("storage
'X' does not exist"), and the dir plugin's path of the volume name (src/PVE/Storage/Plugin.pm parse_volname and
get_subdir: a template, vztmpl/<name>.tar.{gz,xz,zst,bz2}, lives in <path>/template/cache, an ISO in
<path>/template/iso, a backup in <path>/dump). The path is printed whether or not the file is there. Errors go
to stderr with exit 255, as a PVE command that dies. The lab's `local` is the node's own directory (Lab.storage_path);
its `local-lvm` holds the containers' volumes in the lab's LXC directory, with no path of PVE's shape, so a volume
of it is refused with a message that says so.
"""

import os
import re
import sys

from .layout import Lab

USAGE = 'USAGE: pvesm path <volume>\n\n  the lab\'s pvesm knows `path` only'
VOLUME_ID = re.compile(r'^([a-z][a-z0-9\-_.]*[a-z0-9]):(.+)$', re.I)
# the dir plugin's volume names of the content types a template storage holds, and their subdirectories
VOLUME_NAMES = (
    (re.compile(r'^vztmpl/([^/]+\.tar\.(?:gz|xz|zst|bz2))$'), 'template/cache'),
    (re.compile(r'^iso/([^/]+\.(?:iso|img))$', re.I), 'template/iso'),
    (re.compile(r'^backup/([^/]+\.(?:tgz|tar|tar\.(?:gz|lzo|zst)|vma(?:\.(?:gz|lzo|zst))?))$'), 'dump'),
)


class PvesmError(Exception):
    pass


def path(lab, volume):
    """The path PVE gives the volume on this node, or PvesmError with PVE's message."""
    m = VOLUME_ID.match(volume)
    if not m:
        raise PvesmError("unable to parse volume ID '{0}'".format(volume))
    sid, name = m.groups()
    if sid == 'local-lvm':
        raise PvesmError("the lab's storage 'local-lvm' holds its volumes in the lab's LXC directory, with no path "
                         "as PVE's lvmthin gives one")
    if sid != 'local':
        raise PvesmError("storage '{0}' does not exist".format(sid))
    for pattern, subdir in VOLUME_NAMES:
        found = pattern.match(name)
        if found:
            return os.path.join(lab.storage_path(sid), subdir, found.group(1))
    raise PvesmError("unable to parse directory volume name '{0}'".format(name))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != 'path':
        print(USAGE, file=sys.stderr)
        return 255
    try:
        print(path(Lab.here(), argv[1]))
    except PvesmError as e:
        print(e, file=sys.stderr)
        return 255
    return 0


if __name__ == '__main__':
    sys.exit(main())
