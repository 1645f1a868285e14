//! The manager attacked by a hostile local user, end to end: a real `spillway manager` and a real
//! `spillway serve`, the CLI run as two unprivileged accounts created for the test
//! (`spillway_harness::TestUser`: a victim and an attacker), each step asserting the refusal,
//! its message, and that the victim's reservations are unchanged.
//!
//! - the manager's files: the database (and its `-wal`/`-shm`) 0600 although the manager runs
//!   with umask 0, the socket 0666 (anyone connects; identity comes from `SO_PEERCRED`);
//! - reads are authorized: `status` and `reservation list/show` show the attacker none of the
//!   victim's reservations, except a persistent one that allows the attacker;
//! - a persistent reservation that a job uses is not destroyed, by its owner or by root, unless
//!   root forces; neither the owner nor the attacker can force, nor register jobs;
//! - stage-in and stage-out reach only the caller's own reservations and read and write the PFS
//!   as the caller;
//! - 70 slow connections of the attacker (one byte every 2 s of a request that never ends) do
//!   not keep `spillway status` from working, for the victim at once and for the attacker once
//!   the request deadline cut the slow ones off; every slow connection reads an HTTP reply (503
//!   or 408), none is reset;
//! - with `manager.job_owner_check = "slurm"` and no Slurm answering, a user cannot reserve for
//!   any job (fail closed, the knob named). Squatting with a real Slurm is in slurm_e2e.rs.
//!
//! Needs root (it creates users and runs the CLI as them) and /usr/bin/python3 (the slow client); it
//! fails, never skips, without them.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use spillway_harness::{ManagerProcess, ServerProcess, TestUser};
use spillway_proto::Endpoint;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const MIB: u64 = 1 << 20;
/// The whole-request deadline of the manager under test (knob `manager.request_timeout_ms`).
const REQUEST_TIMEOUT_MS: u64 = 4_000;
/// The interpreter of the slow client.
const PYTHON: &str = "/usr/bin/python3";

/// A manager in `dir` with `env` knobs on top of the test's (8 MiB fragments, the request
/// deadline), started with umask 0 so the modes of its files are the ones it sets itself.
fn start_manager(dir: &Path, env: &[(&str, &str)]) -> ManagerProcess {
    let fragment_bytes = (8 * MIB).to_string();
    let request_timeout_ms = REQUEST_TIMEOUT_MS.to_string();
    let mut all = vec![
        ("SPILLWAY_MANAGER_FRAGMENT_BYTES", fragment_bytes.as_str()),
        ("SPILLWAY_MANAGER_REQUEST_TIMEOUT_MS", request_timeout_ms.as_str()),
    ];
    all.extend_from_slice(env);
    ManagerProcess::start(Path::new(BIN), dir, &all)
}

/// Who runs a CLI command.
#[derive(Clone, Copy)]
enum As<'a> {
    Root,
    User(&'a TestUser),
}

impl As<'_> {
    fn name(&self) -> &str {
        match self {
            As::Root => "root",
            As::User(user) => &user.name,
        }
    }
}

fn spillway(manager: &ManagerProcess, who: As<'_>, args: &[&str]) -> Output {
    let mut command = match who {
        As::Root => Command::new(BIN),
        As::User(user) => user.command(BIN),
    };
    command.args(args).env("SPILLWAY_MANAGER", &manager.socket).env("RUST_LOG", "warn");
    command.stdin(Stdio::null()).output().unwrap()
}

/// Runs the CLI with `--json`, expects success, parses the output.
fn json(manager: &ManagerProcess, who: As<'_>, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let output = spillway(manager, who, &all);
    assert!(
        output.status.success(),
        "spillway {args:?} as {} failed: {}\nmanager log:\n{}",
        who.name(),
        String::from_utf8_lossy(&output.stderr),
        manager.log_text()
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!("spillway {args:?}: not JSON ({e}): {}", String::from_utf8_lossy(&output.stdout))
    })
}

