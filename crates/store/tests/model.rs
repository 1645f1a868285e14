//! Property test: random write / zeros / commit / read / drain / delete / GC / restart / power-loss
//! sequences against a simple in-memory model (one byte vector per file). Any divergence fails
//! with the seed that replays it (`SPILLWAY_TEST_SEED=<seed> cargo test -p spillway-store
//! --test model`).

mod common;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spillway_config::StoreKnobs;
use spillway_store::{
    CrashPlan, Durability, EpochPhase, FlusherMode, SimStorage, Storage, Store, WriteError,
};
use spillway_types::{EpochId, FileId, StreamKey};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Open,
    CommittedMemory,
    Committed,
}

#[derive(Clone, Debug)]
struct ModelEpoch {
    phase: Phase,
    files: BTreeMap<FileId, Vec<u8>>,
    names: BTreeMap<FileId, String>,
}

fn write_into(file: &mut Vec<u8>, offset: usize, data: &[u8]) {
    if file.len() < offset + data.len() {
        file.resize(offset + data.len(), 0);
    }
    file[offset..offset + data.len()].copy_from_slice(data);
}

fn verify_epoch(store: &Store, epoch: EpochId, model: &ModelEpoch, seed: u64) {
    for (&file, content) in &model.files {
        let stat = store
            .stat(epoch, file)
            .unwrap_or_else(|| panic!("seed {seed}: epoch {epoch} file {file} missing"));
        assert_eq!(
            stat.size_bytes,
            content.len() as u64,
            "seed {seed}: size of epoch {epoch} file {file}"
        );
        let mut back = vec![0xAAu8; content.len() + 100];
        store.read(epoch, file, 0, &mut back).unwrap();
        assert!(
            back[..content.len()] == content[..],
            "seed {seed}: content of epoch {epoch} file {file} differs"
        );
        assert!(
            back[content.len()..].iter().all(|&b| b == 0),
            "seed {seed}: bytes past the end are not zero"
        );
    }
    for (&file, name) in &model.names {
        let stat = store
            .stat(epoch, file)
            .unwrap_or_else(|| panic!("seed {seed}: named file {file} missing"));
        assert_eq!(
            stat.name.as_deref(),
            Some(name.as_str()),
            "seed {seed}: name of epoch {epoch} file {file}"
        );
    }
}

/// Runs `steps` random operations from `seed`; returns the final directory (each file's name,
/// length and CRC) after a clean close.
fn run_sequence(
    seed: u64,
    steps: usize,
    ssd_bytes_max: u64,
    flusher: FlusherMode,
) -> Vec<(String, u64, u32)> {
    let mut sequence = Sequence::new(seed, flusher);
    // Odd seeds spill behind the ingest in 32 KiB batches (write-behind, clean cached copies
    // read from the ring); even seeds keep the default batch, which the 256 KiB ring never
    // reaches, so data spills only above the watermarks and at commits.
    let flusher_batch_bytes =
        if seed % 2 == 1 { 32 << 10 } else { StoreKnobs::default().flusher_batch_bytes };
    let knobs =
        spillway_config::StoreKnobs { ssd_bytes_max, flusher_batch_bytes, ..common::small_knobs() };
    let mut storage = SimStorage::new();
    let mut store = sequence.open(&knobs, &storage).unwrap();
    for step in 0..steps {
        if flusher == FlusherMode::Manual && sequence.rng.gen_range(0..4) == 0 {
            // The flusher runs exactly where the seed says, and nowhere else.
            store.step_flusher();
        }
        let choice = sequence.rng.gen_range(0..100);
        let stats = store.stats();
        sequence.totals[0] = sequence.totals[0].max(stats.ssd_used_bytes);
        let live: Vec<EpochId> = sequence.model.keys().copied().collect();
        let open: Vec<EpochId> = sequence
            .model
            .iter()
            .filter(|(_, m)| m.phase == Phase::Open)
            .map(|(&e, _)| e)
            .collect();
        match choice {
            0..=44 => sequence.write(&store, &open, step),
            45..=49 => sequence.name_file(&store, &open),
            50..=59 => sequence.commit(&store, &open),
            60..=74 => sequence.check_read(&store, &live, step),
            75..=82 => sequence.drain(&store),
            83..=86 => sequence.delete(&store, &live),
            87..=89 => sequence.collect_garbage(&store),
            90 => sequence.evict_cached(&store),
            91..=94 => store = sequence.restart(store, &knobs, &storage),
            95..=96 => (store, storage) = sequence.power_loss(store, &knobs, &storage, step),
            _ => sequence.verify_all(&store),
        }
        store.check_invariants();
    }
    sequence.verify_all(&store);
    let stats = store.stats();
    let Sequence { counts, totals, model, .. } = &sequence;
    eprintln!(
        "seed {seed}: {counts:?}; peak SSD use {} B; explicit GC deleted {} segments, copied {} B; {} live epochs at the end",
        totals[0], totals[1], totals[2], model.len()
    );
    assert!(
        stats.host_write_amplification >= 1.0,
        "seed {seed}: WAF {}",
        stats.host_write_amplification
    );
    store.close().unwrap();
    let directory = storage.clone() as Arc<dyn Storage>;
    storage
        .files()
        .into_iter()
        .map(|(name, length)| {
            let mut bytes = vec![0u8; length as usize];
            directory.open(&name).unwrap().read_at(0, &mut bytes).unwrap();
            (name, length, crc32c::crc32c(&bytes))
        })
        .collect()
}

