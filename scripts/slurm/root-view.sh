#!/bin/sh
# Give the current mount namespace a Debian root's view, so that Slurm's daemons and what they
# start can run chrooted into it (scripts/slurm/start.sh, scripts/slurm/start-cluster.sh).
#
#   scripts/slurm/root-view.sh ROOT ETC_DIR [DIRECTORY...]      (root, in a private namespace)
#
# Mounts over ROOT: its own /proc and /tmp, this namespace's /sys and /dev, ETC_DIR/passwd and
# ETC_DIR/group (the root's tables with this machine's users added; written when missing) and
# /etc/hosts, this
# namespace's /run/munge when it has one, and each DIRECTORY at the same path inside (one
# below another already bound is covered by it). Run again in the same namespace: nothing.
set -eu

if [ $# -lt 2 ]; then
    echo "usage: $0 ROOT ETC_DIR [DIRECTORY...]" >&2
    exit 2
fi
root=$1
etc=$2
shift 2
mountpoint -q "$root/proc" && exit 0
mkdir -p "$etc"
for table in passwd group; do
    [ -s "$etc/$table" ] && continue
    cp "$root/etc/$table" "$etc/$table"
    awk -F: 'NR == FNR { known[$1] = 1; next } !($1 in known)' "$root/etc/$table" "/etc/$table" >> "$etc/$table"
    chmod 0644 "$etc/$table"
done
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount --bind "$etc/passwd" "$root/etc/passwd"
mount --bind "$etc/group" "$root/etc/group"
[ -e "$root/etc/hosts" ] || : > "$root/etc/hosts"
mount --bind /etc/hosts "$root/etc/hosts"
if [ -d /run/munge ]; then
    mkdir -p "$root/run/munge"
    mount --bind /run/munge "$root/run/munge"
fi
bound=""
for path; do
    if [ ! -d "$path" ]; then
        echo "not bound (no such directory): $path" >&2
        continue
    fi
    covered=no
    for outer in $bound; do
        case "$path/" in "$outer"/*) covered=yes ;; esac
    done
    [ "$covered" = yes ] && continue
    mkdir -p "$root$path"
    mount --rbind "$path" "$root$path"
    bound="$bound $path"
done
