//! `spillway characterize`: the DataWarp-paper characterization of one workflow pipeline's trace
//! against measured peaks (a `spillway bench peaks --json` file, or flags), with allocation
//! advice, as a terminal table, JSON, or a self-contained HTML report.
//!
//! Flags and output only; the method is `spillway_sim::characterize`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use spillway_policy::targets::Targets;
use spillway_sim::characterize::{
    characterize, characterize_profile, AllocationTarget, Characterization, Peaks, Profile,
};
use spillway_sim::report::{characterization_html, characterization_table};
use spillway_trace::JobMeta;

#[derive(clap::Args)]
pub struct Args {
    /// Trace of one workflow pipeline (Spillway trace format).
    #[arg(required_unless_present = "profile", conflicts_with = "profile")]
    pub trace: Option<PathBuf>,
    /// Instead of a trace: a measured profile as JSON (wall_seconds, data_time_seconds,
    /// metadata_time_seconds, bytes_read, bytes_written, read_ops, write_ops, metadata_ops,
    /// file_bytes), bare or as {"name": …, "profile": {…}}; see traces/profiles/.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    #[command(flatten)]
    pub peaks: PeakArgs,
    /// Concurrent pipelines the allocation must serve.
    #[arg(long, default_value_t = 1)]
    pub pipelines: u64,
    /// Capacity of one allocation unit (fragment), GiB.
    #[arg(long, default_value_t = 200)]
    pub fragment_gib: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write an HTML report with charts to this file.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Print only the `#BB_LUA` directive a job of --pipelines such pipelines should use:
    /// capacity and bandwidth, IOPS and metadata targets from the measured rates (with --json:
    /// the characterization with a `request` object added).
    #[arg(long)]
    pub request: bool,
}

/// The peaks of one allocation unit (one server), shared by `characterize` and `sim
/// --request` so both read the same source: a `spillway bench peaks --json` file, flags
/// overriding it, the DataWarp paper's Cori fragment by default.
#[derive(clap::Args)]
pub struct PeakArgs {
    /// Peaks measured by `spillway bench peaks --json` (its `peaks` object is used).
    #[arg(long)]
    pub peaks: Option<PathBuf>,
    /// Peak bandwidth, MiB/s (overrides the peaks file). Default: 6144 (DataWarp paper).
    #[arg(long)]
    pub peak_bandwidth_mib_per_s: Option<f64>,
    /// Peak 4 KiB operations per second (overrides the peaks file). Default: 90000.
    #[arg(long)]
    pub peak_iops: Option<f64>,
    /// Peak metadata operations per second (overrides the peaks file). Default: 25000.
    #[arg(long)]
    pub peak_metadata_ops_per_s: Option<f64>,
}

impl PeakArgs {
    /// The peaks file (or the Cori default) with the flags applied, checked.
    pub fn peaks(&self) -> anyhow::Result<Peaks> {
        let mut peaks = match &self.peaks {
            Some(path) => read_peaks(path)?,
            None => Peaks::datawarp_cori(),
        };
        if let Some(mib) = self.peak_bandwidth_mib_per_s {
            peaks.bandwidth_bytes_per_second = mib * 1024.0 * 1024.0;
        }
        if let Some(iops) = self.peak_iops {
            peaks.iops = iops;
        }
        if let Some(rate) = self.peak_metadata_ops_per_s {
            peaks.metadata_ops_per_second = rate;
        }
        Ok(peaks)
    }

    /// Whether the peaks are the paper's defaults (nothing measured given).
    pub fn defaulted(&self) -> bool {
        self.peaks.is_none() && self.peak_bandwidth_mib_per_s.is_none()
    }
}

