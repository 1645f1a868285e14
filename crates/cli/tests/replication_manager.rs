//! Replication in the manager end to end (a real `spillway manager`, three real servers on
//! loopback, the CLI): `server list` shows each server's host as its heartbeat announces it;
//! `reservation create --replicas K` is refused without K known hosts and placed on K hosts with
//! them; a server killed and its SSD directory deleted is declared lost by root (`server lost`;
//! refused for anyone else), shows `LOST`, and its reservations show `degraded` in `reservation
//! show` and `status`, with the server that would replace it; a server down longer than
//! `manager.server_lost_after_s` is declared lost by the manager itself. Re-replication: a
//! replicas=2 reservation over three hosts whose data is on two hosts per piece loses one
//! server (killed, SSD directory deleted, declared lost); the manager copies what it held onto a
//! fourth host's server, puts it at the lost server's index, and every byte is again on two
//! live servers of distinct hosts — for a committed epoch (sealed on the replacement too) and
//! an open one (left open there).
//!
//! Needs root (runs the CLI as another uid with setpriv).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;
use spillway_client::{Client, ClientOptions};
use spillway_harness::{pattern, ManagerProcess, ServerProcess};
use spillway_proto::{Durability, Endpoint, EpochState};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const USER: u32 = 1000;
/// Bound on waiting for the heartbeat to see a change (it runs every 200 ms).
const HEARTBEAT_WAIT: Duration = Duration::from_secs(60);

fn spillway(manager: &ManagerProcess, uid: Option<u32>, args: &[&str]) -> Output {
    manager.cli(Path::new(BIN), uid).args(args).output().unwrap()
}

fn ok(manager: &ManagerProcess, uid: Option<u32>, args: &[&str]) -> String {
    let output = spillway(manager, uid, args);
    assert!(
        output.status.success(),
        "spillway {args:?} as {uid:?}: {}\nmanager log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        manager.log_text()
    );
    String::from_utf8(output.stdout).unwrap()
}

fn json(manager: &ManagerProcess, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let text = ok(manager, None, &all);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {text}"))
}

fn refused(manager: &ManagerProcess, uid: Option<u32>, args: &[&str], needle: &str) {
    let output = spillway(manager, uid, args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "spillway {args:?} as {uid:?} succeeded");
    assert!(stderr.contains(needle), "spillway {args:?}: expected {needle:?} in {stderr:?}");
}

/// Servers named `names`, each on its own failure domain `host-<name>`.
fn start_servers(dir: &Path, names: &[&str]) -> Vec<ServerProcess> {
    names
        .iter()
        .map(|name| {
            ServerProcess::builder(BIN, dir, name)
                .args(["--failure-domain", &format!("host-{name}")])
                .start()
        })
        .collect()
}

/// Pool `p` with the servers, 64 MiB each; returns once the heartbeat taught the manager every
/// server's host.
fn add_servers(manager: &ManagerProcess, addresses: &[String]) {
    ok(manager, None, &["pool", "create", "p", "--granularity", "8MiB"]);
    for address in addresses {
        ok(manager, None, &["server", "add", address, "--pool", "p", "--capacity", "64MiB"]);
    }
    for address in addresses {
        wait_for(manager, address, "known by host", |s| s["failure_domain"].is_string());
    }
}

fn address(server: &ServerProcess) -> String {
    let Endpoint::Tcp(address) = server.endpoint() else { panic!("expected TCP") };
    address.to_string()
}

/// The server entry of `server list --json` at `address`.
fn server_entry(manager: &ManagerProcess, address: &str) -> Value {
    let list = json(manager, &["server", "list"]);
    list.as_array().unwrap().iter().find(|s| s["address"] == address).unwrap().clone()
}

