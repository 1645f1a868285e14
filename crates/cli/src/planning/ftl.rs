//! `spillway ftl`: the FTL simulator. Subcommands run one workload (`run`), check the model
//! against its closed form (`validate`), or reproduce and extend the BIOS experiment
//! (`bios-experiment`). Device shape and NAND timing come from the `ftl` knobs; flags override.

use anyhow::Context;
use spillway_ftl::bios;
use spillway_ftl::experiment::{self, ExperimentParams};
use spillway_ftl::replay::{self, ReplayParams};
use spillway_ftl::report::RunReport;
use spillway_ftl::synthetic::{self, Skew, SyntheticParams};
use spillway_ftl::workload::{DeleteRuleName, WorkloadError, WorkloadKind, WorkloadSpec};
use spillway_ftl::{analytic, FtlKnobs, Mapping, SsdConfig, VictimPolicy};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Run one workload under one or more stream mappings.
    Run(Box<RunArgs>),
    /// Uniform random writes vs the closed form WAF = α/(α+W₀(−αe^−α)), FIFO and greedy.
    Validate(ValidateArgs),
    /// BIOS synthetic setup: legacy / user-ID / per-job / lifetime-aware, configs 1–3, stripe sweep.
    BiosExperiment(ExperimentArgs),
}

/// Device flags shared by the subcommands (override the `ftl` knobs).
#[derive(clap::Args, Clone)]
struct DeviceArgs {
    /// Erase blocks per SSD.
    #[arg(long)]
    blocks_per_ssd: Option<u32>,
    /// Pages per erase block.
    #[arg(long)]
    pages_per_block: Option<u32>,
    /// NAND page size in bytes.
    #[arg(long)]
    page_bytes: Option<u32>,
    /// Fraction of physical pages hidden from the host.
    #[arg(long)]
    overprovision_fraction: Option<f64>,
    /// Victim policy: greedy, fifo, cost-benefit.
    #[arg(long, value_parser = parse_victim)]
    victim: Option<VictimPolicy>,
    /// Streams per SSD.
    #[arg(long)]
    streams: Option<u16>,
    /// GC copies: shared or per-stream.
    #[arg(long, value_parser = parse_gc_placement)]
    gc_placement: Option<spillway_ftl::GcPlacement>,
    /// SSDs behind the striping.
    #[arg(long)]
    ssds: Option<u16>,
    /// Stripe unit in bytes.
    #[arg(long)]
    stripe_unit_bytes: Option<u64>,
    /// File system discards deleted files' blocks (true) or leaves them valid until reused (false).
    #[arg(long)]
    trim_on_delete: Option<bool>,
    /// File system block allocator: stack, first-fit, next-fit.
    #[arg(long, value_parser = parse_lba_allocation)]
    lba_allocation: Option<spillway_ftl::volume::LbaAllocation>,
    /// Time model: queued (per-die queues, foreground GC blocks) or fluid (latency ÷ dies).
    #[arg(long, value_parser = parse_device_model)]
    device_model: Option<spillway_ftl::device::DeviceModel>,
    /// Queued model: host programs go ahead of GC work above the reserve (true) or not.
    #[arg(long)]
    gc_preemption: Option<bool>,
}

fn parse_device_model(text: &str) -> Result<spillway_ftl::device::DeviceModel, String> {
    spillway_ftl::device::DeviceModel::parse(text)
        .ok_or_else(|| format!("unknown device model {text:?} (queued, fluid)"))
}

fn parse_lba_allocation(text: &str) -> Result<spillway_ftl::volume::LbaAllocation, String> {
    spillway_ftl::volume::LbaAllocation::parse(text)
        .ok_or_else(|| format!("unknown LBA allocation {text:?} (stack, first-fit, next-fit)"))
}

fn parse_victim(text: &str) -> Result<VictimPolicy, String> {
    match text {
        "greedy" => Ok(VictimPolicy::Greedy),
        "fifo" => Ok(VictimPolicy::Fifo),
        "cost-benefit" | "cost_benefit" => Ok(VictimPolicy::CostBenefit),
        _ => Err(format!("unknown victim policy {text:?} (greedy, fifo, cost-benefit)")),
    }
}

fn parse_gc_placement(text: &str) -> Result<spillway_ftl::GcPlacement, String> {
    match text {
        "shared" => Ok(spillway_ftl::GcPlacement::Shared),
        "per-stream" | "per_stream" => Ok(spillway_ftl::GcPlacement::PerStream),
        _ => Err(format!("unknown GC placement {text:?} (shared, per-stream)")),
    }
}

