//! Behaviour of the store's public API one feature at a time: queries, streams and segments,
//! group commit, lifecycle and GC, capacity and quotas, the SSD write log.

mod common;

use spillway_store::{
    format, Durability, EpochPhase, SimStorage, SpaceLimit, Storage, Store, Tier, WriteError,
    WRITE_LOG_HEADER,
};
use spillway_types::{EpochId, FileId, SegmentId, StreamKey, KIB};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

fn open_sim() -> (Arc<SimStorage>, Store) {
    let storage = SimStorage::new();
    let store =
        Store::open_with(&common::small_knobs(), storage.clone() as Arc<dyn Storage>).unwrap();
    (storage, store)
}

/// Stream of each segment file, read from its header record.
fn segment_streams(storage: &Arc<SimStorage>) -> BTreeMap<String, StreamKey> {
    let dir = storage.clone() as Arc<dyn Storage>;
    storage
        .files()
        .into_iter()
        .filter(|(name, _)| format::parse_segment_file_name(name).is_some())
        .map(|(name, _)| {
            let mut header = vec![0u8; format::HEADER_BYTES];
            dir.open(&name).unwrap().read_at(0, &mut header).unwrap();
            (name, format::RecordHeader::decode(&header).unwrap().stream)
        })
        .collect()
}

#[test]
fn queries_answer_epochs_ranges_files_and_byte_ranges() {
    let (_storage, store) = open_sim();
    for epoch in 1..=4u64 {
        for file in 0..3u64 {
            store
                .write(StreamKey(1), EpochId(epoch), FileId(file), 0, &[epoch as u8; 1000])
                .unwrap();
            store.write(StreamKey(1), EpochId(epoch), FileId(file), 3000, &[9; 500]).unwrap();
        }
    }
    // Overlap: newest write wins, holes read as zeros.
    store.write(StreamKey(1), EpochId(2), FileId(1), 500, &[7; 1000]).unwrap();
    let mut back = vec![0xFFu8; 4000];
    store.read(EpochId(2), FileId(1), 0, &mut back).unwrap();
    assert!(back[..500].iter().all(|&b| b == 2));
    assert!(back[500..1500].iter().all(|&b| b == 7));
    assert!(back[1500..3000].iter().all(|&b| b == 0));
    assert!(back[3000..3500].iter().all(|&b| b == 9));
    assert!(back[3500..].iter().all(|&b| b == 0));

    let whole_epoch = store.extents(EpochId(3)..=EpochId(3), None);
    assert_eq!(whole_epoch.len(), 6);
    let range = store.extents(EpochId(2)..EpochId(4), None);
    assert_eq!(
        range.iter().map(|e| e.epoch).collect::<BTreeSet<_>>(),
        BTreeSet::from([EpochId(2), EpochId(3)])
    );
    // In order: (epoch, file, offset) ascending, so a drain can walk files from offset 0 up.
    let keys: Vec<_> = range.iter().map(|e| (e.epoch, e.file, e.offset)).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    let one_file = store.extents(EpochId(2)..=EpochId(2), Some(FileId(1)));
    assert_eq!(
        one_file.iter().map(|e| (e.offset, e.length)).collect::<Vec<_>>(),
        vec![(0, 500), (500, 1000), (1500, 0)][..2]
            .iter()
            .copied()
            .chain([(3000, 500)])
            .collect::<Vec<_>>()
    );
    assert!(one_file.iter().all(|e| e.tier == Tier::Dram));
    assert_eq!(store.files(EpochId(1)).unwrap().len(), 3);
    assert_eq!(store.stat(EpochId(1), FileId(2)).unwrap().size_bytes, 3500);
    assert!(store.stat(EpochId(1), FileId(9)).is_none());
}

#[test]
fn each_stream_gets_its_own_segments() {
    let (storage, store) = open_sim();
    for round in 0..40u64 {
        for stream in 1..=3u64 {
            let data = common::payload(round * 10 + stream, 3000);
            store
                .write(StreamKey(stream), EpochId(round % 4), FileId(stream), round * 3000, &data)
                .unwrap();
        }
    }
    store.sync().unwrap();
    let streams = segment_streams(&storage);
    // Every data record in a segment carries the segment's stream.
    let dir = storage.clone() as Arc<dyn Storage>;
    let mut seen = BTreeSet::new();
    for (name, stream) in &streams {
        let length = storage.files().into_iter().find(|(n, _)| n == name).unwrap().1;
        let mut image = vec![0u8; length as usize];
        dir.open(name).unwrap().read_at(0, &mut image).unwrap();
        let mut at = 0;
        while at < image.len() {
            let header = format::RecordHeader::decode(&image[at..]).unwrap();
            assert_eq!(header.stream, *stream, "segment {name} mixes streams");
            at += format::record_bytes(header.payload_bytes as u64) as usize;
        }
        seen.insert(*stream);
    }
    assert!(seen.is_superset(&BTreeSet::from([StreamKey(1), StreamKey(2), StreamKey(3)])));
    assert_eq!(spillway_store::write_hint_for(StreamKey(1)), 4);
    assert_ne!(store.stats().write_hints, spillway_store::WriteHints::NotTried);
}

