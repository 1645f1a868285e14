//! `spillway bench peaks`: the peaks of a storage target, measured the way the DataWarp paper
//! measures a fragment — IOR-style bandwidth (large sequential transfers, one file per thread),
//! IOR-style IOPS (4 KiB random transfers) and MDTest-style metadata rates (create, stat,
//! remove) — at rising concurrency (1, 2, 4, … threads).
//!
//! Two kinds of target, one table and one JSON shape:
//! - `--target DIR`: a directory (a plain directory, or a Spillway FUSE mount once it exists);
//! - `--servers HOST:PORT,…`: a Spillway reservation's servers, driven through the native client
//!   library (no kernel in the path), one `Client` per thread ([`native`]).
//!
//! Every phase is bounded in bytes, operations and seconds so the default run finishes in well
//! under a minute. `--json` output is what `spillway characterize --peaks` reads.

mod namespaces;
mod native;

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::json;
use spillway_proto::Endpoint;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["target", "servers"])))]
pub struct Args {
    /// Directory to measure (created if missing; the benchmark works in a fresh subdirectory it
    /// removes afterwards). A Spillway FUSE mount is measured this way.
    #[arg(long, conflicts_with = "servers")]
    pub target: Option<PathBuf>,
    /// Measure a Spillway reservation through the native client instead: its servers, in the
    /// reservation's order, as HOST:PORT (or tcp://HOST:PORT, unix:///PATH), comma-separated.
    /// Until the manager that hands out reservations exists, this is the list of `spillway
    /// serve` endpoints. The benchmark uses fresh epochs and deletes them afterwards.
    #[arg(long, value_delimiter = ',', value_parser = parse_endpoint)]
    pub servers: Vec<Endpoint>,
    /// Native target: durability of the bandwidth phase's commit (ssd, memory, replicated with
    /// --replicas 2 or more, or server for the servers' configured default).
    #[arg(long, value_enum, default_value_t = CommitDurability::Server)]
    pub commit_durability: CommitDurability,
    /// Native target: copies of every piece, on servers of distinct failure domains.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Highest thread count; the levels are 1, 2, 4, … up to this.
    #[arg(long, default_value_t = 4)]
    pub threads_max: usize,
    /// Bandwidth phase: bytes each thread writes then reads, MiB.
    #[arg(long, default_value_t = 64)]
    pub file_mib_per_thread: u64,
    /// Bandwidth phase: transfer size, KiB (IOR in the paper: 8 MiB).
    #[arg(long, default_value_t = 8192)]
    pub transfer_kib: u64,
    /// IOPS phase: transfer size, bytes.
    #[arg(long, default_value_t = 4096)]
    pub small_transfer_bytes: u64,
    /// Metadata phase: files each thread creates, stats and removes.
    #[arg(long, default_value_t = 2000)]
    pub metadata_files_per_thread: u64,
    /// Upper bound on each phase, seconds (a phase stops early and reports what it did).
    #[arg(long, default_value_t = 1.0)]
    pub phase_seconds: f64,
    /// IOPS phase: fdatasync after every small write (IOR's fsyncPerWrite), so writes reach the
    /// device instead of the page cache. Native target: wait for each write's acknowledgement
    /// (no pipelining); durability only comes with an epoch's commit.
    #[arg(long)]
    pub sync_small_writes: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON object to this file (for `spillway characterize --peaks`).
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// One concurrency level's measurements.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Level {
    pub threads: usize,
    pub write_bytes_per_second: f64,
    pub read_bytes_per_second: f64,
    pub write_iops: f64,
    pub read_iops: f64,
    pub create_per_second: f64,
    pub stat_per_second: f64,
    /// Entries listed per second (directory: `readdir` of the thread's directory; native:
    /// `list_files` of the thread's epoch), repeated until the phase's time is up.
    pub list_entries_per_second: f64,
    pub remove_per_second: f64,
    /// Native target: metadata operations per second through the namespace service (mean of
    /// create, stat and unlink), all threads in one striped namespace; `None` for a directory,
    /// or when this process may not create namespaces ([`namespaces`]).
    pub namespace_striped_ops_per_second: Option<f64>,
    /// The same with one private namespace per thread.
    pub namespace_private_ops_per_second: Option<f64>,
}

