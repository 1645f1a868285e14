//! A workload description for `spillway ftl run`: a TOML file (`--workload-file W.toml`) and the
//! same parameters as flags, flags overriding the file. Every key is optional; what is not given
//! takes the BIOS 5.2 setup's value ([`BiosParams::bios_setup`]). Unknown keys are refused, and
//! every value is checked against its allowed range before anything runs, the error naming where
//! the value came from (the file or the command line), the key and the range.
//!
//! The device (blocks, pages, streams, SSDs, stripe unit, file system model) is not part of the
//! workload: it comes from the `[ftl]` knobs and the device flags.

use crate::bios::{self, BiosParams, DeleteRule};
use crate::ssd::SsdConfig;
use crate::synthetic::Skew;
use crate::volume::FileSystemModel;
use std::path::{Path, PathBuf};

/// Which workload runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadKind {
    Uniform,
    HotCold,
    Bios,
    /// The store's SSD write log (`log`).
    Replay,
    /// A Spillway trace, e.g. a converted Darshan log (`trace`).
    Trace,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 5] = [
        WorkloadKind::Uniform,
        WorkloadKind::HotCold,
        WorkloadKind::Bios,
        WorkloadKind::Replay,
        WorkloadKind::Trace,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Uniform => "uniform",
            WorkloadKind::HotCold => "hot_cold",
            WorkloadKind::Bios => "bios",
            WorkloadKind::Replay => "replay",
            WorkloadKind::Trace => "trace",
        }
    }

    /// Parses a name, with `-` or `_` between words.
    pub fn parse(text: &str) -> Option<WorkloadKind> {
        let text = text.replace('-', "_");
        WorkloadKind::ALL.into_iter().find(|k| k.name() == text)
    }
}

/// Which rule a user deletes by when over quota (see [`DeleteRule`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeleteRuleName {
    /// The oldest `delete_fraction` of the user's files, at least one (BIOS).
    OldestFraction,
    /// The oldest files until the user is within quota.
    OldestUntilWithinQuota,
}

impl DeleteRuleName {
    pub fn parse(text: &str) -> Option<DeleteRuleName> {
        match text.replace('-', "_").as_str() {
            "oldest_fraction" => Some(DeleteRuleName::OldestFraction),
            "oldest_until_within_quota" => Some(DeleteRuleName::OldestUntilWithinQuota),
            _ => None,
        }
    }
}

/// The parameters of a workload, each optional (unset = the default in the docs' table).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    pub workload: Option<WorkloadKind>,
    /// Host writes ÷ logical capacity (uniform/hot_cold: after the initial fill).
    pub device_writes: Option<f64>,
    pub seed: Option<u64>,
    /// WAF samples over the run.
    pub samples: Option<u32>,
    /// hot_cold: fraction of the logical space that is hot.
    pub hot_space_fraction: Option<f64>,
    /// hot_cold: fraction of the writes that go to the hot space.
    pub hot_write_fraction: Option<f64>,
    /// replay: the store's SSD write log.
    pub log: Option<PathBuf>,
    /// trace: a Spillway trace file.
    pub trace: Option<PathBuf>,
    /// bios: users per node (users in all = users_per_node × SSDs).
    pub users_per_node: Option<u16>,
    pub threads_per_user: Option<u16>,
    /// bios: relative write rates, cycled over users.
    pub write_shares: Option<Vec<f64>>,
    /// bios: quota weights, cycled over users (unset: lifetime class multipliers).
    pub capacity_shares: Option<Vec<f64>>,
    /// bios: quota multiplier per lifetime class.
    pub lifetime_classes: Option<Vec<f64>>,
    /// bios: grouping configuration 1–4.
    pub configuration: Option<u8>,
    pub file_bytes: Option<u64>,
    /// bios: SSDs per pool a file is striped over.
    pub stripe_count: Option<u16>,
    /// bios: stripe rows a thread writes per turn (the interleave).
    pub rows_per_turn: Option<u32>,
    pub delete_rule: Option<DeleteRuleName>,
    /// bios, delete_rule oldest_fraction: the fraction deleted.
    pub delete_fraction: Option<f64>,
    /// bios: fraction of the exported capacity the quotas (plus data in flight) fill.
    pub device_utilisation: Option<f64>,
    /// bios, lifetime-aware: σ of the log-normal error on lifetime estimates.
    pub lifetime_estimate_noise: Option<f64>,
}

