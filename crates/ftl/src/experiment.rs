//! `spillway ftl bios-experiment`: the BIOS synthetic setup under four stream mappings and
//! three grouping configurations, plus the stripe-count sweep of BIOS 5.5.
//!
//! Setup (BIOS 5.2): 4 nodes × 8 users × 2 threads, one 8-stream SSD per node, 64 MiB files in
//! 512 KiB stripe units over all 4 SSDs, four lifetime classes with quota multipliers 1:2:4:8
//! (8 users each), 15 % of a user's oldest files deleted when over quota. The quotas plus data
//! in flight fill the exported capacity (a fully subscribed burst buffer). WAF is measured over
//! the second half of the run (BIOS measured after 30 of 60 minutes).
//!
//! Configuration 4 (ours): every user its own lifetime, quota multipliers 8^(u/31), to see how
//! lifetime-aware grouping does when no grouping can be perfect.
//!
//! Stripe sweep (BIOS 5.5): 8 users per SSD whatever the stripe count; stripe count 1, 2, 4
//! means 4, 2, 1 pools; legacy vs user-ID; on configuration 3 (the first model's choice) and on
//! configuration 2, which is what BIOS most likely swept: its stripe-count-4 gains (1.51× WAF,
//! 1.83× throughput) are exactly its configuration-2 gains of Figure 6, and BIOS 5.5 names no
//! configuration.
//!
//! File systems: everything above runs under the base file system model (TRIM on delete), then
//! configurations 1–3 and the stripe sweep run again under each of `extra_file_systems`
//! (by default a file system mounted without `discard` — how BIOS's BeeGFS targets ran, 5.6 —
//! under each of the three allocators, since BIOS does not say which file system it used and
//! the allocator decides when dead data dies in the FTL; see [`crate::volume`]).

use crate::bios::{self, BiosError, BiosParams};
use crate::device::{DeviceModel, GcPreemption};
use crate::mapping::Mapping;
use crate::report::RunReport;
use crate::ssd::SsdConfig;
use crate::volume::{FileSystemModel, LbaAllocation};
use spillway_plot::{line_chart_svg, Series};
use std::collections::BTreeMap;

/// Size of the experiment.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ExperimentParams {
    pub base: BiosParams,
    pub configurations: Vec<u8>,
    pub mappings: Vec<Mapping>,
    pub stripe_counts: Vec<u16>,
    /// Grouping configurations the stripe sweep runs on.
    pub sweep_configurations: Vec<u8>,
    /// Also run configuration 4: every user its own lifetime (quota multipliers spaced
    /// geometrically over the same 1–8 range), where no grouping is perfect.
    pub distinct_lifetimes: bool,
    /// Also run lifetime-aware with noisy estimates (log-normal σ) on configurations 3 and 4.
    pub estimate_noise_sigmas: Vec<f64>,
    /// Rerun configurations and stripe sweep under these file system models too.
    pub extra_file_systems: Vec<FileSystemModel>,
    /// Time models to compare with the base one (`base.ssd.timing`): configurations 1–3 under
    /// legacy, user-ID and lifetime-aware at stripe count 4, under the base file system and
    /// the no-TRIM stack one (when run). WAF does not depend on the time model except through
    /// the order in which the closed loop issues writes.
    pub compared_time_models: Vec<(DeviceModel, GcPreemption)>,
}

impl ExperimentParams {
    /// The BIOS setup on `ssd` SSDs of the given configuration.
    pub fn bios(
        ssd: SsdConfig,
        stripe_unit_bytes: u64,
        device_writes: f64,
        seed: u64,
    ) -> ExperimentParams {
        ExperimentParams {
            base: BiosParams::bios_setup(ssd, stripe_unit_bytes, device_writes, seed),
            configurations: vec![1, 2, 3],
            mappings: Mapping::ALL.to_vec(),
            stripe_counts: vec![1, 2, 4],
            sweep_configurations: vec![2, 3],
            distinct_lifetimes: true,
            estimate_noise_sigmas: vec![0.5, 1.0],
            extra_file_systems: [
                LbaAllocation::Stack,
                LbaAllocation::FirstFit,
                LbaAllocation::NextFit,
            ]
            .into_iter()
            .map(|allocation| FileSystemModel { allocation, trim_on_delete: false })
            .collect(),
            compared_time_models: vec![
                (DeviceModel::Fluid, GcPreemption::Off),
                (DeviceModel::Queued, GcPreemption::On),
            ],
        }
    }
}

