//! `spillway sim`: replays a trace (or a synthetic workflow) through the Xu/Sato two-level burst
//! buffer model and reports I/O time, throughput, hit ratio and bytes moved each way, for one
//! buffer size or as a sweep of sizes relative to the access space (table, JSON, SVG).
//!
//! This module only parses flags, loads the trace, times the simulator (for `ops_per_second`)
//! and formats output; the model is `spillway_sim::model`. `spillway sim ias` (tiering
//! strategies over three tiers) is a subcommand with its own flags, in `sim_ias`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::json;
use spillway_sim::model::{
    access_space, simulate, smallest_sufficient, sweep, time_ordered, AccessSpace, Level,
    SimConfig, SimReport, SweepPoint, WriteBack,
};
use spillway_sim::policy::PolicyKind;
use spillway_sim::report::{sweep_svg, sweep_table};
use spillway_sim::synth::{workflow, WorkflowShape};
use spillway_trace::{Trace, TraceOp};
use spillway_types::format_bytes;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Trace file (Spillway trace format, docs/design/trace.md). Omit with --synthetic.
    pub trace: Option<PathBuf>,
    /// Simulate a synthetic SWarp-like workflow instead of a trace file.
    #[arg(long)]
    pub synthetic: bool,
    /// Synthetic: concurrent pipelines (one rank each; default 8). With --request: pipelines
    /// like the trace sharing the reservation, all doing I/O at once, as `characterize
    /// --pipelines` (default 1).
    #[arg(long)]
    pub pipelines: Option<u32>,
    /// Synthetic: input images per pipeline.
    #[arg(long, default_value_t = 16)]
    pub inputs: u32,
    /// Synthetic: distinct input images shared by all pipelines.
    #[arg(long, default_value_t = 64)]
    pub input_pool: u32,
    /// Synthetic: size of each image, MiB.
    #[arg(long, default_value_t = 32)]
    pub input_mib: u64,
    /// Synthetic: read/write transfer size, KiB.
    #[arg(long, default_value_t = 4096)]
    pub transfer_kib: u64,
    /// Synthetic: random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Save the trace that was simulated (useful with --synthetic).
    #[arg(long)]
    pub write_trace: Option<PathBuf>,
    /// Burst buffer bandwidth, GB/s (decimal). Default: Reedbush's DDN IME.
    #[arg(long, default_value_t = 436.2)]
    pub bb_bandwidth_gb_per_s: f64,
    /// Burst buffer latency, microseconds.
    #[arg(long, default_value_t = 20.0)]
    pub bb_latency_us: f64,
    /// PFS bandwidth, GB/s (decimal). Default: Reedbush's Lustre.
    #[arg(long, default_value_t = 145.2)]
    pub pfs_bandwidth_gb_per_s: f64,
    /// PFS latency, microseconds.
    #[arg(long, default_value_t = 500.0)]
    pub pfs_latency_us: f64,
    /// Caching unit, KiB.
    #[arg(long, default_value_t = 1024)]
    pub chunk_kib: u64,
    /// Eviction policies, comma-separated: lru, fifo, lfu.
    #[arg(long, default_value = "lru")]
    pub policy: String,
    /// Write-back of dirty data: async (overlaps service) or sync (on eviction).
    #[arg(long, default_value = "async")]
    pub write_back: String,
    /// Issue each request no earlier than its trace time, so compute gaps overlap async
    /// write-back (default: back to back, as Xu/Sato).
    #[arg(long)]
    pub honor_timestamps: bool,
    /// One run with this burst buffer capacity, MiB (instead of a sweep).
    #[arg(long, conflicts_with = "bb_fraction")]
    pub capacity_mib: Option<u64>,
    /// One run with capacity = this fraction of the access space (instead of a sweep).
    #[arg(long)]
    pub bb_fraction: Option<f64>,
    /// Sweep fractions of the access space, comma-separated.
    #[arg(long, default_value = "0.01,0.05,0.1,0.25,0.5,0.75,1.0")]
    pub fractions: String,
    /// Sweep: report the smallest buffer reaching this fraction of the ideal throughput.
    #[arg(long, default_value_t = 0.9)]
    pub target_relative: f64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write the sweep chart (relative throughput vs buffer size) as SVG.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    #[command(flatten)]
    pub request: super::sim_request::RequestArgs,
}

