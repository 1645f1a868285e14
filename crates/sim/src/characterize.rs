//! Workflow characterization after Daley et al. (DataWarp paper, §3–5): a profile of one
//! workflow pipeline (I/O time split into data and metadata operations, bytes, operation counts)
//! is compared with the peaks of the allocation (bandwidth, IOPS, metadata ops/s) to say how much
//! of each peak one pipeline uses, what bounds it, how many concurrent pipelines saturate the
//! allocation, and what allocation to ask for.
//!
//! The formulas are the paper's, reproduced exactly (the test `table2` checks every derived row
//! of its Table 2): rate = amount / time in that class of operation; % of peak = 100 × rate /
//! peak; pipelines to saturate data = ⌈100 / max(% peak bandwidth, % peak IOPS)⌉ and metadata =
//! ⌈100 / % peak metadata⌉; data reuse = I/O bytes / total size of the files accessed. The
//! allocation advice is ours and is stated in docs/design/characterize.md.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use spillway_policy::targets::{round_up_bandwidth, round_up_capacity, round_up_ops_rate, Targets};
use spillway_trace::{JobMeta, Op, Trace, TraceOp};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The peaks of one allocation unit (a fragment), as measured by `spillway bench peaks`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    pub bandwidth_bytes_per_second: f64,
    /// Small (4 KiB) read/write operations per second.
    pub iops: f64,
    pub metadata_ops_per_second: f64,
}

impl Peaks {
    /// The estimates the DataWarp paper uses for one Cori fragment: 6 GiB/s, 90K IOPS, 25K
    /// metadata operations per second.
    pub fn datawarp_cori() -> Peaks {
        Peaks {
            bandwidth_bytes_per_second: 6.0 * GIB,
            iops: 90_000.0,
            metadata_ops_per_second: 25_000.0,
        }
    }

    pub fn validate(&self) -> Result<(), CharacterizeError> {
        for (name, value) in [
            ("bandwidth_bytes_per_second", self.bandwidth_bytes_per_second),
            ("iops", self.iops),
            ("metadata_ops_per_second", self.metadata_ops_per_second),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(CharacterizeError::BadPeak { name, value });
            }
        }
        Ok(())
    }
}

/// Why a characterization cannot be computed.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum CharacterizeError {
    #[error("peak {name} must be finite and positive (got {value})")]
    BadPeak { name: &'static str, value: f64 },
    #[error("the trace has no operations")]
    EmptyTrace,
    #[error("target pipelines must be at least 1")]
    ZeroPipelines,
    #[error("fragment_bytes must be at least 1")]
    ZeroFragment,
    #[error("profile field {name} must be finite and not negative (got {value})")]
    BadProfile { name: &'static str, value: f64 },
}

/// The measured inputs of one workflow pipeline (the upper groups of the paper's Table 2).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Profile {
    pub wall_seconds: f64,
    pub data_time_seconds: f64,
    pub metadata_time_seconds: f64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    pub metadata_ops: u64,
    /// Total size of the files accessed (largest extent per file).
    pub file_bytes: u64,
}

/// What bounds a pipeline's I/O at scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bound {
    Bandwidth,
    Iops,
    Metadata,
    /// No I/O at all.
    None,
}

impl Bound {
    pub fn name(self) -> &'static str {
        match self {
            Bound::Bandwidth => "bandwidth",
            Bound::Iops => "IOPS",
            Bound::Metadata => "metadata",
            Bound::None => "none",
        }
    }
}

/// One pipeline's I/O in seconds of a fragment at its peaks ([`Profile::seconds_at_peaks`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SecondsAtPeaks {
    pub bandwidth: f64,
    pub iops: f64,
    pub metadata: f64,
}

impl SecondsAtPeaks {
    /// The paper's "bandwidth-, IOPS- or metadata-bound depending on whether I/O time is
    /// dominated by large read/write operations, small read/write operations or file
    /// open/close/stat operations" (§2), with I/O time taken at the fragment's peaks. Comparing
    /// the percentages of peak instead would weigh a 0.01 s burst of opens at 80 % of the
    /// metadata peak above 100 s of streaming at 12 % of the bandwidth peak, and call a
    /// bandwidth benchmark metadata-bound.
    pub fn bound(&self) -> Bound {
        let SecondsAtPeaks { bandwidth, iops, metadata } = *self;
        if bandwidth == 0.0 && iops == 0.0 && metadata == 0.0 {
            Bound::None
        } else if metadata > bandwidth.max(iops) {
            Bound::Metadata
        } else if iops > bandwidth {
            Bound::Iops
        } else {
            Bound::Bandwidth
        }
    }
}

/// The derived rows of Table 2 (plus Table 3's reuse and read:write ratio).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub io_time_seconds: f64,
    pub io_time_percent: f64,
    pub io_bytes: u64,
    pub data_ops: u64,
    pub mean_transfer_bytes: f64,
    pub bandwidth_bytes_per_second: f64,
    pub percent_peak_bandwidth: f64,
    pub data_ops_per_second: f64,
    pub percent_peak_iops: f64,
    pub metadata_ops_per_second: f64,
    pub percent_peak_metadata: f64,
    /// None when the pipeline does no data I/O (it never saturates).
    pub pipelines_to_saturate_data: Option<u64>,
    pub pipelines_to_saturate_metadata: Option<u64>,
    pub bound: Bound,
    /// What decides `bound`: the pipeline's I/O in seconds at the fragment's peaks.
    pub seconds_at_peaks: SecondsAtPeaks,
    /// I/O bytes over total file size.
    pub data_reuse: Option<f64>,
    /// Bytes read over bytes written; None when nothing was written.
    pub read_write_ratio: Option<f64>,
}

fn rate(amount: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        amount / seconds
    } else {
        0.0
    }
}

/// ⌈100 / percent⌉, tolerant of floating-point noise at exact integers.
fn pipelines_to_saturate(percent: f64) -> Option<u64> {
    (percent > 0.0).then(|| ((100.0 / percent) - 1e-9).ceil().max(1.0) as u64)
}

impl Profile {
    /// Seconds one pipeline's I/O occupies each resource of a fragment running at its peaks:
    /// bytes at peak bandwidth, data operations at peak IOPS, metadata operations at the peak
    /// metadata rate. They depend on counts only, not on how fast the traced system was.
    pub fn seconds_at_peaks(&self, peaks: &Peaks) -> SecondsAtPeaks {
        SecondsAtPeaks {
            bandwidth: (self.bytes_read + self.bytes_written) as f64
                / peaks.bandwidth_bytes_per_second,
            iops: (self.read_ops + self.write_ops) as f64 / peaks.iops,
            metadata: self.metadata_ops as f64 / peaks.metadata_ops_per_second,
        }
    }

