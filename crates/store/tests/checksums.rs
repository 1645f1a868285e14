//! Write-time checksums: a record keeps the CRC its writer took (the client's, checked by the
//! server on receipt) from ingest on, and every read that serves data checks the whole record
//! against it, in DRAM and on SSD. Damage after ingest fails the read, naming the epoch, the
//! file, the record's range and where it lives; no wrong byte is returned.

mod common;

use spillway_store::{Durability, ReadError, SimStorage, Storage, Store};
use spillway_types::{EpochId, FileId, StreamKey, KIB};
use std::sync::Arc;

const RECORD: u64 = 16 * KIB;

fn open_sim() -> Store {
    let storage = SimStorage::new();
    Store::open_with(&common::small_knobs(), storage as Arc<dyn Storage>).unwrap()
}

/// Writes 40 KiB (three records of at most 16 KiB) at offset 0 of (epoch, file 1) with the
/// CRC of each piece, as the server hands them over.
fn write_three_records(store: &Store, epoch: u64) -> Vec<u8> {
    let data = common::payload(epoch, 40 * KIB as usize);
    let crcs: Vec<u32> = data.chunks(RECORD as usize).map(crc32c::crc32c).collect();
    store.write_with_crcs(StreamKey(1), EpochId(epoch), FileId(1), 0, &data, &crcs).unwrap();
    data
}

/// Reads `length` bytes at `offset` and expects the checksum error for the record at
/// `record_offset` of the 40 KiB written, at a location starting with `tier`.
fn expect_mismatch(
    store: &Store,
    epoch: u64,
    offset: u64,
    length: usize,
    record_offset: u64,
    tier: &str,
) {
    let mut back = vec![0xEEu8; length];
    match store.read(EpochId(epoch), FileId(1), offset, &mut back) {
        Err(error @ ReadError::ChecksumMismatch { .. }) => {
            let ReadError::ChecksumMismatch {
                epoch: e, file, offset: at, length, location, ..
            } = &error
            else {
                unreachable!()
            };
            assert_eq!(
                (*e, *file, *at, *length),
                (EpochId(epoch), FileId(1), record_offset, RECORD.min(40 * KIB - record_offset))
            );
            assert!(location.starts_with(tier), "{error}");
            let message = error.to_string();
            assert!(
                message.contains(&format!("epoch {epoch} file 1 bytes {record_offset}..")),
                "{message}"
            );
        }
        other => panic!("read of a damaged record at {offset}+{length}: {other:?}"),
    }
}

#[test]
fn a_record_damaged_in_dram_fails_every_read_of_it() {
    let store = open_sim();
    let data = write_three_records(&store, 1);
    let location = store.inject_corruption(EpochId(1), FileId(1), 20_000).unwrap().unwrap();
    assert!(location.starts_with("DRAM"), "the record should still be in DRAM: {location}");
    // The whole file, the damaged byte alone, and a part of the record without the damaged byte.
    expect_mismatch(&store, 1, 0, data.len(), RECORD, "DRAM");
    expect_mismatch(&store, 1, 20_000, 1, RECORD, "DRAM");
    expect_mismatch(&store, 1, RECORD, 100, RECORD, "DRAM");
    // The other records still read, bit exact.
    let mut first = vec![0u8; RECORD as usize];
    store.read(EpochId(1), FileId(1), 0, &mut first).unwrap();
    assert!(first[..] == data[..RECORD as usize]);
    let mut last = vec![0u8; data.len() - 2 * RECORD as usize];
    store.read(EpochId(1), FileId(1), 2 * RECORD, &mut last).unwrap();
    assert!(last[..] == data[2 * RECORD as usize..]);
    store.check_invariants();
}

#[test]
fn a_record_damaged_on_ssd_fails_whole_and_partial_reads() {
    let store = open_sim();
    let data = write_three_records(&store, 2);
    store.commit(EpochId(2), Durability::Ssd).unwrap();
    let location = store.inject_corruption(EpochId(2), FileId(1), 2 * RECORD + 5).unwrap().unwrap();
    assert!(location.starts_with("segment"), "a committed record should be on SSD: {location}");
    expect_mismatch(&store, 2, 0, data.len(), 2 * RECORD, "segment");
    expect_mismatch(&store, 2, 2 * RECORD, data.len() - 2 * RECORD as usize, 2 * RECORD, "segment");
    // A read of part of the record, not covering the damaged byte, is checked too.
    expect_mismatch(&store, 2, 2 * RECORD + 100, 10, 2 * RECORD, "segment");
    let mut head = vec![0u8; 2 * RECORD as usize];
    store.read(EpochId(2), FileId(1), 0, &mut head).unwrap();
    assert!(head[..] == data[..2 * RECORD as usize]);
}

