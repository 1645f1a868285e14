//! The store under faults: the file-size limit (EFBIG), a full file system (ENOSPC that is never
//! sticky), genuine I/O errors (sticky `Failed`), failed fsyncs, all injected behind the
//! storage seam (`SimStorage` faults and capacity).

mod common;

use spillway_store::storage::{Fault, FaultOp};
use spillway_store::{
    CommitError, CrashPlan, Durability, EpochPhase, LifecycleError, SimStorage, SpaceLimit,
    Storage, Store, SyncError, WriteError,
};
use spillway_types::{EpochId, FileId, StreamKey, KIB};
use std::sync::Arc;

fn open_sim_with(knobs: &spillway_config::StoreKnobs) -> (Arc<SimStorage>, Store) {
    let storage = SimStorage::new();
    let store = Store::open_with(knobs, storage.clone() as Arc<dyn Storage>).unwrap();
    (storage, store)
}

#[test]
fn writes_ending_past_the_file_size_limit_are_refused_whole() {
    let knobs = spillway_config::StoreKnobs { file_bytes_max: 1 << 20, ..common::small_knobs() };
    let (_storage, store) = open_sim_with(&knobs);
    let (stream, epoch, file) = (StreamKey(1), EpochId(1), FileId(1));
    // Ending exactly at the limit is fine; one byte past it is refused.
    store.write(stream, epoch, file, (1 << 20) - 10, &[7u8; 10]).unwrap();
    let refused = store.write(stream, epoch, file, (1 << 20) - 9, &[7u8; 10]);
    assert!(
        matches!(refused, Err(WriteError::FileTooLarge { offset, length: 10, file_bytes_max, .. })
            if offset == (1 << 20) - 9 && file_bytes_max == 1 << 20),
        "{refused:?}"
    );
    // The report case: 10 bytes at 2^63, and an end that overflows u64.
    assert!(matches!(
        store.write(stream, epoch, file, 1 << 63, &[1u8; 10]),
        Err(WriteError::FileTooLarge { .. })
    ));
    assert!(matches!(
        store.write(stream, epoch, file, u64::MAX - 4, &[1u8; 10]),
        Err(WriteError::OffsetOverflow { .. })
    ));
    assert!(matches!(
        store.try_reserve_write(stream, epoch, file, 1 << 63, 10),
        Err(WriteError::FileTooLarge { .. })
    ));
    // Nothing of the refused writes exists: the file still ends at the limit.
    let info = store.stat(epoch, file).unwrap();
    assert_eq!(info.size_bytes, 1 << 20);
    store.commit(epoch, Durability::Ssd).unwrap();
    store.check_invariants();
}

#[test]
fn the_default_file_size_limit_is_2_to_the_44() {
    assert_eq!(spillway_config::StoreKnobs::default().file_bytes_max, 1 << 44);
    let too_big =
        spillway_config::StoreKnobs { file_bytes_max: (1 << 62) + 1, ..common::small_knobs() };
    let error = too_big.validate().unwrap_err().to_string();
    assert!(error.contains("file_bytes_max"), "{error}");
}

const POWER_LOSS: CrashPlan = CrashPlan { torn_write_bytes: Some(100), keep_older_unsynced: false };

/// Small tiers, a 128 KiB reserve.
fn knobs() -> spillway_config::StoreKnobs {
    spillway_config::StoreKnobs { ssd_reserve_bytes: 128 * KIB, ..common::small_knobs() }
}

fn reopen(storage: &SimStorage, knobs: &spillway_config::StoreKnobs) -> Store {
    let image = storage.crash_image(POWER_LOSS);
    Store::open_with(knobs, image as Arc<dyn Storage>).unwrap()
}

/// Writes 16 KiB records to (`epoch`, file 1) until the store refuses one; returns the bytes
/// written and the refusal.
fn write_until_refused(store: &Store, epoch: EpochId) -> (u64, WriteError) {
    for i in 0..1024u64 {
        let data = common::payload(epoch.0 * 10_000 + i, 16 * KIB as usize);
        if let Err(error) = store.write(StreamKey(1), epoch, FileId(1), i * 16 * KIB, &data) {
            return (i * 16 * KIB, error);
        }
    }
    panic!("a 1 MiB file system took 16 MiB of writes");
}

