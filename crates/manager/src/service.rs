//! The manager's operations: pools, servers, reservations, quotas, health — each one transaction.
//!
//! [`Manager`] owns the database and the in-memory stream tables. Every state change runs inside
//! one SQLite transaction while the database mutex is held, so decisions (pool, fragments,
//! stream) are taken on a consistent snapshot and either all land or none. Placement is decided
//! by the pure functions of `spillway-policy`: BIOS Algorithm 2 (`select_pool`) among the pools
//! that can hold the request, `fragments::allocate` for the servers, BIOS Algorithm 1
//! (`StreamTable`, one per pool since a pool is one group of devices) for the stream id, keyed by
//! user or job (knob `manager.stream_key`). Stream tables are rebuilt from the active
//! reservations at start, so a restart keeps every assignment.
//!
//! Authorization: a caller sees and changes only their own reservations; a persistent
//! reservation is also visible to its allowed uids and groups; root and the admin group see
//! everything, manage pools, servers and quotas, and may create reservations for another uid.
//! Each operation has its own error enum, mapped to an HTTP status by [`ApiError`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use spillway_config::{JobOwnerCheck, ManagerKnobs, StreamKeyKind};
use spillway_policy::fragments::{
    allocate, choose_replacement, FragmentError, FragmentPlan, FragmentRequest, ServerSpace,
    REPLICAS_MAX,
};
use spillway_policy::targets::{plan as target_plan, TargetError, TargetPlan, TargetRequest};
use spillway_policy::{
    select_pool, PoolChoice, PoolState, StreamDecision, StreamTable, StreamTableLimits,
};
use spillway_types::{format_bytes, StreamKey};

use crate::db::{self, Db, PoolRow, ReservationRow, ServerRow};
use crate::identity::Caller;
use crate::job_owner::{JobOwnerError, JobOwners, Squeue};
use crate::model::*;
use crate::replicate::RepairJob;

/// The clock, behind a seam so tests control stream reclaim and timestamps.
pub trait Clock: Send + Sync {
    fn now_unix_s(&self) -> u64;
}

/// The system clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix_s(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }
}

/// An error's HTTP status and stable kind name, for the API.
pub trait ApiError: std::error::Error {
    fn status(&self) -> u16;
    fn kind(&self) -> &'static str;
}

macro_rules! api_error {
    ($name:ident { $($variant:ident => ($status:expr, $kind:expr)),* $(,)? }) => {
        impl ApiError for $name {
            fn status(&self) -> u16 {
                match self { $( $name::$variant { .. } => $status, )* }
            }
            fn kind(&self) -> &'static str {
                match self { $( $name::$variant { .. } => $kind, )* }
            }
        }
    };
}
pub(crate) use api_error;

/// Why a database read failed (list and status operations).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(ReadError { Database => (500, "database") });

macro_rules! from_read_error {
    ($($name:ident),*) => {$(
        impl From<ReadError> for $name {
            fn from(error: ReadError) -> Self {
                match error {
                    ReadError::Database { source } => $name::Database { source },
                }
            }
        }
    )*};
}
from_read_error!(CreatePoolError, AddServerError, QuotaError, LostServerError);

/// Why `pool create` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreatePoolError {
    #[error("uid {uid} may not manage pools (root or the admin group only)")]
    NotAuthorized { uid: u32 },
    #[error("invalid pool: {reason}")]
    Invalid { reason: String },
    #[error("pool {name:?} already exists")]
    Exists { name: String },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(CreatePoolError {
    NotAuthorized => (403, "not_authorized"),
    Invalid => (400, "invalid"),
    Exists => (409, "exists"),
    Database => (500, "database"),
});

/// Why `server add` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AddServerError {
    #[error("uid {uid} may not manage servers (root or the admin group only)")]
    NotAuthorized { uid: u32 },
    #[error("invalid server: {reason}")]
    Invalid { reason: String },
    #[error("no pool named {pool:?} (create it with `spillway pool create`)")]
    NoSuchPool { pool: String },
    #[error("server {address} is already known")]
    Exists { address: String },
    #[error("server {address} is already registered as {existing} (the same server id {server_id}): not added twice")]
    SameServer { address: String, existing: String, server_id: String },
    #[error(
        "server {address} cannot be added: {error} (start it with `spillway serve`, and see its log, before adding it)"
    )]
    Unreachable { address: String, error: String },
    #[error("server {address} serves another cluster ({serves}; this manager's database is cluster {ours}): it holds another manager's reservations, or this manager's database was wiped or replaced. Not added: restore that database, or empty the server's store (its --ssd-dir, CLUSTER file included) to give it to this cluster")]
    OtherCluster { address: String, serves: String, ours: String },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(AddServerError {
    NotAuthorized => (403, "not_authorized"),
    Invalid => (400, "invalid"),
    NoSuchPool => (404, "no_such_pool"),
    Exists => (409, "exists"),
    SameServer => (409, "exists"),
    Unreachable => (502, "unreachable"),
    OtherCluster => (409, "other_cluster"),
    Database => (500, "database"),
});

/// Why `server lost` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LostServerError {
    #[error("uid {uid} may not declare servers lost (root or the admin group only)")]
    NotAuthorized { uid: u32 },
    #[error("no server {key:?} (give its id or address, as `spillway server list` shows)")]
    NotFound { key: String },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(LostServerError {
    NotAuthorized => (403, "not_authorized"),
    NotFound => (404, "not_found"),
    Database => (500, "database"),
});

/// Why `reservation create` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreateReservationError {
    #[error("invalid reservation request: {reason}")]
    Invalid { reason: String },
    #[error(
        "uid {uid} may not create reservations for uid {owner} (root or the admin group only)"
    )]
    NotAuthorized { uid: u32, owner: u32 },
    #[error("no pool named {pool:?}")]
    NoSuchPool { pool: String },
    #[error("a reservation named {name:?} already exists")]
    NameTaken { name: String },
    #[error("job {job} already has reservation {id}")]
    JobHasReservation { job: String, id: u64 },
    #[error("job {job} belongs to uid {owner}; only its owner or root can reserve for it")]
    NotJobOwner { job: String, owner: u32 },
    #[error(
        "Slurm does not know job {job}; only an existing job's owner or root can reserve for it"
    )]
    UnknownJob { job: String },
    #[error("cannot ask Slurm who owns job {job}: {reason} (knob manager.job_owner_check = \"none\" turns this check off)")]
    JobOwnerUnavailable { job: String, reason: String },
    #[error("quota exceeded for uid {uid}: {} in use + {} asked > quota {}", format_bytes(*used_bytes), format_bytes(*asked_bytes), format_bytes(*quota_bytes))]
    QuotaExceeded { uid: u32, quota_bytes: u64, used_bytes: u64, asked_bytes: u64 },
    #[error(
        "uid {uid} already holds {count} reservations (knob manager.reservations_per_user_max)"
    )]
    TooManyReservations { uid: u32, count: u32 },
    #[error("no capacity: {reason}")]
    NoCapacity { reason: String },
    /// Within the pools' measured peaks, not with what is promised now (the job waits).
    #[error("targets not available now: {reason}")]
    TargetsBusy { reason: String },
    /// Beyond what any pool could give, or no pool's peaks are measured.
    #[error("targets cannot be met: {reason}")]
    TargetsUnmeetable { reason: String },
    /// The owner's promises would pass `manager.targets_user_share_percent_max` of the pool.
    #[error("{reason} (knob manager.targets_user_share_percent_max)")]
    TargetsShareExceeded { reason: String },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(CreateReservationError {
    Invalid => (400, "invalid"),
    NotAuthorized => (403, "not_authorized"),
    NoSuchPool => (404, "no_such_pool"),
    NameTaken => (409, "name_taken"),
    JobHasReservation => (409, "job_has_reservation"),
    NotJobOwner => (403, "not_job_owner"),
    UnknownJob => (404, "unknown_job"),
    JobOwnerUnavailable => (503, "job_owner_unavailable"),
    QuotaExceeded => (403, "quota_exceeded"),
    TooManyReservations => (403, "too_many_reservations"),
    NoCapacity => (507, "no_capacity"),
    TargetsBusy => (507, "targets_busy"),
    TargetsUnmeetable => (422, "targets_unmeetable"),
    TargetsShareExceeded => (403, "targets_share_exceeded"),
    Database => (500, "database"),
});

/// Why a reservation could not be looked up (`reservation show`, staging).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    #[error("no reservation {key:?} visible to uid {uid}")]
    NotFound { key: String, uid: u32 },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(LookupError { NotFound => (404, "not_found"), Database => (500, "database") });

