#!/bin/sh
# Serve a shared parallel file system (MooseFS) from one host of a test cluster, mount it in
# every other live host, and shape the server host's link to a bandwidth.
#
#   scripts/cluster/pfs-up.sh DIR SERVER_HOST MOUNT_PATH BANDWIDTH_MBIT   (root; a cluster of
#                                                                          scripts/cluster/up.sh)
#
# In SERVER_HOST (its namespaces, through exec.sh): mfsmaster (metadata; ports 9419-9421) and one
# mfschunkserver (data; port 9422), both listening on SERVER_HOST's address only, storing
# everything under DIR/hosts/SERVER_HOST/pfs (their configuration, metadata and chunks: the PFS
# is lost with its host) and running as root with nice 0. Nothing of the machine's /etc or
# services is used. Goal (copies per chunk) 1: there is one chunkserver.
# In every other live host: mfsmount (FUSE) at MOUNT_PATH, which must be DIR or lie under it (so
# it is unique to the cluster); the same path in every client, each mount in its host's mount
# namespace only. Mount options: no data kept in the page cache across opens
# (mfscachemode=NO) and no attribute or directory-entry caching (every stat and lookup asks the
# master), so what one host published is what every other host sees next.
# Shaping (tc tbf, BANDWIDTH_MBIT megabits per second each way): the egress of the switch's port
# toward SERVER_HOST (everything written to the PFS, from every host, shares it) and the egress
# of SERVER_HOST's eth0 (everything read from it).
#
# Writes DIR/pfs.env (shell-sourceable) and prints it:
#   PFS_KIND=moosefs PFS_SERVER PFS_SERVER_ADDR PFS_MOUNT PFS_RATE_MBIT PFS_CLIENTS PFS_DATA
# Stop it alone with scripts/cluster/pfs-down.sh DIR; scripts/cluster/down.sh DIR stops it with
# the cluster (its FUSE mounts and daemons are in the hosts' namespaces). On failure it undoes what
# it did (pfs-down.sh) and exits non-zero naming the step that failed.
#
# Environment: SPILLWAY_CLUSTER_TIMEOUT seconds to wait for the file system to be usable
# (default 20).
set -eu

if [ $# -ne 4 ]; then
    echo "usage: $0 DIR SERVER_HOST MOUNT_PATH BANDWIDTH_MBIT" >&2
    exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "$0: must run as root" >&2
    exit 1
fi
for tool in mfsmaster mfschunkserver mfsmount mfssetgoal tc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "$0: $tool not found (Debian packages moosefs-master, moosefs-chunkserver, moosefs-client, iproute2; scripts/install-deps.sh)" >&2
        exit 1
    fi
done
if [ ! -e /dev/fuse ]; then
    echo "$0: /dev/fuse missing: the clients mount with FUSE" >&2
    exit 1
fi
here=$(cd "$(dirname "$0")" && pwd)
dir=$(cd "$1" 2>/dev/null && pwd -P) || {
    echo "$0: no directory $1" >&2
    exit 1
}
server=$2
mount_path=$3
rate=$4
timeout=${SPILLWAY_CLUSTER_TIMEOUT:-20}
tag=$(cat "$dir/run/tag" 2>/dev/null) || {
    echo "$0: no cluster in $dir (start one with $here/up.sh)" >&2
    exit 1
}
case "$rate" in
    '' | *[!0-9]* | 0*) echo "$0: BANDWIDTH_MBIT must be a positive whole number of Mbit/s, got '$rate'" >&2; exit 2 ;;
esac
case "$mount_path" in
    "$dir" | "$dir"/*) ;;
    *) echo "$0: MOUNT_PATH must be $dir or lie under it (unique to the cluster), got '$mount_path'" >&2; exit 2 ;;
esac
case "$mount_path" in
    *[[:space:]\\]* | */../* | */.. | */./* | */.) echo "$0: MOUNT_PATH must be a plain path without whitespace, backslashes, . or .., got '$mount_path'" >&2; exit 2 ;;
esac
if [ -e "$dir/pfs.env" ]; then
    echo "$0: $dir already serves a PFS ($(tr '\n' ' ' < "$dir/pfs.env")); stop it with $here/pfs-down.sh $dir" >&2
    exit 1
fi
# A host is live when its holder still holds its network namespace (not removed for good).
live() {
    [ -s "$dir/run/$1.pid" ] && [ -e "/run/netns/spw-$tag-$1" ] \
        && [ "$(readlink "/proc/$(cat "$dir/run/$1.pid")/ns/net" 2>/dev/null)" = "net:[$(stat -L -c %i "/run/netns/spw-$tag-$1")]" ]
}
# shellcheck disable=SC1091
. "$dir/cluster.env"
case " $CLUSTER_HOSTS " in
    *" $server "*) ;;
    *) echo "$0: no host '$server' in the cluster at $dir (hosts: $CLUSTER_HOSTS)" >&2; exit 2 ;;
esac
if ! live "$server"; then
    echo "$0: server host $server is not running (removed?)" >&2
    exit 1
