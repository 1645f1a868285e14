"""Darshan logs to Spillway traces, through PyDarshan.

Three Darshan modules carry I/O calls, and each call becomes one trace operation:

- **POSIX** (open/read/write/stat/fsync …), with **DXT_POSIX** segments where DXT traced them;
- **STDIO** (fopen/fread/fwrite …): Darshan's POSIX module does not see the read()/write() that
  libc makes underneath, so STDIO operations are added beside the POSIX ones, never instead;
- **MPI-IO**, with **DXT_MPIIO** segments: MPI-IO calls are carried out by POSIX calls that the
  POSIX module already counts, so MPI-IO operations are used only for files that have no POSIX
  record (the POSIX module ran out of record memory or was disabled).

Data operations come from DXT segments when the log has them for a file (recorded: each
read/write with its offset, length, start and end). Otherwise they are synthesized from the
module's counters — counts, bytes and cumulative times are exact, but sizes are split evenly,
offsets are sequential and times are spread evenly over the file's read/write window — and the
trace header is then flagged *synthesized*. Darshan records no per-call metadata events, so
opens, closes, stats and fsyncs are always synthesized from counters the same way.

Darshan flags a module *partial* when it ran out of memory. For DXT the trace buffer filled up:
the segments missing from each file (counter minus DXT, in calls and bytes) are synthesized from
the counters so totals still match. For POSIX, STDIO and MPI-IO whole files went unrecorded: the
totals are lower bounds. Either way the header gets the PARTIAL flag and the ``source`` string
says what is missing; nothing is dropped silently.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Dict, Iterable, List, Optional, Set, Tuple

from .trace import STRING_BYTES_MAX, JobMeta, Op, Trace, TraceOp, save

#: Refuse to synthesize more operations than this (memory bound: ~100 bytes per op in Python).
OPS_MAX = 20_000_000


class ConversionError(ValueError):
    """The log cannot be converted; the message names the log and the reason."""


@dataclasses.dataclass(frozen=True)
class Module:
    """Where one Darshan module keeps the counters the converter needs."""

    name: str  # PyDarshan's module name
    prefix: str  # counter name prefix
    dxt: Optional[str]  # the DXT module tracing this one, if any
    reads: Tuple[str, ...]
    writes: Tuple[str, ...]
    opens: Tuple[str, ...]
    stats: Tuple[str, ...] = ()
    syncs: Tuple[str, ...] = ()
    # Highest byte offset touched (sequential offsets of synthesized ops wrap there); MPI-IO has none.
    max_byte_read: Optional[str] = None
    max_byte_written: Optional[str] = None

    def total(self, row: dict, names: Tuple[str, ...]) -> int:
        return sum(int(row[name]) for name in names)


POSIX = Module(
    "POSIX", "POSIX", "DXT_POSIX", ("POSIX_READS",), ("POSIX_WRITES",), ("POSIX_OPENS",),
    stats=("POSIX_STATS",), syncs=("POSIX_FSYNCS", "POSIX_FDSYNCS"),
    max_byte_read="POSIX_MAX_BYTE_READ", max_byte_written="POSIX_MAX_BYTE_WRITTEN",
)
# STDIO_FDOPENS are not opens of the file (fdopen() wraps a descriptor the POSIX module counted),
# and fflush() is not a sync to storage; neither becomes an operation.
STDIO = Module(
    "STDIO", "STDIO", None, ("STDIO_READS",), ("STDIO_WRITES",), ("STDIO_OPENS",),
    max_byte_read="STDIO_MAX_BYTE_READ", max_byte_written="STDIO_MAX_BYTE_WRITTEN",
)
MPIIO = Module(
    "MPI-IO", "MPIIO", "DXT_MPIIO",
    tuple(f"MPIIO_{kind}_READS" for kind in ("INDEP", "COLL", "SPLIT", "NB")),
    tuple(f"MPIIO_{kind}_WRITES" for kind in ("INDEP", "COLL", "SPLIT", "NB")),
    ("MPIIO_INDEP_OPENS", "MPIIO_COLL_OPENS"),
    syncs=("MPIIO_SYNCS",),
)
MODULES = (POSIX, STDIO, MPIIO)


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


@dataclasses.dataclass
class _Filled:
    """Data calls of one DXT module and op kind: all of them, and those filled in from counters."""

    calls: int = 0
    filled_calls: int = 0
    bytes: int = 0
    filled_bytes: int = 0


@dataclasses.dataclass
class _Conversion:
    """State of one conversion: the trace under construction and what it is made of."""

    log_path: str
    nprocs: int
    names: dict
    files: List[str] = dataclasses.field(default_factory=list)
    file_ids: Dict[int, int] = dataclasses.field(default_factory=dict)
    ops: List[TraceOp] = dataclasses.field(default_factory=list)
    recorded_ops: Dict[str, int] = dataclasses.field(default_factory=dict)  # by DXT module
    synthesized_ops: Dict[str, int] = dataclasses.field(default_factory=dict)  # by counter module
    filled: Dict[Tuple[str, Op], _Filled] = dataclasses.field(default_factory=dict)
    module_files: Dict[str, int] = dataclasses.field(default_factory=dict)  # files each module recorded
    console: Dict[str, List[int]] = dataclasses.field(default_factory=dict)  # name -> [calls, bytes] left out

    def file_id(self, record_id: int) -> int:
        if record_id not in self.file_ids:
            self.file_ids[record_id] = len(self.files)
            self.files.append(self.names.get(record_id, f"<darshan record {record_id:#x}>")[:STRING_BYTES_MAX])
        return self.file_ids[record_id]

    def check_size(self) -> None:
        if len(self.ops) > OPS_MAX:
            raise ConversionError(f"{self.log_path}: more than {OPS_MAX} operations; refusing to synthesize")


#: STDIO's pseudo-files for the standard streams.
CONSOLE_STREAMS = ("<STDIN>", "<STDOUT>", "<STDERR>")


def _dxt_segments(report, dxt_module: Optional[str]) -> Dict[int, List[dict]]:
    """DXT records by record id (one per rank that traced the file)."""
    by_id: Dict[int, List[dict]] = {}
    if dxt_module and dxt_module in report.records:
        for record in report.records[dxt_module].to_df():
            by_id.setdefault(int(record["id"]), []).append(record)
    return by_id


def _convert_module(
    conversion: _Conversion, report, module: Module, skip_ids: Set[int], dxt_partial: bool
) -> Set[int]:
    """Adds one module's operations, except for files in ``skip_ids``; returns the ids it covered."""
    frames = report.records[module.name].to_df()
    dxt = _dxt_segments(report, module.dxt)
    # A full DXT buffer stops tracing on that process: calls missing from DXT came after the last
    # segment the process recorded, whichever file it was on.
    buffer_full = _last_segment_ends(dxt) if dxt_partial else {}
    prefix = module.prefix
    covered: Set[int] = set()
    conversion.module_files[module.name] = len({int(record_id) for record_id in frames["counters"]["id"]})
    for row, frow in zip(frames["counters"].to_dict("records"), frames["fcounters"].to_dict("records")):
        record_id = int(row["id"])
        if int(frow["id"]) != record_id or int(frow["rank"]) != int(row["rank"]):
            raise ConversionError(
                f"{conversion.log_path}: {module.name} counter tables are not aligned at record {record_id}"
            )
        if record_id in skip_ids:
            continue
        name = conversion.names.get(record_id, "")
        if name in CONSOLE_STREAMS:
            # A terminal or the job's output file, not I/O a burst buffer would hold; said in
            # the source string, not dropped silently.
            left_out = conversion.console.setdefault(name, [0, 0])
            left_out[0] += module.total(row, module.reads) + module.total(row, module.writes)
            left_out[1] += int(row[f"{prefix}_BYTES_READ"]) + int(row[f"{prefix}_BYTES_WRITTEN"])
            continue
        covered.add(record_id)
        file_id = conversion.file_id(record_id)
        rank = int(row["rank"])
        ranks = [rank] if rank >= 0 else list(range(conversion.nprocs))

        opens = module.total(row, module.opens)
        stats = module.total(row, module.stats)
        syncs = module.total(row, module.syncs)
        meta_ops = 2 * opens + stats
        meta_duration = _seconds_to_ns(frow[f"{prefix}_F_META_TIME"] / meta_ops) if meta_ops else 0
        open_start, open_end = frow[f"{prefix}_F_OPEN_START_TIMESTAMP"], frow[f"{prefix}_F_OPEN_END_TIMESTAMP"]
        close_start, close_end = frow[f"{prefix}_F_CLOSE_START_TIMESTAMP"], frow[f"{prefix}_F_CLOSE_END_TIMESTAMP"]
        ops = conversion.ops
        ops += _synthesize_metadata(Op.STAT, stats, open_start, open_start, meta_duration, ranks, file_id)
        ops += _synthesize_metadata(Op.OPEN, opens, open_start, open_end, meta_duration, ranks, file_id)
        ops += _synthesize_metadata(Op.CLOSE, opens, close_start, max(close_end, close_start), meta_duration, ranks, file_id)
        ops += _synthesize_metadata(
            Op.FSYNC, syncs, frow[f"{prefix}_F_WRITE_START_TIMESTAMP"], frow[f"{prefix}_F_WRITE_END_TIMESTAMP"], 0,
            ranks, file_id,
        )

        # A shared record (rank -1) aggregates every rank; its DXT segments stay per rank.
        traced = [record for record in dxt.get(record_id, []) if rank < 0 or int(record["rank"]) == rank]
        for op, counter_names, bytes_name, extent_name, window, key in (
            (Op.READ, module.reads, f"{prefix}_BYTES_READ", module.max_byte_read, "READ", "read_segments"),
            (Op.WRITE, module.writes, f"{prefix}_BYTES_WRITTEN", module.max_byte_written, "WRITE", "write_segments"),
        ):
            calls, total_bytes = module.total(row, counter_names), int(row[bytes_name])
            start, end = frow[f"{prefix}_F_{window}_START_TIMESTAMP"], frow[f"{prefix}_F_{window}_END_TIMESTAMP"]
            seconds = frow[f"{prefix}_F_{window}_TIME"]
            recorded = _recorded(traced, key, op, file_id)
            ops += recorded
            recorded_bytes = sum(item.length for item in recorded)
            missing_calls = calls - len(recorded)
            missing_bytes = max(total_bytes - recorded_bytes, 0)
            if recorded:
                conversion.recorded_ops[module.dxt] = conversion.recorded_ops.get(module.dxt, 0) + len(recorded)
                # DXT traces calls in order: the missing ones came after the last recorded one.
                start = max(start, max(item.time_ns + item.duration_ns for item in recorded) / 1e9)
                seconds = max(seconds - sum(item.duration_ns for item in recorded) / 1e9, 0.0)
            if buffer_full:
                ends = [buffer_full.get(one, 0.0) for one in ranks]
                start = max(start, min(ends))
            if module.dxt:
                tally = conversion.filled.setdefault((module.dxt, op), _Filled())
                tally.calls += calls
                tally.bytes += total_bytes
            if missing_calls <= 0:
                continue
            extent = int(row[extent_name]) + 1 if extent_name else 0
            ops += _synthesize_data(op, missing_calls, missing_bytes, extent, start, max(end, start), seconds, ranks, file_id)
            conversion.synthesized_ops[module.name] = conversion.synthesized_ops.get(module.name, 0) + missing_calls
            if module.dxt and (recorded or dxt_partial):
                # DXT saw this file (or ran out of buffer before reaching it) but not every call.
                tally.filled_calls += missing_calls
                tally.filled_bytes += missing_bytes
        conversion.check_size()
    return covered


