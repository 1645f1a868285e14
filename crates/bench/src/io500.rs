//! `spillway bench io500`: the four IO500 shapes through the native client, the FUSE mount and
//! the LD_PRELOAD library, with a plain directory on the same disk as the baseline, in one run.
//!
//! - **ior-easy**: each process writes its own file in 1 MiB transfers (`--ior-easy-bytes`
//!   each), then reads it back;
//! - **ior-hard**: every process writes one shared file in 47,008-byte transfers, interleaved:
//!   transfer `i` of process `p` of `P` lands at `(i·P + p)·47,008` (`--ior-hard-transfers`
//!   each), then reads its own transfers back;
//! - **mdtest-easy**: each process creates `--mdtest-easy-files` empty files in its own
//!   directory, then stats and deletes them;
//! - **mdtest-hard**: every process creates `--mdtest-hard-files` files of 3,901 bytes in one
//!   shared directory, then stats, reads and deletes them.
//!
//! Phases run in IO500's order (writes, then stats and reads, then deletes, so reads never find
//! their data still in the writer's hands), and every read checks every byte. On the mount and
//! the directory the processes are real processes (this binary's hidden `bench io500-worker`)
//! doing plain POSIX calls, started together: each prepares (directories, the files a read
//! phase opens: untimed), says it is ready, and starts when every process is ready. A phase
//! lasts from the first process's start to the last one's end (wall clock; every process
//! stamps its own). On the native client the processes are threads, each with its own
//! `Client`, sharing one `RemoteNamespace` for metadata, and doing what the mount does for a
//! file (namespace create, store write, flush, `wrote` with the size).
//!
//! A write phase ends with `close` on the mount (every byte acknowledged by the servers) and
//! with `flush` on the native client; on the directory it ends in the page cache (no fsync, as
//! IO500's phases), and before each read phase of the directory the files are synced and their
//! pages dropped, so reads there come from the disk as on the servers' side they come over the
//! network. Each subject starts with a fresh namespace, epoch or directory.
//!
//! Scores as IO500: the bandwidth score is the geometric mean of the four ior phases in GiB/s,
//! the metadata score the geometric mean of the mdtest phases in kIOPS, the total the geometric
//! mean of both. Ratios (`ratios` in `--json`): `<subject>_vs_dir_<phase>` and
//! `mount_vs_native_<phase>` for every phase, and the same for the scores.
//!
//! The mount runs twice: as `spillway mount` makes it (`mount`: entries and attributes cached,
//! kept consistent by invalidations) and with TTL 0 (`mount_uncached`, every lookup and stat
//! asking the namespace server). The preload subject runs the same worker processes under the
//! LD_PRELOAD library (`libspillway_preload.so`, crates/preload) with a caching mount's mount
//! point as its own. Each runs on a namespace of its own. `ratios` also hold issue 20's targets
//! by name: `preload_vs_native` (ior-easy write), `preload_over_mount_creates` and
//! `preload_over_mount_stats` (mdtest-easy write and stat, against the uncached mount the
//! issue measured), and the same two against the caching mount (`preload_over_cached_mount_*`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context};
use spillway_client::{Client, ClientOptions, Placement};
use spillway_mount::connect::connect_namespace;
use spillway_namespace::{data_file_name, Caller, FileKind, Ino, Namespace, ROOT_INO};
use spillway_proto::Endpoint;
use spillway_types::EpochId;

use crate::mount::{mount_with, open_root, start_servers};
use spillway_mount::MountConfig;

/// ior-easy's transfer, as IO500's.
const IOR_EASY_TRANSFER_BYTES: usize = 1 << 20;
/// ior-hard's transfer, as IO500's.
const IOR_HARD_TRANSFER_BYTES: usize = 47_008;
/// mdtest-hard's file size, as IO500's.
const MDTEST_HARD_FILE_BYTES: usize = 3_901;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// Namespace id and data epoch of the mount subject; epoch of the native subject's ior files.
const MOUNT_NAMESPACE_ID: u64 = 500;
const PRELOAD_NAMESPACE_ID: u64 = 502;
const MOUNT_UNCACHED_NAMESPACE_ID: u64 = 503;
/// A mounted subject's data epoch: this plus its namespace id.
const MOUNT_EPOCH_BASE: u64 = 1_000_000;
/// The interception library's file name.
const PRELOAD_LIBRARY: &str = "libspillway_preload.so";
const NATIVE_NAMESPACE_ID: u64 = 501;
const NATIVE_DATA_EPOCH: u64 = 1_000_501;
const NATIVE_IOR_EPOCH: u64 = 7_000;
/// Largest shapes accepted (each far above what this machine can run in a benchmark).
const PROCESSES_MAX: usize = 1024;
const PER_PROCESS_BYTES_MAX: u64 = 1 << 40;
const FILES_MAX: u64 = 100_000_000;
/// How long a worker process may take to get ready or to finish a phase.
const WORKER_WAIT_MAX: Duration = Duration::from_secs(600);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Processes (threads on the native client) per phase.
    #[arg(long, default_value_t = 4)]
    pub processes: usize,
    /// ior-easy bytes per process (a multiple of 1 MiB; suffixes K, M, G).
    #[arg(long, default_value = "64M", value_parser = spillway_types::parse_size)]
    pub ior_easy_bytes: u64,
    /// ior-hard transfers of 47,008 bytes per process.
    #[arg(long, default_value_t = 256)]
    pub ior_hard_transfers: u64,
    /// mdtest-easy files per process.
    #[arg(long, default_value_t = 2000)]
    pub mdtest_easy_files: u64,
    /// mdtest-hard files per process.
    #[arg(long, default_value_t = 500)]
    pub mdtest_hard_files: u64,
    /// Burst buffer servers (`spillway serve` children on loopback).
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// FUSE session threads of the mount (and data clients).
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// The LD_PRELOAD library (default: libspillway_preload.so next to this binary).
    #[arg(long)]
    pub preload_lib: Option<PathBuf>,
    /// Directory for the servers' logs, the mount point and the baseline directory (default: a
    /// temporary directory under /var/tmp, on the disk the servers' SSD logs use).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

