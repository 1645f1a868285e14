//! IAS tiering in the client: the runtime that reports a job's I/O phases, the node-local tier
//! and direct PFS writes (docs/design/ias.md).
//!
//! A phase is one epoch's writes: it begins with the epoch's first `create_file` or `write` in
//! this client and ends with its `commit_epoch`. At its beginning the client asks the data
//! scheduler (the manager, through a [`TierService`]) where the phase goes; every process of a
//! job gets the same answer for the same epoch, because the manager decides once per (job,
//! epoch). That one question per phase waits at most [`TieringOptions::begin_wait_max`]; it is
//! sent by the runtime thread, and a late or missing answer means the burst buffer, Spillway's
//! behaviour without tiering. Writes never call the manager: the end of a phase (bytes, seconds)
//! is queued to the runtime thread (bounded; a full queue drops the report and counts it).
//!
//! - [`Tier::BurstBuffer`]: the usual path over the reservation's servers.
//! - [`Tier::Pfs`]: each file is written at a staging name next to its final name
//!   (`<pfs>/epoch-<E>/<dir>/.<base>.spillway-direct`) and renamed to the final name by the
//!   commit, after an fsync; nothing is ever published under a final name before its commit.
//! - [`Tier::NodeLocal`]: a log-structured store (the servers' own format and code) in a
//!   directory of this node; the commit makes the epoch durable there (at the client's
//!   durability, `ssd` unless `memory` was asked), then the mover thread copies it to the burst
//!   buffer when the scheduler sees the burst buffer idle (or when the client is dropped, which
//!   waits for it), commits it there and frees it locally. A store left by a process that died
//!   is adopted by the next client of the same job on the node: its committed epochs are moved,
//!   its uncommitted ones deleted (they were never promised).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spillway_policy::tiering::{choose_tier, node_local_move_now, PhaseRequest};
use spillway_policy::{Strategy, Tier, TierSnapshot};
use spillway_types::{EpochId, FileId, StreamKey};

/// Reports waiting for the runtime thread; more are dropped (and counted), never waited for.
pub const REPORTS_QUEUED_MAX: usize = 256;

/// How often the mover asks for the tiers' load while it has epochs to move.
pub const MOVE_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// The marker `spillway drain mark-pfs` leaves in a PFS directory (the drain's
/// `PFS_MARKER_FILE`; a test there keeps the two equal).
pub const PFS_MARKER_FILE: &str = ".spillway-pfs";

/// Suffix of a file a PFS phase is writing, before its commit renames it.
pub const PFS_STAGING_SUFFIX: &str = ".spillway-direct";

/// The manager's side of tiering, as the client needs it. Implemented over the manager's API
/// by `spillway_manager::tiering::ManagerTiers`; tests may implement it directly.
pub trait TierService: Send + Sync {
    /// A phase begins: the tier the job's phase of this epoch goes to.
    fn begin_phase(&self, begin: &PhaseBegin) -> Result<Tier, String>;
    /// A phase ended (its commit returned).
    fn end_phase(&self, end: &PhaseEnd) -> Result<(), String>;
    /// The shared tiers' load now (for the mover's "is the burst buffer idle").
    fn snapshot(&self) -> Result<TierSnapshot, String>;
    /// The client is going away: once all its job's clients left, the job no longer counts
    /// as active (IAS's N).
    fn leave(&self, _job: &str, _client: u64) -> Result<(), String> {
        Ok(())
    }
    /// Where one of the caller's epochs now is (after a commit or a move), for readers on
    /// other nodes.
    fn record_location(&self, _location: &EpochLocation) -> Result<(), String> {
        Ok(())
    }
    /// Where the caller's epoch is, as last recorded by any of the caller's clients.
    fn locate(&self, _epoch: EpochId) -> Result<Option<EpochLocation>, String> {
        Ok(None)
    }
    /// Every location the caller's clients recorded (for listings of the caller's epochs).
    fn locations(&self) -> Result<Vec<EpochLocation>, String> {
        Ok(Vec::new())
    }
}

/// Where an epoch's committed data is: the metadata organizer's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochLocation {
    pub job: String,
    pub epoch: EpochId,
    pub tier: Tier,
    /// The node holding it (node-local), or the node that wrote it.
    pub host: String,
}

/// This node's name, for locations.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .unwrap_or_default()
}

/// What a client says when one of its phases begins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseBegin {
    pub job: String,
    pub client: u64,
    /// Processes of the job doing I/O (IAS's runtime reports it with every phase).
    pub processes: u32,
    pub epoch: EpochId,
    /// The strategy the job asked for; `None`: its reservation's, else the site's.
    pub strategy: Option<Strategy>,
    /// The job's previous phase size in this client (0: first phase).
    pub expected_bytes: u64,
    pub node_local_free_bytes: u64,
    pub node_local_bandwidth_bytes_per_s: u64,
}

/// What a client says when one of its phases ended.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseEnd {
    pub job: String,
    pub client: u64,
    pub epoch: EpochId,
    pub tier: Tier,
    pub bytes: u64,
    /// From the phase's beginning to its commit's return.
    pub seconds: f64,
}

/// The node-local tier of a client.
#[derive(Clone, Debug)]
pub struct NodeLocalOptions {
    /// A directory on this node's own device; each client keeps a store in
    /// `<directory>/<job>.<client id>`.
    pub directory: PathBuf,
    /// Bytes the client may hold there (its store's SSD capacity).
    pub capacity_bytes: u64,
    /// The device's write bandwidth (bytes per second) for the `measured` strategy; 0: unknown.
    pub bandwidth_bytes_per_s: u64,
}