/// `--commit-durability` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CommitDurability {
    Ssd,
    Memory,
    Replicated,
    Server,
}

impl CommitDurability {
    fn protocol(self) -> spillway_proto::Durability {
        match self {
            CommitDurability::Ssd => spillway_proto::Durability::Ssd,
            CommitDurability::Memory => spillway_proto::Durability::Memory,
            CommitDurability::Replicated => spillway_proto::Durability::Replicated,
            CommitDurability::Server => spillway_proto::Durability::ServerDefault,
        }
    }
}

fn parse_endpoint(text: &str) -> Result<Endpoint, String> {
    text.trim().parse()
}

/// Amount done by one thread in one phase and the time it took.
#[derive(Clone, Copy, Default)]
struct Work {
    units: u64,
    seconds: f64,
}

/// Aggregate rate: all units over the slowest thread's time (threads start together).
fn aggregate(work: &[Work]) -> f64 {
    let units: u64 = work.iter().map(|work| work.units).sum();
    let seconds = work.iter().map(|work| work.seconds).fold(0.0, f64::max);
    if seconds > 0.0 {
        units as f64 / seconds
    } else {
        0.0
    }
}

struct Phase<'a> {
    directory: &'a Path,
    args: &'a Args,
    deadline: Duration,
}

fn drop_cache(file: &File) {
    // Best effort: ask the kernel to forget the file's pages so reads reach the device.
    // SAFETY: plain syscall on a valid descriptor; failure only means the cache stays warm.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

impl Phase<'_> {
    fn data_path(&self, thread: usize) -> PathBuf {
        self.directory.join(format!("bandwidth.{thread}"))
    }

    /// Runs `body` on `threads` threads released together; each returns its work.
    fn parallel<F>(&self, threads: usize, body: F) -> anyhow::Result<Vec<Work>>
    where
        F: Fn(usize) -> anyhow::Result<Work> + Sync,
    {
        let barrier = Barrier::new(threads);
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|thread| {
                    let (barrier, body) = (&barrier, &body);
                    scope.spawn(move || {
                        barrier.wait();
                        body(thread)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().expect("benchmark thread panicked"))
                .collect()
        })
    }

    fn write_bandwidth(&self, thread: usize) -> anyhow::Result<Work> {
        let path = self.data_path(thread);
        let transfer = (self.args.transfer_kib << 10) as usize;
        let total = self.args.file_mib_per_thread << 20;
        let block = vec![0xA5u8; transfer];
        let mut file =
            File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let started = Instant::now();
        let mut written = 0u64;
        while written < total && started.elapsed() < self.deadline * 4 {
            let length = transfer.min((total - written) as usize);
            file.write_all(&block[..length])
                .with_context(|| format!("writing {}", path.display()))?;
            written += length as u64;
        }
        file.sync_all().with_context(|| format!("fsync {}", path.display()))?;
        let seconds = started.elapsed().as_secs_f64();
        drop_cache(&file);
        Ok(Work { units: written, seconds })
    }

    fn read_bandwidth(&self, thread: usize) -> anyhow::Result<Work> {
        let path = self.data_path(thread);
        let mut file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let mut block = vec![0u8; (self.args.transfer_kib << 10) as usize];
        let started = Instant::now();
        let mut read = 0u64;
        while started.elapsed() < self.deadline * 4 {
            let bytes =
                file.read(&mut block).with_context(|| format!("reading {}", path.display()))?;
            if bytes == 0 {
                break;
            }
            read += bytes as u64;
        }
        Ok(Work { units: read, seconds: started.elapsed().as_secs_f64() })
    }

    fn random_transfers(&self, thread: usize, write: bool, seed: u64) -> anyhow::Result<Work> {
        let path = self.data_path(thread);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let size = file.metadata().with_context(|| format!("stat {}", path.display()))?.len();
        let transfer = self.args.small_transfer_bytes;
        let slots = size / transfer;
        if slots == 0 {
            bail!("{} is smaller than one {transfer}-byte transfer", path.display());
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ thread as u64);
        let mut buffer = vec![0x5Au8; transfer as usize];
        let started = Instant::now();
        let mut operations = 0u64;
        // Check the clock every 64 operations; bound the count too.
        const OPERATIONS_MAX: u64 = 10_000_000;
        while operations < OPERATIONS_MAX {
            for _ in 0..64 {
                let offset = rng.gen_range(0..slots) * transfer;
                if write {
                    file.write_all_at(&buffer, offset).and_then(|()| {
                        if self.args.sync_small_writes {
                            file.sync_data()
                        } else {
                            Ok(())
                        }
                    })
                } else {
                    file.read_exact_at(&mut buffer, offset)
                }
                .with_context(|| {
                    format!(
                        "{} {} at offset {offset}",
                        if write { "write" } else { "read" },
                        path.display()
                    )
                })?;
                operations += 1;
            }
            if started.elapsed() >= self.deadline {
                break;
            }
        }
        Ok(Work { units: operations, seconds: started.elapsed().as_secs_f64() })
    }

    fn metadata(&self, thread: usize, step: MetadataStep) -> anyhow::Result<Work> {
        let directory = self.directory.join(format!("metadata.{thread}"));
        std::fs::create_dir_all(&directory)
            .with_context(|| format!("creating {}", directory.display()))?;
        let count = self.args.metadata_files_per_thread;
        let started = Instant::now();
        let mut done = 0u64;
        if step == MetadataStep::List {
            // At least one listing; more while the phase's time lasts.
            loop {
                for entry in std::fs::read_dir(&directory)
                    .with_context(|| format!("listing {}", directory.display()))?
                {
                    entry.with_context(|| format!("listing {}", directory.display()))?;
                    done += 1;
                }
                if started.elapsed() >= self.deadline || done == 0 {
                    break;
                }
            }
            return Ok(Work { units: done, seconds: started.elapsed().as_secs_f64() });
        }
        for index in 0..count {
            let path = directory.join(format!("f{index}"));
            let result = match step {
                MetadataStep::Create => {
                    OpenOptions::new().write(true).create_new(true).open(&path).map(drop)
                }
                MetadataStep::Stat => std::fs::metadata(&path).map(drop),
                MetadataStep::Remove => std::fs::remove_file(&path),
                MetadataStep::List => unreachable!("listing is handled above"),
            };
            match result {
                Ok(()) => done += 1,
                // Stat and remove only cover the files the (possibly cut short) create made.
                Err(error)
                    if error.kind() == std::io::ErrorKind::NotFound
                        && step != MetadataStep::Create =>
                {
                    break
                }
                Err(error) => {
                    return Err(error).with_context(|| format!("{step:?} {}", path.display()))
                }
            }
            if index % 64 == 63 && started.elapsed() >= self.deadline {
                break;
            }
        }
        Ok(Work { units: done, seconds: started.elapsed().as_secs_f64() })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MetadataStep {
    Create,
    Stat,
    List,
    Remove,
}

fn measure_level(phase: &Phase<'_>, threads: usize) -> anyhow::Result<Level> {
    let mut level = Level { threads, ..Level::default() };
    level.write_bytes_per_second =
        aggregate(&phase.parallel(threads, |thread| phase.write_bandwidth(thread))?);
    level.read_bytes_per_second =
        aggregate(&phase.parallel(threads, |thread| phase.read_bandwidth(thread))?);
    level.write_iops =
        aggregate(&phase.parallel(threads, |thread| phase.random_transfers(thread, true, 1))?);
    level.read_iops =
        aggregate(&phase.parallel(threads, |thread| phase.random_transfers(thread, false, 2))?);
    level.create_per_second =
        aggregate(&phase.parallel(threads, |thread| phase.metadata(thread, MetadataStep::Create))?);
    level.stat_per_second =
        aggregate(&phase.parallel(threads, |thread| phase.metadata(thread, MetadataStep::Stat))?);
    level.list_entries_per_second =
        aggregate(&phase.parallel(threads, |thread| phase.metadata(thread, MetadataStep::List))?);
    level.remove_per_second =
        aggregate(&phase.parallel(threads, |thread| phase.metadata(thread, MetadataStep::Remove))?);
    for thread in 0..threads {
        let path = phase.data_path(thread);
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        let directory = phase.directory.join(format!("metadata.{thread}"));
        std::fs::remove_dir_all(&directory)
            .with_context(|| format!("removing {}", directory.display()))?;
    }
    Ok(level)
}

/// Peaks from the levels, the way the paper estimates a fragment's peaks: the best level's mean
/// of read and write (bandwidth, IOPS) and of create, stat and remove (metadata).
pub fn peaks_of(levels: &[Level]) -> spillway_sim::Peaks {
    let best = |value: &dyn Fn(&Level) -> f64| levels.iter().map(value).fold(0.0, f64::max);
    spillway_sim::Peaks {
        bandwidth_bytes_per_second: best(&|level| {
            (level.read_bytes_per_second + level.write_bytes_per_second) / 2.0
        }),
        iops: best(&|level| (level.read_iops + level.write_iops) / 2.0),
        metadata_ops_per_second: best(&|level| {
            (level.create_per_second + level.stat_per_second + level.remove_per_second) / 3.0
        }),
    }
}

/// The best level's namespace metadata rates (striped, private), when the native target
/// measured them: the per-mode metadata peaks the manager plans with.
pub fn namespace_peaks_of(levels: &[Level]) -> Option<(f64, f64)> {
    let best = |rate: fn(&Level) -> Option<f64>| {
        levels
            .iter()
            .filter_map(rate)
            .fold(None, |best: Option<f64>, r| Some(best.map_or(r, |b| b.max(r))))
    };
    Some((
        best(|level| level.namespace_striped_ops_per_second)?,
        best(|level| level.namespace_private_ops_per_second)?,
    ))
}

const THREADS_LIMIT: usize = 256;

/// Validates the flags and measures every level of the chosen target; whatever the benchmark
/// created (work directory, epochs) is removed afterwards.
pub fn measure(args: &Args) -> anyhow::Result<(Vec<Level>, spillway_sim::Peaks)> {
    validate(args)?;
    let levels = match &args.target {
        Some(target) => measure_directory(args, target)?,
        None => native::measure(args)?,
    };
    let peaks = peaks_of(&levels);
    Ok((levels, peaks))
}

/// The concurrency levels: 1, 2, 4, … up to `--threads-max`.
fn thread_levels(threads_max: usize) -> Vec<usize> {
    std::iter::successors(Some(1usize), |threads| threads.checked_mul(2))
        .take_while(|&threads| threads <= threads_max)
        .collect()
}

fn validate(args: &Args) -> anyhow::Result<()> {
    if args.target.is_some() != args.servers.is_empty() {
        bail!("give exactly one of --target DIR and --servers HOST:PORT[,HOST:PORT…]");
    }
    if args.threads_max == 0 || args.threads_max > THREADS_LIMIT {
        bail!("--threads-max must be between 1 and {THREADS_LIMIT} (got {})", args.threads_max);
    }
    if args.transfer_kib == 0 || args.file_mib_per_thread == 0 || args.small_transfer_bytes == 0 {
        bail!(
            "--transfer-kib, --file-mib-per-thread and --small-transfer-bytes must be at least 1"
        );
    }
    if args.metadata_files_per_thread == 0 {
        bail!("--metadata-files-per-thread must be at least 1");
    }
    if (args.file_mib_per_thread << 20) < args.small_transfer_bytes {
        bail!("--file-mib-per-thread must hold at least one --small-transfer-bytes transfer");
    }
    if !(args.phase_seconds > 0.0 && args.phase_seconds <= 600.0) {
        bail!("--phase-seconds must be in (0, 600] (got {})", args.phase_seconds);
    }
    if !args.servers.is_empty() && args.small_transfer_bytes > u32::MAX as u64 {
        bail!("--small-transfer-bytes must fit one request (at most {} bytes)", u32::MAX);
    }
    Ok(())
}

fn measure_directory(args: &Args, target: &Path) -> anyhow::Result<Vec<Level>> {
    std::fs::create_dir_all(target)
        .with_context(|| format!("creating target {}", target.display()))?;
    let work = tempfile::Builder::new()
        .prefix("spillway-peaks.")
        .tempdir_in(target)
        .with_context(|| format!("creating a work directory in {}", target.display()))?;
    let phase = Phase {
        directory: work.path(),
        args,
        deadline: Duration::from_secs_f64(args.phase_seconds),
    };
    let levels = thread_levels(args.threads_max)
        .into_iter()
        .map(|threads| measure_level(&phase, threads))
        .collect::<anyhow::Result<Vec<_>>>()?;
    work.close().with_context(|| format!("removing the work directory in {}", target.display()))?;
    Ok(levels)
}

/// How the target is named in the output: the directory, or the server list.
fn target_description(args: &Args) -> (String, &'static str) {
    match &args.target {
        Some(target) => (target.display().to_string(), "directory"),
        None => {
            (args.servers.iter().map(ToString::to_string).collect::<Vec<_>>().join(","), "spillway")
        }
    }
}

const DIRECTORY_NOTE: &str = "peaks = best level's mean of read and write (bandwidth, IOPS) and of create, stat, remove (metadata); reads may be served from the page cache when posix_fadvise cannot drop it";
const NATIVE_NOTE: &str = "peaks = best level's mean of read and write (bandwidth, IOPS) and of create, stat, remove (metadata); namespace_metadata_peaks = best level's mean of create, lookup, unlink through the namespace service, threads sharing one namespace (striped) or one each (private; root only); native client, one Client per thread; create = create_file, stat = open_file + file_size (lookup by name), list = list_files, remove = delete_epoch of one-file epochs prepared untimed (the API's only remove; rate per delete request)";

pub fn run(args: Args) -> anyhow::Result<()> {
    let (levels, peaks) = measure(&args)?;
    let (target, target_kind) = target_description(&args);
    let output = json!({
        "target": target,
        "target_kind": target_kind,
        "transfer_bytes": args.transfer_kib << 10,
        "small_transfer_bytes": args.small_transfer_bytes,
        "file_bytes_per_thread": args.file_mib_per_thread << 20,
        "levels": levels,
        "peaks": peaks,
        "namespace_metadata_peaks": namespace_peaks_of(&levels).map(|(striped, private)| {
            json!({ "striped_ops_per_second": striped, "private_ops_per_second": private })
        }),
        "note": if args.target.is_some() { DIRECTORY_NOTE } else { NATIVE_NOTE },
    });
    if let Some(path) = &args.output {
        std::fs::write(path, serde_json::to_string_pretty(&output)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&output)?);
        return Ok(());
    }
    const MIB: f64 = 1024.0 * 1024.0;
    println!("target {target} ({target_kind})");
    println!(
        "{:>7} {:>12} {:>12} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "threads",
        "write MiB/s",
        "read MiB/s",
        "write IOPS",
        "read IOPS",
        "create/s",
        "stat/s",
        "listed/s",
        "remove/s"
    );
    for level in &levels {
        println!(
            "{:>7} {:>12.0} {:>12.0} {:>11.0} {:>11.0} {:>11.0} {:>11.0} {:>11.0} {:>11.0}",
            level.threads,
            level.write_bytes_per_second / MIB,
            level.read_bytes_per_second / MIB,
            level.write_iops,
            level.read_iops,
            level.create_per_second,
            level.stat_per_second,
            level.list_entries_per_second,
            level.remove_per_second
        );
    }
    println!(
        "peaks: {:.0} MiB/s, {:.0} IOPS ({} B), {:.0} metadata ops/s",
        peaks.bandwidth_bytes_per_second / MIB,
        peaks.iops,
        args.small_transfer_bytes,
        peaks.metadata_ops_per_second
    );
    if let Some((striped, private)) = namespace_peaks_of(&levels) {
        println!(
            "namespace metadata (create, stat, unlink through the namespace service): {striped:.0} ops/s in one striped namespace, {private:.0} ops/s in one private namespace per thread"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(target: PathBuf) -> Args {
        Args {
            target: Some(target),
            servers: Vec::new(),
            commit_durability: CommitDurability::Server,
            replicas: 1,
            threads_max: 2,
            file_mib_per_thread: 1,
            transfer_kib: 256,
            small_transfer_bytes: 4096,
            metadata_files_per_thread: 50,
            phase_seconds: 0.05,
            sync_small_writes: false,
            json: true,
            output: None,
        }
    }

    #[test]
    fn a_tiny_run_measures_every_phase_at_each_level_and_cleans_up() {
        let target = tempfile::tempdir().unwrap();
        let (levels, peaks) = measure(&tiny(target.path().to_path_buf())).unwrap();
        assert_eq!(levels.iter().map(|level| level.threads).collect::<Vec<_>>(), vec![1, 2]);
        for level in &levels {
            for rate in [
                level.write_bytes_per_second,
                level.read_bytes_per_second,
                level.write_iops,
                level.read_iops,
                level.create_per_second,
                level.stat_per_second,
                level.list_entries_per_second,
                level.remove_per_second,
            ] {
                assert!(rate > 0.0 && rate.is_finite(), "{level:?}");
            }
        }
        assert!(
            peaks.bandwidth_bytes_per_second > 0.0
                && peaks.iops > 0.0
                && peaks.metadata_ops_per_second > 0.0
        );
        assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 0, "work directory removed");
    }

    #[test]
    fn peaks_are_the_best_levels_means() {
        let level = |threads, bandwidth: f64, iops: f64, metadata: f64| Level {
            threads,
            write_bytes_per_second: bandwidth - 1.0,
            read_bytes_per_second: bandwidth + 1.0,
            write_iops: iops,
            read_iops: iops,
            create_per_second: metadata / 2.0,
            stat_per_second: metadata,
            list_entries_per_second: 1e9,
            remove_per_second: metadata * 1.5,
            namespace_striped_ops_per_second: Some(metadata * 2.0),
            namespace_private_ops_per_second: Some(100.0 - metadata),
        };
        let levels = [level(1, 10.0, 500.0, 30.0), level(2, 20.0, 400.0, 60.0)];
        let peaks = peaks_of(&levels);
        assert_eq!(peaks.bandwidth_bytes_per_second, 20.0);
        assert_eq!(peaks.iops, 500.0);
        assert_eq!(peaks.metadata_ops_per_second, 60.0);
        // Each mode's best level, whichever it is.
        assert_eq!(namespace_peaks_of(&levels), Some((120.0, 70.0)));
        let unmeasured = Level { namespace_private_ops_per_second: None, ..levels[1].clone() };
        assert_eq!(namespace_peaks_of(&[unmeasured]), None);
    }

    #[test]
    fn absurd_flags_are_refused_by_name() {
        let target = tempfile::tempdir().unwrap();
        let mut args = tiny(target.path().to_path_buf());
        args.threads_max = 0;
        assert!(measure(&args).unwrap_err().to_string().contains("--threads-max"));
        let mut args = tiny(target.path().to_path_buf());
        args.phase_seconds = -1.0;
        assert!(measure(&args).unwrap_err().to_string().contains("--phase-seconds"));
    }
}