/// One process of a POSIX subject (run by `bench io500` itself).
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    #[arg(long, value_enum)]
    pub phase: Phase,
    /// The subject's root directory (a mount or a plain directory).
    #[arg(long)]
    pub root: PathBuf,
    #[arg(long)]
    pub rank: usize,
    #[arg(long)]
    pub ranks: usize,
    #[arg(long)]
    pub ior_easy_bytes: u64,
    #[arg(long)]
    pub ior_hard_transfers: u64,
    #[arg(long)]
    pub mdtest_easy_files: u64,
    #[arg(long)]
    pub mdtest_hard_files: u64,
    /// Before a read phase: sync the files and drop their cached pages (the plain directory).
    #[arg(long)]
    pub drop_cache: bool,
}

/// The phases, in IO500's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    IorEasyWrite,
    MdtestEasyWrite,
    IorHardWrite,
    MdtestHardWrite,
    IorEasyRead,
    MdtestEasyStat,
    IorHardRead,
    MdtestHardStat,
    MdtestEasyDelete,
    MdtestHardRead,
    MdtestHardDelete,
}

impl Phase {
    pub const ALL: [Phase; 11] = [
        Phase::IorEasyWrite,
        Phase::MdtestEasyWrite,
        Phase::IorHardWrite,
        Phase::MdtestHardWrite,
        Phase::IorEasyRead,
        Phase::MdtestEasyStat,
        Phase::IorHardRead,
        Phase::MdtestHardStat,
        Phase::MdtestEasyDelete,
        Phase::MdtestHardRead,
        Phase::MdtestHardDelete,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Phase::IorEasyWrite => "ior_easy_write",
            Phase::MdtestEasyWrite => "mdtest_easy_write",
            Phase::IorHardWrite => "ior_hard_write",
            Phase::MdtestHardWrite => "mdtest_hard_write",
            Phase::IorEasyRead => "ior_easy_read",
            Phase::MdtestEasyStat => "mdtest_easy_stat",
            Phase::IorHardRead => "ior_hard_read",
            Phase::MdtestHardStat => "mdtest_hard_stat",
            Phase::MdtestEasyDelete => "mdtest_easy_delete",
            Phase::MdtestHardRead => "mdtest_hard_read",
            Phase::MdtestHardDelete => "mdtest_hard_delete",
        }
    }

    /// A bandwidth (ior) phase, scored in GiB/s; the others are scored in kIOPS.
    fn is_bandwidth(self) -> bool {
        matches!(
            self,
            Phase::IorEasyWrite | Phase::IorHardWrite | Phase::IorEasyRead | Phase::IorHardRead
        )
    }

    fn is_read(self) -> bool {
        matches!(self, Phase::IorEasyRead | Phase::IorHardRead | Phase::MdtestHardRead)
    }
}

/// The sizes of a run, shared by the subjects and passed to worker processes.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Shape {
    pub processes: usize,
    pub ior_easy_bytes: u64,
    pub ior_hard_transfers: u64,
    pub mdtest_easy_files: u64,
    pub mdtest_hard_files: u64,
}

impl Shape {
    fn check(&self) -> anyhow::Result<()> {
        ensure!(self.processes > 0, "--processes must be positive");
        ensure!(
            self.ior_easy_bytes > 0
                && self.ior_easy_bytes.is_multiple_of(IOR_EASY_TRANSFER_BYTES as u64),
            "--ior-easy-bytes ({}) must be a positive multiple of 1 MiB",
            self.ior_easy_bytes
        );
        ensure!(
            self.ior_hard_transfers > 0 && self.mdtest_easy_files > 0 && self.mdtest_hard_files > 0,
            "--ior-hard-transfers, --mdtest-easy-files and --mdtest-hard-files must be positive"
        );
        // Bounds that keep every product below (amounts, DRAM sizing) far from overflow.
        ensure!(
            self.processes <= PROCESSES_MAX,
            "--processes ({}) must be at most {PROCESSES_MAX}",
            self.processes
        );
        let hard_bytes = self.ior_hard_transfers.saturating_mul(IOR_HARD_TRANSFER_BYTES as u64);
        ensure!(
            self.ior_easy_bytes <= PER_PROCESS_BYTES_MAX && hard_bytes <= PER_PROCESS_BYTES_MAX,
            "--ior-easy-bytes and --ior-hard-transfers × 47,008 must be at most {PER_PROCESS_BYTES_MAX} bytes per process"
        );
        ensure!(
            self.mdtest_easy_files <= FILES_MAX && self.mdtest_hard_files <= FILES_MAX,
            "--mdtest-easy-files and --mdtest-hard-files must be at most {FILES_MAX} per process"
        );
        Ok(())
    }

    /// Bytes (bandwidth phases) or operations (metadata phases) of `phase` over every process.
    fn amount(&self, phase: Phase) -> u64 {
        let per_process = match phase {
            Phase::IorEasyWrite | Phase::IorEasyRead => self.ior_easy_bytes,
            Phase::IorHardWrite | Phase::IorHardRead => {
                self.ior_hard_transfers * IOR_HARD_TRANSFER_BYTES as u64
            }
            Phase::MdtestEasyWrite | Phase::MdtestEasyStat | Phase::MdtestEasyDelete => {
                self.mdtest_easy_files
            }
            Phase::MdtestHardWrite
            | Phase::MdtestHardStat
            | Phase::MdtestHardRead
            | Phase::MdtestHardDelete => self.mdtest_hard_files,
        };
        per_process * self.processes as u64
    }

