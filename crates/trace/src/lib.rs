//! The Spillway trace format, version 1: a compact, streamable, little-endian record of every I/O
//! operation of one job (time, rank, file, operation, offset, length, duration) plus the job's
//! metadata. Darshan converters (python/spillway_tools), synthetic generators and the client
//! tracer (spillway-client) produce it; `spillway sim` and `spillway characterize` consume it.
//! A leaf crate (serde and thiserror only) so the client can record traces without the simulator.
//!
//! Why this shape: a trace can hold millions of operations, so records are varint-packed (a
//! typical operation is 10–16 bytes) and file names live once in a string table that is written
//! inline, before first use, so a writer never needs to know the whole table up front and a
//! reader never needs to seek. The byte-by-byte layout is in docs/design/trace.md; the Python
//! implementation in python/spillway_tools/trace.py must stay byte-identical.

pub mod crc32;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::crc32::Crc32;

/// The first eight bytes of every trace file.
pub const MAGIC: [u8; 8] = *b"SPWTRACE";
/// The format version this code reads and writes.
pub const VERSION: u16 = 1;
/// Header flag: the operations were synthesized from aggregate counters, not recorded one by one.
pub const FLAG_SYNTHESIZED: u16 = 1;
/// Header flag: the producer's input was incomplete (e.g. Darshan ran out of memory), so totals
/// are partly filled in or are lower bounds. Set exactly when `source` contains [`PARTIAL_MARKER`],
/// which is followed by what is missing: see [`JobMeta::partial`].
pub const FLAG_PARTIAL: u16 = 2;
const FLAGS_KNOWN: u16 = FLAG_SYNTHESIZED | FLAG_PARTIAL;
/// Text in `source` that introduces what a partial trace is missing; present iff [`FLAG_PARTIAL`].
pub const PARTIAL_MARKER: &str = "PARTIAL:";
/// Longest file name or header string accepted, in bytes. Longer input is corrupt, not a path.
pub const STRING_BYTES_MAX: usize = 64 * 1024;
/// Most distinct files in one trace.
pub const FILES_MAX: u64 = u32::MAX as u64;

const TAG_FILE: u8 = 0x01;
const TAG_OP: u8 = 0x02;
const TAG_END: u8 = 0xFF;
const HEADER_FIXED_BYTES: usize = 44;

/// One kind of I/O operation. Codes are part of the on-disk format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Op {
    Open = 1,
    Close = 2,
    Stat = 3,
    Read = 4,
    Write = 5,
    Unlink = 6,
    Fsync = 7,
    Mkdir = 8,
    Readdir = 9,
    Rename = 10,
    Truncate = 11,
    Create = 12,
}

impl Op {
    pub const ALL: [Op; 12] = [
        Op::Open,
        Op::Close,
        Op::Stat,
        Op::Read,
        Op::Write,
        Op::Unlink,
        Op::Fsync,
        Op::Mkdir,
        Op::Readdir,
        Op::Rename,
        Op::Truncate,
        Op::Create,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    #[inline]
    pub fn from_code(code: u8) -> Option<Op> {
        match code {
            1..=12 => Some(Op::ALL[usize::from(code) - 1]),
            _ => None,
        }
    }

    /// Read and write move data; every other operation is metadata (the DataWarp paper's split:
    /// open, close, stat, create, unlink, … and synchronisation).
    pub fn is_data(self) -> bool {
        matches!(self, Op::Read | Op::Write)
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Open => "open",
            Op::Close => "close",
            Op::Stat => "stat",
            Op::Read => "read",
            Op::Write => "write",
            Op::Unlink => "unlink",
            Op::Fsync => "fsync",
            Op::Mkdir => "mkdir",
            Op::Readdir => "readdir",
            Op::Rename => "rename",
            Op::Truncate => "truncate",
            Op::Create => "create",
        }
    }
}

/// One operation of the trace. Times are nanoseconds since the job's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceOp {
    pub time_ns: u64,
    pub duration_ns: u64,
    pub offset: u64,
    pub length: u64,
    pub rank: u32,
    pub file: u32,
    pub op: Op,
}

