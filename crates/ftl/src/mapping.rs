//! Stream mappings: which device stream a file's data goes to.
//!
//! - `legacy`: one stream for everything (a conventional SSD).
//! - `user_id`: BIOS Algorithm 1 keyed by user, one table per SSD with the device's stream limit.
//! - `per_job`: Algorithm 1 keyed by job.
//! - `lifetime_aware`: keys ranked by the expected lifetime of the data they write now and cut
//!   into equal groups, one per stream ([`spillway_policy::lifetime_stream`]).
//!
//! The decisions come from `spillway-policy`, the same code the manager runs. A stream is chosen
//! when a file is opened on an SSD (BIOS: `fadvise` on the file descriptor), not per page.

use rand::{Rng, SeedableRng};
use spillway_policy::{lifetime_stream, LifetimeEstimate, StreamTable, StreamTableLimits};
use spillway_types::StreamKey;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mapping {
    Legacy,
    UserId,
    PerJob,
    LifetimeAware,
}

impl Mapping {
    pub const ALL: [Mapping; 4] =
        [Mapping::Legacy, Mapping::UserId, Mapping::PerJob, Mapping::LifetimeAware];

    pub fn name(self) -> &'static str {
        match self {
            Mapping::Legacy => "legacy",
            Mapping::UserId => "user_id",
            Mapping::PerJob => "per_job",
            Mapping::LifetimeAware => "lifetime_aware",
        }
    }

    pub fn parse(text: &str) -> Option<Mapping> {
        Mapping::ALL.into_iter().find(|m| m.name() == text || m.name().replace('_', "-") == text)
    }
}

/// What the lifetime-aware mapping knows about one key.
#[derive(Clone, Debug, Default)]
struct KeyLifetime {
    /// Capacity of the key's reservation, when it has one.
    quota_bytes: Option<u64>,
    bytes_written: u64,
    first_write: Option<u64>,
    /// EWMA of the observed lifetimes of the key's deleted files.
    observed_lifetime: Option<f64>,
}

/// Weight of the newest observation in the lifetime EWMA.
const LIFETIME_EWMA_WEIGHT: f64 = 0.25;

/// Online expected-lifetime estimates per key, in the caller's time unit.
///
/// Estimate = EWMA of observed lifetimes once the key has deleted data; before that, from the
/// reservation: quota ÷ the key's observed write rate (time to cycle through its quota); before
/// any rate is known, the quota itself (all keys start together, so the ranking is by quota).
#[derive(Clone, Debug, Default)]
pub struct LifetimeEstimator {
    keys: Vec<(StreamKey, KeyLifetime)>,
}

impl LifetimeEstimator {
    fn entry(&mut self, key: StreamKey) -> &mut KeyLifetime {
        if let Some(i) = self.keys.iter().position(|(k, _)| *k == key) {
            return &mut self.keys[i].1;
        }
        self.keys.push((key, KeyLifetime::default()));
        &mut self.keys.last_mut().unwrap().1
    }

    pub fn set_quota(&mut self, key: StreamKey, quota_bytes: u64) {
        self.entry(key).quota_bytes = Some(quota_bytes);
    }

    pub fn wrote(&mut self, key: StreamKey, bytes: u64, now: u64) {
        let e = self.entry(key);
        e.first_write.get_or_insert(now);
        e.bytes_written += bytes;
    }

    pub fn deleted(&mut self, key: StreamKey, lifetime: u64) {
        let e = self.entry(key);
        let sample = lifetime as f64;
        e.observed_lifetime = Some(match e.observed_lifetime {
            None => sample,
            Some(old) => old + LIFETIME_EWMA_WEIGHT * (sample - old),
        });
    }

    /// Current estimates of all known keys.
    pub fn estimates(&self, now: u64) -> Vec<LifetimeEstimate> {
        let rates_known = self
            .keys
            .iter()
            .all(|(_, e)| e.first_write.is_some_and(|t| now > t) && e.bytes_written > 0);
        let mut estimates = self
            .keys
            .iter()
            .map(|(key, e)| {
                let expected_lifetime = match (e.observed_lifetime, e.quota_bytes) {
                    (Some(observed), _) => observed,
                    (None, Some(quota)) if rates_known => {
                        let rate = e.bytes_written as f64 / (now - e.first_write.unwrap()) as f64;
                        quota as f64 / rate
                    }
                    (None, Some(quota)) => quota as f64,
                    // No reservation and nothing deleted yet: assume the mean of the others.
                    (None, None) => f64::NAN,
                };
                LifetimeEstimate { key: *key, expected_lifetime }
            })
            .collect::<Vec<_>>();
        fill_unknown(&mut estimates);
        estimates
    }

    /// Registers `key` (no-op when known).
    pub fn touch(&mut self, key: StreamKey) {
        self.entry(key);
    }
}

/// Keys without any estimate get the mean of the known ones (1.0 if none is known).
fn fill_unknown(estimates: &mut [LifetimeEstimate]) {
    let known: Vec<f64> =
        estimates.iter().map(|e| e.expected_lifetime).filter(|l| l.is_finite()).collect();
    let mean = if known.is_empty() { 1.0 } else { known.iter().sum::<f64>() / known.len() as f64 };
    for e in estimates.iter_mut() {
        if !e.expected_lifetime.is_finite() {
            e.expected_lifetime = mean;
        }
    }
}