/// Why `reservation destroy` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DestroyError {
    #[error("no active reservation {key:?} visible to uid {uid}")]
    NotFound { key: String, uid: u32 },
    #[error("uid {uid} may use but not destroy reservation {name:?} (owner uid {owner})")]
    NotAuthorized { uid: u32, name: String, owner: u32 },
    #[error("reservation {name:?} belongs to job {actual:?}, not job {given:?}")]
    JobMismatch { name: String, given: String, actual: Option<String> },
    #[error("reservation {name} is used by {jobs} (root may destroy it anyway with --force)")]
    InUse { name: String, jobs: String },
    #[error("uid {uid} may not force the destruction of reservation {name:?} (root only)")]
    ForceNotAuthorized { uid: u32, name: String },
    #[error("reservation {name} is a rescue reservation (its stage-out failed: {error}); job teardown keeps it: its owner finishes it with `spillway stage-out --retry {name}`")]
    RescueKept { name: String, error: String },
    #[error("reservation {name} is uid {owner}'s rescue reservation (its stage-out failed); only its owner may destroy it before {reclaimable_unix_s} (unix seconds; knob manager.rescue_expiry_s), root and admins from then on")]
    RescueNotExpired { name: String, owner: u32, reclaimable_unix_s: u64 },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(DestroyError {
    NotFound => (404, "not_found"),
    NotAuthorized => (403, "not_authorized"),
    JobMismatch => (409, "job_mismatch"),
    InUse => (409, "in_use"),
    ForceNotAuthorized => (403, "not_authorized"),
    RescueKept => (409, "rescue_kept"),
    RescueNotExpired => (409, "rescue_not_expired"),
    Database => (500, "database"),
});

/// Why `quota set` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    #[error("uid {uid} may not set quotas (root or the admin group only)")]
    NotAuthorized { uid: u32 },
    #[error("manager database: {source}")]
    Database {
        #[from]
        source: rusqlite::Error,
    },
}
api_error!(QuotaError { NotAuthorized => (403, "not_authorized"), Database => (500, "database") });

/// What one heartbeat learnt about a server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub drains_in_flight: u32,
    /// How the server authenticates TCP clients (`none`, `munge`), from its `Status`.
    pub auth: String,
    /// The server's id and incarnation (`<id> #<incarnation>`), from its `Status`.
    pub identity: String,
    /// The host it runs on (`server.failure_domain`), from its `Status`; `None` from a server
    /// that does not announce one.
    pub failure_domain: Option<String>,
    /// Payload bytes per epoch id it holds (`ListEpochs` as root), for the per-reservation
    /// bytes written; empty when the listing failed.
    pub epoch_bytes: BTreeMap<u64, u64>,
}

/// A reservation destroyed by [`Manager::destroy_reservation`]: the caller deletes its data.
#[derive(Clone, Debug)]
pub struct Destroyed {
    pub reservation: Reservation,
}

/// How much of the state a status answer shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusView {
    /// What the caller may see: every reservation for root and admins, their own and permitted
    /// ones for anyone else.
    Caller,
    /// Capacity only, whoever asks: pools and servers with capacity, used and free, and no
    /// reservation (what `scontrol show bbstat` shows when Slurm does not say who asks).
    Aggregate,
}

/// The control plane's state and operations.
pub struct Manager {
    pub(crate) db: Mutex<Db>,
    /// The cluster this manager's database is; every server it uses serves it.
    cluster_id: [u8; spillway_proto::CLUSTER_ID_BYTES],
    knobs: ManagerKnobs,
    admin_gid: Option<u32>,
    pub(crate) clock: Arc<dyn Clock>,
    /// Who owns a Slurm job; `None` when `manager.job_owner_check = "none"`.
    job_owners: Option<Arc<dyn JobOwners>>,
    /// Per pool id: BIOS Algorithm 1's table. Locked only while `db` is held.
    pub(crate) streams: Mutex<BTreeMap<u64, StreamTable>>,
    /// Per server id: what the last heartbeat saw.
    pub(crate) live: Mutex<BTreeMap<u64, Probe>>,
    /// Per reservation id: its re-replication since this manager started.
    repairs: Mutex<BTreeMap<u64, RepairProgress>>,
    /// IAS: jobs' phases, the shared tiers' load, drains' PFS slots (crate::tiering).
    pub(crate) tiers: Mutex<crate::tiering::TierBoard>,
    /// API requests' latency, for the metrics.
    pub(crate) api_latency: spillway_metrics::Histogram,
    /// Held from reading reservations to sending their grants (the heartbeat's re-grant) and
    /// from changing a reservation to sending its new grant or revoke (modify, destroy): the
    /// servers replace grants whole, so a heartbeat that read a reservation before a change
    /// must not deliver the old grant after the new one. Taken before `db`, and only through
    /// [`lock_within`] with [`GRANTS_WAIT_MAX`]: one hung server must not stall every change.
    pub(crate) grants: Mutex<()>,
}

/// `server add`'s candidate addresses as stored: `unix:…` and `IP:PORT` as given (a `tcp://`
/// prefix dropped), `HOST:PORT` resolved to every address of the host (the first that answers
/// is kept), so `localhost:7070` and `127.0.0.1:7070` are one server.
fn canonical_addresses(given: &str) -> Result<Vec<String>, AddServerError> {
    let text = given.strip_prefix("tcp://").unwrap_or(given);
    // `#` marks the address of a removed server's row (`<address>#removed-<id>`): an address
    // with one could collide with such a row.
    if text.contains('#') {
        let reason = format!("{given:?}: a server address may not contain '#' (rename the socket)");
        return Err(AddServerError::Invalid { reason });
    }
    if text.starts_with("unix:") || text.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(vec![text.to_string()]);
    }
    let invalid = |reason: String| AddServerError::Invalid { reason };
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| invalid(format!("{given:?}: expected HOST:PORT, IP:PORT or unix:/path")))?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(invalid(format!("{given:?}: expected HOST:PORT with a port number")));
    }
    use std::net::ToSocketAddrs;
    let mut resolved: Vec<String> = text
        .to_socket_addrs()
        .map_err(|e| invalid(format!("{given:?}: cannot resolve {host:?}: {e}")))?
        .map(|address| address.to_string())
        .collect();
    resolved.dedup();
    if resolved.is_empty() {
        return Err(invalid(format!("{given:?}: {host:?} resolves to no address")));
    }
    Ok(resolved)
}

/// A server as placement sees it: free bytes from the active reservations; a lost server, or one
/// being removed, is never healthy (it gets nothing new).
pub(crate) fn server_space(s: &ServerRow, used_per_server: &BTreeMap<u64, u64>) -> ServerSpace {
    ServerSpace {
        server: s.id,
        free_bytes: s
            .capacity_bytes
            .saturating_sub(used_per_server.get(&s.id).copied().unwrap_or(0)),
        healthy: s.healthy && s.lost_unix_s.is_none() && s.retiring_unix_s.is_none(),
        domain: s.failure_domain.clone(),
    }
}

/// Where a new reservation goes: the pool, its fragments, the rule that chose the pool, and the
/// plan when it asked by performance targets.
pub(crate) struct Placed {
    pool_id: u64,
    fragments: FragmentPlan,
    choice: PoolChoice,
    target_plan: Option<TargetPlan>,
}

/// Why one pool cannot take a request.
enum PoolRefusal {
    /// The request itself is wrong (the same in every pool).
    Invalid(String),
    /// Not in this pool, however long the request waits.
    Full(String),
    /// Not now: what is promised there must end first.
    Busy(String),
}

/// Every pool's refusal, for the error when none takes the request.
#[derive(Default)]
struct Refusals {
    full: Vec<String>,
    busy: Vec<String>,
}

impl Refusals {
    fn into_error(self, by_targets: bool) -> CreateReservationError {
        let reason = self.busy.iter().chain(&self.full).cloned().collect::<Vec<_>>().join("; ");
        match (by_targets, self.busy.is_empty()) {
            (true, false) => CreateReservationError::TargetsBusy { reason },
            (true, true) => CreateReservationError::TargetsUnmeetable { reason },
            (false, _) => CreateReservationError::NoCapacity { reason },
        }
    }
}

/// Names of pools and persistent reservations: 1–64 of `[A-Za-z0-9._-]`, not all digits (ids
/// are numbers), not `job-…`/`res-…` (generated names).
fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("{what} name {name:?} must be 1 to 64 characters"));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        return Err(format!(
            "{what} name {name:?} may contain only letters, digits, '.', '_' and '-'"
        ));
    }
    if name.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{what} name {name:?} is all digits (numbers are ids)"));
    }
    Ok(())
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock is a bug; the state behind it is the database, which the
    // aborted transaction left consistent, so going on is safe.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Longest a grant sender waits for [`Manager::grants`]. The client has no reply deadline, so a