/// Tiering settings of a client (`None` in [`crate::ClientOptions`]: every phase goes to the
/// burst buffer, without any report).
#[derive(Clone)]
pub struct TieringOptions {
    /// The job these phases belong to (Slurm's job id, or any stable name shared by its
    /// processes); 1–64 of `[A-Za-z0-9._-]`.
    pub job: String,
    pub processes: u32,
    /// `None`: the reservation's strategy, else the site's default (the manager knows them).
    pub strategy: Option<Strategy>,
    /// The PFS directory this reservation drains to (`epoch-<E>/<name>` below it): where PFS
    /// phases write and where reads find drained epochs. Without it no phase goes to the PFS.
    pub pfs_directory: Option<PathBuf>,
    /// Without it no phase goes node-local.
    pub node_local: Option<NodeLocalOptions>,
    /// The data scheduler; `None`: decisions by `strategy` alone over an idle system.
    pub service: Option<Arc<dyn TierService>>,
    /// Longest a phase's beginning waits for the scheduler's answer.
    pub begin_wait_max: Duration,
}

impl std::fmt::Debug for TieringOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TieringOptions")
            .field("job", &self.job)
            .field("processes", &self.processes)
            .field("strategy", &self.strategy)
            .field("pfs_directory", &self.pfs_directory)
            .field("node_local", &self.node_local)
            .field("service", &self.service.is_some())
            .field("begin_wait_max", &self.begin_wait_max)
            .finish()
    }
}

impl TieringOptions {
    pub fn new(job: impl Into<String>) -> TieringOptions {
        TieringOptions {
            job: job.into(),
            processes: 1,
            strategy: None,
            pfs_directory: None,
            node_local: None,
            service: None,
            begin_wait_max: Duration::from_millis(200),
        }
    }
}

/// Why a tiering job name is refused (the client and the manager check the same rule).
pub fn check_job_name(job: &str) -> Result<(), String> {
    let ok = !job.is_empty()
        && job.len() <= 64
        && job.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !job.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(format!("tiering job name {job:?}: want 1-64 of [A-Za-z0-9._-], not starting with '.'"))
    }
}

/// Where a file of a non-burst-buffer phase is written.
#[derive(Clone, Debug)]
pub(crate) enum Direct {
    /// Written at `staging` until the commit renames it to its final name.
    Pfs { file: Arc<File>, staging: PathBuf },
    /// In the node-local store under this id.
    NodeLocal { id: FileId },
}

impl Direct {
    pub(crate) fn tier(&self) -> Tier {
        match self {
            Direct::Pfs { .. } => Tier::Pfs,
            Direct::NodeLocal { .. } => Tier::NodeLocal,
        }
    }
}

/// One phase in progress in this client.
#[derive(Debug)]
struct Phase {
    tier: Tier,
    started: Instant,
    bytes: u64,
}

enum Report {
    Begin(PhaseBegin, SyncSender<Tier>),
    End(PhaseEnd),
    Location(EpochLocation),
    Leave { job: String, client: u64 },
}

enum MoverMessage {
    /// An epoch was committed locally (the mover scans what waits).
    Move,
    /// Move everything now, then answer.
    Settle(SyncSender<Result<(), String>>),
}

/// What the mover and the client share.
#[derive(Default)]
struct MoveState {
    /// Node-local epochs waiting to move (committed locally).
    waiting: BTreeSet<EpochId>,
    /// Moved to the burst buffer (and freed locally).
    moved: BTreeSet<EpochId>,
    /// Why a move failed (kept locally; retried by the next settle).
    failed: BTreeMap<EpochId, String>,
}

/// The node-local store of a client.
pub(crate) struct NodeLocal {
    pub(crate) store: Arc<spillway_store::Store>,
    directory: PathBuf,
    options: NodeLocalOptions,
    next_file: u64,
    names: HashMap<(EpochId, String), FileId>,
}

/// The stream node-local writes use (one writer: any fixed key).
const NODE_LOCAL_STREAM: StreamKey = StreamKey(1);

/// DRAM ring of a node-local store: large writes go to its segments directly, so a small
/// ring is enough and many processes per node stay cheap.
const NODE_LOCAL_DRAM_BYTES: u64 = 16 << 20;

/// Smallest node-local capacity: the store wants four segments of two records.
pub const NODE_LOCAL_CAPACITY_MIN: u64 = 8 * NODE_LOCAL_RECORD_BYTES;

/// Largest record of a node-local store: small enough that a small tier holds several
/// segments.
const NODE_LOCAL_RECORD_BYTES: u64 = 1 << 20;

fn node_local_knobs(directory: &Path, capacity_bytes: u64) -> spillway_config::store::StoreKnobs {
    spillway_config::store::StoreKnobs {
        ssd_directory: directory.to_string_lossy().into_owned(),
        dram_bytes_max: NODE_LOCAL_DRAM_BYTES,
        ssd_bytes_max: capacity_bytes,
        record_payload_bytes_max: NODE_LOCAL_RECORD_BYTES,
        segment_bytes_max: (capacity_bytes / 4).clamp(2 * NODE_LOCAL_RECORD_BYTES, 64 << 20),
        dram_prefault: false,
        ssd_reserve_bytes: 0,
        ..spillway_config::store::StoreKnobs::default()
    }
}

impl NodeLocal {
    fn open(options: &NodeLocalOptions, job: &str, client: u64) -> Result<NodeLocal, String> {
        if options.capacity_bytes < NODE_LOCAL_CAPACITY_MIN {
            return Err(format!(
                "node-local capacity of {} bytes: at least {NODE_LOCAL_CAPACITY_MIN} (four segments of two records)",
                options.capacity_bytes
            ));
        }
        let directory = options.directory.join(format!("{job}.{client:016x}"));
        std::fs::create_dir_all(&options.directory)
            .map_err(|e| format!("node-local directory {}: {e}", options.directory.display()))?;
        // Private: the store holds the job's bytes, and adoption trusts what it finds here.
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&directory)
            .map_err(|e| format!("node-local directory {}: {e}", directory.display()))?;
        let store =
            spillway_store::Store::open(&node_local_knobs(&directory, options.capacity_bytes))
                .map_err(|e| format!("node-local store in {}: {e}", directory.display()))?;
        Ok(NodeLocal {
            store: Arc::new(store),
            directory,
            options: options.clone(),
            next_file: 1,
            names: HashMap::new(),
        })
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        self.store.free_bytes()
    }

    pub(crate) fn file(&mut self, epoch: EpochId, name: &str) -> Result<FileId, String> {
        if let Some(&id) = self.names.get(&(epoch, name.to_string())) {
            return Ok(id);
        }
        let id = FileId(self.next_file);
        self.next_file += 1;
        self.store.create_file(epoch, id, name).map_err(|e| e.to_string())?;
        self.names.insert((epoch, name.to_string()), id);
        Ok(id)
    }

    pub(crate) fn existing(&self, epoch: EpochId, name: &str) -> Option<FileId> {
        self.names.get(&(epoch, name.to_string())).copied()
    }

    pub(crate) fn write(
        &self,
        epoch: EpochId,
        id: FileId,
        offset: u64,
        data: &[u8],
    ) -> Result<(), spillway_store::WriteError> {
        self.store.write(NODE_LOCAL_STREAM, epoch, id, offset, data)
    }

    pub(crate) fn forget(&mut self, epoch: EpochId) {
        self.names.retain(|(e, _), _| *e != epoch);
    }
}