/// One row of the results table.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ExperimentRow {
    pub configuration: u8,
    /// σ of the log-normal error on lifetime estimates (0 = exact).
    pub lifetime_estimate_noise: f64,
    pub stripe_count: u16,
    pub mapping: Mapping,
    /// File system model of the run.
    pub fs: FileSystemModel,
    /// Time model of the run.
    pub device_model: DeviceModel,
    pub gc_preemption: GcPreemption,
    pub report: RunReport,
}

impl ExperimentRow {
    /// The mapping name, with the estimate noise when there is some.
    pub fn mapping_label(&self) -> String {
        if self.lifetime_estimate_noise > 0.0 {
            format!("{} σ={}", self.mapping.name(), self.lifetime_estimate_noise)
        } else {
            self.mapping.name().to_string()
        }
    }
}

/// Everything the experiment measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ExperimentResult {
    /// Steady-state WAF per mapping on configuration 3 (stripe count 4), base file system.
    pub waf: BTreeMap<String, f64>,
    /// The same per file system model (name → mapping → WAF).
    pub waf_by_file_system: BTreeMap<String, BTreeMap<String, f64>>,
    /// Host page writes simulated per CPU second of the simulating thread (one core), all runs.
    pub page_writes_per_second: f64,
    /// Host writes + GC copies simulated per CPU second.
    pub nand_page_programs_per_second: f64,
    /// Host page writes per wall-clock second (lower when the machine is shared).
    pub page_writes_per_wall_second: f64,
    pub wall_seconds: f64,
    pub cpu_seconds: f64,
    pub rows: Vec<ExperimentRow>,
    pub params: ExperimentParams,
}

/// Runs every configuration × mapping at stripe count 4, then the stripe sweep. `progress` is
/// told about each finished run.
pub fn run(
    params: &ExperimentParams,
    progress: impl FnMut(&ExperimentRow),
) -> Result<ExperimentResult, BiosError> {
    let mut recorder = Recorder::new(progress);
    let base_fs = params.base.fs;
    let file_systems: Vec<FileSystemModel> = std::iter::once(base_fs)
        .chain(params.extra_file_systems.iter().copied().filter(|fs| *fs != base_fs))
        .collect();
    for &fs in &file_systems {
        run_configurations(params, fs, &mut recorder)?;
        run_stripe_sweep(params, fs, &mut recorder)?;
    }
    if params.distinct_lifetimes {
        run_distinct_lifetimes(params, &mut recorder)?;
    }
    run_estimate_noise(params, &mut recorder)?;
    run_time_models(params, &file_systems, &mut recorder)?;
    let Recorder { rows, host_pages, nand_pages, wall_seconds, cpu_seconds, .. } = recorder;
    let main = time_model_of(&params.base);
    let waf = configuration3_waf(&rows, base_fs, main);
    let waf_by_file_system =
        file_systems.iter().map(|&fs| (fs.name(), configuration3_waf(&rows, fs, main))).collect();
    Ok(ExperimentResult {
        waf,
        waf_by_file_system,
        page_writes_per_second: host_pages as f64 / cpu_seconds.max(1e-9),
        nand_page_programs_per_second: nand_pages as f64 / cpu_seconds.max(1e-9),
        page_writes_per_wall_second: host_pages as f64 / wall_seconds.max(1e-9),
        wall_seconds,
        cpu_seconds,
        rows,
        params: params.clone(),
    })
}

