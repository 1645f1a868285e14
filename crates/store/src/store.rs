//! The store proper: write path, spill, group commit, lifecycle, GC and the queries.
//!
//! One mutex guards all bookkeeping (ring positions, index, segment accounting, epoch states);
//! bulk work happens outside it: writers copy and checksum payloads into ring ranges they
//! reserved, spills and compaction `pwrite` ranges placed under the lock, fsyncs run unlocked.
//! Condition variables: `space` (ring freed, records spilled, writes finished, GC freed SSD),
//! `commit` (a group-commit round ended) and `flusher` (wake the background flusher).

use crate::arena::{Arena, Ring};
use crate::error::*;
use crate::flusher::{FlusherMode, Round};
use crate::format::*;
use crate::grant::EpochGrant;
use crate::index::{Extent, Index};
use crate::storage::{is_no_space, PosixStorage, SegmentFile, Storage};
use crate::write_log::WriteLog;
use parking_lot::{Condvar, Mutex};
use spillway_config::StoreKnobs;
use spillway_types::{EpochId, FileId, SegmentId, StreamKey};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::RangeBounds;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How durable `commit` makes an epoch before returning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Every record of the epoch is written and fsync'd in the SSD log (survives power loss).
    Ssd,
    /// The epoch is sealed and marked committed in DRAM; the flusher makes it durable soon
    /// after. Survives nothing that kills the process before that.
    Memory,
}

/// Where an extent's bytes are right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    Dram,
    Ssd(SegmentId),
}

/// One epoch as `epochs()` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochInfo {
    pub epoch: EpochId,
    pub phase: EpochPhase,
    pub files: usize,
    pub data_records: u64,
    pub payload_bytes: u64,
    /// Found uncommitted at the last open: whatever records survived are whole, others are
    /// absent; the writer must know which (the server decides what to do with it).
    pub recovered_uncommitted: bool,
}

/// One file of one epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    pub epoch: EpochId,
    pub file: FileId,
    pub name: Option<String>,
    /// End of the last byte written (holes read as zeros).
    pub size_bytes: u64,
    pub extents: usize,
}

/// One extent as the range queries report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtentInfo {
    pub epoch: EpochId,
    pub file: FileId,
    pub offset: u64,
    pub length: u64,
    pub tier: Tier,
}

/// What one GC call did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub segments_deleted: u64,
    pub bytes_freed: u64,
    pub segments_compacted: u64,
    pub bytes_copied: u64,
}

/// Whether the kernel took the write-lifetime hints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteHints {
    NotTried,
    Supported,
    Unsupported,
}

/// What recovery found at open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segments_scanned: u64,
    pub records_scanned: u64,
    pub bytes_scanned: u64,
    /// (segment, offset) where a torn tail was cut off.
    pub truncated: Vec<(SegmentId, u64)>,
    /// Segments removed because they held nothing valid (created just before a crash).
    pub segments_removed: u64,
    pub committed_epochs: u64,
    pub uncommitted_epochs: u64,
    pub duration_ms: u64,
}

/// Counters and gauges.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreStats {
    pub dram_bytes_max: u64,
    /// Ring bytes of records not yet on SSD (being written, ready or spilling): what the ring
    /// cannot give back without a spill. Dead records the tail has not reached yet are not
    /// counted (they are released as soon as it does).
    pub dram_used_bytes: u64,
    /// Ring bytes holding clean copies of records already on SSD (evicted when the room is
    /// needed; not counted in `dram_used_bytes`).
    pub dram_cached_bytes: u64,
    pub ssd_bytes_max: u64,
    pub ssd_used_bytes: u64,
    pub ssd_live_bytes: u64,
    pub free_bytes: u64,
    pub segments: u64,
    pub segments_created: u64,
    pub segments_deleted: u64,
    /// Payload bytes accepted by `write`.
    pub user_payload_bytes: u64,
    /// Record bytes of data records appended to SSD by spills and write-throughs (headers
    /// included).
    pub user_bytes_to_ssd: u64,
    /// Data records a writer appended to SSD itself because DRAM was above its high watermark.
    pub write_through_records: u64,
    /// Record bytes copied by compaction.
    pub compaction_bytes: u64,
    /// Metadata and segment header bytes appended.
    pub metadata_bytes: u64,
    /// Everything appended to segment files.
    pub ssd_bytes_written: u64,
    /// Bytes of spills and write-throughs written around the page cache (`O_DIRECT`,
    /// `store.ssd_direct_io`).
    pub ssd_direct_bytes_written: u64,
    /// `ssd_bytes_written / user_bytes_to_ssd` (1.0 when nothing was spilled yet).
    pub host_write_amplification: f64,
    pub commits: u64,
    pub commit_rounds: u64,
    pub fsyncs: u64,
    /// Syncs and commit steps that a concurrent fsync round covered (group fsync).
    pub fsyncs_shared: u64,
    /// fsync rounds the background syncer ran because `ssd_sync_behind_bytes` were unsynced.
    pub sync_behind_rounds: u64,
    pub write_hints: WriteHints,
    pub recovery: RecoveryReport,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DramStatus {
    /// `Store::write` is copying the payload in; the write holds its epoch open.
    Writing,
    /// Held by a [`crate::WriteSlot`] whose owner fills it outside the store; not yet a write.
    /// Commits, syncs and deletes do not wait for it: it becomes one when published (and is
    /// refused then if its epoch is no longer open), or dead when abandoned.
    Reserved,
    Ready,
    Spilling,
    /// On SSD, its ring copy kept as a clean cache for reads until the ring needs the room
    /// (`advance_tail` evicts it once the ring is above `dram_cache_keep_bytes`).
    Spilled,
    Dead,
}

#[derive(Debug)]
pub(crate) struct DramRecord {
    pub position: u64,
    pub bytes: u64,
    pub status: DramStatus,
    /// Readers copying out of this record without the lock; the tail may not pass it.
    pub readers: u32,
    pub sequence: u64,
    pub epoch: EpochId,
    pub stream: StreamKey,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Location {
    Dram { position: u64 },
    Ssd { segment: SegmentId, offset: u64 },
}

#[derive(Debug)]
pub(crate) struct RecordInfo {
    pub location: Location,
    /// Ring position of a clean DRAM copy of an `Ssd` record (spilled, not yet evicted): reads
    /// take it instead of the segment. `None` for `Dram` records and evicted copies.
    pub cached: Option<u64>,
    pub epoch: EpochId,
    pub payload_bytes: u32,
    /// A `Zeros` record: its extents read as zeros, nothing is read from where it lives.
    pub zeros: bool,
}

impl RecordInfo {
    /// Where its bytes can be read in the ring: a DRAM record, or an SSD record's clean copy.
    pub(crate) fn ring_position(&self) -> Option<u64> {
        match self.location {
            Location::Dram { position } => Some(position),
            Location::Ssd { .. } => self.cached,
        }
    }
}

#[derive(Debug)]
pub(crate) struct EpochEntry {
    pub phase: EpochPhase,
    pub inflight_writes: u32,
    pub data_records: u64,
    pub payload_bytes: u64,
    /// Published data records in DRAM not yet spilled (Ready or Spilling).
    pub dram_pending: u64,
    pub record_sequences: Vec<u64>,
    /// Segments holding record bytes (data, names, commit) of this epoch.
    pub segments: BTreeSet<SegmentId>,
    pub stream_bytes: BTreeMap<StreamKey, u64>,
    pub names: BTreeMap<FileId, String>,
    pub recovered_uncommitted: bool,
    /// Who may use the epoch, its capacity on this store and its stream (`Store::grant_epoch`);
    /// kept while the epoch is live or drained, gone once it is deleted or the grant revoked.
    pub grant: Option<EpochGrant>,
    /// Payload bytes of writes admitted but not yet published (counted against the grant's
    /// capacity with `payload_bytes`, so concurrent writers cannot overshoot it together).
    pub admitted_payload_bytes: u64,
    /// Its last `Ssd` commit ran out of space: it is sealed (`Committing`) with no commit
    /// running, so it may be deleted to free space, or committed again.
    pub commit_stalled: bool,
    /// The servers committers wrote the epoch to, sorted by id (`Store::record_participants`).
    pub participants: Vec<crate::participants::EpochParticipant>,
}

impl EpochEntry {
    pub fn new() -> EpochEntry {
        EpochEntry {
            phase: EpochPhase::Open,
            inflight_writes: 0,
            data_records: 0,
            payload_bytes: 0,
            dram_pending: 0,
            record_sequences: Vec::new(),
            segments: BTreeSet::new(),
            stream_bytes: BTreeMap::new(),
            names: BTreeMap::new(),
            recovered_uncommitted: false,
            grant: None,
            participants: Vec::new(),
            admitted_payload_bytes: 0,
            commit_stalled: false,
        }
    }
}

pub(crate) fn phase_is_live(phase: EpochPhase) -> bool {
    !matches!(phase, EpochPhase::Drained | EpochPhase::Deleted)
}

pub(crate) struct Segment {
    pub stream: StreamKey,
    pub file: Arc<dyn SegmentFile>,
    /// Bytes placed (written or being written).
    pub length: u64,
    /// Bytes reserved on disk with `preallocate` (placements below never run out of space);
    /// `None`: the file system cannot preallocate, or the segment was recovered (sealed).
    pub preallocated: Option<u64>,
    pub inflight: u32,
    /// Start offsets of the placements still being written (one per `inflight`): every byte
    /// below the lowest is written, so that is how far an fsync makes the segment durable.
    pub inflight_at: BTreeSet<u64>,
    /// Writes below this offset were handed to writeback (`start_writeback`) already.
    pub kicked: u64,
    pub synced_length: u64,
    pub dirty: bool,
    pub sealed: bool,
    pub epoch_bytes: BTreeMap<EpochId, u64>,
    /// `EpochState` records (drained/deleted) by epoch.
    pub tombstones: BTreeMap<EpochId, u64>,
    pub last_write_sequence: u64,
}

impl Segment {
    /// A placement at `offset` is written (or failed): it no longer holds the frontier back.
    pub(crate) fn finish_placement(&mut self, offset: u64) {
        assert!(self.inflight > 0, "segment in-flight count underflow");
        self.inflight -= 1;
        let removed = self.inflight_at.remove(&offset);
        assert!(removed, "finished a placement at {offset} that was not in flight");
    }