/// Simulated storage whose fsync takes a while, like a disk, so commits overlap.
struct SlowSync(Arc<SimStorage>);
struct SlowFile(Arc<dyn spillway_store::SegmentFile>);

impl spillway_store::SegmentFile for SlowFile {
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.write_at(offset, data)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn sync(&self) -> std::io::Result<()> {
        std::thread::sleep(std::time::Duration::from_millis(3));
        self.0.sync()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, length: u64) -> std::io::Result<()> {
        self.0.set_len(length)
    }
    fn set_write_hint(&self, hint: u64) -> std::io::Result<bool> {
        self.0.set_write_hint(hint)
    }
}

impl Storage for SlowSync {
    fn list(&self) -> std::io::Result<Vec<String>> {
        self.0.list()
    }
    fn create(&self, name: &str) -> std::io::Result<Arc<dyn spillway_store::SegmentFile>> {
        Ok(Arc::new(SlowFile(self.0.create(name)?)))
    }
    fn open(&self, name: &str) -> std::io::Result<Arc<dyn spillway_store::SegmentFile>> {
        Ok(Arc::new(SlowFile(self.0.open(name)?)))
    }
    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.0.remove(name)
    }
    fn sync_directory(&self) -> std::io::Result<()> {
        self.0.sync_directory()
    }
    fn describe(&self) -> String {
        "slow-sync simulated storage".into()
    }
}

