//! `spillway bench mount`: the FUSE mount against its baselines, measured in the same run.
//!
//! 1. Sequential 1 MiB writes of the same bytes through the mount (a plain `write(2)` loop on a
//!    file of the mount, ended by `close`) and through the native client (`Client::write`,
//!    ended by `flush`); both end when every byte is acknowledged by the servers. Runs
//!    alternate after one unmeasured warm-up round; the medians of `--repeat` runs are reported
//!    and the ratio is the median of the per-run mount/native ratios; target: ≥ 0.6.
//! 2. Metadata: each worker creates, stats and unlinks `--files` empty files in its own
//!    directory, 1 and 2 workers at once, on a `striped` namespace (one namespace on the first
//!    server; each worker has its own mount of it, as two compute nodes would) and on `private`
//!    namespaces (each worker's mount has its own namespace, on different servers).
//! 3. The same metadata run on a plain local directory, the reference.
//! 4. IOR-shaped phases (file per process, shared file, 16 KiB strided; write and read) through
//!    the mount and through the native client: [`crate::mount_ior`].
//! 5. Durable: file per process with `fsync` at the end of each file, through the mount and
//!    into a plain directory on the servers' disk: [`crate::mount_durable`].
//! 6. Stat: the same files stat'ed through a caching mount (the default) and through one with
//!    TTL 0: [`crate::mount_stat`].
//!
//! `--phases` picks some of them (`sequential`, `metadata`, `ior`, `durable`, `stat`; default
//! all).
//!
//! Workers are threads of this process, each with its own mount (the kernel serves each
//! thread's system calls independently, as it would separate processes'); the mounts run in
//! this process too, with the same code as `spillway mount`. Servers are `spillway serve`
//! children on loopback, killed when the benchmark ends.

use crate::mount_durable::{DurableResult, DurableShape};
use crate::mount_ior::{IorRow, IorShape};
use crate::start_server;
use crate::stats::median;
use spillway_harness::ServerProcess;
use spillway_mount::connect::{
    connect_namespace, data_clients, namespace_placement, NamespaceRoot,
};
use spillway_policy::namespace::NamespaceAccess;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use anyhow::{bail, Context};
use spillway_client::{Client, ClientOptions, Placement};
use spillway_mount::MountConfig;
use spillway_namespace::Namespace;
use spillway_proto::Endpoint;
use spillway_types::EpochId;

const MIB: f64 = 1024.0 * 1024.0;
const TRANSFER_BYTES: usize = 1 << 20;
/// Epoch of the native-client runs (mount data lives in the namespaces' own epochs).
const NATIVE_EPOCH_BASE: u64 = 5_000;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Bytes written per sequential-write run (suffixes K, M, G).
    #[arg(long, default_value = "256M", value_parser = spillway_types::parse_size)]
    pub write_bytes: u64,
    /// Runs of each sequential-write variant (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub repeat: u32,
    /// Files each metadata worker creates, stats and unlinks.
    #[arg(long, default_value_t = 2000)]
    pub files: u32,
    /// Burst buffer servers to start.
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// FUSE session threads per mount.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Working directory (default: a fresh temporary directory).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Worker threads of the IOR-shaped phases.
    #[arg(long, default_value_t = 4)]
    pub ior_workers: usize,
    /// Bytes each IOR worker writes in the 1 MiB-transfer layouts (a multiple of 1 MiB).
    #[arg(long, default_value = "64M", value_parser = spillway_types::parse_size)]
    pub ior_block: u64,
    /// Bytes each IOR worker writes in the 16 KiB strided layout (a multiple of 16 KiB).
    #[arg(long, default_value = "8M", value_parser = spillway_types::parse_size)]
    pub ior_strided_block: u64,
    /// Runs of each IOR layout and side, and of each side of the durable phase (the median is
    /// reported).
    #[arg(long, default_value_t = 3)]
    pub ior_repeat: u32,
    /// Writer threads of the durable phase (file per process, fsync at the end).
    #[arg(long, default_value_t = 2)]
    pub durable_workers: usize,
    /// Bytes each durable-phase writer writes to its file (a multiple of 1 MiB).
    #[arg(long, default_value = "128M", value_parser = spillway_types::parse_size)]
    pub durable_block: u64,
    /// The phases to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_values = ["sequential", "metadata", "ior", "durable", "stat"]
    )]
    pub phases: Vec<Phase>,
}

