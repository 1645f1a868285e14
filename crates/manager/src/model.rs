//! The API's data: what the manager stores and what its HTTP/JSON endpoints send and receive.
//!
//! One set of serde types shared by the daemon (which fills them from SQLite) and the CLI (which
//! prints them), so the JSON the Slurm hooks parse has exactly one definition. Field names carry
//! units (`capacity_bytes`, `created_unix_s`).

use serde::{Deserialize, Serialize};

/// How a reservation's namespace is laid out (DataWarp's modes).
pub use spillway_policy::namespace::NamespaceAccess as Access;

/// Whether a reservation still holds capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReservationState {
    Active,
    Destroyed,
}

impl ReservationState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationState::Active => "active",
            ReservationState::Destroyed => "destroyed",
        }
    }

    pub fn parse(text: &str) -> Option<ReservationState> {
        match text {
            "active" => Some(ReservationState::Active),
            "destroyed" => Some(ReservationState::Destroyed),
            _ => None,
        }
    }
}

/// A pool: a disjoint group of servers a job stripes inside (BIOS §4.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    pub id: u64,
    pub name: String,
    /// The allocation unit reported to Slurm (its pools hook reports space = quantity × granularity).
    pub granularity_bytes: u64,
    pub servers: u64,
    pub servers_healthy: u64,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    /// Active reservations in this pool: all of them for root and admins, those the caller may
    /// see for anyone else.
    pub reservations: u64,
    /// Keys (users or jobs) holding each stream id of this pool's devices (index = stream id);
    /// empty for callers other than root and admins (it describes other users' activity).
    pub keys_per_stream: Vec<u32>,
}

/// A burst buffer server as the manager knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Server {
    pub id: u64,
    /// Endpoint as given to `server add` (`127.0.0.1:7001`, `unix:///run/bb.sock`).
    pub address: String,
    pub pool: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    /// Where this server drains to (its `--pfs`), if known.
    pub pfs_dir: Option<String>,
    pub healthy: bool,
    /// Consecutive missed heartbeats.
    pub misses: u32,
    pub last_seen_unix_s: Option<u64>,
    /// Drains in flight on this server at the last heartbeat.
    pub drains_in_flight: u32,
    /// How the server authenticates TCP clients (`none`: unauthenticated beyond loopback,
    /// `munge`), from its last heartbeat; absent until one answered.
    #[serde(default)]
    pub auth: Option<String>,
    /// The server's id and incarnation (`<id> #<incarnation>`: a new id is another server, a
    /// higher incarnation a restart), from its last heartbeat; absent until one answered.
    #[serde(default)]
    pub identity: Option<String>,
    /// The host it runs on (its `server.failure_domain`), from its heartbeats; absent until one
    /// answered. Copies of a replicated reservation go to distinct failure domains.
    #[serde(default)]
    pub failure_domain: Option<String>,
    /// When it was declared lost for good (`spillway server lost`, or down for
    /// `manager.server_lost_after_s`); absent while not lost. A lost server gets nothing new
    /// and is never taken back.
    #[serde(default)]
    pub lost_unix_s: Option<u64>,
    /// Since when `spillway server remove` is retiring it: it gets no new fragments and is
    /// removed once no active reservation holds any and its drains are done; absent while in
    /// service.
    #[serde(default)]
    pub retiring_unix_s: Option<u64>,
    /// Its measured peaks (`spillway server measure`); absent until measured.
    #[serde(default)]
    pub peaks: Option<ServerPeaks>,
    /// The rates active reservations by performance target were promised on it (absent:
    /// none); what is left of `peaks` is what the next request by target may get.
    #[serde(default)]
    pub promised: Option<spillway_policy::targets::Rates>,
}

/// What `spillway bench peaks` measured against one server alone (the best concurrency level's
/// mean of read and write for bandwidth and IOPS, of create, stat and remove for metadata), and
/// when and how: what allocation by performance target divides (docs/design/targets.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerPeaks {
    pub bandwidth_bytes_per_s: u64,
    /// Small (4 KiB) operations per second.
    pub iops: u64,
    pub metadata_ops_per_s: u64,
    /// When the manager recorded them.
    pub measured_unix_s: u64,
    /// How they were taken (the benchmark's parameters, who measured), as the measurer said.
    pub conditions: String,
    /// Metadata operations per second through the namespace service, every client in one
    /// striped namespace on this server; absent from an older measurement (then
    /// `metadata_ops_per_s` stands for both modes).
    #[serde(default)]
    pub metadata_striped_ops_per_s: Option<u64>,
    /// The same with one private namespace per client, all on this server.
    #[serde(default)]
    pub metadata_private_ops_per_s: Option<u64>,
}