/// server that accepts and hangs (stopped, wedged) can hold the lock's owner indefinitely; past
/// this wait a reservation change goes on without the lock (at worst the heartbeat re-sends a
/// stale grant, which its next round corrects) and the heartbeat skips a re-grant round.
pub(crate) const GRANTS_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(20);

/// `mutex`, if it can be had within `wait`; `None` past it.
pub(crate) fn lock_within<T>(
    mutex: &Mutex<T>,
    wait: std::time::Duration,
) -> Option<MutexGuard<'_, T>> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match mutex.try_lock() {
            Ok(guard) => return Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if std::time::Instant::now() >= deadline => {
                return None
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
        }
    }
}

impl Manager {
    /// Opens the manager on `db`, rebuilding the stream tables from the active reservations.
    pub fn new(
        db: Db,
        knobs: ManagerKnobs,
        admin_gid: Option<u32>,
        clock: Arc<dyn Clock>,
    ) -> Result<Manager, ReadError> {
        let job_owners: Option<Arc<dyn JobOwners>> = match knobs.job_owner_check {
            JobOwnerCheck::Slurm => Some(Arc::new(Squeue {
                timeout: std::time::Duration::from_millis(knobs.job_owner_timeout_ms),
            })),
            JobOwnerCheck::Unchecked => None,
        };
        let manager = Manager {
            cluster_id: db.cluster_id,
            db: Mutex::new(db),
            knobs,
            admin_gid,
            clock,
            job_owners,
            streams: Mutex::new(BTreeMap::new()),
            live: Mutex::new(BTreeMap::new()),
            repairs: Mutex::new(BTreeMap::new()),
            tiers: Mutex::new(crate::tiering::TierBoard::default()),
            api_latency: spillway_metrics::Histogram::default(),
            grants: Mutex::new(()),
        };
        manager.rebuild_streams()?;
        Ok(manager)
    }

    /// The same manager asking `job_owners` who owns a Slurm job (`None`: no check), instead of
    /// what `manager.job_owner_check` says; for tests that answer without Slurm.
    pub fn with_job_owners(mut self, job_owners: Option<Arc<dyn JobOwners>>) -> Manager {
        self.job_owners = job_owners;
        self
    }

    /// The cluster id of this manager's database (what its servers record on `JoinCluster`).
    pub fn cluster_id(&self) -> [u8; spillway_proto::CLUSTER_ID_BYTES] {
        self.cluster_id
    }

    pub fn knobs(&self) -> &ManagerKnobs {
        &self.knobs
    }

    /// The identity of a connection's peer.
    pub fn caller(&self, uid: u32, gid: u32) -> Caller {
        Caller::resolve(uid, gid, self.admin_gid)
    }

    fn stream_limits(&self) -> StreamTableLimits {
        StreamTableLimits {
            streams_max: self.knobs.streams_max,
            reclaim_check_every: self.knobs.stream_reclaim_check_every,
            idle_reclaim_after: self.knobs.stream_idle_reclaim_s,
        }
    }

    fn stream_key(&self, owner_uid: u32, epoch: u64) -> StreamKey {
        match self.knobs.stream_key {
            StreamKeyKind::User => StreamKey(owner_uid as u64),
            // The epoch is unique per reservation, so it names the job's reservation.
            StreamKeyKind::Job => StreamKey(epoch),
        }
    }

    fn rebuild_streams(&self) -> Result<(), ReadError> {
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let active = db::active_reservations(&tx)?;
        drop(tx);
        let mut streams = lock(&self.streams);
        streams.clear();
        for row in active {
            let table = streams
                .entry(row.pool_id)
                .or_insert_with(|| StreamTable::new(self.stream_limits()));
            let key = self.stream_key(row.owner_uid, row.epoch);
            if table.stream_of(key).is_some() || row.stream >= self.knobs.streams_max {
                continue; // shared key already registered, or streams_max lowered since
            }
            table.apply(&StreamDecision {
                key,
                stream: row.stream,
                registered: true,
                stream_was_idle: false,
                reclaimed: None,
                now: row.created_unix_s,
            });
        }
        Ok(())
    }

    pub fn whoami(&self, caller: &Caller) -> Whoami {
        Whoami { uid: caller.uid, gid: caller.gid, admin: caller.admin }
    }

    // ---- pools and servers ----

    pub fn create_pool(
        &self,
        caller: &Caller,
        request: &CreatePool,
    ) -> Result<Pool, CreatePoolError> {
        if !caller.admin {
            return Err(CreatePoolError::NotAuthorized { uid: caller.uid });
        }
        check_name("pool", &request.name).map_err(|reason| CreatePoolError::Invalid { reason })?;
        if request.granularity_bytes == 0 || request.granularity_bytes > i64::MAX as u64 {
            return Err(CreatePoolError::Invalid {
                reason: format!("granularity of {} bytes", request.granularity_bytes),
            });
        }
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        if db::pools(&tx)?.iter().any(|p| p.name == request.name) {
            return Err(CreatePoolError::Exists { name: request.name.clone() });
        }
        db::insert_pool(&tx, &request.name, request.granularity_bytes, self.clock.now_unix_s())?;
        tx.commit()?;
        drop(db);
        tracing::info!(pool = %request.name, granularity_bytes = request.granularity_bytes, uid = caller.uid, "pool created");
        Ok(self
            .list_pools(caller)?
            .into_iter()
            .find(|p| p.name == request.name)
            .expect("pool just committed"))
    }

    pub fn add_server(
        &self,
        caller: &Caller,
        request: &AddServer,
    ) -> Result<Server, AddServerError> {
        if !caller.admin {
            return Err(AddServerError::NotAuthorized { uid: caller.uid });
        }
        let endpoint: spillway_proto::Endpoint =
            request.address.parse().map_err(|reason| AddServerError::Invalid { reason })?;
        // Servers on other hosts are reached with munge credentials (`manager.munge_socket`);
        // only an address that names no single host is refused.
        if let spillway_proto::Endpoint::Tcp(address) = endpoint {
            let ip = address.ip();
            let broadcast = matches!(ip, std::net::IpAddr::V4(v4) if v4.is_broadcast());
            if ip.is_unspecified() || ip.is_multicast() || broadcast || address.port() == 0 {
                return Err(AddServerError::Invalid {
                    reason: format!("{address} is not the address of one server (unspecified, multicast or broadcast address, or port 0)"),
                });
            }
        }
        if request.capacity_bytes == 0 || request.capacity_bytes > i64::MAX as u64 {
            return Err(AddServerError::Invalid {
                reason: format!("capacity of {} bytes", request.capacity_bytes),
            });
        }
        if let Some(dir) = &request.pfs_dir {
            if !dir.starts_with('/') {
                return Err(AddServerError::Invalid {
                    reason: format!("PFS directory {dir:?} is not absolute"),
                });
            }
        }
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let pool = db::pools(&tx)?
            .into_iter()
            .find(|p| p.name == request.pool)
            .ok_or_else(|| AddServerError::NoSuchPool { pool: request.pool.clone() })?;
        if db::servers(&tx)?.iter().any(|s| s.address == request.address) {
            return Err(AddServerError::Exists { address: request.address.clone() });
        }
        db::insert_server(
            &tx,
            &request.address,
            pool.id,
            request.capacity_bytes,
            request.pfs_dir.as_deref(),
        )?;
        tx.commit()?;
        drop(db);
        tracing::info!(server = %request.address, pool = %request.pool, capacity_bytes = request.capacity_bytes, "server added");
        Ok(self
            .list_servers()?
            .into_iter()
            .find(|s| s.address == request.address)
            .expect("server just committed"))
    }

