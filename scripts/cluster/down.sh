#!/bin/sh
# Stop a test cluster started by scripts/cluster/up.sh and check that nothing is left.
#
#   scripts/cluster/down.sh DIR        (root)
#
# Lazily unmounts FUSE file systems inside the hosts, stops every process in every host's
# namespaces (TERM, then KILL; bounded), deletes the hosts' and the switch's network namespaces
# (their veths and the bridge go with them) and DIR's runtime state (hosts/, run/, etc/,
# munge.key, cluster.env, pfs.env and the mount point of pfs-up.sh's PFS; DIR/log stays). Then
# checks that no network namespace of the cluster's tag, no process in its namespaces and no mount
# mentioning DIR is left, and exits 1 naming what is. Idempotent, and safe after a half-failed
# up.sh or on a DIR that never held a cluster. A shared PFS (pfs-up.sh) stops with the hosts: its
# daemons and FUSE mounts are theirs.
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
if [ ! -d "$1" ]; then
    exit 0
fi
dir=$(cd "$1" && pwd -P)
tag=$(cat "$dir/run/tag" 2>/dev/null || true)
# shellcheck source=scripts/cluster/lib.sh
. "$here/lib.sh"

# The watchdog of an owned cluster (up.sh) is not needed once the cluster is being stopped,
# unless it is the one stopping it.
if [ -z "${SPILLWAY_CLUSTER_WATCHDOG:-}" ] && [ -s "$dir/run/watchdog.pid" ]; then
    watchdog=$(cat "$dir/run/watchdog.pid")
    if grep -q -F -e "$dir" "/proc/$watchdog/cmdline" 2>/dev/null; then
        kill "$watchdog" 2>/dev/null || true
    fi
fi
leftovers=
if [ -n "$tag" ]; then
    namespaces=$(ip netns list | awk '{ print $1 }' | grep -e "^spw-$tag-" || true)
    ids=
    for ns in $namespaces; do
        ids="$ids $(netns_id "$ns")"
        host=${ns#"spw-$tag-"}
        ids="$ids $(host_mnt_id "$host")"
    done
    for ns in $namespaces; do
        unmount_fuse_in "${ns#"spw-$tag-"}"
    done
    # shellcheck disable=SC2086
    alive=$(stop_processes_in $ids)
    for ns in $namespaces; do
        ip netns delete "$ns" 2>/dev/null || true
    done
    left=$(ip netns list | awk '{ print $1 }' | grep -e "^spw-$tag-" || true)
    [ -z "$left" ] || leftovers="$leftovers network namespaces: $left;"
    # shellcheck disable=SC2086
    alive=$(pids_in $ids)
    [ -z "$alive" ] || leftovers="$leftovers processes: $(echo $alive);"
fi

mounts=$(mounts_under "$dir")
case "$dir" in
    # up.sh refuses such a DIR (no cluster was made there); its mounts could not be recognized,
    # so nothing is removed.
    *[[:space:]\\]*) [ -n "$tag" ] || exit 0; mounts="(unrecognizable under '$dir')" ;;
esac
if [ -n "$mounts" ]; then
    leftovers="$leftovers mounts: $(echo $mounts);"
else
    # Only with no mount under DIR is removing its trees sure to stay inside DIR.
    # The shared PFS of pfs-up.sh went with the hosts (its daemons and mounts were theirs).
    pfs_mount=$(sed -n 's/^PFS_MOUNT=//p' "$dir/pfs.env" 2>/dev/null || true)
    [ -z "$pfs_mount" ] || rmdir "$pfs_mount" 2>/dev/null || true
    rm -rf "$dir/hosts" "$dir/run" "$dir/etc" "$dir/munge.key" "$dir/cluster.env" "$dir/pfs.env"
fi
if [ -n "$leftovers" ]; then
    echo "$0: cluster ${tag:-?} in $dir not fully stopped; left:$leftovers" >&2
    exit 1
fi