/// Job metadata carried in the header.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMeta {
    pub uid: u32,
    pub nprocs: u32,
    pub job_id: u64,
    pub start_unix_us: u64,
    pub end_unix_us: u64,
    /// True when the operations were synthesized from counters rather than recorded.
    pub synthesized: bool,
    /// Who produced the trace, e.g. `darshan-dxt`, `darshan-counters`, `spillway-synth`; for a
    /// partial trace also what is missing, after [`PARTIAL_MARKER`].
    pub source: String,
    /// The traced executable or workflow stage.
    pub executable: String,
}

impl JobMeta {
    /// True when the producer's input was incomplete ([`FLAG_PARTIAL`]); `source` says what is
    /// missing after [`PARTIAL_MARKER`]. Derived from `source` rather than stored in a field so
    /// that adding the flag did not change the fields every producer spells out.
    pub fn partial(&self) -> bool {
        self.source.contains(PARTIAL_MARKER)
    }

    /// Text after [`PARTIAL_MARKER`] in `source`: what a partial trace is missing.
    pub fn partial_warning(&self) -> Option<&str> {
        self.source.find(PARTIAL_MARKER).map(|at| self.source[at + PARTIAL_MARKER.len()..].trim())
    }

    /// Wall time of the job in seconds, when the header knows it.
    pub fn wall_seconds(&self) -> Option<f64> {
        (self.end_unix_us > self.start_unix_us)
            .then(|| (self.end_unix_us - self.start_unix_us) as f64 / 1e6)
    }
}

/// Why a trace could not be read. Offsets are byte offsets in the trace stream.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceReadError {
    #[error("trace I/O error at byte {offset}: {source}")]
    Io { offset: u64, source: std::io::Error },
    #[error("not a Spillway trace: the first 8 bytes are {found:?}, expected \"SPWTRACE\"")]
    BadMagic { found: [u8; 8] },
    #[error(
        "trace format version {version} is not supported (this build reads version {VERSION})"
    )]
    UnsupportedVersion { version: u16 },
    #[error("trace header has unknown flags {flags:#06x}")]
    UnknownFlags { flags: u16 },
    #[error(
        "trace header flag PARTIAL is {}set but the source string {} \"{PARTIAL_MARKER}\"",
        if *flag { "" } else { "not " },
        if *flag { "lacks" } else { "contains" }
    )]
    PartialMismatch { flag: bool },
    #[error("trace ends early at byte {offset} (no end record)")]
    Truncated { offset: u64 },
    #[error("unknown record tag {tag:#04x} at byte {offset}")]
    UnknownTag { tag: u8, offset: u64 },
    #[error("unknown operation code {code} at byte {offset}")]
    UnknownOp { code: u8, offset: u64 },
    #[error("malformed varint at byte {offset}")]
    BadVarint { offset: u64 },
    #[error("string of {bytes} bytes at byte {offset} exceeds the {STRING_BYTES_MAX}-byte limit")]
    StringTooLong { bytes: u64, offset: u64 },
    #[error("string at byte {offset} is not UTF-8")]
    BadUtf8 { offset: u64 },
    #[error("file record at byte {offset} defines id {found}, expected the next id {expected}")]
    FileIdOutOfOrder { expected: u64, found: u64, offset: u64 },
    #[error("operation at byte {offset} names file {file}, but only {defined} files are defined")]
    UndefinedFile { file: u64, defined: u64, offset: u64 },
    #[error("value {value} of {field} at byte {offset} does not fit")]
    OutOfRange { field: &'static str, value: u64, offset: u64 },
    #[error("end record counts {claimed_ops} ops and {claimed_files} files, the stream held {ops} and {files}")]
    CountMismatch { claimed_ops: u64, claimed_files: u64, ops: u64, files: u64 },
    #[error("trace checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("{bytes} bytes of trailing data after the end record at byte {offset}")]
    TrailingData { bytes: u64, offset: u64 },
}

/// Why a trace could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceWriteError {
    #[error("trace write failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("string of {bytes} bytes exceeds the {STRING_BYTES_MAX}-byte limit")]
    StringTooLong { bytes: usize },
    #[error("operation names file {file}, but only {defined} files are defined")]
    UndefinedFile { file: u32, defined: u32 },
    #[error("more than {FILES_MAX} files in one trace")]
    TooManyFiles,
}

/// A whole trace in memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    pub meta: JobMeta,
    pub files: Vec<String>,
    pub ops: Vec<TraceOp>,
}

impl Trace {
    /// Reads a whole trace file.
    pub fn read_path(path: &Path) -> Result<Trace, TraceReadError> {
        let file =
            std::fs::File::open(path).map_err(|source| TraceReadError::Io { offset: 0, source })?;
        Trace::read_from(file)
    }

