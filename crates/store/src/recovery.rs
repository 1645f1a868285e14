//! Recovery: rebuild the store's state from the segment files at open.
//!
//! Every record's CRC is verified. The first bad record of a segment starts its damaged region:
//! if that region lies below a point the segment was known to be fsync'd to (sync points are
//! carried by commit records) it is corruption and open fails naming segment and offset;
//! otherwise it is a torn tail (writes in flight at the crash) and is cut off. Records are then
//! replayed in sequence order (compaction copies keep their sequence number, duplicates are
//! collapsed), and every committed epoch is checked against the record count its commit record
//! promised, so a committed epoch is either complete or open fails.

use crate::error::{EpochPhase, OpenError};
use crate::format::*;
use crate::index::Extent;
use crate::storage::{SegmentFile, Storage};
use crate::store::{phase_is_live, EpochEntry, Location, RecordInfo, Segment, State};
use spillway_config::StoreKnobs;
use spillway_types::{EpochId, SegmentId, StreamKey};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

struct ScannedRecord {
    segment: SegmentId,
    offset: u64,
    bytes: u64,
    header: RecordHeader,
    /// Payload of metadata records (names, commits); empty for data.
    payload: Vec<u8>,
}

struct Damage {
    segment: SegmentId,
    offset: u64,
    detail: String,
}

struct ScannedSegment {
    file: Arc<dyn SegmentFile>,
    stream: Option<StreamKey>,
    length: u64,
}

/// What the scan of every segment file found.
struct Scan {
    records: Vec<ScannedRecord>,
    damages: Vec<Damage>,
    segments: BTreeMap<SegmentId, ScannedSegment>,
    /// Highest segment id on disk (new segments are numbered after it).
    max_segment: u64,
}

pub(crate) fn recover(
    knobs: &StoreKnobs,
    storage: &dyn Storage,
    state: &mut State,
) -> Result<(), OpenError> {
    let started = Instant::now();
    let directory = storage.describe();
    let io = |what: String, source: std::io::Error| OpenError::Io {
        what,
        directory: directory.clone(),
        source,
    };
    let names = list_segment_files(storage, &io)?;
    let mut scan = scan_segment_files(knobs, storage, state, &names, &io)?;
    let synced = sync_points(&scan.records)?;
    check_grant_payloads(&scan.records)?;
    check_damage_above_sync_points(&scan.damages, &synced)?;
    cut_torn_tails(storage, state, &scan.damages, &mut scan.segments, &io)?;
    let headerless = remove_headerless_segments(storage, state, &mut scan.segments, &io)?;
    if !scan.damages.is_empty() || !headerless.is_empty() {
        storage.sync_directory().map_err(|e| io("syncing the directory".into(), e))?;
    }
    scan.records.retain(|r| scan.segments.contains_key(&r.segment));
    install_segments(state, &scan.segments);
    let promised = replay(state, scan.records);
    check_committed_epochs(state, &promised, &scan.damages)?;
    state.next_segment = next_segment_id(scan.max_segment, &synced);
    state.recovery.duration_ms = started.elapsed().as_millis() as u64;
    crate::store::check_invariants(state);
    Ok(())
}

/// The id of the next segment: above every segment on disk *and* every segment a surviving
/// commit record names. GC deletes whole segments, the newest among them; an id reused after a
/// restart would make an old commit's sync point apply to a new segment of the same id, and
/// the next recovery would read that segment's torn tail as corruption below its sync point.
fn next_segment_id(max_on_disk: u64, synced: &HashMap<SegmentId, u64>) -> u64 {
    let max_named = synced.keys().map(|segment| segment.0).max().unwrap_or(0);
    max_on_disk.max(max_named) + 1
}

/// Step 1 of `recover`: the segment files in the directory, by id.
fn list_segment_files(
    storage: &dyn Storage,
    io: &impl Fn(String, std::io::Error) -> OpenError,
) -> Result<Vec<(SegmentId, String)>, OpenError> {
    let mut names: Vec<(SegmentId, String)> = storage
        .list()
        .map_err(|e| io("listing segments".into(), e))?
        .into_iter()
        .filter_map(|name| parse_segment_file_name(&name).map(|id| (id, name)))
        .collect();
    names.sort();
    Ok(names)
}