def _last_segment_ends(dxt: Dict[int, List[dict]]) -> Dict[int, float]:
    """End time (seconds) of the last DXT segment of each rank."""
    ends: Dict[int, float] = {}
    for records in dxt.values():
        for record in records:
            rank = int(record["rank"])
            for key in ("read_segments", "write_segments"):
                frame = record[key]
                if len(frame):
                    ends[rank] = max(ends.get(rank, 0.0), float(frame["end_time"].max()))
    return ends


def _recorded(traced: List[dict], key: str, op: Op, file_id: int) -> List[TraceOp]:
    ops = []
    for record in traced:
        frame = record[key]
        if len(frame) == 0:
            continue
        columns = zip(frame["offset"], frame["length"], frame["start_time"], frame["end_time"])
        for offset, length, start, end in columns:
            start_ns = _seconds_to_ns(start)
            duration_ns = max(_seconds_to_ns(end) - start_ns, 0)
            ops.append(TraceOp(start_ns, duration_ns, int(offset), int(length), int(record["rank"]), file_id, op))
    return ops


def _partial_flags(report) -> Dict[str, bool]:
    """Darshan's per-module "ran out of memory" flags, by module name."""
    return {name: bool(info.get("partial_flag", False)) for name, info in report.modules.items()}


_OP_NOUNS = {Op.READ: "reads", Op.WRITE: "writes"}


