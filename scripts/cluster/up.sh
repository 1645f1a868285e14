#!/bin/sh
# Start a test cluster of N hosts, each a set of Linux namespaces on this machine.
#
#   scripts/cluster/up.sh DIR N        (root; stop with scripts/cluster/down.sh DIR)
#
# Host i is named host<i> and has address 10.213.<x>.<i>/24, where <x> (1..254) is the first free
# cluster number; the cluster's tag is c<x> and every network namespace it makes is spw-c<x>-*:
# a switch namespace (spw-c<x>-sw) holding the bridge br0, and per host a namespace
# spw-c<x>-host<i> whose eth0 is one end of a veth pair (the other end, host<i>, is a port of
# br0). Nothing changes in this machine's own network namespace.
# Each host also has its own hostname (UTS namespace) and mount namespace, in which /tmp and
# /var/tmp are DIR/hosts/<name>/tmp and var-tmp, /run/munge is a private tmpfs and /etc/hosts
# lists every host. Everything else (the repository, PFS directories) is shared, as on a cluster
# with a shared file system; DIR, the repository and each path of SPILLWAY_CLUSTER_KEEP stay
# visible at their own paths even when they lie under /tmp or /var/tmp (a clone or a target
# directory there holds the binaries the hosts run). Each host runs munged on the
# default socket /run/munge/munge.socket.2 with the cluster's key DIR/munge.key (0400), so munge
# clients in a host need no flags. DIR/hosts/<name>/ssd is the host's SSD directory by convention.
# A holder process per host keeps its namespaces alive; scripts/cluster/exec.sh enters them.
#
# Writes DIR/cluster.env (shell-sourceable) and prints it:
#   CLUSTER_DIR CLUSTER_TAG CLUSTER_SUBNET CLUSTER_HOSTS CLUSTER_ADDRS (same order as the hosts)
#   and per host CLUSTER_ADDR_<name> CLUSTER_NETNS_<name> CLUSTER_SSD_<name>.
# On failure it tears down what it made (scripts/cluster/down.sh DIR) and exits non-zero.
#
# Environment: SPILLWAY_CLUSTER_TIMEOUT seconds to wait for each host to come up (default 20).
#   SPILLWAY_CLUSTER_KEEP: colon-separated directories that every host must see at their paths
#   (besides DIR and the repository); ones that do not exist are ignored.
#   SPILLWAY_CLUSTER_OWNER_PID: a process that owns the cluster (a test). A watchdog runs
#   down.sh DIR and removes DIR when that process is gone without having stopped the cluster
#   (killed test runs leave nothing behind); down.sh stops the watchdog.
set -eu

if [ $# -ne 2 ]; then
    echo "usage: $0 DIR N" >&2
    exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "$0: must run as root (network and mount namespaces)" >&2
    exit 1
fi
for tool in ip unshare nsenter munged munge unmunge mount hostname; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "$0: $tool not found (Debian packages iproute2, util-linux, munge)" >&2
        exit 1
    fi
done
count=$2
case "$count" in
    '' | *[!0-9]*) echo "$0: N must be a number of hosts, got '$count'" >&2; exit 2 ;;
esac
if [ "$count" -lt 1 ] || [ "$count" -gt 200 ]; then
    echo "$0: N must be 1..200, got $count" >&2
    exit 2
fi

here=$(cd "$(dirname "$0")" && pwd)
dir=$(mkdir -p "$1" && cd "$1" && pwd -P)
timeout=${SPILLWAY_CLUSTER_TIMEOUT:-20}
# The mount table escapes these characters, so down.sh could not recognize mounts under DIR.
case "$dir" in
    *[[:space:]\\]*) echo "$0: DIR must not contain whitespace or backslashes: '$dir'" >&2; exit 2 ;;
esac
owner=${SPILLWAY_CLUSTER_OWNER_PID:-}
# The directories a host's private /tmp and /var/tmp must not hide, resolved, colon-separated.
keep=$dir
add_kept() {
    resolved=$(cd "$1" 2>/dev/null && pwd -P) || return 0
    case "$resolved" in
        *:*) echo "$0: cannot keep '$resolved' visible in the hosts: it contains a colon" >&2; exit 2 ;;
    esac
    keep="$keep:$resolved"
}
add_kept "$here/../.."
old_ifs=$IFS
IFS=:
set -f
for path in ${SPILLWAY_CLUSTER_KEEP:-}; do
    IFS=$old_ifs
    add_kept "$path"