/// Why a workload cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkloadError {
    #[error("cannot read workload file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("workload file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("{origin}: {key} = {value}: allowed {allowed}")]
    OutOfRange { origin: String, key: &'static str, value: String, allowed: String },
    #[error("{origin}: {key} applies only to the {applies_to} workload, not {workload}")]
    NotApplicable {
        origin: String,
        key: &'static str,
        applies_to: &'static str,
        workload: &'static str,
    },
    #[error("no workload given: set workload in the file or --workload")]
    NoWorkload,
    #[error("workload {workload} needs {key} (the file's {key} key or --{key})")]
    Missing { workload: &'static str, key: &'static str },
    #[error("workload bios: {0}")]
    Bios(#[from] bios::BiosError),
}

/// Default host writes ÷ logical capacity of `spillway ftl run`.
pub const DEFAULT_DEVICE_WRITES: f64 = 6.0;
/// Default hot/cold skew: 80 % of the writes to 20 % of the space.
pub const DEFAULT_HOT_SPACE_FRACTION: f64 = 0.2;
pub const DEFAULT_HOT_WRITE_FRACTION: f64 = 0.8;

impl WorkloadSpec {
    /// Reads and checks a workload file.
    pub fn read_file(path: &Path) -> Result<WorkloadSpec, WorkloadError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|source| WorkloadError::Read { path: name.clone(), source })?;
        WorkloadSpec::parse(&text, &name)
    }

    /// Parses and checks workload TOML; `source_name` names it in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<WorkloadSpec, WorkloadError> {
        let spec: WorkloadSpec = toml::from_str(text).map_err(|e| WorkloadError::Parse {
            path: source_name.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        spec.check(&format!("workload file {source_name}"))?;
        Ok(spec)
    }

    /// The spec as TOML (what `parse` reads back).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a workload spec serializes to TOML")
    }

    /// This spec with every key `over` sets replaced by `over`'s value (flags over a file).
    pub fn overridden_by(self, over: WorkloadSpec) -> WorkloadSpec {
        WorkloadSpec {
            workload: over.workload.or(self.workload),
            device_writes: over.device_writes.or(self.device_writes),
            seed: over.seed.or(self.seed),
            samples: over.samples.or(self.samples),
            hot_space_fraction: over.hot_space_fraction.or(self.hot_space_fraction),
            hot_write_fraction: over.hot_write_fraction.or(self.hot_write_fraction),
            log: over.log.or(self.log),
            trace: over.trace.or(self.trace),
            users_per_node: over.users_per_node.or(self.users_per_node),
            threads_per_user: over.threads_per_user.or(self.threads_per_user),
            write_shares: over.write_shares.or(self.write_shares),
            capacity_shares: over.capacity_shares.or(self.capacity_shares),
            lifetime_classes: over.lifetime_classes.or(self.lifetime_classes),
            configuration: over.configuration.or(self.configuration),
            file_bytes: over.file_bytes.or(self.file_bytes),
            stripe_count: over.stripe_count.or(self.stripe_count),
            rows_per_turn: over.rows_per_turn.or(self.rows_per_turn),
            delete_rule: over.delete_rule.or(self.delete_rule),
            delete_fraction: over.delete_fraction.or(self.delete_fraction),
            device_utilisation: over.device_utilisation.or(self.device_utilisation),
            lifetime_estimate_noise: over.lifetime_estimate_noise.or(self.lifetime_estimate_noise),
        }
    }

    /// Checks every set value against its allowed range; `origin` names where they came from.
    pub fn check(&self, origin: &str) -> Result<(), WorkloadError> {
        let out_of_range = |key, value: String, allowed: &str| WorkloadError::OutOfRange {
            origin: origin.to_string(),
            key,
            value,
            allowed: allowed.to_string(),
        };
        for (key, value, range) in self.fractions() {
            if let Some(v) = value {
                if !range.contains(v) {
                    return Err(out_of_range(key, v.to_string(), range.text));
                }
            }
        }
        for (key, value) in self.counts() {
            if value == Some(0) {
                return Err(out_of_range(key, "0".into(), "≥ 1"));
            }
        }
        if let Some(c) = self.configuration {
            if !(1..=4).contains(&c) {
                return Err(out_of_range("configuration", c.to_string(), "1, 2, 3 or 4"));
            }
        }
        for (key, weights) in self.weight_lists() {
            let Some(weights) = weights else { continue };
            if weights.is_empty() || weights.iter().any(|w| !(w.is_finite() && *w > 0.0)) {
                let allowed = "a non-empty list of finite weights > 0";
                return Err(out_of_range(key, format!("{weights:?}"), allowed));
            }
        }
        self.check_applies(origin)
    }

    /// Real-valued keys with their allowed ranges.
    fn fractions(&self) -> [(&'static str, Option<f64>, Range); 6] {
        [
            ("device_writes", self.device_writes, Range::POSITIVE),
            ("hot_space_fraction", self.hot_space_fraction, Range::OPEN_UNIT),
            ("hot_write_fraction", self.hot_write_fraction, Range::OPEN_UNIT),
            ("delete_fraction", self.delete_fraction, Range::HALF_OPEN_UNIT),
            ("device_utilisation", self.device_utilisation, Range::HALF_OPEN_UNIT),
            ("lifetime_estimate_noise", self.lifetime_estimate_noise, Range::NON_NEGATIVE),
        ]
    }

    /// Keys that count something and must be at least 1.
    fn counts(&self) -> [(&'static str, Option<u64>); 6] {
        [
            ("samples", self.samples.map(u64::from)),
            ("users_per_node", self.users_per_node.map(u64::from)),
            ("threads_per_user", self.threads_per_user.map(u64::from)),
            ("file_bytes", self.file_bytes),
            ("stripe_count", self.stripe_count.map(u64::from)),
            ("rows_per_turn", self.rows_per_turn.map(u64::from)),
        ]
    }

    fn weight_lists(&self) -> [(&'static str, Option<&Vec<f64>>); 3] {
        [
            ("write_shares", self.write_shares.as_ref()),
            ("capacity_shares", self.capacity_shares.as_ref()),
            ("lifetime_classes", self.lifetime_classes.as_ref()),
        ]
    }

    /// Refuses keys of another workload than the one set (a typo'd workload would otherwise
    /// silently ignore them), and delete_fraction under a rule that has no fraction.
    fn check_applies(&self, origin: &str) -> Result<(), WorkloadError> {
        let Some(kind) = self.workload else { return Ok(()) };
        let not_applicable = |key, applies_to| WorkloadError::NotApplicable {
            origin: origin.to_string(),
            key,
            applies_to,
            workload: kind.name(),
        };
        for (key, set, applies_to) in self.workload_specific_keys() {
            if set && applies_to != kind {
                return Err(not_applicable(key, applies_to.name()));
            }
        }
        if self.delete_rule == Some(DeleteRuleName::OldestUntilWithinQuota)
            && self.delete_fraction.is_some()
        {
            return Err(not_applicable("delete_fraction", "bios with delete_rule oldest_fraction"));
        }
        Ok(())
    }

    /// Keys that belong to one workload: (key, whether set, the workload).
    fn workload_specific_keys(&self) -> Vec<(&'static str, bool, WorkloadKind)> {
        use WorkloadKind::{Bios, HotCold, Replay, Trace};
        vec![
            ("hot_space_fraction", self.hot_space_fraction.is_some(), HotCold),
            ("hot_write_fraction", self.hot_write_fraction.is_some(), HotCold),
            ("log", self.log.is_some(), Replay),
            ("trace", self.trace.is_some(), Trace),
            ("users_per_node", self.users_per_node.is_some(), Bios),
            ("threads_per_user", self.threads_per_user.is_some(), Bios),
            ("write_shares", self.write_shares.is_some(), Bios),
            ("capacity_shares", self.capacity_shares.is_some(), Bios),
            ("lifetime_classes", self.lifetime_classes.is_some(), Bios),
            ("configuration", self.configuration.is_some(), Bios),
            ("file_bytes", self.file_bytes.is_some(), Bios),
            ("stripe_count", self.stripe_count.is_some(), Bios),
            ("rows_per_turn", self.rows_per_turn.is_some(), Bios),
            ("delete_rule", self.delete_rule.is_some(), Bios),
            ("delete_fraction", self.delete_fraction.is_some(), Bios),
            ("device_utilisation", self.device_utilisation.is_some(), Bios),
            ("lifetime_estimate_noise", self.lifetime_estimate_noise.is_some(), Bios),
        ]
    }

    /// The workload to run.
    pub fn kind(&self) -> Result<WorkloadKind, WorkloadError> {
        self.workload.ok_or(WorkloadError::NoWorkload)
    }

    pub fn device_writes(&self) -> f64 {
        self.device_writes.unwrap_or(DEFAULT_DEVICE_WRITES)
    }

    /// The skew of a uniform or hot/cold run.
    pub fn skew(&self) -> Skew {
        match self.workload {
            Some(WorkloadKind::HotCold) => Skew::HotCold {
                hot_space_fraction: self.hot_space_fraction.unwrap_or(DEFAULT_HOT_SPACE_FRACTION),
                hot_write_fraction: self.hot_write_fraction.unwrap_or(DEFAULT_HOT_WRITE_FRACTION),
            },
            _ => Skew::Uniform,
        }
    }

    /// The BIOS run this spec describes on `nodes` SSDs of `ssd` (checked: the errors name the
    /// key). Configuration 4 without lifetime classes gets one class per user.
    pub fn bios_params(
        &self,
        ssd: SsdConfig,
        nodes: u16,
        stripe_unit_bytes: u64,
        fs: FileSystemModel,
    ) -> Result<BiosParams, WorkloadError> {
        let mut p = BiosParams::bios_setup(
            ssd,
            stripe_unit_bytes,
            self.device_writes(),
            self.seed.unwrap_or(1),
        );
        p.nodes = nodes;
        p.fs = fs;
        p.samples = self.samples.unwrap_or(p.samples);
        p.users_per_node = self.users_per_node.unwrap_or(p.users_per_node);
        p.threads_per_user = self.threads_per_user.unwrap_or(p.threads_per_user);
        p.file_bytes = self.file_bytes.unwrap_or(p.file_bytes);
        p.stripe_count = self.stripe_count.unwrap_or(p.stripe_count);
        p.configuration = self.configuration.unwrap_or(p.configuration);
        p.rows_per_turn = self.rows_per_turn.unwrap_or(p.rows_per_turn);
        p.device_utilisation = self.device_utilisation.unwrap_or(p.device_utilisation);
        p.lifetime_estimate_noise = self.lifetime_estimate_noise.unwrap_or(0.0);
        p.write_shares = self.write_shares.clone().unwrap_or(p.write_shares);
        p.capacity_shares = self.capacity_shares.clone().unwrap_or_default();
        p.quota_classes = match (&self.lifetime_classes, p.configuration) {
            (Some(classes), _) => classes.clone(),
            (None, 4) => bios::distinct_quota_classes(p.users()),
            (None, _) => p.quota_classes,
        };
        p.delete_rule = match self.delete_rule {
            Some(DeleteRuleName::OldestUntilWithinQuota) => DeleteRule::OldestUntilWithinQuota,
            _ => DeleteRule::OldestFraction {
                fraction: self.delete_fraction.unwrap_or(bios::BIOS_DELETE_FRACTION),
            },
        };
        bios::user_quotas(&p)?;
        Ok(p)
    }
}

/// An allowed range of a real-valued key, with how errors spell it.
#[derive(Clone, Copy)]
struct Range {
    low: f64,
    low_inclusive: bool,
    high: f64,
    high_inclusive: bool,
    text: &'static str,
}

impl Range {
    const POSITIVE: Range = Range {
        low: 0.0,
        low_inclusive: false,
        high: f64::INFINITY,
        high_inclusive: false,
        text: "a finite number > 0",
    };
    const NON_NEGATIVE: Range = Range {
        low: 0.0,
        low_inclusive: true,
        high: f64::INFINITY,
        high_inclusive: false,
        text: "a finite number ≥ 0",
    };
    const OPEN_UNIT: Range =
        Range { low: 0.0, low_inclusive: false, high: 1.0, high_inclusive: false, text: "(0, 1)" };
    const HALF_OPEN_UNIT: Range =
        Range { low: 0.0, low_inclusive: false, high: 1.0, high_inclusive: true, text: "(0, 1]" };

    /// Whether `v` lies in the range (NaN never does).
    fn contains(self, v: f64) -> bool {
        let above = if self.low_inclusive { v >= self.low } else { v > self.low };
        let below = if self.high_inclusive { v <= self.high } else { v < self.high };
        above && below
    }
}
