//! `spillway bench store`: store ingest against baselines measured in the same run.
//!
//! Four subjects, each paired with the baseline it is judged against and measured right next
//! to it (the disk's speed drifts a lot from one minute to the next):
//! DRAM ingest (2 threads, 1 MiB records, no spill) vs memcpy (2 threads, same sizes, into a
//! pre-faulted buffer); SSD spill (same writes into a small DRAM tier, until `sync` returns) vs a
//! plain sequential file write + fdatasync; `commit` of an epoch held in DRAM vs the same plain
//! write + fdatasync. Every pair is repeated; the table shows the best of each figure and the
//! median and spread of the paired ratios.

use crate::stats::{gigabytes_per_second, median, spread};
use anyhow::{bail, Context};
use spillway_config::StoreKnobs;
use spillway_store::{Durability, Store};
use spillway_types::{EpochId, FileId, StreamKey, GIB, MIB};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Directory on the disk under test (default: a fresh directory under /var/tmp). Refuses
    /// tmpfs, which would measure memory instead of the disk.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Bytes written per measurement.
    #[arg(long, default_value_t = GIB)]
    bytes: u64,
    /// Times each (baseline, subject) pair is measured.
    #[arg(long, default_value_t = 3)]
    repeats: u32,
    /// Segment size of the stores under test (`store.segment_bytes_max`; default = the knob's
    /// default). Larger segments mean fewer files to fsync per commit.
    #[arg(long)]
    segment_bytes: Option<u64>,
}

const RECORD_BYTES: usize = MIB as usize;
const THREADS: u64 = 2;
const TMPFS_MAGIC: i64 = 0x0102_1994;

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.bytes < 64 * MIB || !args.bytes.is_multiple_of(THREADS * MIB) {
        bail!("--bytes must be at least 64 MiB and a multiple of 2 MiB (got {})", args.bytes);
    }
    if args.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    let segment_bytes = args.segment_bytes.unwrap_or(StoreKnobs::default().segment_bytes_max);
    let (root, _temp) = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            (dir.clone(), None)
        }
        None => {
            let temp =
                tempfile::Builder::new().prefix("spillway-bench-store-").tempdir_in("/var/tmp")?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    if is_tmpfs(&root)? {
        bail!("{} is on tmpfs; pass --dir on the disk under test", root.display());
    }
    let source = pattern(RECORD_BYTES);
    let mut rows = Vec::new();
    for repeat in 0..args.repeats {
        // Each subject is sandwiched between two runs of its baseline; the baseline figure is
        // their mean, so drift of the shared disk hits both sides alike.
        let memcpy_before = measure_memcpy(args.bytes, &source);
        let dram = measure_dram_ingest(&root, args.bytes, segment_bytes, &source)?;
        let memcpy = (memcpy_before + measure_memcpy(args.bytes, &source)) / 2.0;
        let file_before = measure_plain_file(&root, args.bytes, &source)?;
        let spill = measure_spill(&root, args.bytes, segment_bytes, &source)?;
        let file_for_spill = (file_before + measure_plain_file(&root, args.bytes, &source)?) / 2.0;
        let (commit, file_for_commit) = measure_commit(&root, args.bytes, segment_bytes, &source)?;
        let row = Row { memcpy, dram, file_for_spill, spill, file_for_commit, commit };
        if !args.json {
            eprintln!(
                "repeat {}: memcpy {:.2} dram {:.2} | file {:.2} spill {:.2} | file {:.2} commit {:.2} GB/s",
                repeat + 1,
                row.memcpy,
                row.dram,
                row.file_for_spill,
                row.spill,
                row.file_for_commit,
                row.commit
            );
        }
        rows.push(row);
    }
    report(&args, &root, segment_bytes, &rows)
}

/// GB/s figures of one repeat.
#[derive(Clone, Copy, Debug, serde::Serialize)]
struct Row {
    memcpy: f64,
    dram: f64,
    file_for_spill: f64,
    spill: f64,
    file_for_commit: f64,
    commit: f64,
}

fn pattern(length: usize) -> Vec<u8> {
    (0..length).map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes()[7]).collect()
}

fn is_tmpfs(path: &Path) -> anyhow::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: an all-zero statfs is a valid value of this plain C struct.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs fills the struct we pass; the path is NUL-terminated.
    if unsafe { libc::statfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statfs {}", path.display()));
    }
    Ok(stat.f_type as i64 == TMPFS_MAGIC)
}

/// Two threads copy 1 MiB records into their halves of a pre-faulted destination.
fn measure_memcpy(bytes: u64, source: &[u8]) -> f64 {
    let mut target = vec![0u8; bytes as usize];
    for page in target.chunks_mut(4096) {
        page[0] = 1;
    }
    let started = Instant::now();
    std::thread::scope(|scope| {
        for half in target.chunks_mut((bytes / THREADS) as usize) {
            scope.spawn(move || {
                for record in half.chunks_mut(RECORD_BYTES) {
                    record.copy_from_slice(&source[..record.len()]);
                }
                std::hint::black_box(&half[0]);
            });
        }
    });
    gigabytes_per_second(bytes, started.elapsed().as_secs_f64())
}

