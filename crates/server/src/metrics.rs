//! The server's Prometheus samples (docs/design/operations.md, "Metrics"): what `Status`
//! reports, the store's GC and write amplification, drain progress and lag, and request
//! latency by kind. Rendered at each scrape from the counters the server keeps anyway.

use std::sync::atomic::Ordering;

use spillway_metrics::{Exposition, Histogram};
use spillway_proto::{DrainState, EpochState, Request};

use crate::Shared;

/// Request kinds with a latency histogram of their own.
pub(crate) const REQUEST_KINDS: [&str; 5] = ["write", "read", "commit", "metadata", "other"];

/// Latency histograms, one per [`REQUEST_KINDS`].
#[derive(Default)]
pub(crate) struct Latency {
    by_kind: [Histogram; REQUEST_KINDS.len()],
}

impl Latency {
    pub(crate) fn observe(&self, kind: usize, elapsed: std::time::Duration) {
        self.by_kind[kind.min(REQUEST_KINDS.len() - 1)].observe(elapsed);
    }
}

/// The index in [`REQUEST_KINDS`] of a request.
pub(crate) fn request_kind(request: &Request) -> usize {
    match request {
        Request::Write { .. } | Request::WriteExtents { .. } | Request::WriteZeros { .. } => 0,
        Request::Read { .. } => 1,
        Request::Commit { .. } | Request::Sync { .. } => 2,
        Request::OpenFile { .. }
        | Request::ListEpochs { .. }
        | Request::ListFiles { .. }
        | Request::Stat { .. }
        | Request::Extents { .. } => 3,
        _ => 4,
    }
}

fn state_name(state: EpochState) -> &'static str {
    match state {
        EpochState::Open => "open",
        EpochState::CommittedMemory => "committed_memory",
        EpochState::Committed => "committed",
        EpochState::Drained => "drained",
    }
}

/// Every sample of this server now.
pub(crate) fn render(shared: &Shared) -> String {
    let mut out = Exposition::new();
    let counters = &shared.counters;
    out.counter(
        "spillway_server_ingest_bytes_total",
        "Payload bytes clients wrote to this server.",
        counters.bytes_written.load(Ordering::Relaxed),
    );
    out.counter(
        "spillway_server_read_bytes_total",
        "Payload bytes clients read from this server.",
        counters.bytes_read.load(Ordering::Relaxed),
    );
    out.counter(
        "spillway_server_requests_total",
        "Requests served.",
        counters.requests_served.load(Ordering::Relaxed),
    );
    out.gauge(
        "spillway_server_connections",
        "Identified client connections.",
        f64::from(shared.connections.load(Ordering::SeqCst)),
    );
    out.gauge(
        "spillway_server_in_flight_bytes",
        "Write payload bytes received and not yet in the store.",
        shared.budget.used() as f64,
    );
    let usage = shared.backend.usage();
    out.gauge(
        "spillway_server_dram_used_bytes",
        "DRAM log bytes in use.",
        usage.dram_bytes_used as f64,
    );
    out.gauge("spillway_server_dram_capacity_bytes", "DRAM log size.", usage.dram_bytes_max as f64);
    out.gauge(
        "spillway_server_ssd_used_bytes",
        "SSD log bytes in use.",
        usage.ssd_bytes_used as f64,
    );
    out.gauge("spillway_server_ssd_capacity_bytes", "SSD log size.", usage.ssd_bytes_max as f64);
    epochs(shared, &mut out);
    store(shared, &mut out);
    drains(shared, &mut out);
    let labels: Vec<[(&str, &str); 1]> =
        REQUEST_KINDS.iter().map(|kind| [("kind", *kind)]).collect();
    let series: Vec<(&[(&str, &str)], &Histogram)> =
        labels.iter().zip(&shared.latency.by_kind).map(|(l, h)| (&l[..], h)).collect();
    out.histogram_family(
        "spillway_server_request_duration_seconds",
        "From a request's arrival to its answer, by kind.",
        &series,
    );
    out.finish()
}

