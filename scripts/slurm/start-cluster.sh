#!/bin/sh
# Start Slurm on a namespace test cluster (scripts/cluster/up.sh): the machine's (Debian 12:
# 22.05), or Debian 13's 24.11 from the root SPILLWAY_SLURM_ROOT names. slurmctld on the first
# host, one slurmd per host (NodeName=<host> NodeAddr=<host address>), Spillway's burst buffer
# hooks (burst_buffer/lua) and its per-node Prolog/Epilog that mount each job's reservation on
# every node of the job.
#
#   scripts/slurm/start-cluster.sh CLUSTER_DIR [SPILLWAY_BINARY]
#
# Everything Slurm writes lives under CLUSTER_DIR/slurm (shared by the hosts like a cluster's
# shared file system; spool, pid and log files are per node: %n). munge is the cluster's: each
# host runs munged on the default socket with the cluster's key. slurmctld and the slurmds run
# as root (SlurmUser=root), without cgroups. Stop with scripts/slurm/stop-cluster.sh CLUSTER_DIR.
#
# Environment:
#   SPILLWAY_MANAGER       the manager the hooks and prologs use, tcp://ADDRESS:PORT on a host
#                          (required; requests are signed with munge: SPILLWAY_MANAGER_AUTH=munge).
#   SPILLWAY_SLURM_PORT    slurmctld port (default 16817); SPILLWAY_SLURMD_PORT slurmd port
#                          (default: the slurmctld port + 1; every host has its own addresses).
#   SPILLWAY_BB_USER       unprivileged user created if missing (default spillway-test).
#   SPILLWAY_BB_MOUNT_ROOT where jobs' reservations are mounted on every node (default
#                          CLUSTER_DIR/slurm/mnt: the same path everywhere, each host's own mount).
#   SPILLWAY_SLURM_TIMEOUT seconds to wait for every node to become idle (default 60).
#   SPILLWAY_SLURM_ROOT    a Debian root with its own Slurm (scripts/debian-root.sh): on every
#                          host, slurmctld, slurmd and everything they start (hooks, prologs,
#                          jobs) run chrooted into it, in the host's own mount namespace, which
#                          gets bind mounts of CLUSTER_DIR, the spillway binary's directory, the
#                          host's /run/munge and each directory of SPILLWAY_SLURM_ROOT_BIND
#                          (colon-separated) at the same paths inside. Clients run through
#                          CLUSTER_DIR/slurm/bin (sbatch, scontrol, ...: on whichever host
#                          scripts/cluster/exec.sh runs them; as SPILLWAY_SLURM_AS=UID:GID when set).
set -eu

if [ $# -lt 1 ]; then
    echo "usage: $0 CLUSTER_DIR [SPILLWAY_BINARY]" >&2
    exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "$0: must run as root (slurmctld/slurmd run as SlurmUser=root)" >&2
    exit 1
fi
root=${SPILLWAY_SLURM_ROOT:-}
for tool in slurmctld slurmd sinfo sbatch scontrol; do
    if [ -n "$root" ]; then
        if [ ! -x "$root/usr/sbin/$tool" ] && [ ! -x "$root/usr/bin/$tool" ]; then
            echo "$0: $tool not found in $root; build the root with scripts/debian-root.sh" >&2
            exit 1
        fi
    elif ! command -v "$tool" >/dev/null 2>&1; then
        echo "$0: $tool not found; install the Debian package slurm-wlm (scripts/install-deps.sh)" >&2
        exit 1
    fi
done

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cluster=$(cd "$1" 2>/dev/null && pwd) || { echo "$0: no such directory $1" >&2; exit 1; }
if [ ! -f "$cluster/cluster.env" ]; then
    echo "$0: $cluster/cluster.env missing: start the cluster with scripts/cluster/up.sh first" >&2
    exit 1
fi
# CLUSTER_HOSTS, CLUSTER_ADDRS, CLUSTER_ADDR_<host>, CLUSTER_SUBNET.
. "$cluster/cluster.env"
exec_in="$repo/scripts/cluster/exec.sh"
spillway=${2:-$(command -v spillway || true)}
manager=${SPILLWAY_MANAGER:-}
port=${SPILLWAY_SLURM_PORT:-16817}
slurmd_port=${SPILLWAY_SLURMD_PORT:-$((port + 1))}
user=${SPILLWAY_BB_USER:-spillway-test}
dir=$cluster/slurm
mount_root=${SPILLWAY_BB_MOUNT_ROOT:-$dir/mnt}
timeout=${SPILLWAY_SLURM_TIMEOUT:-60}
lua_src="$repo/slurm/burst_buffer.lua"
job_submit_src="$repo/slurm/job_submit.lua"

if [ -z "$spillway" ] || [ ! -x "$spillway" ]; then
    echo "$0: spillway binary not found (pass it as the second argument or put it on PATH)" >&2
    exit 1
fi
spillway=$(cd "$(dirname "$spillway")" && pwd)/$(basename "$spillway")
case "$manager" in
    tcp://*) ;;
    *) echo "$0: SPILLWAY_MANAGER must be the manager's tcp://ADDRESS:PORT on a cluster host, got '$manager'" >&2; exit 1 ;;
