//! Write slots (`Store::try_reserve_write`): the payload goes straight into the DRAM ring and the
//! write becomes visible only when published. A slot never holds its epoch open, never blocks a
//! commit or sync, and an abandoned one leaves no trace.

mod common;

use spillway_store::{Durability, EpochPhase, SimStorage, Storage, Store, WriteError};
use spillway_types::{EpochId, FileId, StreamKey, KIB};
use std::sync::Arc;

fn open_sim() -> (Arc<SimStorage>, Store) {
    let storage = SimStorage::new();
    let store =
        Store::open_with(&common::small_knobs(), storage.clone() as Arc<dyn Storage>).unwrap();
    (storage, store)
}

/// Fills a slot with `data`, piece by piece as a socket reader would.
fn fill(slot: &mut spillway_store::WriteSlot, data: &[u8]) {
    let mut at = 0;
    for buffer in slot.buffers() {
        buffer.copy_from_slice(&data[at..at + buffer.len()]);
        at += buffer.len();
    }
    assert_eq!(at, data.len());
}

/// Publishes a filled slot with the CRC of each buffer, as the server does after checking them.
fn publish(mut slot: spillway_store::WriteSlot) -> Result<(), WriteError> {
    let crcs: Vec<u32> = slot.buffers().iter().map(|buffer| crc32c::crc32c(buffer)).collect();
    slot.publish(&crcs)
}

/// The store as it opens after a power loss now (everything synced survives).
fn crash_and_reopen(storage: &SimStorage, store: Store) -> Store {
    let image = storage.crash_image(spillway_store::CrashPlan {
        torn_write_bytes: None,
        keep_older_unsynced: false,
    });
    drop(store);
    Store::open_with(&common::small_knobs(), image as Arc<dyn Storage>).unwrap()
}

fn reserve(store: &Store, epoch: u64, offset: u64, length: usize) -> spillway_store::WriteSlot {
    store
        .try_reserve_write(StreamKey(1), EpochId(epoch), FileId(0), offset, length)
        .unwrap()
        .expect("an empty ring has room for a slot")
}

