//! Mount files of different reservations (epochs) with the same POSIX path, and a namespace id
//! reused by another epoch, drained by real `spillway serve` processes (issue 15):
//!
//! * the later commit (higher epoch) wins a shared path: an older epoch drained after a newer
//!   one is reported superseded (drain status) and never overwrites the newer file; a newer one
//!   drained after an older one replaces it; the existence of a file is never taken as proof
//!   that this epoch published it;
//! * a file under a final name that the drain did not publish (the user's own) is neither
//!   replaced nor taken as done: the drain fails naming it, keeps the data, and publishes once
//!   it is moved aside;
//! * mount data of an epoch whose namespace id now belongs to another epoch is refused: nothing
//!   is published, the epoch is not drained.

use std::path::Path;
use std::time::{Duration, Instant};

use spillway_client::meta::{RemoteNamespace, RemoteOptions};
use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{pattern, same_bytes, ServerProcess};
use spillway_namespace::{data_file_name, Caller, FileKind, Namespace, ROOT_INO};
use spillway_proto::{DrainInfo, DrainState, Endpoint};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

fn server(dir: &Path, pfs: &Path) -> (ServerProcess, Endpoint) {
    let socket = dir.join("s0.sock");
    let endpoint = Endpoint::Unix(socket.clone());
    let server = ServerProcess::builder(BIN, dir, "s0")
        .no_tcp()
        .unix_socket(socket)
        .pfs_dir(pfs)
        .drain_peers(std::slice::from_ref(&endpoint), 0)
        .rust_log("info")
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MIN", "10")
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MAX", "100")
        .start();
    (server, endpoint)
}

fn client(endpoint: &Endpoint) -> Client {
    let options =
        ClientOptions { placement: Placement::Local { rank: 0 }, ..ClientOptions::default() };
    Client::connect(std::slice::from_ref(endpoint), options).unwrap()
}

/// A namespace `id` whose data epoch is `epoch` with the file `name` at its root holding
/// `bytes`, written into `data_epoch` (normally `epoch`) and committed.
fn mount_file(
    endpoint: &Endpoint,
    c: &mut Client,
    id: u64,
    epoch: EpochId,
    data_epoch: EpochId,
    name: &[u8],
    bytes: &[u8],
) {
    let options = RemoteOptions {
        create: true,
        data_epoch: epoch,
        root_mode: 0o755,
        ..RemoteOptions::default()
    };
    let ns = RemoteNamespace::open(endpoint, id, &options).unwrap();
    let root = Caller::root();
    let file = ns.create(&root, ROOT_INO, name, FileKind::Regular, 0o644, 0, 0, true).unwrap();
    c.begin_epoch(data_epoch);
    let mut handle =
        c.create_file(data_epoch, &data_file_name(id, file.ino, file.generation)).unwrap();
    c.write(&mut handle, 0, bytes).unwrap();
    ns.wrote(&root, file.ino, bytes.len() as u64).unwrap();
    c.flush().unwrap();
    ns.sync().unwrap();
    c.commit_epoch(data_epoch).unwrap();
}

fn status(c: &mut Client, epoch: EpochId) -> Option<DrainInfo> {
    c.drain_status().unwrap().into_iter().flat_map(|(_, l)| l).find(|d| d.epoch == epoch)
}