esac
set -- $CLUSTER_HOSTS
if [ $# -lt 1 ]; then
    echo "$0: $cluster/cluster.env lists no hosts" >&2
    exit 1
fi
controller=$1
eval "controller_addr=\$CLUSTER_ADDR_$controller"

if ! id "$user" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /bin/sh "$user"
fi

mkdir -p "$dir/etc" "$dir/state" "$dir/spool" "$dir/log" "$dir/run" "$dir/bb-state" "$mount_root"
chmod 0755 "$dir" "$dir/etc" "$dir/run" "$dir/log" "$dir/spool" "$mount_root"
chmod 0700 "$dir/state" "$dir/bb-state"

nodes=
for host in $CLUSTER_HOSTS; do
    eval "addr=\$CLUSTER_ADDR_$host"
    # CPUs as this machine has them (every host sees them all); a small RealMemory so that
    # four nodes on one machine never look short of memory (CR_CPU does not account memory).
    nodes="${nodes}NodeName=$host NodeAddr=$addr CPUs=$(nproc) RealMemory=1000 State=UNKNOWN
"
done
node_list=$(echo $CLUSTER_HOSTS | tr ' ' ',')

cat > "$dir/etc/slurm.conf" <<CONF
# Generated by scripts/slurm/start-cluster.sh for Spillway's multi-node burst buffer tests.
ClusterName=spillway
SlurmctldHost=$controller($controller_addr)
SlurmctldPort=$port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/slurmd-%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
DebugFlags=BurstBuffer
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=600
KillWait=5
# Two cores for four nodes and their daemons: a step may take a while to die under load.
UnkillableStepTimeout=120
MessageTimeout=30
InactiveLimit=0
BurstBufferType=burst_buffer/lua
# slurm/job_submit.lua: refuses at sbatch the burst buffer requests Slurm would ignore.
JobSubmitPlugins=lua
# Every node of a job mounts its reservation before the job starts and unmounts it after.
PrologFlags=Alloc,DeferBatch
Prolog=$dir/etc/spillway-prolog.sh
Epilog=$dir/etc/spillway-epilog.sh
PrologEpilogTimeout=60
$nodes
PartitionName=debug Nodes=$node_list Default=YES MaxTime=INFINITE State=UP
CONF

cat > "$dir/etc/burst_buffer.conf" <<CONF
# Generated by scripts/slurm/start-cluster.sh: Spillway behind burst_buffer/lua, test timeouts.
Directive=BB_LUA
Flags=TeardownFailure
StageInTimeout=120
StageOutTimeout=120
# post_run waits up to 20 s for every node's epilog: OtherTimeout must be longer.
OtherTimeout=60
CONF

cat > "$dir/etc/spillway-bb.env" <<CONF
SPILLWAY_BIN=$spillway
SPILLWAY_MANAGER=$manager
SPILLWAY_MANAGER_AUTH=munge
SPILLWAY_BB_MOUNT_ROOT=$mount_root
SPILLWAY_BB_STATE_DIR=$dir/bb-state
CONF
cp "$lua_src" "$dir/etc/burst_buffer.lua"
cp "$job_submit_src" "$dir/etc/job_submit.lua"
for hook in prolog epilog; do
    cat > "$dir/etc/spillway-$hook.sh" <<SCRIPT
#!/bin/sh
# slurmd's $hook on every node of a job (root, SLURM_JOB_ID/UID/GID and SLURMD_NODENAME set).
exec env SLURM_CONF='$dir/etc/slurm.conf' SPILLWAY_MANAGER='$manager' SPILLWAY_MANAGER_AUTH=munge SPILLWAY_BB_MOUNT_ROOT='$mount_root' SPILLWAY_BB_STATE_DIR='$dir/bb-state' '$spillway' bb $hook
SCRIPT
done
chmod 0644 "$dir/etc/"*
chmod 0755 "$dir/etc/spillway-prolog.sh" "$dir/etc/spillway-epilog.sh"

export SLURM_CONF="$dir/etc/slurm.conf"

# Warm the pools cache from the controller's host (the manager is on a host address).
if ! "$exec_in" "$cluster" "$controller" env SPILLWAY_MANAGER="$manager" SPILLWAY_MANAGER_AUTH=munge \
    "$spillway" bb pools --refresh --cache "$dir/etc/spillway-pools.json" >/dev/null 2>"$dir/log/pools-refresh.log"; then
    echo "$0: warning: could not read the pools from the manager at $manager: $(cat "$dir/log/pools-refresh.log")" >&2
fi

# `ip netns exec` gives each host a fresh /sys without the cgroup file system, and slurmd 22.05
# will not start without the one this machine has (even with proctrack/linuxproc and task/none;
# it refuses a different layout): this script mounts the same layout in a host's own mount
# namespace (gone with the host): cgroup2 alone, or a tmpfs with this machine's v1 hierarchies.
{
    echo 'mountpoint -q /sys/fs/cgroup && exit 0'
    if [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ]; then
        echo 'mount -t cgroup2 cgroup2 /sys/fs/cgroup'
    else
        echo 'mount -t tmpfs -o mode=0755 cgroup /sys/fs/cgroup'
        awk '$3 == "cgroup" && $2 ~ "^/sys/fs/cgroup/" {
            print "mkdir -p " $2 " && mount -t cgroup -o " $4 " cgroup " $2
        }' /proc/self/mounts
        awk '$3 == "cgroup2" && $2 ~ "^/sys/fs/cgroup/" {
            print "mkdir -p " $2 " && mount -t cgroup2 cgroup2 " $2
        }' /proc/self/mounts
    fi
} > "$dir/run/cgroup-mounts.sh"