/// One random sequence of operations: its random source, the model the store must match,
/// and what it counted.
struct Sequence {
    seed: u64,
    flusher: FlusherMode,
    rng: ChaCha8Rng,
    model: BTreeMap<EpochId, ModelEpoch>,
    next_epoch: u64,
    /// Operations done, by name.
    counts: BTreeMap<&'static str, u64>,
    /// Peak SSD use, then segments deleted and bytes copied by explicit GC.
    totals: [u64; 4],
}

impl Sequence {
    /// Opens the store on `storage` with this sequence's flusher mode.
    fn open(
        &self,
        knobs: &StoreKnobs,
        storage: &Arc<SimStorage>,
    ) -> Result<Store, spillway_store::OpenError> {
        Store::open_with_flusher(knobs, storage.clone() as Arc<dyn Storage>, self.flusher)
    }

    /// A sequence replaying `seed`, with an empty model.
    fn new(seed: u64, flusher: FlusherMode) -> Sequence {
        Sequence {
            seed,
            flusher,
            rng: ChaCha8Rng::seed_from_u64(seed),
            model: BTreeMap::new(),
            next_epoch: 1,
            counts: BTreeMap::new(),
            totals: [0; 4],
        }
    }

    /// Operation: a write (to an open epoch, or a new one); running out of space changes
    /// nothing.
    fn write(&mut self, store: &Store, open: &[EpochId], step: usize) {
        let (seed, rng) = (self.seed, &mut self.rng);
        let epoch = if open.is_empty() || rng.gen_bool(0.1) {
            self.next_epoch += 1;
            EpochId(self.next_epoch)
        } else {
            open[rng.gen_range(0..open.len())]
        };
        let file = FileId(rng.gen_range(0..4));
        let offset = rng.gen_range(0..40_000usize);
        let length = if rng.gen_bool(0.3) {
            rng.gen_range(20_000..120_000)
        } else {
            rng.gen_range(1..5_000)
        };
        let stream = StreamKey(rng.gen_range(1..4));
        // Some writes are runs of zeros (punch hole, zero range): one small record each.
        let zeros = rng.gen_bool(0.15);
        let (data, written) = if zeros {
            (
                vec![0u8; length],
                store.write_zeros(stream, epoch, file, offset as u64, length as u64),
            )
        } else {
            let data = common::payload(seed ^ (step as u64) << 8, length);
            let written = store.write(stream, epoch, file, offset as u64, &data);
            (data, written)
        };
        match written {
            Ok(()) => {
                *self.counts.entry(if zeros { "zeros" } else { "write" }).or_default() += 1;
                let entry = self.model.entry(epoch).or_insert_with(|| ModelEpoch {
                    phase: Phase::Open,
                    files: BTreeMap::new(),
                    names: BTreeMap::new(),
                });
                write_into(entry.files.entry(file).or_default(), offset, &data);
            }
            Err(WriteError::OutOfSpace { .. }) => {
                *self.counts.entry("out_of_space").or_default() += 1;
                // Nothing half-written: the model is unchanged and later reads check it.
            }
            Err(error) => panic!("seed {seed} step {step}: write failed: {error}"),
        }
    }