fn wait_for(
    c: &mut Client,
    epoch: EpochId,
    what: &str,
    done: impl Fn(&DrainInfo) -> bool,
) -> DrainInfo {
    let started = Instant::now();
    loop {
        if let Some(info) = status(c, epoch).filter(|i| done(i)) {
            return info;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "epoch {epoch}: {what}: {:?}",
            status(c, epoch)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn drain(c: &mut Client, epoch: EpochId) -> DrainInfo {
    c.request_drain(epoch, 1).unwrap();
    wait_for(c, epoch, "drained", |i| i.state == DrainState::Drained)
}

fn assert_pfs_file(pfs: &Path, name: &str, expected: &[u8]) {
    let got = std::fs::read(pfs.join(name)).unwrap();
    assert!(got.len() == expected.len() && same_bytes(&got, expected), "{name} has other bytes");
}

#[test]
fn the_later_commit_wins_a_shared_path_and_the_older_one_is_reported_superseded() {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    let (_server, endpoint) = server(dir.path(), &pfs);
    let mut c = client(&endpoint);
    // Three reservations' mounts, each with /out.dat.
    let bytes = |epoch: u64| pattern(epoch, 50_000 + epoch as usize);
    for (id, epoch) in [(81, 10), (82, 11), (83, 12)] {
        mount_file(
            &endpoint,
            &mut c,
            id,
            EpochId(epoch),
            EpochId(epoch),
            b"out.dat",
            &bytes(epoch),
        );
    }
    // The newer epoch drains first; the older one finds its file there: superseded, reported,
    // and the newer file is untouched.
    let info = drain(&mut c, EpochId(11));
    assert!(!info.last_error.contains("superseded"), "{}", info.last_error);
    assert_pfs_file(&pfs, "out.dat", &bytes(11));
    let info = drain(&mut c, EpochId(10));
    assert!(
        info.last_error.contains("superseded") && info.last_error.contains("epoch 11"),
        "the older epoch must be reported superseded: {:?}",
        info.last_error
    );
    assert_pfs_file(&pfs, "out.dat", &bytes(11));
    // A later epoch drained after it replaces it; the replaced epoch's status says so.
    drain(&mut c, EpochId(12));
    assert_pfs_file(&pfs, "out.dat", &bytes(12));
    let replaced = status(&mut c, EpochId(11)).unwrap();
    assert!(
        replaced.state == DrainState::Drained
            && replaced.last_error.contains("superseded by epoch 12"),
        "{replaced:?}"
    );
}

#[test]
fn a_user_s_own_file_at_the_final_name_is_kept_and_the_data_waits_for_it_to_move() {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    let (_server, endpoint) = server(dir.path(), &pfs);
    let mut c = client(&endpoint);
    let data = pattern(20, 40_000);
    mount_file(&endpoint, &mut c, 90, EpochId(20), EpochId(20), b"result.dat", &data);
    // The owner (root here) already has a file of its own at that path on the PFS.
    std::fs::write(pfs.join("result.dat"), b"the user's own result").unwrap();
    c.request_drain(EpochId(20), 1).unwrap();
    let info =
        wait_for(&mut c, EpochId(20), "failing on the user's file", |i| i.failed_attempts >= 2);
    assert_ne!(info.state, DrainState::Drained);
    assert!(info.last_error.contains("did not publish"), "{}", info.last_error);
    assert_eq!(std::fs::read(pfs.join("result.dat")).unwrap(), b"the user's own result");
    // Moved aside: the next attempt publishes the drained bytes.
    std::fs::rename(pfs.join("result.dat"), pfs.join("result.dat.mine")).unwrap();
    wait_for(&mut c, EpochId(20), "drained", |i| i.state == DrainState::Drained);
    assert_pfs_file(&pfs, "result.dat", &data);
    assert_eq!(std::fs::read(pfs.join("result.dat.mine")).unwrap(), b"the user's own result");
}

#[test]
fn mount_data_of_a_reused_namespace_id_is_refused_not_drained() {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    let (_server, endpoint) = server(dir.path(), &pfs);
    let mut c = client(&endpoint);
    // Namespace 84 now belongs to epoch 30; epoch 31 holds data named after namespace 84 (an
    // older incarnation of the id, before a manager database reset).
    mount_file(&endpoint, &mut c, 84, EpochId(30), EpochId(31), b"theirs.dat", &pattern(31, 9000));
    c.request_drain(EpochId(31), 1).unwrap();
    let info = wait_for(&mut c, EpochId(31), "refused", |i| i.failed_attempts >= 2);
    assert_ne!(info.state, DrainState::Drained);
    assert!(
        info.last_error.contains("namespace 84") && info.last_error.contains("epoch 30"),
        "{}",
        info.last_error
    );
    assert!(!pfs.join("theirs.dat").exists(), "nothing published under the other namespace's path");
    let epochs = c.list_epochs().unwrap();
    let held = epochs.iter().find(|e| e.epoch == EpochId(31)).unwrap();
    assert_ne!(held.state, spillway_proto::EpochState::Drained, "the data is kept");
}
