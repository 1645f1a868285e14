"""`spillway characterize` verdicts on real Darshan logs whose nature is known from their command
line: VPIC-IO writing one 2 TiB HDF5 file (``example.darshan``) and IOR writing in 4 MiB transfers
(``sample-badost.darshan``, IOR ``-w``) are bandwidth benchmarks. ``sample-badost`` spends half a
second in 12,288 fast metadata operations at 79 % of the metadata peak against 11.5 % of the
bandwidth peak while writing 512 GiB; comparing those percentages called it metadata-bound.
"""

import json
import subprocess

import pytest

from spillway_tools.darshan_convert import convert, example_logs
from spillway_tools.trace import save

LABELLED = {
    "example.darshan": "bandwidth",
    "sample-badost.darshan": "bandwidth",
}


@pytest.mark.parametrize("name", sorted(LABELLED))
def test_a_bandwidth_benchmark_is_bandwidth_bound(spillway_bin, name, tmp_path):
    path = tmp_path / (name + ".spwt")
    save(convert(example_logs()[name]), str(path))
    result = subprocess.run(
        [spillway_bin, "characterize", str(path), "--json"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    metrics = out["metrics"]
    assert metrics["bound"] == LABELLED[name], metrics
    at_peaks = metrics["seconds_at_peaks"]
    assert at_peaks["bandwidth"] > max(at_peaks["iops"], at_peaks["metadata"]), at_peaks
    verdict = out["recommendation"]["advice"]
    assert any(line.startswith(f"One pipeline is {LABELLED[name]}-bound") for line in verdict), verdict
