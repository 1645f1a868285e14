//! Grants: who may use an epoch, how many bytes it may hold on this store, which stream its
//! data goes to — kept as records in the SSD log, so they survive restarts.
//!
//! The store does not decide who a caller is; it keeps the grant for the server, which checks
//! every request against it (docs/semantics.md, "Ownership and grants"). The store itself
//! enforces only the capacity: a write that would take the epoch past `capacity_bytes` is
//! refused whole at admission ([`crate::WriteError::GrantCapacityExceeded`]). A `Grant` record
//! replaces the previous grant of its epoch; a `GrantRevoked` record or the epoch's deletion
//! removes it. Both records are epoch metadata (live while the epoch is), and `grant_epoch` and
//! `revoke_grant` return only once their record is fsync'd.

use spillway_types::{EpochId, FileId, StreamKey, GRANT_ALLOWED_IDS_MAX};

use crate::error::{EpochPhase, GrantError, RevokeError};
use crate::format::{encode_grant, RecordHeader, RecordKind, META_STREAM};
use crate::store::{EpochEntry, Store};

/// One epoch's grant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EpochGrant {
    /// The owner: always allowed.
    pub owner_uid: u32,
    pub owner_gid: u32,
    /// Other uids allowed to use the epoch, sorted, without duplicates (`grant_epoch` sorts).
    pub allowed_uids: Vec<u32>,
    /// Groups whose members may use the epoch, sorted, without duplicates.
    pub allowed_gids: Vec<u32>,
    /// Payload bytes the epoch may take on this store (overwrites count again); 0 = no limit.
    pub capacity_bytes: u64,
    /// The reservation's capacity over all its servers, for `statfs`; 0 = not known.
    pub reservation_capacity_bytes: u64,
    /// The stream the epoch's writes go to; `None`: each writer's own.
    pub stream: Option<StreamKey>,
}

/// What [`Store::grant_epoch`] does when the epoch already has a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantMode {
    /// The new grant replaces it (the manager's grants).
    Replace,
    /// The existing grant stays (a first writer's claim on an unmanaged server).
    IfAbsent,
}

/// What [`Store::grant_epoch`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrantOutcome {
    /// A `Grant` record was written and fsync'd; the grant is in force.
    Recorded,
    /// The epoch already had exactly this grant; nothing was written.
    Unchanged,
    /// `IfAbsent`, and the epoch already had this (different) grant, which stays.
    Kept(EpochGrant),
}

impl EpochGrant {
    /// The grant with its id lists sorted and deduplicated (the form the store keeps).
    fn canonical(mut self) -> EpochGrant {
        for ids in [&mut self.allowed_uids, &mut self.allowed_gids] {
            ids.sort_unstable();
            ids.dedup();
        }
        self
    }

    /// Whether `uid` (with these groups, primary included) may use the epoch.
    pub fn allows(&self, uid: u32, groups: &[u32]) -> bool {
        uid == self.owner_uid
            || self.allowed_uids.binary_search(&uid).is_ok()
            || groups.iter().any(|gid| self.allowed_gids.binary_search(gid).is_ok())
    }
}

impl Store {
    /// Records `grant` for `epoch` (creating the epoch, empty and open, if the store does not
    /// know it). Returns once the record is fsync'd; a grant equal to the one in force writes
    /// nothing. Deleted epochs cannot be granted; drained ones can (their data is gone, the
    /// grant still says whose they were).
    pub fn grant_epoch(
        &self,
        epoch: EpochId,
        grant: EpochGrant,
        mode: GrantMode,
    ) -> Result<GrantOutcome, GrantError> {
        let grant = grant.canonical();
        for (what, count) in
            [("uids", grant.allowed_uids.len()), ("gids", grant.allowed_gids.len())]
        {
            if count > GRANT_ALLOWED_IDS_MAX {
                let max = GRANT_ALLOWED_IDS_MAX;
                return Err(GrantError::TooManyAllowedIds { epoch, what, count, max });
            }
        }
        if let Some(stream) = grant.stream.filter(|&stream| stream == META_STREAM) {
            return Err(GrantError::ReservedStream { epoch, stream });
        }
        let mut state = self.inner.state.lock();
        if let Some(reason) = &state.failed {
            return Err(GrantError::Failed(reason.clone()));
        }
        let entry = state.epochs.entry(epoch).or_insert_with(EpochEntry::new);
        if entry.phase == EpochPhase::Deleted {
            return Err(GrantError::EpochDeleted { epoch });
        }
        match (&entry.grant, mode) {
            (Some(current), _) if *current == grant => return Ok(GrantOutcome::Unchanged),
            (Some(current), GrantMode::IfAbsent) => return Ok(GrantOutcome::Kept(current.clone())),
            _ => {}
        }
        let payload = encode_grant(&grant);
        let header = meta_header(RecordKind::Grant, epoch, payload.len());
        self.inner.append_meta(&mut state, header, &payload).map_err(|(segment, source)| {
            if crate::storage::is_no_space(&source) {
                GrantError::NoSpace { epoch, source }
            } else {
                GrantError::Io { epoch, segment, source }
            }
        })?;
        state.epochs.get_mut(&epoch).expect("granted epoch vanished").grant = Some(grant);
        #[cfg(feature = "strict_assertions")]
        crate::store::check_invariants(&state);
        drop(state);
        self.inner.sync_dirty().map_err(GrantError::Failed)?;
        Ok(GrantOutcome::Recorded)
    }

    /// Revokes the grant of `epoch`: afterwards nobody but root may use it. Returns whether
    /// there was a grant (nothing is written otherwise); once `true` is returned the
    /// `GrantRevoked` record is fsync'd.
    pub fn revoke_grant(&self, epoch: EpochId) -> Result<bool, RevokeError> {
        let mut state = self.inner.state.lock();
        if let Some(reason) = &state.failed {
            return Err(RevokeError::Failed(reason.clone()));
        }
        if state.epochs.get(&epoch).is_none_or(|entry| entry.grant.is_none()) {
            return Ok(false);
        }
        let header = meta_header(RecordKind::GrantRevoked, epoch, 0);
        self.inner.append_meta(&mut state, header, &[]).map_err(|(segment, source)| {
            if crate::storage::is_no_space(&source) {
                RevokeError::NoSpace { epoch, source }
            } else {
                RevokeError::Io { epoch, segment, source }
            }
        })?;
        state.epochs.get_mut(&epoch).expect("revoked epoch vanished").grant = None;
        #[cfg(feature = "strict_assertions")]
        crate::store::check_invariants(&state);
        drop(state);
        self.inner.sync_dirty().map_err(RevokeError::Failed)?;
        Ok(true)
    }

    /// The grant in force for `epoch`, if any.
    pub fn grant(&self, epoch: EpochId) -> Option<EpochGrant> {
        self.inner.state.lock().epochs.get(&epoch).and_then(|entry| entry.grant.clone())
    }
}

/// The header of a grant or revocation record of `epoch` (sequence assigned by `append_meta`).
fn meta_header(kind: RecordKind, epoch: EpochId, payload_bytes: usize) -> RecordHeader {
    RecordHeader {
        kind,
        sequence: 0,
        stream: META_STREAM,
        epoch,
        file: FileId(0),
        offset: 0,
        payload_bytes: payload_bytes as u32,
    }
}
