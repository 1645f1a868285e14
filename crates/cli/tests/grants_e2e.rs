//! Ownership end to end, tried as hostile local users: real `spillway serve` (and `spillway
//! manager`) processes, and clients run as real uids from the user database (this test binary
//! re-executed as `spw-grants-a`, `spw-grants-b` and `spw-grants-c`, created with
//! `spillway_harness::TestUser`; `spw-grants-c` is a member of the group `spillway-secg`).
//!
//! * a user's epoch survives a server SIGKILL and restart with its owner: another user can
//!   neither list, read, stat, write, commit, sync, delete, drain, grant nor revoke it, and the
//!   owner still can, its bytes unchanged;
//! * `ListEpochs` and `DrainStatus` show another user nothing of it;
//! * a managed server refuses data for an epoch id no reservation has yet (and a user cannot
//!   grant it to itself), and after the manager's grant takes it from the owner alone;
//! * a grant allowing a group lets its members in, nobody else, and holds across a restart
//!   without the manager (it is in the server's SSD log);
//! * the manager's grant reaches a server that was down when the reservation was created (the
//!   heartbeat), with the server's share of the capacity, past which writes fail with EDQUOT;
//! * `df` on a mount of the reservation shows its capacity and usage, and a write past the
//!   capacity fails with EDQUOT;
//! * `reservation modify` grows the server's grant and shares and unshares a persistent
//!   reservation at once; `server remove` waits for the reservation; `pool delete` then works;
//! * a wiped manager database cannot add the server of the cluster it was (which keeps it).
//!
//! Needs root (CI runs tests as root), `useradd`/`groupadd`/`usermod`, `setpriv`, FUSE and `df`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use spillway_client::meta::{RemoteNamespace, RemoteOptions};
use spillway_client::{Client, ClientOptions, ServerConnection};
use spillway_harness::{pattern, ServerProcess, TestUser};

/// A user the tests create and act as.
type User = TestUser;
use spillway_proto::{Durability, Endpoint, EpochGrant, Request, Response};
use spillway_types::{EpochId, FileId};

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const CHILD_ENV: &str = "SPILLWAY_GRANTS_E2E_CHILD";
const MIB: u64 = 1 << 20;
const GROUP: &str = "spillway-secg";

/// The user `name` (created with `useradd` if absent, see `TestUser`); with `group`, also a
/// member of that group (created with `groupadd` if absent).
fn ensure_user(name: &str, group: Option<&str>) -> User {
    let user = TestUser::create(name).unwrap_or_else(|e| {
        panic!(
            "grants_e2e runs clients as users it creates: {e} (run the tests as root, as CI does)"
        )
    });
    if let Some(group) = group {
        if spillway_sys::user::group_id(group).unwrap().is_none() {
            // A parallel test may create it at the same time: the look-up below decides.
            let _ = Command::new("groupadd").args(["--system", group]).output();
        }
        assert!(
            spillway_sys::user::group_id(group).unwrap().is_some(),
            "cannot create group {group} (groupadd)"
        );
        let output = Command::new("usermod").args(["--append", "--groups", group, name]).output();
        let output = output.expect("usermod");
        assert!(output.status.success(), "usermod: {}", String::from_utf8_lossy(&output.stderr));
    }
    user
}

/// The three users: A owns epochs, B attacks them, C is in `spillway-secg`.
fn users() -> (User, User, User) {
    (
        ensure_user("spw-grants-a", None),
        ensure_user("spw-grants-b", None),
        ensure_user("spw-grants-c", Some(GROUP)),
    )
}

/// What one client operation run as a user did: `Ok(output)` or `Err((errno, message))`.
type Outcome = Result<String, (i32, String)>;

