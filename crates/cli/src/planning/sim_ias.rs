//! `spillway sim ias`: several jobs' I/O phases over the three tiers (node-local, burst buffer,
//! PFS) under each tiering strategy, with the policy functions the daemons use; per-job and
//! average I/O time per strategy and the IAS ratios (table or JSON).
//!
//! This module only parses flags, builds the jobs (synthetic or from traces) and formats
//! output; the model is `spillway_sim::ias` (docs/design/ias.md, "Simulator").

use std::path::PathBuf;

use anyhow::{bail, Context};
use serde_json::json;
use spillway_policy::tiering::Strategy;
use spillway_sim::ias::{
    compare_strategies, ias_table, synthetic_jobs, trace_job, IasConfig, JobSpec, SyntheticWorkload,
};
use spillway_types::{format_bytes, parse_size};

#[derive(clap::Args)]
pub struct Args {
    /// Synthetic: concurrent jobs.
    #[arg(long, default_value_t = 2)]
    pub jobs: u32,
    /// Synthetic: compute + I/O steps per job.
    #[arg(long, default_value_t = 5)]
    pub steps: u32,
    /// Synthetic: fraction of a job's standalone run time spent in I/O (alone on the burst
    /// buffer), in (0, 1].
    #[arg(long, default_value_t = 0.5)]
    pub io_ratio: f64,
    /// Synthetic: bytes per job per I/O phase (e.g. 32GiB).
    #[arg(long, default_value = "32GiB")]
    pub phase_bytes: String,
    /// Synthetic: processes per job.
    #[arg(long, default_value_t = 32)]
    pub processes: u32,
    /// Synthetic: job start offsets drawn from [0, this) seconds (default: one standalone step;
    /// 0: all jobs start at once). Traces start together unless this is given.
    #[arg(long)]
    pub start_spread: Option<f64>,
    /// Seed of the start offsets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Aggregate burst buffer bandwidth per second (e.g. 8GiB).
    #[arg(long, default_value = "8GiB")]
    pub bb_bandwidth: String,
    /// Aggregate PFS bandwidth per second.
    #[arg(long, default_value = "2GiB")]
    pub pfs_bandwidth: String,
    /// Node-local device bandwidth per second, per compute node.
    #[arg(long, default_value = "2GiB")]
    pub local_bandwidth: String,
    /// Node-local capacity per compute node (0: no node-local tier).
    #[arg(long, default_value = "256GiB")]
    pub local_capacity: String,
    /// Processes per compute node (a job's nodes = processes / this, rounded up).
    #[arg(long, default_value_t = 32)]
    pub processes_per_node: u32,
    /// PFS writers (drains plus direct phases) above which no drain starts.
    #[arg(long, default_value_t = 4)]
    pub pfs_writers_max: u32,
    /// Interference: aggregate bandwidth / (1 + alpha × writers beyond the knee).
    #[arg(long, default_value_t = 0.2)]
    pub interference_alpha: f64,
    /// Interference: writers a shared tier takes at full bandwidth.
    #[arg(long, default_value_t = 2)]
    pub interference_knee: u32,
    /// A Spillway trace as one job (repeatable); replaces the synthetic jobs.
    #[arg(long)]
    pub trace: Vec<PathBuf>,
    /// Traces: a quiet gap longer than this (seconds) ends a write phase (so does an fsync).
    #[arg(long, default_value_t = 1.0)]
    pub phase_gap: f64,
    /// Strategies, comma-separated: baseline, high-priority, interference-aware, measured.
    #[arg(long, default_value = "baseline,high-priority,interference-aware,measured")]
    pub strategy: String,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// JSON: include every tiering decision with its snapshot.
    #[arg(long)]
    pub decisions: bool,
}

/// A size flag through `parse_size`, an optional `/s` allowed on bandwidths.
fn size_flag(flag: &str, text: &str) -> anyhow::Result<u64> {
    let bare = text.trim().trim_end_matches("/s");
    parse_size(bare).map_err(|error| anyhow::anyhow!("{flag}: {text:?}: {error}"))
}

fn parse_strategies(text: &str) -> anyhow::Result<Vec<Strategy>> {
    let mut strategies = Vec::new();
    for name in text.split(',').map(str::trim).filter(|name| !name.is_empty()) {
        let Some(strategy) = Strategy::parse(&name.to_ascii_lowercase()) else {
            let known: Vec<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
            bail!("--strategy: unknown strategy {name:?} (known: {})", known.join(", "));
        };
        if !strategies.contains(&strategy) {
            strategies.push(strategy);
        }
    }
    if strategies.is_empty() {
        bail!("--strategy: no strategy given");
    }
    Ok(strategies)
}

fn config(args: &Args) -> anyhow::Result<IasConfig> {
    let positive = |flag: &str, text: &str| -> anyhow::Result<u64> {
        let value = size_flag(flag, text)?;
        if value == 0 {
            bail!("{flag}: must be more than 0");
        }
        Ok(value)
    };
    if !(args.interference_alpha.is_finite() && args.interference_alpha >= 0.0) {
        bail!("--interference-alpha: {} is not a finite number ≥ 0", args.interference_alpha);
    }
    if args.pfs_writers_max == 0 {
        bail!("--pfs-writers-max: must be at least 1");
    }
    if args.processes_per_node == 0 {
        bail!("--processes-per-node: must be at least 1");
    }
    Ok(IasConfig {
        bb_bandwidth_bytes_per_s: positive("--bb-bandwidth", &args.bb_bandwidth)?,
        pfs_bandwidth_bytes_per_s: positive("--pfs-bandwidth", &args.pfs_bandwidth)?,
        local_bandwidth_bytes_per_s: positive("--local-bandwidth", &args.local_bandwidth)?,
        local_capacity_bytes: size_flag("--local-capacity", &args.local_capacity)?,
        processes_per_node: args.processes_per_node,
        pfs_writers_max: args.pfs_writers_max,
        interference_alpha: args.interference_alpha,
        interference_knee: args.interference_knee,
    })
}

