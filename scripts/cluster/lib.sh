# Shared by down.sh and remove-host.sh (sourced, not run): finding and stopping what runs in a
# cluster's hosts. Expects $dir (the cluster directory, absolute) and $tag to be set.

# "net:[inode]" of a named network namespace, or nothing when it is gone.
netns_id() {
    if [ -e "/run/netns/$1" ]; then
        echo "net:[$(stat -L -c %i "/run/netns/$1")]"
    fi
}

# "mnt:[inode]" of a host's mount namespace (its holder's), or nothing when the holder is gone.
host_mnt_id() {
    if [ -s "$dir/run/$1.pid" ]; then
        readlink "/proc/$(cat "$dir/run/$1.pid")/ns/mnt" 2>/dev/null || true
    fi
}

# Pids of every process whose network or mount namespace is one of the ids given (space-separated
# "net:[…]"/"mnt:[…]" words). One find over /proc (a shell loop would fork per process).
pids_in() {
    [ $# -gt 0 ] || return 0
    set -f # the escaped patterns are find's, not the shell's
    set -- $(for id in "$@"; do printf ' -o -lname %s' "$(printf '%s' "$id" | sed 's/[][]/\\&/g')"; done)
    set +f
    shift # the leading -o
    find /proc/[0-9]*/ns/net /proc/[0-9]*/ns/mnt -maxdepth 0 \( "$@" \) 2>/dev/null \
        | cut -d/ -f3 | grep -v -x -e "$$" | sort -u || true
}

# Lazily unmounts every FUSE file system mounted inside a host (its holder must be alive), so no
# process stays blocked on a mount whose daemon is about to die.
unmount_fuse_in() {
    [ -s "$dir/run/$1.pid" ] || return 0
    holder=$(cat "$dir/run/$1.pid")
    [ -d "/proc/$holder" ] || return 0
    nsenter --target "$holder" --mount -- sh -c '
        awk "\$0 ~ / - fuse/ { print \$5 }" /proc/self/mountinfo | sort -r | while read -r point; do
            umount -l "$point" 2>/dev/null || true
        done' || true
}

# Mount points (of the machine's mount table) at DIR or under it.
mounts_under() {
    awk -v dir="$1" '$5 == dir || index($5, dir "/") == 1 { print $5 }' /proc/self/mountinfo
}

# Sends signal $1 to every process in the namespaces given, then waits (up to 5 s) until
# none is left.
signal_and_wait_in() {
    signal=$1
    shift
    pids=$(pids_in "$@")
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086
    kill "-$signal" $pids 2>/dev/null || true
    waited=0
    while [ -n "$(pids_in "$@")" ] && [ "$waited" -lt 50 ]; do
        sleep 0.1
        waited=$((waited + 1))
    done
}

# SIGKILL of every process in the namespaces given (a crash: nothing flushed), bounded wait
# (5 s) until they are gone. Prints the pids still alive (none when it worked).
kill_processes_in() {
    signal_and_wait_in KILL "$@"
    pids_in "$@"
}

# Bounded stop of every process in the namespaces given: TERM, up to 5 s, KILL, up to 5 s.
# Prints the pids still alive (none when it worked).
stop_processes_in() {
    signal_and_wait_in TERM "$@"
    signal_and_wait_in KILL "$@"
    pids_in "$@"
}