/// Collects the rows in run order, adds up the simulator's speed and tells `progress`.
struct Recorder<F> {
    rows: Vec<ExperimentRow>,
    host_pages: u64,
    nand_pages: u64,
    wall_seconds: f64,
    cpu_seconds: f64,
    progress: F,
}

impl<F: FnMut(&ExperimentRow)> Recorder<F> {
    /// An empty recorder that tells `progress` about each row.
    fn new(progress: F) -> Recorder<F> {
        Recorder {
            rows: Vec::new(),
            host_pages: 0,
            nand_pages: 0,
            wall_seconds: 0.0,
            cpu_seconds: 0.0,
            progress,
        }
    }

    /// Runs BIOS with `run_params` under `mapping` and records the row.
    fn run_and_record(
        &mut self,
        run_params: &BiosParams,
        mapping: Mapping,
        lifetime_estimate_noise: f64,
    ) -> Result<(), BiosError> {
        let report = bios::run(run_params, mapping)?;
        // The row's estimate noise is the caller's (0 for runs with exact estimates, whatever
        // the base parameters say); its other columns are those of `run_params`.
        self.record(ExperimentRow {
            configuration: run_params.configuration,
            lifetime_estimate_noise,
            stripe_count: run_params.stripe_count,
            mapping,
            fs: run_params.fs,
            device_model: run_params.ssd.timing.device_model,
            gc_preemption: run_params.ssd.timing.gc_preemption,
            report,
        });
        Ok(())
    }

    /// Adds a finished run's speed to the totals, tells `progress` and keeps the row.
    fn record(&mut self, row: ExperimentRow) {
        if let Some(wall_clock) = &row.report.wall {
            self.host_pages += row.report.host_pages;
            self.nand_pages += row.report.host_pages + row.report.gc_copied_pages;
            self.wall_seconds += wall_clock.seconds;
            self.cpu_seconds += wall_clock.cpu_seconds;
        }
        (self.progress)(&row);
        self.rows.push(row);
    }
}

/// Every configuration × mapping at stripe count 4 under `fs`.
fn run_configurations(
    params: &ExperimentParams,
    fs: FileSystemModel,
    recorder: &mut Recorder<impl FnMut(&ExperimentRow)>,
) -> Result<(), BiosError> {
    for &configuration in &params.configurations {
        for &mapping in &params.mappings {
            let run_params =
                BiosParams { configuration, stripe_count: 4, fs, ..params.base.clone() };
            recorder.run_and_record(&run_params, mapping, 0.0)?;
        }
    }
    Ok(())
}

/// The stripe-count sweep under `fs`, legacy and user-ID, skipping runs measured already.
fn run_stripe_sweep(
    params: &ExperimentParams,
    fs: FileSystemModel,
    recorder: &mut Recorder<impl FnMut(&ExperimentRow)>,
) -> Result<(), BiosError> {
    for &configuration in &params.sweep_configurations {
        for &stripe_count in &params.stripe_counts {
            if stripe_count == 4 && params.configurations.contains(&configuration) {
                continue; // measured above
            }
            for mapping in [Mapping::Legacy, Mapping::UserId] {
                let run_params =
                    BiosParams { configuration, stripe_count, fs, ..params.base.clone() };
                recorder.run_and_record(&run_params, mapping, 0.0)?;
            }
        }
    }
    Ok(())
}

/// Configuration 4 (every user its own lifetime) under legacy, user-ID and lifetime-aware.
fn run_distinct_lifetimes(
    params: &ExperimentParams,
    recorder: &mut Recorder<impl FnMut(&ExperimentRow)>,
) -> Result<(), BiosError> {
    let quota_classes = bios::distinct_quota_classes(params.base.users());
    for mapping in [Mapping::Legacy, Mapping::UserId, Mapping::LifetimeAware] {
        let run_params = BiosParams {
            configuration: 4,
            stripe_count: 4,
            quota_classes: quota_classes.clone(),
            ..params.base.clone()
        };
        recorder.run_and_record(&run_params, mapping, 0.0)?;
    }
    Ok(())
}