    /// GiB/s (bandwidth phases) or kIOPS (metadata phases) of `phase` done in `seconds`.
    fn score(&self, phase: Phase, seconds: f64) -> f64 {
        let amount = self.amount(phase) as f64 / seconds.max(1e-9);
        if phase.is_bandwidth() {
            amount / GIB
        } else {
            amount / 1000.0
        }
    }
}

/// The transfer's bytes: one pattern, different per process and position, so a transfer that
/// lands in another's place is caught.
fn pattern(length: usize, rank: usize, index: u64) -> Vec<u8> {
    let seed = (rank as u64).wrapping_mul(1_000_003).wrapping_add(index);
    (0..length).map(|i| ((i as u64).wrapping_mul(131).wrapping_add(seed) % 251) as u8).collect()
}

fn ior_easy_name(rank: usize) -> String {
    format!("ior_easy/file.{rank:06}")
}

const IOR_HARD_NAME: &str = "ior_hard/file";

/// The file (relative to the subject's root), transfer size and offsets of `rank`'s ior phase.
fn ior_layout(shape: &Shape, phase: Phase, rank: usize) -> (String, usize, Vec<u64>) {
    if matches!(phase, Phase::IorEasyWrite | Phase::IorEasyRead) {
        let transfers = shape.ior_easy_bytes / IOR_EASY_TRANSFER_BYTES as u64;
        let offsets = (0..transfers).map(|i| i * IOR_EASY_TRANSFER_BYTES as u64).collect();
        (ior_easy_name(rank), IOR_EASY_TRANSFER_BYTES, offsets)
    } else {
        let offsets =
            (0..shape.ior_hard_transfers).map(|i| ior_hard_offset(shape, rank, i)).collect();
        (IOR_HARD_NAME.to_string(), IOR_HARD_TRANSFER_BYTES, offsets)
    }
}

fn mdtest_easy_dir(root: &Path, rank: usize) -> PathBuf {
    root.join("mdtest_easy").join(format!("rank.{rank:06}"))
}

fn mdtest_hard_name(rank: usize, i: u64) -> String {
    format!("file.{rank:06}.{i:08}")
}

fn ior_hard_offset(shape: &Shape, rank: usize, i: u64) -> u64 {
    (i * shape.processes as u64 + rank as u64) * IOR_HARD_TRANSFER_BYTES as u64
}

/// `base` with `index` in its first 8 bytes: a transfer that lands in another transfer's place
/// reads back with the wrong index, and the pattern costs one copy per transfer, not one
/// computation.
fn stamp(buffer: &mut [u8], base: &[u8], index: u64) {
    buffer.copy_from_slice(base);
    let stamp = index.to_le_bytes();
    let n = stamp.len().min(buffer.len());
    buffer[..n].copy_from_slice(&stamp[..n]);
}

