"""Shared fixtures: paths of the repository, sample traces and the spillway binary."""

import os
import shutil
import subprocess

import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(PYTHON_DIR)
TRACES = os.path.join(REPO, "traces")


def _spillway_binary():
    explicit = os.environ.get("SPILLWAY_BIN")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    default = os.path.join(REPO, "target", "release", "spillway")
    if os.access(default, os.X_OK):
        return default
    if os.environ.get("SPILLWAY_BUILD", "1") != "0" and shutil.which("cargo"):
        subprocess.run(["cargo", "build", "--release", "-p", "spillway"], cwd=REPO, check=True)
        if os.access(default, os.X_OK):
            return default
    return None


@pytest.fixture(scope="session")
def spillway_bin():
    binary = _spillway_binary()
    if binary is None:
        # A test that cannot run fails with the reason; it never passes by skipping.
        pytest.fail(
            "spillway binary absent: set SPILLWAY_BIN, or build target/release/spillway "
            "(cargo build --release -p spillway)",
            pytrace=False,
        )
    return binary
