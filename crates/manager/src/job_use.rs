//! Which Slurm jobs use a persistent reservation: registered by the setup hook of each job that
//! names it (`#BB_LUA persistent=NAME`), removed by the job's teardown. While a job is
//! registered, [`Manager::destroy_reservation`] refuses to destroy the reservation under it
//! (only root may force). Only root and the admin group register and remove jobs: the
//! hooks run as root, and a user registering jobs could keep another user's reservation alive.

use crate::db;
use crate::identity::Caller;
use crate::model::{Reservation, ReservationState};
use crate::service::{api_error, lock, ApiError, Manager};

/// Why registering a job with a reservation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterJobError {
    #[error("uid {uid} may not register jobs with reservations (root or the admin group only; the Slurm setup hook does)")]
    NotAuthorized { uid: u32 },
    #[error("invalid job: {reason}")]
    Invalid { reason: String },
    #[error("no active reservation {key:?} visible to uid {uid}")]
    NotFound { key: String, uid: u32 },
    #[error("reservation {name} is a job reservation; only persistent reservations record the jobs using them")]
    NotPersistent { name: String },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(RegisterJobError {
    NotAuthorized => (403, "not_authorized"),
    Invalid => (400, "invalid"),
    NotFound => (404, "not_found"),
    NotPersistent => (400, "not_persistent"),
    Database => (500, "database"),
});

/// Why removing a job from a reservation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UnregisterJobError {
    #[error("uid {uid} may not unregister jobs from reservations (root or the admin group only; the Slurm teardown hook does)")]
    NotAuthorized { uid: u32 },
    #[error("invalid job: {reason}")]
    Invalid { reason: String },
    #[error("no active reservation {key:?} visible to uid {uid}")]
    NotFound { key: String, uid: u32 },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(UnregisterJobError {
    NotAuthorized => (403, "not_authorized"),
    Invalid => (400, "invalid"),
    NotFound => (404, "not_found"),
    Database => (500, "database"),
});

/// A Slurm job id as the hooks pass it: 1 to 64 of `[A-Za-z0-9._-]`.
fn check_job(job: &str) -> Result<(), String> {
    if job.is_empty()
        || job.len() > 64
        || !job.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(format!("job id {job:?} must be 1 to 64 of [A-Za-z0-9._-]"));
    }
    Ok(())
}

impl Manager {
    /// Records that Slurm job `job` uses the persistent reservation `key` (again: no change).
    pub fn register_job(
        &self,
        caller: &Caller,
        key: &str,
        job: &str,
    ) -> Result<Reservation, RegisterJobError> {
        if !caller.admin {
            return Err(RegisterJobError::NotAuthorized { uid: caller.uid });
        }
        check_job(job).map_err(|reason| RegisterJobError::Invalid { reason })?;
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let row = db::find_reservation(&tx, key)?
            .filter(|r| r.state == ReservationState::Active)
            .ok_or_else(|| RegisterJobError::NotFound {
            key: key.to_string(),
            uid: caller.uid,
        })?;
        if !row.persistent {
            return Err(RegisterJobError::NotPersistent { name: row.name });
        }
        db::register_job(&tx, row.id, job, self.clock.now_unix_s())?;
        let reservation = db::find_reservation(&tx, &row.id.to_string())?
            .expect("the reservation just updated")
            .to_model(&db::pools(&tx)?, &db::servers(&tx)?);
        tx.commit()?;
        tracing::info!(reservation = row.id, name = %row.name, job, "job registered as using the reservation");
        Ok(reservation)
    }

    /// Forgets that Slurm job `job` uses reservation `key`; a job that was not registered is no
    /// error (teardown is idempotent).
    pub fn unregister_job(
        &self,
        caller: &Caller,
        key: &str,
        job: &str,
    ) -> Result<Reservation, UnregisterJobError> {
        if !caller.admin {
            return Err(UnregisterJobError::NotAuthorized { uid: caller.uid });
        }
        check_job(job).map_err(|reason| UnregisterJobError::Invalid { reason })?;
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let row = db::find_reservation(&tx, key)?
            .filter(|r| r.state == ReservationState::Active)
            .ok_or_else(|| UnregisterJobError::NotFound {
            key: key.to_string(),
            uid: caller.uid,
        })?;
        let removed = db::unregister_job(&tx, row.id, job)?;
        let reservation = db::find_reservation(&tx, &row.id.to_string())?
            .expect("the reservation just updated")
            .to_model(&db::pools(&tx)?, &db::servers(&tx)?);
        tx.commit()?;
        if removed {
            tracing::info!(reservation = row.id, name = %row.name, job, "job no longer uses the reservation");
        }
        Ok(reservation)
    }
}
