//! The drain never loses data or frees it early, and one bad epoch never stops the others
//! (issue 15): an unmarked (unmounted) PFS directory gets nothing and frees nothing; holes stay
//! holes; a drain that keeps failing or panics is quarantined (journaled, not resumed at
//! restart, released by a new request); an epoch that cannot drain does not delay another
//! owner's epoch.
//!
//! In process: a real store, server (Unix socket) and drainer over a real directory. No
//! assertion depends on timing: every wait is for a state, bounded by a generous deadline.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_client::{Client, ClientOptions, Placement};
use spillway_config::{ServerKnobs, StoreKnobs};
use spillway_drain::{DrainMode, Drainer, DrainerOptions, FaultyPfs, Pfs, PosixPfs};
use spillway_proto::{DrainInfo, DrainState, Durability, Endpoint, EpochGrant, EpochState};
use spillway_server::{Backend, GrantMode, Server, ServerOptions, ShutdownHandle, StoreBackend};
use spillway_types::EpochId;

struct Node {
    backend: Arc<StoreBackend>,
    endpoint: Endpoint,
    shutdown: ShutdownHandle,
    serving: Option<std::thread::JoinHandle<()>>,
}

impl Node {
    fn start(dir: &Path) -> Node {
        assert_eq!(spillway_sys::user::euid(), 0, "these tests need root, as `make test` runs");
        let store_knobs = StoreKnobs {
            ssd_directory: dir.join("ssd").display().to_string(),
            dram_bytes_max: 64 << 20,
            ssd_bytes_max: 1 << 30,
            ..StoreKnobs::default()
        };
        let backend =
            Arc::new(StoreBackend::new(spillway_store::Store::open(&store_knobs).unwrap()));
        let endpoint = Endpoint::Unix(dir.join("s0.sock"));
        let knobs = ServerKnobs { server_name: "s0".into(), ..ServerKnobs::default() };
        let server = Server::bind(
            ServerOptions::from_knobs(&knobs),
            backend.clone(),
            std::slice::from_ref(&endpoint),
            false,
        )
        .unwrap();
        let shutdown = server.shutdown_handle();
        let serving = Some(std::thread::spawn(move || server.run().unwrap()));
        Node { backend, endpoint, shutdown, serving }
    }

    fn client(&self) -> Client {
        let options = ClientOptions {
            placement: Placement::Local { rank: 0 },
            durability: Durability::Ssd,
            ..ClientOptions::default()
        };
        Client::connect(std::slice::from_ref(&self.endpoint), options).unwrap()
    }

    fn drainer(&self, dir: &Path, pfs: Arc<dyn Pfs>, quarantine_after_failures: u32) -> Drainer {
        let options = self.drainer_options(quarantine_after_failures);
        Drainer::start(options, self.backend.clone(), pfs, &dir.join("ssd"), None).unwrap()
    }

    fn drainer_options(&self, quarantine_after_failures: u32) -> DrainerOptions {
        DrainerOptions {
            peers: vec![self.endpoint.clone()],
            self_index: 0,
            stripe_bytes: 64 << 10,
            write_bytes_max: 1 << 20,
            default_mode: DrainMode::Shuffled,
            drain_after_commit: false,
            ingest_bandwidth_share: 1.0,
            ingest_idle_after: Duration::from_millis(250),
            retry_backoff_min: Duration::from_millis(5),
            retry_backoff_max: Duration::from_millis(50),
            queued_epochs_max: 16,
            quarantine_after_failures,
            server_name: "s0".into(),
            staging_key: spillway_drain::StagingKey::random(),
            munge_socket: None,
        }
    }

    fn epoch_state(&self, epoch: EpochId) -> EpochState {
        self.backend.epochs().unwrap().into_iter().find(|e| e.epoch == epoch).unwrap().state
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown.shutdown();
        if let Some(serving) = self.serving.take() {
            let _ = serving.join();
        }
    }
}