fn assert_file_is(store: &Store, epoch: EpochId, seed_base: u64, length: u64) {
    let mut back = vec![0u8; length as usize];
    store.read(epoch, FileId(1), 0, &mut back).unwrap();
    for (i, chunk) in back.chunks(16 * KIB as usize).enumerate() {
        assert!(
            chunk == &common::payload(seed_base + i as u64, chunk.len())[..],
            "epoch {epoch} record {i} differs"
        );
    }
}

#[test]
fn a_full_file_system_is_enospc_and_the_store_recovers_without_a_restart() {
    let knobs = knobs();
    let (storage, store) = open_sim_with(&knobs);
    // The file system is far smaller than ssd_bytes_max (8 MiB).
    storage.set_capacity(Some(1024 * KIB));
    let data = common::payload(10_000, 16 * KIB as usize);
    store.write(StreamKey(1), EpochId(1), FileId(1), 0, &data).unwrap();
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    let written = 16 * KIB;
    let (full_at, refusal) = write_until_refused(&store, EpochId(2));
    assert!(
        matches!(refusal, WriteError::OutOfSpace { limit: SpaceLimit::FileSystem, .. }),
        "{refusal:?}"
    );
    assert!(full_at > 0 && full_at < 1024 * KIB);
    // Not sticky: reads work, the commit of the epoch that filled the disk is ENOSPC (it stays
    // sealed), and deletes work and free the space.
    assert_file_is(&store, EpochId(1), 10_000, written);
    assert_file_is(&store, EpochId(2), 20_000, full_at);
    match store.commit(EpochId(2), Durability::Ssd) {
        Err(CommitError::NoSpace(_)) | Ok(()) => {}
        other => panic!("commit on a full disk: {other:?}"),
    }
    store.delete_epoch(EpochId(2)).unwrap();
    store.mark_drained(EpochId(1)).unwrap();
    store.gc().unwrap();
    // Space is back: writes and commits succeed without a restart.
    let data = common::payload(30_000, 16 * KIB as usize);
    store.write(StreamKey(1), EpochId(3), FileId(1), 0, &data).unwrap();
    store.commit(EpochId(3), Durability::Ssd).unwrap();
    store.check_invariants();
    drop(store);
    // Everything committed is intact after a power loss; the deleted and drained are gone.
    let store = reopen(&storage, &knobs);
    assert_file_is(&store, EpochId(3), 30_000, 16 * KIB);
    assert_eq!(store.epoch(EpochId(3)).unwrap().phase, EpochPhase::Committed);
    assert!(store.epoch(EpochId(2)).is_none_or(|e| e.phase == EpochPhase::Deleted));
    assert!(store.epoch(EpochId(1)).is_none_or(|e| e.phase == EpochPhase::Drained));
    store.check_invariants();
}

#[test]
fn a_commit_stalled_by_a_full_disk_can_be_deleted_or_retried_once_space_returns() {
    let knobs = knobs();
    let (storage, store) = open_sim_with(&knobs);
    // 64 KiB per epoch stays in DRAM (below the high watermark): nothing is spilled yet.
    for epoch in [EpochId(1), EpochId(2)] {
        for i in 0..4u64 {
            let data = common::payload(epoch.0 * 10_000 + i, 16 * KIB as usize);
            store.write(StreamKey(1), epoch, FileId(1), i * 16 * KIB, &data).unwrap();
        }
    }
    // The file system is full (the reserve file holds its last 128 KiB): the commits cannot
    // spill.
    storage.set_capacity(Some(storage.allocated_bytes()));
    for epoch in [EpochId(1), EpochId(2)] {
        let first = store.commit(epoch, Durability::Ssd);
        assert!(matches!(first, Err(CommitError::NoSpace(_))), "{first:?}");
        assert_eq!(store.epoch(epoch).unwrap().phase, EpochPhase::Committing);
    }
    // Sealed: no more writes.
    assert!(matches!(
        store.write(StreamKey(1), EpochId(1), FileId(1), 0, b"x"),
        Err(WriteError::EpochNotOpen { .. })
    ));
    // A stalled epoch can be deleted on the full disk (its tombstone takes the reserve).
    store.delete_epoch(EpochId(2)).unwrap();
    // Space returns: the commit is retried and succeeds.
    storage.set_capacity(None);
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    drop(store);
    let store = reopen(&storage, &knobs);
    assert_eq!(store.epoch(EpochId(1)).unwrap().phase, EpochPhase::Committed);
    assert_file_is(&store, EpochId(1), 10_000, 64 * KIB);
    assert!(store.epoch(EpochId(2)).is_none_or(|e| e.phase == EpochPhase::Deleted));
}

