//! Taking things out of service and changing them in place: `pool delete`, `server remove` and
//! `reservation modify`. Like every operation of [`crate::service`], each runs in one
//! transaction, and each has its own error enum.
//!
//! A server is removed in two steps so that nothing committed is lost: `server remove` starts
//! *retiring* it (placement gives it nothing new, as if it were down), and it is removed once no
//! active reservation holds fragments on it and it has no drain in flight — at once if that is
//! already so, else at the heartbeat round that sees it. It does not move a running job's data
//! (a reservation's data layout is fixed by its server list); it waits for the reservations to
//! end, and names them. A replicated reservation can leave sooner through `server lost` and
//! re-replication.

use std::collections::BTreeSet;

use spillway_policy::fragments::{grow, ServerSpace};
use spillway_types::format_bytes;

use crate::db;
use crate::identity::Caller;
use crate::model::*;
use crate::service::{api_error, lock, server_space, ApiError, Manager, ReadError};

/// Why `pool delete` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeletePoolError {
    #[error("uid {uid} may not manage pools (root or the admin group only)")]
    NotAuthorized { uid: u32 },
    #[error("no pool named {name:?}")]
    NotFound { name: String },
    #[error("pool {name} still has servers {servers}: remove them first (spillway server remove)")]
    HasServers { name: String, servers: String },
    #[error("pool {name} still holds reservations {reservations}")]
    HasReservations { name: String, reservations: String },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(DeletePoolError {
    NotAuthorized => (403, "not_authorized"),
    NotFound => (404, "not_found"),
    HasServers => (409, "in_use"),
    HasReservations => (409, "in_use"),
    Database => (500, "database"),
});

/// Why `server remove` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoveServerError {
    #[error("uid {uid} may not manage servers (root or the admin group only)")]
    NotAuthorized { uid: u32 },
    #[error("no server {key:?} (give its id or address, as `spillway server list` shows)")]
    NotFound { key: String },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(RemoveServerError {
    NotAuthorized => (403, "not_authorized"),
    NotFound => (404, "not_found"),
    Database => (500, "database"),
});

/// Why `reservation modify` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModifyReservationError {
    #[error("invalid change: {reason}")]
    Invalid { reason: String },
    #[error("no active reservation {key:?} visible to uid {uid}")]
    NotFound { key: String, uid: u32 },
    #[error("uid {uid} may use but not change reservation {name:?} (owner uid {owner})")]
    NotAuthorized { uid: u32, name: String, owner: u32 },
    #[error("reservation {name} cannot grow: {reason}")]
    NoCapacity { name: String, reason: String },
    #[error("quota exceeded for uid {uid}: {} in use + {} more asked > quota {}", format_bytes(*used_bytes), format_bytes(*asked_bytes), format_bytes(*quota_bytes))]
    QuotaExceeded { uid: u32, quota_bytes: u64, used_bytes: u64, asked_bytes: u64 },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(ModifyReservationError {
    Invalid => (400, "invalid"),
    NotFound => (404, "not_found"),
    NotAuthorized => (403, "not_authorized"),
    NoCapacity => (507, "no_capacity"),
    QuotaExceeded => (403, "quota_exceeded"),
    Database => (500, "database"),
});

impl From<ReadError> for RemoveServerError {
    fn from(error: ReadError) -> Self {
        match error {
            ReadError::Database { source } => RemoveServerError::Database { source },
        }
    }
}

/// `a, b and 3 more`: a short list for an error message.
fn few(names: &[String]) -> String {
    const SHOWN: usize = 5;
    match names.len() {
        n if n <= SHOWN => names.join(", "),
        n => format!("{} and {} more", names[..SHOWN].join(", "), n - SHOWN),
    }
}

impl Manager {
    /// Deletes an empty pool: no server left in it (`server remove` them first) and no active
    /// reservation. Its name is free again at once.
    pub fn delete_pool(&self, caller: &Caller, name: &str) -> Result<(), DeletePoolError> {
        if !caller.admin {
            return Err(DeletePoolError::NotAuthorized { uid: caller.uid });
        }
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let pool = db::pools(&tx)?
            .into_iter()
            .find(|p| p.name == name)
            .ok_or_else(|| DeletePoolError::NotFound { name: name.to_string() })?;
        let servers: Vec<String> = db::servers(&tx)?
            .into_iter()
            .filter(|s| s.pool_id == pool.id)
            .map(|s| s.address)
            .collect();
        if !servers.is_empty() {
            return Err(DeletePoolError::HasServers { name: pool.name, servers: few(&servers) });
        }
        let reservations: Vec<String> = db::active_reservations(&tx)?
            .into_iter()
            .filter(|r| r.pool_id == pool.id)
            .map(|r| r.name)
            .collect();
        if !reservations.is_empty() {
            return Err(DeletePoolError::HasReservations {
                name: pool.name,
                reservations: few(&reservations),
            });
        }
        db::mark_pool_deleted(&tx, pool.id, self.clock.now_unix_s())?;
        tx.commit()?;
        lock(&self.streams).remove(&pool.id);
        drop(db);
        tracing::info!(pool = %name, uid = caller.uid, "pool deleted");
        Ok(())
    }

