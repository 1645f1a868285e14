//! The drain against a hostile user on a shared PFS directory (mode 1777, like a center's
//! scratch): a real `spillway serve` draining as root, its data written by `spw-sec-owner` and
//! attacked by `spw-sec-planter` (both created with `spillway_harness::TestUser`; the clients
//! are this test binary re-executed as them).
//!
//! * a symbolic link planted as the epoch's directory, pointing at a root-only directory, makes
//!   the drain fail and retry: nothing is created in the root-only directory; once the link is
//!   gone the drain completes;
//! * a symbolic link planted as a final name in a directory the planter made, pointing at a
//!   root-owned file, is replaced by the owner's file; the root-owned file keeps its bytes;
//! * drained files belong to the epoch's owner with mode 0600 (not root's, not readable by the
//!   planter), and no staging file is left behind.
//!
//! Needs root (CI runs tests as root), `useradd` and `setpriv`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{pattern, same_bytes, ServerProcess, TestUser};
use spillway_proto::{DrainState, Endpoint};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
/// Set in the re-executed child: `write <socket> <epoch>` or `drain <socket> <epoch>`.
const CHILD_ENV: &str = "SPILLWAY_SECURITY_DRAIN_CHILD";
const FILE_BYTES: usize = 300_000;

/// The server, its store and log in `dir`, listening on `socket` only.
fn server(dir: &Path, socket: &Path, pfs: &Path) -> ServerProcess {
    let socket = socket.to_path_buf();
    ServerProcess::builder(BIN, dir, "s0")
        .no_tcp()
        .unix_socket(socket.clone())
        .pfs_dir(pfs)
        .drain_peers(&[Endpoint::Unix(socket)], 0)
        .rust_log("info")
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MIN", "20")
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MAX", "100")
        .env("SPILLWAY_DRAIN_STAGING_KEY_FILE", dir.join("staging.key"))
        .start()
}

fn client(socket: &Path) -> Client {
    let options =
        ClientOptions { placement: Placement::Local { rank: 0 }, ..ClientOptions::default() };
    Client::connect(&[Endpoint::Unix(socket.to_path_buf())], options).unwrap()
}

/// What the child does, as the user it was started as.
fn child_main(request: &str) {
    let words: Vec<&str> = request.split(' ').collect();
    let (socket, epoch) = (Path::new(words[1]), EpochId(words[2].parse().unwrap()));
    let mut c = client(socket);
    match words[0] {
        "write" => {
            c.begin_epoch(epoch);
            for name in ["ckpt/rank0.dat", "ckpt/rank1.dat"] {
                let mut file = c.create_file(epoch, name).unwrap();
                c.write(&mut file, 0, &pattern(epoch.0, FILE_BYTES)).unwrap();
            }
            c.flush().unwrap();
            c.commit_epoch(epoch).unwrap();
        }
        "drain" => {
            c.request_drain(epoch, 1).unwrap();
        }
        other => panic!("unknown child request {other:?}"),
    }
}

/// Runs this test binary as `user` doing `request`; panics with its output if it fails.
fn as_user(user: &TestUser, request: &str) {
    let exe = std::env::current_exe().unwrap();
    let output = user
        .command(exe)
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, request)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{request} as {}: {}\n{}",
        user.name,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The entry point of the re-executed child; does nothing in the parent's run.
#[test]
fn child_entry() {
    if let Ok(request) = std::env::var(CHILD_ENV) {
        child_main(&request);
    }
}

fn drain_state(root: &mut Client, epoch: EpochId) -> Option<(DrainState, String)> {
    let status = root.drain_status().unwrap();
    let info = status.into_iter().flat_map(|(_, list)| list).find(|d| d.epoch == epoch)?;
    Some((info.state, info.last_error))
}

fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A root-only directory and a root-owned file beside the PFS, where the planted links point.
fn root_only_targets(base: &Path) -> (PathBuf, PathBuf) {
    let private = base.join("root-only");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret = base.join("root-file");
    std::fs::write(&secret, b"root's bytes").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    (private, secret)
}