/// Checks a transfer read back against what [`stamp`] wrote there.
fn check(read: &[u8], base: &[u8], index: u64, what: impl Fn() -> String) -> anyhow::Result<()> {
    let mut expected = vec![0; base.len()];
    stamp(&mut expected, base, index);
    ensure!(read == expected.as_slice(), "{}: not the bytes written", what());
    Ok(())
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// Syncs a file of the plain directory and drops its cached pages, so the read phase that
/// follows reads the disk.
fn drop_cached_pages(path: &Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    file.sync_all().with_context(|| format!("syncing {}", path.display()))?;
    // SAFETY: a valid descriptor; advice only, whole file.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    ensure!(rc == 0, "posix_fadvise on {}: errno {rc}", path.display());
    Ok(())
}

/// One process of a POSIX subject: plain system calls under `root`.
struct PosixWorker {
    root: PathBuf,
    rank: usize,
    shape: Shape,
}

impl PosixWorker {
    /// What a phase needs before its clock starts: its directories, and the directory
    /// baseline's files out of the page cache before a read.
    fn prepare(&self, phase: Phase, drop_cache: bool) -> anyhow::Result<()> {
        let dir = match phase {
            Phase::IorEasyWrite => self.root.join("ior_easy"),
            Phase::IorHardWrite => self.root.join("ior_hard"),
            Phase::MdtestEasyWrite => mdtest_easy_dir(&self.root, self.rank),
            Phase::MdtestHardWrite => self.root.join("mdtest_hard"),
            _ => self.root.clone(),
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        if drop_cache && phase.is_read() {
            match phase {
                Phase::IorEasyRead => drop_cached_pages(&self.root.join(ior_easy_name(self.rank)))?,
                Phase::IorHardRead => drop_cached_pages(&self.root.join(IOR_HARD_NAME))?,
                _ => {
                    for i in 0..self.shape.mdtest_hard_files {
                        drop_cached_pages(&self.mdtest_hard_path(i))?;
                    }
                }
            }
        }
        Ok(())
    }

    fn mdtest_hard_path(&self, i: u64) -> PathBuf {
        self.root.join("mdtest_hard").join(mdtest_hard_name(self.rank, i))
    }

    fn run(&self, phase: Phase) -> anyhow::Result<()> {
        match phase {
            Phase::IorEasyWrite | Phase::IorHardWrite => self.ior_write(phase),
            Phase::IorEasyRead | Phase::IorHardRead => self.ior_read(phase),
            _ => self.mdtest(phase),
        }
    }

    /// The file, transfer size and offsets of an ior phase.
    fn ior_layout(&self, phase: Phase) -> (PathBuf, usize, Vec<u64>) {
        let (name, transfer, offsets) = ior_layout(&self.shape, phase, self.rank);
        (self.root.join(name), transfer, offsets)
    }

    fn ior_write(&self, phase: Phase) -> anyhow::Result<()> {
        let (path, transfer, offsets) = self.ior_layout(phase);
        let easy = phase == Phase::IorEasyWrite;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(easy)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let base = pattern(transfer, self.rank, 0);
        let mut buffer = vec![0; transfer];
        for (i, &offset) in offsets.iter().enumerate() {
            stamp(&mut buffer, &base, i as u64);
            file.write_all_at(&buffer, offset)
                .with_context(|| format!("writing {} at {offset}", path.display()))?;
        }
        drop(file); // close: on the mount, every byte acknowledged by the servers
        Ok(())
    }

    fn ior_read(&self, phase: Phase) -> anyhow::Result<()> {
        let (path, transfer, offsets) = self.ior_layout(phase);
        let file =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let base = pattern(transfer, self.rank, 0);
        let mut buffer = vec![0; transfer];
        for (i, &offset) in offsets.iter().enumerate() {
            file.read_exact_at(&mut buffer, offset)
                .with_context(|| format!("reading {} at {offset}", path.display()))?;
            check(&buffer, &base, i as u64, || format!("{} at {offset}", path.display()))?;
        }
        Ok(())
    }

    fn mdtest(&self, phase: Phase) -> anyhow::Result<()> {
        let easy = matches!(
            phase,
            Phase::MdtestEasyWrite | Phase::MdtestEasyStat | Phase::MdtestEasyDelete
        );
        let files = if easy { self.shape.mdtest_easy_files } else { self.shape.mdtest_hard_files };
        let hard_base = pattern(MDTEST_HARD_FILE_BYTES, self.rank, 0);
        let mut buffer = vec![0; MDTEST_HARD_FILE_BYTES];
        for i in 0..files {
            let path = if easy {
                mdtest_easy_dir(&self.root, self.rank).join(format!("file.{i:08}"))
            } else {
                self.mdtest_hard_path(i)
            };
            let context = || format!("{} of {}", phase.key(), path.display());
            match phase {
                Phase::MdtestEasyWrite => drop(
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o644)
                        .open(&path)
                        .with_context(context)?,
                ),
                Phase::MdtestHardWrite => {
                    let mut file = std::fs::File::create_new(&path).with_context(context)?;
                    stamp(&mut buffer, &hard_base, i);
                    file.write_all(&buffer).with_context(context)?;
                }
                Phase::MdtestEasyStat | Phase::MdtestHardStat => {
                    let meta = std::fs::metadata(&path).with_context(context)?;
                    let size = if easy { 0 } else { MDTEST_HARD_FILE_BYTES as u64 };
                    ensure!(
                        meta.is_file() && meta.len() == size,
                        "{}: size {}",
                        context(),
                        meta.len()
                    );
                }
                Phase::MdtestHardRead => {
                    let read = std::fs::read(&path).with_context(context)?;
                    check(&read, &hard_base, i, context)?;
                }
                Phase::MdtestEasyDelete | Phase::MdtestHardDelete => {
                    std::fs::remove_file(&path).with_context(context)?;
                }
                _ => bail!("{} is not an mdtest phase", phase.key()),
            }
        }
        Ok(())
    }
}

/// `spillway bench io500-worker`: prepares, prints `ready`, waits for `go` on stdin, runs the
/// phase and prints its start and end (ns since the epoch) as one JSON line.
pub fn run_worker(args: WorkerArgs) -> anyhow::Result<()> {
    let shape = Shape {
        processes: args.ranks,
        ior_easy_bytes: args.ior_easy_bytes,
        ior_hard_transfers: args.ior_hard_transfers,
        mdtest_easy_files: args.mdtest_easy_files,
        mdtest_hard_files: args.mdtest_hard_files,
    };
    shape.check()?;
    ensure!(args.rank < args.ranks, "--rank {} of {} ranks", args.rank, args.ranks);
    let worker = PosixWorker { root: args.root, rank: args.rank, shape };
    worker.prepare(args.phase, args.drop_cache)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "ready")?;
    stdout.flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    ensure!(line.trim() == "go", "expected `go` on stdin, got {line:?}");
    let start = now_ns();
    worker.run(args.phase)?;
    let end = now_ns();
    writeln!(stdout, "{}", serde_json::json!({ "start_ns": start, "end_ns": end }))?;
    stdout.flush()?;
    Ok(())
}

/// A POSIX subject: worker processes of this binary on a directory.
struct PosixSubject {
    root: PathBuf,
    /// Sync and drop the files' pages before read phases (the plain directory).
    drop_cache: bool,
    /// Extra environment of the workers (`LD_PRELOAD` and its settings for the preload
    /// library).
    environment: Vec<(String, String)>,
}

/// Worker processes of one phase, killed if dropped before they finished.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Reads one line of a worker's stdout (`None` at end of file).
fn read_line(reader: &mut impl BufRead) -> anyhow::Result<Option<String>> {
    let mut line = String::new();
    Ok((reader.read_line(&mut line)? > 0).then(|| line.trim().to_string()))
}

