//! IOR-shaped phases of `spillway bench mount`: `--ior-workers` worker threads write, then read
//! back, in three layouts, through the mount and through the native client in the same run:
//!
//! - file per process, 1 MiB transfers: worker `w` writes its own file, `--ior-block` bytes;
//! - shared file, 1 MiB transfers: worker `w` writes `[w·B, (w+1)·B)` of one file (IOR's
//!   segmented layout);
//! - shared file, 16 KiB transfers strided: transfer `i` of worker `w` lands at `(i·W + w)·16 KiB`
//!   (IOR's `-s` strided layout), `--ior-strided-block` bytes per worker.
//!
//! A phase lasts from the first worker's start to the last worker's end (each worker's own
//! clock, as in the metadata runs). Writes end with `close` (mount) or `flush` (native): every
//! byte acknowledged by the servers. Reads open the file afresh (the mount drops cached pages
//! at open, so they reach the servers) and check every transfer's bytes. The shared file is
//! created before the phase, untimed, as IOR's rank 0 does; file-per-process files are created
//! inside it. Each run uses a fresh namespace and native epoch, deleted afterwards, so the
//! servers' DRAM holds one run at a time. Ratios are medians of each run's mount/native pair.

use crate::mount::{mount, open_root};
use crate::stats::median;
use anyhow::{ensure, Context};
use spillway_client::{Client, ClientOptions, Placement};
use spillway_mount::connect::connect_namespace;
use spillway_proto::Endpoint;
use spillway_types::EpochId;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Barrier;
use std::time::Instant;

const MIB: f64 = 1024.0 * 1024.0;
/// Namespace ids and epochs of the IOR runs (clear of the other phases').
const NAMESPACE_ID_BASE: u64 = 300;
const MOUNT_EPOCH_BASE: u64 = 1_000_300;
const NATIVE_EPOCH_BASE: u64 = 6_000;

/// The sizes of the IOR phases.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct IorShape {
    pub workers: usize,
    /// Bytes per worker of the 1 MiB-transfer layouts.
    pub block_bytes: u64,
    /// Bytes per worker of the 16 KiB strided layout.
    pub strided_block_bytes: u64,
    pub repeat: u32,
    pub threads: usize,
}

impl IorShape {
    /// Bytes one run writes on one side (mount or native).
    pub fn run_bytes(&self) -> u64 {
        self.workers as u64 * (2 * self.block_bytes + self.strided_block_bytes)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    FilePerProcess,
    Shared,
    Strided16k,
}

impl Layout {
    pub const ALL: [Layout; 3] = [Layout::FilePerProcess, Layout::Shared, Layout::Strided16k];

    /// The key in `ratios`: `mount_vs_native_<key>_<write|read>`.
    pub fn key(self) -> &'static str {
        match self {
            Layout::FilePerProcess => "fpp",
            Layout::Shared => "shared",
            Layout::Strided16k => "strided_16k",
        }
    }

    fn transfer_bytes(self) -> usize {
        match self {
            Layout::FilePerProcess | Layout::Shared => 1 << 20,
            Layout::Strided16k => 16 << 10,
        }
    }

    fn block_bytes(self, shape: &IorShape) -> u64 {
        match self {
            Layout::FilePerProcess | Layout::Shared => shape.block_bytes,
            Layout::Strided16k => shape.strided_block_bytes,
        }
    }

    fn file_name(self, worker: usize) -> String {
        match self {
            Layout::FilePerProcess => format!("ior-fpp.{worker:04}"),
            Layout::Shared => "ior-shared".to_string(),
            Layout::Strided16k => "ior-strided".to_string(),
        }
    }

    /// Offset of transfer `i` of `worker` (of `workers`), each worker writing `block` bytes.
    fn offset(self, worker: usize, workers: usize, block: u64, i: u64) -> u64 {
        let transfer = self.transfer_bytes() as u64;
        match self {
            Layout::FilePerProcess => i * transfer,
            Layout::Shared => worker as u64 * block + i * transfer,
            Layout::Strided16k => (i * workers as u64 + worker as u64) * transfer,
        }
    }
}