def _partial_warnings(conversion: _Conversion, partial: Dict[str, bool], present: Set[str]) -> Tuple[List[str], List[str]]:
    """What is missing from the trace (these set PARTIAL), and partial modules that do not affect it."""
    warnings: List[str] = []
    notes: List[str] = []
    for (dxt, op), tally in sorted(conversion.filled.items(), key=lambda item: (item[0][0], item[0][1])):
        if tally.filled_calls:
            warnings.append(
                f"{dxt} truncated: {tally.filled_calls:,} of {tally.calls:,} {_OP_NOUNS[op]} "
                f"({tally.filled_bytes:,} of {tally.bytes:,} bytes) filled in from counters"
            )
    for dxt in ("DXT_POSIX", "DXT_MPIIO"):
        if partial.get(dxt) and not any(tally.filled_calls for (name, _), tally in conversion.filled.items() if name == dxt):
            notes.append(f"{dxt} truncated, no operation of this trace needed filling in")
    for module in MODULES:
        if not partial.get(module.name):
            continue
        if module is MPIIO and "POSIX" in present and not partial.get("POSIX"):
            warnings.append(
                "MPI-IO ran out of record memory: files it did not record are still counted through POSIX"
            )
            continue
        warnings.append(
            f"{module.name} ran out of record memory: files beyond the {conversion.module_files.get(module.name, 0):,} it "
            f"recorded are missing, totals are lower bounds"
        )
    for name, flagged in sorted(partial.items()):
        if flagged and name not in {"DXT_POSIX", "DXT_MPIIO"} | {module.name for module in MODULES}:
            notes.append(f"{name} partial (not converted, no effect on this trace)")
    return warnings, notes


