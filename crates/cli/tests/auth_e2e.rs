//! End to end: munge authentication with real `spillway serve` processes (`server.auth = munge`)
//! and real `munged` daemons (`spillway_harness::Munged`, each with its own key).
//!
//! A munge server listens on any address without `--insecure-tcp`; TCP clients run as the uid
//! of their credential (root here, and an unprivileged user: this test binary re-executed as
//! `spillway-sec1`, created if absent), Unix-socket clients keep `SO_PEERCRED`; a forged
//! credential is refused and logged; the mount works over it; two munge servers drain to a PFS
//! through their authenticated peer connections. Needs root (it runs a child as another uid).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{pattern, same_bytes, Munged, ServerBuilder, ServerProcess};
use spillway_proto::{AuthMethod, DrainState, Endpoint, ErrorCode};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
/// The unprivileged user the child runs as (`useradd --system` when absent).
const UNPRIVILEGED_USER: &str = "spillway-sec1";
/// Set in the child's environment: the endpoint it connects to.
const CHILD_ENV: &str = "SPILLWAY_AUTH_E2E_CHILD";

/// A server of `dir` that authenticates TCP clients with `munged`.
fn munge_server(dir: &Path, name: &str, munged: &Munged) -> ServerBuilder {
    ServerProcess::builder(BIN, dir, name)
        .env("SPILLWAY_SERVER_AUTH", "munge")
        .env("SPILLWAY_SERVER_MUNGE_SOCKET", munged.socket())
        .rust_log("info")
}

fn options(munge_socket: &Path) -> ClientOptions {
    ClientOptions {
        placement: Placement::striped_default(),
        munge_socket: Some(munge_socket.to_path_buf()),
        ..ClientOptions::default()
    }
}

/// The loopback endpoint of a listener bound to `0.0.0.0:PORT`.
fn loopback(endpoint: &Endpoint) -> Endpoint {
    let Endpoint::Tcp(address) = endpoint else { panic!("expected TCP, got {endpoint}") };
    Endpoint::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], address.port())))
}

/// uid/gid of `spillway-sec1`, created as a system user if absent (the test runs as root).
fn unprivileged_user() -> (u32, u32) {
    let lookup = || {
        let output = Command::new("id").args(["-u", UNPRIVILEGED_USER]).output().unwrap();
        let uid = String::from_utf8_lossy(&output.stdout).trim().parse::<u32>().ok()?;
        Some((uid, spillway_sys::user::primary_gid(uid)?))
    };
    if let Some(ids) = lookup() {
        return ids;
    }
    let status = Command::new("useradd")
        .args(["--system", "--no-create-home", UNPRIVILEGED_USER])
        .status()
        .unwrap();
    assert!(status.success(), "useradd {UNPRIVILEGED_USER} failed ({status})");
    lookup().expect("the user just created")
}

/// The server's log without terminal colour codes.
fn plain_log(server: &ServerProcess) -> String {
    let mut plain = String::new();
    let mut escape = false;
    for c in server.log_text().chars() {
        match (escape, c) {
            (false, '\u{1b}') => escape = true,
            (true, 'm') => escape = false,
            (true, _) => {}
            (false, c) => plain.push(c),
        }
    }
    plain
}

