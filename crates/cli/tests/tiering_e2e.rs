//! End to end: IAS tiering with a real `spillway manager` (the data scheduler) and a real
//! `spillway serve` (the burst buffer) on loopback, a PFS directory and node-local stores.
//!
//! Jobs' phases land on each of the three tiers by Algorithm 1 as the manager decides it, read
//! back through the writing client and through fresh clients, node-local data moves to the
//! burst buffer once the scheduler sees it idle, a full node-local tier falls back to the burst
//! buffer without losing a byte, and phase reports never run on the writer's thread.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spillway_client::{
    Client, ClientOptions, NodeLocalOptions, PhaseBegin, PhaseEnd, Tier, TierService,
    TieringOptions,
};
use spillway_harness::{pattern, ManagerProcess, ServerProcess};
use spillway_manager::tiering::ManagerTiers;
use spillway_policy::TierSnapshot;
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const MIB: u64 = 1 << 20;

struct Setup {
    _dir: tempfile::TempDir,
    server: ServerProcess,
    manager: ManagerProcess,
    pfs: PathBuf,
    local: PathBuf,
}

fn setup(strategy: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    let local = dir.path().join("node-local");
    std::fs::create_dir_all(&pfs).unwrap();
    let server =
        ServerProcess::builder(BIN, dir.path(), "bb").pfs_dir(&pfs).dram_bytes("64M").start();
    let manager = ManagerProcess::start(
        Path::new(BIN),
        &dir.path().join("manager"),
        &[
            ("SPILLWAY_MANAGER_TIERING_DEFAULT", strategy),
            ("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "none"),
        ],
    );
    Setup { _dir: dir, server, manager, pfs, local }
}

impl Setup {
    fn service(&self) -> Arc<dyn TierService> {
        let api = spillway_manager::ApiClient::new(&self.manager.socket.to_string_lossy()).unwrap();
        Arc::new(ManagerTiers::new(api))
    }

    fn tiering(&self, job: &str, service: Arc<dyn TierService>) -> TieringOptions {
        TieringOptions {
            pfs_directory: Some(self.pfs.clone()),
            node_local: Some(NodeLocalOptions {
                directory: self.local.clone(),
                capacity_bytes: 256 * MIB,
                bandwidth_bytes_per_s: 0,
            }),
            service: Some(service),
            begin_wait_max: Duration::from_secs(10),
            ..TieringOptions::new(job)
        }
    }

    fn client(&self, tiering: Option<TieringOptions>) -> Client {
        let options = ClientOptions { tiering, ..ClientOptions::default() };
        Client::connect(self.server.endpoints(), options).unwrap()
    }

    /// `spillway mount --background` of the setup's server and manager at `<dir>/<name>` with
    /// `args`, its log in `<dir>/<name>.log`.
    fn mount_background(&self, name: &str, args: &[&str]) -> Mounted {
        assert!(
            Path::new("/dev/fuse").exists(),
            "the mount tests need /dev/fuse (the fuse kernel module) and root"
        );
        let dir = self.pfs.parent().unwrap();
        let path = dir.join(name);
        std::fs::create_dir_all(&path).unwrap();
        let output = std::process::Command::new(BIN)
            .args(["mount", "--background"])
            .args(args)
            .arg("--servers")
            .arg(self.server.endpoint().to_string())
            .arg("--manager")
            .arg(&self.manager.socket)
            .arg("--log")
            .arg(dir.join(format!("{name}.log")))
            .arg(&path)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        Mounted { path }
    }

    /// A client without tiering that finds drained or PFS-written epochs on the PFS.
    fn reader(&self) -> Client {
        let mut client = self.client(None);
        client.set_pfs_fallback(&self.pfs);
        client
    }
}

fn write_file(client: &mut Client, epoch: u64, name: &str, bytes: u64, seed: u64) -> Tier {
    let epoch = EpochId(epoch);
    client.begin_epoch(epoch);
    let mut file = client.create_file(epoch, name).unwrap();
    let data = pattern(seed, bytes as usize);
    for (i, chunk) in data.chunks(MIB as usize).enumerate() {
        client.write(&mut file, i as u64 * MIB, chunk).unwrap();
    }
    file.tier()
}

fn read_back(client: &mut Client, epoch: u64, name: &str, bytes: u64, seed: u64, how: &str) {
    let file = client
        .open_file(EpochId(epoch), name)
        .unwrap_or_else(|e| panic!("{how}: open of epoch {epoch} {name}: {e}"));
    assert_eq!(client.file_size(&file).unwrap(), bytes, "{how}: size of epoch {epoch} {name}");
    let mut buffer = vec![0u8; bytes as usize];
    client.read(&file, 0, &mut buffer).unwrap();
    assert!(buffer == pattern(seed, bytes as usize), "{how}: epoch {epoch} {name} differs");
}

/// A mount made by a `spillway mount --background` process; unmounted when dropped.
struct Mounted {
    path: PathBuf,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ =
            std::process::Command::new(BIN).arg("umount").arg("--lazy").arg(&self.path).status();
    }
}