impl PosixSubject {
    /// Runs `phase` on `shape.processes` workers started together; its span in seconds.
    fn phase(&self, shape: &Shape, phase: Phase) -> anyhow::Result<f64> {
        let binary = std::env::current_exe()?;
        let mut workers = Workers(Vec::new());
        for rank in 0..shape.processes {
            let mut command = Command::new(&binary);
            command
                .args(["bench", "io500-worker", "--phase", phase.key().replace('_', "-").as_str()])
                .arg("--root")
                .arg(&self.root)
                .args(["--rank", &rank.to_string(), "--ranks", &shape.processes.to_string()])
                .args(["--ior-easy-bytes", &shape.ior_easy_bytes.to_string()])
                .args(["--ior-hard-transfers", &shape.ior_hard_transfers.to_string()])
                .args(["--mdtest-easy-files", &shape.mdtest_easy_files.to_string()])
                .args(["--mdtest-hard-files", &shape.mdtest_hard_files.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            if self.drop_cache {
                command.arg("--drop-cache");
            }
            command.envs(self.environment.iter().map(|(k, v)| (k, v)));
            workers.0.push(command.spawn().context("starting an io500 worker")?);
        }
        let watchdog = Watchdog::start(workers.0.iter().map(Child::id).collect());
        let mut outputs = Vec::new();
        let mut inputs: Vec<ChildStdin> = Vec::new();
        for (rank, child) in workers.0.iter_mut().enumerate() {
            let mut output = BufReader::new(child.stdout.take().context("worker stdout")?);
            let ready = read_line(&mut output)?;
            ensure!(
                ready.as_deref() == Some("ready"),
                "{} worker {rank} did not get ready (it said {ready:?}; its error is above)",
                phase.key()
            );
            outputs.push(output);
            inputs.push(child.stdin.take().context("worker stdin")?);
        }
        for input in &mut inputs {
            input.write_all(b"go\n")?;
            input.flush()?;
        }
        let mut spans = Vec::new();
        for (rank, output) in outputs.iter_mut().enumerate() {
            let line = read_line(output)?.with_context(|| {
                format!("{} worker {rank} failed (its error is above)", phase.key())
            })?;
            let span: serde_json::Value = serde_json::from_str(&line)
                .with_context(|| format!("worker {rank} printed {line:?}"))?;
            let field = |name: &str| span[name].as_u64().map(u128::from);
            match (field("start_ns"), field("end_ns")) {
                (Some(start), Some(end)) => spans.push((start, end)),
                _ => bail!("worker {rank} printed {line:?}"),
            }
        }
        for (rank, child) in workers.0.iter_mut().enumerate() {
            let status = child.wait()?;
            ensure!(status.success(), "{} worker {rank} exited with {status}", phase.key());
        }
        drop(watchdog);
        let first = spans.iter().map(|s| s.0).min().context("no worker")?;
        let last = spans.iter().map(|s| s.1).max().context("no worker")?;
        Ok(last.saturating_sub(first) as f64 / 1e9)
    }
}

/// Kills a phase's workers if they are not done within [`WORKER_WAIT_MAX`] (a hung mount must
/// not hang the benchmark). Dropping it (the phase ended, or failed and its workers were
/// killed and reaped) disarms it, so it never signals a pid that could have been reused.
struct Watchdog {
    _armed: std::sync::mpsc::Sender<()>,
}

impl Watchdog {
    fn start(pids: Vec<u32>) -> Watchdog {
        let (armed, disarmed) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if disarmed.recv_timeout(WORKER_WAIT_MAX)
                == Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            {
                eprintln!("io500 workers still running after {WORKER_WAIT_MAX:?}: killing them");
                for pid in pids {
                    // SAFETY: signalling our own child by pid; not reaped yet, since the phase
                    // (which reaps it) still holds the armed watchdog.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
            }
        });
        Watchdog { _armed: armed }
    }
}

/// The native subject: threads with their own `Client`, one `RemoteNamespace` for metadata.
struct NativeSubject {
    endpoints: Vec<Endpoint>,
    namespace: Arc<dyn Namespace>,
    /// The namespace's data epoch (mdtest-hard's bytes, named as the mount names them).
    data_epoch: EpochId,
    /// The epoch of the ior files (no namespace: the native API's own files).
    ior_epoch: EpochId,
    mdtest_easy_dirs: Vec<Ino>,
    mdtest_hard_dir: Ino,
}

/// What a native thread needs for a phase, made before the clock starts.
struct NativeThread {
    client: Client,
    caller: Caller,
}

impl NativeSubject {
    fn connect(endpoints: &[Endpoint], shape: &Shape) -> anyhow::Result<NativeSubject> {
        let data_epoch = EpochId(NATIVE_DATA_EPOCH);
        let namespace = connect_namespace(
            &endpoints[0],
            NATIVE_NAMESPACE_ID,
            open_root(data_epoch),
            shape.processes,
            None,
        )?;
        let caller = Caller::root();
        let mkdir = |parent: Ino, name: &str| -> anyhow::Result<Ino> {
            Ok(namespace
                .mkdir(&caller, parent, name.as_bytes(), 0o755, 0o022)
                .with_context(|| format!("native mkdir {name}"))?
                .ino)
        };
        let easy = mkdir(ROOT_INO, "mdtest_easy")?;
        let mdtest_easy_dirs = (0..shape.processes)
            .map(|rank| mkdir(easy, &format!("rank.{rank:06}")))
            .collect::<anyhow::Result<_>>()?;
        let mdtest_hard_dir = mkdir(ROOT_INO, "mdtest_hard")?;
        Ok(NativeSubject {
            endpoints: endpoints.to_vec(),
            namespace,
            data_epoch,
            ior_epoch: EpochId(NATIVE_IOR_EPOCH),
            mdtest_easy_dirs,
            mdtest_hard_dir,
        })
    }

    fn thread(&self) -> anyhow::Result<NativeThread> {
        let mut client = Client::connect(
            &self.endpoints,
            ClientOptions { placement: Placement::striped_default(), ..Default::default() },
        )?;
        client.begin_epoch(self.ior_epoch);
        client.begin_epoch(self.data_epoch);
        Ok(NativeThread { client, caller: Caller::root() })
    }