#[test]
fn concurrent_commits_share_fsync_rounds() {
    let storage = Arc::new(SlowSync(SimStorage::new()));
    let store =
        Arc::new(Store::open_with(&common::small_knobs(), storage as Arc<dyn Storage>).unwrap());
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..10u64 {
                    let epoch = EpochId(t * 100 + i);
                    store
                        .write(
                            StreamKey(t),
                            epoch,
                            FileId(0),
                            0,
                            &common::payload(t * 100 + i, 2000),
                        )
                        .unwrap();
                    store.commit(epoch, Durability::Ssd).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let stats = store.stats();
    assert_eq!(stats.commits, 80);
    // Eight threads committing against a 3 ms fsync: rounds must have been shared.
    assert!(
        stats.commit_rounds < stats.commits,
        "{} rounds for {} commits",
        stats.commit_rounds,
        stats.commits
    );
    eprintln!(
        "80 commits from 8 threads took {} rounds and {} fsyncs",
        stats.commit_rounds, stats.fsyncs
    );
    // Writes after commit are refused; commit is idempotent.
    let error = store.write(StreamKey(0), EpochId(0), FileId(0), 0, b"late").unwrap_err();
    assert!(
        matches!(error, WriteError::EpochNotOpen { phase: EpochPhase::Committed, .. }),
        "{error}"
    );
    store.commit(EpochId(0), Durability::Ssd).unwrap();
}

#[test]
fn writes_above_the_high_watermark_go_straight_to_ssd_and_survive_a_crash() {
    let (storage, store) = open_sim();
    // 256 KiB of DRAM, high watermark 75 %: the 12th 16 KiB record would cross it. Nobody
    // commits and the flusher only spills above the watermark or after a write-through, so
    // that record (and others after it) must be written through, whatever the timing.
    let records = 48u64;
    for i in 0..records {
        store
            .write(
                StreamKey(1),
                EpochId(1),
                FileId(0),
                i * 16 * KIB,
                &common::payload(i, 16 * KIB as usize),
            )
            .unwrap();
        // A second epoch interleaved in the same stream and segments, left uncommitted.
        store
            .write(StreamKey(1), EpochId(2), FileId(0), i * 5000, &common::payload(1000 + i, 5000))
            .unwrap();
    }
    let stats = store.stats();
    assert!(stats.write_through_records > 0, "no record was written through: {stats:?}");
    store.check_invariants();
    let check = |store: &Store| {
        for i in 0..records {
            let mut back = vec![0u8; 16 * KIB as usize];
            store.read(EpochId(1), FileId(0), i * 16 * KIB, &mut back).unwrap();
            assert!(back == common::payload(i, 16 * KIB as usize), "record {i} of epoch 1 differs");
        }
    };
    check(&store);
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    // Power loss right after the commit: every record of epoch 1 is back, written through or not.
    let image = storage.crash_image(spillway_store::CrashPlan {
        torn_write_bytes: Some(3000),
        keep_older_unsynced: false,
    });
    drop(store);
    let store = Store::open_with(&common::small_knobs(), image as Arc<dyn Storage>).unwrap();
    store.check_invariants();
    assert_eq!(
        store.epochs().iter().find(|e| e.epoch == EpochId(1)).unwrap().phase,
        EpochPhase::Committed
    );
    check(&store);
}

#[test]
fn memory_commits_become_durable_in_the_background() {
    let (storage, store) = open_sim();
    store.write(StreamKey(1), EpochId(1), FileId(0), 0, &common::payload(1, 5000)).unwrap();
    store.commit(EpochId(1), Durability::Memory).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.epochs()[0].phase != EpochPhase::Committed {
        assert!(std::time::Instant::now() < deadline, "the flusher never made the epoch durable");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let image = storage.crash_image(spillway_store::CrashPlan {
        torn_write_bytes: None,
        keep_older_unsynced: false,
    });
    drop(store);
    let store = Store::open_with(&common::small_knobs(), image as Arc<dyn Storage>).unwrap();
    let mut back = vec![0u8; 5000];
    store.read(EpochId(1), FileId(0), 0, &mut back).unwrap();
    assert_eq!(back, common::payload(1, 5000));
}

#[test]
fn drained_epochs_free_whole_segments_and_compaction_counts_its_bytes() {
    let (storage, store) = open_sim();
    // Interleave a long-lived and a short-lived epoch on one stream so segments end up mixed.
    for i in 0..60u64 {
        let epoch = if i % 4 == 0 { EpochId(1) } else { EpochId(2) };
        store.write(StreamKey(1), epoch, FileId(0), i * 4000, &common::payload(i, 4000)).unwrap();
    }
    // Spill in arrival order (as the flusher does under pressure), so segments mix both epochs.
    store.sync().unwrap();
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    store.commit(EpochId(2), Durability::Ssd).unwrap();
    let before = store.stats();
    store.mark_drained(EpochId(2)).unwrap();
    assert!(store.read(EpochId(2), FileId(0), 0, &mut [0u8; 10]).is_err());
    let report = store.compact_now().unwrap();
    let after = store.stats();
    eprintln!("{report:?}; WAF {:.3}", after.host_write_amplification);
    assert!(report.segments_compacted > 0 && report.bytes_copied > 0);
    assert!(report.segments_deleted > 0);
    assert!(after.ssd_used_bytes < before.ssd_used_bytes);
    assert_eq!(after.compaction_bytes, report.bytes_copied);
    assert!(after.host_write_amplification > 1.0);
    let segment_files = storage
        .files()
        .into_iter()
        .filter(|(name, _)| format::parse_segment_file_name(name).is_some())
        .count();
    assert!(segment_files < before.segments as usize);
    for i in (0..60u64).step_by(4) {
        let mut back = vec![0u8; 4000];
        store.read(EpochId(1), FileId(0), i * 4000, &mut back).unwrap();
        assert_eq!(back, common::payload(i, 4000), "epoch 1 data at {} after compaction", i * 4000);
    }
    // Restart: compaction copies are found again.
    store.close().unwrap();
    let store =
        Store::open_with(&common::small_knobs(), storage.clone() as Arc<dyn Storage>).unwrap();
    let phases: Vec<_> = store.epochs().into_iter().map(|e| (e.epoch, e.phase)).collect();
    assert_eq!(
        phases,
        vec![(EpochId(1), EpochPhase::Committed), (EpochId(2), EpochPhase::Drained)]
    );
    let mut back = vec![0u8; 4000];
    store.read(EpochId(1), FileId(0), 8 * 4000, &mut back).unwrap();
    assert_eq!(back, common::payload(8, 4000));
}

#[test]
fn out_of_space_names_the_limit_and_writes_nothing() {
    let knobs = spillway_config::StoreKnobs { ssd_bytes_max: 512 * KIB, ..common::small_knobs() };
    let storage = SimStorage::new();
    let store = Store::open_with(&knobs, storage as Arc<dyn Storage>).unwrap();
    store.write(StreamKey(1), EpochId(1), FileId(0), 0, &vec![1u8; 300 * 1024]).unwrap();
    store.commit(EpochId(1), Durability::Ssd).unwrap();
    let free = store.free_bytes();
    let error =
        store.write(StreamKey(1), EpochId(2), FileId(0), 0, &vec![2u8; 200 * 1024]).unwrap_err();
    let message = error.to_string();
    match error {
        WriteError::OutOfSpace { stream, limit, free_bytes, .. } => {
            assert_eq!((stream, limit), (StreamKey(1), SpaceLimit::Ssd));
            assert_eq!(free_bytes, free);
        }
        other => panic!("wrong error {other}"),
    }
    assert!(message.contains("ssd_bytes_max") && message.contains("stream 1"), "{message}");
    assert!(store.stat(EpochId(2), FileId(0)).is_none(), "a failed write left data behind");
    // Committed data untouched; once epoch 1 drains the space comes back.
    let mut back = vec![0u8; 300 * 1024];
    store.read(EpochId(1), FileId(0), 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 1));
    store.mark_drained(EpochId(1)).unwrap();
    assert!(store.wait_for_space(200 * 1024 + 1024, std::time::Duration::from_secs(10)));
    store.write(StreamKey(1), EpochId(2), FileId(0), 0, &vec![2u8; 200 * 1024]).unwrap();
}

#[test]
fn stream_quota_is_enforced_per_stream() {
    let (_storage, store) = open_sim();
    store.set_stream_quota(StreamKey(7), Some(20 * KIB));
    store.write(StreamKey(7), EpochId(1), FileId(0), 0, &[1; 10_000]).unwrap();
    let error = store.write(StreamKey(7), EpochId(1), FileId(0), 10_000, &[1; 15_000]).unwrap_err();
    assert!(
        matches!(
            error,
            WriteError::OutOfSpace {
                stream: StreamKey(7),
                limit: SpaceLimit::StreamQuota,
                limit_bytes: 20480,
                ..
            }
        ),
        "{error}"
    );
    // Other streams are not affected.
    store.write(StreamKey(8), EpochId(1), FileId(1), 0, &[1; 30_000]).unwrap();
    assert_eq!(store.stream_usage_bytes(StreamKey(7)), format::record_bytes(10_000));
    store.delete_epoch(EpochId(1)).unwrap();
    assert_eq!(store.stream_usage_bytes(StreamKey(7)), 0);
    store.write(StreamKey(7), EpochId(2), FileId(0), 0, &[1; 15_000]).unwrap();
}

#[test]
fn ssd_write_log_lists_appends_and_deletions() {
    let temp = tempfile::tempdir().unwrap();
    let log_path = temp.path().join("writes.log");
    let knobs = spillway_config::StoreKnobs {
        ssd_directory: temp.path().join("ssd").display().to_string(),
        ssd_write_log_path: log_path.display().to_string(),
        ..common::small_knobs()
    };
    let store = Store::open(&knobs).unwrap();
    for epoch in 1..=3u64 {
        store
            .write(StreamKey(epoch), EpochId(epoch), FileId(0), 0, &common::payload(epoch, 100_000))
            .unwrap();
        store.commit(EpochId(epoch), Durability::Ssd).unwrap();
    }
    store.mark_drained(EpochId(1)).unwrap();
    store.gc().unwrap();
    let stats = store.stats();
    store.close().unwrap();
    let text = std::fs::read_to_string(&log_path).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(WRITE_LOG_HEADER));
    let (mut written, mut deleted) = (0u64, 0u64);
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    for line in lines {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["write", _stream, segment, offset, length] => {
                let (segment, offset, length): (u64, u64, u64) =
                    (segment.parse().unwrap(), offset.parse().unwrap(), length.parse().unwrap());
                let end = live.entry(segment).or_default();
                assert_eq!(*end, offset, "appends to segment {segment} are sequential");
                *end += length;
                written += length;
            }
            ["delete", segment, length] => {
                let segment: u64 = segment.parse().unwrap();
                assert_eq!(
                    live.remove(&segment),
                    Some(length.parse().unwrap()),
                    "delete length of {segment}"
                );
                deleted += 1;
            }
            other => panic!("unexpected line {other:?}"),
        }
    }
    assert_eq!(written, stats.ssd_bytes_written);
    assert!(deleted > 0);
    assert_eq!(deleted, stats.segments_deleted);
    let _ = SegmentId(0);
}