/// Lifetime-aware with noisy lifetime estimates, each σ on configurations 3 and 4.
fn run_estimate_noise(
    params: &ExperimentParams,
    recorder: &mut Recorder<impl FnMut(&ExperimentRow)>,
) -> Result<(), BiosError> {
    for &sigma in &params.estimate_noise_sigmas {
        for configuration in [3u8, 4] {
            let mut run_params = BiosParams {
                configuration,
                stripe_count: 4,
                lifetime_estimate_noise: sigma,
                ..params.base.clone()
            };
            if configuration == 4 {
                run_params.quota_classes = bios::distinct_quota_classes(params.base.users());
            }
            recorder.run_and_record(&run_params, Mapping::LifetimeAware, sigma)?;
        }
    }
    Ok(())
}

/// The time model of a run's parameters.
fn time_model_of(params: &BiosParams) -> (DeviceModel, GcPreemption) {
    (params.ssd.timing.device_model, params.ssd.timing.gc_preemption)
}

/// Configurations 1–3 × legacy, user-ID, lifetime-aware at stripe count 4 under each compared
/// time model, on the base file system and (when run) the no-TRIM stack one.
fn run_time_models(
    params: &ExperimentParams,
    file_systems: &[FileSystemModel],
    recorder: &mut Recorder<impl FnMut(&ExperimentRow)>,
) -> Result<(), BiosError> {
    let no_trim_stack = FileSystemModel { allocation: LbaAllocation::Stack, trim_on_delete: false };
    let compared_fs =
        file_systems.iter().copied().filter(|&fs| fs == params.base.fs || fs == no_trim_stack);
    for fs in compared_fs {
        for &(device_model, gc_preemption) in &params.compared_time_models {
            if (device_model, gc_preemption) == time_model_of(&params.base) {
                continue;
            }
            for &configuration in &params.configurations {
                for mapping in [Mapping::Legacy, Mapping::UserId, Mapping::LifetimeAware]
                    .into_iter()
                    .filter(|m| params.mappings.contains(m))
                {
                    let mut run_params =
                        BiosParams { configuration, stripe_count: 4, fs, ..params.base.clone() };
                    run_params.ssd.timing.device_model = device_model;
                    run_params.ssd.timing.gc_preemption = gc_preemption;
                    recorder.run_and_record(&run_params, mapping, 0.0)?;
                }
            }
        }
    }
    Ok(())
}

/// Steady-state WAF per mapping on configuration 3 at stripe count 4, exact estimates, `fs`,
/// under the time model `main`.
fn configuration3_waf(
    rows: &[ExperimentRow],
    fs: FileSystemModel,
    main: (DeviceModel, GcPreemption),
) -> BTreeMap<String, f64> {
    rows.iter()
        .filter(|r| {
            r.configuration == 3
                && r.stripe_count == 4
                && r.lifetime_estimate_noise == 0.0
                && r.fs == fs
                && (r.device_model, r.gc_preemption) == main
        })
        .map(|r| (r.mapping.name().to_string(), r.report.waf_steady))
        .collect()
}

impl ExperimentResult {
    /// File system models that have rows: the base first, then the extras in run order.
    pub fn file_systems(&self) -> Vec<FileSystemModel> {
        let mut out: Vec<FileSystemModel> = Vec::new();
        for row in &self.rows {
            if !out.contains(&row.fs) {
                out.push(row.fs);
            }
        }
        out
    }

    /// Whether a row ran under the experiment's own time model (not a compared one).
    fn is_main(&self, row: &ExperimentRow) -> bool {
        (row.device_model, row.gc_preemption) == time_model_of(&self.params.base)
    }

    fn row(
        &self,
        fs: FileSystemModel,
        configuration: u8,
        stripe_count: u16,
        mapping: Mapping,
    ) -> Option<&RunReport> {
        self.row_under(fs, configuration, stripe_count, mapping, time_model_of(&self.params.base))
    }

