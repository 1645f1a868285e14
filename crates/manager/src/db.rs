//! The manager's state in an embedded SQLite database: schema, migrations and row mapping.
//!
//! SQLite because the state is small, relational (servers belong to pools, fragments to
//! reservations and servers) and must survive a crash with every change atomic: each operation
//! of [`crate::service`] runs in one transaction, the journal is WAL with `synchronous=FULL`, and
//! foreign keys are enforced. The schema is versioned with `PRAGMA user_version`; [`Db::open`]
//! creates or migrates it and refuses a database newer than this binary. Only this module writes
//! SQL; the schema is documented in docs/design/manager.md.
//!
//! The database holds every user's reservations, so it is private to the manager: the file (and
//! SQLite's `-wal` and `-shm` beside it, which SQLite creates with the database file's mode) is
//! created `0600`, and an existing one with broader bits is narrowed when opened.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension, Transaction};

use crate::model::{
    Access, Achieved, Degraded, Rescue, Reservation, ReservationState, ServerPeaks, StageOutPair,
    TargetsRecord,
};

/// The schema this binary writes.
pub const SCHEMA_VERSION: i64 = 8;

/// Permission bits of the database file and its `-wal`/`-shm` companions.
pub const DATABASE_FILE_MODE: u32 = 0o600;

/// Permission bits of a database directory the manager creates.
const DATABASE_DIRECTORY_MODE: u32 = 0o700;

const SCHEMA_V1: &str = "
CREATE TABLE pools (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    granularity_bytes INTEGER NOT NULL CHECK (granularity_bytes > 0),
    created_unix_s INTEGER NOT NULL
);
CREATE TABLE servers (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    address TEXT NOT NULL UNIQUE,
    pool_id INTEGER NOT NULL REFERENCES pools(id),
    capacity_bytes INTEGER NOT NULL CHECK (capacity_bytes > 0),
    pfs_dir TEXT,
    healthy INTEGER NOT NULL DEFAULT 1,
    misses INTEGER NOT NULL DEFAULT 0,
    last_seen_unix_s INTEGER
);
CREATE TABLE reservations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    owner_uid INTEGER NOT NULL,
    owner_gid INTEGER NOT NULL,
    job_id TEXT,
    persistent INTEGER NOT NULL,
    requested_bytes INTEGER NOT NULL,
    fragment_bytes INTEGER NOT NULL,
    fragments INTEGER NOT NULL,
    pool_id INTEGER NOT NULL REFERENCES pools(id),
    access TEXT NOT NULL CHECK (access IN ('striped', 'private')),
    epoch INTEGER NOT NULL UNIQUE,
    namespace_id INTEGER NOT NULL UNIQUE,
    stream INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('active', 'destroyed')),
    created_unix_s INTEGER NOT NULL,
    destroyed_unix_s INTEGER,
    allowed_uids TEXT NOT NULL DEFAULT '[]',
    allowed_gids TEXT NOT NULL DEFAULT '[]'
);
CREATE UNIQUE INDEX reservations_active_name ON reservations(name) WHERE state = 'active';
CREATE UNIQUE INDEX reservations_active_job ON reservations(job_id)
    WHERE state = 'active' AND job_id IS NOT NULL;
CREATE TABLE fragments (
    reservation_id INTEGER NOT NULL REFERENCES reservations(id),
    stripe_index INTEGER NOT NULL,
    server_id INTEGER NOT NULL REFERENCES servers(id),
    fragments INTEGER NOT NULL CHECK (fragments > 0),
    PRIMARY KEY (reservation_id, stripe_index)
);
CREATE TABLE quotas (
    uid INTEGER PRIMARY KEY,
    bytes INTEGER NOT NULL
);
CREATE TABLE counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO counters (name, value) VALUES ('next_epoch', 1), ('next_namespace_id', 1);
";

/// Version 2: the Slurm jobs using each persistent reservation (registered by the setup hook,
/// removed by teardown), so a reservation in use is not destroyed under a running job.
const SCHEMA_V2: &str = "
CREATE TABLE reservation_jobs (
    reservation_id INTEGER NOT NULL REFERENCES reservations(id),
    job_id TEXT NOT NULL,
    registered_unix_s INTEGER NOT NULL,
    PRIMARY KEY (reservation_id, job_id)
);
";

/// Version 3: rescue reservations. A job reservation whose stage-out failed is kept with the
/// error, when it became a rescue, from when root or an admin may reclaim it, and the job's
/// stage-outs (JSON `[{"src":…,"dst":…}]`) that `stage-out --retry` redoes.
const SCHEMA_V3: &str = "
ALTER TABLE reservations ADD COLUMN rescue_error TEXT;
ALTER TABLE reservations ADD COLUMN rescue_since_unix_s INTEGER;
ALTER TABLE reservations ADD COLUMN rescue_reclaimable_unix_s INTEGER;
ALTER TABLE reservations ADD COLUMN rescue_stage_outs TEXT;
";

/// Version 4: replication. Each server's failure domain (its host, from its `Status` heartbeat;
/// NULL until one answered) and when it was declared lost for good (NULL: not lost); each
/// reservation's replica count (copies of every byte, on distinct failure domains).
const SCHEMA_V4: &str = "
ALTER TABLE servers ADD COLUMN failure_domain TEXT;
ALTER TABLE servers ADD COLUMN lost_unix_s INTEGER;
ALTER TABLE reservations ADD COLUMN replicas INTEGER NOT NULL DEFAULT 1 CHECK (replicas BETWEEN 1 AND 4);
";

/// Version 5: tiering. The strategy a reservation's jobs' phases are scheduled with
/// (docs/design/ias.md; NULL: the site's default, `manager.tiering_default`).
const SCHEMA_V5: &str = "
ALTER TABLE reservations ADD COLUMN tiering TEXT;
";

