//! Stage-in and stage-out: copying files and directory trees between the PFS and a reservation.
//!
//! Runs in the process that asks for it (the `spillway stage-in|stage-out` CLI, i.e. the Slurm
//! hook), not in the manager: bulk data then flows directly between the PFS client and the burst
//! buffer servers instead of through the control plane, the manager stays responsive while a
//! large stage runs, and PFS files are read and written with the caller's own permissions. The
//! manager only says where the reservation lives (servers, epoch).
//!
//! - **Layout.** Files are created in the reservation's POSIX namespace (the one the job's
//!   mount shows: `spillway_client::meta::RemoteNamespace` on the server and with the id
//!   `spillway_policy::namespace::namespace_placement` gives for striped access), with their
//!   directories, permission bits and modification times; their bytes go where the mount
//!   reads them, the store file `ns/<namespace>/<ino>.<generation>` of the namespace's data
//!   epoch, striped over the reservation's servers with the client's default placement. The
//!   caller acts as itself; root acts as the reservation's owner, so the files are the
//!   owner's. A private reservation has a namespace per compute node: a stage names the node
//!   (`StageOptions::node`) and copies that node's namespace, which its mount created.
//! - **Parallel.** Up to `parallel_files` files at once, one client (its own connections) per
//!   worker; the queue is the file list itself, so nothing is unbounded.
//! - **Verified.** Every file's CRC32C is computed while it is read from the source, then the
//!   copy is read back from the destination and its CRC32C compared; a mismatch fails the stage
//!   naming the file.
//! - **Resumable.** After a file is verified, one JSON line (name, size, mtime, CRC) is appended
//!   to a progress record and fsync'd. A rerun skips files whose record matches the source and
//!   whose copy still has the recorded size, so an interrupted stage continues where it stopped.
//! - **Drained data.** With `drain_first`, stage-out commits the epoch on every server and
//!   drains it through the drain path first; a file whose drained copy already sits in the
//!   servers' PFS directory (under its path, or as its data file; complete: right size) is
//!   copied from there, not read again from the burst buffer — and not copied at all when the
//!   drain already published it exactly at the destination.
//! - **Progress.** A bar on a terminal, a line every few seconds otherwise ([`ProgressMode`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use spillway_client::{Client, ClientError, ClientOptions, Placement, ServerConnection};
use spillway_proto::{
    DrainInfo, DrainState, Durability, Endpoint, EpochState, ErrorCode, Request, Response,
};
use spillway_types::EpochId;

use spillway_client::meta::{RemoteNamespace, RemoteOptions};
use spillway_client::ns_snapshot::{Snapshot, SnapshotLoad};
use spillway_namespace::{
    data_file_name, parse_data_file_name, Attr as MetaAttr, Caller as MetaCaller, FileKind, Ino,
    MetaError, Namespace, NamespaceId, SetAttr, TimeSet, Timestamp, ROOT_INO,
};
use spillway_policy::namespace::{namespace_placement, NamespaceAccess};

use crate::model::{Access, Reservation};

/// Files one stage handles at most (bounds the file list).
pub const FILES_MAX: usize = 1_000_000;

/// Why a stage failed. Names the file, server or record at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    #[error("invalid path {path:?}: {reason}")]
    BadPath { path: String, reason: String },
    #[error("{path}: {source}")]
    Pfs { path: PathBuf, source: std::io::Error },
    #[error("reservation {reservation}: {source}")]
    BurstBuffer { reservation: String, source: ClientError },
    #[error("reservation {reservation} has no server endpoints usable from here: {reason}")]
    Servers { reservation: String, reason: String },
    #[error("checksum mismatch for {name}: wrote CRC32C {expected:08x}, read back {actual:08x}")]
    Checksum { name: String, expected: u32, actual: u32 },
    #[error("reservation {reservation} has nothing under {path:?}")]
    NothingToStage { reservation: String, path: String },
    #[error("more than {FILES_MAX} files under {path}")]
    TooManyFiles { path: String },
    #[error("reservation {reservation}, {what}: {error}")]
    Namespace { reservation: String, what: String, error: MetaError },
    #[error("reservation {reservation} is private (a namespace per compute node): name the node whose namespace to stage (--node NAME)")]
    Private { reservation: String },
    #[error("reservation {reservation} is striped (one namespace for all nodes): a stage of it names no node")]
    NodeOfStriped { reservation: String },
    #[error("reservation {reservation} has no namespace of node {node} yet: a node's namespace is made when that node mounts the reservation (did the job run on {node}?)")]
    NodeNamespaceMissing { reservation: String, node: String },
    #[error("reservation {reservation} is private: a stage-out of it reads one node's namespace, not through a drain of the shared epoch (its drained files of every node share their paths)")]
    PrivateDrain { reservation: String },
    #[error("progress record {path}: {source}")]
    Record { path: PathBuf, source: std::io::Error },
    #[error("drain of epoch {epoch} did not finish in {timeout:?}; last state: {state}")]
    DrainTimeout { epoch: u64, timeout: Duration, state: String },
    #[error("stage-out destination {dst}: its parent directory {parent} does not exist (an unmounted PFS looks like this); stage-out creates the destination and the directories below it, never above it")]
    DestinationParentMissing { dst: PathBuf, parent: PathBuf },
    #[error("drain of epoch {epoch} is quarantined on server {server} after repeated failures: {error}; the data stays in the burst buffer (fix the cause, then retry the stage-out)")]
    DrainQuarantined { epoch: u64, server: usize, error: String },
    #[error("drain of epoch {epoch} requested, but the reservation's servers have no PFS directory (server add --pfs)")]
    NoDrainDirectory { epoch: u64 },
    #[error("drain of epoch {epoch} got no PFS slot from the manager's drain scheduler: {message}; the data stays in the burst buffer (retry the stage-out)")]
    DrainSlot { epoch: u64, message: String },
    #[error("{what}: no PFS slot from the manager's drain scheduler: {message}; nothing was copied (retry the stage-out)")]
    PfsSlot { what: String, message: String },
    /// Staging out from a snapshot (the namespace's server is gone), a file's bytes are not
    /// what the snapshot names (changed since, or a forged size): not staged out.
    #[error("{name}: the namespace's snapshot names {expected} bytes in {data_name}, the burst buffer holds {held}: the file changed after the snapshot (or its size there is wrong), so it is not staged out (its bytes stay in the reservation)")]
    StaleSnapshot { name: String, data_name: String, expected: u64, held: String },
}

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// A bar redrawn in place on stderr (a terminal).
    Bar,
    /// A line on stderr every `interval` (logs, batch jobs).
    Lines { interval: Duration },
    /// Nothing.
    Silent,
}

impl ProgressMode {
    /// A bar when stderr is a terminal, periodic lines otherwise.
    pub fn for_stderr() -> ProgressMode {
        use std::io::IsTerminal;
        if std::io::stderr().is_terminal() {
            ProgressMode::Bar
        } else {
            ProgressMode::Lines { interval: Duration::from_secs(5) }
        }
    }
}

/// Settings of one stage.
#[derive(Clone, Debug)]
pub struct StageOptions {
    /// Files copied at once (1..=64).
    pub parallel_files: usize,
    /// Bytes per read and write request.
    pub chunk_bytes: usize,
    /// The progress record (created if missing).
    pub record_path: PathBuf,
    pub progress: ProgressMode,
    /// Stage-out: commit and drain the epoch through the drain path first.
    pub drain_first: bool,
    /// How long a `drain_first` drain may take.
    pub drain_timeout: Duration,
    /// Where the progress record is opened ([`PrivateRecordStore`]; tests inject faults).
    pub record_store: std::sync::Arc<dyn RecordStore>,
    /// The manager whose cross-job drain scheduler a `drain_first` drain and a stage-out's
    /// copy wait for (crate::tiering); `None`: they start at once.
    pub drain_slots: Option<std::sync::Arc<crate::ApiClient>>,
    /// A private reservation: the compute node whose namespace is staged (required there,
    /// refused for a striped one).
    pub node: Option<String>,
}

impl StageOptions {
    pub fn new(record_path: PathBuf) -> StageOptions {
        StageOptions {
            parallel_files: 4,
            chunk_bytes: 1 << 20,
            record_path,
            progress: ProgressMode::Silent,
            drain_first: false,
            drain_timeout: Duration::from_secs(600),
            record_store: std::sync::Arc::new(PrivateRecordStore),
            drain_slots: None,
            node: None,
        }
    }
}

/// What a stage did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageReport {
    pub files_total: u64,
    pub files_copied: u64,
    /// Already complete and verified by an earlier (interrupted) run.
    pub files_skipped: u64,
    pub bytes_total: u64,
    pub bytes_copied: u64,
    pub elapsed_ms: u64,
    /// Stage-out: files read from their drained PFS copy rather than from the burst buffer.
    pub files_from_drained_copy: u64,
}

/// One line of the progress record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct RecordEntry {
    /// The file's name in the reservation.
    name: String,
    size: u64,
    /// Source modification time (stage-in) or 0 (stage-out).
    mtime_ns: i128,
    crc32c: u32,
}