    /// Every byte below this offset has been written (no placement below it is in flight).
    pub(crate) fn written_frontier(&self) -> u64 {
        self.inflight_at.first().copied().unwrap_or(self.length)
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Counters {
    pub user_payload_bytes: u64,
    pub user_bytes_to_ssd: u64,
    pub compaction_bytes: u64,
    pub metadata_bytes: u64,
    pub ssd_bytes_written: u64,
    pub commits: u64,
    pub commit_rounds: u64,
    pub fsyncs: u64,
    pub segments_created: u64,
    pub segments_deleted: u64,
    /// Data records written straight to SSD because DRAM was above its high watermark.
    pub write_through_records: u64,
    /// `sync_dirty` calls that a round started after them made durable (no fsync of their own).
    pub fsyncs_shared: u64,
    /// Rounds the background syncer ran (`StoreStats::sync_behind_rounds`).
    pub sync_behind_rounds: u64,
}

pub(crate) struct State {
    pub ring: Ring,
    pub dram: VecDeque<DramRecord>,
    /// DRAM record bytes not yet placed in a segment (they will need SSD space).
    pub dram_unplaced_bytes: u64,
    /// Bytes of Ready records (published, not yet placed): what write-behind may spill.
    pub dram_ready_bytes: u64,
    /// Bytes of Spilled records still in the ring (clean copies of SSD records).
    pub dram_cached_bytes: u64,
    /// Ring use up to which Spilled records stay cached (the low watermark): above it they are
    /// evicted, so clean copies never push the ring toward its high watermark.
    pub dram_cache_keep_bytes: u64,
    pub records: HashMap<u64, RecordInfo>,
    pub index: Index,
    pub epochs: BTreeMap<EpochId, EpochEntry>,
    pub segments: BTreeMap<SegmentId, Segment>,
    pub open_segments: HashMap<StreamKey, SegmentId>,
    pub next_sequence: u64,
    /// `sync_dirty` calls so far, and how many of them the last finished round covered.
    pub sync_calls: u64,
    pub sync_calls_covered: u64,
    /// Bytes spilled or written through since the last `sync_dirty` round took its snapshot
    /// (the background syncer starts a round when they reach `ssd_sync_behind_bytes`).
    pub unsynced_bytes: u64,
    pub next_segment: u64,
    pub ssd_used_bytes: u64,
    /// Capacity promised to writes in progress but not yet in DRAM.
    pub reserved_bytes: u64,
    pub stream_usage: HashMap<StreamKey, u64>,
    pub stream_quota: HashMap<StreamKey, u64>,
    pub counters: Counters,
    pub commit_queue: BTreeSet<EpochId>,
    pub commit_leader: bool,
    pub durable_pending: BTreeSet<EpochId>,
    /// Segments fsync'd since the last commit record (their sync points go into the next one).
    pub recent_synced: BTreeSet<SegmentId>,
    pub directory_dirty: bool,
    pub gc_wanted: bool,
    /// A writer wrote through to SSD since the flusher last looked: DRAM is under pressure,
    /// so the flusher spills down to the low watermark even from below the high one.
    pub write_through_seen: bool,
    pub failed: Option<String>,
    /// The SSD directory's file system said ENOSPC: writes are admitted only once it has room
    /// again (`Inner::disk_has_room`), and the flusher backs off between spill attempts.
    pub disk_full: bool,
    /// The reserve file (`RESERVE_FILE_NAME`) exists and holds `ssd_reserve_bytes`.
    pub reserve_held: bool,
    pub shutdown: bool,
    pub hints: WriteHints,
    pub recovery: RecoveryReport,
}

pub(crate) struct Inner {
    pub knobs: StoreKnobs,
    /// Whether a background thread runs the flusher or only the caller does.
    pub flusher_mode: FlusherMode,
    pub storage: Arc<dyn Storage>,
    pub arena: Arena,
    pub state: Mutex<State>,
    pub space: Condvar,
    pub commit: Condvar,
    pub flusher: Condvar,
    /// Wakes the background syncer (`sync_behind.rs`).
    pub syncer: Condvar,
    pub write_log: WriteLog,
    /// Serialises GC rounds (the flusher and writers short of space may both start one).
    pub gc_lock: Mutex<()>,
    /// Serialises `sync_dirty`: a caller that finds a segment clean must not return while
    /// another caller's fsync of it is still running.
    pub sync_lock: Mutex<()>,
    /// Writes the spills' runs, whole blocks around the page cache where the storage allows.
    pub direct: crate::direct::DirectWriter,
}

/// The log-structured store of one server. `Send + Sync`; share it behind an `Arc`.
pub struct Store {
    pub(crate) inner: Arc<Inner>,
    flusher: Option<std::thread::JoinHandle<()>>,
    /// The background syncer; `None` with `FlusherMode::Manual` or `ssd_sync_behind_bytes = 0`.
    syncer: Option<std::thread::JoinHandle<()>>,
}

/// Which DRAM records a spill takes.
pub(crate) enum SpillScope<'a> {
    /// Oldest first, any epoch.
    Oldest,
    Epochs(&'a BTreeSet<EpochId>),
    /// Records whose sequence is below `horizon` (they existed when a sync began), of `epochs`
    /// only when given: a sync never chases writes that arrive while it runs.
    Before {
        horizon: u64,
        epochs: Option<&'a BTreeSet<EpochId>>,
    },
}

impl SpillScope<'_> {
    fn takes(&self, sequence: u64, epoch: EpochId) -> bool {
        match self {
            SpillScope::Oldest => true,
            SpillScope::Epochs(epochs) => epochs.contains(&epoch),
            SpillScope::Before { horizon, epochs } => {
                sequence < *horizon && epochs.is_none_or(|epochs| epochs.contains(&epoch))
            }
        }
    }
}

/// Why a record could not be placed in a segment.
#[derive(Debug)]
pub(crate) enum PlaceError {
    /// The file system is full: a new segment could not be created. Nothing changed; the store
    /// carries on.
    NoSpace(String),
    /// Any other I/O error; the caller fails the store.
    Io(String),
}

/// Name of the reserve file in the SSD directory: `ssd_reserve_bytes` preallocated while there
/// is room, deleted when the file system fills so tombstones, commit records and compaction can
/// still get a segment. Not a segment; recovery ignores it.
pub const RESERVE_FILE_NAME: &str = "RESERVE";

/// Creates the reserve file (removing any old one first) and preallocates it. `false` when
/// there is no room or reserve (`ssd_reserve_bytes` = 0); a failure is not an error.
pub(crate) fn take_reserve(knobs: &StoreKnobs, storage: &dyn Storage) -> bool {
    if knobs.ssd_reserve_bytes == 0 {
        return false;
    }
    let _ = storage.remove(RESERVE_FILE_NAME);
    let result = storage.create(RESERVE_FILE_NAME).and_then(|file| {
        if file.preallocate(knobs.ssd_reserve_bytes)? {
            return Ok(());
        }
        // No fallocate: write zeros instead.
        let zeros = vec![0u8; (1 << 20).min(knobs.ssd_reserve_bytes) as usize];
        let mut at = 0;
        while at < knobs.ssd_reserve_bytes {
            let n = zeros.len().min((knobs.ssd_reserve_bytes - at) as usize);
            file.write_at(at, &zeros[..n])?;
            at += n as u64;
        }
        Ok(())
    });
    match result {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(%error, "could not take the SSD reserve file; retrying when space returns");
            let _ = storage.remove(RESERVE_FILE_NAME);
            false
        }
    }
}

/// A spill's pwrite that failed: the records from `first_unwritten` on were not (fully)
/// written.
pub(crate) struct SpillWriteError {
    first_unwritten: usize,
    no_space: bool,
    reason: String,
}

/// One placed record range waiting for its pwrite.
pub(crate) struct Placed {
    segment: SegmentId,
    offset: u64,
    file: Arc<dyn SegmentFile>,
    position: u64,
    bytes: u64,
    sequence: u64,
    stream: StreamKey,
}

/// Smallest payload a writer writes through to SSD when DRAM is above its high watermark;
/// smaller ones wait for the flusher (two extra syscalls would cost more than the copy).
const WRITE_THROUGH_PAYLOAD_BYTES_MIN: u64 = 4096;

/// Which step of making a segment file failed, and how.
type SegmentFileFailure = (&'static str, std::io::Error);

/// Segments are preallocated in chunks of this size as placements reach the end of what is
/// reserved (at most `segment_bytes_max`), so a segment never holds much unused disk.
const PREALLOCATE_CHUNK_BYTES: u64 = 16 << 20;

/// Writeback is started (`sync_file_range`) in chunks of this size as segments fill.
const WRITEBACK_CHUNK_BYTES: u64 = 16 << 20;

/// With `store.ssd_drop_behind`, the page cache of a segment range is dropped when writeback
/// of the range this far above it starts: by then its own writeback (started as long before)
/// has usually ended, and only clean pages can be dropped. The rest goes after the next fsync.
const DROP_BEHIND_LAG_BYTES: u64 = 4 * WRITEBACK_CHUNK_BYTES;

const WRITE_HINT_META: u64 = 2; // RWH_WRITE_LIFE_SHORT

/// Write-lifetime hint for a stream's segments: metadata is short-lived; data streams spread
/// over MEDIUM/LONG/EXTREME so streams with different keys land in different device streams.
pub fn write_hint_for(stream: StreamKey) -> u64 {
    if stream == META_STREAM {
        WRITE_HINT_META
    } else {
        3 + stream.0 % 3
    }
}

/// Refuses a write of `payload_bytes` that would take the epoch past the capacity its grant
/// gives it on this store (bytes written so far, overwrites included, plus writes admitted).
fn check_granted_capacity(
    epoch: EpochId,
    entry: &EpochEntry,
    payload_bytes: u64,
) -> Result<(), WriteError> {
    let Some(grant) = &entry.grant else { return Ok(()) };
    let used = entry.payload_bytes + entry.admitted_payload_bytes;
    if grant.capacity_bytes > 0 && used.saturating_add(payload_bytes) > grant.capacity_bytes {
        return Err(WriteError::GrantCapacityExceeded {
            epoch,
            capacity_bytes: grant.capacity_bytes,
            used_bytes: used,
            needed_bytes: payload_bytes,
        });
    }
    Ok(())
}

/// Refuses writes no store accepts: to the metadata stream, past the end of the offset space,
/// or ending past `file_bytes_max` (checked before anything is reserved or written).
pub(crate) fn check_write_target(
    knobs: &StoreKnobs,
    stream: StreamKey,
    epoch: EpochId,
    file: FileId,
    offset: u64,
    length: u64,
) -> Result<(), WriteError> {
    if stream == META_STREAM {
        return Err(WriteError::ReservedStream(stream));
    }
    let Some(end) = offset.checked_add(length) else {
        return Err(WriteError::OffsetOverflow { epoch, file, offset, length });
    };
    if end > knobs.file_bytes_max {
        return Err(WriteError::FileTooLarge {
            epoch,
            file,
            offset,
            length,
            file_bytes_max: knobs.file_bytes_max,
        });
    }
    Ok(())
}

/// Takes the next sequence number for a data record and builds its header (kind `Data`; a
/// `Zeros` record's publisher changes it). Called under the state lock: sequence order is the
/// order records become visible (newest wins).
fn next_data_header(
    state: &mut State,
    stream: StreamKey,
    epoch: EpochId,
    file: FileId,
    offset: u64,
    payload_bytes: usize,
) -> RecordHeader {
    let sequence = state.next_sequence;
    state.next_sequence += 1;
    RecordHeader {
        kind: RecordKind::Data,
        sequence,
        stream,
        epoch,
        file,
        offset,
        payload_bytes: payload_bytes as u32,
    }
}

/// Makes a written data record readable and accounted, wherever it lives (DRAM ring or, for a
/// write-through, its segment): record table, index extent, its epoch's bookkeeping, counters.
/// `record_bytes` is the record's size on its medium (header, payload, padding);
/// `extent_bytes` the file bytes it covers (its payload's length, or a `Zeros` record's run).
fn publish_data_record(
    state: &mut State,
    header: &RecordHeader,
    location: Location,
    record_bytes: u64,
    extent_bytes: u64,
) {
    let (sequence, epoch, payload_bytes) = (header.sequence, header.epoch, header.payload_bytes);
    let zeros = header.kind == RecordKind::Zeros;
    state
        .records
        .insert(sequence, RecordInfo { location, cached: None, epoch, payload_bytes, zeros });
    if extent_bytes > 0 {
        state.index.insert(
            epoch,
            header.file,
            header.offset,
            Extent { record: sequence, skip: 0, length: extent_bytes },
        );
    }
    let entry = state.epochs.get_mut(&epoch).expect("admitted epoch vanished");
    assert!(
        entry.admitted_payload_bytes >= payload_bytes as u64,
        "epoch {epoch} publishes {payload_bytes} payload bytes it was not admitted for"
    );
    entry.admitted_payload_bytes -= payload_bytes as u64;
    entry.data_records += 1;
    entry.payload_bytes += payload_bytes as u64;
    entry.record_sequences.push(sequence);
    *entry.stream_bytes.entry(header.stream).or_default() += record_bytes;
    state.counters.user_payload_bytes += payload_bytes as u64;
}

/// Takes `bytes` of ring space for a data record of (`stream`, `epoch`) in `status` (Writing or
/// Reserved), recording any padding skipped before it. The record's capacity moves from
/// `reserved_bytes` (admitted) to `dram_unplaced_bytes`. `None`: the ring has no room now.
pub(crate) fn reserve_dram_record(
    state: &mut State,
    bytes: u64,
    stream: StreamKey,
    epoch: EpochId,
    status: DramStatus,
) -> Option<u64> {
    debug_assert!(matches!(status, DramStatus::Writing | DramStatus::Reserved));
    let reservation = state.ring.reserve(bytes)?;
    let record = |position, bytes, status| DramRecord {
        position,
        bytes,
        status,
        readers: 0,
        sequence: 0,
        epoch,
        stream,
    };
    if reservation.padding > 0 {
        state.dram.push_back(record(
            reservation.position - reservation.padding,
            reservation.padding,
            DramStatus::Dead,
        ));
    }
    state.dram.push_back(record(reservation.position, bytes, status));
    assert!(
        state.reserved_bytes >= bytes,
        "ring record of {bytes} bytes without admitted capacity"
    );
    state.reserved_bytes -= bytes;
    state.dram_unplaced_bytes += bytes;
    Some(reservation.position)
}

/// Publishes the ring record at `position`, whose payload (`payload_bytes` after the header)
/// its reserver has written: next sequence number, header, status Ready, index. Under the
/// state lock, so the record becomes visible whole. `zeros`: the record is a `Zeros` record
/// of that run (its payload the encoded length), not `Data`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn publish_dram_record(
    state: &mut State,
    arena: &Arena,
    position: u64,
    was: DramStatus,
    stream: StreamKey,
    epoch: EpochId,
    file: FileId,
    offset: u64,
    payload_bytes: usize,
    payload_crc: u32,
    zeros: Option<u64>,
) {
    let at = dram_index(state, position);
    let bytes = state.dram[at].bytes;
    assert_eq!(state.dram[at].status, was, "publishing a DRAM record that is not being written");
    // SAFETY: the record is still Writing/Reserved: only its reserver (our caller) touches it,
    // and it is done with the payload. Padding after the payload is zeroed for the SSD image.
    let slot = unsafe { arena.slice_mut(position, bytes) };
    slot[HEADER_BYTES + payload_bytes..].fill(0);
    let mut header = next_data_header(state, stream, epoch, file, offset, payload_bytes);
    if zeros.is_some() {
        header.kind = RecordKind::Zeros;
    }
    // The record CRC is sealed now from the CRC taken when the data was written (the client's,
    // checked by the server on receipt), not from the ring's bytes: from here on, every read
    // and the SSD copy are checked against what the application wrote.
    header.encode(payload_crc, &mut slot[..HEADER_BYTES]);
    let record = &mut state.dram[at];
    record.status = DramStatus::Ready;
    record.sequence = header.sequence;
    state.dram_ready_bytes += bytes;
    let extent_bytes = zeros.unwrap_or(payload_bytes as u64);
    publish_data_record(state, &header, Location::Dram { position }, bytes, extent_bytes);
    state.epochs.get_mut(&epoch).expect("published epoch vanished").dram_pending += 1;
}

/// Turns an unpublished ring record (of `payload_bytes` for `epoch`) dead and returns its
/// capacity (the caller advances the tail and wakes waiters).
pub(crate) fn abandon_dram_record(
    state: &mut State,
    position: u64,
    stream: StreamKey,
    epoch: EpochId,
    payload_bytes: usize,
) {
    let at = dram_index(state, position);
    let record = &mut state.dram[at];
    assert_eq!(
        record.status,
        DramStatus::Reserved,
        "abandoning a DRAM record that is not reserved"
    );
    record.status = DramStatus::Dead;
    let bytes = record.bytes;
    state.dram_unplaced_bytes -= bytes;
    let usage =
        state.stream_usage.get_mut(&stream).expect("stream usage of a reserved record missing");
    assert!(*usage >= bytes, "stream {stream} usage underflow");
    *usage -= bytes;
    unadmit_payload(state, epoch, payload_bytes as u64);
}

/// Returns `payload_bytes` admitted for `epoch` but never published to the grant's capacity.
pub(crate) fn unadmit_payload(state: &mut State, epoch: EpochId, payload_bytes: u64) {
    let entry = state.epochs.get_mut(&epoch).expect("epoch of an admitted write vanished");
    assert!(
        entry.admitted_payload_bytes >= payload_bytes,
        "epoch {epoch} admitted payload underflow"
    );
    entry.admitted_payload_bytes -= payload_bytes;
}

/// Step 2 of `Inner::write_through`, outside the lock: writes the payload of the record of
/// `bytes` placed at `at` (its whole blocks around the page cache, like a spill's), then the
/// zero padding after it (the header comes last).
fn write_payload_and_padding(
    direct: &crate::direct::DirectWriter,
    segment_file: &dyn SegmentFile,
    at: u64,
    piece: &[u8],
    bytes: u64,
) -> std::io::Result<()> {
    let padding = (bytes - HEADER_BYTES as u64 - piece.len() as u64) as usize;
    let mut result = direct.write(segment_file, at + HEADER_BYTES as u64, piece);
    if result.is_ok() && padding > 0 {
        result = segment_file
            .write_at(at + HEADER_BYTES as u64 + piece.len() as u64, &[0u8; 8][..padding]);
    }
    result
}

impl Store {
    /// Opens (recovering if needed) the store in `knobs.ssd_directory`.
    pub fn open(knobs: &StoreKnobs) -> Result<Store, OpenError> {
        let storage = PosixStorage::new(std::path::Path::new(&knobs.ssd_directory))
            .map_err(|source| OpenError::Io {
                what: "creating and locking the directory".into(),
                directory: knobs.ssd_directory.clone(),
                source,
            })?
            .with_direct_io(knobs.ssd_direct_io);
        Store::open_with(knobs, Arc::new(storage))
    }

