#!/bin/sh
# What `make demo-cluster` shows: Spillway on 4 hosts in Linux namespaces (scripts/cluster/up.sh).
#
#   scripts/cluster/demo.sh [SPILLWAY_BINARY]      (root; default: target/release/spillway)
#
# host1-host3 each run a burst buffer server on their own address with munge authentication,
# host1 also the manager (munge-authenticated TCP API); host4 is a compute node: it creates a
# reservation, mounts it, writes a checkpoint (4 ranks, one file each) through the mount, and
# stages it out through the drain path to a local directory playing the PFS. Prints the hosts,
# addresses, bytes, timings and the drain result, verifies every byte (sha256), and always
# tears the cluster down (trap), leaving nothing behind. Exits non-zero on any failure.
#
# Environment: SPILLWAY_DEMO_RANK_MIB (default 16) bytes per rank, in MiB.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
spillway=${1:-$repo/target/release/spillway}
rank_mib=${SPILLWAY_DEMO_RANK_MIB:-16}
ranks=4
if [ "$(id -u)" -ne 0 ]; then
    echo "$0: must run as root (hosts are network and mount namespaces)" >&2
    exit 1
fi
if [ ! -x "$spillway" ]; then
    echo "$0: $spillway not found; build it first (make release)" >&2
    exit 1
fi
case "$rank_mib" in
    '' | *[!0-9]*) echo "$0: SPILLWAY_DEMO_RANK_MIB must be a number" >&2; exit 2 ;;
esac
spillway=$(cd "$(dirname "$spillway")" && pwd)/$(basename "$spillway")

dir=$(mktemp -d /tmp/spillway-demo-cluster.XXXXXX)
finish() {
    status=$?
    echo
    echo "== teardown: scripts/cluster/down.sh"
    if "$here/down.sh" "$dir"; then
        echo "   nothing left: no namespace, process or mount of the cluster"
        rm -rf "$dir"
    else
        echo "   teardown left something behind (see above); logs in $dir/log" >&2
        status=1
    fi
    if [ "$status" -ne 0 ]; then
        echo "demo-cluster FAILED (exit $status); logs were in $dir" >&2
    fi
    exit "$status"
}
trap finish EXIT
trap 'exit 130' INT TERM

on() { # HOST CMD...: run CMD inside HOST
    host=$1
    shift
    "$here/exec.sh" "$dir" "$host" "$@"
}