/// Per-SSD mapping state.
pub struct StreamMapper {
    mapping: Mapping,
    streams: u16,
    tables: Vec<StreamTable>,
    pub lifetimes: LifetimeEstimator,
    /// σ of a log-normal error applied afresh to every lifetime estimate at every decision
    /// (0 = exact estimates); models imperfect knowledge of deletion times.
    estimate_noise_sigma: f64,
    rng: rand_chacha::ChaCha8Rng,
}

impl StreamMapper {
    pub fn new(mapping: Mapping, ssd_count: usize, streams: u16) -> StreamMapper {
        let limits = StreamTableLimits {
            streams_max: streams,
            // Keys in these workloads are active until the end; reclaim is exercised by the
            // policy's own tests. A scan every 4096 opens, reclaiming keys idle for 2^62 units.
            reclaim_check_every: 4096,
            idle_reclaim_after: 1 << 62,
        };
        StreamMapper {
            mapping,
            streams,
            tables: (0..ssd_count).map(|_| StreamTable::new(limits)).collect(),
            lifetimes: LifetimeEstimator::default(),
            estimate_noise_sigma: 0.0,
            rng: rand_chacha::ChaCha8Rng::seed_from_u64(0),
        }
    }

    /// Makes lifetime estimates noisy: each is multiplied by exp(σ·N(0,1)) at every decision.
    pub fn set_estimate_noise(&mut self, sigma: f64, seed: u64) {
        assert!(sigma >= 0.0 && sigma.is_finite(), "noise sigma {sigma} must be finite and ≥ 0");
        self.estimate_noise_sigma = sigma;
        self.rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    }

    /// A standard normal draw (Box–Muller).
    fn gaussian(&mut self) -> f64 {
        let u1: f64 = self.rng.gen_range(f64::MIN_POSITIVE..1.0);
        let u2: f64 = self.rng.gen_range(0.0..1.0);
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    pub fn mapping(&self) -> Mapping {
        self.mapping
    }

    /// The stream for a file of `user` (running as `job`) opened on `ssd` at `now`.
    pub fn open(&mut self, ssd: usize, user: StreamKey, job: StreamKey, now: u64) -> u16 {
        let stream = match self.mapping {
            Mapping::Legacy => 0,
            Mapping::UserId => self.tables[ssd].access(user, now),
            Mapping::PerJob => self.tables[ssd].access(job, now),
            Mapping::LifetimeAware => {
                self.lifetimes.touch(user);
                let mut estimates = self.lifetimes.estimates(now);
                if self.estimate_noise_sigma > 0.0 {
                    for e in &mut estimates {
                        e.expected_lifetime *= (self.estimate_noise_sigma * self.gaussian()).exp();
                    }
                }
                lifetime_stream(&estimates, user, self.streams)
            }
        };
        assert!(stream < self.streams);
        stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_follow_quota_then_rate_then_observation() {
        let mut estimator = LifetimeEstimator::default();
        estimator.set_quota(StreamKey(1), 100);
        estimator.set_quota(StreamKey(2), 400);
        // Before any write: the quota ranks the keys.
        let e = estimator.estimates(0);
        assert!(e[0].expected_lifetime < e[1].expected_lifetime);
        // Key 2 writes 8× faster: quota ÷ rate makes it the shorter-lived one.
        estimator.wrote(StreamKey(1), 10, 0);
        estimator.wrote(StreamKey(2), 80, 0);
        let e = estimator.estimates(10);
        assert_eq!(e[0].expected_lifetime, 100.0); // 100 B ÷ (10 B / 10 ns)
        assert_eq!(e[1].expected_lifetime, 50.0);
        // An observed deletion age wins over the reservation; the EWMA moves a quarter of the way.
        estimator.deleted(StreamKey(1), 7);
        estimator.deleted(StreamKey(1), 11);
        assert_eq!(estimator.estimates(10)[0].expected_lifetime, 8.0);
    }

    #[test]
    fn unknown_keys_get_the_mean_and_mappings_stay_in_range() {
        let mut mapper = StreamMapper::new(Mapping::LifetimeAware, 2, 4);
        mapper.lifetimes.deleted(StreamKey(1), 10);
        mapper.lifetimes.deleted(StreamKey(2), 30);
        let e = {
            mapper.lifetimes.touch(StreamKey(3));
            mapper.lifetimes.estimates(5)
        };
        assert_eq!(e[2].expected_lifetime, 20.0);
        for key in 0..20u64 {
            assert!(mapper.open((key % 2) as usize, StreamKey(key), StreamKey(key), 1) < 4);
        }
        let mut legacy = StreamMapper::new(Mapping::Legacy, 1, 4);
        assert_eq!(legacy.open(0, StreamKey(9), StreamKey(9), 0), 0);
        let mut per_job = StreamMapper::new(Mapping::PerJob, 1, 4);
        let streams: Vec<u16> =
            (0..4).map(|j| per_job.open(0, StreamKey(1), StreamKey(j), 0)).collect();
        assert_eq!(streams, vec![0, 1, 2, 3], "per-job keys by job, not user");
    }
}