/// Step 2 of `recover`: reads and scans every segment file, counting what was scanned.
fn scan_segment_files(
    knobs: &StoreKnobs,
    storage: &dyn Storage,
    state: &mut State,
    names: &[(SegmentId, String)],
    io: &impl Fn(String, std::io::Error) -> OpenError,
) -> Result<Scan, OpenError> {
    let mut records = Vec::new();
    let mut damages = Vec::new();
    let mut segments: BTreeMap<SegmentId, ScannedSegment> = BTreeMap::new();
    let mut max_segment = 0;
    for (id, name) in names {
        max_segment = max_segment.max(id.0);
        let file = storage.open(name).map_err(|e| io(format!("opening {name}"), e))?;
        let length = file.len().map_err(|e| io(format!("sizing {name}"), e))?;
        let mut image = vec![0u8; length as usize];
        file.read_at(0, &mut image).map_err(|e| io(format!("reading {name}"), e))?;
        state.recovery.segments_scanned += 1;
        state.recovery.bytes_scanned += length;
        let (stream, valid_length) = scan_segment(*id, &image, knobs, &mut records, &mut damages);
        segments.insert(*id, ScannedSegment { file, stream, length: valid_length });
    }
    state.recovery.records_scanned = records.len() as u64;
    Ok(Scan { records, damages, segments, max_segment })
}

/// Step 3 of `recover`: the sync points, how far each segment was known to be durable when
/// some commit was written.
fn sync_points(records: &[ScannedRecord]) -> Result<HashMap<SegmentId, u64>, OpenError> {
    let mut synced: HashMap<SegmentId, u64> = HashMap::new();
    for record in records {
        if record.header.kind == RecordKind::Commit {
            let payload =
                CommitPayload::decode(&record.payload).map_err(|detail| OpenError::Corrupt {
                    segment: record.segment,
                    offset: record.offset,
                    detail: detail.to_string(),
                })?;
            for (segment, length) in payload.synced {
                let entry = synced.entry(segment).or_default();
                *entry = (*entry).max(length);
            }
        }
    }
    Ok(synced)
}

/// Step 3b of `recover`: every grant record's payload decodes (its CRC held, so a payload that
/// does not is corruption, not a torn write), so that replay can apply it.
fn check_grant_payloads(records: &[ScannedRecord]) -> Result<(), OpenError> {
    for record in records.iter().filter(|r| r.header.kind == RecordKind::Grant) {
        decode_grant(&record.payload).map_err(|detail| OpenError::Corrupt {
            segment: record.segment,
            offset: record.offset,
            detail: format!("grant of epoch {}: {detail}", record.header.epoch),
        })?;
    }
    for record in records.iter().filter(|r| r.header.kind == RecordKind::Participants) {
        decode_participants(&record.payload).map_err(|detail| OpenError::Corrupt {
            segment: record.segment,
            offset: record.offset,
            detail: format!("participants of epoch {}: {detail}", record.header.epoch),
        })?;
    }
    Ok(())
}

/// Step 4 of `recover`: damage below a segment's sync point is corruption, and open fails.
fn check_damage_above_sync_points(
    damages: &[Damage],
    synced: &HashMap<SegmentId, u64>,
) -> Result<(), OpenError> {
    for damage in damages {
        let durable = synced.get(&damage.segment).copied().unwrap_or(0);
        if damage.offset < durable {
            return Err(OpenError::Corrupt {
                segment: damage.segment,
                offset: damage.offset,
                detail: format!("{} (below the fsync'd length {durable})", damage.detail),
            });
        }
    }
    Ok(())
}

/// Step 5 of `recover`: cuts off the torn tails (a segment without a valid header goes
/// entirely).
fn cut_torn_tails(
    storage: &dyn Storage,
    state: &mut State,
    damages: &[Damage],
    segments: &mut BTreeMap<SegmentId, ScannedSegment>,
    io: &impl Fn(String, std::io::Error) -> OpenError,
) -> Result<(), OpenError> {
    for damage in damages {
        let name = segment_file_name(damage.segment);
        let segment = segments.get_mut(&damage.segment).expect("damaged segment was scanned");
        if segment.stream.is_none() || damage.offset == 0 {
            storage.remove(&name).map_err(|e| io(format!("removing empty segment {name}"), e))?;
            segments.remove(&damage.segment);
            state.recovery.segments_removed += 1;
            continue;
        }
        segment.file.set_len(damage.offset).map_err(|e| io(format!("truncating {name}"), e))?;
        segment.file.sync().map_err(|e| io(format!("syncing {name}"), e))?;
        segment.length = damage.offset;
        state.recovery.truncated.push((damage.segment, damage.offset));
        tracing::warn!(segment = %damage.segment, offset = damage.offset, detail = %damage.detail, "cut torn tail");
    }
    Ok(())
}

