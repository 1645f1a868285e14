#!/usr/bin/env bash
# Installs the Debian packages the tests and benchmarks need, only those missing, so that a fresh
# machine of this kind runs `make test` with nothing installed by hand.
set -euo pipefail

packages=(
    python3-venv        # the Python tooling's virtual environment (pyenv Pythons carry venv already)
    gcc                 # the C example of the C ABI is compiled and run by the tests
    g++                 # ...and the header is checked to compile as C++
    binutils            # nm: the library exports exactly the header's functions
    pkg-config          # checks the installed spillway.pc
    memcached           # `spillway bench ingress` baseline
    libmemcached-tools  # memcaslap, the baseline's load generator
    fuse3               # fusermount3 and /etc/fuse.conf for `spillway mount` and its tests
    slurm-wlm           # slurmctld + slurmd + clients 22.05, with burst_buffer_lua.so, for the Slurm tests
    munge               # the authentication daemon (Slurm's, and spillway's server.auth = munge; tests run private ones)
    libmunge2           # libmunge.so.2, which spillway-sys opens with dlopen to encode and decode credentials
    iproute2            # ip netns, veth and bridge: the hosts of scripts/cluster/
    util-linux          # unshare, nsenter, setpriv: the hosts of scripts/cluster/ and acting as test users
    moosefs-master      # the shared PFS of scripts/cluster/pfs-up.sh: metadata server in one host...
    moosefs-chunkserver # ...its data server...
    moosefs-client      # ...and mfsmount (FUSE) in the other hosts
    openmpi-bin         # mpirun for the multi-node Slurm test's MPI checkpoint job
    libopenmpi-dev      # mpicc and mpi.h: that job's program (examples/mpi/checkpoint.c) is compiled by the test
    prometheus          # scrapes the server's and the manager's /metrics in metrics_e2e
    debootstrap         # builds the Debian 13 root with Slurm 24.11 (scripts/slurm/debian13-root.sh)
)

missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done

if ! command -v cargo >/dev/null; then
    echo "install-deps: cargo is not on PATH; install Rust (rustup) first" >&2
    exit 1
fi

# A clean `make test` writes about 4 GiB under target/ (see Cargo.toml's profiles). Say so up front
# when the disk is short, rather than fail twenty minutes into the build with ENOSPC.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ "$free_kib" -lt $((4 * 1024 * 1024)) ]; then
    echo "install-deps: warning: $((free_kib / 1024)) MiB free here; a clean make test needs about 4 GiB" >&2
fi

# rustfmt and clippy run in `make test` (make lint); rustup's default profile has them, a minimal
# one does not.
for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        echo "install-deps: adding the Rust component $component"
        rustup component add "$component"
    fi
done

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
# cargo-deb builds the Debian package (scripts/package/deb.sh, tested by package_deb): from
# crates.io, pinned, about two minutes to compile once.
CARGO_DEB_VERSION=3.8.0
if ! cargo deb --version 2>/dev/null | grep -qx "cargo-deb $CARGO_DEB_VERSION"; then
    echo "install-deps: installing cargo-deb $CARGO_DEB_VERSION (cargo install)"
    cargo install --quiet --locked cargo-deb --version "$CARGO_DEB_VERSION"
fi

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#packages[@]} Debian packages present"
else
    echo "install-deps: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Slurm 24.11 for the Slurm tests: Debian 13's packages in a root of their own, built once (about
# a minute) and reused while its package list is unchanged.
echo "install-deps: Debian 13 root with Slurm 24.11: $($sudo "$(dirname "$0")/slurm/debian13-root.sh")"
