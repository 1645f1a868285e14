//! A trace replayed against a reservation shaped by performance targets (`spillway sim
//! --request`, issue 22, docs/design/targets.md §5b): the request is planned with
//! [`spillway_policy::targets::plan`] over a described pool — the function the manager uses —
//! and the trace is replayed through the two-level model ([`crate::model`]) with the burst
//! buffer level the plan's servers give, then compared with a reservation of the same capacity
//! asked by capacity alone.
//!
//! The reservation as one burst buffer level (rules, stated in the design document):
//!
//! - **Rates.** A reservation over `n` servers serves `n × (the least peak among them)` of
//!   bandwidth and IOPS (the even split of the planner: the slowest server sets the pace), and
//!   metadata at `n ×` the private peak in private mode, at the first server's striped peak in
//!   striped mode (one namespace on one server). That is the reservation *at its servers'
//!   peaks*, what a job gets when nothing else runs there. *At the promise* it gets what the
//!   plan promised (`Σ ⌈T / n⌉` on its servers), what is left to it when the pool is full of
//!   other promises; a dimension not asked for is then taken at the peaks.
//! - **Level.** The model's burst buffer has the reservation's bandwidth and IOPS as two
//!   separate rates, as the planner promises them: a request of `L` bytes costs the slower of
//!   the two, `max(1 / IOPS, L / bandwidth)` (so a run of equal requests meets both targets
//!   exactly when the reservation offers both). Metadata operations cost `1 / metadata rate`
//!   (taken out of the model, which would charge a latency).
//! - **Stage-in.** By default the chunks the trace reads before writing start resident (the
//!   reservation's stage-in ran before the job); `staged_in: false` reads them from the PFS on
//!   first use, as plain `spillway sim` does.
//! - **Pipelines.** A job of `pipelines` pipelines like the trace (as `characterize
//!   --pipelines`), all doing I/O at once: one pipeline is replayed with `1 / pipelines` of the
//!   reservation's rates and capacity, and the job's achieved rates are `pipelines ×` that
//!   pipeline's.
//! - **Capacity.** The plan's granted capacity (whole fragments); the model needs no more than
//!   the trace's access space, so it is capped there (a buffer that holds everything never
//!   evicts, however much larger it is).
//!
//! Pure: no I/O, no clock.

use serde::{Deserialize, Serialize};
use spillway_policy::fragments::ServerSpace;
use spillway_policy::namespace::NamespaceAccess;
use spillway_policy::targets::{
    format_bandwidth, plan, Rates, ServerLoad, ServerPeaks, TargetError, TargetParseError,
    TargetPlan, TargetRequest, Targets,
};
use spillway_trace::TraceOp;
use spillway_types::format_bytes;

use crate::characterize::Peaks;
use crate::model::{access_space, simulate, Level, SimConfig, SimConfigError, SimReport};

/// The keys a request may hold.
const KEYS: [&str; 4] = ["capacity", "bandwidth", "iops", "metadata"];

/// Why a request's text does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    #[error("unknown key(s) {} (known: capacity, bandwidth, iops, metadata)", quoted(.keys))]
    UnknownKeys { keys: Vec<String> },
    #[error("no target: give at least one of capacity=, bandwidth=, iops=, metadata=")]
    Empty,
    #[error(transparent)]
    Target(#[from] TargetParseError),
}

fn quoted(keys: &[String]) -> String {
    keys.iter().map(|key| format!("{key:?}")).collect::<Vec<_>>().join(", ")
}

/// Reads a request: the `key=value` targets of docs/design/targets.md, as `spillway
/// characterize --request` prints them — with or without its `#BB_LUA` prefix, or after a
/// DataWarp `#DW jobdw`. Every unknown key is named at once.
pub fn parse_request(text: &str) -> Result<Targets, RequestError> {
    let mut rest = text.trim();
    for prefix in ["#BB_LUA", "#DW jobdw", "#DW"] {
        if let Some(after) = rest.strip_prefix(prefix) {
            rest = after.trim_start();
            break;
        }
    }
    let mut unknown = Vec::new();
    let mut targets = Targets::default();
    for token in rest.split_whitespace() {
        match token.split_once('=') {
            Some((key, _)) if !KEYS.contains(&key) => unknown.push(key.to_string()),
            Some((key, value)) => targets.set(key, value)?,
            None => return Err(TargetParseError::NotKeyValue { token: token.to_string() }.into()),
        }
    }
    if !unknown.is_empty() {
        return Err(RequestError::UnknownKeys { keys: unknown });
    }
    if targets == Targets::default() {
        return Err(RequestError::Empty);
    }
    Ok(targets)
}

