//! `spillway bench mount`, stat phase: `stat` of the same files through a caching mount (the
//! default: entries and attributes cached, kept consistent by invalidations) and through a
//! mount of the same namespace with TTL 0 (every lookup and stat asks the namespace server),
//! in alternating runs after one unmeasured pass each (which fills the caching mount's cache,
//! as any first look does). Reported: the medians and
//! `ratios.cached_over_uncached_stats`, the median of per-run ratios; target: ≥ 5.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use spillway_mount::connect::connect_namespace;
use spillway_mount::MountConfig;
use spillway_proto::Endpoint;
use spillway_types::EpochId;

use crate::mount::{mount_with, open_root};
use crate::stats::median;

/// The namespace of the stat phase (apart from the other phases').
const STAT_NAMESPACE: u64 = 40;

/// What the stat phase is asked to do.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct StatShape {
    /// Files stat'ed per pass.
    pub files: u32,
    /// Measured runs of each mount.
    pub repeat: u32,
    /// FUSE session threads per mount.
    pub threads: usize,
}

/// stat(2) calls per second of every measured run.
#[derive(Debug, serde::Serialize)]
pub struct StatResult {
    pub cached_stats_s_runs: Vec<f64>,
    pub uncached_stats_s_runs: Vec<f64>,
    pub cached_stats_s: f64,
    pub uncached_stats_s: f64,
    /// Median of the per-run cached/uncached ratios.
    pub cached_over_uncached_stats: f64,
}

/// One pass: stat every file in `dir` (`files` of them), in stat(2) calls per second.
fn stat_pass(dir: &Path, files: u32) -> anyhow::Result<f64> {
    let start = Instant::now();
    for i in 0..files {
        let path = dir.join(format!("f{i:06}"));
        let meta = std::fs::metadata(&path).with_context(|| format!("stat {}", path.display()))?;
        anyhow::ensure!(meta.is_file(), "{} is not a file", path.display());
    }
    Ok(f64::from(files) / start.elapsed().as_secs_f64())
}

/// Runs the phase on a fresh striped namespace of the first server.
pub fn measure(
    shape: &StatShape,
    work: &Path,
    endpoints: &[Endpoint],
) -> anyhow::Result<StatResult> {
    let root = open_root(EpochId(1_000_000 + STAT_NAMESPACE));
    let mount_of = |name: &str, attr_ttl: Duration| -> anyhow::Result<_> {
        let ns = connect_namespace(&endpoints[0], STAT_NAMESPACE, root, shape.threads, None)?;
        let config = MountConfig { threads: shape.threads, attr_ttl, ..MountConfig::default() };
        mount_with(&work.join(name), ns, endpoints, config)
    };
    let cached = mount_of("mnt-stat-cached", MountConfig::default().attr_ttl)?;
    let uncached = mount_of("mnt-stat-uncached", Duration::ZERO)?;
    let dir_of = |mount: &crate::mount::BenchMount| -> PathBuf { mount.path.join("stat") };
    std::fs::create_dir_all(dir_of(&cached))?;
    for i in 0..shape.files {
        let path = dir_of(&cached).join(format!("f{i:06}"));
        drop(
            std::fs::File::create_new(&path)
                .with_context(|| format!("creating {}", path.display()))?,
        );
    }
    stat_pass(&dir_of(&cached), shape.files)?;
    stat_pass(&dir_of(&uncached), shape.files)?;
    let (mut with_cache, mut without) = (Vec::new(), Vec::new());
    for _ in 0..shape.repeat {
        with_cache.push(stat_pass(&dir_of(&cached), shape.files)?);
        without.push(stat_pass(&dir_of(&uncached), shape.files)?);
    }
    let ratios: Vec<f64> = with_cache.iter().zip(&without).map(|(c, u)| c / u).collect();
    Ok(StatResult {
        cached_stats_s: median(with_cache.clone()),
        uncached_stats_s: median(without.clone()),
        cached_stats_s_runs: with_cache,
        uncached_stats_s_runs: without,
        cached_over_uncached_stats: median(ratios),
    })
}
