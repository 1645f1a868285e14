//! `spillway bench egress`: draining a checkpoint to the PFS, naive against coordinated
//! shuffling, with a sequential-write baseline measured in the same run (BurstMem Fig. 8/9).
//!
//! S servers run in this process (real `Server`s over real stores, Unix sockets), each with a
//! real drainer writing to a PFS directory on this machine's disk, all recording their PFS
//! writes in one shared log. C client threads (local placement: client i writes to server
//! i mod S) write one N-1 shared file with interleaved transfers (client i writes blocks i, i+C,
//! i+2C, …), commit, and the epoch is drained (a) naive, (b) shuffled. Baselines on the same
//! disk: the same bytes written sequentially with fsync (PFS bandwidth), and the checkpoint
//! written directly to the disk with fsync (the application-visible time without a buffer).
//! Stripe lock switches come from the write log ([`spillway_drain::lock_switches`]): a local
//! disk has no extent locks, the count stands in for Lustre's lock ping-pong.

use crate::stats::median;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use spillway_client::{Client, ClientOptions, Placement};
use spillway_config::{ServerKnobs, StoreKnobs};
use spillway_drain::{DrainMode, Drainer, DrainerOptions, PosixPfs, WriteLog};
use spillway_proto::{DrainState, Durability, Endpoint};
use spillway_server::{Server, ServerOptions, ShutdownHandle, StoreBackend};
use spillway_types::EpochId;

#[derive(clap::Args)]
pub struct Args {
    /// Burst buffer servers (S).
    #[arg(long, default_value_t = 4)]
    servers: u32,
    /// Client threads (C).
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// Size of the shared checkpoint file.
    #[arg(long, default_value = "1G", value_parser = spillway_types::parse_size)]
    total_bytes: u64,
    /// Bytes per client write (interleaving unit).
    #[arg(long, default_value = "16K", value_parser = spillway_types::parse_size)]
    transfer_bytes: u64,
    /// PFS stripe size.
    #[arg(long, default_value = "1M", value_parser = spillway_types::parse_size)]
    stripe_bytes: u64,
    /// Largest PFS write of the shuffled drain.
    #[arg(long, default_value = "8M", value_parser = spillway_types::parse_size)]
    write_bytes: u64,
    /// DRAM log per server (default: room for the server's share of the checkpoint below the
    /// flusher's high watermark, as a burst buffer sized for its checkpoints has; the ingress
    /// benchmark sizes its `memory` runs the same way).
    #[arg(long, value_parser = spillway_types::parse_size)]
    dram_bytes: Option<u64>,
    /// Requests a server queues per connection (the clients' pipelining window is 64).
    #[arg(long, default_value_t = 64)]
    in_flight_requests: u32,
    /// Directory for SSD logs, PFS and baselines (default: a temporary directory under /var/tmp).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Drain the first checkpoint shuffled and the second naive (to check for order effects).
    /// Later repeats alternate the order either way.
    #[arg(long)]
    shuffled_first: bool,
    /// Paired repeats: each measures its own sequential baseline right before each drain and its
    /// own direct checkpoint, so a disk that swings between runs (this machine's does, 2-3x)
    /// moves both sides of a ratio; the reported ratios are the medians of the per-repeat ones.
    #[arg(long, default_value_t = 3)]
    repeat: u32,
    /// One JSON object on stdout instead of tables.
    #[arg(long)]
    json: bool,
}

struct Cluster {
    endpoints: Vec<Endpoint>,
    handles: Vec<ShutdownHandle>,
    threads: Vec<std::thread::JoinHandle<()>>,
    drainers: Vec<Arc<Drainer>>,
}