#[test]
fn the_record_keeps_the_writers_crc_not_one_taken_of_its_own_bytes() {
    // A payload that changed between the writer's checksum and the store (what a bug in the
    // slot path would do) is caught at the first read, in DRAM and after it reached SSD.
    let store = open_sim();
    let data = common::payload(3, 10 * KIB as usize);
    let mut changed = data.clone();
    changed[77] ^= 0x40;
    store
        .write_with_crcs(StreamKey(1), EpochId(3), FileId(1), 0, &changed, &[crc32c::crc32c(&data)])
        .unwrap();
    let mut back = vec![0u8; data.len()];
    assert!(matches!(
        store.read(EpochId(3), FileId(1), 0, &mut back),
        Err(ReadError::ChecksumMismatch { location, .. }) if location.starts_with("DRAM")
    ));
    store.commit(EpochId(3), Durability::Ssd).unwrap();
    // Committed, the record is on SSD and its ring copy is a clean cache: both are checked.
    assert!(matches!(
        store.read(EpochId(3), FileId(1), 0, &mut back),
        Err(ReadError::ChecksumMismatch { location, .. }) if location.starts_with("DRAM")
    ));
    assert!(store.evict_cached() > 0, "the committed record kept no cached copy");
    assert!(matches!(
        store.read(EpochId(3), FileId(1), 0, &mut back),
        Err(ReadError::ChecksumMismatch { location, .. }) if location.starts_with("segment")
    ));
}

#[test]
fn write_slots_keep_the_crcs_they_are_published_with() {
    let store = open_sim();
    let data = common::payload(4, 40 * KIB as usize);
    let mut slot = store
        .try_reserve_write(StreamKey(1), EpochId(4), FileId(1), 0, data.len())
        .unwrap()
        .expect("an empty ring has room for a slot");
    let mut crcs = Vec::new();
    let mut at = 0;
    for buffer in slot.buffers() {
        buffer.copy_from_slice(&data[at..at + buffer.len()]);
        crcs.push(crc32c::crc32c(buffer));
        at += buffer.len();
    }
    // The second piece's CRC is wrong: its record fails reads, the others do not.
    crcs[1] ^= 1;
    slot.publish(&crcs).unwrap();
    expect_mismatch(&store, 4, RECORD + 1, 1, RECORD, "DRAM");
    let mut first = vec![0u8; RECORD as usize];
    store.read(EpochId(4), FileId(1), 0, &mut first).unwrap();
    assert!(first[..] == data[..RECORD as usize]);
}

#[test]
fn reads_return_the_crc_of_their_bytes_derived_from_the_write_time_crcs() {
    // Records at 1000..41960 and a second write after a hole; ranges cover whole records,
    // parts of records, holes before, between and after, from DRAM and then from SSD.
    let store = open_sim();
    let data = common::payload(5, 40 * KIB as usize);
    let crcs: Vec<u32> = data.chunks(RECORD as usize).map(crc32c::crc32c).collect();
    store.write_with_crcs(StreamKey(1), EpochId(5), FileId(1), 1000, &data, &crcs).unwrap();
    store.write(StreamKey(1), EpochId(5), FileId(1), 60_000, b"after a hole").unwrap();
    let ranges = [
        (0u64, 70_000usize),
        (1000, 40 * KIB as usize),
        (5000, 20_000),
        (41_000, 20_000),
        (17_000, 1),
    ];
    for durability in [None, Some(Durability::Ssd)] {
        if let Some(durability) = durability {
            store.commit(EpochId(5), durability).unwrap();
        }
        for (offset, length) in ranges {
            let mut back = vec![0xEEu8; length];
            let crc = store.read_with_crc(EpochId(5), FileId(1), offset, &mut back).unwrap();
            assert_eq!(crc, crc32c::crc32c(&back), "{offset}+{length} after {durability:?}");
        }
    }
    // A record written with a CRC other than its bytes' shows in the CRC a read returns
    // (it is the write-time one), and fails the read.
    let mut changed = data[..100].to_vec();
    changed[3] ^= 1;
    store
        .write_with_crcs(
            StreamKey(1),
            EpochId(6),
            FileId(1),
            0,
            &changed,
            &[crc32c::crc32c(&data[..100])],
        )
        .unwrap();
    let mut back = vec![0u8; 100];
    assert!(store.read_with_crc(EpochId(6), FileId(1), 0, &mut back).is_err());
}