/// The runtime of one client: its phases, its report thread and its mover.
pub(crate) struct Runtime {
    pub(crate) options: TieringOptions,
    client_id: u64,
    /// The tier of every epoch this client began (kept after the phase ends: later opens and
    /// reads of the epoch look here).
    epochs: HashMap<EpochId, Tier>,
    phases: HashMap<EpochId, Phase>,
    /// The PFS directory, every path beneath it opened without following links (a name
    /// another user planted cannot send a phase's bytes elsewhere).
    pfs_tree: Option<spillway_sys::beneath::Beneath>,
    /// PFS files written per epoch: staging name → (file, final name), both relative to the
    /// PFS directory; renamed by the commit.
    pfs_files: HashMap<EpochId, BTreeMap<PathBuf, (Arc<File>, PathBuf)>>,
    last_phase_bytes: u64,
    pub(crate) node_local: Option<NodeLocal>,
    reports: Option<SyncSender<Report>>,
    mover: Option<SyncSender<MoverMessage>>,
    moves: Arc<Mutex<MoveState>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pub(crate) reports_dropped: Arc<AtomicU64>,
}

impl Runtime {
    /// Starts the runtime; `bb` connects the mover's own client (no tiering) to the burst
    /// buffer when it first has something to move.
    pub(crate) fn start(
        options: TieringOptions,
        client_id: u64,
        bb: Box<dyn FnOnce() -> Result<crate::Client, crate::ClientError> + Send>,
    ) -> Result<Runtime, String> {
        check_job_name(&options.job)?;
        if options.processes == 0 {
            return Err("tiering: processes must be at least 1".into());
        }
        let node_local = match &options.node_local {
            Some(local) => Some(NodeLocal::open(local, &options.job, client_id)?),
            None => None,
        };
        let pfs_tree = match &options.pfs_directory {
            Some(pfs) => {
                let tree = spillway_sys::beneath::Beneath::open(pfs)
                    .map_err(|e| format!("tiering PFS directory: {e}"))?;
                // As the drain: an unmounted PFS leaves an empty mount point, and bytes written
                // there would be on the wrong disk.
                match tree.stat(Path::new(PFS_MARKER_FILE)) {
                    Ok(Some(_)) => Some(tree),
                    _ => {
                        return Err(format!(
                            "tiering PFS directory {} has no {PFS_MARKER_FILE} marker: not a drain directory marked by `spillway drain mark-pfs`, or the PFS is not mounted",
                            pfs.display()
                        ))
                    }
                }
            }
            None => None,
        };
        let mut runtime = Runtime {
            options,
            client_id,
            epochs: HashMap::new(),
            phases: HashMap::new(),
            pfs_tree,
            pfs_files: HashMap::new(),
            last_phase_bytes: 0,
            node_local,
            reports: None,
            mover: None,
            moves: Arc::new(Mutex::new(MoveState::default())),
            threads: Vec::new(),
            reports_dropped: Arc::new(AtomicU64::new(0)),
        };
        if let Some(service) = runtime.options.service.clone() {
            let (sender, receiver) = std::sync::mpsc::sync_channel(REPORTS_QUEUED_MAX);
            let thread = std::thread::Builder::new()
                .name("spillway-tiering".into())
                .spawn(move || report_loop(service.as_ref(), receiver))
                .map_err(|e| format!("starting the tiering thread: {e}"))?;
            runtime.reports = Some(sender);
            runtime.threads.push(thread);
        }
        if let Some(local) = &runtime.node_local {
            let adopted = adopt_orphans(&local.options, &runtime.options.job, &local.directory);
            let (sender, receiver) = std::sync::mpsc::sync_channel(REPORTS_QUEUED_MAX);
            let mover = Mover {
                job: runtime.options.job.clone(),
                store: local.store.clone(),
                service: runtime.options.service.clone(),
                moves: runtime.moves.clone(),
                adopted,
            };
            let thread = std::thread::Builder::new()
                .name("spillway-mover".into())
                .spawn(move || mover.run(bb, receiver))
                .map_err(|e| format!("starting the node-local mover: {e}"))?;
            runtime.mover = Some(sender);
            runtime.threads.push(thread);
        }
        Ok(runtime)
    }

    /// The tier of `epoch` now: where its phase went, or the burst buffer once moved there.
    pub(crate) fn tier_of(&self, epoch: EpochId) -> Option<Tier> {
        let tier = *self.epochs.get(&epoch)?;
        if tier == Tier::NodeLocal && self.moves.lock().expect("moves lock").moved.contains(&epoch)
        {
            return Some(Tier::BurstBuffer);
        }
        Some(tier)
    }

    /// The tier of `epoch`, beginning its phase if this is its first touch in this client.
    pub(crate) fn route(&mut self, epoch: EpochId) -> Tier {
        if let Some(tier) = self.tier_of(epoch) {
            return tier;
        }
        let free = self.node_local.as_ref().map_or(0, NodeLocal::free_bytes);
        let begin = PhaseBegin {
            job: self.options.job.clone(),
            client: self.client_id,
            processes: self.options.processes,
            epoch,
            strategy: self.options.strategy,
            expected_bytes: self.last_phase_bytes,
            node_local_free_bytes: free,
            node_local_bandwidth_bytes_per_s: self
                .options
                .node_local
                .as_ref()
                .map_or(0, |l| l.bandwidth_bytes_per_s),
        };
        let wanted = self.ask(&begin);
        let tier = self.usable(wanted, free);
        self.epochs.insert(epoch, tier);
        self.phases.insert(epoch, Phase { tier, started: Instant::now(), bytes: 0 });
        tier
    }