fn knobs(
    root: &Path,
    name: &str,
    dram_bytes_max: u64,
    bytes: u64,
    segment_bytes_max: u64,
) -> anyhow::Result<StoreKnobs> {
    let directory = root.join(name);
    if directory.exists() {
        std::fs::remove_dir_all(&directory)?;
    }
    Ok(StoreKnobs {
        ssd_directory: directory.display().to_string(),
        dram_bytes_max,
        ssd_bytes_max: 4 * bytes + 16 * segment_bytes_max,
        record_payload_bytes_max: MIB,
        segment_bytes_max,
        dram_prefault: true,
        ..StoreKnobs::default()
    })
}

/// Two threads append `bytes` of 1 MiB records to epoch 1 (thread t writes file t).
fn ingest(store: &Store, bytes: u64, source: &[u8]) -> anyhow::Result<()> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                scope.spawn(move || -> anyhow::Result<()> {
                    let records = bytes / THREADS / RECORD_BYTES as u64;
                    for record in 0..records {
                        store.write(
                            StreamKey(thread),
                            EpochId(1),
                            FileId(thread),
                            record * RECORD_BYTES as u64,
                            source,
                        )?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("ingest thread panicked"))
    })
}

fn measure_dram_ingest(
    root: &Path,
    bytes: u64,
    segment_bytes: u64,
    source: &[u8],
) -> anyhow::Result<f64> {
    // Room for everything below the high watermark, and no write-behind: nothing spills.
    let dram = (bytes + bytes / 8).div_ceil(MIB) * MIB * 100 / 75 + 16 * MIB;
    let store = Store::open(&StoreKnobs {
        ssd_write_behind: false,
        ..knobs(root, "dram", dram, bytes, segment_bytes)?
    })?;
    let started = Instant::now();
    ingest(&store, bytes, source)?;
    let seconds = started.elapsed().as_secs_f64();
    let spilled = store.stats().user_bytes_to_ssd;
    drop(store);
    std::fs::remove_dir_all(root.join("dram"))?;
    if spilled > 0 {
        bail!("the DRAM-only run spilled {spilled} bytes; its figure would be wrong");
    }
    Ok(gigabytes_per_second(bytes, seconds))
}

/// Sequential 1 MiB writes to a new file, then fdatasync: the disk's plain speed now.
fn measure_plain_file(root: &Path, bytes: u64, source: &[u8]) -> anyhow::Result<f64> {
    let path = root.join("plain-file.bin");
    let started = Instant::now();
    let mut file = std::fs::File::create(&path)?;
    for _ in 0..bytes / RECORD_BYTES as u64 {
        file.write_all(source)?;
    }
    file.sync_data()?;
    let seconds = started.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(gigabytes_per_second(bytes, seconds))
}

/// Ingest into a 256 MiB DRAM tier (the flusher spills as it goes), then `sync`.
fn measure_spill(
    root: &Path,
    bytes: u64,
    segment_bytes: u64,
    source: &[u8],
) -> anyhow::Result<f64> {
    let store =
        Store::open(&knobs(root, "spill", (bytes / 4).max(32 * MIB), bytes, segment_bytes)?)?;
    let started = Instant::now();
    ingest(&store, bytes, source)?;
    store.sync()?;
    let seconds = started.elapsed().as_secs_f64();
    let spilled = store.stats().user_bytes_to_ssd;
    store.close()?;
    std::fs::remove_dir_all(root.join("spill"))?;
    if spilled < bytes {
        bail!("the spill run moved only {spilled} of {bytes} bytes to SSD");
    }
    Ok(gigabytes_per_second(bytes, seconds))
}

/// An epoch of `bytes` held in DRAM, then timed `commit` (spill + fsync + commit record),
/// sandwiched between two plain write + fdatasync baselines. Returns (commit, baseline) GB/s.
fn measure_commit(
    root: &Path,
    bytes: u64,
    segment_bytes: u64,
    source: &[u8],
) -> anyhow::Result<(f64, f64)> {
    let dram = (bytes + bytes / 8).div_ceil(MIB) * MIB * 100 / 75 + 16 * MIB;
    let store = Store::open(&knobs(root, "commit", dram, bytes, segment_bytes)?)?;
    ingest(&store, bytes, source)?;
    let before = measure_plain_file(root, bytes, source)?;
    let started = Instant::now();
    store.commit(EpochId(1), Durability::Ssd)?;
    let seconds = started.elapsed().as_secs_f64();
    let after = measure_plain_file(root, bytes, source)?;
    store.close()?;
    std::fs::remove_dir_all(root.join("commit"))?;
    Ok((gigabytes_per_second(bytes, seconds), (before + after) / 2.0))
}

