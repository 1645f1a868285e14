//! `spillway bench ingress`: client-visible ingress through real servers, against baselines
//! measured in the same run (BurstMem Fig. 6/7 on one machine).
//!
//! For each configuration (servers S, client processes C, transfer size T, bytes per client B)
//! and each pattern (N-N: a file per client; N-1: one shared file, disjoint blocks):
//! 1. Spillway: S `spillway serve` processes, C client processes (this binary in a hidden worker
//!    mode) that connect, wait for "go", write B bytes in T-byte pipelined writes, meet at a
//!    barrier, commit (`memory` or `ssd`), report. Timed from "go" to the last commit's return.
//! 2. Memcached: S real `memcached -I 2m` processes on loopback, loaded by `memcaslap` (C
//!    threads, C connections) with SETs of T-byte values, the same total bytes.
//! 3. Loopback limit: C threads push the same bytes over plain TCP into sinks that discard.
//! 4. Direct to PFS: C threads write the same bytes to files in a directory on the same disk as
//!    the SSD log, then fsync.
//!
//! For the durable subjects (direct, and Spillway at `ssd`) the report also gives the
//! durability tail (`tail_seconds`): from the last byte written (the workers' "written", the
//! direct writers' last `write`) to the end (the last commit, the slowest fsync).
//!
//! 5. With `--auth munge`: Spillway N-N at memory durability again, its servers started with
//!    `server.auth = munge` and a private `munged` (`spillway_harness::Munged`, its own key), so
//!    every worker's connections authenticate with a credential; `ratios.munge_vs_none` is it over
//!    the same workload without authentication.
//!
//! Workers connect after "go": the handshake (and with munge the credential, made by one
//! `munged` and checked by another round trip to it) is inside the timed region.
//!
//! Ratios are Spillway over each baseline of the same configuration: within each repeat the
//! subject runs right after its baseline, and the reported ratio is the median over repeats of
//! those paired ratios. The durable pair runs twice per repeat in A B … B A order (see
//! `sample_subjects`), its two runs combined into the repeat's sample.

use crate::start_server;
use crate::stats::{gigabytes_per_second, median};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use spillway_harness::{Munged, Reaped, ServerProcess};

use anyhow::{bail, Context};
use spillway_client::{Client, ClientOptions, Placement};
use spillway_proto::{Durability, Endpoint};
use spillway_types::EpochId;

#[derive(clap::Args)]
pub struct Args {
    /// Burst buffer servers (S).
    #[arg(long, default_value_t = 1)]
    servers: u32,
    /// Client processes (C).
    #[arg(long, default_value_t = 2)]
    clients: u32,
    /// Bytes per write (and per memcached SET).
    #[arg(long, default_value = "1M", value_parser = spillway_types::parse_size)]
    transfer_bytes: u64,
    /// Bytes each client writes.
    #[arg(long, default_value = "512M", value_parser = spillway_types::parse_size)]
    bytes_per_client: u64,
    /// Only the configuration given by the flags (default: also S=2 and 16 KiB transfers).
    #[arg(long)]
    single: bool,
    /// An existing directory in which a private work directory (0700, random name, removed at
    /// the end) holds the SSD logs and the direct-to-PFS files (same disk). Default /var/tmp.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Measure every subject this many times, interleaved, and report medians (the disk and
    /// the shared CPUs drift from one second to the next; ratios are medians of the ratios
    /// within each repeat, so a slow stretch hits a subject and its baseline alike).
    #[arg(long, default_value_t = 5)]
    repeat: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// `munge`: also measure N-N at memory durability with munge-authenticated connections
    /// (servers with server.auth = munge, a private munged) and report `ratios.munge_vs_none`.
    #[arg(long, default_value = "none", value_parser = ["none", "munge"])]
    auth: String,
    /// Only the durable subjects: direct+fsync and Spillway N-N and N-1 at `ssd` durability
    /// (`ratios.ssd_vs_direct_pfs`); the memory, memcached and loopback columns are left out.
    #[arg(long, conflicts_with = "auth")]
    durable_only: bool,
    /// Only 16 KiB against 1 MiB writes through the native client (threads in this process),
    /// sequential and strided, with the same bytes (`ratios.small_vs_large_writes`); uses
    /// `--servers`, `--clients`, `--bytes-per-client`, `--repeat` and `--dir`.
    #[arg(long, conflicts_with_all = ["auth", "durable_only"])]
    small_writes: bool,
    /// With `--small-writes`: the clients' `coalesce_bytes_max` (0: every write is its own
    /// frame, as before the client coalesced).
    #[arg(long, default_value_t = spillway_client::COALESCE_BYTES_MAX_DEFAULT, value_parser = spillway_types::parse_size, requires = "small_writes")]
    coalesce_bytes_max: u64,
    #[arg(long, hide = true)]
    worker_rank: Option<u32>,
    #[arg(long, hide = true, default_value = "")]
    worker_servers: String,
    #[arg(long, hide = true, default_value = "nn")]
    worker_pattern: String,
    #[arg(long, hide = true, default_value = "memory")]
    worker_durability: String,
    #[arg(long, hide = true)]
    worker_munge_socket: Option<PathBuf>,
}

