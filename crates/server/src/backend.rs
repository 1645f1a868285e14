//! The seam between protocol handlers and the store.
//!
//! The server needs a handful of operations from the store that owns the data; they are a trait
//! so the handlers can be read (and reasoned about) without the store's internals, and so a
//! future store variant slots in. The production implementation is [`crate::StoreBackend`] over
//! `spillway_store::Store`.

use std::time::Duration;

use spillway_proto::{Durability, EpochGrant, EpochInfo, ErrorCode, Extent, FileInfo, Participant};
use spillway_types::{EpochId, FileId, StreamKey};

/// A failed backend operation: the protocol code plus a message naming what failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct BackendError {
    pub code: ErrorCode,
    pub message: String,
}

impl BackendError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        BackendError { code, message: message.into() }
    }
}

/// The store stream key of a stream id the manager assigned: the top bit set, so an assigned
/// stream never shares segments with a writer's uid stream.
pub fn assigned_stream_key(stream: u64) -> StreamKey {
    StreamKey(ASSIGNED_STREAM_TAG | stream)
}

/// The tag bit of [`assigned_stream_key`]; stream ids must stay below it.
pub const ASSIGNED_STREAM_TAG: u64 = 1 << 63;

/// What [`Backend::grant_epoch`] does when the epoch already has a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantMode {
    /// The new grant replaces it (the manager's `GrantEpoch`).
    Replace,
    /// The existing grant stays (the first writer's claim on an unmanaged server).
    IfAbsent,
}

/// Capacity figures for `status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub dram_bytes_used: u64,
    pub dram_bytes_max: u64,
    pub ssd_bytes_used: u64,
    pub ssd_bytes_max: u64,
}

/// A write whose payload the connection reads straight into the store's memory (no buffer in
/// between): fill [`PendingWrite::buffers`] in order, then publish. Dropping it unpublished
/// abandons it and writes nothing.
pub trait PendingWrite: Send {
    /// The write's payload size.
    fn payload_bytes(&self) -> usize;
    /// The ranges to fill, in order; together they hold the write's payload.
    fn buffers(&mut self) -> Vec<&mut [u8]>;
    /// Makes the write visible, as [`Backend::write`] returning would. `buffer_crcs`: the
    /// CRC32C of each buffer, in order, which the caller checked against the client's
    /// write-time checksum; the store keeps them as its record checksums. Fails, writing
    /// nothing, if the epoch stopped accepting writes since the reservation.
    fn publish(self: Box<Self>, buffer_crcs: &[u32]) -> Result<(), BackendError>;
}