fn plant_symlink(planter: &TestUser, target: &Path, link: &Path) {
    let status = planter.command("ln").arg("-s").arg(target).arg(link).status().unwrap();
    assert!(status.success(), "ln -s {} {} as the planter", target.display(), link.display());
}

fn users() -> (TestUser, TestUser) {
    let create =
        |name| TestUser::create(name).unwrap_or_else(|e| panic!("security_drain needs root: {e}"));
    (create("spw-sec-owner"), create("spw-sec-planter"))
}

#[test]
fn planted_symlinks_on_a_shared_pfs_never_redirect_the_drain() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let (owner, planter) = users();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let pfs = dir.path().join("scratch");
    std::fs::create_dir(&pfs).unwrap();
    std::fs::set_permissions(&pfs, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let (private, secret) = root_only_targets(dir.path());
    let socket = dir.path().join("s0.sock");
    let _server = server(dir.path(), &socket, &pfs);
    let mut root = client(&socket);
    let request = |verb: &str, epoch: u64| format!("{verb} {} {epoch}", socket.display());

    // Epoch 7: the planter puts a link to the root-only directory where its directory goes.
    let epoch = EpochId(7);
    as_user(&owner, &request("write", 7));
    let epoch_dir = pfs.join("epoch-7");
    plant_symlink(&planter, &private, &epoch_dir);
    as_user(&owner, &request("drain", 7));
    wait_for("the drain to fail on the planted directory link", || {
        drain_state(&mut root, epoch).is_some_and(|(state, error)| {
            state == DrainState::Retrying && error.contains("refused")
        })
    });
    assert_eq!(std::fs::read_dir(&private).unwrap().count(), 0, "nothing in the root-only dir");
    // Once the link is gone (root cleans up) the retried drain completes, as the owner.
    std::fs::remove_file(&epoch_dir).unwrap();
    wait_for("epoch 7 to drain", || {
        drain_state(&mut root, epoch).is_some_and(|(state, _)| state == DrainState::Drained)
    });
    assert_owner_s_files(&epoch_dir, &owner, &planter, epoch);

    // Epoch 8: the planter makes the directory, open to all, with a link to a root-owned file
    // at a final name.
    let epoch = EpochId(8);
    let epoch_dir = pfs.join("epoch-8");
    for d in [epoch_dir.clone(), epoch_dir.join("ckpt")] {
        assert!(planter.command("mkdir").arg(&d).status().unwrap().success());
        assert!(planter.command("chmod").arg("0777").arg(&d).status().unwrap().success());
    }
    plant_symlink(&planter, &secret, &epoch_dir.join("ckpt/rank0.dat"));
    as_user(&owner, &request("write", 8));
    as_user(&owner, &request("drain", 8));
    wait_for("epoch 8 to drain", || {
        drain_state(&mut root, epoch).is_some_and(|(state, _)| state == DrainState::Drained)
    });
    assert_eq!(std::fs::read(&secret).unwrap(), b"root's bytes", "root's file untouched");
    assert_owner_s_files(&epoch_dir, &owner, &planter, epoch);
}

/// Both files of `epoch` are the owner's plain files, mode 0600, with the bytes written, which
/// the planter cannot read; no staging file is left.
fn assert_owner_s_files(epoch_dir: &Path, owner: &TestUser, planter: &TestUser, epoch: EpochId) {
    for name in ["rank0.dat", "rank1.dat"] {
        let path = epoch_dir.join("ckpt").join(name);
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_file(), "{name} is the owner's file, not a planted link");
        assert_eq!((meta.uid(), meta.gid()), (owner.uid, owner.gid), "{name}: owner");
        assert_eq!(meta.mode() & 0o777, 0o600, "{name}: mode");
        assert!(same_bytes(&std::fs::read(&path).unwrap(), &pattern(epoch.0, FILE_BYTES)));
        let read = planter.command("cat").arg(&path).output().unwrap();
        assert!(!read.status.success(), "the planter cannot read the owner's {name}");
    }
    let leftovers: Vec<String> = std::fs::read_dir(epoch_dir.join("ckpt"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "staging files left: {leftovers:?}");
}