/// Runs one client operation (see `child_client`) as `user` against `endpoints`.
fn as_user(user: &User, endpoints: &[Endpoint], op: &[&str]) -> Outcome {
    let mut spec = vec![spillway_harness::endpoint_list(endpoints)];
    spec.extend(op.iter().map(|s| s.to_string()));
    let mut command = user.command(std::env::current_exe().unwrap());
    command
        .args(["--exact", "child_client", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, spec.join("|"))
        .current_dir("/");
    let output = command.output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    let line = text
        .lines()
        .find_map(|l| l.split_once("outcome: ").map(|(_, outcome)| outcome))
        .unwrap_or_else(|| panic!("{op:?} as {}: no outcome:\n{text}", user.name));
    match line.split_once(' ') {
        Some(("ok", rest)) => Ok(rest.to_string()),
        Some(("errno", rest)) => {
            let (errno, message) = rest.split_once(' ').unwrap();
            Err((errno.parse().unwrap(), message.to_string()))
        }
        _ => panic!("{op:?} as {}: bad outcome {line:?}", user.name),
    }
}

/// `as_user`, expecting success.
fn ok(user: &User, endpoints: &[Endpoint], op: &[&str]) -> String {
    as_user(user, endpoints, op)
        .unwrap_or_else(|(errno, m)| panic!("{op:?} as {}: errno {errno}: {m}", user.name))
}

/// `as_user`, expecting `errno` with `needle` in the message.
fn refused(user: &User, endpoints: &[Endpoint], op: &[&str], errno: i32, needle: &str) {
    match as_user(user, endpoints, op) {
        Ok(output) => {
            panic!("{op:?} as {} succeeded ({output}); expected errno {errno}", user.name)
        }
        Err((got, message)) => {
            assert_eq!(got, errno, "{op:?} as {}: {message}", user.name);
            assert!(
                message.contains(needle),
                "{op:?} as {}: {needle:?} not in {message}",
                user.name
            );
        }
    }
}

/// The child: one client operation against the servers in `SPILLWAY_GRANTS_E2E_CHILD`
/// (`endpoints|op|args…`), its outcome printed as `outcome: ok …` or `outcome: errno N …`.
#[test]
fn child_client() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let fields: Vec<&str> = spec.split('|').collect();
    let endpoints: Vec<Endpoint> = fields[0].split(',').map(|e| e.parse().unwrap()).collect();
    let outcome = if fields[1] == "ns-readdir" {
        Ok(String::new()) // below: a namespace client, not a data client
    } else if ["commit", "stat", "extents", "sync", "zeros", "zeros-huge"].contains(&fields[1]) {
        // Straight to the server: `Client::commit_epoch` commits only where it wrote, and an
        // attacker asks for file ids it never opened.
        raw_on(&endpoints[0], fields[1], EpochId(fields[2].parse().unwrap()))
    } else {
        Client::connect(&endpoints, ClientOptions::default())
            .and_then(|mut client| run_op(&mut client, &fields[1..]))
    };
    let outcome = if fields[1] == "ns-readdir" {
        ns_readdir(&endpoints[0], fields[2].parse().unwrap())
    } else {
        outcome.map_err(|error| (error.errno(), error.to_string()))
    };
    match outcome {
        Ok(output) => println!("outcome: ok {output}"),
        Err((errno, message)) => println!("outcome: errno {errno} {message}"),
    }
}

/// The names in the root directory of namespace `id` (opened as the caller, never created).
fn ns_readdir(endpoint: &Endpoint, id: u64) -> Result<String, (i32, String)> {
    use spillway_namespace::{Caller, Namespace, ROOT_INO};
    let options = RemoteOptions { create: false, ..RemoteOptions::default() };
    let listed = RemoteNamespace::open(endpoint, id, &options).and_then(|ns| {
        let caller = Caller { uid: 0, gid: 0, groups: Vec::new(), pid: 0 };
        ns.readdir(&caller, ROOT_INO, 0, 64)
    });
    match listed {
        Ok(entries) => {
            let names: Vec<String> =
                entries.iter().map(|e| String::from_utf8_lossy(&e.name).into_owned()).collect();
            Ok(names.join(","))
        }
        Err(error) => Err((error.errno, error.message)),
    }
}

fn run_op(client: &mut Client, op: &[&str]) -> Result<String, spillway_client::ClientError> {
    let epoch = || EpochId(op[1].parse().unwrap());
    let number = |i: usize| -> u64 { op[i].parse().unwrap() };
    Ok(match op[0] {
        "write" => {
            let mut file = client.create_file(epoch(), op[2])?;
            client.write(&mut file, number(3), &pattern(number(4), number(5) as usize))?;
            client.flush()?;
            String::new()
        }
        "read" => {
            let file = client.open_file(epoch(), op[2])?;
            let mut back = vec![0u8; number(4) as usize];
            client.read(&file, 0, &mut back)?;
            (back == pattern(number(3), back.len())).to_string()
        }
        "delete" => client.delete_epoch(epoch()).map(|()| String::new())?,
        "grant-self" => {
            // The caller grants the epoch to itself, as only the manager may.
            let (uid, gid) = client.identity();
            let grant = EpochGrant { owner_uid: uid, owner_gid: gid, ..EpochGrant::default() };
            client.grant_epoch(epoch(), &grant).map(|()| String::new())?
        }
        "revoke" => client.revoke_epoch(epoch()).map(|_| String::new())?,
        "drain" => client.request_drain(epoch(), 1).map(|n| n.to_string())?,
        "files" => format!("{:?}", client.list_files(epoch())?),
        "list" => {
            let epochs = client.list_epochs()?;
            let listed: Vec<String> =
                epochs.iter().map(|e| format!("{}:{}", e.epoch, e.bytes)).collect();
            listed.join(",")
        }
        "drains" => {
            let drains = client.drain_status()?;
            let listed: Vec<String> = drains
                .iter()
                .flat_map(|(_, list)| list.iter())
                .map(|d| format!("{}:{}", d.epoch, d.state))
                .collect();
            listed.join(",")
        }
        other => panic!("unknown op {other}"),
    })
}

