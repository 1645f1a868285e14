//! Single-SSD synthetic workloads: uniform random overwrite and hot/cold skew.
//!
//! Both start by writing every logical page once (sequentially), then overwrite at random
//! `device_writes` times the logical capacity. Steady-state WAF is measured over the second half
//! of all host writes, fill included ([`crate::report::SteadyWindow`], the same for every
//! workload), so the closed form for steady state applies. Randomness comes from a seeded ChaCha8.

use crate::mapping::Mapping;
use crate::report::{RunReport, Sampler, SsdSummary, SteadyWindow};
use crate::ssd::{Ssd, SsdConfig, SsdConfigError};
use rand::{Rng, SeedableRng};

/// Which logical pages are overwritten.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Skew {
    Uniform,
    /// `hot_write_fraction` of the writes go to the first `hot_space_fraction` of the pages.
    HotCold {
        hot_space_fraction: f64,
        hot_write_fraction: f64,
    },
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct SyntheticParams {
    pub ssd: SsdConfig,
    pub skew: Skew,
    /// Random overwrites after the initial fill, as multiples of the logical capacity.
    pub device_writes: f64,
    pub samples: u32,
    pub seed: u64,
}

/// Why a synthetic run cannot proceed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SyntheticError {
    #[error(transparent)]
    Ssd(#[from] SsdConfigError),
    #[error("mapping {mapping} does not apply to the {workload} workload: {reason}")]
    Mapping { mapping: &'static str, workload: &'static str, reason: &'static str },
    #[error("{name} = {value} must be a finite number ≥ 0")]
    DeviceWrites { name: &'static str, value: f64 },
    #[error(
        "hot/cold fractions must lie strictly between 0 and 1 (space {space}, writes {writes})"
    )]
    Fractions { space: f64, writes: f64 },
}

/// Runs the workload. `legacy` puts everything on stream 0; for hot/cold, `lifetime_aware`
/// separates hot pages (short lifetime) onto stream 1 and cold onto stream 0.
pub fn run(params: &SyntheticParams, mapping: Mapping) -> Result<RunReport, SyntheticError> {
    let started = crate::report::Stopwatch::start();
    let separate = separates_hot_pages(params, mapping)?;
    if !(params.device_writes.is_finite() && params.device_writes >= 0.0) {
        return Err(SyntheticError::DeviceWrites {
            name: "device_writes",
            value: params.device_writes,
        });
    }
    let mut ssd = Ssd::new(params.ssd.clone())?;
    let logical = ssd.logical_pages();
    let hot = HotRegion::of(params.skew, logical)?;
    let stream_of = |lpn: u32| -> u16 { u16::from(separate && lpn < hot.pages) };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(params.seed);
    let page_bytes = params.ssd.page_bytes as u64;
    let logical_bytes = logical as u64 * page_bytes;
    let overwrites = (logical as f64 * params.device_writes) as u64;
    let total = logical as u64 + overwrites;
    let window_start = SteadyWindow::start_host_pages(total);
    let mut sampler = Sampler::new(total, params.samples, logical_bytes, page_bytes);
    let mut window = None;
    for i in 0..total {
        if i == window_start {
            window = Some(ssd.counters());
        }
        // The fill writes every page once, in order; then random overwrites.
        let lpn = if i < logical as u64 { i as u32 } else { hot.pick_page(&mut rng, logical) };
        ssd.write(lpn, stream_of(lpn));
        if i % 4096 == 0 {
            sampler.observe(&ssd.counters(), 0);
        }
    }
    let counters = ssd.counters();
    sampler.force(&counters, 0);
    let window = window.unwrap_or_default();
    let (waf_steady, steady_window) =
        SteadyWindow::measure(&window, &counters, logical_bytes, page_bytes);
    Ok(RunReport {
        label: run_label(params, mapping),
        waf_steady,
        steady_window,
        waf_cumulative: counters.waf(),
        users: Vec::new(),
        host_pages: counters.host_pages,
        gc_copied_pages: counters.gc_copied_pages,
        erases: counters.erases,
        per_ssd: vec![SsdSummary::of(&ssd)],
        samples: sampler.samples,
        throughput_mib_per_s: None,
        file_write_latency: None,
        wall: Some(started.finish(&counters)),
    })
}

/// Whether `mapping` puts hot pages on their own stream, or why it does not apply.
fn separates_hot_pages(params: &SyntheticParams, mapping: Mapping) -> Result<bool, SyntheticError> {
    match (params.skew, mapping) {
        (_, Mapping::Legacy) | (Skew::Uniform, Mapping::LifetimeAware) => Ok(false),
        (Skew::HotCold { .. }, Mapping::LifetimeAware) if params.ssd.streams < 2 => {
            Err(SyntheticError::Mapping {
                mapping: mapping.name(),
                workload: "hot_cold",
                reason: "needs at least 2 streams",
            })
        }
        (_, Mapping::UserId | Mapping::PerJob) => Err(SyntheticError::Mapping {
            mapping: mapping.name(),
            workload: "uniform/hot_cold",
            reason: "the workload has no users or jobs",
        }),
        (Skew::HotCold { .. }, Mapping::LifetimeAware) => Ok(true),
    }
}

/// The hot pages (the first `pages` logical pages) and the probability a write goes to them.
#[derive(Clone, Copy)]
struct HotRegion {
    pages: u32,
    probability: f64,
}

impl HotRegion {
    /// The hot region of `skew` over `logical_pages`: all of them, always written, when uniform.
    fn of(skew: Skew, logical_pages: u32) -> Result<HotRegion, SyntheticError> {
        let (pages, probability) = match skew {
            Skew::Uniform => (logical_pages, 1.0),
            Skew::HotCold { hot_space_fraction, hot_write_fraction } => {
                let ok = |f: f64| f > 0.0 && f < 1.0;
                if !ok(hot_space_fraction) || !ok(hot_write_fraction) {
                    return Err(SyntheticError::Fractions {
                        space: hot_space_fraction,
                        writes: hot_write_fraction,
                    });
                }
                (((logical_pages as f64 * hot_space_fraction) as u32).max(1), hot_write_fraction)
            }
        };
        Ok(HotRegion { pages, probability })
    }

    /// Draws the logical page of the next overwrite: hot with the region's probability.
    fn pick_page(self, rng: &mut rand_chacha::ChaCha8Rng, logical_pages: u32) -> u32 {
        if self.probability >= 1.0 {
            rng.gen_range(0..logical_pages)
        } else if rng.gen_bool(self.probability) {
            rng.gen_range(0..self.pages)
        } else {
            rng.gen_range(self.pages..logical_pages)
        }
    }
}

/// Label of a run: mapping, skew and GC victim policy.
fn run_label(params: &SyntheticParams, mapping: Mapping) -> String {
    format!(
        "{} {} {}",
        mapping.name(),
        match params.skew {
            Skew::Uniform => "uniform".to_string(),
            Skew::HotCold { hot_space_fraction, hot_write_fraction } =>
                format!("hot_cold {hot_write_fraction}/{hot_space_fraction}"),
        },
        serde_json::to_value(params.ssd.victim)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    )
}
