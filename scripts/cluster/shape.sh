#!/bin/sh
# Shape one host's link of a test cluster to a bandwidth, each way.
#
#   scripts/cluster/shape.sh DIR HOST BANDWIDTH_MBIT   (root; a cluster of scripts/cluster/up.sh)
#
# tc tbf at BANDWIDTH_MBIT megabits per second on the egress of the switch's port toward HOST
# (everything sent to HOST, from every host, shares it) and on the egress of HOST's eth0
# (everything it sends). Burst: 10 ms of the rate, at least 128 KiB (above the 64 KiB GSO packets
# of the veths); at most 100 ms queued. Replaces an earlier shaping of the same host; the qdiscs
# go with the namespaces (down.sh, remove-host.sh).
set -eu

if [ $# -ne 3 ]; then
    echo "usage: $0 DIR HOST BANDWIDTH_MBIT" >&2
    exit 2
fi
dir=$1
host=$2
rate=$3
case "$rate" in
    '' | *[!0-9]* | 0*) echo "$0: BANDWIDTH_MBIT must be a positive whole number of Mbit/s, got '$rate'" >&2; exit 2 ;;
esac
tag=$(cat "$dir/run/tag" 2>/dev/null) || {
    echo "$0: $dir is not a cluster directory (no run/tag)" >&2
    exit 1
}
burst=$((rate * 1000000 / 8 / 100))
[ "$burst" -ge 131072 ] || burst=131072
ip netns exec "spw-$tag-sw" tc qdisc replace dev "$host" root tbf rate "${rate}mbit" burst "$burst" latency 100ms || {
    echo "$0: tc on the switch port $host (spw-$tag-sw) failed" >&2
    exit 1
}
ip netns exec "spw-$tag-$host" tc qdisc replace dev eth0 root tbf rate "${rate}mbit" burst "$burst" latency 100ms || {
    echo "$0: tc on eth0 of $host failed" >&2
    exit 1
}
