//! The namespace's persistence: an append-only, CRC'd operation journal in the server's store
//! directory, compacted into a snapshot (written as the same records) when it grows.
//!
//! Each operation appends one record holding its [`Mutation`]s, with one `write` (so a server
//! crash — SIGKILL — loses nothing that was acknowledged; a power loss loses what came after the
//! last [`Journal::sync`], which is `fdatasync`). Recovery reads records in order, verifies each
//! checksum and sequence number, and cuts the file at the first record that is incomplete or
//! fails its checksum (a torn tail). The byte format is in docs/design/namespace.md.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use spillway_types::EpochId;

use crate::state::{Inode, Mutation, State};
use spillway_namespace::{Attr, FileKind, NamespaceId, Timestamp};

/// Journal file magic, version 1.
pub const MAGIC: [u8; 8] = *b"SPWLNSJ1";
/// Format version in the header.
pub const VERSION: u32 = 1;
/// Header bytes at the start of the file.
pub const HEADER_BYTES: usize = 48;
/// Bytes before a record's body: body length, CRC, sequence number.
pub const RECORD_HEADER_BYTES: usize = 16;
/// Largest record body; longer lengths are treated as a torn tail.
pub const RECORD_BYTES_MAX: usize = 4 << 20;
/// Mutations per snapshot record (each at most ~4.2 KiB, so records stay below ~1.1 MiB).
const SNAPSHOT_MUTATIONS_PER_RECORD: usize = 256;

const TAG_PUT_INODE: u8 = 1;
const TAG_DROP_INODE: u8 = 2;
const TAG_PUT_ENTRY: u8 = 3;
const TAG_DROP_ENTRY: u8 = 4;
const TAG_NEXT_INO: u8 = 5;

/// Why a journal could not be created, opened or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    #[error("namespace journal {path}: {action}: {source}")]
    Io { path: PathBuf, action: &'static str, source: io::Error },
    /// The file system is full (ENOSPC or EDQUOT): nothing of the failed write stays behind.
    #[error("namespace journal {path}: {action}: out of space: {source}")]
    NoSpace { path: PathBuf, action: &'static str, source: io::Error },
    #[error("namespace journal {path}: bad header: {reason}")]
    BadHeader { path: PathBuf, reason: String },
    #[error("namespace journal {path}: record at offset {offset} cannot be replayed: {reason}")]
    Replay { path: PathBuf, offset: u64, reason: String },
}

/// What the header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalHeader {
    pub namespace: NamespaceId,
    pub data_epoch: EpochId,
}

/// What recovery found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    pub records: u64,
    /// Bytes after the last good record that were cut (a torn tail), 0 after a clean stop.
    pub torn_bytes_cut: u64,
}

/// The journal's writes and syncs: the seam where tests inject faults (like the store's
/// `Storage`). [`PosixJournalIo`] is the real one; [`FaultyJournalIo`] fails chosen calls.
pub trait JournalIo: Send + Sync + std::fmt::Debug {
    /// Writes all of `bytes` at `offset` (an append, or a new file's contents at 0).
    fn write_at(&self, file: &File, offset: u64, bytes: &[u8]) -> io::Result<()>;
    /// `fdatasync` (or `fsync` when `all`).
    fn sync(&self, file: &File, all: bool) -> io::Result<()>;
}

/// The real journal I/O: `pwrite` and `fdatasync`/`fsync`.
#[derive(Debug, Default)]
pub struct PosixJournalIo;

impl JournalIo for PosixJournalIo {
    fn write_at(&self, file: &File, offset: u64, bytes: &[u8]) -> io::Result<()> {
        file.write_all_at(bytes, offset)
    }
    fn sync(&self, file: &File, all: bool) -> io::Result<()> {
        if all {
            file.sync_all()
        } else {
            file.sync_data()
        }
    }
}

/// Which journal call a [`JournalFault`] fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalFaultOp {
    Write,
    Sync,
}

/// A queued fault: the `skip + 1`-th next `op` fails with `errno`; a failed write lands its
/// first `written_bytes` first (a short write).
#[derive(Clone, Copy, Debug)]
pub struct JournalFault {
    pub op: JournalFaultOp,
    pub skip: u64,
    pub errno: i32,
    pub written_bytes: u64,
}

/// Real journal I/O that fails the calls queued with [`FaultyJournalIo::inject`] (tests).
#[derive(Debug, Default)]
pub struct FaultyJournalIo {
    faults: Mutex<Vec<JournalFault>>,
}

