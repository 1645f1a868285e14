"""Darshan logs (the examples bundled with the darshan wheel) convert to valid traces whose
totals are Darshan's own counters: POSIX + STDIO, + MPI-IO for files without a POSIX record."""

import functools
import glob
import os

import pytest

from spillway_tools.darshan_convert import CONSOLE_STREAMS, ConversionError, convert, convert_report, example_logs, main
from spillway_tools.trace import PARTIAL_MARKER, Op, dumps, load, loads

LOGS = example_logs()


def _bundled_logs():
    """Every .darshan file the wheel ships: example_logs/ and darshan-graph/."""
    import darshan.examples

    base = os.path.dirname(darshan.examples.__file__)
    paths = glob.glob(os.path.join(base, "example_logs", "*.darshan"))
    paths += glob.glob(os.path.join(base, "darshan-graph", "*.darshan"))
    return {os.path.basename(path): path for path in sorted(paths)}


BUNDLED = _bundled_logs()
MPIIO_READS = [f"MPIIO_{kind}_READS" for kind in ("INDEP", "COLL", "SPLIT", "NB")]
MPIIO_WRITES = [f"MPIIO_{kind}_WRITES" for kind in ("INDEP", "COLL", "SPLIT", "NB")]


def expected_totals(report):
    """Reads, writes, bytes and opens by Darshan's counters, computed independently of the converter."""
    totals = dict.fromkeys(("reads", "writes", "bytes_read", "bytes_written", "opens"), 0)

    def counters(module):
        if module not in report.records or not len(report.records[module]):
            return None
        return report.records[module].to_df()["counters"]

    posix_ids = set()
    for module in ("POSIX", "STDIO"):
        frame = counters(module)
        if frame is None:
            continue
        # The standard streams are left out (and said so in the source string).
        frame = frame[[report.name_records.get(int(i), "") not in CONSOLE_STREAMS for i in frame["id"]]]
        if module == "POSIX":
            posix_ids = {int(record_id) for record_id in frame["id"]}
        totals["reads"] += int(frame[f"{module}_READS"].sum())
        totals["writes"] += int(frame[f"{module}_WRITES"].sum())
        totals["bytes_read"] += int(frame[f"{module}_BYTES_READ"].sum())
        totals["bytes_written"] += int(frame[f"{module}_BYTES_WRITTEN"].sum())
        totals["opens"] += int(frame[f"{module}_OPENS"].sum())
    frame = counters("MPI-IO")
    if frame is not None:
        frame = frame[[int(record_id) not in posix_ids for record_id in frame["id"]]]
        totals["reads"] += int(frame[MPIIO_READS].to_numpy().sum())
        totals["writes"] += int(frame[MPIIO_WRITES].to_numpy().sum())
        totals["bytes_read"] += int(frame["MPIIO_BYTES_READ"].sum())
        totals["bytes_written"] += int(frame["MPIIO_BYTES_WRITTEN"].sum())
        totals["opens"] += int(frame["MPIIO_INDEP_OPENS"].sum() + frame["MPIIO_COLL_OPENS"].sum())
    return totals


def trace_totals(trace):
    totals = dict.fromkeys(("reads", "writes", "bytes_read", "bytes_written", "opens"), 0)
    for op in trace.ops:
        if op.op == Op.READ:
            totals["reads"] += 1
            totals["bytes_read"] += op.length
        elif op.op == Op.WRITE:
            totals["writes"] += 1
            totals["bytes_written"] += op.length
        elif op.op == Op.OPEN:
            totals["opens"] += 1
    return totals


def test_the_wheel_bundles_example_logs():
    assert "dxt.darshan" in LOGS
    assert len(LOGS) >= 4
    assert len(BUNDLED) >= len(LOGS) + 6, sorted(BUNDLED)


@functools.lru_cache(maxsize=None)
def converted(name):
    """One conversion per bundled log for the whole module (noposix.darshan takes ~15 s)."""
    return convert(BUNDLED[name])


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_every_bundled_log_converts_with_darshans_totals(name):
    import darshan

    trace = converted(name)
    report = darshan.DarshanReport(BUNDLED[name], read_all=True)
    expected = expected_totals(report)
    assert trace_totals(trace) == expected, name
    assert expected["reads"] + expected["writes"] > 0, "the comparison is not vacuous"
    assert all(a.time_ns <= b.time_ns for a, b in zip(trace.ops, trace.ops[1:]))
    assert not trace.meta.partial and PARTIAL_MARKER not in trace.meta.source, "no bundled log is partial"
    if len(trace.ops) <= 250_000:  # noposix.darshan's 2.4 M operations take minutes in pure Python
        assert loads(dumps(trace)) == trace


