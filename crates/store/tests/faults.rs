//! The store under faults: the file-size limit (EFBIG), a full file system (ENOSPC that is never
//! sticky), genuine I/O errors (sticky `Failed`), failed fsyncs, all injected behind the
//! storage seam (`SimStorage` faults and capacity).

mod common;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spillway_store::storage::{Fault, FaultOp};
use spillway_store::{
    CommitError, CrashPlan, Durability, EpochPhase, FlusherMode, LifecycleError, SimStorage,
    SpaceLimit, Storage, Store, SyncError, WriteError,
};
use spillway_types::{EpochId, FileId, StreamKey, KIB};
use std::collections::BTreeMap;
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
    let storage = SimStorage::new();
    let store =
        Store::open_with_flusher(&knobs, storage.clone() as Arc<dyn Storage>, FlusherMode::Manual)
            .unwrap();
    let has_reserve = || storage.files().iter().any(|(name, _)| name == "RESERVE");
    store.write(StreamKey(1), EpochId(1), FileId(1), 0, b"data").unwrap();
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    assert!(has_reserve());
    storage.inject(Fault { op: FaultOp::Write, skip: 0, errno: libc::ENOSPC, written_bytes: 0 });
    store.mark_drained(EpochId(1)).unwrap();
    assert_eq!(storage.pending_faults(), 0);
    assert!(!has_reserve());
    store.sync().unwrap();
    // The flusher takes the reserve back once there is room.
    store.step_flusher();
    assert!(has_reserve(), "reserve not re-taken");
    drop(store);
    let store = reopen(&storage, &knobs);
    assert!(store.epoch(EpochId(1)).is_none_or(|e| e.phase == EpochPhase::Drained));
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

/// A random fault: mostly ENOSPC (often a short write), sometimes EIO or a failed fsync.
/// Returns it and whether it is fatal (the store must then fail, not carry on).
fn random_fault(rng: &mut ChaCha8Rng, fatal_allowed: bool) -> (Fault, bool) {
    let skip = rng.gen_range(0..6);
    let written_bytes = if rng.gen_bool(0.5) { rng.gen_range(1..20_000) } else { 0 };
    let kinds = if fatal_allowed { 10 } else { 7 };
    match rng.gen_range(0..kinds) {
        0..=4 => (Fault { op: FaultOp::Write, skip, errno: libc::ENOSPC, written_bytes }, false),
        5..=6 => {
            (Fault { op: FaultOp::Create, skip, errno: libc::ENOSPC, written_bytes: 0 }, false)
        }
        7 => (Fault { op: FaultOp::Write, skip, errno: libc::EIO, written_bytes }, true),
        8 => (Fault { op: FaultOp::Create, skip, errno: libc::EIO, written_bytes: 0 }, true),
        _ => {
            // Even ENOSPC from fsync is fatal (fsyncgate).
            let errno = if rng.gen_bool(0.5) { libc::EIO } else { libc::ENOSPC };
            (Fault { op: FaultOp::Sync, skip, errno, written_bytes: 0 }, true)
        }
    }
}

/// One seeded run under random faults: the model of what the store must keep.
struct FaultRun {
    seed: u64,
    rng: ChaCha8Rng,
    store: Store,
    /// Epochs whose `Ssd` commit returned `Ok` (and not drained since): file 1's content.
    committed: BTreeMap<EpochId, Vec<u8>>,
    /// Epochs whose commit ran out of space: sealed, to be committed again or deleted.
    stalled: Vec<(EpochId, Vec<u8>)>,
    epoch: EpochId,
    content: Vec<u8>,
    refusals: u64,
    stalls: u64,
}