    pub fn read_from<R: Read>(source: R) -> Result<Trace, TraceReadError> {
        let mut reader = TraceReader::new(source)?;
        let mut ops = Vec::new();
        while let Some(op) = reader.next_op()? {
            ops.push(op);
        }
        let (meta, files) = reader.into_parts();
        Ok(Trace { meta, files, ops })
    }

    /// Writes the trace; operations name files by index into `files`.
    pub fn write_to<W: Write>(&self, target: W) -> Result<W, TraceWriteError> {
        let mut writer = TraceWriter::new(target, &self.meta)?;
        for name in &self.files {
            writer.define_file(name)?;
        }
        for op in &self.ops {
            writer.write_op(op)?;
        }
        writer.finish()
    }

    pub fn write_path(&self, path: &Path) -> Result<(), TraceWriteError> {
        let file = std::fs::File::create(path)?;
        let file = self.write_to(file)?;
        file.sync_all()?;
        Ok(())
    }
}

/// Streaming reader: the header is parsed by [`TraceReader::new`], then [`TraceReader::next_op`]
/// yields operations one at a time in O(1) memory (plus the string table).
pub struct TraceReader<R: Read> {
    source: R,
    buffer: Vec<u8>,
    position: usize,
    filled: usize,
    /// Stream offset of `buffer[0]`.
    base_offset: u64,
    /// Bytes of `buffer` already fed to the checksum.
    checksummed: usize,
    crc: Crc32,
    meta: JobMeta,
    files: Vec<String>,
    ops_read: u64,
    previous_time_ns: u64,
    finished: bool,
}

const READ_BUFFER_BYTES: usize = 64 * 1024;

impl<R: Read> TraceReader<R> {
    pub fn new(source: R) -> Result<Self, TraceReadError> {
        let mut reader = TraceReader {
            source,
            buffer: vec![0; READ_BUFFER_BYTES],
            position: 0,
            filled: 0,
            base_offset: 0,
            checksummed: 0,
            crc: Crc32::new(),
            meta: JobMeta::default(),
            files: Vec::new(),
            ops_read: 0,
            previous_time_ns: 0,
            finished: false,
        };
        reader.read_header()?;
        Ok(reader)
    }

    pub fn meta(&self) -> &JobMeta {
        &self.meta
    }

    /// File names defined so far (all of them once [`TraceReader::next_op`] returned `None`).
    pub fn files(&self) -> &[String] {
        &self.files
    }

    pub fn into_parts(self) -> (JobMeta, Vec<String>) {
        (self.meta, self.files)
    }

    fn offset(&self) -> u64 {
        self.base_offset + self.position as u64
    }

    /// Refills the buffer; returns false at end of stream.
    fn refill(&mut self) -> Result<bool, TraceReadError> {
        debug_assert_eq!(self.position, self.filled);
        self.crc.update(&self.buffer[self.checksummed..self.filled]);
        self.base_offset += self.filled as u64;
        self.position = 0;
        self.filled = 0;
        self.checksummed = 0;
        loop {
            match self.source.read(&mut self.buffer) {
                Ok(bytes) => {
                    self.filled = bytes;
                    return Ok(bytes > 0);
                }
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(TraceReadError::Io { offset: self.base_offset, source }),
            }
        }
    }

    #[inline]
    fn byte(&mut self) -> Result<u8, TraceReadError> {
        if self.position == self.filled && !self.refill()? {
            return Err(TraceReadError::Truncated { offset: self.offset() });
        }
        let value = self.buffer[self.position];
        self.position += 1;
        Ok(value)
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], TraceReadError> {
        let mut out = [0u8; N];
        for slot in out.iter_mut() {
            *slot = self.byte()?;
        }
        Ok(out)
    }

