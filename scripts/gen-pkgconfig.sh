#!/bin/sh
# Writes spillway.pc (pkg-config) for an install of libspillway.so and spillway.h to stdout.
#
#   scripts/gen-pkgconfig.sh PREFIX [LIBDIR [INCLUDEDIR]] > spillway.pc
#
# LIBDIR defaults to PREFIX/lib, INCLUDEDIR to PREFIX/include. The version comes from the
# workspace Cargo.toml. See docs/design/c-api.md for the whole install recipe.
set -eu
if [ $# -lt 1 ] || [ $# -gt 3 ]; then
    echo "usage: $0 PREFIX [LIBDIR [INCLUDEDIR]] > spillway.pc" >&2
    exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=$1
libdir=${2:-$prefix/lib}
includedir=${3:-$prefix/include}
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' "$root/Cargo.toml")
if [ -z "$version" ]; then
    echo "$0: no version in [workspace.package] of $root/Cargo.toml" >&2
    exit 1
fi
for value in "$prefix" "$libdir" "$includedir"; do
    case $value in
        *'|'* | *'
'*) echo "$0: path must not contain '|' or a newline: $value" >&2; exit 1 ;;
    esac
done
sed -e "s|@PREFIX@|$prefix|g" -e "s|@LIBDIR@|$libdir|g" -e "s|@INCLUDEDIR@|$includedir|g" -e "s|@VERSION@|$version|g" \
    "$root/crates/capi/spillway.pc.in"