/// A phase of the benchmark (`--phases`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    /// Sequential 1 MiB writes, mount against native client.
    Sequential,
    /// Create, stat, unlink: striped and private namespaces and a plain directory.
    Metadata,
    /// IOR-shaped layouts, write and read, mount against native client.
    Ior,
    /// File per process with fsync, mount against a plain directory on the servers' disk.
    Durable,
    /// stat through a caching mount against one with TTL 0.
    Stat,
}

impl Args {
    fn ior_shape(&self) -> IorShape {
        IorShape {
            workers: self.ior_workers,
            block_bytes: self.ior_block,
            strided_block_bytes: self.ior_strided_block,
            repeat: self.ior_repeat,
            threads: self.threads,
        }
    }

    fn durable_shape(&self) -> DurableShape {
        DurableShape {
            workers: self.durable_workers,
            block_bytes: self.durable_block,
            transfer_bytes: TRANSFER_BYTES,
            repeat: self.ior_repeat,
            threads: self.threads,
        }
    }

    fn stat_shape(&self) -> crate::mount_stat::StatShape {
        crate::mount_stat::StatShape {
            files: self.files,
            repeat: self.ior_repeat,
            threads: self.threads,
        }
    }

    fn runs(&self, phase: Phase) -> bool {
        self.phases.contains(&phase)
    }
}

/// What the phases measured (`None`: not run).
struct Measured {
    writes: Option<SequentialWrites>,
    metadata: Option<Vec<MetaRow>>,
    ior: Option<Vec<IorRow>>,
    durable: Option<DurableResult>,
    stat: Option<crate::mount_stat::StatResult>,
}

/// `count` servers with `dram_bytes` of DRAM each, and their endpoints.
pub(crate) fn start_servers(
    work: &Path,
    count: usize,
    dram_bytes: u64,
) -> anyhow::Result<(Vec<ServerProcess>, Vec<Endpoint>)> {
    let mut servers = Vec::new();
    let mut endpoints = Vec::new();
    for s in 0..count {
        let ssd_dir = work.join(format!("ssd-{s}"));
        let server = start_server(work, &s.to_string(), &ssd_dir, dram_bytes, &[])?;
        endpoints.push(server.endpoint().clone());
        servers.push(server);
    }
    Ok((servers, endpoints))
}

/// A namespace root every benchmark worker may write: root-owned, mode 1777.
pub(crate) fn open_root(data_epoch: EpochId) -> NamespaceRoot {
    NamespaceRoot { data_epoch, uid: 0, gid: 0, mode: 0o1777 }
}

/// A mount of the benchmark, unmounted when dropped.
pub(crate) struct BenchMount {
    mount: Option<spillway_mount::Mount>,
    pub(crate) path: PathBuf,
}

impl Drop for BenchMount {
    fn drop(&mut self) {
        if let Some(mount) = self.mount.take() {
            if mount.unmount().is_err() {
                let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(&self.path).status();
            }
        }
    }
}

pub(crate) fn mount(
    path: &Path,
    namespace: Arc<dyn Namespace>,
    endpoints: &[Endpoint],
    threads: usize,
) -> anyhow::Result<BenchMount> {
    mount_with(path, namespace, endpoints, MountConfig { threads, ..MountConfig::default() })
}

/// A mount with `config` (one data client per session thread).
pub(crate) fn mount_with(
    path: &Path,
    namespace: Arc<dyn Namespace>,
    endpoints: &[Endpoint],
    config: MountConfig,
) -> anyhow::Result<BenchMount> {
    std::fs::create_dir_all(path)?;
    let clients = data_clients(endpoints, config.threads, 1)?;
    let mount = spillway_mount::mount(namespace, clients, path, config)?;
    Ok(BenchMount { mount: Some(mount), path: path.to_path_buf() })
}

