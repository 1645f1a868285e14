//! `spillway demo` with real processes: two `spillway serve` servers draining to a PFS
//! directory, client ranks writing a checkpoint through the client library, the drain running in
//! the background while the application goes on, a SIGKILL, recovery, read-back, GC and clean
//! shutdown.
//!
//! This is what `make demo` shows (issue 4's "Done when"): the same binary re-executes itself as
//! two servers on loopback ports (SSD logs under a temporary directory in /var/tmp, a DRAM tier
//! small enough that the checkpoint spills to SSD, a `pfs` directory beside them standing in for
//! Lustre, drain peers over Unix sockets whose paths are known before the servers start), then
//! plays a job's ranks as threads, each with its own connections (the servers see independent
//! clients):
//!
//! 1. both servers start with `--pfs-dir`, `--drain-peers` and `--drain-self-index`;
//! 2. epochs 1 and 2 are N-N checkpoints (a file per rank, `local` placement, BurstMem style)
//!    committed at `memory` and at `ssd` durability; epoch 3 is N-1 (one shared file, disjoint
//!    ranges, striped over both servers) at `ssd` durability. Each is timed as the application
//!    sees it (first write to last commit) against writing the same bytes straight to files in
//!    a directory on the same disk with fsync;
//! 3. right after epoch 3's commit returns, its drain (coordinated shuffling) is requested and
//!    the application writes epoch 4 meanwhile; the timeline (commit, request, epoch 4's writes,
//!    publication, drained), the drain throughput, each server's stripe-aligned domain and the
//!    PFS file (CRC32C of every rank's range) are shown and checked;
//! 4. epoch 1 (N-N) is drained with the application idle, and every poll checks that no server
//!    frees space before the PFS files it holds parts of are published (fsync'd and renamed);
//! 5. with epoch 4 open, server 1 is killed with SIGKILL and restarted on the same SSD directory
//!    and port; every committed byte is read back through the client — from the PFS copy for the
//!    drained and freed epochs (`set_pfs_fallback`), from the burst buffer otherwise;
//! 6. the epochs and the servers' DRAM/SSD use are listed, the oldest epoch still held in the
//!    burst buffer is deleted and the space it held is shown coming back;
//! 7. both servers get SIGTERM and must exit 0.
//!
//! Server processes are owned by `spillway-harness`'s [`ServerProcess`] guards that SIGKILL and
//! reap them on drop, so no path out of [`run`] (error or panic) leaves a server behind; and they
//! are started with `PR_SET_PDEATHSIG = SIGKILL`, so even a demo killed by a signal takes its
//! servers with it. Any byte that does not verify, on the PFS or read back, makes [`run`] fail,
//! hence a non-zero exit.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use spillway_client::{Client, ClientOptions, EpochSummary, Placement};
use spillway_drain::{chunk_writes, partition_domains, DrainMode};
use spillway_harness::{ServerBuilder, ServerProcess};
use spillway_proto::{DrainInfo, DrainState, Durability, Endpoint, EpochState, ServerStatus};
use spillway_types::{format_bytes, EpochId, MIB};

/// `spillway demo`'s flags.
#[derive(clap::Args)]
pub struct Args {
    /// Client ranks (threads, each with its own connections to every server).
    #[arg(long, default_value_t = 4)]
    ranks: u32,
    /// Bytes each rank writes per epoch, e.g. 16M.
    #[arg(long, default_value = "32M", value_parser = spillway_types::parse_size)]
    rank_bytes: u64,
    /// Size of one write call of a rank, e.g. 1M.
    #[arg(long, default_value = "1M", value_parser = spillway_types::parse_size)]
    transfer_bytes: u64,
    /// DRAM tier of each server (small, so that the checkpoint spills to SSD).
    #[arg(long, default_value = "32M", value_parser = spillway_types::parse_size)]
    dram_bytes: u64,
    /// SSD log segment size of each server (small, so that deleting an epoch frees whole segments).
    #[arg(long, default_value = "8M", value_parser = spillway_types::parse_size)]
    segment_bytes: u64,
    /// Directory under which the demo makes its temporary directory (removed at the end).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// The `spillway` executable to run as servers (default: this one).
    #[arg(long, hide = true)]
    server_bin: Option<PathBuf>,
}

/// SSD capacity of each demo server: at least 1 GiB, and room for all four epochs (each server
/// holds about half of each) with slack for segments shared between epochs.
fn ssd_bytes(args: &Args) -> u64 {
    (3 * args.ranks as u64 * args.rank_bytes).max(1024 * MIB)
}
/// How long a server may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long background work (memory → SSD catch-up, segment GC) may take to become visible.
const BACKGROUND_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the demo watches GC reclaim the segments of a deleted epoch.
const GC_WAIT: Duration = Duration::from_secs(3);
/// How long a drain may take (it yields to ingest while the next epoch is written).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
/// PFS stripe size the servers drain with (`drain.stripe_bytes`): shuffled domains start on it.
const DRAIN_STRIPE_BYTES: u64 = MIB;
/// Largest PFS write of the drain (`drain.write_bytes_max`, a multiple of the stripe).
const DRAIN_WRITE_BYTES_MAX: u64 = 8 * MIB;
/// The server killed and restarted.
const VICTIM: usize = 1;

/// One demo server: `--ssd-bytes`, the DRAM tier, the segment and drain knobs, a Unix socket
/// among the drain peers (their paths are known before any server starts, unlike the TCP ports),
/// draining to `pfs`.
fn demo_server(
    bin: &Path,
    root: &Path,
    index: usize,
    peers: &[Endpoint],
    pfs: &Path,
    args: &Args,
) -> ServerBuilder {
    let name = SERVER_NAMES[index];
    ServerBuilder::new(bin, root, name)
        .ssd_dir(ssd_dir(root, name))
        .dram_bytes(&args.dram_bytes.to_string())
        .args(["--ssd-bytes".to_string(), ssd_bytes(args).to_string()])
        .unix_socket(socket_path(root, name))
        .pfs_dir(pfs)
        .drain_peers(peers, index)
        .env("SPILLWAY_STORE_SEGMENT_BYTES_MAX", args.segment_bytes.to_string())
        .env("SPILLWAY_DRAIN_STRIPE_BYTES", DRAIN_STRIPE_BYTES.to_string())
        .env("SPILLWAY_DRAIN_WRITE_BYTES_MAX", DRAIN_WRITE_BYTES_MAX.to_string())
        .rust_log("info")
}

/// The servers of the demo, in drain order.
const SERVER_NAMES: [&str; 2] = ["bb0", "bb1"];

/// The SSD log directory of server `name`.
fn ssd_dir(root: &Path, name: &str) -> PathBuf {
    root.join(format!("{name}-ssd"))
}

/// The Unix socket of server `name`, through which its drain peers reach it.
fn socket_path(root: &Path, name: &str) -> PathBuf {
    root.join(format!("{name}.sock"))
}

/// The last lines of a server's log, for error messages (the log dies with the temp dir).
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(15)..].join("\n  ");
    format!("; last lines of {}:\n  {tail}", log.display())
}

/// How the ranks of one epoch lay out their data.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// N-N: a file per rank, each rank writing to its own server (`local` placement).
    FilePerRank,
    /// N-1: one shared file, rank `r` writes bytes `[r·B, (r+1)·B)`, striped over every server.
    SharedStriped,
}

#[derive(Clone, Copy)]
struct EpochPlan {
    epoch: EpochId,
    layout: Layout,
    durability: Durability,
    /// Bytes per rank.
    rank_bytes: u64,
    commit: bool,
}