/// One request about `epoch` sent to one server: `commit`, or `stat`/`extents` of file id 1
/// (the epoch's first file) or `sync`, or a run of zeros over file id 1: `zeros` over its first
/// 300 000 bytes, `zeros-huge` of 2^62 bytes.
fn raw_on(
    endpoint: &Endpoint,
    op: &str,
    epoch: EpochId,
) -> Result<String, spillway_client::ClientError> {
    let mut connection = ServerConnection::connect(endpoint, "grants_e2e raw", 1)?;
    let file = FileId(1);
    let request = match op {
        "commit" => {
            Request::Commit { epoch, durability: Durability::Ssd, participants: Vec::new() }
        }
        "stat" => Request::Stat { epoch, file },
        "extents" => Request::Extents { epoch, file, from_offset: 0 },
        "sync" => Request::Sync { epoch, participants: Vec::new() },
        "zeros" => Request::WriteZeros { epoch, file, offset: 0, length: 300_000 },
        "zeros-huge" => Request::WriteZeros { epoch, file, offset: 0, length: 1 << 62 },
        other => panic!("unknown raw op {other}"),
    };
    match connection.call(&request, &[], None)? {
        (Response::FileStat(info), ()) => Ok(format!("{}:{}", info.name, info.size_bytes)),
        (Response::Extents(extents), ()) => Ok(format!("{} extents", extents.len())),
        (Response::Committed { .. } | Response::Synced { .. } | Response::Written { .. }, ()) => {
            Ok(String::new())
        }
        (other, ()) => panic!("{op} answered {other:?}"),
    }
}

/// Epoch ids in a `list` output (`epoch:bytes,…`).
fn listed_epochs(output: &str) -> Vec<u64> {
    output
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.split(':').next().unwrap().parse().unwrap())
        .collect()
}

