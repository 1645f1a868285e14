//! The stage progress record under injected I/O faults, with a real manager and two real
//! servers: EIO, ENOSPC and a failed fsync while recording a verified file make the stage fail
//! with an error naming the record and the cause, and a rerun (with the real record) redoes
//! exactly the files the record does not name — never reports a file verified that was not —
//! and ends with every byte right.
//!
//! Needs root (the manager and servers run as this user; staging acts as the reservation's
//! owner, root).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use spillway_harness::{pattern, ManagerProcess, ServerProcess};
use spillway_manager::stage::record_faults::{FaultyRecordStore, RecordFault};
use spillway_manager::stage::{self, PrivateRecordStore, RecordStore, StageOptions};
use spillway_manager::Reservation;
use spillway_proto::Endpoint;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const FILES: usize = 6;

fn spillway_json(manager: &ManagerProcess, args: &[&str]) -> String {
    let output = Command::new(BIN)
        .args(args)
        .arg("--json")
        .env("SPILLWAY_MANAGER", &manager.socket)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "spillway {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// One file at a time, so the `n`th record append is the `n`th file (sorted by name).
fn options(record: &Path, store: Arc<dyn RecordStore>) -> StageOptions {
    let mut options = StageOptions::new(record.to_path_buf());
    options.parallel_files = 1;
    options.record_store = store;
    options
}

/// The record file's `at`th append call (0-based) fails with `errno`, or (`fsync`) succeeds
/// and the fsync after it fails with EIO.
fn faulty(at: usize, errno: i32, fsync: bool) -> Arc<dyn RecordStore> {
    let fault = if fsync { RecordFault::Fsync } else { RecordFault::Errno(errno) };
    Arc::new(FaultyRecordStore { fault, at })
}

fn recorded_names(record: &Path) -> Vec<String> {
    std::fs::read_to_string(record)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["name"].to_string())
        .collect()
}

/// Two servers, a manager, a pool and root's reservation over both.
fn cluster(dir: &Path) -> (ManagerProcess, Vec<ServerProcess>, Reservation) {
    let servers: Vec<ServerProcess> =
        ["a", "b"].iter().map(|n| ServerProcess::builder(BIN, dir, n).start()).collect();
    let manager = ManagerProcess::start(
        Path::new(BIN),
        dir,
        &[
            ("SPILLWAY_MANAGER_FRAGMENT_BYTES", "8388608"),
            ("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "none"),
        ],
    );
    spillway_json(&manager, &["pool", "create", "fast", "--granularity", "8MiB"]);
    for server in &servers {
        let Endpoint::Tcp(address) = server.endpoint() else { panic!("expected TCP") };
        let address = address.to_string();
        spillway_json(
            &manager,
            &["server", "add", &address, "--pool", "fast", "--capacity", "64MiB"],
        );
    }
    let created = spillway_json(&manager, &["reservation", "create", "--capacity", "16MiB"]);
    let reservation: Reservation = serde_json::from_str(created.trim()).unwrap();
    (manager, servers, reservation)
}

/// Stage-in of `source` into `in`: ENOSPC recording the third verified file, then EIO on the
/// next run's first record append; the real record's rerun copies exactly the other four.
fn stage_in_with_faults(reservation: &Reservation, source: &Path, record: &Path) {
    let run = |store: Arc<dyn RecordStore>| {
        stage::stage_in(reservation, source, "in", &options(record, store))
    };
    let error = run(faulty(2, libc::ENOSPC, false)).unwrap_err().to_string();
    assert!(
        error.contains(&record.display().to_string()) && error.contains("No space left on device"),
        "{error}"
    );
    assert_eq!(recorded_names(record), ["\"in/f0\"", "\"in/f1\""], "only what was recorded");
    let error = run(faulty(0, libc::EIO, false)).unwrap_err().to_string();
    assert!(error.contains("Input/output error"), "{error}");
    assert_eq!(recorded_names(record).len(), 2);
    let rerun = run(Arc::new(PrivateRecordStore)).unwrap();
    assert_eq!((rerun.files_skipped, rerun.files_copied), (2, FILES as u64 - 2), "{rerun:?}");
    let again = run(Arc::new(PrivateRecordStore)).unwrap();
    assert_eq!((again.files_skipped, again.files_copied), (FILES as u64, 0));
}

#[test]
fn stage_record_faults_fail_the_stage_and_a_rerun_redoes_exactly_the_unrecorded_files() {
    assert_eq!(spillway_sys::user::euid(), 0, "stage_record_faults must run as root");
    let dir = tempfile::tempdir().unwrap();
    let (manager, servers, reservation) = cluster(dir.path());
    let source = dir.path().join("src");
    std::fs::create_dir_all(&source).unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..FILES)
        .map(|i| (format!("f{i}"), pattern(40 + i as u64, 100_000 + 37_777 * i)))
        .collect();
    for (name, data) in &files {
        std::fs::write(source.join(name), data).unwrap();
    }
    let records = dir.path().join("records");
    stage_in_with_faults(&reservation, &source, &records.join("in.jsonl"));

    // Stage-out: the fsync after recording the second file fails; the entry is cut back.
    let out = dir.path().join("out");
    let record_out = records.join("out.jsonl");
    let run = |store: Arc<dyn RecordStore>| {
        stage::stage_out(&reservation, "in", &out, &options(&record_out, store))
    };
    let error = run(faulty(1, 0, true)).unwrap_err().to_string();
    assert!(error.contains("Input/output error"), "{error}");
    assert_eq!(recorded_names(&record_out), ["\"in/f0\""]);
    let rerun = run(Arc::new(PrivateRecordStore)).unwrap();
    assert_eq!((rerun.files_skipped, rerun.files_copied), (1, FILES as u64 - 1), "{rerun:?}");
    for (name, data) in &files {
        let copied: PathBuf = out.join(name);
        assert!(std::fs::read(&copied).unwrap() == *data, "{} differs", copied.display());
    }
    drop(manager);
    drop(servers);
}
