//! End to end: a real `spillway manager` and two real `spillway serve` processes on loopback.
//!
//! Root adds a pool and the servers; an unprivileged uid (the CLI run under `setpriv
//! --reuid=1000`) creates a reservation that another uid can neither see nor destroy; a tree is
//! staged in, read back through its namespace and the client, staged in again (resumed: nothing copied twice),
//! staged out and compared byte for byte; the manager is restarted and still knows the
//! reservation; a killed server is noticed by the heartbeat. Needs root (CI runs tests as root)
//! and `setpriv` (util-linux).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;
use spillway_client::meta::{RemoteNamespace, RemoteOptions};
use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{pattern, ManagerProcess, ServerProcess};
use spillway_namespace::{data_file_name, Caller as MetaCaller, FileKind, Namespace, ROOT_INO};
use spillway_proto::Endpoint;
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const USER: u32 = 1000;
const OTHER: u32 = 1001;
const MIB: u64 = 1 << 20;

/// The manager of these tests, its files in `dir` (a restart on the same `dir` finds them).
fn start_manager(dir: &Path) -> ManagerProcess {
    let fragment_bytes = (8 * MIB).to_string();
    ManagerProcess::start(
        Path::new(BIN),
        dir,
        &[
            ("SPILLWAY_MANAGER_FRAGMENT_BYTES", &fragment_bytes),
            ("SPILLWAY_MANAGER_STRIPE_SERVERS_MAX", "2"),
            ("SPILLWAY_MANAGER_HEARTBEAT_MS", "200"),
            ("SPILLWAY_MANAGER_HEARTBEAT_MISSES_MAX", "2"),
            // No Slurm here: who owns a job is not checked (slurm_e2e checks it with Slurm).
            ("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "none"),
            // One PFS writer: stage-outs wait for each other (stage_out_as_user checks it).
            ("SPILLWAY_MANAGER_PFS_WRITERS_MAX", "1"),
        ],
    )
}

/// Runs the CLI as root (`uid` None) or as an unprivileged uid through setpriv.
fn spillway(manager: &ManagerProcess, uid: Option<u32>, args: &[&str]) -> Output {
    manager.cli(Path::new(BIN), uid).args(args).output().unwrap()
}

/// Runs the CLI, expects success, parses its `--json` output.
fn json(manager: &ManagerProcess, uid: Option<u32>, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let output = spillway(manager, uid, &all);
    assert!(
        output.status.success(),
        "spillway {args:?} as {uid:?} failed: {}\nmanager log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        manager.log_text()
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!("spillway {args:?}: not JSON ({e}): {}", String::from_utf8_lossy(&output.stdout))
    })
}

/// Runs the CLI, expects failure with exit code 1 and one stderr line containing `needle`.
fn fails(manager: &ManagerProcess, uid: Option<u32>, args: &[&str], needle: &str) {
    let output = spillway(manager, uid, args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "spillway {args:?} as {uid:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "spillway {args:?} as {uid:?}: expected {needle:?} in {stderr:?}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line naming the problem: {stderr:?}");
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid))
        .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The source tree on the "PFS": nested directories, an empty file, a file larger than the
/// stripe unit and not a multiple of it.
fn make_tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let files = vec![
        ("a.dat".to_string(), pattern(1, 100_000)),
        ("sub/b.dat".to_string(), pattern(2, 3 * MIB as usize + 12_345)),
        ("sub/deeper/c.dat".to_string(), pattern(3, 4096)),
        ("sub/deeper/empty".to_string(), Vec::new()),
        ("z.dat".to_string(), pattern(4, 777_777)),
    ];
    for (name, data) in &files {
        let path = root.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, data).unwrap();
    }
    files
}