/// `spillway sim <subcommand>`; without one, `sim` runs the two-level model on a trace.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Tiering strategies (IAS) over node-local, burst buffer and PFS: per-job I/O time.
    Ias(Box<super::sim_ias::Args>),
}

fn parse_policies(text: &str) -> anyhow::Result<Vec<PolicyKind>> {
    let mut policies = Vec::new();
    for name in text.split(',').map(str::trim).filter(|name| !name.is_empty()) {
        let Some(policy) = PolicyKind::parse(name) else {
            bail!("--policy: unknown eviction policy {name:?} (known: lru, fifo, lfu)");
        };
        if !policies.contains(&policy) {
            policies.push(policy);
        }
    }
    if policies.is_empty() {
        bail!("--policy: no policy given");
    }
    Ok(policies)
}

fn parse_fractions(text: &str) -> anyhow::Result<Vec<f64>> {
    let mut fractions = Vec::new();
    for part in text.split(',').map(str::trim).filter(|part| !part.is_empty()) {
        let value: f64 =
            part.parse().with_context(|| format!("--fractions: {part:?} is not a number"))?;
        if !(value > 0.0 && value <= 1.0) {
            bail!("--fractions: {value} is outside (0, 1]");
        }
        fractions.push(value);
    }
    if fractions.is_empty() {
        bail!("--fractions: no fraction given");
    }
    Ok(fractions)
}

