"""Darshan example logs (bundled with the darshan wheel) convert to valid traces."""

import pytest

from spillway_tools.darshan_convert import ConversionError, convert, example_logs, main
from spillway_tools.trace import Op, load, loads, dumps

LOGS = example_logs()


def test_the_wheel_bundles_example_logs():
    assert "dxt.darshan" in LOGS
    assert len(LOGS) >= 4


@pytest.mark.parametrize("name", sorted(name for name in LOGS if name != "noposix.darshan"))
def test_every_example_log_converts_and_round_trips(name):
    import darshan

    trace = convert(LOGS[name])
    assert trace.ops, name
    assert loads(dumps(trace)) == trace
    assert all(a.time_ns <= b.time_ns for a, b in zip(trace.ops, trace.ops[1:]))
    # Bytes and counts agree with Darshan's own POSIX counters.
    counters = darshan.DarshanReport(LOGS[name], read_all=True).records["POSIX"].to_df()["counters"]
    read = sum(op.length for op in trace.ops if op.op == Op.READ)
    written = sum(op.length for op in trace.ops if op.op == Op.WRITE)
    assert read == int(counters["POSIX_BYTES_READ"].sum())
    assert written == int(counters["POSIX_BYTES_WRITTEN"].sum())
    opens = sum(1 for op in trace.ops if op.op == Op.OPEN)
    assert opens == int(counters["POSIX_OPENS"].sum())


def test_dxt_log_is_recorded_not_synthesized():
    trace = convert(LOGS["dxt.darshan"])
    assert not trace.meta.synthesized
    assert trace.meta.source.startswith("darshan-dxt")
    assert trace.meta.uid == 8699 and trace.meta.job_id == 1537455


def test_counter_only_log_is_marked_synthesized():
    trace = convert(LOGS["example.darshan"])
    assert trace.meta.synthesized
    assert "synthesized" in trace.meta.source
    assert trace.meta.nprocs == 2048
    assert len({op.rank for op in trace.ops}) > 1, "shared-file ops are spread over the ranks"


def test_log_without_posix_is_refused_by_name():
    with pytest.raises(ConversionError, match="noposix.darshan: no POSIX"):
        convert(LOGS["noposix.darshan"])


def test_command_line_writes_a_trace(tmp_path):
    output = tmp_path / "out.spwt"
    assert main([LOGS["ior_hdf5_example.darshan"], "-o", str(output)]) == 0
    assert load(str(output)).ops
    assert main([LOGS["noposix.darshan"], "-o", str(tmp_path / "x.spwt")]) == 1