impl FaultRun {
    /// Appends one record at most (≤ record_payload_bytes_max), so a refusal writes nothing.
    fn write(&mut self, step: u64) -> Result<(), String> {
        let length = self.rng.gen_range(1..=16 * KIB as usize);
        let data = common::payload(self.seed ^ step, length);
        let offset = self.content.len() as u64;
        match self.store.write(StreamKey(1), self.epoch, FileId(1), offset, &data) {
            Ok(()) => {
                self.content.extend_from_slice(&data);
                Ok(())
            }
            Err(WriteError::OutOfSpace { limit: SpaceLimit::FileSystem, .. }) => {
                self.refusals += 1;
                Ok(())
            }
            Err(error) => Err(format!("write: {error}")),
        }
    }

    /// Retries a stalled commit first, else commits the open epoch.
    fn commit(&mut self) -> Result<(), String> {
        let (target, data) = self.stalled.pop().unwrap_or_else(|| {
            let next = EpochId(self.epoch.0 + 1);
            (std::mem::replace(&mut self.epoch, next), std::mem::take(&mut self.content))
        });
        match self.store.commit(target, Durability::Ssd) {
            Ok(()) => {
                self.committed.insert(target, data);
                Ok(())
            }
            Err(CommitError::NoSpace(_)) => {
                self.stalls += 1;
                self.stalled.push((target, data));
                Ok(())
            }
            Err(error) => Err(format!("commit of {target}: {error}")),
        }
    }

    fn drain(&mut self) -> Result<(), String> {
        let Some(target) = self.committed.keys().next().copied() else { return Ok(()) };
        match self.store.mark_drained(target) {
            Ok(()) => {
                self.committed.remove(&target);
                Ok(())
            }
            // Rolled back: the epoch must come back Committed.
            Err(LifecycleError::NoSpace { .. }) => Ok(()),
            Err(error) => {
                // An I/O error may leave the tombstone written (like a crash in the middle
                // of the drain): the epoch may come back either way.
                self.committed.remove(&target);
                Err(format!("drain of {target}: {error}"))
            }
        }
    }

    fn delete_stalled(&mut self) -> Result<(), String> {
        let Some((target, data)) = self.stalled.pop() else { return Ok(()) };
        match self.store.delete_epoch(target) {
            Ok(()) => Ok(()),
            Err(LifecycleError::NoSpace { .. }) => {
                self.stalled.push((target, data));
                Ok(())
            }
            Err(error) => Err(format!("delete of stalled {target}: {error}")),
        }
    }

    /// One random operation.
    fn step(&mut self, step: u64) -> Result<(), String> {
        match self.rng.gen_range(0..12) {
            0..=6 => self.write(step),
            7 => self.commit(),
            8 => self.drain(),
            9 => self.delete_stalled(),
            10 => self.store.gc().map(|_| ()).map_err(|error| format!("gc: {error}")),
            _ => {
                self.store.step_flusher();
                Ok(())
            }
        }
    }
}