/// Runs the CLI, expects exit code 1 and one stderr line containing `needle`.
fn refused(manager: &ManagerProcess, who: As<'_>, args: &[&str], needle: &str) {
    let output = spillway(manager, who, args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "spillway {args:?} as {}: {stderr}", who.name());
    assert!(
        stderr.contains(needle),
        "spillway {args:?} as {}: expected {needle:?} in {stderr:?}",
        who.name()
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line naming the problem: {stderr:?}");
}

/// The names of the reservations in a JSON list (or a status's `reservations`), sorted.
fn names(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn a_hostile_user_cannot_squat_read_destroy_or_lock_out() {
    assert_eq!(
        spillway_sys::user::euid(),
        0,
        "manager_security must run as root (it creates users and runs the CLI as them); \
         run `make test` as root, as CI does"
    );
    let victim = TestUser::create("spw-sec-victim").unwrap();
    let attacker = TestUser::create("spw-sec-attacker").unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = ServerProcess::builder(BIN, dir.path(), "a").start();
    let address = match server.endpoint() {
        Endpoint::Tcp(address) => address.to_string(),
        other => panic!("expected a TCP endpoint, got {other}"),
    };
    let manager =
        start_manager(&dir.path().join("m"), &[("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "none")]);
    json(&manager, As::Root, &["pool", "create", "fast", "--granularity", "8MiB"]);
    json(
        &manager,
        As::Root,
        &["server", "add", &address, "--pool", "fast", "--capacity", "256MiB"],
    );

    database_private_socket_open(&manager);
    let victims = victim_reservations(&manager, &victim, &attacker);
    reads_show_only_what_the_caller_may_see(&manager, &victim, &attacker);
    stage_only_into_and_out_of_one_s_own(&manager, dir.path(), &victim, &attacker);
    persistent_reservation_in_use_not_destroyed(&manager, &victim, &attacker);
    slow_connections_do_not_lock_out_status(&manager, &victim, &attacker);
    // The victim's reservations are as they were (the persistent one forced away by root).
    let after = json(&manager, As::User(&victim), &["reservation", "list"]);
    assert_eq!(names(&after), vec!["job-101".to_string()], "{after}");
    assert_eq!(after[0]["id"], victims["id"], "{after}");
    drop(manager);

    job_owner_check_fails_closed_without_slurm(dir.path(), &attacker);
}

/// The database, its `-wal` and `-shm` are 0600 and their directory 0700, though the manager
/// runs with umask 0; the socket is 0666.
fn database_private_socket_open(manager: &ManagerProcess) {
    for suffix in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{}{suffix}", manager.db.display()));
        assert_eq!(mode(&file), 0o600, "{} must be private to the manager", file.display());
    }
    assert_eq!(mode(manager.db.parent().unwrap()), 0o700, "the database directory");
    assert_eq!(mode(&manager.socket), 0o666, "the socket: anyone connects, SO_PEERCRED says who");
}

/// The victim's job reservation `job-101`, a persistent `vdata` only it may use and a persistent
/// `vshared` that allows the attacker; the attacker's own `job-202`. Returns `job-101`.
fn victim_reservations(manager: &ManagerProcess, victim: &TestUser, attacker: &TestUser) -> Value {
    let mine = json(
        manager,
        As::User(victim),
        &["reservation", "create", "--capacity", "8MiB", "--job", "101"],
    );
    assert_eq!(mine["owner"], victim.uid);
    json(
        manager,
        As::User(victim),
        &["reservation", "create", "--capacity", "8MiB", "--persistent", "vdata"],
    );
    let attacker_uid = attacker.uid.to_string();
    json(
        manager,
        As::User(victim),
        &[
            "reservation",
            "create",
            "--capacity",
            "8MiB",
            "--persistent",
            "vshared",
            "--allow-uid",
            &attacker_uid,
        ],
    );
    json(
        manager,
        As::User(attacker),
        &["reservation", "create", "--capacity", "8MiB", "--job", "202"],
    );
    // Taking the victim's job's name, or acting as the victim, is refused.
    refused(
        manager,
        As::User(attacker),
        &["reservation", "create", "--capacity", "8MiB", "--job", "101"],
        "a reservation named \"job-101\" already exists",
    );
    let victim_uid = victim.uid.to_string();
    let victim_gid = victim.gid.to_string();
    refused(
        manager,
        As::User(attacker),
        &[
            "reservation",
            "create",
            "--capacity",
            "8MiB",
            "--job",
            "303",
            "--owner",
            &victim_uid,
            "--group",
            &victim_gid,
        ],
        &format!("may not create reservations for uid {}", victim.uid),
    );
    mine
}

/// Stage-in and stage-out: the victim stages a file into `job-101` and back out; the attacker
/// can neither stage into nor out of it, nor stage a root-only PFS file into its own reservation
/// (the copy runs as the user); the victim's staged file still reads back unchanged.
fn stage_only_into_and_out_of_one_s_own(
    manager: &ManagerProcess,
    dir: &Path,
    victim: &TestUser,
    attacker: &TestUser,
) {
    let pfs = dir.join("stage-pfs");
    std::fs::create_dir(&pfs).unwrap();
    std::fs::set_permissions(&pfs, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let input = pfs.join("victim-input.dat");
    let bytes = spillway_harness::pattern(101, 200_000);
    std::fs::write(&input, &bytes).unwrap();
    std::os::unix::fs::chown(&input, Some(victim.uid), Some(victim.gid)).unwrap();
    std::fs::set_permissions(&input, std::fs::Permissions::from_mode(0o600)).unwrap();
    let input_text = input.display().to_string();
    let stage = |who, verb: &str, src: &str, dst: &str, reservation: &str| {
        spillway(
            manager,
            who,
            &[verb, "--reservation", reservation, "--progress", "none", src, dst],
        )
    };
    let staged = stage(As::User(victim), "stage-in", &input_text, "/in/data.dat", "job-101");
    assert!(staged.status.success(), "{}", String::from_utf8_lossy(&staged.stderr));

    // Into or out of the victim's reservation: the manager does not even name it.
    let stolen = pfs.join("stolen.dat").display().to_string();
    for (verb, src, dst) in
        [("stage-in", input_text.as_str(), "/x.dat"), ("stage-out", "/in/data.dat", &stolen)]
    {
        let output = stage(As::User(attacker), verb, src, dst, "job-101");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{verb} into the victim's reservation: {stderr}");
        assert!(stderr.contains("no reservation \"job-101\" visible"), "{verb}: {stderr}");
    }
    assert!(!pfs.join("stolen.dat").exists(), "nothing staged out for the attacker");
    // The victim's file on the PFS into the attacker's own reservation: read as the attacker.
    let output = stage(As::User(attacker), "stage-in", &input_text, "/copy.dat", "job-202");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "staging a file the attacker cannot read: {stderr}");
    assert!(stderr.to_lowercase().contains("permission denied"), "{stderr}");

    let back = pfs.join("victim-back.dat").display().to_string();
    let output = stage(As::User(victim), "stage-out", "/in/data.dat", &back, "job-101");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(std::fs::read(&back).unwrap(), bytes, "the victim's staged file is unchanged");
    assert_eq!(std::fs::metadata(&back).unwrap().uid(), victim.uid, "staged out as the victim");
}

/// Status, list and show: the attacker sees its own reservation and the one shared with it,
/// capacity as totals, none of the victim's other reservations; the victim sees its own; root
/// sees all.
fn reads_show_only_what_the_caller_may_see(
    manager: &ManagerProcess,
    victim: &TestUser,
    attacker: &TestUser,
) {
    let status = json(manager, As::User(attacker), &["status"]);
    assert_eq!(names(&status["reservations"]), vec!["job-202", "vshared"], "{status}");
    assert_eq!(status["used_bytes"], 32 * MIB, "capacity totals count everyone's: {status}");
    let text = status.to_string();
    assert!(!text.contains("job-101") && !text.contains("vdata"), "{text}");
    assert_eq!(status["pools"][0]["reservations"], 2, "only the visible ones counted: {status}");
    assert_eq!(status["pools"][0]["keys_per_stream"], Value::Array(vec![]), "{status}");
    let list = json(manager, As::User(attacker), &["reservation", "list"]);
    assert_eq!(names(&list), vec!["job-202", "vshared"], "{list}");
    for hidden in ["job-101", "vdata"] {
        refused(manager, As::User(attacker), &["reservation", "show", hidden], "no reservation");
        refused(
            manager,
            As::User(attacker),
            &["reservation", "destroy", hidden],
            "no active reservation",
        );
    }
    refused(
        manager,
        As::User(attacker),
        &["reservation", "destroy", "vshared"],
        "may use but not destroy",
    );
    let own = json(manager, As::User(victim), &["status"]);
    assert_eq!(names(&own["reservations"]), vec!["job-101", "vdata", "vshared"], "{own}");
    let all = json(manager, As::Root, &["status"]);
    assert_eq!(
        names(&all["reservations"]),
        vec!["job-101", "job-202", "vdata", "vshared"],
        "{all}"
    );
    // Capacity only, whoever asks (what bbstat shows when Slurm does not say who asks).
    let aggregate = json(manager, As::User(attacker), &["status", "--aggregate"]);
    assert_eq!(aggregate["reservations"], Value::Array(vec![]), "{aggregate}");
    assert_eq!(aggregate["used_bytes"], 32 * MIB, "{aggregate}");
}

/// Root registers job 555 as using `vdata` (the Slurm setup hook does); nobody destroys it
/// while registered, the owner and the attacker cannot force or register, root forces.
fn persistent_reservation_in_use_not_destroyed(
    manager: &ManagerProcess,
    victim: &TestUser,
    attacker: &TestUser,
) {
    let registered =
        json(manager, As::Root, &["reservation", "register-job", "vdata", "--job", "555"]);
    assert_eq!(registered["jobs"], serde_json::json!(["555"]), "{registered}");
    let in_use = "reservation vdata is used by job 555";
    refused(manager, As::User(victim), &["reservation", "destroy", "vdata"], in_use);
    refused(manager, As::Root, &["reservation", "destroy", "vdata"], in_use);
    refused(
        manager,
        As::User(victim),
        &["reservation", "destroy", "vdata", "--force"],
        "may not force the destruction of reservation \"vdata\" (root only)",
    );
    for (who, key) in [(victim, "vdata"), (attacker, "job-202")] {
        refused(
            manager,
            As::User(who),
            &["reservation", "register-job", key, "--job", "9"],
            "may not register jobs with reservations",
        );
        refused(
            manager,
            As::User(who),
            &["reservation", "unregister-job", "vdata", "--job", "555"],
            "may not unregister jobs",
        );
    }
    assert_eq!(
        json(manager, As::User(victim), &["reservation", "show", "vdata"])["state"],
        "active",
        "vdata survived every refused destroy"
    );
    let forced = json(manager, As::Root, &["reservation", "destroy", "vdata", "--force"]);
    assert_eq!(forced["state"], "destroyed", "{forced}");
    json(manager, As::Root, &["reservation", "destroy", "vshared"]);
    json(manager, As::Root, &["reservation", "destroy", "job-202"]);
}

/// The slow client: opens N connections, trickles one byte of a request that never ends to each
/// every INTERVAL seconds for DURATION seconds (stopping on a connection once sending fails),
/// prints "connected", and at the end one JSON object counting what each connection read: the
/// HTTP status of its reply, "reset" (nothing read, connection reset) or "none".
const SLOW_CLIENT: &str = r#"
import json, socket, sys, time
path, n, duration, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
conns = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    conns.append(s)
print("connected", flush=True)
request = b"GET /v1/status HTTP/1.1\r\nContent-Length: 0\r\n"
sent, alive = [0] * n, [True] * n
end = time.time() + duration
while time.time() < end:
    for i, s in enumerate(conns):
        if alive[i]:
            try:
                s.send(request[sent[i] % len(request):][:1])
                sent[i] += 1
            except OSError:
                alive[i] = False
    time.sleep(interval)
outcome = {}
for s in conns:
    s.settimeout(10)
    data, key = b"", None
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        key = "reset"
    except socket.timeout:
        key = "still open"
    if data.startswith(b"HTTP/1.1 "):
        key = data.split(b" ")[1].decode()
    key = key or "none"
    outcome[key] = outcome.get(key, 0) + 1
print(json.dumps(outcome), flush=True)
"#;

/// 70 connections of the attacker trickling a request: the victim's `status` works at once
/// (the attacker holds at most `connections_per_uid_max` of the manager's connections), the
/// attacker's own works once the deadline cut its slow ones off (the CLI retries 503), and every
/// slow connection reads a reply — 503 busy or 408 too slow — never a reset.
fn slow_connections_do_not_lock_out_status(
    manager: &ManagerProcess,
    victim: &TestUser,
    attacker: &TestUser,
) {
    let connections = 70;
    let trickle_s = 2 * REQUEST_TIMEOUT_MS / 1000 + 2;
    let mut slow = attacker
        // The system's interpreter: one under root's home is out of the attacker's reach.
        .command(PYTHON)
        .args(["-c", SLOW_CLIENT])
        .arg(&manager.socket)
        .args([connections.to_string(), trickle_s.to_string(), "2".into()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {PYTHON} as the attacker (the slow client): {e}"));
    let mut stdout = std::io::BufReader::new(slow.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    if line.trim() != "connected" {
        let output = slow.wait_with_output().unwrap();
        panic!("the slow client did not connect: {}", String::from_utf8_lossy(&output.stderr));
    }
    // While the slow connections are attached.
    let status = json(manager, As::User(victim), &["status"]);
    assert_eq!(names(&status["reservations"]), vec!["job-101"], "{status}");
    json(manager, As::Root, &["status"]);
    // The attacker's own status: busy at first (its slots are full), served once they are cut.
    let own = json(manager, As::User(attacker), &["status"]);
    assert_eq!(own["reservations"], Value::Array(vec![]), "{own}");
    let mut summary = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut summary).unwrap();
    let output = slow.wait_with_output().unwrap();
    assert!(output.status.success(), "slow client: {}", String::from_utf8_lossy(&output.stderr));
    let outcome: serde_json::Map<String, Value> = serde_json::from_str(summary.trim())
        .unwrap_or_else(|e| panic!("slow client summary {summary:?}: {e}"));
    let count = |key: &str| outcome.get(key).and_then(Value::as_u64).unwrap_or(0);
    assert_eq!(
        count("503") + count("408"),
        connections,
        "every slow connection read a reply: {outcome:?}"
    );
    assert!(count("503") > 0 && count("408") > 0, "both busy and too-slow answers: {outcome:?}");
    assert!(
        manager.log_text().contains("request not received in time"),
        "the manager logs the slow requests it cut off"
    );
}

/// A manager asking Slurm who owns a job, with no Slurm answering (`SLURM_CONF` names no file):
/// a user's reservation for a job is refused, naming the knob; without `--job` it is not asked.
fn job_owner_check_fails_closed_without_slurm(dir: &Path, attacker: &TestUser) {
    let missing = dir.join("no-slurm.conf");
    let manager = start_manager(
        &dir.join("m-slurm"),
        &[
            ("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "slurm"),
            ("SPILLWAY_MANAGER_JOB_OWNER_TIMEOUT_MS", "3000"),
            ("SLURM_CONF", missing.to_str().unwrap()),
        ],
    );
    refused(
        &manager,
        As::User(attacker),
        &["reservation", "create", "--capacity", "8MiB", "--job", "101"],
        "cannot ask Slurm who owns job 101",
    );
    refused(
        &manager,
        As::User(attacker),
        &["reservation", "create", "--capacity", "8MiB", "--job", "x7"],
        "is not a Slurm job id",
    );
    // Without a job nothing is asked: it fails only for want of a pool.
    refused(
        &manager,
        As::User(attacker),
        &["reservation", "create", "--capacity", "8MiB"],
        "no pools exist",
    );
}