wait_for_text() { # FILE TEXT WHAT: bounded wait (60 s) until FILE contains TEXT
    waited=0
    until grep -q -- "$2" "$1" 2>/dev/null; do
        if [ "$waited" -ge 600 ]; then
            echo "$0: $3 not ready after 60 s; its log:" >&2
            cat "$1" >&2 || true
            return 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

json_number() { # KEY: the first "KEY":NUMBER of stdin
    sed -n "s/.*\"$1\":\([0-9][0-9]*\).*/\1/p" | head -n 1
}

echo "== 1. four hosts in Linux namespaces (scripts/cluster/up.sh)"
"$here/up.sh" "$dir" 4 >/dev/null
. "$dir/cluster.env"
for host in $CLUSTER_HOSTS; do
    eval "address=\$CLUSTER_ADDR_$host"
    echo "   $host  $address  hostname $(on "$host" hostname)  netns spw-$CLUSTER_TAG-$host"
done
pfs=$dir/pfs
mkdir -p "$pfs" "$dir/manager"
"$spillway" drain mark-pfs "$pfs" >/dev/null

echo "== 2. servers on host1-host3 (auth munge), manager on host1"
peers=
for i in 1 2 3; do
    peers="$peers${peers:+,}$(eval echo "\$CLUSTER_ADDR_host$i"):7200"
done
for i in 1 2 3; do
    eval "address=\$CLUSTER_ADDR_host$i"
    on "host$i" "$spillway" serve --listen "$address:7200" --auth munge \
        --ssd-dir "$dir/hosts/host$i/ssd/bb$i" --dram-bytes 128M --name "bb$i" \
        --pfs-dir "$pfs" --drain-peers "$peers" --drain-self-index $((i - 1)) \
        </dev/null >"$dir/log/bb$i.out" 2>"$dir/log/bb$i.log" &
done
for i in 1 2 3; do
    wait_for_text "$dir/log/bb$i.out" listening "server bb$i"
    echo "   bb$i on host$i: $(cat "$dir/log/bb$i.out")"
done
manager_tcp=$CLUSTER_ADDR_host1:7300
on host1 env SPILLWAY_MANAGER_AUTH=munge SPILLWAY_MANAGER_HEARTBEAT_MS=200 \
    SPILLWAY_MANAGER_FRAGMENT_BYTES=8388608 SPILLWAY_MANAGER_STRIPE_SERVERS_MAX=3 RUST_LOG=info \
    "$spillway" manager \
    --socket "$dir/manager/manager.sock" --db "$dir/manager/manager.db" --listen "$manager_tcp" \
    </dev/null >/dev/null 2>"$dir/log/manager.log" &
wait_for_text "$dir/log/manager.log" "spillway manager listening" "the manager"
echo "   manager on host1: tcp://$manager_tcp (munge)"

# Everything below is the CLI on host4, a compute node, talking to the manager on host1.
cli() {
    on host4 env SPILLWAY_MANAGER="tcp://$manager_tcp" SPILLWAY_MANAGER_AUTH=munge "$spillway" "$@"
}
cli pool create demo --granularity 8MiB >/dev/null
for i in 1 2 3; do
    cli server add "$(eval echo "\$CLUSTER_ADDR_host$i"):7200" --pool demo --capacity 256MiB \
        --pfs "$pfs" >/dev/null
done
waited=0
until [ "$(cli server list --json | grep -o '"auth":"munge"' | wc -l)" -eq 3 ]; do
    if [ "$waited" -ge 600 ]; then
        echo "$0: the manager's heartbeats did not reach the servers in 60 s" >&2
        cli server list >&2 || true
        exit 1
    fi
    sleep 0.1
    waited=$((waited + 1))
done
echo "   host4 registered the servers; the manager's heartbeats (munge) see them up:"
cli server list | sed 's/^/     /'

echo "== 3. host4: a reservation, mounted on host4"
capacity=$((ranks * rank_mib * 2))MiB
reservation=$(cli reservation create --capacity "$capacity" --json)
id=$(echo "$reservation" | json_number id)
epoch=$(echo "$reservation" | json_number epoch)
namespace=$(echo "$reservation" | json_number namespace_id)
servers=$(echo "$reservation" | sed -n 's/.*"servers":\[\([^]]*\)\].*/\1/p' | tr -d '"')
echo "   reservation $id: $capacity, epoch $epoch, servers $servers"
mnt=$dir/mnt
mkdir -p "$mnt"
on host4 "$spillway" mount --servers "$servers" --namespace-id "$namespace" --epoch "$epoch" \
    --background --log "$dir/log/mount.log" "$mnt" >/dev/null
echo "   mounted on host4 at $mnt (a directory every host shares)"

echo "== 4. host4: a checkpoint of $ranks ranks x $rank_mib MiB through the mount"
mkdir -p "$dir/source"
for rank in $(seq 0 $((ranks - 1))); do
    dd if=/dev/urandom of="$dir/source/rank-$rank" bs=1M count="$rank_mib" status=none
done
(cd "$dir/source" && sha256sum rank-*) >"$dir/sums"
started=$(date +%s.%N)
on host4 sh -c "mkdir '$mnt/ckpt' && for f in '$dir/source'/rank-*; do cp \"\$f\" '$mnt/ckpt/' & done; wait; sync"
ended=$(date +%s.%N)
echo "   $mnt/ckpt: host4 sees $(on host4 sh -c "ls '$mnt/ckpt' | wc -l") files; host3 and the machine see no mount there ($(on host3 sh -c "ls -A '$mnt' | wc -l") and $(ls -A "$mnt" | wc -l) entries)"
on host4 "$spillway" umount "$mnt"
bytes=$((ranks * rank_mib * 1048576))
echo "   $bytes bytes written through the mount in $(echo "$started $ended" | awk '{ printf "%.2f", $2 - $1 }') s"

echo "== 5. stage-out through the drain path to the PFS directory"
out=$dir/pfs-out
started=$(date +%s.%N)
report=$(cli stage-out --drain --drain-timeout-s 300 --reservation "$id" /ckpt "$out" --json)
ended=$(date +%s.%N)
copied=$(echo "$report" | json_number files_copied)
drained=$(echo "$report" | json_number files_from_drained_copy)
echo "   epoch $epoch drained by bb1-bb3 to $pfs, then $copied files copied ($drained from the drained copy) in $(echo "$started $ended" | awk '{ printf "%.2f", $2 - $1 }') s"
echo "   published under $pfs: $(find "$pfs" -type f ! -name .spillway-pfs | wc -l) files, $(du -sb "$pfs" | cut -f1) bytes"
(cd "$out" && sha256sum -c --quiet "$dir/sums")
echo "   every byte verified (sha256 of each rank's file)"
if [ "$copied" != "$ranks" ] || [ "$drained" != "$ranks" ]; then
    echo "$0: expected $ranks files staged out from the drained copy: $report" >&2
    exit 1
fi
cli reservation destroy "$id" >/dev/null
echo "   reservation $id destroyed"

echo "== 6. replicas=2 on distinct hosts, and a host lost for good"
reservation=$(cli reservation create --capacity "$capacity" --replicas 2 --persistent twice --json)
epoch=$(echo "$reservation" | json_number epoch)
namespace=$(echo "$reservation" | json_number namespace_id)
servers=$(echo "$reservation" | sed -n 's/.*"servers":\[\([^]]*\)\].*/\1/p' | tr -d '"')
echo "   reservation twice: replicas 2, epoch $epoch, servers $servers"
# A spare server on host4, added after the reservation was placed: re-replication copies there.
on host4 "$spillway" serve --listen "$CLUSTER_ADDR_host4:7200" --auth munge \
    --ssd-dir "$dir/hosts/host4/ssd/bb4" --dram-bytes 128M --name bb4 \
    </dev/null >"$dir/log/bb4.out" 2>"$dir/log/bb4.log" &
wait_for_text "$dir/log/bb4.out" listening "server bb4"
cli server add "$CLUSTER_ADDR_host4:7200" --pool demo --capacity 256MiB --pfs "$pfs" >/dev/null
on host4 "$spillway" mount --servers "$servers" --namespace-id "$namespace" --epoch "$epoch" \
    --replicas 2 --background --log "$dir/log/mount2.log" "$mnt" >/dev/null
on host4 sh -c "mkdir '$mnt/ckpt' && cp '$dir/source'/rank-* '$mnt/ckpt/' && sync"
echo "   $bytes bytes written through a replicas=2 mount on host4: every piece on two hosts"
# host2 (bb2) is lost for good: neither the manager's host nor the client's.
lost=$CLUSTER_ADDR_host2:7200
"$here/remove-host.sh" "$dir" host2
echo "   host2 removed for good: its processes killed, its namespace and SSD directory deleted"
on host4 sh -c "cd '$mnt/ckpt' && sha256sum -c --quiet '$dir/sums'"
echo "   every byte read back through the mount on host4, from the surviving copies"
on host4 "$spillway" umount "$mnt" 2>/dev/null || echo "   (the mount's final sync could not reach $lost)"
cli server lost "$lost" >/dev/null
echo "   root declared $lost lost: $(cli status | grep -m 1 'degraded' || echo 'repair already under way')"
waited=0
until cli reservation show twice --json | grep -q '"state":"restored"'; do
    if [ "$waited" -ge 600 ]; then
        echo "$0: re-replication did not restore two copies in 60 s" >&2
        cli reservation show twice >&2 || true
        exit 1
    fi
    sleep 0.1
    waited=$((waited + 1))
done
servers=$(cli reservation show twice --json | sed -n 's/.*"servers":\[\([^]]*\)\].*/\1/p' | tr -d '"')
echo "   re-replication restored two copies: servers now $servers"
on host4 "$spillway" mount --servers "$servers" --namespace-id "$namespace" --epoch "$epoch" \
    --replicas 2 --background --log "$dir/log/mount3.log" "$mnt" >/dev/null
on host4 sh -c "cd '$mnt/ckpt' && sha256sum -c --quiet '$dir/sums'"
on host4 "$spillway" umount "$mnt"
echo "   every byte read back through a mount of the new server list"
# The job's stage-out (Slurm's data_out): from the restored copies to the PFS.
out=$dir/pfs-out-twice
cli stage-out --reservation twice /ckpt "$out" >/dev/null
(cd "$out" && sha256sum -c --quiet "$dir/sums")
echo "   staged out from the restored copies to $out: every byte verified (sha256)"
cli reservation destroy twice >/dev/null
