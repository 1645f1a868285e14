//! `spillway sim ias`: several jobs' I/O phases replayed over a model of the three tiers
//! (node-local NVM, shared burst buffer, PFS) under each IAS tiering strategy, so that a center
//! can try a strategy before turning it on.
//!
//! The decisions are not re-implemented here: at every phase start the model builds the
//! [`TierSnapshot`] the manager would see and asks [`choose_tier`]; drains of the burst buffer go
//! to the PFS when [`next_drains`] lets them. Those are the functions the daemons call, so the
//! simulator predicts what they do. The model itself (docs/design/ias.md, "Simulator"):
//!
//! - Discrete events, deterministic: flows (a phase, a drain, a move) have remaining bytes and a
//!   rate that is constant between events; an event is a flow finishing, a job starting or a
//!   job's compute ending. No wall clock; randomness only in the seeded start offsets.
//! - A shared tier (burst buffer, PFS) with `w` concurrent writers delivers
//!   `B_eff(w) = B / (1 + α·max(0, w − knee))` in aggregate, split max-min fairly among them (a
//!   node-local move is also capped by its nodes' local bandwidth). Node-local is private to a
//!   job's nodes: `nodes × B_local`, no interference.
//! - A job's I/O time for a phase is the time from the phase's start until its bytes are in the
//!   destination tier; background drains (burst buffer → PFS) and moves (node-local → a shared
//!   tier) are not part of it. The run ends when every job finished and every byte reached the
//!   PFS (the makespan).

use std::fmt::Write as _;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize, Serializer};

use spillway_policy::tiering::{
    choose_tier, next_drains, DrainWait, PhaseRequest, Strategy, Tier, TierChoice, TierLoad,
    TierSnapshot,
};
use spillway_trace::{Op, Trace, TraceOp};
use spillway_types::format_bytes;

const GIB: u64 = 1 << 30;

/// Weight of a new sample in the observed-bandwidth moving average (`measured`'s input):
/// `bw ← bw + (sample − bw) / 4`, the first sample taken as is.
pub const BANDWIDTH_EWMA_WEIGHT: f64 = 0.25;

/// Most phases one simulation may replay (bounds time and memory for absurd inputs).
pub const PHASES_MAX: u64 = 1_000_000;

/// The storage system: three tiers, the interference model and the drain limit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IasConfig {
    /// Aggregate bandwidth of the shared burst buffer with few writers, bytes/s.
    pub bb_bandwidth_bytes_per_s: u64,
    /// Aggregate bandwidth of the PFS with few writers, bytes/s.
    pub pfs_bandwidth_bytes_per_s: u64,
    /// Bandwidth of one compute node's local device, bytes/s.
    pub local_bandwidth_bytes_per_s: u64,
    /// Capacity of one compute node's local device, bytes (0: no node-local tier).
    pub local_capacity_bytes: u64,
    /// Processes per compute node: a job of `p` processes has `⌈p / this⌉` nodes.
    pub processes_per_node: u32,
    /// PFS writers (drains plus jobs' direct phases) above which no drain starts.
    pub pfs_writers_max: u32,
    /// Interference: each writer beyond the knee divides a shared tier's aggregate bandwidth by
    /// a further `α` (see [`effective_bandwidth`]).
    pub interference_alpha: f64,
    /// Writers a shared tier takes at full aggregate bandwidth.
    pub interference_knee: u32,
}

impl Default for IasConfig {
    /// A small center in the proportions of the IAS testbed: a burst buffer four times faster
    /// than the PFS, node-local NVMe per node as fast as the PFS as a whole.
    fn default() -> Self {
        IasConfig {
            bb_bandwidth_bytes_per_s: 8 * GIB,
            pfs_bandwidth_bytes_per_s: 2 * GIB,
            local_bandwidth_bytes_per_s: 2 * GIB,
            local_capacity_bytes: 256 * GIB,
            processes_per_node: 32,
            pfs_writers_max: 4,
            interference_alpha: 0.2,
            interference_knee: 2,
        }
    }
}

/// Why a simulation cannot run.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum IasError {
    #[error("{what} must be at least 1")]
    Zero { what: &'static str },
    #[error("interference alpha must be finite and at least 0 (got {0})")]
    Alpha(f64),
    #[error("I/O ratio must be in (0, 1] (got {0})")]
    IoRatio(f64),
    #[error("{what} must be finite and at least 0 (got {value})")]
    Seconds { what: &'static str, value: f64 },
    #[error("no jobs to simulate")]
    NoJobs,
    #[error("{phases} phases in all, more than the simulator's limit of {limit}")]
    TooManyPhases { phases: u64, limit: u64 },
    #[error("job {job} has a phase of 0 bytes")]
    EmptyPhase { job: String },
    #[error("trace {name} has no write with a length: no I/O phase to simulate")]
    NoWrites { name: String },
}

/// Aggregate bandwidth of a shared tier of nominal `bandwidth` with `writers` concurrent
/// writers: `bandwidth / (1 + alpha × max(0, writers − knee))`.
pub fn effective_bandwidth(bandwidth: f64, writers: u32, alpha: f64, knee: u32) -> f64 {
    bandwidth / (1.0 + alpha * f64::from(writers.saturating_sub(knee)))
}

impl IasConfig {
    pub fn validate(&self) -> Result<(), IasError> {
        for (what, value) in [
            ("burst buffer bandwidth", self.bb_bandwidth_bytes_per_s),
            ("PFS bandwidth", self.pfs_bandwidth_bytes_per_s),
            ("node-local bandwidth", self.local_bandwidth_bytes_per_s),
            ("processes per node", u64::from(self.processes_per_node)),
            ("PFS writers max", u64::from(self.pfs_writers_max)),
        ] {
            if value == 0 {
                return Err(IasError::Zero { what });
            }
        }
        if !(self.interference_alpha.is_finite() && self.interference_alpha >= 0.0) {
            return Err(IasError::Alpha(self.interference_alpha));
        }
        Ok(())
    }

    fn nodes(&self, processes: u32) -> u64 {
        u64::from(processes.max(1).div_ceil(self.processes_per_node.max(1)))
    }
}

/// One step of a job: compute, then an I/O phase writing `bytes`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepSpec {
    pub compute_seconds: f64,
    pub bytes: u64,
}

/// A job: when it starts (seconds from the simulation's start) and its steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    pub processes: u32,
    pub start_seconds: f64,
    pub steps: Vec<StepSpec>,
}

