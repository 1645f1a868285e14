//! Metadata caching in the FUSE mount, kept consistent by invalidations from the namespace
//! server: real `spillway serve` processes, real FUSE mounts of one namespace.
//!
//! Both mounts cache entries and attributes for an hour, so anything the kernel kept would show
//! for the whole test: what one mount changed shows on the other as soon as the change returned
//! only because the server waited for the other mount to drop it. The control test runs the
//! same steps with invalidations off and sees stale state, which is what the first test would
//! see without them. No test sleeps or times anything.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use spillway_client::meta::{RemoteNamespace, RemoteOptions};
use spillway_client::ServerConnection;
use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{MountGuard, ServerProcess};
use spillway_mount::MountConfig;
use spillway_namespace::{Changes, Namespace};
use spillway_proto::{Endpoint, NamespaceRequest, NamespaceResponse, Request, Response};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const NAMESPACE: u64 = 31;
/// Long enough that nothing cached expires during a test.
const HOUR: Duration = Duration::from_secs(3600);
const UNPRIVILEGED: u32 = 4243;

fn tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn server(dir: &Path) -> ServerProcess {
    ServerProcess::builder(BIN, dir, "s0").dram_bytes("64M").rust_log("info").start()
}

fn namespace(endpoint: &Endpoint) -> Arc<dyn Namespace> {
    let options = RemoteOptions {
        create: true,
        data_epoch: EpochId(1_000 + NAMESPACE),
        root_mode: 0o755,
        ..RemoteOptions::default()
    };
    Arc::new(RemoteNamespace::open(endpoint, NAMESPACE, &options).unwrap())
}

/// A mount of the test namespace at `dir/name`, caching for an hour.
fn mount(dir: &Path, name: &str, endpoint: &Endpoint, watch_changes: bool) -> MountGuard {
    spillway_harness::require_fuse("the mount tests");
    let path = dir.join(name);
    std::fs::create_dir_all(&path).unwrap();
    let config = MountConfig { attr_ttl: HOUR, watch_changes, ..MountConfig::default() };
    let clients = (0..config.threads)
        .map(|_| {
            let options =
                ClientOptions { placement: Placement::striped_default(), ..Default::default() };
            Client::connect(std::slice::from_ref(endpoint), options).unwrap()
        })
        .collect();
    let mount = spillway_mount::mount(namespace(endpoint), clients, &path, config).unwrap();
    MountGuard::new(path, move || mount.unmount().map_err(|e| e.to_string()))
}

/// Collects what a mount shows that differs from what it should.
#[derive(Default)]
struct Findings(Vec<String>);

impl Findings {
    fn check(&mut self, what: &str, ok: bool) {
        if !ok {
            self.0.push(what.to_string());
        }
    }
}

