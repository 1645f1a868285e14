//! What the demo prints about the servers: their drains, epochs and space.

use std::time::{Duration, Instant};

use spillway_client::EpochSummary;
use spillway_drain::DrainMode;
use spillway_proto::{EpochState, ServerStatus};
use spillway_types::format_bytes;

use crate::watch::DrainWatch;

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