    /// Starts retiring a server (by id or address) and removes it if nothing holds it any more
    /// (see the module documentation). Asking again reports where the removal stands.
    pub fn remove_server(
        &self,
        caller: &Caller,
        key: &str,
    ) -> Result<ServerRemoval, RemoveServerError> {
        if !caller.admin {
            return Err(RemoveServerError::NotAuthorized { uid: caller.uid });
        }
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let server = db::servers(&tx)?
            .into_iter()
            .find(|s| s.address == key || key.parse::<u64>() == Ok(s.id))
            .ok_or_else(|| RemoveServerError::NotFound { key: key.to_string() })?;
        let now = self.clock.now_unix_s();
        db::mark_server_retiring(&tx, server.id, now)?;
        let pools = db::pools(&tx)?;
        tx.commit()?;
        drop(db);
        if server.retiring_unix_s.is_none() {
            tracing::info!(server = %server.address, uid = caller.uid, "server retiring: it gets no new fragments");
        }
        match self.finish_retirement(server.id)? {
            Some(removal) => Ok(removal),
            // The heartbeat removed it in between.
            None => {
                let row = db::ServerRow {
                    retiring_unix_s: server.retiring_unix_s.or(Some(now)),
                    ..server
                };
                let server = Self::server_model(&row, &pools, &Default::default(), None);
                Ok(ServerRemoval { server, removed: true, waiting_for: Vec::new() })
            }
        }
    }

    /// Removes every retiring server nothing holds any more (the heartbeat round's step).
    pub fn finish_retirements(&self) -> Result<(), ReadError> {
        let retiring: Vec<u64> = {
            let mut db = lock(&self.db);
            let tx = db.conn.transaction()?;
            let ids = db::servers(&tx)?
                .iter()
                .filter(|s| s.retiring_unix_s.is_some())
                .map(|s| s.id)
                .collect();
            tx.commit()?;
            ids
        };
        for id in retiring {
            self.finish_retirement(id)?;
        }
        Ok(())
    }

    /// Where the retirement of server `id` stands, removing it when nothing holds it: no active
    /// reservation with fragments on it, no drain in flight at its last heartbeat. `None`: it
    /// is not listed (removed already).
    fn finish_retirement(&self, id: u64) -> Result<Option<ServerRemoval>, ReadError> {
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let (pools, servers) = (db::pools(&tx)?, db::servers(&tx)?);
        let Some(row) = servers.into_iter().find(|s| s.id == id) else { return Ok(None) };
        assert!(
            row.retiring_unix_s.is_some(),
            "server {id} is retiring when its removal is checked"
        );
        let active = db::active_reservations(&tx)?;
        let mut waiting_for: Vec<String> = active
            .iter()
            .filter(|r| r.placement.iter().any(|&(server, _)| server == id))
            .map(|r| format!("reservation {} (uid {})", r.name, r.owner_uid))
            .collect();
        let mut live = lock(&self.live);
        let drains = live.get(&id).map(|p| p.drains_in_flight).unwrap_or(0);
        if drains > 0 {
            waiting_for.push(format!("{drains} drains in flight"));
        }
        let used = Self::used_per_server(&active);
        let server = Self::server_model(&row, &pools, &used, live.get(&id));
        let removed = waiting_for.is_empty();
        if removed {
            db::mark_server_removed(&tx, id, self.clock.now_unix_s())?;
            live.remove(&id);
            tracing::info!(server = %row.address, "server removed");
        }
        drop(live);
        tx.commit()?;
        Ok(Some(ServerRemoval { server, removed, waiting_for }))
    }