/// The pool a request is planned on: identical servers, each with the measured peaks of one
/// server (`spillway bench peaks`, as `spillway server measure` records them), some of them
/// already carrying promises.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    pub servers: u32,
    /// One server's peaks; its metadata rate stands for both namespace modes, as in the manager.
    pub peaks: Peaks,
    pub free_bytes_per_server: u64,
    pub fragment_bytes: u64,
    /// `manager.stripe_servers_max`.
    pub stripe_servers_max: u32,
    /// Rates already promised to other reservations on each of the first `promised_servers`.
    pub promised: Rates,
    pub promised_servers: u32,
}

impl Pool {
    /// The peaks as the manager records them: whole rates, at least 1; the one metadata rate
    /// for both modes (crates/manager/src/targets.rs, `peaks_of`).
    pub fn server_peaks(&self) -> ServerPeaks {
        let whole = |rate: f64| (rate.round() as u64).max(1);
        let metadata = whole(self.peaks.metadata_ops_per_second);
        ServerPeaks {
            bandwidth_bytes_per_s: whole(self.peaks.bandwidth_bytes_per_second),
            iops: whole(self.peaks.iops),
            metadata_striped_ops_per_s: metadata,
            metadata_private_ops_per_s: metadata,
        }
    }

    /// The servers as the planner sees them: ids 1 to `servers`, healthy, each on its own host.
    pub fn loads(&self) -> Vec<ServerLoad> {
        let peaks = self.server_peaks();
        (1..=u64::from(self.servers))
            .map(|id| ServerLoad {
                space: ServerSpace {
                    server: id,
                    free_bytes: self.free_bytes_per_server,
                    healthy: true,
                    domain: Some(format!("server{id}")),
                },
                peaks,
                promised: if id <= u64::from(self.promised_servers) {
                    self.promised
                } else {
                    Rates::default()
                },
            })
            .collect()
    }

    fn request(&self, targets: Targets) -> TargetRequest {
        TargetRequest {
            targets,
            fragment_bytes: self.fragment_bytes,
            stripe_servers_max: self.stripe_servers_max,
            replicas: 1,
        }
    }
}

/// How the replay runs: the model's PFS, chunk, policy and write-back (its burst buffer level
/// and capacity are the reservation's), and the pipelines of the job.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayOptions {
    pub base: SimConfig,
    pub pipelines: u32,
    /// The trace's inputs are in the burst buffer when it starts (stage-in ran); off, they
    /// are read from the PFS on first use.
    pub staged_in: bool,
}

/// Why a request cannot be replayed; the plan's errors worded as the manager words them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    #[error("targets cannot be met: {0}")]
    Never(TargetError),
    #[error("targets not available now: {0}")]
    Wait(TargetError),
    #[error("{0}")]
    Plan(TargetError),
    #[error("simulator configuration: {0}")]
    Model(#[from] SimConfigError),
    #[error("pipelines must be at least 1")]
    ZeroPipelines,
}

impl From<TargetError> for ReplayError {
    fn from(error: TargetError) -> Self {
        match error {
            TargetError::Never { .. } => ReplayError::Never(error),
            TargetError::Wait { .. } => ReplayError::Wait(error),
            other => ReplayError::Plan(other),
        }
    }
}

/// What a reservation serves the whole job, per second.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceRates {
    pub bandwidth_bytes_per_s: f64,
    pub iops: f64,
    pub metadata_ops_per_s: f64,
}

