//! `spillway bench replication --json` runs its three modes against real `spillway serve`
//! processes in three failure domains and reports every mode and both ratios (their values are
//! timings and are not asserted).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

#[test]
fn the_benchmark_reports_every_mode_and_both_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args(["bench", "replication", "--json", "--total-bytes", "12M", "--clients", "3"])
        .args(["--transfer-bytes", "256K", "--rounds", "2", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["benchmark"], "replication");
    assert_eq!(report["total_bytes"], 12 << 20);
    let modes = report["modes"].as_array().unwrap();
    let names: Vec<&str> = modes.iter().map(|m| m["mode"].as_str().unwrap()).collect();
    assert_eq!(names, ["replicated", "ssd", "memory"]);
    let replicas: Vec<u64> = modes.iter().map(|m| m["replicas"].as_u64().unwrap()).collect();
    assert_eq!(replicas, [2, 1, 1]);
    for mode in modes {
        assert_eq!(mode["seconds"].as_array().unwrap().len(), 2, "{mode}");
    }
    for ratio in ["ssd_over_replicated", "replicated_vs_memory"] {
        let value = report["ratios"][ratio].as_f64().unwrap();
        assert!(value.is_finite() && value > 0.0, "{ratio} = {value}");
    }
}
