#!/bin/sh
# Stop the cluster started by scripts/slurm/start.sh DIR: cancel its jobs, then SIGTERM (and after
# a grace period SIGKILL) exactly the daemons named by DIR's pid files. Nothing else is touched.
#
#   scripts/slurm/stop.sh DIR
set -u

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
dir=$(cd "$1" 2>/dev/null && pwd) || { echo "$0: no such directory $1" >&2; exit 1; }
export SLURM_CONF="$dir/etc/slurm.conf"
# A cluster in a Debian root (SPILLWAY_SLURM_ROOT) has its clients in DIR/bin.
scancel=scancel
[ -x "$dir/bin/scancel" ] && scancel="$dir/bin/scancel"

# Cancel the jobs first so teardown hooks unmount and destroy their reservations.
if [ -f "$dir/run/slurmctld.pid" ] && kill -0 "$(cat "$dir/run/slurmctld.pid")" 2>/dev/null; then
    "$scancel" --full --quiet --state=PENDING 2>/dev/null || true
    "$scancel" --full --quiet 2>/dev/null || true
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

stop_pid_file "$dir/run/slurmd.pid"
stop_pid_file "$dir/run/slurmctld.pid"
stop_pid_file "$dir/run/munged.pid"
# Last, the holder of a root's mount namespace: its bind mounts go with it.
stop_pid_file "$dir/run/root-ns.pid"
exit 0
