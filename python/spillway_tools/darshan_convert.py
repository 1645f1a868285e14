"""Darshan logs to Spillway traces, through PyDarshan.

Data operations come from DXT segments when the log has them for a file (recorded: each
read/write with its offset, length, start and end). Files without DXT data get operations
synthesized from their POSIX counters — counts, bytes and cumulative times are exact, but sizes
are split evenly, offsets are sequential and times are spread evenly over the file's read/write
window — and the trace header is then flagged *synthesized*. Darshan records no per-call
metadata events, so opens, closes, stats and fsyncs are always synthesized from counters the
same way; the ``source`` string says which parts were recorded.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Dict, Iterable, List, Optional

from .trace import STRING_BYTES_MAX, JobMeta, Op, Trace, TraceOp, save

#: Refuse to synthesize more operations than this (memory bound: ~100 bytes per op in Python).
OPS_MAX = 20_000_000


class ConversionError(ValueError):
    """The log cannot be converted; the message names the log and the reason."""


def example_logs() -> Dict[str, str]:
    """Paths of the example logs bundled with the ``darshan`` wheel, by file name."""
    import darshan.examples.example_logs as bundled

    directory = os.path.dirname(bundled.__file__)
    return {
        name: os.path.join(directory, name)
        for name in sorted(os.listdir(directory))
        if name.endswith(".darshan")
    }


def _seconds_to_ns(value: float) -> int:
    if value is None or not math.isfinite(value) or value < 0:
        return 0
    return int(round(value * 1e9))


def _spread(count: int, start: float, end: float) -> List[int]:
    """``count`` times evenly spread over [start, end] (seconds), in ns."""
    if count <= 0:
        return []
    start_ns, end_ns = _seconds_to_ns(start), _seconds_to_ns(end)
    end_ns = max(end_ns, start_ns)
    if count == 1:
        return [start_ns]
    step = (end_ns - start_ns) / (count - 1)
    return [start_ns + int(step * index) for index in range(count)]


def _split(total: int, count: int) -> List[int]:
    base, extra = divmod(total, count)
    return [base + (1 if index < extra else 0) for index in range(count)]


def _synthesize_data(
    op: Op, count: int, total_bytes: int, extent: int, start: float, end: float, seconds: float,
    ranks: List[int], file_id: int,
) -> Iterable[TraceOp]:
    if count <= 0:
        return []
    duration = _seconds_to_ns(seconds / count)
    times = _spread(count, start, end)
    sizes = _split(max(total_bytes, 0), count)
    cursor = 0
    ops = []
    for index in range(count):
        length = sizes[index]
        if extent > 0 and cursor + length > extent:
            cursor = 0
        ops.append(TraceOp(times[index], duration, cursor, length, ranks[index % len(ranks)], file_id, op))
        cursor += length
    return ops


def _synthesize_metadata(op: Op, count: int, start: float, end: float, duration: int, ranks: List[int], file_id: int):
    return [
        TraceOp(time, duration, 0, 0, ranks[index % len(ranks)], file_id, op)
        for index, time in enumerate(_spread(count, start, end))
    ]


def convert(log_path: str) -> Trace:
    """Converts one Darshan log into an in-memory trace."""
    import darshan

    try:
        report = darshan.DarshanReport(log_path, read_all=True)
    except Exception as error:  # PyDarshan raises bare exceptions for unreadable logs
        raise ConversionError(f"{log_path}: PyDarshan cannot read it: {error}") from error
    if "POSIX" not in report.records:
        raise ConversionError(f"{log_path}: no POSIX module records (modules: {sorted(report.records)})")
    job = report.metadata["job"]
    nprocs = max(int(job.get("nprocs", 1)), 1)
    names = report.name_records

    dxt: Dict[int, List[dict]] = {}
    if "DXT_POSIX" in report.records:
        for record in report.records["DXT_POSIX"].to_df():
            dxt.setdefault(int(record["id"]), []).append(record)

    frames = report.records["POSIX"].to_df()
    counters = frames["counters"]
    fcounters = frames["fcounters"]
    files: List[str] = []
    file_ids: Dict[int, int] = {}
    ops: List[TraceOp] = []
    synthesized_data = False
    recorded_data = False

    for row, frow in zip(counters.to_dict("records"), fcounters.to_dict("records")):
        record_id = int(row["id"])
        if int(frow["id"]) != record_id or int(frow["rank"]) != int(row["rank"]):
            raise ConversionError(f"{log_path}: POSIX counter tables are not aligned at record {record_id}")
        if record_id not in file_ids:
            file_ids[record_id] = len(files)
            files.append(names.get(record_id, f"<darshan record {record_id:#x}>")[:STRING_BYTES_MAX])
        file_id = file_ids[record_id]
        rank = int(row["rank"])
        ranks = [rank] if rank >= 0 else list(range(nprocs))

        opens = int(row["POSIX_OPENS"])
        stats = int(row["POSIX_STATS"])
        fsyncs = int(row["POSIX_FSYNCS"]) + int(row["POSIX_FDSYNCS"])
        meta_ops = 2 * opens + stats
        meta_duration = _seconds_to_ns(frow["POSIX_F_META_TIME"] / meta_ops) if meta_ops else 0
        open_start, open_end = frow["POSIX_F_OPEN_START_TIMESTAMP"], frow["POSIX_F_OPEN_END_TIMESTAMP"]
        close_start, close_end = frow["POSIX_F_CLOSE_START_TIMESTAMP"], frow["POSIX_F_CLOSE_END_TIMESTAMP"]
        ops += _synthesize_metadata(Op.STAT, stats, open_start, open_start, meta_duration, ranks, file_id)
        ops += _synthesize_metadata(Op.OPEN, opens, open_start, open_end, meta_duration, ranks, file_id)
        ops += _synthesize_metadata(Op.CLOSE, opens, close_start, max(close_end, close_start), meta_duration, ranks, file_id)
        ops += _synthesize_metadata(
            Op.FSYNC, fsyncs, frow["POSIX_F_WRITE_START_TIMESTAMP"], frow["POSIX_F_WRITE_END_TIMESTAMP"], 0, ranks, file_id
        )

        # A shared record (rank -1) aggregates every rank; its DXT segments stay per rank.
        traced = [record for record in dxt.get(record_id, []) if rank < 0 or int(record["rank"]) == rank]
        if any(len(record["read_segments"]) or len(record["write_segments"]) for record in traced):
            recorded_data = True
            for record in traced:
                for key, op in (("read_segments", Op.READ), ("write_segments", Op.WRITE)):
                    frame = record[key]
                    if len(frame) == 0:
                        continue
                    columns = zip(frame["offset"], frame["length"], frame["start_time"], frame["end_time"])
                    for offset, length, start, end in columns:
                        start_ns = _seconds_to_ns(start)
                        duration_ns = max(_seconds_to_ns(end) - start_ns, 0)
                        ops.append(TraceOp(start_ns, duration_ns, int(offset), int(length), int(record["rank"]), file_id, op))
        else:
            reads, writes = int(row["POSIX_READS"]), int(row["POSIX_WRITES"])
            if reads or writes:
                synthesized_data = True
            ops += _synthesize_data(
                Op.READ, reads, int(row["POSIX_BYTES_READ"]), int(row["POSIX_MAX_BYTE_READ"]) + 1,
                frow["POSIX_F_READ_START_TIMESTAMP"], frow["POSIX_F_READ_END_TIMESTAMP"], frow["POSIX_F_READ_TIME"],
                ranks, file_id,
            )
            ops += _synthesize_data(
                Op.WRITE, writes, int(row["POSIX_BYTES_WRITTEN"]), int(row["POSIX_MAX_BYTE_WRITTEN"]) + 1,
                frow["POSIX_F_WRITE_START_TIMESTAMP"], frow["POSIX_F_WRITE_END_TIMESTAMP"], frow["POSIX_F_WRITE_TIME"],
                ranks, file_id,
            )
        if len(ops) > OPS_MAX:
            raise ConversionError(f"{log_path}: more than {OPS_MAX} operations; refusing to synthesize")

    ops.sort(key=lambda op: op.time_ns)
    if recorded_data and synthesized_data:
        source = "darshan-dxt+posix-counters (data partly synthesized, metadata synthesized)"
    elif recorded_data:
        source = "darshan-dxt (data recorded, metadata synthesized from counters)"
    else:
        source = "darshan-posix-counters (synthesized)"
    start_us = int(job["start_time_sec"]) * 1_000_000 + int(job.get("start_time_nsec", 0)) // 1000
    end_us = int(job["end_time_sec"]) * 1_000_000 + int(job.get("end_time_nsec", 0)) // 1000
    if end_us <= start_us:
        # Darshan stores whole seconds; a sub-second job shows start == end. Use the trace span.
        span_ns = max((op.time_ns + op.duration_ns for op in ops), default=0)
        end_us = start_us + max(span_ns // 1000, 1)
    meta = JobMeta(
        uid=int(job["uid"]) & 0xFFFFFFFF,
        nprocs=nprocs,
        job_id=int(job["jobid"]) & ((1 << 64) - 1),
        start_unix_us=start_us,
        end_unix_us=end_us,
        synthesized=synthesized_data or not recorded_data,
        source=source,
        executable=str(report.metadata.get("exe", ""))[:1024] or os.path.basename(log_path),
    )
    return Trace(meta, files, ops)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Convert a Darshan log to a Spillway trace.")
    parser.add_argument("log", nargs="?", help="Darshan log (.darshan)")
    parser.add_argument("-o", "--output", help="trace file to write (default: LOG with .spwt)")
    parser.add_argument("--list-examples", action="store_true", help="list the example logs bundled with PyDarshan")
    args = parser.parse_args(argv)
    if args.list_examples:
        for name, path in example_logs().items():
            print(f"{name}\t{path}")
        return 0
    if not args.log:
        parser.error("a Darshan log is required")
    output = args.output or os.path.splitext(os.path.basename(args.log))[0] + ".spwt"
    try:
        trace = convert(args.log)
    except ConversionError as error:
        print(f"spillway-darshan: {error}", file=sys.stderr)
        return 1
    save(trace, output)
    print(f"{output}: {len(trace.ops)} operations, {len(trace.files)} files, source {trace.meta.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