fn parse_mapping(text: &str) -> Result<Mapping, String> {
    Mapping::parse(text).ok_or_else(|| {
        format!("unknown mapping {text:?} (legacy, user-id, per-job, lifetime-aware)")
    })
}

impl DeviceArgs {
    fn knobs(&self) -> FtlKnobs {
        let mut k = FtlKnobs::default();
        if let Some(v) = self.blocks_per_ssd {
            k.blocks_per_ssd = v
        }
        if let Some(v) = self.pages_per_block {
            k.pages_per_block = v
        }
        if let Some(v) = self.page_bytes {
            k.page_bytes = v
        }
        if let Some(v) = self.overprovision_fraction {
            k.overprovision_fraction = v
        }
        if let Some(v) = self.victim {
            k.victim = v
        }
        if let Some(v) = self.streams {
            k.streams_max = v
        }
        if let Some(v) = self.gc_placement {
            k.gc_placement = v
        }
        if let Some(v) = self.ssds {
            k.ssds = v
        }
        if let Some(v) = self.stripe_unit_bytes {
            k.stripe_unit_bytes = v
        }
        if let Some(v) = self.trim_on_delete {
            k.trim_on_delete = v
        }
        if let Some(v) = self.lba_allocation {
            k.lba_allocation = v
        }
        if let Some(v) = self.device_model {
            k.device_model = v
        }
        if let Some(on) = self.gc_preemption {
            k.gc_preemption = if on {
                spillway_ftl::device::GcPreemption::On
            } else {
                spillway_ftl::device::GcPreemption::Off
            }
        }
        k
    }

    fn ssd(&self) -> anyhow::Result<(FtlKnobs, SsdConfig)> {
        let knobs = self.knobs();
        let ssd = knobs.ssd_config().context("ftl knobs describe an impossible SSD")?;
        Ok((knobs, ssd))
    }
}

#[derive(clap::Args)]
struct RunArgs {
    /// Workload: uniform, hot-cold, bios, replay (the store's SSD write log, --log) or trace
    /// (a Spillway trace such as a converted Darshan log, --trace). Required unless the
    /// workload file sets it.
    #[arg(long, value_parser = parse_workload)]
    workload: Option<WorkloadKind>,
    /// TOML file describing the workload (keys as the flags below, with `_`; flags override it;
    /// see docs/design/ftl.md "Workloads").
    #[arg(long)]
    workload_file: Option<PathBuf>,
    /// Stream mappings to compare (comma separated): legacy, user-id, per-job, lifetime-aware.
    #[arg(long, value_delimiter = ',', value_parser = parse_mapping, default_value = "legacy")]
    mapping: Vec<Mapping>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write waf.svg and report.json into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    params: WorkloadArgs,
    #[command(flatten)]
    device: DeviceArgs,
}

/// Workload parameters as flags (the workload file's keys; defaults in docs/design/ftl.md).
#[derive(clap::Args)]
struct WorkloadArgs {
    /// The store's SSD write log (workload replay).
    #[arg(long)]
    log: Option<PathBuf>,
    /// A Spillway trace file (workload trace).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Host writes ÷ logical capacity (uniform/hot-cold: after the initial fill) [default 6].
    #[arg(long)]
    device_writes: Option<f64>,
    /// Seed of every random choice [default 1].
    #[arg(long)]
    seed: Option<u64>,
    /// WAF samples over the run [default 60].
    #[arg(long)]
    samples: Option<u32>,
    /// Hot/cold: fraction of the space that is hot, in (0, 1) [default 0.2].
    #[arg(long)]
    hot_space_fraction: Option<f64>,
    /// Hot/cold: fraction of writes that go to the hot space, in (0, 1) [default 0.8].
    #[arg(long)]
    hot_write_fraction: Option<f64>,
    /// BIOS: users per node (SSD); users in all = this × --ssds [default 8].
    #[arg(long)]
    users_per_node: Option<u16>,
    /// BIOS: threads per user, each writing files back to back [default 2].
    #[arg(long)]
    threads_per_user: Option<u16>,
    /// BIOS: relative write rate per user, comma separated, cycled over users [default 1].
    #[arg(long, value_delimiter = ',')]
    write_shares: Option<Vec<f64>>,
    /// BIOS: quota weight per user, comma separated, cycled over users [default: the lifetime
    /// class multipliers].
    #[arg(long, value_delimiter = ',')]
    capacity_shares: Option<Vec<f64>>,
    /// BIOS: quota multiplier per lifetime class, comma separated [default 1,2,4,8].
    #[arg(long, value_delimiter = ',')]
    lifetime_classes: Option<Vec<f64>>,
    /// BIOS grouping configuration 1, 2, 3, or 4 (every user its own lifetime class) [default 3].
    #[arg(long)]
    configuration: Option<u8>,
    /// BIOS: file size in bytes [default 67108864 = 64 MiB].
    #[arg(long)]
    file_bytes: Option<u64>,
    /// BIOS: SSDs per pool a file is striped over [default 4].
    #[arg(long)]
    stripe_count: Option<u16>,
    /// BIOS interleave: stripe rows a thread writes per turn before another thread's [default 1].
    #[arg(long)]
    rows_per_turn: Option<u32>,
    /// BIOS: what an over-quota user deletes: oldest-fraction or oldest-until-within-quota
    /// [default oldest-fraction].
    #[arg(long, value_parser = parse_delete_rule)]
    delete_rule: Option<DeleteRuleName>,
    /// BIOS, oldest-fraction: fraction of the user's files deleted, in (0, 1] [default 0.15].
    #[arg(long)]
    delete_fraction: Option<f64>,
    /// BIOS: fraction of the exported capacity quotas plus data in flight fill, in (0, 1]
    /// [default 1].
    #[arg(long)]
    device_utilisation: Option<f64>,
    /// BIOS, lifetime-aware: σ of a log-normal error on lifetime estimates [default 0 = exact].
    #[arg(long)]
    lifetime_estimate_noise: Option<f64>,
}