#[test]
fn enospc_on_a_metadata_append_rolls_it_back_and_cuts_what_landed() {
    // No reserve: the ENOSPC reaches the caller.
    let knobs = spillway_config::StoreKnobs { ssd_reserve_bytes: 0, ..common::small_knobs() };
    let (storage, store) = open_sim_with(&knobs);
    store.name_file(EpochId(1), FileId(1), "first").unwrap();
    let files_before = storage.files();
    // The next write lands 10 bytes of the record, then fails with ENOSPC.
    storage.inject(Fault { op: FaultOp::Write, skip: 0, errno: libc::ENOSPC, written_bytes: 10 });
    let refused = store.name_file(EpochId(1), FileId(2), "second");
    assert!(
        matches!(refused, Err(WriteError::OutOfSpace { limit: SpaceLimit::FileSystem, .. })),
        "{refused:?}"
    );
    // The torn 10 bytes are cut: every file is as long as before.
    assert_eq!(storage.files(), files_before);
    // Not sticky, and the next record goes where the failed one was.
    store.name_file(EpochId(1), FileId(2), "second").unwrap();
    store.write(StreamKey(1), EpochId(1), FileId(2), 0, b"data").unwrap();
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    drop(store);
    let store = reopen(&storage, &knobs);
    let names: Vec<_> =
        store.files(EpochId(1)).unwrap().into_iter().filter_map(|f| f.name).collect();
    assert_eq!(names, vec!["first".to_string(), "second".to_string()]);
}

