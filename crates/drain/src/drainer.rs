//! The drainer: one background worker per server that moves committed epochs to the PFS.
//!
//! Requests come from clients (`Drain` frames) or, if `drain_after_commit` is set, from every
//! commit; each is journaled (fsync) before it is acknowledged, so a crash loses none. The worker
//! takes ready epochs round robin across owners, oldest first within an owner; each epoch backs
//! off (or polls its peers) on its own, so none delays another. For each file of the epoch this
//! server holds it:
//!
//! 1. judges the final PFS name (`judge_final_name`): done if it carries this drain's identity
//!    (this epoch, this store file: published earlier, maybe by a peer); superseded if a later
//!    epoch's drained file is there; an error if something the drain did not publish is there;
//! 2. asks every server of the reservation which of them have the file (the *participants*),
//!    then judges the final name again (a participant only drops the file after it is
//!    published, so from here on the participant set is complete);
//! 3. unless its part marker exists, writes its part into the shared staging file:
//!    *shuffled* — the held bytes of its stripe-aligned domain ([`crate::plan::held_chunks`];
//!    holes are not written), gathered from every participant with pipelined `Read`s and
//!    written in large sequential writes, gathering the next chunk while the previous one is
//!    written; *naive* — the extents it holds, where they fall; a chunk that is all zeros
//!    (a run of zeros, zeros the application wrote) is not written and stays a hole, which
//!    reads the same: the staging file is this epoch's file's alone, and every attempt
//!    writes the same bytes at the same offsets; then sets the size, the
//!    identity attribute, fsyncs, and creates its part marker (with its domain's CRC32C);
//! 4. if every participant's marker exists, publishes: sets the identity with the combined
//!    checksum, renames to the final name (never replacing anything but a lower epoch's file or
//!    a link), fsyncs the directory, removes the markers. Otherwise it waits for the peers.
//!
//! When every file is published the epoch is journaled as drained, marked drained in the store
//! and GC runs. Failures (PFS or peers) are retried with exponential backoff capped at
//! `retry_backoff_ms_max`, shown in status; nothing is freed meanwhile. After
//! `quarantine_after_failures` failures, or a panic (caught), the epoch is quarantined. While
//! clients are writing to this server, each PFS write is followed by a pause that caps drain
//! bandwidth at `ingest_bandwidth_share` of the bandwidth measured when idle.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use spillway_client::{Client, ClientOptions, FileHandle};
use spillway_proto::{DrainInfo, DrainState, Endpoint, EpochState, ErrorCode, FileInfo};
use spillway_server::{Backend, BackendError, DrainControl, IngestProbe};
use spillway_types::EpochId;

use crate::journal::{DrainMode, Journal, JournalError};
use crate::peer_ids::{PeerIds, PeerIdsError, Seen};
use crate::pfs::{AtFinalName, IoBuffer, Pfs, PfsError, PfsFile, PfsOwner, PublishedIdentity};
use crate::plan::{chunk_writes, held_chunks, naive_writes, partition_domains, read_plan};
use crate::staging_key::StagingKey;
use crate::survivors::{FileLoss, View};

/// Drainer settings (from the `[drain]` knobs).
#[derive(Clone, Debug)]
pub struct DrainerOptions {
    /// The reservation's servers in order (the same list clients use); this server included.
    pub peers: Vec<Endpoint>,
    /// This server's position in `peers`.
    pub self_index: usize,
    pub stripe_bytes: u64,
    pub write_bytes_max: u64,
    pub default_mode: DrainMode,
    pub drain_after_commit: bool,
    /// Share (0, 1] of the measured PFS bandwidth the drain may use while ingest is active.
    pub ingest_bandwidth_share: f64,
    /// Ingest counts as active until it has not moved for this long (250 ms in the server).
    pub ingest_idle_after: Duration,
    pub retry_backoff_min: Duration,
    pub retry_backoff_max: Duration,
    /// Epochs queued at once; more requests are refused with `Busy`.
    pub queued_epochs_max: usize,
    /// Failed attempts after which an epoch's drain is quarantined (0: never).
    pub quarantine_after_failures: u32,
    /// Name for logs.
    pub server_name: String,
    /// The servers' secret behind staging names (the same for every server of a reservation).
    pub staging_key: StagingKey,
    /// The `munged` socket for the credentials of the drain's peer connections when the
    /// servers require munge authentication (the server's `server.munge_socket`; `None`:
    /// libmunge's default). The drain runs as the server's uid (root).
    pub munge_socket: Option<std::path::PathBuf>,
}