    /// Operation: names a file of the first open epoch.
    fn name_file(&mut self, store: &Store, open: &[EpochId]) {
        if let Some(&epoch) = open.first() {
            let file = FileId(self.rng.gen_range(0..4));
            let name = format!("ckpt/{epoch}/file-{file}.dat");
            store.name_file(epoch, file, &name).unwrap();
            self.model.get_mut(&epoch).unwrap().names.insert(file, name);
        }
    }

    /// Operation: commits an open epoch, to SSD or (less often) to memory.
    fn commit(&mut self, store: &Store, open: &[EpochId]) {
        if !open.is_empty() {
            let epoch = open[self.rng.gen_range(0..open.len())];
            let durability =
                if self.rng.gen_bool(0.3) { Durability::Memory } else { Durability::Ssd };
            store.commit(epoch, durability).unwrap();
            *self.counts.entry("commit").or_default() += 1;
            self.model.get_mut(&epoch).unwrap().phase = if durability == Durability::Ssd {
                Phase::Committed
            } else {
                Phase::CommittedMemory
            };
        }
    }

    /// Operation: reads a random range of a file of a live epoch and checks it byte by byte
    /// (zeros past the end).
    fn check_read(&mut self, store: &Store, live: &[EpochId], step: usize) {
        if live.is_empty() {
            return;
        }
        let (seed, rng) = (self.seed, &mut self.rng);
        let epoch = live[rng.gen_range(0..live.len())];
        let entry = &self.model[&epoch];
        if let Some((&file, content)) =
            entry.files.iter().nth(rng.gen_range(0..entry.files.len().max(1)))
        {
            let offset = rng.gen_range(0..content.len() + 10);
            let length = rng.gen_range(1..30_000);
            let mut back = vec![0x55u8; length];
            store.read(epoch, file, offset as u64, &mut back).unwrap();
            for (i, &byte) in back.iter().enumerate() {
                let expected = content.get(offset + i).copied().unwrap_or(0);
                assert_eq!(
                    byte,
                    expected,
                    "seed {seed} step {step}: epoch {epoch} file {file} byte {}",
                    offset + i
                );
            }
        }
    }

    /// Operation: drains a committed epoch (it leaves the model).
    fn drain(&mut self, store: &Store) {
        let committed: Vec<EpochId> =
            self.model.iter().filter(|(_, m)| m.phase != Phase::Open).map(|(&e, _)| e).collect();
        if !committed.is_empty() {
            let epoch = committed[self.rng.gen_range(0..committed.len())];
            store.mark_drained(epoch).unwrap();
            *self.counts.entry("drain").or_default() += 1;
            self.model.remove(&epoch);
            assert_eq!(
                store.epochs().iter().find(|e| e.epoch == epoch).unwrap().phase,
                EpochPhase::Drained
            );
        }
    }

    /// Operation: deletes a live epoch (it leaves the model).
    fn delete(&mut self, store: &Store, live: &[EpochId]) {
        if !live.is_empty() {
            let epoch = live[self.rng.gen_range(0..live.len())];
            store.delete_epoch(epoch).unwrap();
            self.model.remove(&epoch);
        }
    }

    /// Operation: one GC round, or a forced compaction.
    fn collect_garbage(&mut self, store: &Store) {
        let report =
            if self.rng.gen_bool(0.5) { store.gc().unwrap() } else { store.compact_now().unwrap() };
        self.totals[1] += report.segments_deleted;
        self.totals[2] += report.bytes_copied;
    }

    /// Operation: every clean cached copy dropped, so reads go to the segments.
    fn evict_cached(&mut self, store: &Store) {
        let dropped = store.evict_cached();
        *self.counts.entry(if dropped > 0 { "evict_cached" } else { "evict_none" }).or_default() +=
            1;
        // A background flusher may spill (and so cache) again before `stats` looks.
        if self.flusher == FlusherMode::Manual {
            assert_eq!(store.stats().dram_cached_bytes, 0, "seed {}: copies left", self.seed);
        }
    }

    /// Operation: a clean restart; everything survives, memory commits become durable.
    fn restart(&mut self, store: Store, knobs: &StoreKnobs, storage: &Arc<SimStorage>) -> Store {
        *self.counts.entry("restart").or_default() += 1;
        store.close().unwrap();
        let store = self.open(knobs, storage).unwrap();
        for entry in self.model.values_mut() {
            if entry.phase == Phase::CommittedMemory {
                entry.phase = Phase::Committed;
            }
        }
        store
    }

