#!/bin/sh
# Build the Debian package of Spillway with cargo-deb, and print its path.
#
#   scripts/package/deb.sh [SPILLWAY_BINARY]     (default: target/release/spillway)
#
# The package (crates/cli/Cargo.toml, [package.metadata.deb]) carries the binary, the LD_PRELOAD
# library (/usr/lib/spillway/libspillway_preload.so, from next to the binary), the systemd
# units and example configuration of ops/, the Slurm Lua scripts of slurm/, and the man pages
# and bash/zsh completions the binary generates from its own command line; they are gathered
# in target/deb-assets/ first. cargo-deb comes from crates.io (scripts/install-deps.sh installs
# the version pinned below). The package lands in target/debian/.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
binary=${1:-$repo/target/release/spillway}
if [ ! -x "$binary" ]; then
    echo "$0: $binary missing: build it first (make release)" >&2
    exit 1
fi
if ! cargo deb --version >/dev/null 2>&1; then
    echo "$0: cargo-deb missing: scripts/install-deps.sh installs it (cargo install cargo-deb)" >&2
    exit 1
fi

assets="$repo/target/deb-assets"
rm -rf "$assets"
mkdir -p "$assets/man"
cp "$binary" "$assets/spillway"
# The LD_PRELOAD library is built next to the binary (make release builds both).
preload="$(dirname "$binary")/libspillway_preload.so"
if [ ! -f "$preload" ]; then
    echo "$0: $preload missing: build it first (make release, or cargo build -p spillway-preload)" >&2
    exit 1
fi
cp "$preload" "$assets/libspillway_preload.so"
# cargo-deb strips only what it builds itself.
strip --strip-unneeded "$assets/spillway" "$assets/libspillway_preload.so"
"$binary" man "$assets/man" >/dev/null
gzip -9n "$assets"/man/*.1
"$binary" completions bash > "$assets/spillway.bash"
"$binary" completions zsh > "$assets/_spillway"

cd "$repo"
rm -rf target/debian
cargo deb -p spillway --no-build --output target/debian/ >&2
ls target/debian/spillway_*.deb
