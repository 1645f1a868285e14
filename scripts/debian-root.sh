#!/bin/sh
# Build, once, a Debian root (debootstrap's minbase of SUITE plus PACKAGES from Debian's archive)
# at ROOT, and print ROOT. A root whose stamp names the same suite and packages is reused as is;
# a failed build leaves nothing at ROOT. Services are never started in it (policy-rc.d).
#
#   scripts/debian-root.sh SUITE ROOT [PACKAGE...]
#
# Used by scripts/slurm/debian13-root.sh (Slurm 24.11) and scripts/package/test-install.sh (a
# clean Debian 12). $SPILLWAY_DEBIAN_MIRROR overrides http://deb.debian.org/debian. Needs root.
set -eu

if [ $# -lt 2 ]; then
    echo "usage: $0 SUITE ROOT [PACKAGE...]" >&2
    exit 2
fi
suite=$1
root=$2
shift 2
packages="$*"
mirror=${SPILLWAY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
stamp="$root/.spillway-root"
want="$suite: $packages"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "$root"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "$0: must run as root (debootstrap and chroot)" >&2
    exit 1
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    echo "$0: debootstrap not found; install the Debian package debootstrap (scripts/install-deps.sh)" >&2
    exit 1
fi

partial="$root.partial"
log="$root.partial.log"
rm -rf "$partial"
mkdir -p "$(dirname "$root")"
echo "$0: building a Debian $suite root in $root" >&2
if ! debootstrap --variant=minbase "$suite" "$partial" "$mirror" >"$log" 2>&1; then
    echo "$0: debootstrap $suite failed; last lines of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
fi
# Package scripts must not start services in the root (policy-rc.d answers "not allowed").
printf '#!/bin/sh\nexit 101\n' > "$partial/usr/sbin/policy-rc.d"
chmod 0755 "$partial/usr/sbin/policy-rc.d"
if [ -n "$packages" ]; then
    # shellcheck disable=SC2086 # the package list is words
    if ! chroot "$partial" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages && apt-get clean" >>"$log" 2>&1; then
        echo "$0: installing $packages in the root failed; last lines of $log:" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
fi
echo "$want" > "$partial/.spillway-root"
rm -rf "$root"
mv "$partial" "$root"
rm -f "$log"
echo "$root"
