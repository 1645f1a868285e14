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
//! 7. unmodified programs (cp, dd, Python) write through the FUSE mount of the servers and read
//!    their files back, before and after a remount (skipped without /dev/fuse);
//! 8. both servers get SIGTERM and must exit 0.
//!
//! Server processes are owned by [`spillway_harness::ServerProcess`] guards that SIGKILL and reap
//! them on drop, so no path out of [`run`] (error or panic) leaves a server behind; and they are
//! started with `PR_SET_PDEATHSIG = SIGKILL`, so even a demo killed by a signal takes its servers
//! with it. Any byte that does not verify, on the PFS or read back, makes [`run`] fail, hence a
//! non-zero exit.
//!
//! The modules hold what the steps share: the servers (`cluster`), what the ranks write
//! (`workload`), the watching of background work (`watch`), the checks (`verify`), the printing
//! (`report`) and step 7 (`mount`).

mod cluster;
mod mount;
mod report;
mod verify;
mod watch;
mod workload;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use spillway_drain::{chunk_writes, partition_domains, DrainMode};
use spillway_harness::ServerProcess;
use spillway_proto::{Durability, Endpoint, EpochState};
use spillway_types::{format_bytes, EpochId, MIB};

use crate::cluster::{
    admin, demo_server, drain_peers, log_tail, server_epochs, ssd_bytes, ssd_dir,
    DRAIN_STRIPE_BYTES, DRAIN_WRITE_BYTES_MAX, SERVER_NAMES, STOP_TIMEOUT, VICTIM,
};
use crate::mount::mount_step;
use crate::report::{gbps, ms_since, print_drain, print_epochs, print_status, state_name};
use crate::verify::{verify_epoch, verify_pfs_copy};
use crate::watch::{final_files, settled_use, space_used, wait_for, watch_drain, GC_WAIT};
use crate::workload::{
    rank_data, write_checkpoint, write_direct, CheckpointTiming, EpochPlan, Layout,
};

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
    let peers = drain_peers(&root);
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

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
