//! Writes whose payload lands in the DRAM ring without passing through a caller's buffer.
//!
//! A server reading a write off a socket would otherwise read it into a buffer and have
//! [`Store::write`] copy it into the ring: one memcpy per byte, the largest cost of ingest after
//! the socket itself. [`Store::try_reserve_write`] instead hands out the ring ranges the write's
//! records will occupy; the caller reads the payload into them and publishes the slot, which
//! makes the write visible exactly as `write` would have.
//!
//! A slot is not a write until it is published: it does not hold its epoch open, so a commit,
//! sync or delete that runs meanwhile neither waits for it nor includes it, and publishing
//! into an epoch that is no longer open fails as a late write would. Dropping an unpublished
//! slot abandons it (its ring space turns dead, its capacity returns). An unpublished slot does
//! pin the ring's tail, so callers keep it briefly (the server bounds how long a client may
//! stall mid-payload) and reservations never wait: when the ring is above its high watermark
//! the caller gets no slot and uses `write`, which takes the write-through path.

use std::sync::Arc;

use spillway_types::{EpochId, FileId, StreamKey};

use crate::error::{EpochPhase, WriteError};
use crate::format::{record_bytes, HEADER_BYTES};
use crate::store::*;

/// Ring space for one write, filled by its owner and then published (see the module docs).
pub struct WriteSlot {
    inner: Arc<Inner>,
    stream: StreamKey,
    epoch: EpochId,
    file: FileId,
    /// One ring record per piece of at most `record_payload_bytes_max`, in the order the
    /// caller fills and publishes them (offset order within each extent):
    /// (position, payload bytes, file offset).
    records: Vec<(u64, usize, u64)>,
    published: bool,
}

impl Store {
    /// Reserves ring space for a write of `length` bytes at `offset` of (`epoch`, `file`) in
    /// `stream`, after the same admission as [`Store::write`] (open epoch, capacity, quota).
    /// `Ok(None)` when DRAM is above its high watermark or the ring lacks room right now: the
    /// caller should fall back to `write`. Never waits for space.
    pub fn try_reserve_write(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        length: usize,
    ) -> Result<Option<WriteSlot>, WriteError> {
        self.try_reserve_extents(stream, epoch, file, &[(offset, length)])
    }

    /// As [`Store::try_reserve_write`] for several extents `(offset, length)` of one file,
    /// filled in the order given and published together (a later extent overwrites an earlier
    /// one it overlaps): one reservation and one publication under the store's lock for a
    /// client's gathered strided writes.
    pub fn try_reserve_extents(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        file: FileId,
        extents: &[(u64, usize)],
    ) -> Result<Option<WriteSlot>, WriteError> {
        let inner = &self.inner;
        let piece_max = inner.knobs.record_payload_bytes_max as usize;
        // (payload bytes, file offset) of each record, in order.
        let mut pieces: Vec<(usize, u64)> = Vec::with_capacity(extents.len());
        for &(offset, length) in extents {
            check_write_target(&inner.knobs, stream, epoch, file, offset, length as u64)?;
            pieces.extend(
                (0..length.div_ceil(piece_max)).map(|i| {
                    (piece_max.min(length - i * piece_max), offset + (i * piece_max) as u64)
                }),
            );
        }
        let length: usize = pieces.iter().map(|&(payload, _)| payload).sum();
        let needed: u64 = pieces.iter().map(|&(payload, _)| record_bytes(payload as u64)).sum();
        let mut state = inner.state.lock();
        // Clean cached copies make room before anything else does.
        advance_tail(&mut state);
        // No slot above the high watermark: there the caller's `write` goes straight to SSD.
        if state.ring.used() + needed > inner.high_watermark_bytes(&state) {
            return Ok(None);
        }
        inner.admit_locked(&mut state, stream, epoch, needed, length as u64)?;
        let mut slot = WriteSlot {
            inner: inner.clone(),
            stream,
            epoch,
            file,
            records: Vec::with_capacity(pieces.len()),
            published: false,
        };
        for &(payload, offset) in &pieces {
            let bytes = record_bytes(payload as u64);
            match reserve_dram_record(&mut state, bytes, stream, epoch, DramStatus::Reserved) {
                Some(position) => slot.records.push((position, payload, offset)),
                None => {
                    // The ring's free space is split by its wrap point. Return what was
                    // admitted but not placed; dropping the slot abandons the rest.
                    let unplaced = &pieces[slot.records.len()..];
                    let unplaced_bytes: u64 =
                        unplaced.iter().map(|&(p, _)| record_bytes(p as u64)).sum();
                    state.reserved_bytes -= unplaced_bytes;
                    *state.stream_usage.get_mut(&stream).expect("admitted stream usage missing") -=
                        unplaced_bytes;
                    unadmit_payload(
                        &mut state,
                        epoch,
                        unplaced.iter().map(|&(p, _)| p).sum::<usize>() as u64,
                    );
                    drop(state);
                    drop(slot);
                    return Ok(None);
                }
            }
        }
        Ok(Some(slot))
    }
}