fn wait_for(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn manager_reservations_staging_restart_and_heartbeat() {
    assert_eq!(
        spillway_sys::user::euid(),
        0,
        "manager_e2e must run as root (it runs the CLI as other uids with setpriv); \
         run `make test` as root, as CI does"
    );
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let mut servers = [
        ServerProcess::builder(BIN, dir.path(), "a").rust_log("info").start(),
        ServerProcess::builder(BIN, dir.path(), "b").rust_log("info").start(),
    ];
    let addresses: Vec<String> = servers
        .iter()
        .map(|s| match s.endpoint() {
            Endpoint::Tcp(address) => address.to_string(),
            other => panic!("expected a TCP endpoint, got {other}"),
        })
        .collect();
    let manager = start_manager(dir.path());

    pools_and_servers_added_by_root_only(&manager, &addresses);
    database_private_and_socket_open_to_all(&manager);
    let reservation = user_reservation_over_both_servers(&manager, &addresses);
    let id = reservation["id"].as_u64().unwrap().to_string();
    let epoch = EpochId(reservation["epoch"].as_u64().unwrap());
    hidden_from_other_users_and_quota_enforced(&manager, &id);

    // Stage in a tree as the user, read it back through the client as root.
    let staged = StagedTree::stage_in(&manager, dir.path());
    read_back_through_namespace_and_client(&reservation, epoch, &staged.files);
    stage_in_resumes(&manager, &staged);
    stage_in_types_checked(&manager, &staged);
    stage_out_as_user(&manager, &id, &staged);

    let mut manager = restart_keeps_reservation_pool_and_servers(manager, dir.path());
    killed_server_marked_down_and_avoided(&manager, &mut servers, &addresses);
    user_destroys_job_reservation(&manager, &addresses, epoch);
    manager.stop();
}

#[test]
fn server_add_asks_the_server_first_and_never_registers_one_twice() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("a.sock");
    let server = ServerProcess::builder(BIN, dir.path(), "a").unix_socket(&socket).start();
    let (tcp, unix) = match server.endpoints() {
        [Endpoint::Tcp(tcp), unix @ Endpoint::Unix(_)] => (*tcp, unix.to_string()),
        other => panic!("expected a TCP and a Unix endpoint: {other:?}"),
    };
    let manager = start_manager(dir.path());
    json(&manager, None, &["pool", "create", "fast", "--granularity", "8MiB"]);
    // Nothing listens on port 1: not registered (and so never shown up).
    fails(&manager, None, &["server", "add", "127.0.0.1:1", "--pool", "fast"], "does not answer");
    let listed = json(&manager, None, &["server", "list"]);
    assert_eq!(listed.as_array().unwrap().len(), 0, "{listed}");
    // More than its store holds.
    let address = tcp.to_string();
    fails(
        &manager,
        None,
        &["server", "add", &address, "--pool", "fast", "--capacity", "100TiB"],
        "more than the server's store holds",
    );
    // A host name is resolved; without --capacity the server's whole store is granted.
    let localhost = format!("localhost:{}", tcp.port());
    let added = json(&manager, None, &["server", "add", &localhost, "--pool", "fast"]);
    assert_eq!(added["address"], address, "{added}");
    assert_eq!(added["capacity_bytes"], 64u64 << 30, "the default store.ssd_bytes_max");
    // The same server again, under its IP, or once its identity is known, its Unix socket.
    fails(&manager, None, &["server", "add", &address, "--pool", "fast"], "already known");
    wait_for("the heartbeat to learn the server's id", Duration::from_secs(30), || {
        json(&manager, None, &["server", "list"])[0]["identity"].is_string()
    });
    fails(&manager, None, &["server", "add", &unix, "--pool", "fast"], "already registered as");
}

/// A server (its TCP address without `tcp://`) and a manager with the empty pool `fast`.
fn one_server_and_pool(dir: &Path) -> (ServerProcess, String, ManagerProcess) {
    let server = ServerProcess::builder(BIN, dir, "a").start();
    let address = server.endpoints()[0].to_string();
    let address = address.strip_prefix("tcp://").unwrap_or(&address).to_string();
    let manager = start_manager(dir);
    json(&manager, None, &["pool", "create", "fast", "--granularity", "8MiB"]);
    (server, address, manager)
}

