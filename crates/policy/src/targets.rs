//! Performance targets → servers, stripe count, namespace mode and fragments: what a job asks
//! for when it is bound by bandwidth, IOPS or metadata rather than by capacity (the DataWarp
//! paper's conclusion, §5.3: "the right building block should be performance targets").
//!
//! A request carries any of `capacity=` (bytes), `bandwidth=` (bytes/s), `iops=` (small
//! read/write operations/s) and `metadata=` (metadata operations/s). Every server of the pool
//! has measured peaks (`spillway bench peaks`; metadata per namespace mode) and the rates
//! already promised to other reservations. The rules (docs/design/targets.md):
//!
//! 1. **Headroom** of a server in a dimension = its peak − what is promised on it (never below
//!    zero). Metadata headroom is taken against the peak of the namespace mode chosen.
//! 2. **Even split.** Data is striped evenly over a reservation's servers and private
//!    namespaces spread compute nodes evenly over them, so a bandwidth, IOPS or private
//!    metadata target `T` over `n` servers puts `⌈T / n⌉` on each: `n` servers meet it when
//!    `n × (the least headroom among them) ≥ T`. A striped namespace lives on one server (the
//!    first in stripe order), so a striped metadata target needs one server with `T` headroom.
//! 3. **Namespace mode.** Private when the metadata target is above the highest striped
//!    metadata peak of any server of the pool (no single namespace could ever serve it);
//!    striped otherwise, and striped when there is no metadata target. The mode depends on
//!    the peaks only, never on current promises, so the same request always gets the same
//!    mode on the same pool.
//! 4. **Servers.** The candidates are the servers [`crate::fragments::eligible_servers`]
//!    allows (healthy, a fragment free, a known host with replicas). They are ordered by
//!    headroom in one dimension (most first; ties: most free bytes, then lowest id), trying
//!    each target's dimension in turn, the one needing the most servers alone first; each
//!    ordering gives the fewest first `n` servers meeting every target, with `n` at least the
//!    capacity's stripe width and at most `stripe_servers_max`. The ordering with the smallest
//!    `n` wins (ties: the earlier).
//! 5. **Fragments.** Capacity `max(capacity, n × fragment_bytes)` is laid over those `n`
//!    servers by [`crate::fragments::allocate`] (one fragment at least per server), so free
//!    space, replicas and failure domains follow today's rules. A striped namespace's server
//!    (the chosen one with the most striped metadata headroom) is moved first in stripe order.
//! 6. **Admission.** When the targets cannot be met even by the whole pool at its peaks with
//!    nothing promised (every server, whatever its health or free space, at most
//!    `stripe_servers_max` of them): [`TargetError::Never`]. When they could be but not with
//!    the current promises, health and free space: [`TargetError::Wait`]. Both name the limit
//!    and its numbers.
//!
//! A request with capacity only is exactly [`crate::fragments::allocate`] on the pool.
//! Pure: no I/O, no clock; the same snapshot and request always give the same plan.

use spillway_types::{format_bytes, parse_size};

use crate::fragments::{self, FragmentError, FragmentPlan, FragmentRequest, ServerSpace};
use crate::namespace::NamespaceAccess;

// ---------------------------------------------------------------------------------------------
// Targets, their syntax and its parsing.

/// What a job asks of the burst buffer; every part optional, at least one given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Targets {
    pub capacity_bytes: Option<u64>,
    pub bandwidth_bytes_per_s: Option<u64>,
    /// Small read/write operations per second.
    pub iops: Option<u64>,
    pub metadata_ops_per_s: Option<u64>,
}

impl Targets {
    /// Whether any rate (not capacity) is asked for.
    pub fn has_rates(&self) -> bool {
        self.bandwidth_bytes_per_s.is_some()
            || self.iops.is_some()
            || self.metadata_ops_per_s.is_some()
    }

    /// Sets one `key=value` of the directive syntax (`capacity`, `bandwidth`, `iops`,
    /// `metadata`); a key already set or unknown is an error.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), TargetParseError> {
        let slot = match key {
            "capacity" => &mut self.capacity_bytes,
            "bandwidth" => &mut self.bandwidth_bytes_per_s,
            "iops" => &mut self.iops,
            "metadata" => &mut self.metadata_ops_per_s,
            _ => return Err(TargetParseError::UnknownKey { key: key.to_string() }),
        };
        if slot.is_some() {
            return Err(TargetParseError::Repeated { key: key.to_string() });
        }
        *slot = Some(match key {
            "capacity" => parse_capacity(value)?,
            "bandwidth" => parse_bandwidth(value)?,
            "iops" => parse_ops_rate("iops", value)?,
            _ => parse_ops_rate("metadata", value)?,
        });
        Ok(())
    }
}

/// The directive syntax, `capacity=64GiB bandwidth=2GiB/s iops=20k metadata=5k/s`, the parts
/// given in that order; it parses back to the same targets.
impl std::fmt::Display for Targets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts = [
            self.capacity_bytes.map(|bytes| format!("capacity={}", format_capacity(bytes))),
            self.bandwidth_bytes_per_s.map(|rate| format!("bandwidth={}", format_bandwidth(rate))),
            self.iops.map(|rate| format!("iops={}", format_iops(rate))),
            self.metadata_ops_per_s.map(|rate| format!("metadata={}", format_metadata_rate(rate))),
        ];
        let text: Vec<String> = parts.into_iter().flatten().collect();
        f.write_str(&text.join(" "))
    }
}

/// Whitespace-separated `key=value` parts (see [`Targets::set`]).
impl std::str::FromStr for Targets {
    type Err = TargetParseError;
    fn from_str(text: &str) -> Result<Self, TargetParseError> {
        let mut targets = Targets::default();
        for token in text.split_whitespace() {
            let Some((key, value)) = token.split_once('=') else {
                return Err(TargetParseError::NotKeyValue { token: token.to_string() });
            };
            targets.set(key, value)?;
        }
        Ok(targets)
    }
}

/// Why a target's text does not parse; every variant names the text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetParseError {
    #[error("{what} {text:?}: no number (e.g. {example})")]
    NoNumber { what: &'static str, text: String, example: &'static str },
    #[error("{what} {text:?}: unknown unit {unit:?} (e.g. {example})")]
    UnknownUnit { what: &'static str, text: String, unit: String, example: &'static str },
    #[error("bandwidth {text:?} is not a rate: end it with /s (e.g. 2GiB/s, 500MB/s)")]
    NotPerSecond { text: String },
    #[error("{what} {text:?} is zero: a target must be above zero (leave it out instead)")]
    Zero { what: &'static str, text: String },
    #[error("{what} {text:?} is too large")]
    Overflow { what: &'static str, text: String },
    #[error("{token:?} is not key=value (capacity=, bandwidth=, iops=, metadata=)")]
    NotKeyValue { token: String },
    #[error("unknown target {key:?} (capacity, bandwidth, iops, metadata)")]
    UnknownKey { key: String },
    #[error("{key}= is given twice")]
    Repeated { key: String },
}

const BANDWIDTH_EXAMPLE: &str = "2GiB/s, 500MB/s, 1.5GB/s";
const OPS_EXAMPLE: &str = "20000, 20k, 20k/s, 1.5M";
const CAPACITY_EXAMPLE: &str = "64GiB, 200GB, 4096";

/// `digits[.digits]` → (mantissa, decimals): `1.25` → (125, 2).
fn parse_decimal(number: &str) -> Option<(u128, u32)> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let digits = || whole.chars().chain(fraction.chars());
    if !digits().all(|c| c.is_ascii_digit()) || fraction.len() > 18 {
        return None;
    }
    let mut mantissa: u128 = 0;
    for c in digits() {
        mantissa = mantissa.checked_mul(10)?.checked_add(c.to_digit(10)? as u128)?;
    }
    Some((mantissa, fraction.len() as u32))
}