    #[inline]
    fn varint(&mut self) -> Result<u64, TraceReadError> {
        let start = self.offset();
        let mut value: u64 = 0;
        for index in 0..10 {
            let byte = self.byte()?;
            let payload = u64::from(byte & 0x7F);
            if index == 9 && byte > 1 {
                return Err(TraceReadError::BadVarint { offset: start });
            }
            value |= payload << (7 * index);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(TraceReadError::BadVarint { offset: start })
    }

    fn string(&mut self) -> Result<String, TraceReadError> {
        let offset = self.offset();
        let bytes = self.varint()?;
        if bytes > STRING_BYTES_MAX as u64 {
            return Err(TraceReadError::StringTooLong { bytes, offset });
        }
        let mut raw = Vec::with_capacity(bytes as usize);
        for _ in 0..bytes {
            raw.push(self.byte()?);
        }
        String::from_utf8(raw).map_err(|_| TraceReadError::BadUtf8 { offset })
    }

    fn read_header(&mut self) -> Result<(), TraceReadError> {
        let magic: [u8; 8] = self.bytes().map_err(|error| match error {
            TraceReadError::Truncated { .. } => TraceReadError::BadMagic { found: [0; 8] },
            other => other,
        })?;
        if magic != MAGIC {
            return Err(TraceReadError::BadMagic { found: magic });
        }
        let version = u16::from_le_bytes(self.bytes()?);
        if version != VERSION {
            return Err(TraceReadError::UnsupportedVersion { version });
        }
        let flags = u16::from_le_bytes(self.bytes()?);
        if flags & !FLAGS_KNOWN != 0 {
            return Err(TraceReadError::UnknownFlags { flags });
        }
        let uid = u32::from_le_bytes(self.bytes()?);
        let nprocs = u32::from_le_bytes(self.bytes()?);
        let job_id = u64::from_le_bytes(self.bytes()?);
        let start_unix_us = u64::from_le_bytes(self.bytes()?);
        let end_unix_us = u64::from_le_bytes(self.bytes()?);
        debug_assert_eq!(self.offset(), HEADER_FIXED_BYTES as u64);
        let source = self.string()?;
        let executable = self.string()?;
        // The flag and the explanation travel together, so a re-encoded trace keeps both.
        let partial = flags & FLAG_PARTIAL != 0;
        if partial != source.contains(PARTIAL_MARKER) {
            return Err(TraceReadError::PartialMismatch { flag: partial });
        }
        self.meta = JobMeta {
            uid,
            nprocs,
            job_id,
            start_unix_us,
            end_unix_us,
            synthesized: flags & FLAG_SYNTHESIZED != 0,
            source,
            executable,
        };
        Ok(())
    }

    /// The next operation, or `None` after the end record (which is verified: counts and CRC).
    pub fn next_op(&mut self) -> Result<Option<TraceOp>, TraceReadError> {
        if self.finished {
            return Ok(None);
        }
        loop {
            let offset = self.offset();
            match self.byte()? {
                TAG_OP => return self.read_op(offset).map(Some),
                TAG_FILE => self.read_file(offset)?,
                TAG_END => {
                    self.read_end()?;
                    self.finished = true;
                    return Ok(None);
                }
                tag => return Err(TraceReadError::UnknownTag { tag, offset }),
            }
        }
    }

    fn read_file(&mut self, offset: u64) -> Result<(), TraceReadError> {
        let id = self.varint()?;
        let expected = self.files.len() as u64;
        if id != expected || id >= FILES_MAX {
            return Err(TraceReadError::FileIdOutOfOrder { expected, found: id, offset });
        }
        let name = self.string()?;
        self.files.push(name);
        Ok(())
    }

    #[inline]
    fn read_op(&mut self, offset: u64) -> Result<TraceOp, TraceReadError> {
        // Fast path: a whole record (at most 1 + 6 × 10 bytes after the tag) is buffered.
        if self.filled - self.position >= 61 {
            return self.read_op_buffered(offset);
        }
        self.read_op_streaming(offset)
    }

    /// Decodes an operation straight from the buffer, without per-byte refill checks.
    fn read_op_buffered(&mut self, offset: u64) -> Result<TraceOp, TraceReadError> {
        let bytes = &self.buffer[self.position..self.filled];
        let code = bytes[0];
        let op = Op::from_code(code).ok_or(TraceReadError::UnknownOp { code, offset })?;
        let mut cursor = 1;
        let mut fields = [0u64; 6];
        for field in fields.iter_mut() {
            let start = cursor;
            let mut value = 0u64;
            let mut index = 0;
            loop {
                let byte = bytes[cursor];
                cursor += 1;
                if index == 9 && byte > 1 {
                    return Err(TraceReadError::BadVarint {
                        offset: self.base_offset + (self.position + start) as u64,
                    });
                }
                value |= u64::from(byte & 0x7F) << (7 * index);
                if byte & 0x80 == 0 {
                    break;
                }
                index += 1;
                if index == 10 {
                    return Err(TraceReadError::BadVarint {
                        offset: self.base_offset + (self.position + start) as u64,
                    });
                }
            }
            *field = value;
        }
        self.position += cursor;
        let [rank, file, delta, duration_ns, op_offset, length] = fields;
        let rank = u32::try_from(rank).map_err(|_| TraceReadError::OutOfRange {
            field: "rank",
            value: rank,
            offset,
        })?;
        if file >= self.files.len() as u64 {
            return Err(TraceReadError::UndefinedFile {
                file,
                defined: self.files.len() as u64,
                offset,
            });
        }
        let time_ns = self.previous_time_ns.wrapping_add(unzigzag(delta) as u64);
        self.previous_time_ns = time_ns;
        self.ops_read += 1;
        Ok(TraceOp { time_ns, duration_ns, offset: op_offset, length, rank, file: file as u32, op })
    }

    fn read_op_streaming(&mut self, offset: u64) -> Result<TraceOp, TraceReadError> {
        let code = self.byte()?;
        let op = Op::from_code(code).ok_or(TraceReadError::UnknownOp { code, offset })?;
        let rank = self.varint()?;
        let rank = u32::try_from(rank).map_err(|_| TraceReadError::OutOfRange {
            field: "rank",
            value: rank,
            offset,
        })?;
        let file = self.varint()?;
        if file >= self.files.len() as u64 {
            return Err(TraceReadError::UndefinedFile {
                file,
                defined: self.files.len() as u64,
                offset,
            });
        }
        // Deltas are modulo 2^64 so that any u64 time round-trips; the CRC guards corruption.
        let delta = unzigzag(self.varint()?);
        let time_ns = self.previous_time_ns.wrapping_add(delta as u64);
        self.previous_time_ns = time_ns;
        let duration_ns = self.varint()?;
        let op_offset = self.varint()?;
        let length = self.varint()?;
        self.ops_read += 1;
        Ok(TraceOp { time_ns, duration_ns, offset: op_offset, length, rank, file: file as u32, op })
    }

    fn read_end(&mut self) -> Result<(), TraceReadError> {
        let claimed_ops = self.varint()?;
        let claimed_files = self.varint()?;
        // The checksum covers every byte before the stored CRC field.
        self.crc.update(&self.buffer[self.checksummed..self.position]);
        self.checksummed = self.position;
        let computed = self.crc.clone().finish();
        let stored = u32::from_le_bytes(self.bytes()?);
        self.checksummed = self.position;
        if claimed_ops != self.ops_read || claimed_files != self.files.len() as u64 {
            return Err(TraceReadError::CountMismatch {
                claimed_ops,
                claimed_files,
                ops: self.ops_read,
                files: self.files.len() as u64,
            });
        }
        if stored != computed {
            return Err(TraceReadError::Checksum { stored, computed });
        }
        let offset = self.offset();
        let mut trailing = (self.filled - self.position) as u64;
        let mut scratch = [0u8; 4096];
        loop {
            match self.source.read(&mut scratch) {
                Ok(0) => break,
                Ok(bytes) => trailing += bytes as u64,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(TraceReadError::Io { offset, source }),
            }
        }
        if trailing > 0 {
            return Err(TraceReadError::TrailingData { bytes: trailing, offset });
        }
        Ok(())
    }
}

/// Streaming writer. File names are interned on first use ([`TraceWriter::file_id`]) or
/// defined explicitly in order ([`TraceWriter::define_file`]).
pub struct TraceWriter<W: Write> {
    target: W,
    buffer: Vec<u8>,
    crc: Crc32,
    file_ids: HashMap<String, u32>,
    files_defined: u32,
    ops_written: u64,
    previous_time_ns: u64,
}

const WRITE_BUFFER_BYTES: usize = 64 * 1024;

impl<W: Write> TraceWriter<W> {
    pub fn new(target: W, meta: &JobMeta) -> Result<Self, TraceWriteError> {
        let mut writer = TraceWriter {
            target,
            buffer: Vec::with_capacity(WRITE_BUFFER_BYTES + 64),
            crc: Crc32::new(),
            file_ids: HashMap::new(),
            files_defined: 0,
            ops_written: 0,
            previous_time_ns: 0,
        };
        let mut flags = if meta.synthesized { FLAG_SYNTHESIZED } else { 0 };
        if meta.partial() {
            flags |= FLAG_PARTIAL;
        }
        writer.buffer.extend_from_slice(&MAGIC);
        writer.buffer.extend_from_slice(&VERSION.to_le_bytes());
        writer.buffer.extend_from_slice(&flags.to_le_bytes());
        writer.buffer.extend_from_slice(&meta.uid.to_le_bytes());
        writer.buffer.extend_from_slice(&meta.nprocs.to_le_bytes());
        writer.buffer.extend_from_slice(&meta.job_id.to_le_bytes());
        writer.buffer.extend_from_slice(&meta.start_unix_us.to_le_bytes());
        writer.buffer.extend_from_slice(&meta.end_unix_us.to_le_bytes());
        assert_eq!(writer.buffer.len(), HEADER_FIXED_BYTES);
        writer.put_string(&meta.source)?;
        writer.put_string(&meta.executable)?;
        Ok(writer)
    }

