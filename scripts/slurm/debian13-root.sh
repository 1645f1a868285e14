#!/bin/sh
# Build, once, the Debian 13 (trixie) root in which the Slurm 24.11 tests run, and print its path.
#
#   scripts/slurm/debian13-root.sh [ROOT]
#
# ROOT defaults to $SPILLWAY_SLURM_ROOT, else /var/cache/spillway/debian13-slurm: debootstrap's
# minbase plus Debian 13's own Slurm (24.11), munge and fuse3 (scripts/debian-root.sh: about
# 400 MiB and a minute, reused while the package list is unchanged). scripts/slurm/start.sh runs
# a cluster inside it when SPILLWAY_SLURM_ROOT names it.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=${1:-${SPILLWAY_SLURM_ROOT:-/var/cache/spillway/debian13-slurm}}
exec "$here/../debian-root.sh" trixie "$root" slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge fuse3
