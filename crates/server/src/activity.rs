//! What the server saw of each epoch the manager granted, from the grant to its revocation:
//! bytes, operations and busy time, which the manager records at teardown as the
//! reservation's achieved rates (docs/design/targets.md). In memory only: a restart starts the
//! counts again when the manager's next heartbeat grants the epoch anew.

use std::collections::HashMap;
use std::time::Instant;

use parking_lot::Mutex;
use spillway_proto::{EpochActivity, Request};
use spillway_types::EpochId;

/// Most epochs counted at once (grants beyond are served but not counted, and logged once).
pub const ACTIVITY_EPOCHS_MAX: usize = 65_536;

/// The resolution of busy time: a tick with at least one request of the epoch counts whole.
const TICK_MS: u64 = 100;

/// One request's contribution, taken before the request runs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counted {
    Write { epoch: EpochId, bytes: u64 },
    Read { epoch: EpochId, bytes: u64 },
    Metadata { epoch: EpochId },
    Nothing,
}

impl Counted {
    /// What `request` counts for (a write's bytes are its payload's, `write_bytes`).
    pub(crate) fn of(request: &Request, write_bytes: u64) -> Counted {
        match *request {
            Request::Write { epoch, .. }
            | Request::WriteExtents { epoch, .. }
            | Request::WriteZeros { epoch, .. } => Counted::Write { epoch, bytes: write_bytes },
            Request::Read { epoch, length, .. } => Counted::Read { epoch, bytes: length.into() },
            Request::OpenFile { epoch, .. }
            | Request::ListFiles { epoch, .. }
            | Request::Stat { epoch, .. }
            | Request::Extents { epoch, .. } => Counted::Metadata { epoch },
            _ => Counted::Nothing,
        }
    }
}

struct Entry {
    activity: EpochActivity,
    last_tick: Option<u64>,
}

/// The granted epochs' counts.
pub(crate) struct ActivityBoard {
    started: Instant,
    epochs: Mutex<HashMap<EpochId, Entry>>,
}

impl Default for ActivityBoard {
    fn default() -> Self {
        ActivityBoard { started: Instant::now(), epochs: Mutex::new(HashMap::new()) }
    }
}

impl ActivityBoard {
    /// The manager granted `epoch` (again, every heartbeat): counting starts if it had not.
    pub(crate) fn granted(&self, epoch: EpochId) {
        let mut epochs = self.epochs.lock();
        if epochs.contains_key(&epoch) {
            return;
        }
        if epochs.len() >= ACTIVITY_EPOCHS_MAX {
            tracing::warn!(%epoch, limit = ACTIVITY_EPOCHS_MAX, "too many granted epochs to count their activity; this one is not counted");
            return;
        }
        epochs.insert(epoch, Entry { activity: EpochActivity::default(), last_tick: None });
    }

    /// The grant is gone: what was counted, and counting stops.
    pub(crate) fn revoked(&self, epoch: EpochId) -> EpochActivity {
        self.epochs.lock().remove(&epoch).map(|entry| entry.activity).unwrap_or_default()
    }

    /// Adds a request that succeeded (an epoch not granted is not counted).
    pub(crate) fn record(&self, counted: Counted) {
        let epoch = match counted {
            Counted::Write { epoch, .. } | Counted::Read { epoch, .. } => epoch,
            Counted::Metadata { epoch } => epoch,
            Counted::Nothing => return,
        };
        let tick = self.started.elapsed().as_millis() as u64 / TICK_MS;
        let mut epochs = self.epochs.lock();
        let Some(entry) = epochs.get_mut(&epoch) else { return };
        let activity = &mut entry.activity;
        match counted {
            Counted::Write { bytes, .. } => {
                activity.bytes_written += bytes;
                activity.write_ops += 1;
            }
            Counted::Read { bytes, .. } => {
                activity.bytes_read += bytes;
                activity.read_ops += 1;
            }
            Counted::Metadata { .. } => activity.metadata_ops += 1,
            Counted::Nothing => unreachable!("returned above"),
        }
        if entry.last_tick != Some(tick) {
            entry.last_tick = Some(tick);
            activity.busy_ms += TICK_MS;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_granted_epochs_count_and_a_revoke_returns_and_forgets_them() {
        let board = ActivityBoard::default();
        let (granted, other) = (EpochId(7), EpochId(8));
        board.granted(granted);
        board.record(Counted::Write { epoch: granted, bytes: 4096 });
        board.record(Counted::Write { epoch: granted, bytes: 100 });
        board.record(Counted::Read { epoch: granted, bytes: 50 });
        board.record(Counted::Metadata { epoch: granted });
        board.record(Counted::Write { epoch: other, bytes: 1 << 20 });
        // Granted again by the next heartbeat: the counts go on.
        board.granted(granted);
        board.record(Counted::Metadata { epoch: granted });
        let seen = board.revoked(granted);
        assert_eq!((seen.bytes_written, seen.write_ops), (4196, 2));
        assert_eq!((seen.bytes_read, seen.read_ops), (50, 1));
        assert_eq!(seen.metadata_ops, 2);
        // Requests within one 100 ms tick, unless this test was descheduled between them.
        assert!(seen.busy_ms >= TICK_MS && seen.busy_ms <= 6 * TICK_MS, "{seen:?}");
        assert_eq!(board.revoked(granted), EpochActivity::default(), "forgotten");
        assert_eq!(board.revoked(other), EpochActivity::default(), "never granted, never counted");
    }
}