/// Writes `data` at `offset` of file `name` in `epoch` and commits.
fn write_committed(c: &mut Client, epoch: EpochId, name: &str, offset: u64, data: &[u8]) {
    c.begin_epoch(epoch);
    let mut file = c.create_file(epoch, name).unwrap();
    c.write(&mut file, offset, data).unwrap();
    c.flush().unwrap();
    c.commit_epoch(epoch).unwrap();
}

fn status_of(drainer: &Drainer, epoch: EpochId) -> Option<DrainInfo> {
    drainer.status().into_iter().find(|d| d.epoch == epoch)
}

/// Waits (bounded) until `epoch`'s drain status satisfies `condition`; returns it.
fn wait_status(
    drainer: &Drainer,
    epoch: EpochId,
    what: &str,
    condition: impl Fn(&DrainInfo) -> bool,
) -> DrainInfo {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(info) = status_of(drainer, epoch).filter(|i| condition(i)) {
            return info;
        }
        assert!(Instant::now() < deadline, "epoch {epoch}: {what}: {:?}", drainer.status());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_unmounted_pfs_gets_nothing_and_frees_nothing_until_the_marked_pfs_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    // The mount point exists but the PFS is not mounted: no marker.
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    let mut app = node.client();
    write_committed(&mut app, EpochId(1), "ckpt.dat", 0, &[7u8; 100_000]);
    let drainer = node.drainer(dir.path(), Arc::new(PosixPfs::new(&pfs)), 0);
    drainer.request(EpochId(1), DrainMode::Shuffled).unwrap();
    let info = wait_status(&drainer, EpochId(1), "retrying on the missing marker", |i| {
        i.state == DrainState::Retrying && i.failed_attempts >= 2
    });
    assert!(info.last_error.contains("mark-pfs"), "{}", info.last_error);
    assert!(std::fs::read_dir(&pfs).unwrap().next().is_none(), "nothing on the local disk");
    assert_eq!(node.epoch_state(EpochId(1)), EpochState::Committed, "nothing freed");
    // The administrator marks the mounted PFS: the retry drains, then the space is freed.
    spillway_drain::pfs::mark_pfs(&pfs).unwrap();
    wait_status(&drainer, EpochId(1), "drained", |i| i.state == DrainState::Drained);
    assert_eq!(std::fs::read(pfs.join("epoch-1/ckpt.dat")).unwrap(), vec![7u8; 100_000]);
    assert_eq!(node.epoch_state(EpochId(1)), EpochState::Drained);
}

#[test]
fn ten_bytes_at_one_gib_drain_as_a_sparse_file() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    spillway_drain::pfs::mark_pfs(&pfs).unwrap();
    let mut app = node.client();
    let gib = 1u64 << 30;
    write_committed(&mut app, EpochId(1), "sparse.dat", gib, b"0123456789");
    let drainer = node.drainer(dir.path(), Arc::new(PosixPfs::new(&pfs)), 0);
    drainer.request(EpochId(1), DrainMode::Shuffled).unwrap();
    let info = wait_status(&drainer, EpochId(1), "drained", |i| i.state == DrainState::Drained);
    assert!(info.pfs_bytes_written < 1 << 20, "wrote {} bytes", info.pfs_bytes_written);
    let path = pfs.join("epoch-1/sparse.dat");
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), gib + 10);
    assert!(meta.blocks() * 512 < 1 << 20, "not sparse: {} blocks", meta.blocks());
    let file = std::fs::File::open(&path).unwrap();
    let mut tail = [0u8; 14];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut tail, gib - 4).unwrap();
    assert_eq!(&tail[..4], &[0u8; 4]);
    assert_eq!(&tail[4..], b"0123456789");
    // Its identity holds the checksum of the whole file, the hole as zeros.
    let identity = spillway_drain::pfs::published_identity(&path).unwrap().unwrap();
    let expected =
        crc32c::crc32c_append(spillway_drain::plan::crc32c_append_zeros(0, gib), b"0123456789");
    assert_eq!((identity.epoch, identity.size, identity.crc32c), (1, gib + 10, Some(expected)));
}