impl Cluster {
    fn start(args: &Args, dir: &Path, pfs: &Path, log: &Arc<WriteLog>) -> anyhow::Result<Cluster> {
        let endpoints: Vec<Endpoint> =
            (0..args.servers).map(|i| Endpoint::Unix(dir.join(format!("s{i}.sock")))).collect();
        let mut cluster = Cluster {
            endpoints: endpoints.clone(),
            handles: Vec::new(),
            threads: Vec::new(),
            drainers: Vec::new(),
        };
        // The PFS stand-in is marked as an administrator marks a PFS (drains check it).
        spillway_drain::pfs::mark_pfs(pfs)?;
        // One process, one key: every drainer computes the same staging names.
        let staging_key = spillway_drain::StagingKey::random();
        for i in 0..args.servers as usize {
            let ssd = dir.join(format!("s{i}-ssd"));
            let knobs = StoreKnobs {
                ssd_directory: ssd.display().to_string(),
                dram_bytes_max: dram_bytes(args),
                ssd_bytes_max: (args.total_bytes * 4).max(1 << 30),
                ..StoreKnobs::default()
            };
            let store = spillway_store::Store::open(&knobs)
                .with_context(|| format!("opening store {}", ssd.display()))?;
            let backend = Arc::new(StoreBackend::new(store));
            let server_knobs = ServerKnobs {
                server_name: format!("s{i}"),
                in_flight_requests_max: args.in_flight_requests,
                ..ServerKnobs::default()
            };
            let server = Server::bind(
                ServerOptions::from_knobs(&server_knobs),
                backend.clone(),
                &endpoints[i..=i],
                false,
            )?;
            let options = DrainerOptions {
                peers: endpoints.clone(),
                self_index: i,
                stripe_bytes: args.stripe_bytes,
                write_bytes_max: args.write_bytes,
                default_mode: DrainMode::Shuffled,
                drain_after_commit: false,
                ingest_bandwidth_share: 1.0,
                ingest_idle_after: spillway_drain::INGEST_IDLE_AFTER,
                retry_backoff_min: Duration::from_millis(50),
                retry_backoff_max: Duration::from_secs(1),
                queued_epochs_max: 16,
                quarantine_after_failures: 0,
                server_name: format!("s{i}"),
                staging_key: staging_key.clone(),
                munge_socket: None,
            };
            let pfs = Arc::new(PosixPfs::new(pfs).with_log(log.clone(), i as u32));
            let drainer = Arc::new(Drainer::start(options, backend, pfs, &ssd, None)?);
            server.attach_drain(drainer.clone());
            cluster.drainers.push(drainer);
            cluster.handles.push(server.shutdown_handle());
            cluster.threads.push(std::thread::spawn(move || {
                if let Err(e) = server.run() {
                    tracing::error!(error = %e, "bench server failed");
                }
            }));
        }
        Ok(cluster)
    }