/// Step 6 of `recover`: removes the segments created just before a crash whose header never
/// reached the disk (empty files). Returns their ids.
fn remove_headerless_segments(
    storage: &dyn Storage,
    state: &mut State,
    segments: &mut BTreeMap<SegmentId, ScannedSegment>,
    io: &impl Fn(String, std::io::Error) -> OpenError,
) -> Result<Vec<SegmentId>, OpenError> {
    let headerless: Vec<SegmentId> =
        segments.iter().filter(|(_, s)| s.stream.is_none()).map(|(&id, _)| id).collect();
    for id in &headerless {
        let name = segment_file_name(*id);
        storage.remove(&name).map_err(|e| io(format!("removing empty segment {name}"), e))?;
        segments.remove(id);
        state.recovery.segments_removed += 1;
    }
    Ok(headerless)
}

/// Step 7 of `recover`: the kept segments enter the state, sealed and synced to their length.
fn install_segments(state: &mut State, segments: &BTreeMap<SegmentId, ScannedSegment>) {
    for (&id, scanned) in segments {
        state.segments.insert(
            id,
            Segment {
                stream: scanned.stream.expect("kept segments have a header"),
                file: scanned.file.clone(),
                length: scanned.length,
                preallocated: None,
                inflight: 0,
                inflight_at: BTreeSet::new(),
                kicked: scanned.length,
                synced_length: scanned.length,
                dirty: false,
                sealed: true,
                epoch_bytes: BTreeMap::new(),
                tombstones: BTreeMap::new(),
                last_write_sequence: 0,
            },
        );
        state.ssd_used_bytes += scanned.length;
    }
}

/// Step 8 of `recover` (after `replay`): counts committed and open epochs, and fails open if a
/// committed epoch has fewer or more data records than its commit record promised.
fn check_committed_epochs(
    state: &mut State,
    promised: &HashMap<EpochId, u64>,
    damages: &[Damage],
) -> Result<(), OpenError> {
    for (&epoch, entry) in &state.epochs {
        match entry.phase {
            EpochPhase::Committed => {
                state.recovery.committed_epochs += 1;
                let expected = promised.get(&epoch).copied().unwrap_or(0);
                if entry.data_records != expected {
                    return Err(incomplete_epoch_error(
                        epoch,
                        expected,
                        entry.data_records,
                        damages,
                    ));
                }
            }
            EpochPhase::Open => state.recovery.uncommitted_epochs += 1,
            _ => {}
        }
    }
    Ok(())
}

/// The error for a committed epoch whose data records (`found`) are not the `expected` count,
/// naming every damage site seen.
fn incomplete_epoch_error(
    epoch: EpochId,
    expected: u64,
    found: u64,
    damages: &[Damage],
) -> OpenError {
    let sites: Vec<String> = damages
        .iter()
        .map(|d| format!("segment {} offset {} ({})", d.segment, d.offset, d.detail))
        .collect();
    OpenError::CommittedEpochIncomplete {
        epoch,
        detail: format!(
            "its commit record promises {expected} data records but {found} were found; damage seen at: {}",
            if sites.is_empty() { "nowhere (records are missing)".to_string() } else { sites.join(", ") }
        ),
    }
}

