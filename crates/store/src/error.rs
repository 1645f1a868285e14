//! Errors, one enum per operation, each naming what it is about (segment and offset, stream and
//! limit, epoch and state). All convert into [`Error`] for callers that do not care which
//! operation failed.

use spillway_types::{format_bytes, EpochId, FileId, SegmentId, StreamKey};

/// Which capacity a write ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpaceLimit {
    /// `ssd_bytes_max` (all data must eventually fit on the SSD log).
    Ssd,
    /// The stream's quota (`stream_quota_bytes` or a per-stream override).
    StreamQuota,
    /// The SSD directory's file system is full (ENOSPC) before `ssd_bytes_max` was reached.
    FileSystem,
}

impl std::fmt::Display for SpaceLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SpaceLimit::Ssd => "store.ssd_bytes_max",
            SpaceLimit::StreamQuota => "stream quota",
            SpaceLimit::FileSystem => "the SSD directory's file system",
        })
    }
}

/// Lifecycle phase of an epoch as the public API reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EpochPhase {
    /// Accepting writes.
    Open,
    /// A commit is sealing it (no more writes) and making it durable.
    Committing,
    /// Committed at the `memory` durability level: sealed, durable later.
    CommittedInMemory,
    /// Committed and durable in the SSD log.
    Committed,
    /// Drained to the PFS; its bytes are dead.
    Drained,
    /// Deleted without draining; its bytes are dead.
    Deleted,
}

