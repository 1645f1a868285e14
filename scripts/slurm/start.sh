#!/bin/sh
# Start a one-node Slurm cluster on localhost for Spillway's burst buffer tests: the host's Slurm
# (Debian 12: 22.05), or Debian 13's Slurm 24.11 inside the root SPILLWAY_SLURM_ROOT names.
#
#   scripts/slurm/start.sh DIR [SPILLWAY_BINARY]
#
# Everything lives under DIR (created if missing, must be reachable by the test user):
# a munge key and munged on its own socket, slurm.conf + burst_buffer.conf + burst_buffer.lua
# + job_submit.lua
# (the last copied from slurm/ in this checkout), state, spool, logs and pid files. slurmctld and
# slurmd run in the background as root (SlurmUser=root); no systemd, no cgroups.
# Prints `export SLURM_CONF=DIR/etc/slurm.conf` on success; stop with scripts/slurm/stop.sh DIR.
#
# Environment:
#   SPILLWAY_SLURM_PORT    slurmctld port (default 16817).
#   SPILLWAY_SLURMD_PORT   slurmd port (default: the slurmctld port + 1).
#   SPILLWAY_MANAGER       manager socket the hooks use (written into DIR/etc/spillway-bb.env).
#   SPILLWAY_BB_USER       unprivileged user created if missing (default spillway-test).
#   SPILLWAY_BB_MOUNT_ROOT where the hooks mount job reservations (default DIR/mnt).
#   SPILLWAY_SLURM_TIMEOUT seconds to wait for the node to become idle (default 60).
#   SPILLWAY_SLURM_ROOT    a Debian root with its own Slurm (scripts/slurm/debian13-root.sh):
#                          munged, slurmctld, slurmd and their children run chrooted into it, in
#                          a mount namespace of their own holding bind mounts of DIR, the
#                          spillway binary's directory, the manager socket's directory and each
#                          directory of SPILLWAY_SLURM_ROOT_BIND (colon-separated) at the same
#                          paths. Clients run through DIR/bin (sbatch, scontrol, squeue, ...,
#                          as root; SPILLWAY_SLURM_AS=UID:GID runs them as that user), and
#                          DIR/bin/in-root runs any command in there.
set -eu