/// `PUT /v1/servers/<id>/peaks`: a server's measured peaks (the manager stamps the time).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetServerPeaks {
    pub bandwidth_bytes_per_s: u64,
    pub iops: u64,
    pub metadata_ops_per_s: u64,
    pub conditions: String,
    /// Per namespace mode (see [`ServerPeaks`]); both or neither.
    #[serde(default)]
    pub metadata_striped_ops_per_s: Option<u64>,
    #[serde(default)]
    pub metadata_private_ops_per_s: Option<u64>,
}

/// `POST /v1/servers/<id>/remove`: where the removal stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerRemoval {
    pub server: Server,
    /// Removed now: no longer listed, its address free for another `server add`.
    pub removed: bool,
    /// What the removal still waits for (reservations holding fragments on it, drains in
    /// flight); empty once removed.
    pub waiting_for: Vec<String>,
}

/// `PATCH /v1/reservations/<key>`: what to change; absent fields stay as they are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModifyReservation {
    /// A larger capacity (never smaller: data may already live in any of it), on the servers the
    /// reservation already uses.
    pub capacity_bytes: Option<u64>,
    /// Users and groups to let use a persistent reservation, and to stop letting.
    pub share_uids: Vec<u32>,
    pub share_gids: Vec<u32>,
    pub unshare_uids: Vec<u32>,
    pub unshare_gids: Vec<u32>,
}

/// A reservation (job-scoped or persistent).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub id: u64,
    /// `job-<JOBID>` for job-scoped reservations, the given name for persistent ones,
    /// `res-<id>` otherwise.
    pub name: String,
    /// Owner uid.
    pub owner: u32,
    /// Owner gid.
    pub group: u32,
    pub job: Option<String>,
    pub persistent: bool,
    /// Capacity granted: whole fragments, at least what was asked.
    pub capacity_bytes: u64,
    /// Capacity asked for.
    pub requested_bytes: u64,
    pub fragments: u64,
    pub fragment_bytes: u64,
    /// The servers striped over, in stripe order (placement depends on the order).
    pub servers: Vec<String>,
    /// Fragments on each server, parallel to `servers`.
    pub server_fragments: Vec<u64>,
    /// Drain directory (`--pfs`) of each server, parallel to `servers`.
    pub server_pfs_dirs: Vec<Option<String>>,
    pub pool: String,
    pub access: Access,
    /// The store epoch holding this reservation's data.
    pub epoch: u64,
    pub namespace_id: u64,
    /// SSD stream id (BIOS Algorithm 1).
    pub stream: u16,
    pub state: ReservationState,
    pub created_unix_s: u64,
    /// Other users who may use a persistent reservation.
    pub allowed_uids: Vec<u32>,
    /// Groups whose members may use a persistent reservation.
    pub allowed_gids: Vec<u32>,
    /// Slurm jobs using this persistent reservation (registered by the setup hook, removed by
    /// teardown); while any is registered, only root with `force` destroys it.
    #[serde(default)]
    pub jobs: Vec<String>,
    /// Set when the job's stage-out failed: the reservation is kept, its owner's alone, until
    /// `spillway stage-out --retry` finishes it (or the owner destroys it); root or an admin may
    /// reclaim it only from `reclaimable_unix_s` on.
    #[serde(default)]
    pub rescue: Option<Rescue>,
    /// Copies of every committed byte until drained, each on another failure domain (1–4).
    #[serde(default = "one_replica")]
    pub replicas: u32,
    /// The tiering strategy its jobs' phases are scheduled with (`tiering=`; absent: the site's
    /// default, docs/design/ias.md).
    #[serde(default)]
    pub tiering: Option<spillway_policy::Strategy>,
    /// Failure domain of each server, parallel to `servers` (absent: not known yet).
    #[serde(default)]
    pub server_domains: Vec<Option<String>>,
    /// Set while one of its servers is lost: which, and what re-replication can do about it.
    #[serde(default)]
    pub degraded: Option<Degraded>,
    /// Re-replication of a lost server's data onto its replacement, since the manager started:
    /// bytes copied of the total, then `restored`.
    #[serde(default)]
    pub repair: Option<RepairProgress>,
    /// What its servers saw of its epoch from grant to teardown (recorded when it is
    /// destroyed); absent while active, and for reservations destroyed before it was recorded.
    #[serde(default)]
    pub achieved: Option<Achieved>,
    /// What it asked for by performance target, and what each of its servers promised for it
    /// (parallel to `servers`) and why; absent for a reservation by capacity alone.
    #[serde(default)]
    pub targets: Option<TargetsRecord>,
}