/// Why one drain attempt failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DrainError {
    #[error(transparent)]
    Pfs(#[from] PfsError),
    #[error("peer: {0}")]
    Peer(#[from] spillway_client::ClientError),
    #[error("local store: {0}")]
    Store(BackendError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("file name {name:?} of epoch {epoch} cannot be a PFS path (absolute or has `..`)")]
    BadName { epoch: EpochId, name: String },
    #[error("this server (index {index}) is not among the servers holding {name:?}: server list differs between servers?")]
    NotParticipant { index: usize, name: String },
    #[error("mount file names: {0}")]
    Namespace(spillway_namespace::MetaError),
    #[error("PFS final name {path} holds {what}: not replaced and not taken as drained; move it aside and the drain's next attempt publishes")]
    FinalNameTaken { path: PathBuf, what: String },
    #[error("namespace {namespace} found on the servers belongs to epoch {found} (its data epoch), not to epoch {epoch} being drained (a reused namespace id): its paths are not this epoch's; refusing to publish")]
    NamespaceIncarnation { namespace: u64, found: EpochId, epoch: EpochId },
    #[error("staging file {path} vanished before its publish, and the final name holds {found}; the next attempt writes it again")]
    StagingVanished { path: PathBuf, found: String },
    #[error("drain attempt panicked: {0}")]
    Panicked(String),
    #[error(transparent)]
    Participants(#[from] crate::participants::ParticipantError),
    #[error("cannot reach {servers}: a lost server may hold parts of this epoch's files, so nothing is published and nothing freed until every server answers (the data stays in the burst buffer)")]
    PeersUnreachable { servers: String },
    #[error("{refusal}; the epoch's manifests do not allow draining from the survivors: {error}")]
    NoSurvivorDrain { error: crate::survivors::SurvivorError, refusal: String },
    #[error("epoch {epoch}: committed bytes are lost, no live server holds them: {losses}; lost with {servers}. Those files are not published (never with zeros in their place); the {published} file(s) held here whose every byte survives are; the epoch stays in the burst buffer (delete it to give it up)")]
    Lost { epoch: EpochId, losses: String, servers: String, published: usize },
    #[error("drain peer ids: {0}")]
    PeerIds(#[from] PeerIdsError),
    #[error("server {position} at {endpoint} was {lost} in failure domain {domain:?} and now answers as {now} (its host was replaced, its SSD gone) while epoch {epoch} was held here: the lost server may have held parts of its files, so nothing is published and nothing freed (the data stays in the burst buffer; delete the epoch to give it up)")]
    PeerReplaced {
        epoch: EpochId,
        position: usize,
        endpoint: String,
        lost: spillway_proto::ServerId,
        domain: String,
        now: spillway_proto::ServerId,
    },
}

/// Why starting the drainer failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("drain.self_index {index} is outside the server list of {count}")]
    SelfIndex { index: usize, count: usize },
    #[error("cannot start the drain thread: {0}")]
    Thread(std::io::Error),
    #[error(transparent)]
    PeerIds(#[from] PeerIdsError),
}

#[derive(Clone, Debug)]
struct EpochStatus {
    state: DrainState,
    mode: DrainMode,
    files_total: u64,
    files_done: u64,
    pfs_bytes_written: u64,
    pfs_write_calls: u64,
    shuffle_us: u64,
    flush_us: u64,
    /// PFS writes made while ingest was active, and the time paused to yield to it.
    yielded_writes: u64,
    yielded_us: u64,
    failed_attempts: u32,
    last_error: String,
    /// Files of this epoch a later epoch's file replaced on the PFS (same path).
    superseded: Vec<String>,
    /// The earliest time of the next attempt (backoff after a failure, poll while waiting).
    next_attempt: Option<Instant>,
    backoff: Duration,
    wait_poll: Duration,
}

impl EpochStatus {
    fn new(mode: DrainMode, state: DrainState) -> Self {
        EpochStatus {
            state,
            mode,
            files_total: 0,
            files_done: 0,
            pfs_bytes_written: 0,
            pfs_write_calls: 0,
            shuffle_us: 0,
            flush_us: 0,
            yielded_writes: 0,
            yielded_us: 0,
            failed_attempts: 0,
            last_error: String::new(),
            superseded: Vec::new(),
            next_attempt: None,
            backoff: Duration::ZERO,
            wait_poll: Duration::ZERO,
        }
    }
}

struct State {
    epochs: BTreeMap<EpochId, EpochStatus>,
    queue: VecDeque<EpochId>,
}

struct Inner {
    options: DrainerOptions,
    backend: Arc<dyn Backend>,
    pfs: Arc<dyn Pfs>,
    journal: Mutex<Journal>,
    state: Mutex<State>,
    wake: Condvar,
    stop: AtomicBool,
    ingest: Option<IngestProbe>,
    /// Observed at start, whenever the worker wakes (at least every 200 ms) and after every
    /// PFS write, so "active" means "clients wrote since about then".
    activity: Mutex<IngestActivity>,
    /// Each peer's id and failure domain when the drain last reached it (a server that no
    /// longer answers is named by them) and the replacements noticed, kept across restarts.
    peer_ids: Mutex<PeerIds>,
    /// Bytes written to the PFS by every drain since start (the metrics' counter).
    pfs_bytes_written_total: AtomicU64,
}

/// The running drainer. Dropping it (or [`Drainer::stop`]) stops the worker between writes; an
/// interrupted drain resumes from the journal at the next start.
pub struct Drainer {
    inner: Arc<Inner>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

enum Outcome {
    Done,
    /// Not all peers are ready (epoch open somewhere, or parts missing): poll again soon.
    Wait(String),
}

impl Drainer {
    /// Opens the journal in `journal_directory` (the server's SSD directory), re-queues every
    /// pending epoch and starts the worker.
    pub fn start(
        options: DrainerOptions,
        backend: Arc<dyn Backend>,
        pfs: Arc<dyn Pfs>,
        journal_directory: &Path,
        ingest: Option<IngestProbe>,
    ) -> Result<Drainer, StartError> {
        let journal = Journal::open(journal_directory, 4096)?;
        Drainer::start_with_journal(options, backend, pfs, journal, ingest)
    }

    /// [`Drainer::start`] with a journal opened by the caller (tests inject journal faults).
    pub fn start_with_journal(
        options: DrainerOptions,
        backend: Arc<dyn Backend>,
        pfs: Arc<dyn Pfs>,
        journal: Journal,
        ingest: Option<IngestProbe>,
    ) -> Result<Drainer, StartError> {
        if options.self_index >= options.peers.len() {
            return Err(StartError::SelfIndex {
                index: options.self_index,
                count: options.peers.len(),
            });
        }
        assert!(
            options.stripe_bytes > 0
                && options.write_bytes_max > 0
                && options.queued_epochs_max > 0
        );
        let mut state = State { epochs: BTreeMap::new(), queue: VecDeque::new() };
        let held: BTreeMap<EpochId, EpochState> = backend
            .epochs()
            .map(|l| l.into_iter().map(|e| (e.epoch, e.state)).collect())
            .unwrap_or_default();
        for (epoch, mode) in journal.pending() {
            tracing::info!(%epoch, %mode, "drain: resuming a journaled drain");
            state.epochs.insert(epoch, EpochStatus::new(mode, DrainState::Queued));
            state.queue.push_back(epoch);
        }
        for (epoch, mode, failed_attempts) in journal.quarantined_epochs() {
            let mut status = EpochStatus::new(mode, DrainState::Quarantined);
            status.failed_attempts = failed_attempts;
            status.last_error = format!(
                "quarantined after {failed_attempts} failed attempt(s) before this server \
                 started (the error is in its log); request the drain again to retry"
            );
            state.epochs.insert(epoch, status);
        }
        show_journaled_losses(&mut state, &journal);
        for epoch in journal.drained_epochs() {
            // Crash between the journal's Drained record and the store's mark: finish it.
            if let Some(s) = held.get(&epoch) {
                if *s != EpochState::Drained {
                    if let Err(e) = backend.mark_drained(epoch) {
                        tracing::warn!(%epoch, error = %e, "drain: cannot re-mark a journaled drained epoch");
                    }
                }
            }
            let mode = journal.get(epoch).map(|e| e.mode).unwrap_or(DrainMode::Shuffled);
            state.epochs.insert(epoch, EpochStatus::new(mode, DrainState::Drained));
        }
        let peer_ids = PeerIds::open(journal.directory(), &options.peers)?;
        let mut activity = IngestActivity::new(options.ingest_idle_after);
        if let Some(probe) = &ingest {
            activity.observe(probe.bytes_written(), Instant::now());
        }
        let inner = Arc::new(Inner {
            activity: Mutex::new(activity),
            peer_ids: Mutex::new(peer_ids),
            pfs_bytes_written_total: AtomicU64::new(0),
            options,
            backend,
            pfs,
            journal: Mutex::new(journal),
            state: Mutex::new(state),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            ingest,
        });
        let worker_inner = inner.clone();
        let worker = std::thread::Builder::new()
            .name("drain".into())
            .spawn(move || worker_inner.run())
            .map_err(StartError::Thread)?;
        Ok(Drainer { inner, worker: Mutex::new(Some(worker)) })
    }

    /// Queues `epoch` (journaled first). Idempotent.
    pub fn request(&self, epoch: EpochId, mode: DrainMode) -> Result<(), BackendError> {
        self.inner.request(epoch, mode)
    }

    /// Status of every epoch known to the drainer, oldest first.
    pub fn status(&self) -> Vec<DrainInfo> {
        self.inner.status()
    }

    /// How the drain of `epoch` yielded to ingest so far: PFS writes made while clients were
    /// writing to this server, and the total pause (`None`: epoch unknown to the drainer).
    pub fn yielded_to_ingest(&self, epoch: EpochId) -> Option<(u64, Duration)> {
        self.inner
            .state
            .lock()
            .epochs
            .get(&epoch)
            .map(|s| (s.yielded_writes, Duration::from_micros(s.yielded_us)))
    }

    /// Stops the worker (between two writes) and waits for it.
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.wake.notify_all();
        if let Some(worker) = self.worker.lock().take() {
            let _ = worker.join();
        }
    }
}

impl Drop for Drainer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl DrainControl for Drainer {
    fn request(&self, epoch: EpochId, mode: u8) -> Result<(), BackendError> {
        let mode = DrainMode::from_code(mode).ok_or_else(|| {
            BackendError::new(
                ErrorCode::InvalidArgument,
                format!("drain mode {mode}: expected 0 (naive) or 1 (shuffled)"),
            )
        })?;
        self.inner.request(epoch, mode)
    }
    fn committed(&self, epoch: EpochId) {
        if self.inner.options.drain_after_commit {
            if let Err(e) = self.inner.request(epoch, self.inner.options.default_mode) {
                tracing::warn!(%epoch, error = %e, "drain after commit: not queued");
            }
        }
    }
    fn status(&self) -> Vec<DrainInfo> {
        self.inner.status()
    }
    fn pfs_bytes_written_total(&self) -> u64 {
        self.inner.pfs_bytes_written_total.load(Ordering::Relaxed)
    }
}

/// Shown at start until the first attempt reports the loss again in full (files and ranges).
fn show_journaled_losses(state: &mut State, journal: &Journal) {
    for (epoch, lost_files) in journal.lost_epochs() {
        if let Some(status) = state.epochs.get_mut(&epoch) {
            status.last_error = format!(
                "{lost_files} file(s) of epoch {epoch} had committed bytes no live server holds \
                 when this server last tried (journaled); not published"
            );
        }
    }
}

/// Final PFS name, staging name and the part marker names of a file, and whose it is.
struct Names {
    final_path: PathBuf,
    staging: PathBuf,
    owner: PfsOwner,
    /// This server's index among the attempt's servers ([`View::me`]).
    me: usize,
    /// [`View::marker_tag`]: empty when every server of the list takes part.
    marker_tag: String,
}

impl Names {
    /// `<pfs>/epoch-<E>/<name>` of a file written through the native API.
    fn new(
        epoch: EpochId,
        name: &str,
        key: &StagingKey,
        owner: PfsOwner,
    ) -> Result<Names, DrainError> {
        let relative = checked_relative(epoch, name)?;
        let final_path = PathBuf::from(format!("epoch-{}", epoch.0)).join(relative);
        Ok(Names::with_staging(epoch, final_path, key, owner))
    }

    /// A mount file published under its namespace path (`<pfs>/<path>`, no epoch directory).
    fn published_as(
        epoch: EpochId,
        path: &str,
        key: &StagingKey,
        owner: PfsOwner,
    ) -> Result<Names, DrainError> {
        let final_path = checked_relative(epoch, path)?.to_path_buf();
        Ok(Names::with_staging(epoch, final_path, key, owner))
    }

    /// The staging name beside `final_path`: hidden, and unpredictable to users (a keyed hash
    /// every server of the reservation computes alike; see [`StagingKey`]).
    fn with_staging(
        epoch: EpochId,
        final_path: PathBuf,
        key: &StagingKey,
        owner: PfsOwner,
    ) -> Names {
        let base = final_path.file_name().expect("normal components").to_string_lossy();
        let token = key.token(epoch, &final_path);
        let staging = final_path
            .with_file_name(format!(".{base}.spillway-e{}-{token:016x}.staging", epoch.0));
        Names { final_path, staging, owner, me: 0, marker_tag: String::new() }
    }

    /// The names as the servers of `view` use them.
    fn in_view(self, view: &View) -> Names {
        Names { me: view.me, marker_tag: view.marker_tag.clone(), ..self }
    }

    fn marker(&self, server: usize) -> PathBuf {
        let mut s = self.staging.clone().into_os_string();
        s.push(format!(".part-{server}{}", self.marker_tag));
        PathBuf::from(s)
    }
}

/// Whose a mount file is on the PFS: its POSIX owner (with that user's groups), its permission
/// bits; directories made for it are open to traverse (the files' modes decide access).
fn mount_file_owner(uid: u32, gid: u32, mode: u32) -> PfsOwner {
    PfsOwner { identity: owner_identity(uid, gid), file_mode: mode & 0o777, directory_mode: 0o755 }
}

/// `uid` with primary group `gid` and its supplementary groups from the user database (only
/// `gid` if they cannot be read), so the PFS grants the owner exactly what it would grant them.
fn owner_identity(uid: u32, gid: u32) -> spillway_sys::identity::FileIdentity {
    let groups = spillway_sys::user::groups_of(uid, gid).unwrap_or_else(|_| vec![gid]);
    spillway_sys::identity::FileIdentity { uid, gid, groups }
}

/// `name` as a path relative to the PFS root: plain components only.
fn checked_relative(epoch: EpochId, name: &str) -> Result<&Path, DrainError> {
    let relative = Path::new(name);
    if name.is_empty()
        || relative.is_absolute()
        || relative.components().any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(DrainError::BadName { epoch, name: name.to_string() });
    }
    Ok(relative)
}

/// What the final name means for the file being drained (see [`judge_final_name`]).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Verdict {
    /// This drain published it (this epoch, this store file): done.
    Ours,
    /// Nothing there: publish without replacing.
    Free,
    /// An earlier epoch's drained file: the later commit (this one) replaces it.
    Supersedes(PublishedIdentity),
    /// A symbolic link (no data; someone planted it): the publish replaces it where the PFS
    /// lets the owner (not in a sticky directory of another user's: `EPERM`, retried).
    ReplaceLink(String),
    /// A later epoch's drained file: this one is superseded, not published.
    SupersededBy(PublishedIdentity),
    /// Something the drain did not publish (a user's own file, another user's, a link, a
    /// directory), or another file of this very epoch: never replaced, never taken as done.
    Taken(String),
}

/// The same-path rule (docs/semantics.md, "Drain"): only this epoch's own identity proves the
/// file is published; between drained files of different epochs the later commit (the higher
/// epoch id) wins.
fn judge_final_name(found: AtFinalName, epoch: EpochId, file: &str) -> Verdict {
    match found {
        AtFinalName::Absent => Verdict::Free,
        AtFinalName::Other(what) => Verdict::Taken(what),
        AtFinalName::Link(what) => Verdict::ReplaceLink(what),
        AtFinalName::Published(identity) => {
            if identity.epoch == epoch.0 && identity.file == file {
                Verdict::Ours
            } else if identity.epoch < epoch.0 {
                Verdict::Supersedes(identity)
            } else if identity.epoch > epoch.0 {
                Verdict::SupersededBy(identity)
            } else {
                Verdict::Taken(format!(
                    "file {:?} of the same epoch {} (two files of one epoch with one PFS path)",
                    identity.file, identity.epoch
                ))
            }
        }
    }
}

/// Whose turn it is among `ready` (owner uid, epoch) drains: the next owner after
/// `last_owner` in uid order (wrapping round), and that owner's oldest (lowest) epoch.
fn next_in_turn(ready: &[(u32, EpochId)], last_owner: Option<u32>) -> Option<(u32, EpochId)> {
    let first_owner = ready.iter().map(|(owner, _)| *owner).min()?;
    let owner = ready
        .iter()
        .map(|(owner, _)| *owner)
        .filter(|owner| last_owner.is_none_or(|last| *owner > last))
        .min()
        .unwrap_or(first_owner);
    let epoch = ready.iter().filter(|(o, _)| *o == owner).map(|(_, e)| *e).min()?;
    Some((owner, epoch))
}

/// The text of a caught panic.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        text.to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_string()
    }
}

