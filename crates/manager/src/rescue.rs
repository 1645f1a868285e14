//! Rescue reservations: a job reservation whose stage-out failed is kept, never torn down with
//! its job, so the data a COMPLETED job wrote is not lost with it.
//!
//! The Slurm hook (root) marks the reservation with the stage-out error and the job's
//! stage-outs ([`Manager::mark_rescue`]). From then on the reservation stays what it was for
//! everyone else: its owner's alone (other users neither see nor use it), counted against the
//! owner's quota and the pool's capacity. What changes is destruction
//! ([`crate::service::Manager::destroy_reservation`]): teardown (a destroy naming the job) is
//! refused; the owner may destroy it (`spillway stage-out --retry` does once every file is
//! copied and verified); root or an admin only from `reclaimable_unix_s` on (knob
//! `manager.rescue_expiry_s`), never automatically.

use crate::db;
use crate::identity::Caller;
use crate::model::{MarkRescue, Rescue, Reservation, ReservationState};
use crate::service::{api_error, lock, ApiError, Manager};

/// Longest stage-out error kept (the hook's message; longer is cut).
pub const RESCUE_ERROR_BYTES_MAX: usize = 4096;
/// Most stage-outs one rescue records: a directive has a handful, a private reservation's are
/// per node (a few stage-outs of a job on a thousand nodes).
pub const RESCUE_STAGE_OUTS_MAX: usize = 4096;

/// Why a reservation could not be marked rescue.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MarkRescueError {
    #[error("uid {uid} may not mark reservations rescue (root or the admin group only; the Slurm stage-out hook does)")]
    NotAuthorized { uid: u32 },
    #[error("invalid rescue request: {reason}")]
    Invalid { reason: String },
    #[error("no active reservation {key:?} visible to uid {uid}")]
    NotFound { key: String, uid: u32 },
    #[error("reservation {name} is persistent: it outlives its jobs anyway, only job reservations become rescue reservations")]
    Persistent { name: String },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(MarkRescueError {
    NotAuthorized => (403, "not_authorized"),
    Invalid => (400, "invalid"),
    NotFound => (404, "not_found"),
    Persistent => (409, "persistent"),
    Database => (500, "database"),
});

/// The error text kept: at most [`RESCUE_ERROR_BYTES_MAX`] bytes, cut on a character boundary.
fn bounded_error(error: &str) -> String {
    let mut end = error.len().min(RESCUE_ERROR_BYTES_MAX);
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    error[..end].to_string()
}

impl Manager {
    /// Keeps job reservation `key` as a rescue reservation: its stage-out failed with
    /// `request.error`. Marking again replaces the error and stage-outs but keeps the times.
    pub fn mark_rescue(
        &self,
        caller: &Caller,
        key: &str,
        request: &MarkRescue,
    ) -> Result<Reservation, MarkRescueError> {
        if !caller.admin {
            return Err(MarkRescueError::NotAuthorized { uid: caller.uid });
        }
        if request.error.trim().is_empty() {
            return Err(MarkRescueError::Invalid { reason: "the error is empty".into() });
        }
        if request.stage_outs.len() > RESCUE_STAGE_OUTS_MAX {
            return Err(MarkRescueError::Invalid {
                reason: format!(
                    "{} stage-outs, at most {RESCUE_STAGE_OUTS_MAX}",
                    request.stage_outs.len()
                ),
            });
        }
        if let Some(pair) = request.stage_outs.iter().find(|p| p.src.is_empty() || p.dst.is_empty())
        {
            return Err(MarkRescueError::Invalid {
                reason: format!("stage-out {:?} -> {:?} has an empty path", pair.src, pair.dst),
            });
        }
        let bad_node = |node: &str| node.is_empty() || node.len() > 255 || node.contains('/');
        if let Some(pair) =
            request.stage_outs.iter().find(|p| p.node.as_deref().is_some_and(bad_node))
        {
            return Err(MarkRescueError::Invalid {
                reason: format!(
                    "stage-out {:?} -> {:?}: node {:?} is not a node name",
                    pair.src, pair.dst, pair.node
                ),
            });
        }
        let now = self.clock.now_unix_s();
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let row = db::find_reservation(&tx, key)?
            .filter(|r| r.state == ReservationState::Active)
            .ok_or_else(|| MarkRescueError::NotFound {
            key: key.to_string(),
            uid: caller.uid,
        })?;
        if row.persistent {
            return Err(MarkRescueError::Persistent { name: row.name });
        }
        let rescue = Rescue {
            error: bounded_error(&request.error),
            since_unix_s: now,
            reclaimable_unix_s: now.saturating_add(self.knobs().rescue_expiry_s),
            stage_outs: request.stage_outs.clone(),
        };
        db::mark_rescue(&tx, row.id, &rescue)?;
        let reservation = db::find_reservation(&tx, &row.id.to_string())?
            .expect("the reservation just updated")
            .to_model(&db::pools(&tx)?, &db::servers(&tx)?);
        tx.commit()?;
        tracing::warn!(reservation = row.id, name = %row.name, owner = row.owner_uid, error = %rescue.error, "stage-out failed: reservation kept as a rescue reservation");
        Ok(reservation)
    }
}