/// `spillway mount --epochs` of the setup, as a separate process.
struct EpochsView {
    _mounted: Mounted,
    path: PathBuf,
}

impl EpochsView {
    fn mount(s: &Setup) -> EpochsView {
        let pfs = s.pfs.to_str().unwrap();
        let mounted = s.mount_background("view", &["--epochs", "--pfs", pfs]);
        EpochsView { path: mounted.path.clone(), _mounted: mounted }
    }

    fn read(&self, epoch: u64, name: &str, bytes: u64, seed: u64, how: &str) {
        let path = self.path.join(format!("epoch-{epoch}")).join(name);
        let data =
            std::fs::read(&path).unwrap_or_else(|e| panic!("{how}: {}: {e}", path.display()));
        assert_eq!(data.len() as u64, bytes, "{how}: size of {}", path.display());
        assert!(data == pattern(seed, bytes as usize), "{how}: {} differs", path.display());
    }

    fn epochs(&self) -> Vec<String> {
        self.list("").unwrap()
    }

    /// The sorted names in a directory of the view (errors surface while reading it).
    fn list(&self, directory: &str) -> std::io::Result<Vec<String>> {
        let mut names = std::fs::read_dir(self.path.join(directory))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<Vec<String>>>()?;
        names.sort();
        Ok(names)
    }
}