/// Whether clients are writing to this server: the ingest counter moved within `idle_after`
/// of the time of an observation. Time is passed in (no clock inside), so tests drive it.
#[derive(Clone, Debug)]
pub struct IngestActivity {
    idle_after: Duration,
    last_bytes: Option<u64>,
    last_change: Option<Instant>,
}

impl IngestActivity {
    pub fn new(idle_after: Duration) -> Self {
        IngestActivity { idle_after, last_bytes: None, last_change: None }
    }

    /// Records the ingest counter read at `now`; true if ingest is active. The first
    /// observation only sets the baseline (activity before the drain started does not count).
    pub fn observe(&mut self, bytes_written: u64, now: Instant) -> bool {
        if self.last_bytes.is_some_and(|b| b != bytes_written) {
            self.last_change = Some(now);
        }
        self.last_bytes = Some(bytes_written);
        self.last_change.is_some_and(|t| now.saturating_duration_since(t) < self.idle_after)
    }
}

/// How long after the last client write ingest still counts as active.
pub const INGEST_IDLE_AFTER: Duration = Duration::from_millis(250);

/// The longest single pause after one PFS write.
pub const YIELD_PAUSE_MAX: Duration = Duration::from_secs(1);

/// The pause after a PFS write that took `took`, so that the drain runs at `share` of its
/// unthrottled speed while ingest is active (write time × (1/share − 1), at most
/// [`YIELD_PAUSE_MAX`]); no pause when ingest is idle or `share` ≥ 1. Pure: the drainer's
/// rate limiter, tested without a clock.
pub fn yield_pause(took: Duration, share: f64, ingest_active: bool) -> Duration {
    if !ingest_active || share >= 1.0 {
        return Duration::ZERO;
    }
    took.mul_f64(1.0 / share.max(0.01) - 1.0).min(YIELD_PAUSE_MAX)
}

/// Caps drain bandwidth while ingest is active; counts how often and how long it yielded.
struct Throttle<'a> {
    probe: Option<&'a IngestProbe>,
    activity: &'a Mutex<IngestActivity>,
    share: f64,
    yielded: u64,
    paused: Duration,
}

impl Throttle<'_> {
    /// After a write that took `took`: pause so that, while ingest is active, the drain runs at
    /// `share` of its unthrottled speed (the write itself measures that speed).
    fn after_write(&mut self, took: Duration) {
        let Some(probe) = self.probe else { return };
        let active = self.activity.lock().observe(probe.bytes_written(), Instant::now());
        let pause = yield_pause(took, self.share, active);
        if active {
            if self.yielded == 0 {
                tracing::info!(share = self.share, "drain: ingest active, yielding PFS bandwidth");
            }
            self.yielded += 1;
        }
        if !pause.is_zero() {
            self.paused += pause;
            std::thread::sleep(pause);
        }
    }
}

/// Counters of one file's part.
#[derive(Default)]
struct PartStats {
    bytes: u64,
    calls: u64,
    shuffle: Duration,
    flush: Duration,
    yielded_writes: u64,
    yielded: Duration,
    /// Shuffled parts: CRC32C of this server's whole domain (holes as zeros) and its length.
    domain_crc32c: Option<(u32, u64)>,
}

/// A shuffled part marker's content: the CRC32C and length of the participant's domain, which
/// the publisher combines into the file's checksum.
fn part_marker(domain_crc32c: Option<(u32, u64)>) -> String {
    domain_crc32c
        .map(|(crc, bytes)| format!("spillway-part/1 crc32c={crc:08x} bytes={bytes}\n"))
        .unwrap_or_default()
}

fn parse_part_marker(content: &[u8]) -> Option<(u32, u64)> {
    let text = std::str::from_utf8(content).ok()?.trim_end();
    let rest = text.strip_prefix("spillway-part/1 crc32c=")?;
    let (crc, bytes) = rest.split_once(" bytes=")?;
    Some((u32::from_str_radix(crc, 16).ok()?, bytes.parse().ok()?))
}