#[test]
fn enospc_on_a_tombstone_releases_the_reserve_and_the_delete_succeeds() {
    let knobs = knobs();
    let (storage, store) = open_sim_with(&knobs);
    store.write(StreamKey(1), EpochId(1), FileId(1), 0, b"data").unwrap();
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    assert!(storage.files().iter().any(|(name, _)| name == "RESERVE"));
    storage.inject(Fault { op: FaultOp::Write, skip: 0, errno: libc::ENOSPC, written_bytes: 0 });
    store.mark_drained(EpochId(1)).unwrap();
    assert_eq!(storage.pending_faults(), 0);
    assert!(!storage.files().iter().any(|(name, _)| name == "RESERVE"));
    store.sync().unwrap();
    // The flusher takes the reserve back once there is room.
    for _ in 0..2000 {
        if storage.files().iter().any(|(name, _)| name == "RESERVE") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(storage.files().iter().any(|(name, _)| name == "RESERVE"), "reserve not re-taken");
    drop(store);
    let store = reopen(&storage, &knobs);
    assert_eq!(store.epoch(EpochId(1)).unwrap().phase, EpochPhase::Drained);
}

#[test]
fn enospc_creating_a_segment_writes_nothing_and_is_not_sticky() {
    let knobs = spillway_config::StoreKnobs { ssd_reserve_bytes: 0, ..common::small_knobs() };
    let (storage, store) = open_sim_with(&knobs);
    storage.inject(Fault { op: FaultOp::Create, skip: 0, errno: libc::ENOSPC, written_bytes: 0 });
    let files_before = storage.files();
    let refused = store.name_file(EpochId(1), FileId(1), "a");
    assert!(
        matches!(refused, Err(WriteError::OutOfSpace { limit: SpaceLimit::FileSystem, .. })),
        "{refused:?}"
    );
    assert_eq!(storage.files(), files_before);
    store.name_file(EpochId(1), FileId(1), "a").unwrap();
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    store.check_invariants();
}

#[test]
fn an_io_error_on_write_is_sticky_and_committed_data_survives() {
    let knobs = knobs();
    let (storage, store) = open_sim_with(&knobs);
    let data = common::payload(10_000, 16 * KIB as usize);
    store.write(StreamKey(1), EpochId(1), FileId(1), 0, &data).unwrap();
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    storage.inject(Fault { op: FaultOp::Write, skip: 0, errno: libc::EIO, written_bytes: 0 });
    store.write(StreamKey(1), EpochId(2), FileId(1), 0, &data).unwrap();
    assert!(matches!(store.commit(EpochId(2), Durability::Ssd), Err(CommitError::Failed(_))));
    // Sticky: every later change is refused, reads of what is there still work.
    assert!(matches!(
        store.write(StreamKey(1), EpochId(3), FileId(1), 0, b"x"),
        Err(WriteError::Failed(_))
    ));
    assert!(matches!(store.mark_drained(EpochId(1)), Err(LifecycleError::Failed(_))));
    assert!(matches!(store.sync(), Err(SyncError::Failed(_))));
    assert_file_is(&store, EpochId(1), 10_000, 16 * KIB);
    drop(store);
    let store = reopen(&storage, &knobs);
    assert_file_is(&store, EpochId(1), 10_000, 16 * KIB);
    assert_ne!(store.epoch(EpochId(2)).map(|e| e.phase), Some(EpochPhase::Committed));
}

#[test]
fn a_failed_fsync_is_never_reported_as_success_later() {
    let knobs = knobs();
    let (storage, store) = open_sim_with(&knobs);
    let data = common::payload(10_000, 16 * KIB as usize);
    store.write(StreamKey(1), EpochId(1), FileId(1), 0, &data).unwrap();
    // The data fsync fails; the simulated kernel then forgets the dirty pages (fsyncgate), so
    // a second fsync would "succeed" without the data being durable.
    storage.inject(Fault { op: FaultOp::Sync, skip: 0, errno: libc::EIO, written_bytes: 0 });
    assert!(matches!(store.commit(EpochId(1), Durability::Ssd), Err(CommitError::Failed(_))));
    assert!(matches!(store.commit(EpochId(1), Durability::Ssd), Err(CommitError::Failed(_))));
    assert!(matches!(store.sync(), Err(SyncError::Failed(_))));
    drop(store);
    let store = reopen(&storage, &knobs);
    assert_ne!(store.epoch(EpochId(1)).map(|e| e.phase), Some(EpochPhase::Committed));
}

#[test]
fn enospc_on_a_spill_rolls_it_back_and_the_records_stay_in_dram() {
    let knobs = knobs();
    let (storage, store) = open_sim_with(&knobs);
    // Three 16 KiB records: they fit in one 64 KiB segment.
    for i in 0..3u64 {
        let data = common::payload(10_000 + i, 16 * KIB as usize);
        store.write(StreamKey(1), EpochId(1), FileId(1), i * 16 * KIB, &data).unwrap();
    }
    // The commit creates the stream's segment (its header is write 1), then spills the three
    // records in one pwrite (write 2), which lands 20 000 bytes and runs out of space.
    storage.inject(Fault {
        op: FaultOp::Write,
        skip: 1,
        errno: libc::ENOSPC,
        written_bytes: 20_000,
    });
    let first = store.commit(EpochId(1), Durability::Ssd);
    assert!(matches!(first, Err(CommitError::NoSpace(_))), "{first:?}");
    assert_eq!(storage.pending_faults(), 0);
    // The segment holds its header only: the landed part was cut.
    let data_segment = storage
        .files()
        .into_iter()
        .filter(|(name, _)| spillway_store::format::parse_segment_file_name(name).is_some())
        .map(|(_, length)| length)
        .max()
        .unwrap();
    assert_eq!(data_segment, spillway_store::format::HEADER_BYTES as u64);
    // Still readable from DRAM, and the retried commit succeeds.
    assert_file_is(&store, EpochId(1), 10_000, 48 * KIB);
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    store.check_invariants();
    drop(store);
    let store = reopen(&storage, &knobs);
    assert_eq!(store.epoch(EpochId(1)).unwrap().phase, EpochPhase::Committed);
    assert_file_is(&store, EpochId(1), 10_000, 48 * KIB);
}