/// Splits `1.5GiB` into the number and the unit after it.
fn split_number(text: &str) -> (&str, &str) {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    text.split_at(split)
}

/// `number × unit`, rounded up to a whole byte or operation: a target is a floor, so rounding
/// never promises less than was asked.
fn scaled(
    what: &'static str,
    text: &str,
    number: &str,
    unit_value: u64,
    example: &'static str,
) -> Result<u64, TargetParseError> {
    let (mantissa, decimals) = parse_decimal(number).ok_or_else(|| TargetParseError::NoNumber {
        what,
        text: text.to_string(),
        example,
    })?;
    let overflow = || TargetParseError::Overflow { what, text: text.to_string() };
    let scale = 10u128.pow(decimals);
    let value = mantissa.checked_mul(unit_value as u128).ok_or_else(overflow)?.div_ceil(scale);
    let value = u64::try_from(value).map_err(|_| overflow())?;
    if value == 0 {
        return Err(TargetParseError::Zero { what, text: text.to_string() });
    }
    Ok(value)
}

/// A bandwidth: a size (as [`parse_size`] reads units: `K`/`KiB` binary, `KB` decimal, up to
/// `P`; a decimal number allowed) followed by `/s`: `2GiB/s`, `500MB/s`, `1.5GB/s`.
pub fn parse_bandwidth(text: &str) -> Result<u64, TargetParseError> {
    let trimmed = text.trim();
    let Some(size) = trimmed.strip_suffix("/s") else {
        return Err(TargetParseError::NotPerSecond { text: text.to_string() });
    };
    let (number, unit) = split_number(size);
    if number.is_empty() {
        let (what, example) = ("bandwidth", BANDWIDTH_EXAMPLE);
        return Err(TargetParseError::NoNumber { what, text: text.to_string(), example });
    }
    let unit_value =
        parse_size(&format!("1{unit}")).map_err(|_| TargetParseError::UnknownUnit {
            what: "bandwidth",
            text: text.to_string(),
            unit: unit.to_string(),
            example: BANDWIDTH_EXAMPLE,
        })?;
    scaled("bandwidth", text, number, unit_value, BANDWIDTH_EXAMPLE)
}

/// An operation rate (`what` is `iops` or `metadata`, for messages): a number with an optional
/// `k` (10^3) or `M` (10^6) and an optional `/s`: `20000`, `20k`, `20k/s`, `1.5M`.
pub fn parse_ops_rate(what: &'static str, text: &str) -> Result<u64, TargetParseError> {
    let trimmed = text.trim();
    let rate = trimmed.strip_suffix("/s").unwrap_or(trimmed);
    let (number, unit) = split_number(rate);
    if number.is_empty() {
        return Err(TargetParseError::NoNumber {
            what,
            text: text.to_string(),
            example: OPS_EXAMPLE,
        });
    }
    let unit_value = match unit {
        "" => 1,
        "k" | "K" => 1_000,
        "m" | "M" => 1_000_000,
        _ => {
            return Err(TargetParseError::UnknownUnit {
                what,
                text: text.to_string(),
                unit: unit.to_string(),
                example: OPS_EXAMPLE,
            })
        }
    };
    scaled(what, text, number, unit_value, OPS_EXAMPLE)
}

/// A capacity, exactly as [`parse_size`] reads it (whole numbers: `64GiB`, `200GB`, `4096`).
pub fn parse_capacity(text: &str) -> Result<u64, TargetParseError> {
    let what = "capacity";
    let bytes = parse_size(text).map_err(|error| match error {
        spillway_types::SizeError::NoDigits => {
            TargetParseError::NoNumber { what, text: text.to_string(), example: CAPACITY_EXAMPLE }
        }
        spillway_types::SizeError::UnknownUnit(unit) => TargetParseError::UnknownUnit {
            what,
            text: text.to_string(),
            unit,
            example: CAPACITY_EXAMPLE,
        },
        spillway_types::SizeError::Overflow => {
            TargetParseError::Overflow { what, text: text.to_string() }
        }
    })?;
    if bytes == 0 {
        return Err(TargetParseError::Zero { what, text: text.to_string() });
    }
    Ok(bytes)
}

/// Byte units from the largest, binary before decimal at each power.
const BYTE_UNITS: [(&str, u64); 10] = [
    ("PiB", 1 << 50),
    ("PB", 1_000_000_000_000_000),
    ("TiB", 1 << 40),
    ("TB", 1_000_000_000_000),
    ("GiB", 1 << 30),
    ("GB", 1_000_000_000),
    ("MiB", 1 << 20),
    ("MB", 1_000_000),
    ("KiB", 1 << 10),
    ("kB", 1_000),
];

/// `value / unit` with up to three decimals, trailing zeros trimmed; `None` unless exact.
fn exact_thousandths(value: u64, unit: u64) -> Option<String> {
    let thousandths = value as u128 * 1000;
    if value < unit || !thousandths.is_multiple_of(unit as u128) {
        return None;
    }
    let thousandths = thousandths / unit as u128;
    let (whole, fraction) = (thousandths / 1000, thousandths % 1000);
    if fraction == 0 {
        return Some(whole.to_string());
    }
    let fraction = format!("{fraction:03}");
    Some(format!("{whole}.{}", fraction.trim_end_matches('0')))
}

/// A bandwidth in the syntax [`parse_bandwidth`] reads, exact: the largest unit that gives the
/// value with at most three decimals (`1.5GiB/s`, `2GB/s`, `1500MiB/s`), else bytes (`7B/s`).
pub fn format_bandwidth(bytes_per_s: u64) -> String {
    for (name, unit) in BYTE_UNITS {
        if let Some(number) = exact_thousandths(bytes_per_s, unit) {
            return format!("{number}{name}/s");
        }
    }
    format!("{bytes_per_s}B/s")
}