    fn stop(self) {
        for d in &self.drainers {
            d.stop();
        }
        for h in &self.handles {
            h.shutdown();
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// DRAM log per server: `--dram-bytes`, or room for the server's share of the checkpoint
/// (records carry a 64-byte header per transfer) below the flusher's 75 % high watermark.
fn dram_bytes(args: &Args) -> u64 {
    args.dram_bytes.unwrap_or_else(|| {
        let share = args.total_bytes.div_ceil(args.servers as u64);
        let records = share + share / args.transfer_bytes.max(1) * 64;
        crate::dram_bytes_holding(records, 64 << 20)
    })
}

/// Deterministic content of block `b`.
fn fill_block(block: u64, buffer: &mut [u8]) {
    let mut x = block.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buffer.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// C client threads write the interleaved N-1 file and commit. Returns the seconds from the
/// first write to the last commit's return.
fn write_checkpoint(
    args: &Args,
    endpoints: &[Endpoint],
    epoch: EpochId,
    durability: Durability,
) -> anyhow::Result<f64> {
    let barrier = Arc::new(std::sync::Barrier::new(args.clients as usize + 1));
    let mut threads = Vec::new();
    for rank in 0..args.clients {
        let endpoints = endpoints.to_vec();
        let barrier = barrier.clone();
        let (total, transfer, clients) =
            (args.total_bytes, args.transfer_bytes, args.clients as u64);
        threads.push(std::thread::spawn(move || -> anyhow::Result<()> {
            let options = ClientOptions {
                placement: Placement::Local { rank },
                durability,
                window: 64,
                ..ClientOptions::default()
            };
            let mut client = Client::connect(&endpoints, options)?;
            client.begin_epoch(epoch);
            let mut file = client.create_file(epoch, "ckpt/shared.dat")?;
            let mut buffer = vec![0u8; transfer as usize];
            barrier.wait();
            let mut block = rank as u64;
            while block * transfer < total {
                let length = transfer.min(total - block * transfer) as usize;
                fill_block(block, &mut buffer[..length]);
                client.write(&mut file, block * transfer, &buffer[..length])?;
                block += clients;
            }
            client.flush()?;
            barrier.wait(); // the write phase ends for everybody (MPI barrier)
            client.commit_epoch(epoch)?;
            Ok(())
        }));
    }
    barrier.wait();
    let started = Instant::now();
    barrier.wait();
    for t in threads {
        t.join().map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The same bytes written directly to one file with fsync (C threads, each its blocks).
fn direct_checkpoint(args: &Args, path: &Path) -> anyhow::Result<f64> {
    use std::os::unix::fs::FileExt;
    let file = Arc::new(std::fs::File::create(path)?);
    let started = Instant::now();
    let mut threads = Vec::new();
    for rank in 0..args.clients as u64 {
        let file = file.clone();
        let (total, transfer, clients) =
            (args.total_bytes, args.transfer_bytes, args.clients as u64);
        threads.push(std::thread::spawn(move || -> std::io::Result<()> {
            let mut buffer = vec![0u8; transfer as usize];
            let mut block = rank;
            while block * transfer < total {
                let length = transfer.min(total - block * transfer) as usize;
                fill_block(block, &mut buffer[..length]);
                file.write_all_at(&buffer[..length], block * transfer)?;
                block += clients;
            }
            Ok(())
        }));
    }
    for t in threads {
        t.join().map_err(|_| anyhow::anyhow!("writer thread panicked"))??;
    }
    file.sync_all()?;
    let seconds = started.elapsed().as_secs_f64();
    std::fs::remove_file(path)?;
    Ok(seconds)
}

/// Sequential writes of `write_bytes` then fsync: the PFS bandwidth baseline.
fn sequential_baseline(args: &Args, path: &Path) -> anyhow::Result<f64> {
    let mut file = std::fs::File::create(path)?;
    let mut buffer = vec![0u8; args.write_bytes as usize];
    fill_block(7, &mut buffer);
    let started = Instant::now();
    let mut written = 0;
    while written < args.total_bytes {
        let n = args.write_bytes.min(args.total_bytes - written) as usize;
        file.write_all(&buffer[..n])?;
        written += n as u64;
    }
    file.sync_all()?;
    let seconds = started.elapsed().as_secs_f64();
    std::fs::remove_file(path)?;
    Ok(args.total_bytes as f64 / seconds)
}

struct DrainResult {
    seconds: f64,
    write_calls: u64,
    aligned_fraction: f64,
    lock_switches: u64,
    shuffle_s_max: f64,
    flush_s_max: f64,
}

/// Writes back every dirty page of the machine, so a measurement does not pay for the previous
/// one's writeback.
fn settle() {
    // SAFETY: sync(2) has no arguments and cannot fail.
    unsafe { libc::sync() };
}

fn drain(
    args: &Args,
    cluster: &Cluster,
    log: &WriteLog,
    epoch: EpochId,
    mode: DrainMode,
    pfs: &Path,
) -> anyhow::Result<DrainResult> {
    log.take();
    settle();
    let mut client = Client::connect(&cluster.endpoints, ClientOptions::default())?;
    let started = Instant::now();
    client.request_drain(epoch, mode.code())?;
    loop {
        let status = client.drain_status()?;
        let mine: Vec<_> =
            status.iter().filter_map(|(_, l)| l.iter().find(|d| d.epoch == epoch)).collect();
        if mine.len() == cluster.endpoints.len()
            && mine.iter().all(|d| d.state == DrainState::Drained)
        {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(3600),
            "drain of epoch {epoch} did not finish: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let seconds = started.elapsed().as_secs_f64();
    let status = client.drain_status()?;
    let mine: Vec<_> =
        status.iter().filter_map(|(_, l)| l.iter().find(|d| d.epoch == epoch).cloned()).collect();
    anyhow::ensure!(
        !log.truncated(),
        "PFS write log overflowed its bound; lock switches would be undercounted"
    );
    let entries = log.take();
    let final_path = pfs.join(format!("epoch-{}/ckpt/shared.dat", epoch.0));
    let size =
        std::fs::metadata(&final_path).with_context(|| format!("{}", final_path.display()))?.len();
    anyhow::ensure!(
        size == args.total_bytes,
        "PFS copy has {size} bytes, expected {}",
        args.total_bytes
    );
    Ok(DrainResult {
        seconds,
        write_calls: entries.len() as u64,
        aligned_fraction: spillway_drain::stripe_aligned_fraction(
            &entries,
            args.stripe_bytes,
            args.total_bytes,
        ),
        lock_switches: spillway_drain::lock_switches(&entries, args.stripe_bytes),
        shuffle_s_max: mine.iter().map(|d| d.shuffle_us).max().unwrap_or(0) as f64 / 1e6,
        flush_s_max: mine.iter().map(|d| d.flush_us).max().unwrap_or(0) as f64 / 1e6,
    })
}

/// Checks the drained PFS copy block by block against the written pattern.
fn verify(args: &Args, path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path)?;
    let (mut got, mut want) =
        (vec![0u8; args.transfer_bytes as usize], vec![0u8; args.transfer_bytes as usize]);
    let mut block = 0;
    while block * args.transfer_bytes < args.total_bytes {
        let length =
            args.transfer_bytes.min(args.total_bytes - block * args.transfer_bytes) as usize;
        file.read_exact_at(&mut got[..length], block * args.transfer_bytes)?;
        fill_block(block, &mut want[..length]);
        anyhow::ensure!(
            got[..length] == want[..length],
            "{}: block {block} differs from what was written",
            path.display()
        );
        block += 1;
    }
    Ok(())
}

/// One paired repeat: both drains with their own sequential baselines, and the checkpoint times.
struct Repeat {
    sequential_before_naive: f64,
    sequential_before_shuffled: f64,
    naive: DrainResult,
    shuffled: DrainResult,
    direct_s: f64,
    memory_s: f64,
    ssd_s: f64,
}

/// Checkpoints `epoch` at `memory` durability and `epoch + 1` at `ssd`, drains one naive and one
/// shuffled (in the given order), each right after its own sequential baseline, and verifies
/// and removes both PFS copies.
fn measure_repeat(
    args: &Args,
    cluster: &Cluster,
    log: &WriteLog,
    pfs: &Path,
    epoch: EpochId,
    shuffled_first: bool,
) -> anyhow::Result<Repeat> {
    // A sequential baseline right before the drain, the drain, then the PFS copy checked and
    // removed: (baseline bytes/s, drain result).
    let drain_paired = |epoch: EpochId, mode: DrainMode| -> anyhow::Result<(f64, DrainResult)> {
        settle();
        let sequential = sequential_baseline(args, &pfs.join("baseline.seq"))?;
        let result = drain(args, cluster, log, epoch, mode, pfs)?;
        let copy = pfs.join(format!("epoch-{}", epoch.0));
        verify(args, &copy.join("ckpt/shared.dat"))?;
        std::fs::remove_dir_all(&copy)?;
        Ok((sequential, result))
    };
    let (first, second) = if shuffled_first {
        (DrainMode::Shuffled, DrainMode::Naive)
    } else {
        (DrainMode::Naive, DrainMode::Shuffled)
    };
    settle();
    let direct_s = direct_checkpoint(args, &pfs.join("baseline.direct"))?;
    settle();
    let memory_s = write_checkpoint(args, &cluster.endpoints, epoch, Durability::Memory)?;
    let first_drain = drain_paired(epoch, first)?;
    settle();
    let ssd_epoch = EpochId(epoch.0 + 1);
    let ssd_s = write_checkpoint(args, &cluster.endpoints, ssd_epoch, Durability::Ssd)?;
    let second_drain = drain_paired(ssd_epoch, second)?;
    let ((sequential_before_naive, naive), (sequential_before_shuffled, shuffled)) =
        if shuffled_first { (second_drain, first_drain) } else { (first_drain, second_drain) };
    Ok(Repeat {
        sequential_before_naive,
        sequential_before_shuffled,
        naive,
        shuffled,
        direct_s,
        memory_s,
        ssd_s,
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    check_args(&args)?;
    let (dir, _temporary) = work_directory(&args)?;
    let repeats = measure_repeats(&args, &dir)?;
    let ratios = paired_ratios(&args, &repeats);
    if args.json {
        print_json(&args, &repeats, &ratios);
        return Ok(());
    }
    print_tables(&args, &repeats, &ratios);
    Ok(())
}

/// Refuses sizes that cannot describe a checkpoint or a shuffled drain.
fn check_args(args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.servers > 0 && args.clients > 0 && args.transfer_bytes > 0 && args.total_bytes > 0,
        "servers, clients and sizes must be positive"
    );
    anyhow::ensure!(
        args.write_bytes.is_multiple_of(args.stripe_bytes),
        "--write-bytes must be a multiple of --stripe-bytes"
    );
    Ok(())
}

/// `--dir`, or a fresh directory under /var/tmp and the guard that removes it when dropped.
fn work_directory(args: &Args) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    match &args.dir {
        Some(dir) => Ok((dir.clone(), None)),
        None => {
            let temporary =
                tempfile::Builder::new().prefix("spillway-egress-").tempdir_in("/var/tmp")?;
            Ok((temporary.path().to_path_buf(), Some(temporary)))
        }
    }
}

/// Starts the cluster, measures `--repeat` paired repeats (alternating drain order), stops it.
fn measure_repeats(args: &Args, dir: &Path) -> anyhow::Result<Vec<Repeat>> {
    let pfs = dir.join("pfs");
    std::fs::create_dir_all(&pfs)?;
    let log = Arc::new(WriteLog::new(
        ((args.total_bytes / args.transfer_bytes.min(args.stripe_bytes)) as usize + 1024)
            .min(64 << 20),
    ));
    let cluster = Cluster::start(args, dir, &pfs, &log)?;
    anyhow::ensure!(args.repeat > 0, "--repeat must be at least 1");
    let mut repeats = Vec::new();
    for r in 0..args.repeat as u64 {
        let shuffled_first = args.shuffled_first ^ (r % 2 == 1);
        repeats.push(measure_repeat(
            args,
            &cluster,
            &log,
            &pfs,
            EpochId(2 * r + 1),
            shuffled_first,
        )?);
    }
    cluster.stop();
    Ok(repeats)
}

/// Bytes per second in MiB per second.
fn mebibytes_per_second(bytes_per_second: f64) -> f64 {
    bytes_per_second / (1u64 << 20) as f64
}

impl DrainResult {
    /// Checkpoint bytes drained per second.
    fn bytes_per_second(&self, args: &Args) -> f64 {
        args.total_bytes as f64 / self.seconds
    }

    /// The drain's figures as JSON, its rate over the sequential baseline measured before it.
    fn to_json(&self, args: &Args, sequential_bytes_per_second: f64) -> serde_json::Value {
        let rate = self.bytes_per_second(args);
        serde_json::json!({
            "drain_s": self.seconds,
            "drain_mib_per_s": mebibytes_per_second(rate),
            "ratio_to_sequential": rate / sequential_bytes_per_second,
            "pfs_write_calls": self.write_calls,
            "stripe_aligned_fraction": self.aligned_fraction,
            "shuffle_s_max_per_server": self.shuffle_s_max,
            "flush_s_max_per_server": self.flush_s_max,
            "lock_switches": self.lock_switches,
        })
    }
}

impl Repeat {
    /// The shuffled drain's rate over its own sequential baseline.
    fn shuffled_vs_sequential(&self, args: &Args) -> f64 {
        self.shuffled.bytes_per_second(args) / self.sequential_before_shuffled
    }

    /// The repeat's figures as JSON, as `repeats` lists them.
    fn to_json(&self, args: &Args) -> serde_json::Value {
        serde_json::json!({
            "sequential_before_naive_mib_per_s": mebibytes_per_second(self.sequential_before_naive),
            "sequential_before_shuffled_mib_per_s": mebibytes_per_second(self.sequential_before_shuffled),
            "naive": self.naive.to_json(args, self.sequential_before_naive),
            "shuffled": self.shuffled.to_json(args, self.sequential_before_shuffled),
            "checkpoint_s": { "direct_fsync": self.direct_s, "spillway_memory": self.memory_s, "spillway_ssd": self.ssd_s },
        })
    }
}

/// The medians over the repeats of each paired ratio, by name.
fn paired_ratios(args: &Args, repeats: &[Repeat]) -> serde_json::Value {
    let rate = |d: &DrainResult| d.bytes_per_second(args);
    let median_of = |f: &dyn Fn(&Repeat) -> f64| median(repeats.iter().map(f));
    serde_json::json!({
        "shuffled_vs_sequential": median_of(&|r| r.shuffled_vs_sequential(args)),
        "naive_vs_sequential": median_of(&|r| rate(&r.naive) / r.sequential_before_naive),
        "shuffled_over_naive_throughput": median_of(&|r| rate(&r.shuffled) / rate(&r.naive)),
        "naive_over_shuffled_write_calls": median_of(&|r| r.naive.write_calls as f64 / r.shuffled.write_calls.max(1) as f64),
        "direct_over_spillway_checkpoint_time_memory": median_of(&|r| r.direct_s / r.memory_s),
        "direct_over_spillway_checkpoint_time_ssd": median_of(&|r| r.direct_s / r.ssd_s),
    })
}

/// The repeat whose shuffled ratio is the median.
fn typical_repeat<'a>(args: &Args, repeats: &'a [Repeat]) -> &'a Repeat {
    let mut order: Vec<usize> = (0..repeats.len()).collect();
    order.sort_by(|&a, &b| {
        repeats[a].shuffled_vs_sequential(args).total_cmp(&repeats[b].shuffled_vs_sequential(args))
    });
    &repeats[order[order.len() / 2]]
}

/// The whole run as one JSON object on stdout.
fn print_json(args: &Args, repeats: &[Repeat], ratios: &serde_json::Value) {
    // The figures of the repeat whose shuffled ratio is the median (tables show every repeat).
    let typical = typical_repeat(args, repeats);
    let lock_switches_max = |f: &dyn Fn(&Repeat) -> u64| repeats.iter().map(f).max().unwrap_or(0);
    let out = serde_json::json!({
        "config": {
            "servers": args.servers, "clients": args.clients, "total_bytes": args.total_bytes,
            "transfer_bytes": args.transfer_bytes, "stripe_bytes": args.stripe_bytes, "write_bytes": args.write_bytes,
            "dram_bytes_per_server": dram_bytes(args), "in_flight_requests_max": args.in_flight_requests,
        },
        "repeats": repeats.iter().map(|r| r.to_json(args)).collect::<Vec<_>>(),
        "sequential_baseline_mib_per_s": mebibytes_per_second(typical.sequential_before_shuffled),
        "naive": typical.naive.to_json(args, typical.sequential_before_naive),
        "shuffled": typical.shuffled.to_json(args, typical.sequential_before_shuffled),
        "checkpoint_s": { "direct_fsync": typical.direct_s, "spillway_memory": typical.memory_s, "spillway_ssd": typical.ssd_s },
        // The worst repeat: zero for shuffled means zero in every repeat.
        "lock_switches": { "naive": lock_switches_max(&|r| r.naive.lock_switches), "shuffled": lock_switches_max(&|r| r.shuffled.lock_switches) },
        "ratios": ratios,
    });
    println!("{out}");
}

/// The configuration, a table of every drain, one of every checkpoint, and the median ratios.
fn print_tables(args: &Args, repeats: &[Repeat], ratios: &serde_json::Value) {
    println!(
        "egress: S={} C={} file {} MiB, {} KiB interleaved transfers, stripe {} KiB, shuffled writes ≤ {} MiB, DRAM {} MiB/server",
        args.servers,
        args.clients,
        args.total_bytes >> 20,
        args.transfer_bytes >> 10,
        args.stripe_bytes >> 10,
        args.write_bytes >> 20,
        dram_bytes(args) >> 20
    );
    println!("{} paired repeats; each drain is compared with a sequential write+fsync of the same bytes measured just before it", repeats.len());
    println!();
    print_drain_table(args, repeats);
    println!();
    print_checkpoint_table(repeats);
    println!();
    println!("medians of the paired ratios:");
    for (name, value) in ratios.as_object().expect("an object") {
        println!("  {name}: {:.2}", value.as_f64().unwrap_or(f64::NAN));
    }
}

/// One row per drain of every repeat, next to the sequential baseline measured before it.
fn print_drain_table(args: &Args, repeats: &[Repeat]) {
    println!("| repeat | mode | sequential MiB/s | drain s | MiB/s | × sequential | PFS writes | stripe-aligned | shuffle s (max/server) | flush s (max/server) | lock switches |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (index, r) in repeats.iter().enumerate() {
        for (name, d, sequential) in [
            ("naive", &r.naive, r.sequential_before_naive),
            ("shuffled", &r.shuffled, r.sequential_before_shuffled),
        ] {
            let rate = d.bytes_per_second(args);
            println!(
                "| {} | {name} | {:.0} | {:.2} | {:.0} | {:.2} | {} | {:.3} | {:.2} | {:.2} | {} |",
                index + 1,
                mebibytes_per_second(sequential),
                d.seconds,
                mebibytes_per_second(rate),
                rate / sequential,
                d.write_calls,
                d.aligned_fraction,
                d.shuffle_s_max,
                d.flush_s_max,
                d.lock_switches
            );
        }
    }
}

/// One row per repeat: the direct checkpoint's time against Spillway's at each durability.
fn print_checkpoint_table(repeats: &[Repeat]) {
    println!("| repeat | direct to disk + fsync s | spillway memory s | direct ÷ memory | spillway ssd s | direct ÷ ssd |");
    println!("|---|---|---|---|---|---|");
    for (index, r) in repeats.iter().enumerate() {
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            index + 1,
            r.direct_s,
            r.memory_s,
            r.direct_s / r.memory_s,
            r.ssd_s,
            r.direct_s / r.ssd_s
        );
    }
}