/// The first line of the server's log containing `needle` (waiting up to 10 s for it).
fn wait_for_log(server: &ServerProcess, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = plain_log(server);
        if let Some(line) = log.lines().find(|l| l.contains(needle)) {
            return line.to_string();
        }
        assert!(Instant::now() < deadline, "no {needle:?} in the server log:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_munge_server_serves_tcp_clients_as_their_credentials_uid_on_any_address() {
    assert_eq!(
        spillway_sys::user::euid(),
        0,
        "auth_e2e must run as root (it runs a client as {UNPRIVILEGED_USER}); run `make test` \
         as root, as CI does"
    );
    let dir = tempfile::tempdir().unwrap();
    // The unprivileged child runs in it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let munged = Munged::started();
    // Any address, and no --insecure-tcp: every TCP peer is authenticated.
    let server = munge_server(dir.path(), "s0", &munged)
        .listen("0.0.0.0:0")
        .unix_socket(dir.path().join("s0.sock"))
        .start();
    let tcp = loopback(&server.endpoints()[0]);
    let root_epoch = root_writes_over_tcp(&tcp, munged.socket());
    unix_socket_clients_keep_so_peercred(&server.endpoints()[1]);
    let (uid, _) = unprivileged_user();
    run_unprivileged_child(&tcp, munged.socket(), dir.path(), root_epoch);
    let line = wait_for_log(&server, &format!("uid={uid} "));
    assert!(line.contains("client connected") && line.contains("auth=munge"), "{line}");
    forged_credentials_are_refused_and_logged(&server, &tcp);
    the_manager_heartbeat_authenticates(&tcp, munged.socket());
    the_mount_works_over_munge(&tcp, munged.socket(), dir.path());
}

/// Root writes, commits and reads epoch 1 over TCP; the server reports munge in `Status`.
fn root_writes_over_tcp(tcp: &Endpoint, munge_socket: &Path) -> EpochId {
    let mut client = Client::connect(std::slice::from_ref(tcp), options(munge_socket)).unwrap();
    assert_eq!(client.identity(), (0, 0), "root's credential");
    let epoch = EpochId(1);
    client.begin_epoch(epoch);
    let mut file = client.create_file(epoch, "root.dat").unwrap();
    let data = pattern(1, 1 << 20);
    client.write(&mut file, 0, &data).unwrap();
    client.commit_epoch(epoch).unwrap();
    let mut back = vec![0; data.len()];
    let reopened = client.open_file(epoch, "root.dat").unwrap();
    client.read(&reopened, 0, &mut back).unwrap();
    assert!(same_bytes(&back, &data));
    assert_eq!(client.status().unwrap()[0].auth, AuthMethod::Munge);
    epoch
}

/// A Unix-socket client needs no munged: the kernel vouches for it.
fn unix_socket_clients_keep_so_peercred(unix: &Endpoint) {
    let no_munged = ClientOptions {
        munge_socket: Some(PathBuf::from("/nonexistent/munge.socket")),
        ..ClientOptions::default()
    };
    let mut client = Client::connect(std::slice::from_ref(unix), no_munged).unwrap();
    assert_eq!(client.identity(), (0, 0));
    client.list_epochs().unwrap();
}

/// A client whose munged has another key is refused, and the server logs it with the peer.
fn forged_credentials_are_refused_and_logged(server: &ServerProcess, tcp: &Endpoint) {
    let forger = Munged::started();
    let error = Client::connect(std::slice::from_ref(tcp), options(forger.socket())).err().unwrap();
    assert_eq!(error.code(), Some(ErrorCode::PermissionDenied), "{error}");
    assert!(error.to_string().contains("invalid credential"), "{error}");
    let line = wait_for_log(server, "refusing connection: munge authentication failed");
    assert!(line.contains("WARN") && line.contains("peer=tcp://127.0.0.1:"), "{line}");
    assert!(line.contains("invalid credential"), "{line}");
}

/// The manager's heartbeat (its real prober) authenticates to a munge server with
/// `manager.munge_socket` and records the server's `auth`; with a munged of another key it is
/// refused and the server counts a miss.
fn the_manager_heartbeat_authenticates(tcp: &Endpoint, munge_socket: &Path) {
    use spillway_manager::heartbeat::{ClientProber, Prober};
    let cluster_id = [7; spillway_proto::CLUSTER_ID_BYTES];
    let prober = ClientProber { munge_socket: Some(munge_socket.to_path_buf()), cluster_id };
    let probe = prober.probe(&tcp.to_string()).unwrap();
    assert_eq!(probe.auth, "munge");
    let forger = Munged::started();
    let forged = ClientProber { munge_socket: Some(forger.socket().to_path_buf()), cluster_id };
    let error = forged.probe(&tcp.to_string()).expect_err("a forged heartbeat is refused");
    assert!(error.contains("invalid credential"), "{error}");
}

/// `spillway mount` (its namespace and data clients) against the munge server.
fn the_mount_works_over_munge(tcp: &Endpoint, munge_socket: &Path, dir: &Path) {
    let path = dir.join("mnt");
    std::fs::create_dir(&path).unwrap();
    let log = dir.join("mount.log");
    let output = Command::new(BIN)
        .args(["mount", "--servers", &tcp.to_string(), "--access", "striped", "--background"])
        .arg("--log")
        .arg(&log)
        .arg(&path)
        .env("SPILLWAY_MUNGE_SOCKET", munge_socket)
        .output()
        .unwrap();
    let unmount = Unmount(path.clone());
    assert!(
        output.status.success(),
        "spillway mount failed: {}; log: {}",
        String::from_utf8_lossy(&output.stderr),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let data = pattern(9, 300_000);
    std::fs::write(path.join("through-the-mount"), &data).unwrap();
    assert!(same_bytes(&std::fs::read(path.join("through-the-mount")).unwrap(), &data));
    drop(unmount);
}

/// Unmounts a `spillway mount` when dropped, also after a failed assertion.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let ok = Command::new(BIN).arg("umount").arg(&self.0).status().is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(&self.0).status();
        }
    }
}

