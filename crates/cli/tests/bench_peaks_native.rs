//! `spillway bench peaks --servers …` against real `spillway serve` processes on loopback ports:
//! the native target measures every phase at every concurrency level, prints the same JSON shape
//! as the directory target, and leaves no epoch behind on the servers.

use std::process::Command;

use spillway_client::{Client, ClientOptions};
use spillway_harness::{endpoint_list, ServerProcess};
use spillway_proto::Endpoint;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

const FIGURES: [&str; 8] = [
    "write_bytes_per_second",
    "read_bytes_per_second",
    "write_iops",
    "read_iops",
    "create_per_second",
    "stat_per_second",
    "list_entries_per_second",
    "remove_per_second",
];

fn run_peaks(target: &[&str]) -> serde_json::Value {
    let output = Command::new(BIN)
        .args(["bench", "peaks"])
        .args(target)
        .args([
            "--threads-max",
            "2",
            "--file-mib-per-thread",
            "1",
            "--transfer-kib",
            "256",
            // Enough files that the time bound may cut the metadata phases short (their
            // clean-up path), few enough to stay fast.
            "--metadata-files-per-thread",
            "150",
            "--phase-seconds",
            "0.02",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "bench peaks {target:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!("not JSON ({error}): {}", String::from_utf8_lossy(&output.stdout))
    })
}

fn assert_every_figure_positive(report: &serde_json::Value) {
    let levels = report["levels"].as_array().expect("levels array");
    let threads: Vec<u64> = levels.iter().map(|level| level["threads"].as_u64().unwrap()).collect();
    assert_eq!(threads, vec![1, 2], "{report}");
    for level in levels {
        for figure in FIGURES {
            let value = level[figure].as_f64().unwrap_or(f64::NAN);
            assert!(value > 0.0 && value.is_finite(), "{figure} in {level}");
        }
    }
    for peak in ["bandwidth_bytes_per_second", "iops", "metadata_ops_per_second"] {
        let value = report["peaks"][peak].as_f64().unwrap_or(f64::NAN);
        assert!(value > 0.0 && value.is_finite(), "peak {peak} in {report}");
    }
}

#[test]
fn native_target_measures_every_phase_and_level_like_the_directory_target() {
    let dir = tempfile::tempdir().unwrap();
    let servers = [
        ServerProcess::builder(BIN, dir.path(), "a").start(),
        ServerProcess::builder(BIN, dir.path(), "b").start(),
    ];
    let endpoints: Vec<Endpoint> = servers.iter().map(|s| s.endpoint().clone()).collect();
    // An epoch the benchmark must neither disturb nor collide with.
    let mut client = Client::connect(&endpoints, ClientOptions::default()).unwrap();
    let mut file = client.create_file(spillway_types::EpochId(7), "keep").unwrap();
    client.write(&mut file, 0, b"application data").unwrap();
    client.commit_epoch(spillway_types::EpochId(7)).unwrap();

    let list = endpoint_list(&endpoints);
    let native = run_peaks(&["--servers", &list]);
    assert_eq!(native["target_kind"], "spillway", "{native}");
    assert_eq!(native["target"], list.as_str());
    assert_every_figure_positive(&native);
    // Metadata through the namespace service, per mode (the tests run as root).
    for level in native["levels"].as_array().unwrap() {
        for mode in ["namespace_striped_ops_per_second", "namespace_private_ops_per_second"] {
            assert!(level[mode].as_f64().unwrap_or(0.0) > 0.0, "{mode} in {level}");
        }
    }
    let namespace_peaks = &native["namespace_metadata_peaks"];
    assert!(namespace_peaks["private_ops_per_second"].as_f64().unwrap_or(0.0) > 0.0);
    // Its namespaces went with their epochs: no journal is left on the servers.
    let journals: Vec<_> = spillway_harness::files_under(dir.path())
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "journal"))
        .collect();
    assert!(journals.is_empty(), "benchmark namespaces left behind: {journals:?}");

    let work = dir.path().join("directory-target");
    let directory = run_peaks(&["--target", work.to_str().unwrap()]);
    assert_eq!(directory["target_kind"], "directory");
    assert_every_figure_positive(&directory);
    assert!(directory["levels"][0]["namespace_striped_ops_per_second"].is_null(), "{directory}");
    let keys = |report: &serde_json::Value| {
        let mut keys: Vec<String> = report.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    assert_eq!(keys(&native), keys(&directory), "same JSON shape");

    // Only the application's epoch is left, intact.
    let epochs = client.list_epochs().unwrap();
    assert_eq!(
        epochs.iter().map(|e| e.epoch.0).collect::<Vec<_>>(),
        vec![7],
        "benchmark epochs left behind: {epochs:?}"
    );
    let file = client.open_file(spillway_types::EpochId(7), "keep").unwrap();
    let mut back = vec![0u8; 16];
    client.read(&file, 0, &mut back).unwrap();
    assert_eq!(&back, b"application data");
}

#[test]
fn target_and_servers_are_exclusive_and_one_is_required() {
    let both = Command::new(BIN)
        .args(["bench", "peaks", "--target", "/tmp", "--servers", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!both.status.success());
    let neither = Command::new(BIN).args(["bench", "peaks"]).output().unwrap();
    assert!(!neither.status.success());
    let bad = Command::new(BIN)
        .args(["bench", "peaks", "--servers", "not-an-endpoint"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("not-an-endpoint"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

#[test]
fn an_unreachable_server_is_named_in_the_error() {
    // A port nobody listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let output = Command::new(BIN)
        .args(["bench", "peaks", "--servers", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
}
