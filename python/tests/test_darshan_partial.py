"""Logs Darshan flagged partial (a module ran out of memory) convert without a silent drop.

No partial log ships with the darshan wheel, so these tests derive one from a bundled log by
setting the module's bit in the log header's ``partial_flag`` (darshan-log-format.h: the header
is uncompressed — ``char version[8]``, ``int64 magic``, ``uint8 comp_type``, 3 bytes of padding,
``uint32 partial_flag`` at byte 20, bit ``1 << module id``). Module ids differ between log format
versions, so the bit is found by asking PyDarshan, which also checks the layout. A truncated DXT
buffer is mimicked by dropping every DXT segment after a cut-off time, in memory.
"""

import shutil
import struct

import pytest

from spillway_tools.darshan_convert import convert, convert_report, example_logs, main
from spillway_tools.trace import PARTIAL_MARKER, Op, dumps, loads
from test_darshan import expected_totals, trace_totals

LOGS = example_logs()
DARSHAN_MAGIC = 6567223  # DARSHAN_MAGIC_NR
HEADER = struct.Struct("<8sqB3xI")  # version, magic, comp_type, partial_flag


def _set_partial_bits(source, target, bits):
    shutil.copyfile(source, target)
    with open(target, "r+b") as log:
        version, magic, comp_type, flags = HEADER.unpack(log.read(HEADER.size))
        assert version.startswith(b"3.") and magic == DARSHAN_MAGIC, "not the darshan 3.x header layout"
        assert flags == 0, "the bundled log is already partial"
        log.seek(0)
        log.write(HEADER.pack(version, magic, comp_type, flags | bits))


def _partial_modules(path):
    import darshan

    report = darshan.DarshanReport(path, read_all=False)
    return {name for name, info in report.modules.items() if info["partial_flag"]}


def make_partial(tmp_path, log_name, module):
    """A copy of a bundled log that PyDarshan reports with exactly ``module`` partial."""
    target = tmp_path / f"partial-{module}-{log_name}"
    for bit in range(32):
        _set_partial_bits(LOGS[log_name], target, 1 << bit)
        found = _partial_modules(str(target))
        if found == {module}:
            return str(target)
        assert not found or module not in found, f"bit {bit} flags {found}"
    raise AssertionError(f"no header bit makes PyDarshan report {module} partial in {log_name}")


def test_unpatched_logs_are_not_partial_and_the_patch_is_read_by_pydarshan(tmp_path):
    assert _partial_modules(LOGS["dxt.darshan"]) == set()
    posix = make_partial(tmp_path, "dxt.darshan", "POSIX")
    dxt = make_partial(tmp_path, "dxt.darshan", "DXT_POSIX")
    with open(posix, "rb") as a, open(dxt, "rb") as b:
        assert HEADER.unpack(a.read(HEADER.size))[3] != HEADER.unpack(b.read(HEADER.size))[3]


def _truncate_dxt(report, module):
    """Drops every DXT segment that starts after the median start time, as a full DXT buffer would."""
    collection = report.records[module]
    records = collection.to_df()  # deep copies
    frames = [record[key] for record in records for key in ("read_segments", "write_segments")]
    starts = sorted(start for frame in frames if len(frame) for start in frame["start_time"])
    cutoff = starts[len(starts) // 2]
    dropped = {Op.READ: [0, 0], Op.WRITE: [0, 0]}
    last_kept_end = 0.0
    for index, record in enumerate(records):
        for key, op in (("read_segments", Op.READ), ("write_segments", Op.WRITE)):
            frame = record[key]
            if not len(frame):
                continue
            late = frame["start_time"] >= cutoff
            dropped[op][0] += int(late.sum())
            dropped[op][1] += int(frame["length"][late].sum())
            record[key] = frame[~late].reset_index(drop=True)
            if len(record[key]):
                last_kept_end = max(last_kept_end, float(record[key]["end_time"].max()))
        collection[index] = record
    return last_kept_end, dropped


def test_truncated_dxt_is_filled_in_from_counters(tmp_path):
    import darshan

    path = make_partial(tmp_path, "dxt.darshan", "DXT_POSIX")
    report = darshan.DarshanReport(path, read_all=True)
    last_kept_end, dropped = _truncate_dxt(report, "DXT_POSIX")
    (reads, read_bytes), (writes, written_bytes) = dropped[Op.READ], dropped[Op.WRITE]
    assert reads > 1000 and writes > 100, dropped

    trace = convert_report(report, path)
    assert trace_totals(trace) == expected_totals(report), "totals are still Darshan's counters"
    assert trace.meta.partial and trace.meta.synthesized
    source = trace.meta.source
    assert f"PARTIAL: DXT_POSIX truncated: {reads:,} of 6,126 reads ({read_bytes:,} of 22,517,726 bytes)" in source
    assert f"{writes:,} of 1,497 writes ({written_bytes:,} of 13,021,781 bytes) filled in from counters" in source
    assert f"{7623 - reads - writes:,} recorded by DXT_POSIX" in source
    # The filled-in calls come after the buffer ran out, not among the recorded ones.
    late_data = [op for op in trace.ops if op.op.is_data and op.time_ns >= round(last_kept_end * 1e9)]
    assert len(late_data) >= reads + writes
    assert loads(dumps(trace)).meta.partial


def test_dxt_flagged_but_complete_is_a_note_not_partial(tmp_path):
    trace = convert(make_partial(tmp_path, "dxt.darshan", "DXT_POSIX"))
    assert not trace.meta.partial and PARTIAL_MARKER not in trace.meta.source
    assert "note: DXT_POSIX truncated, no operation of this trace needed filling in" in trace.meta.source


@pytest.mark.parametrize(
    "log_name, module, warning",
    [
        ("dxt.darshan", "POSIX", "POSIX ran out of record memory: files beyond the 214 it recorded are missing, totals are lower bounds"),
        ("dxt.darshan", "STDIO", "STDIO ran out of record memory: files beyond the 1 it recorded are missing, totals are lower bounds"),
        ("ior_hdf5_example.darshan", "MPI-IO", "MPI-IO ran out of record memory: files it did not record are still counted through POSIX"),
    ],
)
def test_module_out_of_records_makes_totals_lower_bounds(tmp_path, log_name, module, warning):
    import darshan

    path = make_partial(tmp_path, log_name, module)
    trace = convert(path)
    assert trace.meta.partial
    assert f"; PARTIAL: {warning}" in trace.meta.source
    assert trace_totals(trace) == expected_totals(darshan.DarshanReport(path, read_all=True))
    assert loads(dumps(trace)) == trace


def test_command_line_warns_about_a_partial_log(tmp_path, capsys):
    path = make_partial(tmp_path, "dxt.darshan", "STDIO")
    assert main([path, "-o", str(tmp_path / "out.spwt")]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and path in err and "incomplete" in err