/// Runs `child_unprivileged_munge_client` as `spillway-sec1`, with the munged socket in
/// `SPILLWAY_MUNGE_SOCKET` (the client's default).
fn run_unprivileged_child(tcp: &Endpoint, munge_socket: &Path, dir: &Path, root_epoch: EpochId) {
    use std::os::unix::process::CommandExt;
    let (uid, gid) = unprivileged_user();
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_unprivileged_munge_client", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{tcp} {}", root_epoch.0))
        .env("SPILLWAY_MUNGE_SOCKET", munge_socket)
        .current_dir(dir)
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "unprivileged child failed:\n{text}");
    assert!(text.contains("1 passed"), "the child test did not run:\n{text}");
}

/// The unprivileged client (runs only when re-executed by the test above): the server sees its
/// own uid, lets it write its epoch, and refuses it root's.
#[test]
fn child_unprivileged_munge_client() {
    let Ok(what) = std::env::var(CHILD_ENV) else { return };
    let (endpoint, root_epoch) = what.split_once(' ').unwrap();
    let endpoints = [endpoint.parse::<Endpoint>().unwrap()];
    let me = (spillway_sys::user::uid(), spillway_sys::user::gid());
    assert_ne!(me.0, 0);
    let mut client = Client::connect(&endpoints, ClientOptions::default()).unwrap();
    assert_eq!(client.identity(), me, "the server established the credential's uid/gid");
    let epoch = EpochId(2);
    client.begin_epoch(epoch);
    let mut file = client.create_file(epoch, "mine.dat").unwrap();
    let data = pattern(2, 100_000);
    client.write(&mut file, 0, &data).unwrap();
    client.commit_epoch(epoch).unwrap();
    let root_epoch = EpochId(root_epoch.parse().unwrap());
    let refused = client.open_file(root_epoch, "root.dat").expect_err("root's epoch");
    assert_eq!(refused.code(), Some(ErrorCode::PermissionDenied), "{refused}");
}

/// Two munge servers on TCP, each the other's drain peer: a striped N-1 file is drained (the
/// shuffle reads from the peer over an authenticated connection) and lands on the PFS whole.
#[test]
fn two_munge_servers_drain_to_the_pfs_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let munged = Munged::started();
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    let addresses = free_loopback_addresses(2);
    let peers: Vec<Endpoint> = addresses.iter().map(|a| a.parse().unwrap()).collect();
    let _servers: Vec<ServerProcess> = (0..2)
        .map(|i| {
            munge_server(dir.path(), &format!("d{i}"), &munged)
                .listen(&addresses[i])
                .pfs_dir(&pfs)
                .drain_peers(&peers, i)
                .env("SPILLWAY_DRAIN_STRIPE_BYTES", (64 << 10).to_string())
                .start()
        })
        .collect();
    let mut client = Client::connect(&peers, options(munged.socket())).unwrap();
    let epoch = EpochId(5);
    client.begin_epoch(epoch);
    let mut file = client.create_file(epoch, "ckpt/shared.dat").unwrap();
    let data = pattern(5, 3_000_001);
    client.write(&mut file, 0, &data).unwrap();
    client.commit_epoch(epoch).unwrap();
    assert_eq!(client.request_drain(epoch, 1).unwrap(), 2, "queued on both servers");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = client.drain_status().unwrap();
        let drained = status.iter().all(|(_, list)| {
            list.iter().any(|d| d.epoch == epoch && d.state == DrainState::Drained)
        });
        if drained {
            break;
        }
        assert!(Instant::now() < deadline, "not drained: {status:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let copy = std::fs::read(pfs.join("epoch-5/ckpt/shared.dat")).unwrap();
    assert!(same_bytes(&copy, &data), "the drained copy differs");
}

/// `count` loopback addresses with distinct ports free right now (for servers that must know
/// their peers' addresses before they start).
fn free_loopback_addresses(count: usize) -> Vec<String> {
    let listeners: Vec<std::net::TcpListener> =
        (0..count).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|l| l.local_addr().unwrap().to_string()).collect()
}