#[test]
fn concurrent_writers_and_readers_see_their_bytes_while_dram_spills() {
    let (_storage, store) = open_sim();
    let store = Arc::new(store);
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let epoch = EpochId(t + 1);
                for i in 0..150u64 {
                    store
                        .write(
                            StreamKey(t),
                            epoch,
                            FileId(0),
                            i * 3000,
                            &common::payload(t * 1000 + i, 3000),
                        )
                        .unwrap();
                    // Read back an earlier piece: it may be in DRAM, being spilled, or on SSD.
                    let j = (i * 7919) % (i + 1);
                    let mut back = vec![0u8; 3000];
                    store.read(epoch, FileId(0), j * 3000, &mut back).unwrap();
                    assert_eq!(
                        back,
                        common::payload(t * 1000 + j, 3000),
                        "thread {t} piece {j} after write {i}"
                    );
                }
                store.commit(epoch, Durability::Ssd).unwrap();
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let stats = store.stats();
    assert!(
        stats.user_bytes_to_ssd > 0,
        "DRAM never spilled: the test did not exercise both tiers"
    );
    store.check_invariants();
}

#[test]
fn a_directory_is_owned_by_one_store_at_a_time() {
    let temp = tempfile::tempdir().unwrap();
    let knobs = spillway_config::StoreKnobs {
        ssd_directory: temp.path().join("ssd").display().to_string(),
        ..common::small_knobs()
    };
    let first = Store::open(&knobs).unwrap();
    let error = match Store::open(&knobs) {
        Ok(_) => panic!("a second store opened a directory in use"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("in use by another store"), "{error}");
    first.close().unwrap();
    Store::open(&knobs).unwrap().close().unwrap();
}

/// A store on a real directory of the real disk (the target directory: /tmp may be a tmpfs).
fn posix_knobs(temp: &tempfile::TempDir, direct_io: bool) -> spillway_config::StoreKnobs {
    spillway_config::StoreKnobs {
        ssd_directory: temp.path().join("ssd").display().to_string(),
        dram_bytes_max: 4 << 20,
        segment_bytes_max: 8 << 20,
        ssd_bytes_max: 256 << 20,
        record_payload_bytes_max: 1 << 20,
        ssd_reserve_bytes: 0,
        ssd_direct_io: direct_io,
        ..common::small_knobs()
    }
}

#[test]
fn ssd_commits_write_whole_blocks_around_the_page_cache_and_read_back_after_a_restart() {
    for direct_io in [true, false] {
        let temp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let knobs = posix_knobs(&temp, direct_io);
        let store = Store::open(&knobs).unwrap();
        // Two streams whose odd-sized writes interleave: runs start and end inside blocks that
        // a neighbouring run shares.
        for epoch in 1..=4u64 {
            for stream in 1..=2u64 {
                let data = common::payload(epoch * 10 + stream, 3 * 1_000_003 + 77);
                store.write(StreamKey(stream), EpochId(epoch), FileId(stream), 0, &data).unwrap();
            }
            store.commit(EpochId(epoch), Durability::Ssd).unwrap();
        }
        let stats = store.stats();
        if direct_io {
            // Spills and write-throughs alike: all but the blocks at the records' ends.
            assert!(stats.ssd_direct_bytes_written > 20 << 20, "{stats:?}");
            assert!(stats.ssd_direct_bytes_written < stats.ssd_bytes_written, "{stats:?}");
        } else {
            assert_eq!(stats.ssd_direct_bytes_written, 0);
        }
        store.close().unwrap();
        let store = Store::open(&knobs).unwrap();
        for epoch in 1..=4u64 {
            for stream in 1..=2u64 {
                let data = common::payload(epoch * 10 + stream, 3 * 1_000_003 + 77);
                let mut back = vec![0u8; data.len()];
                store.read(EpochId(epoch), FileId(stream), 0, &mut back).unwrap();
                assert!(back == data, "epoch {epoch} stream {stream} (direct_io {direct_io})");
            }
        }
        store.close().unwrap();
    }
}

/// Pages of the file at `path` in the page cache (`mincore` over a read-only mapping, which
/// does not fault any page in).
fn resident_pages(path: &std::path::Path) -> usize {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    let length = file.metadata().unwrap().len() as usize;
    if length == 0 {
        return 0;
    }
    let page = 4096;
    // SAFETY: a fresh shared read-only mapping of our own descriptor, unmapped below; mincore
    // writes one byte per page into a vector of exactly that many bytes.
    unsafe {
        let address = libc::mmap(
            std::ptr::null_mut(),
            length,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        assert_ne!(address, libc::MAP_FAILED, "mmap of {}", path.display());
        let mut residency = vec![0u8; length.div_ceil(page)];
        let result = libc::mincore(address, length, residency.as_mut_ptr());
        libc::munmap(address, length);
        assert_eq!(result, 0, "mincore of {}", path.display());
        residency.iter().filter(|&&byte| byte & 1 == 1).count()
    }
}

#[test]
fn spilled_segments_leave_the_page_cache_once_synced_with_drop_behind() {
    for drop_behind in [true, false] {
        let temp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let knobs = spillway_config::StoreKnobs {
            ssd_drop_behind: drop_behind,
            ..posix_knobs(&temp, false)
        };
        let store = Store::open(&knobs).unwrap();
        let data = common::payload(5, 24 << 20);
        store.write(StreamKey(1), EpochId(1), FileId(0), 0, &data).unwrap();
        store.commit(EpochId(1), Durability::Ssd).unwrap();
        let mut resident = 0;
        for entry in std::fs::read_dir(temp.path().join("ssd")).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            if format::parse_segment_file_name(&name).is_some() {
                resident += resident_pages(&path);
            }
        }
        // 24 MiB are 6144 pages; the DRAM log (4 MiB) never held more than a fifth of them.
        if drop_behind {
            assert!(resident < 64, "{resident} pages of synced segments still cached");
        } else {
            assert!(resident > 4096, "only {resident} pages cached without drop-behind");
        }
        let mut back = vec![0u8; data.len()];
        store.read(EpochId(1), FileId(0), 0, &mut back).unwrap();
        assert!(back == data, "drop_behind {drop_behind}: bytes differ after the drop");
        store.close().unwrap();
    }
}

#[test]
fn spilled_bytes_become_durable_in_the_background_before_any_commit() {
    for sync_behind in [64 * KIB, 0] {
        let knobs = spillway_config::StoreKnobs {
            ssd_sync_behind_bytes: sync_behind,
            ..common::small_knobs()
        };
        let storage = SimStorage::new();
        let store = Store::open_with(&knobs, storage.clone() as Arc<dyn Storage>).unwrap();
        // Four times the DRAM log: most of it is spilled or written through.
        let data = common::payload(7, 1 << 20);
        store.write(StreamKey(1), EpochId(1), FileId(0), 0, &data).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while sync_behind > 0
            && store.stats().sync_behind_rounds == 0
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let rounds = store.stats().sync_behind_rounds;
        // Power loss with the epoch neither committed nor synced.
        let recovered = power_loss(&storage);
        let durable = recovered.epoch(EpochId(1)).map_or(0, |info| info.payload_bytes);
        if sync_behind == 0 {
            assert_eq!(rounds, 0);
            assert_eq!(durable, 0, "nothing was fsync'd, yet {durable} bytes survived");
        } else {
            assert!(rounds > 0, "no background fsync round in 30 s");
            assert!(durable > 0, "{rounds} background rounds, yet nothing survived");
            // What survived is the data written, whole records only.
            let mut back = vec![0u8; data.len()];
            recovered.read(EpochId(1), FileId(0), 0, &mut back).unwrap();
            let survived = back.iter().zip(&data).filter(|(b, d)| b == d).count() as u64;
            assert!(survived >= durable, "{survived} matching bytes of {durable} recovered");
        }
        drop(store);
    }
}

#[test]
fn write_behind_spills_batches_below_the_watermarks_and_reads_them_from_the_ring() {
    // A 1 MiB ring (low watermark 512 KiB) and 64 KiB batches; 256 KiB written stays far below
    // both watermarks, so only write-behind spills it before a commit.
    let knobs = |write_behind| spillway_config::StoreKnobs {
        dram_bytes_max: 1 << 20,
        flusher_batch_bytes: 64 * KIB,
        ssd_write_behind: write_behind,
        ssd_sync_behind_bytes: 0,
        ..common::small_knobs()
    };
    for write_behind in [true, false] {
        let storage = SimStorage::new();
        let store =
            Store::open_with(&knobs(write_behind), storage.clone() as Arc<dyn Storage>).unwrap();
        let data = common::payload(11, 256 * KIB as usize);
        store.write(StreamKey(1), EpochId(1), FileId(0), 0, &data).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while write_behind
            && store.stats().user_bytes_to_ssd < 192 * KIB
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let stats = store.stats();
        let on_ssd = store
            .extents(EpochId(1)..=EpochId(1), None)
            .into_iter()
            .filter(|e| e.tier != Tier::Dram)
            .count();
        if write_behind {
            // Whole batches went (the rest waits for the next batch or the commit), and their
            // ring copies stay as a clean cache below the low watermark.
            assert!(stats.user_bytes_to_ssd >= 192 * KIB, "write-behind spilled {stats:?}");
            assert!(on_ssd > 0, "no extent is on SSD");
            assert_eq!(stats.dram_cached_bytes, stats.user_bytes_to_ssd, "{stats:?}");
            assert_eq!(stats.write_through_records, 0, "{stats:?}");
        } else {
            assert_eq!(stats.user_bytes_to_ssd, 0, "spilled below the watermarks: {stats:?}");
            assert_eq!(on_ssd, 0);
        }
        let mut back = vec![0u8; data.len()];
        store.read(EpochId(1), FileId(0), 0, &mut back).unwrap();
        assert!(back == data, "read back through the cached copies");
        // The commit spills the rest; every copy is clean then, and a read from the
        // segments (after the copies are dropped) returns the same bytes.
        store.commit(EpochId(1), Durability::Ssd).unwrap();
        assert_eq!(store.stats().dram_used_bytes, 0);
        assert!(store.evict_cached() > 0, "the commit's spill kept no cached copy");
        back.fill(0);
        store.read(EpochId(1), FileId(0), 0, &mut back).unwrap();
        assert!(back == data, "read back from the segments");
        store.check_invariants();
        let recovered = power_loss(&storage);
        back.fill(0);
        recovered.read(EpochId(1), FileId(0), 0, &mut back).unwrap();
        assert!(back == data, "the committed data after a power loss");
    }
}

#[test]
fn cached_copies_give_way_to_new_writes() {
    // Eight times the ring, written with write-behind and no commit: the clean copies of what
    // was spilled are evicted as new records need the room, and every byte reads back.
    let knobs = spillway_config::StoreKnobs {
        dram_bytes_max: 512 * KIB,
        flusher_batch_bytes: 32 * KIB,
        ..common::small_knobs()
    };
    let storage = SimStorage::new();
    let store = Store::open_with(&knobs, storage.clone() as Arc<dyn Storage>).unwrap();
    let data = common::payload(12, 4 << 20);
    for (i, chunk) in data.chunks(16 * KIB as usize).enumerate() {
        store.write(StreamKey(1), EpochId(1), FileId(0), (i * chunk.len()) as u64, chunk).unwrap();
        let stats = store.stats();
        assert!(
            stats.dram_cached_bytes <= 256 * KIB,
            "clean copies above the low watermark: {stats:?}"
        );
    }
    let mut back = vec![0u8; data.len()];
    store.read(EpochId(1), FileId(0), 0, &mut back).unwrap();
    assert!(back == data);
    store.check_invariants();
}

fn open_manual_sim() -> (Arc<SimStorage>, Store) {
    let storage = SimStorage::new();
    let store = Store::open_with_flusher(
        &common::small_knobs(),
        storage.clone() as Arc<dyn Storage>,
        spillway_store::FlusherMode::Manual,
    )
    .unwrap();
    (storage, store)
}

/// A power loss now: every unsynced write dropped.
fn power_loss(storage: &SimStorage) -> Store {
    let image = storage.crash_image(spillway_store::CrashPlan {
        torn_write_bytes: None,
        keep_older_unsynced: false,
    });
    Store::open_with(&common::small_knobs(), image as Arc<dyn Storage>).unwrap()
}

#[test]
fn sync_epoch_makes_that_epoch_durable_and_leaves_the_others_in_dram() {
    let (storage, store) = open_manual_sim();
    let (synced, other) = (common::payload(1, 40_000), common::payload(2, 40_000));
    store.write(StreamKey(1), EpochId(1), FileId(0), 0, &synced).unwrap();
    store.write(StreamKey(2), EpochId(2), FileId(0), 0, &other).unwrap();
    store.sync_epoch(EpochId(1)).unwrap();
    let in_dram = |epoch: u64| -> Vec<bool> {
        let extents = store.extents(EpochId(epoch)..=EpochId(epoch), None);
        extents.into_iter().map(|e| e.tier == Tier::Dram).collect()
    };
    assert!(in_dram(1).iter().all(|dram| !dram), "epoch 1 is still in DRAM");
    assert!(in_dram(2).iter().all(|dram| *dram), "another epoch was spilled by the sync");
    assert!(!in_dram(2).is_empty());
    // Still open: a sync does not seal.
    store.write(StreamKey(1), EpochId(1), FileId(1), 0, b"after the sync").unwrap();
    let recovered = power_loss(&storage);
    let mut back = vec![0u8; synced.len()];
    recovered.read(EpochId(1), FileId(0), 0, &mut back).unwrap();
    assert!(back == synced);
    assert!(recovered.epochs().iter().all(|e| e.epoch != EpochId(2)), "epoch 2 was never synced");
}

#[test]
fn concurrent_syncs_of_many_epochs_are_each_durable() {
    let (storage, store) = open_sim();
    let store = Arc::new(store);
    let threads: Vec<_> = (1..=6u64)
        .map(|epoch| {
            let store = store.clone();
            std::thread::spawn(move || {
                for round in 0..20u64 {
                    let data = common::payload(epoch * 100 + round, 3000);
                    store.write(StreamKey(epoch), EpochId(epoch), FileId(round), 0, &data).unwrap();
                    store.sync_epoch(EpochId(epoch)).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let stats = store.stats();
    eprintln!("fsyncs {} shared {}", stats.fsyncs, stats.fsyncs_shared);
    let recovered = power_loss(&storage);
    for epoch in 1..=6u64 {
        for round in 0..20u64 {
            let mut back = vec![0u8; 3000];
            recovered.read(EpochId(epoch), FileId(round), 0, &mut back).unwrap();
            assert!(
                back == common::payload(epoch * 100 + round, 3000),
                "epoch {epoch} file {round}"
            );
        }
    }
}

#[test]
fn a_run_of_zeros_reads_as_zeros_costs_one_small_record_and_survives_restart_and_compaction() {
    let (storage, store) = open_sim();
    let (stream, epoch, file) = (StreamKey(1), EpochId(1), FileId(3));
    let data = common::payload(7, 256 * KIB as usize);
    store.write(stream, epoch, file, 0, &data).unwrap();
    let before = store.stats();
    // A hole punched in the middle, and a run of a GiB past the end: on a store of 8 MiB.
    store.write_zeros(stream, epoch, file, 64 * KIB, 32 * KIB).unwrap();
    let gib = 1u64 << 30;
    store.write_zeros(stream, epoch, file, 512 * KIB, gib).unwrap();
    // Newest wins inside a run as anywhere else.
    store.write(stream, epoch, file, 512 * KIB + 100, &[5; 10]).unwrap();
    store.write_zeros(stream, epoch, file, 0, 0).unwrap();
    let after = store.stats();
    let record = format::record_bytes(format::ZEROS_PAYLOAD_BYTES as u64);
    assert_eq!(after.user_payload_bytes - before.user_payload_bytes, 2 * 8 + 10);
    assert_eq!(
        after.dram_used_bytes + after.ssd_used_bytes
            - before.dram_used_bytes
            - before.ssd_used_bytes,
        2 * record + format::record_bytes(10),
        "two runs of zeros (one a GiB long) and a 10-byte write cost three small records"
    );
    let check = |store: &Store| {
        let mut expected = data.clone();
        expected[64 * KIB as usize..96 * KIB as usize].fill(0);
        let mut back = vec![0xEEu8; data.len()];
        store.read(epoch, file, 0, &mut back).unwrap();
        assert!(back == expected, "the punched hole reads as zeros, the rest as written");
        let mut back = vec![0xEEu8; 4096];
        store.read(epoch, file, 512 * KIB, &mut back).unwrap();
        assert!(back[..100].iter().all(|&b| b == 0) && back[100..110] == [5; 10]);
        assert!(back[110..].iter().all(|&b| b == 0));
        store.read(epoch, file, 512 * KIB + gib - 4096, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert_eq!(store.stat(epoch, file).unwrap().size_bytes, 512 * KIB + gib);
    };
    check(&store);
    store.commit(epoch, Durability::Ssd).unwrap();
    let records = store.epoch(epoch).unwrap().data_records;
    // Another epoch's dead bytes beside them, so compaction has segments to copy from.
    for i in 0..64u64 {
        store.write(StreamKey(1), EpochId(2), FileId(0), i * 16 * KIB, &[1; 16 * 1024]).unwrap();
    }
    store.delete_epoch(EpochId(2)).unwrap();
    store.compact_now().unwrap();
    check(&store);
    store.close().unwrap();
    let store = Store::open_with(&common::small_knobs(), storage as Arc<dyn Storage>).unwrap();
    assert_eq!(store.epoch(epoch).unwrap().phase, EpochPhase::Committed);
    assert_eq!(store.epoch(epoch).unwrap().data_records, records, "runs count as data records");
    check(&store);
    store.check_invariants();
}

#[test]
fn a_run_of_zeros_past_the_file_size_limit_is_refused_by_name() {
    let (_storage, store) = open_sim();
    let limit = common::small_knobs().file_bytes_max;
    let error = store.write_zeros(StreamKey(1), EpochId(1), FileId(0), limit - 10, 11).unwrap_err();
    assert!(matches!(error, WriteError::FileTooLarge { .. }), "{error}");
    let error = store.write_zeros(StreamKey(1), EpochId(1), FileId(0), u64::MAX, 2).unwrap_err();
    assert!(matches!(error, WriteError::OffsetOverflow { .. }), "{error}");
    assert!(store.epochs().is_empty() || store.extents(.., None).is_empty());
}
