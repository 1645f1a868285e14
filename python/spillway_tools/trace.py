"""Reader and writer of the Spillway trace format, version 1 (docs/design/trace.md).

Byte-identical with the Rust implementation in crates/trace/src/lib.rs: a fixed 44-byte header
(magic, version, flags, job metadata), two length-prefixed strings, then a stream of records —
file definitions (inline string table), operations (varint-packed, time as a zigzag delta) and
one end record with counts and a CRC-32 (zlib's) of everything before it.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import struct
import zlib
from typing import BinaryIO, Iterator, List, Optional

MAGIC = b"SPWTRACE"
VERSION = 1
FLAG_SYNTHESIZED = 1
#: The producer's input was incomplete (e.g. Darshan ran out of memory). Set exactly when the
#: ``source`` string contains PARTIAL_MARKER, followed by what is missing.
FLAG_PARTIAL = 2
FLAGS_KNOWN = FLAG_SYNTHESIZED | FLAG_PARTIAL
PARTIAL_MARKER = "PARTIAL:"
STRING_BYTES_MAX = 64 * 1024
TAG_FILE = 0x01
TAG_OP = 0x02
TAG_END = 0xFF
_HEADER = struct.Struct("<8sHHIIQQQ")
assert _HEADER.size == 44
U64 = (1 << 64) - 1


class Op(enum.IntEnum):
    """Operation codes; part of the on-disk format."""

    OPEN = 1
    CLOSE = 2
    STAT = 3
    READ = 4
    WRITE = 5
    UNLINK = 6
    FSYNC = 7
    MKDIR = 8
    READDIR = 9
    RENAME = 10
    TRUNCATE = 11
    CREATE = 12

    @property
    def is_data(self) -> bool:
        return self in (Op.READ, Op.WRITE)


@dataclasses.dataclass(frozen=True)
class TraceOp:
    time_ns: int
    duration_ns: int
    offset: int
    length: int
    rank: int
    file: int
    op: Op


@dataclasses.dataclass
class JobMeta:
    uid: int = 0
    nprocs: int = 0
    job_id: int = 0
    start_unix_us: int = 0
    end_unix_us: int = 0
    synthesized: bool = False
    source: str = ""
    executable: str = ""
    # Last, so positional constructors written before it existed keep working. Must agree with
    # PARTIAL_MARKER in ``source`` (the Rust side derives the flag from it).
    partial: bool = False


@dataclasses.dataclass
class Trace:
    meta: JobMeta
    files: List[str]
    ops: List[TraceOp]


class TraceError(ValueError):
    """The bytes are not a valid Spillway trace; the message names the byte offset."""


def _put_varint(out: bytearray, value: int) -> None:
    if value < 0 or value > U64:
        raise ValueError(f"varint value {value} outside 0..2^64-1")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _zigzag(value: int) -> int:
    return ((value << 1) ^ (value >> 63)) & U64


def _unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


class TraceWriter:
    """Streaming writer; call :meth:`finish` to write the end record."""

    def __init__(self, target: BinaryIO, meta: JobMeta):
        self._target = target
        self._crc = 0
        self._buffer = bytearray()
        self._file_ids: dict[str, int] = {}
        self._files = 0
        self._ops = 0
        self._previous_time = 0
        if meta.partial != (PARTIAL_MARKER in meta.source):
            raise ValueError(
                f"JobMeta.partial is {meta.partial} but the source string "
                f"{'lacks' if meta.partial else 'contains'} {PARTIAL_MARKER!r}: say what is missing, or clear it"
            )
        flags = (FLAG_SYNTHESIZED if meta.synthesized else 0) | (FLAG_PARTIAL if meta.partial else 0)
        self._buffer += _HEADER.pack(
            MAGIC, VERSION, flags, meta.uid, meta.nprocs, meta.job_id, meta.start_unix_us, meta.end_unix_us
        )
        self._put_string(meta.source)
        self._put_string(meta.executable)

    def _put_string(self, text: str) -> None:
        raw = text.encode("utf-8")
        if len(raw) > STRING_BYTES_MAX:
            raise ValueError(f"string of {len(raw)} bytes exceeds {STRING_BYTES_MAX}")
        _put_varint(self._buffer, len(raw))
        self._buffer += raw

    def _flush_if_full(self) -> None:
        if len(self._buffer) >= 64 * 1024:
            self._crc = zlib.crc32(self._buffer, self._crc)
            self._target.write(self._buffer)
            self._buffer = bytearray()

    def define_file(self, name: str) -> int:
        file_id = self._files
        self._buffer.append(TAG_FILE)
        _put_varint(self._buffer, file_id)
        self._put_string(name)
        self._files += 1
        self._file_ids.setdefault(name, file_id)
        self._flush_if_full()
        return file_id

    def file_id(self, name: str) -> int:
        found = self._file_ids.get(name)
        return found if found is not None else self.define_file(name)

    def write_op(self, op: TraceOp) -> None:
        if not 0 <= op.file < self._files:
            raise ValueError(f"operation names file {op.file}, only {self._files} defined")
        delta = (op.time_ns - self._previous_time) & U64
        if delta >= 1 << 63:
            delta -= 1 << 64
        self._previous_time = op.time_ns
        buffer = self._buffer
        buffer.append(TAG_OP)
        buffer.append(int(op.op))
        _put_varint(buffer, op.rank)
        _put_varint(buffer, op.file)
        _put_varint(buffer, _zigzag(delta))
        _put_varint(buffer, op.duration_ns)
        _put_varint(buffer, op.offset)
        _put_varint(buffer, op.length)
        self._ops += 1
        self._flush_if_full()

    def finish(self) -> None:
        self._buffer.append(TAG_END)
        _put_varint(self._buffer, self._ops)
        _put_varint(self._buffer, self._files)
        self._crc = zlib.crc32(self._buffer, self._crc)
        self._buffer += struct.pack("<I", self._crc)
        self._target.write(self._buffer)
        self._buffer = bytearray()
        self._target.flush()


class TraceReader:
    """Streaming reader: ``meta`` after construction, then iterate for operations."""

    def __init__(self, source: BinaryIO):
        self._source = source
        self._data = b""
        self._position = 0
        self._base = 0
        self._checked = 0
        self._crc = 0
        self.files: List[str] = []
        self._ops = 0
        self._previous_time = 0
        self.finished = False
        head = self._take(_HEADER.size, header=True)
        magic, version, flags, uid, nprocs, job_id, start, end = _HEADER.unpack(head)
        if magic != MAGIC:
            raise TraceError(f"not a Spillway trace: first 8 bytes are {magic!r}")
        if version != VERSION:
            raise TraceError(f"trace format version {version} is not supported (this reads {VERSION})")
        if flags & ~FLAGS_KNOWN:
            raise TraceError(f"unknown header flags {flags:#06x}")
        source_name = self._string()
        executable = self._string()
        if bool(flags & FLAG_PARTIAL) != (PARTIAL_MARKER in source_name):
            raise TraceError(
                f"header flag PARTIAL is {'' if flags & FLAG_PARTIAL else 'not '}set but the source string "
                f"{'lacks' if flags & FLAG_PARTIAL else 'contains'} {PARTIAL_MARKER!r}"
            )
        self.meta = JobMeta(
            uid, nprocs, job_id, start, end, bool(flags & FLAG_SYNTHESIZED), source_name, executable,
            partial=bool(flags & FLAG_PARTIAL),
        )

    def _offset(self) -> int:
        return self._base + self._position

    def _refill(self) -> bool:
        self._crc = zlib.crc32(self._data[self._checked :], self._crc)
        self._base += len(self._data)
        self._data = self._source.read(64 * 1024)
        self._position = 0
        self._checked = 0
        return bool(self._data)

    def _byte(self) -> int:
        if self._position >= len(self._data) and not self._refill():
            raise TraceError(f"trace ends early at byte {self._offset()} (no end record)")
        value = self._data[self._position]
        self._position += 1
        return value

    def _take(self, count: int, header: bool = False) -> bytes:
        out = bytearray()
        try:
            for _ in range(count):
                out.append(self._byte())
        except TraceError:
            if header:
                raise TraceError("not a Spillway trace: shorter than its header") from None
            raise
        return bytes(out)

    def _varint(self) -> int:
        start = self._offset()
        value = 0
        for index in range(10):
            byte = self._byte()
            if index == 9 and byte > 1:
                raise TraceError(f"malformed varint at byte {start}")
            value |= (byte & 0x7F) << (7 * index)
            if not byte & 0x80:
                return value
        raise TraceError(f"malformed varint at byte {start}")

    def _string(self) -> str:
        offset = self._offset()
        length = self._varint()
        if length > STRING_BYTES_MAX:
            raise TraceError(f"string of {length} bytes at byte {offset} exceeds {STRING_BYTES_MAX}")
        try:
            return self._take(length).decode("utf-8")
        except UnicodeDecodeError:
            raise TraceError(f"string at byte {offset} is not UTF-8") from None

    def __iter__(self) -> Iterator[TraceOp]:
        while not self.finished:
            op = self.next_op()
            if op is None:
                return
            yield op

    def next_op(self) -> Optional[TraceOp]:
        while not self.finished:
            offset = self._offset()
            tag = self._byte()
            if tag == TAG_OP:
                code = self._byte()
                try:
                    kind = Op(code)
                except ValueError:
                    raise TraceError(f"unknown operation code {code} at byte {offset}") from None
                rank = self._varint()
                if rank > 0xFFFFFFFF:
                    raise TraceError(f"rank {rank} at byte {offset} does not fit 32 bits")
                file_id = self._varint()
                if file_id >= len(self.files):
                    raise TraceError(f"operation at byte {offset} names file {file_id}, only {len(self.files)} defined")
                self._previous_time = (self._previous_time + _unzigzag(self._varint())) & U64
                duration = self._varint()
                op_offset = self._varint()
                length = self._varint()
                self._ops += 1
                return TraceOp(self._previous_time, duration, op_offset, length, rank, file_id, kind)
            if tag == TAG_FILE:
                file_id = self._varint()
                if file_id != len(self.files):
                    raise TraceError(f"file record at byte {offset} defines id {file_id}, expected {len(self.files)}")
                self.files.append(self._string())
            elif tag == TAG_END:
                self._read_end()
            else:
                raise TraceError(f"unknown record tag {tag:#04x} at byte {offset}")
        return None

    def _read_end(self) -> None:
        ops = self._varint()
        files = self._varint()
        computed = zlib.crc32(self._data[self._checked : self._position], self._crc)
        self._checked = self._position
        stored = struct.unpack("<I", self._take(4))[0]
        self._checked = self._position
        if ops != self._ops or files != len(self.files):
            raise TraceError(f"end record counts {ops} ops/{files} files, stream held {self._ops}/{len(self.files)}")
        if stored != computed:
            raise TraceError(f"trace checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")
        trailing = len(self._data) - self._position + len(self._source.read())
        if trailing:
            raise TraceError(f"{trailing} bytes of trailing data after the end record")
        self.finished = True


def write_trace(trace: Trace, target: BinaryIO) -> None:
    writer = TraceWriter(target, trace.meta)
    for name in trace.files:
        writer.define_file(name)
    for op in trace.ops:
        writer.write_op(op)
    writer.finish()


def read_trace(source: BinaryIO) -> Trace:
    reader = TraceReader(source)
    ops = list(reader)
    return Trace(reader.meta, reader.files, ops)


def dumps(trace: Trace) -> bytes:
    out = io.BytesIO()
    write_trace(trace, out)
    return out.getvalue()


def loads(data: bytes) -> Trace:
    return read_trace(io.BytesIO(data))


def save(trace: Trace, path: str) -> None:
    with open(path, "wb") as target:
        write_trace(trace, target)


def load(path: str) -> Trace:
    with open(path, "rb") as source:
        return read_trace(source)
