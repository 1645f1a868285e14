#!/bin/sh
# Run a command inside a host of a test cluster started by scripts/cluster/up.sh.
#
#   scripts/cluster/exec.sh DIR HOST CMD [ARG...]     (root)
#
# The command runs in HOST's network, UTS and mount namespaces (its address, hostname, /tmp,
# /var/tmp, /run/munge and mounts), as root, with this environment and working directory
# (when the directory exists inside the host; else /). To run it as another user, wrap it, e.g.
#   scripts/cluster/exec.sh DIR host2 setpriv --reuid=alice --regid=alice --init-groups CMD...
# or `runuser -u alice -- CMD...`. Exits with the command's status; 1 if HOST is not up.
set -eu

if [ $# -lt 3 ]; then
    echo "usage: $0 DIR HOST CMD [ARG...]" >&2
    exit 2
fi
dir=$(cd "$1" && pwd -P)
host=$2
shift 2
case "$host" in
    '' | */* | .*) echo "$0: bad host name '$host'" >&2; exit 2 ;;
esac
pidfile=$dir/run/$host.pid
if [ ! -s "$pidfile" ]; then
    echo "$0: no host '$host' in the cluster at $dir (removed, or the cluster is down)" >&2
    exit 1
fi
holder=$(cat "$pidfile")
tag=$(cat "$dir/run/tag")
# The pid file must still name the holder of this host's namespace (not a recycled pid).
if [ ! -e "/run/netns/spw-$tag-$host" ] \
    || [ "$(readlink "/proc/$holder/ns/net" 2>/dev/null)" != "net:[$(stat -L -c %i "/run/netns/spw-$tag-$host")]" ]; then
    echo "$0: host '$host' of the cluster at $dir is not running" >&2
    exit 1
fi
# Keep the working directory when the host has it (not, e.g., a directory of the machine's /tmp);
# else /. sh execs the command, so its pid is the one exec.sh was started with.
exec nsenter --target "$holder" --uts --mount --net -- \
    sh -c 'cd "$1" 2>/dev/null || cd /; shift; exec "$@"' sh "$PWD" "$@"
