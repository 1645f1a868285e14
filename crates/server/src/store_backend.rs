//! [`Backend`] over the real log-structured store (`spillway_store::Store`).
//!
//! The store names files by caller-chosen ids; the protocol names them by path within an epoch.
//! This adapter keeps the mapping: a per-epoch name → id table, loaded from the store's file
//! names on first use (so it survives restarts: names are records in the SSD log) and extended
//! under one lock when a file is created, so two clients creating the same N-1 file get the
//! same id. Store errors map to protocol codes here, in one place.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use spillway_proto::{
    Durability, EpochGrant, EpochInfo, EpochState, ErrorCode, Extent, FileInfo, Participant,
    ServerId,
};
use spillway_store::{
    CommitError, EpochParticipant, EpochPhase, GrantError, GrantOutcome, LifecycleError,
    ParticipantsError, ReadError, RevokeError, Store, WriteError, WriteSlot,
};
use spillway_types::{EpochId, FileId, StreamKey};

use crate::backend::{
    assigned_stream_key, Backend, BackendError, GrantMode, PendingWrite, Usage, ASSIGNED_STREAM_TAG,
};

/// Name → id of the files of one epoch, plus the next free id.
#[derive(Default)]
struct EpochNames {
    ids: HashMap<String, FileId>,
    next: u64,
}

pub struct StoreBackend {
    store: Store,
    names: Mutex<HashMap<EpochId, EpochNames>>,
}

impl StoreBackend {
    pub fn new(store: Store) -> Self {
        StoreBackend { store, names: Mutex::new(HashMap::new()) }
    }

    /// The store (for `status` extras and for a clean close).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Gives the store back (to `close` it).
    pub fn into_store(self) -> Store {
        self.store
    }

    fn load_names(&self, epoch: EpochId) -> Result<EpochNames, BackendError> {
        let mut names = EpochNames { ids: HashMap::new(), next: 1 };
        match self.store.files(epoch) {
            Ok(files) => {
                for f in files {
                    names.next = names.next.max(f.file.0 + 1);
                    if let Some(name) = f.name {
                        names.ids.insert(name, f.file);
                    }
                }
            }
            Err(ReadError::UnknownEpoch(_)) => {}
            Err(error) => return Err(read_error(error)),
        }
        Ok(names)
    }
}

fn write_error(error: WriteError) -> BackendError {
    let code = match &error {
        WriteError::OutOfSpace { .. } | WriteError::DramStalled { .. } => ErrorCode::NoSpace,
        WriteError::EpochNotOpen { phase: EpochPhase::Drained | EpochPhase::Deleted, .. } => {
            ErrorCode::NoSuchEpoch
        }
        WriteError::EpochNotOpen { .. } => ErrorCode::EpochReadOnly,
        WriteError::GrantCapacityExceeded { .. } => ErrorCode::QuotaExceeded,
        WriteError::FileTooLarge { .. } => ErrorCode::FileTooLarge,
        WriteError::ReservedStream(_)
        | WriteError::OffsetOverflow { .. }
        | WriteError::BadFileName { .. } => ErrorCode::InvalidArgument,
        WriteError::Io { .. } | WriteError::Failed(_) => ErrorCode::Io,
        _ => ErrorCode::Internal,
    };
    BackendError::new(code, error.to_string())
}

fn read_error(error: ReadError) -> BackendError {
    let code = match &error {
        ReadError::UnknownEpoch(_) | ReadError::EpochGone { .. } => ErrorCode::NoSuchEpoch,
        ReadError::OffsetOverflow { .. } => ErrorCode::InvalidArgument,
        ReadError::Io { .. } => ErrorCode::Io,
        ReadError::ChecksumMismatch { .. } => ErrorCode::ChecksumMismatch,
        _ => ErrorCode::Internal,
    };
    BackendError::new(code, error.to_string())
}

fn commit_error(error: CommitError) -> BackendError {
    let code = match &error {
        CommitError::EpochGone { .. } => ErrorCode::NoSuchEpoch,
        CommitError::NoSpace(_) => ErrorCode::NoSpace,
        CommitError::Failed(_) => ErrorCode::Io,
        _ => ErrorCode::Internal,
    };
    BackendError::new(code, error.to_string())
}