/// Version 6: retiring, and the cluster id. The id is drawn once, when the database is made (or
/// migrated), and every server the manager adds records it (`JoinCluster`): a server that
/// serves another database's cluster is refused, so a wiped database never hands out epoch ids
/// its servers hold under other owners.
/// Retiring: A server being removed (`server remove`: no new fragments, removed once
/// no active reservation holds any) and removed; a deleted pool. Removed and deleted rows stay,
/// because destroyed reservations' rows refer to them, but their address or name is freed (see
/// [`mark_server_removed`]) and they are no longer listed.
const SCHEMA_V6: &str = "
ALTER TABLE servers ADD COLUMN retiring_unix_s INTEGER;
ALTER TABLE servers ADD COLUMN removed_unix_s INTEGER;
ALTER TABLE pools ADD COLUMN deleted_unix_s INTEGER;
CREATE TABLE cluster (
    id TEXT NOT NULL CHECK (length(id) = 32)
);
";

/// Version 7: each server's measured peaks (`spillway server measure`: `spillway bench peaks`
/// against that server alone), what allocation by performance target divides
/// (docs/design/targets.md), NULL until measured; and each destroyed reservation's achieved
/// I/O (JSON `Achieved`, from its servers' counts at teardown), NULL until recorded; and a
/// reservation by performance targets' targets, per-server promises (by server id) and reasons
/// (JSON `TargetsRow`), NULL for one by capacity alone.
const SCHEMA_V7: &str = "
ALTER TABLE servers ADD COLUMN peak_bandwidth_bytes_per_s INTEGER;
ALTER TABLE servers ADD COLUMN peak_iops INTEGER;
ALTER TABLE servers ADD COLUMN peak_metadata_ops_per_s INTEGER;
ALTER TABLE servers ADD COLUMN peaks_measured_unix_s INTEGER;
ALTER TABLE servers ADD COLUMN peaks_conditions TEXT;
ALTER TABLE reservations ADD COLUMN achieved TEXT;
ALTER TABLE reservations ADD COLUMN targets TEXT;
";

/// Version 8: each server's metadata peaks per namespace mode (through the namespace service:
/// every thread in one striped namespace, or one private namespace each), NULL when measured
/// before version 8 or by someone who may not create namespaces: `peak_metadata_ops_per_s`
/// then stands for both modes.
const SCHEMA_V8: &str = "
ALTER TABLE servers ADD COLUMN peak_metadata_striped_ops_per_s INTEGER;
ALTER TABLE servers ADD COLUMN peak_metadata_private_ops_per_s INTEGER;
";

/// Why the database could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("cannot create the directory of database {path}: {source}")]
    Directory { path: String, source: std::io::Error },
    #[error("database {path}: {source}")]
    Sqlite { path: String, source: rusqlite::Error },
    #[error("database {path} has schema version {found}, newer than this binary's {supported}")]
    TooNew { path: String, found: i64, supported: i64 },
    #[error("cannot draw the cluster id from getrandom: {0}")]
    Random(String),
    #[error("database {path}: its cluster id {found:?} is not 32 hex digits")]
    BadClusterId { path: String, found: String },
    #[error("cannot make database file {path} private (mode {mode:o}): {source}")]
    Mode { path: String, mode: u32, source: std::io::Error },
}

/// The open database.
pub struct Db {
    pub(crate) conn: Connection,
    /// The cluster this database is (see `SCHEMA_V6`).
    pub(crate) cluster_id: [u8; spillway_proto::CLUSTER_ID_BYTES],
}