    /// `server add` as the API runs it: the address canonicalized (a host name resolved, so
    /// one server is never registered under two spellings), the server asked who it is and how
    /// big its store is (`identify`), then registered with at most that capacity (0: all of it).
    /// Only admins get as far as the connection.
    pub fn add_server_probed(
        &self,
        caller: &Caller,
        request: &AddServer,
        identify: &dyn Fn(&str) -> Result<crate::heartbeat::ServerFacts, String>,
    ) -> Result<Server, AddServerError> {
        if !caller.admin {
            return Err(AddServerError::NotAuthorized { uid: caller.uid });
        }
        let mut failures = Vec::new();
        let mut answered = None;
        for address in canonical_addresses(&request.address)? {
            match identify(&address) {
                Ok(facts) => {
                    answered = Some((address, facts));
                    break;
                }
                Err(error) => failures.push(format!("{address}: {error}")),
            }
        }
        let Some((address, facts)) = answered else {
            return Err(AddServerError::Unreachable {
                address: request.address.clone(),
                error: failures.join("; "),
            });
        };
        if facts.cluster_id != self.cluster_id {
            return Err(AddServerError::OtherCluster {
                address,
                serves: spillway_proto::cluster_id_hex(&facts.cluster_id),
                ours: spillway_proto::cluster_id_hex(&self.cluster_id),
            });
        }
        let capacity_bytes = match request.capacity_bytes {
            0 => facts.ssd_bytes_max,
            asked if asked > facts.ssd_bytes_max => {
                return Err(AddServerError::Invalid {
                    reason: format!(
                        "capacity {} is more than the server's store holds ({}, its store.ssd_bytes_max); give at most that, or leave --capacity out",
                        spillway_types::format_bytes(asked),
                        spillway_types::format_bytes(facts.ssd_bytes_max)
                    ),
                })
            }
            asked => asked,
        };
        let same = format!("{} #", facts.server_id);
        let known = self.list_servers()?;
        let live = lock(&self.live);
        if let Some(existing) = known
            .iter()
            .find(|s| live.get(&s.id).is_some_and(|probe| probe.identity.starts_with(&same)))
        {
            return Err(AddServerError::SameServer {
                address,
                existing: existing.address.clone(),
                server_id: facts.server_id,
            });
        }
        drop(live);
        self.add_server(caller, &AddServer { address, capacity_bytes, ..request.clone() })
    }

    fn snapshot(
        &self,
        db: &mut Db,
    ) -> rusqlite::Result<(Vec<PoolRow>, Vec<ServerRow>, Vec<ReservationRow>)> {
        let tx = db.conn.transaction()?;
        let snapshot = (db::pools(&tx)?, db::servers(&tx)?, db::active_reservations(&tx)?);
        tx.commit()?;
        Ok(snapshot)
    }

    pub(crate) fn used_per_server(active: &[ReservationRow]) -> BTreeMap<u64, u64> {
        let mut used = BTreeMap::new();
        for row in active {
            for &(server, fragments) in &row.placement {
                // Fragments count every copy: a replicated reservation takes k times the space.
                *used.entry(server).or_insert(0) += fragments * row.fragment_bytes;
            }
        }
        used
    }

    /// Every pool with its capacity, used and free bytes. Root and admins also see how many
    /// reservations it holds and the keys per stream; anyone else sees only the reservations it
    /// may see counted, and no stream keys (they describe other users' activity).
    pub fn list_pools(&self, caller: &Caller) -> Result<Vec<Pool>, ReadError> {
        let (pools, servers, active) = self.snapshot(&mut lock(&self.db))?;
        let used = Self::used_per_server(&active);
        let streams = lock(&self.streams);
        let visible: Vec<&ReservationRow> =
            active.iter().filter(|r| Self::can_see(caller, r)).collect();
        let pools = pools.iter().map(|pool| {
            let members: Vec<&ServerRow> =
                servers.iter().filter(|s| s.pool_id == pool.id).collect();
            let capacity: u64 = members.iter().map(|s| s.capacity_bytes).sum();
            let used_bytes: u64 =
                members.iter().map(|s| used.get(&s.id).copied().unwrap_or(0)).sum();
            Pool {
                id: pool.id,
                name: pool.name.clone(),
                granularity_bytes: pool.granularity_bytes,
                servers: members.len() as u64,
                servers_healthy: members.iter().filter(|s| s.healthy).count() as u64,
                capacity_bytes: capacity,
                used_bytes,
                free_bytes: capacity.saturating_sub(used_bytes),
                reservations: visible.iter().filter(|r| r.pool_id == pool.id).count() as u64,
                keys_per_stream: streams
                    .get(&pool.id)
                    .map(|t| t.keys_per_stream())
                    .unwrap_or_else(|| vec![0; self.knobs.streams_max as usize]),
            }
        });
        Ok(pools.map(|pool| Self::pool_as_seen_by(caller, pool)).collect())
    }

    pub fn list_servers(&self) -> Result<Vec<Server>, ReadError> {
        let (pools, servers, active) = self.snapshot(&mut lock(&self.db))?;
        let used = Self::used_per_server(&active);
        let promised = crate::targets::promised_per_server(&active);
        let live = lock(&self.live);
        Ok(servers
            .iter()
            .map(|s| Server {
                promised: promised.get(&s.id).copied(),
                ..Self::server_model(s, &pools, &used, live.get(&s.id))
            })
            .collect())
    }

    /// The API view of a server row, with its use and what its last heartbeat said.
    pub(crate) fn server_model(
        s: &ServerRow,
        pools: &[PoolRow],
        used_per_server: &BTreeMap<u64, u64>,
        probe: Option<&Probe>,
    ) -> Server {
        Server {
            id: s.id,
            address: s.address.clone(),
            pool: pools
                .iter()
                .find(|p| p.id == s.pool_id)
                .map(|p| p.name.clone())
                .unwrap_or_default(),
            capacity_bytes: s.capacity_bytes,
            used_bytes: used_per_server.get(&s.id).copied().unwrap_or(0),
            pfs_dir: s.pfs_dir.clone(),
            healthy: s.healthy,
            misses: s.misses,
            last_seen_unix_s: s.last_seen_unix_s,
            drains_in_flight: probe.map(|p| p.drains_in_flight).unwrap_or(0),
            auth: probe.map(|p| p.auth.clone()).filter(|a| !a.is_empty()),
            identity: probe.map(|p| p.identity.clone()).filter(|i| !i.is_empty()),
            failure_domain: s.failure_domain.clone(),
            lost_unix_s: s.lost_unix_s,
            retiring_unix_s: s.retiring_unix_s,
            peaks: s.peaks.clone(),
            promised: None,
        }
    }

    // ---- reservations ----

    pub(crate) fn can_see(caller: &Caller, row: &ReservationRow) -> bool {
        caller.admin
            || row.owner_uid == caller.uid
            || (row.persistent
                && (row.allowed_uids.contains(&caller.uid)
                    || row.allowed_gids.iter().any(|&g| caller.in_group(g))))
    }

    pub(crate) fn quota_of(
        &self,
        tx: &rusqlite::Transaction<'_>,
        uid: u32,
    ) -> rusqlite::Result<(u64, bool)> {
        Ok(match db::quotas(tx)?.into_iter().find(|&(u, _)| u == uid) {
            Some((_, bytes)) => (bytes, false),
            None => (self.knobs.quota_bytes_default, true),
        })
    }

    pub fn create_reservation(
        &self,
        caller: &Caller,
        request: &CreateReservation,
    ) -> Result<Reservation, CreateReservationError> {
        let (owner_uid, owner_gid) = Self::validate_reservation_request(caller, request)?;
        // Asked before the database lock is taken: Slurm may take up to its timeout.
        self.check_job_owner(caller, request, owner_uid)?;
        let now = self.clock.now_unix_s();

        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let pools = db::pools(&tx)?;
        let servers = db::servers(&tx)?;
        let active = db::active_reservations(&tx)?;

        let name = Self::check_name_and_job(&tx, request, &active)?;
        self.check_count_and_quota(&tx, request, owner_uid, &active)?;
        let Placed { pool_id, fragments: plan, choice, target_plan } =
            self.choose_pool(request, owner_uid, &pools, &servers, &active)?;
        let access = self.check_target_plan(
            &tx,
            request,
            (owner_uid, pool_id),
            (&servers, &active),
            target_plan.as_ref(),
        )?;

        // Identifiers and stream.
        let epoch = db::take_counter(&tx, "next_epoch")?;
        let namespace_id = db::take_counter(&tx, "next_namespace_id")?;
        let key = self.stream_key(owner_uid, epoch);
        let mut streams = lock(&self.streams);
        let table =
            streams.entry(pool_id).or_insert_with(|| StreamTable::new(self.stream_limits()));
        let decision = table.decide(key, now);

        let mut row = ReservationRow {
            id: 0,
            name: name.clone().unwrap_or_else(|| format!("pending-{epoch}")),
            owner_uid,
            owner_gid,
            job_id: request.job.clone(),
            persistent: request.persistent.is_some(),
            requested_bytes: request.capacity_bytes,
            fragment_bytes: self.knobs.fragment_bytes,
            fragments: plan.fragments,
            pool_id,
            access,
            epoch,
            namespace_id,
            stream: decision.stream,
            state: ReservationState::Active,
            created_unix_s: now,
            allowed_uids: request.allowed_uids.clone(),
            allowed_gids: request.allowed_gids.clone(),
            placement: plan.per_server.clone(),
            jobs: Vec::new(),
            rescue: None,
            replicas: plan.replicas,
            tiering: request.tiering,
            achieved: None,
            targets: target_plan.as_ref().map(|plan| crate::targets::row_of(request, plan)),
        };
        Self::persist_reservation(&tx, &mut row, name.is_none())?;
        if request.dry_run {
            // Dropping the transaction rolls back the row and the counters it took.
            drop(tx);
            row.id = 0;
            return Ok(row.to_model(&pools, &servers));
        }
        tx.commit()?;
        table.apply(&decision);
        drop(streams);
        drop(db);
        tracing::info!(
            reservation = row.id, name = %row.name, owner = owner_uid, pool = pool_id, rule = ?choice,
            fragments = plan.fragments, servers = plan.per_server.len(), stream = decision.stream, epoch,
            "reservation created"
        );
        Ok(row.to_model(&pools, &servers))
    }

