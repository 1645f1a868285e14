#!/bin/sh
# Build, once, the Debian 13 (trixie) root in which the Slurm 24.11 tests run, and print its path.
#
#   scripts/slurm/debian13-root.sh [ROOT]
#
# ROOT defaults to $SPILLWAY_SLURM_ROOT, else /var/cache/spillway/debian13-slurm. The root is
# debootstrap's minbase plus Debian 13's own Slurm (24.11), munge and fuse3, from Debian's
# archive ($SPILLWAY_DEBIAN_MIRROR, default http://deb.debian.org/debian). It is kept between
# runs: a root whose stamp lists the same packages is reused as is (about 400 MiB; a build takes
# about a minute). A failed build leaves nothing under ROOT. scripts/slurm/start.sh runs a cluster
# inside it when SPILLWAY_SLURM_ROOT names it.
set -eu

root=${1:-${SPILLWAY_SLURM_ROOT:-/var/cache/spillway/debian13-slurm}}
mirror=${SPILLWAY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages="slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge fuse3"
stamp="$root/.spillway-root"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$packages" ]; then
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
rm -rf "$partial"
mkdir -p "$(dirname "$root")"
echo "$0: building the Debian 13 root for the Slurm 24.11 tests in $root (about a minute)" >&2
if ! debootstrap --variant=minbase trixie "$partial" "$mirror" >"$partial.log" 2>&1; then
    echo "$0: debootstrap trixie failed; last lines of $partial.log:" >&2
    tail -n 20 "$partial.log" >&2
    exit 1
fi
# Package scripts must not start services in the root (policy-rc.d answers "not allowed").
printf '#!/bin/sh\nexit 101\n' > "$partial/usr/sbin/policy-rc.d"
chmod 0755 "$partial/usr/sbin/policy-rc.d"
# shellcheck disable=SC2086 # the package list is words
if ! chroot "$partial" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages && apt-get clean" >>"$partial.log" 2>&1; then
    echo "$0: installing $packages in the root failed; last lines of $partial.log:" >&2
    tail -n 20 "$partial.log" >&2
    exit 1
fi
echo "$packages" > "$partial/.spillway-root"
rm -rf "$root"
mv "$partial" "$root"
rm -f "$partial.log"
echo "$root"