# With a Debian root: each host's mount namespace gets the root's view (its /proc, /sys with
# the cgroups above, /dev, /tmp, the cluster's passwd, group and hosts, the host's munged, and
# the directories the daemons and jobs use at the same paths), and Slurm's programs run
# chrooted into it.
in_root=
if [ -n "$root" ]; then
    root=$(cd "$root" && pwd)
    mkdir -p "$dir/bin"
    rm -rf "$dir/root-etc"
    binds=$(printf '%s\n' "$cluster" "$(dirname "$spillway")" $(echo "${SPILLWAY_SLURM_ROOT_BIND:-}" | tr ':' ' ') | awk 'NF' | sort -u)
    for host in $CLUSTER_HOSTS; do
        "$exec_in" "$cluster" "$host" sh "$dir/run/cgroup-mounts.sh"
        # shellcheck disable=SC2086 # one directory per word
        "$exec_in" "$cluster" "$host" "$here/root-view.sh" "$root" "$dir/root-etc" $binds
    done
    for tool in sbatch salloc srun scontrol squeue scancel sinfo sacct; do
        cat > "$dir/bin/$tool" <<SCRIPT
#!/bin/sh
# Slurm's $tool from $root, on the cluster host this runs on (scripts/cluster/exec.sh), in the
# caller's working directory; as SPILLWAY_SLURM_AS=UID:GID when that is set.
exec chroot \${SPILLWAY_SLURM_AS:+--userspec=\$SPILLWAY_SLURM_AS} '$root' /bin/sh -c 'cd "\$1" 2>/dev/null || cd /; shift; exec "\$@"' sh "\$PWD" $tool "\$@"
SCRIPT
    done
    chmod 0755 "$dir/bin" "$dir/bin/"*
    in_root="chroot $root"
fi

# shellcheck disable=SC2086 # $in_root is a command prefix or nothing
if ! "$exec_in" "$cluster" "$controller" $in_root slurmctld -c -f "$SLURM_CONF"; then
    echo "$0: slurmctld on $controller did not start; its log:" >&2
    tail -n 20 "$dir/log/slurmctld.log" >&2 || true
    exit 1
fi
for host in $CLUSTER_HOSTS; do
    mkdir -p "$dir/spool/slurmd-$host"
    chmod 0755 "$dir/spool/slurmd-$host"
    "$exec_in" "$cluster" "$host" sh "$dir/run/cgroup-mounts.sh"
    # shellcheck disable=SC2086
    if ! "$exec_in" "$cluster" "$host" $in_root slurmd -N "$host" -f "$SLURM_CONF"; then
        echo "$0: slurmd on $host did not start; its log:" >&2
        tail -n 20 "$dir/log/slurmd-$host.log" >&2 || true
        exit 1
    fi
done

# Wait until every node is idle (its slurmd registered) and the controller accepts jobs.
count=$(echo $CLUSTER_HOSTS | wc -w)
waited=0
while :; do
    # shellcheck disable=SC2086
    idle=$("$exec_in" "$cluster" "$controller" $in_root sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l || true)
    [ "$idle" -ge "$count" ] && break
    if [ "$waited" -ge "$((timeout * 5))" ]; then
        echo "$0: only $idle of $count nodes idle after ${timeout}s; logs in $dir/log" >&2
        # shellcheck disable=SC2086
        "$exec_in" "$cluster" "$controller" $in_root sinfo -N >&2 || true
        tail -n 20 "$dir/log/slurmctld.log" >&2 || true
        exit 1
    fi
    sleep 0.2
    waited=$((waited + 1))
done
echo "export SLURM_CONF=$SLURM_CONF"
