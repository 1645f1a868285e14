//! BIOS Algorithm 1: user-ID (or job-ID) based stream management on one device.
//!
//! A multi-streamed SSD exposes only a few stream ids (4–16). Each storage daemon keeps a table
//! key → stream id. A key seen for the first time takes an idle stream (one no key holds) if
//! there is one, otherwise the *least used* stream (the one held by the fewest keys; ties go to
//! the lowest id) and shares it. Every access refreshes the key's access time and bumps a
//! counter; when the counter exceeds `reclaim_check_every`, keys not accessed for
//! `idle_reclaim_after` are removed (their stream becomes reusable) and the counter restarts.
//!
//! Whether the key is a user or a job is the caller's choice ([`spillway_types::StreamKey`]
//! is opaque). The decision is computed by [`StreamTable::decide`] (pure, `&self`) and applied
//! by [`StreamTable::apply`]; [`StreamTable::access`] does both.

use spillway_types::StreamKey;

/// Limits of one device's stream table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamTableLimits {
    /// Streams the device supports (BIOS: 8 on a PM963).
    pub streams_max: u16,
    /// Accesses between two reclaim scans (Algorithm 1's `setting_value`).
    pub reclaim_check_every: u64,
    /// A key not accessed for this long (caller's time unit) is reclaimed at the next scan.
    pub idle_reclaim_after: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    key: StreamKey,
    stream: u16,
    accessed_at: u64,
}

/// The per-device table of Algorithm 1: registered (key, stream, access time) triples and the
/// access counter. Bounded: at most one entry per distinct key seen since its last reclaim, and
/// the caller bounds keys (users or jobs of the center).
#[derive(Clone, Debug)]
pub struct StreamTable {
    limits: StreamTableLimits,
    entries: Vec<Entry>,
    /// Algorithm 1's `threshold`: accesses since the last reclaim scan.
    accesses_since_check: u64,
}

/// What [`StreamTable::decide`] concluded for one access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamDecision {
    pub key: StreamKey,
    /// The stream the write must carry (`fadvise(fd, streamID)`).
    pub stream: u16,
    /// The key was not in the table and is registered by this access.
    pub registered: bool,
    /// The stream was idle (no key held it) when allocated; false when shared (least used).
    pub stream_was_idle: bool,
    /// This access triggers a reclaim scan; these keys are removed from the table.
    pub reclaimed: Option<Vec<StreamKey>>,
    pub now: u64,
}

impl StreamTable {
    pub fn new(limits: StreamTableLimits) -> StreamTable {
        assert!(limits.streams_max > 0, "a device has at least one stream");
        StreamTable { limits, entries: Vec::new(), accesses_since_check: 0 }
    }

    pub fn limits(&self) -> StreamTableLimits {
        self.limits
    }

    /// The stream `key` holds now, if registered.
    pub fn stream_of(&self, key: StreamKey) -> Option<u16> {
        self.entries.iter().find(|e| e.key == key).map(|e| e.stream)
    }

    /// Number of keys holding each stream (index = stream id).
    pub fn keys_per_stream(&self) -> Vec<u32> {
        let mut counts = vec![0u32; self.limits.streams_max as usize];
        for entry in &self.entries {
            counts[entry.stream as usize] += 1;
        }
        counts
    }

    pub fn registered_keys(&self) -> usize {
        self.entries.len()
    }

    /// Algorithm 1 for an access by `key` at `now`, without changing the table.
    pub fn decide(&self, key: StreamKey, now: u64) -> StreamDecision {
        let (stream, registered, stream_was_idle) = match self.stream_of(key) {
            Some(stream) => (stream, false, false),
            None => {
                let counts = self.keys_per_stream();
                // Lowest count wins, ties to the lowest id: an idle stream (count 0) when there is
                // one (lines 4–5), else the least used (line 7).
                let (stream, count) = counts
                    .iter()
                    .enumerate()
                    .min_by_key(|&(stream, &count)| (count, stream))
                    .map(|(stream, &count)| (stream as u16, count))
                    .expect("streams_max > 0");
                (stream, true, count == 0)
            }
        };
        let reclaimed = if self.accesses_since_check + 1 > self.limits.reclaim_check_every {
            // Lines 16–22: every key not accessed recently is reclaimed. The accessing key has
            // just been accessed, so it is never reclaimed by its own access.
            Some(
                self.entries
                    .iter()
                    .filter(|e| e.key != key)
                    .filter(|e| now.saturating_sub(e.accessed_at) > self.limits.idle_reclaim_after)
                    .map(|e| e.key)
                    .collect(),
            )
        } else {
            None
        };
        StreamDecision { key, stream, registered, stream_was_idle, reclaimed, now }
    }