/// A reservation by performance targets: the targets, each server's share and the reasons.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetsRecord {
    pub asked: spillway_policy::targets::Targets,
    /// Parallel to the reservation's `servers`.
    pub promised: Vec<spillway_policy::targets::Rates>,
    pub why: Vec<String>,
}

/// A reservation's achieved I/O, from its servers' counts of its epoch (`EpochRevoked` at
/// teardown). Rates divide by the longest time any one server was busy with the epoch (100 ms
/// ticks with at least one request): servers striped over work at the same time, so this is
/// the job's I/O time, and a lower bound on its rate when they did not overlap.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Achieved {
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub write_ops: u64,
    pub read_ops: u64,
    pub metadata_ops: u64,
    /// The longest any one server was busy with the epoch, ms.
    pub busy_ms: u64,
    /// Bytes written and read per busy second.
    pub bandwidth_bytes_per_s: u64,
    /// Reads and writes per busy second.
    pub iops: u64,
    pub metadata_ops_per_s: u64,
    /// Servers that answered the teardown, of `servers`: the others' counts are missing.
    pub servers_reporting: u32,
    pub recorded_unix_s: u64,
}

impl Achieved {
    /// Sums what each reporting server saw.
    pub fn of(seen: &[spillway_proto::EpochActivity], recorded_unix_s: u64) -> Achieved {
        let sum = |f: fn(&spillway_proto::EpochActivity) -> u64| {
            seen.iter().map(f).fold(0u64, u64::saturating_add)
        };
        let busy_ms = seen.iter().map(|a| a.busy_ms).max().unwrap_or(0);
        let per_second = |count: u64| {
            if busy_ms == 0 {
                0
            } else {
                (count as u128 * 1000 / busy_ms as u128).min(u64::MAX as u128) as u64
            }
        };
        let (bytes_written, bytes_read) = (sum(|a| a.bytes_written), sum(|a| a.bytes_read));
        let (write_ops, read_ops) = (sum(|a| a.write_ops), sum(|a| a.read_ops));
        let metadata_ops = sum(|a| a.metadata_ops);
        Achieved {
            bytes_written,
            bytes_read,
            write_ops,
            read_ops,
            metadata_ops,
            busy_ms,
            bandwidth_bytes_per_s: per_second(bytes_written.saturating_add(bytes_read)),
            iops: per_second(write_ops.saturating_add(read_ops)),
            metadata_ops_per_s: per_second(metadata_ops),
            servers_reporting: seen.len() as u32,
            recorded_unix_s,
        }
    }
}

fn one_replica() -> u32 {
    1
}

/// A reservation one of whose servers is lost for good.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Degraded {
    /// The lost servers' addresses, in stripe order.
    pub lost_servers: Vec<String>,
    /// Copies of every byte still on live servers at worst: `replicas` minus the lost servers
    /// of the worst replica set (0: some data exists nowhere any more unless drained).
    pub replicas_left: u32,
    /// The server that would take the first lost server's place (same pool, the lost one's
    /// failure domain or, if it was alone on it, one the reservation does not use; most
    /// free), if any.
    pub replacement: Option<String>,
    /// What is happening about it, in words.
    pub detail: String,
}

/// Where one reservation's repair stands (shown with it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairProgress {
    /// `copying`, `restored` or `failed` (retried next round).
    pub state: String,
    pub lost: String,
    pub replacement: String,
    pub copied_bytes: u64,
    pub total_bytes: u64,
    /// The error of a failed attempt.
    #[serde(default)]
    pub error: Option<String>,
}

/// One stage-out of a job: a path in the reservation and its PFS destination.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageOutPair {
    pub src: String,
    pub dst: String,
    /// A private reservation's: the compute node whose namespace `src` is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Why a reservation is kept as a rescue reservation, and what `stage-out --retry` redoes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rescue {
    /// The stage-out error, as the hook saw it.
    pub error: String,
    pub since_unix_s: u64,
    /// From then on root or an admin may destroy it (knob `manager.rescue_expiry_s`).
    pub reclaimable_unix_s: u64,
    /// Every stage-out of the job, in directive order (all are redone; verified files are skipped).
    pub stage_outs: Vec<StageOutPair>,
}