/// One layout's medians and pair ratios.
#[derive(Debug, serde::Serialize)]
pub struct IorRow {
    pub layout: Layout,
    pub native_write_mib_s: f64,
    pub mount_write_mib_s: f64,
    pub native_read_mib_s: f64,
    pub mount_read_mib_s: f64,
    pub mount_vs_native_write: f64,
    pub mount_vs_native_read: f64,
}

/// Write and read MiB/s of one run on one side.
#[derive(Clone, Copy)]
struct Rates {
    write: f64,
    read: f64,
}

/// Every layout, `shape.repeat` runs of each side in pairs.
pub fn measure(
    shape: &IorShape,
    work: &Path,
    endpoints: &[Endpoint],
) -> anyhow::Result<Vec<IorRow>> {
    ensure!(shape.workers > 0 && shape.repeat > 0, "--ior-workers and --repeat must be positive");
    let mut rows = Vec::new();
    let mut run_index = 0u64;
    for layout in Layout::ALL {
        let block = layout.block_bytes(shape);
        let transfer = layout.transfer_bytes() as u64;
        ensure!(
            block >= transfer && block % transfer == 0,
            "{}: the bytes per worker ({block}) must be a positive multiple of its {transfer}-byte transfer",
            layout.key()
        );
        let (mut native, mut mounted) = (Vec::new(), Vec::new());
        for _ in 0..shape.repeat {
            native.push(native_run(
                shape,
                layout,
                endpoints,
                EpochId(NATIVE_EPOCH_BASE + run_index),
            )?);
            mounted.push(mount_run(shape, layout, work, endpoints, run_index)?);
            run_index += 1;
        }
        let ratio = |pick: fn(&Rates) -> f64| {
            median(native.iter().zip(&mounted).map(|(n, m)| pick(m) / pick(n)))
        };
        rows.push(IorRow {
            layout,
            native_write_mib_s: median(native.iter().map(|r| r.write)),
            mount_write_mib_s: median(mounted.iter().map(|r| r.write)),
            native_read_mib_s: median(native.iter().map(|r| r.read)),
            mount_read_mib_s: median(mounted.iter().map(|r| r.read)),
            mount_vs_native_write: ratio(|r| r.write),
            mount_vs_native_read: ratio(|r| r.read),
        });
    }
    Ok(rows)
}

/// The transfer's bytes: the same pattern for every transfer, so reads check cheaply.
pub(crate) fn pattern(length: usize) -> Vec<u8> {
    (0..length).map(|i| (i * 131 % 251) as u8).collect()
}