impl FaultyJournalIo {
    pub fn new() -> Arc<FaultyJournalIo> {
        Arc::new(FaultyJournalIo::default())
    }

    pub fn inject(&self, fault: JournalFault) {
        self.faults.lock().push(fault);
    }

    /// Faults queued and not fired yet.
    pub fn pending(&self) -> usize {
        self.faults.lock().len()
    }

    fn take(&self, op: JournalFaultOp) -> Option<JournalFault> {
        let mut faults = self.faults.lock();
        let index = faults.iter().position(|f| f.op == op)?;
        if faults[index].skip > 0 {
            faults[index].skip -= 1;
            return None;
        }
        Some(faults.remove(index))
    }
}

impl JournalIo for FaultyJournalIo {
    fn write_at(&self, file: &File, offset: u64, bytes: &[u8]) -> io::Result<()> {
        match self.take(JournalFaultOp::Write) {
            Some(fault) => {
                let landed = (fault.written_bytes as usize).min(bytes.len());
                file.write_all_at(&bytes[..landed], offset)?;
                Err(io::Error::from_raw_os_error(fault.errno))
            }
            None => file.write_all_at(bytes, offset),
        }
    }
    fn sync(&self, file: &File, all: bool) -> io::Result<()> {
        if let Some(fault) = self.take(JournalFaultOp::Sync) {
            return Err(io::Error::from_raw_os_error(fault.errno));
        }
        PosixJournalIo.sync(file, all)
    }
}

fn is_no_space(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

impl JournalError {
    /// Whether this is a full file system (the namespace carries on; ENOSPC to the caller).
    pub fn is_no_space(&self) -> bool {
        matches!(self, JournalError::NoSpace { .. })
    }
}

/// An open journal file, positioned for appending.
#[derive(Debug)]
pub struct Journal {
    io: Arc<dyn JournalIo>,
    file: File,
    path: PathBuf,
    header: JournalHeader,
    next_sequence: u64,
    /// File length (where the next record goes).
    bytes: u64,
    /// Bytes of records appended since the last sync.
    unsynced_bytes: u64,
}

fn io_error<'a>(
    path: &'a Path,
    action: &'static str,
) -> impl FnOnce(io::Error) -> JournalError + 'a {
    move |source| {
        if is_no_space(&source) {
            JournalError::NoSpace { path: path.to_path_buf(), action, source }
        } else {
            JournalError::Io { path: path.to_path_buf(), action, source }
        }
    }
}

fn sync_directory_of(path: &Path) -> Result<(), JournalError> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_error(path, "fsync of the directory"))
}

/// Writes `bytes` as the whole of a new (or truncated) file at `path` and fsyncs it; returns it
/// open for reading and appending, before it is put in place.
/// On failure the file is removed again (a full file system gets its space back).
fn write_synced(io: &dyn JournalIo, path: &Path, bytes: &[u8]) -> Result<File, JournalError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(io_error(path, "create"))?;
    let written = io
        .write_at(&file, 0, bytes)
        .map_err(io_error(path, "write"))
        .and_then(|()| io.sync(&file, true).map_err(io_error(path, "fsync")));
    if let Err(error) = written {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(error);
    }
    Ok(file)
}

impl Journal {
    /// Creates a new journal holding `initial` as its first record (the root directory), fsyncs
    /// it and its directory. Fails if the file exists.
    pub fn create(
        io: Arc<dyn JournalIo>,
        path: &Path,
        header: JournalHeader,
        initial: &[Mutation],
    ) -> Result<Journal, JournalError> {
        let tmp = path.with_extension("creating");
        let mut bytes = encode_header(header).to_vec();
        bytes.extend_from_slice(&encode_record(1, initial));
        let file = write_synced(io.as_ref(), &tmp, &bytes)?;
        // Link, not rename: fails if another creator won the race.
        std::fs::hard_link(&tmp, path).map_err(io_error(path, "link into place"))?;
        std::fs::remove_file(&tmp).map_err(io_error(&tmp, "remove"))?;
        sync_directory_of(path)?;
        Ok(Journal {
            io,
            file,
            path: path.to_path_buf(),
            header,
            next_sequence: 2,
            bytes: bytes.len() as u64,
            unsynced_bytes: 0,
        })
    }

