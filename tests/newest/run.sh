#!/usr/bin/env bash
# The collection on the newest ansible-core its range allows, which needs a newer Python than this machine's (2.20
# and later need Python 3.12): in a Debian 13 root (Python 3.13) copied from the lab's own Debian 13 base, the
# controller installed as a user installs it there (pip install of the checkout: pyproject.toml's range), then
#   unit    the unit suite
#   smoke   the unit suite, and gpufleet up, drift and verify on the lab (make newest)
#   lab     gpufleet up, drift and verify on the lab only (make test runs unit beside the lab's suites, then this)
# The root shares this machine's network, so its controller reaches the lab's API and nodes as ours does. Run as root
# after `gpufleet lab up` (its Debian 13 base is in the lab's cache). The root is kept in $GPUFLEET_NEWEST_DIR for the
# next run; the lab's cache is only read.
set -euo pipefail
what=${1:-unit}
here=$(cd "$(dirname "$0")/../.." && pwd)
base=${GPUFLEET_LAB_CACHE:-/var/cache/gpufleet-lab}/base-trixie/rootfs
# GPUFLEET_NEWEST_CORE=2.20 (a minor release of the range): its newest ansible-core instead, in a root of its own
core=${GPUFLEET_NEWEST_CORE:-}
work=${GPUFLEET_NEWEST_DIR:-/var/tmp/gpufleet-newest}${core:+-$core}
root=$work/root
[ -x "$base/usr/bin/python3" ] || { echo "no Debian 13 base at $base: bring the lab up first (gpufleet lab up)" >&2; exit 1; }

mounted=()
cleanup() { for m in $(printf '%s\n' "${mounted[@]}" | tac); do umount "$m" 2>/dev/null || umount -l "$m"; done; }
trap cleanup EXIT
bind() { mkdir -p "$root$2"; mount --bind "$1" "$root$2"; mounted+=("$root$2"); }

if [ ! -f "$work/ready" ]; then
    rm -rf "$work" && mkdir -p "$work"
    cp -a "$base" "$root"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
# this machine's certificate authorities, for the package index as this machine reaches it
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/host-ca-certificates.crt"
bind /proc /proc
bind /dev /dev
bind /dev/pts /dev/pts
bind "$here" /src
[ -d /var/lib/gpufleet-lab ] && bind /var/lib/gpufleet-lab /var/lib/gpufleet-lab
cache=${GPUFLEET_LAB_CACHE:-/var/cache/gpufleet-lab}
bind "$cache" "$cache" && mount -o remount,ro,bind "$root$cache"  # what the tests take from it (promtool), read only
in_root() { chroot "$root" /usr/bin/env -i PATH=/venv/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 SSL_CERT_FILE=/etc/ssl/host-ca-certificates.crt "$@"; }

if [ ! -f "$work/ready" ]; then
    # what the controller needs of the system: ssh for the nodes, git for the tests that ask it about the checkout
    in_root sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        openssh-client git ca-certificates >/dev/null'
    cp "$(command -v uv || echo "$here/.venv/bin/uv")" "$root/usr/local/bin/uv"
    in_root uv venv -q /venv --python /usr/bin/python3.13
    # the controller as a user installs it on this Python (pyproject.toml's dependencies: the newest ansible-core its
    # range allows), and what the tests need besides
    in_root uv pip install -q --python /venv/bin/python -e /src pytest prometheus_client ${core:+ansible-core==$core.*}
    touch "$work/ready"
fi
in_root python -c 'import ansible, sys; print("ansible-core {0} on Python {1}".format(ansible.__version__, sys.version.split()[0]))'
[ "$what" = lab ] || in_root sh -c 'cd /src && git config --global --add safe.directory /src && python -m pytest -q -p no:cacheprovider tests/unit'
[ "$what" = unit ] && exit 0
for command in up drift verify; do
    echo "gpufleet $command on the lab"
    in_root sh -c "cd /src && gpufleet $command -i inventories/lab"
done