    /// The row of a run under the time model `model`.
    fn row_under(
        &self,
        fs: FileSystemModel,
        configuration: u8,
        stripe_count: u16,
        mapping: Mapping,
        model: (DeviceModel, GcPreemption),
    ) -> Option<&RunReport> {
        self.rows
            .iter()
            .find(|r| {
                r.configuration == configuration
                    && r.stripe_count == stripe_count
                    && r.mapping == mapping
                    && r.lifetime_estimate_noise == 0.0
                    && r.fs == fs
                    && (r.device_model, r.gc_preemption) == model
            })
            .map(|r| &r.report)
    }

    /// Time models that have rows: the experiment's own first, then the compared ones.
    pub fn time_models(&self) -> Vec<(DeviceModel, GcPreemption)> {
        let mut out = vec![time_model_of(&self.params.base)];
        for row in &self.rows {
            let model = (row.device_model, row.gc_preemption);
            if !out.contains(&model) {
                out.push(model);
            }
        }
        out
    }

    /// Name of a time model: `fluid`, `queued` or `queued+preemption`.
    pub fn time_model_name(model: (DeviceModel, GcPreemption)) -> String {
        match model {
            (DeviceModel::Queued, GcPreemption::On) => "queued+preemption".to_string(),
            (device_model, _) => device_model.name().to_string(),
        }
    }

    /// Throughput gain against WAF gain of separation, per time model, configuration and file
    /// system (stripe count 4): the table that says whether throughput only tracks WAF.
    fn markdown_time_models(&self, out: &mut String) {
        let models = self.time_models();
        if models.len() < 2 {
            return;
        }
        out.push_str(&format!(
            "\n## Time models: throughput gain against WAF gain (stripe count 4)\n\n\
             Main model of the tables above: {}. Gains are legacy ÷ mapping for WAF and \
             p99, mapping ÷ legacy for throughput.\n\n\
             | file system | config | time model | legacy MiB/s | user_id WAF gain | user_id throughput gain | user_id p99 gain | lifetime_aware WAF gain | lifetime_aware throughput gain | legacy / user_id p99 ms |\n\
             |---|---|---|---|---|---|---|---|---|---|\n",
            Self::time_model_name(models[0])
        ));
        for fs in self.file_systems() {
            for &configuration in &self.params.configurations {
                for &model in &models {
                    let get = |m| self.row_under(fs, configuration, 4, m, model);
                    let (Some(l), Some(u), Some(a)) =
                        (get(Mapping::Legacy), get(Mapping::UserId), get(Mapping::LifetimeAware))
                    else {
                        continue;
                    };
                    let mib = |r: &RunReport| r.throughput_mib_per_s.unwrap_or(0.0);
                    let p99 = |r: &RunReport| {
                        r.file_write_latency.as_ref().map_or(0.0, |x| x.latency_ms_p99)
                    };
                    out.push_str(&format!(
                        "| {} | {configuration} | {} | {:.0} | {:.3}× | {:.3}× | {:.3}× | {:.3}× | {:.3}× | {:.0} / {:.0} |\n",
                        fs.name(),
                        Self::time_model_name(model),
                        mib(l),
                        l.waf_steady / u.waf_steady,
                        mib(u) / mib(l).max(1e-9),
                        p99(l) / p99(u).max(1e-9),
                        l.waf_steady / a.waf_steady,
                        mib(a) / mib(l).max(1e-9),
                        p99(l),
                        p99(u),
                    ));
                }
            }
        }
    }

    /// Heading text for a file system model.
    fn fs_title(fs: FileSystemModel) -> String {
        let trim =
            if fs.trim_on_delete { "TRIM on delete" } else { "no TRIM (mounted without discard)" };
        format!("{trim}, {} LBA allocation", fs.allocation.name())
    }