/// `POST /v1/reservations/<id or name>/rescue`: keep this job reservation, its stage-out failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkRescue {
    pub error: String,
    pub stage_outs: Vec<StageOutPair>,
}

/// `POST /v1/reservations/<id or name>/jobs`: a Slurm job now uses this persistent reservation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterJob {
    pub job: String,
}

/// `POST /v1/reservations`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CreateReservation {
    pub capacity_bytes: u64,
    pub pool: Option<String>,
    pub access: Option<Access>,
    /// Name of a persistent reservation; job-scoped when absent.
    pub persistent: Option<String>,
    pub job: Option<String>,
    /// Act for this uid (root or admin only).
    pub owner: Option<u32>,
    /// With `owner`: the owner's gid.
    pub group: Option<u32>,
    pub allowed_uids: Vec<u32>,
    pub allowed_gids: Vec<u32>,
    /// Copies of every byte on distinct failure domains (1–4; default 1).
    pub replicas: Option<u32>,
    /// The tiering strategy of its jobs' phases (absent: the site's default).
    pub tiering: Option<spillway_policy::Strategy>,
    /// Performance targets (docs/design/targets.md): with any of them, the servers, stripe
    /// count and namespace mode come from `spillway_policy::targets::plan`, and
    /// `capacity_bytes` may be 0 (then the plan's fragments are the capacity).
    pub bandwidth_bytes_per_s: Option<u64>,
    /// Small read/write operations per second.
    pub iops: Option<u64>,
    pub metadata_ops_per_s: Option<u64>,
    /// Check and place the request, then forget it: the reply is the reservation it would be
    /// (id 0, nothing granted), or the error creating it would give now. The Slurm hooks ask
    /// this before releasing a job that waits for performance targets.
    pub dry_run: bool,
}

impl CreateReservation {
    /// The request as performance targets (capacity included when given).
    pub fn targets(&self) -> spillway_policy::targets::Targets {
        spillway_policy::targets::Targets {
            capacity_bytes: Some(self.capacity_bytes).filter(|&bytes| bytes > 0),
            bandwidth_bytes_per_s: self.bandwidth_bytes_per_s,
            iops: self.iops,
            metadata_ops_per_s: self.metadata_ops_per_s,
        }
    }
}

/// `POST /v1/pools`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatePool {
    pub name: String,
    pub granularity_bytes: u64,
}

/// `POST /v1/servers`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddServer {
    pub address: String,
    pub pool: String,
    /// 0: the server's whole store (`POST /v1/servers` asks the server).
    pub capacity_bytes: u64,
    #[serde(default)]
    pub pfs_dir: Option<String>,
}

/// `PUT /v1/quotas/<uid>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetQuota {
    /// 0 = unlimited.
    pub bytes: u64,
}

/// One user's quota.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    pub uid: u32,
    /// 0 = unlimited.
    pub bytes: u64,
    pub used_bytes: u64,
    /// Whether `bytes` comes from the knob default (no row for this user).
    pub default: bool,
}

/// Who the manager thinks the caller is (`GET /v1/whoami`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Whoami {
    pub uid: u32,
    pub gid: u32,
    pub admin: bool,
}

/// `GET /v1/status`: everything `spillway status` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub pools: Vec<Pool>,
    pub servers: Vec<Server>,
    /// The reservations the caller may see (all of them for root and admins); none in the
    /// aggregate view.
    pub reservations: Vec<Reservation>,
    /// The latest reservations by performance targets that ended (at most
    /// [`ENDED_BY_TARGETS_SHOWN`]), newest first, as the caller may see them: their targets
    /// beside what their servers counted (`achieved`), so a center sees whether promises were
    /// kept. None in the aggregate view.
    #[serde(default)]
    pub ended_by_targets: Vec<Reservation>,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub drains_in_flight: u64,
}

/// How many ended reservations by targets `status` shows.
pub const ENDED_BY_TARGETS_SHOWN: u32 = 10;

/// The body of every error reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    /// A stable machine-readable name (`quota_exceeded`, `not_found`, …).
    pub kind: String,
}
