#!/bin/sh
# Install a Spillway .deb into a clean Debian 12 root, check what it put where, start the
# manager and a server the way their systemd units do, stop them with the units' KillSignal,
# then remove and purge the package. Prints one `ok: …` line per check; exits non-zero at the
# first failure, naming it.
#
#   scripts/package/test-install.sh DEB
#
# The clean root is debootstrap's minbase of bookworm, built once at
# /var/cache/spillway/debian12-minbase (scripts/debian-root.sh, about 35 s) and copied for each
# run, so every run starts clean. apt-get
# fetches the package's dependencies (fuse3, munge) from Debian's archive. There is no systemd in
# the root: the ExecStart, KillSignal and TimeoutStopSec of the installed units are followed by
# this script, and StateDirectory/RuntimeDirectory are made as systemd makes them. Needs root.
set -eu

if [ $# -ne 1 ] || [ ! -f "$1" ]; then
    echo "usage: $0 DEB" >&2
    exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "$0: must run as root (debootstrap, chroot, mount namespaces)" >&2
    exit 1
fi
deb=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
here=$(cd "$(dirname "$0")" && pwd)
cache=$("$here/../debian-root.sh" bookworm /var/cache/spillway/debian12-minbase)

work=$(mktemp -d /tmp/spillway-package.XXXXXX)
trap 'rm -rf "$work"' EXIT
root="$work/root"
cp -a "$cache" "$root"
cp "$deb" "$root/tmp/spillway.deb"
cp /etc/resolv.conf "$root/etc/resolv.conf"

# Everything below runs in a mount namespace of its own: /proc, /dev and /sys of the root go
# away with it.
# shellcheck disable=SC2016 # expanded by the namespace's shell
unshare --mount --propagation private -- /bin/sh -eu -c '
root=$1
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
in_root() { chroot "$root" "$@"; }
fail() { echo "FAILED: $*" >&2; exit 1; }

in_root apt-get update -qq >/dev/null 2>&1 || fail "apt-get update in the clean root"
DEBIAN_FRONTEND=noninteractive in_root apt-get install -y -qq /tmp/spillway.deb >"$root/tmp/install.log" 2>&1 \
    || { tail -n 20 "$root/tmp/install.log" >&2; fail "apt-get install spillway.deb"; }
echo "ok: installed with its dependencies ($(in_root dpkg-query -W -f "\${Version}" spillway))"

for path in /usr/bin/spillway /lib/systemd/system/spillway-server.service \
    /lib/systemd/system/spillway-manager.service /etc/spillway/spillway.toml \
    /usr/share/man/man1/spillway.1.gz /usr/share/man/man1/spillway-manager.1.gz \
    /usr/share/bash-completion/completions/spillway /usr/share/zsh/vendor-completions/_spillway \
    /usr/share/spillway/slurm/burst_buffer.lua /usr/share/spillway/slurm/job_submit.lua; do
    [ -e "$root$path" ] || fail "$path not installed"
done
echo "ok: binary, units, configuration, man pages, completions and Slurm scripts in place"
library=/usr/lib/spillway/libspillway_preload.so
[ -e "$root$library" ] || fail "$library not installed"
# The library loads into a program of the clean root (and stays out of the way unconfigured).
in_root env LD_PRELOAD=$library cat /etc/debian_version >/dev/null || fail "LD_PRELOAD=$library cat"
in_root /usr/bin/spillway mount --servers 127.0.0.1:1 --print-preload-env /mnt \
    | grep -q "^export LD_PRELOAD=.$library.\$" || fail "--print-preload-env does not name $library"
echo "ok: the LD_PRELOAD library loads and --print-preload-env names it"
in_root dpkg-query -W -f "\${Conffiles}\n" spillway | grep -q "/etc/spillway/spillway.toml" \
    || fail "/etc/spillway/spillway.toml is not a conffile"
in_root /usr/bin/spillway --version >/dev/null || fail "spillway --version"
in_root sh -c "command -v fusermount3" >/dev/null || fail "fuse3 (a dependency) not installed"
echo "ok: spillway runs; fuse3 came with it; the configuration is a conffile"

# Start a unit as systemd would: its ExecStart, in the background, with its state and runtime
# directories made (mode 0700/0755) and the test sizes of the environment; its pid in
# $started (not a command substitution: the daemon must be a child of this shell to be waited for).
start_unit() {
    unit=$1; shift
    exec_start=$(sed -n "s/^ExecStart=//p" "$root/lib/systemd/system/$unit")
    mkdir -p -m 0700 "$root/var/lib/spillway"
    mkdir -p -m 0755 "$root/run/spillway"
    # shellcheck disable=SC2086 # ExecStart is words
    env "$@" RUST_LOG=info chroot "$root" $exec_start >"$root/tmp/$unit.log" 2>&1 &
    started=$!
}
stop_unit() {
    unit=$1; pid=$2
    signal=$(sed -n "s/^KillSignal=SIG//p" "$root/lib/systemd/system/$unit")
    timeout=$(sed -n "s/^TimeoutStopSec=//p" "$root/lib/systemd/system/$unit")
    kill -s "$signal" "$pid"
    waited=0
    while kill -0 "$pid" 2>/dev/null; do
        [ "$waited" -lt $((timeout * 10)) ] || fail "$unit still running ${timeout} s after SIG$signal"
        sleep 0.1
        waited=$((waited + 1))
    done
    status=0
    wait "$pid" || status=$?
    [ "$status" -eq 0 ] || fail "$unit exited $status after SIG$signal: $(tail -n 5 "$root/tmp/$unit.log")"
}
wait_for() {
    what=$1; shift
    waited=0
    until "$@" >/dev/null 2>&1; do
        [ "$waited" -lt 300 ] || fail "$what within 30 s"
        sleep 0.1
        waited=$((waited + 1))
    done
}

start_unit spillway-manager.service
manager=$started
wait_for "the manager answering on /run/spillway/manager.sock" in_root /usr/bin/spillway pool list --json
in_root /usr/bin/spillway pool create smoke --granularity 1MiB >/dev/null || fail "pool create through the installed manager"
echo "ok: spillway-manager.service started; it answers on /run/spillway/manager.sock"

start_unit spillway-server.service SPILLWAY_STORE_SSD_BYTES_MAX=536870912 \
    SPILLWAY_STORE_SEGMENT_BYTES_MAX=33554432 SPILLWAY_STORE_DRAM_BYTES_MAX=67108864 \
    SPILLWAY_SERVER_LISTEN_ADDRESS=127.0.0.1:0
server=$started
wait_for "the server listening" grep -q listening "$root/tmp/spillway-server.service.log"
[ -d "$root/var/lib/spillway/ssd" ] || fail "the server made no SSD log under /var/lib/spillway/ssd"
echo "ok: spillway-server.service started; its SSD log is in /var/lib/spillway/ssd"

stop_unit spillway-server.service "$server"
stop_unit spillway-manager.service "$manager"
echo "ok: both stopped cleanly by their units'"'"' KillSignal"

DEBIAN_FRONTEND=noninteractive in_root apt-get remove -y -qq spillway >/dev/null 2>&1 || fail "apt-get remove"
[ ! -e "$root/usr/bin/spillway" ] || fail "/usr/bin/spillway left after remove"
[ -e "$root/etc/spillway/spillway.toml" ] || fail "remove deleted the configuration (a conffile stays until purge)"
DEBIAN_FRONTEND=noninteractive in_root apt-get purge -y -qq spillway >/dev/null 2>&1 || fail "apt-get purge"
[ ! -e "$root/etc/spillway/spillway.toml" ] || fail "purge left /etc/spillway/spillway.toml"
echo "ok: removed (configuration kept), then purged (configuration gone)"
' test-install "$root"
