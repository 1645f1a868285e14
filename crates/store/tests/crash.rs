//! Crash tests on simulated storage: a power-loss image is taken while writer threads keep
//! writing, spilling and committing; unsynced writes are dropped and the last one torn. After
//! recovery every epoch whose `commit` had returned reads back bit-exact, and every record of an
//! uncommitted epoch is whole or absent.

mod common;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spillway_config::StoreKnobs;
use spillway_store::{CrashPlan, Durability, EpochPhase, SimStorage, Storage, Store};
use spillway_types::{EpochId, FileId, StreamKey};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const FILES: u64 = 3;
const RECORD_BYTES: usize = 6_000;

/// Record `r` of file `f` of epoch `e` has its own seed and its own range of the file.
fn record_seed(epoch: u64, file: u64, record: u64) -> u64 {
    (epoch << 32) ^ (file << 16) ^ record
}

/// The store over `storage` (a fresh directory or a crash image), recovered.
fn open(knobs: &StoreKnobs, storage: &Arc<SimStorage>) -> Store {
    Store::open_with(knobs, storage.clone() as Arc<dyn Storage>).unwrap()
}

fn records_per_epoch(epoch: u64) -> u64 {
    4 + epoch % 5
}

/// Writes one epoch; every record lands on a distinct range.
fn write_epoch(store: &Store, epoch: u64) {
    for file in 0..FILES {
        for record in 0..records_per_epoch(epoch) {
            let data = common::payload(record_seed(epoch, file, record), RECORD_BYTES);
            store
                .write(
                    StreamKey(1 + epoch % 3),
                    EpochId(epoch),
                    FileId(file),
                    record * RECORD_BYTES as u64,
                    &data,
                )
                .unwrap();
        }
    }
}

fn verify_committed(store: &Store, epoch: u64, seed: u64) {
    for file in 0..FILES {
        let mut back = vec![0u8; records_per_epoch(epoch) as usize * RECORD_BYTES];
        store.read(EpochId(epoch), FileId(file), 0, &mut back).unwrap();
        for record in 0..records_per_epoch(epoch) {
            let expected = common::payload(record_seed(epoch, file, record), RECORD_BYTES);
            let at = record as usize * RECORD_BYTES;
            assert!(
                back[at..at + RECORD_BYTES] == expected[..],
                "seed {seed}: committed epoch {epoch} file {file} record {record} differs after the crash"
            );
        }
    }
}

/// Uncommitted epochs: each record reads back whole or as zeros (absent), never partly.
fn verify_whole_or_absent(store: &Store, epoch: u64, seed: u64) {
    for file in 0..FILES {
        let mut back = vec![0u8; records_per_epoch(epoch) as usize * RECORD_BYTES];
        store.read(EpochId(epoch), FileId(file), 0, &mut back).unwrap();
        for record in 0..records_per_epoch(epoch) {
            let expected = common::payload(record_seed(epoch, file, record), RECORD_BYTES);
            let slice = &back[record as usize * RECORD_BYTES..(record as usize + 1) * RECORD_BYTES];
            assert!(
                slice == &expected[..] || slice.iter().all(|&b| b == 0),
                "seed {seed}: uncommitted epoch {epoch} file {file} record {record} is partly there"
            );
        }
    }
}

#[test]
fn committed_epochs_survive_power_loss_during_concurrent_work() {
    let seed = common::seed("committed_epochs_survive_power_loss_during_concurrent_work");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut direct_bytes = 0;
    let mut sync_behind_rounds = 0;
    for round in 0..24 {
        // Every third round a background syncer fsyncs every 32 KiB spilled, racing the
        // commits' own rounds and the crash.
        let knobs = StoreKnobs {
            ssd_sync_behind_bytes: if round % 3 == 2 { 32 << 10 } else { 0 },
            ..common::small_knobs()
        };
        let storage = SimStorage::new();
        // Every other round the spills write whole blocks with O_DIRECT-style aligned writes
        // (misaligned ones fail with EINVAL): the torn and dropped writes then fall on that path.
        if round % 2 == 1 {
            storage.set_direct_alignment(Some(4096));
        }
        let store =
            Arc::new(Store::open_with(&knobs, storage.clone() as Arc<dyn Storage>).unwrap());
        let writers = start_writers(&store);
        let crash = crash_while_writing(&mut rng, &storage, writers);
        sync_behind_rounds += store.stats().sync_behind_rounds;
        drop(store);
        direct_bytes += storage.direct_bytes_written();

        let store = Store::open_with(&knobs, crash.image.clone() as Arc<dyn Storage>)
            .unwrap_or_else(|e| panic!("seed {seed} round {round}: reopen failed: {e}"));
        check_recovered(&store, &crash, seed, round);
        store.close().unwrap();
    }
    assert!(direct_bytes > 0, "seed {seed}: no spill took the direct path");
    assert!(sync_behind_rounds > 0, "seed {seed}: the background syncer never ran");
}

