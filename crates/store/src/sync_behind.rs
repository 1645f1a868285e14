//! Write-behind durability: a background thread fsyncs the SSD log whenever
//! `store.ssd_sync_behind_bytes` have been spilled or written through since the last fsync
//! round, so the bytes of a large `ssd` checkpoint become durable while it is still arriving
//! and its commit's fsync has at most about that much left to flush. A device that caches
//! writes (an SSD's volatile cache, a VM's host page cache) otherwise takes the whole
//! checkpoint's flush at the commit, after the last byte arrived. The rounds are ordinary
//! `sync_dirty` rounds, shared with commits and syncs; what they make durable is only ever
//! claimed by a commit record written after them, so the crash rules do not change.

use crate::store::*;
use std::sync::Arc;

impl Inner {
    /// Counts `bytes` appended to a segment (spill or write-through) and wakes the syncer once
    /// `ssd_sync_behind_bytes` are unsynced.
    pub(crate) fn note_unsynced(&self, state: &mut State, bytes: u64) {
        state.unsynced_bytes += bytes;
        let threshold = self.knobs.ssd_sync_behind_bytes;
        if threshold > 0 && state.unsynced_bytes >= threshold {
            self.syncer.notify_one();
        }
    }

    /// The background syncer: sleeps until `ssd_sync_behind_bytes` are unsynced, then runs an
    /// fsync round. A failed round has failed the store (as a commit's would); the syncer then
    /// sleeps until shutdown.
    pub(crate) fn syncer_loop(self: Arc<Self>) {
        let threshold = self.knobs.ssd_sync_behind_bytes;
        loop {
            {
                let mut state = self.state.lock();
                while !state.shutdown
                    && (state.failed.is_some() || state.unsynced_bytes < threshold)
                {
                    self.syncer.wait(&mut state);
                }
                if state.shutdown {
                    return;
                }
            }
            match self.sync_dirty() {
                Ok(_) => self.state.lock().counters.sync_behind_rounds += 1,
                Err(reason) => tracing::error!(%reason, "background fsync round failed"),
            }
        }
    }
}