impl Drop for EpochsView {
    fn drop(&mut self) {
        let _ =
            std::process::Command::new(BIN).arg("umount").arg("--lazy").arg(&self.path).status();
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn algorithm_1_places_phases_on_every_tier_and_the_data_reads_back_from_each() {
    let s = setup("interference-aware");
    let mut a = s.client(Some(s.tiering("job-a", s.service())));
    let mut b = s.client(Some(s.tiering("job-b", s.service())));

    // Job a alone (N = 1): the burst buffer; its phase stays open.
    assert_eq!(write_file(&mut a, 10, "ckpt", 3 * MIB, 1), Tier::BurstBuffer);
    // Job b (N = 2, a on the BB): the PFS, written at a staging name until its commit.
    assert_eq!(write_file(&mut b, 20, "out/ckpt", 3 * MIB, 2), Tier::Pfs);
    let final_b = s.pfs.join("epoch-20/out/ckpt");
    assert!(!final_b.exists(), "a PFS phase publishes nothing before its commit");
    read_back(&mut b, 20, "out/ckpt", 3 * MIB, 2, "the writer, before the commit");
    // Job a's next phase (both shared tiers at N/2): node-local.
    assert_eq!(write_file(&mut a, 11, "ckpt", 5 * MIB, 3), Tier::NodeLocal);
    read_back(&mut a, 11, "ckpt", 5 * MIB, 3, "the writer, node-local, before the commit");

    b.commit_epoch(EpochId(20)).unwrap();
    assert!(final_b.is_file(), "the commit published {}", final_b.display());
    assert!(!s.pfs.join("epoch-20/out/.ckpt.spillway-direct").exists(), "no staging file left");
    read_back(&mut s.reader(), 20, "out/ckpt", 3 * MIB, 2, "a fresh client, from the PFS");
    // The epochs view (a read-only FUSE mount in another process) reads it from the PFS, and
    // shows no staging name and no marker.
    let view = EpochsView::mount(&s);
    view.read(20, "out/ckpt", 3 * MIB, 2, "the epochs view, from the PFS");
    assert_eq!(view.list("epoch-20/out").unwrap(), ["ckpt"], "only the published file shows");
    let refused = std::fs::OpenOptions::new().write(true).open(view.path.join("epoch-20/out/ckpt"));
    assert_eq!(refused.unwrap_err().raw_os_error(), Some(libc::EROFS), "the view is read-only");

    // Committed node-local; the burst buffer is busy (a's epoch-10 phase), so it waits.
    a.commit_epoch(EpochId(11)).unwrap();
    assert_eq!(a.node_local_waiting(), vec![EpochId(11)]);
    // Another process of the user asks for it: the scheduler says where it is (EAGAIN), never
    // "no such epoch".
    let mut elsewhere = s.client(Some(TieringOptions {
        strategy: Some(spillway_client::TieringStrategy::HighPriority),
        service: Some(s.service()),
        ..TieringOptions::new("job-reader")
    }));
    wait_until("the node-local epoch's location", || {
        match elsewhere.open_file(EpochId(11), "ckpt") {
            Err(e) if e.errno() == libc::EAGAIN => {
                assert!(e.to_string().contains("node-local storage of host"), "{e}");
                true
            }
            // The server has no such file (yet): the location is on its way to the manager.
            Err(spillway_client::ClientError::NoSuchEpoch { .. })
            | Err(spillway_client::ClientError::NoSuchFile { .. }) => false,
            other => panic!("epoch 11 before its move: {other:?}"),
        }
    });
    read_back(&mut a, 11, "ckpt", 5 * MIB, 3, "the writer, node-local, committed");
    // The view lists it (the scheduler located it) but cannot read it yet: EAGAIN, not ENOENT.
    assert_eq!(view.epochs(), ["epoch-10", "epoch-11", "epoch-20"]);
    let held = view.list("epoch-11");
    assert_eq!(held.err().and_then(|e| e.raw_os_error()), Some(libc::EAGAIN));
    // The mount logs why (its warnings reach its --log file, without escape codes).
    let log = std::fs::read_to_string(s.pfs.parent().unwrap().join("view.log")).unwrap();
    assert!(log.contains("node-local storage of host") && !log.contains('\u{1b}'), "{log:?}");

    // The burst buffer phase ends: the scheduler sees it idle and the mover moves epoch 11.
    a.commit_epoch(EpochId(10)).unwrap();
    wait_until("the node-local epoch to move", || a.node_local_waiting().is_empty());
    assert_eq!(a.epoch_tier(EpochId(11)), Some(Tier::BurstBuffer));
    read_back(&mut a, 11, "ckpt", 5 * MIB, 3, "the writer, after the move");
    let mut reader = s.reader();
    read_back(&mut reader, 11, "ckpt", 5 * MIB, 3, "a fresh client, from the burst buffer");
    read_back(&mut reader, 10, "ckpt", 3 * MIB, 1, "a fresh client, from the burst buffer");
    wait_until("the view to see the moved epoch", || view.list("epoch-11").is_ok());
    view.read(11, "ckpt", 5 * MIB, 3, "the epochs view, after the node-local move");
    view.read(10, "ckpt", 3 * MIB, 1, "the epochs view, from the burst buffer");
    assert_eq!(a.tiering_reports_dropped(), 0);
    assert_eq!(b.tiering_reports_dropped(), 0);
    // `spillway tiers` shows what the scheduler measured.
    let view = tiers_json(&s);
    assert_eq!(view["strategy_default"], "interference-aware");
    assert!(view["snapshot"]["pfs"]["bandwidth_bytes_per_s"].as_u64().unwrap() > 0, "{view}");
    // A dropped client's node-local store is removed once nothing waits in it.
    drop(a);
    let left: Vec<_> =
        std::fs::read_dir(&s.local).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.iter().all(|name| name.to_string_lossy().starts_with("job-b.")), "{left:?}");
}

/// Answers every phase with one tier, and records on which thread each call ran.
struct Recording {
    tier: Tier,
    threads: Mutex<Vec<String>>,
    ends: Mutex<Vec<PhaseEnd>>,
    /// Begin answers take this long (a slow or stuck manager).
    begin_delay: Duration,
}

impl Recording {
    fn new(tier: Tier, begin_delay: Duration) -> Arc<Recording> {
        Arc::new(Recording {
            tier,
            threads: Mutex::new(Vec::new()),
            ends: Mutex::new(Vec::new()),
            begin_delay,
        })
    }