/// Reads the `peaks` object of a bench-peaks JSON file (or a bare peaks object).
pub fn read_peaks(path: &Path) -> anyhow::Result<Peaks> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading peaks file {}", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("peaks file {} is not JSON", path.display()))?;
    let peaks = value.get("peaks").cloned().unwrap_or(value);
    serde_json::from_value(peaks).with_context(|| {
        format!(
            "peaks file {}: expected an object with bandwidth_bytes_per_second, iops and metadata_ops_per_second",
            path.display()
        )
    })
}

/// Reads a profile file: a bare [`Profile`] object or `{"name": …, "profile": {…}}`.
pub fn read_profile(path: &Path) -> anyhow::Result<(String, Profile)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading profile {}", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("profile {} is not JSON", path.display()))?;
    let name = value.get("name").and_then(|name| name.as_str()).unwrap_or_default().to_string();
    let profile = value.get("profile").cloned().unwrap_or(value);
    let profile = serde_json::from_value(profile)
        .with_context(|| format!("profile {}: not a profile object", path.display()))?;
    Ok((name, profile))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let peaks = args.peaks.peaks()?;
    if args.fragment_gib == 0 {
        bail!("--fragment-gib must be at least 1");
    }
    let target =
        AllocationTarget { pipelines: args.pipelines, fragment_bytes: args.fragment_gib << 30 };
    let result = match (&args.trace, &args.profile) {
        (Some(path), None) => {
            let trace = super::read_trace(path)?;
            characterize(&trace, &peaks, target)
                .with_context(|| format!("characterizing trace {}", path.display()))?
        }
        (None, Some(path)) => {
            let (name, profile) = read_profile(path)?;
            let job = JobMeta {
                source: format!("profile {}", path.display()),
                executable: name,
                ..JobMeta::default()
            };
            characterize_profile(&profile, job, &peaks, target)
                .with_context(|| format!("characterizing profile {}", path.display()))?
        }
        _ => bail!("give either a trace file or --profile, not both"),
    };
    if let Some(path) = &args.html {
        std::fs::write(path, characterization_html(&result))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.request {
        return print_request(&result, args.json);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        if args.peaks.defaulted() {
            println!("(peaks: the DataWarp paper's Cori fragment; measure yours with `spillway bench peaks`)\n");
        }
        print!("{}", characterization_table(&result));
    }
    Ok(())
}

/// The `#BB_LUA` line of the characterization's targets (docs/design/targets.md), which the
/// targets' own parser reads back; with `json`, the characterization with `request` added.
fn print_request(result: &Characterization, json: bool) -> anyhow::Result<()> {
    let targets = result.request_targets();
    if targets == Targets::default() {
        bail!("the trace asks for nothing: no file bytes, data or metadata operations to size a request by");
    }
    let directive = format!("#BB_LUA {targets}");
    if json {
        let mut value = serde_json::to_value(result)?;
        value["request"] = serde_json::json!({ "directive": directive, "targets": targets });
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        println!("{directive}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_file_is_a_bench_output_or_a_bare_object_and_errors_name_it() {
        let directory = tempfile::tempdir().unwrap();
        let bench = directory.path().join("bench.json");
        std::fs::write(&bench, r#"{"levels": [], "peaks": {"bandwidth_bytes_per_second": 1.0, "iops": 2.0, "metadata_ops_per_second": 3.0}}"#).unwrap();
        assert_eq!(read_peaks(&bench).unwrap().iops, 2.0);
        let bare = directory.path().join("bare.json");
        std::fs::write(
            &bare,
            r#"{"bandwidth_bytes_per_second": 4.0, "iops": 5.0, "metadata_ops_per_second": 6.0}"#,
        )
        .unwrap();
        assert_eq!(read_peaks(&bare).unwrap().metadata_ops_per_second, 6.0);
        let broken = directory.path().join("broken.json");
        std::fs::write(&broken, r#"{"peaks": {"iops": 1.0}}"#).unwrap();
        let message = format!("{:#}", read_peaks(&broken).unwrap_err());
        assert!(
            message.contains("broken.json") && message.contains("bandwidth_bytes_per_second"),
            "{message}"
        );
    }
}
