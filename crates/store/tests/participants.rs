//! Participants: the union of the servers commits named, recorded fsync'd (so it survives a
//! power loss), restored by recovery, unchanged unions write nothing, dropped with a deleted
//! epoch, bad entries refused by name.

mod common;

use std::sync::Arc;

use spillway_store::{
    CrashPlan, Durability, EpochParticipant, ParticipantsError, SimStorage, Storage, Store,
};
use spillway_types::{EpochId, FileId, StreamKey};

fn open(storage: &Arc<SimStorage>) -> Store {
    Store::open_with(&common::small_knobs(), storage.clone() as Arc<dyn Storage>).unwrap()
}

fn participant(byte: u8, address: &str) -> EpochParticipant {
    EpochParticipant { id: [byte; 16], address: address.into() }
}

#[test]
fn the_union_is_recorded_fsynced_and_survives_power_loss() {
    let storage = SimStorage::new();
    let store = open(&storage);
    let (epoch, deleted) = (EpochId(3), EpochId(4));
    for e in [epoch, deleted] {
        store.write(StreamKey(1), e, FileId(1), 0, b"part").unwrap();
    }
    assert!(store.record_participants(epoch, &[participant(2, "b"), participant(1, "a")]).unwrap());
    store.commit(epoch, Durability::Ssd).unwrap();
    assert!(
        store.record_participants(epoch, &[participant(3, "c")]).unwrap(),
        "a second committer"
    );
    let written = store.stats().metadata_bytes;
    assert!(!store.record_participants(epoch, &[participant(1, "a")]).unwrap());
    assert_eq!(store.stats().metadata_bytes, written, "an unchanged union writes nothing");
    assert!(store.record_participants(deleted, &[participant(9, "z")]).unwrap());
    store.delete_epoch(deleted).unwrap();
    assert!(!store.record_participants(EpochId(99), &[participant(1, "a")]).unwrap());
    let expected = vec![participant(1, "a"), participant(2, "b"), participant(3, "c")];
    assert_eq!(store.participants(epoch), expected);
    assert!(store.participants(deleted).is_empty(), "dropped with the deleted epoch");

    let lost =
        storage.crash_image(CrashPlan { torn_write_bytes: Some(10), keep_older_unsynced: false });
    let killed = storage
        .crash_image(CrashPlan { torn_write_bytes: Some(u64::MAX), keep_older_unsynced: true });
    drop(store);
    let store = open(&lost);
    assert_eq!(store.participants(epoch), expected, "recorded before returning");
    drop(store);
    let store = open(&killed);
    assert_eq!(store.participants(epoch), expected);
    assert!(store.participants(deleted).is_empty(), "dropped with the deleted epoch by replay");
}

#[test]
fn a_zero_id_or_an_overlong_address_is_refused_by_name() {
    let storage = SimStorage::new();
    let store = open(&storage);
    let epoch = EpochId(1);
    store.write(StreamKey(1), epoch, FileId(1), 0, b"x").unwrap();
    assert!(matches!(
        store.record_participants(epoch, &[participant(0, "a")]),
        Err(ParticipantsError::ZeroId { .. })
    ));
    let long = participant(1, &"x".repeat(256));
    assert!(matches!(
        store.record_participants(epoch, &[long]),
        Err(ParticipantsError::AddressTooLong { bytes: 256, .. })
    ));
    assert!(store.participants(epoch).is_empty());
}