    fn phase(&self, shape: &Shape, phase: Phase) -> anyhow::Result<f64> {
        if phase == Phase::IorHardWrite {
            // The shared file exists before the phase, as IOR's rank 0 makes it.
            let mut thread = self.thread()?;
            thread.client.create_file(self.ior_epoch, IOR_HARD_NAME)?;
            thread.client.flush()?;
        }
        crate::mount_ior::timed_workers_prepared(
            shape.processes,
            |_| self.thread(),
            |rank, mut thread| match phase {
                Phase::IorEasyWrite | Phase::IorHardWrite => {
                    self.ior_write(shape, phase, rank, &mut thread)
                }
                Phase::IorEasyRead | Phase::IorHardRead => {
                    self.ior_read(shape, phase, rank, &mut thread)
                }
                _ => self.mdtest(shape, phase, rank, &mut thread),
            },
        )
    }

    fn ior_write(
        &self,
        shape: &Shape,
        phase: Phase,
        rank: usize,
        thread: &mut NativeThread,
    ) -> anyhow::Result<()> {
        let (name, transfer, offsets) = ior_layout(shape, phase, rank);
        let client = &mut thread.client;
        let mut file = if phase == Phase::IorEasyWrite {
            client.create_file(self.ior_epoch, &name)?
        } else {
            client.open_file(self.ior_epoch, &name)?
        };
        let base = pattern(transfer, rank, 0);
        let mut buffer = vec![0; transfer];
        for (i, &offset) in offsets.iter().enumerate() {
            stamp(&mut buffer, &base, i as u64);
            client.write(&mut file, offset, &buffer)?;
        }
        client.flush()?;
        Ok(())
    }

    fn ior_read(
        &self,
        shape: &Shape,
        phase: Phase,
        rank: usize,
        thread: &mut NativeThread,
    ) -> anyhow::Result<()> {
        let (name, transfer, offsets) = ior_layout(shape, phase, rank);
        let client = &mut thread.client;
        let file = client.open_file(self.ior_epoch, &name)?;
        let base = pattern(transfer, rank, 0);
        let mut buffer = vec![0; transfer];
        for (i, &offset) in offsets.iter().enumerate() {
            client.read(&file, offset, &mut buffer)?;
            check(&buffer, &base, i as u64, || format!("native {name} at {offset}"))?;
        }
        Ok(())
    }

    /// The metadata phases as the mount does them: names in the namespace, mdtest-hard's bytes
    /// in the store file of the inode's generation, its size reported with `wrote` once the
    /// bytes are acknowledged.
    fn mdtest(
        &self,
        shape: &Shape,
        phase: Phase,
        rank: usize,
        thread: &mut NativeThread,
    ) -> anyhow::Result<()> {
        let ns = &self.namespace;
        let (client, caller) = (&mut thread.client, &thread.caller);
        let easy = matches!(
            phase,
            Phase::MdtestEasyWrite | Phase::MdtestEasyStat | Phase::MdtestEasyDelete
        );
        let (dir, files) = if easy {
            (self.mdtest_easy_dirs[rank], shape.mdtest_easy_files)
        } else {
            (self.mdtest_hard_dir, shape.mdtest_hard_files)
        };
        let hard_base = pattern(MDTEST_HARD_FILE_BYTES, rank, 0);
        let mut buffer = vec![0; MDTEST_HARD_FILE_BYTES];
        for i in 0..files {
            let name = if easy { format!("file.{i:08}") } else { mdtest_hard_name(rank, i) };
            let context = || format!("native {} of {name}", phase.key());
            let create = || {
                let kind = FileKind::Regular;
                ns.create(caller, dir, name.as_bytes(), kind, 0o644, 0o022, 0, true)
                    .with_context(context)
            };
            match phase {
                Phase::MdtestEasyWrite => {
                    create()?;
                }
                Phase::MdtestHardWrite => {
                    let attr = create()?;
                    let data = data_file_name(ns.id(), attr.ino, attr.generation);
                    let mut file = client.create_file(self.data_epoch, &data)?;
                    stamp(&mut buffer, &hard_base, i);
                    client.write(&mut file, 0, &buffer)?;
                    client.flush()?;
                    ns.wrote(caller, attr.ino, MDTEST_HARD_FILE_BYTES as u64)
                        .with_context(context)?;
                }
                Phase::MdtestEasyStat | Phase::MdtestHardStat => {
                    let attr = ns.lookup(caller, dir, name.as_bytes()).with_context(context)?;
                    let size = if easy { 0 } else { MDTEST_HARD_FILE_BYTES as u64 };
                    ensure!(attr.size == size, "{}: size {}", context(), attr.size);
                }
                Phase::MdtestHardRead => {
                    let attr = ns.lookup(caller, dir, name.as_bytes()).with_context(context)?;
                    let data = data_file_name(ns.id(), attr.ino, attr.generation);
                    let file = client.open_file(self.data_epoch, &data)?;
                    client.read(&file, 0, &mut buffer)?;
                    check(&buffer, &hard_base, i, context)?;
                }
                Phase::MdtestEasyDelete | Phase::MdtestHardDelete => {
                    ns.unlink(caller, dir, name.as_bytes()).with_context(context)?;
                }
                _ => bail!("{} is not an mdtest phase", phase.key()),
            }
        }
        Ok(())
    }
}

/// One phase of one subject.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct PhaseResult {
    pub seconds: f64,
    /// GiB/s (ior phases) or kIOPS (mdtest phases).
    pub score: f64,
}

