#!/bin/sh
# Stop the shared PFS that scripts/cluster/pfs-up.sh started in a test cluster, leaving the
# cluster running.
#
#   scripts/cluster/pfs-down.sh DIR        (root)
#
# Lazily unmounts the PFS in every client host and stops its mfsmount (TERM, then KILL; bounded),
# stops mfschunkserver and mfsmaster in the server host (TERM, then KILL; bounded),
# removes the tc shaping, the server's data (DIR/hosts/SERVER/pfs) and DIR/pfs.env. Exits 1
# naming any PFS process left. Idempotent: without DIR/pfs.env there is nothing to do.
# scripts/cluster/down.sh needs none of this: it stops every process and mount of the hosts.
set -eu

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "$0: must run as root" >&2
    exit 1
fi
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$1" ] || exit 0
dir=$(cd "$1" && pwd -P)
[ -f "$dir/pfs.env" ] || exit 0
tag=$(cat "$dir/run/tag" 2>/dev/null || true)
# shellcheck source=scripts/cluster/lib.sh
. "$here/lib.sh"
PFS_SERVER= PFS_MOUNT= PFS_CLIENTS= PFS_DATA=
# shellcheck disable=SC1091
. "$dir/pfs.env"

# Pids of the processes named (comm) one of the words of $2 in host $1's namespaces.
named_in() {
    for pid in $(pids_in $(netns_id "spw-$tag-$1") $(host_mnt_id "$1")); do
        case " $2 " in
            *" $(cat "/proc/$pid/comm" 2>/dev/null) "*) echo "$pid" ;;
        esac
    done
}
# TERM, up to 5 s, KILL, up to 5 s, of the processes named one of the words of $2 in host $1
# (mfsmaster stores its metadata on TERM, in a few seconds).
stop_named() {
    for signal in TERM KILL; do
        pids=$(named_in "$1" "$2")
        [ -n "$pids" ] || return 0
        # shellcheck disable=SC2086
        kill "-$signal" $pids 2>/dev/null || true
        waited=0
        while [ -n "$(named_in "$1" "$2")" ] && [ "$waited" -lt 50 ]; do
            sleep 0.1
            waited=$((waited + 1))
        done
    done
}

left=
if [ -n "$tag" ]; then
    for host in $PFS_CLIENTS; do
        [ -e "/run/netns/spw-$tag-$host" ] || continue
        if [ -s "$dir/run/$host.pid" ] && [ -d "/proc/$(cat "$dir/run/$host.pid")" ]; then
            nsenter --target "$(cat "$dir/run/$host.pid")" --mount -- \
                umount -l "$PFS_MOUNT" 2>/dev/null || true
        fi
        stop_named "$host" mfsmount
        [ -z "$(named_in "$host" mfsmount)" ] || left="$left mfsmount in $host;"
    done
    if [ -n "$PFS_SERVER" ] && [ -e "/run/netns/spw-$tag-$PFS_SERVER" ]; then
        stop_named "$PFS_SERVER" "mfschunkserver mfsmaster"
        [ -z "$(named_in "$PFS_SERVER" "mfschunkserver mfsmaster")" ] \
            || left="$left mfschunkserver or mfsmaster in $PFS_SERVER;"
        ip netns exec "spw-$tag-sw" tc qdisc del dev "$PFS_SERVER" root 2>/dev/null || true
        ip netns exec "spw-$tag-$PFS_SERVER" tc qdisc del dev eth0 root 2>/dev/null || true
    fi
fi
if [ -n "$left" ]; then
    echo "$0: PFS of $dir not fully stopped; left:$left" >&2
    exit 1
fi
case "$PFS_DATA" in
    "$dir"/hosts/*/pfs) [ -n "$(mounts_under "$PFS_DATA")" ] || rm -rf "$PFS_DATA" ;;
esac
rmdir "$PFS_MOUNT" 2>/dev/null || true
rm -f "$dir/pfs.env"