/// IAS's synthetic benchmark: `jobs` jobs alternating compute and an I/O phase `steps` times.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyntheticWorkload {
    pub jobs: u32,
    pub steps: u32,
    /// Fraction of a job's standalone run time spent in I/O when it writes alone to the burst
    /// buffer: compute per step = `t_io × (1 − r) / r`, `t_io = phase_bytes / B_eff(1)`.
    pub io_ratio: f64,
    pub phase_bytes: u64,
    pub processes: u32,
    /// Start offsets are drawn uniformly from `[0, spread)` with `seed`. `None`: one standalone
    /// step (`t_io / r`); 0: every job starts at once (fully overlapping).
    pub start_spread_seconds: Option<f64>,
    pub seed: u64,
}

impl Default for SyntheticWorkload {
    /// The IAS experiments: two jobs of 32 processes writing 1 GiB per process per phase.
    fn default() -> Self {
        SyntheticWorkload {
            jobs: 2,
            steps: 5,
            io_ratio: 0.5,
            phase_bytes: 32 * GIB,
            processes: 32,
            start_spread_seconds: None,
            seed: 1,
        }
    }
}

/// The jobs of a synthetic workload on `config` (which sets the standalone I/O time).
pub fn synthetic_jobs(
    workload: &SyntheticWorkload,
    config: &IasConfig,
) -> Result<Vec<JobSpec>, IasError> {
    config.validate()?;
    for (what, value) in [
        ("jobs", u64::from(workload.jobs)),
        ("steps", u64::from(workload.steps)),
        ("phase bytes", workload.phase_bytes),
        ("processes", u64::from(workload.processes)),
    ] {
        if value == 0 {
            return Err(IasError::Zero { what });
        }
    }
    let ratio = workload.io_ratio;
    if !(ratio.is_finite() && ratio > 0.0 && ratio <= 1.0) {
        return Err(IasError::IoRatio(ratio));
    }
    let phases = u64::from(workload.jobs) * u64::from(workload.steps);
    if phases > PHASES_MAX {
        return Err(IasError::TooManyPhases { phases, limit: PHASES_MAX });
    }
    let alone = effective_bandwidth(
        config.bb_bandwidth_bytes_per_s as f64,
        1,
        config.interference_alpha,
        config.interference_knee,
    );
    let io_seconds = workload.phase_bytes as f64 / alone;
    let compute_seconds = io_seconds * (1.0 - ratio) / ratio;
    let spread = workload.start_spread_seconds.unwrap_or(io_seconds / ratio);
    if !(spread.is_finite() && spread >= 0.0) {
        return Err(IasError::Seconds { what: "start spread", value: spread });
    }
    let mut rng = ChaCha8Rng::seed_from_u64(workload.seed);
    Ok((0..workload.jobs)
        .map(|index| JobSpec {
            name: format!("job-{index}"),
            processes: workload.processes,
            start_seconds: if spread > 0.0 { rng.gen_range(0.0..spread) } else { 0.0 },
            steps: vec![
                StepSpec { compute_seconds, bytes: workload.phase_bytes };
                workload.steps as usize
            ],
        })
        .collect())
}

/// One write phase found in a trace: nanoseconds since the job's start, bytes written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracePhase {
    pub start_ns: u64,
    pub end_ns: u64,
    pub bytes: u64,
}

/// A trace's write phases: writes (with a length) in time order, a new phase after an `Fsync`
/// (a commit ends a phase) or when a write starts more than `gap_ns` after the previous write
/// of the phase ended. Reads and other metadata neither start nor end phases.
pub fn write_phases(ops: &[TraceOp], gap_ns: u64) -> Vec<TracePhase> {
    let mut ordered: Vec<&TraceOp> = ops
        .iter()
        .filter(|op| (op.op == Op::Write && op.length > 0) || op.op == Op::Fsync)
        .collect();
    ordered.sort_by_key(|op| op.time_ns);
    let mut phases: Vec<TracePhase> = Vec::new();
    let mut open: Option<TracePhase> = None;
    for op in ordered {
        if op.op == Op::Fsync {
            phases.extend(open.take());
            continue;
        }
        let end = op.time_ns.saturating_add(op.duration_ns);
        match &mut open {
            Some(phase) if op.time_ns <= phase.end_ns.saturating_add(gap_ns) => {
                phase.end_ns = phase.end_ns.max(end);
                phase.bytes = phase.bytes.saturating_add(op.length);
            }
            _ => {
                phases.extend(open.take());
                open = Some(TracePhase { start_ns: op.time_ns, end_ns: end, bytes: op.length });
            }
        }
    }
    phases.extend(open);
    phases
}

/// A trace as one job: its write phases (see [`write_phases`]), the compute before each the
/// trace time since the previous phase ended (the first: since the job's start), its process
/// count from the header. It starts at `start_seconds`.
pub fn trace_job(
    trace: &Trace,
    name: &str,
    gap_seconds: f64,
    start_seconds: f64,
) -> Result<JobSpec, IasError> {
    if !(gap_seconds.is_finite() && gap_seconds >= 0.0) {
        return Err(IasError::Seconds { what: "phase gap", value: gap_seconds });
    }
    let phases = write_phases(&trace.ops, (gap_seconds * 1e9) as u64);
    if phases.is_empty() {
        return Err(IasError::NoWrites { name: name.to_string() });
    }
    let mut previous_end = 0;
    let steps = phases
        .iter()
        .map(|phase| {
            let compute_ns = phase.start_ns.saturating_sub(previous_end);
            previous_end = previous_end.max(phase.end_ns);
            StepSpec { compute_seconds: compute_ns as f64 / 1e9, bytes: phase.bytes }
        })
        .collect();
    Ok(JobSpec {
        name: name.to_string(),
        processes: trace.meta.nprocs.max(1),
        start_seconds,
        steps,
    })
}

/// Which call of [`choose_tier`] a decision records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecisionKind {
    /// A phase starts: where it writes.
    Phase,
    /// The phase was sent to node-local but does not fit the node's free space: asked again
    /// with no local room, the whole phase goes where this answer says.
    Spill,
    /// Node-local data waits to move on (its job computing): asked with no local room; a
    /// `NodeLocalFull` answer means both shared tiers are busy, and the move waits.
    Move,
}

/// The [`PhaseRequest`] of a decision (serializable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RequestRecord {
    pub expected_bytes: u64,
    pub node_local_free_bytes: u64,
    pub node_local_bandwidth_bytes_per_s: u64,
}

impl RequestRecord {
    pub fn request(&self) -> PhaseRequest {
        PhaseRequest {
            expected_bytes: self.expected_bytes,
            node_local_free_bytes: self.node_local_free_bytes,
            node_local_bandwidth_bytes_per_s: self.node_local_bandwidth_bytes_per_s,
        }
    }
}

impl From<PhaseRequest> for RequestRecord {
    fn from(request: PhaseRequest) -> Self {
        RequestRecord {
            expected_bytes: request.expected_bytes,
            node_local_free_bytes: request.node_local_free_bytes,
            node_local_bandwidth_bytes_per_s: request.node_local_bandwidth_bytes_per_s,
        }
    }
}