    /// The scheduler's answer, or without one the strategy's own over an idle system.
    fn ask(&self, begin: &PhaseBegin) -> Tier {
        let local = || {
            let request = PhaseRequest {
                expected_bytes: begin.expected_bytes,
                node_local_free_bytes: begin.node_local_free_bytes,
                node_local_bandwidth_bytes_per_s: begin.node_local_bandwidth_bytes_per_s,
            };
            let strategy = begin.strategy.unwrap_or(Strategy::HighPriority);
            let idle = TierSnapshot { active_jobs: 1, ..TierSnapshot::default() };
            choose_tier(strategy, &idle, &request).tier()
        };
        let Some(reports) = &self.reports else { return local() };
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        match reports.try_send(Report::Begin(begin.clone(), answer)) {
            Ok(()) => {
                answered.recv_timeout(self.options.begin_wait_max).unwrap_or(Tier::BurstBuffer)
            }
            Err(_) => {
                self.reports_dropped.fetch_add(1, Ordering::Relaxed);
                Tier::BurstBuffer
            }
        }
    }

    /// A tier this client can write: the PFS needs a PFS directory, node-local a store with
    /// room for the expected phase; otherwise the burst buffer.
    fn usable(&self, tier: Tier, node_local_free: u64) -> Tier {
        match tier {
            Tier::Pfs if self.options.pfs_directory.is_none() => Tier::BurstBuffer,
            Tier::NodeLocal
                if self.node_local.is_none() || node_local_free < self.last_phase_bytes.max(1) =>
            {
                Tier::BurstBuffer
            }
            other => other,
        }
    }

    /// Counts bytes of the epoch's phase.
    pub(crate) fn wrote(&mut self, epoch: EpochId, bytes: u64) {
        if let Some(phase) = self.phases.get_mut(&epoch) {
            phase.bytes += bytes;
        }
    }

    /// The epoch's phase now goes to the burst buffer (node-local ran out of room).
    pub(crate) fn switch_to_burst_buffer(&mut self, epoch: EpochId) {
        self.epochs.insert(epoch, Tier::BurstBuffer);
        if let Some(phase) = self.phases.get_mut(&epoch) {
            phase.tier = Tier::BurstBuffer;
        }
    }