impl Db {
    /// Opens (creating or migrating) the database at `path`; `:memory:` for tests. The file and
    /// its `-wal`/`-shm` are made [`DATABASE_FILE_MODE`] before SQLite opens them.
    pub fn open(path: &Path) -> Result<Db, OpenError> {
        let name = path.display().to_string();
        let sqlite = |source| OpenError::Sqlite { path: name.clone(), source };
        if path != Path::new(":memory:") {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(DATABASE_DIRECTORY_MODE)
                    .create(parent)
                    .map_err(|source| OpenError::Directory { path: name.clone(), source })?;
            }
            make_private(path)?;
        }
        let mut conn = Connection::open(path).map_err(sqlite)?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(sqlite)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(sqlite)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(sqlite)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(sqlite)?;
        let version: i64 =
            conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(sqlite)?;
        if version > SCHEMA_VERSION {
            return Err(OpenError::TooNew {
                path: name,
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        let tx = conn.transaction().map_err(sqlite)?;
        if version < 1 {
            tx.execute_batch(SCHEMA_V1).map_err(sqlite)?;
        }
        if version < 2 {
            tx.execute_batch(SCHEMA_V2).map_err(sqlite)?;
        }
        if version < 3 {
            tx.execute_batch(SCHEMA_V3).map_err(sqlite)?;
        }
        if version < 4 {
            tx.execute_batch(SCHEMA_V4).map_err(sqlite)?;
        }
        if version < 5 {
            tx.execute_batch(SCHEMA_V5).map_err(sqlite)?;
        }
        if version < 6 {
            tx.execute_batch(SCHEMA_V6).map_err(sqlite)?;
            let mut id = [0u8; spillway_proto::CLUSTER_ID_BYTES];
            getrandom::getrandom(&mut id).map_err(|e| OpenError::Random(e.to_string()))?;
            tx.execute(
                "INSERT INTO cluster (id) VALUES (?1)",
                params![spillway_proto::cluster_id_hex(&id)],
            )
            .map_err(sqlite)?;
        }
        if version < 7 {
            tx.execute_batch(SCHEMA_V7).map_err(sqlite)?;
        }
        if version < 8 {
            tx.execute_batch(SCHEMA_V8).map_err(sqlite)?;
        }
        tx.pragma_update(None, "user_version", SCHEMA_VERSION).map_err(sqlite)?;
        let found: String =
            tx.query_row("SELECT id FROM cluster", [], |r| r.get(0)).map_err(sqlite)?;
        let cluster_id = spillway_proto::parse_cluster_id(&found)
            .ok_or(OpenError::BadClusterId { path: name.clone(), found })?;
        tx.commit().map_err(sqlite)?;
        Ok(Db { conn, cluster_id })
    }
}

/// Creates the database file with [`DATABASE_FILE_MODE`] if missing, and narrows the mode of an
/// existing one and of its `-wal`/`-shm` (SQLite gives those the database file's mode when it
/// creates them, so a private database file keeps them private too).
fn make_private(path: &Path) -> Result<(), OpenError> {
    let mode_error = |path: &Path, source| OpenError::Mode {
        path: path.display().to_string(),
        mode: DATABASE_FILE_MODE,
        source,
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(DATABASE_FILE_MODE)
        .open(path)
        .map_err(|source| mode_error(path, source))?;
    for suffix in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{}{suffix}", path.display()));
        let metadata = match std::fs::metadata(&file) {
            Ok(metadata) => metadata,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(mode_error(&file, source)),
        };
        if metadata.permissions().mode() & 0o777 != DATABASE_FILE_MODE {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(DATABASE_FILE_MODE))
                .map_err(|source| mode_error(&file, source))?;
        }
    }
    Ok(())
}

/// A pool row.
#[derive(Clone, Debug)]
pub struct PoolRow {
    pub id: u64,
    pub name: String,
    pub granularity_bytes: u64,
}

/// A server row.
#[derive(Clone, Debug)]
pub struct ServerRow {
    pub id: u64,
    pub address: String,
    pub pool_id: u64,
    pub capacity_bytes: u64,
    pub pfs_dir: Option<String>,
    pub healthy: bool,
    pub misses: u32,
    pub last_seen_unix_s: Option<u64>,
    /// Its host, from its heartbeats; `None` until one answered.
    pub failure_domain: Option<String>,
    /// When it was declared lost for good; `None`: not lost.
    pub lost_unix_s: Option<u64>,
    /// Since when `server remove` is retiring it (no new fragments); `None`: in service.
    pub retiring_unix_s: Option<u64>,
    /// Its measured peaks; `None` until `spillway server measure` recorded them.
    pub peaks: Option<ServerPeaks>,
}

/// A reservation row plus its fragments.
#[derive(Clone, Debug)]
pub struct ReservationRow {
    pub id: u64,
    pub name: String,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub job_id: Option<String>,
    pub persistent: bool,
    pub requested_bytes: u64,
    pub fragment_bytes: u64,
    pub fragments: u64,
    pub pool_id: u64,
    pub access: Access,
    pub epoch: u64,
    pub namespace_id: u64,
    pub stream: u16,
    pub state: ReservationState,
    pub created_unix_s: u64,
    pub allowed_uids: Vec<u32>,
    pub allowed_gids: Vec<u32>,
    /// `(server id, fragments)` in stripe order.
    pub placement: Vec<(u64, u64)>,
    /// The Slurm jobs registered as using this (persistent) reservation, in job id order.
    pub jobs: Vec<String>,
    /// Kept because the job's stage-out failed.
    pub rescue: Option<Rescue>,
    /// Copies of every byte, on distinct failure domains.
    pub replicas: u32,
    /// The tiering strategy its jobs ask for (`None`: the site's default).
    pub tiering: Option<spillway_policy::Strategy>,
    /// Recorded at teardown.
    pub achieved: Option<Achieved>,
    /// A reservation by performance targets.
    pub targets: Option<TargetsRow>,
}

/// What a reservation by targets asked and promised, as stored (promises by server id: they
/// are what other requests' headroom is computed from).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TargetsRow {
    pub asked: spillway_policy::targets::Targets,
    pub promised: Vec<(u64, spillway_policy::targets::Rates)>,
    pub why: Vec<String>,
}

impl ReservationRow {
    /// Capacity granted to the user: one copy's fragments.
    pub fn granted_bytes(&self) -> u64 {
        self.fragments / self.replicas.max(1) as u64 * self.fragment_bytes
    }

    /// Bytes taken on the servers: every copy (what quotas and free space count).
    pub fn raw_bytes(&self) -> u64 {
        self.fragments * self.fragment_bytes
    }

