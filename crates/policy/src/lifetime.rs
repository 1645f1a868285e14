//! Lifetime-aware stream grouping, the improvement BIOS 7.2 proposes and never built.
//!
//! User-ID mapping puts whatever users Algorithm 1 happens to pair onto one stream; when their
//! data lives for different times, a block of that stream holds a mix of short- and long-lived
//! pages and GC has to copy the long-lived ones. Here the caller supplies, for every key active on
//! the device, an *expected lifetime* of the data it writes now (from the reservation: time until
//! the job ends, or quota ÷ observed write rate, or observed lifetimes of the key's deleted data).
//! Keys are ranked by that estimate and cut into `streams` groups of equal key count (quantile
//! grouping), so keys with neighbouring lifetimes share a stream. Data written at the same moment
//! with the same expected lifetime dies together, which is what a flash block wants.

use spillway_types::StreamKey;

/// One active key and the expected lifetime of the data it writes now (any time unit, same for
/// all keys of one call).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LifetimeEstimate {
    pub key: StreamKey,
    pub expected_lifetime: f64,
}

/// The stream for `key` among `active` keys (which must contain it) on a device with `streams`
/// streams. Ties in lifetime are broken by key so the answer is deterministic.
pub fn lifetime_stream(active: &[LifetimeEstimate], key: StreamKey, streams: u16) -> u16 {
    assert!(streams > 0);
    let own = active
        .iter()
        .find(|e| e.key == key)
        .expect("the key asking for a stream is among the active keys");
    assert!(own.expected_lifetime.is_finite(), "lifetime estimate of {key} is not finite");
    let rank = active
        .iter()
        .filter(|e| (e.expected_lifetime, e.key) < (own.expected_lifetime, own.key))
        .count();
    ((rank * streams as usize) / active.len()) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn est(key: u64, lifetime: f64) -> LifetimeEstimate {
        LifetimeEstimate { key: StreamKey(key), expected_lifetime: lifetime }
    }

    #[test]
    fn similar_lifetimes_share_a_stream() {
        // 32 keys, 4 lifetime classes interleaved by key (BIOS configuration 3 order): the
        // grouping puts each class on its own 2 streams.
        let active: Vec<_> =
            (0..32).map(|k| est(k, [10.0, 20.0, 40.0, 80.0][(k / 8) as usize])).collect();
        for e in &active {
            let stream = lifetime_stream(&active, e.key, 8);
            let class = e.key.0 / 8;
            assert!(stream / 2 == class as u16, "key {} class {class} got stream {stream}", e.key);
        }
    }

    #[test]
    fn fewer_keys_than_streams_spread_out() {
        let active = [est(5, 3.0), est(1, 1.0), est(9, 2.0)];
        assert_eq!(lifetime_stream(&active, StreamKey(1), 8), 0);
        assert_eq!(lifetime_stream(&active, StreamKey(9), 8), 2);
        assert_eq!(lifetime_stream(&active, StreamKey(5), 8), 5);
    }

    #[test]
    fn ties_break_by_key() {
        let active = [est(2, 1.0), est(1, 1.0)];
        assert_eq!(lifetime_stream(&active, StreamKey(1), 2), 0);
        assert_eq!(lifetime_stream(&active, StreamKey(2), 2), 1);
    }
}