/// The jobs: one per `--trace`, else the synthetic workload.
fn jobs(args: &Args, config: &IasConfig) -> anyhow::Result<(Vec<JobSpec>, String)> {
    if let Some(spread) = args.start_spread {
        if !(spread.is_finite() && spread >= 0.0) {
            bail!("--start-spread: {spread} is not a finite number of seconds ≥ 0");
        }
    }
    if args.trace.is_empty() {
        for (flag, value) in [("--jobs", args.jobs), ("--steps", args.steps)] {
            if value == 0 {
                bail!("{flag}: must be at least 1");
            }
        }
        if args.processes == 0 {
            bail!("--processes: must be at least 1");
        }
        if !(args.io_ratio.is_finite() && args.io_ratio > 0.0 && args.io_ratio <= 1.0) {
            bail!("--io-ratio: {} is outside (0, 1]", args.io_ratio);
        }
        let phase_bytes = size_flag("--phase-bytes", &args.phase_bytes)?;
        if phase_bytes == 0 {
            bail!("--phase-bytes: must be more than 0");
        }
        let workload = SyntheticWorkload {
            jobs: args.jobs,
            steps: args.steps,
            io_ratio: args.io_ratio,
            phase_bytes,
            processes: args.processes,
            start_spread_seconds: args.start_spread,
            seed: args.seed,
        };
        let jobs = synthetic_jobs(&workload, config).context("synthetic jobs")?;
        let label = format!(
            "{} synthetic job(s) × {} steps of {}, I/O ratio {}",
            args.jobs,
            args.steps,
            format_bytes(phase_bytes),
            args.io_ratio
        );
        return Ok((jobs, label));
    }
    if !(args.phase_gap.is_finite() && args.phase_gap >= 0.0) {
        bail!("--phase-gap: {} is not a finite number of seconds ≥ 0", args.phase_gap);
    }
    let spread = args.start_spread.unwrap_or(0.0);
    let mut offsets = synthetic_offsets(args.trace.len(), spread, args.seed, config)?;
    let mut jobs = Vec::new();
    for path in &args.trace {
        let trace =
            super::read_trace(path).with_context(|| format!("--trace {}", path.display()))?;
        let name = path
            .file_name()
            .map_or_else(|| path.display().to_string(), |name| name.to_string_lossy().into_owned());
        let job = trace_job(&trace, &name, args.phase_gap, offsets.remove(0))
            .with_context(|| format!("--trace {}", path.display()))?;
        jobs.push(job);
    }
    Ok((jobs, format!("{} trace job(s)", args.trace.len())))
}

/// Start offsets for trace jobs: the synthetic jobs' seeded rule, with an explicit spread.
fn synthetic_offsets(
    count: usize,
    spread: f64,
    seed: u64,
    config: &IasConfig,
) -> anyhow::Result<Vec<f64>> {
    let workload = SyntheticWorkload {
        jobs: u32::try_from(count).context("--trace: too many traces")?,
        steps: 1,
        start_spread_seconds: Some(spread),
        seed,
        ..SyntheticWorkload::default()
    };
    Ok(synthetic_jobs(&workload, config)?.into_iter().map(|job| job.start_seconds).collect())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let strategies = parse_strategies(&args.strategy)?;
    let config = config(&args)?;
    let (jobs, label) = jobs(&args, &config)?;
    let mut report = compare_strategies(&jobs, &config, &strategies).context("simulation")?;
    if args.json {
        if !args.decisions {
            for strategy in &mut report.strategies {
                strategy.decisions.clear();
            }
        }
        let mut output = serde_json::to_value(&report)?;
        output["workload"] = json!(label);
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        println!(
            "{label}; burst buffer {}/s, PFS {}/s, node-local {}/s and {} per node; \
             interference alpha {} beyond {} writers; PFS writers max {}\n",
            format_bytes(config.bb_bandwidth_bytes_per_s),
            format_bytes(config.pfs_bandwidth_bytes_per_s),
            format_bytes(config.local_bandwidth_bytes_per_s),
            format_bytes(config.local_capacity_bytes),
            config.interference_alpha,
            config.interference_knee,
            config.pfs_writers_max
        );
        print!("{}", ias_table(&report));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_and_sizes_parse_or_name_the_flag() {
        assert_eq!(
            parse_strategies("measured, baseline,measured").unwrap(),
            vec![Strategy::Measured, Strategy::Baseline]
        );
        assert!(parse_strategies("fastest").unwrap_err().to_string().contains("--strategy"));
        assert_eq!(size_flag("--bb-bandwidth", "8GiB/s").unwrap(), 8 << 30);
        let error = size_flag("--pfs-bandwidth", "fast").unwrap_err().to_string();
        assert!(error.contains("--pfs-bandwidth"), "{error}");
    }
}