    /// The API view, with server addresses and the pool name resolved.
    pub fn to_model(&self, pools: &[PoolRow], servers: &[ServerRow]) -> Reservation {
        let server = |id: u64| servers.iter().find(|s| s.id == id);
        Reservation {
            id: self.id,
            name: self.name.clone(),
            owner: self.owner_uid,
            group: self.owner_gid,
            job: self.job_id.clone(),
            persistent: self.persistent,
            capacity_bytes: self.granted_bytes(),
            requested_bytes: self.requested_bytes,
            fragments: self.fragments,
            fragment_bytes: self.fragment_bytes,
            servers: self
                .placement
                .iter()
                .map(|&(id, _)| {
                    server(id).map(|s| s.address.clone()).unwrap_or_else(|| format!("server-{id}"))
                })
                .collect(),
            server_fragments: self.placement.iter().map(|&(_, f)| f).collect(),
            server_pfs_dirs: self
                .placement
                .iter()
                .map(|&(id, _)| server(id).and_then(|s| s.pfs_dir.clone()))
                .collect(),
            pool: pools
                .iter()
                .find(|p| p.id == self.pool_id)
                .map(|p| p.name.clone())
                .unwrap_or_else(|| format!("pool-{}", self.pool_id)),
            access: self.access,
            epoch: self.epoch,
            namespace_id: self.namespace_id,
            stream: self.stream,
            state: self.state,
            created_unix_s: self.created_unix_s,
            allowed_uids: self.allowed_uids.clone(),
            allowed_gids: self.allowed_gids.clone(),
            jobs: self.jobs.clone(),
            rescue: self.rescue.clone(),
            replicas: self.replicas,
            tiering: self.tiering,
            server_domains: self
                .placement
                .iter()
                .map(|&(id, _)| server(id).and_then(|s| s.failure_domain.clone()))
                .collect(),
            degraded: self.degraded(servers),
            repair: None,
            achieved: self.achieved.clone(),
            targets: self.targets.as_ref().map(|t| TargetsRecord {
                asked: t.asked,
                promised: self
                    .placement
                    .iter()
                    .map(|&(id, _)| {
                        t.promised
                            .iter()
                            .find(|(s, _)| *s == id)
                            .map(|&(_, r)| r)
                            .unwrap_or_default()
                    })
                    .collect(),
                why: t.why.clone(),
            }),
        }
    }

    /// The degraded state when any of its servers is lost (without a replacement: the service
    /// fills that in, it needs the pool's free space).
    fn degraded(&self, servers: &[ServerRow]) -> Option<Degraded> {
        let lost: Vec<&ServerRow> = self
            .placement
            .iter()
            .filter_map(|&(id, _)| servers.iter().find(|s| s.id == id))
            .filter(|s| s.lost_unix_s.is_some())
            .collect();
        if lost.is_empty() || self.state != ReservationState::Active {
            return None;
        }
        // Every replica set has `replicas` distinct servers, so at worst all lost ones are in one.
        let replicas_left = self.replicas.saturating_sub(lost.len() as u32);
        let detail = if replicas_left == 0 {
            "data not yet drained that only the lost servers held is gone (the drain reports which files and ranges)".to_string()
        } else {
            format!("at least {replicas_left} of {} copies of every byte remain", self.replicas)
        };
        Some(Degraded {
            lost_servers: lost.iter().map(|s| s.address.clone()).collect(),
            replicas_left,
            replacement: None,
            detail,
        })
    }
}

pub fn pools(tx: &Transaction<'_>) -> rusqlite::Result<Vec<PoolRow>> {
    let mut statement = tx.prepare_cached(
        "SELECT id, name, granularity_bytes FROM pools WHERE deleted_unix_s IS NULL ORDER BY id",
    )?;
    let rows = statement.query_map([], |r| {
        Ok(PoolRow {
            id: r.get::<_, i64>(0)? as u64,
            name: r.get(1)?,
            granularity_bytes: r.get::<_, i64>(2)? as u64,
        })
    })?;
    rows.collect()
}

pub fn insert_pool(
    tx: &Transaction<'_>,
    name: &str,
    granularity_bytes: u64,
    now_unix_s: u64,
) -> rusqlite::Result<u64> {
    tx.execute(
        "INSERT INTO pools (name, granularity_bytes, created_unix_s) VALUES (?1, ?2, ?3)",
        params![name, granularity_bytes as i64, now_unix_s as i64],
    )?;
    Ok(tx.last_insert_rowid() as u64)
}

pub fn servers(tx: &Transaction<'_>) -> rusqlite::Result<Vec<ServerRow>> {
    let mut statement = tx.prepare_cached(
        "SELECT id, address, pool_id, capacity_bytes, pfs_dir, healthy, misses, last_seen_unix_s, failure_domain, lost_unix_s, retiring_unix_s, \
         peak_bandwidth_bytes_per_s, peak_iops, peak_metadata_ops_per_s, peaks_measured_unix_s, peaks_conditions, \
         peak_metadata_striped_ops_per_s, peak_metadata_private_ops_per_s \
         FROM servers WHERE removed_unix_s IS NULL ORDER BY id",
    )?;
    let rows = statement.query_map([], |r| {
        Ok(ServerRow {
            id: r.get::<_, i64>(0)? as u64,
            address: r.get(1)?,
            pool_id: r.get::<_, i64>(2)? as u64,
            capacity_bytes: r.get::<_, i64>(3)? as u64,
            pfs_dir: r.get(4)?,
            healthy: r.get::<_, i64>(5)? != 0,
            misses: r.get::<_, i64>(6)? as u32,
            last_seen_unix_s: r.get::<_, Option<i64>>(7)?.map(|v| v as u64),
            failure_domain: r.get(8)?,
            lost_unix_s: r.get::<_, Option<i64>>(9)?.map(|v| v as u64),
            retiring_unix_s: r.get::<_, Option<i64>>(10)?.map(|v| v as u64),
            peaks: peaks_of_row(r)?,
        })
    })?;
    rows.collect()
}

/// Columns 11–17 of the `servers` query: 11–14 all set, or none (never measured); 16 and 17
/// (per namespace mode) only from a measurement through the namespace service.
fn peaks_of_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Option<ServerPeaks>> {
    let (Some(bandwidth), Some(iops), Some(metadata), Some(measured)) = (
        r.get::<_, Option<i64>>(11)?,
        r.get::<_, Option<i64>>(12)?,
        r.get::<_, Option<i64>>(13)?,
        r.get::<_, Option<i64>>(14)?,
    ) else {
        return Ok(None);
    };
    Ok(Some(ServerPeaks {
        bandwidth_bytes_per_s: bandwidth as u64,
        iops: iops as u64,
        metadata_ops_per_s: metadata as u64,
        measured_unix_s: measured as u64,
        conditions: r.get::<_, Option<String>>(15)?.unwrap_or_default(),
        metadata_striped_ops_per_s: r.get::<_, Option<i64>>(16)?.map(|v| v as u64),
        metadata_private_ops_per_s: r.get::<_, Option<i64>>(17)?.map(|v| v as u64),
    }))
}

