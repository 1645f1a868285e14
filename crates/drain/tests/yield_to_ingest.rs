//! The drainer yields to ingest (issue 4, "Interference"): while clients write to its server, it
//! pauses after each PFS write (bandwidth capped at `ingest_bandwidth_share`) and says so; when
//! ingest is idle it never pauses.
//!
//! In process: a real store, server (Unix socket) and drainer. No assertion depends on timing:
//! the "active" window is set far longer than the test, the ingest that must count happens
//! (and is acknowledged) before the drain is requested, and the idle drain runs before any
//! write the drainer could see. The rate limiter's arithmetic is unit-tested in `drainer.rs`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_client::{Client, ClientOptions, Placement};
use spillway_config::{ServerKnobs, StoreKnobs};
use spillway_drain::{DrainMode, Drainer, DrainerOptions, PosixPfs};
use spillway_proto::{DrainState, Durability, Endpoint};
use spillway_server::{Server, ServerOptions, StoreBackend};
use spillway_types::EpochId;

fn client(endpoint: &Endpoint) -> Client {
    let options = ClientOptions {
        placement: Placement::Local { rank: 0 },
        durability: Durability::Ssd,
        ..ClientOptions::default()
    };
    Client::connect(std::slice::from_ref(endpoint), options).unwrap()
}

/// Writes `bytes` of file "ckpt.dat" in epoch `epoch`; commits if asked.
fn write_epoch(c: &mut Client, epoch: EpochId, bytes: usize, commit: bool) {
    c.begin_epoch(epoch);
    let mut file = c.create_file(epoch, "ckpt.dat").unwrap();
    let block = vec![epoch.0 as u8; 64 * 1024];
    let mut offset = 0;
    while offset < bytes {
        c.write(&mut file, offset as u64, &block).unwrap();
        offset += block.len();
    }
    c.flush().unwrap();
    if commit {
        c.commit_epoch(epoch).unwrap();
    }
}

fn wait_drained(drainer: &Drainer, epoch: EpochId) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = drainer.status();
        let info = status.iter().find(|d| d.epoch == epoch);
        if info.is_some_and(|d| d.state == DrainState::Drained) {
            return;
        }
        assert!(Instant::now() < deadline, "epoch {epoch} not drained: {status:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The store of the test's server: 64 MiB of DRAM, 1 GiB of SSD in `ssd`.
fn open_backend(ssd: &Path) -> Arc<StoreBackend> {
    let store_knobs = StoreKnobs {
        ssd_directory: ssd.display().to_string(),
        dram_bytes_max: 64 << 20,
        ssd_bytes_max: 1 << 30,
        ..StoreKnobs::default()
    };
    Arc::new(StoreBackend::new(spillway_store::Store::open(&store_knobs).unwrap()))
}

/// Drainer options for the one server at `endpoint`: 16 PFS writes per 2 MiB checkpoint.
fn drainer_options(endpoint: &Endpoint) -> DrainerOptions {
    DrainerOptions {
        peers: vec![endpoint.clone()],
        self_index: 0,
        stripe_bytes: 64 << 10,
        write_bytes_max: 128 << 10, // 16 PFS writes per checkpoint
        default_mode: DrainMode::Shuffled,
        drain_after_commit: false,
        ingest_bandwidth_share: 0.5,
        // Longer than the test: once clients have written, ingest stays "active".
        ingest_idle_after: Duration::from_secs(3600),
        retry_backoff_min: Duration::from_millis(20),
        retry_backoff_max: Duration::from_millis(200),
        queued_epochs_max: 4,
        quarantine_after_failures: 0,
        server_name: "s0".into(),
        staging_key: spillway_drain::StagingKey::random(),
        munge_socket: None,
    }
}

/// Both drained copies (epochs 1 and 2) are complete in `pfs`.
fn assert_copies_complete(pfs: &Path) {
    for epoch in [1u64, 2] {
        let copy = std::fs::read(pfs.join(format!("epoch-{epoch}/ckpt.dat"))).unwrap();
        assert_eq!(copy.len(), 2 << 20);
        assert!(copy.iter().all(|&b| b == epoch as u8), "epoch {epoch}: PFS copy differs");
    }
}

#[test]
fn drain_yields_while_clients_write_and_runs_unthrottled_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");
    let pfs = dir.path().join("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    spillway_drain::pfs::mark_pfs(&pfs).unwrap();
    let backend = open_backend(&ssd);
    let endpoint = Endpoint::Unix(dir.path().join("s0.sock"));
    let server_knobs = ServerKnobs { server_name: "s0".into(), ..ServerKnobs::default() };
    let server = Server::bind(
        ServerOptions::from_knobs(&server_knobs),
        backend.clone(),
        std::slice::from_ref(&endpoint),
        false,
    )
    .unwrap();
    let probe = server.ingest_probe();
    let shutdown = server.shutdown_handle();
    let serving = std::thread::spawn(move || server.run().unwrap());

    // Two committed checkpoints of 2 MiB, written before the drainer starts watching.
    let mut app = client(&endpoint);
    write_epoch(&mut app, EpochId(1), 2 << 20, true);
    write_epoch(&mut app, EpochId(2), 2 << 20, true);

    let drainer = Drainer::start(
        drainer_options(&endpoint),
        backend.clone(),
        Arc::new(PosixPfs::new(&pfs)),
        &ssd,
        Some(probe.clone()),
    )
    .unwrap();

    // Idle: nobody writes; the drain never yields.
    let before = probe.bytes_written();
    drainer.request(EpochId(1), DrainMode::Shuffled).unwrap();
    wait_drained(&drainer, EpochId(1));
    assert_eq!(probe.bytes_written(), before, "nothing may write during the idle drain");
    let (writes, paused) = drainer.yielded_to_ingest(EpochId(1)).unwrap();
    assert_eq!(
        (writes, paused),
        (0, Duration::ZERO),
        "an idle-ingest drain must run at full speed"
    );

    // Active: the application writes the next checkpoint (acknowledged) before the drain starts.
    write_epoch(&mut app, EpochId(3), 1 << 20, false);
    assert!(probe.bytes_written() > before);
    drainer.request(EpochId(2), DrainMode::Shuffled).unwrap();
    wait_drained(&drainer, EpochId(2));
    let (writes, paused) = drainer.yielded_to_ingest(EpochId(2)).unwrap();
    assert_eq!(writes, 16, "every PFS write of the drain saw active ingest and yielded");
    assert!(paused > Duration::ZERO, "yielding means pausing");

    // Both copies are complete.
    assert_copies_complete(&pfs);
    drainer.stop();
    drop(app);
    shutdown.shutdown();
    serving.join().unwrap();
}
