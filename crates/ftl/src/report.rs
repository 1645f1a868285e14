//! What a simulation run reports: WAF over time and at the end, GC copies, wear per SSD, and the
//! modelled throughput and write latency. Serializable for `--json`; plotted as SVG.

use crate::ssd::{Ssd, SsdCounters};

/// One point of the WAF-over-time curve.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct WafSample {
    /// Host bytes written so far, over all SSDs.
    pub host_bytes: u64,
    /// Host bytes so far ÷ logical capacity ("device writes", the x axis of the plots).
    pub device_writes: f64,
    /// Modelled time so far (seconds) when the workload has a time model, else 0.
    pub time_s: f64,
    /// WAF of the interval since the previous sample (what `nvme smart-log` deltas show).
    pub waf_window: f64,
    pub waf_cumulative: f64,
}

/// Wear and amplification of one SSD.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SsdSummary {
    pub host_pages: u64,
    pub gc_copied_pages: u64,
    pub waf: f64,
    pub erases: u64,
    pub erase_count_min: u32,
    pub erase_count_max: u32,
    pub erase_count_mean: f64,
}

impl SsdSummary {
    pub fn of(ssd: &Ssd) -> SsdSummary {
        let c = ssd.counters();
        let counts = ssd.erase_counts();
        SsdSummary {
            host_pages: c.host_pages,
            gc_copied_pages: c.gc_copied_pages,
            waf: c.waf(),
            erases: c.erases,
            erase_count_min: counts.iter().copied().min().unwrap_or(0),
            erase_count_max: counts.iter().copied().max().unwrap_or(0),
            erase_count_mean: counts.iter().map(|&c| c as f64).sum::<f64>()
                / counts.len().max(1) as f64,
        }
    }
}

/// Latency percentiles in milliseconds.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LatencyPercentiles {
    pub count: u64,
    pub latency_ms_p50: f64,
    pub latency_ms_p95: f64,
    pub latency_ms_p99: f64,
    pub latency_ms_p999: f64,
    pub latency_ms_p9999: f64,
    pub latency_ms_max: f64,
}

impl LatencyPercentiles {
    /// Nearest-rank percentiles of `samples_ns` (sorted in place). None when empty.
    pub fn from_ns(samples_ns: &mut [u64]) -> Option<LatencyPercentiles> {
        if samples_ns.is_empty() {
            return None;
        }
        samples_ns.sort_unstable();
        let at = |q: f64| {
            let rank = ((q * samples_ns.len() as f64).ceil() as usize).clamp(1, samples_ns.len());
            samples_ns[rank - 1] as f64 / 1e6
        };
        Some(LatencyPercentiles {
            count: samples_ns.len() as u64,
            latency_ms_p50: at(0.50),
            latency_ms_p95: at(0.95),
            latency_ms_p99: at(0.99),
            latency_ms_p999: at(0.999),
            latency_ms_p9999: at(0.9999),
            latency_ms_max: *samples_ns.last().unwrap() as f64 / 1e6,
        })
    }
}

/// The result of one simulation run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RunReport {
    pub label: String,
    /// WAF over the steady-state window ([`SteadyWindow`]), all SSDs together.
    pub waf_steady: f64,
    /// Where the steady-state window lies and whether the run reached steady state.
    pub steady_window: SteadyWindow,
    /// WAF from the first write to the end.
    pub waf_cumulative: f64,
    /// Per user, for workloads that have users (bios): shares, quota and what it wrote.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<UserSummary>,
    pub host_pages: u64,
    pub gc_copied_pages: u64,
    pub erases: u64,
    pub per_ssd: Vec<SsdSummary>,
    pub samples: Vec<WafSample>,
    /// Modelled host write throughput over the measurement window, MiB/s (all SSDs).
    pub throughput_mib_per_s: Option<f64>,
    /// Modelled latency of each file write (first chunk issued → last chunk done), measurement
    /// window only.
    pub file_write_latency: Option<LatencyPercentiles>,
    /// Simulator speed (not deterministic; excluded from comparisons).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall: Option<WallClock>,
}

/// Host writes ÷ logical capacity that must precede the steady-state window for the run to count
/// as having reached steady state: the device must have been written through once, so that
/// every page GC meets was written by the workload, not by the initial fill or not at all.
pub const STEADY_MIN_DEVICE_WRITES_BEFORE: f64 = 1.0;