/// One target asked against what the replay achieved.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetCheck {
    /// `bandwidth`, `iops` or `metadata`.
    pub target: String,
    pub asked: u64,
    /// The job's rate over the replay's time in that class of operation; None when the trace
    /// has no such operation.
    pub achieved: Option<f64>,
    /// `achieved ≥ asked`; None when the trace has no such operation.
    pub met: Option<bool>,
}

/// One replay of the trace against one set of rates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Replay {
    /// The reservation's rates for the whole job.
    pub rates: ServiceRates,
    /// Data time plus metadata time, one pipeline (all run at once).
    pub io_time_seconds: f64,
    pub data_time_seconds: f64,
    pub metadata_time_seconds: f64,
    /// The job's rates: pipelines × one pipeline's.
    pub achieved: ServiceRates,
    /// Every rate target of the request (also for the capacity-only reservation).
    pub targets: Vec<TargetCheck>,
    /// The two-level model's report for one pipeline.
    pub model: SimReport,
}

impl Replay {
    /// Whether every target the trace exercises was met.
    pub fn all_met(&self) -> bool {
        self.targets.iter().all(|check| check.met != Some(false))
    }
}

/// A plan as the replay shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanSummary {
    pub asked: Targets,
    pub servers: Vec<u64>,
    pub stripe_count: u32,
    pub namespace: NamespaceAccess,
    pub fragments: u64,
    pub fragment_bytes: u64,
    pub capacity_bytes: u64,
    /// What each server (stripe order) takes on.
    pub promised_per_server: Vec<(u64, Rates)>,
    pub why: Vec<String>,
}

impl PlanSummary {
    fn of(asked: Targets, planned: &TargetPlan) -> PlanSummary {
        PlanSummary {
            asked,
            servers: planned.servers(),
            stripe_count: planned.stripe_count(),
            namespace: planned.namespace,
            fragments: planned.fragments.fragments,
            fragment_bytes: planned.fragments.fragment_bytes,
            capacity_bytes: planned.fragments.granted_bytes(),
            promised_per_server: planned.promised_per_server.clone(),
            why: planned.why.clone(),
        }
    }
}

/// A reservation's plan and the trace replayed against it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReservationReplay {
    pub plan: PlanSummary,
    /// The plan's servers at their peaks (nothing else running on them).
    pub at_peaks: Replay,
    /// At what the plan promised (the pool full of other promises); None when nothing was
    /// promised (capacity only).
    pub at_promise: Option<Replay>,
}

/// `spillway sim --request`'s answer: the reservation by targets, and one of the same
/// capacity by capacity alone (or why that could not be placed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestReplay {
    pub request: Targets,
    pub pipelines: u32,
    pub by_targets: ReservationReplay,
    /// The capacity of the capacity-only comparison: the request's `capacity=`, else the
    /// trace's file bytes × pipelines.
    pub capacity_only_bytes: u64,
    pub capacity_only: Option<ReservationReplay>,
    pub capacity_only_error: Option<String>,
}

/// Plans `request` on `pool` and replays `ops` (time-ordered: [`crate::model::time_ordered`])
/// against the plan, then against a capacity-only reservation of the same capacity.
pub fn replay_request(
    ops: &[TraceOp],
    request: &Targets,
    pool: &Pool,
    options: &ReplayOptions,
) -> Result<RequestReplay, ReplayError> {
    if options.pipelines == 0 {
        return Err(ReplayError::ZeroPipelines);
    }
    options.base.validate()?;
    let loads = pool.loads();
    let planned = plan(&loads, &pool.request(*request))?;
    let by_targets = replay_plan(ops, &loads, (request, &planned), request, options)?;
    let space = access_space(ops, options.base.chunk_bytes)?;
    let capacity_only_bytes = request
        .capacity_bytes
        .unwrap_or(space.file_bytes.saturating_mul(u64::from(options.pipelines)))
        .max(1);
    let capacity_request =
        Targets { capacity_bytes: Some(capacity_only_bytes), ..Targets::default() };
    let (capacity_only, capacity_only_error) = match plan(&loads, &pool.request(capacity_request)) {
        Ok(capacity_plan) => {
            let planned = (&capacity_request, &capacity_plan);
            (Some(replay_plan(ops, &loads, planned, request, options)?), None)
        }
        Err(error) => (None, Some(ReplayError::from(error).to_string())),
    };
    Ok(RequestReplay {
        request: *request,
        pipelines: options.pipelines,
        by_targets,
        capacity_only_bytes,
        capacity_only,
        capacity_only_error,
    })
}