/// Runs of zeros (a punched hole, a truncate's zero-fill) and zeros the application wrote are
/// not written to the PFS: they stay holes there, in both drain modes.
#[test]
fn chunks_of_zeros_drain_as_holes() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    spillway_drain::pfs::mark_pfs(&pfs).unwrap();
    let mut app = node.client();
    let size = 16usize << 20;
    // No zero byte of its own: every zero on the PFS comes from the run.
    let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251 + 1) as u8).collect();
    let mut expected = data.clone();
    expected[(1 << 20) + 5..15 << 20].fill(0);
    for (epoch, mode) in [(1, DrainMode::Shuffled), (2, DrainMode::Naive)] {
        let epoch = EpochId(epoch);
        app.begin_epoch(epoch);
        let mut file = app.create_file(epoch, "zeros.dat").unwrap();
        app.write(&mut file, 0, &data).unwrap();
        app.write_zeros(&mut file, (1 << 20) + 5, (14 << 20) - 5).unwrap();
        app.flush().unwrap();
        app.commit_epoch(epoch).unwrap();
        let drainer = node.drainer(dir.path(), Arc::new(PosixPfs::new(&pfs)), 0);
        drainer.request(epoch, mode).unwrap();
        let info = wait_status(&drainer, epoch, "drained", |i| i.state == DrainState::Drained);
        let path = pfs.join(format!("epoch-{epoch}/zeros.dat"));
        assert!(std::fs::read(&path).unwrap() == expected, "{mode:?}: the drained bytes differ");
        let meta = std::fs::metadata(&path).unwrap();
        // 1 MiB chunks: the first two and the last hold data, the 13 between are zeros.
        assert!(info.pfs_bytes_written <= 3 << 20, "{mode:?}: wrote {}", info.pfs_bytes_written);
        assert!(meta.blocks() * 512 <= 4 << 20, "{mode:?}: {} blocks", meta.blocks());
        let identity = spillway_drain::pfs::published_identity(&path).unwrap().unwrap();
        // Shuffled drains record the file's checksum (holes as zeros); naive ones none.
        let crc = (mode == DrainMode::Shuffled).then(|| crc32c::crc32c(&expected));
        assert_eq!(identity.crc32c, crc, "{mode:?}");
    }
}

#[test]
fn a_drain_that_keeps_failing_is_quarantined_kept_across_restart_and_released_by_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let pfs_dir = dir.path().join("pfs");
    std::fs::create_dir(&pfs_dir).unwrap();
    spillway_drain::pfs::mark_pfs(&pfs_dir).unwrap();
    let mut app = node.client();
    write_committed(&mut app, EpochId(1), "a.dat", 0, &[1u8; 50_000]);
    write_committed(&mut app, EpochId(2), "b.dat", 0, &[2u8; 50_000]);

    let (pfs, faults) = FaultyPfs::new(PosixPfs::new(&pfs_dir));
    faults.lock().fsync_fails = true;
    let drainer = node.drainer(dir.path(), Arc::new(pfs), 3);
    drainer.request(EpochId(1), DrainMode::Shuffled).unwrap();
    let info =
        wait_status(&drainer, EpochId(1), "quarantined", |i| i.state == DrainState::Quarantined);
    assert_eq!(info.failed_attempts, 3);
    assert!(
        info.last_error.contains("quarantined") && info.last_error.contains("fsync"),
        "{}",
        info.last_error
    );
    assert_eq!(node.epoch_state(EpochId(1)), EpochState::Committed, "nothing freed");
    // A panicking attempt is caught and quarantined at once; the drainer lives on.
    faults.lock().fsync_fails = false;
    faults.lock().panic_on_open = true;
    drainer.request(EpochId(2), DrainMode::Shuffled).unwrap();
    let info = wait_status(&drainer, EpochId(2), "quarantined after a panic", |i| {
        i.state == DrainState::Quarantined
    });
    assert!(info.last_error.contains("panicked"), "{}", info.last_error);
    drainer.stop();
    drop(drainer);

    // Restart: both stay quarantined (not replayed into another failure), shown with why.
    faults.lock().panic_on_open = false;
    let (pfs, _faults) = FaultyPfs::new(PosixPfs::new(&pfs_dir));
    let drainer = node.drainer(dir.path(), Arc::new(pfs), 3);
    for epoch in [EpochId(1), EpochId(2)] {
        let info = status_of(&drainer, epoch).unwrap();
        assert_eq!(info.state, DrainState::Quarantined, "{info:?}");
        assert!(info.last_error.contains("request the drain again"), "{}", info.last_error);
    }
    assert!(std::fs::read_dir(pfs_dir.join("epoch-1")).is_ok_and(|d| d
        .filter_map(Result::ok)
        .all(|e| e.file_name().to_string_lossy().starts_with('.'))));
    // An explicit request releases each; both drain completely.
    for epoch in [EpochId(1), EpochId(2)] {
        drainer.request(epoch, DrainMode::Shuffled).unwrap();
        wait_status(&drainer, epoch, "drained", |i| i.state == DrainState::Drained);
    }
    assert_eq!(std::fs::read(pfs_dir.join("epoch-1/a.dat")).unwrap(), vec![1u8; 50_000]);
    assert_eq!(std::fs::read(pfs_dir.join("epoch-2/b.dat")).unwrap(), vec![2u8; 50_000]);
}