fn size(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

fn mode(path: &Path) -> Option<u32> {
    std::fs::metadata(path).ok().map(|m| m.permissions().mode() & 0o7777)
}

/// Changes on `a`, each looked at through `b` right after it returned (`b` looked first, so
/// its kernel holds the old state).
fn changes_on_a_show_on_b(a: &Path, b: &Path) -> Findings {
    let mut found = Findings::default();
    std::fs::create_dir(a.join("d")).unwrap();
    std::fs::write(a.join("d/f"), b"hello").unwrap();
    found.check("b sees a's new file", size(&b.join("d/f")) == Some(5));
    found.check(
        "b reads a's new file",
        std::fs::read(b.join("d/f")).ok().as_deref() == Some(b"hello"),
    );

    // A write and close: size and bytes (close-to-open).
    std::fs::write(a.join("d/f"), b"hello world").unwrap();
    found.check("b sees the size a's close reported", size(&b.join("d/f")) == Some(11));
    found.check(
        "b reads the bytes a wrote",
        std::fs::read(b.join("d/f")).ok().as_deref() == Some(b"hello world"),
    );

    std::fs::set_permissions(a.join("d/f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    found.check("b sees a's chmod", mode(&b.join("d/f")) == Some(0o600));

    std::fs::OpenOptions::new().write(true).open(a.join("d/f")).unwrap().set_len(3).unwrap();
    found.check("b sees a's truncate", size(&b.join("d/f")) == Some(3));
    found.check(
        "b reads the truncated file",
        std::fs::read(b.join("d/f")).ok().as_deref() == Some(b"hel"),
    );

    std::fs::rename(a.join("d/f"), a.join("d/g")).unwrap();
    found.check("b no longer sees the old name of a's rename", !b.join("d/f").exists());
    found.check("b sees the new name of a's rename", size(&b.join("d/g")) == Some(3));

    std::fs::remove_file(a.join("d/g")).unwrap();
    found.check("b no longer sees what a unlinked", !b.join("d/g").exists());

    // A name b found absent, then created on a.
    found.check("b sees no h yet", !b.join("d/h").exists());
    std::fs::write(a.join("d/h"), b"h").unwrap();
    found.check("b sees the name a created", size(&b.join("d/h")) == Some(1));

    let nlink = |path: &Path| std::fs::metadata(path).ok().map(|m| m.nlink());
    found.check("b sees one link", nlink(&b.join("d/h")) == Some(1));
    std::fs::hard_link(a.join("d/h"), a.join("d/h2")).unwrap();
    found.check("b sees a's hard link counted", nlink(&b.join("d/h")) == Some(2));
    found.check("b sees the link's name", b.join("d/h2").exists());

    let mut listed: Vec<String> = std::fs::read_dir(b.join("d"))
        .map(|dir| dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    listed.sort();
    found.check("ls on b shows a's names", listed == ["h", "h2"]);

    std::fs::create_dir(a.join("e")).unwrap();
    found.check("b sees a's directory", b.join("e").is_dir());
    std::fs::remove_dir(a.join("e")).unwrap();
    found.check("b no longer sees the directory a removed", !b.join("e").exists());

    // Replacing a name b has cached with another inode.
    std::fs::write(a.join("d/r"), b"old").unwrap();
    found.check("b sees r", size(&b.join("d/r")) == Some(3));
    std::fs::write(a.join("d/new"), b"newer").unwrap();
    std::fs::rename(a.join("d/new"), a.join("d/r")).unwrap();
    found.check(
        "b reads the file a renamed over a name b had cached",
        std::fs::read(b.join("d/r")).ok().as_deref() == Some(b"newer"),
    );
    found
}

#[test]
fn a_caching_mount_shows_another_mounts_changes_as_soon_as_they_return() {
    let dir = tempdir();
    let server = server(dir.path());
    let a = mount(dir.path(), "a", server.endpoint(), true);
    let b = mount(dir.path(), "b", server.endpoint(), true);
    let found = changes_on_a_show_on_b(a.path(), b.path());
    assert!(found.0.is_empty(), "stale on the second mount: {:?}", found.0);
    // And the other way round.
    let found = {
        let mut found = Findings::default();
        std::fs::set_permissions(b.path().join("d/h"), std::fs::Permissions::from_mode(0o640))
            .unwrap();
        found.check("a sees b's chmod", mode(&a.path().join("d/h")) == Some(0o640));
        std::fs::remove_file(b.path().join("d/h2")).unwrap();
        found.check("a no longer sees what b unlinked", !a.path().join("d/h2").exists());
        found
    };
    assert!(found.0.is_empty(), "stale on the first mount: {:?}", found.0);
    // A native API user of the namespace (no mount): its changes reach both mounts too.
    let native = namespace(server.endpoint());
    let root = spillway_namespace::Caller::root();
    let d = native.lookup(&root, spillway_namespace::ROOT_INO, b"d").unwrap();
    let h = native.lookup(&root, d.ino, b"h").unwrap();
    let set = spillway_namespace::SetAttr { mode: Some(0o604), ..Default::default() };
    native.setattr(&root, h.ino, &set).unwrap();
    native.unlink(&root, d.ino, b"r").unwrap();
    for mount in [&a, &b] {
        assert_eq!(mode(&mount.path().join("d/h")), Some(0o604), "{}", mount.path().display());
        assert!(!mount.path().join("d/r").exists(), "{}", mount.path().display());
    }
}

/// What the first test would see without invalidations: the same steps with caching on and
/// invalidations off leave the second mount showing stale names and attributes.
#[test]
fn without_invalidations_a_caching_mount_shows_stale_state() {
    let dir = tempdir();
    let server = server(dir.path());
    let a = mount(dir.path(), "a", server.endpoint(), false);
    let b = mount(dir.path(), "b", server.endpoint(), false);
    let found = changes_on_a_show_on_b(a.path(), b.path());
    for stale in [
        "b sees a's truncate",
        "b no longer sees what a unlinked",
        "b no longer sees the directory a removed",
        "b reads the file a renamed over a name b had cached",
    ] {
        assert!(found.0.iter().any(|f| f == stale), "{stale:?} not stale: {:?}", found.0);
    }
}

/// A raw watcher: one `NsWatch` on a connection of its own.
fn poll(connection: &mut ServerConnection, session: u64, since: u64) -> NamespaceResponse {
    let request =
        Request::Namespace(NamespaceRequest::Watch { namespace: NAMESPACE, session, since });
    match connection.call(&request, &[], None) {
        Ok((Response::Namespace(response), ())) => response,
        other => panic!("unexpected reply to NsWatch: {other:?}"),
    }
}

#[test]
fn a_watcher_that_never_acknowledges_is_waited_for_once_then_reset() {
    let dir = tempdir();
    let server = server(dir.path());
    let a = mount(dir.path(), "a", server.endpoint(), true);
    std::fs::write(a.path().join("f"), b"x").unwrap();
    let mut silent = ServerConnection::connect(server.endpoint(), "silent watcher", 1).unwrap();
    let NamespaceResponse::Changes(Changes { version, reset: false, .. }) =
        poll(&mut silent, 99, 0)
    else {
        panic!("a new watcher is registered without a reset");
    };
    // Each change waits for the silent watcher: the first up to the bound (then it is stale),
    // the later ones not at all. All of them return.
    for mode in [0o600, 0o640, 0o644, 0o604] {
        std::fs::set_permissions(a.path().join("f"), std::fs::Permissions::from_mode(mode))
            .unwrap();
    }
    let stale_marks = server.log_text().matches("did not acknowledge a change in time").count();
    assert_eq!(stale_marks, 1, "the silent watcher was waited for once:\n{}", server.log_text());
    match poll(&mut silent, 99, version) {
        NamespaceResponse::Changes(Changes { reset: true, changes, .. }) => {
            assert!(changes.is_empty())
        }
        other => panic!("a stale watcher must be told to reset, got {other:?}"),
    }
}

/// The watch frames over a real server: a change made on another session arrives as its inode
/// and entry, its own changes do not.
#[test]
fn watch_frames_round_trip_through_a_server() {
    let dir = tempdir();
    let server = server(dir.path());
    let ns = namespace(server.endpoint());
    let mut watcher = ServerConnection::connect(server.endpoint(), "watcher", 1).unwrap();
    let NamespaceResponse::Changes(first) = poll(&mut watcher, 5, 0) else { panic!() };
    let root = spillway_namespace::Caller::root();
    let made = std::thread::scope(|scope| {
        let maker = scope.spawn(|| {
            ns.create(&root, 1, b"n", spillway_namespace::FileKind::Regular, 0o644, 0, 0, true)
                .unwrap();
            ns.unlink(&root, 1, b"n").unwrap();
        });
        let mut seen = Vec::new();
        let mut since = first.version;
        // Create: the directory; unlink: the entry, the directory, the file. Each poll
        // acknowledges the batch before (the maker's changes wait for it).
        for _ in 0..32 {
            match poll(&mut watcher, 5, since) {
                NamespaceResponse::Changes(batch) => {
                    assert!(!batch.reset);
                    since = batch.version;
                    seen.extend(batch.changes);
                }
                other => panic!("{other:?}"),
            }
            if seen.len() >= 4 && maker.is_finished() {
                break;
            }
        }
        maker.join().unwrap();
        seen
    });
    use spillway_namespace::Change;
    assert!(made.contains(&Change::Inode(1)), "{made:?}");
    assert!(made.contains(&Change::Entry { parent: 1, name: b"n".to_vec() }), "{made:?}");
}

#[test]
fn a_user_without_access_to_the_namespace_cannot_watch_it() {
    assert_root();
    let dir = tempdir();
    let server = server(dir.path());
    // Root's mount writes a file: the data epoch is root's, the namespace is not the user's.
    let a = mount(dir.path(), "a", server.endpoint(), true);
    std::fs::write(a.path().join("secret-name"), b"x").unwrap();
    run_child_unprivileged("child_watch_refused", "SPILLWAY_CACHE_E2E_CHILD", &server, dir.path());
}

fn assert_root() {
    assert_eq!(
        spillway_sys::user::euid(),
        0,
        "this test re-runs itself as another uid: run as root"
    );
}

/// Runs this binary's test `child` as uid [`UNPRIVILEGED`] in `dir`, with the server's endpoint
/// in the environment variable `variable` (the child test runs only when it is set), and
/// asserts that it ran and passed.
fn run_child_unprivileged(child: &str, variable: &str, server: &ServerProcess, dir: &Path) {
    use std::os::unix::process::CommandExt;
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child, "--nocapture", "--test-threads=1"])
        .env(variable, server.endpoint().to_string())
        .current_dir(dir)
        .uid(UNPRIVILEGED)
        .gid(UNPRIVILEGED)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "unprivileged child {child} failed:\n{text}");
    assert!(text.contains("1 passed"), "the child test {child} did not run:\n{text}");
}

/// In a child test: a connection to the server named by `variable`, as [`UNPRIVILEGED`];
/// `None` (the child test does nothing) when not re-executed by its parent test.
fn child_connection(variable: &str, name: &str) -> Option<ServerConnection> {
    let endpoint: Endpoint = std::env::var(variable).ok()?.parse().unwrap();
    assert_eq!(spillway_sys::user::uid(), UNPRIVILEGED);
    Some(ServerConnection::connect(&endpoint, name, 1).unwrap())
}

/// The unprivileged watcher (runs only when re-executed by the test above).
#[test]
fn child_watch_refused() {
    let Some(mut connection) = child_connection("SPILLWAY_CACHE_E2E_CHILD", "prying watcher")
    else {
        return;
    };
    match poll(&mut connection, 7, 0) {
        NamespaceResponse::Error { errno, message } => {
            assert!(errno == libc::EACCES || errno == libc::EPERM, "{errno}: {message}")
        }
        other => panic!("a user without access subscribed: {other:?}"),
    }
}

/// The bound on a non-root uid's watch sessions in the test below.
const USER_WATCHERS: u64 = 4;

/// A user who may use the namespace opens watch sessions in a loop and never polls them again:
/// refused (EUSERS, naming the uid and the bound) once it holds its bound, while root's mounts
/// keep watching and new root watchers are still admitted.
#[test]
fn a_user_looping_watch_sessions_is_refused_after_its_bound_while_root_mounts_still_watch() {
    assert_root();
    let dir = tempdir();
    let server = ServerProcess::builder(BIN, dir.path(), "s0")
        .dram_bytes("64M")
        .rust_log("info")
        .env("SPILLWAY_SERVER_NAMESPACE_WATCHERS_PER_USER_MAX", USER_WATCHERS.to_string())
        .start();
    // Root's mounts; no file data is written, so the namespace's data epoch holds nothing and
    // the user may use (and watch) the namespace.
    let a = mount(dir.path(), "a", server.endpoint(), true);
    let b = mount(dir.path(), "b", server.endpoint(), true);
    std::fs::create_dir(a.path().join("d")).unwrap();
    assert!(b.path().join("d").is_dir(), "b caches d");
    run_child_unprivileged(
        "child_watch_sessions_looped",
        "SPILLWAY_CACHE_E2E_LOOP",
        &server,
        dir.path(),
    );
    // Root's mounts still see each other's changes (the user's silent sessions cost one wait).
    std::fs::set_permissions(a.path().join("d"), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(mode(&b.path().join("d")), Some(0o700), "b sees a's chmod");
    std::fs::remove_dir(b.path().join("d")).unwrap();
    assert!(!a.path().join("d").exists(), "a no longer sees what b removed");
    // And root opens more sessions than the user's bound.
    let mut root = ServerConnection::connect(server.endpoint(), "root watcher", 1).unwrap();
    for session in 1..=2 * USER_WATCHERS {
        let reply = poll(&mut root, 1_000 + session, 0);
        assert!(matches!(reply, NamespaceResponse::Changes(_)), "root refused: {reply:?}");
    }
}

/// The looping user (runs only when re-executed by the test above).
#[test]
fn child_watch_sessions_looped() {
    let Some(mut connection) = child_connection("SPILLWAY_CACHE_E2E_LOOP", "looping watcher")
    else {
        return;
    };
    for session in 1..=USER_WATCHERS {
        let reply = poll(&mut connection, session, 0);
        assert!(matches!(reply, NamespaceResponse::Changes(_)), "session {session}: {reply:?}");
    }
    for session in USER_WATCHERS + 1..USER_WATCHERS + 100 {
        match poll(&mut connection, session, 0) {
            NamespaceResponse::Error { errno, message } => {
                assert_eq!(errno, libc::EUSERS, "{message}");
                assert!(
                    message.contains(&format!("uid {UNPRIVILEGED}"))
                        && message.contains(&format!("maximum of {USER_WATCHERS}")),
                    "{message}"
                );
            }
            other => panic!("session {session} beyond the bound admitted: {other:?}"),
        }
    }
}

/// Two mounts removing and renaming names in one directory at once: each kernel holds the
/// directory's lock across its own change, which the other mount's change would need its
/// invalidator to take. Without the server's rule against cycles of waits, changes wait out
/// the bound and watchers are marked stale; with it, none is.
#[test]
fn two_mounts_changing_one_directory_at_once_never_stall_each_other() {
    let dir = tempdir();
    let server = server(dir.path());
    let a = mount(dir.path(), "a", server.endpoint(), true);
    let b = mount(dir.path(), "b", server.endpoint(), true);
    std::fs::create_dir(a.path().join("shared")).unwrap();
    for i in 0..200 {
        std::fs::write(a.path().join(format!("shared/f{i}")), b"").unwrap();
    }
    assert_eq!(std::fs::read_dir(b.path().join("shared")).unwrap().count(), 200);
    std::thread::scope(|scope| {
        for (mount, parity) in [(&a, 0), (&b, 1)] {
            scope.spawn(move || {
                for i in (parity..200).step_by(2) {
                    let name = mount.path().join(format!("shared/f{i}"));
                    if i % 4 < 2 {
                        std::fs::remove_file(&name).unwrap();
                    } else {
                        std::fs::rename(&name, mount.path().join(format!("shared/g{i}"))).unwrap();
                    }
                }
            });
        }
    });
    for mount in [&a, &b] {
        let mut names: Vec<String> = std::fs::read_dir(mount.path().join("shared"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 100, "{names:?}");
        assert!(names.iter().all(|n| n.starts_with('g')), "{names:?}");
        assert!(
            !mount.path().join("shared/f0").exists() && !mount.path().join("shared/f2").exists()
        );
    }
    let stale = server.log_text().matches("did not acknowledge a change in time").count();
    assert_eq!(stale, 0, "watchers waited out the bound:\n{}", server.log_text());
}