pub fn set_server_peaks(
    tx: &Transaction<'_>,
    id: u64,
    peaks: &ServerPeaks,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE servers SET peak_bandwidth_bytes_per_s = ?2, peak_iops = ?3, \
         peak_metadata_ops_per_s = ?4, peaks_measured_unix_s = ?5, peaks_conditions = ?6, \
         peak_metadata_striped_ops_per_s = ?7, peak_metadata_private_ops_per_s = ?8 WHERE id = ?1",
        params![
            id as i64,
            peaks.bandwidth_bytes_per_s as i64,
            peaks.iops as i64,
            peaks.metadata_ops_per_s as i64,
            peaks.measured_unix_s as i64,
            peaks.conditions,
            peaks.metadata_striped_ops_per_s.map(|v| v as i64),
            peaks.metadata_private_ops_per_s.map(|v| v as i64),
        ],
    )?;
    Ok(())
}

pub fn insert_server(
    tx: &Transaction<'_>,
    address: &str,
    pool_id: u64,
    capacity_bytes: u64,
    pfs_dir: Option<&str>,
) -> rusqlite::Result<u64> {
    tx.execute(
        "INSERT INTO servers (address, pool_id, capacity_bytes, pfs_dir) VALUES (?1, ?2, ?3, ?4)",
        params![address, pool_id as i64, capacity_bytes as i64, pfs_dir],
    )?;
    Ok(tx.last_insert_rowid() as u64)
}

pub fn set_server_health(
    tx: &Transaction<'_>,
    id: u64,
    healthy: bool,
    misses: u32,
    last_seen_unix_s: Option<u64>,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE servers SET healthy = ?2, misses = ?3, last_seen_unix_s = COALESCE(?4, last_seen_unix_s) WHERE id = ?1",
        params![id as i64, healthy as i64, misses as i64, last_seen_unix_s.map(|v| v as i64)],
    )?;
    Ok(())
}

/// Records the failure domain a server's heartbeat announced (unchanged: no write).
pub fn set_server_domain(tx: &Transaction<'_>, id: u64, domain: &str) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE servers SET failure_domain = ?2 WHERE id = ?1 AND failure_domain IS NOT ?2",
        params![id as i64, domain],
    )?;
    Ok(())
}

/// Puts `replacement` in the place of `lost` at `stripe_index` of a reservation's placement;
/// whether that row still named `lost` (else nothing changed).
pub fn replace_fragment_server(
    tx: &Transaction<'_>,
    reservation: u64,
    stripe_index: usize,
    lost: u64,
    replacement: u64,
) -> rusqlite::Result<bool> {
    let changed = tx.execute(
        "UPDATE fragments SET server_id = ?4 WHERE reservation_id = ?1 AND stripe_index = ?2 AND server_id = ?3",
        params![reservation as i64, stripe_index as i64, lost as i64, replacement as i64],
    )?;
    Ok(changed == 1)
}

/// Declares a server lost for good (already lost: the first time is kept).
pub fn mark_server_lost(tx: &Transaction<'_>, id: u64, now_unix_s: u64) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE servers SET lost_unix_s = ?2, healthy = 0 WHERE id = ?1 AND lost_unix_s IS NULL",
        params![id as i64, now_unix_s as i64],
    )?;
    Ok(())
}

/// Starts retiring a server (already retiring: the first time is kept).
pub fn mark_server_retiring(
    tx: &Transaction<'_>,
    id: u64,
    now_unix_s: u64,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE servers SET retiring_unix_s = ?2 WHERE id = ?1 AND retiring_unix_s IS NULL",
        params![id as i64, now_unix_s as i64],
    )?;
    Ok(())
}

/// Removes a server: it is no longer listed, and its address is free for another `server add`
/// (the row keeps `<address>#removed-<id>`, which no endpoint parses as, for the destroyed
/// reservations that refer to it).
pub fn mark_server_removed(tx: &Transaction<'_>, id: u64, now_unix_s: u64) -> rusqlite::Result<()> {
    let changed = tx.execute(
        "UPDATE servers SET removed_unix_s = ?2, address = address || '#removed-' || id \
         WHERE id = ?1 AND removed_unix_s IS NULL",
        params![id as i64, now_unix_s as i64],
    )?;
    assert_eq!(changed, 1, "server {id} was listed when removed");
    Ok(())
}

/// Deletes a pool the same way: unlisted, its name (`<name>#deleted-<id>` in the row) free.
pub fn mark_pool_deleted(tx: &Transaction<'_>, id: u64, now_unix_s: u64) -> rusqlite::Result<()> {
    let changed = tx.execute(
        "UPDATE pools SET deleted_unix_s = ?2, name = name || '#deleted-' || id \
         WHERE id = ?1 AND deleted_unix_s IS NULL",
        params![id as i64, now_unix_s as i64],
    )?;
    assert_eq!(changed, 1, "pool {id} was listed when deleted");
    Ok(())
}

const RESERVATION_COLUMNS: &str = "id, name, owner_uid, owner_gid, job_id, persistent, requested_bytes, fragment_bytes, \
     fragments, pool_id, access, epoch, namespace_id, stream, state, created_unix_s, allowed_uids, allowed_gids, \
     rescue_error, rescue_since_unix_s, rescue_reclaimable_unix_s, rescue_stage_outs, replicas, tiering, achieved, targets";