    fn put_string(&mut self, text: &str) -> Result<(), TraceWriteError> {
        if text.len() > STRING_BYTES_MAX {
            return Err(TraceWriteError::StringTooLong { bytes: text.len() });
        }
        put_varint(&mut self.buffer, text.len() as u64);
        self.buffer.extend_from_slice(text.as_bytes());
        Ok(())
    }

    fn flush_if_full(&mut self) -> Result<(), TraceWriteError> {
        if self.buffer.len() >= WRITE_BUFFER_BYTES {
            self.crc.update(&self.buffer);
            self.target.write_all(&self.buffer)?;
            self.buffer.clear();
        }
        Ok(())
    }

    /// Defines the next file id for `name` (even if the name was seen before) and returns it.
    pub fn define_file(&mut self, name: &str) -> Result<u32, TraceWriteError> {
        if u64::from(self.files_defined) >= FILES_MAX {
            return Err(TraceWriteError::TooManyFiles);
        }
        let id = self.files_defined;
        self.buffer.push(TAG_FILE);
        put_varint(&mut self.buffer, u64::from(id));
        self.put_string(name)?;
        self.files_defined += 1;
        self.file_ids.entry(name.to_owned()).or_insert(id);
        self.flush_if_full()?;
        Ok(id)
    }

    /// The id of `name`, defining it on first use.
    pub fn file_id(&mut self, name: &str) -> Result<u32, TraceWriteError> {
        match self.file_ids.get(name) {
            Some(&id) => Ok(id),
            None => self.define_file(name),
        }
    }

