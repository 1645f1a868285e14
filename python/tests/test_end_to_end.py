"""Darshan example log → trace → `spillway sim` and `spillway characterize`."""

import json
import subprocess

import pytest

from spillway_tools.darshan_convert import convert, example_logs
from spillway_tools.trace import Op, save


def run(binary, *args):
    result = subprocess.run([binary, *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{args}: {result.stderr}"
    return result.stdout


@pytest.fixture(scope="module", params=["dxt.darshan", "ior_hdf5_example.darshan", "example.darshan"])
def converted(request, tmp_path_factory):
    trace = convert(example_logs()[request.param])
    path = tmp_path_factory.mktemp("e2e") / (request.param + ".spwt")
    save(trace, str(path))
    return trace, path


def test_sim_sweeps_the_converted_trace(spillway_bin, converted, tmp_path):
    trace, path = converted
    svg = tmp_path / "sweep.svg"
    # 64 MiB chunks keep example.darshan's 2 TiB to 32K chunks (a minute of debug build at 1 MiB).
    chunk = ["--chunk-kib", "65536"] if sum(op.length for op in trace.ops) > 1 << 40 else []
    out = json.loads(run(spillway_bin, "sim", str(path), "--json", "--policy", "lru,fifo", "--svg", str(svg), *chunk))
    assert out["ops_per_second"] > 0
    assert out["trace"]["ops"] == len(trace.ops)
    sweep = out["sweep"]
    assert {point["policy"] for point in sweep} == {"lru", "fifo"}
    ideal = [point for point in sweep if point["bb_fraction"] == 1.0]
    assert ideal and all(point["relative_throughput"] == 1.0 for point in ideal)
    for point in sweep:
        assert 0 < point["relative_throughput"] <= 1.0 + 1e-9
        result = point["result"]
        assert result["bytes_read"] == sum(op.length for op in trace.ops if op.op == Op.READ)
        assert result["bytes_written"] == sum(op.length for op in trace.ops if op.op == Op.WRITE)
    assert svg.read_text().startswith("<svg")
    chosen = {entry["policy"]: entry for entry in out["smallest_sufficient"]}
    assert set(chosen) == {"lru", "fifo"}
    assert all(entry["relative_throughput"] >= out["target_relative"] for entry in chosen.values())


def test_sim_single_size_and_sync_write_back(spillway_bin, converted):
    _, path = converted
    out = json.loads(run(spillway_bin, "sim", str(path), "--json", "--bb-fraction", "0.25", "--write-back", "sync"))
    assert out["result"]["io_time_seconds"] > 0
    assert 0.0 <= out["result"]["hit_ratio"] <= 1.0


def test_characterize_reports_and_advises(spillway_bin, converted, tmp_path):
    trace, path = converted
    html = tmp_path / "report.html"
    out = json.loads(run(spillway_bin, "characterize", str(path), "--json", "--html", str(html), "--pipelines", "16"))
    assert out["job"]["synthesized"] == trace.meta.synthesized
    metadata_ops = sum(1 for op in trace.ops if not op.op.is_data)
    assert out["profile"]["metadata_ops"] == metadata_ops
    assert out["metrics"]["bound"] in ("bandwidth", "iops", "metadata")
    assert out["recommendation"]["fragments"] >= 1
    assert out["recommendation"]["advice"]
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    if trace.meta.synthesized:
        assert "Synthesized trace" in page
    table = run(spillway_bin, "characterize", str(path))
    assert "% of peak metadata rate" in table


def test_characterize_takes_peaks_from_a_bench_file(spillway_bin, converted, tmp_path):
    _, path = converted
    peaks = tmp_path / "peaks.json"
    peaks.write_text(json.dumps({"peaks": {"bandwidth_bytes_per_second": 1e9, "iops": 1e4, "metadata_ops_per_second": 1e3}}))
    out = json.loads(run(spillway_bin, "characterize", str(path), "--json", "--peaks", str(peaks)))
    assert out["peaks"]["iops"] == 1e4


def test_bad_trace_fails_with_its_name(spillway_bin, tmp_path):
    bad = tmp_path / "bad.spwt"
    bad.write_bytes(b"not a trace at all")
    result = subprocess.run([spillway_bin, "sim", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0
    assert "bad.spwt" in result.stderr and "SPWTRACE" in result.stderr


def test_characterize_a_datawarp_profile_reproduces_table2(spillway_bin):
    import os

    from conftest import TRACES

    path = os.path.join(TRACES, "profiles", "datawarp-camp-builddb.json")
    out = json.loads(run(spillway_bin, "characterize", "--profile", path, "--json", "--pipelines", "64"))
    assert out["metrics"]["pipelines_to_saturate_data"] == 10
    assert out["metrics"]["pipelines_to_saturate_metadata"] == 3
    assert out["metrics"]["bound"] == "metadata"
    assert out["recommendation"]["namespace"] == "private"


def test_a_partial_trace_is_said_in_every_report(spillway_bin, tmp_path):
    import dataclasses

    trace = convert(example_logs()["ior_hdf5_example.darshan"])
    missing = "DXT_POSIX truncated: 5 of 36 reads filled in from counters"
    meta = dataclasses.replace(
        trace.meta, synthesized=True, partial=True, source=trace.meta.source + "; PARTIAL: " + missing
    )
    path = tmp_path / "partial.spwt"
    save(dataclasses.replace(trace, meta=meta), str(path))
    html = tmp_path / "report.html"
    for args in (["characterize", str(path), "--html", str(html)], ["characterize", str(path), "--json"],
                 ["sim", str(path)], ["sim", str(path), "--json"]):
        result = subprocess.run([spillway_bin, *args], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert f"warning: trace {path} is partial: {missing}" in result.stderr, (args, result.stderr)
        if args == ["characterize", str(path), "--html", str(html)]:
            assert f"Partial (input incomplete)" in result.stdout and f"YES: {missing}" in result.stdout
            assert "Partial trace." in html.read_text()
        if args[-1] == "--json" and args[0] == "sim":
            assert json.loads(result.stdout)["trace"]["partial"] == missing