fn native_write(
    endpoints: &[Endpoint],
    epoch: EpochId,
    data: &[u8],
    total: u64,
) -> anyhow::Result<f64> {
    let mut client = Client::connect(
        endpoints,
        ClientOptions { placement: Placement::striped_default(), ..Default::default() },
    )?;
    client.begin_epoch(epoch);
    let start = Instant::now();
    let mut file = client.create_file(epoch, "bench/native")?;
    let mut offset = 0;
    while offset < total {
        let length = (total - offset).min(data.len() as u64) as usize;
        client.write(&mut file, offset, &data[..length])?;
        offset += length as u64;
    }
    client.flush()?;
    let seconds = start.elapsed().as_secs_f64();
    client.delete_epoch(epoch)?;
    Ok(total as f64 / MIB / seconds)
}

fn mount_write(path: &Path, data: &[u8], total: u64) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut written = 0;
    while written < total {
        let length = (total - written).min(data.len() as u64) as usize;
        file.write_all(&data[..length])
            .with_context(|| format!("writing {} at {written}", path.display()))?;
        written += length as u64;
    }
    drop(file); // close: waits until the servers acknowledged every write
    let seconds = start.elapsed().as_secs_f64();
    Ok(total as f64 / MIB / seconds)
}

/// Operations per second of each metadata phase.
#[derive(Clone, Copy, Debug, serde::Serialize)]
struct MetaRates {
    create_ops_s: f64,
    stat_ops_s: f64,
    unlink_ops_s: f64,
}