fn parse_workload(text: &str) -> Result<WorkloadKind, String> {
    WorkloadKind::parse(text).ok_or_else(|| {
        format!("unknown workload {text:?} (uniform, hot-cold, bios, replay, trace)")
    })
}

fn parse_delete_rule(text: &str) -> Result<DeleteRuleName, String> {
    DeleteRuleName::parse(text).ok_or_else(|| {
        format!("unknown delete rule {text:?} (oldest-fraction, oldest-until-within-quota)")
    })
}

impl RunArgs {
    /// The workload: the file's keys overridden by the flags, every value checked.
    fn spec(&self) -> anyhow::Result<WorkloadSpec> {
        let p = &self.params;
        let flags = WorkloadSpec {
            workload: self.workload,
            device_writes: p.device_writes,
            seed: p.seed,
            samples: p.samples,
            hot_space_fraction: p.hot_space_fraction,
            hot_write_fraction: p.hot_write_fraction,
            log: p.log.clone(),
            trace: p.trace.clone(),
            users_per_node: p.users_per_node,
            threads_per_user: p.threads_per_user,
            write_shares: p.write_shares.clone(),
            capacity_shares: p.capacity_shares.clone(),
            lifetime_classes: p.lifetime_classes.clone(),
            configuration: p.configuration,
            file_bytes: p.file_bytes,
            stripe_count: p.stripe_count,
            rows_per_turn: p.rows_per_turn,
            delete_rule: p.delete_rule,
            delete_fraction: p.delete_fraction,
            device_utilisation: p.device_utilisation,
            lifetime_estimate_noise: p.lifetime_estimate_noise,
        };
        flags.check("command line")?;
        let Some(path) = &self.workload_file else { return Ok(flags) };
        let merged = WorkloadSpec::read_file(path)?.overridden_by(flags);
        merged.check(&format!("workload file {} with the flags", path.display()))?;
        Ok(merged)
    }
}