/// The default progress record for a stage: under the system temp dir, per uid, named by the
/// reservation and a hash of the two paths and the node (a private reservation's), so reruns of
/// the same stage find it.
pub fn default_record_path(
    direction: &str,
    reservation: &Reservation,
    src: &str,
    dst: &str,
    node: Option<&str>,
) -> PathBuf {
    let uid = spillway_sys::user::uid();
    let node = node.map(|n| format!("\0{n}")).unwrap_or_default();
    let key = crc32c::crc32c(format!("{src}\0{dst}{node}").as_bytes());
    std::env::temp_dir().join(format!("spillway-stage-{uid}")).join(format!(
        "{direction}-res{}-epoch{}-{key:08x}.jsonl",
        reservation.id, reservation.epoch
    ))
}

/// A normalized path inside a reservation: no leading `/`, no `.`/`..`, `/`-separated; "" is
/// the reservation's root.
pub fn reservation_path(path: &str) -> Result<String, StageError> {
    let mut parts = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => parts.push(
                part.to_str()
                    .ok_or_else(|| StageError::BadPath {
                        path: path.into(),
                        reason: "not UTF-8".into(),
                    })?
                    .to_string(),
            ),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(StageError::BadPath {
                    path: path.into(),
                    reason: "'..' is not allowed in a reservation path".into(),
                })
            }
        }
    }
    Ok(parts.join("/"))
}

fn join_name(base: &str, relative: &str) -> String {
    match (base.is_empty(), relative.is_empty()) {
        (true, _) => relative.to_string(),
        (false, true) => base.to_string(),
        (false, false) => format!("{base}/{relative}"),
    }
}

fn endpoints(reservation: &Reservation) -> Result<Vec<Endpoint>, StageError> {
    reservation
        .servers
        .iter()
        .map(|s| s.parse::<Endpoint>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|reason| StageError::Servers { reservation: reservation.name.clone(), reason })
}

fn connect(reservation: &Reservation) -> Result<Client, StageError> {
    // With replicas and every server's domain known, a lost server's copies are read elsewhere.
    let known: Option<Vec<String>> = reservation.server_domains.iter().cloned().collect();
    let failure_domains = match known {
        Some(domains) if reservation.replicas > 1 && domains.len() == reservation.servers.len() => {
            domains
        }
        _ => Vec::new(),
    };
    let options = ClientOptions {
        placement: Placement::striped_default(),
        durability: Durability::Ssd,
        replicas: reservation.replicas,
        client_name: format!("spillway stage pid {}", std::process::id()),
        failure_domains,
        ..Default::default()
    };
    let mut client = Client::connect(&endpoints(reservation)?, options)
        .map_err(|source| burst(reservation, source))?;
    if let Some(Some(dir)) = reservation.server_pfs_dirs.first() {
        client.set_pfs_fallback(dir);
    }
    Ok(client)
}

fn burst(reservation: &Reservation, source: ClientError) -> StageError {
    StageError::BurstBuffer { reservation: reservation.name.clone(), source }
}

/// One open progress record file. The seam between the record's logic and its file I/O, so
/// tests can inject EIO, ENOSPC, short writes and failed fsyncs ([`RecordStore`]).
pub trait RecordFile: Send {
    /// The whole record as it is now.
    fn read_all(&mut self) -> std::io::Result<Vec<u8>>;
    /// Appends a prefix of `bytes` (possibly shorter: a short write); how many bytes that was.
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<usize>;
    /// Makes what was appended durable (fsync of the data).
    fn sync(&mut self) -> std::io::Result<()>;
    /// Cuts the record back to `len` bytes (undoes an append that failed).
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
}

/// Where progress records are opened; [`PrivateRecordStore`] unless a test injects faults.
pub trait RecordStore: Send + Sync {
    /// Opens (creating) the record at `path`.
    fn open(&self, path: &Path) -> Result<Box<dyn RecordFile>, StageError>;
}

impl std::fmt::Debug for dyn RecordStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordStore")
    }
}

/// The real records: a plain file of the caller's in a private directory.
#[derive(Clone, Copy, Debug, Default)]
pub struct PrivateRecordStore;

impl RecordFile for File {
    fn read_all(&mut self) -> std::io::Result<Vec<u8>> {
        use std::io::Seek;
        self.seek(std::io::SeekFrom::Start(0))?;
        let mut bytes = Vec::new();
        self.read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    fn append(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.write(bytes)
    }

    fn sync(&mut self) -> std::io::Result<()> {
        self.sync_data()
    }

    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.set_len(len)
    }
}

impl RecordStore for PrivateRecordStore {
    /// The record decides which files a rerun skips, and its default place is under the shared
    /// temporary directory, so nobody else may have put it, or the directory it is in, there:
    /// the directory must be this user's (created 0700) or root's, not writable by others
    /// unless sticky; the record a plain file of this user's, opened without following a link.
    fn open(&self, path: &Path) -> Result<Box<dyn RecordFile>, StageError> {
        let error = |source| StageError::Record { path: path.to_path_buf(), source };
        let refuse =
            |why: String| error(std::io::Error::new(std::io::ErrorKind::PermissionDenied, why));
        let uid = spillway_sys::user::euid();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(parent).map_err(error)?;
            let meta = std::fs::symlink_metadata(parent).map_err(error)?;
            let others_write = meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0;
            if !meta.is_dir() || (meta.uid() != uid && meta.uid() != 0) || others_write {
                return Err(refuse(format!(
                    "its directory {} is not a private directory of uid {uid} (owner uid {}, \
                     mode {:o}): someone else could plant or change the record; remove it or \
                     pass --record",
                    parent.display(),
                    meta.uid(),
                    meta.mode() & 0o7777
                )));
            }
        }
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(error)?;
        let meta = file.metadata().map_err(error)?;
        if !meta.is_file() || meta.uid() != uid {
            return Err(refuse(format!(
                "not a plain file of uid {uid} (owner uid {})",
                meta.uid()
            )));
        }
        Ok(Box::new(file))
    }
}

/// The progress record: entries of earlier runs, and an append handle.
struct Record {
    path: PathBuf,
    done: BTreeMap<String, RecordEntry>,
    file: Mutex<RecordHandle>,
}

/// The open record and its length after the last complete, durable append.
struct RecordHandle {
    file: Box<dyn RecordFile>,
    len: u64,
}

impl Record {
    /// Opens (creating) the record at `path` with the private store.
    #[cfg(test)]
    fn open(path: &Path) -> Result<Record, StageError> {
        Record::open_in(&PrivateRecordStore, path)
    }

    /// Opens (creating) the record at `path` in `store` and reads the entries of earlier runs.
    fn open_in(store: &dyn RecordStore, path: &Path) -> Result<Record, StageError> {
        let error = |source| StageError::Record { path: path.to_path_buf(), source };
        let mut file = store.open(path)?;
        let bytes = file.read_all().map_err(error)?;
        let mut done = BTreeMap::new();
        for line in bytes.split(|&b| b == b'\n') {
            // A torn last line (interrupted mid-append) is ignored: that file is redone.
            if let Ok(entry) = serde_json::from_slice::<RecordEntry>(line) {
                done.insert(entry.name.clone(), entry);
            }
        }
        let mut handle = RecordHandle { file, len: bytes.len() as u64 };
        // End a torn last line, so the next entry starts a line of its own (else it would be
        // glued to the fragment and lost to the next rerun).
        if bytes.last().is_some_and(|&b| b != b'\n') {
            handle.append_line(b"\n").map_err(error)?;
        }
        Ok(Record { path: path.to_path_buf(), done, file: Mutex::new(handle) })
    }

    /// Appends one entry and makes it durable. On any failure (EIO, ENOSPC, a write that stops
    /// short, a failed fsync) the record is cut back to what it held before, so it never names
    /// a file whose entry did not fully land: a rerun redoes exactly the files not recorded.
    fn append(&self, entry: &RecordEntry) -> Result<(), StageError> {
        let mut line = serde_json::to_vec(entry).expect("record entries serialize");
        line.push(b'\n');
        let mut handle = self.file.lock().unwrap_or_else(|p| p.into_inner());
        handle
            .append_line(&line)
            .map_err(|source| StageError::Record { path: self.path.clone(), source })
    }
}