fn reservation_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ReservationRow> {
    let text_error = |column: usize, what: &str, value: String| {
        rusqlite::Error::FromSqlConversionFailure(
            column,
            rusqlite::types::Type::Text,
            format!("{what} {value:?} is not valid").into(),
        )
    };
    let access: String = r.get(10)?;
    let state: String = r.get(14)?;
    let allowed_uids: String = r.get(16)?;
    let allowed_gids: String = r.get(17)?;
    let rescue = match r.get::<_, Option<String>>(18)? {
        None => None,
        Some(error) => {
            let stage_outs: String = r.get::<_, Option<String>>(21)?.unwrap_or_default();
            Some(Rescue {
                error,
                since_unix_s: r.get::<_, Option<i64>>(19)?.unwrap_or(0) as u64,
                reclaimable_unix_s: r.get::<_, Option<i64>>(20)?.unwrap_or(0) as u64,
                stage_outs: serde_json::from_str::<Vec<StageOutPair>>(&stage_outs)
                    .map_err(|_| text_error(21, "rescue_stage_outs", stage_outs.clone()))?,
            })
        }
    };
    Ok(ReservationRow {
        id: r.get::<_, i64>(0)? as u64,
        name: r.get(1)?,
        owner_uid: r.get::<_, i64>(2)? as u32,
        owner_gid: r.get::<_, i64>(3)? as u32,
        job_id: r.get(4)?,
        persistent: r.get::<_, i64>(5)? != 0,
        requested_bytes: r.get::<_, i64>(6)? as u64,
        fragment_bytes: r.get::<_, i64>(7)? as u64,
        fragments: r.get::<_, i64>(8)? as u64,
        pool_id: r.get::<_, i64>(9)? as u64,
        access: access.parse::<Access>().map_err(|_| text_error(10, "access", access.clone()))?,
        epoch: r.get::<_, i64>(11)? as u64,
        namespace_id: r.get::<_, i64>(12)? as u64,
        stream: r.get::<_, i64>(13)? as u16,
        state: ReservationState::parse(&state)
            .ok_or_else(|| text_error(14, "state", state.clone()))?,
        created_unix_s: r.get::<_, i64>(15)? as u64,
        allowed_uids: serde_json::from_str(&allowed_uids)
            .map_err(|_| text_error(16, "allowed_uids", allowed_uids.clone()))?,
        allowed_gids: serde_json::from_str(&allowed_gids)
            .map_err(|_| text_error(17, "allowed_gids", allowed_gids.clone()))?,
        placement: Vec::new(),
        jobs: Vec::new(),
        rescue,
        replicas: r.get::<_, i64>(22)? as u32,
        tiering: match r.get::<_, Option<String>>(23)? {
            None => None,
            Some(text) => Some(
                spillway_policy::Strategy::parse(&text)
                    .ok_or_else(|| text_error(23, "tiering", text.clone()))?,
            ),
        },
        achieved: json_column(r, 24, "achieved")?,
        targets: json_column(r, 25, "targets")?,
    })
}

/// A nullable column holding JSON (NULL: `None`); text that does not parse is an error naming it.
fn json_column<T: serde::de::DeserializeOwned>(
    r: &rusqlite::Row<'_>,
    column: usize,
    what: &str,
) -> rusqlite::Result<Option<T>> {
    let Some(text) = r.get::<_, Option<String>>(column)? else { return Ok(None) };
    serde_json::from_str(&text).map(Some).map_err(|_| {
        rusqlite::Error::FromSqlConversionFailure(
            column,
            rusqlite::types::Type::Text,
            format!("{what} {text:?} is not valid").into(),
        )
    })
}

/// Records a destroyed reservation's achieved I/O.
pub fn set_achieved(tx: &Transaction<'_>, id: u64, achieved: &Achieved) -> rusqlite::Result<()> {
    let text = serde_json::to_string(achieved).expect("Achieved serializes");
    tx.execute("UPDATE reservations SET achieved = ?2 WHERE id = ?1", params![id as i64, text])?;
    Ok(())
}