fn wait_for(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `<dir>/pfs`, a scratch directory like a center's (mode 1777): the drain creates each epoch's
/// directory there as the epoch's owner.
fn scratch(dir: &Path) -> PathBuf {
    let pfs = dir.join("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    std::fs::set_permissions(&pfs, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    pfs
}

fn tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap();
    dir
}

/// A root client of `endpoints`.
fn root_client(endpoints: &[Endpoint]) -> Client {
    Client::connect(endpoints, ClientOptions::default()).unwrap()
}

// ---- restart, then steal -------------------------------------------------------------------

/// User A writes and commits epoch 1 on an unmanaged server (the first uid claims it), the
/// server is SIGKILLed and restarted; user B can do nothing with the epoch, A still can.
#[test]
fn a_claimed_epoch_survives_a_server_kill_and_cannot_be_stolen() {
    let (a, b, _) = users();
    let dir = tempdir();
    let pfs = scratch(dir.path());
    let mut server = ServerProcess::builder(BIN, dir.path(), "s").pfs_dir(&pfs).start();
    let endpoints = server.endpoints().to_vec();
    ok(&a, &endpoints, &["write", "1", "ckpt", "0", "11", "300000"]);
    ok(&a, &endpoints, &["commit", "1"]);
    refused(
        &b,
        &endpoints,
        &["write", "1", "mine", "0", "12", "100"],
        libc::EACCES,
        "another user",
    );
    // A run of zeros over A's file, by file id (never opened by B): refused like a write.
    refused(&b, &endpoints, &["zeros", "1"], libc::EACCES, "another user");

    server.sigkill().unwrap();
    server.restart().unwrap();
    let endpoints = server.endpoints().to_vec();
    assert!(!listed_epochs(&ok(&b, &endpoints, &["list"])).contains(&1), "B lists A's epoch");
    let denied = "granted to another user";
    refused(&b, &endpoints, &["files", "1"], libc::EACCES, denied);
    refused(&b, &endpoints, &["read", "1", "ckpt", "11", "300000"], libc::EACCES, denied);
    refused(&b, &endpoints, &["write", "1", "ckpt", "0", "12", "100"], libc::EACCES, denied);
    refused(&b, &endpoints, &["commit", "1"], libc::EACCES, denied);
    refused(&b, &endpoints, &["delete", "1"], libc::EACCES, denied);
    refused(&b, &endpoints, &["drain", "1"], libc::EACCES, denied);
    refused(&b, &endpoints, &["grant-self", "1"], libc::EACCES, "only root");
    refused(&b, &endpoints, &["revoke", "1"], libc::EACCES, "only root");
    refused(&b, &endpoints, &["stat", "1"], libc::EACCES, denied);
    refused(&b, &endpoints, &["extents", "1"], libc::EACCES, denied);
    refused(&b, &endpoints, &["sync", "1"], libc::EACCES, denied);
    refused(&b, &endpoints, &["zeros", "1"], libc::EACCES, denied);
    // An absurd run is refused by size, before anything is stored.
    refused(&a, &endpoints, &["zeros-huge", "1"], libc::EFBIG, "file_bytes_max");
    assert_eq!(ok(&a, &endpoints, &["stat", "1"]), "ckpt:300000", "A stats its file");

    assert_eq!(listed_epochs(&ok(&a, &endpoints, &["list"])), vec![1]);
    assert_eq!(ok(&a, &endpoints, &["read", "1", "ckpt", "11", "300000"]), "true");
    assert!(ok(&a, &endpoints, &["files", "1"]).contains("ckpt"));
    // B's own epoch is B's, and B claims no more than that.
    ok(&b, &endpoints, &["write", "2", "mine", "0", "12", "100"]);
    assert_eq!(listed_epochs(&ok(&b, &endpoints, &["list"])), vec![2]);
    assert_eq!(listed_epochs(&ok(&a, &endpoints, &["list"])), vec![1]);
    ok(&a, &endpoints, &["delete", "1"]);
}

/// `ListEpochs` and `DrainStatus` as another user show nothing of A's drained epoch; A and root
/// see it.
#[test]
fn listings_and_drain_status_show_another_user_nothing() {
    let (a, b, _) = users();
    let dir = tempdir();
    let pfs = scratch(dir.path());
    let server = ServerProcess::builder(BIN, dir.path(), "s").pfs_dir(&pfs).start();
    let endpoints = server.endpoints().to_vec();
    ok(&a, &endpoints, &["write", "3", "ckpt", "0", "13", "200000"]);
    ok(&a, &endpoints, &["commit", "3"]);
    ok(&a, &endpoints, &["drain", "3"]);
    wait_for("A's epoch to drain", Duration::from_secs(60), || {
        ok(&a, &endpoints, &["drains"]).contains("3:drained")
    });
    assert_eq!(ok(&b, &endpoints, &["list"]), "", "B sees no epoch");
    assert_eq!(ok(&b, &endpoints, &["drains"]), "", "B sees no drain");
    assert_eq!(listed_epochs(&ok(&a, &endpoints, &["list"])), vec![3]);
    let mut root = root_client(&endpoints);
    assert!(root.list_epochs().unwrap().iter().any(|e| e.epoch == EpochId(3)));
    let drains = root.drain_status().unwrap();
    assert!(drains.iter().flat_map(|(_, l)| l.iter()).any(|d| d.epoch == EpochId(3)));
}

/// An epoch the store holds without a grant (root's data: here its grant was revoked and the
/// epoch not deleted) is root's on an unmanaged server too: B's write does not claim it, B reads
/// nothing of it, and root's bytes stay.
#[test]
fn held_data_without_a_grant_is_not_claimed_by_a_write() {
    let (_, b, _) = users();
    let dir = tempdir();
    let server = ServerProcess::builder(BIN, dir.path(), "s").start();
    let endpoints = server.endpoints().to_vec();
    let mut root = root_client(&endpoints);
    let epoch = EpochId(6);
    root.begin_epoch(epoch);
    let mut file = root.create_file(epoch, "roots").unwrap();
    root.write(&mut file, 0, &pattern(31, 50_000)).unwrap();
    root.flush().unwrap();
    root.commit_epoch(epoch).unwrap();
    root.revoke_epoch(epoch).unwrap();
    let held = "holds data and no grant";
    refused(&b, &endpoints, &["write", "6", "mine", "0", "1", "100"], libc::EACCES, held);
    refused(&b, &endpoints, &["read", "6", "roots", "31", "50000"], libc::EACCES, "only root");
    refused(&b, &endpoints, &["files", "6"], libc::EACCES, "only root");
    let files = root.list_files(epoch).unwrap();
    assert_eq!(files, vec![("roots".to_string(), 50_000)], "root's epoch as it was");
}

/// A grant allowing a group: its member C writes and reads, B (not a member) is refused; on a
/// managed server nobody but root writes an epoch without a grant. The grant is in the server's
/// SSD log: after a SIGKILL and restart (no manager to grant again) it holds just the same.
#[test]
fn a_group_grant_admits_its_members_only_and_survives_a_restart() {
    let (a, b, c) = users();
    let dir = tempdir();
    let mut server = ServerProcess::builder(BIN, dir.path(), "s").arg("--managed").start();
    let endpoints = server.endpoints().to_vec();
    let group = spillway_sys::user::group_id(GROUP).unwrap().unwrap();
    let grant = EpochGrant {
        owner_uid: a.uid,
        owner_gid: a.gid,
        allowed_gids: vec![group],
        ..EpochGrant::default()
    };
    root_client(&endpoints).grant_epoch(EpochId(4), &grant).unwrap();
    ok(&c, &endpoints, &["write", "4", "shared", "0", "14", "5000"]);
    assert_eq!(ok(&a, &endpoints, &["read", "4", "shared", "14", "5000"]), "true");
    refused(&b, &endpoints, &["read", "4", "shared", "14", "5000"], libc::EACCES, "another user");
    assert_eq!(listed_epochs(&ok(&c, &endpoints, &["list"])), vec![4]);
    refused(&c, &endpoints, &["write", "5", "x", "0", "1", "10"], libc::EACCES, "not granted");
    ok(&a, &endpoints, &["commit", "4"]);

    server.sigkill().unwrap();
    server.restart().unwrap();
    let endpoints = server.endpoints().to_vec();
    let denied = "granted to another user";
    assert_eq!(ok(&b, &endpoints, &["list"]), "", "B lists nothing after the restart");
    refused(&b, &endpoints, &["files", "4"], libc::EACCES, denied);
    refused(&b, &endpoints, &["read", "4", "shared", "14", "5000"], libc::EACCES, denied);
    refused(&b, &endpoints, &["write", "4", "shared", "0", "15", "5000"], libc::EACCES, denied);
    refused(&b, &endpoints, &["delete", "4"], libc::EACCES, denied);
    refused(&b, &endpoints, &["write", "6", "x", "0", "1", "10"], libc::EACCES, "not granted");
    // The victim's bytes are unchanged, and its owner and group still use them.
    assert_eq!(ok(&a, &endpoints, &["read", "4", "shared", "14", "5000"]), "true");
    assert_eq!(ok(&c, &endpoints, &["read", "4", "shared", "14", "5000"]), "true");
    assert_eq!(listed_epochs(&ok(&a, &endpoints, &["list"])), vec![4]);
}

// ---- with the manager ------------------------------------------------------------------------

/// The manager process (killed on drop) and what the tests do with it.
struct ManagerProcess(spillway_harness::ManagerProcess);

impl ManagerProcess {
    /// A manager with 8 MiB fragments that never marks a server down (a test stops servers on
    /// purpose and wants reservations placed on them anyway).
    fn start(dir: &Path) -> ManagerProcess {
        let fragment_bytes = (8 * MIB).to_string();
        ManagerProcess(spillway_harness::ManagerProcess::start(
            Path::new(BIN),
            &dir.join("manager"),
            &[
                ("SPILLWAY_MANAGER_FRAGMENT_BYTES", &fragment_bytes),
                ("SPILLWAY_MANAGER_STRIPE_SERVERS_MAX", "2"),
                ("SPILLWAY_MANAGER_HEARTBEAT_MS", "200"),
                ("SPILLWAY_MANAGER_HEARTBEAT_MISSES_MAX", "100000"),
            ],
        ))
    }

    /// Runs the CLI against this manager as root or as `user` (setpriv), expecting JSON.
    fn json(&self, user: Option<&User>, args: &[&str]) -> Value {
        let mut command = match user {
            None => Command::new(BIN),
            Some(user) => user.command(BIN),
        };
        let output = command
            .args(args)
            .arg("--json")
            .env("SPILLWAY_MANAGER", &self.0.socket)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "spillway {args:?}: {}\nmanager log:\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.0.log_text()
        );
        serde_json::from_slice(&output.stdout).unwrap()
    }

    /// Runs the CLI as root or `user`, expecting it to fail with `needle` in its error.
    fn fails(&self, user: Option<&User>, args: &[&str], needle: &str) {
        let mut command = match user {
            None => Command::new(BIN),
            Some(user) => user.command(BIN),
        };
        let output = command.args(args).env("SPILLWAY_MANAGER", &self.0.socket).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "spillway {args:?} succeeded");
        assert!(stderr.contains(needle), "spillway {args:?}: {needle:?} not in {stderr}");
    }

    /// A pool of these servers, `capacity` each.
    fn add_pool(&self, servers: &[&ServerProcess], capacity: &str) {
        self.json(None, &["pool", "create", "p", "--granularity", "8MiB"]);
        for server in servers {
            let address = server.endpoint().to_string();
            self.json(None, &["server", "add", &address, "--pool", "p", "--capacity", capacity]);
        }
    }
}

