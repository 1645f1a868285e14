//! Grants: recorded, replaced, kept, revoked and dropped with their epoch; restored by recovery
//! after a process kill and after a power loss (grant and revoke return once fsync'd); kept
//! through compaction; and the granted capacity refusing a write whole.

mod common;

use std::sync::Arc;

use spillway_config::StoreKnobs;
use spillway_store::format::{encode_record, RecordHeader, RecordKind, META_STREAM};
use spillway_store::{
    CrashPlan, Durability, EpochGrant, EpochPhase, GrantError, GrantMode, GrantOutcome, OpenError,
    SimStorage, Storage, Store, WriteError,
};
use spillway_types::{EpochId, FileId, StreamKey, GRANT_ALLOWED_IDS_MAX, KIB};

fn open(knobs: &StoreKnobs, storage: &Arc<SimStorage>) -> Store {
    Store::open_with(knobs, storage.clone() as Arc<dyn Storage>).unwrap()
}

fn owned_by(uid: u32) -> EpochGrant {
    EpochGrant { owner_uid: uid, owner_gid: uid, ..EpochGrant::default() }
}

/// A reservation's grant as the manager sends it (lists out of order, one duplicate).
fn reservation_grant() -> EpochGrant {
    EpochGrant {
        owner_uid: 1000,
        owner_gid: 100,
        allowed_uids: vec![1003, 1001, 1003],
        allowed_gids: vec![60, 50],
        capacity_bytes: 512 * KIB,
        reservation_capacity_bytes: 1024 * KIB,
        stream: Some(StreamKey((1 << 63) | 2)),
    }
}

fn canonical_reservation_grant() -> EpochGrant {
    EpochGrant { allowed_uids: vec![1001, 1003], allowed_gids: vec![50, 60], ..reservation_grant() }
}

/// Epochs 1..=6 in every grant state: 1 granted then replaced, 2 claimed, 3 revoked, 4 deleted,
/// 5 drained, 6 claimed by a first writer and then kept against a second.
fn grant_every_way(store: &Store) {
    let epoch = EpochId(1);
    assert_eq!(
        store.grant_epoch(epoch, owned_by(7), GrantMode::Replace).unwrap(),
        GrantOutcome::Recorded
    );
    assert_eq!(
        store.grant_epoch(epoch, reservation_grant(), GrantMode::Replace).unwrap(),
        GrantOutcome::Recorded
    );
    assert_eq!(
        store.grant(epoch),
        Some(canonical_reservation_grant()),
        "lists sorted, deduplicated"
    );
    let written = store.stats().metadata_bytes;
    assert_eq!(
        store.grant_epoch(epoch, reservation_grant(), GrantMode::Replace).unwrap(),
        GrantOutcome::Unchanged
    );
    assert_eq!(store.stats().metadata_bytes, written, "an unchanged grant writes nothing");

    store.grant_epoch(EpochId(2), owned_by(1002), GrantMode::IfAbsent).unwrap();
    store.grant_epoch(EpochId(3), owned_by(1003), GrantMode::Replace).unwrap();
    assert!(store.revoke_grant(EpochId(3)).unwrap());
    assert!(!store.revoke_grant(EpochId(3)).unwrap(), "nothing left to revoke");
    assert!(!store.revoke_grant(EpochId(99)).unwrap(), "an unknown epoch has no grant");

    for epoch in [EpochId(4), EpochId(5)] {
        store.grant_epoch(epoch, owned_by(1004), GrantMode::Replace).unwrap();
        store.write(StreamKey(1004), epoch, FileId(1), 0, &common::payload(epoch.0, 5000)).unwrap();
        store.commit(epoch, Durability::Ssd).unwrap();
    }
    store.delete_epoch(EpochId(4)).unwrap();
    assert_eq!(store.grant(EpochId(4)), None, "deleting an epoch removes its grant");
    assert!(matches!(
        store.grant_epoch(EpochId(4), owned_by(1004), GrantMode::Replace),
        Err(GrantError::EpochDeleted { .. })
    ));
    store.mark_drained(EpochId(5)).unwrap();
    assert_eq!(store.grant(EpochId(5)), Some(owned_by(1004)), "a drained epoch keeps its grant");

    assert_eq!(
        store.grant_epoch(EpochId(6), owned_by(1006), GrantMode::IfAbsent).unwrap(),
        GrantOutcome::Recorded
    );
    assert_eq!(
        store.grant_epoch(EpochId(6), owned_by(1066), GrantMode::IfAbsent).unwrap(),
        GrantOutcome::Kept(owned_by(1006)),
        "a second claim keeps the first"
    );
}