done
set +f
IFS=$old_ifs
case "$owner" in
    *[!0-9]*) echo "$0: SPILLWAY_CLUSTER_OWNER_PID must be a pid, got '$owner'" >&2; exit 2 ;;
esac
if [ -n "$owner" ] && [ ! -d "/proc/$owner" ]; then
    echo "$0: SPILLWAY_CLUSTER_OWNER_PID $owner is not running" >&2
    exit 2
fi
if [ -e "$dir/run/tag" ]; then
    echo "$0: $dir already holds a cluster ($(cat "$dir/run/tag")); stop it with $here/down.sh $dir" >&2
    exit 1
fi

chmod 0755 "$dir"
mkdir -p "$dir/run" "$dir/log" "$dir/hosts" "$dir/etc"
chmod 0755 "$dir/run" "$dir/log" "$dir/hosts" "$dir/etc"

# Claim a cluster number: `ip netns add` creates /run/netns/<name> exclusively, so the switch
# namespace is the lock that keeps two clusters started at once apart.
start=$(( $(od -An -N2 -tu2 /dev/urandom | tr -d ' ') % 254 ))
tag=
tries=0
while [ "$tries" -lt 254 ]; do
    x=$(( (start + tries) % 254 + 1 ))
    if error=$(ip netns add "spw-c$x-sw" 2>&1); then
        tag=c$x
        break
    fi
    if [ ! -e "/run/netns/spw-c$x-sw" ]; then
        # Not taken by another cluster: ip netns itself failed.
        echo "$0: ip netns add spw-c$x-sw: $error" >&2
        exit 1
    fi
    tries=$((tries + 1))
done
if [ -z "$tag" ]; then
    echo "$0: no free cluster number (254 namespaces spw-c*-sw exist; stop old clusters with down.sh)" >&2
    exit 1
fi
echo "$tag" > "$dir/run/tag"
trap 'status=$?; if [ "$status" -ne 0 ]; then echo "$0: failed; tearing down" >&2; "$here/down.sh" "$dir" >&2 || true; fi' EXIT
# Interrupted: exit, so that the EXIT trap tears down what was made.
trap 'exit 130' INT TERM

subnet=10.213.$x
# Jumbo frames, as on an HPC cluster's data network (Ethernet 9000; IPoIB even 65520).
mtu=9000
switch=spw-$tag-sw
ip -n "$switch" link set lo up
ip -n "$switch" link add br0 mtu "$mtu" type bridge
ip -n "$switch" link set br0 up

# /etc/hosts of every host: this machine's plus the cluster's names.
{
    cat /etc/hosts 2>/dev/null || true
    echo "# spillway test cluster $tag"
    i=1
    while [ "$i" -le "$count" ]; do
        echo "$subnet.$i host$i"
        i=$((i + 1))
    done
} > "$dir/etc/hosts"
chmod 0644 "$dir/etc/hosts"

# The cluster's munge key, shared by every host's munged like on a real cluster.
if [ ! -f "$dir/munge.key" ]; then
    dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 2>/dev/null
fi
chmod 0400 "$dir/munge.key"
# The mount point of each host's private /run/munge tmpfs (munged's default socket directory).
mkdir -p /run/munge