/// Fills each row's placement (from `fragments`) and the jobs using it (`reservation_jobs`).
fn attach_placement(tx: &Transaction<'_>, rows: &mut [ReservationRow]) -> rusqlite::Result<()> {
    let mut placement = tx.prepare_cached(
        "SELECT server_id, fragments FROM fragments WHERE reservation_id = ?1 ORDER BY stripe_index",
    )?;
    let mut jobs = tx.prepare_cached(
        "SELECT job_id FROM reservation_jobs WHERE reservation_id = ?1 ORDER BY job_id",
    )?;
    for row in rows {
        row.placement = placement
            .query_map(params![row.id as i64], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
            })?
            .collect::<rusqlite::Result<_>>()?;
        row.jobs = jobs
            .query_map(params![row.id as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
    }
    Ok(())
}

/// Every active reservation, by id.
pub fn active_reservations(tx: &Transaction<'_>) -> rusqlite::Result<Vec<ReservationRow>> {
    let mut statement = tx.prepare_cached(&format!(
        "SELECT {RESERVATION_COLUMNS} FROM reservations WHERE state = 'active' ORDER BY id"
    ))?;
    let mut rows: Vec<ReservationRow> =
        statement.query_map([], reservation_from_row)?.collect::<rusqlite::Result<_>>()?;
    drop(statement);
    attach_placement(tx, &mut rows)?;
    Ok(rows)
}

/// The latest `limit` destroyed reservations that asked by performance targets, newest first.
pub fn ended_by_targets(tx: &Transaction<'_>, limit: u32) -> rusqlite::Result<Vec<ReservationRow>> {
    let mut statement = tx.prepare_cached(&format!(
        "SELECT {RESERVATION_COLUMNS} FROM reservations WHERE state = 'destroyed' AND targets IS NOT NULL \
         ORDER BY destroyed_unix_s DESC, id DESC LIMIT ?1"
    ))?;
    let mut rows: Vec<ReservationRow> = statement
        .query_map(params![limit], reservation_from_row)?
        .collect::<rusqlite::Result<_>>()?;
    drop(statement);
    attach_placement(tx, &mut rows)?;
    Ok(rows)
}

/// A reservation by id (any state) or by name (active only).
pub fn find_reservation(
    tx: &Transaction<'_>,
    key: &str,
) -> rusqlite::Result<Option<ReservationRow>> {
    let row = match key.parse::<u64>() {
        Ok(id) => tx
            .query_row(
                &format!("SELECT {RESERVATION_COLUMNS} FROM reservations WHERE id = ?1"),
                params![id as i64],
                reservation_from_row,
            )
            .optional()?,
        Err(_) => tx
            .query_row(
                &format!("SELECT {RESERVATION_COLUMNS} FROM reservations WHERE name = ?1 AND state = 'active'"),
                params![key],
                reservation_from_row,
            )
            .optional()?,
    };
    let mut rows: Vec<ReservationRow> = row.into_iter().collect();
    attach_placement(tx, &mut rows)?;
    Ok(rows.pop())
}

/// The active reservation of a job, if any.
pub fn reservation_of_job(tx: &Transaction<'_>, job: &str) -> rusqlite::Result<Option<u64>> {
    tx.query_row(
        "SELECT id FROM reservations WHERE job_id = ?1 AND state = 'active'",
        params![job],
        |r| r.get::<_, i64>(0).map(|v| v as u64),
    )
    .optional()
}

/// Takes the next value of a counter (`next_epoch`, `next_namespace_id`).
pub fn take_counter(tx: &Transaction<'_>, name: &str) -> rusqlite::Result<u64> {
    let value: i64 =
        tx.query_row("SELECT value FROM counters WHERE name = ?1", params![name], |r| r.get(0))?;
    tx.execute("UPDATE counters SET value = value + 1 WHERE name = ?1", params![name])?;
    Ok(value as u64)
}

/// Inserts a reservation (its `id` is ignored and returned) with its fragments.
pub fn insert_reservation(tx: &Transaction<'_>, row: &ReservationRow) -> rusqlite::Result<u64> {
    tx.execute(
        "INSERT INTO reservations (name, owner_uid, owner_gid, job_id, persistent, requested_bytes, fragment_bytes, \
         fragments, pool_id, access, epoch, namespace_id, stream, state, created_unix_s, allowed_uids, allowed_gids, replicas, tiering, targets) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
        params![
            row.name,
            row.owner_uid as i64,
            row.owner_gid as i64,
            row.job_id,
            row.persistent as i64,
            row.requested_bytes as i64,
            row.fragment_bytes as i64,
            row.fragments as i64,
            row.pool_id as i64,
            row.access.as_str(),
            row.epoch as i64,
            row.namespace_id as i64,
            row.stream as i64,
            row.state.as_str(),
            row.created_unix_s as i64,
            serde_json::to_string(&row.allowed_uids).expect("u32 list serializes"),
            serde_json::to_string(&row.allowed_gids).expect("u32 list serializes"),
            row.replicas as i64,
            row.tiering.map(spillway_policy::Strategy::name),
            row.targets.as_ref().map(|t| serde_json::to_string(t).expect("targets serialize")),
        ],
    )?;
    let id = tx.last_insert_rowid() as u64;
    let mut statement = tx.prepare_cached(
        "INSERT INTO fragments (reservation_id, stripe_index, server_id, fragments) VALUES (?1, ?2, ?3, ?4)",
    )?;
    for (index, &(server, fragments)) in row.placement.iter().enumerate() {
        statement.execute(params![id as i64, index as i64, server as i64, fragments as i64])?;
    }
    Ok(id)
}

/// Renames a reservation (used to give `res-<id>` names once the id is known).
pub fn rename_reservation(tx: &Transaction<'_>, id: u64, name: &str) -> rusqlite::Result<()> {
    tx.execute("UPDATE reservations SET name = ?2 WHERE id = ?1", params![id as i64, name])?;
    Ok(())
}

/// A larger capacity for an active reservation on the same servers: `placement` lists the same
/// servers in the same stripe order, each with at least its old fragments.
pub fn grow_reservation(
    tx: &Transaction<'_>,
    id: u64,
    requested_bytes: u64,
    placement: &[(u64, u64)],
) -> rusqlite::Result<()> {
    let fragments: u64 = placement.iter().map(|&(_, f)| f).sum();
    let changed = tx.execute(
        "UPDATE reservations SET requested_bytes = ?2, fragments = ?3 WHERE id = ?1 AND state = 'active'",
        params![id as i64, requested_bytes as i64, fragments as i64],
    )?;
    assert_eq!(changed, 1, "reservation {id} was active when grown");
    let mut statement = tx.prepare_cached(
        "UPDATE fragments SET fragments = ?4 WHERE reservation_id = ?1 AND stripe_index = ?2 AND server_id = ?3 AND fragments <= ?4",
    )?;
    for (index, &(server, fragments)) in placement.iter().enumerate() {
        let changed =
            statement.execute(params![id as i64, index as i64, server as i64, fragments as i64])?;
        assert_eq!(changed, 1, "reservation {id} stripe {index}: same server, no fewer fragments");
    }
    Ok(())
}

/// Who besides its owner may use a persistent reservation.
pub fn set_sharing(
    tx: &Transaction<'_>,
    id: u64,
    allowed_uids: &[u32],
    allowed_gids: &[u32],
) -> rusqlite::Result<()> {
    let changed = tx.execute(
        "UPDATE reservations SET allowed_uids = ?2, allowed_gids = ?3 WHERE id = ?1 AND state = 'active'",
        params![
            id as i64,
            serde_json::to_string(allowed_uids).expect("u32 list serializes"),
            serde_json::to_string(allowed_gids).expect("u32 list serializes"),
        ],
    )?;
    assert_eq!(changed, 1, "reservation {id} was active when shared");
    Ok(())
}

/// Marks a reservation destroyed; the jobs registered with it are forgotten.
pub fn mark_destroyed(tx: &Transaction<'_>, id: u64, now_unix_s: u64) -> rusqlite::Result<()> {
    let changed = tx.execute(
        "UPDATE reservations SET state = 'destroyed', destroyed_unix_s = ?2 WHERE id = ?1 AND state = 'active'",
        params![id as i64, now_unix_s as i64],
    )?;
    assert_eq!(changed, 1, "reservation {id} was active when destroyed");
    tx.execute("DELETE FROM reservation_jobs WHERE reservation_id = ?1", params![id as i64])?;
    Ok(())
}

/// Keeps an active reservation as a rescue reservation (again: the error and stage-outs are
/// replaced, the times kept, so marking twice never extends the owner's exclusive period).
pub fn mark_rescue(tx: &Transaction<'_>, id: u64, rescue: &Rescue) -> rusqlite::Result<()> {
    let changed = tx.execute(
        "UPDATE reservations SET rescue_error = ?2, \
         rescue_since_unix_s = COALESCE(rescue_since_unix_s, ?3), \
         rescue_reclaimable_unix_s = COALESCE(rescue_reclaimable_unix_s, ?4), \
         rescue_stage_outs = ?5 WHERE id = ?1 AND state = 'active'",
        params![
            id as i64,
            rescue.error,
            rescue.since_unix_s as i64,
            rescue.reclaimable_unix_s as i64,
            serde_json::to_string(&rescue.stage_outs).expect("stage-out pairs serialize"),
        ],
    )?;
    assert_eq!(changed, 1, "reservation {id} was active when marked rescue");
    Ok(())
}

/// Registers `job` as using the reservation (again: no change).
pub fn register_job(
    tx: &Transaction<'_>,
    reservation_id: u64,
    job: &str,
    now_unix_s: u64,
) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT OR IGNORE INTO reservation_jobs (reservation_id, job_id, registered_unix_s) VALUES (?1, ?2, ?3)",
        params![reservation_id as i64, job, now_unix_s as i64],
    )?;
    Ok(())
}