/// Scans one segment image; returns its stream (from the header record) and the length of its
/// valid prefix, pushing records and at most one damage site.
fn scan_segment(
    id: SegmentId,
    image: &[u8],
    knobs: &StoreKnobs,
    records: &mut Vec<ScannedRecord>,
    damages: &mut Vec<Damage>,
) -> (Option<StreamKey>, u64) {
    let mut at = 0usize;
    let mut stream = None;
    while at < image.len() {
        match check_record(&image[at..], knobs) {
            Ok(header) => {
                let bytes = record_bytes(header.payload_bytes as u64);
                let header_problem = if at == 0 {
                    (header.kind != RecordKind::SegmentHeader || header.file.0 != id.0)
                        .then_some("segment does not start with its own header record")
                } else {
                    (header.kind == RecordKind::SegmentHeader).then_some("second segment header")
                };
                if let Some(detail) = header_problem {
                    damages.push(Damage {
                        segment: id,
                        offset: at as u64,
                        detail: detail.to_string(),
                    });
                    return (stream, at as u64);
                }
                if at == 0 {
                    stream = Some(header.stream);
                } else {
                    let payload = if header.kind == RecordKind::Data {
                        Vec::new()
                    } else {
                        image[at + HEADER_BYTES..at + HEADER_BYTES + header.payload_bytes as usize]
                            .to_vec()
                    };
                    records.push(ScannedRecord {
                        segment: id,
                        offset: at as u64,
                        bytes,
                        header,
                        payload,
                    });
                }
                at += bytes as usize;
            }
            Err(detail) => {
                let valid_after = find_valid_record(image, at + RECORD_ALIGN_BYTES, knobs);
                let detail = match valid_after {
                    Some(next) => format!("{detail}; a valid record follows at offset {next}"),
                    None => format!("{detail}; nothing valid follows (torn tail)"),
                };
                damages.push(Damage { segment: id, offset: at as u64, detail });
                return (stream, at as u64);
            }
        }
    }
    (stream, at as u64)
}

fn check_record(bytes: &[u8], knobs: &StoreKnobs) -> Result<RecordHeader, String> {
    let header = RecordHeader::decode(bytes).map_err(str::to_string)?;
    if header.payload_bytes as u64 > knobs.record_payload_bytes_max.max(METADATA_PAYLOAD_BYTES_MAX)
    {
        return Err(format!("payload length {} exceeds the maximum", header.payload_bytes));
    }
    if header.offset.checked_add(header.payload_bytes as u64).is_none() {
        return Err(format!("data range at offset {} overflows", header.offset));
    }
    verify_payload(&header, bytes).map_err(str::to_string)?;
    if header.kind == RecordKind::Zeros {
        let payload = &bytes[HEADER_BYTES..HEADER_BYTES + header.payload_bytes as usize];
        decode_zeros_payload(&header, payload).map_err(str::to_string)?;
    }
    Ok(header)
}

fn find_valid_record(image: &[u8], from: usize, knobs: &StoreKnobs) -> Option<usize> {
    let mut at = from.next_multiple_of(RECORD_ALIGN_BYTES);
    while at + HEADER_BYTES <= image.len() {
        if image[at..at + 4] == RECORD_MAGIC.to_le_bytes()
            && check_record(&image[at..], knobs).is_ok()
        {
            return Some(at);
        }
        at += RECORD_ALIGN_BYTES;
    }
    None
}

/// Applies records in sequence order. Returns the data-record count each commit promised.
fn replay(state: &mut State, mut records: Vec<ScannedRecord>) -> HashMap<EpochId, u64> {
    // Same sequence twice = a compaction copy and its original; keep the newer segment's copy.
    records.sort_by_key(|r| (r.header.sequence, std::cmp::Reverse(r.segment)));
    records.dedup_by_key(|r| r.header.sequence);
    let mut promised = HashMap::new();
    let mut max_sequence = 0;
    for record in records {
        let header = record.header;
        assert!(
            header.sequence > max_sequence,
            "replay out of sequence order at {}",
            header.sequence
        );
        max_sequence = header.sequence;
        replay_record(state, &record, &mut promised);
    }
    for entry in state.epochs.values() {
        for (&stream, &bytes) in &entry.stream_bytes {
            *state.stream_usage.entry(stream).or_default() += bytes;
        }
    }
    state.next_sequence = max_sequence.max(state.next_sequence - 1) + 1;
    promised
}

