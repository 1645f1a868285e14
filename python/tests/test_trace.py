"""The Python trace reader/writer: round trips, corruption, and compatibility with Rust."""

import io
import os
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import TRACES
from spillway_tools.trace import (
    FLAG_PARTIAL,
    FLAG_SYNTHESIZED,
    MAGIC,
    PARTIAL_MARKER,
    JobMeta,
    Op,
    Trace,
    TraceError,
    TraceOp,
    TraceReader,
    TraceWriter,
    dumps,
    load,
    loads,
)

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)


@st.composite
def traces(draw):
    files = draw(st.lists(st.text(max_size=30), min_size=1, max_size=6))
    ops = draw(
        st.lists(
            st.builds(
                TraceOp,
                time_ns=U64,
                duration_ns=U64,
                offset=U64,
                length=U64,
                rank=U32,
                file=st.integers(0, len(files) - 1),
                op=st.sampled_from(list(Op)),
            ),
            max_size=60,
        )
    )
    partial = draw(st.booleans())
    source = draw(st.text(max_size=20)).replace(PARTIAL_MARKER, "")
    meta = JobMeta(
        uid=draw(U32),
        nprocs=draw(U32),
        job_id=draw(U64),
        start_unix_us=draw(U64),
        end_unix_us=draw(U64),
        synthesized=draw(st.booleans()),
        source=source + (f"; {PARTIAL_MARKER} {draw(st.text(max_size=20))}" if partial else ""),
        executable=draw(st.text(max_size=20)),
        partial=partial,
    )
    return Trace(meta, files, ops)


@settings(max_examples=150, deadline=None)
@given(traces())
def test_round_trip_keeps_every_field(trace):
    assert loads(dumps(trace)) == trace


@settings(max_examples=40, deadline=None)
@given(traces(), st.data())
def test_any_single_byte_flip_is_rejected(trace, data):
    raw = bytearray(dumps(trace))
    index = data.draw(st.integers(0, len(raw) - 1))
    raw[index] ^= data.draw(st.integers(1, 255))
    with pytest.raises(TraceError):
        loads(bytes(raw))


def test_header_layout_is_the_documented_one():
    meta = JobMeta(uid=7, nprocs=3, job_id=99, start_unix_us=5, end_unix_us=6, synthesized=True, source="s", executable="e")
    raw = dumps(Trace(meta, ["f"], [TraceOp(1, 2, 3, 4, 0, 0, Op.WRITE)]))
    assert raw[:8] == MAGIC
    assert struct.unpack_from("<HHIIQQQ", raw, 8) == (1, 1, 7, 3, 99, 5, 6)
    assert raw[44:48] == b"\x01s\x01e"
    # File record, op record, end record, CRC over everything before it.
    assert raw[48:51] == b"\x01\x00\x01"
    assert raw[52:54] == bytes([0x02, Op.WRITE])
    assert struct.unpack("<I", raw[-4:])[0] == zlib.crc32(raw[:-4])


def test_truncation_and_trailing_bytes_are_errors():
    raw = dumps(Trace(JobMeta(), ["a"], [TraceOp(0, 0, 0, 1, 0, 0, Op.READ)]))
    for cut in range(len(raw)):
        with pytest.raises(TraceError):
            loads(raw[:cut])
    with pytest.raises(TraceError, match="trailing"):
        loads(raw + b"\x00")


def test_streaming_writer_interns_names():
    out = io.BytesIO()
    writer = TraceWriter(out, JobMeta(source="stream"))
    for index in range(1000):
        name = f"/bb/file{index % 10}"
        writer.write_op(TraceOp(index, 1, index * 4096, 4096, index % 4, writer.file_id(name), Op.WRITE))
    writer.finish()
    reader = TraceReader(io.BytesIO(out.getvalue()))
    ops = list(reader)
    assert len(ops) == 1000 and len(reader.files) == 10
    assert reader.meta.source == "stream"


def test_reads_the_trace_written_by_rust():
    path = os.path.join(TRACES, "synthetic-workflow.spwt")
    trace = load(path)
    assert trace.meta.synthesized
    assert trace.meta.source == "spillway-synth-workflow"
    assert any(op.op == Op.UNLINK for op in trace.ops)
    assert all(a.time_ns <= b.time_ns for a, b in zip(trace.ops, trace.ops[1:]))
    # Re-encoding gives back the same bytes: the two implementations agree byte for byte.
    with open(path, "rb") as source:
        assert dumps(trace) == source.read()


def _header_flags(raw: bytes) -> int:
    return struct.unpack_from("<H", raw, 10)[0]


def test_partial_flag_is_bit_1_and_round_trips():
    meta = JobMeta(synthesized=True, source=f"darshan-dxt+counters; {PARTIAL_MARKER} DXT_POSIX truncated", partial=True)
    raw = dumps(Trace(meta, ["f"], []))
    assert _header_flags(raw) == FLAG_SYNTHESIZED | FLAG_PARTIAL == 3
    back = loads(raw)
    assert back.meta.partial and back.meta.synthesized
    assert dumps(back) == raw
    # Old positional constructors still work and mean "not partial".
    assert not JobMeta(1, 2, 3, 4, 5, False, "s", "e").partial


def test_partial_flag_and_source_marker_must_agree():
    with pytest.raises(ValueError, match="lacks"):
        dumps(Trace(JobMeta(source="no explanation", partial=True), [], []))
    with pytest.raises(ValueError, match="contains"):
        dumps(Trace(JobMeta(source=f"{PARTIAL_MARKER} x"), [], []))
    # A reader rejects a header whose bit disagrees with the source (CRC would also, later).
    raw = bytearray(dumps(Trace(JobMeta(source="plain"), [], [])))
    raw[10] |= FLAG_PARTIAL
    with pytest.raises(TraceError, match="PARTIAL is set"):
        loads(bytes(raw))


@pytest.mark.parametrize("bit", range(2, 16))
def test_flag_bits_above_partial_are_rejected(bit):
    raw = bytearray(dumps(Trace(JobMeta(), [], [])))
    struct.pack_into("<H", raw, 10, 1 << bit)
    with pytest.raises(TraceError, match="unknown header flags"):
        loads(bytes(raw))