    /// Applies a decision made by [`StreamTable::decide`] on this same table state.
    pub fn apply(&mut self, decision: &StreamDecision) {
        if decision.registered {
            assert!(self.stream_of(decision.key).is_none(), "key registered twice");
            assert!(decision.stream < self.limits.streams_max);
            self.entries.push(Entry {
                key: decision.key,
                stream: decision.stream,
                accessed_at: decision.now,
            });
        }
        let entry = self
            .entries
            .iter_mut()
            .find(|e| e.key == decision.key)
            .expect("decision applied to the table it was made on");
        assert_eq!(entry.stream, decision.stream, "decision applied to a different table");
        entry.accessed_at = decision.now;
        self.accesses_since_check += 1;
        if let Some(reclaimed) = &decision.reclaimed {
            self.entries.retain(|e| !reclaimed.contains(&e.key));
            self.accesses_since_check = 0;
        }
    }

    /// Decide and apply; returns the stream to use.
    pub fn access(&mut self, key: StreamKey, now: u64) -> u16 {
        let decision = self.decide(key, now);
        self.apply(&decision);
        decision.stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(streams_max: u16) -> StreamTable {
        StreamTable::new(StreamTableLimits {
            streams_max,
            reclaim_check_every: 1000,
            idle_reclaim_after: 100,
        })
    }

    #[test]
    fn new_keys_take_idle_streams_first() {
        let mut t = table(4);
        for user in 0..4 {
            let d = t.decide(StreamKey(user), 0);
            assert!(d.registered && d.stream_was_idle);
            assert_eq!(d.stream, user as u16);
            t.apply(&d);
        }
        assert_eq!(t.keys_per_stream(), vec![1, 1, 1, 1]);
    }

    #[test]
    fn when_streams_run_out_the_least_used_is_shared() {
        let mut t = table(3);
        for user in 0..3 {
            t.access(StreamKey(user), 0);
        }
        // All busy: 4th key shares stream 0 (all tied at 1, lowest id).
        let d = t.decide(StreamKey(10), 1);
        assert!(d.registered && !d.stream_was_idle);
        assert_eq!(d.stream, 0);
        t.apply(&d);
        // Now stream 0 has 2 keys; the next goes to stream 1 (least used).
        assert_eq!(t.access(StreamKey(11), 2), 1);
        assert_eq!(t.keys_per_stream(), vec![2, 2, 1]);
        // 32 keys on 8 streams: round robin, 4 per stream (BIOS 5.2).
        let mut t = table(8);
        for user in 0..32 {
            assert_eq!(t.access(StreamKey(user), 0), (user % 8) as u16);
        }
        assert_eq!(t.keys_per_stream(), vec![4; 8]);
    }

    #[test]
    fn registered_key_keeps_its_stream() {
        let mut t = table(2);
        let first = t.access(StreamKey(7), 0);
        t.access(StreamKey(8), 0);
        for now in 1..50 {
            let d = t.decide(StreamKey(7), now);
            assert!(!d.registered);
            assert_eq!(d.stream, first);
            t.apply(&d);
        }
    }

    #[test]
    fn idle_keys_are_reclaimed_at_the_periodic_check() {
        let mut t = StreamTable::new(StreamTableLimits {
            streams_max: 2,
            reclaim_check_every: 3,
            idle_reclaim_after: 10,
        });
        t.access(StreamKey(1), 0); // counter 1
        t.access(StreamKey(2), 0); // counter 2
        t.access(StreamKey(2), 50); // counter 3
                                    // 4th access exceeds the threshold: key 1 was last seen at 0, idle for 60 > 10.
        let d = t.decide(StreamKey(2), 60);
        assert_eq!(d.reclaimed, Some(vec![StreamKey(1)]));
        t.apply(&d);
        assert_eq!(t.stream_of(StreamKey(1)), None);
        assert_eq!(t.registered_keys(), 1);
        // Stream 0 is idle again and goes to the next new key.
        let d = t.decide(StreamKey(3), 61);
        assert!(d.stream_was_idle);
        assert_eq!(d.stream, 0);
        assert_eq!(d.reclaimed, None, "counter was reset by the scan");
    }

    #[test]
    fn recently_accessed_keys_survive_the_check() {
        let mut t = StreamTable::new(StreamTableLimits {
            streams_max: 4,
            reclaim_check_every: 0,
            idle_reclaim_after: 10,
        });
        t.access(StreamKey(1), 0);
        t.access(StreamKey(2), 5);
        let d = t.decide(StreamKey(3), 12);
        assert_eq!(d.reclaimed, Some(vec![StreamKey(1)]));
    }
}