/// Writer threads working on one store until told to stop, and what they reported.
struct Writers {
    /// Epochs whose `commit` returned, in order.
    committed: Arc<Mutex<Vec<u64>>>,
    /// Epochs asked to be drained.
    drained: Arc<Mutex<Vec<u64>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Scenario step 1: two writer threads write and commit every other epoch, draining old ones.
fn start_writers(store: &Arc<Store>) -> Writers {
    let committed = Arc::new(Mutex::new(Vec::<u64>::new()));
    let drained = Arc::new(Mutex::new(Vec::<u64>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for thread in 0..2u64 {
        let (store, committed, drained, stop) =
            (store.clone(), committed.clone(), drained.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut epoch = 1 + thread;
            while !stop.load(Ordering::Relaxed) {
                write_epoch(&store, epoch);
                store.commit(EpochId(epoch), Durability::Ssd).unwrap();
                committed.lock().push(epoch);
                if epoch > 6 {
                    // Drain old epochs so GC deletes and compacts segments mid-run.
                    drained.lock().push(epoch - 6);
                    store.mark_drained(EpochId(epoch - 6)).unwrap();
                }
                epoch += 2;
            }
        }));
    }
    Writers { committed, drained, stop, threads }
}

/// A power-loss image and what was promised when it was taken.
struct Crash {
    /// Epochs whose commit returned before the crash instant.
    promised: Vec<u64>,
    /// Epochs asked to be drained by then (or just after).
    drained: Vec<u64>,
    image: Arc<SimStorage>,
}

/// Scenario step 2: after a random while, takes a power-loss image under the writers' feet,
/// then stops them.
fn crash_while_writing(rng: &mut ChaCha8Rng, storage: &Arc<SimStorage>, writers: Writers) -> Crash {
    std::thread::sleep(Duration::from_millis(rng.gen_range(5..60)));
    let plan = CrashPlan {
        torn_write_bytes: rng.gen_bool(0.7).then(|| rng.gen_range(1..RECORD_BYTES as u64 * 2)),
        keep_older_unsynced: rng.gen_bool(0.3),
    };
    // Epochs whose commit returned before the crash instant are promised.
    let (promised, image) = {
        let list = writers.committed.lock();
        (list.clone(), storage.crash_image(plan))
    };
    let drained = writers.drained.lock().clone();
    writers.stop.store(true, Ordering::Relaxed);
    for writer in writers.threads {
        writer.join().unwrap();
    }
    Crash { promised, drained, image }
}

/// Scenario step 3, on the store reopened from the image: every promised epoch is committed
/// and reads back exactly (unless drained around the crash), every open one is whole or absent.
fn check_recovered(store: &Store, crash: &Crash, seed: u64, round: u32) {
    store.check_invariants();
    let phases: std::collections::BTreeMap<u64, EpochPhase> =
        store.epochs().into_iter().map(|e| (e.epoch.0, e.phase)).collect();
    let mut checked = 0;
    for &epoch in &crash.promised {
        match phases.get(&epoch) {
            Some(EpochPhase::Committed) => {
                verify_committed(store, epoch, seed);
                checked += 1;
            }
            // Drained around the crash (its tombstone may or may not be durable).
            Some(EpochPhase::Drained) | None if crash.drained.contains(&epoch) => {}
            other => {
                panic!("seed {seed} round {round}: committed epoch {epoch} came back as {other:?}")
            }
        }
    }
    for (&epoch, &phase) in &phases {
        if phase == EpochPhase::Open {
            verify_whole_or_absent(store, epoch, seed);
        }
    }
    eprintln!(
        "round {round}: {} epochs promised, {checked} verified, {} open after recovery, truncated {:?}",
        crash.promised.len(),
        phases.values().filter(|p| **p == EpochPhase::Open).count(),
        store.stats().recovery.truncated
    );
}

#[test]
fn torn_tail_is_cut_and_reported() {
    let knobs = common::small_knobs();
    let storage = SimStorage::new();
    let store = open(&knobs, &storage);
    write_epoch(&store, 1);
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    // An uncommitted epoch spilled but never synced, torn in the middle of its last write.
    write_epoch(&store, 2);
    store.sync().unwrap();
    write_epoch(&store, 3);
    store.commit(EpochId(3), Durability::Memory).unwrap();
    std::thread::sleep(Duration::from_millis(1));
    let image =
        storage.crash_image(CrashPlan { torn_write_bytes: Some(100), keep_older_unsynced: true });
    drop(store);
    let store = open(&knobs, &image);
    verify_committed(&store, 1, 0);
    verify_committed(&store, 2, 0);
    let phases: Vec<_> =
        store.epochs().into_iter().map(|e| (e.epoch.0, e.phase, e.recovered_uncommitted)).collect();
    assert_eq!(phases[0], (1, EpochPhase::Committed, false));
    assert_eq!(phases[1], (2, EpochPhase::Open, true));
    if let Some(&(3, EpochPhase::Open, _)) = phases.get(2) {
        verify_whole_or_absent(&store, 3, 0);
    }
    store.check_invariants();
}

/// Ids of the segment files in `storage`.
fn segment_ids(storage: &Arc<SimStorage>) -> Vec<u64> {
    let mut ids: Vec<u64> = storage
        .files()
        .into_iter()
        .filter_map(|(name, _)| spillway_store::format::parse_segment_file_name(&name))
        .map(|id| id.0)
        .collect();
    ids.sort();
    ids
}

/// Regression: after GC deleted the newest segments and the store restarted, new segments took
/// their ids again; the commit record that named the deleted segment then lent its sync point to
/// the new one, and a later recovery read the new segment's torn tail as corruption below the
/// fsync'd length, refusing to open. Ids named by a surviving commit record are never reused.
#[test]
fn segment_ids_named_by_commit_records_are_not_reused_after_a_restart() {
    let knobs = common::small_knobs();
    let storage = SimStorage::new();
    let store = open(&knobs, &storage);
    write_epoch(&store, 1);
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    write_epoch(&store, 2);
    store.commit(EpochId(2), Durability::Ssd).unwrap();
    let before_gc = segment_ids(&storage);
    store.delete_epoch(EpochId(2)).unwrap();
    store.gc().unwrap();
    store.sync().unwrap();
    let after_gc = segment_ids(&storage);
    assert!(
        after_gc.last() < before_gc.last(),
        "precondition: GC deleted the newest segments ({before_gc:?} -> {after_gc:?})"
    );
    let newest_named = *before_gc.last().unwrap();
    let image =
        storage.crash_image(CrashPlan { torn_write_bytes: None, keep_older_unsynced: true });
    drop(store);

    let store = open(&knobs, &image);
    write_epoch(&store, 3);
    store.sync().unwrap();
    let created: Vec<u64> =
        segment_ids(&image).into_iter().filter(|id| !after_gc.contains(id)).collect();
    assert!(!created.is_empty(), "epoch 3 went to new segments");
    assert!(
        created.iter().all(|&id| id > newest_named),
        "new segments {created:?} reuse ids up to {newest_named}, named by epoch 2's commit"
    );
    // A torn tail in the new segments is cut at the next open, not taken for corruption.
    write_epoch(&store, 6);
    let torn =
        image.crash_image(CrashPlan { torn_write_bytes: Some(100), keep_older_unsynced: true });
    drop(store);
    let store = open(&knobs, &torn);
    verify_committed(&store, 1, 0);
    store.check_invariants();
}