def test_dxt_log_records_posix_data_and_synthesizes_stdio():
    trace = convert(LOGS["dxt.darshan"])
    assert trace.meta.uid == 8699 and trace.meta.job_id == 1537455
    # 7,623 POSIX reads and writes come from DXT; the JVM's 39 fread()s of jvm.cfg from STDIO counters.
    assert trace.meta.source.startswith("darshan-dxt+counters (POSIX + STDIO; ")
    assert "7,623 recorded by DXT_POSIX, 39 synthesized from STDIO counters" in trace.meta.source
    assert trace.meta.synthesized
    jvm_cfg = [index for index, name in enumerate(trace.files) if name.endswith("/jvm.cfg")]
    assert len(jvm_cfg) == 1
    assert sum(1 for op in trace.ops if op.op == Op.READ and op.file == jvm_cfg[0]) == 39


def test_dxt_metadata_time_is_darshans_blocking_pipe_opens():
    """characterize's 11,217 s of metadata time in a 1,468 s job is in the log: 128 COMPSs named
    pipes each block in open() for up to 1,462 s (threads of one JVM wait concurrently)."""
    import darshan

    trace = convert(LOGS["dxt.darshan"])
    metadata_ns = sum(op.duration_ns for op in trace.ops if not op.op.is_data)
    fcounters = darshan.DarshanReport(LOGS["dxt.darshan"], read_all=True).records["POSIX"].to_df()["fcounters"]
    logged = fcounters["POSIX_F_META_TIME"].sum()  # STDIO adds 32 µs
    assert abs(metadata_ns / 1e9 - logged) < 0.01
    assert 11_217 < logged < 11_218
    pipes = [index for index, name in enumerate(trace.files) if "/pipe_" in name]
    pipe_ns = sum(op.duration_ns for op in trace.ops if not op.op.is_data and op.file in set(pipes))
    assert len(pipes) == 128 and pipe_ns / metadata_ns > 0.9999


def test_counter_only_log_is_marked_synthesized():
    trace = convert(LOGS["example.darshan"])
    assert trace.meta.synthesized
    assert trace.meta.source.startswith("darshan-counters (POSIX + STDIO; ")
    assert trace.meta.nprocs == 2048
    assert len({op.rank for op in trace.ops}) > 1, "shared-file ops are spread over the ranks"


def test_stdio_only_log_converts():
    """noposix.darshan has only STDIO and LUSTRE records: 2.4 M stdio calls on 2 files."""
    trace = converted("noposix.darshan")
    assert trace.meta.source.startswith("darshan-counters (STDIO; data operations: 2,390,124 synthesized")
    assert len(trace.files) == 2


def test_mpiio_counts_only_for_files_without_a_posix_record():
    import darshan

    path = LOGS["ior_hdf5_example.darshan"]
    with_posix = convert(path)
    # The POSIX record's file is counted once, through POSIX (MPI-IO's 59 calls ran as those POSIX calls).
    assert "MPI-IO" not in with_posix.meta.source
    # As if the POSIX module had been disabled: the same file now comes from MPI-IO and DXT_MPIIO.
    report = darshan.DarshanReport(path, read_all=True)
    del report.records["POSIX"], report.records["DXT_POSIX"]
    trace = convert_report(report, path)
    assert trace_totals(trace) == expected_totals(report)
    assert "MPI-IO for 1 file without a POSIX record" in trace.meta.source
    assert "59 recorded by DXT_MPIIO" in trace.meta.source
    assert trace_totals(trace)["bytes_read"] == 4202504


def test_log_without_any_converted_module_is_refused_by_name():
    import darshan

    report = darshan.DarshanReport(LOGS["noposix.darshan"], read_all=True)  # STDIO and LUSTRE only
    del report.records["STDIO"]
    with pytest.raises(ConversionError, match=r"noposix.darshan: no POSIX, STDIO or MPI-IO records.*of: LUSTRE\)"):
        convert_report(report, LOGS["noposix.darshan"])


def test_command_line_writes_a_trace(tmp_path, capsys):
    output = tmp_path / "out.spwt"
    assert main([LOGS["ior_hdf5_example.darshan"], "-o", str(output)]) == 0
    assert load(str(output)).ops
    assert main([str(tmp_path / "missing.darshan"), "-o", str(tmp_path / "x.spwt")]) == 1
    assert "missing.darshan: PyDarshan cannot read it" in capsys.readouterr().err


def test_standard_streams_are_left_out_and_said_so():
    """IOR prints its report with 128 fwrite()s to <STDOUT>: not I/O a burst buffer holds."""
    import darshan

    report = darshan.DarshanReport(LOGS["ior_hdf5_example.darshan"], read_all=True)
    stdio = report.records["STDIO"].to_df()["counters"]
    stdout = stdio[[report.name_records[int(i)] == "<STDOUT>" for i in stdio["id"]]]
    writes, written = int(stdout["STDIO_WRITES"].sum()), int(stdout["STDIO_BYTES_WRITTEN"].sum())
    assert writes == 128
    trace = convert(LOGS["ior_hdf5_example.darshan"])
    assert f"<STDOUT> left out ({writes:,} calls, {written:,} bytes)" in trace.meta.source
    assert "<STDOUT>" not in trace.files