fn load(args: &Args) -> anyhow::Result<(Trace, String, f64)> {
    match (&args.trace, args.synthetic) {
        (Some(_), true) => bail!("give either a trace file or --synthetic, not both"),
        (None, false) => bail!("give a trace file, or --synthetic for a generated workflow"),
        (Some(path), false) => {
            let started = Instant::now();
            let trace = super::read_trace(path)?;
            let seconds = started.elapsed().as_secs_f64();
            let rate = if seconds > 0.0 { trace.ops.len() as f64 / seconds } else { 0.0 };
            Ok((trace, path.display().to_string(), rate))
        }
        (None, true) => {
            let shape = WorkflowShape {
                pipelines: args.pipelines.unwrap_or(8),
                inputs_per_pipeline: args.inputs,
                input_pool: args.input_pool,
                input_bytes: args.input_mib << 20,
                transfer_bytes: args.transfer_kib << 10,
                seed: args.seed,
                ..WorkflowShape::default()
            };
            let trace = workflow(&shape).context("generating the synthetic workflow")?;
            Ok((trace, "synthetic".to_string(), 0.0))
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(Command::Ias(ias)) = args.command {
        return super::sim_ias::run(*ias);
    }
    let policies = parse_policies(&args.policy)?;
    let write_back = parse_write_back(&args.write_back)?;
    let (trace, name, decode_ops_per_second) = load(&args)?;
    if let Some(path) = &args.write_trace {
        trace.write_path(path).with_context(|| format!("writing trace {}", path.display()))?;
    }
    if args.chunk_kib == 0 {
        bail!("--chunk-kib must be at least 1");
    }
    let ops = time_ordered(&trace.ops);
    let base = base_config(&args, policies[0], write_back);
    base.validate().context("simulator configuration")?;
    if args.request.request.is_some() {
        if policies.len() > 1 {
            bail!("--request replays with one --policy (got {})", args.policy);
        }
        let replayed = super::sim_request::Replayed { trace: &trace, name: &name, ops: &ops };
        return super::sim_request::run(&args, &replayed, base);
    }
    args.request.refuse_without_request()?;
    let space = access_space(&ops, base.chunk_bytes).with_context(|| format!("trace {name}"))?;
    if space.chunks == 0 {
        bail!("trace {name} has no read or write with a length: nothing to simulate");
    }
    let simulation =
        Simulation { trace: &trace, name, decode_ops_per_second, ops: &ops, base, space, policies };
    match single_capacity(&args, &space, simulation.base.chunk_bytes)? {
        Some(capacity_bytes) => run_single(&args, &simulation, capacity_bytes),
        None => run_sweep(&args, &simulation),
    }
}

/// `--write-back`: async or sync.
fn parse_write_back(text: &str) -> anyhow::Result<WriteBack> {
    match text {
        "async" => Ok(WriteBack::Async),
        "sync" => Ok(WriteBack::Sync),
        other => bail!("--write-back: {other:?} is neither async nor sync"),
    }
}

/// The two levels and the caching unit from the flags; capacity one chunk until a run sets it.
fn base_config(args: &Args, policy: PolicyKind, write_back: WriteBack) -> SimConfig {
    let chunk_bytes = args.chunk_kib << 10;
    SimConfig {
        burst_buffer: Level {
            bandwidth_bytes_per_second: args.bb_bandwidth_gb_per_s * 1e9,
            latency_seconds: args.bb_latency_us * 1e-6,
        },
        pfs: Level {
            bandwidth_bytes_per_second: args.pfs_bandwidth_gb_per_s * 1e9,
            latency_seconds: args.pfs_latency_us * 1e-6,
        },
        capacity_bytes: chunk_bytes,
        chunk_bytes,
        policy,
        write_back,
        honor_timestamps: args.honor_timestamps,
        burst_buffer_ops_per_second: None,
        staged_in: false,
    }
}

/// The capacity of a single run (`--capacity-mib` or `--bb-fraction`); None for a sweep.
fn single_capacity(
    args: &Args,
    space: &AccessSpace,
    chunk_bytes: u64,
) -> anyhow::Result<Option<u64>> {
    let capacity = match (args.capacity_mib, args.bb_fraction) {
        (Some(mib), _) => Some(mib << 20),
        (None, Some(fraction)) => {
            if !(fraction > 0.0 && fraction <= 1.0) {
                bail!("--bb-fraction {fraction} is outside (0, 1]");
            }
            Some(((space.chunks as f64 * fraction).floor() as u64).max(1) * chunk_bytes)
        }
        (None, None) => None,
    };
    Ok(capacity)
}

/// What every run simulates: the time-ordered trace, the base configuration and the policies.
struct Simulation<'a> {
    trace: &'a Trace,
    name: String,
    decode_ops_per_second: f64,
    ops: &'a [TraceOp],
    base: SimConfig,
    space: AccessSpace,
    policies: Vec<PolicyKind>,
}

impl Simulation<'_> {
    /// The trace's description in the JSON output.
    fn trace_info(&self) -> serde_json::Value {
        json!({
            "name": self.name,
            "source": self.trace.meta.source,
            "executable": self.trace.meta.executable,
            "synthesized": self.trace.meta.synthesized,
            "partial": self.trace.meta.partial_warning(),
            "ops": self.trace.ops.len(),
            "files": self.trace.files.len(),
        })
    }

    /// Trace ops simulated per second when `runs` runs took `seconds`.
    fn ops_per_second(&self, runs: usize, seconds: f64) -> f64 {
        (self.ops.len() * runs) as f64 / seconds.max(1e-9)
    }
}

/// One run per policy with `capacity_bytes` of burst buffer, printed as JSON or one line each.
fn run_single(args: &Args, simulation: &Simulation<'_>, capacity_bytes: u64) -> anyhow::Result<()> {
    let mut results = Vec::new();
    let started = Instant::now();
    for &policy in &simulation.policies {
        let config = SimConfig { capacity_bytes, policy, ..simulation.base.clone() };
        let report = simulate(simulation.ops, &config).context("simulator configuration")?;
        results.push((policy, report));
    }
    let seconds = started.elapsed().as_secs_f64();
    let ops_per_second = simulation.ops_per_second(simulation.policies.len(), seconds);
    if args.json {
        print_single_json(simulation, capacity_bytes, &results, ops_per_second)
    } else {
        print_single_text(simulation, capacity_bytes, &results, ops_per_second);
        Ok(())
    }
}