#[test]
fn a_published_slot_reads_back_and_survives_commit_and_crash() {
    let (storage, store) = open_sim();
    // 40 KiB spans three records of at most 16 KiB.
    let data = common::payload(1, 40 * KIB as usize);
    let mut slot = reserve(&store, 1, 1000, data.len());
    assert_eq!(slot.len(), data.len());
    assert_eq!(slot.buffers().len(), 3);
    fill(&mut slot, &data);
    let mut back = vec![0xAAu8; data.len()];
    store.read(EpochId(1), FileId(0), 1000, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0), "an unpublished slot is visible");
    publish(slot).unwrap();
    store.read(EpochId(1), FileId(0), 1000, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(store.stats().user_payload_bytes, data.len() as u64);
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    store.check_invariants();
    let store = crash_and_reopen(&storage, store);
    let mut back = vec![0u8; data.len()];
    store.read(EpochId(1), FileId(0), 1000, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn a_slot_of_several_extents_publishes_each_at_its_offset_in_order() {
    let (storage, store) = open_sim();
    // Three strided extents, one of three records (40 KiB), and a last one overlapping the first:
    // the later extent wins where they overlap, as two writes in that order would.
    let (first, second, third) = (
        common::payload(3, 4 * KIB as usize),
        common::payload(4, 40 * KIB as usize),
        common::payload(5, KIB as usize),
    );
    let extents = [(0u64, first.len()), (64 * KIB, second.len()), (3 * KIB, third.len())];
    let mut slot = store
        .try_reserve_extents(StreamKey(1), EpochId(1), FileId(0), &extents)
        .unwrap()
        .expect("an empty ring has room");
    assert_eq!(slot.len(), first.len() + second.len() + third.len());
    assert_eq!(slot.buffers().len(), 1 + 3 + 1);
    let payload = [first.clone(), second.clone(), third.clone()].concat();
    fill(&mut slot, &payload);
    publish(slot).unwrap();
    let check = |store: &Store| {
        let mut back = vec![0xAAu8; 104 * KIB as usize];
        store.read(EpochId(1), FileId(0), 0, &mut back).unwrap();
        assert_eq!(&back[..3 * KIB as usize], &first[..3 * KIB as usize]);
        assert_eq!(&back[3 * KIB as usize..4 * KIB as usize], &third[..]);
        assert!(back[4 * KIB as usize..64 * KIB as usize].iter().all(|&b| b == 0), "the gap");
        assert_eq!(&back[64 * KIB as usize..], &second[..]);
    };
    check(&store);
    assert_eq!(store.stat(EpochId(1), FileId(0)).unwrap().size_bytes, 104 * KIB);
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    store.check_invariants();
    let store = crash_and_reopen(&storage, store);
    check(&store);
}

#[test]
fn a_slot_of_several_extents_is_refused_whole_when_one_is_out_of_bounds() {
    let (_storage, store) = open_sim();
    let extents = [(0u64, 10usize), (u64::MAX - 4, 10)];
    assert!(matches!(
        store.try_reserve_extents(StreamKey(1), EpochId(1), FileId(0), &extents),
        Err(WriteError::OffsetOverflow { .. })
    ));
    assert_eq!(store.stats().dram_used_bytes, 0);
    assert_eq!(store.stream_usage_bytes(StreamKey(1)), 0);
    store.check_invariants();
}

#[test]
fn an_abandoned_slot_writes_nothing_and_returns_its_space() {
    let (_storage, store) = open_sim();
    let free = store.free_bytes();
    let mut slot = reserve(&store, 1, 0, 20 * KIB as usize);
    assert!(store.free_bytes() < free);
    fill(&mut slot, &common::payload(2, 20 * KIB as usize));
    drop(slot);
    assert_eq!(store.free_bytes(), free);
    assert_eq!(store.stream_usage_bytes(StreamKey(1)), 0);
    assert_eq!(store.stats().dram_used_bytes, 0, "the abandoned ring space was not released");
    let mut back = vec![0xAAu8; 20 * KIB as usize];
    store.read(EpochId(1), FileId(0), 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
    store.check_invariants();
    // The ring is whole again: a later write lands and commits.
    store.write(StreamKey(1), EpochId(1), FileId(0), 0, b"after").unwrap();
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    store.check_invariants();
}

#[test]
fn a_commit_or_sync_does_not_wait_for_a_slot_and_a_late_publish_is_refused() {
    let (_storage, store) = open_sim();
    store.write(StreamKey(1), EpochId(1), FileId(0), 0, b"before the slot").unwrap();
    let mut slot = reserve(&store, 1, 100, 4096);
    fill(&mut slot, &[7; 4096]);
    // A connection's executor may commit (or sync) while its reader still holds the next
    // write's slot: neither waits for it, or the two would deadlock.
    store.sync().unwrap();
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    match publish(slot) {
        Err(WriteError::EpochNotOpen { epoch, phase }) => {
            assert_eq!((epoch, phase), (EpochId(1), EpochPhase::Committed));
        }
        other => panic!("publish into a committed epoch: {other:?}"),
    }
    let info = store.stat(EpochId(1), FileId(0)).unwrap();
    assert_eq!(info.size_bytes, 15, "the refused slot changed the file: {info:?}");
    assert_eq!(store.stats().dram_used_bytes, 0);
    store.check_invariants();
}

#[test]
fn a_slot_in_a_deleted_epoch_is_refused_and_its_space_returns() {
    let (_storage, store) = open_sim();
    let mut slot = reserve(&store, 3, 0, 8192);
    fill(&mut slot, &[1; 8192]);
    store.write(StreamKey(1), EpochId(3), FileId(0), 0, b"x").unwrap();
    store.delete_epoch(EpochId(3)).unwrap();
    assert!(matches!(
        publish(slot),
        Err(WriteError::EpochNotOpen { phase: EpochPhase::Deleted, .. })
    ));
    assert_eq!(store.stream_usage_bytes(StreamKey(1)), 0);
    store.check_invariants();
}

#[test]
fn slots_are_refused_by_the_same_admission_as_writes() {
    let (_storage, store) = open_sim();
    store.write(StreamKey(1), EpochId(1), FileId(0), 0, b"x").unwrap();
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    assert!(matches!(
        store.try_reserve_write(StreamKey(1), EpochId(1), FileId(0), 0, 10),
        Err(WriteError::EpochNotOpen { .. })
    ));
    store.set_stream_quota(StreamKey(2), Some(4 * KIB));
    assert!(matches!(
        store.try_reserve_write(StreamKey(2), EpochId(2), FileId(0), 0, 8 * KIB as usize),
        Err(WriteError::OutOfSpace { .. })
    ));
    assert!(matches!(
        store.try_reserve_write(StreamKey(1), EpochId(2), FileId(0), u64::MAX - 4, 10),
        Err(WriteError::OffsetOverflow { .. })
    ));
    assert_eq!(store.stream_usage_bytes(StreamKey(2)), 0);
    store.check_invariants();
}

#[test]
fn no_slot_above_the_high_watermark_and_held_slots_pin_the_ring() {
    let (_storage, store) = open_sim();
    // 256 KiB of DRAM, high watermark 75 % (192 KiB): eleven slots of 16 KiB records fit
    // under it, the twelfth would cross it and is refused (the caller then uses `write`).
    let mut held = Vec::new();
    for i in 0..11u64 {
        let mut slot = reserve(&store, 1, i * 16 * KIB, 16 * KIB as usize);
        fill(&mut slot, &common::payload(i, 16 * KIB as usize));
        held.push(slot);
    }
    assert!(store
        .try_reserve_write(StreamKey(1), EpochId(1), FileId(0), 0, 16 * KIB as usize)
        .unwrap()
        .is_none());
    // Writes still go through (straight to SSD) while the slots pin the ring.
    store
        .write(
            StreamKey(1),
            EpochId(1),
            FileId(0),
            11 * 16 * KIB,
            &common::payload(11, 16 * KIB as usize),
        )
        .unwrap();
    assert!(store.stats().write_through_records > 0);
    for slot in held {
        publish(slot).unwrap();
    }
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    for i in 0..12u64 {
        let mut back = vec![0u8; 16 * KIB as usize];
        store.read(EpochId(1), FileId(0), i * 16 * KIB, &mut back).unwrap();
        assert!(back == common::payload(i, 16 * KIB as usize), "record {i} differs");
    }
    store.check_invariants();
}

#[test]
fn concurrent_slots_and_writes_from_many_threads_all_land() {
    let (_storage, store) = open_sim();
    let store = Arc::new(store);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..64u64 {
                    let offset = (t * 64 + i) * 6000;
                    let data = common::payload(t * 1000 + i, 6000);
                    match store
                        .try_reserve_write(StreamKey(t), EpochId(1), FileId(t), offset, data.len())
                        .unwrap()
                    {
                        Some(mut slot) => {
                            fill(&mut slot, &data);
                            publish(slot).unwrap();
                        }
                        None => {
                            store.write(StreamKey(t), EpochId(1), FileId(t), offset, &data).unwrap()
                        }
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    for t in 0..4u64 {
        for i in 0..64u64 {
            let mut back = vec![0u8; 6000];
            store.read(EpochId(1), FileId(t), (t * 64 + i) * 6000, &mut back).unwrap();
            assert!(back == common::payload(t * 1000 + i, 6000), "thread {t} write {i} differs");
        }
    }
    store.check_invariants();
}