#[derive(clap::Args)]
struct ValidateArgs {
    /// Erase blocks of the simulated SSD.
    #[arg(long, default_value_t = 4096)]
    blocks: u32,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct ExperimentArgs {
    #[arg(long)]
    json: bool,
    /// Directory for results.md, results.json and the SVG plots.
    #[arg(long, default_value = "ftl-results")]
    out: PathBuf,
    /// Host writes per run as multiples of the logical capacity.
    #[arg(long, default_value_t = 10.0)]
    device_writes: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Only run the base file system model (the knobs'), not also the no-discard ones.
    #[arg(long)]
    no_extra_file_systems: bool,
    #[command(flatten)]
    device: DeviceArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Run(a) => run_workload(*a),
        Command::Validate(a) => validate(a),
        Command::BiosExperiment(a) => bios_experiment(a),
    }
}

fn run_workload(args: RunArgs) -> anyhow::Result<()> {
    let (knobs, ssd) = args.device.ssd()?;
    let spec = args.spec()?;
    let kind = spec.kind()?;
    let events = load_events(&spec, kind)?;
    let bios_params = match kind {
        WorkloadKind::Bios => Some(spec.bios_params(
            ssd.clone(),
            knobs.ssds,
            knobs.stripe_unit_bytes,
            knobs.file_system(),
        )?),
        _ => None,
    };
    let mut reports: Vec<RunReport> = Vec::new();
    for &mapping in &args.mapping {
        let report = match (kind, &bios_params) {
            (_, Some(params)) => bios::run(params, mapping)?,
            (WorkloadKind::Uniform | WorkloadKind::HotCold, _) => {
                run_synthetic(&spec, &ssd, mapping)?
            }
            _ => {
                let params = ReplayParams {
                    ssd: ssd.clone(),
                    ssds: knobs.ssds,
                    stripe_unit_bytes: knobs.stripe_unit_bytes,
                    samples: spec.samples.unwrap_or(60),
                };
                replay::replay(&params, events.as_deref().unwrap_or(&[]), mapping)?
            }
        };
        reports.push(report);
    }
    if let Some(dir) = &args.out {
        write_run_outputs(dir, &reports)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&serde_json::json!({ "runs": reports }))?);
    } else {
        print_run_table(&reports);
    }
    Ok(())
}

/// The events of a replay (the store's write log) or trace workload; None for the others.
fn load_events(
    spec: &WorkloadSpec,
    kind: WorkloadKind,
) -> anyhow::Result<Option<Vec<replay::LogEvent>>> {
    let events = match kind {
        WorkloadKind::Replay => {
            let path = spec
                .log
                .as_ref()
                .ok_or(WorkloadError::Missing { workload: "replay", key: "log" })?;
            let file = std::fs::File::open(path)
                .with_context(|| format!("cannot open write log {}", path.display()))?;
            Some(replay::parse_log(std::io::BufReader::new(file), &path.display().to_string())?)
        }
        WorkloadKind::Trace => {
            let path = spec
                .trace
                .as_ref()
                .ok_or(WorkloadError::Missing { workload: "trace", key: "trace" })?;
            let trace = super::read_trace(path)?;
            Some(replay::events_from_trace(&trace))
        }
        _ => None,
    };
    Ok(events)
}

/// One uniform or hot/cold run under `mapping`.
fn run_synthetic(
    spec: &WorkloadSpec,
    ssd: &SsdConfig,
    mapping: Mapping,
) -> anyhow::Result<RunReport> {
    let params = SyntheticParams {
        ssd: ssd.clone(),
        skew: spec.skew(),
        device_writes: spec.device_writes(),
        samples: spec.samples.unwrap_or(60),
        seed: spec.seed.unwrap_or(1),
    };
    Ok(synthetic::run(&params, mapping)?)
}

/// Writes waf.svg (WAF over time, one line per run) and report.json into `dir`.
fn write_run_outputs(dir: &std::path::Path, reports: &[RunReport]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let series: Vec<spillway_plot::Series> = reports
        .iter()
        .map(|r| spillway_plot::Series {
            name: r.label.clone(),
            points: r.samples.iter().map(|s| (s.device_writes, s.waf_window)).collect(),
        })
        .collect();
    let svg = spillway_plot::line_chart_svg(
        "WAF over time",
        "host writes ÷ logical capacity",
        "WAF (per interval)",
        &series,
    );
    write_file(&dir.join("waf.svg"), &svg)?;
    write_file(&dir.join("report.json"), &serde_json::to_string_pretty(reports)?)
}

/// Prints the runs as a markdown table, one row per run.
fn print_run_table(reports: &[RunReport]) {
    println!("| run | WAF steady | steady window (device-writes) | WAF cumulative | GC copies | erases | MiB/s | p99 ms | host Mpages/s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        let window = &r.steady_window;
        println!(
            "| {} | {:.3} | {:.2}–{:.2}{} | {:.3} | {} | {} | {} | {} | {:.2} |",
            r.label,
            r.waf_steady,
            window.start_device_writes,
            window.end_device_writes,
            if window.reached { "" } else { " (not reached)" },
            r.waf_cumulative,
            r.gc_copied_pages,
            r.erases,
            r.throughput_mib_per_s.map_or("-".into(), |t| format!("{t:.0}")),
            r.file_write_latency
                .as_ref()
                .map_or("-".into(), |l| format!("{:.0}", l.latency_ms_p99)),
            r.wall.as_ref().map_or(0.0, |w| w.host_page_writes_per_second / 1e6),
        );
    }
    for r in reports {
        if let Some(note) = &r.steady_window.note {
            println!("\n{}: {note}", r.label);
        }
    }
}