    pub fn write_op(&mut self, op: &TraceOp) -> Result<(), TraceWriteError> {
        if op.file >= self.files_defined {
            return Err(TraceWriteError::UndefinedFile {
                file: op.file,
                defined: self.files_defined,
            });
        }
        let delta = op.time_ns.wrapping_sub(self.previous_time_ns) as i64;
        self.previous_time_ns = op.time_ns;
        self.buffer.push(TAG_OP);
        self.buffer.push(op.op.code());
        put_varint(&mut self.buffer, u64::from(op.rank));
        put_varint(&mut self.buffer, u64::from(op.file));
        put_varint(&mut self.buffer, zigzag(delta));
        put_varint(&mut self.buffer, op.duration_ns);
        put_varint(&mut self.buffer, op.offset);
        put_varint(&mut self.buffer, op.length);
        self.ops_written += 1;
        self.flush_if_full()
    }

    /// Writes the end record (counts and CRC), flushes and returns the target.
    pub fn finish(mut self) -> Result<W, TraceWriteError> {
        self.buffer.push(TAG_END);
        put_varint(&mut self.buffer, self.ops_written);
        put_varint(&mut self.buffer, u64::from(self.files_defined));
        self.crc.update(&self.buffer);
        let crc = self.crc.finish();
        self.buffer.extend_from_slice(&crc.to_le_bytes());
        self.target.write_all(&self.buffer)?;
        self.target.flush()?;
        Ok(self.target)
    }
}

#[inline]
fn put_varint(buffer: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        buffer.push((value as u8) | 0x80);
        value >>= 7;
    }
    buffer.push(value as u8);
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Trace {
        Trace {
            meta: JobMeta {
                uid: 1000,
                nprocs: 4,
                job_id: 77,
                start_unix_us: 1_600_000_000_000_000,
                end_unix_us: 1_600_000_010_000_000,
                synthesized: false,
                source: "test".into(),
                executable: "/bin/app".into(),
            },
            files: vec!["/bb/a".into(), "/bb/b".into()],
            ops: vec![
                TraceOp {
                    time_ns: 10,
                    duration_ns: 5,
                    offset: 0,
                    length: 0,
                    rank: 0,
                    file: 0,
                    op: Op::Open,
                },
                TraceOp {
                    time_ns: 20,
                    duration_ns: 50,
                    offset: 0,
                    length: 4096,
                    rank: 1,
                    file: 1,
                    op: Op::Write,
                },
                TraceOp {
                    time_ns: 15,
                    duration_ns: 9,
                    offset: 4096,
                    length: 8192,
                    rank: 3,
                    file: 0,
                    op: Op::Read,
                },
            ],
        }
    }