/// The reservation's servers (stripe order) and epoch.
fn placement(reservation: &Value) -> (Vec<Endpoint>, EpochId) {
    let servers = reservation["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().parse().unwrap())
        .collect();
    (servers, EpochId(reservation["epoch"].as_u64().unwrap()))
}

/// B tries the epoch ids the next reservations will get on a managed server: refused. After A's
/// reservation is granted, A writes its epoch, B still cannot.
#[test]
fn a_managed_server_refuses_a_claim_before_the_grant() {
    let (a, b, _) = users();
    let dir = tempdir();
    let server = ServerProcess::builder(BIN, dir.path(), "s").arg("--managed").start();
    let endpoints = server.endpoints().to_vec();
    let manager = ManagerProcess::start(dir.path());
    manager.add_pool(&[&server], "64MiB");
    for epoch in ["1", "2", "3"] {
        refused(
            &b,
            &endpoints,
            &["write", epoch, "squat", "0", "1", "100"],
            libc::EACCES,
            "not granted to any reservation",
        );
    }
    // Nor can B grant itself the next epoch id, as the manager would.
    refused(&b, &endpoints, &["grant-self", "1"], libc::EACCES, "only root");
    assert_eq!(ok(&b, &endpoints, &["list"]), "");
    let reservation = manager.json(Some(&a), &["reservation", "create", "--capacity", "16MiB"]);
    let (_, epoch) = placement(&reservation);
    assert!((1..=3).contains(&epoch.0), "the epoch B tried: {epoch}");
    let e = epoch.0.to_string();
    ok(&a, &endpoints, &["write", &e, "ckpt", "0", "21", "100000"]);
    refused(&b, &endpoints, &["write", &e, "squat", "0", "1", "100"], libc::EACCES, "another user");
    refused(&b, &endpoints, &["read", &e, "ckpt", "21", "100000"], libc::EACCES, "another user");
    refused(&b, &endpoints, &["delete", &e], libc::EACCES, "another user");
    assert_eq!(ok(&b, &endpoints, &["list"]), "");
    assert_eq!(listed_epochs(&ok(&a, &endpoints, &["list"])), vec![epoch.0]);
    assert_eq!(ok(&a, &endpoints, &["read", &e, "ckpt", "21", "100000"]), "true", "A's bytes");
    assert!(!ok(&a, &endpoints, &["files", &e]).contains("squat"), "no squatter's file");
    // Destroying the reservation revokes the grant and deletes the epoch.
    manager.json(Some(&a), &["reservation", "destroy", reservation["name"].as_str().unwrap()]);
    refused(&a, &endpoints, &["write", &e, "again", "0", "1", "100"], libc::EACCES, "not granted");
}

/// A reservation over two servers, one of them down at creation: the heartbeat's grant reaches
/// it once it is back, with its share of the capacity (one 8 MiB fragment), past which a write
/// fails with EDQUOT and stores nothing.
#[test]
fn the_heartbeat_grants_a_server_that_was_down() {
    let (a, _, _) = users();
    let dir = tempdir();
    let up = ServerProcess::builder(BIN, dir.path(), "up").arg("--managed").start();
    let mut down = ServerProcess::builder(BIN, dir.path(), "down").arg("--managed").start();
    let manager = ManagerProcess::start(dir.path());
    manager.add_pool(&[&up, &down], "64MiB");
    down.sigkill().unwrap();
    let reservation = manager.json(Some(&a), &["reservation", "create", "--capacity", "16MiB"]);
    let (servers, epoch) = placement(&reservation);
    assert_eq!(servers.len(), 2, "{reservation}");
    assert_eq!(reservation["server_fragments"], serde_json::json!([1, 1]));
    down.restart().unwrap();
    let down_endpoints = down.endpoints().to_vec();
    let e = epoch.0.to_string();
    wait_for("the heartbeat to grant the restarted server", Duration::from_secs(30), || {
        as_user(&a, &down_endpoints, &["write", &e, "probe", "0", "31", "4096"]).is_ok()
    });
    // The server's share is one fragment: 8 MiB of payload (the probe's 4 KiB included).
    let rest = (8 * MIB - 4096).to_string();
    ok(&a, &down_endpoints, &["write", &e, "ckpt", "0", "32", &rest]);
    let end = rest.clone();
    let past = ["write", &e, "ckpt", &end, "33", "1"];
    refused(&a, &down_endpoints, &past, libc::EDQUOT, "granted capacity");
    let bytes = format!("{epoch}:{}", 8 * MIB);
    assert_eq!(ok(&a, &down_endpoints, &["list"]), bytes, "the refused write stored nothing");
    let ckpt = ok(&a, &down_endpoints, &["read", &e, "ckpt", "32", &rest]);
    assert_eq!(ckpt, "true", "the bytes before the refused write are unchanged");
}

/// `reservation modify` reaches the server at once: a grown reservation takes writes that hit
/// EDQUOT before, a shared one lets the other user in (and unsharing shuts them out again).
/// Then `server remove` retires the server until the reservation is gone, and `pool delete`
/// takes the empty pool.
#[test]
fn modify_grows_and_shares_on_the_server_and_remove_waits_for_the_reservation() {
    let (a, b, _) = users();
    let dir = tempdir();
    let server = ServerProcess::builder(BIN, dir.path(), "s").arg("--managed").start();
    let endpoints = server.endpoints().to_vec();
    let address = server.endpoint().to_string();
    let manager = ManagerProcess::start(dir.path());
    manager.add_pool(&[&server], "64MiB");
    let create = ["reservation", "create", "--capacity", "8MiB", "--persistent", "modset"];
    let reservation = manager.json(Some(&a), &create);
    let e = placement(&reservation).1 .0.to_string();
    let full = (8 * MIB).to_string();
    ok(&a, &endpoints, &["write", &e, "ckpt", "0", "41", &full]);
    let past = ["write", &e, "ckpt", &full, "42", "4096"];
    refused(&a, &endpoints, &past, libc::EDQUOT, "granted capacity");

    let grown = manager.json(Some(&a), &["reservation", "modify", "modset", "--capacity", "16MiB"]);
    assert_eq!(grown["capacity_bytes"], 16 * MIB, "{grown}");
    ok(&a, &endpoints, &past);
    assert_eq!(ok(&a, &endpoints, &["read", &e, "ckpt", "41", &full]), "true", "old bytes kept");

    let b_write = ["write", &e, "visitor", "0", "43", "100"];
    refused(&b, &endpoints, &b_write, libc::EACCES, "another user");
    manager.fails(
        Some(&b),
        &["reservation", "modify", "modset", "--capacity", "24MiB"],
        "no active reservation",
    );
    let b_uid = b.uid.to_string();
    manager.json(Some(&a), &["reservation", "modify", "modset", "--share-uid", &b_uid]);
    ok(&b, &endpoints, &b_write);
    manager.fails(
        Some(&b),
        &["reservation", "modify", "modset", "--capacity", "24MiB"],
        "may use but not change",
    );
    manager.json(Some(&a), &["reservation", "modify", "modset", "--unshare-uid", &b_uid]);
    refused(
        &b,
        &endpoints,
        &["write", &e, "visitor2", "0", "44", "100"],
        libc::EACCES,
        "another user",
    );

    manager.fails(Some(&a), &["server", "remove", &address], "root or the admin group");
    let removal = manager.json(None, &["server", "remove", &address]);
    assert_eq!(removal["removed"], false, "{removal}");
    assert_eq!(
        removal["waiting_for"],
        serde_json::json!([format!("reservation modset (uid {})", a.uid)])
    );
    manager.fails(None, &["pool", "delete", "p"], "still has servers");
    // A retiring server takes no new reservation (it is the pool's only one).
    manager.fails(Some(&a), &["reservation", "create", "--capacity", "8MiB"], "no capacity");
    // `--wait` returns once the reservation is gone (destroyed while it waits).
    let wait = Command::new(BIN)
        .args(["server", "remove", &address, "--wait", "--timeout-s", "60"])
        .env("SPILLWAY_MANAGER", &manager.0.socket)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    manager.json(Some(&a), &["reservation", "destroy", "modset"]);
    let waited = wait.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&waited.stdout);
    assert!(waited.status.success(), "{printed}{}", String::from_utf8_lossy(&waited.stderr));
    assert!(printed.contains("waits for: reservation modset"), "{printed}");
    assert!(printed.trim_end().ends_with("removed"), "{printed}");
    assert_eq!(manager.json(None, &["server", "list"]), serde_json::json!([]));
    manager.json(None, &["pool", "delete", "p"]);
    assert_eq!(manager.json(None, &["pool", "list"]), serde_json::json!([]));
}