/// One seeded run: appends to an epoch, commits, drains and GC under random injected faults,
/// with the flusher stepped by the seed. ENOSPC never fails the store; whatever fails it, every
/// epoch whose `Ssd` commit returned `Ok` is intact, bit for bit, after a power loss.
fn run_with_faults(seed: u64, fatal_allowed: bool) {
    let knobs = knobs();
    let storage = SimStorage::new();
    let store =
        Store::open_with_flusher(&knobs, storage.clone() as Arc<dyn Storage>, FlusherMode::Manual)
            .unwrap();
    let mut run = FaultRun {
        seed,
        rng: ChaCha8Rng::seed_from_u64(seed),
        store,
        committed: BTreeMap::new(),
        stalled: Vec::new(),
        epoch: EpochId(1),
        content: Vec::new(),
        refusals: 0,
        stalls: 0,
    };
    let (mut fatal_injected, mut failure, mut steps) = (false, None, 0);
    for step in 0..400 {
        steps += 1;
        if run.rng.gen_range(0..8) == 0 {
            let (fault, fatal) = random_fault(&mut run.rng, fatal_allowed);
            fatal_injected |= fatal;
            storage.inject(fault);
        }
        let outcome = run.step(step);
        run.store.check_invariants();
        if let Err(error) = outcome {
            assert!(
                fatal_injected,
                "seed {seed} step {step}: only ENOSPC was injected, yet the store failed: {error}"
            );
            failure = Some(error);
            break;
        }
    }
    let FaultRun { store, committed, refusals, stalls, .. } = run;
    eprintln!(
        "seed {seed}: {steps} steps, {refusals} writes refused with ENOSPC, {stalls} commits \
         stalled, {} epochs committed at the end; ended by {failure:?}",
        committed.len()
    );
    if !fatal_allowed {
        assert_eq!(steps, 400, "seed {seed}: an ENOSPC-only run ended early");
    }
    drop(store);
    let store = reopen(&storage, &knobs);
    for (epoch, data) in &committed {
        let info = store.epoch(*epoch);
        assert_eq!(
            info.as_ref().map(|e| e.phase),
            Some(EpochPhase::Committed),
            "seed {seed}: committed epoch {epoch} came back as {info:?} (run ended by {failure:?})"
        );
        let mut back = vec![0u8; data.len()];
        store.read(*epoch, FileId(1), 0, &mut back).unwrap();
        assert!(back == *data, "seed {seed}: committed epoch {epoch} differs after a power loss");
    }
    store.check_invariants();
}

#[test]
fn random_faults_never_lose_committed_data_and_enospc_is_never_sticky() {
    let base = common::seed("random_faults_never_lose_committed_data_and_enospc_is_never_sticky");
    for round in 0..16u64 {
        // Even rounds inject only ENOSPC (the run must go to the end), odd ones also EIO and
        // failed fsyncs (the run ends at the first).
        run_with_faults(base.wrapping_add(round), round % 2 == 1);
    }
}

#[test]
fn a_segment_reserves_its_blocks_chunk_by_chunk_and_a_refused_chunk_places_nothing() {
    let knobs = spillway_config::StoreKnobs {
        segment_bytes_max: 48 << 20,
        ssd_bytes_max: 256 << 20,
        ssd_reserve_bytes: 0,
        ..common::small_knobs()
    };
    let storage = SimStorage::new();
    let store =
        Store::open_with_flusher(&knobs, storage.clone() as Arc<dyn Storage>, FlusherMode::Manual)
            .unwrap();
    // Room for the first 16 MiB chunk of a data segment and a little more, not a second chunk.
    storage.set_capacity(Some(storage.allocated_bytes() + (20 << 20)));
    let (written, refusal) = {
        let mut written = 0u64;
        loop {
            let data = common::payload(written, 16 * KIB as usize);
            match store.write(StreamKey(1), EpochId(1), FileId(1), written, &data) {
                Ok(()) => written += data.len() as u64,
                Err(error) => break (written, error),
            }
            store.step_flusher();
            assert!(written < 32 << 20, "a 20 MiB file system took {written} bytes");
        }
    };
    assert!(
        matches!(refusal, WriteError::OutOfSpace { limit: SpaceLimit::FileSystem, .. }),
        "{refusal:?}"
    );
    // Nothing was placed past the reserved first chunk.
    for (name, length) in storage.files() {
        assert!(length <= 16 << 20, "{name} is {length} bytes, past its reserved chunk");
    }
    // Space returns: the segment takes its next chunk and everything commits.
    storage.set_capacity(None);
    let data = common::payload(written, 16 * KIB as usize);
    store.write(StreamKey(1), EpochId(1), FileId(1), written, &data).unwrap();
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    store.check_invariants();
    drop(store);
    let store = reopen(&storage, &knobs);
    let mut back = vec![0u8; 16 * KIB as usize];
    store.read(EpochId(1), FileId(1), written, &mut back).unwrap();
    assert!(back == data);
    assert_eq!(store.stat(EpochId(1), FileId(1)).unwrap().size_bytes, written + 16 * KIB);
}