/// Polls `server list` until `done` holds for `address`'s entry, within [`HEARTBEAT_WAIT`].
fn wait_for(manager: &ManagerProcess, address: &str, what: &str, done: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + HEARTBEAT_WAIT;
    loop {
        let entry = server_entry(manager, address);
        if done(&entry) {
            return;
        }
        assert!(Instant::now() < deadline, "{address}: never {what}: {entry}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn lost_servers_degrade_their_reservations() {
    assert_eq!(spillway_sys::user::euid(), 0, "replication_manager must run as root (setpriv)");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap();
    let servers = start_servers(dir.path(), &["a", "b", "c"]);
    let addresses: Vec<String> = servers.iter().map(address).collect();
    let manager = ManagerProcess::start(
        Path::new(BIN),
        &dir.path().join("manager"),
        &[
            ("SPILLWAY_MANAGER_FRAGMENT_BYTES", "8388608"),
            ("SPILLWAY_MANAGER_HEARTBEAT_MS", "200"),
            ("SPILLWAY_MANAGER_HEARTBEAT_MISSES_MAX", "2"),
            ("SPILLWAY_MANAGER_SERVER_LOST_AFTER_S", "2"),
            ("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "none"),
        ],
    );
    add_servers(&manager, &addresses);
    let mut servers: Vec<Option<ServerProcess>> = servers.into_iter().map(Some).collect();

    // One copy over all three servers; then the first server is lost with its SSD.
    let wide =
        json(&manager, &["reservation", "create", "--capacity", "24MiB", "--persistent", "wide"]);
    assert_eq!(wide["replicas"], 1);
    assert_eq!(wide["servers"].as_array().unwrap().len(), 3, "{wide}");
    let victim = wide["servers"][0].as_str().unwrap().to_string();
    let index = addresses.iter().position(|a| *a == victim).unwrap();
    drop(servers[index].take());
    std::fs::remove_dir_all(dir.path().join(format!("{}-ssd", ["a", "b", "c"][index]))).unwrap();
    refused(&manager, Some(USER), &["server", "lost", &victim], "may not declare servers lost");
    refused(&manager, None, &["server", "lost", "127.0.0.1:1"], "no server");
    let lost = json(&manager, &["server", "lost", &victim]);
    assert!(lost["lost_unix_s"].is_u64(), "{lost}");
    assert!(ok(&manager, None, &["server", "list"]).contains("LOST"));
    let shown = json(&manager, &["reservation", "show", "wide"]);
    assert_eq!(shown["degraded"]["lost_servers"][0], victim.as_str(), "{shown}");
    assert_eq!(shown["degraded"]["replicas_left"], 0, "one copy, its server lost: {shown}");
    let text = ok(&manager, None, &["reservation", "show", "wide"]);
    assert!(text.contains("degraded") && text.contains(&victim), "{text}");
    let status = ok(&manager, None, &["status"]);
    assert!(status.contains("degraded wide: lost"), "{status}");
    // The lost server gets nothing new.
    let next =
        json(&manager, &["reservation", "create", "--capacity", "24MiB", "--persistent", "next"]);
    assert!(!next["servers"].as_array().unwrap().iter().any(|s| *s == victim.as_str()), "{next}");

    // A server down longer than server_lost_after_s is declared lost by the manager.
    let other = (index + 1) % 3;
    wait_for(&manager, &addresses[other], "seen", |s| s["last_seen_unix_s"].is_u64());
    drop(servers[other].take());
    wait_for(&manager, &addresses[other], "declared lost", |s| s["lost_unix_s"].is_u64());
    assert!(manager.log_text().contains("declared lost"));
}

/// Bytes of one piece of the test file; each piece is on two servers (ring order).
const PIECE: usize = 1 << 20;
const PIECES: usize = 6;

/// A client of the one server at `address`, as root.
fn client_of(address: &str) -> Client {
    let endpoint: Endpoint = address.parse().unwrap();
    Client::connect(&[endpoint], ClientOptions::default()).unwrap()
}

/// Writes file `ckpt` of the epoch through a replicas=2 client of the reservation's servers
/// (every piece on two servers of distinct hosts) and commits it at `ssd` (`commit`), or only
/// syncs it (the epoch stays open, as while a job runs).
fn write_two_copies(servers: &[String], epoch: EpochId, data: &[u8], commit: bool) {
    let endpoints: Vec<Endpoint> = servers.iter().map(|a| a.parse().unwrap()).collect();
    let options = ClientOptions { replicas: 2, durability: Durability::Ssd, ..Default::default() };
    let mut client = Client::connect(&endpoints, options).unwrap();
    let mut file = client.create_file(epoch, "ckpt").unwrap();
    client.write(&mut file, 0, data).unwrap();
    if commit {
        client.commit_epoch(epoch).unwrap();
    } else {
        client.sync_epoch(epoch).unwrap();
    }
}

/// Per data file of the epoch (the client's `.spillway/` manifests aside), per piece, the
/// servers of `servers` (indexes) that hold all of it.
fn holders(servers: &[String], epoch: EpochId) -> BTreeMap<String, Vec<Vec<usize>>> {
    let endpoints: Vec<Endpoint> = servers.iter().map(|a| a.parse().unwrap()).collect();
    let mut client = Client::connect(&endpoints, ClientOptions::default()).unwrap();
    let mut out = BTreeMap::new();
    for (name, size) in client.list_files(epoch).unwrap() {
        if name.starts_with(".spillway/") {
            continue;
        }
        let file = client.open_file(epoch, &name).unwrap();
        let extents = client.extents(&file).unwrap();
        let pieces = (0..size.div_ceil(PIECE as u64))
            .map(|piece| {
                let start = piece * PIECE as u64;
                let end = (start + PIECE as u64).min(size);
                let mut held: Vec<usize> = extents
                    .iter()
                    .filter(|(_, e)| e.offset <= start && end <= e.offset + e.length)
                    .map(|&(server, _)| server)
                    .collect();
                held.sort_unstable();
                held.dedup();
                held
            })
            .collect();
        out.insert(name, pieces);
    }
    out
}

/// Stages a file into reservation `ckpt` (through the stage's client: replicas=2) and writes
/// one with a replicas=2 client; checks every piece of both is on two servers of two hosts and
/// returns where they are.
fn fill(
    manager: &ManagerProcess,
    dir: &Path,
    created: &Value,
    data: &[u8],
    commit: bool,
) -> BTreeMap<String, Vec<Vec<usize>>> {
    let list = string_list(&created["servers"]);
    let epoch = EpochId(created["epoch"].as_u64().unwrap());
    let pfs = dir.join("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    std::fs::write(pfs.join("input"), pattern(7, 3 * PIECE + 5)).unwrap();
    let source = pfs.to_str().unwrap();
    ok(manager, None, &["stage-in", "--reservation", "ckpt", "--progress", "none", source, "/in"]);
    write_two_copies(&list, epoch, data, commit);
    let before = holders(&list, epoch);
    assert_eq!(before.len(), 2, "ckpt and the staged file's data: {before:?}");
    for (name, pieces) in &before {
        for (piece, held) in pieces.iter().enumerate() {
            let hosts: Vec<&Value> = held.iter().map(|&i| &created["server_domains"][i]).collect();
            assert!(held.len() == 2 && hosts[0] != hosts[1], "{name} piece {piece}: {held:?}");
        }
    }
    before
}

/// Polls `reservation show` until its repair says `restored`, within [`HEARTBEAT_WAIT`].
fn wait_restored(manager: &ManagerProcess, name: &str) -> Value {
    let deadline = Instant::now() + HEARTBEAT_WAIT;
    loop {
        let shown = json(manager, &["reservation", "show", name]);
        if shown["repair"]["state"] == "restored" {
            return shown;
        }
        assert!(Instant::now() < deadline, "never restored: {shown}\n{}", manager.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn string_list(value: &Value) -> Vec<String> {
    value.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
}

#[test]
fn re_replication_restores_two_copies_of_a_committed_epoch() {
    restores_two_copies(true);
}

#[test]
fn re_replication_restores_two_copies_of_an_open_epoch() {
    restores_two_copies(false);
}

/// A replicas=2 reservation on three hosts, a fourth host spare: one server of the list lost
/// with its SSD is replaced, its data copied, the epoch sealed there when it was sealed on the
/// survivors (`commit`), else left open.
fn restores_two_copies(commit: bool) {
    assert_eq!(spillway_sys::user::euid(), 0, "replication_manager must run as root");
    let dir = tempfile::tempdir().unwrap();
    let names = ["a", "b", "c", "d"];
    let mut servers: Vec<Option<ServerProcess>> =
        start_servers(dir.path(), &names).into_iter().map(Some).collect();
    let addresses: Vec<String> = servers.iter().map(|s| address(s.as_ref().unwrap())).collect();
    let manager = ManagerProcess::start(
        Path::new(BIN),
        &dir.path().join("manager"),
        &[
            ("SPILLWAY_MANAGER_FRAGMENT_BYTES", "8388608"),
            ("SPILLWAY_MANAGER_STRIPE_SERVERS_MAX", "3"),
            ("SPILLWAY_MANAGER_HEARTBEAT_MS", "200"),
            ("SPILLWAY_MANAGER_HEARTBEAT_MISSES_MAX", "2"),
            ("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "none"),
        ],
    );
    add_servers(&manager, &addresses);
    let hosts = ok(&manager, None, &["server", "list"]);
    assert!(hosts.contains("HOST") && hosts.contains("host-a"), "{hosts}");

    let create = ["reservation", "create", "--capacity", "16MiB", "--replicas", "2"];
    let created = json(&manager, &[&create[..], &["--persistent", "ckpt"]].concat());
    assert_eq!(created["replicas"], 2);
    let list = string_list(&created["servers"]);
    assert_eq!(list.len(), 3, "{created}");
    let spare = addresses.iter().find(|a| !list.contains(a)).unwrap().clone();
    let epoch = EpochId(created["epoch"].as_u64().unwrap());
    let data = pattern(16, PIECE * PIECES);
    let before = fill(&manager, dir.path(), &created, &data, commit);

    // The second server of the list is lost with its SSD.
    let lost = list[1].clone();
    let index = addresses.iter().position(|a| *a == lost).unwrap();
    drop(servers[index].take());
    std::fs::remove_dir_all(dir.path().join(format!("{}-ssd", names[index]))).unwrap();
    json(&manager, &["server", "lost", &lost]);

    // The manager copies what it held onto the spare and swaps it in at its index.
    let restored = wait_restored(&manager, "ckpt");
    let new_list = string_list(&restored["servers"]);
    assert_eq!(new_list, vec![list[0].clone(), spare.clone(), list[2].clone()], "{restored}");
    assert!(restored["degraded"].is_null(), "{restored}");
    // Exactly the pieces the lost server (index 1) held were copied.
    let staged = before.keys().find(|n| *n != "ckpt").unwrap();
    let staged_held = before[staged].iter().enumerate().filter(|(_, h)| h.contains(&1));
    let staged_bytes: u64 = staged_held.map(|(p, _)| if p == 3 { 5 } else { PIECE as u64 }).sum();
    let lost_pieces: Vec<usize> = (0..PIECES).filter(|&p| before["ckpt"][p].contains(&1)).collect();
    assert!(!lost_pieces.is_empty());
    let held_bytes = (lost_pieces.len() * PIECE) as u64 + staged_bytes;
    assert_eq!(restored["repair"]["total_bytes"], held_bytes, "{restored}");
    assert_eq!(restored["repair"]["copied_bytes"], held_bytes, "{restored}");
    let status = ok(&manager, None, &["status"]);
    assert!(status.contains("replicas restored"), "{status}");

    // Every piece again on two live servers of distinct hosts, at the indexes it was before.
    assert_eq!(holders(&new_list, epoch), before);
    // The replacement holds the very bytes, committed.
    let mut replacement = client_of(&spare);
    let file = replacement.open_file(epoch, "ckpt").unwrap();
    for &piece in &lost_pieces {
        let mut copy = vec![0u8; PIECE];
        replacement.read(&file, (piece * PIECE) as u64, &mut copy).unwrap();
        assert!(copy == data[piece * PIECE..(piece + 1) * PIECE], "piece {piece} differs");
    }
    let epochs = replacement.epochs_on(0).unwrap();
    let state = epochs.iter().find(|e| e.epoch == epoch).unwrap().state;
    let sealed = if commit { EpochState::Committed } else { EpochState::Open };
    assert_eq!(state, sealed);
}
