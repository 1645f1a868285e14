#!/usr/bin/env bash
# Creates or refreshes python/.venv, installs spillway_tools with its test extras (darshan,
# pytest, hypothesis) and runs the Python tests. Extra arguments go to pytest.
# The end-to-end tests use the spillway binary: $SPILLWAY_BIN, else target/release/spillway,
# else they build it with cargo (SPILLWAY_BUILD=0: they fail, naming the missing binary).
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys' >/dev/null 2>&1; then
    rm -rf .venv
    python3 -m venv .venv
fi
# Quiet on success; the whole pip log on failure.
if ! { .venv/bin/python -m pip install --disable-pip-version-check --upgrade pip &&
       .venv/bin/python -m pip install --disable-pip-version-check -e '.[test]'; } >.venv/pip.log 2>&1; then
    cat .venv/pip.log >&2
    echo "python/run-tests.sh: installing spillway_tools and its test dependencies failed (log above)" >&2
    exit 1
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