/// A single run's results as one JSON object (the first policy's also as `result`).
fn print_single_json(
    simulation: &Simulation<'_>,
    capacity_bytes: u64,
    results: &[(PolicyKind, SimReport)],
    ops_per_second: f64,
) -> anyhow::Result<()> {
    let write_back = simulation.base.write_back;
    let runs: Vec<_> = results
        .iter()
        .map(|(policy, report)| json!({"policy": policy, "write_back": write_back, "capacity_bytes": capacity_bytes, "result": report}))
        .collect();
    let output = json!({
        "trace": simulation.trace_info(),
        "access_space_bytes": simulation.space.bytes,
        "access_space_file_bytes": simulation.space.file_bytes,
        "chunk_bytes": simulation.base.chunk_bytes,
        "burst_buffer": simulation.base.burst_buffer,
        "pfs": simulation.base.pfs,
        "ops_per_second": ops_per_second,
        "decode_ops_per_second": simulation.decode_ops_per_second,
        "result": results[0].1,
        "runs": runs,
    });
    println!("{}", serde_json::to_string_pretty(&output)?);
    Ok(())
}

/// A single run's results as text: the trace, then one line per policy.
fn print_single_text(
    simulation: &Simulation<'_>,
    capacity_bytes: u64,
    results: &[(PolicyKind, SimReport)],
    ops_per_second: f64,
) {
    let (trace, space) = (simulation.trace, &simulation.space);
    println!(
        "trace {}: {} ops, {} files, access space {} ({} by file extents)",
        simulation.name,
        trace.ops.len(),
        trace.files.len(),
        format_bytes(space.bytes),
        format_bytes(space.file_bytes)
    );
    for (policy, report) in results {
        println!(
            "{} {}: capacity {}  io_time {:.6} s  throughput {}/s  hit ratio {:.4} (reads {:.4})  PFS→BB {}  BB→PFS {}  evictions {} (dirty {})  write-back wait {:.6} s  drained at {:.6} s",
            policy.name(),
            simulation.base.write_back.name(),
            format_bytes(capacity_bytes),
            report.io_time_seconds,
            format_bytes(report.throughput_bytes_per_second as u64),
            report.hit_ratio,
            report.read_hit_ratio,
            format_bytes(report.bytes_pfs_to_bb),
            format_bytes(report.bytes_bb_to_pfs),
            report.evictions,
            report.dirty_evictions,
            report.write_back_wait_seconds,
            report.drain_complete_seconds
        );
    }
    println!("simulated {:.2} million trace ops/s", ops_per_second / 1e6);
}

/// A sweep of buffer sizes and what running it took.
struct SweepOutcome {
    points: Vec<SweepPoint>,
    /// Simulator runs behind the points.
    runs: usize,
    ops_per_second: f64,
}

/// Sweeps the buffer size over `--fractions` of the access space, then writes and prints it.
fn run_sweep(args: &Args, simulation: &Simulation<'_>) -> anyhow::Result<()> {
    let fractions = parse_fractions(&args.fractions)?;
    let started = Instant::now();
    let (_, points) = sweep(simulation.ops, &simulation.base, &simulation.policies, &fractions)
        .context("simulator configuration")?;
    let seconds = started.elapsed().as_secs_f64();
    // One ideal run per policy plus one per fraction below the ideal.
    let runs = simulation.policies.len()
        + points.iter().filter(|point| point.capacity_bytes < simulation.space.bytes).count();
    let ops_per_second = simulation.ops_per_second(runs, seconds);
    let outcome = SweepOutcome { points, runs, ops_per_second };
    if !(args.target_relative > 0.0 && args.target_relative <= 1.0) {
        bail!("--target-relative {} is outside (0, 1]", args.target_relative);
    }
    let sufficient = smallest_sufficient(&outcome.points, args.target_relative);
    if let Some(path) = &args.svg {
        let title = format!("Burst buffer size sweep: {}", simulation.trace.meta.executable);
        std::fs::write(path, sweep_svg(&outcome.points, &title))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        print_sweep_json(args, simulation, &outcome, &sufficient)
    } else {
        print_sweep_text(args, simulation, &outcome, &sufficient);
        Ok(())
    }
}