    /// The namespace mode of a new reservation: asked for, or (by performance targets) what the
    /// plan chose, which an explicit `access` must agree with. A plan by targets may take more
    /// fragments than the capacity asked for: the quota is checked again against them; and its
    /// promises must leave the owner within `targets_user_share_percent_max` of the pool.
    fn check_target_plan(
        &self,
        tx: &rusqlite::Transaction<'_>,
        request: &CreateReservation,
        (owner_uid, pool_id): (u32, u64),
        (servers, active): (&[ServerRow], &[ReservationRow]),
        plan: Option<&TargetPlan>,
    ) -> Result<Access, CreateReservationError> {
        let Some(plan) = plan else { return Ok(request.access.unwrap_or(Access::Striped)) };
        let planned = match plan.namespace {
            spillway_policy::namespace::NamespaceAccess::Striped => Access::Striped,
            spillway_policy::namespace::NamespaceAccess::Private => Access::Private,
        };
        if request.access.is_some_and(|asked| asked != planned) {
            return Err(CreateReservationError::Invalid {
                reason: format!(
                    "access={} cannot meet these targets: {} (leave access out, or change metadata=)",
                    request.access.map_or("", Access::as_str),
                    plan.why.join("; ")
                ),
            });
        }
        self.check_quota(tx, owner_uid, active, plan.fragments.raw_bytes())?;
        if owner_uid != 0 {
            let share = self.knobs.targets_user_share_percent_max;
            crate::targets::check_user_share(owner_uid, pool_id, share, servers, active, plan)
                .map_err(|reason| CreateReservationError::TargetsShareExceeded { reason })?;
        }
        Ok(planned)
    }

    /// Checks the request itself (capacity, owner, names, job id, allowed lists): owner uid, gid.
    fn validate_reservation_request(
        caller: &Caller,
        request: &CreateReservation,
    ) -> Result<(u32, u32), CreateReservationError> {
        let invalid = |reason: String| CreateReservationError::Invalid { reason };
        // By performance targets alone, the plan's fragments are the capacity.
        let capacity_needed = !request.targets().has_rates();
        if (request.capacity_bytes == 0 && capacity_needed)
            || request.capacity_bytes > i64::MAX as u64 / 8
        {
            return Err(invalid(format!("capacity of {} bytes", request.capacity_bytes)));
        }
        let replicas = request.replicas.unwrap_or(1);
        if !(1..=REPLICAS_MAX).contains(&replicas) {
            return Err(invalid(format!(
                "replicas={replicas}: a reservation keeps 1 to {REPLICAS_MAX} copies"
            )));
        }
        let owner = Self::reservation_owner(caller, request)?;
        if let Some(name) = &request.persistent {
            check_name("reservation", name).map_err(invalid)?;
            if name.starts_with("job-") || name.starts_with("res-") {
                return Err(invalid(format!(
                    "reservation name {name:?} uses a reserved prefix (job-, res-)"
                )));
            }
        }
        if let Some(job) = &request.job {
            if job.is_empty()
                || job.len() > 64
                || !job.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            {
                return Err(invalid(format!("job id {job:?} must be 1 to 64 of [A-Za-z0-9._-]")));
            }
        }
        let max = spillway_types::GRANT_ALLOWED_IDS_MAX;
        if request.allowed_uids.len() > max || request.allowed_gids.len() > max {
            // The servers' grants hold at most this many of each.
            return Err(invalid(format!("more than {max} allowed uids or gids")));
        }
        Ok(owner)
    }

    /// A reservation for Slurm job N is for N's owner: unless root asks (the Slurm hooks do),
    /// Slurm is asked who owns the job and the reservation's owner must be that uid, whoever
    /// asks — an admin too (a SlurmUser other than root, in the admin group, passes: it reserves
    /// for the uid Slurm gave it). When Slurm cannot be asked, the request is refused too
    /// (`manager.job_owner_check = "none"` turns this off).
    fn check_job_owner(
        &self,
        caller: &Caller,
        request: &CreateReservation,
        owner_uid: u32,
    ) -> Result<(), CreateReservationError> {
        let (Some(job), Some(job_owners)) = (&request.job, &self.job_owners) else {
            return Ok(());
        };
        if caller.uid == 0 {
            return Ok(());
        }
        if !job.bytes().all(|b| b.is_ascii_digit()) {
            return Err(CreateReservationError::Invalid {
                reason: format!(
                    "job id {job:?} is not a Slurm job id (digits only; Slurm is asked who owns it)"
                ),
            });
        }
        match job_owners.owner_of(job) {
            Ok(owner) if owner == owner_uid => Ok(()),
            Ok(owner) => Err(CreateReservationError::NotJobOwner { job: job.clone(), owner }),
            Err(JobOwnerError::UnknownJob { .. }) => {
                Err(CreateReservationError::UnknownJob { job: job.clone() })
            }
            Err(JobOwnerError::Unavailable { reason }) => {
                Err(CreateReservationError::JobOwnerUnavailable { job: job.clone(), reason })
            }
        }
    }

    /// The owner's uid and gid: the caller's unless given (another uid by root or admins only).
    fn reservation_owner(
        caller: &Caller,
        request: &CreateReservation,
    ) -> Result<(u32, u32), CreateReservationError> {
        let invalid = |reason: String| CreateReservationError::Invalid { reason };
        Ok(match (request.owner, request.group) {
            (None, None) => (caller.uid, caller.gid),
            (Some(owner), group) => {
                if owner != caller.uid && !caller.admin {
                    return Err(CreateReservationError::NotAuthorized { uid: caller.uid, owner });
                }
                match group {
                    Some(group) => (owner, group),
                    None if owner == caller.uid => (owner, caller.gid),
                    None => {
                        return Err(invalid(format!(
                            "owner {owner} given without its group (--group GID)"
                        )))
                    }
                }
            }
            (None, Some(group)) => {
                if group != caller.gid && !caller.in_group(group) && !caller.admin {
                    return Err(invalid(format!("uid {} is not in group {group}", caller.uid)));
                }
                (caller.uid, group)
            }
        })
    }

    /// Names and jobs: the name must be free, and a job holds one reservation at a time.
    fn check_name_and_job(
        tx: &rusqlite::Transaction<'_>,
        request: &CreateReservation,
        active: &[ReservationRow],
    ) -> Result<Option<String>, CreateReservationError> {
        let name = match (&request.persistent, &request.job) {
            (Some(name), _) => Some(name.clone()),
            (None, Some(job)) => Some(format!("job-{job}")),
            (None, None) => None,
        };
        if let Some(name) = &name {
            if active.iter().any(|r| &r.name == name) {
                return Err(CreateReservationError::NameTaken { name: name.clone() });
            }
        }
        if let Some(job) = &request.job {
            if request.persistent.is_none() {
                if let Some(id) = db::reservation_of_job(tx, job)? {
                    return Err(CreateReservationError::JobHasReservation { job: job.clone(), id });
                }
            }
        }
        Ok(name)
    }

    /// Quota and count: the owner stays within `reservations_per_user_max` and its quota.
    fn check_count_and_quota(
        &self,
        tx: &rusqlite::Transaction<'_>,
        request: &CreateReservation,
        owner_uid: u32,
        active: &[ReservationRow],
    ) -> Result<(), CreateReservationError> {
        let mine: Vec<&ReservationRow> =
            active.iter().filter(|r| r.owner_uid == owner_uid).collect();
        if mine.len() as u64 >= self.knobs.reservations_per_user_max as u64 {
            return Err(CreateReservationError::TooManyReservations {
                uid: owner_uid,
                count: mine.len() as u32,
            });
        }
        let fragment_bytes = self.knobs.fragment_bytes;
        // Quotas count the space taken on the servers: every copy.
        let replicas = request.replicas.unwrap_or(1) as u64;
        let granted = request.capacity_bytes.div_ceil(fragment_bytes) * fragment_bytes * replicas;
        self.check_quota(tx, owner_uid, active, granted)
    }