/// `server add --measure` records the server's peaks (`spillway bench peaks` against it alone),
/// which `server list` shows with when and how they were taken; `server measure` takes them
/// again; a user may not measure; a user's reservation by target is placed and promised there.
#[test]
fn server_peaks_are_measured_recorded_and_shown() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, address, manager) = one_server_and_pool(dir.path());
    let quick = ["--threads-max", "1", "--phase-seconds", "0.2", "--file-mib-per-thread", "8"];
    let add = ["server", "add", &address, "--pool", "fast", "--measure"];
    let added = json(&manager, None, &[&add[..], &quick[..]].concat());
    let peaks = &added["peaks"];
    let rates = ["bandwidth_bytes_per_s", "iops", "metadata_ops_per_s"];
    // Metadata per namespace mode too: through the namespace service, as root.
    for rate in rates.iter().chain(&["metadata_striped_ops_per_s", "metadata_private_ops_per_s"]) {
        assert!(peaks[rate].as_u64().unwrap_or(0) > 0, "{rate} not measured: {added}");
    }
    let conditions = peaks["conditions"].as_str().unwrap();
    assert!(conditions.contains("spillway bench peaks --servers"), "{conditions}");
    assert!(conditions.contains("--threads-max 1"), "{conditions}");
    let first_measured = peaks["measured_unix_s"].as_u64().unwrap();
    assert!(first_measured > 1_700_000_000, "{added}");
    // Shown in the table and kept across listings.
    let table = spillway(&manager, None, &["server", "list"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("PEAKS") && table.contains("namespaces: striped"), "{table}");
    // When and how, in `server list` and in `status`.
    let status = spillway(&manager, None, &["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    for shown in [&table, &status] {
        assert!(shown.contains(&format!("peaks of {address} measured 20")), "{shown}");
        assert!(shown.contains("UTC: spillway bench peaks --servers"), "{shown}");
    }
    // On demand, again (every server of the pool when none is named).
    let measured =
        json(&manager, None, &[&["server", "measure", "--pool", "fast"][..], &quick].concat());
    assert_eq!(measured.as_array().unwrap().len(), 1, "{measured}");
    assert!(measured[0]["peaks"]["measured_unix_s"].as_u64().unwrap() >= first_measured);
    // Users may not.
    fails(
        &manager,
        Some(USER),
        &[&["server", "measure", &address][..], &quick].concat(),
        "may not record server peaks",
    );
    fails(&manager, None, &["server", "measure", "127.0.0.1:1"], "no server");
    // A user asks by target: placed on the measured server, the promise shown on it; a
    // target beyond its peaks is refused naming the limit.
    let created = json(&manager, Some(USER), &["reservation", "create", "--bandwidth", "1MiB/s"]);
    assert_eq!(created["targets"]["asked"]["bandwidth_bytes_per_s"], 1u64 << 20, "{created}");
    assert_eq!(created["targets"]["promised"][0]["bandwidth_bytes_per_s"], 1u64 << 20);
    let listed = json(&manager, None, &["server", "list"]);
    assert_eq!(listed[0]["promised"]["bandwidth_bytes_per_s"], 1u64 << 20, "{listed}");
    // A dry run places the same request and keeps nothing.
    let dry = ["reservation", "create", "--bandwidth", "2MiB/s", "--dry-run"];
    let would = json(&manager, Some(USER), &dry);
    assert_eq!(
        (would["id"].as_u64(), would["servers"].as_array().map(Vec::len)),
        (Some(0), Some(1))
    );
    let mine = json(&manager, Some(USER), &["reservation", "list"]);
    assert_eq!(mine.as_array().unwrap().len(), 1, "a dry run created a reservation: {mine}");
    // Ended, it is shown in `status` with its targets beside what was achieved, to its owner
    // and not to another user.
    let name = created["name"].as_str().unwrap();
    json(&manager, Some(USER), &["reservation", "destroy", name]);
    let status = json(&manager, Some(USER), &["status"]);
    let ended = &status["ended_by_targets"][0];
    assert_eq!(ended["name"], name, "{status}");
    assert_eq!(ended["targets"]["asked"]["bandwidth_bytes_per_s"], 1u64 << 20, "{status}");
    assert!(ended["achieved"]["servers_reporting"].as_u64().is_some(), "{status}");
    let others = json(&manager, Some(OTHER), &["status"]);
    assert_eq!(others["ended_by_targets"], serde_json::json!([]), "{others}");
    let table = spillway(&manager, Some(USER), &["status"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("ACHIEVED/ASKED") && table.contains("bandwidth="), "{table}");
    fails(
        &manager,
        Some(USER),
        &["reservation", "create", "--bandwidth", "100TiB/s"],
        "targets cannot be met",
    );
    let not_a_rate =
        spillway(&manager, Some(USER), &["reservation", "create", "--bandwidth", "2GiB"]);
    let stderr = String::from_utf8_lossy(&not_a_rate.stderr);
    assert!(!not_a_rate.status.success() && stderr.contains("end it with /s"), "{stderr}");
}

/// A destroyed reservation's reply records what its servers saw of its epoch from grant to
/// teardown: exactly the bytes written and read through the client, its metadata operations,
/// busy time and the rates they make.
#[test]
fn a_destroyed_reservation_records_its_achieved_io() {
    let dir = tempfile::tempdir().unwrap();
    let (server, address, manager) = one_server_and_pool(dir.path());
    json(&manager, None, &["server", "add", &address, "--pool", "fast", "--capacity", "64MiB"]);
    let created = json(&manager, None, &["reservation", "create", "--capacity", "16MiB"]);
    let epoch = EpochId(created["epoch"].as_u64().unwrap());
    let name = created["name"].as_str().unwrap().to_string();
    let data = pattern(5, 3 << 20);
    let mut client = Client::connect(&[server.endpoints()[0].clone()], ClientOptions::default())
        .expect("connect");
    let mut file = client.create_file(epoch, "ckpt").unwrap();
    client.write(&mut file, 0, &data).unwrap();
    client.flush().unwrap();
    let mut back = vec![0u8; 1 << 20];
    client.read(&file, 0, &mut back).unwrap();
    assert_eq!(back[..], data[..1 << 20]);
    drop(client);
    let destroyed = json(&manager, None, &["reservation", "destroy", &name]);
    let achieved = &destroyed["achieved"];
    assert_eq!(achieved["servers_reporting"], 1, "{destroyed}");
    assert_eq!(achieved["bytes_written"], 3u64 << 20, "{destroyed}");
    assert_eq!(achieved["bytes_read"], 1u64 << 20, "{destroyed}");
    assert!(achieved["metadata_ops"].as_u64().unwrap() >= 1, "the create: {destroyed}");
    assert!(achieved["busy_ms"].as_u64().unwrap() >= 100, "{destroyed}");
    assert!(achieved["bandwidth_bytes_per_s"].as_u64().unwrap() > 0, "{destroyed}");
}

/// Root: a pool and two servers. A user may not.
fn pools_and_servers_added_by_root_only(manager: &ManagerProcess, addresses: &[String]) {
    json(manager, None, &["pool", "create", "fast", "--granularity", "8MiB"]);
    fails(
        manager,
        Some(USER),
        &["pool", "create", "mine", "--granularity", "8MiB"],
        "may not manage pools",
    );
    for address in addresses {
        json(manager, None, &["server", "add", address, "--pool", "fast", "--capacity", "64MiB"]);
    }
    fails(
        manager,
        Some(USER),
        &["server", "add", "127.0.0.1:1", "--pool", "fast", "--capacity", "1G"],
        "may not manage servers",
    );
}

/// The database (and its -wal and -shm) is 0600 although the manager runs with umask 0; its
/// socket is 0666: anyone may connect, the socket's peer credentials say who.
fn database_private_and_socket_open_to_all(manager: &ManagerProcess) {
    let mode = |path: &Path| {
        std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
            & 0o777
    };
    for suffix in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{}{suffix}", manager.db.display()));
        assert_eq!(mode(&file), 0o600, "{} must be private to the manager", file.display());
    }
    assert_eq!(mode(&manager.socket), 0o666, "the manager's socket");
}

/// The user's reservation: 20 MiB in 8 MiB fragments over both servers.
fn user_reservation_over_both_servers(manager: &ManagerProcess, addresses: &[String]) -> Value {
    let reservation =
        json(manager, Some(USER), &["reservation", "create", "--capacity", "20MiB", "--job", "77"]);
    assert_eq!(reservation["name"], "job-77");
    assert_eq!(reservation["owner"], USER);
    assert_eq!(reservation["fragments"], 3);
    assert_eq!(reservation["capacity_bytes"], 24 * MIB);
    assert_eq!(reservation["state"], "active");
    assert_eq!(reservation["access"], "striped");
    let mut striped: Vec<String> = reservation["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    striped.sort();
    let mut expected = addresses.to_vec();
    expected.sort();
    assert_eq!(striped, expected);
    reservation
}

/// Another uid can neither see nor destroy the reservation; a quota refuses a request above it.
fn hidden_from_other_users_and_quota_enforced(manager: &ManagerProcess, id: &str) {
    // Another uid can neither see nor destroy it.
    fails(manager, Some(OTHER), &["reservation", "show", id], "no reservation");
    fails(manager, Some(OTHER), &["reservation", "show", "job-77"], "no reservation");
    fails(manager, Some(OTHER), &["reservation", "destroy", "job-77"], "no active reservation");
    assert_eq!(json(manager, Some(OTHER), &["reservation", "list"]), Value::Array(vec![]));
    assert_eq!(json(manager, Some(USER), &["reservation", "list"]).as_array().unwrap().len(), 1);
    // Status: another uid sees capacity (used by the user's reservation) but none of it.
    let other_status = json(manager, Some(OTHER), &["status"]);
    assert_eq!(other_status["reservations"], Value::Array(vec![]), "{other_status}");
    assert_eq!(other_status["used_bytes"], 24 * MIB);
    assert_eq!(other_status["pools"][0]["reservations"], 0, "{other_status}");
    assert!(!other_status.to_string().contains("job-77"), "{other_status}");
    let own_status = json(manager, Some(USER), &["status"]);
    assert_eq!(own_status["reservations"][0]["name"], "job-77", "{own_status}");
    // Quota: root sets 16 MiB for the other user, whose 24 MiB request is refused clearly.
    json(manager, None, &["quota", "set", &OTHER.to_string(), "16MiB"]);
    fails(
        manager,
        Some(OTHER),
        &["reservation", "create", "--capacity", "24MiB"],
        "quota exceeded for uid 1001",
    );
}

/// The tree staged into job-77 as the user, and the user's directory for records and copies.
struct StagedTree {
    source: PathBuf,
    files: Vec<(String, Vec<u8>)>,
    user_dir: PathBuf,
    record_in: PathBuf,
}

impl StagedTree {
    /// Stages a tree in as the user; every file is copied.
    fn stage_in(manager: &ManagerProcess, dir: &Path) -> StagedTree {
        let source = dir.join("pfs-src");
        let files = make_tree(&source);
        let user_dir = dir.join("user");
        std::fs::create_dir(&user_dir).unwrap();
        chown(&user_dir, USER);
        let record_in = user_dir.join("in.jsonl");
        let staged = StagedTree { source, files, user_dir, record_in };
        let report = json(manager, Some(USER), &staged.stage_in_args());
        assert_eq!(report["files_total"], staged.files.len());
        assert_eq!(report["files_copied"], staged.files.len());
        staged
    }

    /// The user's stage-in command, recorded in `record_in`.
    fn stage_in_args(&self) -> [&str; 9] {
        [
            "stage-in",
            "--reservation",
            "job-77",
            self.source.to_str().unwrap(),
            "/input",
            "--record",
            self.record_in.to_str().unwrap(),
            "--progress",
            "lines",
        ]
    }
}

/// Every staged file through the namespace the job's mount shows, and its bytes through the client.
fn read_back_through_namespace_and_client(
    reservation: &Value,
    epoch: EpochId,
    files: &[(String, Vec<u8>)],
) {
    // In the reservation's stripe order (placement depends on it).
    let endpoints_in_order: Vec<Endpoint> = reservation["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().parse().unwrap())
        .collect();
    let mut client = Client::connect(
        &endpoints_in_order,
        ClientOptions { placement: Placement::striped_default(), ..Default::default() },
    )
    .unwrap();
    // Through the namespace the job's mount shows: /input/<name>, owned by the user, with the
    // bytes in the namespace's data file.
    let namespace = RemoteNamespace::open(
        &endpoints_in_order[0],
        reservation["namespace_id"].as_u64().unwrap(),
        &RemoteOptions { create: false, data_epoch: epoch, ..Default::default() },
    )
    .unwrap();
    assert_eq!(namespace.data_epoch(), epoch);
    for (name, data) in files {
        let mut attr = namespace.getattr(ROOT_INO).unwrap();
        for part in format!("input/{name}").split('/') {
            attr = namespace
                .lookup(&MetaCaller::root(), attr.ino, part.as_bytes())
                .unwrap_or_else(|e| panic!("input/{name}: {e}"));
        }
        assert_eq!(attr.kind, FileKind::Regular);
        assert_eq!((attr.uid, attr.size), (USER, data.len() as u64), "input/{name}");
        if data.is_empty() {
            continue;
        }
        let handle = client
            .open_file(epoch, &data_file_name(namespace.id(), attr.ino, attr.generation))
            .unwrap();
        let mut back = vec![0u8; data.len()];
        client.read(&handle, 0, &mut back).unwrap();
        assert!(back == *data, "input/{name}: bytes differ");
    }
}

/// Resume: a rerun copies nothing; with the record cut to its first line, the rest again.
fn stage_in_resumes(manager: &ManagerProcess, staged: &StagedTree) {
    let files = &staged.files;
    let report = json(manager, Some(USER), &staged.stage_in_args());
    assert_eq!(
        (report["files_copied"].as_u64(), report["files_skipped"].as_u64()),
        (Some(0), Some(files.len() as u64))
    );
    let first_line =
        std::fs::read_to_string(&staged.record_in).unwrap().lines().next().unwrap().to_string();
    std::fs::write(&staged.record_in, format!("{first_line}\n")).unwrap();
    let report = json(manager, Some(USER), &staged.stage_in_args());
    assert_eq!(
        (report["files_copied"].as_u64(), report["files_skipped"].as_u64()),
        (Some(files.len() as u64 - 1), Some(1))
    );
}

/// `stage-in --type`: a source of the wrong kind and a bad or unreadable stage list are refused,
/// naming the problem; a list is read as the caller (a root-only file is not); a good list
/// stages every entry under the destination.
fn stage_in_types_checked(manager: &ManagerProcess, staged: &StagedTree) {
    let source = staged.source.to_str().unwrap();
    let (file_name, file_bytes) = &staged.files[0];
    let file = staged.source.join(file_name);
    let file = file.to_str().unwrap();
    let stage = |kind: &str, src: &str, dst: &str| {
        ["stage-in", "--reservation", "job-77", "--type", kind, src, dst, "--progress", "none"]
            .map(str::to_string)
    };
    let run = |args: [String; 9], needle: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(manager, Some(USER), &args, needle);
    };
    run(stage("file", source, "typed"), "is a directory, and type=file was asked");
    run(stage("directory", file, "typed"), "is a regular file, and type=directory was asked");
    let write_list = |name: &str, text: &str| {
        let path = staged.user_dir.join(name);
        std::fs::write(&path, text).unwrap();
        chown(&path, USER);
        path.to_str().unwrap().to_string()
    };
    let one_word = write_list("one-word.list", &format!("# comment\n{file} a b\n"));
    run(stage("list", &one_word, "listed"), "line 2: expected `SOURCE DESTINATION`, got 3 words");
    let relative = write_list("relative.list", "relative/source dst\n");
    run(stage("list", &relative, "listed"), "the source must be an absolute PFS path");
    let escape = write_list("escape.list", &format!("{file} ../../x\n"));
    run(stage("list", &escape, "listed"), "the destination must be relative");
    let secret = staged.user_dir.join("root-only.list");
    std::fs::write(&secret, format!("{file} stolen\n")).unwrap();
    chmod(&secret, 0o600);
    run(stage("list", secret.to_str().unwrap(), "listed"), "Permission denied");
    let good = write_list("good.list", &format!("\"{file}\" 'with space/copy'\n"));
    let args = stage("list", &good, "listed");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let reports = json(manager, Some(USER), &args);
    assert_eq!(reports.as_array().map(Vec::len), Some(1), "{reports}");
    assert_eq!(reports[0]["bytes_total"], file_bytes.len(), "{reports}");
    let out = ["stage-out", "--reservation", "job-77", "--type", "file", "x", "/tmp/x"];
    fails(manager, Some(USER), &out, "--type applies to stage-in only");
}

/// Stage out as the user: the same bytes on the PFS.
fn stage_out_as_user(manager: &ManagerProcess, id: &str, staged: &StagedTree) {
    let out = staged.user_dir.join("out");
    let record_out = staged.user_dir.join("out.jsonl");
    // The PFS's one writer slot is taken (another reservation's drain): the copy waits for it,
    // and past its wait it copies nothing and says why.
    let api = spillway_manager::ApiClient::new(&manager.socket.to_string_lossy()).unwrap();
    let held = spillway_manager::tiering::DrainSlot::acquire(
        &api,
        "another reservation's drain",
        0,
        Duration::from_secs(10),
    )
    .unwrap();
    fails(
        manager,
        Some(USER),
        &[
            "stage-out",
            "--reservation",
            id,
            "/input",
            out.to_str().unwrap(),
            "--drain-timeout-s",
            "1",
        ],
        "no PFS slot",
    );
    assert!(!out.exists(), "a stage-out without its PFS slot wrote {}", out.display());
    drop(held);
    let report = json(
        manager,
        Some(USER),
        &[
            "stage-out",
            "--reservation",
            id,
            "/input",
            out.to_str().unwrap(),
            "--record",
            record_out.to_str().unwrap(),
            "--parallel",
            "3",
        ],
    );
    assert_eq!(report["files_copied"], staged.files.len());
    for (name, data) in &staged.files {
        let path = out.join(name);
        assert!(std::fs::read(&path).unwrap() == *data, "{}: bytes differ", path.display());
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().uid(),
            USER,
            "written with the user's identity"
        );
    }
    fails(
        manager,
        Some(USER),
        &["stage-out", "--reservation", id, "/nothing", out.to_str().unwrap()],
        "nothing under",
    );
}

/// Restart: the reservation, pool and servers are still there. Returns the new manager.
fn restart_keeps_reservation_pool_and_servers(
    mut manager: ManagerProcess,
    dir: &Path,
) -> ManagerProcess {
    let before = json(&manager, Some(USER), &["reservation", "show", "job-77"]);
    manager.stop();
    assert!(manager.db.exists());
    let manager = start_manager(dir);
    assert_eq!(json(&manager, Some(USER), &["reservation", "show", "job-77"]), before);
    let status = json(&manager, None, &["status"]);
    assert_eq!(status["used_bytes"], 24 * MIB);
    assert_eq!(status["pools"][0]["servers"], 2);
    // `status --watch` shows it again each interval: one JSON object per line, --count of them.
    let watch = spillway(&manager, None, &["status", "--watch", "1", "--count", "2", "--json"]);
    assert!(watch.status.success(), "{}", String::from_utf8_lossy(&watch.stderr));
    let lines: Vec<Value> = String::from_utf8_lossy(&watch.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one status object per line"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert!(lines.iter().all(|l| l["used_bytes"] == 24 * MIB), "{lines:?}");
    manager
}

/// A killed server is marked down by the heartbeat, and new reservations avoid it.
fn killed_server_marked_down_and_avoided(
    manager: &ManagerProcess,
    servers: &mut [ServerProcess],
    addresses: &[String],
) {
    servers[1].sigkill().unwrap();
    let down = addresses[1].clone();
    wait_for("the heartbeat to mark the killed server down", Duration::from_secs(30), || {
        let list = json(manager, None, &["server", "list"]);
        list.as_array()
            .unwrap()
            .iter()
            .any(|s| s["address"] == down.as_str() && s["healthy"] == false)
    });
    // New reservations avoid it.
    let next = json(
        manager,
        Some(USER),
        &["reservation", "create", "--capacity", "16MiB", "--persistent", "keep"],
    );
    assert_eq!(next["servers"], serde_json::json!([addresses[0]]));
}

/// The user destroys their job reservation; its data is deleted on the live server.
fn user_destroys_job_reservation(manager: &ManagerProcess, addresses: &[String], epoch: EpochId) {
    let destroyed = json(manager, Some(USER), &["reservation", "destroy", "job-77", "--job", "77"]);
    assert_eq!(destroyed["state"], "destroyed");
    fails(manager, Some(USER), &["reservation", "show", "job-77"], "no reservation");
    let live_endpoint: Endpoint = addresses[0].parse().unwrap();
    let mut live = Client::connect(&[live_endpoint], ClientOptions::default()).unwrap();
    assert!(
        live.list_epochs().unwrap().iter().all(|e| e.epoch != epoch),
        "epoch deleted at destroy"
    );
}

/// Stage-out with `--drain`: the reservation's epoch is committed and drained to the PFS by the
/// servers (the drain path), and the copy is made from the drained files, not read again from
/// the burst buffer; a rerun copies nothing. Servers on Unix sockets known in advance, so each
/// gets the whole reservation as its drain peers.
#[test]
fn stage_out_through_the_drain_path() {
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    let (_servers, endpoints) = draining_servers(dir.path(), &pfs);
    let manager = start_manager(dir.path());
    add_drained_pool(&manager, &endpoints, &pfs);
    let reservation =
        json(&manager, None, &["reservation", "create", "--capacity", "16MiB", "--job", "9"]);
    assert_eq!(reservation["servers"].as_array().unwrap().len(), 2);
    let source = dir.path().join("src");
    let files = make_tree(&source);
    json(
        &manager,
        None,
        &[
            "stage-in",
            "--reservation",
            "job-9",
            source.to_str().unwrap(),
            "/data",
            "--progress",
            "none",
        ],
    );

    let out = dir.path().join("out");
    let record = dir.path().join("out.jsonl");
    let args = [
        "stage-out",
        "--reservation",
        "job-9",
        "/data",
        out.to_str().unwrap(),
        "--drain",
        "--drain-timeout-s",
        "60",
        "--record",
        record.to_str().unwrap(),
        "--progress",
        "none",
    ];
    let report = json(&manager, None, &args);
    assert_eq!(report["files_copied"], files.len());
    assert_eq!(
        report["files_from_drained_copy"],
        files.len(),
        "every file came from its drained copy: {report}"
    );
    for (name, data) in &files {
        assert!(std::fs::read(out.join(name)).unwrap() == *data, "{name}: bytes differ");
    }
    assert_epoch_drained(&endpoints, &reservation);
    // Already staged out: nothing is copied twice.
    let report = json(&manager, None, &args);
    assert_eq!(
        (report["files_copied"].as_u64(), report["files_skipped"].as_u64()),
        (Some(0), Some(files.len() as u64))
    );
}

/// A stage-out whose drain is quarantined (here: the PFS lost its marker, so every attempt is
/// refused) fails at once with the drain's error instead of waiting out its timeout; the data
/// stays in the burst buffer, and once the PFS is repaired a rerun (its drain request releases
/// the quarantine) stages everything out.
#[test]
fn stage_out_reports_a_quarantined_drain_and_a_rerun_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    let (_servers, endpoints) = draining_servers_with(
        dir.path(),
        &pfs,
        &[("SPILLWAY_DRAIN_QUARANTINE_AFTER_FAILURES", "2")],
    );
    let manager = start_manager(dir.path());
    add_drained_pool(&manager, &endpoints, &pfs);
    let reservation =
        json(&manager, None, &["reservation", "create", "--capacity", "16MiB", "--job", "10"]);
    let source = dir.path().join("src");
    let files = make_tree(&source);
    let stage_in = [
        "stage-in",
        "--reservation",
        "job-10",
        source.to_str().unwrap(),
        "/data",
        "--progress",
        "none",
    ];
    json(&manager, None, &stage_in);

    destination_under_a_missing_parent_refused(&manager, dir.path(), "job-10");

    // The PFS "lost" its marker (as a PFS mounted elsewhere, or not at all, has none).
    let marker = pfs.join(".spillway-pfs");
    let saved = std::fs::read(&marker).expect("the harness marks the PFS");
    std::fs::remove_file(&marker).unwrap();
    let out = dir.path().join("out");
    let record = dir.path().join("out.jsonl");
    let args = [
        "stage-out",
        "--reservation",
        "job-10",
        "/data",
        out.to_str().unwrap(),
        "--drain",
        "--drain-timeout-s",
        "600",
        "--record",
        record.to_str().unwrap(),
        "--progress",
        "none",
    ];
    fails(&manager, None, &args, "quarantined");
    assert!(
        !out.exists() || std::fs::read_dir(&out).unwrap().next().is_none(),
        "nothing staged out while the drain could not run"
    );
    let mut client = Client::connect(&endpoints, ClientOptions::default()).unwrap();
    let epoch = EpochId(reservation["epoch"].as_u64().unwrap());
    assert!(
        client.list_epochs().unwrap().iter().any(|e| e.epoch == epoch),
        "the epoch stays in the burst buffer"
    );

    std::fs::write(&marker, saved).unwrap();
    let report = json(&manager, None, &args);
    assert_eq!(report["files_copied"], files.len(), "{report}");
    for (name, data) in &files {
        assert!(std::fs::read(out.join(name)).unwrap() == *data, "{name}: bytes differ");
    }
}

/// A destination whose parent is missing (an unmounted PFS's tree) is refused, not created.
fn destination_under_a_missing_parent_refused(manager: &ManagerProcess, dir: &Path, id: &str) {
    let unmounted = dir.join("unmounted-pfs");
    let nowhere = unmounted.join("project/out");
    let refused = [
        "stage-out",
        "--reservation",
        id,
        "/data",
        nowhere.to_str().unwrap(),
        "--progress",
        "none",
    ];
    fails(manager, None, &refused, "does not exist");
    assert!(!unmounted.exists(), "stage-out created directories above its destination");
}

/// Two servers on Unix sockets draining to `pfs`, each with both as its drain peers.
fn draining_servers(dir: &Path, pfs: &Path) -> (Vec<ServerProcess>, Vec<Endpoint>) {
    draining_servers_with(dir, pfs, &[])
}

/// [`draining_servers`] with extra environment (knobs) for both servers.
fn draining_servers_with(
    dir: &Path,
    pfs: &Path,
    env: &[(&str, &str)],
) -> (Vec<ServerProcess>, Vec<Endpoint>) {
    let sockets: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("d{i}.sock"))).collect();
    let endpoints: Vec<Endpoint> = sockets.iter().map(|s| Endpoint::Unix(s.clone())).collect();
    let servers: Vec<ServerProcess> = (0..2)
        .map(|i| {
            let mut builder = ServerProcess::builder(BIN, dir, &format!("d{i}"))
                .no_tcp()
                .unix_socket(&sockets[i])
                .pfs_dir(pfs)
                .drain_peers(&endpoints, i)
                .rust_log("info")
                .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MIN", "20")
                .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MAX", "100");
            for (name, value) in env {
                builder = builder.env(name, value);
            }
            builder.start()
        })
        .collect();
    (servers, endpoints)
}

/// The pool `drained` with the servers added to it, their PFS `pfs`.
fn add_drained_pool(manager: &ManagerProcess, endpoints: &[Endpoint], pfs: &Path) {
    json(manager, None, &["pool", "create", "drained", "--granularity", "8MiB"]);
    for endpoint in endpoints {
        json(
            manager,
            None,
            &[
                "server",
                "add",
                &endpoint.to_string(),
                "--pool",
                "drained",
                "--capacity",
                "64MiB",
                "--pfs",
                pfs.to_str().unwrap(),
            ],
        );
    }
}

/// The reservation's epoch is drained (or already gone) on the servers.
fn assert_epoch_drained(endpoints: &[Endpoint], reservation: &Value) {
    let mut client = Client::connect(endpoints, ClientOptions::default()).unwrap();
    let epoch = EpochId(reservation["epoch"].as_u64().unwrap());
    let state =
        client.list_epochs().unwrap().into_iter().find(|e| e.epoch == epoch).map(|e| e.state);
    assert!(
        matches!(state, None | Some(spillway_proto::EpochState::Drained)),
        "epoch drained: {state:?}"
    );
}
