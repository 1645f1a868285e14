//! Participants: which servers (by id) committers wrote an epoch to, kept as a record in the
//! SSD log so that a drain, even after restarts, refuses to publish an epoch one of them is
//! missing from (docs/semantics.md, "Drain").
//!
//! Every `Commit` names the servers its client wrote the epoch to; the store keeps the union
//! over all commits. A `Participants` record holds the whole union, so the last one of an
//! epoch is what is in force; it is epoch metadata (live while the epoch is), and
//! [`Store::record_participants`] returns only once its record is fsync'd.

use std::collections::BTreeMap;

use spillway_types::{EpochId, FileId};

use crate::error::{EpochPhase, ParticipantsError};
use crate::format::{
    encode_participants, RecordHeader, RecordKind, META_STREAM, PARTICIPANTS_MAX,
    PARTICIPANT_ADDRESS_BYTES_MAX, PARTICIPANT_ID_BYTES,
};
use crate::store::Store;

/// A server an epoch was written to: its id and where a committer reached it (the address is
/// for messages; the id is what a drain checks).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EpochParticipant {
    pub id: [u8; PARTICIPANT_ID_BYTES],
    pub address: String,
}

/// The union of `current` and `named`, keyed by id (a newer address replaces an older one).
fn union(current: &[EpochParticipant], named: &[EpochParticipant]) -> Vec<EpochParticipant> {
    let mut by_id: BTreeMap<[u8; PARTICIPANT_ID_BYTES], String> =
        current.iter().map(|p| (p.id, p.address.clone())).collect();
    for participant in named {
        by_id.insert(participant.id, participant.address.clone());
    }
    by_id.into_iter().map(|(id, address)| EpochParticipant { id, address }).collect()
}

impl Store {
    /// Adds `named` to the participants of `epoch` (the union is kept). Returns whether a
    /// record was written (then it is fsync'd); nothing is written when `named` adds nothing
    /// new, or when the store does not hold the epoch open or committed (a drained epoch is
    /// published already; an unknown or deleted one has nothing to protect).
    pub fn record_participants(
        &self,
        epoch: EpochId,
        named: &[EpochParticipant],
    ) -> Result<bool, ParticipantsError> {
        for participant in named {
            if participant.id == [0; PARTICIPANT_ID_BYTES] {
                return Err(ParticipantsError::ZeroId { epoch });
            }
            if participant.address.len() > PARTICIPANT_ADDRESS_BYTES_MAX {
                let bytes = participant.address.len();
                return Err(ParticipantsError::AddressTooLong { epoch, bytes });
            }
        }
        let mut state = self.inner.state.lock();
        if let Some(reason) = &state.failed {
            return Err(ParticipantsError::Failed(reason.clone()));
        }
        let Some(entry) = state.epochs.get(&epoch) else { return Ok(false) };
        if matches!(entry.phase, EpochPhase::Drained | EpochPhase::Deleted) {
            return Ok(false);
        }
        let merged = union(&entry.participants, named);
        if merged == entry.participants {
            return Ok(false);
        }
        if merged.len() > PARTICIPANTS_MAX {
            let (count, max) = (merged.len(), PARTICIPANTS_MAX);
            return Err(ParticipantsError::TooMany { epoch, count, max });
        }
        let payload = encode_participants(&merged);
        let header = RecordHeader {
            kind: RecordKind::Participants,
            sequence: 0,
            stream: META_STREAM,
            epoch,
            file: FileId(0),
            offset: 0,
            payload_bytes: payload.len() as u32,
        };
        self.inner
            .append_meta(&mut state, header, &payload)
            .map_err(|(segment, source)| ParticipantsError::Io { epoch, segment, source })?;
        state.epochs.get_mut(&epoch).expect("epoch vanished under the lock").participants = merged;
        drop(state);
        self.inner.sync_dirty().map_err(ParticipantsError::Failed)?;
        Ok(true)
    }

    /// The servers committers named for `epoch`, sorted by id; empty if none were named.
    pub fn participants(&self, epoch: EpochId) -> Vec<EpochParticipant> {
        let state = self.inner.state.lock();
        state.epochs.get(&epoch).map(|entry| entry.participants.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn participant(byte: u8, address: &str) -> EpochParticipant {
        EpochParticipant { id: [byte; PARTICIPANT_ID_BYTES], address: address.into() }
    }

    #[test]
    fn the_union_is_by_id_and_the_newest_address_wins() {
        let merged = union(
            &[participant(2, "b"), participant(1, "a")],
            &[participant(3, "c"), participant(1, "a2")],
        );
        assert_eq!(merged, vec![participant(1, "a2"), participant(2, "b"), participant(3, "c")]);
    }
}