    /// Refuses `asked` more bytes on the servers (every copy) past `owner_uid`'s quota.
    fn check_quota(
        &self,
        tx: &rusqlite::Transaction<'_>,
        owner_uid: u32,
        active: &[ReservationRow],
        asked: u64,
    ) -> Result<(), CreateReservationError> {
        let used: u64 =
            active.iter().filter(|r| r.owner_uid == owner_uid).map(|r| r.raw_bytes()).sum();
        let (quota, _) = self.quota_of(tx, owner_uid)?;
        if quota != 0 && used + asked > quota {
            return Err(CreateReservationError::QuotaExceeded {
                uid: owner_uid,
                quota_bytes: quota,
                used_bytes: used,
                asked_bytes: asked,
            });
        }
        Ok(())
    }

    /// Chooses the pool and the fragments; returns them, the rule that chose the pool and,
    /// for a request by performance targets, the plan that chose the servers.
    fn choose_pool(
        &self,
        request: &CreateReservation,
        owner_uid: u32,
        pools: &[PoolRow],
        servers: &[ServerRow],
        active: &[ReservationRow],
    ) -> Result<Placed, CreateReservationError> {
        // Placement: pools that can hold it, then Algorithm 2 among them, then fragments.
        let candidates: Vec<&PoolRow> = match &request.pool {
            Some(name) => vec![pools
                .iter()
                .find(|p| &p.name == name)
                .ok_or_else(|| CreateReservationError::NoSuchPool { pool: name.clone() })?],
            None => pools.iter().collect(),
        };
        if candidates.is_empty() {
            return Err(CreateReservationError::NoCapacity { reason: "no pools exist".into() });
        }
        let mut fitting = Vec::new();
        let mut refusals = Refusals::default();
        for pool in &candidates {
            match self.place_in_pool(request, pool, servers, active) {
                Ok(placed) => fitting.push((pool.id, placed)),
                Err(PoolRefusal::Invalid(reason)) => {
                    return Err(CreateReservationError::Invalid { reason })
                }
                Err(PoolRefusal::Full(reason)) => refusals.full.push(reason),
                Err(PoolRefusal::Busy(reason)) => refusals.busy.push(reason),
            }
        }
        let states: Vec<PoolState> = fitting
            .iter()
            .map(|(pool, _)| PoolState {
                pool: *pool as u32,
                running_job_users: active
                    .iter()
                    .filter(|r| r.pool_id == *pool)
                    .map(|r| StreamKey(r.owner_uid as u64))
                    .collect(),
            })
            .collect();
        let Some(choice) = select_pool(&states, StreamKey(owner_uid as u64)) else {
            return Err(refusals.into_error(request.targets().has_rates()));
        };
        let (pool_id, (fragments, target_plan)) = fitting
            .into_iter()
            .find(|(p, _)| *p as u32 == choice.pool())
            .expect("chosen among fitting");
        Ok(Placed { pool_id, fragments, choice, target_plan })
    }

    /// The fragments of `request` in `pool`: by capacity alone, `fragments::allocate`; by
    /// performance targets, `targets::plan` over the pool's measured and promised servers.
    fn place_in_pool(
        &self,
        request: &CreateReservation,
        pool: &PoolRow,
        servers: &[ServerRow],
        active: &[ReservationRow],
    ) -> Result<(FragmentPlan, Option<TargetPlan>), PoolRefusal> {
        let used_per_server = Self::used_per_server(active);
        let pool_servers: Vec<&ServerRow> =
            servers.iter().filter(|s| s.pool_id == pool.id).collect();
        let replicas = request.replicas.unwrap_or(1);
        let targets = request.targets();
        if !targets.has_rates() {
            let space: Vec<ServerSpace> =
                pool_servers.iter().map(|s| server_space(s, &used_per_server)).collect();
            let fragment_request = FragmentRequest {
                capacity_bytes: request.capacity_bytes,
                fragment_bytes: self.knobs.fragment_bytes,
                stripe_servers_max: self.knobs.stripe_servers_max,
                replicas,
            };
            return match allocate(&space, fragment_request) {
                Ok(plan) => Ok((plan, None)),
                Err(FragmentError::ZeroCapacity) => {
                    Err(PoolRefusal::Invalid("capacity of 0 bytes".into()))
                }
                Err(error) => Err(PoolRefusal::Full(format!("pool {}: {error}", pool.name))),
            };
        }
        if !pool_servers.iter().any(|s| s.peaks.is_some()) {
            return Err(PoolRefusal::Full(format!(
                "pool {}: no server's peaks are measured (root: `spillway server measure --pool {}`)",
                pool.name, pool.name
            )));
        }
        let promised = crate::targets::promised_per_server(active);
        let loads = crate::targets::loads(&pool_servers, &used_per_server, &promised);
        let target_request = TargetRequest {
            targets,
            fragment_bytes: self.knobs.fragment_bytes,
            stripe_servers_max: self.knobs.stripe_servers_max,
            replicas,
        };
        match target_plan(&loads, &target_request) {
            Ok(plan) => Ok((plan.fragments.clone(), Some(plan))),
            Err(error @ TargetError::Wait { .. }) => {
                Err(PoolRefusal::Busy(format!("pool {}: {error}", pool.name)))
            }
            Err(error @ (TargetError::NoTarget | TargetError::ZeroTarget { .. })) => {
                Err(PoolRefusal::Invalid(error.to_string()))
            }
            Err(TargetError::Placement(FragmentError::ZeroCapacity)) => {
                Err(PoolRefusal::Invalid("capacity of 0 bytes".into()))
            }
            Err(error) => Err(PoolRefusal::Full(format!("pool {}: {error}", pool.name))),
        }
    }

    /// The API view of `row`; when it is degraded, with the server that would replace its first
    /// lost server (`policy::fragments::choose_replacement`: same pool, the lost server's
    /// domain or, if it was alone on it, one the reservation does not use; room for the lost
    /// server's fragments).
    fn model_with_repair(
        &self,
        row: &ReservationRow,
        pools: &[PoolRow],
        servers: &[ServerRow],
        active: &[ReservationRow],
    ) -> Reservation {
        let mut model = row.to_model(pools, servers);
        model.repair = lock(&self.repairs).get(&row.id).cloned();
        let Some(degraded) = model.degraded.as_mut() else { return model };
        let lost =
            row.placement.iter().enumerate().find(|(_, (id, _))| {
                servers.iter().any(|s| s.id == *id && s.lost_unix_s.is_some())
            });
        let Some((index, &(lost_id, lost_fragments))) = lost else { return model };
        let used = Self::used_per_server(active);
        let pool: Vec<ServerSpace> = servers
            .iter()
            .filter(|s| s.pool_id == row.pool_id)
            .map(|s| server_space(s, &used))
            .collect();
        let list: Vec<u64> = row.placement.iter().map(|&(id, _)| id).collect();
        let lost_domain =
            servers.iter().find(|s| s.id == lost_id).and_then(|s| s.failure_domain.as_deref());
        let needed = lost_fragments * row.fragment_bytes;
        let replacement = choose_replacement(&pool, &list, index, lost_domain, needed);
        degraded.replacement = replacement
            .and_then(|id| servers.iter().find(|s| s.id == id))
            .map(|s| s.address.clone());
        if degraded.replacement.is_none() {
            degraded.detail.push_str(&format!(
                "; no replacement: no healthy server of pool {} outside the reservation, on host {} or a host it does not use, has {} free",
                model.pool,
                lost_domain.unwrap_or("?"),
                format_bytes(needed),
            ));
        }
        model
    }

    /// Persists the new reservation's row; gives it its id and, if it has no name, `res-<id>`.
    fn persist_reservation(
        tx: &rusqlite::Transaction<'_>,
        row: &mut ReservationRow,
        generated_name: bool,
    ) -> Result<(), CreateReservationError> {
        let id = db::insert_reservation(tx, row)?;
        row.id = id;
        if generated_name {
            row.name = format!("res-{id}");
            db::rename_reservation(tx, id, &row.name)?;
        }
        Ok(())
    }