impl RecordHandle {
    /// Writes all of `line` (looping over short writes) and syncs; undoes it on failure.
    fn append_line(&mut self, line: &[u8]) -> std::io::Result<()> {
        let mut written = 0;
        let result = loop {
            if written == line.len() {
                break self.file.sync();
            }
            match self.file.append(&line[written..]) {
                Ok(0) => {
                    break Err(std::io::Error::new(
                        std::io::ErrorKind::WriteZero,
                        format!(
                            "appending an entry stopped after {written} of {} bytes",
                            line.len()
                        ),
                    ))
                }
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        match result {
            Ok(()) => {
                self.len += line.len() as u64;
                Ok(())
            }
            Err(e) => {
                // Best effort: if the cut fails too, the partial line is a torn line a rerun
                // ignores (and ends); an entry whose fsync failed may survive, but it is true.
                let _ = self.file.truncate(self.len).and_then(|()| self.file.sync());
                Err(e)
            }
        }
    }
}

/// Shared progress counters and their display.
struct Progress {
    label: &'static str,
    mode: ProgressMode,
    files_total: u64,
    bytes_total: u64,
    files_done: AtomicU64,
    bytes_done: AtomicU64,
    started: Instant,
    last_shown: Mutex<Instant>,
}

impl Progress {
    fn new(
        label: &'static str,
        mode: ProgressMode,
        files_total: u64,
        bytes_total: u64,
    ) -> Progress {
        let now = Instant::now();
        Progress {
            label,
            mode,
            files_total,
            bytes_total,
            files_done: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
            started: now,
            last_shown: Mutex::new(now),
        }
    }

    fn add(&self, files: u64, bytes: u64) {
        self.files_done.fetch_add(files, Ordering::Relaxed);
        self.bytes_done.fetch_add(bytes, Ordering::Relaxed);
        self.show(false);
    }

    fn show(&self, last: bool) {
        let interval = match self.mode {
            ProgressMode::Silent => return,
            ProgressMode::Bar => Duration::from_millis(100),
            ProgressMode::Lines { interval } => interval,
        };
        let mut shown = self.last_shown.lock().unwrap_or_else(|p| p.into_inner());
        if !last && shown.elapsed() < interval {
            return;
        }
        *shown = Instant::now();
        let files = self.files_done.load(Ordering::Relaxed);
        let bytes = self.bytes_done.load(Ordering::Relaxed);
        let seconds = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = spillway_types::format_bytes((bytes as f64 / seconds) as u64);
        let text = format!(
            "{}: {files}/{} files, {}/{} ({rate}/s)",
            self.label,
            self.files_total,
            spillway_types::format_bytes(bytes),
            spillway_types::format_bytes(self.bytes_total)
        );
        match self.mode {
            ProgressMode::Bar => {
                const WIDTH: u64 = 30;
                let filled = (bytes.saturating_mul(WIDTH))
                    .checked_div(self.bytes_total)
                    .map_or(WIDTH, |f| f.min(WIDTH));
                let bar: String = (0..WIDTH).map(|i| if i < filled { '#' } else { '.' }).collect();
                eprint!("\r[{bar}] {text}\x1b[K{}", if last { "\n" } else { "" });
            }
            ProgressMode::Lines { .. } => eprintln!("{text}"),
            ProgressMode::Silent => {}
        }
    }
}

/// Runs `work` over `items` with at most `parallel` threads, each with its own state from
/// `init`; stops handing out items after the first error and returns it.
fn parallel<T: Sync, S>(
    items: &[T],
    parallel: usize,
    init: impl Fn() -> Result<S, StageError> + Sync,
    work: impl Fn(&mut S, &T) -> Result<(), StageError> + Sync,
) -> Result<(), StageError> {
    let next = AtomicU64::new(0);
    let failure: Mutex<Option<StageError>> = Mutex::new(None);
    let workers = parallel.clamp(1, 64).min(items.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                let fail = |e: StageError| {
                    failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                };
                let mut state = match init() {
                    Ok(state) => state,
                    Err(e) => return fail(e),
                };
                loop {
                    if failure.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                        return;
                    }
                    let index = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(item) = items.get(index) else { return };
                    if let Err(e) = work(&mut state, item) {
                        return fail(e);
                    }
                }
            });
        }
    });
    failure.into_inner().unwrap_or_else(|p| p.into_inner()).map_or(Ok(()), Err)
}

/// Maps an I/O error on `path` (a PFS file or directory) to a [`StageError`].
fn pfs_error(path: &Path) -> impl Fn(std::io::Error) -> StageError {
    let path = path.to_path_buf();
    move |source| StageError::Pfs { path: path.clone(), source }
}

/// A source file of a stage-in.
struct SourceFile {
    path: PathBuf,
    name: String,
    size: u64,
    mtime_ns: i128,
}

fn walk(root: &Path, base: &str, out: &mut Vec<SourceFile>) -> Result<(), StageError> {
    let pfs = pfs_error;
    let meta = std::fs::metadata(root).map_err(pfs(root))?;
    if meta.is_file() {
        out.push(SourceFile {
            path: root.to_path_buf(),
            name: base.to_string(),
            size: meta.len(),
            mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
        });
        return Ok(());
    }
    // Directories: breadth by sorted name, symlinks to directories are not followed (no loops).
    let mut stack = vec![(root.to_path_buf(), base.to_string())];
    while let Some((dir, prefix)) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map_err(pfs(&dir))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(pfs(&dir))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str() else {
                return Err(StageError::BadPath {
                    path: path.display().to_string(),
                    reason: "not UTF-8".into(),
                });
            };
            let name = join_name(&prefix, name);
            let kind = entry.file_type().map_err(pfs(&path))?;
            if kind.is_dir() {
                stack.push((path, name));
            } else {
                let meta = std::fs::metadata(&path).map_err(pfs(&path))?;
                if !meta.is_file() {
                    tracing::warn!(path = %path.display(), "not a regular file; not staged");
                    continue;
                }
                if out.len() >= FILES_MAX {
                    return Err(StageError::TooManyFiles { path: root.display().to_string() });
                }
                out.push(SourceFile {
                    path,
                    name,
                    size: meta.len(),
                    mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
                });
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(())
}

/// The reservation's namespace (striped access) and the identity staging acts as.
struct Tree {
    ns: RemoteNamespace,
    caller: MetaCaller,
    /// The data epoch of the namespace (where file bytes live).
    epoch: EpochId,
}

fn meta(reservation: &Reservation, what: &str, error: MetaError) -> StageError {
    StageError::Namespace { reservation: reservation.name.clone(), what: what.to_string(), error }
}

impl Tree {
    /// Opens (creating if needed, rooted at the reservation's owner) the namespace the job's
    /// mount shows: the reservation's one (striped), or `node`'s (private).
    fn open(
        reservation: &Reservation,
        node: Option<&str>,
        connections_max: usize,
    ) -> Result<Tree, StageError> {
        let name = || reservation.name.clone();
        let (access, node) = match (reservation.access, node) {
            (Access::Striped, None) => (NamespaceAccess::Striped, ""),
            (Access::Private, Some(node)) => (NamespaceAccess::Private, node),
            (Access::Striped, Some(_)) => {
                return Err(StageError::NodeOfStriped { reservation: name() })
            }
            (Access::Private, None) => return Err(StageError::Private { reservation: name() }),
        };
        let servers = endpoints(reservation)?;
        let place = namespace_placement(access, reservation.namespace_id, node, servers.len());
        let (uid, gid) = (spillway_sys::user::euid(), spillway_sys::user::egid());
        let options = RemoteOptions {
            // Only root may create namespaces on a server; the manager creates a striped
            // reservation's namespace when it creates the reservation.
            create: uid == 0,
            data_epoch: EpochId(reservation.epoch),
            root_uid: reservation.owner,
            root_gid: reservation.group,
            root_mode: 0o755,
            connections_max: connections_max.max(1),
            // SPILLWAY_MUNGE_SOCKET of the staging process, like its data clients.
            ..RemoteOptions::default()
        };
        let what = format!("opening namespace {} on {}", place.namespace, servers[place.server]);
        let endpoint = &servers[place.server];
        let ns = if options.create {
            let mut data = connect(reservation)?;
            RemoteNamespace::open_guarded(endpoint, place.namespace, &options, &mut data)
        } else {
            RemoteNamespace::open(endpoint, place.namespace, &options)
        }
        .map_err(|e| match access {
            NamespaceAccess::Private if e.errno == libc::ENOENT => {
                StageError::NodeNamespaceMissing { reservation: name(), node: node.to_string() }
            }
            _ => meta(reservation, &what, e),
        })?;
        let caller = if uid == 0 {
            MetaCaller {
                uid: reservation.owner,
                gid: reservation.group,
                groups: vec![reservation.group],
                pid: std::process::id(),
            }
        } else {
            MetaCaller {
                uid,
                gid,
                groups: spillway_sys::user::process_groups().unwrap_or_default(),
                pid: std::process::id(),
            }
        };
        let epoch = ns.data_epoch();
        Ok(Tree { ns, caller, epoch })
    }

    /// The inode at `path` ("" is the root), if it exists.
    fn resolve(
        &self,
        reservation: &Reservation,
        path: &str,
    ) -> Result<Option<MetaAttr>, StageError> {
        let mut attr = self.ns.getattr(ROOT_INO).map_err(|e| meta(reservation, "/", e))?;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            match self.ns.lookup(&self.caller, attr.ino, part.as_bytes()) {
                Ok(next) => attr = next,
                Err(e) if e.errno == libc::ENOENT => return Ok(None),
                Err(e) => return Err(meta(reservation, path, e)),
            }
        }
        Ok(Some(attr))
    }

    /// `mkdir -p path`; returns the directory's inode.
    fn make_dirs(&self, reservation: &Reservation, path: &str) -> Result<Ino, StageError> {
        let mut ino = ROOT_INO;
        let mut walked = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            walked = join_name(&walked, part);
            let attr = match self.ns.lookup(&self.caller, ino, part.as_bytes()) {
                Ok(attr) => attr,
                Err(e) if e.errno == libc::ENOENT => {
                    match self.ns.mkdir(&self.caller, ino, part.as_bytes(), 0o755, 0o022) {
                        Ok(attr) => attr,
                        // Made meanwhile by a parallel stage: use it.
                        Err(e) if e.errno == libc::EEXIST => self
                            .ns
                            .lookup(&self.caller, ino, part.as_bytes())
                            .map_err(|e| meta(reservation, &walked, e))?,
                        Err(e) => return Err(meta(reservation, &walked, e)),
                    }
                }
                Err(e) => return Err(meta(reservation, &walked, e)),
            };
            if attr.kind != FileKind::Directory {
                return Err(StageError::BadPath {
                    path: walked,
                    reason: "exists in the reservation and is not a directory".into(),
                });
            }
            ino = attr.ino;
        }
        Ok(ino)
    }
}