const STRIPE_UNIT_BYTES: u64 = MIB;

impl EpochPlan {
    fn file_name(&self, rank: u32) -> String {
        match self.layout {
            Layout::FilePerRank => format!("ckpt.{}/rank{rank}.dat", self.epoch.0),
            Layout::SharedStriped => format!("ckpt.{}/shared.dat", self.epoch.0),
        }
    }

    fn offset(&self, rank: u32) -> u64 {
        match self.layout {
            Layout::FilePerRank => 0,
            Layout::SharedStriped => rank as u64 * self.rank_bytes,
        }
    }

    fn placement(&self, rank: u32) -> Placement {
        match self.layout {
            Layout::FilePerRank => Placement::Local { rank },
            Layout::SharedStriped => {
                Placement::Striped { stripe_unit_bytes: STRIPE_UNIT_BYTES, stripe_count: u32::MAX }
            }
        }
    }

    fn describe(&self, ranks: u32) -> String {
        let what = match self.layout {
            Layout::FilePerRank => format!("N-N, {ranks} files, local placement"),
            Layout::SharedStriped => {
                format!("N-1, 1 shared file, striped {} units", format_bytes(STRIPE_UNIT_BYTES))
            }
        };
        let durability = match (self.commit, self.durability) {
            (false, _) => "not committed".to_string(),
            (true, Durability::Memory) => "commit durability memory".to_string(),
            (true, Durability::Ssd) => "commit durability ssd".to_string(),
            (true, other) => format!("commit durability {other:?}"),
        };
        format!("epoch {} ({what}, {durability})", self.epoch.0)
    }
}