#[test]
fn an_epoch_that_cannot_drain_never_delays_another_owner_s_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    std::fs::set_permissions(&pfs, std::fs::Permissions::from_mode(0o1777)).unwrap();
    spillway_drain::pfs::mark_pfs(&pfs).unwrap();
    // Epoch 1 belongs to uid 5301, whose epoch directory on the PFS is root's and refuses it.
    let grant = EpochGrant {
        owner_uid: 5301,
        owner_gid: 5301,
        allowed_uids: Vec::new(),
        allowed_gids: Vec::new(),
        capacity_bytes: 0,
        reservation_capacity_bytes: 0,
        stream: None,
    };
    node.backend.grant_epoch(EpochId(1), grant, GrantMode::Replace).unwrap();
    std::fs::create_dir(pfs.join("epoch-1")).unwrap();
    std::fs::set_permissions(pfs.join("epoch-1"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut app = node.client();
    write_committed(&mut app, EpochId(1), "stuck.dat", 0, &[1u8; 10_000]);
    write_committed(&mut app, EpochId(2), "free.dat", 0, &[2u8; 10_000]);
    let drainer = node.drainer(dir.path(), Arc::new(PosixPfs::new(&pfs)), 0);
    // The stuck epoch is queued first and fails before the other is even requested.
    drainer.request(EpochId(1), DrainMode::Shuffled).unwrap();
    wait_status(&drainer, EpochId(1), "failing", |i| i.failed_attempts >= 1);
    drainer.request(EpochId(2), DrainMode::Shuffled).unwrap();
    wait_status(&drainer, EpochId(2), "drained", |i| i.state == DrainState::Drained);
    assert_eq!(std::fs::read(pfs.join("epoch-2/free.dat")).unwrap(), vec![2u8; 10_000]);
    let stuck = status_of(&drainer, EpochId(1)).unwrap();
    assert_ne!(stuck.state, DrainState::Drained);
    assert!(stuck.last_error.contains("ermission denied"), "{}", stuck.last_error);
    assert_eq!(node.epoch_state(EpochId(1)), EpochState::Committed, "nothing freed");
}

#[test]
fn a_journal_that_fails_to_sync_frees_nothing_and_refuses_requests_until_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    spillway_drain::pfs::mark_pfs(&pfs).unwrap();
    let mut app = node.client();
    write_committed(&mut app, EpochId(1), "a.dat", 0, &[5u8; 30_000]);
    write_committed(&mut app, EpochId(2), "b.dat", 0, &[6u8; 30_000]);
    let faults = Arc::new(parking_lot::Mutex::new(spillway_drain::JournalFaults::default()));
    let journal =
        spillway_drain::Journal::open_with_faults(&dir.path().join("ssd"), 4096, faults.clone())
            .unwrap();
    let options = node.drainer_options(0);
    let drainer = Drainer::start_with_journal(
        options,
        node.backend.clone(),
        Arc::new(PosixPfs::new(&pfs)),
        journal,
        None,
    )
    .unwrap();
    // ENOSPC on the journal: the request is refused (not acknowledged), nothing queued.
    faults.lock().space_left_bytes = Some(0);
    let refused = drainer.request(EpochId(2), DrainMode::Shuffled).unwrap_err();
    assert!(refused.to_string().contains("No space left"), "{refused}");
    assert!(status_of(&drainer, EpochId(2)).is_none());
    faults.lock().space_left_bytes = None;
    drainer.request(EpochId(1), DrainMode::Shuffled).unwrap();
    // The PFS copy is published but the `Drained` record's fdatasync fails: not freed.
    faults.lock().sync_fails = true;
    let info = wait_status(&drainer, EpochId(1), "failing on the journal", |i| {
        i.failed_attempts >= 2 && i.last_error.contains("drain journal")
    });
    assert_ne!(info.state, DrainState::Drained);
    assert_eq!(node.epoch_state(EpochId(1)), EpochState::Committed, "nothing freed");
    assert_eq!(std::fs::read(pfs.join("epoch-1/a.dat")).unwrap(), vec![5u8; 30_000]);
    // After a failed fdatasync the journal takes nothing more until the server restarts.
    faults.lock().sync_fails = false;
    let refused = drainer.request(EpochId(2), DrainMode::Shuffled).unwrap_err();
    assert!(refused.to_string().contains("restart"), "{refused}");
    drainer.stop();
    drop(drainer);
    // Restart with a healthy journal: the drain resumes (or finds its record) and frees.
    let drainer = node.drainer(dir.path(), Arc::new(PosixPfs::new(&pfs)), 0);
    drainer.request(EpochId(1), DrainMode::Shuffled).unwrap();
    wait_status(&drainer, EpochId(1), "drained", |i| i.state == DrainState::Drained);
    assert_eq!(node.epoch_state(EpochId(1)), EpochState::Drained);
    drainer.request(EpochId(2), DrainMode::Shuffled).unwrap();
    wait_status(&drainer, EpochId(2), "drained", |i| i.state == DrainState::Drained);
}

