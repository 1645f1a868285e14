//! Durability: fsync of dirty segments and the leader/follower group commit.
//!
//! A commit round spills the epochs' DRAM records, fsyncs every dirty segment (a few at a time,
//! in parallel), appends one commit record per epoch (with the segments' sync points) and fsyncs
//! those. Concurrent committers queue their epochs; whoever finds no leader runs the next round
//! for everything queued, the others wait for the round that covers theirs.

use crate::error::*;
use crate::format::*;
use crate::store::*;
use spillway_types::{EpochId, FileId, SegmentId};
use std::collections::BTreeSet;
use std::time::Duration;

impl Inner {
    /// fsyncs every dirty segment (and the directory if files came or went): when it returns,
    /// everything written before the call is durable. Rounds are shared: callers queue on
    /// `sync_lock`, and one whose call came before a round took its snapshot returns when that
    /// round ends, without a round of its own (group fsync across connections and files).
    pub(crate) fn sync_dirty(&self) -> Result<u64, String> {
        let ticket = {
            let mut state = self.state.lock();
            state.sync_calls += 1;
            state.sync_calls
        };
        let _one_at_a_time = self.sync_lock.lock();
        let (targets, directory, round) = {
            let mut state = self.state.lock();
            Self::failed(&state)?;
            if state.sync_calls_covered >= ticket {
                state.counters.fsyncs_shared += 1;
                return Ok(0);
            }
            // Every call counted so far wrote (and marked dirty) before this snapshot.
            let round = state.sync_calls;
            state.unsynced_bytes = 0;
            let mut targets = Vec::new();
            for (&id, segment) in state.segments.iter_mut() {
                if segment.dirty {
                    segment.dirty = false;
                    let length = segment.written_frontier();
                    targets.push((id, segment.file.clone(), length));
                }
            }
            (targets, std::mem::take(&mut state.directory_dirty), round)
        };
        let result = self.fsync_round(&targets, directory);
        if result.is_ok() && self.knobs.ssd_drop_behind {
            // Every page below `length` is clean now: what drop-behind skipped can go.
            for (_, file, length) in &targets {
                let _ = file.drop_cached(0, *length);
            }
        }
        let mut state = self.state.lock();
        if let Err(reason) = result {
            self.fail(&mut state, reason.clone());
            return Err(reason);
        }
        for (id, _, length) in &targets {
            if let Some(segment) = state.segments.get_mut(id) {
                segment.synced_length = segment.synced_length.max(*length);
                state.recent_synced.insert(*id);
            }
        }
        state.counters.fsyncs += targets.len() as u64;
        debug_assert!(state.sync_calls_covered < round, "sync rounds went backwards");
        state.sync_calls_covered = round;
        drop(state);
        self.write_log.flush();
        Ok(targets.len() as u64)
    }