/// Forgets that `job` uses the reservation; whether it was registered.
pub fn unregister_job(
    tx: &Transaction<'_>,
    reservation_id: u64,
    job: &str,
) -> rusqlite::Result<bool> {
    let changed = tx.execute(
        "DELETE FROM reservation_jobs WHERE reservation_id = ?1 AND job_id = ?2",
        params![reservation_id as i64, job],
    )?;
    Ok(changed > 0)
}

pub fn quotas(tx: &Transaction<'_>) -> rusqlite::Result<Vec<(u32, u64)>> {
    let mut statement = tx.prepare_cached("SELECT uid, bytes FROM quotas ORDER BY uid")?;
    let rows = statement
        .query_map([], |r| Ok((r.get::<_, i64>(0)? as u32, r.get::<_, i64>(1)? as u64)))?;
    rows.collect()
}

pub fn set_quota(tx: &Transaction<'_>, uid: u32, bytes: u64) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO quotas (uid, bytes) VALUES (?1, ?2) ON CONFLICT(uid) DO UPDATE SET bytes = excluded.bytes",
        params![uid as i64, bytes as i64],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_database_and_its_wal_and_shm_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/manager.db");
        let mut db = Db::open(&path).unwrap();
        let tx = db.conn.transaction().unwrap();
        set_quota(&tx, 1000, 1).unwrap();
        tx.commit().unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let file = PathBuf::from(format!("{}{suffix}", path.display()));
            assert_eq!(mode(&file), DATABASE_FILE_MODE, "{}", file.display());
        }
        assert_eq!(mode(path.parent().unwrap()), DATABASE_DIRECTORY_MODE);
        drop(db);
        // An existing database with broader bits is narrowed when opened.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        Db::open(&path).unwrap();
        assert_eq!(mode(&path), DATABASE_FILE_MODE);
    }

    #[test]
    fn a_version_1_database_gains_the_job_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manager.db");
        {
            let mut conn = Connection::open(&path).unwrap();
            let tx = conn.transaction().unwrap();
            tx.execute_batch(SCHEMA_V1).unwrap();
            tx.pragma_update(None, "user_version", 1).unwrap();
            tx.commit().unwrap();
        }
        let mut db = Db::open(&path).unwrap();
        let version: i64 = db.conn.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let tx = db.conn.transaction().unwrap();
        assert!(!unregister_job(&tx, 1, "7").unwrap(), "the table exists and is empty");
        // Version 3's rescue columns exist (an old reservation reads back without a rescue).
        assert!(active_reservations(&tx).unwrap().is_empty());
        tx.query_row(
            "SELECT count(rescue_error), count(rescue_stage_outs) FROM reservations",
            [],
            |_| Ok(()),
        )
        .unwrap();
        // Version 4's replication columns exist; servers read back without a domain, not lost.
        tx.query_row("SELECT count(replicas) FROM reservations", [], |_| Ok(())).unwrap();
        insert_pool(&tx, "p", 1, 0).unwrap();
        insert_server(&tx, "127.0.0.1:1", 1, 1, None).unwrap();
        let server = &servers(&tx).unwrap()[0];
        assert_eq!((server.failure_domain.as_deref(), server.lost_unix_s), (None, None));
    }
}