# The holder's script: runs inside the new UTS and mount namespaces, sets them up, then sleeps
# forever. Arguments: name, private directory, DIR, ready file, the kept directories
# (colon-separated).
cat > "$dir/run/holder.sh" <<'HOLDER'
#!/bin/sh
set -euf
name=$1 private=$2 dir=$3 ready=$4 keep=$5
hostname "$name"
# OWN mounted over ROOT, still showing each kept directory under ROOT at its path.
private_over() {
    root=$1 own=$2
    old_ifs=$IFS
    IFS=:
    for path in $keep; do
        case "$path" in
            "$root"/*)
                rel=${path#"$root"/}
                mkdir -p "$own/$rel"
                mount --bind "$path" "$own/$rel"
                ;;
        esac
    done
    IFS=$old_ifs
    mount --rbind "$own" "$root"
}
private_over /tmp "$private/tmp"
private_over /var/tmp "$private/var-tmp"
mount -t tmpfs -o mode=0755,size=16m "munge-$name" /run/munge
mount --bind "$dir/etc/hosts" /etc/hosts
echo $$ > "$ready"
exec sleep infinity
HOLDER
chmod 0755 "$dir/run/holder.sh"

wait_for() { # FILE WHAT: bounded wait until FILE exists
    waited=0
    while [ ! -s "$1" ]; do
        if [ "$waited" -ge "$((timeout * 10))" ]; then
            echo "$0: $2 not ready after ${timeout}s" >&2
            return 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

i=1
while [ "$i" -le "$count" ]; do
    name=host$i
    ns=spw-$tag-$name
    private=$dir/hosts/$name
    mkdir -p "$private/tmp" "$private/var-tmp" "$private/ssd" "$private/munge"
    chmod 1777 "$private/tmp" "$private/var-tmp"
    chmod 0755 "$private" "$private/ssd"
    chmod 0700 "$private/munge"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$switch" link add "$name" mtu "$mtu" type veth peer name eth0 mtu "$mtu" netns "$ns"
    ip -n "$switch" link set "$name" master br0 up
    ip -n "$ns" addr add "$subnet.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    rm -f "$dir/run/$name.pid"
    # ip netns exec and unshare both exec in place: the holder's pid is this job's pid.
    ip netns exec "$ns" unshare --uts --mount --propagation slave \
        "$dir/run/holder.sh" "$name" "$private" "$dir" "$dir/run/$name.pid" "$keep" \
        </dev/null >"$dir/log/$name-holder.log" 2>&1 &
    wait_for "$dir/run/$name.pid" "$name (holder; log $dir/log/$name-holder.log)"
    pid=$(cat "$dir/run/$name.pid")
    nsenter --target "$pid" --uts --mount --net -- munged --force \
        --socket=/run/munge/munge.socket.2 \
        --key-file="$dir/munge.key" \
        --pid-file="$private/munge/munged.pid" \
        --log-file="$dir/log/$name-munged.log" \
        --seed-file="$private/munge/munged.seed"
    waited=0
    until nsenter --target "$pid" --mount -- sh -c 'munge -n | unmunge' >/dev/null 2>&1; do
        if [ "$waited" -ge "$((timeout * 10))" ]; then
            echo "$0: munged on $name does not answer after ${timeout}s; log $dir/log/$name-munged.log" >&2
            exit 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    i=$((i + 1))
done

{
    echo "CLUSTER_DIR=$dir"
    echo "CLUSTER_TAG=$tag"
    echo "CLUSTER_SUBNET=$subnet.0/24"
    hosts= addrs=
    i=1
    while [ "$i" -le "$count" ]; do
        hosts="$hosts${hosts:+ }host$i"
        addrs="$addrs${addrs:+ }$subnet.$i"
        i=$((i + 1))
    done
    echo "CLUSTER_HOSTS='$hosts'"
    echo "CLUSTER_ADDRS='$addrs'"
    i=1
    while [ "$i" -le "$count" ]; do
        echo "CLUSTER_ADDR_host$i=$subnet.$i"
        echo "CLUSTER_NETNS_host$i=spw-$tag-host$i"
        echo "CLUSTER_SSD_host$i=$dir/hosts/host$i/ssd"
        i=$((i + 1))
    done
} > "$dir/cluster.env"
chmod 0644 "$dir/cluster.env"

if [ -n "$owner" ]; then
    # The owner's start time tells it apart from a later process that reuses its pid.
    started() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }
    owner_start=$(started "$owner")
    # Detached (own session, no inherited streams) so the owner's terminal or pipes do not
    # wait for it; it keeps running when up.sh exits.
    setsid sh -c '
        echo $$ > "$1/run/watchdog.pid"
        while [ "$(sed "s/.*) //" "/proc/$2/stat" 2>/dev/null | cut -d" " -f20)" = "$3" ]; do
            sleep 1
        done
        echo "owner $2 gone: stopping the cluster"
        SPILLWAY_CLUSTER_WATCHDOG=1 "$4/down.sh" "$1" && rm -rf "$1"
    ' watchdog "$dir" "$owner" "$owner_start" "$here" </dev/null >>"$dir/log/watchdog.log" 2>&1 &
    waited=0
    until [ -s "$dir/run/watchdog.pid" ] || [ "$waited" -ge 50 ]; do
        sleep 0.1
        waited=$((waited + 1))
    done
fi
cat "$dir/cluster.env"