    fn note(&self) {
        let name = std::thread::current().name().unwrap_or("unnamed").to_string();
        self.threads.lock().unwrap().push(name);
    }
}

impl TierService for Recording {
    fn begin_phase(&self, _: &PhaseBegin) -> Result<Tier, String> {
        self.note();
        std::thread::sleep(self.begin_delay);
        Ok(self.tier)
    }
    fn end_phase(&self, end: &PhaseEnd) -> Result<(), String> {
        self.note();
        self.ends.lock().unwrap().push(end.clone());
        Ok(())
    }
    fn snapshot(&self) -> Result<TierSnapshot, String> {
        self.note();
        Ok(TierSnapshot { active_jobs: 1, ..TierSnapshot::default() })
    }
}

/// `spillway tiers --json` against the setup's manager.
fn tiers_json(s: &Setup) -> serde_json::Value {
    let output = std::process::Command::new(BIN)
        .args(["tiers", "--json"])
        .env("SPILLWAY_MANAGER", &s.manager.socket)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The phases the manager holds now, as (job, tier).
fn phases_now(s: &Setup) -> Vec<(String, String)> {
    tiers_json(s)["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["job"].as_str().unwrap().to_string(), p["tier"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn writes_through_the_mount_count_as_the_jobs_phases_on_the_burst_buffer() {
    let s = setup("interference-aware");
    let mounted = s.mount_background("mnt", &["--tiering-job", "mount-job"]);
    let mountpoint = mounted.path.clone();

    // A job writes through the mount, steadily (bounded: at most 60 s of writes).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writing = {
        let (stop, file) = (stop.clone(), mountpoint.join("checkpoint"));
        std::thread::spawn(move || {
            use std::io::Write;
            let mut out = std::fs::File::create(&file).unwrap();
            for _ in 0..600 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                out.write_all(&[7u8; 64 << 10]).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    wait_until("the mount's phase at the manager", || {
        phases_now(&s).contains(&("mount-job".to_string(), "burst-buffer".to_string()))
    });
    // Another job's phase now sees one of two active jobs on the burst buffer (not fewer than
    // N/2): Algorithm 1 sends it to the PFS. Without the mount's report it would be alone.
    let mut b = s.client(Some(s.tiering("job-b", s.service())));
    assert_eq!(write_file(&mut b, 30, "ckpt", MIB, 5), Tier::Pfs);
    b.commit_epoch(EpochId(30)).unwrap();

    // The writes stop: the mount's phase ends after its quiet time, with what it wrote.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writing.join().unwrap();
    wait_until("the mount's phase to end", || {
        !phases_now(&s).iter().any(|(job, _)| job == "mount-job")
    });
    drop(mounted);
}

#[test]
fn a_full_node_local_tier_falls_back_to_the_burst_buffer_without_losing_a_byte() {
    let s = setup("high-priority");
    let service = Recording::new(Tier::NodeLocal, Duration::ZERO);
    let mut tiering = s.tiering("job-full", service.clone());
    tiering.node_local.as_mut().unwrap().capacity_bytes = 8 * MIB;
    let mut client = s.client(Some(tiering));
    // 24 MiB into an 8 MiB node-local tier: the phase starts there, then goes on in the burst
    // buffer with what it had written moved along.
    let tier_at_end = write_file(&mut client, 30, "big", 24 * MIB, 7);
    assert_eq!(tier_at_end, Tier::BurstBuffer);
    assert_eq!(client.epoch_tier(EpochId(30)), Some(Tier::BurstBuffer));
    read_back(&mut client, 30, "big", 24 * MIB, 7, "the writer, after the fallback");
    client.commit_epoch(EpochId(30)).unwrap();
    read_back(&mut s.reader(), 30, "big", 24 * MIB, 7, "a fresh client");
    // The phase's end names the tier it finished on.
    wait_until("the phase's end report", || !service.ends.lock().unwrap().is_empty());
    assert_eq!(service.ends.lock().unwrap()[0].tier, Tier::BurstBuffer);
}

#[test]
fn phase_reports_run_on_the_runtime_thread_and_a_stuck_scheduler_means_the_burst_buffer() {
    let s = setup("high-priority");
    // A scheduler that answers PFS, but only after 3 s: the phase waits 100 ms at most.
    let stuck = Recording::new(Tier::Pfs, Duration::from_secs(3));
    let mut tiering = s.tiering("job-stuck", stuck.clone());
    tiering.begin_wait_max = Duration::from_millis(100);
    let mut client = s.client(Some(tiering));
    assert_eq!(write_file(&mut client, 40, "x", 2 * MIB, 9), Tier::BurstBuffer);
    client.commit_epoch(EpochId(40)).unwrap();
    read_back(&mut s.reader(), 40, "x", 2 * MIB, 9, "a fresh client");

    // A prompt scheduler: every call it sees (begin, end) ran on the runtime thread, never on
    // the thread that writes.
    let prompt = Recording::new(Tier::Pfs, Duration::ZERO);
    let mut client = s.client(Some(s.tiering("job-prompt", prompt.clone())));
    for epoch in 50..53 {
        assert_eq!(write_file(&mut client, epoch, "x", MIB, epoch), Tier::Pfs);
        client.commit_epoch(EpochId(epoch)).unwrap();
    }
    wait_until("three phase ends", || prompt.ends.lock().unwrap().len() == 3);
    let threads = prompt.threads.lock().unwrap().clone();
    assert_eq!(threads.len(), 6, "{threads:?}");
    assert!(threads.iter().all(|t| t == "spillway-tiering"), "{threads:?}");
    let ends = prompt.ends.lock().unwrap().clone();
    assert!(ends.iter().all(|e| e.tier == Tier::Pfs && e.bytes == MIB), "{ends:?}");
    for epoch in 50..53 {
        read_back(&mut s.reader(), epoch, "x", MIB, epoch, "a fresh client, from the PFS");
    }
}

#[test]
fn a_pfs_phase_never_follows_a_link_planted_in_the_pfs_directory() {
    let s = setup("baseline");
    let elsewhere = s._dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, s.pfs.join("epoch-60")).unwrap();
    let service = Recording::new(Tier::Pfs, Duration::ZERO);
    let mut client = s.client(Some(s.tiering("job-link", service)));
    client.begin_epoch(EpochId(60));
    let error = client.create_file(EpochId(60), "x").unwrap_err();
    assert!(error.to_string().starts_with("pfs tier:"), "{error}");
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "nothing written through the link"
    );
    // A PFS directory without the drain's marker (an unmounted PFS's empty mount point) is
    // refused at connect, naming it.
    let unmarked = s._dir.path().join("unmounted");
    std::fs::create_dir_all(&unmarked).unwrap();
    let tiering = TieringOptions {
        pfs_directory: Some(unmarked.clone()),
        ..s.tiering("job-link", Recording::new(Tier::Pfs, Duration::ZERO))
    };
    let options = ClientOptions { tiering: Some(tiering), ..ClientOptions::default() };
    let error =
        Client::connect(s.server.endpoints(), options).err().expect("an unmarked PFS directory");
    assert!(error.to_string().contains(".spillway-pfs"), "{error}");
    assert_eq!(std::fs::read_dir(&unmarked).unwrap().count(), 0);
    // A name that leaves the epoch's directory is refused by name.
    let error = client.create_file(EpochId(61), "../escape").unwrap_err();
    assert!(error.to_string().contains("escape"), "{error}");
}

#[test]
fn a_staging_name_another_user_planted_is_refused_not_written() {
    let s = setup("baseline");
    let epoch_dir = s.pfs.join("epoch-62");
    std::fs::create_dir_all(&epoch_dir).unwrap();
    let planted = epoch_dir.join(".x.spillway-direct");
    std::fs::write(&planted, b"").unwrap();
    std::os::unix::fs::chown(&planted, Some(1001), Some(1001)).unwrap();
    let service = Recording::new(Tier::Pfs, Duration::ZERO);
    let mut client = s.client(Some(s.tiering("job-planted", service)));
    client.begin_epoch(EpochId(62));
    let error = client.create_file(EpochId(62), "x").unwrap_err();
    assert!(error.to_string().contains("belongs to uid 1001"), "{error}");
    assert_eq!(std::fs::metadata(&planted).unwrap().len(), 0, "nothing written into it");
    assert!(!epoch_dir.join("x").exists(), "nothing published");
}

/// A committed node-local store left in `dir/<job>.<id>`, owned by `uid`.
fn orphan_store(dir: &Path, job: &str, id: &str, epoch: u64, seed: u64, uid: u32) {
    let path = dir.join(format!("{job}.{id}"));
    std::fs::create_dir_all(&path).unwrap();
    let knobs = spillway_config::store::StoreKnobs {
        ssd_directory: path.to_string_lossy().into_owned(),
        dram_bytes_max: 16 * MIB,
        ssd_bytes_max: 64 * MIB,
        segment_bytes_max: 4 * MIB,
        record_payload_bytes_max: MIB,
        dram_prefault: false,
        ssd_reserve_bytes: 0,
        ..spillway_config::store::StoreKnobs::default()
    };
    let store = spillway_store::Store::open(&knobs).unwrap();
    let file = spillway_types::FileId(1);
    store.create_file(EpochId(epoch), file, "orphan").unwrap();
    let stream = spillway_types::StreamKey(1);
    store.write(stream, EpochId(epoch), file, 0, &pattern(seed, MIB as usize)).unwrap();
    store.commit(EpochId(epoch), spillway_store::Durability::Ssd).unwrap();
    drop(store);
    let status = std::process::Command::new("chown")
        .args(["-R", &format!("{uid}:{uid}")])
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn only_this_users_orphaned_node_local_stores_are_adopted() {
    let s = setup("high-priority");
    std::fs::create_dir_all(&s.local).unwrap();
    let me = spillway_sys::user::euid();
    orphan_store(&s.local, "job-orphan", "00000000000000aa", 71, 71, me);
    orphan_store(&s.local, "job-orphan", "00000000000000bb", 72, 72, 1001);
    let service = Recording::new(Tier::BurstBuffer, Duration::ZERO);
    let mut client = s.client(Some(s.tiering("job-orphan", service)));
    client.settle_tiers().unwrap();
    drop(client);
    let mut reader = s.reader();
    read_back(&mut reader, 71, "orphan", MIB, 71, "this user's orphan, moved");
    assert!(reader.open_file(EpochId(72), "orphan").is_err(), "another user's store was adopted");
    assert!(s.local.join("job-orphan.00000000000000bb").is_dir(), "left where it was");
}
