//! Bad input on the SSD: flipped bits in the middle of a segment are detected at open and
//! reported with the segment and the offset of the damaged record; the store refuses to serve
//! silently wrong data. A torn tail beyond the last sync point is cut instead.

mod common;

use spillway_store::{format, Durability, OpenError, SimStorage, Storage, Store};
use spillway_types::{EpochId, FileId, SegmentId, StreamKey};
use std::sync::Arc;

/// Three committed epochs on one stream, spread over several 64 KiB segments. Returns the
/// storage and the name and length of the first data segment.
fn committed_store() -> (Arc<SimStorage>, String, u64) {
    let knobs = common::small_knobs();
    let storage = SimStorage::new();
    let store = Store::open_with(&knobs, storage.clone() as Arc<dyn Storage>).unwrap();
    for epoch in 1..=3u64 {
        for file in 0..2u64 {
            let data = common::payload(epoch * 10 + file, 50_000);
            store.write(StreamKey(5), EpochId(epoch), FileId(file), 0, &data).unwrap();
        }
        store.commit(EpochId(epoch), Durability::Ssd).unwrap();
    }
    store.close().unwrap();
    // Find a data segment (stream 5) that is not the last one.
    let mut data_segments = Vec::new();
    for (name, length) in storage.files() {
        if format::parse_segment_file_name(&name).is_none() {
            continue;
        }
        let file = (storage.clone() as Arc<dyn Storage>).open(&name).unwrap();
        let mut header = vec![0u8; format::HEADER_BYTES];
        file.read_at(0, &mut header).unwrap();
        if format::RecordHeader::decode(&header).unwrap().stream == StreamKey(5) {
            data_segments.push((name, length));
        }
    }
    assert!(data_segments.len() >= 3, "expected several data segments, got {data_segments:?}");
    let (name, length) = data_segments.swap_remove(0);
    (storage, name, length)
}

#[test]
fn flipped_payload_byte_mid_segment_is_reported_with_segment_and_offset() {
    let (storage, name, length) = committed_store();
    let flipped = length / 2;
    storage.corrupt(&name, flipped);
    let error = match Store::open_with(&common::small_knobs(), storage as Arc<dyn Storage>) {
        Ok(_) => panic!("a corrupt segment was accepted"),
        Err(error) => error,
    };
    let message = error.to_string();
    match error {
        OpenError::Corrupt { segment, offset, .. } => {
            assert_eq!(Some(segment), format::parse_segment_file_name(&name), "{message}");
            // The reported offset is the start of the record holding the flipped byte.
            assert!(offset <= flipped && flipped - offset < 16 * 1024 + 64, "{message}");
            assert_eq!(offset % 8, 0);
        }
        other => panic!("wrong error: {other}"),
    }
    assert!(message.contains("segment") && message.contains("offset"), "{message}");
}

#[test]
fn flipped_header_byte_is_reported_too() {
    let (storage, name, _) = committed_store();
    // Byte 64 + 20 is inside the stream field of the first record after the segment header.
    storage.corrupt(&name, 64 + 20);
    match Store::open_with(&common::small_knobs(), storage as Arc<dyn Storage>) {
        Err(OpenError::Corrupt { segment, offset, detail }) => {
            assert_eq!(Some(segment), format::parse_segment_file_name(&name));
            assert_eq!(offset, 64, "{detail}");
        }
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("a corrupt header was accepted"),
    }
}

#[test]
fn garbage_after_the_last_sync_point_is_a_torn_tail() {
    let (storage, name, length) = committed_store();
    // Half a record of garbage appended after the fsync'd end: what a crash mid-append leaves.
    let file = (storage.clone() as Arc<dyn Storage>).open(&name).unwrap();
    let mut junk = format::encode_record(
        &format::RecordHeader {
            kind: format::RecordKind::Data,
            sequence: 1 << 40,
            stream: StreamKey(5),
            epoch: EpochId(9),
            file: FileId(0),
            offset: 0,
            payload_bytes: 1000,
        },
        &[7u8; 1000],
    );
    junk.truncate(500);
    file.write_at(length, &junk).unwrap();
    file.sync().unwrap();
    let store =
        Store::open_with(&common::small_knobs(), storage.clone() as Arc<dyn Storage>).unwrap();
    let segment: SegmentId = format::parse_segment_file_name(&name).unwrap();
    assert_eq!(store.stats().recovery.truncated, vec![(segment, length)]);
    for epoch in 1..=3u64 {
        let mut back = vec![0u8; 50_000];
        store.read(EpochId(epoch), FileId(1), 0, &mut back).unwrap();
        assert!(back == common::payload(epoch * 10 + 1, 50_000));
    }
    assert!(store.epochs().iter().all(|e| e.epoch != EpochId(9)));
}

#[test]
fn damage_after_open_is_caught_when_a_whole_record_is_read() {
    let (storage, name, length) = committed_store();
    let store =
        Store::open_with(&common::small_knobs(), storage.clone() as Arc<dyn Storage>).unwrap();
    // Bad media after recovery verified everything: flip a payload byte under the running store.
    storage.corrupt(&name, length / 2);
    let mut failures = Vec::new();
    for epoch in 1..=3u64 {
        for file in 0..2u64 {
            // Record-sized reads (16 KiB records) as a drain would do them.
            for offset in (0..50_000u64).step_by(16 * 1024) {
                let mut back = vec![0u8; (50_000 - offset).min(16 * 1024) as usize];
                if let Err(error) = store.read(EpochId(epoch), FileId(file), offset, &mut back) {
                    failures.push(error.to_string());
                }
            }
        }
    }
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0]
            .contains(&format!("segment {}", format::parse_segment_file_name(&name).unwrap())),
        "{failures:?}"
    );
}