    pub fn metrics(&self, peaks: &Peaks) -> Metrics {
        let io_time_seconds = self.data_time_seconds + self.metadata_time_seconds;
        let io_bytes = self.bytes_read + self.bytes_written;
        let data_ops = self.read_ops + self.write_ops;
        let bandwidth = rate(io_bytes as f64, self.data_time_seconds);
        let data_ops_per_second = rate(data_ops as f64, self.data_time_seconds);
        let metadata_ops_per_second = rate(self.metadata_ops as f64, self.metadata_time_seconds);
        let percent_peak_bandwidth = 100.0 * bandwidth / peaks.bandwidth_bytes_per_second;
        let percent_peak_iops = 100.0 * data_ops_per_second / peaks.iops;
        let percent_peak_metadata = 100.0 * metadata_ops_per_second / peaks.metadata_ops_per_second;
        let data_percent = percent_peak_bandwidth.max(percent_peak_iops);
        let seconds_at_peaks = self.seconds_at_peaks(peaks);
        let bound = seconds_at_peaks.bound();
        Metrics {
            io_time_seconds,
            io_time_percent: if self.wall_seconds > 0.0 {
                100.0 * io_time_seconds / self.wall_seconds
            } else {
                0.0
            },
            io_bytes,
            data_ops,
            mean_transfer_bytes: if data_ops > 0 { io_bytes as f64 / data_ops as f64 } else { 0.0 },
            bandwidth_bytes_per_second: bandwidth,
            percent_peak_bandwidth,
            data_ops_per_second,
            percent_peak_iops,
            metadata_ops_per_second,
            percent_peak_metadata,
            pipelines_to_saturate_data: pipelines_to_saturate(data_percent),
            pipelines_to_saturate_metadata: pipelines_to_saturate(percent_peak_metadata),
            bound,
            seconds_at_peaks,
            data_reuse: (self.file_bytes > 0).then(|| io_bytes as f64 / self.file_bytes as f64),
            read_write_ratio: (self.bytes_written > 0)
                .then(|| self.bytes_read as f64 / self.bytes_written as f64),
        }
    }
}

/// How a file is used by the pipeline, which decides its staging.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileRole {
    /// Software environment (interpreter modules, shared libraries): read-only, reused by every
    /// pipeline — keep it in a persistent reservation.
    Software,
    /// Read, never written: stage in (persistent if read more than once or by several ranks).
    Input,
    /// Read first, then written (a database updated in place): stage in and stage out.
    Updated,
    /// Written and removed within the pipeline: never leaves the burst buffer.
    Intermediate,
    /// Written and kept: stage out.
    Output,
    /// Only metadata operations.
    MetadataOnly,
}

/// Per-file usage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileUsage {
    pub name: String,
    pub role: FileRole,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub size_bytes: u64,
    pub ranks: u64,
    pub metadata_ops: u64,
}

/// A set of files with one role.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FileGroup {
    pub files: u64,
    pub bytes: u64,
    /// Up to ten example names, largest first.
    pub examples: Vec<String>,
}

/// Namespace layout of the allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Namespace {
    /// One namespace striped over the fragments (one metadata server).
    Striped,
    /// One namespace per compute node (one metadata server per fragment).
    Private,
}

/// What to ask the burst buffer for, for `pipelines` concurrent pipelines.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    pub pipelines: u64,
    pub fragment_bytes: u64,
    pub fragments: u64,
    pub fragments_for_capacity: u64,
    pub fragments_for_data: u64,
    pub fragments_for_metadata: u64,
    pub namespace: Namespace,
    pub stage_in: FileGroup,
    pub keep_persistent: FileGroup,
    pub stage_out: FileGroup,
    pub discard: FileGroup,
    pub advice: Vec<String>,
}

/// The whole characterization of one trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Characterization {
    pub job: JobMeta,
    /// Distinct ranks in the trace (1 for a measured profile). Above 1 the job is the pipeline:
    /// its data and metadata times are the job's busy times (when any of its ranks was in such
    /// an operation), and "pipelines" count jobs like this one.
    pub ranks: u64,
    pub peaks: Peaks,
    pub profile: Profile,
    pub metrics: Metrics,
    pub op_counts: BTreeMap<String, u64>,
    /// Data operations per power-of-two transfer size class: (lower bound bytes, count).
    pub transfer_size_histogram: Vec<(u64, u64)>,
    /// Cumulative (seconds since start, bytes read, bytes written), at most ~200 points.
    pub cumulative_bytes: Vec<(f64, u64, u64)>,
    pub files: Vec<FileUsage>,
    pub recommendation: Recommendation,
}

impl Characterization {
    /// The performance targets a job of `recommendation.pipelines` pipelines like this one
    /// should ask for (`spillway characterize --request`), the paper's Table 2 read as a
    /// request: each rate one pipeline achieves (bandwidth and IOPS over its data time,
    /// metadata over its metadata time, i.e. % of peak × peak) times the pipelines, as if all
    /// ran their I/O at once (the same worst case as "pipelines to saturate"), and the files'
    /// total size times the pipelines as capacity. Rounded up to two significant digits; a
    /// dimension the pipeline does not use is left out.
    pub fn request_targets(&self) -> Targets {
        let pipelines = self.recommendation.pipelines as f64;
        let metrics = &self.metrics;
        let positive = |value: u64| (value > 0).then_some(value);
        Targets {
            capacity_bytes: positive(self.profile.file_bytes).map(|bytes| {
                round_up_capacity(bytes.saturating_mul(self.recommendation.pipelines))
            }),
            bandwidth_bytes_per_s: positive(round_up_bandwidth(
                metrics.bandwidth_bytes_per_second * pipelines,
            )),
            iops: positive(round_up_ops_rate(metrics.data_ops_per_second * pipelines)),
            metadata_ops_per_s: positive(round_up_ops_rate(
                metrics.metadata_ops_per_second * pipelines,
            )),
        }
    }
}

/// Target of the allocation advice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationTarget {
    pub pipelines: u64,
    pub fragment_bytes: u64,
}

impl Default for AllocationTarget {
    /// One pipeline on Cori's 200 GiB fragments.
    fn default() -> Self {
        AllocationTarget { pipelines: 1, fragment_bytes: 200 << 30 }
    }
}

fn looks_like_software(name: &str) -> bool {
    const MARKERS: [&str; 8] =
        ["site-packages", "/lib/python", "/usr/lib", "/lib64/", "/conda/", "/env/", ".so", ".pyc"];
    MARKERS.iter().any(|marker| name.contains(marker)) || name.ends_with(".py")
}

#[derive(Default)]
struct FileAccumulator {
    bytes_read: u64,
    bytes_written: u64,
    extent: u64,
    first_data: Option<Op>,
    unlinked: bool,
    ranks: HashSet<u32>,
    metadata_ops: u64,
}

const RANKS_TRACKED_MAX: usize = 1024;

/// Characterizes one pipeline's trace against `peaks`.
/// Characterizes a pipeline from a measured profile (e.g. IPM or the paper's Table 2) instead
/// of a trace: the same metrics and advice, without per-file roles or time series.
pub fn characterize_profile(
    profile: &Profile,
    job: JobMeta,
    peaks: &Peaks,
    target: AllocationTarget,
) -> Result<Characterization, CharacterizeError> {
    peaks.validate()?;
    if target.pipelines == 0 {
        return Err(CharacterizeError::ZeroPipelines);
    }
    if target.fragment_bytes == 0 {
        return Err(CharacterizeError::ZeroFragment);
    }
    for (name, value) in [
        ("wall_seconds", profile.wall_seconds),
        ("data_time_seconds", profile.data_time_seconds),
        ("metadata_time_seconds", profile.metadata_time_seconds),
    ] {
        if !(value.is_finite() && value >= 0.0) {
            return Err(CharacterizeError::BadProfile { name, value });
        }
    }
    let metrics = profile.metrics(peaks);
    let recommendation = recommend(profile, &metrics, &[], target);
    let op_counts = BTreeMap::from([
        ("read".to_string(), profile.read_ops),
        ("write".to_string(), profile.write_ops),
        ("metadata".to_string(), profile.metadata_ops),
    ]);
    Ok(Characterization {
        job,
        ranks: 1,
        peaks: *peaks,
        profile: profile.clone(),
        metrics,
        op_counts,
        transfer_size_histogram: Vec::new(),
        cumulative_bytes: Vec::new(),
        files: Vec::new(),
        recommendation,
    })
}

