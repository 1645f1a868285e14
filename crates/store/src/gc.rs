//! Garbage collection: whole dead segments are deleted; when free space runs low a compactor
//! copies the live records out of cost-benefit victims (verbatim, same sequence numbers) and
//! deletes them. Host write amplification counts every copied byte.

use crate::format::*;
use crate::storage::SegmentFile;
use crate::store::*;
use spillway_types::{EpochId, SegmentId};
use std::collections::BTreeSet;
use std::sync::Arc;

impl Inner {
    /// Deletes segments with no live bytes; then, if `force` or free space is low, compacts
    /// cost-benefit victims.
    pub(crate) fn gc(&self, force: bool) -> Result<GcReport, String> {
        let _one_at_a_time = self.gc_lock.lock();
        let mut report = GcReport::default();
        self.delete_dead_segments(&mut report)?;
        for _ in 0..64 {
            let victim = {
                let state = self.state.lock();
                self.choose_victim(&state, force)
            };
            let Some(victim) = victim else { break };
            let copied = self.compact(victim)?;
            if copied == 0 {
                // Nothing could be copied (the file system is full): another round would
                // choose the same victim.
                break;
            }
            report.bytes_copied += copied;
            report.segments_compacted += 1;
            self.delete_dead_segments(&mut report)?;
        }
        Ok(report)
    }

    pub(crate) fn delete_dead_segments(&self, report: &mut GcReport) -> Result<(), String> {
        let is_dead = |state: &State, id: SegmentId, segment: &Segment| {
            segment.inflight == 0
                && (segment.sealed || segment.length > HEADER_BYTES as u64)
                && segment_live_bytes(id, segment, &state.epochs) == 0
        };
        let candidates: BTreeSet<SegmentId> = {
            let state = self.state.lock();
            state
                .segments
                .iter()
                .filter(|(&id, s)| is_dead(&state, id, s))
                .map(|(&id, _)| id)
                .collect()
        };
        if candidates.is_empty() {
            return Ok(());
        }
        // The tombstones and compaction copies that made these segments dead must be durable
        // before the old bytes go; segments that died after this sync wait for the next round.
        self.sync_dirty()?;
        let removed = {
            let mut state = self.state.lock();
            let dead: Vec<SegmentId> = candidates
                .into_iter()
                .filter(|id| state.segments.get(id).is_some_and(|s| is_dead(&state, *id, s)))
                .collect();
            let mut removed = Vec::new();
            for id in dead {
                let segment = state.segments.remove(&id).expect("dead segment vanished");
                if state.open_segments.get(&segment.stream) == Some(&id) {
                    state.open_segments.remove(&segment.stream);
                }
                state.ssd_used_bytes -= segment.length;
                for epoch in segment.epoch_bytes.keys() {
                    if let Some(entry) = state.epochs.get_mut(epoch) {
                        entry.segments.remove(&id);
                    }
                }
                state.counters.segments_deleted += 1;
                state.recent_synced.remove(&id);
                removed.push((id, segment.length));
            }
            removed
        };
        for &(id, length) in &removed {
            self.storage.remove(&segment_file_name(id)).map_err(|e| {
                let reason = format!("removing segment {id} in {}: {e}", self.storage.describe());
                self.fail(&mut self.state.lock(), reason.clone());
                reason
            })?;
            self.write_log.delete(id, length);
            report.segments_deleted += 1;
            report.bytes_freed += length;
        }
        if !removed.is_empty() {
            self.storage.sync_directory().map_err(|e| {
                let reason = format!("syncing directory {}: {e}", self.storage.describe());
                self.fail(&mut self.state.lock(), reason.clone());
                reason
            })?;
        }
        self.space.notify_all();
        Ok(())
    }

