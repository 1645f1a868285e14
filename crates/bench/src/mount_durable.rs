//! The durable phase of `spillway bench mount`: `--durable-workers` writers, file per process,
//! 1 MiB writes of `--durable-block` bytes each, `fsync` at the end of each file, through the
//! mount and into a plain directory on the disk that holds the servers' SSD logs (the
//! benchmark's work directory), the same bytes, in the same run.
//!
//! Each subject is timed from the first write to the return of the last `fsync` (files are
//! opened, and on the mount created, before: untimed). Runs alternate plain directory, mount,
//! as the IOR-shaped phases alternate native, mount; the medians of `--ior-repeat` runs are
//! reported and the ratio is the median of the per-run mount/direct ratios
//! (`ratios.mount_fsync_vs_direct`; target ≥ 0.8). Each mount run has a fresh namespace and
//! epoch, deleted afterwards; each direct run's files are removed afterwards.
//!
//! The busy CPU seconds of the whole machine (`/proc/stat`: every process, kernel threads and
//! interrupts included) per GB written are read around each run's workers, so they include
//! thread start and the untimed opens, and whatever else the machine runs meanwhile.

use crate::mount::{mount, open_root};
use crate::mount_ior::{delete_epoch, pattern, timed_workers_prepared};
use crate::stats::{median, BusyCpu};
use anyhow::{ensure, Context};
use spillway_mount::connect::connect_namespace;
use spillway_proto::Endpoint;
use spillway_types::EpochId;
use std::fs::File;
use std::io::Write;
use std::path::Path;

const MIB: f64 = 1024.0 * 1024.0;
/// Namespace ids and epochs of the durable runs (clear of the other phases').
const NAMESPACE_ID_BASE: u64 = 400;
const MOUNT_EPOCH_BASE: u64 = 1_000_400;

/// The sizes of the durable phase.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct DurableShape {
    pub workers: usize,
    /// Bytes each worker writes to its file (a multiple of 1 MiB).
    pub block_bytes: u64,
    pub transfer_bytes: usize,
    pub repeat: u32,
    pub threads: usize,
}

impl DurableShape {
    /// Bytes one run writes on one side.
    pub fn run_bytes(&self) -> u64 {
        self.workers as u64 * self.block_bytes
    }
}

/// One run of one subject: MiB/s and busy machine CPU seconds per GB written.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct DurableRun {
    pub mib_s: f64,
    pub cpu_seconds_per_gb: f64,
}

/// The phase's runs, medians and ratio.
#[derive(Debug, serde::Serialize)]
pub struct DurableResult {
    pub direct_mib_s: f64,
    pub mount_mib_s: f64,
    pub direct_cpu_seconds_per_gb: f64,
    pub mount_cpu_seconds_per_gb: f64,
    /// Median of the per-run mount/direct ratios.
    pub mount_fsync_vs_direct: f64,
    pub direct_runs: Vec<DurableRun>,
    pub mount_runs: Vec<DurableRun>,
}

/// `shape.repeat` pairs of runs, plain directory then mount, after one unmeasured pair.
pub fn measure(
    shape: &DurableShape,
    work: &Path,
    endpoints: &[Endpoint],
) -> anyhow::Result<DurableResult> {
    ensure!(
        shape.workers > 0 && shape.repeat > 0,
        "--durable-workers and --ior-repeat must be positive"
    );
    let transfer = shape.transfer_bytes as u64;
    ensure!(
        shape.block_bytes >= transfer && shape.block_bytes.is_multiple_of(transfer),
        "--durable-block ({}) must be a positive multiple of {transfer} bytes",
        shape.block_bytes
    );
    // Warm-up: connections, first files, the directory's and the logs' first allocations.
    direct_run(shape, work, "warm-up")?;
    mount_run(shape, work, endpoints, 0)?;
    let (mut direct, mut mounted) = (Vec::new(), Vec::new());
    for run in 0..shape.repeat as u64 {
        direct.push(direct_run(shape, work, &run.to_string())?);
        mounted.push(mount_run(shape, work, endpoints, run + 1)?);
    }
    Ok(DurableResult {
        direct_mib_s: median(direct.iter().map(|r| r.mib_s)),
        mount_mib_s: median(mounted.iter().map(|r| r.mib_s)),
        direct_cpu_seconds_per_gb: median(direct.iter().map(|r| r.cpu_seconds_per_gb)),
        mount_cpu_seconds_per_gb: median(mounted.iter().map(|r| r.cpu_seconds_per_gb)),
        mount_fsync_vs_direct: median(direct.iter().zip(&mounted).map(|(d, m)| m.mib_s / d.mib_s)),
        direct_runs: direct,
        mount_runs: mounted,
    })
}

/// Every worker opens its file with `open(worker)` (untimed), then all write `block` bytes in
/// 1 MiB `write(2)`s and `fsync` it, timed together; the run's figures.
fn timed_run(
    shape: &DurableShape,
    open: impl Fn(usize) -> anyhow::Result<(File, std::path::PathBuf)> + Sync,
) -> anyhow::Result<DurableRun> {
    let data = pattern(shape.transfer_bytes);
    let transfers = shape.block_bytes / shape.transfer_bytes as u64;
    let cpu = BusyCpu::start()?;
    let seconds = timed_workers_prepared(shape.workers, open, |_, (mut file, path)| {
        for i in 0..transfers {
            file.write_all(&data).with_context(|| {
                format!("writing {} at {}", path.display(), i * data.len() as u64)
            })?;
        }
        file.sync_all().with_context(|| format!("fsync of {}", path.display()))?;
        Ok(file) // closed after the span: it ends at the fsync's return
    })?;
    let bytes = shape.run_bytes();
    Ok(DurableRun {
        mib_s: bytes as f64 / MIB / seconds.max(1e-9),
        cpu_seconds_per_gb: cpu.seconds_per_gb(bytes)?,
    })
}

/// One run into `<work>/durable-direct-<run>`, on the disk of the servers' SSD logs.
fn direct_run(shape: &DurableShape, work: &Path, run: &str) -> anyhow::Result<DurableRun> {
    let dir = work.join(format!("durable-direct-{run}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = timed_run(shape, |w| {
        let path = dir.join(format!("fpp.{w:04}"));
        let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok((file, path))
    });
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    result
}

/// One run through a fresh mount (namespace and data epoch of its own, deleted afterwards).
fn mount_run(
    shape: &DurableShape,
    work: &Path,
    endpoints: &[Endpoint],
    run: u64,
) -> anyhow::Result<DurableRun> {
    let id = NAMESPACE_ID_BASE + run;
    let epoch = EpochId(MOUNT_EPOCH_BASE + run);
    let namespace = connect_namespace(&endpoints[0], id, open_root(epoch), shape.threads, None)?;
    let bench_mount =
        mount(&work.join(format!("mnt-durable-{run}")), namespace, endpoints, shape.threads)?;
    let root = bench_mount.path.clone();
    let result = timed_run(shape, |w| {
        let path = root.join(format!("fpp.{w:04}"));
        let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok((file, path))
    });
    drop(bench_mount);
    delete_epoch(endpoints, epoch)?;
    result
}