/// A sweep as one JSON object: every point and the smallest sufficient buffer per policy.
fn print_sweep_json(
    args: &Args,
    simulation: &Simulation<'_>,
    outcome: &SweepOutcome,
    sufficient: &[&SweepPoint],
) -> anyhow::Result<()> {
    let sweep: Vec<_> = outcome
        .points
        .iter()
        .map(|point| {
            json!({
                "policy": point.policy,
                "write_back": point.write_back,
                "bb_fraction": point.bb_fraction,
                "capacity_bytes": point.capacity_bytes,
                "relative_throughput": point.relative_throughput,
                "result": point.report,
            })
        })
        .collect();
    let output = json!({
        "trace": simulation.trace_info(),
        "access_space_bytes": simulation.space.bytes,
        "access_space_file_bytes": simulation.space.file_bytes,
        "chunk_bytes": simulation.base.chunk_bytes,
        "burst_buffer": simulation.base.burst_buffer,
        "pfs": simulation.base.pfs,
        "write_back": simulation.base.write_back,
        "ops_per_second": outcome.ops_per_second,
        "decode_ops_per_second": simulation.decode_ops_per_second,
        "simulated_runs": outcome.runs,
        "sweep": sweep,
        "target_relative": args.target_relative,
        "smallest_sufficient": sufficient.iter().map(|point| json!({
            "policy": point.policy,
            "bb_fraction": point.bb_fraction,
            "capacity_bytes": point.capacity_bytes,
            "relative_throughput": point.relative_throughput,
        })).collect::<Vec<_>>(),
    });
    println!("{}", serde_json::to_string_pretty(&output)?);
    Ok(())
}

/// A sweep as text: the trace, the sweep table and the smallest sufficient buffer per policy.
fn print_sweep_text(
    args: &Args,
    simulation: &Simulation<'_>,
    outcome: &SweepOutcome,
    sufficient: &[&SweepPoint],
) {
    let (trace, space) = (simulation.trace, &simulation.space);
    println!(
        "trace {}: {} ops, {} files, access space {} ({} by file extents); write-back {}",
        simulation.name,
        trace.ops.len(),
        trace.files.len(),
        format_bytes(space.bytes),
        format_bytes(space.file_bytes),
        simulation.base.write_back.name()
    );
    print!("{}", sweep_table(&outcome.points));
    for point in sufficient {
        println!(
            "{}: {} ({:.0}% of the access space) reaches {:.0}% of the ideal throughput",
            point.policy.name(),
            format_bytes(point.capacity_bytes),
            100.0 * point.bb_fraction,
            100.0 * args.target_relative
        );
    }
    println!(
        "simulated {} configurations at {:.2} million trace ops/s",
        outcome.runs,
        outcome.ops_per_second / 1e6
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_and_fractions_parse_or_name_the_flag() {
        assert_eq!(
            parse_policies("lru, FIFO,lru").unwrap(),
            vec![PolicyKind::Lru, PolicyKind::Fifo]
        );
        assert!(parse_policies("arc").unwrap_err().to_string().contains("--policy"));
        assert_eq!(parse_fractions("0.5,1").unwrap(), vec![0.5, 1.0]);
        assert!(parse_fractions("0").unwrap_err().to_string().contains("--fractions"));
        assert!(parse_fractions("x").unwrap_err().to_string().contains("--fractions"));
    }
}
