#!/bin/sh
# Lose a host of a test cluster for good, as a crashed node whose disk is gone.
#
#   scripts/cluster/remove-host.sh [--silent] DIR HOST     (root)
#
# SIGKILLs every process in HOST's namespaces at once (a crash: nothing flushed or synced; its
# FUSE mounts are lazily unmounted first so no process stays blocked on them), then deletes its
# network namespace (its veth leaves the bridge) and its directory DIR/hosts/HOST, SSD directory
# included. Peers see the host's TCP connections closed by its kernel as the processes die.
# With --silent the host's link to the bridge is cut first, as in a power loss: peers get no FIN
# or RST and only notice by their timeouts.
# The other hosts keep running; down.sh still stops them. Exits 1 naming what could not be
# removed. Removing a host already gone succeeds.
set -eu

silent=false
if [ "${1:-}" = "--silent" ]; then
    silent=true
    shift
fi
if [ $# -ne 2 ]; then
    echo "usage: $0 [--silent] DIR HOST" >&2
    exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "$0: must run as root" >&2
    exit 1
fi
here=$(cd "$(dirname "$0")" && pwd)
dir=$(cd "$1" && pwd -P)
host=$2
case "$host" in
    '' | */* | .* | sw) echo "$0: bad host name '$host'" >&2; exit 2 ;;
esac
tag=$(cat "$dir/run/tag" 2>/dev/null) || {
    echo "$0: no cluster in $dir" >&2
    exit 1
}
# shellcheck source=scripts/cluster/lib.sh
. "$here/lib.sh"

ns=spw-$tag-$host
if [ "$silent" = true ] && [ -e "/run/netns/$ns" ]; then
    # The switch end of the host's veth: deleting it takes the host's eth0 with it.
    ip -n "spw-$tag-sw" link delete "$host" 2>/dev/null || true
fi
ids="$(netns_id "$ns") $(host_mnt_id "$host")"
unmount_fuse_in "$host"
# shellcheck disable=SC2086
alive=$(kill_processes_in $ids)
if [ -n "$alive" ]; then
    echo "$0: processes of $host still alive: $(echo $alive)" >&2
    exit 1
fi
if [ -e "/run/netns/$ns" ]; then
    ip netns delete "$ns"
fi
rm -f "$dir/run/$host.pid"
left=$(mounts_under "$dir/hosts/$host")
if [ -n "$left" ]; then
    echo "$0: mounts under $dir/hosts/$host are left ($(echo $left)); not deleting it" >&2
    exit 1
fi
rm -rf "$dir/hosts/$host"