/// `files` creates, stats and unlinks in each of `dirs` (one worker thread each), phase by
/// phase, all workers starting each phase together. A phase lasts from the first worker's start
/// to the last worker's end, as each worker timed them (a loaded machine may delay any one
/// thread, so no third thread's clock is trusted).
fn metadata_run(dirs: &[PathBuf], files: u32) -> anyhow::Result<MetaRates> {
    for dir in dirs {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let workers = dirs.len();
    let barrier = Barrier::new(workers);
    let ops = (files as usize * workers) as f64;
    let spans: Vec<[(Instant, Instant); 3]> =
        std::thread::scope(|scope| -> anyhow::Result<Vec<[(Instant, Instant); 3]>> {
            let handles: Vec<_> = dirs
                .iter()
                .map(|dir| {
                    let barrier = &barrier;
                    scope.spawn(move || -> anyhow::Result<[(Instant, Instant); 3]> {
                        let name = |i: u32| dir.join(format!("f{i:06}"));
                        let phase = |p: usize| -> anyhow::Result<()> {
                            for i in 0..files {
                                let path = name(i);
                                match p {
                                    0 => {
                                        drop(std::fs::File::create_new(&path).with_context(
                                            || format!("creating {}", path.display()),
                                        )?)
                                    }
                                    1 => {
                                        let meta = std::fs::metadata(&path)
                                            .with_context(|| format!("stat {}", path.display()))?;
                                        anyhow::ensure!(
                                            meta.is_file(),
                                            "{} is not a file",
                                            path.display()
                                        );
                                    }
                                    _ => std::fs::remove_file(&path)
                                        .with_context(|| format!("unlink {}", path.display()))?,
                                }
                            }
                            Ok(())
                        };
                        // Every worker reaches every barrier, also after a failure (no deadlock).
                        let mut failure = None;
                        let mut spans = [(Instant::now(), Instant::now()); 3];
                        for (p, span) in spans.iter_mut().enumerate() {
                            barrier.wait();
                            let start = Instant::now();
                            if failure.is_none() {
                                failure = phase(p).err();
                            }
                            *span = (start, Instant::now());
                        }
                        failure.map_or(Ok(spans), Err)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("metadata worker panicked")).collect()
        })?;
    let rate = |phase: usize| {
        let first = spans.iter().map(|s| s[phase].0).min().expect("a worker");
        let last = spans.iter().map(|s| s[phase].1).max().expect("a worker");
        ops / (last - first).as_secs_f64()
    };
    Ok(MetaRates { create_ops_s: rate(0), stat_ops_s: rate(1), unlink_ops_s: rate(2) })
}

#[derive(Debug, serde::Serialize)]
struct MetaRow {
    target: &'static str,
    workers: usize,
    #[serde(flatten)]
    rates: MetaRates,
}

/// Two node names whose private namespaces land on different servers.
fn nodes_on_different_servers(servers: usize) -> (String, String) {
    let first = "node-0".to_string();
    let (_, server0) = namespace_placement(NamespaceAccess::Private, &first, None, servers);
    if servers < 2 {
        return (first, "node-1".to_string());
    }
    let second = (1..)
        .map(|i| format!("node-{i}"))
        .find(|n| namespace_placement(NamespaceAccess::Private, n, None, servers).1 != server0)
        .expect("some name hashes elsewhere");
    (first, second)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let total = args.write_bytes;
    if total == 0 || args.repeat == 0 || args.files == 0 || args.servers == 0 || args.threads == 0 {
        bail!("--write-bytes, --repeat, --files, --servers and --threads must be positive");
    }
    let (work, _temporary) = work_directory(args.work_dir.as_deref())?;
    // Every byte of both variants stays in DRAM (mount files are never deleted from the
    // store during the run): no spilling inside a measurement.
    // The IOR and durable runs delete their epochs: one run of each side at a time.
    let bytes_of = |phase: Phase, bytes: u64| if args.runs(phase) { bytes } else { 0 };
    let per_server = (bytes_of(Phase::Sequential, total * (args.repeat as u64 + 1) * 2)
        + bytes_of(Phase::Ior, 2 * args.ior_shape().run_bytes())
        + bytes_of(Phase::Durable, 2 * args.durable_shape().run_bytes()))
    .div_ceil(args.servers as u64);
    let dram = crate::dram_bytes_holding(per_server, 128 << 20);
    let (servers, endpoints) = start_servers(&work, args.servers, dram)?;
    let measured = Measured {
        writes: args
            .runs(Phase::Sequential)
            .then(|| measure_sequential_writes(&args, &work, &endpoints))
            .transpose()?,
        metadata: args
            .runs(Phase::Metadata)
            .then(|| measure_metadata(&args, &work, &endpoints))
            .transpose()?,
        ior: args
            .runs(Phase::Ior)
            .then(|| crate::mount_ior::measure(&args.ior_shape(), &work, &endpoints))
            .transpose()?,
        durable: args
            .runs(Phase::Durable)
            .then(|| crate::mount_durable::measure(&args.durable_shape(), &work, &endpoints))
            .transpose()?,
        stat: args
            .runs(Phase::Stat)
            .then(|| crate::mount_stat::measure(&args.stat_shape(), &work, &endpoints))
            .transpose()?,
    };
    drop(servers);
    if args.json {
        return print_json(&args, &measured);
    }
    if let Some(writes) = &measured.writes {
        print_writes_text(&args, writes);
    }
    if let Some(rows) = &measured.metadata {
        print_metadata_text(&args, rows);
    }
    if let Some(ior) = &measured.ior {
        print_ior_text(&args.ior_shape(), ior);
    }
    if let Some(durable) = &measured.durable {
        print_durable_text(&args.durable_shape(), durable);
    }
    if let Some(stat) = &measured.stat {
        print_stat_text(&args.stat_shape(), stat);
    }
    Ok(())
}

/// `--work-dir` (created if missing), or a fresh temporary directory and its guard.
pub(crate) fn work_directory(
    dir: Option<&Path>,
) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            Ok((dir.to_path_buf(), None))
        }
        None => {
            let temporary = tempfile::tempdir()?;
            Ok((temporary.path().to_path_buf(), Some(temporary)))
        }
    }
}

/// MiB/s of every measured sequential-write run, native client and mount in pairs.
struct SequentialWrites {
    native: Vec<f64>,
    mounted: Vec<f64>,
}

impl SequentialWrites {
    /// Each run's mount over native figure.
    fn pair_ratios(&self) -> Vec<f64> {
        self.native.iter().zip(&self.mounted).map(|(n, m)| m / n).collect()
    }
}

/// (1) Native client and mount writes of `--write-bytes`, paired, after an unmeasured round.
fn measure_sequential_writes(
    args: &Args,
    work: &Path,
    endpoints: &[Endpoint],
) -> anyhow::Result<SequentialWrites> {
    let total = args.write_bytes;
    let data: Vec<u8> = (0..TRANSFER_BYTES).map(|i| (i * 131 % 251) as u8).collect();
    let write_ns =
        connect_namespace(&endpoints[0], 10, open_root(EpochId(1_000_010)), args.threads, None)?;
    let write_mount = mount(&work.join("mnt-write"), write_ns, endpoints, args.threads)?;
    // One unmeasured round first (connections, first files), then alternating measured runs;
    // the ratio is the median of each run's mount/native pair, which cancels slow phases of a
    // shared machine better than a ratio of medians.
    let warmup = (total / 8).max(TRANSFER_BYTES as u64);
    native_write(endpoints, EpochId(NATIVE_EPOCH_BASE - 1), &data, warmup)?;
    mount_write(&write_mount.path.join("warmup"), &data, warmup)?;
    let (mut native, mut mounted) = (Vec::new(), Vec::new());
    for run in 0..args.repeat {
        native.push(native_write(
            endpoints,
            EpochId(NATIVE_EPOCH_BASE + run as u64),
            &data,
            total,
        )?);
        mounted.push(mount_write(&write_mount.path.join(format!("seq-{run}")), &data, total)?);
    }
    drop(write_mount);
    Ok(SequentialWrites { native, mounted })
}

/// (2) Metadata on striped and private namespaces, (3) on a plain directory; 1 and 2 workers.
fn measure_metadata(
    args: &Args,
    work: &Path,
    endpoints: &[Endpoint],
) -> anyhow::Result<Vec<MetaRow>> {
    let mut rows = Vec::new();
    for workers in [1, 2] {
        let dirs: Vec<PathBuf> =
            (0..workers).map(|w| work.join(format!("plain-{workers}/w{w}"))).collect();
        rows.push(MetaRow {
            target: "plain directory",
            workers,
            rates: metadata_run(&dirs, args.files)?,
        });
    }
    for workers in [1, 2] {
        let mounts = striped_mounts(args, work, endpoints, workers)?;
        rows.push(MetaRow {
            target: "mount, striped",
            workers,
            rates: metadata_run(&worker_directories(&mounts), args.files)?,
        });
    }
    let nodes = nodes_on_different_servers(args.servers);
    for workers in [1, 2] {
        let mounts = private_mounts(args, work, endpoints, &nodes, workers)?;
        rows.push(MetaRow {
            target: "mount, private",
            workers,
            rates: metadata_run(&worker_directories(&mounts), args.files)?,
        });
    }
    Ok(rows)
}

/// Directory `w<i>` of each worker `i`, on its own mount.
fn worker_directories(mounts: &[BenchMount]) -> Vec<PathBuf> {
    mounts.iter().enumerate().map(|(w, m)| m.path.join(format!("w{w}"))).collect()
}

/// One mount per worker of one striped namespace on the first server, as two nodes would.
fn striped_mounts(
    args: &Args,
    work: &Path,
    endpoints: &[Endpoint],
    workers: usize,
) -> anyhow::Result<Vec<BenchMount>> {
    let id = 20 + workers as u64;
    (0..workers)
        .map(|w| {
            let ns = connect_namespace(
                &endpoints[0],
                id,
                open_root(EpochId(1_000_000 + id)),
                args.threads,
                // Fresh epochs of its own: nothing to guard.
                None,
            )?;
            mount(&work.join(format!("mnt-striped-{workers}-{w}")), ns, endpoints, args.threads)
        })
        .collect()
}

/// One mount per worker, each of its node's private namespace (`nodes`: on different servers).
fn private_mounts(
    args: &Args,
    work: &Path,
    endpoints: &[Endpoint],
    nodes: &(String, String),
    workers: usize,
) -> anyhow::Result<Vec<BenchMount>> {
    [&nodes.0, &nodes.1][..workers]
        .iter()
        .enumerate()
        .map(|(w, node)| {
            // A fresh namespace per run, on the server the node's name picks.
            let (id, server) = namespace_placement(
                NamespaceAccess::Private,
                node,
                Some(100 + 10 * workers as u64 + w as u64),
                args.servers,
            );
            let ns = connect_namespace(
                &endpoints[server],
                id,
                open_root(EpochId(1_000_100)),
                args.threads,
                // Fresh epochs of its own: nothing to guard.
                None,
            )?;
            mount(&work.join(format!("mnt-private-{workers}-{w}")), ns, endpoints, args.threads)
        })
        .collect()
}

/// The rates of the metadata row of `target` with `workers` workers.
fn find_rates(rows: &[MetaRow], target: &str, workers: usize) -> MetaRates {
    rows.iter().find(|r| r.target == target && r.workers == workers).expect("measured").rates
}

/// Creates per second with 2 workers, private namespaces over one striped namespace.
fn private_over_striped_creates(rows: &[MetaRow]) -> f64 {
    find_rates(rows, "mount, private", 2).create_ops_s
        / find_rates(rows, "mount, striped", 2).create_ops_s
}

/// Every figure and ratio of the phases run as one JSON object on stdout.
fn print_json(args: &Args, measured: &Measured) -> anyhow::Result<()> {
    let mut out = serde_json::json!({
        "servers": args.servers,
        "threads_per_mount": args.threads,
        "ratios": {},
    });
    if let Some(writes) = &measured.writes {
        let pair_ratios = writes.pair_ratios();
        out["write"] = serde_json::json!({
            "bytes": args.write_bytes,
            "transfer_bytes": TRANSFER_BYTES,
            "repeat": args.repeat,
            "native_mib_s": median(writes.native.clone()),
            "mount_mib_s": median(writes.mounted.clone()),
            "native_mib_s_runs": writes.native,
            "mount_mib_s_runs": writes.mounted,
            "mount_over_native_runs": pair_ratios,
        });
        out["ratios"]["mount_vs_native"] = median(pair_ratios).into();
    }
    if let Some(rows) = &measured.metadata {
        let find = |target: &str, workers: usize| find_rates(rows, target, workers);
        out["metadata"] = serde_json::json!({ "files_per_worker": args.files, "rows": rows });
        let ratios = &mut out["ratios"];
        ratios["private_over_striped_creates_2proc"] = private_over_striped_creates(rows).into();
        ratios["striped_2_over_1_creates"] = (find("mount, striped", 2).create_ops_s
            / find("mount, striped", 1).create_ops_s)
            .into();
        ratios["private_2_over_1_creates"] = (find("mount, private", 2).create_ops_s
            / find("mount, private", 1).create_ops_s)
            .into();
        ratios["mount_over_plain_creates_1proc"] = (find("mount, striped", 1).create_ops_s
            / find("plain directory", 1).create_ops_s)
            .into();
    }
    if let Some(ior) = &measured.ior {
        out["ior"] = serde_json::json!({ "shape": args.ior_shape(), "rows": ior });
        for row in ior {
            let key = row.layout.key();
            out["ratios"][format!("mount_vs_native_{key}_write")] =
                row.mount_vs_native_write.into();
            out["ratios"][format!("mount_vs_native_{key}_read")] = row.mount_vs_native_read.into();
        }
    }
    if let Some(durable) = &measured.durable {
        out["durable"] = serde_json::json!({ "shape": args.durable_shape(), "result": durable });
        out["ratios"]["mount_fsync_vs_direct"] = durable.mount_fsync_vs_direct.into();
    }
    if let Some(stat) = &measured.stat {
        out["stat"] = serde_json::json!({ "shape": args.stat_shape(), "result": stat });
        out["ratios"]["cached_over_uncached_stats"] = stat.cached_over_uncached_stats.into();
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// The stat figures.
fn print_stat_text(shape: &crate::mount_stat::StatShape, stat: &crate::mount_stat::StatResult) {
    println!(
        "stat of {} files through a mount, median of {} runs ({} FUSE threads)",
        shape.files, shape.repeat, shape.threads
    );
    println!("  {:<28} {:>12.0} stat/s", "caching (default TTL)", stat.cached_stats_s);
    println!("  {:<28} {:>12.0} stat/s", "TTL 0 (no cache)", stat.uncached_stats_s);
    println!(
        "  cached over uncached: {:.2}x, median of per-run ratios (target >= 5)",
        stat.cached_over_uncached_stats
    );
}

/// The sequential-write figures.
fn print_writes_text(args: &Args, writes: &SequentialWrites) {
    println!(
        "Sequential 1 MiB writes, {:.0} MiB per run, median of {} ({} servers, {} FUSE threads)",
        args.write_bytes as f64 / MIB,
        args.repeat,
        args.servers,
        args.threads
    );
    println!("  {:<16} {:>10.1} MiB/s", "native client", median(writes.native.clone()));
    println!(
        "  {:<16} {:>10.1} MiB/s   {:.2}x native, median of per-run ratios (target >= 0.6)",
        "mount",
        median(writes.mounted.clone()),
        median(writes.pair_ratios())
    );
    println!();
}

/// The metadata table.
fn print_metadata_text(args: &Args, rows: &[MetaRow]) {
    println!("Metadata: {} files per worker, ops/s", args.files);
    println!(
        "  {:<18} {:>7} {:>10} {:>10} {:>10}",
        "target", "workers", "create", "stat", "unlink"
    );
    for row in rows {
        println!(
            "  {:<18} {:>7} {:>10.0} {:>10.0} {:>10.0}",
            row.target,
            row.workers,
            row.rates.create_ops_s,
            row.rates.stat_ops_s,
            row.rates.unlink_ops_s
        );
    }
    println!();
    println!(
        "private / striped creates with 2 workers: {:.2}x",
        private_over_striped_creates(rows)
    );
    println!();
}

/// The durable phase as a table row per subject, with the target.
fn print_durable_text(shape: &DurableShape, result: &DurableResult) {
    println!(
        "Durable: file per process, {} writers, {:.0} MiB each in 1 MiB writes, fsync at the end, median of {}",
        shape.workers,
        shape.block_bytes as f64 / MIB,
        shape.repeat
    );
    println!("  {:<24} {:>10} {:>12}", "subject", "MiB/s", "CPU s/GB");
    println!(
        "  {:<24} {:>10.1} {:>12.2}",
        "plain directory + fsync", result.direct_mib_s, result.direct_cpu_seconds_per_gb
    );
    println!(
        "  {:<24} {:>10.1} {:>12.2}   {:.2}x direct, median of per-run ratios (target >= 0.8)",
        "mount + fsync",
        result.mount_mib_s,
        result.mount_cpu_seconds_per_gb,
        result.mount_fsync_vs_direct
    );
    let runs: Vec<String> = result
        .direct_runs
        .iter()
        .zip(&result.mount_runs)
        .map(|(d, m)| format!("{:.0}/{:.0}", d.mib_s, m.mib_s))
        .collect();
    println!("  runs (direct/mount MiB/s): {}", runs.join(", "));
}

/// The IOR-shaped phases as a table, with the targets.
fn print_ior_text(shape: &IorShape, rows: &[IorRow]) {
    println!(
        "IOR-shaped phases: {} workers, {:.0} MiB each (16 KiB strided: {:.0} MiB), median of {}, MiB/s",
        shape.workers,
        shape.block_bytes as f64 / MIB,
        shape.strided_block_bytes as f64 / MIB,
        shape.repeat
    );
    println!(
        "  {:<12} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7}  target",
        "layout", "native wr", "mount wr", "ratio", "native rd", "mount rd", "ratio"
    );
    for row in rows {
        let target = if row.layout == crate::mount_ior::Layout::Strided16k { 0.5 } else { 0.8 };
        println!(
            "  {:<12} {:>10.1} {:>10.1} {:>6.2}x {:>10.1} {:>10.1} {:>6.2}x  >= {target}",
            row.layout.key(),
            row.native_write_mib_s,
            row.mount_write_mib_s,
            row.mount_vs_native_write,
            row.native_read_mib_s,
            row.mount_read_mib_s,
            row.mount_vs_native_read
        );
    }
    println!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn every_phase_runs_by_default_and_phases_picks_some() {
        let all = Cli::try_parse_from(["mount"]).unwrap().args;
        let every = [Phase::Sequential, Phase::Metadata, Phase::Ior, Phase::Durable, Phase::Stat];
        assert!(every.iter().all(|&p| all.runs(p)), "{:?}", all.phases);
        let some = Cli::try_parse_from(["mount", "--phases", "durable,ior"]).unwrap().args;
        assert_eq!(every.map(|p| some.runs(p)), [false, false, true, true, false]);
        assert!(Cli::try_parse_from(["mount", "--phases", "fsync"]).is_err());
    }
}