    /// Opens the store on any [`Storage`] (tests pass a `SimStorage`).
    pub fn open_with(knobs: &StoreKnobs, storage: Arc<dyn Storage>) -> Result<Store, OpenError> {
        Store::open_with_flusher(knobs, storage, FlusherMode::Background)
    }

    /// [`Store::open_with`], choosing who runs the flusher: with [`FlusherMode::Manual`] no
    /// thread is started and nothing moves to SSD in the background, so a single-threaded
    /// test driven by a seed does exactly the same I/O on every run.
    pub fn open_with_flusher(
        knobs: &StoreKnobs,
        storage: Arc<dyn Storage>,
        flusher_mode: FlusherMode,
    ) -> Result<Store, OpenError> {
        knobs.validate()?;
        let write_log =
            WriteLog::open(&knobs.ssd_write_log_path).map_err(|source| OpenError::Io {
                what: format!("opening ssd_write_log_path {}", knobs.ssd_write_log_path),
                directory: storage.describe(),
                source,
            })?;
        let arena = Arena::new(knobs.dram_bytes_max, knobs.dram_prefault);
        let mut state = State {
            ring: Ring::new(knobs.dram_bytes_max),
            dram: VecDeque::new(),
            dram_unplaced_bytes: 0,
            dram_ready_bytes: 0,
            dram_cached_bytes: 0,
            dram_cache_keep_bytes: knobs.dram_bytes_max / 100 * knobs.dram_low_watermark_percent,
            records: HashMap::new(),
            index: Index::default(),
            epochs: BTreeMap::new(),
            segments: BTreeMap::new(),
            open_segments: HashMap::new(),
            next_sequence: 1,
            sync_calls: 0,
            sync_calls_covered: 0,
            unsynced_bytes: 0,
            next_segment: 1,
            ssd_used_bytes: 0,
            reserved_bytes: 0,
            stream_usage: HashMap::new(),
            stream_quota: HashMap::new(),
            counters: Counters::default(),
            commit_queue: BTreeSet::new(),
            commit_leader: false,
            durable_pending: BTreeSet::new(),
            recent_synced: BTreeSet::new(),
            directory_dirty: false,
            gc_wanted: true,
            write_through_seen: false,
            failed: None,
            disk_full: false,
            reserve_held: false,
            shutdown: false,
            hints: WriteHints::NotTried,
            recovery: RecoveryReport::default(),
        };
        crate::recovery::recover(knobs, storage.as_ref(), &mut state)?;
        state.reserve_held = take_reserve(knobs, storage.as_ref());
        let inner = Arc::new(Inner {
            knobs: knobs.clone(),
            flusher_mode,
            storage,
            arena,
            state: Mutex::new(state),
            space: Condvar::new(),
            commit: Condvar::new(),
            flusher: Condvar::new(),
            syncer: Condvar::new(),
            write_log,
            gc_lock: Mutex::new(()),
            sync_lock: Mutex::new(()),
            direct: crate::direct::DirectWriter::default(),
        });
        Store { inner, flusher: None, syncer: None }.start_threads(flusher_mode)
    }

    /// Step 2 of `open_with_flusher`: the flusher thread and, with `ssd_sync_behind_bytes`
    /// above 0, the syncer (`sync_behind.rs`); neither with `FlusherMode::Manual`.
    fn start_threads(mut self, flusher_mode: FlusherMode) -> Result<Store, OpenError> {
        if flusher_mode == FlusherMode::Manual {
            return Ok(self);
        }
        let directory = self.inner.knobs.ssd_directory.clone();
        let spawn = |name: &str, body: fn(Arc<Inner>), inner: Arc<Inner>| {
            std::thread::Builder::new().name(name.into()).spawn(move || body(inner)).map_err(
                |source| OpenError::Io {
                    what: format!("starting the {name} thread"),
                    directory: directory.clone(),
                    source,
                },
            )
        };
        self.flusher = Some(spawn("spillway-flusher", Inner::flusher_loop, self.inner.clone())?);
        if self.inner.knobs.ssd_sync_behind_bytes > 0 {
            self.syncer = Some(spawn("spillway-syncer", Inner::syncer_loop, self.inner.clone())?);
        }
        Ok(self)
    }

    /// Appends `data` at `offset` of (`epoch`, `file`) in `stream`. Returns once the data is in
    /// the DRAM log and indexed (visible to `read`). Writes larger than
    /// `record_payload_bytes_max` become several records; capacity for all of them is reserved
    /// first, so an out-of-space failure writes nothing.
    pub fn write(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        data: &[u8],
    ) -> Result<(), WriteError> {
        let piece_max = self.inner.knobs.record_payload_bytes_max as usize;
        let piece_crcs: Vec<u32> = data.chunks(piece_max).map(crc32c::crc32c).collect();
        self.write_with_crcs(stream, epoch, file, offset, data, &piece_crcs)
    }

    /// The largest payload of one record (`record_payload_bytes_max`): a write is split into
    /// pieces of this size, one record each.
    pub fn record_payload_bytes_max(&self) -> usize {
        self.inner.knobs.record_payload_bytes_max as usize
    }

