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

/// Pool `fast` with the persistent reservations `per-node` (private) and `shared` (striped) of
/// uid OWNER, and a PFS directory of OWNER's holding `input.txt`.
fn start_private(dir: &Path) -> (ManagerProcess, ServerProcess, std::path::PathBuf) {
    let (manager, server) = start(dir);
    let owner = OWNER.to_string();
    for (name, access) in [("per-node", "private"), ("shared", "striped")] {
        let args = [
            "reservation",
            "create",
            "--capacity",
            "8MiB",
            "--persistent",
            name,
            "--access",
            access,
            "--owner",
            &owner,
            "--group",
            &owner,
        ];
        ok(&manager, None, &args);
    }
    let pfs = dir.join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    let input = pfs.join("input.txt");
    std::fs::write(&input, "node one's copy\n").unwrap();
    for path in [&pfs, &input] {
        std::os::unix::fs::chown(path, Some(OWNER), Some(OWNER)).unwrap();
    }
    (manager, server, pfs)
}

/// A private reservation (a namespace per compute node) is staged one node at a time with
/// `--node`; a node's copy stays that node's, and a node whose namespace no mount made is
/// named as such.
#[test]
fn private_reservations_are_staged_by_node() {
    assert_eq!(
        spillway_sys::user::euid(),
        0,
        "rescue_cli must run as root (setpriv to other uids)"
    );
    let dir = tempfile::tempdir().unwrap();
    let (manager, server, pfs) = start_private(dir.path());
    let input = pfs.join("input.txt");
    let input = input.to_str().unwrap();
    let stage_in = ["stage-in", "--reservation", "per-node", input, "in.txt", "--progress", "none"];
    let with_node = |args: &[&str], node: &'static str| {
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.extend(["--node".to_string(), node.to_string()]);
        args
    };
    let run = |uid: Option<u32>, args: &[String]| {
        spillway(&manager, uid, &args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    refused(
        &manager,
        Some(OWNER),
        &stage_in,
        "name the node whose namespace to stage (--node NAME)",
    );
    // The node's namespace exists once the node mounted it (root creates it): root here.
    assert!(run(None, &with_node(&stage_in, "n1")).status.success());
    let n1_copy = pfs.join("n1.txt");
    let out = [
        "stage-out",
        "--reservation",
        "per-node",
        "in.txt",
        n1_copy.to_str().unwrap(),
        "--progress",
        "none",
    ];
    let done = run(Some(OWNER), &with_node(&out, "n1"));
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    assert_eq!(std::fs::read_to_string(&n1_copy).unwrap(), "node one's copy\n");
    // Node n2 never mounted it: its namespace does not exist, and n1's file is not n2's.
    let n2_copy = pfs.join("n2.txt");
    let out = [
        "stage-out",
        "--reservation",
        "per-node",
        "in.txt",
        n2_copy.to_str().unwrap(),
        "--progress",
        "none",
    ];
    let output = run(Some(OWNER), &with_node(&out, "n2"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "stage-out of node n2's namespace, which no mount created");
    assert!(stderr.contains("has no namespace of node n2 yet"), "{stderr}");
    assert!(!n2_copy.exists());
    drop(manager);
    drop(server);
}

/// `--node` where it does not apply, `--drain` of a private reservation and a rescue whose
/// `--node`s do not match its `--from`s are refused, naming the fix.
#[test]
fn node_options_are_refused_where_they_do_not_apply() {
    assert_eq!(
        spillway_sys::user::euid(),
        0,
        "rescue_cli must run as root (setpriv to other uids)"
    );
    let dir = tempfile::tempdir().unwrap();
    let (manager, server, pfs) = start_private(dir.path());
    let input = pfs.join("input.txt");
    let input = input.to_str().unwrap();
    let striped =
        ["stage-in", "--reservation", "shared", input, "x", "--node", "n1", "--progress", "none"];
    refused(&manager, Some(OWNER), &striped, "a stage of it names no node");
    let drained =
        ["stage-out", "--reservation", "per-node", "x", "/tmp/x", "--node", "n1", "--drain"];
    refused(&manager, Some(OWNER), &drained, "a stage-out of it reads one node's namespace");
    let mark = [
        "reservation",
        "mark-rescue",
        "per-node",
        "--error",
        "failed",
        "--from",
        "a",
        "--to",
        "/x/a",
        "--from",
        "b",
        "--to",
        "/x/b",
        "--node",
        "n1",
    ];
    refused(&manager, None, &mark, "give one --node per --from, or none");
    drop(manager);
    drop(server);
}