fn lifecycle_error(error: LifecycleError) -> BackendError {
    let code = match &error {
        LifecycleError::UnknownEpoch(_) => ErrorCode::NoSuchEpoch,
        LifecycleError::NoSpace { .. } => ErrorCode::NoSpace,
        LifecycleError::WrongPhase { phase: EpochPhase::Committing, .. } => ErrorCode::Busy,
        LifecycleError::WrongPhase { phase: EpochPhase::Drained | EpochPhase::Deleted, .. } => {
            ErrorCode::NoSuchEpoch
        }
        LifecycleError::WrongPhase { .. } => ErrorCode::InvalidArgument,
        LifecycleError::Io { .. } | LifecycleError::Failed(_) => ErrorCode::Io,
        _ => ErrorCode::Internal,
    };
    BackendError::new(code, error.to_string())
}

fn grant_error(error: GrantError) -> BackendError {
    let code = match &error {
        GrantError::TooManyAllowedIds { .. } | GrantError::ReservedStream { .. } => {
            ErrorCode::InvalidArgument
        }
        GrantError::EpochDeleted { .. } => ErrorCode::NoSuchEpoch,
        GrantError::NoSpace { .. } => ErrorCode::NoSpace,
        GrantError::Failed(_) | GrantError::Io { .. } => ErrorCode::Io,
        _ => ErrorCode::Internal,
    };
    BackendError::new(code, error.to_string())
}

fn participants_error(error: ParticipantsError) -> BackendError {
    let code = match &error {
        ParticipantsError::ZeroId { .. }
        | ParticipantsError::AddressTooLong { .. }
        | ParticipantsError::TooMany { .. } => ErrorCode::InvalidArgument,
        ParticipantsError::Failed(_) | ParticipantsError::Io { .. } => ErrorCode::Io,
        _ => ErrorCode::Internal,
    };
    BackendError::new(code, error.to_string())
}

fn revoke_error(error: RevokeError) -> BackendError {
    let code = match &error {
        RevokeError::NoSpace { .. } => ErrorCode::NoSpace,
        RevokeError::Failed(_) | RevokeError::Io { .. } => ErrorCode::Io,
        _ => ErrorCode::Internal,
    };
    BackendError::new(code, error.to_string())
}

/// The protocol's grant (stream as the manager's id) as the store keeps it (a store stream key).
fn store_grant(grant: EpochGrant) -> spillway_store::EpochGrant {
    spillway_store::EpochGrant {
        owner_uid: grant.owner_uid,
        owner_gid: grant.owner_gid,
        allowed_uids: grant.allowed_uids,
        allowed_gids: grant.allowed_gids,
        capacity_bytes: grant.capacity_bytes,
        reservation_capacity_bytes: grant.reservation_capacity_bytes,
        stream: grant.stream.map(assigned_stream_key),
    }
}

/// The inverse of [`store_grant`].
fn protocol_grant(grant: spillway_store::EpochGrant) -> EpochGrant {
    EpochGrant {
        owner_uid: grant.owner_uid,
        owner_gid: grant.owner_gid,
        allowed_uids: grant.allowed_uids,
        allowed_gids: grant.allowed_gids,
        capacity_bytes: grant.capacity_bytes,
        reservation_capacity_bytes: grant.reservation_capacity_bytes,
        stream: grant.stream.map(|key| key.0 & !ASSIGNED_STREAM_TAG),
    }
}

fn state_of(phase: EpochPhase) -> Option<EpochState> {
    match phase {
        EpochPhase::Open | EpochPhase::Committing => Some(EpochState::Open),
        EpochPhase::CommittedInMemory => Some(EpochState::CommittedMemory),
        EpochPhase::Committed => Some(EpochState::Committed),
        EpochPhase::Drained => Some(EpochState::Drained),
        EpochPhase::Deleted => None,
    }
}

impl PendingWrite for WriteSlot {
    fn payload_bytes(&self) -> usize {
        self.len()
    }

    fn buffers(&mut self) -> Vec<&mut [u8]> {
        WriteSlot::buffers(self)
    }

    fn publish(self: Box<Self>, buffer_crcs: &[u32]) -> Result<(), BackendError> {
        WriteSlot::publish(*self, buffer_crcs).map_err(write_error)
    }
}