fn assert_grants_after_grant_every_way(store: &Store, context: &str) {
    assert_eq!(store.grant(EpochId(1)), Some(canonical_reservation_grant()), "{context}: replaced");
    assert_eq!(store.grant(EpochId(2)), Some(owned_by(1002)), "{context}: claimed");
    assert_eq!(store.grant(EpochId(3)), None, "{context}: revoked");
    assert_eq!(store.grant(EpochId(4)), None, "{context}: deleted");
    assert_eq!(store.grant(EpochId(5)), Some(owned_by(1004)), "{context}: drained");
    assert_eq!(store.grant(EpochId(6)), Some(owned_by(1006)), "{context}: kept");
    let phase = |epoch| store.epoch(EpochId(epoch)).map(|e| e.phase);
    assert_eq!(phase(1), Some(EpochPhase::Open), "{context}: a granted epoch exists, empty");
    assert_eq!(phase(4), Some(EpochPhase::Deleted), "{context}");
    store.check_invariants();
}

#[test]
fn grants_survive_a_process_kill() {
    let knobs = common::small_knobs();
    let storage = SimStorage::new();
    let store = open(&knobs, &storage);
    grant_every_way(&store);
    // SIGKILL: every write the process made is in the page cache and survives; DRAM is lost.
    let killed = storage
        .crash_image(CrashPlan { torn_write_bytes: Some(u64::MAX), keep_older_unsynced: true });
    drop(store);
    let store = open(&knobs, &killed);
    assert_grants_after_grant_every_way(&store, "after a kill");
}

#[test]
fn grants_survive_power_loss_because_they_return_fsynced() {
    let knobs = common::small_knobs();
    let storage = SimStorage::new();
    let store = open(&knobs, &storage);
    grant_every_way(&store);
    // Power loss: every write not fsync'd is dropped, the last one torn.
    let lost =
        storage.crash_image(CrashPlan { torn_write_bytes: Some(10), keep_older_unsynced: false });
    drop(store);
    let store = open(&knobs, &lost);
    assert_grants_after_grant_every_way(&store, "after a power loss");
    // And on a real directory, a reopen after a drop without close.
    let dir = tempfile::tempdir().unwrap();
    let knobs = StoreKnobs { ssd_directory: dir.path().display().to_string(), ..knobs };
    let store = Store::open(&knobs).unwrap();
    grant_every_way(&store);
    drop(store);
    assert_grants_after_grant_every_way(&Store::open(&knobs).unwrap(), "on a real directory");
}

#[test]
fn grants_are_bounded_and_never_name_the_metadata_stream() {
    let store = open(&common::small_knobs(), &SimStorage::new());
    let mut grant = owned_by(1);
    grant.allowed_gids = (0..=GRANT_ALLOWED_IDS_MAX as u32).collect();
    let error = store.grant_epoch(EpochId(1), grant, GrantMode::Replace).unwrap_err();
    assert!(matches!(error, GrantError::TooManyAllowedIds { what: "gids", .. }), "{error}");
    let mut grant = owned_by(1);
    grant.allowed_uids = (0..GRANT_ALLOWED_IDS_MAX as u32).collect();
    grant.allowed_gids = (0..GRANT_ALLOWED_IDS_MAX as u32).collect();
    store.grant_epoch(EpochId(1), grant.clone(), GrantMode::Replace).unwrap();
    let grant = EpochGrant { stream: Some(META_STREAM), ..owned_by(1) };
    let error = store.grant_epoch(EpochId(2), grant, GrantMode::Replace).unwrap_err();
    assert!(matches!(error, GrantError::ReservedStream { .. }), "{error}");
    assert_eq!(store.grant(EpochId(2)), None);
    store.check_invariants();
}