/// One step of `replay`: applies one record to its epoch, then accounts its bytes to its
/// segment (as a tombstone or as bytes of the epoch).
fn replay_record(state: &mut State, record: &ScannedRecord, promised: &mut HashMap<EpochId, u64>) {
    let header = record.header;
    let epoch = header.epoch;
    let segment = state.segments.get_mut(&record.segment).expect("replayed segment missing");
    segment.last_write_sequence = segment.last_write_sequence.max(header.sequence);
    let entry = state.epochs.entry(epoch).or_insert_with(EpochEntry::new);
    if matches!(header.kind, RecordKind::Data | RecordKind::Zeros) && !phase_is_live(entry.phase) {
        // An epoch id reused after its earlier incarnation was retired.
        *entry = EpochEntry::new();
    }
    match header.kind {
        RecordKind::SegmentHeader => unreachable!("segment headers are not replayed"),
        RecordKind::Data | RecordKind::Zeros => replay_data_record(state, record),
        RecordKind::FileName => {
            if phase_is_live(entry.phase) {
                entry
                    .names
                    .insert(header.file, String::from_utf8_lossy(&record.payload).into_owned());
            }
        }
        RecordKind::Commit => {
            if entry.phase == EpochPhase::Open {
                entry.phase = EpochPhase::Committed;
                entry.recovered_uncommitted = false;
                let payload =
                    CommitPayload::decode(&record.payload).expect("commit payload checked earlier");
                promised.insert(epoch, payload.data_records);
            }
        }
        RecordKind::EpochState => replay_epoch_state(state, epoch, header.offset),
        RecordKind::Grant => {
            if entry.phase != EpochPhase::Deleted {
                entry.grant =
                    Some(decode_grant(&record.payload).expect("grant payload checked earlier"));
            }
        }
        RecordKind::GrantRevoked => entry.grant = None,
        RecordKind::Participants => {
            if phase_is_live(entry.phase) {
                entry.participants = decode_participants(&record.payload)
                    .expect("participants payload checked earlier");
            }
        }
    }
    let segment = state.segments.get_mut(&record.segment).expect("replayed segment missing");
    if header.kind == RecordKind::EpochState {
        *segment.tombstones.entry(epoch).or_default() += record.bytes;
    } else {
        *segment.epoch_bytes.entry(epoch).or_default() += record.bytes;
        state.epochs.get_mut(&epoch).expect("epoch just used").segments.insert(record.segment);
    }
}

/// Replays a data record (`Data` or `Zeros`): record table, index extent and its epoch's
/// bookkeeping (the epoch counts as uncommitted until a commit record of it is replayed).
fn replay_data_record(state: &mut State, record: &ScannedRecord) {
    let header = record.header;
    let epoch = header.epoch;
    let zeros = header.kind == RecordKind::Zeros;
    let extent_bytes = if zeros {
        decode_zeros_payload(&header, &record.payload).expect("zeros payload checked at scan")
    } else {
        header.payload_bytes as u64
    };
    state.records.insert(
        header.sequence,
        RecordInfo {
            location: Location::Ssd { segment: record.segment, offset: record.offset },
            cached: None,
            epoch,
            payload_bytes: header.payload_bytes,
            zeros,
        },
    );
    if extent_bytes > 0 {
        state.index.insert(
            epoch,
            header.file,
            header.offset,
            Extent { record: header.sequence, skip: 0, length: extent_bytes },
        );
    }
    let entry = state.epochs.get_mut(&epoch).expect("epoch of a replayed record missing");
    entry.data_records += 1;
    entry.payload_bytes += header.payload_bytes as u64;
    entry.record_sequences.push(header.sequence);
    *entry.stream_bytes.entry(header.stream).or_default() += record.bytes;
    entry.recovered_uncommitted = true;
}

/// Replays an `EpochState` record (`code` drained or deleted): a live epoch is retired and
/// forgets its records, streams, names and index.
fn replay_epoch_state(state: &mut State, epoch: EpochId, code: u64) {
    let entry = state.epochs.get_mut(&epoch).expect("epoch of a replayed record missing");
    if phase_is_live(entry.phase) {
        entry.phase = if code == epoch_state_code::DRAINED {
            EpochPhase::Drained
        } else {
            EpochPhase::Deleted
        };
        entry.recovered_uncommitted = false;
        for sequence in std::mem::take(&mut entry.record_sequences) {
            state.records.remove(&sequence);
        }
        entry.stream_bytes.clear();
        entry.names.clear();
        entry.participants.clear();
        if code != epoch_state_code::DRAINED {
            entry.grant = None;
        }
        state.index.remove_epoch(epoch);
    }
}