impl Backend for StoreBackend {
    fn open_file(
        &self,
        _stream: StreamKey,
        epoch: EpochId,
        name: &str,
        create: bool,
    ) -> Result<(FileId, bool), BackendError> {
        let mut all = self.names.lock();
        let names = match all.entry(epoch) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert(self.load_names(epoch)?)
            }
        };
        if let Some(&id) = names.ids.get(name) {
            return Ok((id, false));
        }
        if !create {
            return Err(BackendError::new(
                ErrorCode::NoSuchFile,
                format!("no file {name:?} in epoch {epoch}"),
            ));
        }
        let id = FileId(names.next);
        self.store.name_file(epoch, id, name).map_err(write_error)?;
        names.next += 1;
        names.ids.insert(name.to_string(), id);
        Ok((id, true))
    }

    fn write(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        data: &[u8],
        piece_crcs: &[u32],
    ) -> Result<(), BackendError> {
        if !self.store.has_file(epoch, file) {
            return Err(BackendError::new(
                ErrorCode::NoSuchFile,
                format!("epoch {epoch} has no file {file}: open it first"),
            ));
        }
        self.store
            .write_with_crcs(stream, epoch, file, offset, data, piece_crcs)
            .map_err(write_error)
    }

    fn write_zeros(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        length: u64,
    ) -> Result<(), BackendError> {
        if !self.store.has_file(epoch, file) {
            return Err(BackendError::new(
                ErrorCode::NoSuchFile,
                format!("epoch {epoch} has no file {file}: open it first"),
            ));
        }
        self.store.write_zeros(stream, epoch, file, offset, length).map_err(write_error)
    }

    fn record_payload_bytes(&self) -> usize {
        self.store.record_payload_bytes_max()
    }

    fn reserve_write(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        file: FileId,
        extents: &[(u64, usize)],
    ) -> Option<Box<dyn PendingWrite>> {
        if !self.store.has_file(epoch, file) {
            return None;
        }
        let slot = self.store.try_reserve_extents(stream, epoch, file, extents).ok()??;
        Some(Box::new(slot))
    }

    fn read(
        &self,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        out: &mut [u8],
    ) -> Result<u32, BackendError> {
        self.store.read_with_crc(epoch, file, offset, out).map_err(read_error)
    }

    fn commit(&self, epoch: EpochId, durability: Durability) -> Result<(), BackendError> {
        let durability = match durability {
            Durability::Memory | Durability::Replicated => spillway_store::Durability::Memory,
            Durability::Ssd | Durability::ServerDefault => spillway_store::Durability::Ssd,
        };
        self.store.commit(epoch, durability).map_err(commit_error)
    }

    fn wait_for_space(&self, bytes: u64, timeout: Duration) -> bool {
        self.store.wait_for_space(bytes, timeout)
    }

    fn sync(&self) -> Result<(), BackendError> {
        self.store.sync().map_err(sync_error)
    }

    fn sync_epoch(&self, epoch: EpochId) -> Result<(), BackendError> {
        self.store.sync_epoch(epoch).map_err(sync_error)
    }

    fn epochs(&self) -> Result<Vec<EpochInfo>, BackendError> {
        Ok(self
            .store
            .epochs()
            .into_iter()
            .filter_map(|e| {
                state_of(e.phase).map(|state| EpochInfo {
                    epoch: e.epoch,
                    state,
                    files: e.files as u64,
                    bytes: e.payload_bytes,
                })
            })
            .collect())
    }

    fn files(&self, epoch: EpochId) -> Result<Vec<FileInfo>, BackendError> {
        let files = self.store.files(epoch).map_err(read_error)?;
        // One walk over the epoch's extents for every file's stored bytes (not one per file).
        let mut stored: HashMap<FileId, u64> = HashMap::new();
        for e in self.store.extents(epoch..=epoch, None) {
            *stored.entry(e.file).or_default() += e.length;
        }
        Ok(files
            .into_iter()
            .map(|f| FileInfo {
                file: f.file,
                name: f.name.unwrap_or_default(),
                size_bytes: f.size_bytes,
                stored_bytes: stored.get(&f.file).copied().unwrap_or(0),
            })
            .collect())
    }

    fn stat(&self, epoch: EpochId, file: FileId) -> Result<FileInfo, BackendError> {
        let info = self.store.stat(epoch, file).ok_or_else(|| {
            BackendError::new(ErrorCode::NoSuchFile, format!("epoch {epoch} has no file {file}"))
        })?;
        let stored_bytes = self.extents(epoch, file)?.iter().map(|e| e.length).sum();
        Ok(FileInfo {
            file,
            name: info.name.unwrap_or_default(),
            size_bytes: info.size_bytes,
            stored_bytes,
        })
    }

    fn extents(&self, epoch: EpochId, file: FileId) -> Result<Vec<Extent>, BackendError> {
        let mut out: Vec<Extent> = Vec::new();
        for e in self.store.extents(epoch..=epoch, Some(file)) {
            match out.last_mut() {
                Some(last) if last.offset + last.length == e.offset => last.length += e.length,
                _ => out.push(Extent { offset: e.offset, length: e.length }),
            }
        }
        Ok(out)
    }

    fn delete_epoch(&self, epoch: EpochId) -> Result<(), BackendError> {
        self.store.delete_epoch(epoch).map_err(lifecycle_error)?;
        self.names.lock().remove(&epoch);
        Ok(())
    }

    fn has_epoch(&self, epoch: EpochId) -> bool {
        self.store.epoch(epoch).is_some_and(|info| info.phase != EpochPhase::Deleted)
    }

    fn grant(&self, epoch: EpochId) -> Option<EpochGrant> {
        self.store.grant(epoch).map(protocol_grant)
    }

    fn grant_epoch(
        &self,
        epoch: EpochId,
        grant: EpochGrant,
        mode: GrantMode,
    ) -> Result<EpochGrant, BackendError> {
        if grant.stream.is_some_and(|stream| stream & ASSIGNED_STREAM_TAG != 0) {
            return Err(BackendError::new(
                ErrorCode::InvalidArgument,
                format!("grant of epoch {epoch}: stream ids must be below 2^63"),
            ));
        }
        let mode = match mode {
            GrantMode::Replace => spillway_store::GrantMode::Replace,
            GrantMode::IfAbsent => spillway_store::GrantMode::IfAbsent,
        };
        match self.store.grant_epoch(epoch, store_grant(grant.clone()), mode) {
            Ok(GrantOutcome::Kept(existing)) => Ok(protocol_grant(existing)),
            Ok(GrantOutcome::Recorded | GrantOutcome::Unchanged) => Ok(grant),
            Err(error) => Err(grant_error(error)),
        }
    }

    fn revoke_grant(&self, epoch: EpochId) -> Result<bool, BackendError> {
        self.store.revoke_grant(epoch).map_err(revoke_error)
    }

    fn record_participants(
        &self,
        epoch: EpochId,
        participants: &[Participant],
    ) -> Result<(), BackendError> {
        let named: Vec<EpochParticipant> = participants
            .iter()
            .map(|p| EpochParticipant { id: p.id.0, address: p.address.clone() })
            .collect();
        self.store.record_participants(epoch, &named).map(|_| ()).map_err(participants_error)
    }

    fn participants(&self, epoch: EpochId) -> Vec<Participant> {
        let recorded = self.store.participants(epoch);
        recorded
            .into_iter()
            .map(|p| Participant { id: ServerId(p.id), address: p.address })
            .collect()
    }

    fn mark_drained(&self, epoch: EpochId) -> Result<(), BackendError> {
        self.store.mark_drained(epoch).map_err(lifecycle_error)
    }

    fn collect_garbage(&self) -> Result<u64, BackendError> {
        self.store
            .gc()
            .map(|report| report.bytes_freed)
            .map_err(|e| BackendError::new(ErrorCode::Io, format!("garbage collection: {e}")))
    }

    fn store_stats(&self) -> Option<spillway_store::StoreStats> {
        Some(self.store.stats())
    }

    fn usage(&self) -> Usage {
        let stats = self.store.stats();
        Usage {
            dram_bytes_used: stats.dram_used_bytes,
            dram_bytes_max: stats.dram_bytes_max,
            ssd_bytes_used: stats.ssd_used_bytes,
            ssd_bytes_max: stats.ssd_bytes_max,
        }
    }
}

/// A store sync's failure on the wire: out of space, or an I/O failure of the store.
fn sync_error(error: spillway_store::SyncError) -> BackendError {
    let code = match &error {
        spillway_store::SyncError::NoSpace(_) => ErrorCode::NoSpace,
        _ => ErrorCode::Io,
    };
    BackendError::new(code, error.to_string())
}