/// A stable name for a [`TierChoice`] (reports, JSON): `burst-buffer-below-half`,
/// `fixed(pfs)`, `fastest-shared(burst-buffer)`, …
pub fn choice_label(choice: TierChoice) -> String {
    match choice {
        TierChoice::Fixed(tier) => format!("fixed({})", tier.name()),
        TierChoice::BurstBufferBelowHalf => "burst-buffer-below-half".into(),
        TierChoice::PfsBelowHalf => "pfs-below-half".into(),
        TierChoice::BothBusy => "both-busy".into(),
        TierChoice::FastestShared(tier) => format!("fastest-shared({})", tier.name()),
        TierChoice::SharedCongested => "shared-congested".into(),
        TierChoice::NodeLocalFull(tier) => format!("node-local-full({})", tier.name()),
        TierChoice::Unmeasured(tier) => format!("unmeasured({})", tier.name()),
    }
}

fn serialize_choice<S: Serializer>(choice: &TierChoice, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&choice_label(*choice))
}

/// One call of [`choose_tier`] by the simulator: its inputs, its answer, what the model did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decision {
    pub time_seconds: f64,
    /// Index into the jobs.
    pub job: usize,
    /// The job's step (for a move: the next step the job will run).
    pub step: usize,
    pub kind: DecisionKind,
    pub snapshot: TierSnapshot,
    pub request: RequestRecord,
    #[serde(serialize_with = "serialize_choice")]
    pub choice: TierChoice,
    /// Where the bytes went; `None`: a move that waits, or a phase re-asked by a `Spill`.
    pub tier: Option<Tier>,
}

/// One job under one strategy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobResult {
    pub name: String,
    /// Sum over the job's phases of phase start → bytes absorbed by the destination tier.
    pub io_time_seconds: f64,
    /// When its last phase was absorbed.
    pub finish_seconds: f64,
    pub phases_node_local: u32,
    pub phases_burst_buffer: u32,
    pub phases_pfs: u32,
    /// Phases sent to node-local that did not fit and went to a shared tier.
    pub spills: u32,
    pub bytes_written: u64,
}

/// One strategy's run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StrategyReport {
    pub strategy: Strategy,
    pub jobs: Vec<JobResult>,
    /// Mean over jobs of their I/O time.
    pub average_io_time_seconds: f64,
    /// When the last job finished its last phase.
    pub jobs_done_seconds: f64,
    /// When every byte had reached the PFS (≥ `jobs_done_seconds`).
    pub makespan_seconds: f64,
    pub bytes_written: u64,
    /// Bytes on the PFS at the end (equals `bytes_written`: conservation).
    pub bytes_on_pfs: u64,
    /// Bytes drained burst buffer → PFS.
    pub bytes_drained: u64,
    /// Bytes moved node-local → a shared tier.
    pub bytes_moved: u64,
    /// Most drains running at once, at any event (≤ `pfs_writers_max`).
    pub max_drains_running: u32,
    /// Most PFS writers (drains plus direct phases and moves) right after drains started.
    pub max_pfs_writers_at_drain_start: u32,
    /// Observed aggregate bandwidth at the end (the moving averages `measured` uses).
    pub observed_bb_bandwidth_bytes_per_s: u64,
    pub observed_pfs_bandwidth_bytes_per_s: u64,
    pub events: u64,
    /// Every call of `choose_tier`, in order (the CLI prints them only on request).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<Decision>,
}

/// Average I/O time of one strategy over another's (`None`: one of them not run, or 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Ratios {
    pub ia_over_hp_io_time: Option<f64>,
    pub ia_over_baseline_io_time: Option<f64>,
    pub measured_over_ia_io_time: Option<f64>,
}

/// A job as simulated (the same under every strategy).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobSummary {
    pub name: String,
    pub processes: u32,
    pub nodes: u64,
    pub start_seconds: f64,
    pub phases: usize,
    pub bytes: u64,
    pub compute_seconds: f64,
}

/// Every strategy's run over the same jobs and system.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IasReport {
    pub config: IasConfig,
    pub jobs: Vec<JobSummary>,
    pub strategies: Vec<StrategyReport>,
    pub ratios: Ratios,
}

impl IasReport {
    pub fn strategy(&self, strategy: Strategy) -> Option<&StrategyReport> {
        self.strategies.iter().find(|report| report.strategy == strategy)
    }
}

/// Runs `jobs` on `config` once per strategy.
pub fn compare_strategies(
    jobs: &[JobSpec],
    config: &IasConfig,
    strategies: &[Strategy],
) -> Result<IasReport, IasError> {
    let mut reports = Vec::new();
    for &strategy in strategies {
        reports.push(simulate_strategy(jobs, config, strategy)?);
    }
    let average = |strategy: Strategy| {
        reports
            .iter()
            .find(|report| report.strategy == strategy)
            .map(|report| report.average_io_time_seconds)
    };
    let ratio = |over: Strategy, under: Strategy| match (average(over), average(under)) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let ratios = Ratios {
        ia_over_hp_io_time: ratio(Strategy::InterferenceAware, Strategy::HighPriority),
        ia_over_baseline_io_time: ratio(Strategy::InterferenceAware, Strategy::Baseline),
        measured_over_ia_io_time: ratio(Strategy::Measured, Strategy::InterferenceAware),
    };
    let summaries = jobs
        .iter()
        .map(|job| JobSummary {
            name: job.name.clone(),
            processes: job.processes,
            nodes: config.nodes(job.processes),
            start_seconds: job.start_seconds,
            phases: job.steps.len(),
            bytes: job.steps.iter().map(|step| step.bytes).sum(),
            compute_seconds: job.steps.iter().map(|step| step.compute_seconds).sum(),
        })
        .collect();
    Ok(IasReport { config: config.clone(), jobs: summaries, strategies: reports, ratios })
}