    /// The file of a PFS phase: opened (created) at its staging name.
    pub(crate) fn pfs_file(&mut self, epoch: EpochId, name: &str) -> std::io::Result<Direct> {
        let tree = self.pfs_tree.as_ref().expect("PFS phases need a PFS directory");
        let final_name = pfs_relative_path(epoch, name)?;
        let staging = staging_path(&final_name);
        let shown = tree.root_path().join(&staging);
        let files = self.pfs_files.entry(epoch).or_default();
        if let Some((file, _)) = files.get(&staging) {
            return Ok(Direct::Pfs { file: file.clone(), staging: shown });
        }
        if let Some(parent) = staging.parent() {
            tree.create_directories(parent, 0o755)?;
        }
        let file = tree.open_or_create_read_write(&staging, 0o644)?;
        // A staging name another user created first (a shared, writable epoch directory) would
        // take this phase's bytes into a file they own and publish it as ours: refused.
        let owner = std::os::unix::fs::MetadataExt::uid(&file.metadata()?);
        if owner != spillway_sys::user::euid() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{} belongs to uid {owner}, not to this process", shown.display()),
            ));
        }
        let file = Arc::new(file);
        files.insert(staging, (file.clone(), final_name));
        Ok(Direct::Pfs { file, staging: shown })
    }

    /// A PFS file of `epoch` for reading: this client's uncommitted staging file, else the
    /// committed one; `None` if neither is there.
    pub(crate) fn open_pfs_file(
        &self,
        epoch: EpochId,
        name: &str,
    ) -> std::io::Result<Option<Direct>> {
        let tree = self.pfs_tree.as_ref().expect("PFS phases need a PFS directory");
        let final_name = pfs_relative_path(epoch, name)?;
        let staging = staging_path(&final_name);
        if let Some((file, _)) = self.pfs_files.get(&epoch).and_then(|files| files.get(&staging)) {
            return Ok(Some(Direct::Pfs {
                file: file.clone(),
                staging: tree.root_path().join(staging),
            }));
        }
        match tree.open_read(&final_name) {
            Ok(file) => Ok(Some(Direct::Pfs {
                file: Arc::new(file),
                staging: tree.root_path().join(final_name),
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// fsyncs every PFS file of the epoch this client wrote (`fsync` of a PFS phase).
    pub(crate) fn sync_pfs(&self, epoch: EpochId) -> std::io::Result<()> {
        for (file, _) in self.pfs_files.get(&epoch).into_iter().flat_map(|f| f.values()) {
            file.sync_all()?;
        }
        Ok(())
    }

    /// Commits the epoch's non-burst-buffer part: PFS files fsync'd and renamed to their final
    /// names (directories fsync'd); node-local: committed in the local store and queued to
    /// move. Then reports the phase's end.
    pub(crate) fn commit(
        &mut self,
        epoch: EpochId,
        durability: spillway_proto::Durability,
    ) -> Result<(), String> {
        match self.tier_of(epoch) {
            Some(Tier::Pfs) => {
                self.sync_pfs(epoch)
                    .map_err(|e| format!("fsync of a PFS file of epoch {epoch}: {e}"))?;
                let tree = self.pfs_tree.as_ref().expect("PFS phases need a PFS directory");
                for (staging, (_, final_name)) in self.pfs_files.remove(&epoch).unwrap_or_default()
                {
                    publish_pfs_file(tree, &staging, &final_name)?;
                }
            }
            Some(Tier::NodeLocal) => {
                let local = self.node_local.as_ref().expect("node-local phases have a store");
                let level = match durability {
                    spillway_proto::Durability::Memory => spillway_store::Durability::Memory,
                    _ => spillway_store::Durability::Ssd,
                };
                if local.store.epoch(epoch).is_some() {
                    local
                        .store
                        .commit(epoch, level)
                        .map_err(|e| format!("node-local commit of epoch {epoch}: {e}"))?;
                    self.moves.lock().expect("moves lock").waiting.insert(epoch);
                    if let Some(mover) = &self.mover {
                        // A full queue is harmless: the mover scans `waiting` anyway.
                        let _ = mover.try_send(MoverMessage::Move);
                    }
                }
            }
            _ => {}
        }
        if let Some(tier @ (Tier::Pfs | Tier::NodeLocal)) = self.tier_of(epoch) {
            self.report(Report::Location(EpochLocation {
                job: self.options.job.clone(),
                epoch,
                tier,
                host: host_name(),
            }));
        }
        self.end_phase(epoch);
        Ok(())
    }

    /// Queues a report for the runtime thread; a full queue drops it (counted).
    fn report(&self, report: Report) {
        if let Some(reports) = &self.reports {
            if reports.try_send(report).is_err() {
                self.reports_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn end_phase(&mut self, epoch: EpochId) {
        let Some(phase) = self.phases.remove(&epoch) else { return };
        self.last_phase_bytes = phase.bytes;
        let end = PhaseEnd {
            job: self.options.job.clone(),
            client: self.client_id,
            epoch,
            tier: phase.tier,
            bytes: phase.bytes,
            seconds: phase.started.elapsed().as_secs_f64(),
        };
        self.report(Report::End(end));
    }

    /// Forgets the epoch (deleted): its PFS staging files are removed, its node-local data
    /// deleted.
    pub(crate) fn delete(&mut self, epoch: EpochId) {
        if let Some(tree) = &self.pfs_tree {
            for (staging, _) in self.pfs_files.remove(&epoch).unwrap_or_default() {
                let _ = tree.remove_file(&staging);
            }
        }
        if let Some(local) = &mut self.node_local {
            let _ = local.store.delete_epoch(epoch);
            local.forget(epoch);
        }
        self.moves.lock().expect("moves lock").waiting.remove(&epoch);
        self.end_phase(epoch);
        self.epochs.remove(&epoch);
    }

    /// Moves every waiting node-local epoch to the burst buffer now; returns when done.
    pub(crate) fn settle(&self) -> Result<(), String> {
        let Some(mover) = &self.mover else { return Ok(()) };
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        mover
            .send(MoverMessage::Settle(answer))
            .map_err(|_| "the node-local mover stopped".to_string())?;
        answered.recv().map_err(|_| "the node-local mover stopped".to_string())?
    }

    /// Node-local epochs not moved yet.
    pub(crate) fn waiting_moves(&self) -> Vec<EpochId> {
        self.moves.lock().expect("moves lock").waiting.iter().copied().collect()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Node-local data must not be stranded by a job that ends: the mover finishes first.
        if let Err(error) = self.settle() {
            eprintln!("spillway: node-local epochs not moved to the burst buffer: {error}");
        }
        if let Some(reports) = self.reports.take() {
            let leave = Report::Leave { job: self.options.job.clone(), client: self.client_id };
            let _ = reports.try_send(leave);
        }
        self.mover = None;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        // Nothing left to move: the store's directory goes with the client.
        if let Some(local) = self.node_local.take() {
            let directory = local.directory.clone();
            let empty =
                local.store.epochs().iter().all(|e| e.phase == spillway_store::EpochPhase::Deleted);
            drop(local);
            if empty && self.moves.lock().expect("moves lock").waiting.is_empty() {
                let _ = std::fs::remove_dir_all(directory);
            }
        }
    }
}

fn report_loop(service: &dyn TierService, reports: Receiver<Report>) {
    for report in reports {
        match report {
            Report::Begin(begin, answer) => {
                let tier = service.begin_phase(&begin).unwrap_or(Tier::BurstBuffer);
                let _ = answer.try_send(tier);
            }
            Report::End(end) => {
                // Best effort: the manager expires phases it never hears the end of.
                let _ = service.end_phase(&end);
            }
            Report::Location(location) => {
                let _ = service.record_location(&location);
            }
            Report::Leave { job, client } => {
                let _ = service.leave(&job, client);
            }
        }
    }
}

/// `epoch-<E>/<name>` below the PFS directory (the drain's layout), refusing names that leave
/// the epoch's directory.
pub(crate) fn pfs_relative_path(epoch: EpochId, name: &str) -> std::io::Result<PathBuf> {
    let relative = Path::new(name);
    if name.is_empty()
        || relative.is_absolute()
        || relative.components().any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("file name {name:?} cannot be a path below the epoch's PFS directory"),
        ));
    }
    Ok(Path::new(&format!("epoch-{}", epoch.0)).join(relative))
}

fn staging_path(final_name: &Path) -> PathBuf {
    let base = final_name.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    final_name.with_file_name(format!(".{base}{PFS_STAGING_SUFFIX}"))
}

/// Renames a fsync'd staging file to its final name and fsyncs the directory. Another process
/// of the job may have renamed it already (N-1): then the final name is there and that is done.
fn publish_pfs_file(
    tree: &spillway_sys::beneath::Beneath,
    staging: &Path,
    final_name: &Path,
) -> Result<(), String> {
    let shown = tree.root_path().join(final_name);
    match tree.rename(staging, final_name) {
        Ok(()) => {}
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && matches!(tree.stat(final_name), Ok(Some(_))) => {}
        Err(e) => return Err(format!("publishing {}: {e}", shown.display())),
    }
    tree.sync_parent(final_name)
        .map_err(|e| format!("fsync of the directory of {}: {e}", shown.display()))
}

/// Reads a PFS phase's file (before or after its commit).
pub(crate) fn read_direct_pfs(file: &File, offset: u64, buffer: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buffer.len() {
        match file.read_at(&mut buffer[done..], offset + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    buffer[done..].fill(0);
    Ok(())
}

/// Stores of the same job on this node whose process is gone (their lock is free): opened
/// to move what they committed.
fn adopt_orphans(
    options: &NodeLocalOptions,
    job: &str,
    own: &Path,
) -> Vec<(PathBuf, spillway_store::Store)> {
    let prefix = format!("{job}.");
    let Ok(entries) = std::fs::read_dir(&options.directory) else { return Vec::new() };
    let mut adopted = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path == own || !name.starts_with(&prefix) {
            continue;
        }
        // Only a real directory of this uid: another user's store (or a link to one) named
        // like ours must not inject its epochs into this job's burst buffer.
        let Ok(metadata) = std::fs::symlink_metadata(&path) else { continue };
        if !metadata.is_dir()
            || std::os::unix::fs::MetadataExt::uid(&metadata) != spillway_sys::user::euid()
        {
            continue;
        }
        // Held by a live client of the job: its lock refuses us.
        if let Ok(store) =
            spillway_store::Store::open(&node_local_knobs(&path, options.capacity_bytes))
        {
            adopted.push((path, store));
        }
    }
    adopted
}

struct Mover {
    job: String,
    store: Arc<spillway_store::Store>,
    service: Option<Arc<dyn TierService>>,
    moves: Arc<Mutex<MoveState>>,
    adopted: Vec<(PathBuf, spillway_store::Store)>,
}

impl Mover {
    fn run(
        mut self,
        connect: Box<dyn FnOnce() -> Result<crate::Client, crate::ClientError> + Send>,
        messages: Receiver<MoverMessage>,
    ) {
        let mut connect = Some(connect);
        let mut client: Option<crate::Client> = None;
        let mut settle_waiting: VecDeque<SyncSender<Result<(), String>>> = VecDeque::new();
        loop {
            let message = messages.recv_timeout(MOVE_POLL_INTERVAL);
            let stopping = matches!(message, Err(RecvTimeoutError::Disconnected));
            if let Ok(MoverMessage::Settle(answer)) = message {
                settle_waiting.push_back(answer);
            }
            let urgent = stopping || !settle_waiting.is_empty();
            let pending = !self.moves.lock().expect("moves lock").waiting.is_empty()
                || !self.adopted.is_empty();
            if pending && (urgent || self.burst_buffer_idle()) {
                let outcome = self.move_all(&mut client, &mut connect);
                for answer in settle_waiting.drain(..) {
                    let _ = answer.send(outcome.clone());
                }
            } else {
                for answer in settle_waiting.drain(..) {
                    let _ = answer.send(Ok(()));
                }
            }
            if stopping {
                return;
            }
        }
    }

    fn burst_buffer_idle(&self) -> bool {
        match &self.service {
            // Nobody to ask: move at once.
            None => true,
            Some(service) => service.snapshot().map(|s| node_local_move_now(&s)).unwrap_or(false),
        }
    }

    fn move_all(
        &mut self,
        client: &mut Option<crate::Client>,
        connect: &mut Option<Box<dyn FnOnce() -> Result<crate::Client, crate::ClientError> + Send>>,
    ) -> Result<(), String> {
        if client.is_none() {
            let Some(open) = connect.take() else {
                return Err("cannot connect to the burst buffer again after a failure".into());
            };
            *client = Some(open().map_err(|e| format!("connecting the node-local mover: {e}"))?);
        }
        let bb = client.as_mut().expect("connected above");
        for (path, store) in std::mem::take(&mut self.adopted) {
            for info in store.epochs() {
                if info.phase == spillway_store::EpochPhase::Deleted {
                    continue;
                }
                let committed = matches!(
                    info.phase,
                    spillway_store::EpochPhase::Committed
                        | spillway_store::EpochPhase::CommittedInMemory
                );
                if committed {
                    move_epoch(&store, bb, info.epoch)?;
                }
                // Uncommitted epochs of a dead process were never promised: dropped.
                let _ = store.delete_epoch(info.epoch);
            }
            drop(store);
            let _ = std::fs::remove_dir_all(&path);
        }
        let waiting: Vec<EpochId> =
            self.moves.lock().expect("moves lock").waiting.iter().copied().collect();
        let mut first_error = None;
        for epoch in waiting {
            match move_epoch(&self.store, bb, epoch) {
                Ok(()) => {
                    let _ = self.store.delete_epoch(epoch);
                    let mut moves = self.moves.lock().expect("moves lock");
                    moves.waiting.remove(&epoch);
                    moves.failed.remove(&epoch);
                    moves.moved.insert(epoch);
                    drop(moves);
                    if let Some(service) = &self.service {
                        // Best effort: readers elsewhere find it on the burst buffer anyway.
                        let _ = service.record_location(&EpochLocation {
                            job: self.job.clone(),
                            epoch,
                            tier: Tier::BurstBuffer,
                            host: host_name(),
                        });
                    }
                }
                Err(error) => {
                    self.moves.lock().expect("moves lock").failed.insert(epoch, error.clone());
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Copies a node-local epoch's files into `client`'s burst buffer, a piece at a time (the
/// caller commits, or goes on writing the phase there).
fn copy_local_epoch(
    store: &spillway_store::Store,
    client: &mut crate::Client,
    epoch: EpochId,
) -> Result<(), crate::ClientError> {
    let mut buffer = Vec::new();
    for info in store.files(epoch).map_err(node_local_error)? {
        let Some(name) = info.name.clone() else { continue };
        let mut handle = client.create_file(epoch, &name)?;
        for extent in store.extents(epoch..=epoch, Some(info.file)) {
            let end = extent.offset + extent.length;
            let mut at = extent.offset;
            while at < end {
                let length = (end - at).min(MOVE_PIECE_BYTES);
                buffer.resize(length as usize, 0);
                store.read(epoch, info.file, at, &mut buffer).map_err(node_local_error)?;
                client.write(&mut handle, at, &buffer)?;
                at += length;
            }
        }
    }
    Ok(())
}

/// Moves a committed node-local epoch to the burst buffer and commits it there.
fn move_epoch(
    store: &spillway_store::Store,
    bb: &mut crate::Client,
    epoch: EpochId,
) -> Result<(), String> {
    copy_local_epoch(store, bb, epoch)
        .and_then(|()| bb.commit_epoch(epoch))
        .map_err(|e| format!("moving node-local epoch {epoch} to the burst buffer: {e}"))
}

/// Bytes the mover reads and writes at a time.
const MOVE_PIECE_BYTES: u64 = 4 << 20;

fn tier_error(tier: Tier, message: impl Into<String>, errno: i32) -> crate::ClientError {
    crate::ClientError::Tier { tier: tier.name(), message: message.into(), errno }
}

fn pfs_error(what: &str, error: std::io::Error) -> crate::ClientError {
    let errno = error.raw_os_error().unwrap_or(libc::EIO);
    tier_error(Tier::Pfs, format!("{what}: {error}"), errno)
}

fn node_local_error(message: impl std::fmt::Display) -> crate::ClientError {
    tier_error(Tier::NodeLocal, message.to_string(), libc::EIO)
}

/// The hooks of [`crate::Client`]'s operations for tiered phases.
impl crate::Client {
    /// The tier of `epoch` in this client (`None`: no tiering, or not begun here).
    pub fn epoch_tier(&self, epoch: EpochId) -> Option<Tier> {
        self.tiering.as_ref()?.tier_of(epoch)
    }

    /// Phase reports dropped because the runtime's queue was full or the runtime stopped.
    pub fn tiering_reports_dropped(&self) -> u64 {
        self.tiering.as_ref().map_or(0, |t| t.reports_dropped.load(Ordering::Relaxed))
    }

    /// Node-local epochs committed but not yet moved to the burst buffer.
    pub fn node_local_waiting(&self) -> Vec<EpochId> {
        self.tiering.as_ref().map_or_else(Vec::new, Runtime::waiting_moves)
    }

    /// Moves every committed node-local epoch to the burst buffer now, whatever the load;
    /// returns once they are committed there. Dropping the client does the same.
    pub fn settle_tiers(&mut self) -> Result<(), crate::ClientError> {
        match &self.tiering {
            Some(runtime) => runtime.settle().map_err(node_local_error),
            None => Ok(()),
        }
    }

    /// Where the scheduler last recorded each of the caller's tiered epochs (empty without a
    /// scheduler): how a listing finds epochs that are on no server.
    pub fn located_epochs(&self) -> Result<Vec<EpochLocation>, crate::ClientError> {
        let Some(service) = self.tiering.as_ref().and_then(|t| t.options.service.as_ref()) else {
            return Ok(Vec::new());
        };
        service.locations().map_err(|message| {
            tier_error(
                Tier::BurstBuffer,
                format!("asking the scheduler for epoch locations: {message}"),
                libc::EIO,
            )
        })
    }

    /// An epoch no server has: if the scheduler knows it is on some node's local tier and not
    /// moved yet, the error that says so (EAGAIN: it will be on the burst buffer later).
    pub fn held_elsewhere(&self, epoch: EpochId) -> Option<crate::ClientError> {
        let service = self.tiering.as_ref()?.options.service.as_ref()?;
        let location = service.locate(epoch).ok()??;
        (location.tier == Tier::NodeLocal).then(|| {
            tier_error(
                Tier::NodeLocal,
                format!(
                    "epoch {epoch} is on the node-local storage of host {} (job {}), not moved to the burst buffer yet; it moves once the burst buffer is quiet or that job's client ends",
                    location.host, location.job
                ),
                libc::EAGAIN,
            )
        })
    }

    /// `create_file` of a PFS or node-local phase; `None`: the burst buffer's.
    pub(crate) fn create_tiered(
        &mut self,
        epoch: EpochId,
        name: &str,
    ) -> Result<Option<crate::FileHandle>, crate::ClientError> {
        let Some(runtime) = &mut self.tiering else { return Ok(None) };
        let direct = match runtime.route(epoch) {
            Tier::BurstBuffer => return Ok(None),
            Tier::Pfs => runtime
                .pfs_file(epoch, name)
                .map_err(|e| pfs_error(&format!("creating {name:?} of epoch {epoch}"), e))?,
            Tier::NodeLocal => {
                let local = runtime.node_local.as_mut().expect("node-local phases have a store");
                let id = local.file(epoch, name).map_err(node_local_error)?;
                Direct::NodeLocal { id }
            }
        };
        Ok(Some(self.direct_handle(epoch, name, direct)))
    }

    fn direct_handle(&self, epoch: EpochId, name: &str, direct: Direct) -> crate::FileHandle {
        crate::FileHandle {
            epoch,
            name: name.to_string(),
            ids: vec![None; self.servers.len()],
            pfs_copy: None,
            direct: Some(direct),
        }
    }

    /// `open_file` of an epoch whose phase this client sent to the PFS or node-local and that
    /// is still there; `None`: look on the burst buffer (and its PFS fallback).
    pub(crate) fn open_tiered(
        &mut self,
        epoch: EpochId,
        name: &str,
    ) -> Result<Option<crate::FileHandle>, crate::ClientError> {
        let Some(runtime) = &mut self.tiering else { return Ok(None) };
        let direct = match runtime.tier_of(epoch) {
            None | Some(Tier::BurstBuffer) => return Ok(None),
            Some(Tier::Pfs) => match runtime.open_pfs_file(epoch, name) {
                Ok(Some(direct)) => direct,
                Ok(None) => {
                    return Err(crate::ClientError::NoSuchFile { epoch, name: name.to_string() })
                }
                Err(e) => return Err(pfs_error(&format!("opening {name:?} of epoch {epoch}"), e)),
            },
            Some(Tier::NodeLocal) => {
                let local = runtime.node_local.as_ref().expect("node-local phases have a store");
                match local.existing(epoch, name) {
                    Some(id) => Direct::NodeLocal { id },
                    None => {
                        return Err(crate::ClientError::NoSuchFile {
                            epoch,
                            name: name.to_string(),
                        })
                    }
                }
            }
        };
        Ok(Some(self.direct_handle(epoch, name, direct)))
    }

    /// A write through a tiered handle. `false`: the epoch went to the burst buffer meanwhile
    /// (its node-local tier filled up) and `file` is now a burst buffer handle: write there.
    pub(crate) fn write_tiered(
        &mut self,
        file: &mut crate::FileHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<bool, crate::ClientError> {
        let runtime = self.tiering.as_mut().expect("tiered handles come from the runtime");
        if runtime.tier_of(file.epoch) == Some(Tier::BurstBuffer) {
            *file = self.create_file_untraced(file.epoch, &file.name.clone())?;
            return Ok(false);
        }
        runtime.wrote(file.epoch, data.len() as u64);
        match file.direct.as_ref().expect("tiered handle") {
            Direct::Pfs { file: pfs_file, staging, .. } => {
                pfs_file
                    .write_all_at(data, offset)
                    .map_err(|e| pfs_error(&format!("writing {}", staging.display()), e))?;
                Ok(true)
            }
            Direct::NodeLocal { id } => {
                let local = runtime.node_local.as_ref().expect("node-local phases have a store");
                match local.write(file.epoch, *id, offset, data) {
                    Ok(()) => Ok(true),
                    Err(spillway_store::WriteError::OutOfSpace { .. }) => {
                        // The node is full: what the phase wrote here moves to the burst
                        // buffer now and the phase goes on there.
                        self.evacuate_node_local(file.epoch)?;
                        *file = self.create_file_untraced(file.epoch, &file.name.clone())?;
                        Ok(false)
                    }
                    Err(error) => Err(node_local_error(format!(
                        "writing {:?} of epoch {}: {error}",
                        file.name, file.epoch
                    ))),
                }
            }
        }
    }

    /// Copies the epoch's node-local bytes (uncommitted: its phase is running) to the burst
    /// buffer through this client, frees them locally and sends the rest of the phase there.
    fn evacuate_node_local(&mut self, epoch: EpochId) -> Result<(), crate::ClientError> {
        let runtime = self.tiering.as_mut().expect("tiering on");
        runtime.switch_to_burst_buffer(epoch);
        let store = runtime.node_local.as_ref().expect("node-local store").store.clone();
        copy_local_epoch(&store, self, epoch)?;
        self.flush()?;
        let runtime = self.tiering.as_mut().expect("tiering on");
        let local = runtime.node_local.as_mut().expect("node-local store");
        let _ = local.store.delete_epoch(epoch);
        local.forget(epoch);
        Ok(())
    }

    /// A read through a tiered handle; node-local data moved meanwhile is read from the burst
    /// buffer.
    pub(crate) fn read_tiered(
        &mut self,
        file: &crate::FileHandle,
        offset: u64,
        buffer: &mut [u8],
    ) -> Result<(), crate::ClientError> {
        match file.direct.as_ref().expect("tiered handle") {
            Direct::Pfs { file: pfs_file, staging, .. } => {
                read_direct_pfs(pfs_file, offset, buffer)
                    .map_err(|e| pfs_error(&format!("reading {}", staging.display()), e))
            }
            Direct::NodeLocal { id } => {
                let runtime = self.tiering.as_ref().expect("tiering on");
                if runtime.tier_of(file.epoch) == Some(Tier::NodeLocal) {
                    let store =
                        runtime.node_local.as_ref().expect("node-local store").store.clone();
                    match store.read(file.epoch, *id, offset, buffer) {
                        Ok(()) => return Ok(()),
                        // Moved between the check and the read: the burst buffer has it.
                        Err(_)
                            if self.tiering.as_ref().expect("tiering on").tier_of(file.epoch)
                                != Some(Tier::NodeLocal) => {}
                        Err(error) => {
                            return Err(node_local_error(format!(
                                "reading {:?} of epoch {}: {error}",
                                file.name, file.epoch
                            )))
                        }
                    }
                }
                let moved = self.open_file_untraced(file.epoch, &file.name)?;
                self.read_untraced(&moved, offset, buffer)
            }
        }
    }

    pub(crate) fn file_size_tiered(
        &mut self,
        file: &crate::FileHandle,
    ) -> Result<u64, crate::ClientError> {
        match file.direct.as_ref().expect("tiered handle") {
            Direct::Pfs { file: pfs_file, staging, .. } => pfs_file
                .metadata()
                .map(|m| m.len())
                .map_err(|e| pfs_error(&format!("stat of {}", staging.display()), e)),
            Direct::NodeLocal { id } => {
                let runtime = self.tiering.as_ref().expect("tiering on");
                if runtime.tier_of(file.epoch) == Some(Tier::NodeLocal) {
                    let store = &runtime.node_local.as_ref().expect("node-local store").store;
                    if let Some(info) = store.stat(file.epoch, *id) {
                        return Ok(info.size_bytes);
                    }
                }
                let moved = self.open_file_untraced(file.epoch, &file.name)?;
                self.file_size(&moved)
            }
        }
    }

    /// The tiered part of `commit_epoch` (the burst buffer's part is done by then).
    pub(crate) fn commit_tiered(&mut self, epoch: EpochId) -> Result<(), crate::ClientError> {
        let durability = self.options.durability;
        let Some(runtime) = &mut self.tiering else { return Ok(()) };
        let tier = runtime.tier_of(epoch).unwrap_or(Tier::BurstBuffer);
        runtime.commit(epoch, durability).map_err(|message| tier_error(tier, message, libc::EIO))
    }

    /// `sync_epoch` of a PFS or node-local phase; `false`: the burst buffer's.
    pub(crate) fn sync_tiered(&mut self, epoch: EpochId) -> Result<bool, crate::ClientError> {
        let Some(runtime) = &self.tiering else { return Ok(false) };
        match runtime.tier_of(epoch) {
            Some(Tier::Pfs) => runtime
                .sync_pfs(epoch)
                .map(|()| true)
                .map_err(|e| pfs_error(&format!("fsync of epoch {epoch}"), e)),
            Some(Tier::NodeLocal) => {
                let store = &runtime.node_local.as_ref().expect("node-local store").store;
                store.sync().map(|()| true).map_err(node_local_error)
            }
            _ => Ok(false),
        }
    }
}