fn split_parent(name: &str) -> (&str, &str) {
    name.rsplit_once('/').unwrap_or(("", name))
}

/// Reads `size` bytes of store file `name` back from the reservation and returns their CRC32C.
fn crc_in_reservation(
    client: &mut Client,
    reservation: &Reservation,
    epoch: EpochId,
    name: &str,
    size: u64,
    chunk: usize,
) -> Result<u32, StageError> {
    if size == 0 {
        return Ok(0);
    }
    let handle = client.open_file(epoch, name).map_err(|e| burst(reservation, e))?;
    let mut crc = 0u32;
    let mut buffer = vec![0u8; chunk];
    let mut offset = 0u64;
    while offset < size {
        let n = ((size - offset) as usize).min(chunk);
        client.read(&handle, offset, &mut buffer[..n]).map_err(|e| burst(reservation, e))?;
        crc = crc32c::crc32c_append(crc, &buffer[..n]);
        offset += n as u64;
    }
    Ok(crc)
}

/// Copies `src` (a file or a directory tree on the PFS) to `dst` in the reservation.
pub fn stage_in(
    reservation: &Reservation,
    src: &Path,
    dst: &str,
    options: &StageOptions,
) -> Result<StageReport, StageError> {
    let started = Instant::now();
    let base = reservation_path(dst)?;
    let mut files = Vec::new();
    walk(src, &base, &mut files)?;
    if files.iter().any(|f| f.name.is_empty()) {
        return Err(StageError::BadPath {
            path: dst.into(),
            reason: "a file needs a name inside the reservation".into(),
        });
    }
    let record = Record::open_in(options.record_store.as_ref(), &options.record_path)?;
    let tree = Tree::open(reservation, options.node.as_deref(), options.parallel_files + 1)?;
    let remaining = files_to_stage_in(&files, &record, &tree, reservation)?;
    // Directories first, one by one (parents before children), then files in parallel.
    let directories = make_parent_directories(&tree, reservation, &remaining.todo)?;
    let bytes_total: u64 = files.iter().map(|f| f.size).sum();
    let progress = Progress::new("stage-in", options.progress, files.len() as u64, bytes_total);
    progress.add(remaining.files_skipped, remaining.bytes_skipped);
    let stage = StageIn {
        reservation,
        tree: &tree,
        directories: &directories,
        record: &record,
        progress: &progress,
        chunk_bytes: options.chunk_bytes.clamp(4096, 16 << 20),
    };
    parallel(
        &remaining.todo,
        options.parallel_files,
        || connect(reservation),
        |client, file| stage.copy_file(client, file),
    )?;
    tree.ns.sync().map_err(|e| meta(reservation, "sync", e))?;
    progress.show(true);
    Ok(StageReport {
        files_total: files.len() as u64,
        files_copied: remaining.todo.len() as u64,
        files_skipped: remaining.files_skipped,
        bytes_total,
        bytes_copied: bytes_total.saturating_sub(remaining.bytes_skipped),
        elapsed_ms: started.elapsed().as_millis() as u64,
        files_from_drained_copy: 0,
    })
}

/// The files a stage still copies, and what earlier runs completed and verified.
struct Remaining<T> {
    todo: Vec<T>,
    files_skipped: u64,
    bytes_skipped: u64,
}

/// Splits the files into those to copy and those an earlier run completed.
fn files_to_stage_in<'a>(
    files: &'a [SourceFile],
    record: &Record,
    tree: &Tree,
    reservation: &Reservation,
) -> Result<Remaining<&'a SourceFile>, StageError> {
    // Files complete and verified by an earlier run: same source, the namespace has the file
    // with the recorded size.
    let mut remaining = Remaining { todo: Vec::new(), files_skipped: 0, bytes_skipped: 0 };
    for file in files.iter() {
        let complete = match record.done.get(&file.name) {
            Some(entry) if entry.size == file.size && entry.mtime_ns == file.mtime_ns => tree
                .resolve(reservation, &file.name)?
                .is_some_and(|attr| attr.kind == FileKind::Regular && attr.size == file.size),
            _ => false,
        };
        if complete {
            remaining.files_skipped += 1;
            remaining.bytes_skipped += file.size;
        } else {
            remaining.todo.push(file);
        }
    }
    Ok(remaining)
}

/// Makes the parent directories of the files to copy; returns their inodes by path.
fn make_parent_directories(
    tree: &Tree,
    reservation: &Reservation,
    todo: &[&SourceFile],
) -> Result<BTreeMap<String, Ino>, StageError> {
    let mut directories: BTreeMap<String, Ino> = BTreeMap::new();
    for file in todo {
        let (parent, _) = split_parent(&file.name);
        if !directories.contains_key(parent) {
            let ino = tree.make_dirs(reservation, parent)?;
            directories.insert(parent.to_string(), ino);
        }
    }
    Ok(directories)
}

/// What the workers of a stage-in share.
struct StageIn<'a> {
    reservation: &'a Reservation,
    tree: &'a Tree,
    /// The inode of every parent directory, by path.
    directories: &'a BTreeMap<String, Ino>,
    record: &'a Record,
    progress: &'a Progress,
    chunk_bytes: usize,
}

impl StageIn<'_> {
    /// Copies one file into the reservation, verifies the copy and records it as done.
    fn copy_file(&self, client: &mut Client, file: &SourceFile) -> Result<(), StageError> {
        let (reservation, tree) = (self.reservation, self.tree);
        let pfs = pfs_error(&file.path);
        let mut source = File::open(&file.path).map_err(&pfs)?;
        let mode = source.metadata().map_err(&pfs)?.mode() & 0o777;
        let attr = self.create_truncated(file, mode)?;
        let data_name = data_file_name(tree.ns.id(), attr.ino, attr.generation);
        let (size, crc) = self.write_data(client, &mut source, file, &data_name)?;
        self.set_size_and_mtime(file, attr.ino, size)?;
        let actual = crc_in_reservation(
            client,
            reservation,
            tree.epoch,
            &data_name,
            size,
            self.chunk_bytes,
        )?;
        if actual != crc {
            return Err(StageError::Checksum { name: file.name.clone(), expected: crc, actual });
        }
        self.record.append(&RecordEntry {
            name: file.name.clone(),
            size,
            mtime_ns: file.mtime_ns,
            crc32c: crc,
        })?;
        self.progress.add(1, 0);
        Ok(())
    }

    /// Creates the file (or finds it) in its parent directory and opens it truncated.
    fn create_truncated(&self, file: &SourceFile, mode: u32) -> Result<MetaAttr, StageError> {
        let (reservation, tree) = (self.reservation, self.tree);
        let (parent, leaf) = split_parent(&file.name);
        let parent_ino = self.directories[parent];
        let created = tree
            .ns
            .create(&tree.caller, parent_ino, leaf.as_bytes(), FileKind::Regular, mode, 0, 0, false)
            .map_err(|e| meta(reservation, &file.name, e))?;
        if created.kind != FileKind::Regular {
            return Err(StageError::BadPath {
                path: file.name.clone(),
                reason: "exists in the reservation and is not a regular file".into(),
            });
        }
        // Truncate (a new data generation: bytes of an earlier, interrupted copy are dead).
        tree.ns
            .open(&tree.caller, created.ino, libc::O_WRONLY | libc::O_TRUNC)
            .map_err(|e| meta(reservation, &file.name, e))
    }

    /// Writes the source's bytes to store file `data_name`; returns how many and their CRC32C.
    fn write_data(
        &self,
        client: &mut Client,
        source: &mut File,
        file: &SourceFile,
        data_name: &str,
    ) -> Result<(u64, u32), StageError> {
        let reservation = self.reservation;
        let pfs = pfs_error(&file.path);
        let epoch = self.tree.epoch;
        client.begin_epoch(epoch);
        let mut handle = client.create_file(epoch, data_name).map_err(|e| burst(reservation, e))?;
        let mut buffer = vec![0u8; self.chunk_bytes];
        let mut offset = 0u64;
        let mut crc = 0u32;
        loop {
            let n = read_full(source, &mut buffer).map_err(&pfs)?;
            if n == 0 {
                break;
            }
            crc = crc32c::crc32c_append(crc, &buffer[..n]);
            client.write(&mut handle, offset, &buffer[..n]).map_err(|e| burst(reservation, e))?;
            offset += n as u64;
            self.progress.add(0, n as u64);
        }
        client.flush().map_err(|e| burst(reservation, e))?;
        Ok((offset, crc))
    }

    /// Records the written size (if any) and the source's modification time in the namespace.
    fn set_size_and_mtime(&self, file: &SourceFile, ino: Ino, size: u64) -> Result<(), StageError> {
        let (reservation, tree) = (self.reservation, self.tree);
        if size > 0 {
            tree.ns.wrote(&tree.caller, ino, size).map_err(|e| meta(reservation, &file.name, e))?;
        }
        let mtime = Timestamp {
            seconds: file.mtime_ns.div_euclid(1_000_000_000) as i64,
            nanos: file.mtime_ns.rem_euclid(1_000_000_000) as u32,
        };
        let set = SetAttr { mtime: Some(TimeSet::At(mtime)), ..Default::default() };
        tree.ns.setattr(&tree.caller, ino, &set).map_err(|e| meta(reservation, &file.name, e))?;
        Ok(())
    }
}