fn validate_jobs(jobs: &[JobSpec]) -> Result<(), IasError> {
    if jobs.is_empty() {
        return Err(IasError::NoJobs);
    }
    let phases: u64 = jobs.iter().map(|job| job.steps.len() as u64).sum();
    if phases > PHASES_MAX {
        return Err(IasError::TooManyPhases { phases, limit: PHASES_MAX });
    }
    for job in jobs {
        if !(job.start_seconds.is_finite() && job.start_seconds >= 0.0) {
            return Err(IasError::Seconds { what: "job start", value: job.start_seconds });
        }
        for step in &job.steps {
            if step.bytes == 0 {
                return Err(IasError::EmptyPhase { job: job.name.clone() });
            }
            if !(step.compute_seconds.is_finite() && step.compute_seconds >= 0.0) {
                return Err(IasError::Seconds {
                    what: "compute time",
                    value: step.compute_seconds,
                });
            }
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlowKind {
    /// A job's I/O phase (the job waits for it).
    Phase,
    /// Burst buffer → PFS.
    Drain,
    /// Node-local → a shared tier.
    Move,
}

#[derive(Clone, Debug)]
struct Flow {
    kind: FlowKind,
    job: usize,
    /// Destination.
    tier: Tier,
    bytes: u64,
    remaining: f64,
    /// Most this flow can take, bytes/s (a move: the nodes' local bandwidth).
    cap: f64,
    rate: f64,
    started: f64,
    /// The destination tier's absorbed-bytes counter when the flow started.
    absorbed_at_start: f64,
}

#[derive(Clone, Debug, Default)]
struct JobState {
    started: bool,
    finished: bool,
    finish: f64,
    next_step: usize,
    in_phase: bool,
    phase_start: f64,
    next_phase_at: Option<f64>,
    last_phase_bytes: u64,
    /// On the node-local devices (written, not yet moved away), including bytes being moved.
    local_bytes: u64,
    /// On node-local and not yet in a move.
    local_pending: u64,
    move_running: bool,
    /// In the burst buffer and not yet in a drain.
    bb_pending: u64,
    drain_running: bool,
    /// Arrival order of the waiting drain, while one waits.
    drain_seq: Option<u64>,
    result: JobResult,
}

fn tier_index(tier: Tier) -> usize {
    match tier {
        Tier::NodeLocal => 0,
        Tier::BurstBuffer => 1,
        Tier::Pfs => 2,
    }
}

struct Model<'a> {
    jobs: &'a [JobSpec],
    config: &'a IasConfig,
    strategy: Strategy,
    now: f64,
    flows: Vec<Flow>,
    state: Vec<JobState>,
    /// Bytes each tier has absorbed so far (fractional while flows run).
    absorbed: [f64; 3],
    /// Observed aggregate bandwidth per shared tier (index as `absorbed`), bytes/s.
    observed: [u64; 3],
    drain_seq: u64,
    report: StrategyReport,
}

/// Runs `jobs` on `config` under one strategy.
pub fn simulate_strategy(
    jobs: &[JobSpec],
    config: &IasConfig,
    strategy: Strategy,
) -> Result<StrategyReport, IasError> {
    config.validate()?;
    validate_jobs(jobs)?;
    let state = jobs
        .iter()
        .map(|job| JobState {
            result: JobResult { name: job.name.clone(), ..JobResult::default() },
            ..JobState::default()
        })
        .collect();
    let model = Model {
        jobs,
        config,
        strategy,
        now: 0.0,
        flows: Vec::new(),
        state,
        absorbed: [0.0; 3],
        observed: [0; 3],
        drain_seq: 0,
        report: StrategyReport {
            strategy,
            jobs: Vec::new(),
            average_io_time_seconds: 0.0,
            jobs_done_seconds: 0.0,
            makespan_seconds: 0.0,
            bytes_written: 0,
            bytes_on_pfs: 0,
            bytes_drained: 0,
            bytes_moved: 0,
            max_drains_running: 0,
            max_pfs_writers_at_drain_start: 0,
            observed_bb_bandwidth_bytes_per_s: 0,
            observed_pfs_bandwidth_bytes_per_s: 0,
            events: 0,
            decisions: Vec::new(),
        },
    };
    Ok(model.run())
}

impl Default for JobResult {
    fn default() -> Self {
        JobResult {
            name: String::new(),
            io_time_seconds: 0.0,
            finish_seconds: 0.0,
            phases_node_local: 0,
            phases_burst_buffer: 0,
            phases_pfs: 0,
            spills: 0,
            bytes_written: 0,
        }
    }
}

impl Model<'_> {
    fn run(mut self) -> StrategyReport {
        loop {
            self.report.events += 1;
            self.start_jobs();
            self.start_phases();
            self.start_moves();
            self.start_drains();
            self.assign_rates();
            let Some(next) = self.next_event() else {
                break;
            };
            self.advance(next);
        }
        self.finish()
    }

    fn nodes(&self, job: usize) -> u64 {
        self.config.nodes(self.jobs[job].processes)
    }

    fn local_bandwidth(&self, job: usize) -> u64 {
        self.config.local_bandwidth_bytes_per_s.saturating_mul(self.nodes(job))
    }

    fn local_free(&self, job: usize) -> u64 {
        self.config
            .local_capacity_bytes
            .saturating_mul(self.nodes(job))
            .saturating_sub(self.state[job].local_bytes)
    }

    fn start_jobs(&mut self) {
        for (index, job) in self.jobs.iter().enumerate() {
            let state = &mut self.state[index];
            if state.started || job.start_seconds > self.now {
                continue;
            }
            state.started = true;
            match job.steps.first() {
                Some(step) => state.next_phase_at = Some(job.start_seconds + step.compute_seconds),
                None => {
                    state.finished = true;
                    state.finish = job.start_seconds;
                }
            }
        }
    }

    /// What the manager knows now: active jobs, and per shared tier the jobs' phases writing
    /// it (Algorithm 1's counts: drains and moves are background traffic the scheduler holds
    /// back, not jobs), the remaining bytes of every flow into it (the queue `measured` sees),
    /// the observed bandwidth.
    fn snapshot(&self) -> TierSnapshot {
        let active_jobs =
            self.state.iter().filter(|state| state.started && !state.finished).count() as u32;
        let load = |tier: Tier| {
            let flows = self.flows.iter().filter(|flow| flow.tier == tier);
            TierLoad {
                concurrent_jobs: flows
                    .clone()
                    .filter(|flow| matches!(flow.kind, FlowKind::Phase))
                    .count() as u32,
                queued_bytes: flows.map(|flow| flow.remaining.max(0.0).ceil() as u64).sum(),
                bandwidth_bytes_per_s: self.observed[tier_index(tier)],
            }
        };
        TierSnapshot { active_jobs, burst_buffer: load(Tier::BurstBuffer), pfs: load(Tier::Pfs) }
    }

    fn decide(
        &mut self,
        job: usize,
        step: usize,
        kind: DecisionKind,
        request: PhaseRequest,
    ) -> (TierChoice, usize) {
        let snapshot = self.snapshot();
        let choice = choose_tier(self.strategy, &snapshot, &request);
        self.report.decisions.push(Decision {
            time_seconds: self.now,
            job,
            step,
            kind,
            snapshot,
            request: request.into(),
            choice,
            tier: Some(choice.tier()),
        });
        (choice, self.report.decisions.len() - 1)
    }

    fn start_phases(&mut self) {
        for job in 0..self.jobs.len() {
            if self.state[job].next_phase_at.is_none_or(|at| at > self.now) {
                continue;
            }
            let step = self.state[job].next_step;
            let bytes = self.jobs[job].steps[step].bytes;
            let request = PhaseRequest {
                expected_bytes: self.state[job].last_phase_bytes,
                node_local_free_bytes: self.local_free(job),
                node_local_bandwidth_bytes_per_s: self.local_bandwidth(job),
            };
            let (choice, index) = self.decide(job, step, DecisionKind::Phase, request);
            let mut tier = choice.tier();
            if tier == Tier::NodeLocal && bytes > request.node_local_free_bytes {
                // The phase does not fit the node: the daemon would get ENOSPC and re-ask with
                // no local room; the whole phase goes to the shared tier it names.
                self.report.decisions[index].tier = None;
                let full = PhaseRequest { node_local_free_bytes: 0, ..request };
                let (again, _) = self.decide(job, step, DecisionKind::Spill, full);
                tier = again.tier();
                assert_ne!(tier, Tier::NodeLocal, "no local room, yet node-local chosen");
                self.state[job].result.spills += 1;
            }
            let state = &mut self.state[job];
            state.in_phase = true;
            state.phase_start = self.now;
            state.next_phase_at = None;
            let result = &mut state.result;
            match tier {
                Tier::NodeLocal => {
                    result.phases_node_local += 1;
                    state.local_bytes += bytes;
                }
                Tier::BurstBuffer => result.phases_burst_buffer += 1,
                Tier::Pfs => result.phases_pfs += 1,
            }
            self.start_flow(FlowKind::Phase, job, tier, bytes, f64::INFINITY);
        }
    }

    fn start_flow(&mut self, kind: FlowKind, job: usize, tier: Tier, bytes: u64, cap: f64) {
        self.flows.push(Flow {
            kind,
            job,
            tier,
            bytes,
            remaining: bytes as f64,
            cap,
            rate: 0.0,
            started: self.now,
            absorbed_at_start: self.absorbed[tier_index(tier)],
        });
    }

    /// Node-local data of a job that is not in an I/O phase moves on, all of it in one move,
    /// to the shared tier `choose_tier` names when asked with no local room — unless the answer
    /// is `NodeLocalFull` (both shared tiers busy) and some shared flow is running, in which
    /// case it waits for the next event.
    fn start_moves(&mut self) {
        for job in 0..self.jobs.len() {
            let state = &self.state[job];
            if state.local_pending == 0 || state.move_running || state.in_phase {
                continue;
            }
            let request = PhaseRequest {
                expected_bytes: state.local_pending,
                node_local_free_bytes: 0,
                node_local_bandwidth_bytes_per_s: self.local_bandwidth(job),
            };
            let step = state.next_step;
            let (choice, index) = self.decide(job, step, DecisionKind::Move, request);
            let shared_busy = self.flows.iter().any(|flow| flow.tier != Tier::NodeLocal);
            if matches!(choice, TierChoice::NodeLocalFull(_)) && shared_busy {
                self.report.decisions[index].tier = None;
                continue;
            }
            let tier = choice.tier();
            assert_ne!(tier, Tier::NodeLocal, "a move asked with no local room stays local");
            let state = &mut self.state[job];
            let bytes = std::mem::take(&mut state.local_pending);
            state.move_running = true;
            let cap = self.local_bandwidth(job) as f64;
            self.start_flow(FlowKind::Move, job, tier, bytes, cap);
        }
    }

    fn count_flows(&self, tier: Tier, kinds: &[FlowKind]) -> u32 {
        self.flows.iter().filter(|flow| flow.tier == tier && kinds.contains(&flow.kind)).count()
            as u32
    }

    /// Waiting drains (one per job with undrained burst buffer bytes, none running) go out as
    /// `next_drains` says. The model has no burst buffer capacity, so no drain is urgent.
    fn start_drains(&mut self) {
        let mut waiting: Vec<(usize, DrainWait)> = self
            .state
            .iter()
            .enumerate()
            .filter_map(|(job, state)| {
                state.drain_seq.map(|queued_seq| {
                    (job, DrainWait { queued_seq, burst_buffer_fill_permille: 0 })
                })
            })
            .collect();
        waiting.sort_by_key(|(_, wait)| wait.queued_seq);
        let limit = self.config.pfs_writers_max;
        let pfs_phase_jobs = self.count_flows(Tier::Pfs, &[FlowKind::Phase, FlowKind::Move]);
        let mut drains_running = self.count_flows(Tier::Pfs, &[FlowKind::Drain]);
        if !waiting.is_empty() {
            let waits: Vec<DrainWait> = waiting.iter().map(|(_, wait)| *wait).collect();
            let started = next_drains(&waits, drains_running, pfs_phase_jobs, limit);
            for &index in &started {
                let job = waiting[index].0;
                let state = &mut self.state[job];
                let bytes = std::mem::take(&mut state.bb_pending);
                state.drain_seq = None;
                state.drain_running = true;
                self.start_flow(FlowKind::Drain, job, Tier::Pfs, bytes, f64::INFINITY);
                drains_running += 1;
            }
            if !started.is_empty() {
                let writers = drains_running + pfs_phase_jobs;
                assert!(
                    writers <= limit.max(1),
                    "drains started past the PFS writer limit: {writers} writers, limit {limit}"
                );
                let peak = &mut self.report.max_pfs_writers_at_drain_start;
                *peak = (*peak).max(writers);
            }
        }
        assert!(
            drains_running <= limit.max(1),
            "{drains_running} drains running, PFS writer limit {limit}"
        );
        self.report.max_drains_running = self.report.max_drains_running.max(drains_running);
    }

    /// Node-local flows run at their nodes' bandwidth; each shared tier's interference-degraded
    /// aggregate is split max-min fairly (capped flows leave their surplus to the others).
    fn assign_rates(&mut self) {
        let config = self.config;
        for tier in Tier::ALL {
            let mut members: Vec<usize> =
                (0..self.flows.len()).filter(|&i| self.flows[i].tier == tier).collect();
            if tier == Tier::NodeLocal {
                for index in members {
                    let job = self.flows[index].job;
                    self.flows[index].rate = self.local_bandwidth(job) as f64;
                }
                continue;
            }
            let nominal = match tier {
                Tier::BurstBuffer => config.bb_bandwidth_bytes_per_s,
                _ => config.pfs_bandwidth_bytes_per_s,
            } as f64;
            let mut left = effective_bandwidth(
                nominal,
                members.len() as u32,
                config.interference_alpha,
                config.interference_knee,
            );
            members.sort_by(|&a, &b| self.flows[a].cap.total_cmp(&self.flows[b].cap));
            let mut sharing = members.len();
            for index in members {
                let rate = self.flows[index].cap.min(left / sharing as f64);
                self.flows[index].rate = rate;
                left -= rate;
                sharing -= 1;
            }
        }
    }

    fn next_event(&self) -> Option<f64> {
        let mut next: Option<f64> = None;
        let mut consider = |time: f64| next = Some(next.map_or(time, |best: f64| best.min(time)));
        for flow in &self.flows {
            consider(self.now + flow.remaining / flow.rate);
        }
        for (job, state) in self.jobs.iter().zip(&self.state) {
            if !state.started {
                consider(job.start_seconds);
            }
            if let Some(at) = state.next_phase_at {
                consider(at);
            }
        }
        next
    }

    fn advance(&mut self, next: f64) {
        let dt = (next - self.now).max(0.0);
        self.now = next;
        let mut done = Vec::new();
        for (index, flow) in self.flows.iter_mut().enumerate() {
            let moved = (flow.rate * dt).min(flow.remaining);
            self.absorbed[tier_index(flow.tier)] += moved;
            flow.remaining -= moved;
            // Finished when what is left would take under a nanosecond (rounding), or less
            // than the clock can still resolve this late in a long run.
            if flow.remaining <= flow.rate * 1e-9 || next + flow.remaining / flow.rate <= next {
                done.push(index);
            }
        }
        for index in done.into_iter().rev() {
            let flow = self.flows.remove(index);
            self.complete(flow);
        }
    }

    fn observe(&mut self, flow: &Flow) {
        let index = tier_index(flow.tier);
        let seconds = self.now - flow.started;
        if flow.tier == Tier::NodeLocal || seconds <= 0.0 {
            return;
        }
        let sample = (self.absorbed[index] - flow.absorbed_at_start) / seconds;
        let previous = self.observed[index] as f64;
        let updated = if self.observed[index] == 0 {
            sample
        } else {
            previous + (sample - previous) * BANDWIDTH_EWMA_WEIGHT
        };
        self.observed[index] = updated.round().max(1.0) as u64;
    }

    /// The flow's bytes arrive in its destination tier.
    fn land(&mut self, job: usize, tier: Tier, bytes: u64) {
        match tier {
            Tier::NodeLocal => self.state[job].local_pending += bytes,
            Tier::BurstBuffer => {
                self.state[job].bb_pending += bytes;
                self.queue_drain(job);
            }
            Tier::Pfs => self.report.bytes_on_pfs += bytes,
        }
    }

    fn queue_drain(&mut self, job: usize) {
        let state = &mut self.state[job];
        if state.bb_pending > 0 && !state.drain_running && state.drain_seq.is_none() {
            state.drain_seq = Some(self.drain_seq);
            self.drain_seq += 1;
        }
    }

    fn complete(&mut self, flow: Flow) {
        self.observe(&flow);
        let job = flow.job;
        match flow.kind {
            FlowKind::Phase => {
                let now = self.now;
                let state = &mut self.state[job];
                state.in_phase = false;
                state.result.io_time_seconds += now - state.phase_start;
                state.result.bytes_written += flow.bytes;
                state.last_phase_bytes = flow.bytes;
                state.next_step += 1;
                match self.jobs[job].steps.get(state.next_step) {
                    Some(step) => state.next_phase_at = Some(now + step.compute_seconds),
                    None => {
                        state.finished = true;
                        state.finish = now;
                    }
                }
                self.report.bytes_written += flow.bytes;
                self.land(job, flow.tier, flow.bytes);
            }
            FlowKind::Drain => {
                self.state[job].drain_running = false;
                self.report.bytes_drained += flow.bytes;
                self.land(job, Tier::Pfs, flow.bytes);
                self.queue_drain(job);
            }
            FlowKind::Move => {
                let state = &mut self.state[job];
                state.move_running = false;
                state.local_bytes -= flow.bytes;
                self.report.bytes_moved += flow.bytes;
                self.land(job, flow.tier, flow.bytes);
            }
        }
    }

    fn finish(mut self) -> StrategyReport {
        for state in &self.state {
            assert!(state.finished, "a job did not finish");
            assert_eq!(state.local_bytes + state.bb_pending, 0, "data left off the PFS");
        }
        let report = &mut self.report;
        report.makespan_seconds = self.now;
        report.jobs = self.state.iter().map(|state| state.result.clone()).collect();
        for (result, state) in report.jobs.iter_mut().zip(&self.state) {
            result.finish_seconds = state.finish;
        }
        report.jobs_done_seconds =
            report.jobs.iter().map(|job| job.finish_seconds).fold(0.0, f64::max);
        report.average_io_time_seconds =
            report.jobs.iter().map(|job| job.io_time_seconds).sum::<f64>()
                / report.jobs.len().max(1) as f64;
        report.observed_bb_bandwidth_bytes_per_s = self.observed[tier_index(Tier::BurstBuffer)];
        report.observed_pfs_bandwidth_bytes_per_s = self.observed[tier_index(Tier::Pfs)];
        self.report
    }
}

/// The comparison as terminal tables: per job and strategy, then per strategy, then the ratios.
pub fn ias_table(report: &IasReport) -> String {
    let mut out = String::new();
    let name_width = report.jobs.iter().map(|job| job.name.len()).max().unwrap_or(3).max(3);
    let _ = writeln!(
        out,
        "{:<18}  {:<name_width$}  {:>11}  {:>10}  {:>12}  {:>5}  {:>6}",
        "strategy", "job", "I/O time s", "node-local", "burst-buffer", "pfs", "spills"
    );
    for strategy in &report.strategies {
        for job in &strategy.jobs {
            let _ = writeln!(
                out,
                "{:<18}  {:<name_width$}  {:>11.2}  {:>10}  {:>12}  {:>5}  {:>6}",
                strategy.strategy.name(),
                job.name,
                job.io_time_seconds,
                job.phases_node_local,
                job.phases_burst_buffer,
                job.phases_pfs,
                job.spills
            );
        }
    }
    let _ = writeln!(
        out,
        "\n{:<18}  {:>13}  {:>11}  {:>10}  {:>11}  {:>11}",
        "strategy", "avg I/O time s", "jobs done s", "makespan s", "drained", "moved"
    );
    for strategy in &report.strategies {
        let _ = writeln!(
            out,
            "{:<18}  {:>13.2}  {:>11.2}  {:>10.2}  {:>11}  {:>11}",
            strategy.strategy.name(),
            strategy.average_io_time_seconds,
            strategy.jobs_done_seconds,
            strategy.makespan_seconds,
            format_bytes(strategy.bytes_drained),
            format_bytes(strategy.bytes_moved)
        );
    }
    let show = |value: Option<f64>| value.map_or_else(|| "-".to_string(), |v| format!("{v:.3}"));
    let ratios = &report.ratios;
    let _ = writeln!(
        out,
        "\nia_over_hp_io_time {}  ia_over_baseline_io_time {}  measured_over_ia_io_time {}",
        show(ratios.ia_over_hp_io_time),
        show(ratios.ia_over_baseline_io_time),
        show(ratios.measured_over_ia_io_time)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_trace::JobMeta;

    const ALL: [Strategy; 4] = Strategy::ALL;

    fn overlapping(jobs: u32, steps: u32, io_ratio: f64) -> SyntheticWorkload {
        SyntheticWorkload {
            jobs,
            steps,
            io_ratio,
            start_spread_seconds: Some(0.0),
            ..SyntheticWorkload::default()
        }
    }

    fn job(name: &str, start_seconds: f64, steps: &[(f64, u64)]) -> JobSpec {
        JobSpec {
            name: name.into(),
            processes: 32,
            start_seconds,
            steps: steps
                .iter()
                .map(|&(compute_seconds, bytes)| StepSpec { compute_seconds, bytes })
                .collect(),
        }
    }

    /// Every recorded decision is `choose_tier` on the recorded snapshot and request, and
    /// every phase went where its last decision said.
    fn recheck(report: &StrategyReport, jobs: &[JobSpec]) {
        let mut per_job_tiers: Vec<Vec<Tier>> = vec![Vec::new(); jobs.len()];
        for (index, decision) in report.decisions.iter().enumerate() {
            let again =
                choose_tier(report.strategy, &decision.snapshot, &decision.request.request());
            assert_eq!(again, decision.choice, "decision {index}: {decision:?}");
            match decision.kind {
                DecisionKind::Phase | DecisionKind::Spill => {
                    if let Some(tier) = decision.tier {
                        assert_eq!(tier, decision.choice.tier());
                        per_job_tiers[decision.job].push(tier);
                    } else {
                        // Re-asked: the next decision is this phase's spill.
                        let next = &report.decisions[index + 1];
                        assert_eq!(next.kind, DecisionKind::Spill);
                        assert_eq!((next.job, next.step), (decision.job, decision.step));
                    }
                }
                DecisionKind::Move => {
                    if decision.tier.is_none() {
                        assert!(matches!(decision.choice, TierChoice::NodeLocalFull(_)));
                    }
                }
            }
        }
        for (job, tiers) in per_job_tiers.iter().enumerate() {
            let result = &report.jobs[job];
            assert_eq!(tiers.len(), jobs[job].steps.len());
            let count = |tier| tiers.iter().filter(|&&t| t == tier).count() as u32;
            assert_eq!(count(Tier::NodeLocal), result.phases_node_local);
            assert_eq!(count(Tier::BurstBuffer), result.phases_burst_buffer);
            assert_eq!(count(Tier::Pfs), result.phases_pfs);
        }
    }

    #[test]
    fn the_simulator_decides_with_the_policy_functions() {
        // Scripted phase starts: three jobs starting their first phases together at t = 2 s,
        // a fourth at t = 3 s, then differing compute.
        const G: u64 = GIB;
        let jobs = vec![
            job("a", 0.0, &[(2.0, 16 * G), (1.0, 8 * G), (4.0, 16 * G)]),
            job("b", 0.0, &[(2.0, 16 * G), (3.0, 16 * G)]),
            job("c", 0.0, &[(2.0, 16 * G), (0.5, 32 * G), (0.5, 4 * G)]),
            job("d", 1.0, &[(2.0, 8 * G), (2.0, 8 * G)]),
        ];
        let config = IasConfig { local_capacity_bytes: 20 * G, ..IasConfig::default() };
        let report = compare_strategies(&jobs, &config, &ALL).unwrap();
        for strategy in &report.strategies {
            recheck(strategy, &jobs);
        }
        // The first three decisions of interference-aware, exactly: N = 4 (d started at 1 s).
        let ia = report.strategy(Strategy::InterferenceAware).unwrap();
        let first: Vec<_> = ia.decisions.iter().take(3).collect();
        let bb = |concurrent_jobs, queued_bytes| TierLoad {
            concurrent_jobs,
            queued_bytes,
            bandwidth_bytes_per_s: 0,
        };
        assert_eq!(
            first[0].snapshot,
            TierSnapshot { active_jobs: 4, burst_buffer: bb(0, 0), pfs: bb(0, 0) }
        );
        assert_eq!(first[0].choice, TierChoice::BurstBufferBelowHalf);
        assert_eq!(first[1].snapshot.burst_buffer, bb(1, 16 * G));
        assert_eq!(first[1].choice, TierChoice::BurstBufferBelowHalf);
        assert_eq!(first[2].snapshot.burst_buffer, bb(2, 32 * G));
        assert_eq!(first[2].choice, TierChoice::PfsBelowHalf);
        // d's phase at 3 s: the burst buffer at N/2, the PFS below: the PFS.
        let fourth = &ia.decisions[3];
        assert_eq!((fourth.time_seconds, fourth.job), (3.0, 3));
        assert_eq!(fourth.snapshot.pfs, bb(1, 16 * G - 2 * G));
        assert_eq!(fourth.choice, TierChoice::PfsBelowHalf);
        // Line 13 never happens here: N counts every active job, each with at most one phase
        // open, so when a job asks, the others fill at most N − 1 places and one of the two
        // shared tiers is below N/2 (docs/design/ias.md, "Algorithm 1 as built").
        assert!(ia.decisions.iter().all(|d| d.choice != TierChoice::BothBusy));
        let measured = report.strategy(Strategy::Measured).unwrap();
        assert!(measured
            .decisions
            .iter()
            .any(|d| matches!(d.choice, TierChoice::FastestShared(_))));
    }

    #[test]
    fn every_written_byte_reaches_the_pfs() {
        let small_local = IasConfig { local_capacity_bytes: 40 * GIB, ..IasConfig::default() };
        let no_local = IasConfig { local_capacity_bytes: 0, ..IasConfig::default() };
        for config in [IasConfig::default(), small_local, no_local] {
            for workload in [
                SyntheticWorkload::default(),
                overlapping(8, 4, 0.8),
                SyntheticWorkload { jobs: 5, steps: 3, seed: 7, ..SyntheticWorkload::default() },
            ] {
                let jobs = synthetic_jobs(&workload, &config).unwrap();
                let written: u64 =
                    jobs.iter().flat_map(|job| &job.steps).map(|step| step.bytes).sum();
                let report = compare_strategies(&jobs, &config, &ALL).unwrap();
                for strategy in &report.strategies {
                    assert_eq!(strategy.bytes_written, written, "{:?}", strategy.strategy);
                    assert_eq!(strategy.bytes_on_pfs, written, "{:?}", strategy.strategy);
                    assert!(strategy.makespan_seconds >= strategy.jobs_done_seconds);
                    let per_job: u64 = strategy.jobs.iter().map(|job| job.bytes_written).sum();
                    assert_eq!(per_job, written);
                    if strategy.strategy == Strategy::Baseline {
                        assert_eq!(strategy.bytes_drained + strategy.bytes_moved, 0);
                    }
                    if strategy.strategy == Strategy::HighPriority {
                        assert_eq!(strategy.bytes_drained, written);
                    }
                }
            }
        }
    }

    #[test]
    fn trace_jobs_conserve_bytes_too() {
        let shape = crate::synth::WorkflowShape {
            pipelines: 2,
            inputs_per_pipeline: 3,
            input_pool: 4,
            input_bytes: 1 << 30,
            transfer_bytes: 64 << 20,
            reread_passes: 1,
            software_files: 5,
            seed: 3,
        };
        let mut jobs = Vec::new();
        for (index, seed) in [3, 4, 5].into_iter().enumerate() {
            let trace =
                crate::synth::workflow(&crate::synth::WorkflowShape { seed, ..shape.clone() })
                    .unwrap();
            jobs.push(trace_job(&trace, &format!("trace-{seed}"), 0.1, index as f64).unwrap());
        }
        assert!(jobs.iter().all(|job| job.steps.len() > 1));
        let written: u64 = jobs.iter().flat_map(|job| &job.steps).map(|step| step.bytes).sum();
        assert_eq!(written, (3 * 2 * 4) << 30);
        let config = IasConfig { local_capacity_bytes: 2 << 30, ..IasConfig::default() };
        let report = compare_strategies(&jobs, &config, &ALL).unwrap();
        for strategy in &report.strategies {
            assert_eq!(strategy.bytes_on_pfs, written, "{:?}", strategy.strategy);
            recheck(strategy, &jobs);
        }
    }

    #[test]
    fn interference_aware_beats_baseline_and_high_priority() {
        let config = IasConfig::default();
        // Two fully overlapping jobs, PFS slower than the burst buffer.
        let jobs = synthetic_jobs(&overlapping(2, 5, 0.5), &config).unwrap();
        let report = compare_strategies(&jobs, &config, &ALL).unwrap();
        let average = |s| report.strategy(s).unwrap().average_io_time_seconds;
        assert!(
            average(Strategy::InterferenceAware) < average(Strategy::Baseline),
            "{}",
            ias_table(&report)
        );
        // Eight jobs with interference: interference-aware beats high-priority too.
        let jobs = synthetic_jobs(&overlapping(8, 5, 0.5), &config).unwrap();
        let report = compare_strategies(&jobs, &config, &ALL).unwrap();
        let average = |s| report.strategy(s).unwrap().average_io_time_seconds;
        assert!(config.interference_alpha > 0.0);
        assert!(
            average(Strategy::InterferenceAware) < average(Strategy::HighPriority),
            "{}",
            ias_table(&report)
        );
        assert!(report.ratios.ia_over_hp_io_time.unwrap() < 1.0);
        assert!(report.ratios.ia_over_baseline_io_time.unwrap() < 1.0);
    }

    #[test]
    fn drains_stay_within_the_pfs_writer_limit() {
        for limit in 1..=4 {
            for jobs in [2, 5, 8] {
                let config = IasConfig {
                    pfs_writers_max: limit,
                    local_capacity_bytes: 48 * GIB,
                    ..IasConfig::default()
                };
                let workload = SyntheticWorkload {
                    jobs,
                    steps: 4,
                    seed: u64::from(limit),
                    ..SyntheticWorkload::default()
                };
                let jobs = synthetic_jobs(&workload, &config).unwrap();
                let report = compare_strategies(&jobs, &config, &ALL).unwrap();
                for strategy in &report.strategies {
                    assert!(strategy.max_drains_running <= limit, "{strategy:?}");
                    assert!(strategy.max_pfs_writers_at_drain_start <= limit);
                    if strategy.strategy == Strategy::HighPriority {
                        assert!(strategy.max_drains_running >= 1);
                    }
                }
            }
        }
    }

    #[test]
    fn same_seed_same_report() {
        let config = IasConfig::default();
        let workload =
            SyntheticWorkload { jobs: 6, steps: 4, seed: 42, ..SyntheticWorkload::default() };
        let run = |workload: &SyntheticWorkload| {
            compare_strategies(&synthetic_jobs(workload, &config).unwrap(), &config, &ALL).unwrap()
        };
        let first = run(&workload);
        let second = run(&workload);
        assert_eq!(first, second);
        assert_eq!(serde_json::to_string(&first).unwrap(), serde_json::to_string(&second).unwrap());
        let other = run(&SyntheticWorkload { seed: 43, ..workload });
        assert_ne!(first.jobs, other.jobs);
    }

    #[test]
    fn trace_phases_split_on_gaps_and_commits() {
        let write = |time_s: f64, length: u64| TraceOp {
            time_ns: (time_s * 1e9) as u64,
            duration_ns: 1_000_000,
            offset: 0,
            length,
            rank: 0,
            file: 0,
            op: Op::Write,
        };
        let mut fsync = write(2.5, 0);
        fsync.op = Op::Fsync;
        let mut read = write(2.6, 100);
        read.op = Op::Read;
        let trace = Trace {
            meta: JobMeta { nprocs: 64, ..JobMeta::default() },
            files: vec!["/bb/out".into()],
            ops: vec![
                write(10.0, 5),
                write(1.0, 10),
                write(1.5, 20),
                write(2.0, 30),
                fsync,
                read,
                write(2.7, 40),
            ],
        };
        let phases = write_phases(&trace.ops, 1_000_000_000);
        let bytes: Vec<u64> = phases.iter().map(|phase| phase.bytes).collect();
        assert_eq!(bytes, vec![60, 40, 5]);
        let job = trace_job(&trace, "t", 1.0, 0.0).unwrap();
        assert_eq!(job.processes, 64);
        assert_eq!(job.steps.len(), 3);
        assert!((job.steps[0].compute_seconds - 1.0).abs() < 1e-9);
        assert!((job.steps[1].compute_seconds - (2.7 - 2.001)).abs() < 1e-9);
        let empty = Trace { ops: vec![read], ..trace };
        assert_eq!(trace_job(&empty, "e", 1.0, 0.0), Err(IasError::NoWrites { name: "e".into() }));
    }

    #[test]
    fn interference_divides_aggregate_bandwidth_beyond_the_knee() {
        assert_eq!(effective_bandwidth(100.0, 2, 0.5, 2), 100.0);
        assert_eq!(effective_bandwidth(100.0, 4, 0.5, 2), 50.0);
        assert_eq!(effective_bandwidth(100.0, 8, 0.0, 2), 100.0);
        let bad = IasConfig { interference_alpha: -1.0, ..IasConfig::default() };
        assert_eq!(bad.validate(), Err(IasError::Alpha(-1.0)));
        let ratio = SyntheticWorkload { io_ratio: 0.0, ..SyntheticWorkload::default() };
        assert_eq!(synthetic_jobs(&ratio, &IasConfig::default()), Err(IasError::IoRatio(0.0)));
    }
}