pub fn characterize(
    trace: &Trace,
    peaks: &Peaks,
    target: AllocationTarget,
) -> Result<Characterization, CharacterizeError> {
    peaks.validate()?;
    if target.pipelines == 0 {
        return Err(CharacterizeError::ZeroPipelines);
    }
    if target.fragment_bytes == 0 {
        return Err(CharacterizeError::ZeroFragment);
    }
    if trace.ops.is_empty() {
        return Err(CharacterizeError::EmptyTrace);
    }
    let mut tally = Tally::default();
    for op in &trace.ops {
        tally.add(op);
    }
    let Tally {
        mut profile,
        op_counts,
        histogram,
        files,
        first_ns,
        last_ns,
        ranks,
        data_busy,
        metadata_busy,
    } = tally;
    profile.file_bytes = files.values().map(|file| file.extent).sum();
    profile.wall_seconds =
        trace.meta.wall_seconds().unwrap_or((last_ns.saturating_sub(first_ns)) as f64 / 1e9);
    let ranks = ranks.len() as u64;
    if ranks > 1 {
        // The job is the pipeline: its rates are what all its ranks achieve together, over
        // the time any of them is busy (a sum over ranks would make each rank a pipeline).
        profile.data_time_seconds = busy_seconds(data_busy);
        profile.metadata_time_seconds = busy_seconds(metadata_busy);
    }
    let metrics = profile.metrics(peaks);
    let usage = file_usage(trace, files);
    let mut recommendation = recommend(&profile, &metrics, &usage, target);
    if ranks > 1 {
        recommendation.advice.insert(0, format!(
            "The trace's {ranks} ranks are one job, characterized as one pipeline: its data and metadata times are the job's busy times (any rank in such an operation), not sums over ranks, and \"pipelines\" below are jobs like this one."
        ));
    }
    Ok(Characterization {
        job: trace.meta.clone(),
        ranks,
        peaks: *peaks,
        profile,
        metrics,
        op_counts,
        transfer_size_histogram: histogram.into_iter().collect(),
        cumulative_bytes: cumulative(trace, first_ns),
        files: usage,
        recommendation,
    })
}

/// Everything one pass over a trace's operations adds up.
struct Tally {
    profile: Profile,
    op_counts: BTreeMap<String, u64>,
    histogram: BTreeMap<u64, u64>,
    files: HashMap<u32, FileAccumulator>,
    first_ns: u64,
    last_ns: u64,
    ranks: HashSet<u32>,
    /// `[start, end)` of every data and every metadata operation (the job's busy times).
    data_busy: Vec<(u64, u64)>,
    metadata_busy: Vec<(u64, u64)>,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            profile: Profile::default(),
            op_counts: BTreeMap::new(),
            histogram: BTreeMap::new(),
            files: HashMap::new(),
            first_ns: u64::MAX,
            last_ns: 0,
            ranks: HashSet::new(),
            data_busy: Vec::new(),
            metadata_busy: Vec::new(),
        }
    }
}

impl Tally {
    fn add(&mut self, op: &TraceOp) {
        let Tally { profile, op_counts, histogram, files, .. } = self;
        self.ranks.insert(op.rank);
        let interval = (op.time_ns, op.time_ns.saturating_add(op.duration_ns));
        if op.op.is_data() {
            self.data_busy.push(interval);
        } else {
            self.metadata_busy.push(interval);
        }
        self.first_ns = self.first_ns.min(op.time_ns);
        self.last_ns = self.last_ns.max(interval.1);
        *op_counts.entry(op.op.name().to_string()).or_insert(0) += 1;
        let seconds = op.duration_ns as f64 / 1e9;
        let file = files.entry(op.file).or_default();
        if file.ranks.len() < RANKS_TRACKED_MAX {
            file.ranks.insert(op.rank);
        }
        match op.op {
            Op::Read | Op::Write => {
                profile.data_time_seconds += seconds;
                if op.op == Op::Read {
                    profile.read_ops += 1;
                    profile.bytes_read += op.length;
                    file.bytes_read += op.length;
                } else {
                    profile.write_ops += 1;
                    profile.bytes_written += op.length;
                    file.bytes_written += op.length;
                }
                file.first_data.get_or_insert(op.op);
                file.extent = file.extent.max(op.offset.saturating_add(op.length));
                let class =
                    if op.length == 0 { 0 } else { 1u64 << (63 - op.length.leading_zeros()) };
                *histogram.entry(class).or_insert(0) += 1;
            }
            other => {
                profile.metadata_time_seconds += seconds;
                profile.metadata_ops += 1;
                file.metadata_ops += 1;
                if other == Op::Unlink {
                    file.unlinked = true;
                }
            }
        }
    }
}