def _source(conversion: _Conversion, present: Set[str], mpiio_files: int) -> str:
    """The header's ``source`` string: which modules, and which data was recorded or synthesized."""
    recorded = sum(conversion.recorded_ops.values())
    synthesized = sum(conversion.synthesized_ops.values())
    label = "darshan-dxt" if recorded and not synthesized else "darshan-dxt+counters" if recorded else "darshan-counters"
    modules = [module.name for module in (POSIX, STDIO) if module.name in present]
    if mpiio_files:
        modules.append(f"MPI-IO for {mpiio_files:,} file{'' if mpiio_files == 1 else 's'} without a POSIX record")
    data = [f"{count:,} recorded by {name}" for name, count in sorted(conversion.recorded_ops.items())]
    data += [f"{count:,} synthesized from {name} counters" for name, count in sorted(conversion.synthesized_ops.items())]
    console = "".join(
        f"; {name} left out ({calls:,} calls, {total:,} bytes)" for name, (calls, total) in sorted(conversion.console.items())
    )
    return (
        f"{label} ({' + '.join(modules) or 'no module'}; data operations: {', '.join(data) or 'none'}; "
        f"metadata synthesized from counters{console})"
    )


def convert(log_path: str) -> Trace:
    """Converts one Darshan log into an in-memory trace."""
    import darshan

    try:
        report = darshan.DarshanReport(log_path, read_all=True)
    except Exception as error:  # PyDarshan raises bare exceptions for unreadable logs
        raise ConversionError(f"{log_path}: PyDarshan cannot read it: {error}") from error
    return convert_report(report, log_path)