    /// [`Store::write`] with the CRC32C of each piece of [`Store::record_payload_bytes_max`]
    /// bytes of `data` (the last may be shorter) taken when the data was written (by the
    /// client, checked on receipt): the records keep them as their checksums, so a read or a
    /// drain that verifies a record verifies it against what the application wrote.
    pub fn write_with_crcs(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        data: &[u8],
        piece_crcs: &[u32],
    ) -> Result<(), WriteError> {
        check_write_target(&self.inner.knobs, stream, epoch, file, offset, data.len() as u64)?;
        let piece_max = self.inner.knobs.record_payload_bytes_max as usize;
        assert_eq!(
            piece_crcs.len(),
            data.len().div_ceil(piece_max),
            "one CRC per record-sized piece of a write"
        );
        let needed: u64 = data.chunks(piece_max).map(|p| record_bytes(p.len() as u64)).sum();
        self.inner.admit_write(stream, epoch, needed, data.len() as u64)?;
        let mut consumed = 0u64;
        let mut published_payload = 0u64;
        let mut result = Ok(());
        for (i, piece) in data.chunks(piece_max).enumerate() {
            let piece_offset = offset + (i * piece_max) as u64;
            let crc = piece_crcs[i];
            match self.inner.write_piece(stream, epoch, file, piece_offset, piece, crc, None) {
                Ok(()) => {
                    consumed += record_bytes(piece.len() as u64);
                    published_payload += piece.len() as u64;
                }
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
        }
        self.inner.end_write(
            stream,
            epoch,
            needed - consumed,
            data.len() as u64 - published_payload,
        );
        result
    }

    /// Makes `[offset, offset + length)` of (`epoch`, `file`) read as zeros without storing
    /// them: one `Zeros` record of 72 bytes in the log, whatever `length` (fallocate's punch
    /// hole and zero range, a shrinking truncate's zero-fill). Like a write of zeros in every
    /// other way: newest wins, counted as a data record of the epoch, drained as zeros.
    /// The bytes it replaces stay in the log until the epoch is drained or deleted, as
    /// overwritten bytes do. `length` 0 does nothing.
    pub fn write_zeros(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        length: u64,
    ) -> Result<(), WriteError> {
        check_write_target(&self.inner.knobs, stream, epoch, file, offset, length)?;
        if length == 0 {
            return Ok(());
        }
        let payload = encode_zeros_payload(length);
        let needed = record_bytes(ZEROS_PAYLOAD_BYTES as u64);
        self.inner.admit_write(stream, epoch, needed, ZEROS_PAYLOAD_BYTES as u64)?;
        let crc = crc32c::crc32c(&payload);
        let result =
            self.inner.write_piece(stream, epoch, file, offset, &payload, crc, Some(length));
        let (unused, unpublished) =
            if result.is_ok() { (0, 0) } else { (needed, ZEROS_PAYLOAD_BYTES as u64) };
        self.inner.end_write(stream, epoch, unused, unpublished);
        result
    }

    /// Records the UTF-8 path name of (`epoch`, `file`) (a `FileName` record), so a drain after
    /// a restart can still name the PFS file. The epoch must be open.
    pub fn name_file(&self, epoch: EpochId, file: FileId, name: &str) -> Result<(), WriteError> {
        const NAME_BYTES_MAX: usize = 4096;
        if name.is_empty() || name.len() > NAME_BYTES_MAX {
            return Err(WriteError::BadFileName { epoch, file, max_bytes: NAME_BYTES_MAX });
        }
        let mut state = self.inner.state.lock();
        if let Some(reason) = &state.failed {
            return Err(WriteError::Failed(reason.clone()));
        }
        let phase = state.epochs.entry(epoch).or_insert_with(EpochEntry::new).phase;
        if phase != EpochPhase::Open {
            return Err(WriteError::EpochNotOpen { epoch, phase });
        }
        let header = RecordHeader {
            kind: RecordKind::FileName,
            sequence: 0,
            stream: META_STREAM,
            epoch,
            file,
            offset: 0,
            payload_bytes: name.len() as u32,
        };
        self.inner.append_meta(&mut state, header, name.as_bytes()).map_err(
            |(segment, source)| {
                if is_no_space(&source) {
                    self.inner.file_system_full(META_STREAM, name.len() as u64, 0)
                } else {
                    WriteError::Io { segment, source }
                }
            },
        )?;
        state.epochs.get_mut(&epoch).expect("epoch vanished").names.insert(file, name.to_string());
        Ok(())
    }

    /// Alias of [`Store::name_file`] for callers that think in terms of creating files.
    pub fn create_file(&self, epoch: EpochId, file: FileId, name: &str) -> Result<(), WriteError> {
        self.name_file(epoch, file, name)
    }

    /// Commits `epoch`: seals it (later writes fail), waits for writes in progress, and returns
    /// when it is durable at `durability`. Concurrent `Ssd` commits share fsyncs (group commit).
    /// Committing an already committed epoch succeeds at once; an unknown epoch is created
    /// empty and committed.
    pub fn commit(&self, epoch: EpochId, durability: Durability) -> Result<(), CommitError> {
        let mut state = self.inner.state.lock();
        loop {
            if let Some(reason) = &state.failed {
                return Err(CommitError::Failed(reason.clone()));
            }
            let entry = state.epochs.entry(epoch).or_insert_with(EpochEntry::new);
            match entry.phase {
                EpochPhase::Open => entry.phase = EpochPhase::Committing,
                EpochPhase::Committing => entry.commit_stalled = false,
                EpochPhase::CommittedInMemory if durability == Durability::Memory => return Ok(()),
                EpochPhase::CommittedInMemory => {}
                EpochPhase::Committed => return Ok(()),
                phase @ (EpochPhase::Drained | EpochPhase::Deleted) => {
                    return Err(CommitError::EpochGone { epoch, phase })
                }
            }
            if entry.inflight_writes == 0 {
                break;
            }
            self.inner.space.wait(&mut state);
        }
        if durability == Durability::Memory {
            let entry = state.epochs.get_mut(&epoch).expect("epoch vanished");
            if entry.phase == EpochPhase::Committing {
                entry.phase = EpochPhase::CommittedInMemory;
            }
            state.durable_pending.insert(epoch);
            drop(state);
            self.inner.flusher.notify_one();
            return Ok(());
        }
        drop(state);
        self.inner.group_commit(BTreeSet::from([epoch]))
    }

    /// Reads `buf.len()` bytes of (`epoch`, `file`) at `offset`, assembled from the extents;
    /// bytes never written read as zeros.
    pub fn read(
        &self,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), ReadError> {
        self.read_with_crc(epoch, file, offset, buf).map(|_| ())
    }

    /// [`Store::read`], returning the CRC32C of `buf` as filled (holes as zeros), taken as the
    /// records are checked against their write-time CRCs: a read within one record costs no
    /// pass beyond the check (a part of a record one pass over the part), a read of several
    /// records or holes one pass over `buf` after every record in it was checked.
    pub fn read_with_crc(
        &self,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<u32, ReadError> {
        if offset.checked_add(buf.len() as u64).is_none() {
            return Err(ReadError::OffsetOverflow { epoch, file, offset });
        }
        buf.fill(0);
        let (dram_reads, ssd_reads) = self.locate_extents(epoch, file, offset, buf.len() as u64)?;
        // (range of `buf`, its CRC32C) of every extent read.
        let mut pieces = self.copy_dram_extents(&dram_reads, buf)?;
        for read in ssd_reads {
            pieces.push(read_ssd_extent(read, buf)?);
        }
        match pieces[..] {
            // One extent filling the buffer (a read of whole records or one record's part):
            // its CRC is the one derived while checking it.
            [(ref range, crc)] if range.len() == buf.len() => Ok(crc),
            // Several extents or holes: `crc32c_combine` costs tens of microseconds per extent
            // (more than checksumming a small record again), so the buffer, every extent of
            // which was just checked, is checksummed once more instead.
            _ => Ok(crc32c::crc32c(buf)),
        }
    }

    /// Step 1 of `read`: under the lock, where each extent of the range is; the DRAM records
    /// are pinned.
    fn locate_extents(
        &self,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        length: u64,
    ) -> Result<(Vec<DramRead>, Vec<SsdRead>), ReadError> {
        let mut ssd_reads = Vec::new();
        // DRAM ranges are copied after the lock is released; the records are pinned meanwhile.
        let mut dram_reads = Vec::new();
        let mut state = self.inner.state.lock();
        let entry = state.epochs.get(&epoch).ok_or(ReadError::UnknownEpoch(epoch))?;
        if !phase_is_live(entry.phase) {
            return Err(ReadError::EpochGone { epoch, phase: entry.phase });
        }
        for (file_offset, extent) in state.index.range(epoch, file, offset, length) {
            let at = (file_offset - offset) as usize;
            let target = at..at + extent.length as usize;
            let info = state.records.get(&extent.record).expect("indexed record has no location");
            if info.zeros {
                // `buf` starts zeroed; nothing is stored for the run.
                continue;
            }
            // Every extent is checked against its whole record's write-time CRC, so the record
            // is read whole even when only part of it is asked for.
            let record = RecordRef {
                sequence: extent.record,
                epoch,
                file,
                offset: file_offset - extent.skip,
                payload_bytes: info.payload_bytes as u64,
                skip: extent.skip,
            };
            match (info.ring_position(), info.location) {
                (Some(position), _) => {
                    let start = position + HEADER_BYTES as u64 + extent.skip;
                    assert!(
                        state.ring.holds(start, extent.length),
                        "indexed DRAM record was released"
                    );
                    let at = dram_index(&state, position);
                    state.dram[at].readers += 1;
                    dram_reads.push(DramRead { position, record, target });
                }
                (None, Location::Ssd { segment, offset: record_offset }) => {
                    let file = state
                        .segments
                        .get(&segment)
                        .expect("record in unknown segment")
                        .file
                        .clone();
                    ssd_reads.push(SsdRead { segment, file, record_offset, record, target });
                }
                (None, Location::Dram { .. }) => unreachable!("a DRAM record is in the ring"),
            }
        }
        Ok((dram_reads, ssd_reads))
    }

    /// Step 2 of `read`: checks each pinned DRAM record against its write-time CRC and copies
    /// the extent into `buf` without the lock, then unpins them (the ring tail may pass them
    /// again). A record that fails its CRC fails the read: no wrong bytes are returned.
    #[allow(clippy::type_complexity)]
    fn copy_dram_extents(
        &self,
        dram_reads: &[DramRead],
        buf: &mut [u8],
    ) -> Result<Vec<(std::ops::Range<usize>, u32)>, ReadError> {
        let mut result = Ok(Vec::with_capacity(dram_reads.len()));
        for DramRead { position, record, target } in dram_reads {
            // SAFETY: the record is published (its header and payload are never written again)
            // and pinned (`readers` > 0), so the ring tail cannot pass it and its range is not
            // reused.
            let header = unsafe { self.inner.arena.slice(*position, HEADER_BYTES as u64) };
            // SAFETY: as above.
            let payload = unsafe {
                self.inner.arena.slice(position + HEADER_BYTES as u64, record.payload_bytes)
            };
            let location = || format!("DRAM ring at {position}");
            match record.check(header, payload, target.len(), location) {
                Ok(crc) => {
                    if let Ok(pieces) = &mut result {
                        pieces.push((target.clone(), crc));
                    }
                }
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
            let from = record.skip as usize;
            buf[target.clone()].copy_from_slice(&payload[from..from + target.len()]);
        }
        if !dram_reads.is_empty() {
            let mut state = self.inner.state.lock();
            for DramRead { position, .. } in dram_reads {
                let at = dram_index(&state, *position);
                assert!(state.dram[at].readers > 0, "DRAM reader count underflow");
                state.dram[at].readers -= 1;
            }
            advance_tail(&mut state);
            drop(state);
            self.inner.space.notify_all();
        }
        result
    }

    /// Every epoch the store knows, in order.
    pub fn epochs(&self) -> Vec<EpochInfo> {
        let state = self.inner.state.lock();
        state.epochs.iter().map(|(&epoch, entry)| epoch_info(&state, epoch, entry)).collect()
    }

    /// One epoch, if the store knows it (in any phase).
    pub fn epoch(&self, epoch: EpochId) -> Option<EpochInfo> {
        let state = self.inner.state.lock();
        state.epochs.get(&epoch).map(|entry| epoch_info(&state, epoch, entry))
    }

    /// The files of an epoch in file-id order (files with data, and named files).
    pub fn files(&self, epoch: EpochId) -> Result<Vec<FileInfo>, ReadError> {
        let state = self.inner.state.lock();
        let entry = state.epochs.get(&epoch).ok_or(ReadError::UnknownEpoch(epoch))?;
        if !phase_is_live(entry.phase) {
            return Err(ReadError::EpochGone { epoch, phase: entry.phase });
        }
        let mut ids: BTreeSet<FileId> = entry.names.keys().copied().collect();
        if let Some(files) = state.index.epoch(epoch) {
            ids.extend(files.keys().copied());
        }
        Ok(ids.into_iter().map(|file| file_info(&state, epoch, file)).collect())
    }

    /// One file of one epoch, if the store has it.
    pub fn stat(&self, epoch: EpochId, file: FileId) -> Option<FileInfo> {
        let state = self.inner.state.lock();
        file_exists(&state, epoch, file).then(|| file_info(&state, epoch, file))
    }

    /// Whether (`epoch`, `file`) exists: named or written, in a live epoch. What [`Store::stat`]
    /// answers, without building the answer (callers check this on every write).
    pub fn has_file(&self, epoch: EpochId, file: FileId) -> bool {
        file_exists(&self.inner.state.lock(), epoch, file)
    }

    /// The extents of a range of epochs (optionally one file), in (epoch, file, offset) order:
    /// what a drain walks.
    pub fn extents(
        &self,
        epochs: impl RangeBounds<EpochId>,
        file: Option<FileId>,
    ) -> Vec<ExtentInfo> {
        let state = self.inner.state.lock();
        let mut out = Vec::new();
        for (epoch, files) in state.index.epochs_in(epochs) {
            for (&file_id, extents) in files {
                if file.is_some_and(|wanted| wanted != file_id) {
                    continue;
                }
                for (&offset, extent) in extents {
                    let tier = match state.records[&extent.record].location {
                        Location::Dram { .. } => Tier::Dram,
                        Location::Ssd { segment, .. } => Tier::Ssd(segment),
                    };
                    out.push(ExtentInfo {
                        epoch,
                        file: file_id,
                        offset,
                        length: extent.length,
                        tier,
                    });
                }
            }
        }
        out
    }

    /// Marks a committed epoch drained (it is safely on the PFS): its bytes become dead.
    pub fn mark_drained(&self, epoch: EpochId) -> Result<(), LifecycleError> {
        self.inner.retire(epoch, EpochPhase::Drained)
    }

    /// Deletes an epoch in any state but mid-commit: its bytes become dead.
    pub fn delete_epoch(&self, epoch: EpochId) -> Result<(), LifecycleError> {
        self.inner.retire(epoch, EpochPhase::Deleted)
    }

    /// Runs one GC round now: deletes dead segments, then compacts if free space is low.
    /// The flusher does the same in the background.
    pub fn gc(&self) -> Result<GcReport, SyncError> {
        self.inner.gc(false).map_err(SyncError::Failed)
    }

    /// Like [`Store::gc`] but compacts every segment below `gc_live_percent_max` regardless of
    /// free space (operators and tests).
    pub fn compact_now(&self) -> Result<GcReport, SyncError> {
        self.inner.gc(true).map_err(SyncError::Failed)
    }

    /// Bytes a new write could still take (SSD capacity minus everything placed or pending).
    pub fn free_bytes(&self) -> u64 {
        let state = self.inner.state.lock();
        self.inner.free_bytes(&state)
    }

    /// Waits until `bytes` are free or `timeout` passes (GC is nudged meanwhile). Returns
    /// whether the space is there.
    pub fn wait_for_space(&self, bytes: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.inner.state.lock();
        let has_room = |state: &mut State| {
            self.inner.free_bytes(state) >= bytes
                && (!state.disk_full || self.inner.disk_has_room(state, bytes))
        };
        loop {
            if has_room(&mut state) {
                return true;
            }
            state.gc_wanted = true;
            self.inner.flusher.notify_one();
            // A full file system can get space back from outside the store: look again at the
            // flusher's pace.
            let poll = Instant::now() + Duration::from_millis(self.inner.knobs.flusher_interval_ms);
            if self.inner.space.wait_until(&mut state, deadline.min(poll)).timed_out()
                && Instant::now() >= deadline
            {
                return has_room(&mut state);
            }
        }
    }

    /// Sets (Some) or clears (None, back to the `stream_quota_bytes` default) a stream's quota.
    pub fn set_stream_quota(&self, stream: StreamKey, quota_bytes: Option<u64>) {
        let mut state = self.inner.state.lock();
        match quota_bytes {
            Some(bytes) => state.stream_quota.insert(stream, bytes),
            None => state.stream_quota.remove(&stream),
        };
    }

    /// Live bytes (DRAM + SSD) held by a stream, as counted against its quota.
    pub fn stream_usage_bytes(&self, stream: StreamKey) -> u64 {
        self.inner.state.lock().stream_usage.get(&stream).copied().unwrap_or(0)
    }

    /// Fault-injection seam for tests: flips one bit of the stored byte at `offset` of
    /// (`epoch`, `file`) where the index says it lives (DRAM ring or SSD segment) and leaves
    /// its record CRC alone, as a memory or disk fault would. Returns where the byte was, or
    /// `None` if no record holds it. Call it with no read of the record in flight. Nothing but
    /// tests calls it.
    #[doc(hidden)]
    pub fn inject_corruption(
        &self,
        epoch: EpochId,
        file: FileId,
        offset: u64,
    ) -> std::io::Result<Option<String>> {
        let mut state = self.inner.state.lock();
        let Some((_, extent)) = state.index.range(epoch, file, offset, 1).into_iter().next() else {
            return Ok(None);
        };
        let info = state.records.get_mut(&extent.record).expect("indexed record has no location");
        if info.zeros {
            // A run of zeros stores no bytes to damage.
            return Ok(None);
        }
        // The damaged copy is the one reads must meet: an SSD record's clean ring copy is
        // dropped (as if evicted), so reads go to the segment.
        info.cached = None;
        let at_in_record = HEADER_BYTES as u64 + extent.skip;
        match info.location {
            Location::Dram { position } => {
                // SAFETY: the record is published and, the state lock being held, the ring
                // tail cannot pass it; the caller has no read of it in flight.
                let byte = unsafe { self.inner.arena.slice_mut(position + at_in_record, 1) };
                byte[0] ^= 0x01;
                Ok(Some(format!("DRAM ring at {}", position + at_in_record)))
            }
            Location::Ssd { segment, offset: record_offset } => {
                let segment_file =
                    state.segments.get(&segment).expect("record in unknown segment").file.clone();
                let mut byte = [0u8; 1];
                segment_file.read_at(record_offset + at_in_record, &mut byte)?;
                byte[0] ^= 0x01;
                segment_file.write_at(record_offset + at_in_record, &byte)?;
                Ok(Some(format!("segment {segment} at {}", record_offset + at_in_record)))
            }
        }
    }

    /// Drops every clean DRAM copy of a record that is on SSD: reads then go to the segments,
    /// and the ring space comes back as the tail reaches it. Returns the bytes dropped.
    pub fn evict_cached(&self) -> u64 {
        let mut state = self.inner.state.lock();
        let state = &mut *state;
        let dropped = state.dram_cached_bytes;
        for record in state.dram.iter_mut().filter(|r| r.status == DramStatus::Spilled) {
            record.status = DramStatus::Dead;
            if let Some(info) = state.records.get_mut(&record.sequence) {
                info.cached = None;
            }
        }
        state.dram_cached_bytes = 0;
        advance_tail(state);
        #[cfg(feature = "strict_assertions")]
        check_invariants(state);
        self.inner.space.notify_all();
        dropped
    }

    pub fn stats(&self) -> StoreStats {
        let state = self.inner.state.lock();
        let live: u64 =
            state.segments.iter().map(|(&id, s)| segment_live_bytes(id, s, &state.epochs)).sum();
        let c = &state.counters;
        StoreStats {
            dram_bytes_max: state.ring.capacity(),
            dram_used_bytes: state
                .dram
                .iter()
                .filter(|r| !matches!(r.status, DramStatus::Spilled | DramStatus::Dead))
                .map(|r| r.bytes)
                .sum(),
            dram_cached_bytes: state.dram_cached_bytes,
            ssd_bytes_max: self.inner.knobs.ssd_bytes_max,
            ssd_used_bytes: state.ssd_used_bytes,
            ssd_live_bytes: live,
            free_bytes: self.inner.free_bytes(&state),
            segments: state.segments.len() as u64,
            segments_created: c.segments_created,
            segments_deleted: c.segments_deleted,
            user_payload_bytes: c.user_payload_bytes,
            user_bytes_to_ssd: c.user_bytes_to_ssd,
            write_through_records: c.write_through_records,
            compaction_bytes: c.compaction_bytes,
            metadata_bytes: c.metadata_bytes,
            ssd_bytes_written: c.ssd_bytes_written,
            ssd_direct_bytes_written: self.inner.direct.direct_bytes_written(),
            host_write_amplification: if c.user_bytes_to_ssd == 0 {
                1.0
            } else {
                c.ssd_bytes_written as f64 / c.user_bytes_to_ssd as f64
            },
            commits: c.commits,
            commit_rounds: c.commit_rounds,
            fsyncs: c.fsyncs,
            fsyncs_shared: c.fsyncs_shared,
            sync_behind_rounds: c.sync_behind_rounds,
            write_hints: state.hints,
            recovery: state.recovery.clone(),
        }
    }

    /// Runs one flusher round in the caller's thread (what the background flusher does when it
    /// wakes). For stores opened with [`FlusherMode::Manual`]; harmless otherwise.
    pub fn step_flusher(&self) {
        let _ = self.inner.flusher_round();
    }

    /// Makes memory-level commits durable, spills everything in DRAM (open epochs too) and
    /// fsyncs every segment.
    pub fn sync(&self) -> Result<(), SyncError> {
        let in_memory: BTreeSet<EpochId> = {
            let state = self.inner.state.lock();
            state
                .epochs
                .iter()
                .filter(|(_, e)| e.phase == EpochPhase::CommittedInMemory)
                .map(|(&epoch, _)| epoch)
                .collect()
        };
        if !in_memory.is_empty() {
            self.inner.group_commit(in_memory).map_err(|e| match e {
                CommitError::NoSpace(reason) => SyncError::NoSpace(reason),
                other => SyncError::Failed(other.to_string()),
            })?;
        }
        self.inner.spill_existing(None).map_err(|reason| self.spill_failure(reason))?;
        self.inner.sync_dirty().map_err(SyncError::Failed)?;
        self.inner.write_log.flush();
        Ok(())
    }

    /// Makes every record of `epoch` written before the call durable without sealing it (the
    /// mount's fsync): only that epoch's DRAM records are spilled, other epochs stay in DRAM,
    /// and the fsync round is shared with every concurrent sync and commit (`sync_dirty`).
    pub fn sync_epoch(&self, epoch: EpochId) -> Result<(), SyncError> {
        let epochs = BTreeSet::from([epoch]);
        self.inner.spill_existing(Some(&epochs)).map_err(|reason| self.spill_failure(reason))?;
        self.inner.sync_dirty().map_err(SyncError::Failed)?;
        self.inner.write_log.flush();
        Ok(())
    }

    /// A sync's spill that stopped: the store failed, or (otherwise) space ran out.
    fn spill_failure(&self, reason: String) -> SyncError {
        if self.inner.state.lock().failed.is_some() {
            SyncError::Failed(reason)
        } else {
            SyncError::NoSpace(reason)
        }
    }

    /// Clean shutdown: [`Store::sync`], then stop the flusher. Dropping a store without
    /// `close` is a crash as far as DRAM contents go.
    pub fn close(mut self) -> Result<(), SyncError> {
        let result = self.sync();
        self.stop_flusher();
        result
    }

    fn stop_flusher(&mut self) {
        self.inner.state.lock().shutdown = true;
        self.inner.flusher.notify_all();
        self.inner.syncer.notify_all();
        self.inner.space.notify_all();
        for handle in [self.flusher.take(), self.syncer.take()].into_iter().flatten() {
            let _ = handle.join();
        }
    }

    /// Checks every bookkeeping invariant (tests call it; strict builds call it more often).
    pub fn check_invariants(&self) {
        let state = self.inner.state.lock();
        check_invariants(&state);
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop_flusher();
    }
}

fn epoch_info(state: &State, epoch: EpochId, entry: &EpochEntry) -> EpochInfo {
    EpochInfo {
        epoch,
        phase: entry.phase,
        files: state.index.epoch(epoch).map_or(0, |files| files.len()),
        data_records: entry.data_records,
        payload_bytes: entry.payload_bytes,
        recovered_uncommitted: entry.recovered_uncommitted,
    }
}

fn file_exists(state: &State, epoch: EpochId, file: FileId) -> bool {
    state.epochs.get(&epoch).is_some_and(|entry| {
        phase_is_live(entry.phase)
            && (entry.names.contains_key(&file) || state.index.file(epoch, file).is_some())
    })
}

fn file_info(state: &State, epoch: EpochId, file: FileId) -> FileInfo {
    let extents = state.index.file(epoch, file);
    FileInfo {
        epoch,
        file,
        name: state.epochs.get(&epoch).and_then(|e| e.names.get(&file).cloned()),
        size_bytes: extents.map_or(0, Index::file_size),
        extents: extents.map_or(0, |e| e.len()),
    }
}

/// The record an extent of a read comes from: what its check needs and what an error names.
struct RecordRef {
    sequence: u64,
    epoch: EpochId,
    file: FileId,
    /// File offset of the record's first payload byte.
    offset: u64,
    payload_bytes: u64,
    /// Where the extent starts in the record's payload.
    skip: u64,
}

impl RecordRef {
    /// Checks a record's header (this record) and its payload against the record CRC, which
    /// was sealed from the write-time CRC, and returns the CRC32C of the `length` bytes the
    /// extent reads (from `skip`): the record's own CRC for a whole record, else the CRC of
    /// the part, taken in a second pass over it (cheaper than `crc32c_combine`).
    /// `location` names where the copy was read.
    fn check(
        &self,
        header: &[u8],
        payload: &[u8],
        length: usize,
        location: impl Fn() -> String,
    ) -> Result<u32, ReadError> {
        let mismatch = |detail: String| ReadError::ChecksumMismatch {
            epoch: self.epoch,
            file: self.file,
            offset: self.offset,
            length: self.payload_bytes,
            location: location(),
            detail,
        };
        let decoded = RecordHeader::decode(header).map_err(|d| mismatch(d.to_string()))?;
        if decoded.sequence != self.sequence {
            return Err(mismatch(format!(
                "expected record {}, found record {}",
                self.sequence, decoded.sequence
            )));
        }
        let whole = crc32c::crc32c(payload);
        let stored = u32::from_le_bytes(header[60..64].try_into().expect("4 bytes"));
        if record_crc(header, whole) != stored {
            return Err(mismatch(format!("record {} fails its record CRC", self.sequence)));
        }
        if length == payload.len() {
            return Ok(whole);
        }
        let from = self.skip as usize;
        Ok(crc32c::crc32c(&payload[from..from + length]))
    }
}

/// One extent of a read that is in the DRAM ring: pinned from `Store::read`'s lookup until
/// its bytes are checked and copied out.
struct DramRead {
    /// Ring position of the record (what pins it).
    position: u64,
    record: RecordRef,
    /// Where the extent's bytes go in the caller's buffer.
    target: std::ops::Range<usize>,
}

/// One extent of a read that is in an SSD segment.
struct SsdRead {
    segment: SegmentId,
    file: Arc<dyn SegmentFile>,
    /// Segment offset of the record's header.
    record_offset: u64,
    record: RecordRef,
    /// Where the extent's bytes go in the caller's buffer.
    target: std::ops::Range<usize>,
}

/// Step 3 of `Store::read`: reads one SSD extent's record whole (header and payload) and
/// checks it (sequence and record CRC) before its bytes reach `buf`; returns the extent's
/// range in `buf` and its CRC32C.
fn read_ssd_extent(
    read: SsdRead,
    buf: &mut [u8],
) -> Result<(std::ops::Range<usize>, u32), ReadError> {
    let SsdRead { segment, file, record_offset, record, target } = read;
    let io = |source| ReadError::Io { segment, offset: record_offset, source };
    let location = || format!("segment {segment} at offset {record_offset}");
    let mut header = [0u8; HEADER_BYTES];
    if record.skip == 0 && target.len() as u64 == record.payload_bytes {
        // The whole record (what drains read): header and payload in one read, straight into
        // the caller's buffer, which is checked before the read returns.
        file.read_two_at(record_offset, &mut header, &mut buf[target.clone()]).map_err(io)?;
        let crc = record.check(&header, &buf[target.clone()], target.len(), location)?;
        Ok((target, crc))
    } else {
        let mut payload = vec![0u8; record.payload_bytes as usize];
        file.read_two_at(record_offset, &mut header, &mut payload).map_err(io)?;
        let crc = record.check(&header, &payload, target.len(), location)?;
        let from = record.skip as usize;
        buf[target.clone()].copy_from_slice(&payload[from..from + target.len()]);
        Ok((target, crc))
    }
}

/// Live bytes of a segment: records of live epochs, plus tombstones still needed (their epoch
/// has bytes in some other segment that a crash could otherwise resurrect).
pub(crate) fn segment_live_bytes(
    id: SegmentId,
    segment: &Segment,
    epochs: &BTreeMap<EpochId, EpochEntry>,
) -> u64 {
    let mut live = 0;
    for (epoch, &bytes) in &segment.epoch_bytes {
        if epochs.get(epoch).is_some_and(|e| phase_is_live(e.phase)) {
            live += bytes;
        }
    }
    for (epoch, &bytes) in &segment.tombstones {
        if epochs.get(epoch).is_some_and(|e| e.segments.iter().any(|&s| s != id)) {
            live += bytes;
        }
    }
    assert!(live <= segment.length, "segment {id} live {live} > length {}", segment.length);
    live
}

/// Whether some SSD bytes are dead (drained or deleted epochs), so a GC round could free space.
fn has_dead_bytes(state: &State) -> bool {
    state.ssd_used_bytes
        > state
            .segments
            .iter()
            .map(|(&id, s)| segment_live_bytes(id, s, &state.epochs))
            .sum::<u64>()
}

pub(crate) fn check_invariants(state: &State) {
    check_dram_invariants(state);
    let used: u64 = state.segments.values().map(|s| s.length).sum();
    assert_eq!(used, state.ssd_used_bytes, "ssd_used_bytes disagrees with segment lengths");
    for (&id, segment) in &state.segments {
        let accounted: u64 =
            segment.epoch_bytes.values().sum::<u64>() + segment.tombstones.values().sum::<u64>();
        assert!(
            accounted <= segment.length,
            "segment {id} accounts {accounted} > length {}",
            segment.length
        );
        assert_eq!(
            segment.inflight as usize,
            segment.inflight_at.len(),
            "segment {id}: in-flight count and offsets disagree"
        );
        assert!(
            segment.synced_length <= segment.written_frontier(),
            "segment {id} claims sync to {} beyond its written frontier {}",
            segment.synced_length,
            segment.written_frontier()
        );
        for epoch in segment.epoch_bytes.keys() {
            if let Some(entry) = state.epochs.get(epoch) {
                assert!(entry.segments.contains(&id), "epoch {epoch} misses segment {id}");
            }
        }
    }
    let mut reserved_records: BTreeMap<EpochId, u64> = BTreeMap::new();
    for record in state.dram.iter().filter(|r| r.status == DramStatus::Reserved) {
        *reserved_records.entry(record.epoch).or_default() += 1;
    }
    for (&epoch, entry) in &state.epochs {
        check_grant_invariants(epoch, entry);
        if entry.inflight_writes == 0 && !reserved_records.contains_key(&epoch) {
            assert_eq!(
                entry.admitted_payload_bytes, 0,
                "epoch {epoch} holds admitted payload bytes without a write in flight"
            );
        }
        for segment in &entry.segments {
            assert!(
                state.segments.contains_key(segment),
                "epoch {epoch} names deleted segment {segment}"
            );
        }
        if let Some(files) = state.index.epoch(epoch) {
            assert!(phase_is_live(entry.phase), "retired epoch {epoch} still indexed");
            for extents in files.values() {
                Index::check_file(extents);
                for extent in extents.values() {
                    let info = state.records.get(&extent.record).expect("indexed record missing");
                    assert_eq!(info.epoch, epoch);
                    assert!(
                        info.zeros || extent.skip + extent.length <= info.payload_bytes as u64,
                        "extent of record {} reaches past its payload",
                        extent.record
                    );
                }
            }
        }
    }
}

/// The ring's records do not overlap, the Ready and cached byte counts match them, and every
/// clean copy an SSD record names is its Spilled record.
fn check_dram_invariants(state: &State) {
    assert!(state.ring.used() <= state.ring.capacity());
    let mut previous = None;
    let (mut ready, mut cached) = (0, 0);
    for record in &state.dram {
        if let Some(end) = previous {
            assert!(record.position >= end, "DRAM records overlap at {}", record.position);
        }
        previous = Some(record.position + record.bytes);
        match record.status {
            DramStatus::Ready => ready += record.bytes,
            DramStatus::Spilled => cached += record.bytes,
            _ => {}
        }
    }
    assert_eq!(ready, state.dram_ready_bytes, "dram_ready_bytes disagrees with Ready records");
    assert_eq!(cached, state.dram_cached_bytes, "dram_cached_bytes disagrees with Spilled records");
    for (&sequence, info) in &state.records {
        if let Some(position) = info.cached {
            assert!(
                matches!(info.location, Location::Ssd { .. }),
                "record {sequence}: cached DRAM"
            );
            let record = &state.dram[dram_index(state, position)];
            assert_eq!(
                (record.status, record.sequence),
                (DramStatus::Spilled, sequence),
                "record {sequence}: its cached copy at {position} is not its Spilled record"
            );
        }
    }
}

/// A grant is kept only for live or drained epochs, in the canonical form `grant_epoch` gives
/// it (id lists sorted, unique, bounded) and never names the metadata stream.
fn check_grant_invariants(epoch: EpochId, entry: &EpochEntry) {
    let Some(grant) = &entry.grant else { return };
    assert_ne!(entry.phase, EpochPhase::Deleted, "deleted epoch {epoch} keeps a grant");
    for ids in [&grant.allowed_uids, &grant.allowed_gids] {
        assert!(ids.len() <= spillway_types::GRANT_ALLOWED_IDS_MAX, "epoch {epoch}: grant ids");
        assert!(ids.windows(2).all(|p| p[0] < p[1]), "epoch {epoch}: grant ids not canonical");
    }
    assert_ne!(grant.stream, Some(META_STREAM), "epoch {epoch} granted the metadata stream");
}

impl Inner {
    pub(crate) fn free_bytes(&self, state: &State) -> u64 {
        let capacity = self.knobs.ssd_bytes_max - self.knobs.segment_bytes_max;
        capacity
            .saturating_sub(state.ssd_used_bytes + state.dram_unplaced_bytes + state.reserved_bytes)
    }

    /// After an ENOSPC: whether the file system has room again for `needed` bytes plus a new
    /// segment's first chunk and the reserve; clears `disk_full` if so. Unknown free space counts as room
    /// (the next append finds out).
    pub(crate) fn disk_has_room(&self, state: &mut State, needed: u64) -> bool {
        let wanted = needed
            .saturating_add(self.first_chunk_bytes())
            .saturating_add(if state.reserve_held { 0 } else { self.knobs.ssd_reserve_bytes });
        let room = match self.storage.available_bytes() {
            Ok(Some(available)) => available >= wanted,
            Ok(None) | Err(_) => true,
        };
        if room {
            state.disk_full = false;
        }
        room
    }

    /// What a new segment reserves on disk at creation.
    pub(crate) fn first_chunk_bytes(&self) -> u64 {
        PREALLOCATE_CHUNK_BYTES.min(self.knobs.segment_bytes_max)
    }

    /// Frees the reserve file so metadata can still be written on a full file system. `true`
    /// if there was one to free.
    pub(crate) fn release_reserve(&self, state: &mut State) -> bool {
        if !state.reserve_held {
            return false;
        }
        state.reserve_held = false;
        match self.storage.remove(RESERVE_FILE_NAME) {
            Ok(()) => {
                tracing::warn!(
                    "the SSD directory's file system is full; released the reserve file for metadata"
                );
                true
            }
            Err(error) => {
                tracing::warn!(%error, "removing the SSD reserve file failed");
                false
            }
        }
    }

    /// Re-creates the reserve file once the file system has room for it again (the flusher
    /// calls this).
    pub(crate) fn restore_reserve(&self) {
        let mut state = self.state.lock();
        if state.reserve_held || self.knobs.ssd_reserve_bytes == 0 || state.failed.is_some() {
            return;
        }
        if state.disk_full && !self.disk_has_room(&mut state, 0) {
            return;
        }
        let wanted = self.knobs.ssd_reserve_bytes.saturating_add(self.first_chunk_bytes());
        if let Ok(Some(available)) = self.storage.available_bytes() {
            if available < wanted {
                return;
            }
        }
        state.reserve_held = take_reserve(&self.knobs, self.storage.as_ref());
    }

    pub(crate) fn failed(state: &State) -> Result<(), String> {
        match &state.failed {
            Some(reason) => Err(reason.clone()),
            None => Ok(()),
        }
    }

    pub(crate) fn fail(&self, state: &mut State, reason: String) {
        if state.failed.is_none() {
            tracing::error!(%reason, "store failed; refusing further work");
            state.failed = Some(reason);
        }
        self.space.notify_all();
        self.commit.notify_all();
    }

    /// Admits a write of `needed` record bytes for `Store::write`: [`Inner::admit_locked`],
    /// retried once after a GC round if dead data could make room, and counted as in flight on
    /// its epoch (commits and deletes wait for it) until `write` ends it.
    pub(crate) fn admit_write(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        needed: u64,
        payload_bytes: u64,
    ) -> Result<(), WriteError> {
        let mut tried_gc = false;
        loop {
            let mut state = self.state.lock();
            match self.admit_locked(&mut state, stream, epoch, needed, payload_bytes) {
                Ok(()) => {
                    state
                        .epochs
                        .get_mut(&epoch)
                        .expect("admitted epoch vanished")
                        .inflight_writes += 1;
                    return Ok(());
                }
                Err(WriteError::OutOfSpace { limit: SpaceLimit::Ssd, .. })
                    if !tried_gc && has_dead_bytes(&state) =>
                {
                    drop(state);
                    tried_gc = true;
                    if let Err(reason) = self.gc(false) {
                        if self.state.lock().failed.is_some() {
                            return Err(WriteError::Failed(reason));
                        }
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Checks the store, the epoch (created if new, must be open), its granted capacity, the
    /// SSD capacity and the stream quota, then reserves `needed` record bytes of capacity for
    /// the caller's records and admits its `payload_bytes` against the grant.
    pub(crate) fn admit_locked(
        &self,
        state: &mut State,
        stream: StreamKey,
        epoch: EpochId,
        needed: u64,
        payload_bytes: u64,
    ) -> Result<(), WriteError> {
        if let Some(reason) = &state.failed {
            return Err(WriteError::Failed(reason.clone()));
        }
        let entry = state.epochs.entry(epoch).or_insert_with(EpochEntry::new);
        if entry.phase != EpochPhase::Open {
            return Err(WriteError::EpochNotOpen { epoch, phase: entry.phase });
        }
        check_granted_capacity(epoch, entry, payload_bytes)?;
        if state.disk_full && !self.disk_has_room(state, needed) {
            let free_bytes = self.storage.available_bytes().ok().flatten().unwrap_or(0);
            return Err(self.file_system_full(stream, needed, free_bytes));
        }
        let free = self.free_bytes(state);
        if needed > free {
            return Err(WriteError::OutOfSpace {
                stream,
                limit: SpaceLimit::Ssd,
                needed_bytes: needed,
                free_bytes: free,
                limit_bytes: self.knobs.ssd_bytes_max,
            });
        }
        let quota =
            state.stream_quota.get(&stream).copied().unwrap_or(self.knobs.stream_quota_bytes);
        let usage = state.stream_usage.get(&stream).copied().unwrap_or(0);
        if quota > 0 && usage + needed > quota {
            return Err(WriteError::OutOfSpace {
                stream,
                limit: SpaceLimit::StreamQuota,
                needed_bytes: needed,
                free_bytes: quota.saturating_sub(usage),
                limit_bytes: quota,
            });
        }
        state.reserved_bytes += needed;
        *state.stream_usage.entry(stream).or_default() += needed;
        state.epochs.get_mut(&epoch).expect("admitted epoch vanished").admitted_payload_bytes +=
            payload_bytes;
        Ok(())
    }

    /// The SSD file system (not `ssd_bytes_max`) refused `needed_bytes` for `stream`.
    fn file_system_full(
        &self,
        stream: StreamKey,
        needed_bytes: u64,
        free_bytes: u64,
    ) -> WriteError {
        WriteError::OutOfSpace {
            stream,
            limit: SpaceLimit::FileSystem,
            needed_bytes,
            free_bytes,
            limit_bytes: self.knobs.ssd_bytes_max,
        }
    }

    /// Reserves ring space (waiting for the flusher if DRAM is full), copies the payload outside
    /// the lock, then publishes the record (sequence, header with the record CRC sealed from
    /// `piece_crc`, the write-time CRC32C of `piece`, index). `zeros`: `piece` is the payload
    /// of a `Zeros` record of that run (never written through: it is 8 bytes).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_piece(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        piece: &[u8],
        piece_crc: u32,
        zeros: Option<u64>,
    ) -> Result<(), WriteError> {
        debug_assert!(zeros.is_none() || piece.len() < WRITE_THROUGH_PAYLOAD_BYTES_MIN as usize);
        let bytes = record_bytes(piece.len() as u64);
        let deadline = Instant::now() + Duration::from_millis(self.knobs.dram_wait_ms_max);
        let position = {
            let mut state = self.state.lock();
            loop {
                if let Some(reason) = &state.failed {
                    return Err(WriteError::Failed(reason.clone()));
                }
                // Clean cached copies make room before anything else does.
                advance_tail(&mut state);
                if state.ring.used() + bytes > self.high_watermark_bytes(&state)
                    && piece.len() as u64 >= WRITE_THROUGH_PAYLOAD_BYTES_MIN
                {
                    // DRAM is above its high watermark: the flusher is busy spilling it. Rather
                    // than copy into the ring and wait, this writer appends its record to the
                    // SSD log itself (write-through): one copy fewer, and every writer thread
                    // spills in parallel with the flusher.
                    self.flusher.notify_one();
                    let target = (stream, epoch, file, offset);
                    return self.write_through(state, target, piece, piece_crc);
                }
                if let Some(position) =
                    reserve_dram_record(&mut state, bytes, stream, epoch, DramStatus::Writing)
                {
                    break position;
                }
                if self.flusher_mode == FlusherMode::Manual {
                    // No flusher thread: run its round here, deterministically.
                    let used = state.ring.used();
                    drop(state);
                    let round = self.flusher_round();
                    state = self.state.lock();
                    if matches!(round, Round::Shutdown) || state.ring.used() >= used {
                        return Err(WriteError::DramStalled { waited_ms: 0 });
                    }
                    continue;
                }
                self.flusher.notify_one();
                if self.space.wait_until(&mut state, deadline).timed_out() {
                    return Err(WriteError::DramStalled { waited_ms: self.knobs.dram_wait_ms_max });
                }
            }
        };
        // SAFETY: the range was just reserved by this thread and is not published yet (status
        // Writing): nobody else reads or writes it, and the tail cannot pass it.
        unsafe { self.arena.slice_mut(position + HEADER_BYTES as u64, piece.len() as u64) }
            .copy_from_slice(piece);
        let mut state = self.state.lock();
        publish_dram_record(
            &mut state,
            &self.arena,
            position,
            DramStatus::Writing,
            stream,
            epoch,
            file,
            offset,
            piece.len(),
            piece_crc,
            zeros,
        );
        self.wake_flusher_if_due(&state);
        Ok(())
    }

    /// Ends a write admitted by [`Inner::admit_write`]: returns the `unused_bytes` of record
    /// capacity and the `unpublished_payload` bytes it did not use, and lets commits and
    /// deletes waiting for it go on.
    pub(crate) fn end_write(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        unused_bytes: u64,
        unpublished_payload: u64,
    ) {
        let mut state = self.state.lock();
        state.reserved_bytes -= unused_bytes;
        *state.stream_usage.entry(stream).or_default() -= unused_bytes;
        unadmit_payload(&mut state, epoch, unpublished_payload);
        let entry = state.epochs.get_mut(&epoch).expect("epoch of an admitted write vanished");
        assert!(entry.inflight_writes > 0);
        entry.inflight_writes -= 1;
        drop(state);
        self.space.notify_all();
    }

    /// Wakes the flusher if DRAM use is above the high watermark or write-behind has a batch.
    pub(crate) fn wake_flusher_if_due(&self, state: &State) {
        if state.ring.used() > self.high_watermark_bytes(state) || self.write_behind_due(state) {
            self.flusher.notify_one();
        }
    }

    /// `store.ssd_write_behind` is on and a spill batch of Ready records is waiting.
    pub(crate) fn write_behind_due(&self, state: &State) -> bool {
        self.knobs.ssd_write_behind && state.dram_ready_bytes >= self.knobs.flusher_batch_bytes
    }

    pub(crate) fn high_watermark_bytes(&self, state: &State) -> u64 {
        state.ring.capacity() / 100 * self.knobs.dram_high_watermark_percent
    }

    /// Appends one data record straight to its stream's segment (no DRAM copy): place it under
    /// the lock, write payload and padding outside it, then, under the lock again, take the
    /// next sequence number, write the header (whose record CRC seals the payload) and publish
    /// the record in the index. Until the header is written the record is invisible and, after
    /// a crash, a torn tail; the placement holds the segment's written frontier back, so no
    /// fsync claims it durable early (see `commit_round`).
    /// `target`: stream, epoch, file, offset; `payload_crc`: the write-time CRC32C of `piece`.
    pub(crate) fn write_through(
        &self,
        mut state: parking_lot::MutexGuard<'_, State>,
        target: (StreamKey, EpochId, FileId, u64),
        piece: &[u8],
        payload_crc: u32,
    ) -> Result<(), WriteError> {
        let (stream, epoch, file, offset) = target;
        let bytes = record_bytes(piece.len() as u64);
        let (segment_id, at, segment_file) =
            self.place_write_through(&mut state, stream, epoch, bytes)?;
        drop(state);

        let mut result =
            write_payload_and_padding(&self.direct, segment_file.as_ref(), at, piece, bytes);

        let mut state = self.state.lock();
        let header = next_data_header(&mut state, stream, epoch, file, offset, piece.len());
        let sequence = header.sequence;
        let mut encoded = [0u8; HEADER_BYTES];
        header.encode(0, &mut encoded);
        let crc = record_crc(&encoded, payload_crc);
        encoded[60..64].copy_from_slice(&crc.to_le_bytes());
        if result.is_ok() {
            result = segment_file.write_at(at, &encoded);
        }
        let segment =
            state.segments.get_mut(&segment_id).expect("segment vanished during a write-through");
        segment.finish_placement(at);
        segment.dirty = true;
        segment.last_write_sequence = segment.last_write_sequence.max(sequence);
        let kick =
            (segment.written_frontier() >= segment.kicked + WRITEBACK_CHUNK_BYTES).then(|| {
                let range = (segment.kicked, segment.written_frontier());
                segment.kicked = range.1;
                range
            });
        if let Err(error) = result {
            // `Store::write` returns the capacity of pieces that failed to the reservation pool.
            state.reserved_bytes += bytes;
            if is_no_space(&error) {
                match self.roll_back_append(&mut state, segment_id, at, bytes, Some(epoch)) {
                    Ok(()) => return Err(self.file_system_full(stream, bytes, 0)),
                    Err(reason) => {
                        self.fail(&mut state, reason);
                        return Err(WriteError::Io { segment: segment_id, source: error });
                    }
                }
            }
            let reason = format!(
                "writing a {bytes}-byte record to segment {segment_id} at offset {at} in {}: {error}",
                self.storage.describe()
            );
            self.fail(&mut state, reason);
            return Err(WriteError::Io { segment: segment_id, source: error });
        }
        publish_data_record(
            &mut state,
            &header,
            Location::Ssd { segment: segment_id, offset: at },
            bytes,
            piece.len() as u64,
        );
        state.counters.user_bytes_to_ssd += bytes;
        state.counters.ssd_bytes_written += bytes;
        state.counters.write_through_records += 1;
        state.write_through_seen = true;
        self.note_unsynced(&mut state, bytes);
        drop(state);
        if let Some((from, to)) = kick {
            self.kick_writeback(segment_file.as_ref(), from, to);
        }
        Ok(())
    }

    /// Starts writeback of `from..to` of a segment so the commit's fsync finds most of it on
    /// disk, and with `store.ssd_drop_behind` drops the range `DROP_BEHIND_LAG_BYTES` below it
    /// from the page cache (hints: errors surface at fsync, and a page still dirty stays).
    pub(crate) fn kick_writeback(&self, file: &dyn SegmentFile, from: u64, to: u64) {
        let _ = file.start_writeback(from, to - from);
        if self.knobs.ssd_drop_behind {
            let (start, end) = (
                from.saturating_sub(DROP_BEHIND_LAG_BYTES),
                to.saturating_sub(DROP_BEHIND_LAG_BYTES),
            );
            if end > start {
                let _ = file.drop_cached(start, end - start);
            }
        }
    }

    /// Step 1 of `write_through`: places the record in its stream's segment and accounts its
    /// bytes there (a placement failure fails the store).
    fn place_write_through(
        &self,
        state: &mut State,
        stream: StreamKey,
        epoch: EpochId,
        bytes: u64,
    ) -> Result<(SegmentId, u64, Arc<dyn SegmentFile>), WriteError> {
        let hint = state.next_sequence;
        let (segment_id, at, segment_file) = match self.place(state, stream, bytes, hint) {
            Ok(placed) => placed,
            Err(PlaceError::NoSpace(_)) => return Err(self.file_system_full(stream, bytes, 0)),
            Err(PlaceError::Io(reason)) => {
                self.fail(state, reason.clone());
                return Err(WriteError::Failed(reason));
            }
        };
        state.reserved_bytes -= bytes;
        *state
            .segments
            .get_mut(&segment_id)
            .expect("placed segment missing")
            .epoch_bytes
            .entry(epoch)
            .or_default() += bytes;
        state.epochs.get_mut(&epoch).expect("admitted epoch vanished").segments.insert(segment_id);
        // Logged at placement, under the lock, so each segment's lines stay in offset order.
        self.write_log.write(stream, segment_id, at, bytes);
        Ok((segment_id, at, segment_file))
    }

    /// Undoes the placement of a failed append of `bytes` at `at` (ENOSPC): if it is the
    /// segment's last, the logical end moves back to `at` and whatever part of it landed is cut
    /// off the file, so neither a later append nor recovery ever sees it. `Err` (the caller
    /// fails the store) when a later placement sits above it or the cut fails.
    pub(crate) fn roll_back_append(
        &self,
        state: &mut State,
        segment_id: SegmentId,
        at: u64,
        bytes: u64,
        epoch: Option<EpochId>,
    ) -> Result<(), String> {
        let segment = state.segments.get_mut(&segment_id).expect("rolled-back segment missing");
        if segment.length != at + bytes {
            return Err(format!(
                "out of space appending {bytes} bytes at offset {at} of segment {segment_id}, \
                 with later appends above it (a hole recovery would cut them at)"
            ));
        }
        segment.file.set_len(at).map_err(|error| {
            format!("cutting the failed append off segment {segment_id} at offset {at}: {error}")
        })?;
        segment.length = at;
        if let Some(epoch) = epoch {
            if let Some(count) = segment.epoch_bytes.get_mut(&epoch) {
                *count -= bytes;
                if *count == 0 {
                    segment.epoch_bytes.remove(&epoch);
                    forget_segment_of_epoch(state, epoch, segment_id);
                }
            }
        }
        state.ssd_used_bytes -= bytes;
        state.disk_full = true;
        tracing::warn!(segment = %segment_id, offset = at, bytes, "append ran out of space; rolled back");
        Ok(())
    }

    /// Places `bytes` at the end of `stream`'s open segment (rolling to a new one when full).
    pub(crate) fn place(
        &self,
        state: &mut State,
        stream: StreamKey,
        bytes: u64,
        sequence: u64,
    ) -> Result<(SegmentId, u64, Arc<dyn SegmentFile>), PlaceError> {
        let current = state.open_segments.get(&stream).copied();
        let segment_id = match current {
            Some(id) if state.segments[&id].length + bytes <= self.knobs.segment_bytes_max => id,
            Some(id) => {
                state.segments.get_mut(&id).expect("open segment missing").sealed = true;
                state.open_segments.remove(&stream);
                self.create_segment(state, stream)?
            }
            None => self.create_segment(state, stream)?,
        };
        let offset = state.segments[&segment_id].length;
        self.reserve_blocks(state, segment_id, offset + bytes)?;
        let segment = state.segments.get_mut(&segment_id).expect("placed segment missing");
        segment.length += bytes;
        segment.inflight += 1;
        segment.inflight_at.insert(offset);
        segment.last_write_sequence = segment.last_write_sequence.max(sequence);
        let file = segment.file.clone();
        state.ssd_used_bytes += bytes;
        Ok((segment_id, offset, file))
    }

    /// Creates a segment file for `stream`, preallocates it, writes its header record and sets
    /// its hint. On a full file system (ENOSPC) the half-made file is removed and, for the
    /// metadata stream, the reserve file is released and the creation tried once more.
    pub(crate) fn create_segment(
        &self,
        state: &mut State,
        stream: StreamKey,
    ) -> Result<SegmentId, PlaceError> {
        let id = SegmentId(state.next_segment);
        state.next_segment += 1;
        let name = segment_file_name(id);
        let sequence = state.next_sequence;
        state.next_sequence += 1;
        let header = RecordHeader {
            kind: RecordKind::SegmentHeader,
            sequence,
            stream,
            epoch: EpochId(0),
            file: FileId(id.0),
            offset: 0,
            payload_bytes: 0,
        };
        let bytes = encode_record(&header, &[]);
        let mut made = self.make_segment_file(&name, stream, &bytes);
        if matches!(&made, Err((_, error)) if is_no_space(error))
            && stream == META_STREAM
            && self.release_reserve(state)
        {
            made = self.make_segment_file(&name, stream, &bytes);
        }
        let (file, preallocated) = match made {
            Ok(made) => made,
            Err((what, error)) => {
                let reason =
                    format!("{what} segment {id} ({name}) in {}: {error}", self.storage.describe());
                if is_no_space(&error) {
                    state.disk_full = true;
                    return Err(PlaceError::NoSpace(reason));
                }
                return Err(PlaceError::Io(reason));
            }
        };
        set_write_hint(state, file.as_ref(), stream, id);
        self.write_log.write(stream, id, 0, bytes.len() as u64);
        state.segments.insert(
            id,
            Segment {
                stream,
                file,
                length: bytes.len() as u64,
                preallocated,
                inflight: 0,
                inflight_at: BTreeSet::new(),
                kicked: 0,
                synced_length: 0,
                dirty: true,
                sealed: false,
                epoch_bytes: BTreeMap::new(),
                tombstones: BTreeMap::new(),
                last_write_sequence: sequence,
            },
        );
        state.open_segments.insert(stream, id);
        state.ssd_used_bytes += bytes.len() as u64;
        state.counters.metadata_bytes += bytes.len() as u64;
        state.counters.ssd_bytes_written += bytes.len() as u64;
        state.counters.segments_created += 1;
        state.directory_dirty = true;
        Ok(id)
    }

    /// Step 1 of `create_segment`: creates the file, reserves `segment_bytes_max` for it (so
    /// appends below that cannot run out of space) and writes its header. On failure the file
    /// is removed again; the error says which step failed.
    fn make_segment_file(
        &self,
        name: &str,
        stream: StreamKey,
        header: &[u8],
    ) -> Result<(Arc<dyn SegmentFile>, Option<u64>), SegmentFileFailure> {
        let file = self.storage.create(name).map_err(|e| ("creating", e))?;
        let first_chunk = self.first_chunk_bytes();
        let result = (|| {
            let preallocated = match file.preallocate(first_chunk) {
                Ok(true) => Some(first_chunk),
                Ok(false) => None,
                // Metadata records are appended under the lock, so a failed one can always be
                // rolled back: a metadata segment may go without its preallocation.
                Err(error) if is_no_space(&error) && stream == META_STREAM => None,
                Err(error) => return Err(("preallocating", error)),
            };
            file.write_at(0, header).map_err(|e| ("writing the header of", e))?;
            Ok(preallocated)
        })();
        match result {
            Ok(preallocated) => Ok((file, preallocated)),
            Err(failure) => {
                drop(file);
                if let Err(error) = self.storage.remove(name) {
                    tracing::warn!(%error, name, "removing a half-created segment failed");
                }
                Err(failure)
            }
        }
    }

    /// Step 2 of `place`: makes sure the disk blocks of `segment` are reserved up to `end`,
    /// preallocating the next chunk if not (releasing the reserve file once for the metadata
    /// stream). Out of space, nothing is placed and the store carries on.
    fn reserve_blocks(
        &self,
        state: &mut State,
        segment_id: SegmentId,
        end: u64,
    ) -> Result<(), PlaceError> {
        let segment = &state.segments[&segment_id];
        let Some(reserved) = segment.preallocated else { return Ok(()) };
        if end <= reserved {
            return Ok(());
        }
        let target =
            (reserved + PREALLOCATE_CHUNK_BYTES).min(self.knobs.segment_bytes_max).max(end);
        let (file, stream) = (segment.file.clone(), segment.stream);
        let mut result = file.preallocate(target);
        if matches!(&result, Err(error) if is_no_space(error))
            && stream == META_STREAM
            && self.release_reserve(state)
        {
            result = file.preallocate(target);
        }
        let segment = state.segments.get_mut(&segment_id).expect("placed segment missing");
        match result {
            Ok(true) => segment.preallocated = Some(target),
            Ok(false) => segment.preallocated = None,
            // A metadata record can always be rolled back: append without the reservation.
            Err(error) if is_no_space(&error) && stream == META_STREAM => {
                segment.preallocated = None;
            }
            Err(error) => {
                let reason = format!(
                    "preallocating segment {segment_id} to {target} bytes in {}: {error}",
                    self.storage.describe()
                );
                if is_no_space(&error) {
                    state.disk_full = true;
                    return Err(PlaceError::NoSpace(reason));
                }
                return Err(PlaceError::Io(reason));
            }
        }
        Ok(())
    }

    /// Appends a metadata record (name, commit, epoch state) to the metadata stream, under the
    /// lock (they are small). Not durable until the next `sync_dirty`. Out of space (even after
    /// releasing the reserve), the record is rolled back and the error is ENOSPC with the store
    /// still working.
    pub(crate) fn append_meta(
        &self,
        state: &mut State,
        mut header: RecordHeader,
        payload: &[u8],
    ) -> Result<(), (SegmentId, std::io::Error)> {
        header.sequence = state.next_sequence;
        state.next_sequence += 1;
        let bytes = encode_record(&header, payload);
        let length = bytes.len() as u64;
        let (segment_id, offset, file) =
            match self.place(state, META_STREAM, length, header.sequence) {
                Ok(placed) => placed,
                Err(PlaceError::NoSpace(reason)) => {
                    tracing::warn!(%reason, "no space for a metadata record");
                    return Err((SegmentId(0), std::io::Error::from_raw_os_error(libc::ENOSPC)));
                }
                Err(PlaceError::Io(reason)) => {
                    self.fail(state, reason.clone());
                    return Err((SegmentId(0), std::io::Error::other(reason)));
                }
            };
        let mut result = file.write_at(offset, &bytes);
        if matches!(&result, Err(error) if is_no_space(error)) && self.release_reserve(state) {
            result = file.write_at(offset, &bytes);
        }
        let segment = state.segments.get_mut(&segment_id).expect("meta segment missing");
        segment.finish_placement(offset);
        segment.dirty = true;
        if let Err(error) = result {
            if is_no_space(&error) {
                match self.roll_back_append(state, segment_id, offset, length, None) {
                    Ok(()) => return Err((segment_id, error)),
                    Err(reason) => {
                        self.fail(state, reason.clone());
                        return Err((segment_id, std::io::Error::other(reason)));
                    }
                }
            }
            let reason =
                format!("writing metadata to segment {segment_id} at offset {offset}: {error}");
            self.fail(state, reason);
            return Err((segment_id, error));
        }
        if header.kind == RecordKind::EpochState {
            *segment.tombstones.entry(header.epoch).or_default() += length;
        } else {
            *segment.epoch_bytes.entry(header.epoch).or_default() += length;
            state
                .epochs
                .entry(header.epoch)
                .or_insert_with(EpochEntry::new)
                .segments
                .insert(segment_id);
        }
        state.counters.metadata_bytes += length;
        state.counters.ssd_bytes_written += length;
        self.write_log.write(META_STREAM, segment_id, offset, length);
        Ok(())
    }

    /// Moves Ready DRAM records in `scope` to their streams' segments (up to `bytes_max`).
    /// Returns the bytes moved.
    /// Out of space for a new segment, it moves what it could and returns `Err` with the store
    /// not failed (the rest stays in DRAM).
    pub(crate) fn spill(&self, scope: SpillScope<'_>, bytes_max: u64) -> Result<u64, String> {
        let (placed, no_space) = self.place_ready_records(scope, bytes_max)?;
        let moved = if placed.is_empty() {
            0
        } else {
            let result = self.write_placed(&placed);
            self.finish_spill(&placed, result)?
        };
        match no_space {
            Some(reason) => Err(reason),
            None => Ok(moved),
        }
    }

    /// Step 1 of `spill`: under the lock, chooses the Ready records in `scope` (oldest first, up
    /// to `bytes_max`), places each in its stream's segment and marks it Spilling.
    /// Out of space for a new segment, it stops there and also returns the reason.
    fn place_ready_records(
        &self,
        scope: SpillScope<'_>,
        bytes_max: u64,
    ) -> Result<(Vec<Placed>, Option<String>), String> {
        let mut placed: Vec<Placed> = Vec::new();
        let mut state = self.state.lock();
        Self::failed(&state)?;
        let mut chosen = Vec::new();
        let mut total = 0;
        for record in &state.dram {
            if total >= bytes_max {
                break;
            }
            if record.status != DramStatus::Ready {
                continue;
            }
            if !scope.takes(record.sequence, record.epoch) {
                continue;
            }
            chosen.push((
                record.position,
                record.bytes,
                record.stream,
                record.epoch,
                record.sequence,
            ));
            total += record.bytes;
        }
        let mut no_space = None;
        for (position, bytes, stream, epoch, sequence) in chosen {
            let (segment, offset, file) = match self.place(&mut state, stream, bytes, sequence) {
                Ok(p) => p,
                Err(PlaceError::NoSpace(reason)) => {
                    no_space = Some(reason);
                    break;
                }
                Err(PlaceError::Io(reason)) => {
                    self.fail(&mut state, reason.clone());
                    return Err(reason);
                }
            };
            let seg = state.segments.get_mut(&segment).expect("placed segment missing");
            *seg.epoch_bytes.entry(epoch).or_default() += bytes;
            state
                .epochs
                .get_mut(&epoch)
                .expect("epoch of DRAM record missing")
                .segments
                .insert(segment);
            state.dram_unplaced_bytes -= bytes;
            state.dram_ready_bytes -= bytes;
            let at = dram_index(&state, position);
            state.dram[at].status = DramStatus::Spilling;
            placed.push(Placed { segment, offset, file, position, bytes, sequence, stream });
        }
        Ok((placed, no_space))
    }

    /// Step 2 of `spill` (after the pwrites, whose `result` it takes): ends the placements,
    /// marks the records Spilled and repoints them to SSD, counts the bytes moved and releases
    /// ring space (failing the store if a write failed).
    fn finish_spill(
        &self,
        placed: &[Placed],
        result: Result<(), SpillWriteError>,
    ) -> Result<u64, String> {
        let mut state = self.state.lock();
        let mut moved = 0;
        let written = match &result {
            Ok(()) => placed.len(),
            Err(failure) => failure.first_unwritten,
        };
        for item in &placed[..written] {
            let segment =
                state.segments.get_mut(&item.segment).expect("segment vanished during spill");
            segment.finish_placement(item.offset);
            segment.dirty = true;
            let at = dram_index(&state, item.position);
            let epoch = state.dram[at].epoch;
            state.dram[at].status = DramStatus::Spilled;
            state.dram_cached_bytes += item.bytes;
            if let Some(info) = state.records.get_mut(&item.sequence) {
                info.location = Location::Ssd { segment: item.segment, offset: item.offset };
                info.cached = Some(item.position);
            }
            if let Some(entry) = state.epochs.get_mut(&epoch) {
                assert!(entry.dram_pending > 0, "epoch {epoch} DRAM pending underflow");
                entry.dram_pending -= 1;
            }
            state.counters.user_bytes_to_ssd += item.bytes;
            state.counters.ssd_bytes_written += item.bytes;
            moved += item.bytes;
        }
        let result = match result {
            Ok(()) => Ok(moved),
            Err(failure) => {
                let unwritten = &placed[written..];
                for item in unwritten {
                    let segment = state.segments.get_mut(&item.segment).expect("segment vanished");
                    segment.finish_placement(item.offset);
                }
                let rolled_back = failure.no_space
                    && self.roll_back_spill(&mut state, unwritten).map_err(|reason| {
                        tracing::error!(%reason, "cannot roll back a spill that ran out of space")
                    }).is_ok();
                if !rolled_back {
                    self.fail(&mut state, failure.reason.clone());
                }
                Err(failure.reason)
            }
        };
        self.note_unsynced(&mut state, moved);
        advance_tail(&mut state);
        #[cfg(feature = "strict_assertions")]
        check_invariants(&state);
        drop(state);
        self.space.notify_all();
        result
    }

    /// After a spill's pwrite ran out of space: gives the `unwritten` records' places back
    /// (each segment's logical end moves back to the first of them and the file is cut there,
    /// so no part of them is ever replayed) and makes the records Ready in DRAM again. `Err`
    /// when another placement sits above them in a segment (then the store must fail).
    fn roll_back_spill(&self, state: &mut State, unwritten: &[Placed]) -> Result<(), String> {
        // Per segment: first offset, end, bytes.
        let mut spans: BTreeMap<SegmentId, (u64, u64, u64)> = BTreeMap::new();
        for item in unwritten {
            let span = spans.entry(item.segment).or_insert((item.offset, item.offset, 0));
            span.0 = span.0.min(item.offset);
            span.1 = span.1.max(item.offset + item.bytes);
            span.2 += item.bytes;
        }
        for (&id, &(start, end, bytes)) in &spans {
            let segment = &state.segments[&id];
            if segment.length != end
                || segment.inflight_at.range(start..).next().is_some()
                || end - start != bytes
            {
                return Err(format!("segment {id} has other appends above offset {start}"));
            }
        }
        for (&id, &(start, _, bytes)) in &spans {
            let segment = state.segments.get_mut(&id).expect("segment vanished");
            segment.file.set_len(start).map_err(|error| {
                format!("cutting the failed spill off segment {id} at offset {start}: {error}")
            })?;
            segment.length = start;
            state.ssd_used_bytes -= bytes;
        }
        for item in unwritten {
            let at = dram_index(state, item.position);
            let epoch = state.dram[at].epoch;
            let segment = state.segments.get_mut(&item.segment).expect("segment vanished");
            if let Some(count) = segment.epoch_bytes.get_mut(&epoch) {
                *count -= item.bytes;
                if *count == 0 {
                    segment.epoch_bytes.remove(&epoch);
                    forget_segment_of_epoch(state, epoch, item.segment);
                }
            }
            let entry = state.epochs.get_mut(&epoch).expect("epoch of a DRAM record missing");
            if phase_is_live(entry.phase) {
                state.dram[at].status = DramStatus::Ready;
                state.dram_unplaced_bytes += item.bytes;
                state.dram_ready_bytes += item.bytes;
            } else {
                // Deleted while it was being written: as `retire` does with Ready records.
                entry.dram_pending -= 1;
                state.dram[at].status = DramStatus::Dead;
            }
        }
        state.disk_full = true;
        tracing::warn!(records = unwritten.len(), "spill ran out of space; rolled back");
        Ok(())
    }

    /// Issues the pwrites of placed records, coalescing neighbours in both ring and segment.
    pub(crate) fn write_placed(&self, placed: &[Placed]) -> Result<(), SpillWriteError> {
        // Per segment: the range written but not yet handed to writeback.
        let mut unkicked: BTreeMap<SegmentId, (Arc<dyn SegmentFile>, u64, u64)> = BTreeMap::new();
        let capacity = self.arena.capacity();
        let mut i = 0;
        while i < placed.len() {
            let first = &placed[i];
            let mut length = first.bytes;
            let mut j = i + 1;
            while j < placed.len() {
                let next = &placed[j];
                let contiguous = next.segment == first.segment
                    && next.offset == first.offset + length
                    && next.position == first.position + length
                    && (first.position % capacity) + length + next.bytes <= capacity;
                if !contiguous {
                    break;
                }
                length += next.bytes;
                j += 1;
            }
            // SAFETY: every record in the range is Spilling: published, so nobody writes it,
            // and the ring tail cannot pass it until we mark it Spilled.
            let bytes = unsafe { self.arena.slice(first.position, length) };
            self.direct.write(first.file.as_ref(), first.offset, bytes).map_err(|error| {
                SpillWriteError {
                    first_unwritten: i,
                    no_space: is_no_space(&error),
                    reason: format!(
                        "writing {length} bytes to segment {} at offset {} in {}: {error}",
                        first.segment,
                        first.offset,
                        self.storage.describe()
                    ),
                }
            })?;
            // Start writeback in large chunks as we go, so the commit's fsync finds most of the
            // data on disk already (a hint; errors surface at fsync).
            let range = unkicked.entry(first.segment).or_insert((
                first.file.clone(),
                first.offset,
                first.offset,
            ));
            range.1 = range.1.min(first.offset);
            range.2 = range.2.max(first.offset + length);
            if range.2 - range.1 >= WRITEBACK_CHUNK_BYTES {
                self.kick_writeback(range.0.as_ref(), range.1, range.2);
                range.1 = range.2;
            }
            self.write_log.write(first.stream, first.segment, first.offset, length);
            i = j;
        }
        for (file, start, end) in unkicked.into_values() {
            if end > start {
                self.kick_writeback(file.as_ref(), start, end);
            }
        }
        Ok(())
    }

    /// Spills every record that exists now (of `epochs` only, when given) and waits until
    /// none of them is still being written or spilled. Records that arrive meanwhile are left
    /// to the flusher: a sync under a steady stream of other writers still ends.
    pub(crate) fn spill_existing(&self, epochs: Option<&BTreeSet<EpochId>>) -> Result<(), String> {
        let horizon = self.state.lock().next_sequence;
        let scope = SpillScope::Before { horizon, epochs };
        loop {
            while self
                .spill(SpillScope::Before { horizon, epochs }, self.knobs.flusher_batch_bytes)?
                > 0
            {}
            let mut state = self.state.lock();
            Self::failed(&state)?;
            let busy = state.dram.iter().any(|r| {
                scope.takes(r.sequence, r.epoch)
                    && matches!(
                        r.status,
                        DramStatus::Writing | DramStatus::Spilling | DramStatus::Ready
                    )
            });
            if !busy {
                return Ok(());
            }
            self.space.wait_for(&mut state, Duration::from_millis(20));
        }
    }

    /// Marks an epoch drained or deleted: writes the tombstone, drops it from the index, turns
    /// its DRAM records dead and its segment bytes dead.
    pub(crate) fn retire(&self, epoch: EpochId, target: EpochPhase) -> Result<(), LifecycleError> {
        let mut state = self.state.lock();
        if self.wait_until_retirable(&mut state, epoch, target)? {
            return Ok(());
        }
        let code = if target == EpochPhase::Drained {
            epoch_state_code::DRAINED
        } else {
            epoch_state_code::DELETED
        };
        let header = RecordHeader {
            kind: RecordKind::EpochState,
            sequence: 0,
            stream: META_STREAM,
            epoch,
            file: FileId(0),
            offset: code,
            payload_bytes: 0,
        };
        self.append_meta(&mut state, header, &[]).map_err(|(segment, source)| {
            if is_no_space(&source) {
                LifecycleError::NoSpace { epoch, source }
            } else {
                LifecycleError::Io { segment, source }
            }
        })?;
        let state = &mut *state;
        let entry = state.epochs.get_mut(&epoch).expect("retired epoch vanished");
        entry.phase = target;
        if target == EpochPhase::Deleted {
            entry.grant = None;
        }
        // Drained or deleted: nothing of it will be published any more.
        entry.participants.clear();
        for sequence in std::mem::take(&mut entry.record_sequences) {
            state.records.remove(&sequence);
        }
        for (stream, bytes) in std::mem::take(&mut entry.stream_bytes) {
            let usage = state.stream_usage.get_mut(&stream).expect("stream usage missing");
            assert!(*usage >= bytes, "stream {stream} usage underflow");
            *usage -= bytes;
        }
        for record in state.dram.iter_mut() {
            if record.epoch != epoch {
                continue;
            }
            match record.status {
                DramStatus::Ready => {
                    record.status = DramStatus::Dead;
                    state.dram_unplaced_bytes -= record.bytes;
                    state.dram_ready_bytes -= record.bytes;
                    entry.dram_pending -= 1;
                }
                // Its record table entry is gone: the clean copy serves nobody.
                DramStatus::Spilled => {
                    record.status = DramStatus::Dead;
                    state.dram_cached_bytes -= record.bytes;
                }
                _ => {}
            }
        }
        state.index.remove_epoch(epoch);
        state.durable_pending.remove(&epoch);
        state.commit_queue.remove(&epoch);
        state.gc_wanted = true;
        advance_tail(state);
        #[cfg(feature = "strict_assertions")]
        check_invariants(state);
        self.flusher.notify_one();
        self.space.notify_all();
        Ok(())
    }
}

impl Inner {
    /// Step 1 of `retire`: checks that `epoch` may move to `target` and waits until no write to
    /// it is in flight. `Ok(true)`: it is in `target` already.
    fn wait_until_retirable(
        &self,
        state: &mut parking_lot::MutexGuard<'_, State>,
        epoch: EpochId,
        target: EpochPhase,
    ) -> Result<bool, LifecycleError> {
        loop {
            if let Some(reason) = &state.failed {
                return Err(LifecycleError::Failed(reason.clone()));
            }
            let entry = state.epochs.get_mut(&epoch).ok_or(LifecycleError::UnknownEpoch(epoch))?;
            let allowed = match (entry.phase, target) {
                (phase, target) if phase == target => return Ok(true),
                (EpochPhase::Committed | EpochPhase::CommittedInMemory, _) => true,
                (EpochPhase::Open, EpochPhase::Deleted) => true,
                // A commit that ran out of space left it sealed with no commit running.
                (EpochPhase::Committing, EpochPhase::Deleted) => entry.commit_stalled,
                _ => false,
            };
            if !allowed {
                return Err(LifecycleError::WrongPhase {
                    epoch,
                    phase: entry.phase,
                    wanted: target,
                });
            }
            if entry.inflight_writes == 0 {
                return Ok(false);
            }
            self.space.wait(state);
        }
    }
}

/// After a rolled-back append left `epoch` without bytes in `segment`: the epoch no longer
/// names it (GC may delete the segment without knowing the epoch).
fn forget_segment_of_epoch(state: &mut State, epoch: EpochId, segment: SegmentId) {
    if let Some(entry) = state.epochs.get_mut(&epoch) {
        entry.segments.remove(&segment);
    }
}

/// Sets a new segment's write-lifetime hint and records whether the kernel supports hints.
fn set_write_hint(state: &mut State, file: &dyn SegmentFile, stream: StreamKey, id: SegmentId) {
    match file.set_write_hint(write_hint_for(stream)) {
        Ok(true) => state.hints = WriteHints::Supported,
        Ok(false) => {
            if state.hints == WriteHints::NotTried {
                state.hints = WriteHints::Unsupported;
            }
        }
        Err(error) => {
            tracing::warn!(%error, segment = %id, "setting the write-lifetime hint failed")
        }
    }
}

/// Index of the DRAM record starting at `position` (the deque is sorted by position).
pub(crate) fn dram_index(state: &State, position: u64) -> usize {
    state
        .dram
        .binary_search_by_key(&position, |r| r.position)
        .unwrap_or_else(|_| panic!("no DRAM record at position {position}"))
}

/// Releases ring space held by dead records at the front, and by spilled ones (clean cached
/// copies) while the ring is above `dram_cache_keep_bytes`.
pub(crate) fn advance_tail(state: &mut State) {
    while let Some(front) = state.dram.front() {
        let evict = match front.status {
            DramStatus::Dead => true,
            DramStatus::Spilled => state.ring.used() > state.dram_cache_keep_bytes,
            _ => false,
        };
        if !evict || front.readers > 0 {
            break;
        }
        let (position, bytes, sequence) = (front.position, front.bytes, front.sequence);
        if front.status == DramStatus::Spilled {
            state.dram_cached_bytes -= bytes;
            if let Some(info) = state.records.get_mut(&sequence) {
                if info.cached == Some(position) {
                    info.cached = None;
                }
            }
        }
        state.dram.pop_front();
        state.ring.release_to(position + bytes);
    }
    if state.dram.is_empty() {
        state.ring.release_to(state.ring.head());
    }
}

// The server shares one store between threads.
const _: fn() = || {
    fn check<T: Send + Sync>() {}
    check::<Store>();
};