/// The rates of a plan's servers at their peaks (the least peak sets the pace of an even
/// split; a striped namespace is its first server's).
pub fn rates_at_peaks(loads: &[ServerLoad], planned: &TargetPlan) -> ServiceRates {
    let servers = planned.servers();
    let peaks: Vec<ServerPeaks> = servers
        .iter()
        .filter_map(|id| loads.iter().find(|load| load.space.server == *id))
        .map(|load| load.peaks)
        .collect();
    let n = peaks.len() as f64;
    let least = |pick: fn(&ServerPeaks) -> u64| peaks.iter().map(pick).min().unwrap_or(0) as f64;
    let metadata = match planned.namespace {
        NamespaceAccess::Private => n * least(|p| p.metadata_private_ops_per_s),
        NamespaceAccess::Striped => {
            peaks.first().map_or(0, |p| p.metadata_striped_ops_per_s) as f64
        }
    };
    ServiceRates {
        bandwidth_bytes_per_s: n * least(|p| p.bandwidth_bytes_per_s),
        iops: n * least(|p| p.iops),
        metadata_ops_per_s: metadata,
    }
}

/// What the plan promised, dimension by dimension; a dimension not asked for at the peaks.
/// None when nothing was promised.
pub fn rates_at_promise(
    asked: &Targets,
    planned: &TargetPlan,
    peaks: ServiceRates,
) -> Option<ServiceRates> {
    if !asked.has_rates() {
        return None;
    }
    let sum = |pick: fn(&Rates) -> u64| {
        planned.promised_per_server.iter().map(|(_, rates)| pick(rates)).sum::<u64>() as f64
    };
    let or_peak = |asked: Option<u64>, promised: f64, peak: f64| match asked {
        Some(_) => promised,
        None => peak,
    };
    Some(ServiceRates {
        bandwidth_bytes_per_s: or_peak(
            asked.bandwidth_bytes_per_s,
            sum(|r| r.bandwidth_bytes_per_s),
            peaks.bandwidth_bytes_per_s,
        ),
        iops: or_peak(asked.iops, sum(|r| r.iops), peaks.iops),
        metadata_ops_per_s: or_peak(
            asked.metadata_ops_per_s,
            sum(|r| r.metadata_ops_per_s),
            peaks.metadata_ops_per_s,
        ),
    })
}

/// Replays `ops` against `planned` (made for `asked`), checking the rates of `request`.
fn replay_plan(
    ops: &[TraceOp],
    loads: &[ServerLoad],
    (asked, planned): (&Targets, &TargetPlan),
    request: &Targets,
    options: &ReplayOptions,
) -> Result<ReservationReplay, ReplayError> {
    let summary = PlanSummary::of(*asked, planned);
    let peaks = rates_at_peaks(loads, planned);
    let at_peaks = replay(ops, peaks, summary.capacity_bytes, request, options)?;
    let at_promise = match rates_at_promise(asked, planned, peaks) {
        Some(rates) => Some(replay(ops, rates, summary.capacity_bytes, request, options)?),
        None => None,
    };
    Ok(ReservationReplay { plan: summary, at_peaks, at_promise })
}