impl Inner {
    fn request(&self, epoch: EpochId, mode: DrainMode) -> Result<(), BackendError> {
        let mut state = self.state.lock();
        if let Some(s) = state.epochs.get(&epoch) {
            // A quarantined epoch is released by a new request; any other known one is
            // drained, queued or in progress.
            if s.state != DrainState::Quarantined
                && (s.state != DrainState::Queued || state.queue.contains(&epoch))
            {
                return Ok(());
            }
        }
        let pending = state.queue.len();
        if pending >= self.options.queued_epochs_max {
            return Err(BackendError::new(
                ErrorCode::Busy,
                format!("{pending} epochs already queued for drain (limit)"),
            ));
        }
        self.journal
            .lock()
            .request(epoch, mode)
            .map_err(|e| BackendError::new(ErrorCode::Io, format!("drain journal: {e}")))?;
        state.epochs.insert(epoch, EpochStatus::new(mode, DrainState::Queued));
        state.queue.push_back(epoch);
        self.wake.notify_all();
        Ok(())
    }

    fn status(&self) -> Vec<DrainInfo> {
        self.state
            .lock()
            .epochs
            .iter()
            .map(|(&epoch, s)| DrainInfo {
                epoch,
                state: s.state,
                mode: s.mode.code(),
                files_total: s.files_total,
                files_done: s.files_done,
                pfs_bytes_written: s.pfs_bytes_written,
                pfs_write_calls: s.pfs_write_calls,
                shuffle_us: s.shuffle_us,
                flush_us: s.flush_us,
                failed_attempts: s.failed_attempts,
                last_error: if s.superseded.is_empty() {
                    s.last_error.clone()
                } else {
                    let superseded = format!("superseded: {}", s.superseded.join("; "));
                    [s.last_error.as_str(), &superseded]
                        .into_iter()
                        .filter(|t| !t.is_empty())
                        .collect::<Vec<_>>()
                        .join("; ")
                },
            })
            .collect()
    }

    fn set(&self, epoch: EpochId, f: impl FnOnce(&mut EpochStatus)) {
        if let Some(s) = self.state.lock().epochs.get_mut(&epoch) {
            f(s);
        }
    }