    /// Cost-benefit (Rosenblum & Ousterhout): maximise (1 - u) · age / (1 + u) over sealed
    /// segments with live share u ≤ `gc_live_percent_max`; only when free space is low.
    pub(crate) fn choose_victim(&self, state: &State, force: bool) -> Option<SegmentId> {
        let low = self.free_bytes(state) * 100
            < self.knobs.gc_free_percent_min * self.knobs.ssd_bytes_max;
        if !force && !low {
            return None;
        }
        let mut best: Option<(f64, SegmentId)> = None;
        for (&id, segment) in &state.segments {
            if !segment.sealed || segment.inflight > 0 {
                continue;
            }
            let live = segment_live_bytes(id, segment, &state.epochs);
            if live == 0 || live * 100 > self.knobs.gc_live_percent_max * segment.length {
                continue;
            }
            let utilisation = live as f64 / segment.length as f64;
            let age = (state.next_sequence - segment.last_write_sequence) as f64 + 1.0;
            let score = (1.0 - utilisation) * age / (1.0 + utilisation);
            if best.is_none() || best.is_some_and(|(s, _)| score > s) {
                best = Some((score, id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// Copies the live records of `victim` (verbatim, same sequence numbers) to its stream's
    /// open segment and repoints them. The victim is then dead and deleted by the caller.
    pub(crate) fn compact(&self, victim: SegmentId) -> Result<u64, String> {
        let image = self.read_segment_image(victim)?;
        let found = scan_segment_image(victim, &image)?;
        let copies = self.place_live_records(victim, found)?;
        let result = self.write_copies(&copies, &image);
        let copied = self.finish_copies(victim, &copies, result)?;
        // The victim is deleted once the copies are fsync'd; a write of another record still in
        // flight below a copy would leave a hole there at a crash, and recovery would cut the
        // copies off with it.
        let ends: Vec<(SegmentId, u64)> =
            copies.iter().map(|copy| (copy.target, copy.offset + copy.total)).collect();
        self.wait_until_written(&ends)?;
        Ok(copied)
    }

    /// Step 1 of `compact`: reads the whole victim segment.
    fn read_segment_image(&self, victim: SegmentId) -> Result<Vec<u8>, String> {
        let (file, length) = {
            let state = self.state.lock();
            let segment = &state.segments[&victim];
            (segment.file.clone(), segment.length)
        };
        let mut image = vec![0u8; length as usize];
        file.read_at(0, &mut image)
            .map_err(|e| format!("reading segment {victim} for compaction: {e}"))?;
        Ok(image)
    }

    /// Step 3 of `compact`: places a copy of each live record at the end of the victim's
    /// stream and moves its accounting there.
    fn place_live_records(
        &self,
        victim: SegmentId,
        found: Vec<FoundRecord>,
    ) -> Result<Vec<CompactionCopy>, String> {
        let mut copies = Vec::new();
        let mut state = self.state.lock();
        let stream = state.segments[&victim].stream;
        for FoundRecord { at, total, header } in found {
            if !is_live_in(&state, victim, at, total, &header) {
                continue;
            }
            let mut placed = self.place(&mut state, stream, total, header.sequence);
            if matches!(placed, Err(PlaceError::NoSpace(_))) && self.release_reserve(&mut state) {
                // Compaction is how a full disk gets space back: it may use the reserve.
                placed = self.place(&mut state, stream, total, header.sequence);
            }
            let (target, offset, target_file) = match placed {
                Ok(p) => p,
                // No room for a new segment: copy what was placed; the victim keeps the
                // rest and stays until a later round empties it.
                Err(PlaceError::NoSpace(_)) => break,
                Err(PlaceError::Io(reason)) => {
                    self.fail(&mut state, reason.clone());
                    return Err(reason);
                }
            };
            let epoch = header.epoch;
            let tombstone = header.kind == RecordKind::EpochState;
            move_bytes(&mut state, victim, target, epoch, total, tombstone);
            copies.push(CompactionCopy { target, offset, target_file, at, total, header });
        }
        Ok(copies)
    }

    /// Step 4 of `compact`: writes the placed copies out of the victim's image (stops at the
    /// first error, which it returns).
    fn write_copies(&self, copies: &[CompactionCopy], image: &[u8]) -> Result<(), String> {
        for CompactionCopy { target, offset, target_file, at, total, header } in copies {
            if let Err(error) = target_file.write_at(*offset, &image[*at..*at + *total as usize]) {
                return Err(format!(
                    "compaction write to segment {target} at offset {offset}: {error}"
                ));
            }
            self.write_log.write(header.stream, *target, *offset, *total);
        }
        Ok(())
    }

    /// Step 5 of `compact`: ends the copies' placements, repoints the data records still in the
    /// victim to their copies and counts the bytes copied (failing the store if a write failed).
    fn finish_copies(
        &self,
        victim: SegmentId,
        copies: &[CompactionCopy],
        result: Result<(), String>,
    ) -> Result<u64, String> {
        let mut state = self.state.lock();
        let mut copied = 0;
        for CompactionCopy { target, offset, at, total, header, .. } in copies {
            let segment = state.segments.get_mut(target).expect("compaction target vanished");
            segment.finish_placement(*offset);
            segment.dirty = true;
            if matches!(header.kind, RecordKind::Data | RecordKind::Zeros) {
                if let Some(info) = state.records.get_mut(&header.sequence) {
                    if info.location == (Location::Ssd { segment: victim, offset: *at as u64 }) {
                        info.location = Location::Ssd { segment: *target, offset: *offset };
                    }
                }
            }
            state.counters.compaction_bytes += total;
            state.counters.ssd_bytes_written += total;
            copied += total;
        }
        if let Err(reason) = &result {
            self.fail(&mut state, reason.clone());
        }
        result.map(|_| copied)
    }
}

/// One record found in a compaction victim's image.
struct FoundRecord {
    /// Offset in the victim.
    at: usize,
    /// Record bytes (header, payload, padding).
    total: u64,
    header: RecordHeader,
}

/// One live record copied by compaction: from offset `at` of the victim to `offset` of
/// segment `target`.
struct CompactionCopy {
    target: SegmentId,
    offset: u64,
    target_file: Arc<dyn SegmentFile>,
    at: usize,
    total: u64,
    header: RecordHeader,
}

/// Step 2 of `compact`: the records of the victim's image (its segment header left out); a
/// record that does not check is corruption.
fn scan_segment_image(victim: SegmentId, image: &[u8]) -> Result<Vec<FoundRecord>, String> {
    let mut found = Vec::new();
    let mut at = 0usize;
    while at < image.len() {
        let header = RecordHeader::decode(&image[at..])
            .and_then(|h| verify_payload(&h, &image[at..]).map(|_| h))
            .map_err(|detail| format!("segment {victim} is corrupt at offset {at}: {detail}"))?;
        let total = record_bytes(header.payload_bytes as u64) as usize;
        if header.kind != RecordKind::SegmentHeader {
            found.push(FoundRecord { at, total: total as u64, header });
        }
        at += total;
    }
    Ok(found)
}

/// Whether the record at `at` of `victim` (`total` bytes) is still live there: a data record
/// the index points at, a name or commit record of a live epoch, or a tombstone still needed.
fn is_live_in(
    state: &State,
    victim: SegmentId,
    at: usize,
    total: u64,
    header: &RecordHeader,
) -> bool {
    let epoch = header.epoch;
    match header.kind {
        RecordKind::Data | RecordKind::Zeros => {
            state.records.get(&header.sequence).map(|r| r.location)
                == Some(Location::Ssd { segment: victim, offset: at as u64 })
        }
        RecordKind::FileName
        | RecordKind::Commit
        | RecordKind::Grant
        | RecordKind::GrantRevoked
        | RecordKind::Participants => {
            state.epochs.get(&epoch).is_some_and(|e| phase_is_live(e.phase))
                && state.segments[&victim].epoch_bytes.get(&epoch).copied().unwrap_or(0) >= total
        }
        RecordKind::EpochState => {
            state.epochs.get(&epoch).is_some_and(|e| e.segments.iter().any(|&s| s != victim))
                && state.segments[&victim].tombstones.get(&epoch).copied().unwrap_or(0) >= total
        }
        RecordKind::SegmentHeader => false,
    }
}

/// Moves the accounting of `bytes` of `epoch` from segment `from` to segment `to`.
fn move_bytes(
    state: &mut State,
    from: SegmentId,
    to: SegmentId,
    epoch: EpochId,
    bytes: u64,
    tombstone: bool,
) {
    let source = state.segments.get_mut(&from).expect("compaction source missing");
    let map = if tombstone { &mut source.tombstones } else { &mut source.epoch_bytes };
    let left = map.get_mut(&epoch).expect("moved bytes not accounted");
    assert!(*left >= bytes, "segment {from} epoch {epoch} bytes underflow");
    *left -= bytes;
    let emptied = *left == 0;
    if emptied {
        map.remove(&epoch);
    }
    let target = state.segments.get_mut(&to).expect("compaction target missing");
    let map = if tombstone { &mut target.tombstones } else { &mut target.epoch_bytes };
    *map.entry(epoch).or_default() += bytes;
    if !tombstone {
        let entry = state.epochs.get_mut(&epoch).expect("epoch of moved bytes missing");
        entry.segments.insert(to);
        if emptied {
            entry.segments.remove(&from);
        }
    }
}