fn write_file(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

#[derive(serde::Serialize)]
struct ValidationRow {
    overprovision_fraction: f64,
    alpha: f64,
    closed_form_waf: f64,
    fifo_waf: f64,
    fifo_error_percent: f64,
    greedy_waf_by_pages_per_block: Vec<(u32, f64)>,
}

fn validate(args: ValidateArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for &op in &[0.07, 0.14, 0.21, 0.28] {
        let run = |victim, pages_per_block: u32| -> anyhow::Result<(f64, f64)> {
            let blocks = (args.blocks as u64 * 64 / pages_per_block as u64) as u32;
            let mut ssd = SsdConfig::with_overprovisioning(blocks, pages_per_block, 4096, op);
            ssd.victim = victim;
            ssd.gc_reserve_blocks = 1;
            let alpha = ssd.physical_pages() as f64 / ssd.logical_pages as f64;
            let params = SyntheticParams {
                ssd,
                skew: Skew::Uniform,
                device_writes: 8.0,
                samples: 10,
                seed: 1,
            };
            Ok((alpha, synthetic::run(&params, Mapping::Legacy)?.waf_steady))
        };
        let (alpha, fifo) = run(VictimPolicy::Fifo, 64)?;
        let closed = analytic::fifo_uniform_waf(alpha);
        let mut greedy = Vec::new();
        for ppb in [16, 64, 256] {
            greedy.push((ppb, run(VictimPolicy::Greedy, ppb)?.1));
        }
        rows.push(ValidationRow {
            overprovision_fraction: op,
            alpha,
            closed_form_waf: closed,
            fifo_waf: fifo,
            fifo_error_percent: (fifo - closed) / closed * 100.0,
            greedy_waf_by_pages_per_block: greedy,
        });
    }
    if args.json {
        println!("{}", serde_json::to_string(&serde_json::json!({ "validation": rows }))?);
    } else {
        println!("| OP | α | closed form | FIFO sim | error % | greedy ppb=16 | greedy ppb=64 | greedy ppb=256 |");
        println!("|---|---|---|---|---|---|---|---|");
        for r in &rows {
            let g = &r.greedy_waf_by_pages_per_block;
            println!(
                "| {:.2} | {:.4} | {:.3} | {:.3} | {:+.2} | {:.3} | {:.3} | {:.3} |",
                r.overprovision_fraction,
                r.alpha,
                r.closed_form_waf,
                r.fifo_waf,
                r.fifo_error_percent,
                g[0].1,
                g[1].1,
                g[2].1
            );
        }
    }
    Ok(())
}

fn bios_experiment(args: ExperimentArgs) -> anyhow::Result<()> {
    let (knobs, ssd) = args.device.ssd()?;
    let mut params =
        ExperimentParams::bios(ssd, knobs.stripe_unit_bytes, args.device_writes, args.seed);
    params.base.nodes = knobs.ssds;
    params.base.fs = knobs.file_system();
    if args.no_extra_file_systems {
        params.extra_file_systems.clear();
    }
    let quiet = args.json;
    let result = experiment::run(&params, |row| {
        if !quiet {
            eprintln!(
                "  {} config {} stripe count {} {:<15} WAF {:.3}  ({:.1} s)",
                row.fs.name(),
                row.configuration,
                row.stripe_count,
                row.mapping_label(),
                row.report.waf_steady,
                row.report.wall.as_ref().map_or(0.0, |w| w.seconds)
            );
        }
    })?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let table = result.markdown();
    write_file(&args.out.join("results.md"), &table)?;
    for fs in result.file_systems() {
        for configuration in result.configurations(fs) {
            write_file(
                &args.out.join(result.waf_plot_file(fs, configuration)),
                &result.waf_plot(fs, configuration),
            )?;
        }
    }
    for &configuration in &params.sweep_configurations {
        write_file(
            &args.out.join(experiment::ExperimentResult::sweep_plot_file(configuration)),
            &result.sweep_plot(configuration),
        )?;
    }
    let json = serde_json::to_string(&result)?;
    write_file(&args.out.join("results.json"), &json)?;
    if args.json {
        println!("{json}");
    } else {
        println!("{table}");
        println!(
            "Wrote {}/results.md, results.json, waf_config*.svg and stripe_sweep*.svg",
            args.out.display()
        );
    }
    Ok(())
}