fi
address=$(eval "echo \$CLUSTER_ADDR_$server")
clients=
for host in $CLUSTER_HOSTS; do
    if [ "$host" != "$server" ] && live "$host"; then
        clients="$clients${clients:+ }$host"
    fi
done
if [ -z "$clients" ]; then
    echo "$0: no live host besides $server to mount the PFS on" >&2
    exit 1
fi

data=$dir/hosts/$server/pfs
log=$dir/log/pfs
mkdir -p "$log"
# From here on, a failure undoes everything (pfs-down.sh reads pfs.env, written first).
{
    echo "PFS_KIND=moosefs"
    echo "PFS_SERVER=$server"
    echo "PFS_SERVER_ADDR=$address"
    echo "PFS_MOUNT=$mount_path"
    echo "PFS_RATE_MBIT=$rate"
    echo "PFS_CLIENTS='$clients'"
    echo "PFS_DATA=$data"
} > "$dir/pfs.env"
chmod 0644 "$dir/pfs.env"
trap 'status=$?; if [ "$status" -ne 0 ]; then echo "$0: failed; undoing (pfs-down.sh)" >&2; "$here/pfs-down.sh" "$dir" >&2 || true; fi' EXIT
trap 'exit 130' INT TERM

fail() {
    echo "$0: $*" >&2
    exit 1
}
in_host() { # HOST CMD...: runs CMD in HOST
    "$here/exec.sh" "$dir" "$@"
}

# The server: configuration and state under its host's directory.
mkdir -p "$data/master" "$data/chunkserver" "$data/chunks"
cp /var/lib/mfs/metadata.mfs.empty "$data/master/metadata.mfs" \
    || fail "cannot create the empty metadata (moosefs-master's /var/lib/mfs/metadata.mfs.empty)"
echo "* / rw,alldirs,admin,maproot=0:0" > "$data/mfsexports.cfg"
: > "$data/mfstopology.cfg"
echo "$data/chunks" > "$data/mfshdd.cfg"
common="WORKING_USER = root
WORKING_GROUP = root
NICE_LEVEL = 0
DISABLE_OOM_KILLER = 0"
cat > "$data/mfsmaster.cfg" <<EOF
$common
DATA_PATH = $data/master
EXPORTS_FILENAME = $data/mfsexports.cfg
TOPOLOGY_FILENAME = $data/mfstopology.cfg
MATOML_LISTEN_HOST = $address
MATOCS_LISTEN_HOST = $address
MATOCL_LISTEN_HOST = $address
EOF
cat > "$data/mfschunkserver.cfg" <<EOF
$common
DATA_PATH = $data/chunkserver
HDD_CONF_FILENAME = $data/mfshdd.cfg
HDD_LEAVE_SPACE_DEFAULT = 1GiB
BIND_HOST = $address
CSSERV_LISTEN_HOST = $address
MASTER_HOST = $address
EOF
# Both daemonize once they listen; their pids are in the namespaces of $server.
in_host "$server" mfsmaster -c "$data/mfsmaster.cfg" start >"$log/mfsmaster.log" 2>&1 \
    || fail "mfsmaster did not start in $server: $(tail -n 3 "$log/mfsmaster.log")"
in_host "$server" mfschunkserver -c "$data/mfschunkserver.cfg" start >"$log/mfschunkserver.log" 2>&1 \
    || fail "mfschunkserver did not start in $server: $(tail -n 3 "$log/mfschunkserver.log")"

# Shaping: scripts/cluster/shape.sh (tbf on the switch's port toward the server and on its eth0).
"$(dirname "$0")/shape.sh" "$dir" "$server" "$rate" || fail "shaping the link of $server failed"

options=mfscachemode=NO,mfsattrcacheto=0,mfsentrycacheto=0,mfsdirentrycacheto=0,mfsnegentrycacheto=0
for host in $clients; do
    in_host "$host" mkdir -p "$mount_path" || fail "cannot create $mount_path in $host"
    in_host "$host" mfsmount "$mount_path" -H "$address" -o "$options" >"$log/mfsmount-$host.log" 2>&1 \
        || fail "mfsmount of $address in $host failed: $(tail -n 3 "$log/mfsmount-$host.log")"
done
# Usable once the chunkserver has registered its space with the master (before, a write would
# retry for minutes and fail with ENOSPC).
first=${clients%% *}
waited=0
until [ "$(in_host "$first" stat -f -c %a "$mount_path" 2>/dev/null || echo 0)" -gt 0 ]; do
    if [ "$waited" -ge "$((timeout * 10))" ]; then
        fail "the chunkserver in $server registered no space with the master after ${timeout}s (logs in $log)"
    fi
    sleep 0.1
    waited=$((waited + 1))
done
in_host "$first" mfssetgoal -r 1 "$mount_path" >"$log/mfssetgoal.log" 2>&1 \
    || fail "mfssetgoal 1 on $mount_path failed: $(tail -n 3 "$log/mfssetgoal.log")"
cat "$dir/pfs.env"