/// A wiped manager database is a new cluster: the server the old one added, and which holds
/// its reservation's epoch under its owner, is refused by name, so the new database never hands
/// that epoch id to another user. The server keeps serving the old cluster across a restart.
#[test]
fn a_wiped_manager_database_does_not_take_over_the_old_clusters_server() {
    let (a, b, _) = users();
    let dir = tempdir();
    let mut server = ServerProcess::builder(BIN, dir.path(), "s").arg("--managed").start();
    let endpoints = server.endpoints().to_vec();
    let address = server.endpoint().to_string();
    let mut manager = ManagerProcess::start(dir.path());
    manager.add_pool(&[&server], "64MiB");
    let reservation = manager.json(Some(&a), &["reservation", "create", "--capacity", "8MiB"]);
    let e = placement(&reservation).1 .0.to_string();
    ok(&a, &endpoints, &["write", &e, "ckpt", "0", "51", "4096"]);
    ok(&a, &endpoints, &["commit", &e]);
    manager.0.stop();
    std::fs::remove_dir_all(dir.path().join("manager")).unwrap();
    server.sigkill().unwrap();
    server.restart().unwrap();
    let wiped = ManagerProcess::start(dir.path());
    wiped.json(None, &["pool", "create", "p", "--granularity", "8MiB"]);
    wiped.fails(None, &["server", "add", &address, "--pool", "p"], "serves another cluster");
    assert_eq!(wiped.json(None, &["server", "list"]), serde_json::json!([]));
    // Nothing was granted over A's epoch: B cannot reach it, A still reads its bytes.
    refused(&b, &endpoints, &["read", &e, "ckpt", "51", "4096"], libc::EACCES, "another user");
    assert_eq!(ok(&a, &endpoints, &["read", &e, "ckpt", "51", "4096"]), "true");
}