#[test]
fn granted_capacity_refuses_a_write_whole_and_holds_after_restart() {
    let knobs = common::small_knobs();
    let storage = SimStorage::new();
    let store = open(&knobs, &storage);
    let (epoch, file, stream) = (EpochId(1), FileId(1), StreamKey(1000));
    let grant = EpochGrant { capacity_bytes: 100 * KIB, ..owned_by(1000) };
    store.grant_epoch(epoch, grant, GrantMode::Replace).unwrap();
    let first = common::payload(1, 60 * KIB as usize);
    store.write(stream, epoch, file, 0, &first).unwrap();
    // 50 KiB more would make 110 KiB: refused, nothing of it stored (it spans several records).
    let error = store.write(stream, epoch, file, 60 * KIB, &common::payload(2, 50 * KIB as usize));
    assert!(
        matches!(
            error,
            Err(WriteError::GrantCapacityExceeded { capacity_bytes, used_bytes, needed_bytes, .. })
                if capacity_bytes == 100 * KIB && used_bytes == 60 * KIB && needed_bytes == 50 * KIB
        ),
        "{error:?}"
    );
    assert_eq!(store.epoch(epoch).unwrap().payload_bytes, 60 * KIB);
    assert_eq!(store.stat(epoch, file).unwrap().size_bytes, 60 * KIB);
    // A write slot holds its bytes against the capacity until it is published or dropped.
    let slot = store.try_reserve_write(stream, epoch, file, 60 * KIB, 30 * KIB as usize).unwrap();
    let slot = slot.expect("DRAM has room for a slot");
    let squeezed = store.write(stream, epoch, file, 90 * KIB, &[7u8; 20 * 1024]);
    assert!(matches!(squeezed, Err(WriteError::GrantCapacityExceeded { .. })), "{squeezed:?}");
    drop(slot);
    store.write(stream, epoch, file, 60 * KIB, &[7u8; 20 * 1024]).unwrap();
    // Overwrites count again (the old bytes stay in the log until the epoch is drained).
    let overwrite = store.write(stream, epoch, file, 0, &first[..30 * 1024]);
    assert!(matches!(overwrite, Err(WriteError::GrantCapacityExceeded { .. })), "{overwrite:?}");
    store.commit(epoch, Durability::Ssd).unwrap();
    store.check_invariants();
    drop(store);

    // After a restart the epoch's bytes are counted again; a raised grant lets more in.
    let store = open(
        &knobs,
        &storage.crash_image(CrashPlan { torn_write_bytes: None, keep_older_unsynced: false }),
    );
    assert_eq!(store.epoch(epoch).unwrap().payload_bytes, 80 * KIB);
    let (epoch, file) = (EpochId(2), FileId(1));
    store
        .grant_epoch(
            epoch,
            EpochGrant { capacity_bytes: 8 * KIB, ..owned_by(1000) },
            GrantMode::Replace,
        )
        .unwrap();
    store.write(stream, epoch, file, 0, &[1u8; 8 * 1024]).unwrap();
    assert!(store.write(stream, epoch, file, 8 * KIB, &[1u8]).is_err());
    store
        .grant_epoch(
            epoch,
            EpochGrant { capacity_bytes: 9 * KIB, ..owned_by(1000) },
            GrantMode::Replace,
        )
        .unwrap();
    store.write(stream, epoch, file, 8 * KIB, &[1u8; 1024]).unwrap();
    store.check_invariants();
}

#[test]
fn compaction_and_gc_keep_grants_of_live_epochs() {
    let knobs = common::small_knobs();
    let storage = SimStorage::new();
    let store = open(&knobs, &storage);
    let kept = EpochId(1);
    store.grant_epoch(kept, reservation_grant(), GrantMode::Replace).unwrap();
    store.write(StreamKey(1), kept, FileId(1), 0, &common::payload(1, 4000)).unwrap();
    store.commit(kept, Durability::Ssd).unwrap();
    // Many short-lived granted epochs fill metadata segments with records that die.
    for epoch in 2..600u64 {
        store.grant_epoch(EpochId(epoch), owned_by(epoch as u32), GrantMode::Replace).unwrap();
        store
            .write(StreamKey(1), EpochId(epoch), FileId(1), 0, &common::payload(epoch, 3000))
            .unwrap();
        store.commit(EpochId(epoch), Durability::Ssd).unwrap();
        store.delete_epoch(EpochId(epoch)).unwrap();
    }
    let report = store.compact_now().unwrap();
    assert!(report.segments_deleted > 0 && report.segments_compacted > 0, "{report:?}");
    store.check_invariants();
    drop(store);
    let store = open(
        &knobs,
        &storage.crash_image(CrashPlan { torn_write_bytes: None, keep_older_unsynced: false }),
    );
    assert_eq!(store.grant(kept), Some(canonical_reservation_grant()));
    assert!((2..600).all(|epoch| store.grant(EpochId(epoch)).is_none()));
    store.check_invariants();
}

#[test]
fn a_grant_record_that_does_not_decode_is_corruption_named_by_segment_and_offset() {
    let storage = SimStorage::new();
    let file = storage.create("segment-0000000000000001.log").unwrap();
    let header = |kind, sequence, payload_bytes| RecordHeader {
        kind,
        sequence,
        stream: META_STREAM,
        epoch: EpochId(if kind == RecordKind::Grant { 3 } else { 0 }),
        file: spillway_types::FileId(if kind == RecordKind::Grant { 0 } else { 1 }),
        offset: 0,
        payload_bytes,
    };
    let segment_header = encode_record(&header(RecordKind::SegmentHeader, 1, 0), &[]);
    let bad_grant = encode_record(&header(RecordKind::Grant, 2, 8), &[0u8; 8]);
    file.write_at(0, &segment_header).unwrap();
    file.write_at(segment_header.len() as u64, &bad_grant).unwrap();
    file.sync().unwrap();
    storage.sync_directory().unwrap();
    let error =
        Store::open_with(&common::small_knobs(), storage as Arc<dyn Storage>).err().unwrap();
    match error {
        OpenError::Corrupt { segment, offset, detail } => {
            assert_eq!((segment.0, offset), (1, 64));
            assert!(detail.contains("grant of epoch 3"), "{detail}");
        }
        other => panic!("expected Corrupt, got {other}"),
    }
}