/// Replays one pipeline with `1 / pipelines` of `rates` and `capacity_bytes` (module rules).
pub fn replay(
    ops: &[TraceOp],
    rates: ServiceRates,
    capacity_bytes: u64,
    request: &Targets,
    options: &ReplayOptions,
) -> Result<Replay, ReplayError> {
    let pipelines = f64::from(options.pipelines.max(1));
    let bandwidth = rates.bandwidth_bytes_per_s / pipelines;
    let iops = rates.iops / pipelines;
    let metadata_rate = rates.metadata_ops_per_s / pipelines;
    let chunk = options.base.chunk_bytes.max(1);
    let space = access_space(ops, chunk)?;
    // A buffer holding the whole access space never evicts: cap there (the model's chunk map
    // has a limit), never below one chunk.
    let capacity = (capacity_bytes / u64::from(options.pipelines.max(1)))
        .min(space.bytes.max(chunk))
        .max(chunk);
    let config = SimConfig {
        burst_buffer: Level { bandwidth_bytes_per_second: bandwidth, latency_seconds: 0.0 },
        burst_buffer_ops_per_second: Some(iops),
        capacity_bytes: capacity,
        staged_in: options.staged_in,
        ..options.base.clone()
    };
    let model = simulate(ops, &config)?;
    // Metadata operations cost nothing in the model (no latency): their time is their rate's.
    let metadata_ops = model.metadata_ops as f64;
    let data_time = model.io_time_seconds;
    let metadata_time = if metadata_ops > 0.0 { metadata_ops / metadata_rate } else { 0.0 };
    let per =
        |amount: f64, seconds: f64| if seconds > 0.0 { pipelines * amount / seconds } else { 0.0 };
    let achieved = ServiceRates {
        bandwidth_bytes_per_s: per((model.bytes_read + model.bytes_written) as f64, data_time),
        iops: per(model.data_ops as f64, data_time),
        metadata_ops_per_s: per(metadata_ops, metadata_time),
    };
    let check = |target: &str, asked: Option<u64>, achieved: f64, exercised: bool| {
        asked.map(|asked| TargetCheck {
            target: target.to_string(),
            asked,
            achieved: exercised.then_some(achieved),
            met: exercised.then_some(achieved >= asked as f64 * (1.0 - 1e-9)),
        })
    };
    let data = model.data_ops > 0 && data_time > 0.0;
    let targets = [
        check("bandwidth", request.bandwidth_bytes_per_s, achieved.bandwidth_bytes_per_s, data),
        check("iops", request.iops, achieved.iops, data),
        check(
            "metadata",
            request.metadata_ops_per_s,
            achieved.metadata_ops_per_s,
            metadata_ops > 0.0,
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    Ok(Replay {
        rates,
        io_time_seconds: data_time + metadata_time,
        data_time_seconds: data_time,
        metadata_time_seconds: metadata_time,
        achieved,
        targets,
        model,
    })
}

// ---------------------------------------------------------------------------------------------
// Text output.

fn bandwidth_text(bytes_per_s: f64) -> String {
    format!("{}/s", format_bytes(bytes_per_s.max(0.0) as u64))
}

fn ops_text(rate: f64) -> String {
    if rate >= 10_000.0 {
        format!("{:.1}k", rate / 1000.0)
    } else {
        format!("{rate:.0}")
    }
}

/// A plan in a few lines: servers, namespace, fragments, promises, reasons.
pub fn plan_text(title: &str, plan: &PlanSummary) -> String {
    let mut text = format!(
        "{title} ({}): {} server(s) {:?}, {} namespace, {} fragment(s) of {} = {}\n",
        plan.asked,
        plan.stripe_count,
        plan.servers,
        plan.namespace,
        plan.fragments,
        format_bytes(plan.fragment_bytes),
        format_bytes(plan.capacity_bytes),
    );
    let rates_text = |rates: &Rates| {
        format!(
            "{} bandwidth, {} IOPS, {} metadata ops/s",
            format_bandwidth(rates.bandwidth_bytes_per_s),
            rates.iops,
            rates.metadata_ops_per_s
        )
    };
    let promised: Vec<&Rates> = plan.promised_per_server.iter().map(|(_, r)| r).collect();
    if let Some(&first) =
        promised.first().filter(|_| promised.iter().any(|r| **r != Rates::default()))
    {
        if promised.iter().all(|r| *r == first) {
            text += &format!("  promised on each server: {}\n", rates_text(first));
        } else {
            let others = promised.get(1).copied().unwrap_or(first);
            text += &format!(
                "  promised on server {}: {}; on each other: {}\n",
                plan.servers.first().copied().unwrap_or(0),
                rates_text(first),
                rates_text(others)
            );
        }
    }
    for why in &plan.why {
        text += &format!("  why: {why}\n");
    }
    text
}

/// The replays side by side: one column each, one row per quantity.
pub fn replay_table(result: &RequestReplay) -> String {
    let targets = &result.by_targets;
    let mut columns: Vec<(String, u32, &Replay)> =
        vec![("targets at peaks".to_string(), targets.plan.stripe_count, &targets.at_peaks)];
    if let Some(promise) = &targets.at_promise {
        columns.push(("targets at promise".to_string(), targets.plan.stripe_count, promise));
    }
    if let Some(capacity) = &result.capacity_only {
        columns.push(("capacity only".to_string(), capacity.plan.stripe_count, &capacity.at_peaks));
    }
    let mut rows: Vec<(String, Vec<String>)> = vec![
        ("servers".to_string(), columns.iter().map(|c| c.1.to_string()).collect()),
        row("reservation bandwidth", &columns, |r| bandwidth_text(r.rates.bandwidth_bytes_per_s)),
        row("reservation IOPS", &columns, |r| ops_text(r.rates.iops)),
        row("reservation metadata ops/s", &columns, |r| ops_text(r.rates.metadata_ops_per_s)),
        row("I/O time (s)", &columns, |r| format!("{:.6}", r.io_time_seconds)),
        row("  data (s)", &columns, |r| format!("{:.6}", r.data_time_seconds)),
        row("  metadata (s)", &columns, |r| format!("{:.6}", r.metadata_time_seconds)),
    ];
    for (index, check) in result.by_targets.at_peaks.targets.iter().enumerate() {
        let asked = match check.target.as_str() {
            "bandwidth" => bandwidth_text(check.asked as f64),
            _ => ops_text(check.asked as f64),
        };
        let label = format!("{} achieved (asked {asked})", check.target);
        rows.push(row(&label, &columns, |r| {
            let Some(check) = r.targets.get(index) else { return "-".to_string() };
            match (check.achieved, check.met) {
                (Some(rate), Some(met)) => {
                    let value = if check.target == "bandwidth" {
                        bandwidth_text(rate)
                    } else {
                        ops_text(rate)
                    };
                    format!("{value} {}", if met { "met" } else { "MISSED" })
                }
                _ => "no such ops".to_string(),
            }
        }));
    }
    let width = rows.iter().map(|(label, _)| label.chars().count()).max().unwrap_or(0);
    let cell = columns
        .iter()
        .map(|(title, _, _)| title.len())
        .chain(rows.iter().flat_map(|(_, cells)| cells.iter().map(|c| c.chars().count())))
        .max()
        .unwrap_or(0);
    let mut text = format!("{:width$}", "");
    for (title, _, _) in &columns {
        text += &format!("  {title:>cell$}");
    }
    text.push('\n');
    for (label, cells) in rows {
        text += &format!("{label:width$}");
        for value in cells {
            text += &format!("  {value:>cell$}");
        }
        text.push('\n');
    }
    text
}

fn row(
    label: &str,
    columns: &[(String, u32, &Replay)],
    value: impl Fn(&Replay) -> String,
) -> (String, Vec<String>) {
    (label.to_string(), columns.iter().map(|(_, _, replay)| value(replay)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SimConfig;
    use spillway_trace::Op;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn op(op: Op, file: u32, offset: u64, length: u64) -> TraceOp {
        TraceOp { time_ns: 0, duration_ns: 0, offset, length, rank: 0, file, op }
    }

    /// Eight servers of 800 MiB/s, 50k IOPS, 20k metadata ops/s; fragments of 64 MiB.
    fn pool() -> Pool {
        Pool {
            servers: 8,
            peaks: Peaks {
                bandwidth_bytes_per_second: (800 * MIB) as f64,
                iops: 50_000.0,
                metadata_ops_per_second: 20_000.0,
            },
            free_bytes_per_server: 100 * 64 * MIB,
            fragment_bytes: 64 * MIB,
            stripe_servers_max: 8,
            promised: Rates::default(),
            promised_servers: 0,
        }
    }

    fn options() -> ReplayOptions {
        ReplayOptions { base: SimConfig::reedbush(MIB), pipelines: 1, staged_in: true }
    }

    /// 64 MiB written in 8 MiB transfers, then read back; an open and a close.
    fn bandwidth_trace() -> Vec<TraceOp> {
        let mut ops = vec![op(Op::Open, 0, 0, 0)];
        for pass in [Op::Write, Op::Read] {
            ops.extend((0..8).map(|i| op(pass, 0, i * 8 * MIB, 8 * MIB)));
        }
        ops.push(op(Op::Close, 0, 0, 0));
        ops
    }

    /// 30,000 creates, stats and unlinks over 10,000 files, one 4 KiB write each.
    fn metadata_trace() -> Vec<TraceOp> {
        let mut ops = Vec::new();
        for file in 0..10_000 {
            ops.push(op(Op::Create, file, 0, 0));
            ops.push(op(Op::Write, file, 0, 4096));
            ops.push(op(Op::Stat, file, 0, 0));
        }
        ops
    }

    #[test]
    fn requests_parse_with_or_without_a_directive_prefix_and_name_unknown_keys() {
        let expected: Targets = "capacity=4800MiB bandwidth=2GiB/s".parse().unwrap();
        for text in [
            "capacity=4800MiB bandwidth=2GiB/s",
            "#BB_LUA capacity=4800MiB bandwidth=2GiB/s\n",
            "#DW jobdw capacity=4800MiB bandwidth=2GiB/s",
        ] {
            assert_eq!(parse_request(text), Ok(expected), "{text}");
        }
        let error = parse_request("#BB_LUA pool=fast bandwidth=1GiB/s access=private").unwrap_err();
        assert_eq!(
            error.to_string(),
            "unknown key(s) \"pool\", \"access\" (known: capacity, bandwidth, iops, metadata)"
        );
        assert!(parse_request("bandwidth=2GiB").unwrap_err().to_string().contains("not a rate"));
        assert_eq!(parse_request("#BB_LUA"), Err(RequestError::Empty));
    }

    #[test]
    fn a_bandwidth_bound_trace_gets_more_servers_and_less_io_time_than_capacity_only() {
        let ops = bandwidth_trace();
        // 64 MiB (one fragment) holds the trace; 5 GiB/s needs ⌈5120 / 800⌉ = 7 servers.
        let request: Targets = "capacity=64MiB bandwidth=5GiB/s".parse().unwrap();
        let result = replay_request(&ops, &request, &pool(), &options()).unwrap();
        let targets = &result.by_targets;
        let capacity = result.capacity_only.as_ref().unwrap();
        assert_eq!(targets.plan.stripe_count, 7);
        assert_eq!(targets.plan.capacity_bytes, 7 * 64 * MIB, "at least a fragment per server");
        assert_eq!(capacity.plan.stripe_count, 1, "one fragment, one server");
        assert_eq!(result.capacity_only_bytes, 64 * MIB);
        assert_eq!(targets.at_peaks.rates.bandwidth_bytes_per_s, (7 * 800 * MIB) as f64);
        assert!(
            targets.at_peaks.io_time_seconds * 3.0 < capacity.at_peaks.io_time_seconds,
            "{} vs {}",
            targets.at_peaks.io_time_seconds,
            capacity.at_peaks.io_time_seconds
        );
        let bandwidth = &targets.at_peaks.targets[0];
        assert_eq!((bandwidth.target.as_str(), bandwidth.asked), ("bandwidth", 5 * GIB));
        assert_eq!(bandwidth.met, Some(true), "{bandwidth:?}");
        assert_eq!(capacity.at_peaks.targets[0].met, Some(false), "800 MiB/s < 5 GiB/s");
        // At the promise (⌈5 GiB/s / 7⌉ on each) the job gets its 5 GiB/s, less the latencies.
        let promise = targets.at_promise.as_ref().unwrap();
        assert!(promise.rates.bandwidth_bytes_per_s >= (5 * GIB) as f64);
        assert!(promise.io_time_seconds > targets.at_peaks.io_time_seconds);
        assert!(capacity.at_promise.is_none(), "capacity alone is promised nothing");
        // Twice the pipelines on the same reservation: each gets half, the job the same.
        let two = ReplayOptions { pipelines: 2, ..options() };
        let shared = replay_request(&ops, &request, &pool(), &two).unwrap();
        let (one, both) = (&result.by_targets.at_peaks, &shared.by_targets.at_peaks);
        assert!(both.io_time_seconds > 1.9 * one.io_time_seconds);
        let ratio = both.achieved.bandwidth_bytes_per_s / one.achieved.bandwidth_bytes_per_s;
        assert!((ratio - 1.0).abs() < 0.01, "{ratio}");
    }

    #[test]
    fn a_metadata_bound_trace_gets_private_namespaces() {
        let ops = metadata_trace();
        let request: Targets = "metadata=50k/s".parse().unwrap();
        let result = replay_request(&ops, &request, &pool(), &options()).unwrap();
        let targets = &result.by_targets;
        assert_eq!(targets.plan.namespace, NamespaceAccess::Private);
        assert_eq!(targets.plan.stripe_count, 3, "⌈50k / 20k⌉");
        assert_eq!(targets.at_peaks.rates.metadata_ops_per_s, 60_000.0);
        assert_eq!(targets.at_peaks.model.metadata_ops, 20_000);
        let capacity = result.capacity_only.as_ref().unwrap();
        assert_eq!(capacity.plan.namespace, NamespaceAccess::Striped);
        assert_eq!(capacity.at_peaks.rates.metadata_ops_per_s, 20_000.0);
        // 20,000 metadata operations: 1/3 s private on 3 servers, 1 s on one striped namespace.
        assert!((targets.at_peaks.metadata_time_seconds - 1.0 / 3.0).abs() < 1e-9);
        assert!((capacity.at_peaks.metadata_time_seconds - 1.0).abs() < 1e-9);
        let metadata = &targets.at_peaks.targets[0];
        assert_eq!(metadata.met, Some(true));
        assert_eq!(capacity.at_peaks.targets[0].met, Some(false));
        let promise = targets.at_promise.as_ref().unwrap();
        assert_eq!(promise.rates.metadata_ops_per_s, 3.0 * 16_667.0);
        assert!(promise.all_met(), "{:?}", promise.targets);
    }

    #[test]
    fn a_request_beyond_the_pool_is_never_and_promises_make_it_wait() {
        let ops = bandwidth_trace();
        let too_much: Targets = "bandwidth=8GiB/s".parse().unwrap();
        let error = replay_request(&ops, &too_much, &pool(), &options()).unwrap_err();
        assert!(matches!(error, ReplayError::Never(_)), "{error}");
        assert_eq!(
            error.to_string(),
            "targets cannot be met: never: bandwidth 8.0 GiB/s asked, at most 6.2 GiB/s from 8 server(s) even with nothing else promised on the pool"
        );
        let busy = Pool {
            promised: Rates { bandwidth_bytes_per_s: 700 * MIB, ..Rates::default() },
            promised_servers: 6,
            ..pool()
        };
        let error = replay_request(&ops, &"bandwidth=2GiB/s".parse().unwrap(), &busy, &options())
            .unwrap_err();
        assert!(matches!(error, ReplayError::Wait(_)), "{error}");
        assert!(error.to_string().starts_with("targets not available now: not now: bandwidth"));
    }

    #[test]
    fn the_table_shows_each_reservation_and_each_target() {
        let request: Targets = "capacity=8MiB bandwidth=3GiB/s".parse().unwrap();
        let result = replay_request(&bandwidth_trace(), &request, &pool(), &options()).unwrap();
        let table = replay_table(&result);
        assert!(table.contains("targets at peaks"), "{table}");
        assert!(table.contains("capacity only"), "{table}");
        assert!(table.contains("bandwidth achieved (asked 3.0 GiB/s)"), "{table}");
        assert!(table.contains("MISSED"), "{table}");
        let plan = plan_text("by targets", &result.by_targets.plan);
        assert!(plan.contains("4 server(s) [1, 2, 3, 4], striped namespace"), "{plan}");
        assert!(plan.contains("why: bandwidth 3.0 GiB/s: striped over 4 server(s)"), "{plan}");
    }
}