// ---- df on a mount ---------------------------------------------------------------------------

/// The reservation's namespace mounted by `spillway mount --background`; unmounted on drop.
fn mount_reservation(
    servers: &[Endpoint],
    reservation: &Value,
    path: &Path,
) -> spillway_harness::MountGuard {
    let namespace = reservation["namespace_id"].as_u64().unwrap().to_string();
    let epoch = reservation["epoch"].as_u64().unwrap().to_string();
    let extra = ["--namespace-id", namespace.as_str(), "--epoch", epoch.as_str()];
    spillway_harness::MountGuard::spillway(BIN, servers, path, &extra)
}

/// `df -B1` of `path`: (size, used, available) in bytes.
fn df(path: &Path) -> (u64, u64, u64) {
    let output =
        Command::new("df").args(["-B1", "--output=size,used,avail"]).arg(path).output().unwrap();
    assert!(output.status.success(), "df: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    let numbers: Vec<u64> =
        text.lines().nth(1).unwrap().split_whitespace().map(|n| n.parse().unwrap()).collect();
    (numbers[0], numbers[1], numbers[2])
}

/// `df` on a mount of a 24 MiB reservation shows 24 MiB and the files' bytes as used; a write
/// past the reservation fails with EDQUOT.
#[test]
fn df_on_a_mount_shows_the_reservation_capacity_and_usage() {
    assert!(Path::new("/dev/fuse").exists(), "grants_e2e needs /dev/fuse (the fuse module)");
    let (a, _, _) = users();
    let dir = tempdir();
    let server = ServerProcess::builder(BIN, dir.path(), "s").arg("--managed").start();
    let manager = ManagerProcess::start(dir.path());
    manager.add_pool(&[&server], "64MiB");
    let reservation = manager.json(Some(&a), &["reservation", "create", "--capacity", "20MiB"]);
    assert_eq!(reservation["capacity_bytes"], 24 * MIB);
    let (servers, _) = placement(&reservation);
    let mountpoint = dir.path().join("mnt");
    let mount = mount_reservation(&servers, &reservation, &mountpoint);
    assert_eq!(df(&mountpoint), (24 * MIB, 0, 24 * MIB), "an empty reservation");
    std::fs::write(mountpoint.join("five"), pattern(41, 5 * MIB as usize)).unwrap();
    std::fs::write(mountpoint.join("one"), pattern(42, MIB as usize)).unwrap();
    assert_eq!(df(&mountpoint), (24 * MIB, 6 * MIB, 18 * MIB), "two files");
    // The reservation's namespace is as private as its data: B cannot list it, A can.
    let (_, b, _) = users();
    let namespace = reservation["namespace_id"].as_u64().unwrap().to_string();
    let denied = "granted to another user";
    refused(&b, &servers, &["ns-readdir", &namespace], libc::EACCES, denied);
    assert_eq!(ok(&a, &servers, &["ns-readdir", &namespace]), ".,..,five,one");
    let dd = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=30", "conv=fsync"])
        .arg(format!("of={}", mountpoint.join("big").display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&dd.stderr);
    assert!(!dd.status.success(), "30 MiB more fit in a 24 MiB reservation: {stderr}");
    assert!(stderr.contains("Disk quota exceeded"), "{stderr}");
    // The files written before are unchanged.
    assert!(std::fs::read(mountpoint.join("five")).unwrap() == pattern(41, 5 * MIB as usize));
    assert!(std::fs::read(mountpoint.join("one")).unwrap() == pattern(42, MIB as usize));
    drop(mount);
}