/// How the servers of one Spillway subject authenticate TCP clients: not at all, or with munge
/// through this `munged`.
#[derive(Clone, Copy)]
enum Auth<'a> {
    None,
    Munge(&'a Munged),
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Shape {
    servers: u32,
    clients: u32,
    transfer_bytes: u64,
    bytes_per_client: u64,
}

impl Shape {
    fn total_bytes(&self) -> u64 {
        self.clients as u64 * self.bytes_per_client
    }
}

/// The subjects of one configuration, in the order of `measure`'s samples.
const SUBJECTS: [&str; 9] = [
    "loopback",
    "spillway_nn_memory",
    "memcached",
    "spillway_n1_memory",
    "direct_pfs",
    "spillway_nn_ssd",
    "spillway_n1_ssd",
    "spillway_nn_memory_munge",
    "spillway_nn_ssd_direct_io",
];
const LOOPBACK: usize = 0;
const NN_MEMORY: usize = 1;
const MEMCACHED: usize = 2;
const N1_MEMORY: usize = 3;
const DIRECT_PFS: usize = 4;
const NN_SSD: usize = 5;
const N1_SSD: usize = 6;
const NN_MEMORY_MUNGE: usize = 7;
const NN_SSD_DIRECT_IO: usize = 8;

/// How the servers of a Spillway subject write their SSD logs: as configured by default
/// (through the page cache), or with `store.ssd_direct_io` (whole blocks with `O_DIRECT`).
#[derive(Clone, Copy, PartialEq)]
enum Spills {
    Default,
    DirectIo,
}

/// One timed run of one subject: its rate, the whole machine's busy CPU over the timed region
/// per GB moved (kernel writeback and softirqs included), and for the durable subjects the
/// durability tail: the seconds from the last byte written to the end (Spillway: the commits;
/// direct: the slowest writer's fsync).
#[derive(Clone, Copy, Debug)]
struct Sample {
    gbps: f64,
    cpu_seconds_per_gb: f64,
    tail_seconds: Option<f64>,
}

impl Sample {
    /// Two runs of the same bytes as one: the rate of both together (the harmonic mean) and
    /// the mean CPU per GB.
    fn combined(first: &Sample, second: &Sample) -> Sample {
        Sample {
            gbps: 2.0 / (1.0 / first.gbps + 1.0 / second.gbps),
            cpu_seconds_per_gb: (first.cpu_seconds_per_gb + second.cpu_seconds_per_gb) / 2.0,
            tail_seconds: first.tail_seconds.zip(second.tail_seconds).map(|(a, b)| (a + b) / 2.0),
        }
    }
}

/// Times a region: wall clock and the machine's busy CPU.
struct Stopwatch {
    started: Instant,
    cpu: crate::stats::BusyCpu,
}

impl Stopwatch {
    fn start() -> anyhow::Result<Stopwatch> {
        Ok(Stopwatch { cpu: crate::stats::BusyCpu::start()?, started: Instant::now() })
    }

    /// The region moved `bytes`; its last `tail_seconds` (if given) made them durable.
    fn stop(self, bytes: u64, tail_seconds: Option<f64>) -> anyhow::Result<Sample> {
        let seconds = self.started.elapsed().as_secs_f64();
        Ok(Sample {
            gbps: gigabytes_per_second(bytes, seconds),
            cpu_seconds_per_gb: self.cpu.seconds_per_gb(bytes)?,
            tail_seconds,
        })
    }
}

/// A subject's `Option` columns are absent when `--durable-only` left it out.
#[derive(Debug, serde::Serialize)]
struct Row {
    servers: u32,
    clients: u32,
    transfer_bytes: u64,
    bytes_total: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    spillway_nn_memory_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spillway_n1_memory_gbps: Option<f64>,
    spillway_nn_ssd_gbps: f64,
    spillway_n1_ssd_gbps: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    memcached_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    loopback_gbps: Option<f64>,
    direct_pfs_gbps: f64,
    /// N-N at memory durability with munge-authenticated connections (`--auth munge`).
    #[serde(skip_serializing_if = "Option::is_none")]
    spillway_nn_memory_munge_gbps: Option<f64>,
    /// Median busy CPU seconds of the whole machine per GB moved, by subject.
    cpu_seconds_per_gb: std::collections::BTreeMap<&'static str, f64>,
    /// Median durability tail by durable subject: seconds from the last byte written to the
    /// end (the commits, or the direct writers' fsync).
    tail_seconds: std::collections::BTreeMap<&'static str, f64>,
    /// N-N at ssd durability with `store.ssd_direct_io = true`: spills around the page cache.
    spillway_nn_ssd_direct_io_gbps: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_memcached: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_loopback: Option<f64>,
    ssd_vs_direct_pfs: f64,
    /// Each repeat's ssd / direct ratio, in order: the spread behind the median.
    ssd_vs_direct_pfs_per_repeat: Vec<f64>,
    /// The same ratio with `O_DIRECT` spills (`ssd_direct_io = true`).
    ssd_direct_io_vs_direct_pfs: f64,
    /// N-N ssd with `O_DIRECT` spills over the default page-cache spills (median of the
    /// paired ratios): the measurement behind the knob's default.
    direct_io_vs_buffered: f64,
    /// Median of the paired munge / none ratios (`--auth munge`).
    #[serde(skip_serializing_if = "Option::is_none")]
    munge_vs_none: Option<f64>,
    /// Each repeat's munge / none ratio, in order (`--auth munge`): the spread behind the median.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    munge_vs_none_per_repeat: Vec<f64>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(rank) = args.worker_rank {
        return worker(rank, &args);
    }
    check_args(&args)?;
    let base = args.dir.clone().unwrap_or_else(|| PathBuf::from("/var/tmp"));
    // A fresh directory of a random name, mode 0700, created by us: never a path another local
    // user could have made first in a shared `/var/tmp` (a symlink there would have sent the
    // direct writer's files, and their removal, anywhere). Removed when the guard drops.
    let work_guard = tempfile::Builder::new()
        .prefix("spillway-bench-ingress-")
        .tempdir_in(&base)
        .with_context(|| format!("creating a work directory in {}", base.display()))?;
    let work = work_guard.path().to_path_buf();
    if args.small_writes {
        let shape = crate::small_writes::Shape {
            servers: args.servers,
            clients: args.clients,
            bytes_per_client: args.bytes_per_client,
            coalesce_bytes_max: args.coalesce_bytes_max,
        };
        return crate::small_writes::run(shape, &work, args.repeat, args.json);
    }
    let munged = match args.auth.as_str() {
        "munge" => Some(Munged::start().context(
            "--auth munge runs a private munged: install the Debian packages munge and libmunge2",
        )?),
        _ => None,
    };
    let result = measure_shapes(&args, &shapes(&args), &work, munged.as_ref());
    drop(munged);
    drop(work_guard);
    let rows = result?;
    if args.json {
        print_json(&args, &rows)?;
    } else {
        print_table(&args, &rows);
    }
    Ok(())
}