/// A capacity in the syntax [`parse_size`] reads (whole numbers only): the largest unit that
/// divides it (`64GiB`, `200GB`), else bytes (`4097`).
pub fn format_capacity(bytes: u64) -> String {
    for (name, unit) in BYTE_UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{name}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// An operation rate, exact: `M` when whole thousands of a million's thousandths, `k` from a
/// thousand, else the number (`1.5M`, `20k`, `1.234k`, `950`).
fn format_ops(rate: u64) -> String {
    if let Some(number) = exact_thousandths(rate, 1_000_000) {
        return format!("{number}M");
    }
    match exact_thousandths(rate, 1_000) {
        Some(number) => format!("{number}k"),
        None => rate.to_string(),
    }
}

/// IOPS as written in a directive: `20k` (the name already says "per second").
pub fn format_iops(iops: u64) -> String {
    format_ops(iops)
}

/// A metadata rate as written in a directive: `5k/s`.
pub fn format_metadata_rate(ops_per_s: u64) -> String {
    format!("{}/s", format_ops(ops_per_s))
}

/// Rounds `value` up to two significant digits (`1452` → `1500`, `61` → `61`), so targets
/// derived from measurements read as round numbers and never fall below the measurement.
fn round_up_two_digits(value: f64) -> u64 {
    if !(value.is_finite() && value > 0.0) {
        return 0;
    }
    let mut step = 1.0f64;
    while value / step >= 100.0 {
        step *= 10.0;
    }
    ((value / step - 1e-9).ceil() * step) as u64
}

/// A measured bandwidth as a target: rounded up to two significant digits of MiB/s (of KiB/s
/// below 1 MiB/s, of bytes/s below 1 KiB/s); 0 for no bandwidth.
pub fn round_up_bandwidth(bytes_per_s: f64) -> u64 {
    for unit in [1u64 << 20, 1 << 10, 1] {
        if bytes_per_s >= unit as f64 || unit == 1 {
            return round_up_two_digits(bytes_per_s / unit as f64).saturating_mul(unit);
        }
    }
    0
}

/// A measured operation rate as a target: rounded up to two significant digits.
pub fn round_up_ops_rate(ops_per_s: f64) -> u64 {
    round_up_two_digits(ops_per_s)
}

/// A measured capacity as a target: rounded up to two significant digits of MiB (at least one
/// MiB), so it reads as `2800MiB` rather than a byte count.
pub fn round_up_capacity(bytes: u64) -> u64 {
    let mib = (bytes as f64 / (1u64 << 20) as f64).max(1.0);
    round_up_two_digits(mib).saturating_mul(1 << 20)
}

// ---------------------------------------------------------------------------------------------
// The pool as the planner sees it, and the plan.

/// Rates in the three dimensions: what is promised on a server, or added by a plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rates {
    pub bandwidth_bytes_per_s: u64,
    pub iops: u64,
    pub metadata_ops_per_s: u64,
}

/// One server's measured peaks (`spillway bench peaks` against it). Metadata per namespace
/// mode: one striped namespace's rate, and the rate of the private namespaces it holds together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ServerPeaks {
    pub bandwidth_bytes_per_s: u64,
    pub iops: u64,
    pub metadata_striped_ops_per_s: u64,
    pub metadata_private_ops_per_s: u64,
}

impl ServerPeaks {
    fn metadata(&self, namespace: NamespaceAccess) -> u64 {
        match namespace {
            NamespaceAccess::Striped => self.metadata_striped_ops_per_s,
            NamespaceAccess::Private => self.metadata_private_ops_per_s,
        }
    }
}

/// One server of the pool: its space and health, its peaks, and what is promised on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerLoad {
    pub space: ServerSpace,
    pub peaks: ServerPeaks,
    pub promised: Rates,
}

/// A reservation's request by targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetRequest {
    pub targets: Targets,
    pub fragment_bytes: u64,
    pub stripe_servers_max: u32,
    /// Copies of every byte (as [`FragmentRequest::replicas`]).
    pub replicas: u32,
}

/// Where a reservation by targets goes and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetPlan {
    /// The fragments over the chosen servers, in stripe order (the namespace server first).
    pub fragments: FragmentPlan,
    pub namespace: NamespaceAccess,
    /// What each server (stripe order) takes on: the rates to add to its promised rates.
    pub promised_per_server: Vec<(u64, Rates)>,
    /// The reasons, one sentence each, for a person.
    pub why: Vec<String>,
}

impl TargetPlan {
    /// The servers striped over, in stripe order.
    pub fn servers(&self) -> Vec<u64> {
        self.fragments.servers()
    }

    /// Number of servers striped over.
    pub fn stripe_count(&self) -> u32 {
        self.fragments.per_server.len() as u32
    }
}

/// A dimension of performance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dimension {
    Bandwidth,
    Iops,
    Metadata(NamespaceAccess),
}

impl Dimension {
    fn format_rate(self, rate: u64) -> String {
        match self {
            Dimension::Bandwidth => format!("{}/s", format_bytes(rate)),
            Dimension::Iops => format!("{rate} IOPS"),
            Dimension::Metadata(_) => format!("{rate} metadata ops/s"),
        }
    }
}

impl std::fmt::Display for Dimension {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dimension::Bandwidth => f.write_str("bandwidth"),
            Dimension::Iops => f.write_str("IOPS"),
            Dimension::Metadata(namespace) => write!(f, "metadata ({namespace} namespace)"),
        }
    }
}

/// What keeps a request from being met: the target and the best the servers give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `best` is the most `servers` servers could sustain together in that dimension.
    Rate { dimension: Dimension, target: u64, best: u64, servers: u32 },
    /// The targets need more servers than a reservation may stripe over.
    StripeWidth { dimension: Dimension, servers_needed: u32, stripe_servers_max: u32 },
    /// Each target alone can be met, but no `servers` servers meet them all together.
    Together { servers: u32 },
    /// No server at all to plan on.
    NoServer,
    /// The pool has servers, but none may take a fragment now: none healthy with a fragment
    /// of `fragment_bytes` free (and a known host, with `replicas` > 1).
    NoneEligible { fragment_bytes: u64, replicas: u32 },
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Limit::Rate { dimension, target, best, servers } => write!(
                f,
                "{dimension} {} asked, at most {} from {servers} server(s)",
                dimension.format_rate(target),
                dimension.format_rate(best)
            ),
            Limit::StripeWidth { dimension, servers_needed, stripe_servers_max } => write!(
                f,
                "{dimension} needs {servers_needed} servers, a reservation stripes over at most {stripe_servers_max} (knob manager.stripe_servers_max)"
            ),
            Limit::Together { servers } => write!(
                f,
                "each target fits alone, but no {servers} server(s) have the headroom for all of them together"
            ),
            Limit::NoServer => f.write_str("the pool has no server"),
            Limit::NoneEligible { fragment_bytes, replicas } => write!(
                f,
                "no server of the pool is healthy with a free fragment of {}{}",
                format_bytes(fragment_bytes),
                if replicas > 1 { " and a known host (replicas=2 or more)" } else { "" }
            ),
        }
    }
}