fn read_full(source: &mut File, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buffer.len() {
        match source.read(&mut buffer[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

fn crc_of_file(path: &Path, chunk: usize) -> std::io::Result<(u64, u32)> {
    let mut file = File::open(path)?;
    let mut buffer = vec![0u8; chunk];
    let (mut size, mut crc) = (0u64, 0u32);
    loop {
        let n = read_full(&mut file, &mut buffer)?;
        if n == 0 {
            return Ok((size, crc));
        }
        crc = crc32c::crc32c_append(crc, &buffer[..n]);
        size += n as u64;
    }
}

/// Commits the epoch and drains it through the servers' drain path, waiting until every server
/// reports it drained. Before the commit, the namespace's name map goes into the epoch on every
/// server: the drain then keeps the files' paths even if the namespace's server is lost.
fn drain_epoch(
    reservation: &Reservation,
    tree: Option<&Tree>,
    client: &mut Client,
    options: &StageOptions,
) -> Result<(), StageError> {
    let timeout = options.drain_timeout;
    let epoch = EpochId(reservation.epoch);
    if reservation.server_pfs_dirs.iter().all(Option::is_none) {
        return Err(StageError::NoDrainDirectory { epoch: epoch.0 });
    }
    let summary = client
        .list_epochs()
        .map_err(|e| burst(reservation, e))?
        .into_iter()
        .find(|e| e.epoch == epoch);
    match summary.map(|s| s.state) {
        None | Some(EpochState::Drained) => return Ok(()), // nothing left in the burst buffer, or done
        Some(_) => {}
    }
    if let Some(tree) = tree {
        match store_snapshot(reservation, tree, client) {
            // Sealed already (an earlier stage-out): it keeps the snapshot it has. Full: the
            // snapshot only guards the paths against the namespace server's loss, and a
            // reservation filled to its last byte still stages out without it.
            Err(StageError::BurstBuffer { source, .. })
                if matches!(
                    source.code(),
                    Some(ErrorCode::EpochReadOnly | ErrorCode::NoSpace | ErrorCode::QuotaExceeded)
                ) =>
            {
                tracing::warn!(error = %source, "stage-out: no namespace snapshot stored; if the server holding the namespace is lost, its files drain under their store names");
            }
            other => {
                other?;
            }
        }
    }
    // Commit on every server holding the epoch: the data may have been written by other
    // processes (the job), so this client has not "touched" any server; send the commit
    // directly on each server's connection. Committing an already committed epoch is harmless.
    for endpoint in endpoints(reservation)? {
        commit_on(&endpoint, epoch).map_err(|e| burst(reservation, e))?;
    }
    // The PFS is shared with every other reservation's drains and jobs' direct PFS phases:
    // wait for the scheduler's slot (released when this returns).
    let label = format!("stage-out {} epoch {}", reservation.name, epoch.0);
    let mut slot = match &options.drain_slots {
        Some(api) => Some(
            crate::tiering::DrainSlot::acquire(api, &label, 0, timeout)
                .map_err(|e| StageError::DrainSlot { epoch: epoch.0, message: e.to_string() })?,
        ),
        None => None,
    };
    client.request_drain(epoch, 1).map_err(|e| burst(reservation, e))?;
    wait_drained(reservation, client, epoch, timeout, slot.as_mut())
}

/// Waits until every server reports the epoch drained, renewing the drain's PFS slot and
/// recording the bytes it moved.
fn wait_drained(
    reservation: &Reservation,
    client: &mut Client,
    epoch: EpochId,
    timeout: Duration,
    mut slot: Option<&mut crate::tiering::DrainSlot<'_>>,
) -> Result<(), StageError> {
    let deadline = Instant::now() + timeout;
    let mut renewed = Instant::now();
    loop {
        let status = client.drain_status().map_err(|e| burst(reservation, e))?;
        let infos: Vec<(usize, &DrainInfo)> = status
            .iter()
            .flat_map(|(server, list)| {
                list.iter().filter(|d| d.epoch == epoch).map(|d| (*server, d))
            })
            .collect();
        if !infos.is_empty() && infos.iter().all(|(_, d)| d.state == DrainState::Drained) {
            if let Some(slot) = slot.as_deref_mut() {
                slot.bytes = summary_bytes(client, epoch);
            }
            return Ok(());
        }
        if let Some(slot) = slot.as_deref() {
            if renewed.elapsed() > DRAIN_SLOT_RENEW_INTERVAL {
                // A lost renewal only risks the slot's expiry, never the drain.
                let _ = slot.renew();
                renewed = Instant::now();
            }
        }
        // A quarantined drain is not retried by itself: waiting out the timeout would only hide
        // its error from the job.
        if let Some((server, d)) = infos.iter().find(|(_, d)| d.state == DrainState::Quarantined) {
            return Err(StageError::DrainQuarantined {
                epoch: epoch.0,
                server: *server,
                error: d.last_error.clone(),
            });
        }
        if Instant::now() > deadline {
            let state = infos
                .iter()
                .map(|(server, d)| match d.last_error.as_str() {
                    "" => format!("server {server}: {:?}", d.state),
                    error => format!("server {server}: {:?} ({error})", d.state),
                })
                .collect::<Vec<_>>()
                .join("; ");
            return Err(StageError::DrainTimeout { epoch: epoch.0, timeout, state });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How often a stage-out's drain renews its PFS slot (well inside `manager.drain_lease_s`).
const DRAIN_SLOT_RENEW_INTERVAL: Duration = Duration::from_secs(5);

/// The epoch's bytes over all servers (what a drain moved), 0 if unknown.
fn summary_bytes(client: &mut Client, epoch: EpochId) -> u64 {
    client
        .list_epochs()
        .ok()
        .and_then(|epochs| epochs.into_iter().find(|e| e.epoch == epoch))
        .map_or(0, |summary| summary.bytes)
}

/// The namespace's name map, stored in its data epoch on every server
/// (`spillway_client::ns_snapshot`); returns the number of files it names.
fn store_snapshot(
    reservation: &Reservation,
    tree: &Tree,
    client: &mut Client,
) -> Result<usize, StageError> {
    let entries = tree.ns.manifest().map_err(|e| meta(reservation, "reading its manifest", e))?;
    let taken_unix_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let snapshot =
        Snapshot { namespace: tree.ns.id(), data_epoch: tree.epoch, taken_unix_ns, entries };
    let files = snapshot.entries.len();
    client.store_namespace_snapshot(&snapshot).map_err(|e| burst(reservation, e))?;
    Ok(files)
}

/// `spillway reservation snapshot`: the namespace's name map stored in its data epoch on every
/// server now (what stage-out with its drain and Slurm's post_run do), so that losing the
/// namespace's server later loses no path. Returns the number of files it names.
pub fn snapshot_namespace(reservation: &Reservation) -> Result<usize, StageError> {
    let tree = Tree::open(reservation, None, 1)?;
    let mut client = connect(reservation)?;
    let files = store_snapshot(reservation, &tree, &mut client)?;
    // The snapshot is in the servers' DRAM logs: make it as durable as the data it names.
    client.sync_epoch(tree.epoch).map_err(|e| burst(reservation, e))?;
    Ok(files)
}

/// Whether opening the reservation's namespace failed because it is gone: its server cannot
/// be reached (EIO) or no longer has it (ENOENT; EIO from a guarded creation).
fn namespace_gone(error: &StageError) -> bool {
    matches!(error, StageError::Namespace { error, .. } if error.errno == libc::EIO || error.errno == libc::ENOENT)
}

/// The newest snapshot of the reservation's namespace in its data epoch, if any.
fn load_snapshot(reservation: &Reservation) -> Result<Option<Snapshot>, StageError> {
    let place =
        namespace_placement(NamespaceAccess::Striped, reservation.namespace_id, "", 1).namespace;
    let mut client = connect(reservation)?;
    let epoch = EpochId(reservation.epoch);
    match client.load_namespace_snapshot(epoch, place).map_err(|e| burst(reservation, e))? {
        SnapshotLoad::Found(snapshot) => Ok(Some(snapshot)),
        SnapshotLoad::Absent => Ok(None),
        SnapshotLoad::Damaged(why) => {
            tracing::warn!(reservation = %reservation.name, %why, "stage-out: the namespace's snapshot is damaged");
            Ok(None)
        }
    }
}

/// The snapshot's regular files at or under `path`, as [`tree_files`] lists a live namespace.
fn snapshot_files(
    snapshot: &Snapshot,
    reservation: &Reservation,
    path: &str,
) -> Result<Vec<TreeFile>, StageError> {
    let mut out = Vec::new();
    for entry in &snapshot.entries {
        let Some((_, ino, generation)) = parse_data_file_name(&entry.file_name) else { continue };
        let Ok(name) = std::str::from_utf8(&entry.path) else {
            tracing::warn!(path = %String::from_utf8_lossy(&entry.path), "not UTF-8; not staged out");
            continue;
        };
        let relative = if path.is_empty() {
            name
        } else if name == path {
            ""
        } else {
            match name.strip_prefix(path).and_then(|rest| rest.strip_prefix('/')) {
                Some(rest) => rest,
                None => continue,
            }
        };
        if out.len() >= FILES_MAX {
            return Err(StageError::TooManyFiles { path: path.to_string() });
        }
        let (name, relative) = (name.to_string(), relative.to_string());
        out.push(TreeFile { name, relative, ino, generation, size: entry.size });
    }
    if out.is_empty() {
        return Err(StageError::NothingToStage {
            reservation: reservation.name.clone(),
            path: path.to_string(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Commits `epoch` at SSD durability on one server, if that server has it.
fn commit_on(endpoint: &Endpoint, epoch: EpochId) -> Result<(), ClientError> {
    let mut connection = ServerConnection::connect(endpoint, "spillway stage-out commit", 1)?;
    match connection.call(&Request::ListEpochs { from_epoch: epoch }, &[], None)? {
        (Response::Epochs(list), ()) if list.first().is_some_and(|e| e.epoch == epoch) => {}
        _ => return Ok(()),
    }
    // Names no participants: stage-out only seals what the mount's writers left open.
    let commit = Request::Commit { epoch, durability: Durability::Ssd, participants: Vec::new() };
    match connection.call(&commit, &[], None)? {
        (Response::Committed { .. }, ()) => Ok(()),
        (other, ()) => Err(ClientError::UnexpectedReply {
            endpoint: endpoint.clone(),
            expected: "Committed",
            got: format!("{:?}", other.kind()),
        }),
    }
}

/// Whether two paths name the same existing file (same device and inode).
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// A file of the namespace to stage out.
#[derive(Clone)]
struct TreeFile {
    /// Path in the reservation.
    name: String,
    /// Path relative to the destination ("" when SRC is the file itself).
    relative: String,
    ino: Ino,
    generation: u64,
    size: u64,
}

/// Every regular file under `path` in the namespace (directories walked, symlinks and other
/// kinds skipped), sorted by name.
fn tree_files(
    tree: &Tree,
    reservation: &Reservation,
    path: &str,
) -> Result<Vec<TreeFile>, StageError> {
    let top = stage_out_top(tree, reservation, path)?;
    let mut out = Vec::new();
    if top.kind == FileKind::Regular {
        out.push(TreeFile {
            name: path.to_string(),
            relative: String::new(),
            ino: top.ino,
            generation: top.generation,
            size: top.size,
        });
        return Ok(out);
    }
    let mut stack = vec![(top.ino, String::new())];
    while let Some((dir, relative_dir)) = stack.pop() {
        let mut cookie = 0;
        loop {
            let entries = tree
                .ns
                .readdir(&tree.caller, dir, cookie, 256)
                .map_err(|e| meta(reservation, &join_name(path, &relative_dir), e))?;
            let Some(last) = entries.last() else { break };
            cookie = last.cookie;
            for entry in entries {
                if entry.name == b"." || entry.name == b".." {
                    continue;
                }
                let name =
                    String::from_utf8(entry.name.clone()).map_err(|_| StageError::BadPath {
                        path: join_name(path, &relative_dir),
                        reason: "an entry's name is not UTF-8".into(),
                    })?;
                let relative = join_name(&relative_dir, &name);
                match entry.kind {
                    FileKind::Directory => stack.push((entry.ino, relative)),
                    FileKind::Regular => {
                        let attr = tree
                            .ns
                            .getattr(entry.ino)
                            .map_err(|e| meta(reservation, &relative, e))?;
                        if out.len() >= FILES_MAX {
                            return Err(StageError::TooManyFiles { path: path.to_string() });
                        }
                        out.push(TreeFile {
                            name: join_name(path, &relative),
                            relative,
                            ino: attr.ino,
                            generation: attr.generation,
                            size: attr.size,
                        });
                    }
                    _ => {
                        tracing::warn!(path = %join_name(path, &relative), "not a regular file; not staged out")
                    }
                }
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The inode at `path` to stage out: it must exist and be a regular file or a directory.
fn stage_out_top(
    tree: &Tree,
    reservation: &Reservation,
    path: &str,
) -> Result<MetaAttr, StageError> {
    let Some(top) = tree.resolve(reservation, path)? else {
        return Err(StageError::NothingToStage {
            reservation: reservation.name.clone(),
            path: path.to_string(),
        });
    };
    match top.kind {
        FileKind::Regular | FileKind::Directory => Ok(top),
        _ => Err(StageError::BadPath {
            path: path.to_string(),
            reason: "neither a regular file nor a directory".into(),
        }),
    }
}

/// Where a stage-out's files come from.
struct Source {
    files: Vec<TreeFile>,
    namespace: NamespaceId,
    epoch: EpochId,
    /// From the namespace's snapshot (its server is gone), not from the namespace.
    from_snapshot: bool,
}

/// The files under `base` in the reservation's namespace, or, when the namespace is gone, in
/// its newest snapshot; the epoch drained first with `drain_first`.
fn stage_out_source(
    reservation: &Reservation,
    base: &str,
    options: &StageOptions,
) -> Result<Source, StageError> {
    if reservation.access == Access::Private && options.drain_first {
        return Err(StageError::PrivateDrain { reservation: reservation.name.clone() });
    }
    match Tree::open(reservation, options.node.as_deref(), options.parallel_files + 1) {
        Ok(tree) => {
            if options.drain_first {
                let mut client = connect(reservation)?;
                drain_epoch(reservation, Some(&tree), &mut client, options)?;
            }
            let files = tree_files(&tree, reservation, base)?;
            Ok(Source { files, namespace: tree.ns.id(), epoch: tree.epoch, from_snapshot: false })
        }
        // Snapshots are of a striped reservation's one namespace (post_run stores them).
        Err(error) if namespace_gone(&error) && reservation.access == Access::Striped => {
            // Its server is lost (or replaced): the files and paths of the newest snapshot.
            let Some(snapshot) = load_snapshot(reservation)? else { return Err(error) };
            tracing::warn!(reservation = %reservation.name, %error, files = snapshot.entries.len(), "stage-out: the namespace is gone; staging out the files of its snapshot");
            if options.drain_first {
                let mut client = connect(reservation)?;
                drain_epoch(reservation, None, &mut client, options)?;
            }
            let files = snapshot_files(&snapshot, reservation, base)?;
            let (namespace, epoch) = (snapshot.namespace, snapshot.data_epoch);
            Ok(Source { files, namespace, epoch, from_snapshot: true })
        }
        Err(error) => Err(error),
    }
}

/// Copies `src` (a file or directory in the reservation) to `dst` on the PFS.
pub fn stage_out(
    reservation: &Reservation,
    src: &str,
    dst: &Path,
    options: &StageOptions,
) -> Result<StageReport, StageError> {
    let started = Instant::now();
    let base = reservation_path(src)?;
    // Creating missing directories above the destination would write into the bare mount
    // point of a PFS that is not mounted, and report success.
    if let Some(parent) = dst.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.is_dir() {
            return Err(StageError::DestinationParentMissing {
                dst: dst.to_path_buf(),
                parent: parent.to_path_buf(),
            });
        }
    }
    let Source { files: selected, namespace, epoch, from_snapshot } =
        stage_out_source(reservation, &base, options)?;
    let drained_root: Option<PathBuf> = reservation
        .server_pfs_dirs
        .iter()
        .flatten()
        .next()
        .map(PathBuf::from)
        .filter(|_| options.drain_first);
    let record = Record::open_in(options.record_store.as_ref(), &options.record_path)?;
    let chunk_bytes = options.chunk_bytes.clamp(4096, 16 << 20);
    let remaining = files_to_stage_out(&selected, &record, dst, chunk_bytes);
    let bytes_total = selected.iter().fold(0u64, |total, f| total.saturating_add(f.size));
    let progress = Progress::new("stage-out", options.progress, selected.len() as u64, bytes_total);
    progress.add(remaining.files_skipped, remaining.bytes_skipped);
    let stage = StageOut {
        reservation,
        namespace,
        epoch,
        from_snapshot,
        dst,
        drained_root: drained_root.as_deref(),
        record: &record,
        progress: &progress,
        chunk_bytes,
        files_from_drained_copy: AtomicU64::new(0),
    };
    let bytes_copying = remaining.todo.iter().fold(0u64, |total, f| total.saturating_add(f.size));
    with_pfs_slot(
        options,
        &format!("stage-out {} {base}", reservation.name),
        bytes_copying,
        || {
            parallel(
                &remaining.todo,
                options.parallel_files,
                || connect(reservation),
                |client, file| stage.copy_file(client, file),
            )
        },
    )?;
    progress.show(true);
    Ok(StageReport {
        files_total: selected.len() as u64,
        files_copied: remaining.todo.len() as u64,
        files_skipped: remaining.files_skipped,
        bytes_total,
        bytes_copied: bytes_total.saturating_sub(remaining.bytes_skipped),
        elapsed_ms: started.elapsed().as_millis() as u64,
        files_from_drained_copy: stage.files_from_drained_copy.into_inner(),
    })
}

/// How often a stage-out copy renews its PFS slot's lease (`manager.drain_lease_s`, 60 s by
/// default, must not run out under a long copy).
const PFS_SLOT_RENEW_INTERVAL: Duration = Duration::from_secs(10);

/// Runs `copy` (`bytes` to the PFS) under a PFS slot of the manager's cross-job drain
/// scheduler when `options.drain_slots` names it: a stage-out's copy writes the PFS like a
/// drain, so it waits its turn (at most `drain_timeout`) and holds the slot, renewed, until done.
fn with_pfs_slot(
    options: &StageOptions,
    label: &str,
    bytes: u64,
    copy: impl FnOnce() -> Result<(), StageError>,
) -> Result<(), StageError> {
    let Some(api) = options.drain_slots.as_deref() else { return copy() };
    if bytes == 0 {
        return copy();
    }
    let mut slot = crate::tiering::DrainSlot::acquire(api, label, 0, options.drain_timeout)
        .map_err(|e| StageError::PfsSlot { what: label.to_string(), message: e.to_string() })?;
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let result = std::thread::scope(|scope| {
        let renewing = &slot;
        scope.spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(PFS_SLOT_RENEW_INTERVAL)
            {
                if let Err(error) = renewing.renew() {
                    tracing::warn!(%error, "renewing the stage-out's PFS slot failed");
                }
            }
        });
        let result = copy();
        drop(stop);
        result
    });
    slot.bytes = bytes;
    result
}

/// What the workers of a stage-out share.
struct StageOut<'a> {
    reservation: &'a Reservation,
    /// The namespace the files are of, and its data epoch.
    namespace: NamespaceId,
    epoch: EpochId,
    /// The files come from the namespace's snapshot (its server is gone), not from it.
    from_snapshot: bool,
    /// The destination on the PFS.
    dst: &'a Path,
    /// With `drain_first`: the servers' PFS directory, where drained copies may sit.
    drained_root: Option<&'a Path>,
    record: &'a Record,
    progress: &'a Progress,
    chunk_bytes: usize,
    files_from_drained_copy: AtomicU64,
}

/// Where a file of a stage-out goes on the PFS: `dst` itself, or `relative` under it.
fn stage_out_target(dst: &Path, relative: &str) -> PathBuf {
    if relative.is_empty() {
        dst.to_path_buf()
    } else {
        dst.join(relative)
    }
}

/// Splits the files into those to copy and those an earlier run copied.
fn files_to_stage_out(
    selected: &[TreeFile],
    record: &Record,
    dst: &Path,
    chunk_bytes: usize,
) -> Remaining<TreeFile> {
    // Already copied and verified by an earlier run: the destination still has the recorded
    // size and checksum.
    let mut remaining = Remaining { todo: Vec::new(), files_skipped: 0, bytes_skipped: 0 };
    for file in selected {
        let done = match record.done.get(&file.name) {
            Some(entry) if entry.size == file.size => {
                matches!(crc_of_file(&stage_out_target(dst, &file.relative), chunk_bytes), Ok((size, crc)) if size == entry.size && crc == entry.crc32c)
            }
            _ => false,
        };
        if done {
            remaining.files_skipped += 1;
            remaining.bytes_skipped += file.size;
        } else {
            remaining.todo.push(file.clone());
        }
    }
    remaining
}

impl StageOut<'_> {
    /// Copies one file to the PFS (from its drained copy if any), verifies it and records it.
    fn copy_file(&self, client: &mut Client, file: &TreeFile) -> Result<(), StageError> {
        let path = stage_out_target(self.dst, &file.relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(pfs_error(parent))?;
        }
        let data_name = data_file_name(self.namespace, file.ino, file.generation);
        let drained = self.drained_copy(file, &data_name);
        if let Some(copy) = &drained {
            if same_file(copy, &path) {
                // The drain published the file exactly where it is wanted: nothing to copy.
                return self.record_drained_in_place(file, copy);
            }
        }
        let partial = path.with_file_name(format!(
            ".{}.spillway-part",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("file")
        ));
        let mut out = File::create(&partial).map_err(pfs_error(&partial))?;
        let copied = match drained {
            Some(copy) => self.copy_from_drained(&copy, &mut out, &partial),
            None => self.copy_from_reservation(client, file, &data_name, &mut out, &partial),
        };
        let placed = copied.and_then(|(size, crc)| {
            verify_and_rename(out, &partial, &path, size, crc, self.chunk_bytes)?;
            Ok((size, crc))
        });
        // A copy that failed leaves no partial file behind on the PFS.
        let (size, crc) = placed.inspect_err(|_| {
            let _ = std::fs::remove_file(&partial);
        })?;
        self.record.append(&RecordEntry {
            name: file.name.clone(),
            size,
            mtime_ns: 0,
            crc32c: crc,
        })?;
        self.progress.add(1, 0);
        Ok(())
    }

    /// The file's complete drained copy on the PFS, if there is one.
    fn drained_copy(&self, file: &TreeFile, data_name: &str) -> Option<PathBuf> {
        // A complete drained copy: the drain already moved these bytes to the PFS, under the
        // file's path (when the drain publishes namespace paths) or under its data file's name
        // in the epoch's directory (`<pfs>/epoch-<E>/ns/<ns>/<ino>.<gen>`).
        self.drained_root.and_then(|root| {
            let epoch_dir = root.join(format!("epoch-{}", self.epoch.0));
            [root.join(&file.name), epoch_dir.join(&file.name), epoch_dir.join(data_name)]
                .into_iter()
                .find(|copy| {
                    std::fs::metadata(copy).is_ok_and(|m| m.is_file() && m.len() == file.size)
                })
        })
    }

    /// The drained copy is the destination itself: only records it as done.
    fn record_drained_in_place(&self, file: &TreeFile, copy: &Path) -> Result<(), StageError> {
        let (size, crc) = crc_of_file(copy, self.chunk_bytes).map_err(pfs_error(copy))?;
        self.record.append(&RecordEntry {
            name: file.name.clone(),
            size,
            mtime_ns: 0,
            crc32c: crc,
        })?;
        self.files_from_drained_copy.fetch_add(1, Ordering::Relaxed);
        self.progress.add(1, size);
        Ok(())
    }

    /// Copies the drained copy into the partial file; returns the bytes copied and their CRC32C.
    fn copy_from_drained(
        &self,
        copy: &Path,
        out: &mut File,
        partial: &Path,
    ) -> Result<(u64, u32), StageError> {
        let mut buffer = vec![0u8; self.chunk_bytes];
        let mut crc = 0u32;
        let mut offset = 0u64;
        let mut source = File::open(copy).map_err(pfs_error(copy))?;
        loop {
            let n = read_full(&mut source, &mut buffer).map_err(pfs_error(copy))?;
            if n == 0 {
                break;
            }
            crc = crc32c::crc32c_append(crc, &buffer[..n]);
            out.write_all(&buffer[..n]).map_err(pfs_error(partial))?;
            offset += n as u64;
            self.progress.add(0, n as u64);
        }
        self.files_from_drained_copy.fetch_add(1, Ordering::Relaxed);
        Ok((offset, crc))
    }

    /// Copies the file from the reservation into the partial file; returns bytes and CRC32C.
    fn copy_from_reservation(
        &self,
        client: &mut Client,
        file: &TreeFile,
        data_name: &str,
        out: &mut File,
        partial: &Path,
    ) -> Result<(u64, u32), StageError> {
        if file.size == 0 {
            return Ok((0, 0));
        }
        let (reservation, chunk) = (self.reservation, self.chunk_bytes);
        let mut buffer = vec![0u8; chunk];
        let mut crc = 0u32;
        let mut offset = 0u64;
        // A file whose bytes were never written (all holes) has no store file: zeros. Not so
        // from a snapshot, which may be older than the file: its bytes must be there, no more.
        let handle = match client.open_file(self.epoch, data_name) {
            Ok(handle) => Some(handle),
            Err(ClientError::NoSuchFile { .. }) if !self.from_snapshot => None,
            Err(ClientError::NoSuchFile { .. }) => return Err(self.stale(file, data_name, "none")),
            Err(e) => return Err(burst(reservation, e)),
        };
        if let (true, Some(handle)) = (self.from_snapshot, &handle) {
            // More: written after the snapshot. Less: a size its writers may have forged
            // (2^62 bytes of zeros onto the PFS), or a truncation upwards; neither is copied.
            let held = client.file_size(handle).map_err(|e| burst(reservation, e))?;
            if held != file.size {
                return Err(self.stale(file, data_name, &held.to_string()));
            }
        }
        while offset < file.size {
            let n = ((file.size - offset) as usize).min(chunk);
            match &handle {
                Some(handle) => client
                    .read(handle, offset, &mut buffer[..n])
                    .map_err(|e| burst(reservation, e))?,
                None => buffer[..n].fill(0),
            }
            crc = crc32c::crc32c_append(crc, &buffer[..n]);
            out.write_all(&buffer[..n]).map_err(pfs_error(partial))?;
            offset += n as u64;
            self.progress.add(0, n as u64);
        }
        Ok((offset, crc))
    }
}

impl StageOut<'_> {
    fn stale(&self, file: &TreeFile, data_name: &str, held: &str) -> StageError {
        StageError::StaleSnapshot {
            name: file.name.clone(),
            data_name: data_name.to_string(),
            expected: file.size,
            held: held.to_string(),
        }
    }
}

/// Syncs the partial copy, checks its size and CRC32C, renames it into place (dir fsync'd).
fn verify_and_rename(
    out: File,
    partial: &Path,
    path: &Path,
    size: u64,
    crc: u32,
    chunk_bytes: usize,
) -> Result<(), StageError> {
    out.sync_all().map_err(pfs_error(partial))?;
    drop(out);
    let (size_read, actual) = crc_of_file(partial, chunk_bytes).map_err(pfs_error(partial))?;
    if size_read != size || actual != crc {
        return Err(StageError::Checksum {
            name: path.display().to_string(),
            expected: crc,
            actual,
        });
    }
    std::fs::rename(partial, path).map_err(pfs_error(path))?;
    if let Some(parent) = path.parent() {
        File::open(parent).and_then(|d| d.sync_all()).map_err(pfs_error(parent))?;
    }
    Ok(())
}

/// Storage faults for the progress record (tests, and anyone checking a stage's behaviour):
/// a real record file (opened as [`PrivateRecordStore`] does) with a fault from one append on.
pub mod record_faults {
    use std::path::Path;

    use super::{PrivateRecordStore, RecordFile, RecordStore, StageError};

    /// What the injected record file does at its `at`th append call (0-based) and after.
    #[derive(Clone, Copy, Debug)]
    pub enum RecordFault {
        /// Fails the call with this errno.
        Errno(i32),
        /// Writes at most this many bytes per call (no error).
        Short(usize),
        /// Writes this many bytes, then the next call fails with EIO.
        ShortThenEio(usize),
        /// Writes nothing (returns 0).
        Zero,
        /// The write succeeds, the fsync after it fails with EIO.
        Fsync,
    }

    /// Opens real records (as [`PrivateRecordStore`]) that inject `fault` from their `at`th
    /// append call on.
    #[derive(Clone, Copy, Debug)]
    pub struct FaultyRecordStore {
        pub fault: RecordFault,
        pub at: usize,
    }

    struct FaultyRecordFile {
        file: Box<dyn RecordFile>,
        fault: RecordFault,
        at: usize,
        calls: usize,
        failed_once: bool,
        fail_sync: bool,
    }

    impl RecordFile for FaultyRecordFile {
        fn read_all(&mut self) -> std::io::Result<Vec<u8>> {
            self.file.read_all()
        }
        fn append(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let call = self.calls;
            self.calls += 1;
            if call < self.at {
                return self.file.append(bytes);
            }
            match self.fault {
                RecordFault::Errno(errno) => Err(std::io::Error::from_raw_os_error(errno)),
                RecordFault::Short(most) => self.file.append(&bytes[..bytes.len().min(most)]),
                RecordFault::ShortThenEio(most) if !self.failed_once => {
                    self.failed_once = true;
                    self.file.append(&bytes[..bytes.len().min(most)])
                }
                RecordFault::ShortThenEio(_) => Err(std::io::Error::from_raw_os_error(libc::EIO)),
                RecordFault::Zero => Ok(0),
                RecordFault::Fsync => {
                    self.fail_sync = true;
                    self.file.append(bytes)
                }
            }
        }
        fn sync(&mut self) -> std::io::Result<()> {
            if std::mem::take(&mut self.fail_sync) {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
            self.file.sync()
        }
        fn truncate(&mut self, len: u64) -> std::io::Result<()> {
            self.file.truncate(len)
        }
    }

    impl RecordStore for FaultyRecordStore {
        fn open(&self, path: &Path) -> Result<Box<dyn RecordFile>, StageError> {
            let file = PrivateRecordStore.open(path)?;
            Ok(Box::new(FaultyRecordFile {
                file,
                fault: self.fault,
                at: self.at,
                calls: 0,
                failed_once: false,
                fail_sync: false,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::record_faults::{FaultyRecordStore, RecordFault};
    use super::*;

    #[test]
    fn reservation_paths_are_normalized_and_confined() {
        assert_eq!(reservation_path("/input/").unwrap(), "input");
        assert_eq!(reservation_path("./a//b/./c").unwrap(), "a/b/c");
        assert_eq!(reservation_path("/").unwrap(), "");
        assert!(matches!(reservation_path("a/../../etc"), Err(StageError::BadPath { .. })));
        assert_eq!(join_name("", "x"), "x");
        assert_eq!(join_name("d", ""), "d");
        assert_eq!(join_name("d", "x"), "d/x");
    }

    #[test]
    fn walk_lists_regular_files_sorted_with_reservation_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("b/c")).unwrap();
        std::fs::write(dir.path().join("b/c/z"), b"zz").unwrap();
        std::fs::write(dir.path().join("a"), b"a").unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("b/loop")).unwrap();
        let mut files = Vec::new();
        walk(dir.path(), "in", &mut files).unwrap();
        let names: Vec<(&str, u64)> = files.iter().map(|f| (f.name.as_str(), f.size)).collect();
        assert_eq!(
            names,
            vec![("in/a", 1), ("in/b/c/z", 2)],
            "the symlink to a directory is not followed"
        );
    }

    #[test]
    fn record_survives_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let record = Record::open(&path).unwrap();
        record.append(&RecordEntry { name: "a".into(), size: 3, mtime_ns: 7, crc32c: 9 }).unwrap();
        drop(record);
        let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"{\"name\":\"b\",\"si").unwrap();
        let record = Record::open(&path).unwrap();
        assert_eq!(record.done.len(), 1);
        assert_eq!(record.done["a"].crc32c, 9);
    }

    fn entry(name: &str) -> RecordEntry {
        RecordEntry { name: name.into(), size: 3, mtime_ns: 7, crc32c: 9 }
    }

    /// EIO, ENOSPC, a write stopping short then failing, a zero-byte write and a failed fsync on
    /// the second append: that append fails naming the record and the cause, and the record
    /// holds exactly the first entry (cut back, no torn fragment), so a rerun redoes the second
    /// file and everything after it.
    #[test]
    fn a_failed_append_leaves_exactly_the_entries_that_landed() {
        let cases = [
            (RecordFault::Errno(libc::EIO), "Input/output error"),
            (RecordFault::Errno(libc::ENOSPC), "No space left on device"),
            (RecordFault::ShortThenEio(10), "Input/output error"),
            (RecordFault::Zero, "stopped after 0 of"),
            (RecordFault::Fsync, "Input/output error"),
        ];
        for (fault, cause) in cases {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("r.jsonl");
            let record = Record::open_in(&FaultyRecordStore { fault, at: 1 }, &path).unwrap();
            record.append(&entry("a")).unwrap();
            let error = record.append(&entry("b")).unwrap_err().to_string();
            assert!(error.contains("progress record") && error.contains(cause), "{error}");
            drop(record);
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(text.lines().count(), 1, "{cause}: {text:?}");
            assert!(text.ends_with('\n'), "{cause}: a fragment was left: {text:?}");
            let rerun = Record::open(&path).unwrap();
            assert_eq!(rerun.done.keys().collect::<Vec<_>>(), ["a"], "{cause}");
            rerun.append(&entry("b")).unwrap();
            assert_eq!(Record::open(&path).unwrap().done.len(), 2, "{cause}");
        }
    }

    /// Writes that stop short (a few bytes per call) are completed, not mistaken for failures.
    #[test]
    fn short_writes_are_completed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let record =
            Record::open_in(&FaultyRecordStore { fault: RecordFault::Short(5), at: 0 }, &path)
                .unwrap();
        for name in ["a", "b", "c"] {
            record.append(&entry(name)).unwrap();
        }
        drop(record);
        assert_eq!(Record::open(&path).unwrap().done.len(), 3);
    }

    /// A torn last line (a crash mid-append, before this code could cut it) is ended when the
    /// record is opened, so the next entry is not glued to it.
    #[test]
    fn a_torn_line_is_ended_before_the_next_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        std::fs::write(&path, b"{\"name\":\"a\",\"size\":3,\"mtime_ns\":7,\"crc32c\":9}\n{\"na")
            .unwrap();
        let record = Record::open(&path).unwrap();
        record.append(&entry("b")).unwrap();
        drop(record);
        let rerun = Record::open(&path).unwrap();
        assert_eq!(rerun.done.keys().collect::<Vec<_>>(), ["a", "b"]);
    }

    /// What another local user could plant where the default record goes (a directory of theirs
    /// under /tmp, a link, a record of theirs claiming files are done) is refused, and nothing
    /// is written through it.
    #[test]
    fn a_record_or_directory_someone_else_planted_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let stranger = 54_321;
        let planted_dir = dir.path().join("spillway-stage-0");
        std::fs::create_dir(&planted_dir).unwrap();
        std::os::unix::fs::chown(&planted_dir, Some(stranger), Some(stranger)).unwrap();
        let error = Record::open(&planted_dir.join("r.jsonl")).err().unwrap();
        assert!(error.to_string().contains("not a private directory"), "{error}");
        let open_dir = dir.path().join("open");
        std::fs::create_dir(&open_dir).unwrap();
        std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(Record::open(&open_dir.join("r.jsonl")).is_err(), "others may write there");

        let victim_file = dir.path().join("victim-file");
        std::fs::write(&victim_file, b"mine").unwrap();
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&victim_file, &link).unwrap();
        assert!(Record::open(&link).is_err(), "a link is not followed");
        assert_eq!(std::fs::read(&victim_file).unwrap(), b"mine");

        let forged = dir.path().join("forged.jsonl");
        std::fs::write(&forged, b"{\"name\":\"a\",\"size\":3,\"mtime_ns\":7,\"crc32c\":9}\n")
            .unwrap();
        std::os::unix::fs::chown(&forged, Some(stranger), Some(stranger)).unwrap();
        let error = Record::open(&forged).err().unwrap();
        assert!(error.to_string().contains("not a plain file of uid"), "{error}");
    }
}