    fn encode(trace: &Trace) -> Vec<u8> {
        trace.write_to(Vec::new()).expect("writing to memory")
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let trace = sample();
        let bytes = encode(&trace);
        assert_eq!(&bytes[..8], b"SPWTRACE");
        assert_eq!(Trace::read_from(&bytes[..]).unwrap(), trace);
    }

    #[test]
    fn header_layout_matches_the_documented_offsets() {
        let bytes = encode(&sample());
        assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), VERSION);
        assert_eq!(u32::from_le_bytes(bytes[12..16].try_into().unwrap()), 1000);
        assert_eq!(u32::from_le_bytes(bytes[16..20].try_into().unwrap()), 4);
        assert_eq!(u64::from_le_bytes(bytes[20..28].try_into().unwrap()), 77);
        assert_eq!(bytes[44], 4, "source string length varint");
        assert_eq!(&bytes[45..49], b"test");
    }

    #[test]
    fn every_single_byte_flip_is_detected() {
        let bytes = encode(&sample());
        for index in 0..bytes.len() {
            let mut corrupt = bytes.clone();
            corrupt[index] ^= 0x10;
            assert!(Trace::read_from(&corrupt[..]).is_err(), "flip at byte {index} went unnoticed");
        }
    }

    #[test]
    fn truncation_and_trailing_garbage_are_errors() {
        let bytes = encode(&sample());
        for cut in 0..bytes.len() {
            assert!(Trace::read_from(&bytes[..cut]).is_err(), "cut at {cut} accepted");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            Trace::read_from(&longer[..]),
            Err(TraceReadError::TrailingData { bytes: 1, .. })
        ));
    }

    /// A source that returns one byte per read, forcing the streaming (slow) decode path.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() || out.is_empty() {
                return Ok(0);
            }
            out[0] = self.0[0];
            self.0 = &self.0[1..];
            Ok(1)
        }
    }

    #[test]
    fn buffered_and_streaming_decoders_agree() {
        let mut trace = sample();
        for index in 0..5000u64 {
            let op = Op::ALL[(index % 12) as usize];
            trace.ops.push(TraceOp {
                time_ns: index * 977,
                duration_ns: index,
                offset: index << 20,
                length: u64::MAX - index,
                rank: index as u32,
                file: (index % 2) as u32,
                op,
            });
        }
        let bytes = encode(&trace);
        assert_eq!(Trace::read_from(&bytes[..]).unwrap(), trace);
        assert_eq!(Trace::read_from(Trickle(&bytes)).unwrap(), trace);
    }

    #[test]
    fn undefined_file_is_rejected_by_the_writer() {
        let mut writer = TraceWriter::new(Vec::new(), &JobMeta::default()).unwrap();
        let op = TraceOp {
            time_ns: 0,
            duration_ns: 0,
            offset: 0,
            length: 0,
            rank: 0,
            file: 0,
            op: Op::Stat,
        };
        assert!(matches!(writer.write_op(&op), Err(TraceWriteError::UndefinedFile { .. })));
    }

    #[test]
    fn file_id_interns_names() {
        let mut writer = TraceWriter::new(Vec::new(), &JobMeta::default()).unwrap();
        assert_eq!(writer.file_id("a").unwrap(), 0);
        assert_eq!(writer.file_id("b").unwrap(), 1);
        assert_eq!(writer.file_id("a").unwrap(), 0);
        let bytes = writer.finish().unwrap();
        let trace = Trace::read_from(&bytes[..]).unwrap();
        assert_eq!(trace.files, vec!["a".to_string(), "b".to_string()]);
    }

    fn arbitrary_op(files: u32) -> impl Strategy<Value = TraceOp> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            0..files,
            0..Op::ALL.len(),
        )
            .prop_map(|(time_ns, duration_ns, offset, length, rank, file, op)| TraceOp {
                time_ns,
                duration_ns,
                offset,
                length,
                rank,
                file,
                op: Op::ALL[op],
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn arbitrary_traces_round_trip(
            names in proptest::collection::vec(".{0,40}", 1..8),
            ops in proptest::collection::vec(arbitrary_op(8), 0..200),
            uid in any::<u32>(), job_id in any::<u64>(), synthesized in any::<bool>(),
        ) {
            let files = names.len() as u32;
            let ops: Vec<TraceOp> = ops.into_iter().map(|mut op| { op.file %= files; op }).collect();
            let trace = Trace {
                meta: JobMeta { uid, job_id, synthesized, source: "prop".into(), ..JobMeta::default() },
                files: names,
                ops,
            };
            let bytes = encode(&trace);
            prop_assert_eq!(Trace::read_from(&bytes[..]).unwrap(), trace);
        }
    }

    #[test]
    fn partial_flag_follows_the_source_marker_and_round_trips() {
        let mut trace = sample();
        assert!(!trace.meta.partial());
        assert_eq!(u16::from_le_bytes([encode(&trace)[10], encode(&trace)[11]]), 0);
        trace.meta.synthesized = true;
        trace.meta.source =
            "darshan-dxt+counters (…); PARTIAL: DXT_POSIX truncated: 9 of 10 reads".into();
        let bytes = encode(&trace);
        assert_eq!(u16::from_le_bytes([bytes[10], bytes[11]]), FLAG_SYNTHESIZED | FLAG_PARTIAL);
        let back = Trace::read_from(&bytes[..]).unwrap();
        assert!(back.meta.partial() && back.meta.synthesized);
        assert_eq!(back.meta.partial_warning(), Some("DXT_POSIX truncated: 9 of 10 reads"));
        assert_eq!(back, trace);
        assert_eq!(encode(&back), bytes);
    }

    #[test]
    fn partial_flag_and_marker_must_agree() {
        // Flag set, no marker in the source.
        let mut bytes = encode(&sample());
        bytes[10] |= FLAG_PARTIAL as u8;
        let error = Trace::read_from(&bytes[..]).unwrap_err();
        assert!(matches!(error, TraceReadError::PartialMismatch { flag: true }), "{error}");
        assert!(error.to_string().contains("lacks"), "{error}");
        // Marker in the source, flag cleared.
        let mut trace = sample();
        trace.meta.source = "x; PARTIAL: STDIO ran out of record memory".into();
        let mut bytes = encode(&trace);
        bytes[10] &= !(FLAG_PARTIAL as u8);
        let error = Trace::read_from(&bytes[..]).unwrap_err();
        assert!(matches!(error, TraceReadError::PartialMismatch { flag: false }), "{error}");
    }

    #[test]
    fn flag_bits_above_partial_are_still_rejected() {
        for bit in 2..16 {
            let mut bytes = encode(&sample());
            let flags = 1u16 << bit;
            bytes[10..12].copy_from_slice(&flags.to_le_bytes());
            let error = Trace::read_from(&bytes[..]).unwrap_err();
            assert!(
                matches!(error, TraceReadError::UnknownFlags { flags: found } if found == flags),
                "bit {bit}: {error}"
            );
        }
    }

    #[test]
    fn operation_codes_round_trip() {
        for op in Op::ALL {
            assert_eq!(Op::from_code(op.code()), Some(op));
        }
        assert_eq!(Op::from_code(0), None);
        assert_eq!(Op::from_code(13), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Garbage after a valid header is an error, never a panic or a hang.
        #[test]
        fn garbage_records_are_errors(tail in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut bytes = encode(&Trace { ops: Vec::new(), files: Vec::new(), ..sample() });
            bytes.truncate(bytes.len() - 7); // drop the end record: tag, two counts, CRC
            bytes.extend_from_slice(&tail);
            prop_assert!(Trace::read_from(&bytes[..]).is_err());
        }
    }

    #[test]
    fn zigzag_round_trips_extremes() {
        for value in [0i64, 1, -1, i64::MAX, i64::MIN, 12345, -98765] {
            assert_eq!(unzigzag(zigzag(value)), value);
        }
    }
}