/// What the server needs from the store. All methods take `&self` and may be called from many
/// connection threads at once.
pub trait Backend: Send + Sync + 'static {
    /// Opens the named file of an epoch, creating it (and the epoch) if `create`.
    /// Returns the file id and whether it was created.
    fn open_file(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        name: &str,
        create: bool,
    ) -> Result<(FileId, bool), BackendError>;
    /// Appends `data` at `offset` of the file. Acknowledged when in the store's DRAM log.
    /// `piece_crcs`: the CRC32C of each consecutive piece of [`Backend::record_payload_bytes`]
    /// bytes of `data` (the last may be shorter), which the caller checked against the client's
    /// write-time checksum; the store keeps them as its record checksums.
    /// A full store answers `ErrorCode::NoSpace` (the server retries within its bounded wait).
    fn write(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        data: &[u8],
        piece_crcs: &[u32],
    ) -> Result<(), BackendError>;
    /// Makes `[offset, offset + length)` of the file read as zeros. A store that can keeps
    /// the run as one small record; this default writes the zeros as bytes, a record-sized
    /// piece at a time. Errors as [`Backend::write`]'s.
    fn write_zeros(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        length: u64,
    ) -> Result<(), BackendError> {
        let piece = self.record_payload_bytes().max(1) as u64;
        let zeros = vec![0u8; piece.min(length) as usize];
        let mut at = 0;
        while at < length {
            let bytes = &zeros[..piece.min(length - at) as usize];
            self.write(stream, epoch, file, offset + at, bytes, &[crc32c::crc32c(bytes)])?;
            at += bytes.len() as u64;
        }
        Ok(())
    }
    /// The largest payload of one store record: [`Backend::write`] takes one CRC per piece of
    /// this size.
    fn record_payload_bytes(&self) -> usize;
    /// Reserves store memory for a write of the extents `(offset, length)` of one file, in
    /// order (the pending write's buffers hold them one after the other, each extent split
    /// into record-sized pieces), if it can without waiting and the write would be admitted
    /// now. `None`: the caller buffers the payload and calls [`Backend::write`] per extent,
    /// which waits for space and reports errors.
    fn reserve_write(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        file: FileId,
        extents: &[(u64, usize)],
    ) -> Option<Box<dyn PendingWrite>> {
        let _ = (stream, epoch, file, extents);
        None
    }
    /// Fills `out` from `offset`; holes read as zeros. Returns the CRC32C of `out`, taken as
    /// the data is checked against its write-time checksums (a store that holds none computes
    /// it from `out`).
    fn read(
        &self,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        out: &mut [u8],
    ) -> Result<u32, BackendError>;
    /// Seals the epoch (later writes fail with `EpochReadOnly`) and returns when it is durable
    /// at `durability`: `Ssd` — fsync'd in the SSD log (group commit); `Memory` — held in DRAM,
    /// the SSD log catches up in the background. Never called with `ServerDefault`.
    fn commit(&self, epoch: EpochId, durability: Durability) -> Result<(), BackendError>;
    /// Waits up to `timeout` for `bytes` of space to become free; true if they did.
    fn wait_for_space(&self, bytes: u64, timeout: Duration) -> bool {
        let _ = bytes;
        std::thread::sleep(timeout);
        false
    }
    /// Makes everything the store holds durable (graceful shutdown).
    fn sync(&self) -> Result<(), BackendError>;
    /// Makes every write to `epoch` acknowledged before the call durable, without sealing it
    /// (a client's `Sync`: the mount's fsync). Other epochs' data may stay in DRAM.
    fn sync_epoch(&self, epoch: EpochId) -> Result<(), BackendError>;
    /// Every epoch this store holds.
    fn epochs(&self) -> Result<Vec<EpochInfo>, BackendError>;
    /// Files of an epoch.
    fn files(&self, epoch: EpochId) -> Result<Vec<FileInfo>, BackendError>;
    /// One file.
    fn stat(&self, epoch: EpochId, file: FileId) -> Result<FileInfo, BackendError>;
    /// The byte ranges of the file held here, in offset order, adjacent ranges merged.
    fn extents(&self, epoch: EpochId, file: FileId) -> Result<Vec<Extent>, BackendError>;
    /// Deletes the epoch; its space becomes free.
    fn delete_epoch(&self, epoch: EpochId) -> Result<(), BackendError>;
    /// Current capacity use.
    fn usage(&self) -> Usage;
    /// The store's counters (GC, write amplification), for the metrics; `None` for backends
    /// without a log-structured store.
    fn store_stats(&self) -> Option<spillway_store::StoreStats> {
        None
    }
    /// Marks a committed epoch drained (every file is on the PFS): its bytes become dead and
    /// GC may free them. Backends without a PFS drain refuse.
    fn mark_drained(&self, epoch: EpochId) -> Result<(), BackendError> {
        Err(BackendError::new(
            ErrorCode::InvalidArgument,
            format!("this backend cannot mark epoch {epoch} drained"),
        ))
    }
    /// Whether the store holds the epoch (open, committed or drained; not deleted).
    fn has_epoch(&self, epoch: EpochId) -> bool;
    /// The grant in force for the epoch, if any: who may use it, its capacity here, its stream.
    fn grant(&self, epoch: EpochId) -> Option<EpochGrant>;
    /// Records a grant durably (creating the epoch, empty, if new) and returns the grant in
    /// force afterwards: `grant`, or with `IfAbsent` an existing one. Writes past the grant's
    /// `capacity_bytes` then fail with `QuotaExceeded`, writing nothing.
    fn grant_epoch(
        &self,
        epoch: EpochId,
        grant: EpochGrant,
        mode: GrantMode,
    ) -> Result<EpochGrant, BackendError>;
    /// Revokes the epoch's grant durably; returns whether it had one.
    fn revoke_grant(&self, epoch: EpochId) -> Result<bool, BackendError>;
    /// Adds the servers a committer names to the epoch's participants (the union is kept),
    /// durably before returning. An epoch this backend does not hold open or committed is left
    /// alone.
    fn record_participants(
        &self,
        epoch: EpochId,
        participants: &[Participant],
    ) -> Result<(), BackendError>;
    /// The epoch's recorded participants, sorted by id; empty if none were named.
    fn participants(&self, epoch: EpochId) -> Vec<Participant>;
    /// Frees the space of dead (drained or deleted) data now; returns the bytes freed.
    fn collect_garbage(&self) -> Result<u64, BackendError> {
        Ok(0)
    }
}
