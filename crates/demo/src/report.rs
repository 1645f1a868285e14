//! What the demo prints: its header, the figures of each step (timings, timelines, drains,
//! recovery) and the servers' epochs and space, in the shapes `make demo` shows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use spillway_client::EpochSummary;
use spillway_drain::DrainMode;
use spillway_proto::{EpochState, ServerStatus};
use spillway_types::{format_bytes, EpochId};

use crate::cluster::ssd_bytes;
use crate::demo::DrainOverlap;
use crate::watch::DrainWatch;
use crate::workload::{CheckpointTiming, EpochPlan};
use crate::Args;

/// The demo's opening lines: servers, ranks, sizes and where its files go.
pub(crate) fn print_intro(args: &Args, root: &Path) {
    let ranks = args.ranks;
    println!(
        "Spillway demo: 2 burst buffer servers, {ranks} client ranks, a checkpoint over 4 epochs"
    );
    println!(
        "  per server: DRAM tier {} (spills to SSD above the high watermark), SSD log {} in segments of {}",
        format_bytes(args.dram_bytes),
        format_bytes(ssd_bytes(args)),
        format_bytes(args.segment_bytes)
    );
    println!(
        "  per epoch: {ranks} ranks x {} = {} in {} writes; working directory {}",
        format_bytes(args.rank_bytes),
        format_bytes(ranks as u64 * args.rank_bytes),
        format_bytes(args.transfer_bytes),
        root.display()
    );
    println!();
}

/// One epoch of step 2: spillway's time as the application saw it against the direct write.
pub(crate) fn print_checkpoint(
    plan: &EpochPlan,
    ranks: u32,
    epoch_bytes: u64,
    timing: &CheckpointTiming,
    direct: Duration,
) {
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
}

/// Step 3's timeline, in ms after `plan`'s commit returned to the application at `committed`.
pub(crate) fn print_overlap_timeline(
    plan: &EpochPlan,
    committed: Instant,
    overlap: &DrainOverlap,
    ranks: u32,
    epoch_bytes: u64,
) {
    let DrainOverlap { queued, watch, writes } = overlap;
    let at = |instant: Instant| ms_since(committed, instant);
    println!("   timeline (ms after epoch {}'s commit returned to the application):", plan.epoch.0);
    println!(
        "     {:>7.0}  drain of epoch {} requested (queued on {queued} servers, journaled)",
        at(watch.requested),
        plan.epoch.0
    );
    println!("     {:>7.0}  epoch 4 writes start ({} from {ranks} ranks, once the application has computed them)", at(writes.started), format_bytes(epoch_bytes));
    println!("     {:>7.0}  epoch 4 writes acknowledged", at(writes.started + writes.write));
    if let Some(published) = watch.published {
        println!("     {:>7.0}  {} complete under its final PFS name (staging file fsync'd, renamed, directory fsync'd)", at(published), plan.file_name(0));
    }
    println!("     {:>7.0}  epoch {} drained on every server", at(watch.drained), plan.epoch.0);
}

/// Step 3's drain throughput against the application's while it overlapped epoch 4's writes;
/// `idle_write` is the write phase of an epoch written with no drain running.
pub(crate) fn print_overlap_throughput(
    overlap: &DrainOverlap,
    epoch_bytes: u64,
    idle_write: Duration,
) {
    let DrainOverlap { watch, writes, .. } = overlap;
    let drain_time = watch.drained - watch.requested;
    println!(
        "   drain: {} in {:.0} ms = {:.2} GB/s, while the application wrote epoch 4 at {:.2} GB/s (epoch 2 with no drain running: {:.2} GB/s)",
        format_bytes(epoch_bytes),
        drain_time.as_secs_f64() * 1e3,
        gbps(epoch_bytes, drain_time),
        gbps(epoch_bytes, writes.write),
        gbps(epoch_bytes, idle_write)
    );
    let busy_ms = watch
        .infos
        .iter()
        .map(|(_, d)| (d.shuffle_us + d.flush_us) as f64 / 1e3)
        .fold(0.0, f64::max);
    if writes.started < watch.drained {
        println!(
            "   (each server was busy shuffling + flushing at most {busy_ms:.0} ms of it; the rest is the drainer yielding to epoch 4's ingest (drain.ingest_bandwidth_share) and waiting for its peer's part)"
        );
    } else {
        println!(
            "   (the drain finished before epoch 4's first write: nothing overlapped this time)"
        );
    }
}

/// Step 4's timeline, in ms after the drain request, events in the order they happened.
pub(crate) fn print_idle_timeline(plan: &EpochPlan, watch: &DrainWatch, ranks: u32) {
    println!("   timeline (ms after the request):");
    let mut events: Vec<(Instant, String)> =
        vec![(watch.drained, format!("epoch {} drained on every server", plan.epoch.0))];
    if let Some(published) = watch.published {
        events.push((
            published,
            format!(
                "all {ranks} files under their final PFS names (each fsync'd before its rename)"
            ),
        ));
    }
    match watch.freed {
        Some(freed) => events.push((freed, "first space freed by GC (each server frees only after its own files are published: checked at every poll)".to_string())),
        None => println!("   (no segment held only epoch {} data: nothing freed yet; compaction reclaims it at low free space)", plan.epoch.0),
    }
    events.sort_by_key(|(at, _)| *at);
    for (at, what) in &events {
        println!("     {:>7.0}  {what}", ms_since(watch.requested, *at));
    }
}

/// The victim's epochs before the kill and after the restart, side by side (step 5).
pub(crate) fn print_recovery(
    victim_name: &str,
    before: &BTreeMap<EpochId, (EpochState, u64)>,
    after: &BTreeMap<EpochId, (EpochState, u64)>,
) {
    println!("   what recovery found on {victim_name} (before the kill -> after the restart):");
    for epoch in before.keys().chain(after.keys()).collect::<BTreeSet<_>>() {
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
}

pub(crate) fn ms_since(origin: Instant, at: Instant) -> f64 {
    at.saturating_duration_since(origin).as_secs_f64() * 1e3
}

pub(crate) fn print_drain(names: &[&str], watch: &DrainWatch) {
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

pub(crate) fn gbps(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64().max(1e-9) / 1e9
}

pub(crate) fn state_name(state: EpochState) -> &'static str {
    match state {
        EpochState::Open => "open (uncommitted)",
        EpochState::CommittedMemory => "committed in DRAM (SSD catching up)",
        EpochState::Committed => "committed, durable on SSD",
        EpochState::Drained => "drained",
    }
}

pub(crate) fn print_status(statuses: &[ServerStatus]) {
    for status in statuses {
        println!(
            "     {:<4} on {:<10} DRAM {:>9} / {:<9}  SSD {:>9} / {:<9}  {} epochs, {} written, {} read",
            status.server_name,
            status.failure_domain,
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

pub(crate) fn print_epochs(epochs: &[EpochSummary]) {
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