if [ $# -lt 1 ]; then
    echo "usage: $0 DIR [SPILLWAY_BINARY]" >&2
    exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "$0: must run as root (slurmctld/slurmd run as SlurmUser=root)" >&2
    exit 1
fi
root=${SPILLWAY_SLURM_ROOT:-}
for tool in munged slurmctld slurmd sinfo sbatch scontrol; do
    if [ -n "$root" ]; then
        if [ ! -x "$root/usr/sbin/$tool" ] && [ ! -x "$root/usr/bin/$tool" ]; then
            echo "$0: $tool not found in $root; build the root with scripts/slurm/debian13-root.sh" >&2
            exit 1
        fi
    elif ! command -v "$tool" >/dev/null 2>&1; then
        echo "$0: $tool not found; install the Debian packages slurm-wlm and munge (scripts/install-deps.sh)" >&2
        exit 1
    fi
done

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
dir=$(mkdir -p "$1" && cd "$1" && pwd)
spillway=${2:-$(command -v spillway || true)}
port=${SPILLWAY_SLURM_PORT:-16817}
slurmd_port=${SPILLWAY_SLURMD_PORT:-$((port + 1))}
user=${SPILLWAY_BB_USER:-spillway-test}
mount_root=${SPILLWAY_BB_MOUNT_ROOT:-$dir/mnt}
manager=${SPILLWAY_MANAGER:-/run/spillway/manager.sock}
timeout=${SPILLWAY_SLURM_TIMEOUT:-60}
lua_src="$repo/slurm/burst_buffer.lua"
job_submit_src="$repo/slurm/job_submit.lua"

if [ -z "$spillway" ] || [ ! -x "$spillway" ]; then
    echo "$0: spillway binary not found (pass it as the second argument or put it on PATH)" >&2
    exit 1
fi
if [ ! -f "$lua_src" ]; then
    echo "$0: $lua_src missing" >&2
    exit 1
fi
spillway=$(cd "$(dirname "$spillway")" && pwd)/$(basename "$spillway")

# The unprivileged user that submits jobs (root may not request burst buffers).
if ! id "$user" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /bin/sh "$user"
fi

# Every directory on the path to DIR must be traversable by the job user and by munge clients.
chmod 0755 "$dir"
mkdir -p "$dir/etc" "$dir/munge" "$dir/state" "$dir/spool" "$dir/log" "$dir/run" "$mount_root"
chmod 0755 "$dir/etc" "$dir/munge" "$dir/run" "$dir/log"
chmod 0700 "$dir/state"
# slurmstepd executes the batch script from the spool as the job user.
chmod 0755 "$dir/spool"
chmod 0755 "$mount_root"

# With a root: one mount namespace (held by a `sleep` chrooted into the root) in which every
# daemon and client of this cluster runs, with the directories they share with the host bound in
# at the same paths. The host's users are added to the root's passwd and group (in the
# namespace only, the root itself is left as built), so job owners resolve the same inside.
in_root=""
if [ -n "$root" ]; then
    root=$(cd "$root" && pwd)
    mkdir -p "$dir/bin"
    rm -rf "$dir/root-etc"
    binds=$(printf '%s\n' "$dir" "$(dirname "$spillway")" "$(dirname "$manager")" $(echo "${SPILLWAY_SLURM_ROOT_BIND:-}" | tr ':' ' ') | awk 'NF' | sort -u)
    rm -f "$dir/run/root-ns.pid"
    # shellcheck disable=SC2016 # expanded by the namespace's shell
    unshare --mount --propagation private -- /bin/sh -c '
        set -e
        view=$1; root=$2; dir=$3; shift 3
        "$view" "$root" "$dir/root-etc" "$@"
        echo $$ > "$dir/run/root-ns.pid"
        exec chroot "$root" sleep infinity' root-ns "$here/root-view.sh" "$root" "$dir" $binds </dev/null >"$dir/log/root-ns.log" 2>&1 &
    waited=0
    while [ ! -s "$dir/run/root-ns.pid" ]; do
        if [ "$waited" -ge 50 ] || ! kill -0 $! 2>/dev/null; then
            echo "$0: the mount namespace for $root did not come up: $(cat "$dir/log/root-ns.log")" >&2
            exit 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    cat > "$dir/bin/in-root" <<SCRIPT
#!/bin/sh
# Runs a command in this test cluster's Debian root (scripts/slurm/start.sh), in the caller's
# working directory; as SPILLWAY_SLURM_AS=UID:GID when that is set. The caller must be root.
# The root's own PATH: the caller's may start with DIR/bin, which is bound in there too.
pid=\$(cat '$dir/run/root-ns.pid') || exit 1
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec nsenter --target "\$pid" --mount --root --wd -- /bin/sh -c '
    cd "\$1" 2>/dev/null || cd /
    as=\$2
    shift 2
    if [ -n "\$as" ]; then exec chroot --userspec="\$as" --skip-chdir / "\$@"; fi
    exec "\$@"' in-root "\$PWD" "\${SPILLWAY_SLURM_AS:-}" "\$@"
SCRIPT
    for tool in sbatch salloc srun scontrol squeue scancel sinfo sacct; do
        printf '#!/bin/sh\nexec %s %s "$@"\n' "$dir/bin/in-root" "$tool" > "$dir/bin/$tool"
    done
    chmod 0755 "$dir/bin" "$dir/bin/"*
    in_root="$dir/bin/in-root"
fi

# munge: own key, socket, pid, log and seed under DIR. munged insists that the key is private to
# the user running it and that the socket directory is not writable by others.
if [ ! -f "$dir/munge/munge.key" ]; then
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2>/dev/null
fi
chmod 0400 "$dir/munge/munge.key"
munge_socket="$dir/munge/munge.socket"
$in_root munged --force \
    --socket="$munge_socket" \
    --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/run/munged.pid" \
    --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed"

# This machine's CPUs and memory, as slurmd sees them.
cpus=$($in_root slurmd -C | sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' | head -n 1)
memory=$($in_root slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n 1)
# Leave a little for the OS so slurmd never drains the node for "low RealMemory".
memory=$((memory * 9 / 10))

cat > "$dir/etc/slurm.conf" <<CONF
# Generated by scripts/slurm/start.sh for Spillway's burst buffer tests.
ClusterName=spillway
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/slurmd-%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
# No mail on this test cluster (24.11 logs an error for a MailProg that does not exist).
MailProg=/bin/true
SlurmdDebug=info
DebugFlags=BurstBuffer
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
# Tests: schedule within a second or two of a job becoming eligible (stage-in done).
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
BurstBufferType=burst_buffer/lua
# slurm/job_submit.lua: refuses at sbatch the burst buffer requests Slurm would ignore.
JobSubmitPlugins=lua
# Every node of a job mounts its reservation before the job starts and unmounts it after.
PrologFlags=Alloc,DeferBatch
Prolog=$dir/etc/spillway-prolog.sh
Epilog=$dir/etc/spillway-epilog.sh
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF

cat > "$dir/etc/burst_buffer.conf" <<CONF
# Generated by scripts/slurm/start.sh: Spillway behind burst_buffer/lua, short test timeouts.
Directive=BB_LUA
# A failed stage-in holds the job; tear its reservation down at once rather than at cancel.
Flags=TeardownFailure
StageInTimeout=60
StageOutTimeout=60
OtherTimeout=30
CONF

# The hooks find the spillway binary, the manager socket and the mount root here (the Lua reads
# this file next to itself; slurmctld's environment is not the submitter's).
cat > "$dir/etc/spillway-bb.env" <<CONF
SPILLWAY_BIN=$spillway
SPILLWAY_MANAGER=$manager
SPILLWAY_BB_MOUNT_ROOT=$mount_root
SPILLWAY_BB_STATE_DIR=$dir/bb-state
CONF
mkdir -p "$dir/bb-state"
chmod 0700 "$dir/bb-state"
cp "$lua_src" "$dir/etc/burst_buffer.lua"
cp "$job_submit_src" "$dir/etc/job_submit.lua"
chmod 0644 "$dir/etc/"*
# slurmd's Prolog and Epilog (a path each, run as root with the job's SLURM_JOB_* variables).
for hook in prolog epilog; do
    cat > "$dir/etc/spillway-$hook.sh" <<SCRIPT
#!/bin/sh
exec env SLURM_CONF='$dir/etc/slurm.conf' SPILLWAY_MANAGER='$manager' SPILLWAY_BB_MOUNT_ROOT='$mount_root' SPILLWAY_BB_STATE_DIR='$dir/bb-state' '$spillway' bb $hook
SCRIPT
    chmod 0755 "$dir/etc/spillway-$hook.sh"
done

export SLURM_CONF="$dir/etc/slurm.conf"

# Warm the pools cache so slurmctld's first slurm_bb_pools call already knows the pools (the
# Lua refreshes it in the background afterwards). A manager that is not up yet is not fatal.
if ! SPILLWAY_MANAGER="$manager" "$spillway" bb pools --refresh --cache "$dir/etc/spillway-pools.json" >/dev/null 2>"$dir/log/pools-refresh.log"; then
    echo "$0: warning: could not read the pools from the manager at $manager: $(cat "$dir/log/pools-refresh.log")" >&2
fi

# Fresh state each start: a leftover job from a killed run would otherwise come back.
$in_root slurmctld -c -f "$SLURM_CONF"
$in_root slurmd -N localhost -f "$SLURM_CONF"

# Wait until the node is idle (slurmd registered and the controller accepts jobs).
waited=0
while :; do
    state=$($in_root sinfo -h -n localhost -o '%T' 2>/dev/null || true)
    case "$state" in
        idle) break ;;
    esac
    if [ "$waited" -ge "$((timeout * 5))" ]; then
        echo "$0: node not idle after ${timeout}s (state: '${state:-none}'); logs in $dir/log" >&2
        tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
        exit 1
    fi
    sleep 0.2
    waited=$((waited + 1))
done
echo "export SLURM_CONF=$SLURM_CONF"
