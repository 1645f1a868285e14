//! Rescue reservations through the CLI, without Slurm (a real manager and server): marking is
//! root's (the stage-out hook's); `stage-out --retry` is refused for a reservation that is not
//! a rescue, for another user (who does not even see it) and for root (who would write the
//! owner's files as root); teardown's destroy and root's destroy before the expiry are refused;
//! a retry that fails keeps the reservation; the owner's list shows the error. The Slurm path
//! (a real failed stage-out, a successful retry) is in slurm_e2e.rs.
//!
//! Needs root (runs the CLI as other uids with setpriv).

use std::path::Path;
use std::process::Output;

use spillway_harness::{ManagerProcess, ServerProcess};
use spillway_proto::Endpoint;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const OWNER: u32 = 1000;
const OTHER: u32 = 1001;

/// The CLI as root (`None`) or as `uid` through setpriv.
fn spillway(manager: &ManagerProcess, uid: Option<u32>, args: &[&str]) -> Output {
    // The default progress records go under TMPDIR, per uid.
    manager.cli(Path::new(BIN), uid).args(args).env("TMPDIR", "/tmp").output().unwrap()
}

fn ok(manager: &ManagerProcess, uid: Option<u32>, args: &[&str]) -> String {
    let output = spillway(manager, uid, args);
    assert!(
        output.status.success(),
        "spillway {args:?} as {uid:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn refused(manager: &ManagerProcess, uid: Option<u32>, args: &[&str], needle: &str) {
    let output = spillway(manager, uid, args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "spillway {args:?} as {uid:?} succeeded");
    assert!(
        stderr.contains(needle),
        "spillway {args:?} as {uid:?}: expected {needle:?} in {stderr:?}"
    );
}

/// A manager with pool `fast` and one real server, its files in `dir`.
fn start(dir: &Path) -> (ManagerProcess, ServerProcess) {
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let server = ServerProcess::builder(BIN, dir, "a").start();
    let manager = ManagerProcess::start(
        Path::new(BIN),
        dir,
        &[
            ("SPILLWAY_MANAGER_FRAGMENT_BYTES", "8388608"),
            ("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "none"),
        ],
    );
    ok(&manager, None, &["pool", "create", "fast", "--granularity", "1MiB"]);
    let Endpoint::Tcp(address) = server.endpoint() else { panic!("expected TCP") };
    let address = address.to_string();
    ok(&manager, None, &["server", "add", &address, "--pool", "fast", "--capacity", "64MiB"]);
    (manager, server)
}

#[test]
fn rescue_reservations_through_the_cli() {
    assert_eq!(
        spillway_sys::user::euid(),
        0,
        "rescue_cli must run as root (setpriv to other uids)"
    );
    let dir = tempfile::tempdir().unwrap();
    let (manager, server) = start(dir.path());
    let (owner, job) = (OWNER.to_string(), "12");
    ok(
        &manager,
        None,
        &[
            "reservation",
            "create",
            "--capacity",
            "8MiB",
            "--job",
            job,
            "--owner",
            &owner,
            "--group",
            &owner,
        ],
    );
    let retry = ["stage-out", "--retry", "job-12", "--progress", "none"];
    refused(&manager, Some(OWNER), &retry, "is not a rescue reservation");

    // Marking is the hook's (root's) alone, with one --to per --from.
    let mark = [
        "reservation",
        "mark-rescue",
        "job-12",
        "--error",
        "stage-out failed: disk quota exceeded",
        "--from",
        "ckpt",
        "--to",
        "/nonexistent/out",
    ];
    refused(&manager, Some(OWNER), &mark, "may not mark reservations rescue");
    refused(&manager, None, &mark[..7], "give one --to per --from");
    let shown = ok(&manager, None, &mark);
    assert!(shown.contains("stage-out failed: disk quota exceeded"), "{shown}");

    let listed = ok(&manager, Some(OWNER), &["reservation", "list"]);
    assert!(
        listed.contains("rescue job-12: stage-out failed: disk quota exceeded")
            && listed.contains("spillway stage-out --retry job-12"),
        "{listed}"
    );
    assert!(!ok(&manager, Some(OTHER), &["reservation", "list"]).contains("job-12"));

    refused(&manager, Some(OTHER), &retry, "no reservation");
    refused(&manager, None, &retry, "only its owner may retry");
    refused(
        &manager,
        None,
        &["reservation", "destroy", "job-12", "--job", job],
        "rescue reservation",
    );
    refused(
        &manager,
        None,
        &["reservation", "destroy", "job-12", "--force"],
        "only its owner may destroy it before",
    );

    // The owner's retry fails (nothing under ckpt yet): the reservation is kept.
    refused(&manager, Some(OWNER), &retry, "rescue reservation job-12 kept");
    assert!(ok(&manager, Some(OWNER), &["reservation", "show", "job-12"]).contains("rescue"));
    // The owner may give it up.
    ok(&manager, Some(OWNER), &["reservation", "destroy", "job-12"]);
    refused(&manager, Some(OWNER), &["reservation", "show", "job-12"], "no reservation");
    drop(manager);
    drop(server);
}