    pub fn list_reservations(
        &self,
        caller: &Caller,
        all: bool,
    ) -> Result<Vec<Reservation>, ReadError> {
        let (pools, servers, active) = self.snapshot(&mut lock(&self.db))?;
        Ok(active
            .iter()
            .filter(|r| Self::can_see(caller, r))
            // Root and admins see everything with `--all`, only their own without it.
            .filter(|r| !caller.admin || all || r.owner_uid == caller.uid)
            .map(|r| self.model_with_repair(r, &pools, &servers, &active))
            .collect())
    }

    pub fn show_reservation(&self, caller: &Caller, key: &str) -> Result<Reservation, LookupError> {
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let row = db::find_reservation(&tx, key)?;
        let (pools, servers) = (db::pools(&tx)?, db::servers(&tx)?);
        let active = db::active_reservations(&tx)?;
        match row {
            Some(row) if Self::can_see(caller, &row) => {
                Ok(self.model_with_repair(&row, &pools, &servers, &active))
            }
            _ => Err(LookupError::NotFound { key: key.to_string(), uid: caller.uid }),
        }
    }

    /// Marks the reservation destroyed (its capacity is free at once). The caller then deletes
    /// its data on the servers ([`crate::retire_reservation_data`]: grant revoked, epoch
    /// deleted). A persistent reservation that Slurm jobs use is refused unless root passes
    /// `force`.
    pub fn destroy_reservation(
        &self,
        caller: &Caller,
        key: &str,
        job: Option<&str>,
        force: bool,
    ) -> Result<Destroyed, DestroyError> {
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let row = db::find_reservation(&tx, key)?
            .filter(|r| r.state == ReservationState::Active && Self::can_see(caller, r))
            .ok_or_else(|| DestroyError::NotFound { key: key.to_string(), uid: caller.uid })?;
        Self::check_destroy(caller, &row, job, force)?;
        Self::check_rescue_destroy(caller, &row, job, self.clock.now_unix_s())?;
        db::mark_destroyed(&tx, row.id, self.clock.now_unix_s())?;
        let (pools, servers) = (db::pools(&tx)?, db::servers(&tx)?);
        tx.commit()?;
        let mut reservation = row.to_model(&pools, &servers);
        reservation.state = ReservationState::Destroyed;
        reservation.jobs.clear();
        tracing::info!(reservation = row.id, name = %row.name, uid = caller.uid, force, jobs = ?row.jobs, "reservation destroyed");
        Ok(Destroyed { reservation })
    }

    /// Records what the servers of destroyed reservation `id` saw of its epoch (the revokes'
    /// replies at teardown); returns the record.
    pub fn record_achieved(
        &self,
        id: u64,
        seen: &[spillway_proto::EpochActivity],
    ) -> Result<Achieved, ReadError> {
        let achieved = Achieved::of(seen, self.clock.now_unix_s());
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        db::set_achieved(&tx, id, &achieved)?;
        tx.commit()?;
        Ok(achieved)
    }

    /// May `caller` destroy `row` now: its owner or an admin, the right job (teardown's check),
    /// and no job using it unless root forces (only root: forcing pulls a reservation from
    /// under running jobs, which the admin group's delegated management should not do).
    fn check_destroy(
        caller: &Caller,
        row: &ReservationRow,
        job: Option<&str>,
        force: bool,
    ) -> Result<(), DestroyError> {
        if !caller.admin && row.owner_uid != caller.uid {
            return Err(DestroyError::NotAuthorized {
                uid: caller.uid,
                name: row.name.clone(),
                owner: row.owner_uid,
            });
        }
        if let Some(job) = job {
            if !row.persistent && row.job_id.as_deref() != Some(job) {
                return Err(DestroyError::JobMismatch {
                    name: row.name.clone(),
                    given: job.to_string(),
                    actual: row.job_id.clone(),
                });
            }
        }
        if force && caller.uid != 0 {
            return Err(DestroyError::ForceNotAuthorized {
                uid: caller.uid,
                name: row.name.clone(),
            });
        }
        if !row.jobs.is_empty() && !force {
            let jobs = match row.jobs.as_slice() {
                [one] => format!("job {one}"),
                many => format!("jobs {}", many.join(", ")),
            };
            return Err(DestroyError::InUse { name: row.name.clone(), jobs });
        }
        Ok(())
    }

    /// A rescue reservation (its stage-out failed) survives its job: teardown (a destroy naming
    /// the job) never destroys it; its owner may (giving the data up, or after `stage-out
    /// --retry` copied it); anyone else (root and admins, forced or not) only once it is
    /// reclaimable.
    fn check_rescue_destroy(
        caller: &Caller,
        row: &ReservationRow,
        job: Option<&str>,
        now_unix_s: u64,
    ) -> Result<(), DestroyError> {
        let Some(rescue) = &row.rescue else { return Ok(()) };
        if job.is_some() {
            return Err(DestroyError::RescueKept {
                name: row.name.clone(),
                error: rescue.error.clone(),
            });
        }
        if caller.uid != row.owner_uid && now_unix_s < rescue.reclaimable_unix_s {
            return Err(DestroyError::RescueNotExpired {
                name: row.name.clone(),
                owner: row.owner_uid,
                reclaimable_unix_s: rescue.reclaimable_unix_s,
            });
        }
        Ok(())
    }

    /// Declares a server (by id or address) lost for good: it gets no new fragments, heartbeats
    /// no longer mark it up, and every reservation on it shows `degraded`. Declaring it again
    /// changes nothing.
    pub fn declare_server_lost(
        &self,
        caller: &Caller,
        key: &str,
    ) -> Result<Server, LostServerError> {
        if !caller.admin {
            return Err(LostServerError::NotAuthorized { uid: caller.uid });
        }
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let server = db::servers(&tx)?
            .into_iter()
            .find(|s| s.address == key || key.parse::<u64>() == Ok(s.id))
            .ok_or_else(|| LostServerError::NotFound { key: key.to_string() })?;
        db::mark_server_lost(&tx, server.id, self.clock.now_unix_s())?;
        tx.commit()?;
        drop(db);
        lock(&self.live).remove(&server.id);
        tracing::warn!(server = %server.address, uid = caller.uid, "server declared lost");
        Ok(self.list_servers()?.into_iter().find(|s| s.id == server.id).expect("server row exists"))
    }

    // ---- re-replication ----

    /// The degraded reservations re-replication can restore now, by id: replicated (k ≥ 2),
    /// active, exactly one server of the list lost (with more, which ranges the first held is
    /// ambiguous; they stay degraded), and a replacement that qualifies.
    pub fn repair_jobs(&self) -> Result<Vec<RepairJob>, ReadError> {
        let (pools, servers, active) = self.snapshot(&mut lock(&self.db))?;
        let is_lost = |id: u64| servers.iter().any(|s| s.id == id && s.lost_unix_s.is_some());
        let mut jobs = Vec::new();
        for row in active.iter().filter(|r| r.replicas >= 2) {
            let lost: Vec<usize> =
                (0..row.placement.len()).filter(|&i| is_lost(row.placement[i].0)).collect();
            let [lost_index] = lost[..] else { continue };
            let model = self.model_with_repair(row, &pools, &servers, &active);
            let Some(replacement) = model.degraded.as_ref().and_then(|d| d.replacement.clone())
            else {
                continue;
            };
            let Some(replacement_server) =
                servers.iter().find(|s| s.address == replacement).map(|s| s.id)
            else {
                continue;
            };
            jobs.push(RepairJob {
                reservation: model,
                lost_index,
                lost_server: row.placement[lost_index].0,
                replacement_server,
                replacement,
            });
        }
        Ok(jobs)
    }

    /// Records that a reservation's re-replication (re)starts: nothing copied yet.
    pub fn start_repair(&self, reservation: u64, lost: &str, replacement: &str) {
        lock(&self.repairs).insert(
            reservation,
            RepairProgress {
                state: "copying".into(),
                lost: lost.to_string(),
                replacement: replacement.to_string(),
                copied_bytes: 0,
                total_bytes: 0,
                error: None,
            },
        );
    }

    /// Changes a reservation's re-replication progress (no entry: nothing).
    pub fn update_repair(&self, reservation: u64, change: impl FnOnce(&mut RepairProgress)) {
        if let Some(progress) = lock(&self.repairs).get_mut(&reservation) {
            change(progress);
        }
    }

    /// Puts `replacement` at `index` of the reservation's server list in place of `lost`, in
    /// one transaction; refused if the reservation is no longer active or the index no longer
    /// names `lost`.
    pub fn replace_server(
        &self,
        reservation: u64,
        index: usize,
        lost: u64,
        replacement: u64,
    ) -> Result<(), LookupError> {
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let active = db::find_reservation(&tx, &reservation.to_string())?
            .is_some_and(|r| r.state == ReservationState::Active);
        if !active || !db::replace_fragment_server(&tx, reservation, index, lost, replacement)? {
            return Err(LookupError::NotFound { key: reservation.to_string(), uid: 0 });
        }
        tx.commit()?;
        tracing::info!(reservation, index, lost, replacement, "replacement server swapped in");
        Ok(())
    }