    /// Operation: a power loss; only SSD-committed epochs are promised. Returns the store
    /// reopened on the crash image, and the image.
    fn power_loss(
        &mut self,
        store: Store,
        knobs: &StoreKnobs,
        storage: &Arc<SimStorage>,
        step: usize,
    ) -> (Store, Arc<SimStorage>) {
        let seed = self.seed;
        *self.counts.entry("power_loss").or_default() += 1;
        let plan = CrashPlan {
            torn_write_bytes: self.rng.gen_bool(0.5).then(|| self.rng.gen_range(0..2000)),
            keep_older_unsynced: self.rng.gen_bool(0.5),
        };
        let image = storage.crash_image(plan);
        drop(store);
        let store = self.open(knobs, &image).unwrap_or_else(|e| {
            panic!("seed {seed} step {step}: reopen after power loss failed: {e}")
        });
        let recovered: BTreeMap<EpochId, EpochPhase> =
            store.epochs().into_iter().map(|e| (e.epoch, e.phase)).collect();
        self.keep_promised_epochs(&recovered, step);
        // Uncertain epochs (open, memory-only, drained/deleted whose tombstone was not
        // durable) are removed so the model stays exact.
        for (epoch, phase) in recovered {
            if !self.model.contains_key(&epoch)
                && matches!(phase, EpochPhase::Open | EpochPhase::Committed)
            {
                store.delete_epoch(epoch).unwrap();
            }
        }
        (store, image)
    }

    /// After a power loss: the model keeps the epochs that came back committed, and every
    /// epoch committed to SSD must have.
    fn keep_promised_epochs(&mut self, recovered: &BTreeMap<EpochId, EpochPhase>, step: usize) {
        let seed = self.seed;
        let mut survivors = BTreeMap::new();
        for (epoch, entry) in std::mem::take(&mut self.model) {
            match (entry.phase, recovered.get(&epoch)) {
                (Phase::Committed, Some(EpochPhase::Committed)) => {
                    survivors.insert(epoch, entry);
                }
                (Phase::Committed, other) => {
                    panic!(
                        "seed {seed} step {step}: committed epoch {epoch} came back as {other:?}"
                    )
                }
                (Phase::CommittedMemory, Some(EpochPhase::Committed)) => {
                    // The flusher made it durable in time: then it must be complete.
                    survivors.insert(epoch, ModelEpoch { phase: Phase::Committed, ..entry });
                }
                _ => {}
            }
        }
        self.model = survivors;
    }

    /// Checks every epoch of the model against the store.
    fn verify_all(&self, store: &Store) {
        for (&epoch, entry) in &self.model {
            verify_epoch(store, epoch, entry, self.seed);
        }
    }
}

#[test]
fn random_operations_match_the_model() {
    let base = common::seed("random_operations_match_the_model");
    for round in 0..4u64 {
        run_sequence(base.wrapping_add(round), 1000, 8 << 20, FlusherMode::Background);
    }
}

#[test]
fn random_operations_match_the_model_when_the_ssd_is_nearly_full() {
    // 512 KiB of SSD = 8 segments: writes run out of space, GC and compaction run under pressure.
    let base = common::seed("random_operations_match_the_model_when_the_ssd_is_nearly_full");
    for round in 0..4u64 {
        run_sequence(base.wrapping_add(round), 1000, 512 << 10, FlusherMode::Background);
    }
}

#[test]
fn a_seed_replays_exactly_with_a_manual_flusher() {
    // With the flusher stepped only where the seed says, the same seed does the same I/O: two
    // runs leave byte-identical directories (with the background flusher they rarely would).
    // A failing seed printed by this test replays with SPILLWAY_TEST_SEED.
    let seed = common::seed("a_seed_replays_exactly_with_a_manual_flusher");
    for (round, ssd_bytes_max) in [(0u64, 8u64 << 20), (1, 512 << 10)] {
        let seed = seed.wrapping_add(round);
        let first = run_sequence(seed, 600, ssd_bytes_max, FlusherMode::Manual);
        let second = run_sequence(seed, 600, ssd_bytes_max, FlusherMode::Manual);
        assert!(!first.is_empty(), "seed {seed}: no files");
        assert_eq!(first, second, "seed {seed}: two runs of one seed diverged");
    }
}