/// Refuses counts of zero and clients that write less than one transfer.
fn check_args(args: &Args) -> anyhow::Result<()> {
    if args.servers == 0 || args.clients == 0 || args.transfer_bytes == 0 {
        bail!("--servers, --clients and --transfer-bytes must be at least 1");
    }
    if args.bytes_per_client < args.transfer_bytes {
        bail!("--bytes-per-client must be at least --transfer-bytes");
    }
    Ok(())
}

/// The flags' configuration, then (without `--single`) S=2 and 16 KiB transfers, each once.
fn shapes(args: &Args) -> Vec<Shape> {
    let primary = Shape {
        servers: args.servers,
        clients: args.clients,
        transfer_bytes: args.transfer_bytes,
        bytes_per_client: args.bytes_per_client,
    };
    let mut shapes = vec![primary];
    if !args.single {
        for extra in
            [Shape { servers: 2, ..primary }, Shape { transfer_bytes: 16 << 10, ..primary }]
        {
            if !shapes.contains(&extra) {
                shapes.push(extra);
            }
        }
    }
    shapes
}

/// One row per configuration, each measured `--repeat` times in `work`.
fn measure_shapes(
    args: &Args,
    shapes: &[Shape],
    work: &Path,
    munged: Option<&Munged>,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for shape in shapes {
        if !args.json {
            eprintln!(
                "measuring S={} C={} transfer={} bytes/client={} …",
                shape.servers, shape.clients, shape.transfer_bytes, shape.bytes_per_client
            );
        }
        rows.push(measure(shape, work, args.repeat.max(1), munged, args.durable_only)?);
    }
    Ok(rows)
}