#[test]
fn a_record_damaged_after_ingest_fails_the_drain_and_nothing_is_published_or_freed() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let pfs_dir = dir.path().join("pfs");
    std::fs::create_dir(&pfs_dir).unwrap();
    spillway_drain::pfs::mark_pfs(&pfs_dir).unwrap();
    let mut app = node.client();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    write_committed(&mut app, EpochId(1), "a.dat", 0, &data);
    write_committed(&mut app, EpochId(2), "b.dat", 0, &data);
    // Bit rot after the write was checked and committed: one byte of each epoch's file, in
    // whichever tier the record lives now (DRAM or SSD).
    for epoch in [EpochId(1), EpochId(2)] {
        let file = node.backend.files(epoch).unwrap()[0].file;
        let at = node.backend.store().inject_corruption(epoch, file, 1_234_567).unwrap();
        assert!(at.is_some(), "the byte is held");
    }
    let pfs = PosixPfs::new(&pfs_dir);
    let drainer = node.drainer(dir.path(), Arc::new(pfs), 2);
    drainer.request(EpochId(1), DrainMode::Shuffled).unwrap();
    drainer.request(EpochId(2), DrainMode::Naive).unwrap();
    for epoch in [EpochId(1), EpochId(2)] {
        let info =
            wait_status(&drainer, epoch, "quarantined", |i| i.state == DrainState::Quarantined);
        assert!(
            info.last_error.contains("write-time checksum")
                && info.last_error.contains(&format!("epoch {epoch}")),
            "the failure does not name the damage: {}",
            info.last_error
        );
        assert_eq!(node.epoch_state(epoch), EpochState::Committed, "nothing freed");
        // Nothing under a final name: at most hidden staging files in the epoch's directory.
        let published: Vec<_> = std::fs::read_dir(pfs_dir.join(format!("epoch-{epoch}")))
            .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            published.iter().all(|name| name.to_string_lossy().starts_with('.')),
            "published despite damage: {published:?}"
        );
    }
}