/// The paired ratio of each subject to the baseline measured next to it, one per repeat.
struct PairedRatios {
    dram_vs_memcpy: Vec<f64>,
    spill_vs_file: Vec<f64>,
    commit_vs_fdatasync: Vec<f64>,
}

impl PairedRatios {
    /// The ratios of every repeat in `rows`.
    fn of(rows: &[Row]) -> PairedRatios {
        let ratios = |f: fn(&Row) -> f64| rows.iter().map(f).collect::<Vec<_>>();
        PairedRatios {
            dram_vs_memcpy: ratios(|r| r.dram / r.memcpy),
            spill_vs_file: ratios(|r| r.spill / r.file_for_spill),
            commit_vs_fdatasync: ratios(|r| r.commit / r.file_for_commit),
        }
    }
}

/// The best value of `figure` over the repeats.
fn best_of(rows: &[Row], figure: fn(&Row) -> f64) -> f64 {
    rows.iter().map(figure).fold(0.0, f64::max)
}

/// Prints the results: one JSON object with `--json`, else the table.
fn report(args: &Args, root: &Path, segment_bytes: u64, rows: &[Row]) -> anyhow::Result<()> {
    let ratios = PairedRatios::of(rows);
    if args.json {
        print_json(args, root, segment_bytes, rows, &ratios);
        return Ok(());
    }
    print_table(args, root, segment_bytes, rows, &ratios);
    Ok(())
}

/// The results as one JSON object on stdout.
fn print_json(args: &Args, root: &Path, segment_bytes: u64, rows: &[Row], ratios: &PairedRatios) {
    let best = |figure: fn(&Row) -> f64| best_of(rows, figure);
    let value = serde_json::json!({
        "benchmark": "store",
        "bytes_per_measurement": args.bytes,
        "record_bytes": RECORD_BYTES,
        "threads": THREADS,
        "repeats": args.repeats,
        "segment_bytes": segment_bytes,
        "directory": root.display().to_string(),
        "ratios": {
            "dram_vs_memcpy": median(ratios.dram_vs_memcpy.clone()),
            "spill_vs_file": median(ratios.spill_vs_file.clone()),
            "commit_vs_fdatasync": median(ratios.commit_vs_fdatasync.clone()),
        },
        "ratio_spread": {
            "dram_vs_memcpy": spread(&ratios.dram_vs_memcpy),
            "spill_vs_file": spread(&ratios.spill_vs_file),
            "commit_vs_fdatasync": spread(&ratios.commit_vs_fdatasync),
        },
        "best_gbps": {
            "memcpy": best(|r| r.memcpy),
            "dram_ingest": best(|r| r.dram),
            "plain_file_write_fdatasync": best(|r| r.file_for_spill).max(best(|r| r.file_for_commit)),
            "ssd_spill": best(|r| r.spill),
            "commit": best(|r| r.commit),
        },
        "targets": { "dram_vs_memcpy": 0.6, "spill_vs_file": 0.8, "commit_vs_fdatasync": 0.8 },
        "repeat_gbps": rows,
    });
    println!("{value}");
}

/// The results as a table of best figures and one of paired ratios against their targets.
fn print_table(args: &Args, root: &Path, segment_bytes: u64, rows: &[Row], ratios: &PairedRatios) {
    let best = |figure: fn(&Row) -> f64| best_of(rows, figure);
    println!(
        "store ingest, {} per measurement, 1 MiB records, {} segments, {THREADS} writer threads, {} repeats, dir {}",
        spillway_types::format_bytes(args.bytes),
        spillway_types::format_bytes(segment_bytes),
        args.repeats,
        root.display()
    );
    println!("{:<34} {:>10} {:>10}", "measurement", "best GB/s", "");
    println!("{:<34} {:>10.2}", "memcpy baseline (2 threads)", best(|r| r.memcpy));
    println!("{:<34} {:>10.2}", "store DRAM ingest (2 threads)", best(|r| r.dram));
    println!(
        "{:<34} {:>10.2}",
        "plain file write + fdatasync",
        best(|r| r.file_for_spill).max(best(|r| r.file_for_commit))
    );
    println!("{:<34} {:>10.2}", "store SSD spill (ingest + sync)", best(|r| r.spill));
    println!("{:<34} {:>10.2}", "store commit of one epoch", best(|r| r.commit));
    println!();
    println!(
        "{:<24} {:>8} {:>16} {:>8} {:>6}",
        "ratio (paired)", "median", "spread", "target", "met"
    );
    for (name, values, target) in [
        ("dram_vs_memcpy", &ratios.dram_vs_memcpy, 0.6),
        ("spill_vs_file", &ratios.spill_vs_file, 0.8),
        ("commit_vs_fdatasync", &ratios.commit_vs_fdatasync, 0.8),
    ] {
        let (lo, hi) = spread(values);
        let m = median(values.clone());
        println!(
            "{name:<24} {m:>8.2} {:>16} {target:>8.1} {:>6}",
            format!("{lo:.2}..{hi:.2}"),
            if m >= target { "yes" } else { "no" }
        );
    }
}