    // ---- quotas ----

    pub fn set_quota(
        &self,
        caller: &Caller,
        uid: u32,
        request: &SetQuota,
    ) -> Result<Quota, QuotaError> {
        if !caller.admin {
            return Err(QuotaError::NotAuthorized { uid: caller.uid });
        }
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        db::set_quota(&tx, uid, request.bytes.min(i64::MAX as u64))?;
        tx.commit()?;
        drop(db);
        Ok(self.quotas(caller)?.into_iter().find(|q| q.uid == uid).expect("quota row just written"))
    }

    /// The caller's quota, or every quota row (plus the caller's) for root and admins.
    pub fn quotas(&self, caller: &Caller) -> Result<Vec<Quota>, ReadError> {
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let rows = db::quotas(&tx)?;
        let active = db::active_reservations(&tx)?;
        let used =
            |uid: u32| active.iter().filter(|r| r.owner_uid == uid).map(|r| r.raw_bytes()).sum();
        let mut out: Vec<Quota> = rows
            .iter()
            .filter(|&&(uid, _)| caller.admin || uid == caller.uid)
            .map(|&(uid, bytes)| Quota { uid, bytes, used_bytes: used(uid), default: false })
            .collect();
        if !out.iter().any(|q| q.uid == caller.uid) {
            out.push(Quota {
                uid: caller.uid,
                bytes: self.knobs.quota_bytes_default,
                used_bytes: used(caller.uid),
                default: true,
            });
        }
        Ok(out)
    }

    // ---- health ----

    /// Addresses of every server not lost, for the heartbeat (a lost host may not even
    /// refuse connections: probing it would only slow every round down).
    pub fn server_addresses(&self) -> Result<Vec<(u64, String)>, ReadError> {
        Ok(self
            .list_servers()?
            .into_iter()
            .filter(|s| s.lost_unix_s.is_none())
            .map(|s| (s.id, s.address))
            .collect())
    }

    /// Records one heartbeat round: `Ok` probes reset the miss count and mark the server up,
    /// errors count a miss; `heartbeat_misses_max` consecutive misses mark it down. Only rows
    /// whose state changed are written.
    pub fn record_heartbeats(
        &self,
        results: &[(u64, Result<Probe, String>)],
    ) -> Result<(), ReadError> {
        let now = self.clock.now_unix_s();
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let servers = db::servers(&tx)?;
        let mut live = lock(&self.live);
        for (id, result) in results {
            let Some(server) = servers.iter().find(|s| s.id == *id) else { continue };
            if server.lost_unix_s.is_some() {
                // Lost for good: whatever answers there now holds none of its data.
                continue;
            }
            match result {
                Ok(probe) => {
                    if let Some(domain) = &probe.failure_domain {
                        db::set_server_domain(&tx, *id, domain)?;
                    }
                    live.insert(*id, probe.clone());
                    if !server.healthy {
                        tracing::info!(server = %server.address, "server is up again");
                    }
                    // last_seen is written at most once per misses/health change, or every
                    // round when the server was seen — cheap (a few rows) and useful in status.
                    db::set_server_health(&tx, *id, true, 0, Some(now))?;
                }
                Err(problem) => {
                    live.remove(id);
                    let misses = server.misses.saturating_add(1);
                    let healthy = misses < self.knobs.heartbeat_misses_max;
                    if server.healthy && !healthy {
                        tracing::warn!(server = %server.address, misses, %problem, "server marked down");
                    }
                    db::set_server_health(&tx, *id, healthy, misses, None)?;
                    if !healthy && self.down_too_long(server, now) {
                        tracing::warn!(server = %server.address, after_s = self.knobs.server_lost_after_s, %problem, "server down too long: declared lost");
                        db::mark_server_lost(&tx, *id, now)?;
                    }
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Bytes each active reservation holds on its servers by the last heartbeats (its epoch's
    /// payload bytes, summed over the servers that answered), by reservation id.
    pub fn written_bytes(&self) -> Result<BTreeMap<u64, u64>, ReadError> {
        let (_, _, active) = self.snapshot(&mut lock(&self.db))?;
        let live = lock(&self.live);
        Ok(active
            .iter()
            .map(|r| {
                let on = |server: &u64| live.get(server).and_then(|p| p.epoch_bytes.get(&r.epoch));
                (r.id, r.placement.iter().filter_map(|(server, _)| on(server)).sum())
            })
            .collect())
    }

    /// Whether a down server has now been unseen for `manager.server_lost_after_s` (0: never
    /// automatically). A server never seen is not declared lost: it never held data.
    fn down_too_long(&self, server: &ServerRow, now: u64) -> bool {
        let after = self.knobs.server_lost_after_s;
        after > 0 && server.last_seen_unix_s.is_some_and(|seen| now.saturating_sub(seen) >= after)
    }

    /// Pools, servers, totals and, in the caller's view, the reservations it may see.
    pub fn status(&self, caller: &Caller, view: StatusView) -> Result<Status, ReadError> {
        let pools = self.list_pools(caller)?;
        let servers = self.list_servers()?;
        let (reservations, ended_by_targets) = match view {
            StatusView::Caller => {
                (self.list_reservations(caller, true)?, self.ended_by_targets(caller)?)
            }
            StatusView::Aggregate => (Vec::new(), Vec::new()),
        };
        let pools = match view {
            StatusView::Caller => pools,
            StatusView::Aggregate => pools.into_iter().map(Self::aggregate_pool).collect(),
        };
        let capacity_bytes = servers.iter().map(|s| s.capacity_bytes).sum();
        let used_bytes = servers.iter().map(|s| s.used_bytes).sum();
        let drains_in_flight = servers.iter().map(|s| s.drains_in_flight as u64).sum();
        Ok(Status {
            pools,
            servers,
            reservations,
            ended_by_targets,
            capacity_bytes,
            used_bytes,
            free_bytes: capacity_bytes.saturating_sub(used_bytes),
            drains_in_flight,
        })
    }

    /// The latest ended reservations by targets that `caller` may see.
    fn ended_by_targets(&self, caller: &Caller) -> Result<Vec<Reservation>, ReadError> {
        let mut db = lock(&self.db);
        let tx = db.conn.transaction()?;
        let ended = db::ended_by_targets(&tx, crate::model::ENDED_BY_TARGETS_SHOWN)?;
        let (pools, servers) = (db::pools(&tx)?, db::servers(&tx)?);
        Ok(ended
            .iter()
            .filter(|r| Self::can_see(caller, r))
            .map(|r| r.to_model(&pools, &servers))
            .collect())
    }

    /// The pool as `caller` may see it: without stream keys unless root or admin.
    fn pool_as_seen_by(caller: &Caller, pool: Pool) -> Pool {
        if caller.admin {
            pool
        } else {
            Pool { keys_per_stream: Vec::new(), ..pool }
        }
    }

    /// A pool's capacity only: no reservation count, no stream keys.
    fn aggregate_pool(pool: Pool) -> Pool {
        Pool { reservations: 0, keys_per_stream: Vec::new(), ..pool }
    }
}

#[cfg(test)]
mod lock_tests {
    use super::*;

    #[test]
    fn lock_within_gives_up_on_a_held_lock_and_takes_a_free_one() {
        let mutex = Mutex::new(());
        let held = mutex.lock().unwrap();
        assert!(lock_within(&mutex, std::time::Duration::from_millis(50)).is_none());
        drop(held);
        assert!(lock_within(&mutex, std::time::Duration::from_millis(50)).is_some());
    }
}

#[cfg(test)]
mod address_tests {
    use super::*;

    #[test]
    fn addresses_are_canonical_and_never_look_like_a_removed_row() {
        assert_eq!(canonical_addresses("tcp://127.0.0.1:7070").unwrap(), ["127.0.0.1:7070"]);
        assert_eq!(canonical_addresses("unix:/run/s.sock").unwrap(), ["unix:/run/s.sock"]);
        // A removed server's row keeps `<address>#removed-<id>`: adding that address collided
        // with the row (a database error, HTTP 500) before it was refused.
        let error = canonical_addresses("unix:/run/s.sock#removed-3").unwrap_err();
        assert!(matches!(error, AddServerError::Invalid { .. }), "{error}");
        assert!(error.to_string().contains("may not contain '#'"), "{error}");
        assert!(canonical_addresses("127.0.0.1").is_err());
    }
}