/// Runs `work(worker)` on `workers` threads started together; the span from the first start to
/// the last end, in seconds.
fn timed_workers(
    workers: usize,
    work: impl Fn(usize) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<f64> {
    timed_workers_prepared(workers, |_| Ok(()), |w, ()| work(w))
}

/// [`timed_workers`] with an untimed `prepare(worker)` on each thread first (opening its file):
/// every worker prepares, then all start `work(worker, prepared)` together. A failed
/// preparation still reaches the barrier (no deadlock) and skips its work. What `work` returns
/// is dropped after its end was taken (a file closed after the span).
pub(crate) fn timed_workers_prepared<T, U>(
    workers: usize,
    prepare: impl Fn(usize) -> anyhow::Result<T> + Sync,
    work: impl Fn(usize, T) -> anyhow::Result<U> + Sync,
) -> anyhow::Result<f64> {
    let barrier = Barrier::new(workers);
    let spans = std::thread::scope(|scope| -> anyhow::Result<Vec<(Instant, Instant)>> {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (barrier, prepare, work) = (&barrier, &prepare, &work);
                scope.spawn(move || {
                    let prepared = prepare(w);
                    barrier.wait();
                    let start = Instant::now();
                    let kept = work(w, prepared?)?;
                    let end = Instant::now();
                    drop(kept);
                    Ok((start, end))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("IOR worker panicked")).collect()
    })?;
    let first = spans.iter().map(|s| s.0).min().expect("a worker");
    let last = spans.iter().map(|s| s.1).max().expect("a worker");
    Ok((last - first).as_secs_f64())
}

fn mount_run(
    shape: &IorShape,
    layout: Layout,
    work: &Path,
    endpoints: &[Endpoint],
    run: u64,
) -> anyhow::Result<Rates> {
    let id = NAMESPACE_ID_BASE + run;
    let epoch = EpochId(MOUNT_EPOCH_BASE + run);
    let namespace = connect_namespace(&endpoints[0], id, open_root(epoch), shape.threads, None)?;
    let bench_mount =
        mount(&work.join(format!("mnt-ior-{run}")), namespace, endpoints, shape.threads)?;
    let root = bench_mount.path.clone();
    let (block, transfer) = (layout.block_bytes(shape), layout.transfer_bytes());
    let transfers = block / transfer as u64;
    let data = pattern(transfer);
    if layout != Layout::FilePerProcess {
        std::fs::File::create(root.join(layout.file_name(0)))?;
    }
    let write_seconds = timed_workers(shape.workers, |w| {
        let path = root.join(layout.file_name(w));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(layout == Layout::FilePerProcess)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        for i in 0..transfers {
            let offset = layout.offset(w, shape.workers, block, i);
            file.write_all_at(&data, offset)
                .with_context(|| format!("writing {} at {offset}", path.display()))?;
        }
        drop(file); // close: every write acknowledged
        Ok(())
    })?;
    let read_seconds = timed_workers(shape.workers, |w| {
        let path = root.join(layout.file_name(w));
        let file = std::fs::File::open(&path)?;
        let mut buffer = vec![0u8; transfer];
        for i in 0..transfers {
            let offset = layout.offset(w, shape.workers, block, i);
            file.read_exact_at(&mut buffer, offset)
                .with_context(|| format!("reading {} at {offset}", path.display()))?;
            ensure!(buffer == data, "{} at {offset}: not the bytes written", path.display());
        }
        Ok(())
    })?;
    drop(bench_mount);
    delete_epoch(endpoints, epoch)?;
    Ok(rates(shape, layout, write_seconds, read_seconds))
}

fn native_client(endpoints: &[Endpoint], epoch: EpochId) -> anyhow::Result<Client> {
    let mut client = Client::connect(
        endpoints,
        ClientOptions { placement: Placement::striped_default(), ..Default::default() },
    )?;
    client.begin_epoch(epoch);
    Ok(client)
}

fn native_run(
    shape: &IorShape,
    layout: Layout,
    endpoints: &[Endpoint],
    epoch: EpochId,
) -> anyhow::Result<Rates> {
    let (block, transfer) = (layout.block_bytes(shape), layout.transfer_bytes());
    let transfers = block / transfer as u64;
    let data = pattern(transfer);
    if layout != Layout::FilePerProcess {
        let mut client = native_client(endpoints, epoch)?;
        client.create_file(epoch, &layout.file_name(0))?;
        client.flush()?;
    }
    let write_seconds = timed_workers(shape.workers, |w| {
        let mut client = native_client(endpoints, epoch)?;
        let name = layout.file_name(w);
        let mut file = if layout == Layout::FilePerProcess {
            client.create_file(epoch, &name)?
        } else {
            client.open_file(epoch, &name)?
        };
        for i in 0..transfers {
            client.write(&mut file, layout.offset(w, shape.workers, block, i), &data)?;
        }
        client.flush()?;
        Ok(())
    })?;
    let read_seconds = timed_workers(shape.workers, |w| {
        let mut client = native_client(endpoints, epoch)?;
        let name = layout.file_name(w);
        let file = client.open_file(epoch, &name)?;
        let mut buffer = vec![0u8; transfer];
        for i in 0..transfers {
            let offset = layout.offset(w, shape.workers, block, i);
            client.read(&file, offset, &mut buffer)?;
            ensure!(buffer == data, "native {name} at {offset}: not the bytes written");
        }
        Ok(())
    })?;
    delete_epoch(endpoints, epoch)?;
    Ok(rates(shape, layout, write_seconds, read_seconds))
}

pub(crate) fn delete_epoch(endpoints: &[Endpoint], epoch: EpochId) -> anyhow::Result<()> {
    let mut client = native_client(endpoints, epoch)?;
    client.delete_epoch(epoch).with_context(|| format!("deleting epoch {}", epoch.0))
}

/// MiB/s of `workers × block` bytes written and read in the given seconds.
fn rates(shape: &IorShape, layout: Layout, write_seconds: f64, read_seconds: f64) -> Rates {
    let mib = (shape.workers as u64 * layout.block_bytes(shape)) as f64 / MIB;
    Rates { write: mib / write_seconds.max(1e-9), read: mib / read_seconds.max(1e-9) }
}