    /// Opens an existing journal, replays it into a state and cuts a torn tail.
    pub fn open(
        io: Arc<dyn JournalIo>,
        path: &Path,
    ) -> Result<(Journal, State, Recovery), JournalError> {
        let mut file =
            OpenOptions::new().read(true).write(true).open(path).map_err(io_error(path, "open"))?;
        let mut contents = Vec::new();
        file.read_to_end(&mut contents).map_err(io_error(path, "read"))?;
        let header = decode_header(&contents)
            .map_err(|reason| JournalError::BadHeader { path: path.to_path_buf(), reason })?;
        let mut state = State::empty();
        let mut offset = HEADER_BYTES;
        let mut sequence = 1u64;
        let mut recovery = Recovery::default();
        loop {
            let decoded = decode_record(&contents[offset..], sequence).map_err(|reason| {
                JournalError::Replay { path: path.to_path_buf(), offset: offset as u64, reason }
            })?;
            let Some((mutations, record_bytes)) = decoded else { break };
            for mutation in mutations {
                state.apply(mutation).map_err(|e| JournalError::Replay {
                    path: path.to_path_buf(),
                    offset: offset as u64,
                    reason: e.0,
                })?;
            }
            offset += record_bytes;
            sequence += 1;
            recovery.records += 1;
        }
        if recovery.records == 0 {
            return Err(JournalError::Replay {
                path: path.to_path_buf(),
                offset: offset as u64,
                reason: "no complete first record (root)".into(),
            });
        }
        state.check().map_err(|reason| JournalError::Replay {
            path: path.to_path_buf(),
            offset: offset as u64,
            reason,
        })?;
        recovery.torn_bytes_cut = (contents.len() - offset) as u64;
        if recovery.torn_bytes_cut > 0 {
            file.set_len(offset as u64).map_err(io_error(path, "cut the torn tail"))?;
            file.sync_all().map_err(io_error(path, "fsync after cutting the torn tail"))?;
        }
        let journal = Journal {
            io,
            file,
            path: path.to_path_buf(),
            header,
            next_sequence: sequence,
            bytes: offset as u64,
            unsynced_bytes: 0,
        };
        Ok((journal, state, recovery))
    }

    pub fn header(&self) -> JournalHeader {
        self.header
    }

