//! Time for the namespace, behind a trait so tests inject it.
//!
//! Every timestamp the namespace writes (atime/mtime/ctime, `TimeSet::Now`) comes from one
//! [`Clock`]; the server uses [`SystemClock`], tests a [`ManualClock`] they advance by hand, so
//! a model test can compare times exactly.

use std::sync::atomic::{AtomicI64, Ordering};

use spillway_namespace::Timestamp;

/// A source of the current time.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// The real wall clock (CLOCK_REALTIME).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Timestamp::new(since.as_secs() as i64, since.subsec_nanos())
    }
}

/// A clock that only moves when told: `now` returns the set time, then advances it by `step_ns`
/// so successive operations get distinct, increasing times.
#[derive(Debug)]
pub struct ManualClock {
    nanos: AtomicI64,
    step_ns: i64,
}

impl ManualClock {
    /// Starts at `start_ns` nanoseconds since the epoch, advancing `step_ns` per reading.
    pub fn new(start_ns: i64, step_ns: i64) -> ManualClock {
        assert!(start_ns >= 0 && step_ns >= 0);
        ManualClock { nanos: AtomicI64::new(start_ns), step_ns }
    }

    /// Moves the clock forward by `ns`.
    pub fn advance(&self, ns: i64) {
        assert!(ns >= 0);
        self.nanos.fetch_add(ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        let ns = self.nanos.fetch_add(self.step_ns, Ordering::SeqCst);
        Timestamp::new(ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_steps_and_advances() {
        let clock = ManualClock::new(1_999_999_999, 1);
        assert_eq!(clock.now(), Timestamp::new(1, 999_999_999));
        assert_eq!(clock.now(), Timestamp::new(2, 0));
        clock.advance(5_000_000_000);
        assert_eq!(clock.now(), Timestamp::new(7, 1));
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now().seconds > 1_577_836_800);
    }
}