/// Steady state, one definition for every workload (synthetic, bios, replay, trace): the second
/// half of the run's host page writes. The run has reached steady state when the host wrote at
/// least [`STEADY_MIN_DEVICE_WRITES_BEFORE`] device-writes before the window starts, i.e. the
/// run writes at least twice the logical capacity. BIOS measured from minute 30 of 60, the
/// second half in time; host writes are the workload-independent clock (a replay has no time).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SteadyWindow {
    /// Host writes ÷ logical capacity where the window starts.
    pub start_device_writes: f64,
    /// Host writes ÷ logical capacity at the end of the run.
    pub end_device_writes: f64,
    /// Whether the run wrote enough before the window for it to be a steady state.
    pub reached: bool,
    /// When not reached: why, and how long a run would be needed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl SteadyWindow {
    /// Host page writes after which the window of a run of `total_host_pages` starts.
    pub fn start_host_pages(total_host_pages: u64) -> u64 {
        total_host_pages / 2
    }

    /// The steady-state WAF between counters `start` (taken when the host page count first
    /// reached [`SteadyWindow::start_host_pages`]) and `end`, and the window's description.
    pub fn measure(
        start: &SsdCounters,
        end: &SsdCounters,
        logical_bytes: u64,
        page_bytes: u64,
    ) -> (f64, SteadyWindow) {
        let device_writes =
            |c: &SsdCounters| (c.host_pages * page_bytes) as f64 / logical_bytes.max(1) as f64;
        let start_device_writes = device_writes(start);
        let reached = start_device_writes >= STEADY_MIN_DEVICE_WRITES_BEFORE;
        let note = (!reached).then(|| {
            format!(
                "steady state not reached: the run wrote {} device-writes in all, {} before the \
                 window (the second half); steady state needs ≥ {} before it, a run of ≥ {} \
                 device-writes; the WAF shown is the second half's",
                readable(device_writes(end)),
                readable(start_device_writes),
                STEADY_MIN_DEVICE_WRITES_BEFORE,
                2.0 * STEADY_MIN_DEVICE_WRITES_BEFORE
            )
        });
        let window = SteadyWindow {
            start_device_writes,
            end_device_writes: device_writes(end),
            reached,
            note,
        };
        (end.waf_since(start), window)
    }
}

/// A device-write count for a message: three decimals, or three significant digits when tiny (a
/// small trace writes a millionth of a device).
fn readable(device_writes: f64) -> String {
    if device_writes == 0.0 || device_writes >= 0.001 {
        format!("{device_writes:.3}")
    } else {
        format!("{device_writes:.2e}")
    }
}

/// What one user of a workload was given and what it did.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct UserSummary {
    pub user: u32,
    /// Relative write rate (weight; see `BiosParams::write_shares`).
    pub write_share: f64,
    pub quota_bytes: u64,
    /// Host bytes the user wrote over the whole run.
    pub host_bytes: u64,
    pub files_deleted: u64,
    /// Mean modelled time from a file's completion to its deletion, seconds (0 if none).
    pub mean_file_lifetime_s: f64,
}

/// Simulator speed. Not deterministic; excluded from comparisons.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct WallClock {
    pub seconds: f64,
    /// CPU time of the simulating thread (one core), immune to other processes on the machine.
    pub cpu_seconds: f64,
    /// Host page writes per CPU second of the simulating thread.
    pub host_page_writes_per_second: f64,
    /// Host writes plus GC copies (every NAND page program simulated) per CPU second.
    pub nand_page_programs_per_second: f64,
}

/// Measures wall-clock and thread CPU time of a run.
pub struct Stopwatch {
    wall: std::time::Instant,
    cpu_seconds: f64,
}

/// CPU time consumed by the calling thread, in seconds.
pub fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid pointer we pass.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

impl Stopwatch {
    pub fn start() -> Stopwatch {
        Stopwatch { wall: std::time::Instant::now(), cpu_seconds: thread_cpu_seconds() }
    }

    pub fn finish(&self, counters: &SsdCounters) -> WallClock {
        let seconds = self.wall.elapsed().as_secs_f64();
        let cpu_seconds = (thread_cpu_seconds() - self.cpu_seconds).max(1e-9);
        WallClock {
            seconds,
            cpu_seconds,
            host_page_writes_per_second: counters.host_pages as f64 / cpu_seconds,
            nand_page_programs_per_second: (counters.host_pages + counters.gc_copied_pages) as f64
                / cpu_seconds,
        }
    }
}

/// Collects WAF samples at a fixed host-page period.
pub struct Sampler {
    every_host_pages: u64,
    next_at: u64,
    last: SsdCounters,
    logical_bytes: u64,
    page_bytes: u64,
    pub samples: Vec<WafSample>,
}

impl Sampler {
    pub fn new(
        total_host_pages: u64,
        samples: u32,
        logical_bytes: u64,
        page_bytes: u64,
    ) -> Sampler {
        let every = (total_host_pages / samples.max(1) as u64).max(1);
        Sampler {
            every_host_pages: every,
            next_at: every,
            last: SsdCounters::default(),
            logical_bytes,
            page_bytes,
            samples: Vec::with_capacity(samples as usize + 1),
        }
    }

    /// Records a sample if the period has passed.
    #[inline]
    pub fn observe(&mut self, counters: &SsdCounters, time_ns: u64) {
        if counters.host_pages >= self.next_at {
            self.force(counters, time_ns);
        }
    }

    /// Records a sample now (the end of a run) unless the interval is too short (under a
    /// quarter period) to give a meaningful windowed WAF.
    pub fn force(&mut self, counters: &SsdCounters, time_ns: u64) {
        let since = counters.host_pages - self.last.host_pages;
        if since == 0 || (since < self.every_host_pages / 4 && !self.samples.is_empty()) {
            return;
        }
        let host_bytes = counters.host_pages * self.page_bytes;
        self.samples.push(WafSample {
            host_bytes,
            device_writes: host_bytes as f64 / self.logical_bytes as f64,
            time_s: time_ns as f64 / 1e9,
            waf_window: counters.waf_since(&self.last),
            waf_cumulative: counters.waf(),
        });
        self.last = *counters;
        while self.next_at <= counters.host_pages {
            self.next_at += self.every_host_pages;
        }
    }
}