    /// The header of the journal at `path`, read without replaying it.
    pub fn read_header(path: &Path) -> Result<JournalHeader, JournalError> {
        let mut bytes = Vec::with_capacity(HEADER_BYTES);
        std::fs::File::open(path)
            .and_then(|file| file.take(HEADER_BYTES as u64).read_to_end(&mut bytes))
            .map_err(io_error(path, "read the header"))?;
        decode_header(&bytes)
            .map_err(|reason| JournalError::BadHeader { path: path.to_path_buf(), reason })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Current file length in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Appends one record with one positioned write (not yet fsync'd).
    pub fn append(&mut self, mutations: &[Mutation]) -> Result<(), JournalError> {
        let record = encode_record(self.next_sequence, mutations);
        assert!(
            record.len() - RECORD_HEADER_BYTES <= RECORD_BYTES_MAX,
            "record of {} bytes",
            record.len()
        );
        if let Err(failure) = self.io.write_at(&self.file, self.bytes, &record) {
            // Whatever part of the record landed is cut off, so neither the next append nor
            // recovery ever sees it; the journal stays as it was before this operation.
            self.file.set_len(self.bytes).map_err(io_error(&self.path, "cut a failed append"))?;
            return Err(io_error(&self.path, "append")(failure));
        }
        self.bytes += record.len() as u64;
        self.unsynced_bytes += record.len() as u64;
        self.next_sequence += 1;
        Ok(())
    }

    /// Makes every appended record durable (fdatasync).
    pub fn sync(&mut self) -> Result<(), JournalError> {
        if self.unsynced_bytes > 0 {
            // Any failure, ENOSPC included, is reported as an I/O error: after a failed fsync
            // the kernel may have dropped the pages, and a retry would report them durable.
            self.io.sync(&self.file, false).map_err(|source| JournalError::Io {
                path: self.path.clone(),
                action: "fdatasync",
                source,
            })?;
            self.unsynced_bytes = 0;
        }
        Ok(())
    }

    /// Replaces the journal by a snapshot of `state` (the same record format), atomically:
    /// written to a temporary file, fsync'd, renamed over the journal, directory fsync'd.
    pub fn compact(&mut self, state: &State) -> Result<(), JournalError> {
        let tmp = self.path.with_extension("compacting");
        let mut bytes = encode_header(self.header).to_vec();
        let mut sequence = 1;
        for chunk in snapshot_mutations(state).chunks(SNAPSHOT_MUTATIONS_PER_RECORD) {
            bytes.extend_from_slice(&encode_record(sequence, chunk));
            sequence += 1;
        }
        let file = write_synced(self.io.as_ref(), &tmp, &bytes)?;
        std::fs::rename(&tmp, &self.path)
            .map_err(io_error(&self.path, "rename the snapshot into place"))?;
        sync_directory_of(&self.path)?;
        self.file = file;
        self.bytes = bytes.len() as u64;
        self.unsynced_bytes = 0;
        self.next_sequence = sequence;
        Ok(())
    }
}

/// The mutations that rebuild `state` from nothing: the inode counter, every inode (parents'
/// kinds do not matter for `PutInode`), then every entry in cookie order.
pub fn snapshot_mutations(state: &State) -> Vec<Mutation> {
    let mut out = vec![Mutation::NextIno(state.next_ino)];
    let mut inos: Vec<_> = state.inodes.keys().copied().collect();
    inos.sort_unstable();
    for ino in &inos {
        out.push(Mutation::PutInode(state.inodes[ino].clone()));
    }
    for ino in &inos {
        if let Some(directory) = state.directories.get(ino) {
            for (&cookie, name) in &directory.by_cookie {
                let (child, _) = directory.by_name[name];
                out.push(Mutation::PutEntry { dir: *ino, name: name.clone(), ino: child, cookie });
            }
        }
    }
    out
}

fn encode_header(header: JournalHeader) -> [u8; HEADER_BYTES] {
    let mut bytes = [0u8; HEADER_BYTES];
    bytes[0..8].copy_from_slice(&MAGIC);
    bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
    bytes[16..24].copy_from_slice(&header.namespace.to_le_bytes());
    bytes[24..32].copy_from_slice(&header.data_epoch.0.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[0..44]);
    bytes[44..48].copy_from_slice(&crc.to_le_bytes());
    bytes
}

fn decode_header(bytes: &[u8]) -> Result<JournalHeader, String> {
    if bytes.len() < HEADER_BYTES {
        return Err(format!(
            "file is {} bytes, shorter than the {HEADER_BYTES}-byte header",
            bytes.len()
        ));
    }
    if bytes[0..8] != MAGIC {
        return Err(format!("magic {:02x?} is not SPWLNSJ1", &bytes[0..8]));
    }
    let crc = u32::from_le_bytes(bytes[44..48].try_into().expect("4"));
    if crc != crc32c::crc32c(&bytes[0..44]) {
        return Err("header checksum mismatch".into());
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4"));
    if version != VERSION {
        return Err(format!("version {version}, this build reads {VERSION}"));
    }
    Ok(JournalHeader {
        namespace: u64::from_le_bytes(bytes[16..24].try_into().expect("8")),
        data_epoch: EpochId(u64::from_le_bytes(bytes[24..32].try_into().expect("8"))),
    })
}

/// A record: `body_bytes u32, crc32c u32 (of sequence and body), sequence u64, body`.
pub fn encode_record(sequence: u64, mutations: &[Mutation]) -> Vec<u8> {
    let mut body = Vec::with_capacity(64 * mutations.len());
    assert!(mutations.len() <= u16::MAX as usize);
    body.extend_from_slice(&(mutations.len() as u16).to_le_bytes());
    for mutation in mutations {
        encode_mutation(&mut body, mutation);
    }
    let mut record = Vec::with_capacity(RECORD_HEADER_BYTES + body.len());
    record.extend_from_slice(&(body.len() as u32).to_le_bytes());
    let mut digest = crc32c::crc32c(&sequence.to_le_bytes());
    digest = crc32c::crc32c_append(digest, &body);
    record.extend_from_slice(&digest.to_le_bytes());
    record.extend_from_slice(&sequence.to_le_bytes());
    record.extend_from_slice(&body);
    record
}

/// Decodes the record at the start of `bytes` if it is complete, has sequence number
/// `sequence` and a good checksum: (mutations, record length). `Ok(None)` marks the end (or a
/// torn tail); an error means a record with a good checksum that does not decode (a bug or a
/// foreign file), which recovery refuses rather than cuts.
pub fn decode_record(
    bytes: &[u8],
    sequence: u64,
) -> Result<Option<(Vec<Mutation>, usize)>, String> {
    if bytes.len() < RECORD_HEADER_BYTES {
        return Ok(None);
    }
    let body_bytes = u32::from_le_bytes(bytes[0..4].try_into().expect("4")) as usize;
    if body_bytes > RECORD_BYTES_MAX || bytes.len() < RECORD_HEADER_BYTES + body_bytes {
        return Ok(None);
    }
    let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4"));
    let found_sequence = u64::from_le_bytes(bytes[8..16].try_into().expect("8"));
    let body = &bytes[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + body_bytes];
    if found_sequence != sequence
        || crc != crc32c::crc32c_append(crc32c::crc32c(&bytes[8..16]), body)
    {
        return Ok(None);
    }
    let mutations = decode_body(body)
        .ok_or_else(|| format!("record {sequence} has a good checksum but does not decode"))?;
    Ok(Some((mutations, RECORD_HEADER_BYTES + body_bytes)))
}

fn put_timestamp(out: &mut Vec<u8>, t: Timestamp) {
    out.extend_from_slice(&t.seconds.to_le_bytes());
    out.extend_from_slice(&t.nanos.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    assert!(bytes.len() <= u16::MAX as usize);
    out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn encode_mutation(out: &mut Vec<u8>, mutation: &Mutation) {
    match mutation {
        Mutation::PutInode(inode) => {
            let a = &inode.attr;
            out.push(TAG_PUT_INODE);
            out.extend_from_slice(&a.ino.to_le_bytes());
            out.push(a.kind.code());
            for v in [a.mode, a.nlink, a.uid, a.gid] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&a.size.to_le_bytes());
            out.extend_from_slice(&a.rdev.to_le_bytes());
            for t in [a.atime, a.mtime, a.ctime] {
                put_timestamp(out, t);
            }
            out.extend_from_slice(&a.generation.to_le_bytes());
            out.extend_from_slice(&inode.parent.to_le_bytes());
            put_bytes(out, &inode.target);
        }
        Mutation::DropInode(ino) => {
            out.push(TAG_DROP_INODE);
            out.extend_from_slice(&ino.to_le_bytes());
        }
        Mutation::PutEntry { dir, name, ino, cookie } => {
            out.push(TAG_PUT_ENTRY);
            out.extend_from_slice(&dir.to_le_bytes());
            out.extend_from_slice(&ino.to_le_bytes());
            out.extend_from_slice(&cookie.to_le_bytes());
            put_bytes(out, name);
        }
        Mutation::DropEntry { dir, name } => {
            out.push(TAG_DROP_ENTRY);
            out.extend_from_slice(&dir.to_le_bytes());
            put_bytes(out, name);
        }
        Mutation::NextIno(next) => {
            out.push(TAG_NEXT_INO);
            out.extend_from_slice(&next.to_le_bytes());
        }
    }
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn timestamp(&mut self) -> Option<Timestamp> {
        let seconds = self.u64()? as i64;
        let nanos = self.u32()?;
        (nanos < 1_000_000_000).then_some(Timestamp { seconds, nanos })
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.u16()? as usize;
        Some(self.take(n)?.to_vec())
    }
}

fn decode_body(body: &[u8]) -> Option<Vec<Mutation>> {
    let mut c = Cursor(body);
    let count = c.u16()? as usize;
    let mut out = Vec::with_capacity(count.min(body.len() / 9));
    for _ in 0..count {
        let mutation = match c.u8()? {
            TAG_PUT_INODE => {
                let ino = c.u64()?;
                let kind = FileKind::from_code(c.u8()?)?;
                let (mode, nlink, uid, gid) = (c.u32()?, c.u32()?, c.u32()?, c.u32()?);
                let size = c.u64()?;
                let rdev = c.u32()?;
                let (atime, mtime, ctime) = (c.timestamp()?, c.timestamp()?, c.timestamp()?);
                let generation = c.u64()?;
                let parent = c.u64()?;
                let target = c.bytes()?;
                let attr = Attr {
                    ino,
                    kind,
                    mode,
                    nlink,
                    uid,
                    gid,
                    size,
                    rdev,
                    atime,
                    mtime,
                    ctime,
                    generation,
                };
                Mutation::PutInode(Inode { attr, target, parent })
            }
            TAG_DROP_INODE => Mutation::DropInode(c.u64()?),
            TAG_PUT_ENTRY => {
                let dir = c.u64()?;
                let ino = c.u64()?;
                let cookie = c.u64()?;
                Mutation::PutEntry { dir, ino, cookie, name: c.bytes()? }
            }
            TAG_DROP_ENTRY => {
                let dir = c.u64()?;
                Mutation::DropEntry { dir, name: c.bytes()? }
            }
            TAG_NEXT_INO => Mutation::NextIno(c.u64()?),
            _ => return None,
        };
        out.push(mutation);
    }
    c.0.is_empty().then_some(out)
}