/// Seconds covered by the union of `[start, end)` nanosecond intervals.
fn busy_seconds(mut intervals: Vec<(u64, u64)>) -> f64 {
    intervals.sort_unstable();
    let mut total_ns = 0u64;
    let mut current: Option<(u64, u64)> = None;
    for (start, end) in intervals {
        current = match current {
            Some((from, to)) if start <= to => Some((from, to.max(end))),
            Some((from, to)) => {
                total_ns += to - from;
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    total_ns += current.map_or(0, |(from, to)| to - from);
    total_ns as f64 / 1e9
}

fn cumulative(trace: &Trace, first_ns: u64) -> Vec<(f64, u64, u64)> {
    const POINTS: usize = 200;
    let mut ordered: Vec<_> = trace.ops.iter().filter(|op| op.op.is_data()).collect();
    ordered.sort_by_key(|op| op.time_ns);
    let step = ordered.len().div_ceil(POINTS).max(1);
    let (mut read, mut written) = (0u64, 0u64);
    let mut points = vec![(0.0, 0, 0)];
    for (index, op) in ordered.iter().enumerate() {
        if op.op == Op::Read {
            read += op.length;
        } else {
            written += op.length;
        }
        if (index + 1) % step == 0 || index + 1 == ordered.len() {
            let end = op.time_ns.saturating_add(op.duration_ns).saturating_sub(first_ns);
            points.push((end as f64 / 1e9, read, written));
        }
    }
    points
}

fn file_usage(trace: &Trace, files: HashMap<u32, FileAccumulator>) -> Vec<FileUsage> {
    let mut usage: Vec<FileUsage> = files
        .into_iter()
        .map(|(id, file)| {
            let name =
                trace.files.get(id as usize).cloned().unwrap_or_else(|| format!("<file {id}>"));
            let role = match (file.first_data, file.bytes_written > 0, file.unlinked) {
                (None, _, _) => FileRole::MetadataOnly,
                (Some(_), true, true) => FileRole::Intermediate,
                (Some(Op::Read), true, false) => FileRole::Updated,
                (Some(_), true, false) => FileRole::Output,
                (Some(_), false, _) if looks_like_software(&name) => FileRole::Software,
                (Some(_), false, _) => FileRole::Input,
            };
            FileUsage {
                name,
                role,
                bytes_read: file.bytes_read,
                bytes_written: file.bytes_written,
                size_bytes: file.extent,
                ranks: file.ranks.len() as u64,
                metadata_ops: file.metadata_ops,
            }
        })
        .collect();
    usage.sort_by(|a, b| {
        (b.bytes_read + b.bytes_written)
            .cmp(&(a.bytes_read + a.bytes_written))
            .then(a.name.cmp(&b.name))
    });
    usage
}

fn group<'a>(files: impl Iterator<Item = &'a FileUsage>) -> FileGroup {
    let mut group = FileGroup::default();
    for file in files {
        group.files += 1;
        group.bytes += file.size_bytes;
        if group.examples.len() < 10 {
            group.examples.push(file.name.clone());
        }
    }
    group
}

/// How many fragments each need asks for, and the namespace layout that follows.
#[derive(Clone, Copy)]
struct Sizing {
    fragments: u64,
    fragments_for_capacity: u64,
    fragments_for_data: u64,
    fragments_for_metadata: u64,
    namespace: Namespace,
}

/// The files to keep persistent, stage in, stage out and discard.
struct Staging {
    keep_persistent: FileGroup,
    stage_in: FileGroup,
    stage_out: FileGroup,
    discard: FileGroup,
}

fn recommend(
    profile: &Profile,
    metrics: &Metrics,
    files: &[FileUsage],
    target: AllocationTarget,
) -> Recommendation {
    let pipelines = target.pipelines;
    let sizing = size_allocation(profile, metrics, target);
    let staging = stage_files(files);
    let mut advice = performance_advice(profile, metrics, pipelines, &sizing);
    advice.extend(staging_advice(metrics, &staging));
    Recommendation {
        pipelines,
        fragment_bytes: target.fragment_bytes,
        fragments: sizing.fragments,
        fragments_for_capacity: sizing.fragments_for_capacity,
        fragments_for_data: sizing.fragments_for_data,
        fragments_for_metadata: sizing.fragments_for_metadata,
        namespace: sizing.namespace,
        stage_in: staging.stage_in,
        keep_persistent: staging.keep_persistent,
        stage_out: staging.stage_out,
        discard: staging.discard,
        advice,
    }
}

/// Sizes the allocation: fragments for capacity, data and metadata, and the namespace layout.
fn size_allocation(profile: &Profile, metrics: &Metrics, target: AllocationTarget) -> Sizing {
    let pipelines = target.pipelines;
    let capacity_bytes = profile.file_bytes.saturating_mul(pipelines);
    let fragments_for_capacity = capacity_bytes.div_ceil(target.fragment_bytes).max(1);
    let data_percent = metrics.percent_peak_bandwidth.max(metrics.percent_peak_iops);
    let fragments_for_data = units_for(pipelines, data_percent, metrics.pipelines_to_saturate_data);
    let fragments_for_metadata =
        units_for(pipelines, metrics.percent_peak_metadata, metrics.pipelines_to_saturate_metadata);
    // A striped namespace has one metadata server whatever its size; only private namespaces
    // (one per node, each with its own metadata server) scale metadata with fragments.
    let namespace =
        if fragments_for_metadata > 1 { Namespace::Private } else { Namespace::Striped };
    let fragments = fragments_for_capacity.max(fragments_for_data).max(match namespace {
        Namespace::Private => fragments_for_metadata,
        Namespace::Striped => 1,
    });
    Sizing {
        fragments,
        fragments_for_capacity,
        fragments_for_data,
        fragments_for_metadata,
        namespace,
    }
}

/// Fragments (or metadata servers) `pipelines` pipelines need, each at `percent` of one's peak:
/// the paper's ⌈pipelines / pipelines to saturate⌉ while one pipeline stays within a peak
/// (`per` = ⌈100 / percent⌉), and the load itself, ⌈pipelines × percent / 100⌉, once one
/// pipeline alone is above it (the paper's formula would say 1 there, whatever the excess).
fn units_for(pipelines: u64, percent: f64, per: Option<u64>) -> u64 {
    if percent > 100.0 {
        let load = pipelines as f64 * percent / 100.0;
        return ((load - 1e-9).ceil() as u64).max(1);
    }
    per.map_or(1, |per| pipelines.div_ceil(per)).max(1)
}

/// Sorts the files into staging groups by their role and reuse.
fn stage_files(files: &[FileUsage]) -> Staging {
    let reused = |file: &&FileUsage| file.ranks > 1 || file.bytes_read > file.size_bytes;
    let keep_persistent = group(files.iter().filter(|file| {
        file.role == FileRole::Software || (file.role == FileRole::Input && reused(file))
    }));
    let stage_in =
        group(files.iter().filter(|file| matches!(file.role, FileRole::Input | FileRole::Updated)));
    let stage_out = group(
        files.iter().filter(|file| matches!(file.role, FileRole::Output | FileRole::Updated)),
    );
    let discard = group(files.iter().filter(|file| file.role == FileRole::Intermediate));
    Staging { keep_persistent, stage_in, stage_out, discard }
}

/// The advice on what bounds a pipeline and how to size and lay out the allocation.
fn performance_advice(
    profile: &Profile,
    metrics: &Metrics,
    pipelines: u64,
    sizing: &Sizing,
) -> Vec<String> {
    let Sizing {
        fragments,
        fragments_for_capacity,
        fragments_for_data,
        fragments_for_metadata,
        namespace,
    } = *sizing;
    let mut advice = Vec::new();
    if metrics.io_time_percent > 100.0 {
        advice.push(format!(
            "I/O time is {:.0}% of wall time: operations overlap (several ranks or threads) or include blocking waits (such as opening a named pipe). Rates per class of operation stay valid; the share of wall time does not.",
            metrics.io_time_percent
        ));
    }
    advice.push(bound_verdict(metrics));
    let data_percent = metrics.percent_peak_bandwidth.max(metrics.percent_peak_iops);
    let saturation = [
        (data_percent, metrics.pipelines_to_saturate_data, "one fragment's data path"),
        (
            metrics.percent_peak_metadata,
            metrics.pipelines_to_saturate_metadata,
            "one metadata server",
        ),
    ];
    for (percent, per, unit) in saturation {
        match per {
            // Above a peak already: the peak was measured lower than this pipeline achieved
            // (another target, a cache), or the pipeline needs several units on its own.
            Some(_) if percent > 100.0 => advice.push(format!(
                "One pipeline alone is at {} of {unit}'s peak ({:.1}×): it needs that many on its own, or the peaks were measured below what it achieved (re-measure them on the target).",
                percent_text(percent),
                percent / 100.0
            )),
            Some(per) => {
                advice.push(format!("About {per} concurrent pipelines saturate {unit}."));
            }
            None => {}
        }
    }
    advice.push(format!(
        "For {pipelines} pipeline(s): {fragments} fragment(s) — {fragments_for_capacity} for capacity ({} per pipeline), {fragments_for_data} for data performance{}.",
        spillway_types::format_bytes(profile.file_bytes),
        if namespace == Namespace::Private { format!(", {fragments_for_metadata} for metadata") } else { String::new() }
    ));
    if fragments_for_data > fragments_for_capacity
        || fragments_for_metadata > fragments_for_capacity
    {
        advice.push(
            "The allocation is sized by performance, not capacity: ask for it by performance target.".to_string(),
        );
    }
    match namespace {
        Namespace::Private => advice.push(
            "Use a private namespace per compute node: each node gets its own metadata server. Files shared between pipelines must then be staged into every namespace.".to_string(),
        ),
        Namespace::Striped => advice.push(
            "A striped (shared) namespace suffices: one metadata server keeps up with the metadata load.".to_string(),
        ),
    }
    if metrics.bound == Bound::Iops {
        advice.push("Transfers are small: aggregate them (larger buffers, fewer writes) before adding fragments.".to_string());
    }
    advice
}

/// What bounds one pipeline, with the seconds it was decided on and the percentages of peak.
fn bound_verdict(metrics: &Metrics) -> String {
    let at_peaks = metrics.seconds_at_peaks;
    format!(
        "One pipeline is {}-bound: at one fragment's peaks its I/O takes {} of bandwidth, {} of IOPS and {} of metadata service; it ran at {} of peak bandwidth, {} of peak IOPS, {} of peak metadata rate.",
        metrics.bound.name(),
        seconds_text(at_peaks.bandwidth),
        seconds_text(at_peaks.iops),
        seconds_text(at_peaks.metadata),
        percent_text(metrics.percent_peak_bandwidth),
        percent_text(metrics.percent_peak_iops),
        percent_text(metrics.percent_peak_metadata)
    )
}

fn percent_text(value: f64) -> String {
    format!("{value:.1}%")
}

/// Three significant digits from microseconds to hours.
fn seconds_text(seconds: f64) -> String {
    if seconds == 0.0 {
        "0 s".to_string()
    } else if seconds < 0.01 {
        format!("{:.3} ms", seconds * 1e3)
    } else {
        format!("{seconds:.3} s")
    }
}

/// The advice on which files to keep persistent, stage in, discard and stage out.
fn staging_advice(metrics: &Metrics, staging: &Staging) -> Vec<String> {
    let Staging { keep_persistent, stage_in, stage_out, discard } = staging;
    let mut advice = Vec::new();
    if keep_persistent.files > 0 {
        advice.push(format!(
            "Keep {} file(s), {} (software environment and reused inputs) in a persistent reservation instead of staging them per job.",
            keep_persistent.files,
            spillway_types::format_bytes(keep_persistent.bytes)
        ));
    }
    if stage_in.files > 0 {
        advice.push(format!(
            "Stage in {} file(s), {} before the job starts: reads dominate{}.",
            stage_in.files,
            spillway_types::format_bytes(stage_in.bytes),
            metrics
                .read_write_ratio
                .map_or(String::new(), |ratio| format!(" (read:write {ratio:.1})"))
        ));
    }
    if discard.files > 0 {
        advice.push(format!(
            "{} intermediate file(s), {} are removed by the pipeline: never stage them out.",
            discard.files,
            spillway_types::format_bytes(discard.bytes)
        ));
    }
    if stage_out.files > 0 {
        advice.push(format!(
            "Stage out {} file(s), {} at the end.",
            stage_out.files,
            spillway_types::format_bytes(stage_out.bytes)
        ));
    }
    advice
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1024.0 * 1024.0;

    /// One column of the DataWarp paper's Tables 1–3: the measured inputs and the derived rows
    /// as printed.
    struct Column {
        name: &'static str,
        wall_seconds: f64,
        data_seconds: f64,
        metadata_seconds: f64,
        io_mib: f64,
        data_ops: u64,
        metadata_ops: u64,
        /// Table 3 "Read:write I/O", to split the bytes.
        read_write_ratio: f64,
        /// Table 1 "Total file size (MiB)".
        file_mib: f64,
        // Derived rows of Table 2 (and Table 3's data reuse).
        io_time_percent: f64,
        mean_transfer_kib: f64,
        bandwidth_mib_s: f64,
        percent_bandwidth: f64,
        data_rate: f64,
        percent_iops: f64,
        metadata_rate: f64,
        percent_metadata: f64,
        pipelines_data: u64,
        pipelines_metadata: u64,
        data_reuse: f64,
    }

    const TABLE2: [Column; 4] = [
        Column {
            name: "SWarp rsmpl",
            wall_seconds: 10.7,
            data_seconds: 1.87,
            metadata_seconds: 0.30,
            io_mib: 2711.5,
            data_ops: 784,
            metadata_ops: 413,
            read_write_ratio: 2.0,
            file_mib: 1686.5,
            io_time_percent: 20.3,
            mean_transfer_kib: 3542.0,
            bandwidth_mib_s: 1452.0,
            percent_bandwidth: 23.6,
            data_rate: 420.0,
            percent_iops: 0.5,
            metadata_rate: 1381.0,
            percent_metadata: 5.5,
            pipelines_data: 5,
            pipelines_metadata: 19,
            data_reuse: 1.6,
        },
        Column {
            name: "SWarp coadd",
            wall_seconds: 4.7,
            data_seconds: 0.97,
            metadata_seconds: 0.26,
            io_mib: 1422.8,
            data_ops: 430,
            metadata_ops: 318,
            read_write_ratio: 13.4,
            file_mib: 1016.8,
            io_time_percent: 26.0,
            mean_transfer_kib: 3388.0,
            bandwidth_mib_s: 1465.0,
            percent_bandwidth: 23.8,
            data_rate: 443.0,
            percent_iops: 0.5,
            metadata_rate: 1237.0,
            percent_metadata: 4.9,
            pipelines_data: 5,
            pipelines_metadata: 21,
            data_reuse: 1.4,
        },
        Column {
            name: "CAMP db",
            wall_seconds: 15.3,
            data_seconds: 0.78,
            metadata_seconds: 1.28,
            io_mib: 25.3,
            data_ops: 7413,
            metadata_ops: 11963,
            read_write_ratio: 2.9,
            file_mib: 74.1,
            io_time_percent: 13.5,
            mean_transfer_kib: 3.0,
            bandwidth_mib_s: 32.0,
            percent_bandwidth: 0.5,
            data_rate: 9467.0,
            percent_iops: 10.5,
            metadata_rate: 9324.0,
            percent_metadata: 37.3,
            pipelines_data: 10,
            pipelines_metadata: 3,
            data_reuse: 0.3,
        },
        Column {
            name: "CAMP reprj",
            wall_seconds: 9.2,
            data_seconds: 0.57,
            metadata_seconds: 0.95,
            io_mib: 34.7,
            data_ops: 1735,
            metadata_ops: 7820,
            read_write_ratio: 12.7,
            file_mib: 77.5,
            io_time_percent: 16.6,
            mean_transfer_kib: 20.0,
            bandwidth_mib_s: 61.0,
            percent_bandwidth: 1.0,
            data_rate: 3060.0,
            percent_iops: 3.4,
            metadata_rate: 8240.0,
            percent_metadata: 33.0,
            pipelines_data: 30,
            pipelines_metadata: 4,
            data_reuse: 0.4,
        },
    ];

    fn profile_of(column: &Column) -> Profile {
        let bytes = column.io_mib * MIB;
        let read = bytes * column.read_write_ratio / (1.0 + column.read_write_ratio);
        let bytes_read = read.round() as u64;
        Profile {
            wall_seconds: column.wall_seconds,
            data_time_seconds: column.data_seconds,
            metadata_time_seconds: column.metadata_seconds,
            bytes_read,
            bytes_written: bytes.round() as u64 - bytes_read,
            // The paper does not split operations by direction; only their sum enters a formula.
            read_ops: column.data_ops,
            write_ops: 0,
            metadata_ops: column.metadata_ops,
            file_bytes: (column.file_mib * MIB).round() as u64,
        }
    }

    fn round_to(value: f64, decimals: i32) -> f64 {
        let scale = 10f64.powi(decimals);
        (value * scale).round() / scale
    }

    /// The paper prints its inputs rounded (times to 0.01 s, wall time to 0.1 s) and derived its
    /// rows from unrounded measurements, so a derived value recomputed from the printed inputs
    /// may differ from the printed one by the propagated input rounding. `tolerance` is that bound,
    /// relative; the printed value must lie within it.
    fn assert_close(
        column: &str,
        row: &str,
        computed: f64,
        printed: f64,
        relative_input_error: f64,
        decimals: i32,
    ) {
        let half_unit = 0.5 * 10f64.powi(-decimals);
        let bound = printed.abs() * relative_input_error + half_unit + 1e-9;
        assert!(
            (computed - printed).abs() <= bound,
            "{column}: {row} computed {computed:.4}, Table 2 prints {printed} (allowed ±{bound:.4})"
        );
    }

    /// Relative rounding error of the printed inputs of one column, per class of operation.
    struct InputErrors {
        data: f64,
        metadata: f64,
        wall: f64,
    }

    /// Derives the relative input errors of `column` from the precision Table 2 prints.
    fn input_errors(column: &Column) -> InputErrors {
        // Relative rounding error of the printed times: ±0.005 s over the time.
        let data = 0.005 / column.data_seconds;
        let metadata = 0.005 / column.metadata_seconds;
        let wall = 0.05 / column.wall_seconds + data.max(metadata);
        InputErrors { data, metadata, wall }
    }

    #[test]
    fn table2_columns_become_requests_by_target() {
        use spillway_policy::fragments::ServerSpace;
        use spillway_policy::namespace::NamespaceAccess;
        use spillway_policy::targets::{plan, Rates, ServerLoad, ServerPeaks, TargetRequest};
        let peaks = Peaks::datawarp_cori();
        let request_of = |column: &Column, pipelines| {
            let target = AllocationTarget { pipelines, ..AllocationTarget::default() };
            characterize_profile(&profile_of(column), JobMeta::default(), &peaks, target)
                .unwrap()
                .request_targets()
        };
        // CAMP-builddb × 64: 11963 / 1.28 s × 64 = 598,150 metadata ops/s → 600k; 7413 / 0.78 s
        // × 64 = 608,246 IOPS → 610k; 25.3 MiB / 0.78 s × 64 = 2,076 MiB/s → 2100; 74.1 MiB × 64
        // = 4,742 MiB → 4800.
        let camp = request_of(&TABLE2[2], 64);
        assert_eq!(
            camp.to_string(),
            "capacity=4800MiB bandwidth=2100MiB/s iops=610k metadata=600k/s"
        );
        assert_eq!(camp.to_string().parse::<Targets>(), Ok(camp));
        // Every target is at least the load and within the two-digit rounding of it.
        for column in &TABLE2 {
            let metrics = profile_of(column).metrics(&peaks);
            let targets = request_of(column, 16);
            for (target, load) in [
                (targets.bandwidth_bytes_per_s, metrics.bandwidth_bytes_per_second),
                (targets.iops, metrics.data_ops_per_second),
                (targets.metadata_ops_per_s, metrics.metadata_ops_per_second),
            ] {
                let (target, load) = (target.unwrap() as f64, load * 16.0);
                assert!(
                    target >= load && target <= load * 1.1,
                    "{}: {target} for {load}",
                    column.name
                );
            }
        }
        // On a pool of 30 Cori-like servers the CAMP request is metadata-bound: 600k ops/s is
        // above one striped namespace (25k), so private namespaces over 24 servers; SWarp × 16
        // (1450 MiB/s × 16 → 24,000 MiB/s) stripes over 4 servers of 6 GiB/s.
        let server = |id| ServerLoad {
            space: ServerSpace { server: id, free_bytes: 10 << 40, healthy: true, domain: None },
            peaks: ServerPeaks {
                bandwidth_bytes_per_s: 6 << 30,
                iops: 90_000,
                metadata_striped_ops_per_s: 25_000,
                metadata_private_ops_per_s: 25_000,
            },
            promised: Rates::default(),
        };
        let pool: Vec<ServerLoad> = (1..=30).map(server).collect();
        let request = |targets| TargetRequest {
            targets,
            fragment_bytes: 200 << 30,
            stripe_servers_max: 64,
            replicas: 1,
        };
        let camp_plan = plan(&pool, &request(camp)).unwrap();
        assert_eq!(camp_plan.namespace, NamespaceAccess::Private);
        assert_eq!(camp_plan.stripe_count(), 24);
        let swarp = request_of(&TABLE2[0], 16);
        assert_eq!(swarp.bandwidth_bytes_per_s, Some(24_000 << 20));
        let swarp_plan = plan(&pool, &request(swarp)).unwrap();
        assert_eq!(swarp_plan.namespace, NamespaceAccess::Striped);
        assert_eq!(swarp_plan.stripe_count(), 4);
    }

    #[test]
    fn table2_derived_rows_match_the_datawarp_paper() {
        let peaks = Peaks::datawarp_cori();
        for column in &TABLE2 {
            let metrics = profile_of(column).metrics(&peaks);
            let errors = input_errors(column);
            assert_pipelines_to_saturate(column, &metrics);
            assert_percentages_of_peak(column, &metrics, &errors);
            assert_rates_and_io_time(column, &metrics, &errors);
            assert_rows_without_times(column, &metrics);
        }
    }

    /// Checks the pipelines-to-saturate rows of one column.
    fn assert_pipelines_to_saturate(column: &Column, metrics: &Metrics) {
        let name = column.name;
        // The two rows the issue names are exact: pipelines to saturate.
        assert_eq!(
            metrics.pipelines_to_saturate_data,
            Some(column.pipelines_data),
            "{name}: data pipelines"
        );
        assert_eq!(
            metrics.pipelines_to_saturate_metadata,
            Some(column.pipelines_metadata),
            "{name}: metadata pipelines"
        );
    }

    /// Checks the % of peak rows of one column, within the propagated input rounding.
    fn assert_percentages_of_peak(column: &Column, metrics: &Metrics, errors: &InputErrors) {
        let name = column.name;
        assert_close(
            name,
            "% peak bandwidth",
            metrics.percent_peak_bandwidth,
            column.percent_bandwidth,
            errors.data,
            1,
        );
        assert_close(
            name,
            "% peak IOPS",
            metrics.percent_peak_iops,
            column.percent_iops,
            errors.data,
            1,
        );
        assert_close(
            name,
            "% peak metadata",
            metrics.percent_peak_metadata,
            column.percent_metadata,
            errors.metadata,
            1,
        );
    }

    /// Checks the rate rows and the I/O time share of one column, within the input rounding.
    fn assert_rates_and_io_time(column: &Column, metrics: &Metrics, errors: &InputErrors) {
        let name = column.name;
        assert_close(
            name,
            "bandwidth MiB/s",
            metrics.bandwidth_bytes_per_second / MIB,
            column.bandwidth_mib_s,
            errors.data,
            0,
        );
        assert_close(
            name,
            "read/write rate",
            metrics.data_ops_per_second,
            column.data_rate,
            errors.data,
            0,
        );
        assert_close(
            name,
            "metadata rate",
            metrics.metadata_ops_per_second,
            column.metadata_rate,
            errors.metadata,
            0,
        );
        assert_close(
            name,
            "I/O time %",
            metrics.io_time_percent,
            column.io_time_percent,
            errors.wall,
            1,
        );
    }

    /// Checks the rows that use no time (mean transfer, reuse, read:write) of one column.
    fn assert_rows_without_times(column: &Column, metrics: &Metrics) {
        let name = column.name;
        // Mean transfer and reuse use no times: exact to the printed precision.
        assert_eq!(
            round_to(metrics.mean_transfer_bytes / 1024.0, 0),
            column.mean_transfer_kib,
            "{name}: mean transfer"
        );
        assert_eq!(
            round_to(metrics.data_reuse.unwrap(), 1),
            column.data_reuse,
            "{name}: data reuse (Table 3)"
        );
        assert_eq!(
            round_to(metrics.read_write_ratio.unwrap(), 1),
            column.read_write_ratio,
            "{name}: read:write"
        );
    }

    #[test]
    fn table2_percentages_are_exact_from_the_printed_rates() {
        // Feeding the printed rates (not the rounded times) must give the printed percentages
        // exactly: this pins the peaks (6 GiB/s = 6144 MiB/s, 90,000 IOPS, 25,000 ops/s).
        let peaks = Peaks::datawarp_cori();
        for column in &TABLE2 {
            let profile = Profile {
                wall_seconds: 1.0,
                data_time_seconds: 1.0,
                metadata_time_seconds: 1.0,
                bytes_read: (column.bandwidth_mib_s * MIB) as u64,
                bytes_written: 0,
                read_ops: column.data_rate as u64,
                write_ops: 0,
                metadata_ops: column.metadata_rate as u64,
                file_bytes: 0,
            };
            let metrics = profile.metrics(&peaks);
            assert_eq!(
                round_to(metrics.percent_peak_bandwidth, 1),
                column.percent_bandwidth,
                "{}",
                column.name
            );
            assert_eq!(
                round_to(metrics.percent_peak_iops, 1),
                column.percent_iops,
                "{}",
                column.name
            );
            assert_eq!(
                round_to(metrics.percent_peak_metadata, 1),
                column.percent_metadata,
                "{}",
                column.name
            );
        }
    }

    #[test]
    fn bounds_follow_the_paper() {
        let peaks = Peaks::datawarp_cori();
        let bounds: Vec<Bound> =
            TABLE2.iter().map(|column| profile_of(column).metrics(&peaks).bound).collect();
        assert_eq!(
            bounds,
            vec![Bound::Bandwidth, Bound::Bandwidth, Bound::Metadata, Bound::Metadata]
        );
    }

    fn op(op: Op, file: u32, rank: u32, time_ns: u64, offset: u64, length: u64) -> TraceOp {
        TraceOp { time_ns, duration_ns: 1_000_000, offset, length, rank, file, op }
    }

    #[test]
    fn roles_and_staging_advice_come_from_the_trace() {
        let trace = Trace {
            meta: JobMeta::default(),
            files: vec![
                "/bb/in/a.dat".into(),
                "/bb/env/lib/python3.11/site-packages/numpy/__init__.py".into(),
                "/bb/tmp/x".into(),
                "/bb/out/y".into(),
                "/bb/db.sqlite".into(),
            ],
            ops: vec![
                op(Op::Read, 0, 0, 0, 0, 1 << 20),
                op(Op::Read, 0, 1, 1, 0, 1 << 20),
                op(Op::Read, 1, 0, 2, 0, 4096),
                op(Op::Write, 2, 0, 3, 0, 1 << 20),
                op(Op::Read, 2, 0, 4, 0, 1 << 20),
                op(Op::Unlink, 2, 0, 5, 0, 0),
                op(Op::Write, 3, 0, 6, 0, 1 << 20),
                op(Op::Read, 4, 0, 7, 0, 4096),
                op(Op::Write, 4, 0, 8, 0, 4096),
            ],
        };
        let result =
            characterize(&trace, &Peaks::datawarp_cori(), AllocationTarget::default()).unwrap();
        let role = |name: &str| result.files.iter().find(|file| file.name == name).unwrap().role;
        assert_eq!(role("/bb/in/a.dat"), FileRole::Input);
        assert_eq!(
            role("/bb/env/lib/python3.11/site-packages/numpy/__init__.py"),
            FileRole::Software
        );
        assert_eq!(role("/bb/tmp/x"), FileRole::Intermediate);
        assert_eq!(role("/bb/out/y"), FileRole::Output);
        assert_eq!(role("/bb/db.sqlite"), FileRole::Updated);
        let recommendation = &result.recommendation;
        assert_eq!(recommendation.keep_persistent.files, 2, "software + input read by two ranks");
        assert_eq!(recommendation.discard.files, 1);
        assert_eq!(recommendation.stage_out.files, 2);
        assert_eq!(result.profile.read_ops, 5);
        assert_eq!(result.profile.metadata_ops, 1);
        assert_eq!(result.op_counts["read"], 5);
    }

    #[test]
    fn metadata_bound_at_scale_asks_for_private_namespaces() {
        let column = &TABLE2[2]; // CAMP-builddb
        let profile = profile_of(column);
        let metrics = profile.metrics(&Peaks::datawarp_cori());
        let target = AllocationTarget { pipelines: 64, fragment_bytes: 200 << 30 };
        let recommendation = recommend(&profile, &metrics, &[], target);
        assert_eq!(recommendation.namespace, Namespace::Private);
        assert_eq!(recommendation.fragments_for_metadata, 22); // ⌈64 / 3⌉
        assert_eq!(recommendation.fragments, 22);
        let swarp = profile_of(&TABLE2[0]);
        let swarp_metrics = swarp.metrics(&Peaks::datawarp_cori());
        let recommendation =
            recommend(&swarp, &swarp_metrics, &[], AllocationTarget { pipelines: 16, ..target });
        // 16 SWarp pipelines stay under one metadata server (19) but need ⌈16 / 5⌉ fragments.
        assert_eq!(recommendation.namespace, Namespace::Striped);
        assert_eq!(recommendation.fragments_for_data, 4);
        assert_eq!(recommendation.fragments, 4);
    }

    /// A trace of `count` operations of `kind` on file 0 by rank 0, one after the other from
    /// `start_ns`, each `duration_ns` long, `length` bytes at consecutive (or `stride`) offsets.
    fn run_of(
        kind: Op,
        count: u64,
        start_ns: u64,
        duration_ns: u64,
        length: u64,
        stride: u64,
    ) -> Vec<TraceOp> {
        (0..count)
            .map(|i| TraceOp {
                time_ns: start_ns + i * duration_ns,
                duration_ns,
                offset: if length == 0 { 0 } else { (i * stride) % (1 << 40) },
                length,
                rank: 0,
                file: 0,
                op: kind,
            })
            .collect()
    }

    fn bound_of(ops: Vec<TraceOp>) -> Characterization {
        let trace = Trace { ops, ..Trace::default() };
        characterize(&trace, &Peaks::datawarp_cori(), AllocationTarget::default()).unwrap()
    }

    #[test]
    fn labelled_benchmarks_get_their_bound() {
        // IOR-like bandwidth test: open, 128 writes of 16 MiB (2 GiB) at 1 GiB/s, close. Opens
        // and closes are fast (2 µs), so the metadata *rate* while opening is 20× the peak: the
        // percentages alone (17 % of peak bandwidth vs 2,000 % of peak metadata) once called
        // this metadata-bound.
        let mut ops = run_of(Op::Open, 1, 0, 2_000, 0, 0);
        ops.extend(run_of(Op::Write, 128, 10_000, 15_625_000, 16 << 20, 16 << 20));
        ops.extend(run_of(Op::Close, 1, 2_100_000_000, 2_000, 0, 0));
        let bandwidth = bound_of(ops);
        assert!(bandwidth.metrics.percent_peak_metadata > 100.0, "{:?}", bandwidth.metrics);
        assert_eq!(bandwidth.metrics.bound, Bound::Bandwidth, "{:?}", bandwidth.metrics);

        // IOPS test: 200,000 random 4 KiB writes at 50 µs each (10 s), open and close.
        let mut ops = run_of(Op::Open, 1, 0, 20_000, 0, 0);
        ops.extend(run_of(Op::Write, 200_000, 100_000, 50_000, 4096, 7919 * 4096));
        ops.extend(run_of(Op::Close, 1, 11_000_000_000, 20_000, 0, 0));
        let iops = bound_of(ops);
        assert_eq!(iops.metrics.bound, Bound::Iops, "{:?}", iops.metrics);

        // mdtest-like: 20,000 creates, stats and unlinks, no data; slow ones (1 ms) so the
        // rate is 4 % of the metadata peak, yet metadata is all the I/O there is.
        let mut ops = run_of(Op::Create, 20_000, 0, 1_000_000, 0, 0);
        ops.extend(run_of(Op::Stat, 20_000, 20_000_000_000, 1_000_000, 0, 0));
        ops.extend(run_of(Op::Unlink, 20_000, 40_000_000_000, 1_000_000, 0, 0));
        let metadata = bound_of(ops);
        assert!(metadata.metrics.percent_peak_metadata < 5.0, "{:?}", metadata.metrics);
        assert_eq!(metadata.metrics.bound, Bound::Metadata, "{:?}", metadata.metrics);

        // The verdict names the seconds it was decided on.
        let verdict = &bandwidth.recommendation.advice[0];
        assert!(verdict.starts_with("One pipeline is bandwidth-bound: at one fragment's peaks"));
        assert!(verdict.contains("0.333 s of bandwidth"), "{verdict}");
    }

    #[test]
    fn the_ranks_of_one_job_are_one_pipeline() {
        // Four ranks each write 1 GiB in 1 MiB writes over the same second, then stat a file:
        // summed per rank that is 4 s of data time (1 GiB/s, a rank's rate); the job did
        // 4 GiB in 1 s.
        let mut ops = Vec::new();
        for rank in 0..4u32 {
            for i in 0..1024u64 {
                let at = i * 1_000_000_000 / 1024;
                ops.push(op(Op::Write, rank, rank, at, i << 20, 1 << 20));
                ops.last_mut().unwrap().duration_ns = 1_000_000_000 / 1024;
            }
            let mut stat = op(Op::Stat, rank, rank, 1_000_000_000 + u64::from(rank) * 1000, 0, 0);
            stat.duration_ns = 10_000;
            ops.push(stat);
        }
        let trace = Trace { ops, ..Trace::default() };
        let result =
            characterize(&trace, &Peaks::datawarp_cori(), AllocationTarget::default()).unwrap();
        assert_eq!(result.ranks, 4);
        assert!((result.profile.data_time_seconds - 1.0).abs() < 1e-6, "{:?}", result.profile);
        // The four stats overlap in [1 s, 1 s + 13 µs): 13 µs busy, not 40 µs.
        assert!(
            (result.profile.metadata_time_seconds - 13e-6).abs() < 1e-9,
            "{:?}",
            result.profile
        );
        let gib_per_second = result.metrics.bandwidth_bytes_per_second / f64::from(1u32 << 30);
        assert!((gib_per_second - 4.0).abs() < 1e-5, "{gib_per_second}");
        assert_eq!(result.metrics.pipelines_to_saturate_data, Some(2), "⌈6 GiB/s ÷ 4 GiB/s⌉ jobs");
        assert!(result.recommendation.advice[0].contains("4 ranks are one job"));
        let table = crate::report::characterization_table(&result);
        assert!(table.contains("Jobs of 4 ranks to saturate data performance"), "{table}");
        assert!(result.metrics.io_time_percent <= 100.0);
        assert_eq!(busy_seconds(vec![(0, 10), (20, 30), (5, 12)]), 22e-9);
    }

    #[test]
    fn a_pipeline_above_a_peak_is_never_told_one_unit_suffices() {
        // One pipeline at 1,369 % of the metadata peak: 25,000 ops/s × 13.69 = 342,250 ops/s.
        let profile = Profile {
            wall_seconds: 10.0,
            data_time_seconds: 1.0,
            metadata_time_seconds: 1.0,
            bytes_read: 1 << 20,
            read_ops: 1,
            metadata_ops: 342_250,
            file_bytes: 1 << 20,
            ..Profile::default()
        };
        let metrics = profile.metrics(&Peaks::datawarp_cori());
        assert!((metrics.percent_peak_metadata - 1369.0).abs() < 1e-6);
        assert_eq!(metrics.pipelines_to_saturate_metadata, Some(1));
        let target = AllocationTarget { pipelines: 1, fragment_bytes: 200 << 30 };
        let recommendation = recommend(&profile, &metrics, &[], target);
        assert_eq!(recommendation.fragments_for_metadata, 14, "⌈13.69⌉ metadata servers");
        assert_eq!(recommendation.namespace, Namespace::Private);
        let advice = recommendation.advice.join("\n");
        assert!(!advice.contains("suffices"), "{advice}");
        assert!(
            advice
                .contains("One pipeline alone is at 1369.0% of one metadata server's peak (13.7×)"),
            "{advice}"
        );
        // At or below a peak the paper's formula stands: 64 CAMP-builddb pipelines need 22.
        assert_eq!(units_for(64, 37.4, Some(3)), 22);
        assert_eq!(units_for(1, 100.0, Some(1)), 1);
        assert_eq!(units_for(3, 150.0, Some(1)), 5, "⌈3 × 1.5⌉");
    }

    #[test]
    fn a_profile_alone_gives_the_same_metrics_and_advice() {
        let profile = profile_of(&TABLE2[2]);
        let target = AllocationTarget { pipelines: 64, fragment_bytes: 200 << 30 };
        let result =
            characterize_profile(&profile, JobMeta::default(), &Peaks::datawarp_cori(), target)
                .unwrap();
        assert_eq!(result.metrics.pipelines_to_saturate_metadata, Some(3));
        assert_eq!(result.recommendation.namespace, Namespace::Private);
        let bad = Profile { data_time_seconds: f64::NAN, ..profile };
        assert!(matches!(
            characterize_profile(&bad, JobMeta::default(), &Peaks::datawarp_cori(), target),
            Err(CharacterizeError::BadProfile { name: "data_time_seconds", .. })
        ));
    }

    #[test]
    fn invalid_inputs_are_named() {
        let trace = Trace::default();
        let bad = Peaks { iops: 0.0, ..Peaks::datawarp_cori() };
        assert_eq!(
            characterize(&trace, &bad, AllocationTarget::default()).unwrap_err(),
            CharacterizeError::BadPeak { name: "iops", value: 0.0 }
        );
        assert_eq!(
            characterize(&trace, &Peaks::datawarp_cori(), AllocationTarget::default()).unwrap_err(),
            CharacterizeError::EmptyTrace
        );
    }
}