/// Every phase of one subject and its IO500 scores.
#[derive(Debug, serde::Serialize)]
pub struct SubjectResult {
    pub subject: &'static str,
    pub phases: BTreeMap<&'static str, PhaseResult>,
    /// Geometric mean of the ior phases, GiB/s.
    pub bandwidth_gib_s: f64,
    /// Geometric mean of the mdtest phases, kIOPS.
    pub metadata_kiops: f64,
    /// Geometric mean of both.
    pub score: f64,
}

fn geometric_mean(values: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, count) = values.into_iter().fold((0.0, 0u32), |(s, n), v| (s + v.ln(), n + 1));
    (sum / f64::from(count.max(1))).exp()
}

/// Runs every phase through `phase` and scores them.
fn measure_subject(
    subject: &'static str,
    shape: &Shape,
    mut phase: impl FnMut(Phase) -> anyhow::Result<f64>,
) -> anyhow::Result<SubjectResult> {
    let mut phases = BTreeMap::new();
    for p in Phase::ALL {
        let seconds = phase(p).with_context(|| format!("{subject}: {}", p.key()))?;
        phases.insert(p.key(), PhaseResult { seconds, score: shape.score(p, seconds) });
    }
    let mean = |bandwidth: bool| {
        geometric_mean(
            Phase::ALL
                .iter()
                .filter(|p| p.is_bandwidth() == bandwidth)
                .map(|p| phases[p.key()].score),
        )
    };
    let (bandwidth_gib_s, metadata_kiops) = (mean(true), mean(false));
    Ok(SubjectResult {
        subject,
        phases,
        bandwidth_gib_s,
        metadata_kiops,
        score: (bandwidth_gib_s * metadata_kiops).sqrt(),
    })
}

/// `<a>_vs_<b>_<phase>` for every phase and the scores: `a`'s score over `b`'s.
fn add_ratios(ratios: &mut BTreeMap<String, f64>, a: &SubjectResult, b: &SubjectResult) {
    for (key, result) in &a.phases {
        ratios.insert(
            format!("{}_vs_{}_{key}", a.subject, b.subject),
            result.score / b.phases[key].score,
        );
    }
    for (key, ours, theirs) in [
        ("bandwidth", a.bandwidth_gib_s, b.bandwidth_gib_s),
        ("metadata", a.metadata_kiops, b.metadata_kiops),
        ("score", a.score, b.score),
    ] {
        ratios.insert(format!("{}_vs_{}_{key}", a.subject, b.subject), ours / theirs);
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let shape = Shape {
        processes: args.processes,
        ior_easy_bytes: args.ior_easy_bytes,
        ior_hard_transfers: args.ior_hard_transfers,
        mdtest_easy_files: args.mdtest_easy_files,
        mdtest_hard_files: args.mdtest_hard_files,
    };
    shape.check()?;
    ensure!(args.servers > 0 && args.threads > 0, "--servers and --threads must be positive");
    let (work, _temporary) = crate::mount::work_directory(args.work_dir.as_deref())?;
    // The native and mount subjects' bytes stay on the servers until the end (mdtest-hard's
    // stores are never deleted by unlink): DRAM for both, the rest spills.
    let subject_bytes =
        [Phase::IorEasyWrite, Phase::IorHardWrite].iter().map(|&p| shape.amount(p)).sum::<u64>()
            + shape.amount(Phase::MdtestHardWrite) * MDTEST_HARD_FILE_BYTES as u64;
    let dram =
        crate::dram_bytes_holding((2 * subject_bytes).div_ceil(args.servers as u64), 128 << 20);
    let (servers, endpoints) = start_servers(&work, args.servers, dram)?;

    let directory = work.join("directory");
    std::fs::create_dir_all(&directory)?;
    let dir_subject =
        PosixSubject { root: directory.clone(), drop_cache: true, environment: Vec::new() };
    let dir = measure_subject("dir", &shape, |p| dir_subject.phase(&shape, p))?;
    std::fs::remove_dir_all(&directory)?;

    let native_subject = NativeSubject::connect(&endpoints, &shape)?;
    let native = measure_subject("native", &shape, |p| native_subject.phase(&shape, p))?;
    drop(native_subject);
    crate::mount_ior::delete_epoch(&endpoints, EpochId(NATIVE_IOR_EPOCH))?;
    crate::mount_ior::delete_epoch(&endpoints, EpochId(NATIVE_DATA_EPOCH))?;

    let measure = |subject| measure_mounted(subject, &args, &shape, &work, &endpoints);
    let mounted = measure(Mounted::Mount)?;
    let uncached = measure(Mounted::MountUncached)?;
    let preloaded = measure(Mounted::Preload)?;
    drop(servers);

    let mut ratios = BTreeMap::new();
    add_ratios(&mut ratios, &native, &dir);
    add_ratios(&mut ratios, &mounted, &dir);
    add_ratios(&mut ratios, &mounted, &native);
    add_ratios(&mut ratios, &preloaded, &dir);
    add_ratios(&mut ratios, &preloaded, &native);
    add_ratios(&mut ratios, &preloaded, &mounted);
    add_ratios(&mut ratios, &uncached, &dir);
    add_ratios(&mut ratios, &preloaded, &uncached);
    // Issue 20's targets by their names: against the mount without caching (the mount the issue
    // measured), and the same against the caching mount (whose stats of files it just created
    // are kernel cache hits).
    for (target, key) in [
        ("preload_vs_native", "preload_vs_native_ior_easy_write"),
        ("preload_over_mount_creates", "preload_vs_mount_uncached_mdtest_easy_write"),
        ("preload_over_mount_stats", "preload_vs_mount_uncached_mdtest_easy_stat"),
        ("preload_over_cached_mount_creates", "preload_vs_mount_mdtest_easy_write"),
        ("preload_over_cached_mount_stats", "preload_vs_mount_mdtest_easy_stat"),
    ] {
        let value = ratios[key];
        ratios.insert(target.to_string(), value);
    }
    let subjects = [dir, native, mounted, uncached, preloaded];
    if args.json {
        let json = serde_json::json!({
            "benchmark": "io500",
            "shape": shape,
            "servers": args.servers,
            "threads": args.threads,
            "subjects": subjects,
            "ratios": ratios,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    print_text(&shape, &subjects, &ratios);
    Ok(())
}

/// The library next to this binary (`cargo build` puts both in the profile directory; `cargo
/// test` leaves the library in `deps/`).
fn preload_library(args: &Args) -> anyhow::Result<PathBuf> {
    if let Some(path) = &args.preload_lib {
        ensure!(path.is_file(), "--preload-lib {}: no such file", path.display());
        return Ok(path.clone());
    }
    let binary = std::env::current_exe()?;
    let directory = binary.parent().context("the binary's directory")?;
    [directory.join(PRELOAD_LIBRARY), directory.join("deps").join(PRELOAD_LIBRARY)]
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "{PRELOAD_LIBRARY} is not next to {} (build it: cargo build -p spillway-preload, \
                 or pass --preload-lib)",
                binary.display()
            )
        })
}

/// The subjects on a fresh namespace behind a FUSE mount.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mounted {
    /// POSIX workers through the mount as `spillway mount` makes it (entries and attributes
    /// cached, kept consistent by invalidations).
    Mount,
    /// The same through a mount with TTL 0: every lookup and stat asks the namespace server.
    MountUncached,
    /// The same workers under the LD_PRELOAD library, the (caching) mount as its mount point:
    /// what the library does not intercept goes through the mount, as in production.
    Preload,
}