/// Epochs by state, and the drain lag: bytes committed here and not yet on the PFS.
fn epochs(shared: &Shared, out: &mut Exposition) {
    let Ok(epochs) = shared.backend.epochs() else { return };
    let states =
        [EpochState::Open, EpochState::CommittedMemory, EpochState::Committed, EpochState::Drained];
    let counts: Vec<(String, f64)> = states
        .iter()
        .map(|state| {
            let n = epochs.iter().filter(|e| e.state == *state).count();
            (state_name(*state).to_string(), n as f64)
        })
        .collect();
    let samples: Vec<([(&str, &str); 1], f64)> =
        counts.iter().map(|(state, n)| ([("state", state.as_str())], *n)).collect();
    let samples: Vec<(&[(&str, &str)], f64)> = samples.iter().map(|(l, n)| (&l[..], *n)).collect();
    out.gauge_family("spillway_server_epochs", "Epochs held, by state.", &samples);
    let lag: u64 = epochs
        .iter()
        .filter(|e| matches!(e.state, EpochState::CommittedMemory | EpochState::Committed))
        .map(|e| e.bytes)
        .sum();
    out.gauge(
        "spillway_server_drain_lag_bytes",
        "Bytes of committed epochs not yet drained to the PFS.",
        lag as f64,
    );
}

/// The store's log: GC and host write amplification.
fn store(shared: &Shared, out: &mut Exposition) {
    let Some(stats) = shared.backend.store_stats() else { return };
    out.gauge(
        "spillway_server_ssd_live_bytes",
        "Live bytes in SSD segments.",
        stats.ssd_live_bytes as f64,
    );
    out.gauge("spillway_server_ssd_segments", "SSD log segments.", stats.segments as f64);
    out.counter(
        "spillway_server_gc_segments_deleted_total",
        "SSD segments freed by GC.",
        stats.segments_deleted,
    );
    out.counter(
        "spillway_server_gc_compaction_bytes_total",
        "Record bytes copied by compaction.",
        stats.compaction_bytes,
    );
    out.counter(
        "spillway_server_ssd_written_bytes_total",
        "Bytes appended to SSD segment files.",
        stats.ssd_bytes_written,
    );
    out.gauge(
        "spillway_server_host_write_amplification",
        "SSD bytes written over user bytes spilled to SSD (1 before any spill).",
        stats.host_write_amplification,
    );
    out.counter("spillway_server_commits_total", "Epoch commits.", stats.commits);
    out.counter(
        "spillway_server_ssd_direct_written_bytes_total",
        "Bytes of ssd_written_bytes_total written around the page cache (O_DIRECT).",
        stats.ssd_direct_bytes_written,
    );
    out.counter("spillway_server_fsyncs_total", "fsync calls on the SSD log.", stats.fsyncs);
    out.counter(
        "spillway_server_fsyncs_shared_total",
        "Syncs and commit steps made durable by an fsync round another caller ran.",
        stats.fsyncs_shared,
    );
    out.counter(
        "spillway_server_sync_behind_rounds_total",
        "fsync rounds started in the background because store.ssd_sync_behind_bytes were unsynced.",
        stats.sync_behind_rounds,
    );
    out.gauge(
        "spillway_server_dram_cached_bytes",
        "DRAM ring bytes holding clean copies of records already on SSD (reads use them).",
        stats.dram_cached_bytes as f64,
    );
}

/// Drains: bytes written to the PFS, epochs by drain state.
fn drains(shared: &Shared, out: &mut Exposition) {
    let Some(drain) = shared.drain.get() else { return };
    out.counter(
        "spillway_server_drain_pfs_bytes_total",
        "Bytes this server wrote to the PFS for drains.",
        drain.pfs_bytes_written_total(),
    );
    let status = drain.status();
    let states = [
        DrainState::Queued,
        DrainState::Waiting,
        DrainState::Running,
        DrainState::Retrying,
        DrainState::Drained,
        DrainState::Quarantined,
    ];
    // The state names are DrainState's Display, as `spillway drain status` shows them.
    let names: Vec<String> = states.iter().map(ToString::to_string).collect();
    let samples: Vec<([(&str, &str); 1], f64)> = states
        .iter()
        .zip(&names)
        .map(|(state, name)| {
            let n = status.iter().filter(|d| d.state == *state).count();
            ([("state", name.as_str())], n as f64)
        })
        .collect();
    let samples: Vec<(&[(&str, &str)], f64)> = samples.iter().map(|(l, n)| (&l[..], *n)).collect();
    out.gauge_family(
        "spillway_server_drains",
        "Epoch drains the drainer knows, by state.",
        &samples,
    );
}
