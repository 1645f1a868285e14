//! Each server's measured peaks (`PUT /v1/servers/<id>/peaks`, recorded by `spillway server
//! measure`): the bandwidth, IOPS and metadata rates allocation by performance target divides
//! among reservations (docs/design/targets.md). The manager does not measure itself: the
//! measurement is load that an admin schedules (when a server is added, or on demand), and
//! the manager only keeps what was measured, when and how.

use crate::db;
use crate::identity::Caller;
use crate::model::{Server, ServerPeaks, SetServerPeaks};
use crate::service::{api_error, lock, ApiError, Manager, ReadError};

/// Longest `conditions` text kept.
pub const PEAKS_CONDITIONS_BYTES_MAX: usize = 1024;

/// Why recording a server's peaks failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetPeaksError {
    #[error("uid {uid} may not record server peaks (root or the admin group only)")]
    NotAuthorized { uid: u32 },
    #[error("no server {key:?} (give its id or address, as `spillway server list` shows)")]
    NotFound { key: String },
    #[error("invalid peaks: {reason}")]
    Invalid { reason: String },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(SetPeaksError {
    NotAuthorized => (403, "not_authorized"),
    NotFound => (404, "not_found"),
    Invalid => (400, "invalid"),
    Database => (500, "database"),
});

impl From<ReadError> for SetPeaksError {
    fn from(error: ReadError) -> Self {
        match error {
            ReadError::Database { source } => SetPeaksError::Database { source },
        }
    }
}

fn validate(peaks: &SetServerPeaks) -> Result<(), SetPeaksError> {
    let invalid = |reason: String| Err(SetPeaksError::Invalid { reason });
    for (name, value) in [
        ("bandwidth_bytes_per_s", peaks.bandwidth_bytes_per_s),
        ("iops", peaks.iops),
        ("metadata_ops_per_s", peaks.metadata_ops_per_s),
    ] {
        // Stored as SQLite integers (i64); a zero rate would make every target unmeetable.
        if value == 0 || value > i64::MAX as u64 {
            return invalid(format!("{name} must be between 1 and {} (got {value})", i64::MAX));
        }
    }
    let modes = [
        ("metadata_striped_ops_per_s", peaks.metadata_striped_ops_per_s),
        ("metadata_private_ops_per_s", peaks.metadata_private_ops_per_s),
    ];
    if modes[0].1.is_some() != modes[1].1.is_some() {
        return invalid(
            "metadata_striped_ops_per_s and metadata_private_ops_per_s: both or neither".into(),
        );
    }
    for (name, value) in modes {
        if let Some(value) = value.filter(|&v| v == 0 || v > i64::MAX as u64) {
            return invalid(format!("{name} must be between 1 and {} (got {value})", i64::MAX));
        }
    }
    if peaks.conditions.len() > PEAKS_CONDITIONS_BYTES_MAX {
        return invalid(format!(
            "conditions hold {} bytes, at most {PEAKS_CONDITIONS_BYTES_MAX}",
            peaks.conditions.len()
        ));
    }
    if peaks.conditions.chars().any(char::is_control) {
        return invalid("conditions hold a control character".to_string());
    }
    Ok(())
}

impl Manager {
    /// Records what was measured against server `key` (id or address), stamped now; replaces
    /// the last measurement.
    pub fn set_server_peaks(
        &self,
        caller: &Caller,
        key: &str,
        peaks: &SetServerPeaks,
    ) -> Result<Server, SetPeaksError> {
        if !caller.admin {
            return Err(SetPeaksError::NotAuthorized { uid: caller.uid });
        }
        validate(peaks)?;
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let server = db::servers(&tx)?
            .into_iter()
            .find(|s| s.address == key || key.parse::<u64>() == Ok(s.id))
            .ok_or_else(|| SetPeaksError::NotFound { key: key.to_string() })?;
        let stored = ServerPeaks {
            bandwidth_bytes_per_s: peaks.bandwidth_bytes_per_s,
            iops: peaks.iops,
            metadata_ops_per_s: peaks.metadata_ops_per_s,
            measured_unix_s: self.clock.now_unix_s(),
            conditions: peaks.conditions.clone(),
            metadata_striped_ops_per_s: peaks.metadata_striped_ops_per_s,
            metadata_private_ops_per_s: peaks.metadata_private_ops_per_s,
        };
        db::set_server_peaks(&tx, server.id, &stored)?;
        tx.commit()?;
        drop(db);
        tracing::info!(
            server = %server.address,
            bandwidth_bytes_per_s = stored.bandwidth_bytes_per_s,
            iops = stored.iops,
            metadata_ops_per_s = stored.metadata_ops_per_s,
            "server peaks recorded"
        );
        Ok(self.list_servers()?.into_iter().find(|s| s.id == server.id).expect("server row exists"))
    }
}
