//! The flusher: makes memory-level commits durable, keeps the DRAM ring between its watermarks
//! by appending the oldest records to SSD, and runs GC when segments died or space is low. By
//! default one background thread per store that sleeps `flusher_interval_ms` when nobody
//! signals it; with `FlusherMode::Manual` there is no thread and a round runs only when the
//! caller asks (`Store::step_flusher`, or a writer that finds the ring full), so a seeded test
//! replays exactly.

use crate::error::CommitError;
use crate::store::*;
use std::sync::Arc;
use std::time::Duration;

/// Who runs the flusher's rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlusherMode {
    /// A background thread (production).
    #[default]
    Background,
    /// Nobody but the caller: `Store::step_flusher` runs one round in the caller's thread, and
    /// a writer that finds the DRAM ring full runs one itself instead of waiting. For tests
    /// that must replay a seed exactly.
    Manual,
}

/// What a flusher round found.
pub(crate) enum Round {
    /// The store is shutting down.
    Shutdown,
    /// Done; `no_space`: a spill or commit ran out of space (back off before the next).
    Done { no_space: bool },
}

impl Inner {
    /// The background flusher: waits for work (or `flusher_interval_ms`), then runs a round.
    pub(crate) fn flusher_loop(self: Arc<Self>) {
        let interval = Duration::from_millis(self.knobs.flusher_interval_ms);
        loop {
            {
                let mut state = self.state.lock();
                if state.shutdown {
                    return;
                }
                if state.durable_pending.is_empty()
                    && state.ring.used() <= self.high_watermark_bytes(&state)
                    && !state.gc_wanted
                    && !state.write_through_seen
                    && !self.write_behind_due(&state)
                {
                    self.flusher.wait_for(&mut state, interval);
                }
                if state.failed.is_some() {
                    self.flusher.wait_for(&mut state, interval);
                    continue;
                }
            }
            match self.flusher_round() {
                Round::Shutdown => return,
                Round::Done { no_space: true } => {
                    // The file system is full: retry at the flusher's pace, not in a busy loop.
                    let mut state = self.state.lock();
                    if !state.shutdown {
                        self.flusher.wait_for(&mut state, interval);
                    }
                }
                Round::Done { no_space: false } => {}
            }
        }
    }

    /// One round: memory-level commits made durable, DRAM above the high watermark (or above
    /// the low one after write-throughs) spilled to the low one, otherwise whole batches of new
    /// records spilled behind the ingest (`ssd_write_behind`), dead segments deleted,
    /// compaction when space is low, the reserve file re-taken when space is back.
    pub(crate) fn flusher_round(&self) -> Round {
        let (pending, over, behind, gc_wanted) = {
            let mut state = self.state.lock();
            if state.shutdown {
                return Round::Shutdown;
            }
            if state.failed.is_some() {
                return Round::Done { no_space: false };
            }
            let high = self.high_watermark_bytes(&state);
            let pending = std::mem::take(&mut state.durable_pending);
            let low = state.ring.capacity() / 100 * self.knobs.dram_low_watermark_percent;
            let pressure = std::mem::take(&mut state.write_through_seen);
            let over = state.ring.used() > high || (pressure && state.ring.used() > low);
            let behind = self.write_behind_due(&state);
            let low_space = self.free_bytes(&state) * 100
                < self.knobs.gc_free_percent_min * self.knobs.ssd_bytes_max;
            (pending, over, behind, std::mem::take(&mut state.gc_wanted) || low_space)
        };
        let mut no_space = false;
        if !pending.is_empty() {
            // Out of space, the epochs go back to `durable_pending` (see `group_commit`).
            no_space |= matches!(self.group_commit(pending), Err(CommitError::NoSpace(_)));
        }
        let spilled = if over {
            self.spill_to_low_watermark()
        } else if behind {
            self.spill_behind()
        } else {
            Some(false)
        };
        match spilled {
            None => return Round::Shutdown,
            Some(full) => no_space |= full,
        }
        if gc_wanted || no_space {
            if let Err(reason) = self.gc(false) {
                tracing::error!(%reason, "GC failed");
            }
        }
        self.restore_reserve();
        Round::Done { no_space }
    }

    /// Write-behind: spills the oldest Ready records, a batch at a time, while a whole batch is
    /// waiting (the rest waits for the next batch or a commit). Returns as
    /// `spill_to_low_watermark` does.
    fn spill_behind(&self) -> Option<bool> {
        loop {
            {
                let state = self.state.lock();
                if state.shutdown {
                    return None;
                }
                if !self.write_behind_due(&state) {
                    return Some(false);
                }
            }
            match self.spill(SpillScope::Oldest, self.knobs.flusher_batch_bytes) {
                Ok(0) => return Some(false),
                Ok(_) => {}
                Err(_) => return Some(true),
            }
        }
    }

    /// Spills the oldest DRAM records until the ring is at its low watermark. `None`: the store
    /// is shutting down; `Some(true)`: a spill failed (the file system is full, or the store
    /// failed).
    fn spill_to_low_watermark(&self) -> Option<bool> {
        loop {
            let low = {
                let mut state = self.state.lock();
                if state.shutdown {
                    return None;
                }
                // Clean cached copies at the front go first: they cost no write.
                let used = state.ring.used();
                advance_tail(&mut state);
                if state.ring.used() < used {
                    self.space.notify_all();
                }
                state.ring.used()
                    <= state.ring.capacity() / 100 * self.knobs.dram_low_watermark_percent
            };
            if low {
                return Some(false);
            }
            match self.spill(SpillScope::Oldest, self.knobs.flusher_batch_bytes) {
                Ok(0) => {
                    if self.flusher_mode == FlusherMode::Background {
                        // Only records still being written are left; let writers finish.
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    return Some(false);
                }
                Ok(_) => {}
                Err(_) => return Some(true),
            }
        }
    }
}