    /// The results as Markdown tables, one group per file system model.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        for fs in self.file_systems() {
            self.markdown_for(fs, &mut out);
        }
        self.markdown_time_models(&mut out);
        out.push_str(&format!(
            "\nSimulator speed: {:.2} M host page writes per CPU second on one core ({:.2} M NAND page programs/s incl. GC copies); {:.1} s CPU, {:.1} s wall ({:.2} M host page writes per wall second) for all runs.\n",
            self.page_writes_per_second / 1e6,
            self.nand_page_programs_per_second / 1e6,
            self.cpu_seconds,
            self.wall_seconds,
            self.page_writes_per_wall_second / 1e6,
        ));
        out
    }

    /// The Markdown tables of one file system model: WAF and latency, ratios, stripe sweeps.
    fn markdown_for(&self, fs: FileSystemModel, out: &mut String) {
        let title = Self::fs_title(fs);
        self.markdown_waf_table(fs, &title, out);
        self.markdown_ratios(fs, out);
        self.markdown_stripe_sweeps(fs, &title, out);
        out.push('\n');
    }

    /// Table of WAF, throughput, tail latency and wear per run at stripe count 4 under `fs`.
    fn markdown_waf_table(&self, fs: FileSystemModel, title: &str, out: &mut String) {
        out.push_str(&format!(
            "## File system: {title}\n\n\
             ### WAF, modelled throughput and file-write tail latency (stripe count 4, steady state)\n\n\
             | config | mapping | WAF | WAF cumulative | GC copies / host page | throughput MiB/s | p99 ms | p99.9 ms | erases max/mean per block |\n\
             |---|---|---|---|---|---|---|---|---|\n",
        ));
        for row in self.rows.iter().filter(|r| r.stripe_count == 4 && r.fs == fs && self.is_main(r))
        {
            let r = &row.report;
            let latency = r.file_write_latency.as_ref();
            let wear_max = r.per_ssd.iter().map(|s| s.erase_count_max).max().unwrap_or(0);
            let wear_mean = r.per_ssd.iter().map(|s| s.erase_count_mean).sum::<f64>()
                / r.per_ssd.len().max(1) as f64;
            out.push_str(&format!(
                "| {} | {} | {:.3} | {:.3} | {:.3} | {:.0} | {:.0} | {:.0} | {} / {:.1} |\n",
                row.configuration,
                row.mapping_label(),
                r.waf_steady,
                r.waf_cumulative,
                r.gc_copied_pages as f64 / r.host_pages.max(1) as f64,
                r.throughput_mib_per_s.unwrap_or(0.0),
                latency.map_or(0.0, |l| l.latency_ms_p99),
                latency.map_or(0.0, |l| l.latency_ms_p999),
                wear_max,
                wear_mean,
            ));
        }
        if self
            .rows
            .iter()
            .any(|r| r.fs == fs && (r.configuration == 4 || r.lifetime_estimate_noise > 0.0))
        {
            out.push_str("\nConfiguration 4 = every user its own lifetime (not in BIOS). σ = log-normal error of the lifetime estimates, drawn afresh at every stream decision.\n");
        }
    }

    /// Table of WAF and throughput ratios between mappings at stripe count 4 under `fs`.
    fn markdown_ratios(&self, fs: FileSystemModel, out: &mut String) {
        out.push_str("\n### Ratios (stripe count 4)\n\n| config | comparison | WAF ratio | throughput ratio |\n|---|---|---|---|\n");
        let pairs = [
            (Mapping::Legacy, Mapping::UserId),
            (Mapping::UserId, Mapping::LifetimeAware),
            (Mapping::PerJob, Mapping::LifetimeAware),
            (Mapping::Legacy, Mapping::LifetimeAware),
        ];
        for &configuration in &self.params.configurations {
            for (worse, better) in pairs {
                if configuration != 3 && worse != Mapping::Legacy {
                    continue;
                }
                if configuration != 3 && better == Mapping::LifetimeAware {
                    continue;
                }
                if let (Some(a), Some(b)) =
                    (self.row(fs, configuration, 4, worse), self.row(fs, configuration, 4, better))
                {
                    out.push_str(&format!(
                        "| {configuration} | {} ÷ {} | {:.3}× | {:.3}× |\n",
                        worse.name(),
                        better.name(),
                        a.waf_steady / b.waf_steady,
                        b.throughput_mib_per_s.unwrap_or(0.0)
                            / a.throughput_mib_per_s.unwrap_or(1.0).max(1e-9),
                    ));
                }
            }
        }
    }

    /// One stripe-count sweep table per swept configuration under `fs`: legacy against user-ID.
    fn markdown_stripe_sweeps(&self, fs: FileSystemModel, title: &str, out: &mut String) {
        for &configuration in &self.params.sweep_configurations {
            out.push_str(&format!(
                "\n### Stripe-count sweep (configuration {configuration}, 8 users per SSD; {title})\n\n| stripe count | legacy WAF | user_id WAF | WAF ratio | legacy MiB/s | user_id MiB/s | throughput ratio | legacy / user_id p99 ms |\n|---|---|---|---|---|---|---|---|\n"
            ));
            for &sc in &self.params.stripe_counts {
                if let (Some(l), Some(u)) = (
                    self.row(fs, configuration, sc, Mapping::Legacy),
                    self.row(fs, configuration, sc, Mapping::UserId),
                ) {
                    let p99 = |r: &RunReport| {
                        r.file_write_latency.as_ref().map_or(0.0, |x| x.latency_ms_p99)
                    };
                    out.push_str(&format!(
                        "| {sc} | {:.3} | {:.3} | {:.3}× | {:.0} | {:.0} | {:.3}× | {:.0} / {:.0} |\n",
                        l.waf_steady,
                        u.waf_steady,
                        l.waf_steady / u.waf_steady,
                        l.throughput_mib_per_s.unwrap_or(0.0),
                        u.throughput_mib_per_s.unwrap_or(0.0),
                        u.throughput_mib_per_s.unwrap_or(0.0)
                            / l.throughput_mib_per_s.unwrap_or(1.0).max(1e-9),
                        p99(l),
                        p99(u),
                    ));
                }
            }
        }
    }

    /// File name of the stripe-sweep plot of `configuration` (configuration 3 keeps the
    /// first model's name).
    pub fn sweep_plot_file(configuration: u8) -> String {
        if configuration == 3 {
            "stripe_sweep.svg".to_string()
        } else {
            format!("stripe_sweep_config{configuration}.svg")
        }
    }

    /// SVG of steady-state WAF against stripe count on `configuration`, legacy and user-ID, one
    /// pair of lines per file system model (BIOS Figure 9a).
    pub fn sweep_plot(&self, configuration: u8) -> String {
        let mut series: Vec<Series> = Vec::new();
        for fs in self.file_systems() {
            for mapping in [Mapping::Legacy, Mapping::UserId] {
                series.push(Series {
                    name: format!("{} {}", mapping.name(), fs.name()),
                    points: self
                        .params
                        .stripe_counts
                        .iter()
                        .filter_map(|&sc| {
                            self.row(fs, configuration, sc, mapping)
                                .map(|r| (sc as f64, r.waf_steady))
                        })
                        .collect(),
                });
            }
        }
        line_chart_svg(
            &format!("Stripe-count sweep (configuration {configuration})"),
            "stripe count (SSDs per file)",
            "steady-state WAF",
            &series,
        )
    }

    /// Configurations that have rows under `fs`, in order.
    pub fn configurations(&self, fs: FileSystemModel) -> Vec<u8> {
        let mut configurations: Vec<u8> =
            self.rows.iter().filter(|r| r.fs == fs).map(|r| r.configuration).collect();
        configurations.sort_unstable();
        configurations.dedup();
        configurations
    }

    /// File name of the WAF-over-time plot of `configuration` under `fs` (the base model keeps
    /// the plain name).
    pub fn waf_plot_file(&self, fs: FileSystemModel, configuration: u8) -> String {
        if Some(fs) == self.file_systems().first().copied() {
            format!("waf_config{configuration}.svg")
        } else {
            format!("waf_config{configuration}_{}.svg", fs.name().replace('+', "_"))
        }
    }

    /// SVG of windowed WAF over device writes for each mapping of `configuration` under `fs`.
    pub fn waf_plot(&self, fs: FileSystemModel, configuration: u8) -> String {
        let series: Vec<Series> = self
            .rows
            .iter()
            .filter(|r| {
                r.configuration == configuration
                    && r.stripe_count == 4
                    && r.fs == fs
                    && self.is_main(r)
            })
            .map(|r| Series {
                name: r.mapping_label(),
                points: r.report.samples.iter().map(|s| (s.device_writes, s.waf_window)).collect(),
            })
            .collect();
        line_chart_svg(
            &format!(
                "BIOS synthetic workload, configuration {configuration}, {}: WAF over time",
                Self::fs_title(fs)
            ),
            "host writes ÷ logical capacity",
            "WAF (per interval)",
            &series,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_types::{KIB, MIB};

    #[test]
    fn every_file_system_model_gets_its_own_rows_tables_and_plots() {
        let mut ssd = SsdConfig::with_overprovisioning(512, 64, 16 * 1024, 0.127);
        ssd.streams = 4;
        let mut params = ExperimentParams::bios(ssd, 256 * KIB, 2.0, 3);
        params.base.users_per_node = 4;
        params.base.file_bytes = 4 * MIB;
        params.base.samples = 10;
        params.configurations = vec![3];
        params.mappings = vec![Mapping::Legacy, Mapping::UserId];
        params.stripe_counts = vec![1, 4];
        params.sweep_configurations = vec![2, 3];
        params.distinct_lifetimes = false;
        params.estimate_noise_sigmas = vec![];
        params.extra_file_systems =
            vec![FileSystemModel { allocation: LbaAllocation::FirstFit, trim_on_delete: false }];
        params.compared_time_models = vec![(DeviceModel::Fluid, GcPreemption::Off)];
        let result = run(&params, |_| {}).unwrap();
        // Per file system: configuration 3 × 2 mappings at stripe count 4, then the sweep:
        // configuration 2 at stripe counts 1 and 4, configuration 3 at 1 (4 was measured);
        // then the fluid model on the base file system (the only compared one run here).
        assert_eq!(result.rows.len(), 2 * (2 + 2 * 2 + 2) + 2);
        let fluid_rows = result.rows.iter().filter(|r| r.device_model == DeviceModel::Fluid);
        assert_eq!(fluid_rows.count(), 2);
        let file_systems = result.file_systems();
        assert_eq!(file_systems, vec![FileSystemModel::default(), params.extra_file_systems[0]]);
        assert_eq!(result.waf.len(), 2);
        assert_eq!(result.waf_by_file_system.len(), 2);
        assert_eq!(result.waf_by_file_system[&FileSystemModel::default().name()], result.waf);
        let untrimmed = &result.waf_by_file_system["no_trim+first_fit"];
        assert!(
            untrimmed["legacy"] > result.waf["legacy"],
            "no-trim legacy {} trim {}",
            untrimmed["legacy"],
            result.waf["legacy"]
        );
        let table = result.markdown();
        assert!(
            table.contains("## File system: TRIM on delete, stack")
                && table.contains("## File system: no TRIM"),
            "{table}"
        );
        assert!(
            table.contains("Stripe-count sweep (configuration 2")
                && table.contains("Stripe-count sweep (configuration 3")
        );
        assert!(table.contains("## Time models: throughput gain against WAF gain"), "{table}");
        assert_eq!(result.waf_plot_file(file_systems[0], 3), "waf_config3.svg");
        assert_eq!(result.waf_plot_file(file_systems[1], 3), "waf_config3_no_trim_first_fit.svg");
        assert!(result.sweep_plot(2).contains("no_trim+first_fit"));
    }
}