    /// The I/O of one `sync_dirty` round: the directory (if files came or went), then the
    /// segments.
    fn fsync_round(
        &self,
        targets: &[(SegmentId, std::sync::Arc<dyn crate::storage::SegmentFile>, u64)],
        directory: bool,
    ) -> Result<(), String> {
        if directory {
            self.storage
                .sync_directory()
                .map_err(|e| format!("syncing directory {}: {e}", self.storage.describe()))?;
        }
        // fsync the segments concurrently (a few at a time) so the device sees them together.
        const PARALLEL_SYNCS_MAX: usize = 4;
        for group in targets.chunks(PARALLEL_SYNCS_MAX) {
            let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
                let handles: Vec<_> = group
                    .iter()
                    .skip(1)
                    .map(|(id, file, _)| {
                        scope.spawn(move || {
                            file.sync().map_err(|e| {
                                format!("fsync of segment {id} in {}: {e}", self.storage.describe())
                            })
                        })
                    })
                    .collect();
                let (id, file, _) = &group[0];
                let mut results = vec![file.sync().map_err(|e| {
                    format!("fsync of segment {id} in {}: {e}", self.storage.describe())
                })];
                results
                    .extend(handles.into_iter().map(|h| h.join().expect("fsync thread panicked")));
                results
            });
            results.into_iter().collect::<Result<Vec<()>, String>>()?;
        }
        Ok(())
    }

    /// Leader/follower group commit: the first committer to find no leader runs a round for
    /// every epoch queued so far; the others wait for the round that covers theirs.
    pub(crate) fn group_commit(&self, epochs: BTreeSet<EpochId>) -> Result<(), CommitError> {
        let mut state = self.state.lock();
        state.commit_queue.extend(epochs.iter().copied());
        loop {
            if let Some(reason) = &state.failed {
                return Err(CommitError::Failed(reason.clone()));
            }
            let done = epochs.iter().all(|e| {
                state.epochs.get(e).is_some_and(|x| {
                    matches!(
                        x.phase,
                        EpochPhase::Committed | EpochPhase::Drained | EpochPhase::Deleted
                    )
                })
            });
            if done {
                return Ok(());
            }
            if !state.commit_leader {
                state.commit_leader = true;
                let mut batch = std::mem::take(&mut state.commit_queue);
                // Ours too: a round that ran out of space took them from the queue undone.
                batch.extend(epochs.iter().copied());
                drop(state);
                let result = self.commit_round(&batch);
                state = self.state.lock();
                state.commit_leader = false;
                self.commit.notify_all();
                if let Err(reason) = result {
                    if state.failed.is_none() {
                        // Out of space (never a reason to fail the store): nothing of the round
                        // is committed; its epochs stay sealed and may be committed again or
                        // deleted. Memory-level ones stay pending for the flusher.
                        for epoch in &batch {
                            if let Some(entry) = state.epochs.get_mut(epoch) {
                                match entry.phase {
                                    EpochPhase::Committing => entry.commit_stalled = true,
                                    EpochPhase::CommittedInMemory => {
                                        state.durable_pending.insert(*epoch);
                                    }
                                    _ => {}
                                }
                            }
                        }
                        return Err(CommitError::NoSpace(reason));
                    }
                    self.fail(&mut state, reason);
                }
                continue;
            }
            self.commit.wait(&mut state);
        }
    }

    /// One group-commit round: spill the epochs, fsync data, append commit records, fsync them.
    pub(crate) fn commit_round(&self, batch: &BTreeSet<EpochId>) -> Result<(), String> {
        if batch.is_empty() {
            return Ok(());
        }
        self.spill_batch(batch)?;
        self.wait_until_batch_written(batch)?;
        self.sync_dirty()?;
        self.append_commit_records(batch)?;
        self.sync_dirty()?;
        self.mark_batch_committed(batch);
        Ok(())
    }

    /// Step 1 of `commit_round`: spills the batch's DRAM records until none is pending.
    fn spill_batch(&self, batch: &BTreeSet<EpochId>) -> Result<(), String> {
        loop {
            let moved = self.spill(SpillScope::Epochs(batch), u64::MAX)?;
            let mut state = self.state.lock();
            Self::failed(&state)?;
            let pending: u64 =
                batch.iter().filter_map(|e| state.epochs.get(e)).map(|e| e.dram_pending).sum();
            if pending == 0 {
                return Ok(());
            }
            if moved == 0 {
                // Another thread (the flusher) is spilling some of them; wait for it.
                self.space.wait_for(&mut state, Duration::from_millis(20));
            }
        }
    }

    /// Step 2 of `commit_round`: waits until the batch's segments are written up to where they
    /// are placed now.
    fn wait_until_batch_written(&self, batch: &BTreeSet<EpochId>) -> Result<(), String> {
        // Every record of the batch is placed; some may still be written by a concurrent
        // spill, and records of other epochs written through below them may be in flight.
        let targets: Vec<(SegmentId, u64)> = {
            let state = self.state.lock();
            batch
                .iter()
                .filter_map(|e| state.epochs.get(e))
                .flat_map(|e| e.segments.iter().copied())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .filter_map(|id| state.segments.get(&id).map(|s| (id, s.length)))
                .collect()
        };
        self.wait_until_written(&targets)
    }

    /// Waits until each `(segment, end)` is written up to `end`: no placement below it is still
    /// in flight. Then the fsync that follows covers those bytes with no hole beneath them; a
    /// hole would make recovery cut everything above it off as a torn tail (committed records
    /// of a commit, or the copies of a compaction whose victim is already gone).
    pub(crate) fn wait_until_written(&self, targets: &[(SegmentId, u64)]) -> Result<(), String> {
        let mut state = self.state.lock();
        loop {
            Self::failed(&state)?;
            let behind = targets.iter().any(|(id, end)| {
                state.segments.get(id).is_some_and(|s| s.written_frontier() < *end)
            });
            if !behind {
                return Ok(());
            }
            self.space.wait_for(&mut state, Duration::from_millis(5));
        }
    }

    /// Step 3 of `commit_round` (after the data fsync): appends one commit record per epoch
    /// still committing, carrying its record counts and the segments' sync points.
    fn append_commit_records(&self, batch: &BTreeSet<EpochId>) -> Result<(), String> {
        let mut state = self.state.lock();
        let recent = std::mem::take(&mut state.recent_synced);
        for &epoch in batch {
            let Some(entry) = state.epochs.get(&epoch) else { continue };
            if !matches!(entry.phase, EpochPhase::Committing | EpochPhase::CommittedInMemory) {
                continue;
            }
            let mut synced: BTreeSet<SegmentId> = entry.segments.clone();
            synced.extend(recent.iter().copied());
            let payload = CommitPayload {
                data_records: entry.data_records,
                payload_bytes: entry.payload_bytes,
                synced: synced
                    .into_iter()
                    .filter_map(|id| state.segments.get(&id).map(|s| (id, s.synced_length)))
                    .collect(),
            };
            let header = RecordHeader {
                kind: RecordKind::Commit,
                sequence: 0,
                stream: META_STREAM,
                epoch,
                file: FileId(0),
                offset: 0,
                payload_bytes: 0,
            };
            let bytes = payload.encode();
            let header = RecordHeader { payload_bytes: bytes.len() as u32, ..header };
            self.append_meta(&mut state, header, &bytes).map_err(|(segment, error)| {
                format!(
                    "appending the commit record of epoch {epoch} to segment {segment}: {error}"
                )
            })?;
        }
        Ok(())
    }

    /// Step 4 of `commit_round` (after the commit records' fsync): the batch's epochs are
    /// committed and no longer pending durability.
    fn mark_batch_committed(&self, batch: &BTreeSet<EpochId>) {
        let mut state = self.state.lock();
        for &epoch in batch {
            if let Some(entry) = state.epochs.get_mut(&epoch) {
                if matches!(entry.phase, EpochPhase::Committing | EpochPhase::CommittedInMemory) {
                    entry.phase = EpochPhase::Committed;
                    entry.recovered_uncommitted = false;
                    state.counters.commits += 1;
                }
            }
            state.durable_pending.remove(&epoch);
        }
        state.counters.commit_rounds += 1;
    }
}