    /// Grows a reservation on its servers and changes who may use it (persistent ones only; job
    /// reservations belong to their job's user). Its owner or an admin. The caller re-sends the
    /// grants ([`crate::grant_reservations`]) so the servers see the change now.
    pub fn modify_reservation(
        &self,
        caller: &Caller,
        key: &str,
        change: &ModifyReservation,
    ) -> Result<Reservation, ModifyReservationError> {
        let invalid = |reason: String| ModifyReservationError::Invalid { reason };
        let sharing = !(change.share_uids.is_empty()
            && change.share_gids.is_empty()
            && change.unshare_uids.is_empty()
            && change.unshare_gids.is_empty());
        if change.capacity_bytes.is_none() && !sharing {
            return Err(invalid(
                "nothing to change: give a capacity or users or groups to share with or unshare"
                    .into(),
            ));
        }
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let row = db::find_reservation(&tx, key)?
            .filter(|r| r.state == ReservationState::Active && Self::can_see(caller, r))
            .ok_or_else(|| ModifyReservationError::NotFound {
                key: key.to_string(),
                uid: caller.uid,
            })?;
        if !caller.admin && row.owner_uid != caller.uid {
            return Err(ModifyReservationError::NotAuthorized {
                uid: caller.uid,
                name: row.name.clone(),
                owner: row.owner_uid,
            });
        }
        if let Some(capacity_bytes) = change.capacity_bytes {
            self.grow_reservation(&tx, &row, capacity_bytes)?;
        }
        if sharing {
            if !row.persistent {
                return Err(invalid(format!(
                    "reservation {} is job {}'s: only persistent reservations are shared",
                    row.name,
                    row.job_id.as_deref().unwrap_or("?")
                )));
            }
            let merge = |now: &[u32], add: &[u32], remove: &[u32]| -> Vec<u32> {
                let mut ids: BTreeSet<u32> = now.iter().chain(add).copied().collect();
                ids.retain(|id| !remove.contains(id));
                ids.into_iter().collect()
            };
            let uids = merge(&row.allowed_uids, &change.share_uids, &change.unshare_uids);
            let gids = merge(&row.allowed_gids, &change.share_gids, &change.unshare_gids);
            let max = spillway_types::GRANT_ALLOWED_IDS_MAX;
            if uids.len() > max || gids.len() > max {
                // The servers' grants hold at most this many of each.
                return Err(invalid(format!("more than {max} allowed uids or gids")));
            }
            db::set_sharing(&tx, row.id, &uids, &gids)?;
        }
        let updated = db::find_reservation(&tx, &row.id.to_string())?
            .expect("the reservation just changed exists");
        let (pools, servers) = (db::pools(&tx)?, db::servers(&tx)?);
        tx.commit()?;
        drop(db);
        tracing::info!(reservation = row.id, name = %row.name, uid = caller.uid, capacity_bytes = updated.requested_bytes,
            fragments = updated.fragments, allowed_uids = ?updated.allowed_uids, allowed_gids = ?updated.allowed_gids, "reservation modified");
        Ok(updated.to_model(&pools, &servers))
    }

    /// The capacity part of [`Manager::modify_reservation`]: more fragments on the same servers
    /// (`policy::fragments::grow`), within the owner's quota.
    fn grow_reservation(
        &self,
        tx: &rusqlite::Transaction<'_>,
        row: &db::ReservationRow,
        capacity_bytes: u64,
    ) -> Result<(), ModifyReservationError> {
        if capacity_bytes < row.requested_bytes || capacity_bytes > i64::MAX as u64 / 8 {
            return Err(ModifyReservationError::Invalid {
                reason: format!(
                    "capacity {} for reservation {} of {}: a reservation only grows (its data may already live anywhere in it)",
                    format_bytes(capacity_bytes),
                    row.name,
                    format_bytes(row.requested_bytes)
                ),
            });
        }
        let fragments = capacity_bytes.div_ceil(row.fragment_bytes) * row.replicas.max(1) as u64;
        let servers = db::servers(tx)?;
        let active = db::active_reservations(tx)?;
        let used = Self::used_per_server(&active);
        let current: Vec<(ServerSpace, u64)> = row
            .placement
            .iter()
            .map(|&(id, count)| {
                let space = servers.iter().find(|s| s.id == id).map(|s| server_space(s, &used));
                // Every server an active reservation uses is listed (removal waits for it).
                let space = space.expect("an active reservation's servers are listed");
                (space, count)
            })
            .collect();
        let placement = grow(&current, fragments, row.fragment_bytes).map_err(|error| {
            ModifyReservationError::NoCapacity { name: row.name.clone(), reason: error.to_string() }
        })?;
        let extra_bytes = (fragments - row.fragments) * row.fragment_bytes;
        let (quota, _) = self.quota_of(tx, row.owner_uid)?;
        let owned: u64 =
            active.iter().filter(|r| r.owner_uid == row.owner_uid).map(|r| r.raw_bytes()).sum();
        if quota != 0 && owned + extra_bytes > quota {
            return Err(ModifyReservationError::QuotaExceeded {
                uid: row.owner_uid,
                quota_bytes: quota,
                used_bytes: owned,
                asked_bytes: extra_bytes,
            });
        }
        db::grow_reservation(tx, row.id, capacity_bytes, &placement)?;
        Ok(())
    }
}
