#!/bin/sh
# Stop Slurm started by scripts/slurm/start-cluster.sh CLUSTER_DIR: cancel its jobs (their
# teardowns and epilogs unmount and release their reservations), then SIGTERM (and after a grace
# period SIGKILL) exactly the daemons named by CLUSTER_DIR/slurm/run's pid files. The cluster's
# hosts stay up (scripts/cluster/down.sh stops them).
#
#   scripts/slurm/stop-cluster.sh CLUSTER_DIR
set -u

if [ $# -ne 1 ]; then
    echo "usage: $0 CLUSTER_DIR" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cluster=$(cd "$1" 2>/dev/null && pwd) || { echo "$0: no such directory $1" >&2; exit 1; }
dir=$cluster/slurm
[ -d "$dir/run" ] || exit 0
export SLURM_CONF="$dir/etc/slurm.conf"
controller=
if [ -f "$cluster/cluster.env" ]; then
    . "$cluster/cluster.env"
    set -- $CLUSTER_HOSTS
    controller=${1:-}
fi

# A Debian root's Slurm (SPILLWAY_SLURM_ROOT) is run through the wrappers in $dir/bin.
scancel=scancel
[ -x "$dir/bin/scancel" ] && scancel=$dir/bin/scancel
if [ -n "$controller" ] && [ -f "$dir/run/slurmctld.pid" ] && kill -0 "$(cat "$dir/run/slurmctld.pid")" 2>/dev/null; then
    "$repo/scripts/cluster/exec.sh" "$cluster" "$controller" "$scancel" --full --quiet --state=PENDING 2>/dev/null || true
    "$repo/scripts/cluster/exec.sh" "$cluster" "$controller" "$scancel" --full --quiet 2>/dev/null || true
fi

stop_pid_file() {
    pid_file=$1
    [ -f "$pid_file" ] || return 0
    pid=$(cat "$pid_file")
    case "$pid" in
        ''|*[!0-9]*) rm -f "$pid_file"; return 0 ;;
    esac
    if kill -TERM "$pid" 2>/dev/null; then
        i=0
        while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 50 ]; do
            sleep 0.2
            i=$((i + 1))
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pid_file"
}

for pid_file in "$dir"/run/slurmd-*.pid; do
    stop_pid_file "$pid_file"
done
stop_pid_file "$dir/run/slurmctld.pid"
exit 0