impl WriteSlot {
    /// Payload bytes of the write.
    pub fn len(&self) -> usize {
        self.records.iter().map(|&(_, payload, _)| payload).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ranges to fill, in offset order; together they are the write's `len()` bytes.
    pub fn buffers(&mut self) -> Vec<&mut [u8]> {
        self.records
            .iter()
            // SAFETY: each range was reserved for this slot and stays Reserved until it is
            // published or abandoned (both take `self`): nobody else reads or writes it, and
            // the ring's tail cannot pass it. The ranges are disjoint, and `&mut self` keeps
            // them from being handed out twice at once.
            .map(|&(position, payload, _)| unsafe {
                self.inner.arena.slice_mut(position + HEADER_BYTES as u64, payload as u64)
            })
            .collect()
    }

    /// Makes the write visible (sequence numbers, headers, index), as [`Store::write`] would
    /// have when it returned. `buffer_crcs`: the write-time CRC32C of each range of
    /// [`WriteSlot::buffers`], in order (the client's, checked on receipt), kept as the record
    /// checksums. Fails, writing nothing, if the store failed or the epoch is no longer open
    /// (committed or deleted since the reservation).
    pub fn publish(mut self, buffer_crcs: &[u32]) -> Result<(), WriteError> {
        assert_eq!(buffer_crcs.len(), self.records.len(), "one CRC per buffer of a write slot");
        let inner = self.inner.clone();
        let mut state = inner.state.lock();
        if let Some(reason) = &state.failed {
            return Err(WriteError::Failed(reason.clone()));
        }
        let phase =
            state.epochs.get(&self.epoch).expect("epoch of a reserved write vanished").phase;
        if phase != EpochPhase::Open {
            return Err(WriteError::EpochNotOpen { epoch: self.epoch, phase });
        }
        for (i, &(position, payload, offset)) in self.records.iter().enumerate() {
            publish_dram_record(
                &mut state,
                &inner.arena,
                position,
                DramStatus::Reserved,
                self.stream,
                self.epoch,
                self.file,
                offset,
                payload,
                buffer_crcs[i],
                None,
            );
        }
        self.published = true;
        inner.wake_flusher_if_due(&state);
        Ok(())
    }
}

impl Drop for WriteSlot {
    /// An unpublished slot (never filled, refused at publish, or its owner gave up) is abandoned.
    fn drop(&mut self) {
        if self.published || self.records.is_empty() {
            return;
        }
        let mut state = self.inner.state.lock();
        for &(position, payload, _) in &self.records {
            abandon_dram_record(&mut state, position, self.stream, self.epoch, payload);
        }
        advance_tail(&mut state);
        #[cfg(feature = "strict_assertions")]
        check_invariants(&state);
        drop(state);
        self.inner.space.notify_all();
    }
}