/// The rows and the first row's ratios as one JSON object on stdout.
fn print_json(args: &Args, rows: &[Row]) -> anyhow::Result<()> {
    let first = &rows[0];
    let mut ratios = serde_json::json!({
        "ssd_vs_direct_pfs": first.ssd_vs_direct_pfs,
        "ssd_direct_io_vs_direct_pfs": first.ssd_direct_io_vs_direct_pfs,
        "direct_io_vs_buffered": first.direct_io_vs_buffered,
    });
    for (key, ratio) in [
        ("vs_memcached", first.vs_memcached),
        ("vs_loopback", first.vs_loopback),
        ("munge_vs_none", first.munge_vs_none),
    ] {
        if let Some(ratio) = ratio {
            ratios[key] = serde_json::json!(ratio);
        }
    }
    let out = serde_json::json!({
        "benchmark": "ingress",
        "repeat": args.repeat.max(1),
        "auth": args.auth,
        "durable_only": args.durable_only,
        "rows": rows,
        "ratios": ratios,
        "ratio_basis": format!(
            "row 0: S={} C={} transfer={} bytes, N-N; memory durability for vs_memcached/vs_loopback/munge_vs_none, ssd for ssd_vs_direct_pfs",
            first.servers, first.clients, first.transfer_bytes
        ),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// The rows as a table, one line per configuration.
fn print_table(args: &Args, rows: &[Row]) {
    println!(
        "ingress GB/s (1 GB = 1e9 bytes), median of {} runs; ratios are medians of the per-run ratios; Spillway timed until every commit returned",
        args.repeat.max(1)
    );
    println!("| S | C | transfer | total | NN mem | N1 mem | NN ssd | N1 ssd | memcached | loopback | direct+fsync | vs_memcached | vs_loopback | ssd_vs_direct_pfs |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    // Subjects that `--durable-only` left out show as "-".
    let cell = |value: Option<f64>| value.map_or("-".to_string(), |v| format!("{v:.2}"));
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {} | {} | {:.2} | {} | {} | {:.2} |",
            r.servers,
            r.clients,
            spillway_types::format_bytes(r.transfer_bytes),
            spillway_types::format_bytes(r.bytes_total),
            cell(r.spillway_nn_memory_gbps),
            cell(r.spillway_n1_memory_gbps),
            r.spillway_nn_ssd_gbps,
            r.spillway_n1_ssd_gbps,
            cell(r.memcached_gbps),
            cell(r.loopback_gbps),
            r.direct_pfs_gbps,
            cell(r.vs_memcached),
            cell(r.vs_loopback),
            r.ssd_vs_direct_pfs
        );
    }
    println!("ratios use N-N: vs_memcached and vs_loopback at memory durability, ssd_vs_direct_pfs at ssd durability");
    for r in rows {
        let ratios: Vec<String> =
            r.ssd_vs_direct_pfs_per_repeat.iter().map(|v| format!("{v:.2}")).collect();
        let cpu: Vec<String> =
            r.cpu_seconds_per_gb.iter().map(|(name, v)| format!("{name} {v:.2}")).collect();
        let tails: Vec<String> =
            r.tail_seconds.iter().map(|(name, v)| format!("{name} {v:.3}")).collect();
        println!(
            "S={} C={} transfer={}: ssd_vs_direct_pfs per repeat {}; with O_DIRECT spills NN ssd {:.2} GB/s, ssd_direct_io_vs_direct_pfs {:.2}, direct_io_vs_buffered {:.2}; busy CPU s/GB (whole machine): {}; durability tail s (last byte written to commit or fsync done): {}",
            r.servers,
            r.clients,
            spillway_types::format_bytes(r.transfer_bytes),
            ratios.join(" "),
            r.spillway_nn_ssd_direct_io_gbps,
            r.ssd_direct_io_vs_direct_pfs,
            r.direct_io_vs_buffered,
            cpu.join(", "),
            tails.join(", ")
        );
    }
    for r in rows.iter().filter(|r| r.munge_vs_none.is_some()) {
        println!(
            "munge (S={} C={} transfer={}): NN mem {:.2} GB/s authenticated, munge_vs_none {:.3}",
            r.servers,
            r.clients,
            spillway_types::format_bytes(r.transfer_bytes),
            r.spillway_nn_memory_munge_gbps.unwrap_or_default(),
            r.munge_vs_none.unwrap_or_default()
        );
    }
}

/// Every subject's samples of one configuration, `repeat` runs interleaved.
fn sample_subjects(
    shape: &Shape,
    work: &Path,
    repeat: u32,
    munged: Option<&Munged>,
    durable_only: bool,
) -> anyhow::Result<[Vec<Sample>; 9]> {
    let mut samples: [Vec<Sample>; 9] = Default::default();
    let (none, default) = (Auth::None, Spills::Default);
    for run in 0..repeat {
        // Each Spillway subject sits next to the baseline it is judged against.
        if !durable_only {
            samples[LOOPBACK].push(loopback_gbps(shape)?);
            // The munge subject runs next to the same workload without authentication, first
            // on every other repeat so that neither always inherits the other's warm caches.
            let munge = |samples: &mut [Vec<Sample>; 9], munged| -> anyhow::Result<()> {
                let auth = Auth::Munge(munged);
                let sample = spillway_gbps(shape, work, "nn", "memory", auth, Spills::Default)?;
                samples[NN_MEMORY_MUNGE].push(sample);
                Ok(())
            };
            if let (Some(munged), 1) = (munged, run % 2) {
                munge(&mut samples, munged)?;
            }
            samples[NN_MEMORY].push(spillway_gbps(shape, work, "nn", "memory", none, default)?);
            if let (Some(munged), 0) = (munged, run % 2) {
                munge(&mut samples, munged)?;
            }
            samples[MEMCACHED].push(memcached_gbps(shape, work)?);
            samples[N1_MEMORY].push(spillway_gbps(shape, work, "n1", "memory", none, default)?);
        }
        // The durable block runs A B … B A: direct, N-N ssd, the other subjects, N-N ssd
        // again, direct again, and each repeat's baseline and N-N sample is the pair's
        // combined rate. Whatever runs right after the direct writer pays for the gigabyte of
        // page cache it frees (about 30 % on the reference VM); this way the N-N subject takes
        // that seat once per repeat, not every time, and the baseline follows a Spillway
        // subject once.
        let direct_first = direct_pfs_gbps(shape, work)?;
        let nn_first = spillway_gbps(shape, work, "nn", "ssd", none, default)?;
        samples[N1_SSD].push(spillway_gbps(shape, work, "n1", "ssd", none, default)?);
        let direct_io = spillway_gbps(shape, work, "nn", "ssd", none, Spills::DirectIo)?;
        samples[NN_SSD_DIRECT_IO].push(direct_io);
        let nn_second = spillway_gbps(shape, work, "nn", "ssd", none, default)?;
        samples[NN_SSD].push(Sample::combined(&nn_first, &nn_second));
        samples[DIRECT_PFS].push(Sample::combined(&direct_first, &direct_pfs_gbps(shape, work)?));
    }
    Ok(samples)
}

fn measure(
    shape: &Shape,
    work: &Path,
    repeat: u32,
    munged: Option<&Munged>,
    durable_only: bool,
) -> anyhow::Result<Row> {
    let samples = sample_subjects(shape, work, repeat, munged, durable_only)?;
    let per_repeat = |subject: usize, baseline: usize| -> Vec<f64> {
        samples[subject].iter().zip(&samples[baseline]).map(|(s, b)| s.gbps / b.gbps).collect()
    };
    // The median of the paired ratios; None when the subject was not measured.
    let paired = |subject: usize, baseline: usize| {
        (!samples[subject].is_empty()).then(|| median(per_repeat(subject, baseline)))
    };
    let rate = |subject: usize| {
        (!samples[subject].is_empty()).then(|| median(samples[subject].iter().map(|s| s.gbps)))
    };
    let cpu_seconds_per_gb = SUBJECTS
        .iter()
        .zip(&samples)
        .filter(|(_, runs)| !runs.is_empty())
        .map(|(name, runs)| (*name, median(runs.iter().map(|s| s.cpu_seconds_per_gb))))
        .collect();
    let tail_seconds = SUBJECTS
        .iter()
        .zip(&samples)
        .filter_map(|(name, runs)| {
            let tails: Option<Vec<f64>> = runs.iter().map(|s| s.tail_seconds).collect();
            tails.filter(|t| !t.is_empty()).map(|t| (*name, median(t)))
        })
        .collect();
    let durable = |subject: usize| rate(subject).expect("durable subjects are always measured");
    Ok(Row {
        servers: shape.servers,
        clients: shape.clients,
        transfer_bytes: shape.transfer_bytes,
        bytes_total: shape.total_bytes(),
        spillway_nn_memory_gbps: rate(NN_MEMORY),
        spillway_n1_memory_gbps: rate(N1_MEMORY),
        spillway_nn_ssd_gbps: durable(NN_SSD),
        spillway_n1_ssd_gbps: durable(N1_SSD),
        memcached_gbps: rate(MEMCACHED),
        loopback_gbps: rate(LOOPBACK),
        direct_pfs_gbps: durable(DIRECT_PFS),
        spillway_nn_memory_munge_gbps: rate(NN_MEMORY_MUNGE),
        cpu_seconds_per_gb,
        tail_seconds,
        vs_memcached: paired(NN_MEMORY, MEMCACHED),
        vs_loopback: paired(NN_MEMORY, LOOPBACK),
        ssd_vs_direct_pfs: paired(NN_SSD, DIRECT_PFS)
            .expect("durable subjects are always measured"),
        ssd_vs_direct_pfs_per_repeat: per_repeat(NN_SSD, DIRECT_PFS),
        spillway_nn_ssd_direct_io_gbps: durable(NN_SSD_DIRECT_IO),
        ssd_direct_io_vs_direct_pfs: paired(NN_SSD_DIRECT_IO, DIRECT_PFS)
            .expect("durable subjects are always measured"),
        direct_io_vs_buffered: paired(NN_SSD_DIRECT_IO, NN_SSD)
            .expect("durable subjects are always measured"),
        munge_vs_none: paired(NN_MEMORY_MUNGE, NN_MEMORY),
        munge_vs_none_per_repeat: per_repeat(NN_MEMORY_MUNGE, NN_MEMORY),
    })
}

/// GB/s of S servers and C client workers at `durability`, from "go" (before the workers
/// connect) to the last commit.
fn spillway_gbps(
    shape: &Shape,
    work: &Path,
    pattern: &str,
    durability: &str,
    auth: Auth<'_>,
    spills: Spills,
) -> anyhow::Result<Sample> {
    let executable = std::env::current_exe()?;
    let servers = start_servers(shape, work, pattern, durability, auth, spills)?;
    let list =
        servers.iter().map(|server| server.endpoint().to_string()).collect::<Vec<_>>().join(",");
    let mut workers = Workers::spawn(&executable, shape, &list, pattern, durability, auth)?;
    let sample = workers.time_writes_and_commits(shape.total_bytes())?;
    workers.wait()?;
    drop(servers);
    for s in 0..shape.servers {
        let _ = std::fs::remove_dir_all(work.join(format!("ssd-{pattern}-{durability}-{s}")));
    }
    Ok(sample)
}

/// DRAM log per server of a Spillway measurement whose servers each receive `per_server` bytes.
fn server_dram_bytes(per_server: u64, durability: &str) -> u64 {
    // Above the flusher's high watermark (75 %) the store starts spilling; leave room so the
    // memory runs measure DRAM ingest.
    // At ssd durability the DRAM log is a staging buffer: a small one makes the flusher write
    // to the SSD while data still arrives, as a loaded server's would.
    if durability == "memory" {
        crate::dram_bytes_holding(per_server, 64 << 20)
    } else {
        std::env::var("SPILLWAY_BENCH_SSD_DRAM")
            .ok()
            .and_then(|v| spillway_types::parse_size(&v).ok())
            .unwrap_or(128 << 20)
    }
}

/// S `spillway serve` processes at `durability`, each with its own SSD directory in `work`.
fn start_servers(
    shape: &Shape,
    work: &Path,
    pattern: &str,
    durability: &str,
    auth: Auth<'_>,
    spills: Spills,
) -> anyhow::Result<Vec<ServerProcess>> {
    let per_server = shape.total_bytes().div_ceil(shape.servers as u64);
    let dram = server_dram_bytes(per_server, durability);
    let ssd = per_server * 2 + (1 << 30);
    let mut servers = Vec::new();
    for s in 0..shape.servers {
        let ssd_dir = work.join(format!("ssd-{pattern}-{durability}-{s}"));
        let mut server_args = vec![
            "--durability".to_string(),
            durability.to_string(),
            "--ssd-bytes".into(),
            ssd.to_string(),
        ];
        if let Auth::Munge(munged) = auth {
            server_args.extend(["--auth".to_string(), "munge".to_string()]);
            server_args
                .extend(["--munge-socket".to_string(), munged.socket().display().to_string()]);
        }
        if spills == Spills::DirectIo {
            let config = work.join("direct-io-spills.toml");
            std::fs::write(&config, "[store]\nssd_direct_io = true\n")?;
            server_args.extend(["--config".to_string(), config.display().to_string()]);
        }
        servers.push(start_server(work, &s.to_string(), &ssd_dir, dram, &server_args)?);
    }
    Ok(servers)
}

/// One client worker process and its pipes.
struct Worker {
    process: Reaped,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

/// The client workers of one Spillway measurement, in rank order, spoken to in lines.
struct Workers<'a> {
    workers: Vec<Worker>,
    pattern: &'a str,
    durability: &'a str,
}

impl<'a> Workers<'a> {
    /// Starts C workers (`executable` in its hidden worker mode), each connected to `servers`.
    fn spawn(
        executable: &Path,
        shape: &Shape,
        servers: &str,
        pattern: &'a str,
        durability: &'a str,
        auth: Auth<'_>,
    ) -> anyhow::Result<Workers<'a>> {
        let mut workers = Vec::new();
        for rank in 0..shape.clients {
            let mut command = Command::new(executable);
            command.args(["bench", "ingress"]);
            if let Auth::Munge(munged) = auth {
                command.arg("--worker-munge-socket").arg(munged.socket());
            }
            let mut child = command
                .args(["--worker-rank", &rank.to_string(), "--worker-servers", servers])
                .args(["--worker-pattern", pattern, "--worker-durability", durability])
                .args([
                    "--transfer-bytes",
                    &shape.transfer_bytes.to_string(),
                    "--bytes-per-client",
                    &shape.bytes_per_client.to_string(),
                ])
                .args([
                    "--servers",
                    &shape.servers.to_string(),
                    "--clients",
                    &shape.clients.to_string(),
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .context("starting a client worker")?;
            let input = child.stdin.take().expect("piped");
            let output = BufReader::new(child.stdout.take().expect("piped"));
            workers.push(Worker { process: Reaped(child), input, output });
        }
        Ok(Workers { workers, pattern, durability })
    }

    /// Reads a line from every worker; each must say `word`.
    fn expect(&mut self, word: &str) -> anyhow::Result<()> {
        for (rank, worker) in self.workers.iter_mut().enumerate() {
            let mut line = String::new();
            worker.output.read_line(&mut line)?;
            if line.trim() != word {
                bail!(
                    "client worker {rank} said {line:?}, expected {word:?} (pattern {}, durability {})",
                    self.pattern,
                    self.durability
                );
            }
        }
        Ok(())
    }

    /// Tells every worker `word`.
    fn say(&mut self, word: &str) -> anyhow::Result<()> {
        for worker in &mut self.workers {
            writeln!(worker.input, "{word}")?;
            worker.input.flush()?;
        }
        Ok(())
    }

    /// Releases the ready workers together; timed from "go" to the last commit's return.
    fn time_writes_and_commits(&mut self, bytes: u64) -> anyhow::Result<Sample> {
        self.expect("ready")?;
        let stopwatch = Stopwatch::start()?;
        self.say("go")?;
        self.expect("written")?;
        let commits = Instant::now();
        self.say("commit")?;
        self.expect("done")?;
        let tail = (self.durability == "ssd").then(|| commits.elapsed().as_secs_f64());
        stopwatch.stop(bytes, tail)
    }

    /// Closes every worker's input and waits for it; each must exit successfully.
    fn wait(self) -> anyhow::Result<()> {
        for Worker { mut process, input, .. } in self.workers {
            drop(input);
            let status = process.0.wait()?;
            if !status.success() {
                bail!("a client worker exited with {status}");
            }
        }
        Ok(())
    }
}

/// One client process of the Spillway measurement.
fn worker(rank: u32, args: &Args) -> anyhow::Result<()> {
    let endpoints: Vec<Endpoint> = args
        .worker_servers
        .split(',')
        .map(|s| s.parse().map_err(|e: String| anyhow::anyhow!(e)))
        .collect::<anyhow::Result<_>>()?;
    let durability = match args.worker_durability.as_str() {
        "memory" => Durability::Memory,
        _ => Durability::Ssd,
    };
    let transfer = args.transfer_bytes;
    let placement = Placement::Striped {
        stripe_unit_bytes: transfer.max(1 << 20),
        stripe_count: endpoints.len() as u32,
    };
    let options = ClientOptions {
        placement,
        durability,
        // Deep enough for small transfers; the client's byte window bounds large ones.
        window: 128,
        transfer_bytes_max: transfer,
        client_name: format!("bench worker {rank}"),
        munge_socket: args.worker_munge_socket.clone(),
        ..ClientOptions::default()
    };
    let (name, base) = match args.worker_pattern.as_str() {
        "n1" => ("shared".to_string(), rank as u64 * args.bytes_per_client),
        _ => (format!("rank{rank}"), 0),
    };
    let buffer: Vec<u8> =
        (0..transfer).map(|i| (i as u8) ^ (rank as u8).wrapping_mul(31)).collect();
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    let mut line = String::new();
    writeln!(stdout, "ready")?;
    stdout.flush()?;
    stdin.read_line(&mut line)?;
    let started = Instant::now();
    // Connected inside the timed region: authentication is part of what is measured.
    let mut client = Client::connect(&endpoints, options)?;
    let epoch = EpochId(1);
    client.begin_epoch(epoch);
    let mut file = client.create_file(epoch, &name)?;
    let mut offset = 0;
    while offset < args.bytes_per_client {
        let length = transfer.min(args.bytes_per_client - offset) as usize;
        client.write(&mut file, base + offset, &buffer[..length])?;
        offset += length as u64;
    }
    client.flush()?;
    writeln!(stdout, "written")?;
    stdout.flush()?;
    line.clear();
    stdin.read_line(&mut line)?;
    let written = started.elapsed();
    let commit_started = Instant::now();
    client.commit_epoch(epoch)?;
    if std::env::var_os("SPILLWAY_BENCH_VERBOSE").is_some() {
        eprintln!(
            "worker {rank}: wrote {} bytes in {:.3} s, commit ({}) took {:.3} s",
            args.bytes_per_client,
            written.as_secs_f64(),
            args.worker_durability,
            commit_started.elapsed().as_secs_f64()
        );
    }
    writeln!(stdout, "done")?;
    stdout.flush()?;
    Ok(())
}

fn memcached_gbps(shape: &Shape, work: &Path) -> anyhow::Result<Sample> {
    let memcached = which("memcached").context(
        "memcached not found: install the Debian packages memcached and libmemcached-tools (apt-get install -y memcached libmemcached-tools)",
    )?;
    let memcaslap = which("memcaslap")
        .context("memcaslap not found: install the Debian package libmemcached-tools")?;
    let per_server_mb = (shape.total_bytes().div_ceil(shape.servers as u64) >> 20) + 256;
    let mut servers = Vec::new();
    let mut addresses = Vec::new();
    for _ in 0..shape.servers {
        let port = free_port()?;
        let mut command = Command::new(&memcached);
        command
            .args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0", "-I", "2m", "-t", "2"])
            .args(["-m", &per_server_mb.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if spillway_sys::user::euid() == 0 {
            command.args(["-u", "root"]);
        }
        servers.push(Reaped(command.spawn().context("starting memcached")?));
        addresses.push(format!("127.0.0.1:{port}"));
        wait_for_port(port)?;
    }
    let config = work.join("memcaslap.cfg");
    std::fs::write(
        &config,
        format!("key\n64 64 1\nvalue\n{0} {0} 1\ncmd\n0 1\n1 0\n", shape.transfer_bytes),
    )?;
    let operations = shape.total_bytes() / shape.transfer_bytes;
    let threads = shape.clients.max(shape.servers + 1);
    let stopwatch = Stopwatch::start()?;
    let output = Command::new(&memcaslap)
        .arg(format!("--servers={}", addresses.join(",")))
        .arg(format!("--cfg_cmd={}", config.display()))
        .args(["-T", &threads.to_string(), "-c", &threads.max(shape.clients).to_string()])
        .args(["-x", &operations.to_string(), "-X", &shape.transfer_bytes.to_string()])
        .output()
        .context("running memcaslap")?;
    let seconds = stopwatch.started.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() || !text.contains("Run time") {
        bail!(
            "memcaslap failed ({}): {}{}",
            output.status,
            text,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let sets: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("cmd_set: "))
        .and_then(|n| n.trim().parse().ok())
        .context("memcaslap printed no cmd_set count")?;
    // Rated on the SETs memcaslap counted, which can fall short of the bytes asked; the CPU is
    // read before memcached is stopped (parsing the output costs nothing measurable).
    let bytes = sets * shape.transfer_bytes;
    let sample = Sample {
        gbps: gigabytes_per_second(bytes, seconds),
        cpu_seconds_per_gb: stopwatch.cpu.seconds_per_gb(bytes)?,
        tail_seconds: None,
    };
    drop(servers);
    Ok(sample)
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|path| path.is_file())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_for_port(port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("memcached did not start listening on port {port}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// C threads push the bytes over plain loopback TCP into S sinks that discard them.
fn loopback_gbps(shape: &Shape) -> anyhow::Result<Sample> {
    let listeners: Vec<TcpListener> =
        (0..shape.servers).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    let addresses: Vec<_> = listeners.iter().map(|l| l.local_addr()).collect::<Result<_, _>>()?;
    let clients = shape.clients;
    let sinks: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(s, listener)| {
            let connections = (0..clients).filter(|c| *c as usize % addresses.len() == s).count();
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut readers = Vec::new();
                for _ in 0..connections {
                    let (mut stream, _) = listener.accept()?;
                    readers.push(std::thread::spawn(move || -> std::io::Result<()> {
                        let mut buffer = vec![0u8; 1 << 20];
                        while stream.read(&mut buffer)? > 0 {}
                        stream.write_all(&[1])
                    }));
                }
                for r in readers {
                    r.join().expect("sink thread")?;
                }
                Ok(())
            })
        })
        .collect();
    let stopwatch = Stopwatch::start()?;
    let senders: Vec<_> = (0..clients)
        .map(|c| {
            let address = addresses[c as usize % addresses.len()];
            let (transfer, bytes) = (shape.transfer_bytes as usize, shape.bytes_per_client);
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut stream = TcpStream::connect(address)?;
                stream.set_nodelay(true)?;
                let buffer = vec![7u8; transfer];
                let mut sent = 0u64;
                while sent < bytes {
                    let n = (transfer as u64).min(bytes - sent) as usize;
                    stream.write_all(&buffer[..n])?;
                    sent += n as u64;
                }
                stream.shutdown(std::net::Shutdown::Write)?;
                let mut ack = [0u8; 1];
                stream.read_exact(&mut ack)
            })
        })
        .collect();
    for s in senders {
        s.join().expect("sender thread")?;
    }
    let sample = stopwatch.stop(shape.total_bytes(), None)?;
    for s in sinks {
        s.join().expect("sink")?;
    }
    Ok(sample)
}

/// C threads write the bytes to files on the same disk as the SSD log, then fsync.
fn direct_pfs_gbps(shape: &Shape, work: &Path) -> anyhow::Result<Sample> {
    let dir = work.join("pfs");
    std::fs::create_dir_all(&dir)?;
    let stopwatch = Stopwatch::start()?;
    let threads: Vec<_> = (0..shape.clients)
        .map(|c| {
            let path = dir.join(format!("rank{c}"));
            let (transfer, bytes) = (shape.transfer_bytes as usize, shape.bytes_per_client);
            // Returns when its last byte was written (before the fsync).
            std::thread::spawn(move || -> std::io::Result<Instant> {
                let mut file = std::fs::File::create(&path)?;
                let buffer = vec![c as u8; transfer];
                let mut written = 0u64;
                while written < bytes {
                    let n = (transfer as u64).min(bytes - written) as usize;
                    file.write_all(&buffer[..n])?;
                    written += n as u64;
                }
                let last_byte = Instant::now();
                file.sync_all()?;
                Ok(last_byte)
            })
        })
        .collect();
    let mut last_byte = None;
    for t in threads {
        let written = t.join().expect("writer thread")?;
        last_byte = last_byte.max(Some(written));
    }
    let tail = last_byte.map(|at| at.elapsed().as_secs_f64());
    let sample = stopwatch.stop(shape.total_bytes(), tail)?;
    std::fs::remove_dir_all(&dir)?;
    Ok(sample)
}