impl std::fmt::Display for EpochPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("store knobs are invalid: {0}")]
    Knobs(#[from] spillway_config::ConfigError),
    #[error("I/O error on {what} in {directory}: {source}")]
    Io { what: String, directory: String, source: std::io::Error },
    #[error("segment {segment} is corrupt at offset {offset}: {detail}; refusing to open (move the segment aside to give up its data)")]
    Corrupt { segment: SegmentId, offset: u64, detail: String },
    #[error("committed epoch {epoch} is incomplete after recovery: {detail}")]
    CommittedEpochIncomplete { epoch: EpochId, detail: String },
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    #[error("out of space: stream {stream} needs {} but {limit} leaves {} free (limit {})", format_bytes(*needed_bytes), format_bytes(*free_bytes), format_bytes(*limit_bytes))]
    OutOfSpace {
        stream: StreamKey,
        limit: SpaceLimit,
        needed_bytes: u64,
        free_bytes: u64,
        limit_bytes: u64,
    },
    #[error("epoch {epoch} is {phase} and accepts no writes")]
    EpochNotOpen { epoch: EpochId, phase: EpochPhase },
    #[error("write of {} would take epoch {epoch} past its granted capacity of {} on this server ({} written already)", format_bytes(*needed_bytes), format_bytes(*capacity_bytes), format_bytes(*used_bytes))]
    GrantCapacityExceeded {
        epoch: EpochId,
        capacity_bytes: u64,
        used_bytes: u64,
        needed_bytes: u64,
    },
    #[error("stream {0} is reserved for the store's metadata")]
    ReservedStream(StreamKey),
    #[error("write to epoch {epoch} file {file} at offset {offset} with {length} bytes overflows the file offset range")]
    OffsetOverflow { epoch: EpochId, file: FileId, offset: u64, length: u64 },
    #[error("write to epoch {epoch} file {file} at offset {offset} with {length} bytes would end past the largest file size, store.file_bytes_max = {file_bytes_max} bytes; nothing was written")]
    FileTooLarge { epoch: EpochId, file: FileId, offset: u64, length: u64, file_bytes_max: u64 },
    #[error("file name for epoch {epoch} file {file} is empty or longer than {max_bytes} bytes")]
    BadFileName { epoch: EpochId, file: FileId, max_bytes: usize },
    #[error("DRAM log stayed full for {waited_ms} ms (flusher cannot keep up or SSD stalled)")]
    DramStalled { waited_ms: u64 },
    #[error("store has failed earlier and refuses work: {0}")]
    Failed(String),
    #[error("I/O error writing metadata to segment {segment}: {source}")]
    Io { segment: SegmentId, source: std::io::Error },
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    #[error("epoch {epoch} is {phase} and cannot be committed")]
    EpochGone { epoch: EpochId, phase: EpochPhase },
    #[error("out of space committing (the SSD directory's file system is full; the epoch stays sealed, commit it again once space is freed, or delete it): {0}")]
    NoSpace(String),
    #[error("store has failed earlier and refuses work: {0}")]
    Failed(String),
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    #[error("epoch {0} is not in the store")]
    UnknownEpoch(EpochId),
    #[error("epoch {epoch} is {phase}; its data is gone")]
    EpochGone { epoch: EpochId, phase: EpochPhase },
    #[error(
        "read of epoch {epoch} file {file} at offset {offset} overflows the file offset range"
    )]
    OffsetOverflow { epoch: EpochId, file: FileId, offset: u64 },
    #[error("I/O error reading segment {segment} at offset {offset}: {source}")]
    Io { segment: SegmentId, offset: u64, source: std::io::Error },
    /// A record's bytes no longer match the CRC taken when they were written; nothing of the
    /// read is returned.
    #[error("epoch {epoch} file {file} bytes {offset}..{end} ({location}) do not match their write-time checksum: {detail}", end = offset + length)]
    ChecksumMismatch {
        epoch: EpochId,
        file: FileId,
        offset: u64,
        length: u64,
        location: String,
        detail: String,
    },
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LifecycleError {
    #[error("epoch {0} is not in the store")]
    UnknownEpoch(EpochId),
    #[error("epoch {epoch} is {phase}; cannot mark it {wanted}")]
    WrongPhase { epoch: EpochId, phase: EpochPhase, wanted: EpochPhase },
    #[error("out of space writing the tombstone of epoch {epoch} (the SSD directory's file system is full even after releasing the reserve): {source}")]
    NoSpace { epoch: EpochId, source: std::io::Error },
    #[error("store has failed earlier and refuses work: {0}")]
    Failed(String),
    #[error("I/O error writing metadata to segment {segment}: {source}")]
    Io { segment: SegmentId, source: std::io::Error },
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SyncError {
    #[error("out of space (the SSD directory's file system is full): {0}")]
    NoSpace(String),
    #[error("store has failed earlier and refuses work: {0}")]
    Failed(String),
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    #[error("grant of epoch {epoch} allows {count} {what}, more than the {max} a grant may hold")]
    TooManyAllowedIds { epoch: EpochId, what: &'static str, count: usize, max: usize },
    #[error(
        "grant of epoch {epoch} names stream {stream}, which is reserved for the store's metadata"
    )]
    ReservedStream { epoch: EpochId, stream: StreamKey },
    #[error("epoch {epoch} is deleted and cannot be granted")]
    EpochDeleted { epoch: EpochId },
    #[error("out of space writing the grant of epoch {epoch} (the SSD directory's file system is full): {source}")]
    NoSpace { epoch: EpochId, source: std::io::Error },
    #[error("store has failed earlier and refuses work: {0}")]
    Failed(String),
    #[error("I/O error writing the grant of epoch {epoch} to segment {segment}: {source}")]
    Io { epoch: EpochId, segment: SegmentId, source: std::io::Error },
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RevokeError {
    #[error("out of space writing the revocation of epoch {epoch} (the SSD directory's file system is full): {source}")]
    NoSpace { epoch: EpochId, source: std::io::Error },
    #[error("store has failed earlier and refuses work: {0}")]
    Failed(String),
    #[error("I/O error writing the revocation of epoch {epoch} to segment {segment}: {source}")]
    Io { epoch: EpochId, segment: SegmentId, source: std::io::Error },
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParticipantsError {
    #[error("a participant of epoch {epoch} has the all-zero server id, which no server has")]
    ZeroId { epoch: EpochId },
    #[error("a participant address of epoch {epoch} is {bytes} bytes, more than a record holds")]
    AddressTooLong { epoch: EpochId, bytes: usize },
    #[error("epoch {epoch} would have {count} participants, more than the {max} it may record")]
    TooMany { epoch: EpochId, count: usize, max: usize },
    #[error("store has failed earlier and refuses work: {0}")]
    Failed(String),
    #[error("I/O error writing the participants of epoch {epoch} to segment {segment}: {source}")]
    Io { epoch: EpochId, segment: SegmentId, source: std::io::Error },
}

/// Any store error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error(transparent)]
    Sync(#[from] SyncError),
    #[error(transparent)]
    Grant(#[from] GrantError),
    #[error(transparent)]
    Revoke(#[from] RevokeError),
    #[error(transparent)]
    Participants(#[from] ParticipantsError),
}