/// Why a request by targets cannot be placed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    #[error("no target: ask for at least one of capacity=, bandwidth=, iops=, metadata=")]
    NoTarget,
    #[error("a {target} target of 0 (leave it out instead)")]
    ZeroTarget { target: &'static str },
    /// Within the pool's peaks, not with what is promised now: hold the job until it is.
    #[error("not now: {limit} with what is already promised (the job waits until other reservations end)")]
    Wait { limit: Limit },
    /// Beyond what the whole pool could ever give.
    #[error("never: {limit} even with nothing else promised on the pool")]
    Never { limit: Limit },
    /// Capacity, fragments, replicas or stripe knobs, as without targets.
    #[error(transparent)]
    Placement(#[from] FragmentError),
}

// ---------------------------------------------------------------------------------------------
// The planner.

/// A server the planner may choose, with its headroom (peak − promised) in each dimension;
/// metadata in the plan's namespace mode.
#[derive(Clone, Copy)]
struct Candidate<'a> {
    load: &'a ServerLoad,
    bandwidth: u64,
    iops: u64,
    metadata: u64,
}

impl<'a> Candidate<'a> {
    fn new(load: &'a ServerLoad, namespace: NamespaceAccess, promised: Rates) -> Candidate<'a> {
        let peaks = load.peaks;
        Candidate {
            load,
            bandwidth: peaks.bandwidth_bytes_per_s.saturating_sub(promised.bandwidth_bytes_per_s),
            iops: peaks.iops.saturating_sub(promised.iops),
            metadata: peaks.metadata(namespace).saturating_sub(promised.metadata_ops_per_s),
        }
    }

    fn headroom(&self, dimension: Dimension) -> u64 {
        match dimension {
            Dimension::Bandwidth => self.bandwidth,
            Dimension::Iops => self.iops,
            Dimension::Metadata(_) => self.metadata,
        }
    }
}

/// One target: its dimension and rate.
type Need = (Dimension, u64);

/// Whether `chosen` meets one target (rule 2 of the module documentation).
fn met(chosen: &[Candidate<'_>], (dimension, target): Need) -> bool {
    let headrooms = chosen.iter().map(|c| c.headroom(dimension));
    match dimension {
        Dimension::Metadata(NamespaceAccess::Striped) => headrooms.max().unwrap_or(0) >= target,
        _ => headrooms.min().unwrap_or(0) as u128 * chosen.len() as u128 >= target as u128,
    }
}

/// The headrooms of one dimension, most first.
fn sorted_headroom(candidates: &[Candidate<'_>], dimension: Dimension) -> Vec<u64> {
    let mut headrooms: Vec<u64> = candidates.iter().map(|c| c.headroom(dimension)).collect();
    headrooms.sort_unstable_by(|a, b| b.cmp(a));
    headrooms
}

/// The most one dimension gives from at most `width` servers, and from how many.
fn best_rate(sorted: &[u64], dimension: Dimension, width: usize) -> (u64, usize) {
    if dimension == Dimension::Metadata(NamespaceAccess::Striped) {
        return (sorted.first().copied().unwrap_or(0), 1);
    }
    (1..=width.min(sorted.len()))
        .map(|n| ((n as u128 * sorted[n - 1] as u128).min(u64::MAX as u128) as u64, n))
        .max_by_key(|&(rate, n)| (rate, std::cmp::Reverse(n)))
        .unwrap_or((0, 0))
}

/// The fewest servers meeting one target alone, with no cap on their number.
fn servers_alone(sorted: &[u64], (dimension, target): Need) -> Option<usize> {
    if dimension == Dimension::Metadata(NamespaceAccess::Striped) {
        return (sorted.first().copied().unwrap_or(0) >= target).then_some(1);
    }
    (1..=sorted.len()).find(|&n| n as u128 * sorted[n - 1] as u128 >= target as u128)
}

/// Every target alone within `width` servers, or the first that is not.
fn check_alone(candidates: &[Candidate<'_>], needs: &[Need], width: usize) -> Result<(), Limit> {
    for &(dimension, target) in needs {
        let sorted = sorted_headroom(candidates, dimension);
        let (best, servers) = best_rate(&sorted, dimension, width);
        if best >= target {
            continue;
        }
        return Err(match servers_alone(&sorted, (dimension, target)) {
            Some(servers_needed) => Limit::StripeWidth {
                dimension,
                servers_needed: servers_needed as u32,
                stripe_servers_max: width as u32,
            },
            None => Limit::Rate { dimension, target, best, servers: servers as u32 },
        });
    }
    Ok(())
}

/// The servers meeting every target (rule 4), at least `width_min` and at most `width_max`
/// of them, in the winning order.
fn choose<'a>(
    candidates: &[Candidate<'a>],
    needs: &[Need],
    width_min: usize,
    width_max: usize,
) -> Result<Vec<Candidate<'a>>, Limit> {
    if candidates.is_empty() {
        return Err(Limit::NoServer);
    }
    check_alone(candidates, needs, width_max)?;
    // The target needing the most servers alone orders first (stable: bandwidth, IOPS, metadata).
    let mut orderings: Vec<(usize, Dimension)> = needs
        .iter()
        .map(|&need| {
            let alone = servers_alone(&sorted_headroom(candidates, need.0), need);
            (alone.unwrap_or(usize::MAX), need.0)
        })
        .collect();
    orderings.sort_by_key(|&(servers, _)| std::cmp::Reverse(servers));
    let top = width_max.min(candidates.len());
    let bottom = width_min.clamp(1, top);
    let mut best: Option<Vec<Candidate<'a>>> = None;
    for (_, dimension) in orderings {
        let mut ordered = candidates.to_vec();
        ordered.sort_by_key(|c| {
            let space = &c.load.space;
            (
                std::cmp::Reverse(c.headroom(dimension)),
                std::cmp::Reverse(space.free_bytes),
                space.server,
            )
        });
        let fewest = (bottom..=top).find(|&n| needs.iter().all(|&need| met(&ordered[..n], need)));
        if let Some(n) = fewest {
            if best.as_ref().is_none_or(|chosen| n < chosen.len()) {
                ordered.truncate(n);
                best = Some(ordered);
            }
        }
    }
    best.ok_or(Limit::Together { servers: top as u32 })
}

/// The targets as needs, in the order bandwidth, IOPS, metadata.
fn needs_of(targets: &Targets, namespace: NamespaceAccess) -> Vec<Need> {
    [
        targets.bandwidth_bytes_per_s.map(|rate| (Dimension::Bandwidth, rate)),
        targets.iops.map(|rate| (Dimension::Iops, rate)),
        targets.metadata_ops_per_s.map(|rate| (Dimension::Metadata(namespace), rate)),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Rule 3: private when the metadata target is above every server's striped metadata peak.
pub fn namespace_for(pool: &[ServerLoad], metadata_ops_per_s: Option<u64>) -> NamespaceAccess {
    let best_striped = pool.iter().map(|s| s.peaks.metadata_striped_ops_per_s).max().unwrap_or(0);
    match metadata_ops_per_s {
        Some(target) if target > best_striped => NamespaceAccess::Private,
        _ => NamespaceAccess::Striped,
    }
}

fn check_targets(targets: &Targets) -> Result<(), TargetError> {
    if targets.capacity_bytes.is_none() && !targets.has_rates() {
        return Err(TargetError::NoTarget);
    }
    for (target, value) in [
        ("bandwidth", targets.bandwidth_bytes_per_s),
        ("iops", targets.iops),
        ("metadata", targets.metadata_ops_per_s),
    ] {
        if value == Some(0) {
            return Err(TargetError::ZeroTarget { target });
        }
    }
    Ok(())
}

/// Places `request` on `pool` (see the module documentation for the rules).
pub fn plan(pool: &[ServerLoad], request: &TargetRequest) -> Result<TargetPlan, TargetError> {
    let targets = request.targets;
    check_targets(&targets)?;
    let capacity_request = FragmentRequest {
        capacity_bytes: targets.capacity_bytes.unwrap_or(request.fragment_bytes.max(1)),
        fragment_bytes: request.fragment_bytes,
        stripe_servers_max: request.stripe_servers_max,
        replicas: request.replicas,
    };
    fragments::check_request(capacity_request)?;
    let spaces: Vec<ServerSpace> = pool.iter().map(|s| s.space.clone()).collect();
    if !targets.has_rates() {
        let fragments = fragments::allocate(&spaces, capacity_request)?;
        let why = vec![format!(
            "capacity {} only: {} fragment(s) of {} over {} server(s), as without targets",
            format_bytes(capacity_request.capacity_bytes),
            fragments.fragments,
            format_bytes(fragments.fragment_bytes),
            fragments.per_server.len()
        )];
        let promised_per_server =
            fragments.servers().iter().map(|&s| (s, Rates::default())).collect();
        let namespace = NamespaceAccess::Striped;
        return Ok(TargetPlan { fragments, namespace, promised_per_server, why });
    }
    let namespace = namespace_for(pool, targets.metadata_ops_per_s);
    let needs = needs_of(&targets, namespace);
    let width_max = request.stripe_servers_max as usize;
    // The capacity alone stripes over one server per fragment (copies included), as today.
    let capacity_fragments = targets.capacity_bytes.map_or(0, |bytes| {
        bytes.div_ceil(request.fragment_bytes).saturating_mul(request.replicas as u64)
    });
    let width_min = capacity_fragments.min(width_max as u64) as usize;
    let ideal: Vec<Candidate<'_>> =
        pool.iter().map(|load| Candidate::new(load, namespace, Rates::default())).collect();
    choose(&ideal, &needs, width_min, width_max).map_err(|limit| TargetError::Never { limit })?;
    let eligible: Vec<u64> =
        fragments::eligible_servers(&spaces, request.fragment_bytes, request.replicas)
            .iter()
            .map(|s| s.server)
            .collect();
    let current: Vec<Candidate<'_>> = pool
        .iter()
        .filter(|load| eligible.contains(&load.space.server))
        .map(|load| Candidate::new(load, namespace, load.promised))
        .collect();
    if current.is_empty() {
        let (fragment_bytes, replicas) = (request.fragment_bytes, request.replicas);
        return Err(TargetError::Wait { limit: Limit::NoneEligible { fragment_bytes, replicas } });
    }
    let chosen = choose(&current, &needs, width_min, width_max)
        .map_err(|limit| TargetError::Wait { limit })?;
    place(&chosen, request, namespace, &needs)
}

/// Lays the fragments over the chosen servers (rule 5) and says what each takes on and why.
fn place(
    chosen: &[Candidate<'_>],
    request: &TargetRequest,
    namespace: NamespaceAccess,
    needs: &[Need],
) -> Result<TargetPlan, TargetError> {
    let servers = chosen.len() as u64;
    let spaces: Vec<ServerSpace> = chosen.iter().map(|c| c.load.space.clone()).collect();
    let capacity_bytes = request
        .targets
        .capacity_bytes
        .unwrap_or(0)
        .max(servers.saturating_mul(request.fragment_bytes));
    let mut fragments = fragments::allocate(
        &spaces,
        FragmentRequest {
            capacity_bytes,
            fragment_bytes: request.fragment_bytes,
            stripe_servers_max: servers as u32,
            replicas: request.replicas,
        },
    )?;
    let striped_metadata =
        request.targets.metadata_ops_per_s.is_some() && namespace == NamespaceAccess::Striped;
    if striped_metadata {
        // The namespace lives on the first server in stripe order: the most headroom there.
        let holder = chosen
            .iter()
            .max_by_key(|c| (c.metadata, std::cmp::Reverse(c.load.space.server)))
            .map(|c| c.load.space.server);
        if let Some(at) = fragments.per_server.iter().position(|&(s, _)| Some(s) == holder) {
            let entry = fragments.per_server.remove(at);
            fragments.per_server.insert(0, entry);
        }
    }
    let promised_per_server = split_promises(&fragments, &request.targets, namespace);
    let why = reasons(chosen, request, namespace, needs, &fragments);
    Ok(TargetPlan { fragments, namespace, promised_per_server, why })
}

/// Rule 2 as promises: `⌈T / n⌉` on each server, except a striped namespace's metadata, all on
/// the first.
fn split_promises(
    fragments: &FragmentPlan,
    targets: &Targets,
    namespace: NamespaceAccess,
) -> Vec<(u64, Rates)> {
    let servers = fragments.per_server.len().max(1) as u64;
    let share = |target: Option<u64>| target.unwrap_or(0).div_ceil(servers);
    fragments
        .servers()
        .into_iter()
        .enumerate()
        .map(|(index, server)| {
            let metadata_ops_per_s = match namespace {
                NamespaceAccess::Private => share(targets.metadata_ops_per_s),
                NamespaceAccess::Striped if index == 0 => targets.metadata_ops_per_s.unwrap_or(0),
                NamespaceAccess::Striped => 0,
            };
            let rates = Rates {
                bandwidth_bytes_per_s: share(targets.bandwidth_bytes_per_s),
                iops: share(targets.iops),
                metadata_ops_per_s,
            };
            (server, rates)
        })
        .collect()
}

/// One sentence per target, then the servers and the fragments.
fn reasons(
    chosen: &[Candidate<'_>],
    request: &TargetRequest,
    namespace: NamespaceAccess,
    needs: &[Need],
    fragments: &FragmentPlan,
) -> Vec<String> {
    let servers = chosen.len() as u64;
    let mut why = Vec::new();
    for &(dimension, target) in needs {
        let least = chosen.iter().map(|c| c.headroom(dimension)).min().unwrap_or(0);
        let most = chosen.iter().map(|c| c.headroom(dimension)).max().unwrap_or(0);
        let rate = |value| dimension.format_rate(value);
        why.push(match dimension {
            Dimension::Metadata(NamespaceAccess::Striped) => format!(
                "metadata {} fits one striped namespace (no more than a server's striped peak): it lives on the first server in stripe order, which has {} of headroom",
                rate(target),
                rate(most)
            ),
            Dimension::Metadata(NamespaceAccess::Private) => format!(
                "metadata {} is above every server's striped metadata peak: private namespaces (one per compute node) over {servers} server(s), {} on each; the least private headroom among them is {}",
                rate(target),
                rate(target.div_ceil(servers)),
                rate(least)
            ),
            _ => format!(
                "{dimension} {}: striped over {servers} server(s), {} on each; the least headroom (peak − promised) among them is {}",
                rate(target),
                rate(target.div_ceil(servers)),
                rate(least)
            ),
        });
    }
    if let Some(bytes) = request.targets.capacity_bytes {
        why.push(format!("capacity {}", format_bytes(bytes)));
    }
    why.push(format!(
        "{} fragment(s) of {} ({} granted) over {} server(s), at least one fragment each; {namespace} namespace",
        fragments.fragments,
        format_bytes(fragments.fragment_bytes),
        format_bytes(fragments.granted_bytes()),
        fragments.per_server.len()
    ));
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    const FRAGMENT: u64 = 8 * MIB;

    type Parser = fn(&str) -> Result<u64, TargetParseError>;

    #[test]
    fn targets_parse_with_units() {
        let cases: [(&str, Parser, u64); 12] = [
            ("2GiB/s", parse_bandwidth, 2 * GIB),
            ("500MB/s", parse_bandwidth, 500_000_000),
            ("1.5GB/s", parse_bandwidth, 1_500_000_000),
            ("1.5GiB/s", parse_bandwidth, 3 * GIB / 2),
            (" 800m/s ", parse_bandwidth, 800 * MIB),
            ("4096/s", parse_bandwidth, 4096),
            ("20k", |t| parse_ops_rate("iops", t), 20_000),
            ("20k/s", |t| parse_ops_rate("iops", t), 20_000),
            ("20000", |t| parse_ops_rate("iops", t), 20_000),
            ("1.5M", |t| parse_ops_rate("iops", t), 1_500_000),
            ("5k/s", |t| parse_ops_rate("metadata", t), 5_000),
            ("64GiB", parse_capacity, 64 * GIB),
        ];
        for (text, parse, expected) in cases {
            assert_eq!(parse(text), Ok(expected), "{text}");
        }
        // A fraction of a byte or an operation rounds up: a target is a floor.
        assert_eq!(parse_ops_rate("iops", "1.0005k"), Ok(1001));
    }

    #[test]
    fn bad_targets_are_refused_naming_the_text() {
        let bad = [
            (parse_bandwidth("2GiB"), "\"2GiB\" is not a rate"),
            (parse_bandwidth("fast/s"), "\"fast/s\": no number"),
            (parse_bandwidth("2XB/s"), "unknown unit \"XB\""),
            (parse_bandwidth("0GiB/s"), "\"0GiB/s\" is zero"),
            (parse_bandwidth("99999999PiB/s"), "too large"),
            (parse_ops_rate("iops", "20q"), "iops \"20q\": unknown unit \"q\""),
            (parse_ops_rate("metadata", "k/s"), "metadata \"k/s\": no number"),
            (parse_ops_rate("metadata", "1.2.3k"), "no number"),
            (parse_capacity("lots"), "capacity \"lots\": no number"),
            (parse_capacity("0"), "is zero"),
        ];
        for (result, needle) in bad {
            let message = result.unwrap_err().to_string();
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        }
        for (text, needle) in [
            ("bandwidth=1GiB/s speed=3", "unknown target \"speed\""),
            ("iops=1k iops=2k", "iops= is given twice"),
            ("capacity", "\"capacity\" is not key=value"),
            ("bandwidth=1GiB", "not a rate"),
        ] {
            let message = text.parse::<Targets>().unwrap_err().to_string();
            assert!(message.contains(needle), "{text}: {message:?} lacks {needle:?}");
        }
    }

    #[test]
    fn targets_display_in_their_own_syntax_and_round_trip() {
        let targets = Targets {
            capacity_bytes: Some(64 * GIB),
            bandwidth_bytes_per_s: Some(2 * GIB),
            iops: Some(20_000),
            metadata_ops_per_s: Some(5_000),
        };
        let text = targets.to_string();
        assert_eq!(text, "capacity=64GiB bandwidth=2GiB/s iops=20k metadata=5k/s");
        assert_eq!(text.parse::<Targets>(), Ok(targets));
        assert_eq!(format_bandwidth(1_500_000_000), "1.5GB/s");
        assert_eq!(format_bandwidth(3 * GIB / 2), "1.5GiB/s");
        assert_eq!(format_bandwidth(1500 * MIB), "1500MiB/s");
        assert_eq!(format_bandwidth(7), "7B/s");
        assert_eq!(format_iops(1234), "1.234k");
        assert_eq!(format_iops(950), "950");
        assert_eq!(format_metadata_rate(1_500_000), "1.5M/s");
        assert_eq!(format_capacity(2800 * MIB), "2800MiB");
        assert_eq!(format_capacity(4097), "4097");
        assert_eq!(Targets { iops: Some(3), ..Targets::default() }.to_string(), "iops=3");
        // Every value in a spread of magnitudes formats to text that parses back to it.
        let mut value: u64 = 1;
        while value < u64::MAX / 3 {
            for v in [value, value + 1, value.saturating_mul(1000), value.saturating_mul(1 << 20)] {
                assert_eq!(parse_bandwidth(&format_bandwidth(v)), Ok(v), "{v}");
                assert_eq!(parse_ops_rate("iops", &format_iops(v)), Ok(v), "{v}");
                assert_eq!(parse_ops_rate("metadata", &format_metadata_rate(v)), Ok(v), "{v}");
                assert_eq!(parse_capacity(&format_capacity(v)), Ok(v), "{v}");
            }
            value = value * 3 + 1;
        }
    }

    #[test]
    fn measurements_round_up_to_readable_targets() {
        assert_eq!(round_up_bandwidth(1452.0 * MIB as f64), 1500 * MIB);
        assert_eq!(round_up_bandwidth(32.2 * MIB as f64), 33 * MIB);
        assert_eq!(round_up_bandwidth(300.0 * 1024.0), 300 * 1024);
        assert_eq!(round_up_bandwidth(0.0), 0);
        assert_eq!(round_up_ops_rate(9467.0), 9500);
        assert_eq!(round_up_ops_rate(61.0), 61);
        assert_eq!(round_up_ops_rate(100.0), 100, "exact values stay");
        assert_eq!(round_up_capacity(151 * MIB + 600 * 1024), 160 * MIB);
        assert_eq!(round_up_capacity(10), MIB);
    }

    /// A server of 800 MiB/s, 50k IOPS, 20k striped and 30k private metadata ops/s, 100
    /// fragments free, nothing promised, on its own host.
    fn server(id: u64) -> ServerLoad {
        ServerLoad {
            space: ServerSpace {
                server: id,
                free_bytes: 100 * FRAGMENT,
                healthy: true,
                domain: Some(format!("host{id}")),
            },
            peaks: ServerPeaks {
                bandwidth_bytes_per_s: 800 * MIB,
                iops: 50_000,
                metadata_striped_ops_per_s: 20_000,
                metadata_private_ops_per_s: 30_000,
            },
            promised: Rates::default(),
        }
    }

    fn pool(servers: u64) -> Vec<ServerLoad> {
        (1..=servers).map(server).collect()
    }

    fn request(targets: &str) -> TargetRequest {
        TargetRequest {
            targets: targets.parse().unwrap(),
            fragment_bytes: FRAGMENT,
            stripe_servers_max: 8,
            replicas: 1,
        }
    }

    fn sorted(mut servers: Vec<u64>) -> Vec<u64> {
        servers.sort_unstable();
        servers
    }

    #[test]
    fn bandwidth_bound_stripes_over_more_servers() {
        let servers = pool(5);
        let one = plan(&servers, &request("bandwidth=500MiB/s")).unwrap();
        assert_eq!(one.stripe_count(), 1);
        let three = plan(&servers, &request("bandwidth=2GiB/s")).unwrap();
        assert_eq!(three.stripe_count(), 3, "2 × 800 MiB/s < 2 GiB/s ≤ 3 × 800 MiB/s");
        assert_eq!(three.namespace, NamespaceAccess::Striped);
        assert_eq!(three.fragments.fragments, 3, "one fragment per server");
        let share = (2 * GIB).div_ceil(3);
        assert!(three.promised_per_server.iter().all(|(_, r)| r.bandwidth_bytes_per_s == share));
        assert!(
            three.why[0].contains("bandwidth 2.0 GiB/s: striped over 3 server(s)"),
            "{:?}",
            three.why
        );
        // Least promised first: server 1 has 600 MiB/s promised, so it is left out.
        let mut busy = pool(5);
        busy[0].promised.bandwidth_bytes_per_s = 600 * MIB;
        let avoided = plan(&busy, &request("bandwidth=2GiB/s")).unwrap();
        assert!(!avoided.servers().contains(&1), "{:?}", avoided.servers());
        assert_eq!(avoided.stripe_count(), 3);
    }

    #[test]
    fn metadata_bound_gets_private_namespaces_on_more_servers() {
        let servers = pool(5);
        // 50k ops/s: above every striped peak (20k); private at 30k per server needs 2.
        let private = plan(&servers, &request("metadata=50k/s")).unwrap();
        assert_eq!(private.namespace, NamespaceAccess::Private);
        assert_eq!(private.stripe_count(), 2);
        assert!(private.promised_per_server.iter().all(|(_, r)| r.metadata_ops_per_s == 25_000));
        assert!(private.why[0].contains("private namespaces"), "{:?}", private.why);
        // 20k fits one striped namespace exactly; it goes to the server with the most headroom,
        // first in stripe order even though another has more free space.
        let mut striped_pool = pool(3);
        striped_pool[0].promised.metadata_ops_per_s = 5_000;
        striped_pool[1].space.free_bytes = 500 * FRAGMENT;
        striped_pool[1].promised.metadata_ops_per_s = 1_000;
        let striped = plan(&striped_pool, &request("capacity=24MiB metadata=15k/s")).unwrap();
        assert_eq!(striped.namespace, NamespaceAccess::Striped);
        assert_eq!(striped.servers(), vec![3, 2, 1], "server 3 has all 20k free; then by space");
        let metadata: Vec<u64> =
            striped.promised_per_server.iter().map(|(_, r)| r.metadata_ops_per_s).collect();
        assert_eq!(metadata, vec![15_000, 0, 0], "a striped namespace's load is on its server");
        assert_eq!(namespace_for(&servers, Some(20_000)), NamespaceAccess::Striped);
        assert_eq!(namespace_for(&servers, Some(20_001)), NamespaceAccess::Private);
        assert_eq!(namespace_for(&servers, None), NamespaceAccess::Striped);
    }

    #[test]
    fn iops_bound_spreads_over_the_servers_with_most_iops_headroom() {
        let mut servers = pool(4);
        servers[0].peaks.iops = 100_000;
        servers[1].peaks.iops = 40_000;
        servers[2].peaks.iops = 100_000;
        servers[3].peaks.iops = 100_000;
        servers[3].promised.iops = 70_000;
        // Headrooms 100k, 40k, 100k, 30k: two servers with 100k meet 150k at 75k each.
        let planned = plan(&servers, &request("iops=150k")).unwrap();
        assert_eq!(sorted(planned.servers()), vec![1, 3]);
        assert!(planned.promised_per_server.iter().all(|(_, r)| r.iops == 75_000));
        // 210k: three servers would each carry 70k, more than server 2's 40k; with all four,
        // 52.5k each is more than server 4's 30k: the pool cannot now, but could at its peaks.
        let error = plan(&servers, &request("iops=210k")).unwrap_err();
        assert_eq!(
            error,
            TargetError::Wait {
                limit: Limit::Rate {
                    dimension: Dimension::Iops,
                    target: 210_000,
                    best: 200_000,
                    servers: 2
                }
            }
        );
    }

    #[test]
    fn capacity_only_is_todays_fragment_allocation() {
        let mut servers = pool(4);
        servers[1].space.free_bytes = 3 * FRAGMENT;
        servers[2].space.healthy = false;
        servers[3].promised.bandwidth_bytes_per_s = 800 * MIB; // no effect without targets
        let spaces: Vec<ServerSpace> = servers.iter().map(|s| s.space.clone()).collect();
        for (capacity, width, replicas) in
            [(1, 8, 1), (24, 8, 1), (80, 2, 1), (800, 8, 1), (16, 8, 2)]
        {
            let asked = TargetRequest {
                targets: Targets { capacity_bytes: Some(capacity * MIB), ..Targets::default() },
                fragment_bytes: FRAGMENT,
                stripe_servers_max: width,
                replicas,
            };
            let expected = fragments::allocate(
                &spaces,
                FragmentRequest {
                    capacity_bytes: capacity * MIB,
                    fragment_bytes: FRAGMENT,
                    stripe_servers_max: width,
                    replicas,
                },
            );
            let planned = plan(&servers, &asked);
            match expected {
                Ok(fragments) => {
                    let planned = planned.unwrap();
                    assert_eq!(planned.fragments, fragments);
                    assert_eq!(planned.namespace, NamespaceAccess::Striped);
                    assert!(planned
                        .promised_per_server
                        .iter()
                        .all(|(_, r)| *r == Rates::default()));
                }
                Err(error) => assert_eq!(planned, Err(TargetError::Placement(error))),
            }
        }
    }

    #[test]
    fn capacity_with_a_rate_stripes_at_least_as_wide_as_capacity_alone() {
        let servers = pool(6);
        let planned = plan(&servers, &request("capacity=40MiB bandwidth=100MiB/s")).unwrap();
        assert_eq!(planned.stripe_count(), 5, "5 fragments, one per server, as today");
        assert!(planned
            .promised_per_server
            .iter()
            .all(|(_, r)| r.bandwidth_bytes_per_s == 20 * MIB));
        let planned = plan(&servers, &request("capacity=8MiB bandwidth=3GiB/s")).unwrap();
        assert_eq!(
            planned.stripe_count(),
            4,
            "the rate needs 4; capacity is raised to 4 fragments"
        );
        assert_eq!(planned.fragments.granted_bytes(), 4 * FRAGMENT);
    }

    #[test]
    fn wait_when_promises_are_full_never_beyond_the_peaks() {
        let servers = pool(5);
        // 5 × 800 MiB/s = 4000 MiB/s is all the pool has.
        let never = plan(&servers, &request("bandwidth=5GiB/s")).unwrap_err();
        let limit = Limit::Rate {
            dimension: Dimension::Bandwidth,
            target: 5 * GIB,
            best: 4000 * MIB,
            servers: 5,
        };
        assert_eq!(never, TargetError::Never { limit });
        let message = never.to_string();
        assert!(
            message.contains("bandwidth 5.0 GiB/s asked, at most 3.9 GiB/s from 5 server(s)"),
            "{message}"
        );
        // Within the peaks: a first reservation fits, a second waits, and fits once it ends.
        let mut promised = pool(5);
        let first = plan(&promised, &request("bandwidth=3GiB/s")).unwrap();
        for (server, rates) in &first.promised_per_server {
            let load = promised.iter_mut().find(|s| s.space.server == *server).unwrap();
            load.promised.bandwidth_bytes_per_s += rates.bandwidth_bytes_per_s;
            assert!(load.promised.bandwidth_bytes_per_s <= load.peaks.bandwidth_bytes_per_s);
        }
        let second = plan(&promised, &request("bandwidth=2GiB/s")).unwrap_err();
        assert!(matches!(second, TargetError::Wait { limit: Limit::Rate { .. } }), "{second}");
        assert!(second.to_string().starts_with("not now: bandwidth"), "{second}");
        assert!(plan(&pool(5), &request("bandwidth=2GiB/s")).is_ok(), "after the first ends");
        // Down servers: wait (they may come back); a stripe width the knob forbids: never.
        let mut down = pool(5);
        for load in &mut down[..3] {
            load.space.healthy = false;
        }
        assert!(matches!(plan(&down, &request("bandwidth=2GiB/s")), Err(TargetError::Wait { .. })));
        let narrow = TargetRequest { stripe_servers_max: 2, ..request("bandwidth=2GiB/s") };
        let error = plan(&servers, &narrow).unwrap_err();
        assert_eq!(
            error,
            TargetError::Never {
                limit: Limit::StripeWidth {
                    dimension: Dimension::Bandwidth,
                    servers_needed: 3,
                    stripe_servers_max: 2
                }
            }
        );
        assert!(error.to_string().contains("manager.stripe_servers_max"), "{error}");
        assert_eq!(
            plan(&[], &request("iops=1k")),
            Err(TargetError::Never { limit: Limit::NoServer })
        );
        // Servers, none with a fragment free: not "no server", but what they lack.
        let mut full = pool(2);
        for server in &mut full {
            server.space.free_bytes = FRAGMENT - 1;
        }
        let error = plan(&full, &request("iops=1k")).unwrap_err();
        assert!(matches!(error, TargetError::Wait { limit: Limit::NoneEligible { .. } }));
        assert!(error
            .to_string()
            .contains("no server of the pool is healthy with a free fragment"));
    }

    #[test]
    fn targets_that_fit_alone_but_not_together_are_named() {
        // Servers 1, 2: bandwidth, no IOPS to speak of; 3, 4: the reverse. An even split puts a
        // share of both on every server chosen, so no set serves both targets.
        let mut servers = pool(4);
        for load in &mut servers[..2] {
            load.peaks.iops = 10;
        }
        for load in &mut servers[2..] {
            load.peaks.bandwidth_bytes_per_s = MIB;
        }
        let error = plan(&servers, &request("bandwidth=1GiB/s iops=60k")).unwrap_err();
        assert_eq!(error, TargetError::Never { limit: Limit::Together { servers: 4 } });
        assert!(plan(&servers, &request("bandwidth=1GiB/s")).is_ok());
        assert!(plan(&servers, &request("iops=60k")).is_ok());
    }

    #[test]
    fn bad_requests_are_refused() {
        let servers = pool(2);
        assert_eq!(plan(&servers, &request("")), Err(TargetError::NoTarget));
        let zero = TargetRequest {
            targets: Targets { iops: Some(0), ..Targets::default() },
            ..request("capacity=1MiB")
        };
        assert_eq!(plan(&servers, &zero), Err(TargetError::ZeroTarget { target: "iops" }));
        let no_fragment = TargetRequest { fragment_bytes: 0, ..request("iops=1k") };
        assert_eq!(
            plan(&servers, &no_fragment),
            Err(TargetError::Placement(FragmentError::ZeroFragment))
        );
        let zero_capacity = TargetRequest {
            targets: Targets { capacity_bytes: Some(0), iops: Some(1), ..Targets::default() },
            ..request("iops=1k")
        };
        assert_eq!(
            plan(&servers, &zero_capacity),
            Err(TargetError::Placement(FragmentError::ZeroCapacity))
        );
    }

    #[test]
    fn plans_are_deterministic_and_promises_stay_within_headroom() {
        for targets in [
            "bandwidth=1GiB/s",
            "iops=70k metadata=10k/s",
            "capacity=100MiB bandwidth=300MiB/s iops=10k metadata=45k/s",
            "metadata=90k/s",
        ] {
            let mut servers = pool(6);
            for (i, load) in servers.iter_mut().enumerate() {
                load.promised.bandwidth_bytes_per_s = i as u64 * 50 * MIB;
                load.promised.iops = (i as u64 * 7_000) % 20_000;
                load.promised.metadata_ops_per_s = (i as u64 * 3_000) % 10_000;
            }
            let first = plan(&servers, &request(targets)).unwrap();
            assert_eq!(plan(&servers, &request(targets)), Ok(first.clone()), "{targets}");
            assert_eq!(
                first.servers(),
                first.promised_per_server.iter().map(|p| p.0).collect::<Vec<_>>()
            );
            for (server, rates) in &first.promised_per_server {
                let load = &servers[*server as usize - 1];
                let peaks = load.peaks;
                assert!(
                    load.promised.bandwidth_bytes_per_s + rates.bandwidth_bytes_per_s
                        <= peaks.bandwidth_bytes_per_s,
                    "{targets}"
                );
                assert!(load.promised.iops + rates.iops <= peaks.iops, "{targets}");
                let metadata_peak = peaks.metadata(first.namespace);
                assert!(
                    load.promised.metadata_ops_per_s + rates.metadata_ops_per_s <= metadata_peak,
                    "{targets}"
                );
            }
            let request = request(targets);
            let total = |pick: fn(&Rates) -> u64| {
                first.promised_per_server.iter().map(|(_, r)| pick(r)).sum::<u64>()
            };
            assert!(
                total(|r| r.bandwidth_bytes_per_s)
                    >= request.targets.bandwidth_bytes_per_s.unwrap_or(0)
            );
            assert!(total(|r| r.iops) >= request.targets.iops.unwrap_or(0));
            assert!(
                total(|r| r.metadata_ops_per_s) >= request.targets.metadata_ops_per_s.unwrap_or(0)
            );
        }
    }
}