    fn run(self: Arc<Self>) {
        let mut client: Option<Client> = None;
        let mut last_owner: Option<u32> = None;
        while !self.stop.load(Ordering::SeqCst) {
            if let Some(probe) = &self.ingest {
                self.activity.lock().observe(probe.bytes_written(), Instant::now());
            }
            let Some((epoch, mode)) = self.next_epoch(&mut last_owner) else { continue };
            self.set(epoch, |s| s.state = DrainState::Running);
            // One epoch's panicking attempt must not kill the worker (every other epoch's
            // drain) nor crash-loop the server at restart: it is caught and quarantined.
            let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.drain_epoch(&mut client, epoch, mode)
            }));
            let result = attempt.unwrap_or_else(|panic| {
                client = None;
                Err(DrainError::Panicked(panic_message(panic.as_ref())))
            });
            match result {
                Ok(Outcome::Done) => {
                    self.state.lock().queue.retain(|e| *e != epoch);
                }
                Ok(Outcome::Wait(why)) => self.set(epoch, |s| {
                    s.state = DrainState::Waiting;
                    s.last_error = why;
                    s.wait_poll = if s.wait_poll.is_zero() {
                        Duration::from_millis(20)
                    } else {
                        (s.wait_poll * 2).min(Duration::from_millis(500))
                    };
                    s.next_attempt = Some(Instant::now() + s.wait_poll);
                }),
                Err(error) => self.failed(&mut client, epoch, error),
            }
        }
    }

    /// The next epoch to attempt: among queued epochs whose backoff or poll delay is over,
    /// owners take turns (round robin by uid after `last_owner`), oldest epoch first within an
    /// owner. `None` after sleeping (until the earliest next attempt, at most 200 ms) when no
    /// epoch is ready, so one epoch's backoff never delays another's drain.
    fn next_epoch(&self, last_owner: &mut Option<u32>) -> Option<(EpochId, DrainMode)> {
        let now = Instant::now();
        let mut state = self.state.lock();
        let mut earliest: Option<Instant> = None;
        let mut ready: Vec<(u32, EpochId)> = Vec::new();
        for epoch in &state.queue {
            let Some(status) = state.epochs.get(epoch) else { continue };
            match status.next_attempt {
                Some(at) if at > now => earliest = Some(earliest.map_or(at, |e| e.min(at))),
                _ => ready.push((self.owner_uid(*epoch), *epoch)),
            }
        }
        let Some((owner, epoch)) = next_in_turn(&ready, *last_owner) else {
            let idle = Duration::from_millis(200);
            let sleep = earliest.map_or(idle, |at| at.saturating_duration_since(now).min(idle));
            self.wake.wait_for(&mut state, sleep);
            return None;
        };
        *last_owner = Some(owner);
        Some((epoch, state.epochs[&epoch].mode))
    }

    /// The uid an epoch's drain is queued under (its grant's owner; the server's own epochs
    /// are this process's).
    fn owner_uid(&self, epoch: EpochId) -> u32 {
        self.backend.grant(epoch).map_or(spillway_sys::user::euid(), |grant| grant.owner_uid)
    }

    /// A failed attempt: backs off this epoch only, or quarantines it after too many failures
    /// or a panic.
    fn failed(&self, client: &mut Option<Client>, epoch: EpochId, error: DrainError) {
        if matches!(error, DrainError::Peer(_) | DrainError::PeersUnreachable { .. }) {
            *client = None; // reconnect next time
        }
        let attempts_max = self.options.quarantine_after_failures;
        let mut quarantine = None;
        self.set(epoch, |s| {
            s.failed_attempts = s.failed_attempts.saturating_add(1);
            s.last_error = error.to_string();
            if matches!(error, DrainError::Panicked(_))
                || (attempts_max > 0 && s.failed_attempts >= attempts_max)
            {
                quarantine = Some(s.failed_attempts);
                return;
            }
            s.state = DrainState::Retrying;
            s.backoff = if s.backoff.is_zero() {
                self.options.retry_backoff_min
            } else {
                (s.backoff * 2).min(self.options.retry_backoff_max)
            };
            s.next_attempt = Some(Instant::now() + s.backoff);
            tracing::warn!(server = %self.options.server_name, %epoch, %error, failed_attempts = s.failed_attempts, retry_in_ms = s.backoff.as_millis() as u64, "drain attempt failed; data stays in the burst buffer");
        });
        if let Some(failed_attempts) = quarantine {
            self.quarantine(epoch, failed_attempts, &error);
        }
    }

    /// Gives `epoch` up: journaled (not resumed at restart), out of the queue, shown in status
    /// with its error; the data stays in the burst buffer until a new request releases it.
    fn quarantine(&self, epoch: EpochId, failed_attempts: u32, error: &DrainError) {
        tracing::error!(server = %self.options.server_name, %epoch, %error, failed_attempts, "drain quarantined: not retried until the drain is requested again; the data stays in the burst buffer");
        if let Err(journal_error) = self.journal.lock().quarantined(epoch, failed_attempts) {
            tracing::error!(%epoch, error = %journal_error, "drain: cannot journal the quarantine (it holds until this server restarts)");
        }
        let mut state = self.state.lock();
        state.queue.retain(|e| *e != epoch);
        if let Some(s) = state.epochs.get_mut(&epoch) {
            s.state = DrainState::Quarantined;
            s.next_attempt = None;
            s.last_error = format!(
                "quarantined after {failed_attempts} failed attempt(s): {error}; request the \
                 drain again to retry"
            );
        }
    }

    fn drain_epoch(
        &self,
        client: &mut Option<Client>,
        epoch: EpochId,
        mode: DrainMode,
    ) -> Result<Outcome, DrainError> {
        if let Some(outcome) = self.check_local_epoch(epoch)? {
            return Ok(outcome);
        }
        let connected = match self.connect_once(client) {
            Ok(connected) => connected,
            // A lost server: the manifests may show that the survivors hold every byte.
            Err(refusal @ DrainError::PeersUnreachable { .. }) => {
                return self.drain_from_survivors(epoch, mode, refusal);
            }
            Err(error) => return Err(error),
        };
        if let Some(summary) = connected.list_epochs()?.into_iter().find(|s| s.epoch == epoch) {
            if summary.state == EpochState::Open {
                return Ok(Outcome::Wait(format!("epoch {epoch} is still open on some server")));
            }
        }
        // Every peer was just asked (a replaced one answered with its new id).
        self.note_peers(connected)?;
        let files = self.local_files(epoch)?;
        let recorded = self.backend.participants(epoch);
        let checked = self
            .check_replacements(epoch)
            .and_then(|()| crate::participants::verify(connected, epoch, &recorded, &files));
        match checked {
            Ok(()) => {}
            // A replaced (or otherwise missing) server: as for a lost one.
            Err(refusal @ (DrainError::PeerReplaced { .. } | DrainError::Participants(_))) => {
                return self.drain_from_survivors(epoch, mode, refusal);
            }
            Err(error) => return Err(error),
        }
        // The last error stays shown until the drain succeeds.
        self.set(epoch, |s| s.files_total = files.len() as u64);
        let view = View::whole(&self.options.peers, self.options.self_index);
        if let Outcome::Wait(why) = self.drain_files(connected, epoch, mode, &files, &view)? {
            return Ok(Outcome::Wait(why));
        }
        self.finish_epoch(epoch, files.len())?;
        Ok(Outcome::Done)
    }

    /// The epoch's user files held here (the clients' own files, the epoch manifests, are
    /// never published).
    fn local_files(&self, epoch: EpochId) -> Result<Vec<FileInfo>, DrainError> {
        let mut files = self.backend.files(epoch).map_err(DrainError::Store)?;
        files.retain(|f| !f.name.starts_with(spillway_client::RESERVED_PREFIX));
        Ok(files)
    }

    /// Some server of the list is lost or replaced (`refusal` says which): with the epoch's
    /// manifests, drains every file whose written bytes all have a live holder from the live
    /// servers the manifests name; a file with lost bytes is not published and the attempt
    /// fails reporting the loss exactly (the epoch stays, retried, never freed). Without
    /// manifests the refusal stands.
    fn drain_from_survivors(
        &self,
        epoch: EpochId,
        mode: DrainMode,
        refusal: DrainError,
    ) -> Result<Outcome, DrainError> {
        let options = self.peer_client_options();
        let peers = &self.options.peers;
        let surveyed = crate::survivors::survey(peers, self.options.self_index, &options, epoch);
        let mut survivors = match surveyed {
            Ok(Some(survivors)) => survivors,
            Ok(None) => return Err(refusal),
            // Both: why the survivors alone are not enough, and who is lost.
            Err(error) => {
                return Err(DrainError::NoSurvivorDrain { error, refusal: refusal.to_string() })
            }
        };
        let client = &mut survivors.client;
        if let Some(summary) = client.list_epochs()?.into_iter().find(|s| s.epoch == epoch) {
            if summary.state == EpochState::Open {
                return Ok(Outcome::Wait(format!("epoch {epoch} is still open on some server")));
            }
        }
        let mut losses = survivors.losses.clone();
        let mut files = self.local_files(epoch)?;
        for file in &files {
            if !survivors.written.contains_key(&file.name) {
                losses.push(FileLoss { file: file.name.clone(), ranges: Vec::new() });
            }
        }
        let view = survivors.view.clone();
        let losses = self.unpublished(epoch, losses, &view)?;
        files.retain(|f| !losses.iter().any(|l| l.file == f.name));
        let lost_servers = survivors.lost_servers.join("; ");
        tracing::warn!(server = %self.options.server_name, %epoch, lost = %lost_servers, files = files.len(), "drain: draining from the surviving servers the epoch's manifests name");
        self.set(epoch, |s| s.files_total = files.len() as u64);
        if let Outcome::Wait(why) = self.drain_files(client, epoch, mode, &files, &view)? {
            return Ok(Outcome::Wait(why));
        }
        if losses.is_empty() {
            self.finish_epoch(epoch, files.len())?;
            return Ok(Outcome::Done);
        }
        let lost_files = u32::try_from(losses.len()).unwrap_or(u32::MAX);
        self.journal.lock().lost(epoch, lost_files)?;
        let losses = crate::survivors::describe_losses(&losses);
        tracing::error!(server = %self.options.server_name, %epoch, lost_servers = %lost_servers, lost = %losses, "drain: committed bytes of the epoch are lost (no live server holds them): those files are not published");
        Err(DrainError::Lost { epoch, losses, servers: lost_servers, published: files.len() })
    }

    /// Checks the epoch in the local store: `Some` when there is nothing to drain now.
    fn check_local_epoch(&self, epoch: EpochId) -> Result<Option<Outcome>, DrainError> {
        let local = match self
            .backend
            .epochs()
            .map_err(DrainError::Store)?
            .into_iter()
            .find(|e| e.epoch == epoch)
        {
            Some(e) => e,
            None => {
                tracing::warn!(%epoch, "drain: epoch is no longer in the burst buffer (deleted); dropping the request");
                self.journal.lock().drained(epoch)?;
                self.state.lock().epochs.remove(&epoch);
                return Ok(Some(Outcome::Done));
            }
        };
        match local.state {
            EpochState::Open => {
                Ok(Some(Outcome::Wait(format!("epoch {epoch} is not committed here yet"))))
            }
            EpochState::Drained => {
                self.journal.lock().drained(epoch)?;
                self.set(epoch, |s| s.state = DrainState::Drained);
                Ok(Some(Outcome::Done))
            }
            EpochState::CommittedMemory | EpochState::Committed => Ok(None),
        }
    }

    /// The client to the reservation's servers, connected on first use.
    fn connect_once<'c>(
        &self,
        client: &'c mut Option<Client>,
    ) -> Result<&'c mut Client, DrainError> {
        if client.is_none() {
            let options = self.peer_client_options();
            let connected = Client::connect(&self.options.peers, options.clone())
                .map_err(|error| self.unreachable_peers(error, &options))?;
            *client = Some(connected);
        }
        Ok(client.as_mut().expect("connected above"))
    }

    /// How the drain connects to its peers.
    fn peer_client_options(&self) -> ClientOptions {
        ClientOptions {
            client_name: format!("drainer of {}", self.options.server_name),
            transfer_bytes_max: 4 << 20,
            // Deep pipelining: a shuffle is many small reads when extents are small.
            window: 64,
            munge_socket: self.options.munge_socket.clone(),
            // One attempt to open a broken peer connection again: the drain's own retry
            // backoff paces the next, and a stopping server must not wait on a dead peer.
            reconnect_wait_max: Duration::ZERO,
            ..ClientOptions::default()
        }
    }

    /// Records each peer's id and failure domain; a peer answering with another id than seen
    /// before at its position is a replacement (the old server's SSD is gone): the epochs held
    /// here now are remembered as possibly missing its parts.
    fn note_peers(&self, client: &Client) -> Result<(), DrainError> {
        // Listed before any change is noticed: a store error fails the attempt rather than
        // recording a replacement that holds nothing back.
        let held: std::collections::BTreeSet<EpochId> = self
            .backend
            .epochs()
            .map_err(DrainError::Store)?
            .into_iter()
            .map(|e| e.epoch)
            .collect();
        let mut peer_ids = self.peer_ids.lock();
        peer_ids.retain_held(&held)?;
        for position in 0..client.server_count() {
            let domain = client.server_failure_domain(position);
            let now = Seen {
                id: client.server_identity(position).0,
                domain: if spillway_types::is_failure_domain(domain) { domain } else { "-" }
                    .to_string(),
                endpoint: self.options.peers[position].to_string(),
            };
            if let Some(r) = peer_ids.note(position, now, || held.clone())? {
                tracing::error!(server = %self.options.server_name, position, lost_id = %r.lost, lost_domain = %r.domain, new_id = %r.now, epochs = ?r.epochs, "drain: a peer answers with a new server id (its host was replaced): the epochs held here may miss its parts and are not published");
            }
        }
        Ok(())
    }

    /// Refuses `epoch` if a peer was replaced while this server held it.
    fn check_replacements(&self, epoch: EpochId) -> Result<(), DrainError> {
        let peer_ids = self.peer_ids.lock();
        let Some(r) = peer_ids.replacement_for(epoch) else { return Ok(()) };
        Err(DrainError::PeerReplaced {
            epoch,
            position: r.position,
            // A record from a longer peer list than this start's: named, not indexed.
            endpoint: self.options.peers.get(r.position).map_or_else(
                || {
                    format!(
                        "(position {} is beyond the {} peers now)",
                        r.position,
                        self.options.peers.len()
                    )
                },
                ToString::to_string,
            ),
            lost: r.lost,
            domain: r.domain.clone(),
            now: r.now,
        })
    }

    /// A failed connection to the reservation's servers, naming the ones that do not answer (a
    /// lost host): without them no epoch is published, since any of them may hold parts of
    /// its files (a file is published only with every holder's part).
    fn unreachable_peers(
        &self,
        error: spillway_client::ClientError,
        options: &ClientOptions,
    ) -> DrainError {
        let peer_ids = self.peer_ids.lock();
        let unreachable: Vec<String> = self
            .options
            .peers
            .iter()
            .enumerate()
            .filter_map(|(position, endpoint)| {
                let error =
                    Client::connect(std::slice::from_ref(endpoint), options.clone()).err()?;
                let seen = match peer_ids.seen(position) {
                    Some(Seen { id, domain, .. }) => {
                        format!("last seen as {id} in failure domain {domain:?}")
                    }
                    None => {
                        "not reached by this drain before: id and failure domain unknown".into()
                    }
                };
                Some(format!("server {position} at {endpoint}, {seen} ({error})"))
            })
            .collect();
        if unreachable.is_empty() {
            return error.into(); // they answer now: the next attempt connects
        }
        DrainError::PeersUnreachable { servers: unreachable.join(", ") }
    }

    /// Whose the files of `epoch` written through the native API are on the PFS: the owner of
    /// the epoch's grant (every server of a reservation holds the same grant), private modes;
    /// an epoch without a grant is the server's (root's).
    fn epoch_owner(&self, epoch: EpochId) -> PfsOwner {
        match self.backend.grant(epoch) {
            Some(grant) => PfsOwner {
                identity: owner_identity(grant.owner_uid, grant.owner_gid),
                file_mode: 0o600,
                directory_mode: 0o700,
            },
            None => PfsOwner::this_process(),
        }
    }

    /// Drains each file of the epoch; `Wait` if one waits for its peers or the drainer stops.
    fn drain_files(
        &self,
        client: &mut Client,
        epoch: EpochId,
        mode: DrainMode,
        files: &[FileInfo],
        view: &View,
    ) -> Result<Outcome, DrainError> {
        let mut done = 0u64;
        let mut waiting = None;
        // Mount files (`ns/<id>/<ino>.<gen>`) are published under their namespace paths.
        let mut namespace_names = crate::namespace_names::NamespaceNames::new(
            epoch,
            view.endpoints.clone(),
            self.options.munge_socket.clone(),
        );
        for file in files {
            let Some(names) = self.names_of(&mut namespace_names, epoch, &file.name, view)? else {
                done += 1;
                continue;
            };
            match self.drain_file(client, epoch, mode, file.file, &file.name, &names)? {
                Outcome::Done => done += 1,
                Outcome::Wait(why) => waiting = Some(why),
            }
            self.set(epoch, |s| s.files_done = done);
            if self.stop.load(Ordering::SeqCst) {
                return Ok(Outcome::Wait("stopping".into()));
            }
        }
        Ok(match waiting {
            Some(why) => Outcome::Wait(why),
            None => Outcome::Done,
        })
    }

    /// The PFS names of a file of `epoch` as the servers of `view` use them; `None` for a mount
    /// file whose path no longer exists (nothing to publish).
    fn names_of(
        &self,
        namespace_names: &mut crate::namespace_names::NamespaceNames,
        epoch: EpochId,
        file: &str,
        view: &View,
    ) -> Result<Option<Names>, DrainError> {
        let key = &self.options.staging_key;
        let names = match namespace_names.final_name(file)? {
            crate::namespace_names::FinalName::Unchanged => {
                Names::new(epoch, file, key, self.epoch_owner(epoch))?
            }
            crate::namespace_names::FinalName::Path { path, uid, gid, mode, owner_trusted } => {
                let owner = if owner_trusted {
                    mount_file_owner(uid, gid, mode)
                } else {
                    PfsOwner { file_mode: mode, directory_mode: 0o755, ..self.epoch_owner(epoch) }
                };
                Names::published_as(epoch, &path, key, owner)?
            }
            crate::namespace_names::FinalName::Dead => return Ok(None),
        };
        Ok(Some(names.in_view(view)))
    }

    /// The losses of the files not published yet: a file this drain published (read from a
    /// server that has freed the epoch since) lost nothing.
    fn unpublished(
        &self,
        epoch: EpochId,
        losses: Vec<FileLoss>,
        view: &View,
    ) -> Result<Vec<FileLoss>, DrainError> {
        let mut namespace_names = crate::namespace_names::NamespaceNames::new(
            epoch,
            view.endpoints.clone(),
            self.options.munge_socket.clone(),
        );
        let mut left = Vec::new();
        for loss in losses {
            let Some(names) = self.names_of(&mut namespace_names, epoch, &loss.file, view)? else {
                continue;
            };
            if self.settled_by_final_name(epoch, &loss.file, &names)?.is_none() {
                left.push(loss);
            }
        }
        Ok(left)
    }

    /// Journals the epoch as drained, marks it drained in the store and frees its space.
    fn finish_epoch(&self, epoch: EpochId, file_count: usize) -> Result<(), DrainError> {
        // Every file is under its final name and fsync'd: journal, then free.
        self.journal.lock().drained(epoch)?;
        self.backend.mark_drained(epoch).map_err(DrainError::Store)?;
        let freed = self.backend.collect_garbage().map_err(DrainError::Store)?;
        tracing::info!(server = %self.options.server_name, %epoch, files = file_count, bytes_freed = freed, "epoch drained to the PFS");
        self.set(epoch, |s| {
            s.state = DrainState::Drained;
            s.last_error.clear();
        });
        Ok(())
    }

    fn drain_file(
        &self,
        client: &mut Client,
        epoch: EpochId,
        mode: DrainMode,
        local_file: spillway_types::FileId,
        name: &str,
        names: &Names,
    ) -> Result<Outcome, DrainError> {
        if let Some(outcome) = self.settled_by_final_name(epoch, name, names)? {
            return Ok(outcome);
        }
        let handle = client.open_file(epoch, name)?;
        let participants = handle.servers();
        if let Some(outcome) = self.settled_by_final_name(epoch, name, names)? {
            return Ok(outcome);
        }
        let me = names.me;
        let position = participants
            .iter()
            .position(|&s| s == me)
            .ok_or_else(|| DrainError::NotParticipant { index: me, name: name.to_string() })?;
        if !self.pfs.holds_owned_file(&names.marker(me), &names.owner)? {
            self.pfs.create_parents(&names.staging, &names.owner)?;
            let stats = self.write_part(
                client,
                &handle,
                epoch,
                mode,
                local_file,
                position,
                participants.len(),
                names,
                name,
            )?;
            self.pfs_bytes_written_total.fetch_add(stats.bytes, Ordering::Relaxed);
            self.set(epoch, |s| {
                s.pfs_bytes_written += stats.bytes;
                s.pfs_write_calls += stats.calls;
                s.shuffle_us += stats.shuffle.as_micros() as u64;
                s.flush_us += stats.flush.as_micros() as u64;
                s.yielded_writes += stats.yielded_writes;
                s.yielded_us += stats.yielded.as_micros() as u64;
            });
            let marker = part_marker(stats.domain_crc32c);
            self.pfs.create_marker(&names.marker(me), &names.owner, marker.as_bytes())?;
        }
        let mut missing = Vec::new();
        for &server in &participants {
            if !self.pfs.holds_owned_file(&names.marker(server), &names.owner)? {
                missing.push(server);
            }
        }
        if !missing.is_empty() {
            if let Some(outcome) = self.settled_by_final_name(epoch, name, names)? {
                return Ok(outcome);
            }
            return Ok(Outcome::Wait(format!(
                "{name:?}: waiting for the parts of servers {missing:?}"
            )));
        }
        let size = client.file_size(&handle)?;
        let crc32c = self.file_crc32c(names, &participants, size)?;
        let identity = PublishedIdentity { epoch: epoch.0, size, crc32c, file: name.to_string() };
        self.publish(epoch, name, names, &identity, &participants)?;
        for &server in &participants {
            self.pfs.remove(&names.marker(server), &names.owner)?;
        }
        Ok(Outcome::Done)
    }

    /// `Some` when the final name settles the file without writing: it is this drain's
    /// (published earlier, maybe by a peer), or a later epoch's (this file is superseded). A
    /// final name holding anything the drain did not publish is an error (retried, data kept).
    fn settled_by_final_name(
        &self,
        epoch: EpochId,
        name: &str,
        names: &Names,
    ) -> Result<Option<Outcome>, DrainError> {
        let found = self.pfs.final_name_state(&names.final_path, &names.owner)?;
        match judge_final_name(found, epoch, name) {
            Verdict::Ours => Ok(Some(Outcome::Done)),
            Verdict::SupersededBy(newer) => {
                self.superseded(epoch, names, &newer)?;
                Ok(Some(Outcome::Done))
            }
            Verdict::Taken(what) => {
                Err(DrainError::FinalNameTaken { path: names.final_path.clone(), what })
            }
            Verdict::Free | Verdict::Supersedes(_) | Verdict::ReplaceLink(_) => Ok(None),
        }
    }

    /// The file's CRC32C from the participants' markers, in domain order; `None` unless every
    /// marker holds a domain checksum and together they cover the file (naive drains, parts
    /// written before checksums).
    fn file_crc32c(
        &self,
        names: &Names,
        participants: &[usize],
        size: u64,
    ) -> Result<Option<u32>, DrainError> {
        let mut crc = 0u32;
        let mut bytes = 0u64;
        for &server in participants {
            let content = self.pfs.read_marker(&names.marker(server), &names.owner, 256)?;
            let Some((part_crc, part_bytes)) = content.as_deref().and_then(parse_part_marker)
            else {
                return Ok(None);
            };
            crc = crc32c::crc32c_combine(crc, part_crc, part_bytes as usize);
            bytes = bytes.saturating_add(part_bytes);
        }
        Ok((bytes == size).then_some(crc))
    }

    /// Every part is written: records the file's identity (with its checksum) on the staging
    /// file and renames it to the final name, unless the final name changed meanwhile (see
    /// [`judge_final_name`]).
    fn publish(
        &self,
        epoch: EpochId,
        name: &str,
        names: &Names,
        identity: &PublishedIdentity,
        participants: &[usize],
    ) -> Result<(), DrainError> {
        let found = self.pfs.final_name_state(&names.final_path, &names.owner)?;
        let replace = match judge_final_name(found, epoch, name) {
            Verdict::Ours => return Ok(()), // a peer published first
            Verdict::SupersededBy(newer) => return self.superseded(epoch, names, &newer),
            Verdict::Taken(what) => {
                return Err(DrainError::FinalNameTaken { path: names.final_path.clone(), what })
            }
            Verdict::Free => false,
            Verdict::ReplaceLink(what) => {
                tracing::warn!(server = %self.options.server_name, %epoch, %what, "drain: replacing a symbolic link at a final name (not followed)");
                true
            }
            Verdict::Supersedes(older) => {
                tracing::warn!(server = %self.options.server_name, %epoch, path = %names.final_path.display(), older_epoch = older.epoch, older_file = %older.file, "drain: a later commit replaces an earlier epoch's file on the PFS (the earlier one is superseded)");
                // The earlier epoch's status says so too when this server drained it.
                let note = format!(
                    "{} superseded by epoch {} (file {})",
                    names.final_path.display(),
                    epoch,
                    name
                );
                if let Some(s) = self.state.lock().epochs.get_mut(&EpochId(older.epoch)) {
                    if !s.superseded.contains(&note) {
                        s.superseded.push(note);
                    }
                }
                true
            }
        };
        if !self.pfs.set_staging_identity(&names.staging, &names.owner, identity)? {
            // No staging file: a peer published it since the final name was judged.
            let found = self.pfs.final_name_state(&names.final_path, &names.owner)?;
            let verdict = judge_final_name(found, epoch, name);
            if verdict == Verdict::Ours {
                return Ok(());
            }
            // Someone removed it: the parts are gone with it, so their markers go too and
            // every participant writes its part again.
            for &server in participants {
                self.pfs.remove(&names.marker(server), &names.owner)?;
            }
            return Err(DrainError::StagingVanished {
                path: names.staging.clone(),
                found: format!("{verdict:?}"),
            });
        }
        if let Err(error) =
            self.pfs.publish(&names.staging, &names.final_path, &names.owner, replace)
        {
            // Something appeared under the final name since it was judged: a peer of this
            // drain (fine) or anything else (judged again at the next attempt).
            let found = self.pfs.final_name_state(&names.final_path, &names.owner)?;
            if judge_final_name(found, epoch, name) != Verdict::Ours {
                return Err(error.into());
            }
        }
        Ok(())
    }

    /// A later epoch's file holds the final name: this file is superseded. Reported (status,
    /// log); its staging file and this server's marker are removed; nothing else is touched.
    fn superseded(
        &self,
        epoch: EpochId,
        names: &Names,
        newer: &PublishedIdentity,
    ) -> Result<(), DrainError> {
        let note = format!(
            "{} superseded by epoch {} (file {})",
            names.final_path.display(),
            newer.epoch,
            newer.file
        );
        tracing::warn!(server = %self.options.server_name, %epoch, %note, "drain: a later commit holds this file's PFS name; this epoch's copy is not published");
        self.set(epoch, |s| {
            if !s.superseded.contains(&note) {
                s.superseded.push(note);
            }
        });
        self.pfs.remove(&names.staging, &names.owner)?;
        self.pfs.remove(&names.marker(names.me), &names.owner)?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn write_part(
        &self,
        client: &mut Client,
        handle: &FileHandle,
        epoch: EpochId,
        mode: DrainMode,
        local_file: spillway_types::FileId,
        position: usize,
        participants: usize,
        names: &Names,
        name: &str,
    ) -> Result<PartStats, DrainError> {
        let size = client.file_size(handle)?;
        let extents: Vec<(usize, u64, u64)> =
            client.extents(handle)?.into_iter().map(|(s, e)| (s, e.offset, e.length)).collect();
        let source = PartSource { handle, epoch, local_file, extents, me: names.me };
        let mut file = self.pfs.open_staging(&names.staging, &names.owner)?;
        let mut stats = PartStats::default();
        let mut throttle = Throttle {
            probe: self.ingest.as_ref(),
            activity: &self.activity,
            share: self.options.ingest_bandwidth_share,
            yielded: 0,
            paused: Duration::ZERO,
        };
        match mode {
            DrainMode::Shuffled => {
                let domain = partition_domains(size, participants, self.options.stripe_bytes)
                    [position]
                    .clone();
                self.write_shuffled(client, &source, domain, &mut file, &mut throttle, &mut stats)?;
            }
            DrainMode::Naive => self.write_naive(&source, &mut file, &mut throttle, &mut stats)?,
        }
        if self.stop.load(Ordering::SeqCst) {
            return Err(DrainError::Store(BackendError::new(
                ErrorCode::ShuttingDown,
                "drainer stopping mid-file",
            )));
        }
        stats.yielded_writes = throttle.yielded;
        stats.yielded = throttle.paused;
        let started = Instant::now();
        // Holes stay holes (held chunks of zeros too): the size is set here (ftruncate).
        file.extend_to(size)?;
        // The identity without the checksum, which the publisher adds from every part.
        let identity =
            PublishedIdentity { epoch: epoch.0, size, crc32c: None, file: name.to_string() };
        file.set_identity(&identity)?;
        file.set_mode(names.owner.file_mode)?;
        file.sync()?;
        stats.flush += started.elapsed();
        Ok(stats)
    }

    /// Shuffled: gathers this server's domain from every participant, writes it on a thread.
    fn write_shuffled(
        &self,
        client: &mut Client,
        source: &PartSource<'_>,
        domain: Range<u64>,
        file: &mut Box<dyn PfsFile>,
        throttle: &mut Throttle<'_>,
        stats: &mut PartStats,
    ) -> Result<(), DrainError> {
        let held: Vec<(u64, u64)> = source.extents.iter().map(|&(_, o, l)| (o, l)).collect();
        let chunks = held_chunks(
            &held,
            &domain,
            crate::pfs::DIRECT_IO_ALIGN as u64,
            self.options.write_bytes_max,
            self.options.stripe_bytes,
        );
        // Gather (shuffle) on this thread, write on another: two chunks in flight at most.
        let (tx, rx) = std::sync::mpsc::sync_channel::<(u64, IoBuffer)>(1);
        std::thread::scope(|scope| {
            let writer = scope.spawn(move || write_chunks(file, throttle, rx));
            let gathered = self.gather_chunks(client, source, &domain, chunks, tx, stats);
            let written = writer.join().expect("drain writer thread panicked");
            gathered?;
            let local = written?;
            stats.bytes += local.bytes;
            stats.calls += local.calls;
            stats.flush += local.flush;
            Ok(())
        })
    }

    /// Gathers the chunks in order for the writer thread, until the drainer stops or it fails.
    fn gather_chunks(
        &self,
        client: &mut Client,
        source: &PartSource<'_>,
        domain: &Range<u64>,
        chunks: Vec<Range<u64>>,
        gathered: SyncSender<(u64, IoBuffer)>,
        stats: &mut PartStats,
    ) -> Result<(), DrainError> {
        // The domain's checksum, holes (between chunks) as zeros.
        let mut crc = 0u32;
        let mut at = domain.start;
        // `gathered` is dropped on return, which ends the writer thread's loop.
        for chunk in chunks {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let started = Instant::now();
            let buffer = self.gather_chunk(client, source, &chunk)?;
            stats.shuffle += started.elapsed();
            crc = crc32c::crc32c_append(
                crate::plan::crc32c_append_zeros(crc, chunk.start - at),
                &buffer,
            );
            at = chunk.end;
            if gathered.send((chunk.start, buffer)).is_err() {
                return Ok(()); // the writer failed; write_shuffled reports its error
            }
        }
        crc = crate::plan::crc32c_append_zeros(crc, domain.end - at);
        stats.domain_crc32c = Some((crc, domain.end - domain.start));
        Ok(())
    }

    /// Reads one chunk of this server's domain: its own bytes from its store, the rest from peers.
    fn gather_chunk(
        &self,
        client: &mut Client,
        source: &PartSource<'_>,
        chunk: &Range<u64>,
    ) -> Result<IoBuffer, DrainError> {
        let me = source.me;
        // Aligned, so the PFS can take it with direct I/O.
        let mut buffer = IoBuffer::zeroed((chunk.end - chunk.start) as usize);
        // Each held byte from one holder (replicas: several hold it), this server's own first:
        // the peers' pieces are disjoint from ours and from each other.
        let mut wanted = Vec::new();
        let mut local = false;
        for (server, piece) in read_plan(&source.extents, chunk, Some(me), |_| true) {
            if server == me {
                local = true;
                continue;
            }
            for p in chunk_writes(piece, 1 << 20, 1 << 20) {
                wanted.push((server, p.start, p.end - p.start));
            }
        }
        // This server's own bytes come from its store directly (one read
        // of the whole chunk: its holes read as zeros), not over a socket;
        // then the peers' ranges are filled in.
        if local {
            self.backend
                .read(source.epoch, source.local_file, chunk.start, &mut buffer)
                .map_err(DrainError::Store)?;
        }
        client.read_ranges(source.handle, chunk.start, &mut buffer, wanted)?;
        Ok(buffer)
    }

    /// Naive: writes the extents this server holds where they fall, read from its store.
    fn write_naive(
        &self,
        source: &PartSource<'_>,
        file: &mut Box<dyn PfsFile>,
        throttle: &mut Throttle<'_>,
        stats: &mut PartStats,
    ) -> Result<(), DrainError> {
        // Bytes several servers hold (replicas) are written once, by the lowest-index holder:
        // every participant computes the same plan from the same extents.
        let me = source.me;
        let mine: Vec<(u64, u64)> = read_plan(&source.extents, &(0..u64::MAX), None, |_| true)
            .into_iter()
            .filter(|(server, _)| *server == me)
            .map(|(_, r)| (r.start, r.end - r.start))
            .collect();
        let mut buffer = Vec::new();
        for range in naive_writes(&mine, self.options.write_bytes_max) {
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            let started = Instant::now();
            buffer.resize((range.end - range.start) as usize, 0);
            self.backend
                .read(source.epoch, source.local_file, range.start, &mut buffer)
                .map_err(DrainError::Store)?;
            stats.shuffle += started.elapsed();
            if crate::plan::all_zeros(&buffer) {
                continue;
            }
            let started = Instant::now();
            file.write_at(range.start, &buffer)?;
            let took = started.elapsed();
            stats.flush += took;
            stats.bytes += buffer.len() as u64;
            stats.calls += 1;
            throttle.after_write(took);
        }
        Ok(())
    }
}