/// Deterministic content of one rank's part of one epoch.
fn rank_data(epoch: EpochId, rank: u32, length: u64) -> Vec<u8> {
    let mut state = (epoch.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (rank as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9))
        | 1;
    let mut out = Vec::with_capacity(length as usize + 8);
    while (out.len() as u64) < length {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(length as usize);
    out
}

/// What the application saw while checkpointing one epoch.
struct CheckpointTiming {
    /// When the first rank started writing.
    started: Instant,
    /// When the last rank's commit returned (end of the write phase if not committed).
    finished: Instant,
    /// First write to the last rank's last write acknowledged (in the servers' DRAM).
    write: Duration,
    /// From the end of the write phase to the last rank's commit returning.
    commit: Duration,
}

impl CheckpointTiming {
    fn total(&self) -> Duration {
        self.write + self.commit
    }
}

/// Runs one epoch's ranks as threads: connect, barrier, write + flush, barrier, commit.
fn write_checkpoint(
    endpoints: &[Endpoint],
    plan: &EpochPlan,
    data: &[Vec<u8>],
    transfer_bytes: u64,
) -> anyhow::Result<CheckpointTiming> {
    let ranks = data.len();
    let barrier = Barrier::new(ranks);
    let results: Vec<anyhow::Result<(Instant, Instant, Instant)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = data
            .iter()
            .enumerate()
            .map(|(rank, bytes)| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let rank = rank as u32;
                    let options = ClientOptions {
                        placement: plan.placement(rank),
                        durability: plan.durability,
                        transfer_bytes_max: transfer_bytes,
                        client_name: format!("demo rank {rank}"),
                        ..ClientOptions::default()
                    };
                    // Every rank passes both barriers even after a failure, so none waits forever.
                    let connected = Client::connect(endpoints, options)
                        .with_context(|| format!("rank {rank}: connecting"));
                    barrier.wait();
                    let started = Instant::now();
                    let written = connected.and_then(|mut client| {
                        client.begin_epoch(plan.epoch);
                        let name = plan.file_name(rank);
                        let mut file = client
                            .create_file(plan.epoch, &name)
                            .with_context(|| format!("rank {rank}: creating {name}"))?;
                        let base = plan.offset(rank);
                        for (i, chunk) in bytes.chunks(transfer_bytes as usize).enumerate() {
                            let offset = base + i as u64 * transfer_bytes;
                            client.write(&mut file, offset, chunk).with_context(|| {
                                format!("rank {rank}: writing {name} at {offset}")
                            })?;
                        }
                        client.flush().with_context(|| format!("rank {rank}: writes of {name}"))?;
                        Ok(client)
                    });
                    let write_done = Instant::now();
                    barrier.wait();
                    let mut client = written?;
                    if plan.commit {
                        client.commit_epoch(plan.epoch).with_context(|| {
                            format!("rank {rank}: committing epoch {}", plan.epoch)
                        })?;
                    }
                    Ok((started, write_done, Instant::now()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a rank thread panicked"))))
            .collect()
    });
    let times = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let start = times.iter().map(|t| t.0).min().expect("at least one rank");
    let written = times.iter().map(|t| t.1).max().expect("at least one rank");
    let committed = times.iter().map(|t| t.2).max().expect("at least one rank");
    Ok(CheckpointTiming {
        started: start,
        finished: committed.max(written),
        write: written - start,
        commit: committed.saturating_duration_since(written),
    })
}

/// The same bytes written straight to a directory on disk: N-N as a file per rank, N-1 as one
/// shared file with positioned writes; every rank fsyncs its file. Returns the elapsed time.
fn write_direct(
    dir: &Path,
    plan: &EpochPlan,
    data: &[Vec<u8>],
    transfer_bytes: u64,
) -> anyhow::Result<Duration> {
    let dir = dir.join(format!("epoch{}", plan.epoch.0));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if plan.layout == Layout::SharedStriped {
        File::create(dir.join("shared.dat"))
            .with_context(|| format!("creating {}/shared.dat", dir.display()))?;
    }
    let started = Instant::now();
    std::thread::scope(|scope| {
        let handles: Vec<_> = data
            .iter()
            .enumerate()
            .map(|(rank, bytes)| {
                let dir = &dir;
                scope.spawn(move || -> anyhow::Result<()> {
                    let rank = rank as u32;
                    let path = match plan.layout {
                        Layout::FilePerRank => dir.join(format!("rank{rank}.dat")),
                        Layout::SharedStriped => dir.join("shared.dat"),
                    };
                    let file = std::fs::OpenOptions::new()
                        .create(true)
                        .write(true)
                        .truncate(false)
                        .open(&path)?;
                    let base = plan.offset(rank);
                    for (i, chunk) in bytes.chunks(transfer_bytes as usize).enumerate() {
                        file.write_all_at(chunk, base + i as u64 * transfer_bytes)
                            .with_context(|| format!("writing {}", path.display()))?;
                    }
                    file.sync_all().with_context(|| format!("fsync of {}", path.display()))?;
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join().unwrap_or_else(|_| Err(anyhow!("a direct-write thread panicked")))
        })
    })?;
    let elapsed = started.elapsed();
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(elapsed)
}

/// Reads every rank's part of a committed epoch back through the client and checks it; with
/// `pfs`, the client falls back to the PFS copy of a drained epoch (and must, if `drained`).
/// Returns the bytes verified and how many parts were read from the PFS copy.
fn verify_epoch(
    endpoints: &[Endpoint],
    plan: &EpochPlan,
    crcs: &[u32],
    transfer_bytes: u64,
    pfs: &Path,
    drained: bool,
) -> anyhow::Result<(u64, usize)> {
    let mut verified = 0;
    let mut from_pfs = 0;
    for (rank, &expected) in crcs.iter().enumerate() {
        let rank = rank as u32;
        // A reader of a local-placement file finds its pieces wherever they are.
        let placement = match plan.placement(rank) {
            Placement::Local { .. } => Placement::Local { rank: 0 },
            striped => striped,
        };
        let options = ClientOptions {
            placement,
            transfer_bytes_max: transfer_bytes,
            client_name: "demo reader".into(),
            ..ClientOptions::default()
        };
        let mut client = Client::connect(endpoints, options).context("reader: connecting")?;
        client.set_pfs_fallback(pfs);
        let name = plan.file_name(rank);
        let file = client
            .open_file(plan.epoch, &name)
            .with_context(|| format!("opening {name} of epoch {}", plan.epoch))?;
        match (file.pfs_copy(), drained) {
            (Some(_), _) => from_pfs += 1,
            (None, true) => bail!("epoch {} {name}: drained and freed, yet the client did not fall back to its PFS copy", plan.epoch),
            (None, false) => {}
        }
        let mut back = vec![0u8; plan.rank_bytes as usize];
        let offset = plan.offset(rank);
        client
            .read(&file, offset, &mut back)
            .with_context(|| format!("reading {name} of epoch {} at {offset}", plan.epoch))?;
        let got = crc32c::crc32c(&back);
        if got != expected {
            let first_bad = rank_data(plan.epoch, rank, plan.rank_bytes)
                .iter()
                .zip(&back)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            bail!(
                "epoch {} {name}: rank {rank}'s {} read back with CRC32C {got:08x}, written {expected:08x}; first differing byte at file offset {}",
                plan.epoch,
                format_bytes(plan.rank_bytes),
                offset + first_bad as u64
            );
        }
        verified += plan.rank_bytes;
    }
    Ok((verified, from_pfs))
}

/// Checks the PFS copy of a drained epoch against the CRC32C of every rank's part: the files
/// exist under their final names with the written size and content, and no staging file or part
/// marker (dot names) is left in the epoch's directory. Returns the bytes verified.
fn verify_pfs_copy(pfs: &Path, plan: &EpochPlan, crcs: &[u32]) -> anyhow::Result<u64> {
    let dir = pfs.join(format!("epoch-{}", plan.epoch.0));
    let ranks = crcs.len() as u32;
    let mut verified = 0;
    let mut check = |name: &str, ranks_in_file: std::ops::Range<u32>| -> anyhow::Result<()> {
        let path = dir.join(name);
        let bytes = std::fs::read(&path)
            .with_context(|| format!("reading the PFS copy {}", path.display()))?;
        let expected_len = match plan.layout {
            Layout::FilePerRank => plan.rank_bytes,
            Layout::SharedStriped => ranks as u64 * plan.rank_bytes,
        };
        if bytes.len() as u64 != expected_len {
            bail!(
                "PFS copy {}: {} bytes, {} were written",
                path.display(),
                bytes.len(),
                expected_len
            );
        }
        for rank in ranks_in_file {
            let start = plan.offset(rank) as usize;
            let got = crc32c::crc32c(&bytes[start..start + plan.rank_bytes as usize]);
            if got != crcs[rank as usize] {
                bail!("PFS copy {}: rank {rank}'s bytes at offset {start} have CRC32C {got:08x}, written {:08x}", path.display(), crcs[rank as usize]);
            }
        }
        verified += bytes.len() as u64;
        Ok(())
    };
    match plan.layout {
        Layout::FilePerRank => {
            for rank in 0..ranks {
                check(&plan.file_name(rank), rank..rank + 1)?;
            }
        }
        Layout::SharedStriped => check(&plan.file_name(0), 0..ranks)?,
    }
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                bail!(
                    "PFS: {} left behind in {} (staging file or part marker)",
                    entry.file_name().to_string_lossy(),
                    d.display()
                );
            }
            if entry.file_type()?.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(verified)
}

/// What was seen while one epoch drained: from the request to every server reporting it drained.
struct DrainWatch {
    requested: Instant,
    /// First poll that found every file of the epoch under its final PFS name (complete, fsync'd).
    published: Option<Instant>,
    /// First poll at which the servers' space in use (DRAM + SSD) was the watch's threshold below
    /// the figure at the request.
    freed: Option<Instant>,
    drained: Instant,
    used_before: u64,
    used_after: u64,
    /// Per server: its drain status once drained.
    infos: Vec<(usize, DrainInfo)>,
}

/// Space in use (DRAM + SSD) on each server.
fn space_used(client: &mut Client) -> anyhow::Result<Vec<u64>> {
    Ok(client.status()?.iter().map(|s| s.ssd_bytes_used + s.dram_bytes_used).collect())
}

/// A file of a drained epoch: its final PFS name and the servers holding a part of it.
struct FinalFile {
    path: PathBuf,
    holders: Vec<usize>,
}

/// Polls drain status, space in use and the PFS until `epoch` is drained on every server that
/// holds it. With `free_threshold` (no other epoch growing meanwhile), fails if a server's space
/// in use fell by that much before every file it holds a part of was published: each server
/// frees an epoch's space once its own files are on the PFS, whatever its peers are doing.
fn watch_drain(
    endpoints: &[Endpoint],
    epoch: EpochId,
    requested: Instant,
    used_before: &[u64],
    files: &[FinalFile],
    free_threshold: Option<u64>,
) -> anyhow::Result<DrainWatch> {
    let mut client = admin(endpoints)?;
    let mut published = None;
    let mut freed = None;
    loop {
        let used = space_used(&mut client)?;
        let status = client.drain_status()?;
        let now = Instant::now();
        let on_pfs: Vec<bool> = files.iter().map(|f| f.path.is_file()).collect();
        if published.is_none() && on_pfs.iter().all(|&p| p) {
            published = Some(now);
        }
        if let Some(threshold) = free_threshold {
            for (server, (&now_used, &before)) in used.iter().zip(used_before).enumerate() {
                if now_used.saturating_add(threshold) > before {
                    continue;
                }
                if let Some((file, _)) =
                    files.iter().zip(&on_pfs).find(|(f, &p)| !p && f.holders.contains(&server))
                {
                    bail!(
                        "epoch {epoch}: server {server} freed space ({} -> {}) before {} was published on the PFS",
                        format_bytes(before),
                        format_bytes(now_used),
                        file.path.display()
                    );
                }
                freed.get_or_insert(now);
            }
        }
        let infos: Vec<(usize, DrainInfo)> = status
            .iter()
            .filter_map(|(server, list)| {
                list.iter().find(|d| d.epoch == epoch).map(|d| (*server, d.clone()))
            })
            .collect();
        if !infos.is_empty() && infos.iter().all(|(_, d)| d.state == DrainState::Drained) {
            if published.is_none() {
                bail!("epoch {epoch}: reported drained but not every file is under its final PFS name");
            }
            return Ok(DrainWatch {
                requested,
                published,
                freed,
                drained: now,
                used_before: used_before.iter().sum(),
                used_after: used.iter().sum(),
                infos,
            });
        }
        if requested.elapsed() > DRAIN_TIMEOUT {
            let report: Vec<String> = infos
                .iter()
                .map(|(s, d)| {
                    format!(
                        "server {s}: {} ({} failed attempts) {}",
                        d.state, d.failed_attempts, d.last_error
                    )
                })
                .collect();
            bail!("epoch {epoch} not drained after {DRAIN_TIMEOUT:?}: {}", report.join("; "));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Every server's DRAM + SSD use once background work has settled (two equal readings 100 ms apart).
fn settled_use(client: &mut Client) -> anyhow::Result<Vec<u64>> {
    let started = Instant::now();
    let mut last = Vec::new();
    loop {
        let used = space_used(client)?;
        if used == last || started.elapsed() > BACKGROUND_TIMEOUT {
            return Ok(used);
        }
        last = used;
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The final PFS names of an epoch's files and which servers hold parts of each.
fn final_files(
    endpoints: &[Endpoint],
    pfs: &Path,
    plan: &EpochPlan,
    ranks: u32,
) -> anyhow::Result<Vec<FinalFile>> {
    let mut client = admin(endpoints)?;
    let names: std::collections::BTreeSet<String> = (0..ranks).map(|r| plan.file_name(r)).collect();
    names
        .into_iter()
        .map(|name| {
            let file = client
                .open_file(plan.epoch, &name)
                .with_context(|| format!("opening {name} of epoch {}", plan.epoch))?;
            Ok(FinalFile {
                path: pfs.join(format!("epoch-{}", plan.epoch.0)).join(&name),
                holders: file.servers(),
            })
        })
        .collect()
}

fn ms_since(origin: Instant, at: Instant) -> f64 {
    at.saturating_duration_since(origin).as_secs_f64() * 1e3
}

fn print_drain(names: &[&str], watch: &DrainWatch) {
    for (server, d) in &watch.infos {
        println!(
            "     {:<4} {:<8} mode {:<8} files {}/{}  {:>9} to the PFS in {:>4} write calls  shuffle {:>5.0} ms  flush {:>5.0} ms{}",
            names.get(*server).copied().unwrap_or("?"),
            d.state.to_string(),
            DrainMode::from_code(d.mode).map(|m| m.to_string()).unwrap_or_default(),
            d.files_done,
            d.files_total,
            format_bytes(d.pfs_bytes_written),
            d.pfs_write_calls,
            d.shuffle_us as f64 / 1e3,
            d.flush_us as f64 / 1e3,
            if d.failed_attempts > 0 { format!("  ({} failed attempts: {})", d.failed_attempts, d.last_error) } else { String::new() }
        );
    }
}

fn gbps(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64().max(1e-9) / 1e9
}

fn state_name(state: EpochState) -> &'static str {
    match state {
        EpochState::Open => "open (uncommitted)",
        EpochState::CommittedMemory => "committed in DRAM (SSD catching up)",
        EpochState::Committed => "committed, durable on SSD",
        EpochState::Drained => "drained",
    }
}

fn print_status(statuses: &[ServerStatus]) {
    for status in statuses {
        println!(
            "     {:<4} DRAM {:>9} / {:<9}  SSD {:>9} / {:<9}  {} epochs, {} written, {} read",
            status.server_name,
            format_bytes(status.dram_bytes_used),
            format_bytes(status.dram_bytes_max),
            format_bytes(status.ssd_bytes_used),
            format_bytes(status.ssd_bytes_max),
            status.epochs,
            format_bytes(status.bytes_written),
            format_bytes(status.bytes_read),
        );
    }
}

fn print_epochs(epochs: &[EpochSummary]) {
    for e in epochs {
        println!(
            "     epoch {:<3} {:>10} on {} server(s)  {}",
            e.epoch.0,
            format_bytes(e.bytes),
            e.servers,
            state_name(e.state)
        );
    }
}

fn admin(endpoints: &[Endpoint]) -> anyhow::Result<Client> {
    Client::connect(
        endpoints,
        ClientOptions { client_name: "demo admin".into(), ..ClientOptions::default() },
    )
    .context("admin client: connecting")
}

/// One server's own view of its epochs (state, bytes).
fn server_epochs(endpoint: &Endpoint) -> anyhow::Result<BTreeMap<EpochId, (EpochState, u64)>> {
    let mut client = admin(std::slice::from_ref(endpoint))?;
    Ok(client.list_epochs()?.into_iter().map(|e| (e.epoch, (e.state, e.bytes))).collect())
}

/// Waits until `check` holds on the merged epoch list; returns how long that took.
fn wait_for(
    endpoints: &[Endpoint],
    what: &str,
    mut check: impl FnMut(&mut Client) -> anyhow::Result<bool>,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut client = admin(endpoints)?;
    loop {
        if check(&mut client)? {
            return Ok(started.elapsed());
        }
        if started.elapsed() > BACKGROUND_TIMEOUT {
            bail!("{what}: not done after {BACKGROUND_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn validate(args: &Args) -> anyhow::Result<()> {
    if args.ranks == 0 || args.ranks > 64 {
        bail!("--ranks {}: expected 1 to 64", args.ranks);
    }
    if args.rank_bytes == 0 || args.rank_bytes > 1024 * MIB {
        bail!("--rank-bytes {}: expected 1 byte to 1 GiB", args.rank_bytes);
    }
    if args.transfer_bytes == 0 || args.transfer_bytes > 16 * MIB {
        bail!("--transfer-bytes {}: expected 1 byte to 16 MiB", args.transfer_bytes);
    }
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    run_demo(args).map(|_| ())
}

/// What the demo checked, for its test.
#[derive(Debug)]
#[cfg_attr(not(test), allow(dead_code))]
struct DemoSummary {
    /// Bytes of PFS copies verified against the CRC32C of what the ranks wrote.
    pfs_bytes_verified: u64,
    /// Rank parts read back through the client from a PFS copy (drained and freed epochs).
    parts_read_from_pfs: usize,
    /// Space (DRAM + SSD) freed after the N-N epoch was drained, with the application idle.
    bytes_freed_after_drain: u64,
}

fn run_demo(args: Args) -> anyhow::Result<DemoSummary> {
    validate(&args)?;
    let demo_started = Instant::now();
    let bin = match &args.server_bin {
        Some(bin) => bin.clone(),
        None => std::env::current_exe().context("locating the spillway executable")?,
    };
    // Declared first, so it is removed last: after every server guard has killed its process.
    let temp = tempfile::Builder::new()
        .prefix("spillway-demo-")
        .tempdir_in(&args.dir)
        .with_context(|| format!("creating a temporary directory in {}", args.dir.display()))?;
    let root = temp.path().to_path_buf();
    let direct_dir = root.join("direct-to-disk");
    let names = SERVER_NAMES;
    let pfs = root.join("pfs");
    std::fs::create_dir(&pfs)
        .with_context(|| format!("creating the PFS stand-in {}", pfs.display()))?;
    let peers: Vec<Endpoint> =
        names.iter().map(|n| Endpoint::Unix(socket_path(&root, n))).collect();
    let ranks = args.ranks;
    let epoch_bytes = ranks as u64 * args.rank_bytes;

    println!(
        "Spillway demo: 2 burst buffer servers, {ranks} client ranks, a checkpoint over 4 epochs"
    );
    println!(
        "  per server: DRAM tier {} (spills to SSD above the high watermark), SSD log {} in segments of {}",
        format_bytes(args.dram_bytes),
        format_bytes(ssd_bytes(&args)),
        format_bytes(args.segment_bytes)
    );
    println!(
        "  per epoch: {ranks} ranks x {} = {} in {} writes; working directory {}",
        format_bytes(args.rank_bytes),
        format_bytes(epoch_bytes),
        format_bytes(args.transfer_bytes),
        root.display()
    );
    println!();

    println!("1. Start two `spillway serve` processes on loopback, draining to a PFS directory");
    println!("   (a directory on the local disk stands in for Lustre: {}; stripe {}; drain peers over Unix sockets)", pfs.display(), format_bytes(DRAIN_STRIPE_BYTES));
    let mut servers: Vec<ServerProcess> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let server = demo_server(&bin, &root, i, &peers, &pfs, &args)
            .spawn()
            .with_context(|| format!("starting server {name} ({} serve)", bin.display()))?;
        println!(
            "   {name}: pid {}, {} (ready in {} ms), SSD log {}",
            server.pid(),
            server.endpoint(),
            server.startup().as_millis(),
            ssd_dir(&root, name).display()
        );
        servers.push(server);
    }
    let endpoints: Vec<Endpoint> = servers.iter().map(|s| s.endpoint().clone()).collect();
    println!();

    println!(
        "2. Checkpoint: each epoch timed as the application sees it (first write to last commit),"
    );
    println!("   against the same bytes written to files on the same disk and fsync'd");
    let plans = [
        EpochPlan {
            epoch: EpochId(1),
            layout: Layout::FilePerRank,
            durability: Durability::Memory,
            rank_bytes: args.rank_bytes,
            commit: true,
        },
        EpochPlan {
            epoch: EpochId(2),
            layout: Layout::FilePerRank,
            durability: Durability::Ssd,
            rank_bytes: args.rank_bytes,
            commit: true,
        },
        EpochPlan {
            epoch: EpochId(3),
            layout: Layout::SharedStriped,
            durability: Durability::Ssd,
            rank_bytes: args.rank_bytes,
            commit: true,
        },
    ];
    let mut crcs: BTreeMap<EpochId, Vec<u32>> = BTreeMap::new();
    let mut timings: BTreeMap<EpochId, CheckpointTiming> = BTreeMap::new();
    for plan in &plans {
        let data: Vec<Vec<u8>> =
            (0..ranks).map(|r| rank_data(plan.epoch, r, plan.rank_bytes)).collect();
        crcs.insert(plan.epoch, data.iter().map(|d| crc32c::crc32c(d)).collect());
        // The direct write first, so that the last epoch's commit is what the drain follows.
        let direct = write_direct(&direct_dir, plan, &data, args.transfer_bytes)?;
        let timing = write_checkpoint(&endpoints, plan, &data, args.transfer_bytes)?;
        println!("   {}", plan.describe(ranks));
        println!(
            "     spillway: {} in {:>6.0} ms = {:>5.2} GB/s  (writes {:.0} ms, commit {:.0} ms)",
            format_bytes(epoch_bytes),
            timing.total().as_secs_f64() * 1e3,
            gbps(epoch_bytes, timing.total()),
            timing.write.as_secs_f64() * 1e3,
            timing.commit.as_secs_f64() * 1e3
        );
        println!(
            "     direct to disk + fsync: {:>6.0} ms = {:>5.2} GB/s  (spillway / direct: {:.2}x)",
            direct.as_secs_f64() * 1e3,
            gbps(epoch_bytes, direct),
            direct.as_secs_f64() / timing.total().as_secs_f64().max(1e-9)
        );
        if plan.durability == Durability::Memory {
            // A memory commit survives a client crash, not a server crash; the servers' flushers
            // make it durable in the background. Wait for that before anyone kills a server.
            let epoch = plan.epoch;
            let caught_up = wait_for(&endpoints, "memory commit reaching SSD", |client| {
                Ok(client
                    .list_epochs()?
                    .iter()
                    .any(|e| e.epoch == epoch && e.state == EpochState::Committed))
            })?;
            println!("     background: the SSD logs caught up with epoch {} {:.0} ms after its commit returned", epoch.0, caught_up.as_secs_f64() * 1e3);
        }
        timings.insert(plan.epoch, timing);
    }
    println!();

    // ---- 3. The drain of the N-1 epoch runs while the application writes the next epoch.
    let shared_plan = plans[2];
    let shared_commit = timings[&shared_plan.epoch].finished;
    println!("3. Epoch {} committed: the application resumes (writes epoch 4) while epoch {} drains to the PFS", shared_plan.epoch.0, shared_plan.epoch.0);
    println!("   (N-1 shared file, coordinated shuffling: stripe-aligned domains, one writer per domain)");
    let mut client = admin(&endpoints)?;
    let shared_final = final_files(&endpoints, &pfs, &shared_plan, ranks)?;
    let used_at_request = space_used(&mut client)?;
    let queued = client
        .request_drain(shared_plan.epoch, DrainMode::Shuffled.code())
        .with_context(|| format!("requesting the drain of epoch {}", shared_plan.epoch))?;
    let drain_requested = Instant::now();
    if queued != names.len() {
        bail!(
            "drain of epoch {} queued on {queued} servers, expected {}",
            shared_plan.epoch,
            names.len()
        );
    }
    // The application computes its next state (here: generates epoch 4's bytes), then writes it.
    let open_plan = EpochPlan {
        epoch: EpochId(4),
        layout: Layout::FilePerRank,
        durability: Durability::Ssd,
        rank_bytes: args.rank_bytes,
        commit: false,
    };
    let open_data: Vec<Vec<u8>> =
        (0..ranks).map(|r| rank_data(open_plan.epoch, r, open_plan.rank_bytes)).collect();
    let (watch, open_timing) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            watch_drain(
                &endpoints,
                shared_plan.epoch,
                drain_requested,
                &used_at_request,
                &shared_final,
                None,
            )
        });
        let written = write_checkpoint(&endpoints, &open_plan, &open_data, args.transfer_bytes);
        let watched = watcher.join().unwrap_or_else(|_| Err(anyhow!("the drain watcher panicked")));
        (watched, written)
    });
    let (watch, open_timing) = (watch?, open_timing?);
    let at = |instant: Instant| ms_since(shared_commit, instant);
    println!(
        "   timeline (ms after epoch {}'s commit returned to the application):",
        shared_plan.epoch.0
    );
    println!(
        "     {:>7.0}  drain of epoch {} requested (queued on {queued} servers, journaled)",
        at(drain_requested),
        shared_plan.epoch.0
    );
    println!("     {:>7.0}  epoch 4 writes start ({} from {ranks} ranks, once the application has computed them)", at(open_timing.started), format_bytes(epoch_bytes));
    println!(
        "     {:>7.0}  epoch 4 writes acknowledged",
        at(open_timing.started + open_timing.write)
    );
    if let Some(published) = watch.published {
        println!("     {:>7.0}  {} complete under its final PFS name (staging file fsync'd, renamed, directory fsync'd)", at(published), shared_plan.file_name(0));
    }
    println!(
        "     {:>7.0}  epoch {} drained on every server",
        at(watch.drained),
        shared_plan.epoch.0
    );
    let drain_time = watch.drained - watch.requested;
    let overlapped = open_timing.started < watch.drained;
    println!(
        "   drain: {} in {:.0} ms = {:.2} GB/s, while the application wrote epoch 4 at {:.2} GB/s (epoch 2 with no drain running: {:.2} GB/s)",
        format_bytes(epoch_bytes),
        drain_time.as_secs_f64() * 1e3,
        gbps(epoch_bytes, drain_time),
        gbps(epoch_bytes, open_timing.write),
        gbps(epoch_bytes, timings[&EpochId(2)].write)
    );
    let busy_ms = watch
        .infos
        .iter()
        .map(|(_, d)| (d.shuffle_us + d.flush_us) as f64 / 1e3)
        .fold(0.0, f64::max);
    if overlapped {
        println!(
            "   (each server was busy shuffling + flushing at most {busy_ms:.0} ms of it; the rest is the drainer yielding to epoch 4's ingest (drain.ingest_bandwidth_share) and waiting for its peer's part)"
        );
    } else {
        println!(
            "   (the drain finished before epoch 4's first write: nothing overlapped this time)"
        );
    }
    print_drain(&names, &watch);
    let domains = partition_domains(epoch_bytes, watch.infos.len(), DRAIN_STRIPE_BYTES);
    println!(
        "   domains of the {} shared file ({} participants, boundaries on {} stripes):",
        format_bytes(epoch_bytes),
        domains.len(),
        format_bytes(DRAIN_STRIPE_BYTES)
    );
    for ((server, info), domain) in watch.infos.iter().zip(&domains) {
        // The writes the plan makes of this domain: at most DRAIN_WRITE_BYTES_MAX, ending on
        // stripe boundaries; the server's own counts must match it.
        let planned = chunk_writes(domain.clone(), DRAIN_WRITE_BYTES_MAX, DRAIN_STRIPE_BYTES);
        let aligned = planned
            .iter()
            .filter(|w| {
                w.start % DRAIN_STRIPE_BYTES == 0
                    && ((w.end - w.start) % DRAIN_STRIPE_BYTES == 0 || w.end == epoch_bytes)
            })
            .count();
        println!(
            "     {:<4} bytes [{}, {}) = {}: wrote {} in {} calls (plan: {} writes of <= {}, {} of them stripe-aligned)",
            names[*server],
            domain.start,
            domain.end,
            format_bytes(domain.end - domain.start),
            format_bytes(info.pfs_bytes_written),
            info.pfs_write_calls,
            planned.len(),
            format_bytes(DRAIN_WRITE_BYTES_MAX),
            aligned
        );
        if info.failed_attempts == 0
            && (info.pfs_bytes_written != domain.end - domain.start
                || info.pfs_write_calls != planned.len() as u64)
        {
            bail!(
                "{} wrote {} bytes in {} calls to the PFS; its domain is {} bytes in {} planned writes",
                names[*server],
                info.pfs_bytes_written,
                info.pfs_write_calls,
                domain.end - domain.start,
                planned.len()
            );
        }
    }
    let mut pfs_bytes_verified = verify_pfs_copy(&pfs, &shared_plan, &crcs[&shared_plan.epoch])?;
    println!("   PFS copy {} verified: {} bytes, every rank's range matches its CRC32C, no staging file left", shared_final[0].path.display(), epoch_bytes);
    println!("   {}: {} written in {:.0} ms, acknowledged, never committed (the crash comes for it in step 5)", open_plan.describe(ranks), format_bytes(epoch_bytes), open_timing.write.as_secs_f64() * 1e3);
    println!();

    // ---- 4. An N-N drain with the application idle: space comes back only after the PFS fsync.
    let nn_plan = plans[0];
    println!("4. Drain epoch {} (N-N, {ranks} files), application idle: GC frees its space only after the PFS copy is fsync'd", nn_plan.epoch.0);
    let used_before = settled_use(&mut client)?;
    println!("   before the drain:");
    print_status(&client.status()?);
    let nn_final = final_files(&endpoints, &pfs, &nn_plan, ranks)?;
    client
        .request_drain(nn_plan.epoch, DrainMode::Shuffled.code())
        .with_context(|| format!("requesting the drain of epoch {}", nn_plan.epoch))?;
    let requested = Instant::now();
    // Freed on a server: at least a quarter of its share of the epoch (segments shared with a
    // live epoch stay until compaction).
    let threshold = (epoch_bytes / (4 * names.len() as u64)).max(1);
    let mut nn_watch = watch_drain(
        &endpoints,
        nn_plan.epoch,
        requested,
        &used_before,
        &nn_final,
        Some(threshold),
    )?;
    while nn_watch.freed.is_none() && nn_watch.drained.elapsed() < GC_WAIT {
        std::thread::sleep(Duration::from_millis(5));
        let used = space_used(&mut client)?;
        if used.iter().zip(&used_before).any(|(&u, &b)| u.saturating_add(threshold) <= b) {
            nn_watch.freed = Some(Instant::now());
        }
    }
    nn_watch.used_after = settled_use(&mut client)?.iter().sum();
    println!("   timeline (ms after the request):");
    let mut events: Vec<(Instant, String)> =
        vec![(nn_watch.drained, format!("epoch {} drained on every server", nn_plan.epoch.0))];
    if let Some(published) = nn_watch.published {
        events.push((
            published,
            format!(
                "all {ranks} files under their final PFS names (each fsync'd before its rename)"
            ),
        ));
    }
    match nn_watch.freed {
        Some(freed) => events.push((freed, "first space freed by GC (each server frees only after its own files are published: checked at every poll)".to_string())),
        None => println!("   (no segment held only epoch {} data: nothing freed yet; compaction reclaims it at low free space)", nn_plan.epoch.0),
    }
    events.sort_by_key(|(at, _)| *at);
    for (at, what) in &events {
        println!("     {:>7.0}  {what}", ms_since(requested, *at));
    }
    let nn_drain_time = nn_watch.drained - nn_watch.requested;
    println!(
        "   drain: {} in {:.0} ms = {:.2} GB/s",
        format_bytes(epoch_bytes),
        nn_drain_time.as_secs_f64() * 1e3,
        gbps(epoch_bytes, nn_drain_time)
    );
    print_drain(&names, &nn_watch);
    pfs_bytes_verified += verify_pfs_copy(&pfs, &nn_plan, &crcs[&nn_plan.epoch])?;
    println!(
        "   PFS copies of the {ranks} files verified against the CRC32C of what each rank wrote"
    );
    println!(
        "   after the drain and GC (DRAM + SSD in use {} -> {}):",
        format_bytes(nn_watch.used_before),
        format_bytes(nn_watch.used_after)
    );
    print_status(&client.status()?);
    print_epochs(&client.list_epochs()?);
    let bytes_freed_after_drain = nn_watch.used_before.saturating_sub(nn_watch.used_after);
    drop(client);
    println!();
    let drained: std::collections::BTreeSet<EpochId> =
        [shared_plan.epoch, nn_plan.epoch].into_iter().collect();

    let victim_name = names[VICTIM];
    println!("5. Crash while epoch 4 is open: SIGKILL {victim_name}, restart it on the same SSD directory and port");
    let before = server_epochs(&endpoints[VICTIM])?;
    let server = &mut servers[VICTIM];
    let pid = server.pid();
    if !matches!(server.endpoint(), Endpoint::Tcp(_)) {
        bail!("server {victim_name} listens on {}, expected TCP", server.endpoint());
    }
    let status = server.sigkill()?;
    println!("   {victim_name} (pid {pid}) killed: {status}");
    // The harness restarts it with the same flags, directories and TCP port.
    server.restart().with_context(|| format!("restarting server {victim_name}"))?;
    if server.endpoint() != &endpoints[VICTIM] {
        bail!("{victim_name} came back on {} instead of {}", server.endpoint(), endpoints[VICTIM]);
    }
    println!(
        "   {victim_name} restarted: pid {}, {} (recovery + ready in {} ms)",
        server.pid(),
        server.endpoint(),
        server.startup().as_millis()
    );
    let after = server_epochs(&endpoints[VICTIM])?;
    println!("   what recovery found on {victim_name} (before the kill -> after the restart):");
    for epoch in before.keys().chain(after.keys()).collect::<std::collections::BTreeSet<_>>() {
        let show = |entry: Option<&(EpochState, u64)>| match entry {
            Some((state, bytes)) => format!("{} {}", format_bytes(*bytes), state_name(*state)),
            None => "absent".to_string(),
        };
        println!(
            "     epoch {:<3} {:<48} -> {}",
            epoch.0,
            show(before.get(epoch)),
            show(after.get(epoch))
        );
    }
    let log_text = servers[VICTIM].log_text();
    let torn = log_text.lines().filter(|l| l.contains("torn tail")).count();
    println!("   (epoch 4 was acknowledged in {victim_name}'s DRAM but never committed: what had not spilled to SSD is gone, as documented)");
    println!("   torn record tails cut by recovery (from {victim_name}'s log): {torn}");
    for plan in &plans {
        let (state, _) = after.get(&plan.epoch).copied().unwrap_or((EpochState::Open, 0));
        let expected =
            if drained.contains(&plan.epoch) { EpochState::Drained } else { EpochState::Committed };
        if before.contains_key(&plan.epoch) && state != expected {
            bail!(
                "committed epoch {} is {} on {victim_name} after the restart",
                plan.epoch,
                state_name(state)
            );
        }
    }
    println!("   reading every committed byte back through the client and checking CRC32C; the client falls");
    println!("   back to the PFS copy for epochs that were drained and freed (restart read path):");
    let read_started = Instant::now();
    let mut verified_total = 0;
    let mut parts_read_from_pfs = 0;
    for plan in &plans {
        let expected = &crcs[&plan.epoch];
        let (verified, from_pfs) = verify_epoch(
            &endpoints,
            plan,
            expected,
            args.transfer_bytes,
            &pfs,
            drained.contains(&plan.epoch),
        )?;
        verified_total += verified;
        parts_read_from_pfs += from_pfs;
        let listing: Vec<String> = expected.iter().map(|c| format!("{c:08x}")).collect();
        let source = if from_pfs > 0 { "from the PFS copy" } else { "from the burst buffer" };
        println!(
            "     epoch {}: {} in {} part(s) verified {source}, CRC32C {}",
            plan.epoch.0,
            format_bytes(verified),
            expected.len(),
            listing.join(" ")
        );
    }
    let read_time = read_started.elapsed();
    println!(
        "   all {} committed bytes verified ({}) in {:.0} ms = {:.2} GB/s",
        verified_total,
        format_bytes(verified_total),
        read_time.as_secs_f64() * 1e3,
        gbps(verified_total, read_time)
    );
    println!();

    println!("6. Epochs and space, then delete the oldest epoch still held in the burst buffer");
    let mut client = admin(&endpoints)?;
    print_epochs(&client.list_epochs()?);
    let statuses = client.status()?;
    print_status(&statuses);
    let ssd_before: u64 = statuses.iter().map(|s| s.ssd_bytes_used).sum();
    let oldest = client
        .list_epochs()?
        .iter()
        .find(|e| e.state != EpochState::Drained)
        .map(|e| e.epoch)
        .ok_or_else(|| anyhow!("no undrained epoch listed"))?;
    client.delete_epoch(oldest).with_context(|| format!("deleting epoch {oldest}"))?;
    // Segments with no live bytes are removed by each server's background GC; a segment that
    // also holds a live epoch stays until compaction, which runs when free space gets low.
    let gc_started = Instant::now();
    let mut statuses = client.status()?;
    while statuses.iter().map(|s| s.ssd_bytes_used).sum::<u64>() >= ssd_before
        && gc_started.elapsed() < GC_WAIT
    {
        std::thread::sleep(Duration::from_millis(10));
        statuses = client.status()?;
    }
    let first_freed = gc_started.elapsed();
    if first_freed < GC_WAIT {
        // Let the GC round that started finish, then take the settled figure.
        std::thread::sleep(Duration::from_millis(200));
        statuses = client.status()?;
    }
    let ssd_after: u64 = statuses.iter().map(|s| s.ssd_bytes_used).sum();
    println!(
        "   deleted epoch {}; SSD use {} -> {}: {} freed by GC (first segments gone after {:.0} ms)",
        oldest.0,
        format_bytes(ssd_before),
        format_bytes(ssd_after),
        format_bytes(ssd_before.saturating_sub(ssd_after)),
        first_freed.as_secs_f64() * 1e3
    );
    if ssd_after >= ssd_before {
        println!("   (no segment held only epoch {} data: its bytes are dead and go when compaction runs at low free space)", oldest.0);
    }
    print_epochs(&client.list_epochs()?);
    print_status(&statuses);
    if client.list_epochs()?.iter().any(|e| e.epoch == oldest) {
        bail!("epoch {oldest} still listed after its deletion");
    }
    drop(client);
    println!();

    mount_step(&bin, &endpoints, &root)?;

    println!("8. Clean shutdown: SIGTERM to both servers");
    let mut failures = Vec::new();
    for server in &mut servers {
        let started = Instant::now();
        let status = server.sigterm_and_wait(STOP_TIMEOUT)?;
        let name = server.name();
        println!("   {name}: exited with {status} after {} ms", started.elapsed().as_millis());
        if !status.success() {
            failures.push(format!("{name} exited with {status}{}", log_tail(server.log_path())));
        }
    }
    if !failures.is_empty() {
        bail!("unclean shutdown: {}", failures.join("; "));
    }
    let _ = std::io::stdout().flush();
    drop(temp);
    println!("   removed {}", root.display());
    println!();
    println!(
        "Demo done in {:.1} s: epochs drained in the background and verified on the PFS; every committed byte verified after SIGKILL and restart.",
        demo_started.elapsed().as_secs_f64()
    );
    Ok(DemoSummary { pfs_bytes_verified, parts_read_from_pfs, bytes_freed_after_drain })
}

/// Unmounts a demo mount when dropped (`spillway umount`, else `fusermount3 -u -z`).
struct DemoMount {
    bin: PathBuf,
    path: PathBuf,
    pid: Option<u32>,
}

impl DemoMount {
    /// Unmounts and waits (bounded) for the serving process to flush, sync and exit.
    fn unmount(mut self) -> anyhow::Result<()> {
        let status = Command::new(&self.bin)
            .arg("umount")
            .arg(&self.path)
            .status()
            .context("running spillway umount")?;
        if !status.success() {
            bail!("spillway umount {} failed ({status})", self.path.display());
        }
        if let Some(pid) = self.pid.take() {
            let deadline = Instant::now() + Duration::from_secs(30);
            while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.path = PathBuf::new();
        Ok(())
    }
}

impl Drop for DemoMount {
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        let unmounted = Command::new(&self.bin)
            .arg("umount")
            .arg(&self.path)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(&self.path).status();
        }
    }
}

/// `spillway mount --background` of the demo's servers at `path`.
fn demo_mount(
    bin: &Path,
    endpoints: &[Endpoint],
    path: &Path,
    log: &Path,
) -> anyhow::Result<DemoMount> {
    let servers = endpoints.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(",");
    let out = Command::new(bin)
        .args(["mount", "--servers", &servers, "--background", "--log"])
        .arg(log)
        .arg(path)
        .output()
        .context("running spillway mount")?;
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        bail!(
            "spillway mount failed: {said} {}{}",
            String::from_utf8_lossy(&out.stderr).trim(),
            log_tail(log)
        );
    }
    println!("   {said}");
    let pid =
        said.rsplit_once("(pid ").and_then(|(_, rest)| rest.trim_end_matches(')').parse().ok());
    Ok(DemoMount { bin: bin.to_path_buf(), path: path.to_path_buf(), pid })
}

fn shell(script: &str) -> anyhow::Result<()> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .with_context(|| format!("running {script}"))?;
    if !out.status.success() {
        bail!(
            "`{script}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Step 7: unmodified programs (cp, dd, Python) write through the FUSE mount; the files are
/// read back, survive an unmount and show up again on a second mount.
fn mount_step(bin: &Path, endpoints: &[Endpoint], root: &Path) -> anyhow::Result<()> {
    println!("7. Unmodified programs through the POSIX mount (`spillway mount`, FUSE)");
    if !Path::new("/dev/fuse").exists() {
        println!("   skipped: /dev/fuse is absent on this machine (load the fuse module to see this step)");
        println!();
        return Ok(());
    }
    let mnt = root.join("mnt");
    std::fs::create_dir(&mnt).with_context(|| format!("creating {}", mnt.display()))?;
    let input = root.join("input.bin");
    std::fs::write(&input, rank_data(EpochId(99), 0, 3 * MIB + 4321))
        .context("writing the demo input")?;
    let mount = demo_mount(bin, endpoints, &mnt, &root.join("mount.log"))?;
    let (i, m) = (input.display(), mnt.display());
    let started = Instant::now();
    shell(&format!("mkdir -p {m}/results && cp {i} {m}/results/copy.bin && dd if={i} of={m}/results/dd.bin bs=1M conv=fsync status=none"))?;
    println!(
        "   cp and dd (conv=fsync) wrote {} twice in {:.0} ms",
        format_bytes(3 * MIB + 4321),
        started.elapsed().as_secs_f64() * 1e3
    );
    let python = "import os, sys\nwith open(sys.argv[1], 'w') as f:\n    f.write('written by Python through the mount\\n')\n    f.flush()\n    os.fsync(f.fileno())\n";
    match Command::new("python3").arg("-c").arg(python).arg(mnt.join("results/python.txt")).status()
    {
        Ok(status) if status.success() => {
            println!("   python3 wrote and fsync'd results/python.txt")
        }
        Ok(status) => bail!("python3 writing through the mount failed ({status})"),
        Err(_) => println!("   (python3 not found: Python part skipped)"),
    }
    shell(&format!("cmp {i} {m}/results/copy.bin && cmp {i} {m}/results/dd.bin"))?;
    let listing = Command::new("ls").arg("-l").arg(mnt.join("results")).output().context("ls")?;
    for line in String::from_utf8_lossy(&listing.stdout).lines() {
        println!("   | {line}");
    }
    mount.unmount()?;
    println!("   unmounted; mounting again shows the same files (metadata on bb0, bytes striped over both servers):");
    let mount = demo_mount(bin, endpoints, &mnt, &root.join("mount.log"))?;
    shell(&format!("cmp {i} {m}/results/copy.bin && cmp {i} {m}/results/dd.bin"))?;
    if mnt.join("results/python.txt").exists() {
        let text = std::fs::read_to_string(mnt.join("results/python.txt"))
            .context("reading results/python.txt back")?;
        println!(
            "   read back: copy.bin and dd.bin identical to the input; python.txt says {:?}",
            text.trim()
        );
    } else {
        println!("   read back: copy.bin and dd.bin identical to the input");
    }
    mount.unmount()?;
    println!();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_data_is_deterministic_and_distinct() {
        assert_eq!(rank_data(EpochId(1), 0, 1000), rank_data(EpochId(1), 0, 1000));
        assert_ne!(rank_data(EpochId(1), 0, 1000), rank_data(EpochId(1), 1, 1000));
        assert_ne!(rank_data(EpochId(1), 0, 1000), rank_data(EpochId(2), 0, 1000));
        assert_eq!(rank_data(EpochId(3), 2, 13).len(), 13);
    }

    #[test]
    fn n_1_ranks_write_disjoint_ranges_of_one_file() {
        let plan = EpochPlan {
            epoch: EpochId(3),
            layout: Layout::SharedStriped,
            durability: Durability::Ssd,
            rank_bytes: 100,
            commit: true,
        };
        assert_eq!(plan.file_name(0), plan.file_name(3));
        assert_eq!((0..4).map(|r| plan.offset(r)).collect::<Vec<_>>(), vec![0, 100, 200, 300]);
        let nn = EpochPlan { layout: Layout::FilePerRank, ..plan };
        assert_ne!(nn.file_name(0), nn.file_name(1));
        assert_eq!(nn.offset(2), 0);
        assert_eq!(nn.placement(2), Placement::Local { rank: 2 });
    }

    /// The whole demo with small sizes, against the `spillway` binary cargo built beside this
    /// test binary (`cargo test --workspace` builds it for the binary's integration tests).
    #[test]
    fn demo_runs() {
        let exe = std::env::current_exe().unwrap();
        let bin = exe.parent().and_then(Path::parent).map(|d| d.join("spillway")).unwrap();
        assert!(
            bin.exists(),
            "{} not built (run `cargo test --workspace`, or `cargo build -p spillway` first)",
            bin.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let args = Args {
            ranks: 2,
            rank_bytes: 8 * MIB + 12_345,
            transfer_bytes: 256 * 1024,
            dram_bytes: 12 * MIB,
            segment_bytes: 6 * MIB,
            dir: dir.path().to_path_buf(),
            server_bin: Some(bin),
        };
        let summary = run_demo(args).unwrap();
        // Both drained epochs (N-1 and N-N) were found intact on the PFS, and every part of them
        // was read back through the client's PFS fallback after GC freed them.
        assert_eq!(summary.pfs_bytes_verified, 2 * 2 * (8 * MIB + 12_345), "{summary:?}");
        assert_eq!(summary.parts_read_from_pfs, 2 + 2, "{summary:?}");
        // The first epoch starts at the head of the SSD logs: whole segments held only its bytes.
        assert!(summary.bytes_freed_after_drain > 0, "{summary:?}");
        // Everything the demo made is gone.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// The PFS check catches a wrong byte, a wrong size, a missing file and a leftover marker.
    #[test]
    fn pfs_copy_check_finds_damage() {
        let dir = tempfile::tempdir().unwrap();
        let plan = EpochPlan {
            epoch: EpochId(7),
            layout: Layout::SharedStriped,
            durability: Durability::Ssd,
            rank_bytes: 1000,
            commit: true,
        };
        let data: Vec<Vec<u8>> = (0..3).map(|r| rank_data(plan.epoch, r, 1000)).collect();
        let crcs: Vec<u32> = data.iter().map(|d| crc32c::crc32c(d)).collect();
        let path = dir.path().join("epoch-7").join(plan.file_name(0));
        let error = verify_pfs_copy(dir.path(), &plan, &crcs).unwrap_err().to_string();
        assert!(error.contains("reading the PFS copy"), "{error}");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut whole = data.concat();
        std::fs::write(&path, &whole).unwrap();
        assert_eq!(verify_pfs_copy(dir.path(), &plan, &crcs).unwrap(), 3000);
        whole[1500] ^= 1;
        std::fs::write(&path, &whole).unwrap();
        let error = verify_pfs_copy(dir.path(), &plan, &crcs).unwrap_err().to_string();
        assert!(error.contains("rank 1") && error.contains("offset 1000"), "{error}");
        whole[1500] ^= 1;
        std::fs::write(&path, &whole[..2999]).unwrap();
        let error = verify_pfs_copy(dir.path(), &plan, &crcs).unwrap_err().to_string();
        assert!(error.contains("2999 bytes"), "{error}");
        std::fs::write(&path, &whole).unwrap();
        std::fs::write(path.with_file_name(".shared.dat.spillway-e7.staging.part-0"), b"").unwrap();
        let error = verify_pfs_copy(dir.path(), &plan, &crcs).unwrap_err().to_string();
        assert!(error.contains("left behind"), "{error}");
    }

    #[test]
    fn bad_arguments_are_refused_before_anything_starts() {
        let dir = tempfile::tempdir().unwrap();
        let args = Args {
            ranks: 0,
            rank_bytes: MIB,
            transfer_bytes: MIB,
            dram_bytes: 32 * MIB,
            segment_bytes: 8 * MIB,
            dir: dir.path().to_path_buf(),
            server_bin: Some(PathBuf::from("/nonexistent/spillway")),
        };
        let error = run(args).unwrap_err().to_string();
        assert!(error.contains("--ranks 0"), "{error}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