/// A subject on a fresh namespace behind a FUSE mount ([`Mounted`]).
fn measure_mounted(
    subject: Mounted,
    args: &Args,
    shape: &Shape,
    work: &Path,
    endpoints: &[Endpoint],
) -> anyhow::Result<SubjectResult> {
    let (name, namespace_id) = match subject {
        Mounted::Mount => ("mount", MOUNT_NAMESPACE_ID),
        Mounted::MountUncached => ("mount_uncached", MOUNT_UNCACHED_NAMESPACE_ID),
        Mounted::Preload => ("preload", PRELOAD_NAMESPACE_ID),
    };
    let epoch = EpochId(MOUNT_EPOCH_BASE + namespace_id);
    let namespace =
        connect_namespace(&endpoints[0], namespace_id, open_root(epoch), args.threads, None)?;
    let mut config = MountConfig { threads: args.threads, ..MountConfig::default() };
    if subject == Mounted::MountUncached {
        config.attr_ttl = Duration::ZERO;
    }
    let bench_mount =
        mount_with(&work.join(format!("mnt-io500-{name}")), namespace, endpoints, config)?;
    let mut environment = Vec::new();
    if subject == Mounted::Preload {
        let servers: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
        environment = vec![
            ("LD_PRELOAD".to_string(), preload_library(args)?.display().to_string()),
            ("SPILLWAY_PRELOAD_MOUNT".to_string(), bench_mount.path.display().to_string()),
            ("SPILLWAY_PRELOAD_SERVERS".to_string(), servers.join(",")),
            ("SPILLWAY_PRELOAD_NAMESPACE".to_string(), namespace_id.to_string()),
            ("SPILLWAY_PRELOAD_NAMESPACE_SERVER".to_string(), "0".to_string()),
        ];
    }
    let subject = PosixSubject { root: bench_mount.path.clone(), drop_cache: false, environment };
    let result = measure_subject(name, shape, |p| subject.phase(shape, p))?;
    drop(bench_mount);
    crate::mount_ior::delete_epoch(endpoints, epoch)?;
    Ok(result)
}

fn print_text(shape: &Shape, subjects: &[SubjectResult], ratios: &BTreeMap<String, f64>) {
    println!(
        "io500 shapes: {} processes; ior-easy {} MiB each; ior-hard {} × 47,008 B each; \
         mdtest-easy {} files each; mdtest-hard {} × 3,901 B each",
        shape.processes,
        shape.ior_easy_bytes >> 20,
        shape.ior_hard_transfers,
        shape.mdtest_easy_files,
        shape.mdtest_hard_files
    );
    print!("{:<28}", "phase");
    for subject in subjects {
        print!("{:>12}", subject.subject);
    }
    println!("{:>14}{:>15}{:>15}", "mount/native", "preload/mount", "preload/uncached");
    for phase in Phase::ALL {
        let unit = if phase.is_bandwidth() { "GiB/s" } else { "kIOPS" };
        print!("{:<28}", format!("{} ({unit})", phase.key()));
        for subject in subjects {
            print!("{:>12.3}", subject.phases[phase.key()].score);
        }
        let ratio = |name: &str| ratios.get(&format!("{name}_{}", phase.key())).copied();
        println!(
            "{:>14.2}{:>15.2}{:>15.2}",
            ratio("mount_vs_native").unwrap_or(f64::NAN),
            ratio("preload_vs_mount").unwrap_or(f64::NAN),
            ratio("preload_vs_mount_uncached").unwrap_or(f64::NAN)
        );
    }
    for (label, pick) in [
        ("bandwidth (GiB/s)", (|s: &SubjectResult| s.bandwidth_gib_s) as fn(&SubjectResult) -> f64),
        ("metadata (kIOPS)", |s| s.metadata_kiops),
        ("score", |s| s.score),
    ] {
        print!("{label:<28}");
        for subject in subjects {
            print!("{:>12.3}", pick(subject));
        }
        println!();
    }
}