/// Where one file's part is read from: the file on the peers and in this server's store.
struct PartSource<'a> {
    handle: &'a FileHandle,
    epoch: EpochId,
    local_file: spillway_types::FileId,
    /// Every extent of the file: (server, offset, length).
    extents: Vec<(usize, u64, u64)>,
    /// This server's index among the attempt's servers.
    me: usize,
}

/// A shuffled part's writer thread: writes each chunk, starts its writeback, yields to ingest.
fn write_chunks(
    file: &mut Box<dyn PfsFile>,
    throttle: &mut Throttle<'_>,
    gathered: Receiver<(u64, IoBuffer)>,
) -> Result<PartStats, PfsError> {
    let mut local = PartStats::default();
    for (offset, buffer) in gathered {
        if crate::plan::all_zeros(&buffer) {
            continue;
        }
        let started = Instant::now();
        file.write_at(offset, &buffer)?;
        file.start_writeback(offset, buffer.len() as u64);
        let took = started.elapsed();
        local.flush += took;
        local.bytes += buffer.len() as u64;
        local.calls += 1;
        throttle.after_write(took);
    }
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_take_turns_and_each_owner_s_oldest_epoch_goes_first() {
        let e = EpochId;
        // uid 7 has three epochs queued, uid 3 one, uid 9 one (in request order).
        let mut ready = vec![(7, e(12)), (7, e(10)), (3, e(40)), (7, e(11)), (9, e(5))];
        let mut last = None;
        let mut order = Vec::new();
        while let Some((owner, epoch)) = next_in_turn(&ready, last) {
            order.push(epoch.0);
            last = Some(owner);
            ready.retain(|&(_, r)| r != epoch);
        }
        assert_eq!(order, vec![40, 10, 5, 11, 12]);
        assert_eq!(next_in_turn(&[], Some(3)), None);
    }

    #[test]
    fn only_our_identity_settles_a_file_and_the_later_epoch_wins_a_shared_path() {
        let id = |epoch, file: &str| PublishedIdentity {
            epoch,
            size: 10,
            crc32c: Some(1),
            file: file.into(),
        };
        let published = |epoch, file| AtFinalName::Published(id(epoch, file));
        let e = EpochId(5);
        assert_eq!(judge_final_name(AtFinalName::Absent, e, "ns/1/2.0"), Verdict::Free);
        assert_eq!(judge_final_name(published(5, "ns/1/2.0"), e, "ns/1/2.0"), Verdict::Ours);
        // Another reservation's epoch with the same POSIX path: never "done" by existing.
        assert_eq!(
            judge_final_name(published(4, "ns/1/2.0"), e, "ns/1/2.0"),
            Verdict::Supersedes(id(4, "ns/1/2.0"))
        );
        assert_eq!(
            judge_final_name(published(6, "ns/3/2.0"), e, "ns/1/2.0"),
            Verdict::SupersededBy(id(6, "ns/3/2.0"))
        );
        // Two files of one epoch on one path, and a file the drain did not publish: refused.
        assert!(matches!(
            judge_final_name(published(5, "ns/1/9.0"), e, "ns/1/2.0"),
            Verdict::Taken(_)
        ));
        assert!(matches!(
            judge_final_name(AtFinalName::Other("a user's file".into()), e, "x"),
            Verdict::Taken(_)
        ));
        assert!(matches!(
            judge_final_name(AtFinalName::Link("a planted link".into()), e, "x"),
            Verdict::ReplaceLink(_)
        ));
    }

    #[test]
    fn ingest_is_active_only_within_the_idle_window_after_the_counter_moved() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut a = IngestActivity::new(ms(250));
        // The baseline: bytes written before the drain started are not activity.
        assert!(!a.observe(1000, t0));
        assert!(!a.observe(1000, t0 + ms(100)));
        // The counter moves: active now and for 250 ms after the move.
        assert!(a.observe(5000, t0 + ms(200)));
        assert!(a.observe(5000, t0 + ms(449)));
        assert!(!a.observe(5000, t0 + ms(450)));
        assert!(!a.observe(5000, t0 + ms(10_000)));
        // It moves again much later: active again.
        assert!(a.observe(5001, t0 + ms(10_001)));
        // A clock that goes backwards (another thread's earlier reading) never panics.
        assert!(a.observe(5001, t0 + ms(10_000)));
    }

    #[test]
    fn the_pause_caps_drain_bandwidth_at_the_share_while_ingest_is_active() {
        let ms = Duration::from_millis;
        // Idle ingest or a share of 1: full speed.
        assert_eq!(yield_pause(ms(40), 0.25, false), Duration::ZERO);
        assert_eq!(yield_pause(ms(40), 1.0, true), Duration::ZERO);
        // Active: write time + pause = write time / share, so bandwidth is share × measured.
        for (share, took) in [(0.25, 40u64), (0.5, 10), (0.1, 7)] {
            let pause = yield_pause(ms(took), share, true);
            let effective = ms(took).as_secs_f64() / (ms(took) + pause).as_secs_f64();
            assert!((effective - share).abs() < 1e-9, "share {share}: got {effective}");
        }
        // Bounded: one slow write never stalls the drain for more than the cap.
        assert_eq!(yield_pause(Duration::from_secs(5), 0.25, true), YIELD_PAUSE_MAX);
        // A nonsensical tiny share is clamped instead of dividing by zero.
        assert_eq!(yield_pause(ms(1), 0.0, true), ms(99));
    }
}