def convert_report(report, log_path: str) -> Trace:
    """Converts an already opened ``darshan.DarshanReport`` (``read_all=True``); ``log_path`` names it in errors."""
    present = {module.name for module in MODULES if module.name in report.records and len(report.records[module.name])}
    if not present:
        others = sorted(name for name in report.records if len(report.records[name]))
        raise ConversionError(
            f"{log_path}: no POSIX, STDIO or MPI-IO records, nothing to convert "
            f"(records of: {', '.join(others) or 'no module'})"
        )
    job = report.metadata["job"]
    conversion = _Conversion(log_path, max(int(job.get("nprocs", 1)), 1), report.name_records)
    partial = _partial_flags(report)

    posix_ids: Set[int] = set()
    if POSIX.name in present:
        posix_ids = _convert_module(conversion, report, POSIX, set(), partial.get("DXT_POSIX", False))
    if STDIO.name in present:
        _convert_module(conversion, report, STDIO, set(), False)
    mpiio_ids: Set[int] = set()
    if MPIIO.name in present:
        # MPI-IO calls reach the file system as POSIX calls: count them only where POSIX did not.
        mpiio_ids = _convert_module(conversion, report, MPIIO, posix_ids, partial.get("DXT_MPIIO", False))

    ops = conversion.ops
    ops.sort(key=lambda op: op.time_ns)
    warnings, notes = _partial_warnings(conversion, partial, present)
    source = _source(conversion, present, len(mpiio_ids))
    if warnings:
        source += "; PARTIAL: " + "; ".join(warnings)
    if notes:
        source += "; note: " + "; ".join(notes)
    start_us = int(job["start_time_sec"]) * 1_000_000 + int(job.get("start_time_nsec", 0)) // 1000
    end_us = int(job["end_time_sec"]) * 1_000_000 + int(job.get("end_time_nsec", 0)) // 1000
    if end_us <= start_us:
        # Darshan stores whole seconds; a sub-second job shows start == end. Use the trace span.
        span_ns = max((op.time_ns + op.duration_ns for op in ops), default=0)
        end_us = start_us + max(span_ns // 1000, 1)
    meta = JobMeta(
        uid=int(job["uid"]) & 0xFFFFFFFF,
        nprocs=conversion.nprocs,
        job_id=int(job["jobid"]) & ((1 << 64) - 1),
        start_unix_us=start_us,
        end_unix_us=end_us,
        synthesized=bool(conversion.synthesized_ops) or not conversion.recorded_ops,
        source=source[:STRING_BYTES_MAX],
        executable=str(report.metadata.get("exe", ""))[:1024] or os.path.basename(log_path),
        partial=bool(warnings),
    )
    return Trace(meta, conversion.files, ops)


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
    if trace.meta.partial:
        print(f"spillway-darshan: warning: {args.log}: Darshan's data is incomplete, see PARTIAL in the source above",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
