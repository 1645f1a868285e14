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
    let mut names: Vec<(SegmentId, String)> = storage
        .list()
        .map_err(|e| io("listing segments".into(), e))?
        .into_iter()
        .filter_map(|name| parse_segment_file_name(&name).map(|id| (id, name)))
        .collect();
    names.sort();

    let mut records = Vec::new();
    let mut damages = Vec::new();
    let mut segments: BTreeMap<SegmentId, ScannedSegment> = BTreeMap::new();
    let mut max_segment = 0;
    for (id, name) in &names {
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

    // Sync points: how far each segment was known to be durable when some commit was written.
    let mut synced: HashMap<SegmentId, u64> = HashMap::new();
    for record in &records {
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
    for damage in &damages {
        let durable = synced.get(&damage.segment).copied().unwrap_or(0);
        if damage.offset < durable {
            return Err(OpenError::Corrupt {
                segment: damage.segment,
                offset: damage.offset,
                detail: format!("{} (below the fsync'd length {durable})", damage.detail),
            });
        }
    }
    // Torn tails: cut them off (a segment without a valid header goes entirely).
    for damage in &damages {
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
    // Segments created just before a crash whose header never reached the disk: empty files.
    let headerless: Vec<SegmentId> =
        segments.iter().filter(|(_, s)| s.stream.is_none()).map(|(&id, _)| id).collect();
    for id in &headerless {
        let name = segment_file_name(*id);
        storage.remove(&name).map_err(|e| io(format!("removing empty segment {name}"), e))?;
        segments.remove(id);
        state.recovery.segments_removed += 1;
    }
    if !damages.is_empty() || !headerless.is_empty() {
        storage.sync_directory().map_err(|e| io("syncing the directory".into(), e))?;
    }
    records.retain(|r| segments.contains_key(&r.segment));

    for (&id, scanned) in &segments {
        state.segments.insert(
            id,
            Segment {
                stream: scanned.stream.expect("kept segments have a header"),
                file: scanned.file.clone(),
                length: scanned.length,
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

    let promised = replay(state, records);
    for (&epoch, entry) in &state.epochs {
        match entry.phase {
            EpochPhase::Committed => {
                state.recovery.committed_epochs += 1;
                let expected = promised.get(&epoch).copied().unwrap_or(0);
                if entry.data_records != expected {
                    let sites: Vec<String> = damages
                        .iter()
                        .map(|d| {
                            format!("segment {} offset {} ({})", d.segment, d.offset, d.detail)
                        })
                        .collect();
                    return Err(OpenError::CommittedEpochIncomplete {
                        epoch,
                        detail: format!(
                            "its commit record promises {expected} data records but {} were found; damage seen at: {}",
                            entry.data_records,
                            if sites.is_empty() { "nowhere (records are missing)".to_string() } else { sites.join(", ") }
                        ),
                    });
                }
            }
            EpochPhase::Open => state.recovery.uncommitted_epochs += 1,
            _ => {}
        }
    }
    state.next_segment = max_segment + 1;
    state.recovery.duration_ms = started.elapsed().as_millis() as u64;
    crate::store::check_invariants(state);
    Ok(())
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
    if header.payload_bytes as u64 > knobs.record_payload_bytes_max.max(1 << 20) {
        return Err(format!("payload length {} exceeds the maximum", header.payload_bytes));
    }
    if header.offset.checked_add(header.payload_bytes as u64).is_none() {
        return Err(format!("data range at offset {} overflows", header.offset));
    }
    verify_payload(&header, bytes).map_err(str::to_string)?;
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
        let epoch = header.epoch;
        let segment = state.segments.get_mut(&record.segment).expect("replayed segment missing");
        segment.last_write_sequence = segment.last_write_sequence.max(header.sequence);
        let entry = state.epochs.entry(epoch).or_insert_with(EpochEntry::new);
        if header.kind == RecordKind::Data && !phase_is_live(entry.phase) {
            // An epoch id reused after its earlier incarnation was retired.
            *entry = EpochEntry::new();
        }
        match header.kind {
            RecordKind::SegmentHeader => unreachable!("segment headers are not replayed"),
            RecordKind::Data => {
                state.records.insert(
                    header.sequence,
                    RecordInfo {
                        location: Location::Ssd { segment: record.segment, offset: record.offset },
                        epoch,
                        payload_bytes: header.payload_bytes,
                    },
                );
                if header.payload_bytes > 0 {
                    state.index.insert(
                        epoch,
                        header.file,
                        header.offset,
                        Extent {
                            record: header.sequence,
                            skip: 0,
                            length: header.payload_bytes as u64,
                        },
                    );
                }
                entry.data_records += 1;
                entry.payload_bytes += header.payload_bytes as u64;
                entry.record_sequences.push(header.sequence);
                *entry.stream_bytes.entry(header.stream).or_default() += record.bytes;
                entry.recovered_uncommitted = true;
            }
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
                    let payload = CommitPayload::decode(&record.payload)
                        .expect("commit payload checked earlier");
                    promised.insert(epoch, payload.data_records);
                }
            }
            RecordKind::EpochState => {
                if phase_is_live(entry.phase) {
                    entry.phase = if header.offset == epoch_state_code::DRAINED {
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
                    state.index.remove_epoch(epoch);
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
    for entry in state.epochs.values() {
        for (&stream, &bytes) in &entry.stream_bytes {
            *state.stream_usage.entry(stream).or_default() += bytes;
        }
    }
    state.next_sequence = max_sequence.max(state.next_sequence - 1) + 1;
    promised
}
