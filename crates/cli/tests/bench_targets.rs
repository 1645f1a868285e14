//! `spillway bench targets --json` with tiny settings: a real manager and three real servers,
//! both jobs by target and by capacity alone; every row has its plan, the client's counts and
//! the servers' achieved counts, which hold at least what the client did. Rates and ratios are
//! timings: only their shape and sign are checked, never their values (nor the 0.8 goal).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

fn u64_at(value: &serde_json::Value, key: &str) -> u64 {
    value[key].as_u64().unwrap_or_else(|| panic!("{key} missing in {value}"))
}

#[test]
fn both_jobs_report_achieved_against_target_and_capacity_only_beside() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args(["bench", "targets", "--json", "--seconds", "0.5"])
        .args(["--bandwidth-job-bytes", "16M", "--transfer-bytes", "1M"])
        .args(["--fragment-bytes", "16M", "--metadata-files", "400"])
        .args(["--measure-threads-max", "1", "--measure-phase-seconds", "0.05"])
        .args(["--measure-file-mib-per-thread", "4", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["benchmark"], "targets");
    assert_eq!(report["peaks"].as_array().unwrap().len(), 3, "{report}");
    assert!(u64_at(&report["targets"], "bandwidth_bytes_per_s") > 0);
    assert!(u64_at(&report["targets"], "metadata_ops_per_s") > 0);
    let jobs = report["jobs"].as_array().unwrap();
    let shape: Vec<(&str, &str)> = jobs
        .iter()
        .map(|j| (j["job"].as_str().unwrap(), j["allocation"].as_str().unwrap()))
        .collect();
    assert_eq!(
        shape,
        [
            ("bandwidth", "by_target"),
            ("metadata", "by_target"),
            ("bandwidth", "by_capacity"),
            ("metadata", "by_capacity")
        ]
    );
    for job in jobs {
        check_row(job);
    }
    for ratio in [
        "achieved_over_target_min",
        "by_target_over_by_capacity_bandwidth",
        "by_target_over_by_capacity_metadata",
    ] {
        let value = report["ratios"][ratio].as_f64().unwrap();
        assert!(value.is_finite() && value > 0.0, "{ratio} = {value}");
    }
}

/// The plan, the client's counts and the servers' counts of one job on one reservation.
fn check_row(job: &serde_json::Value) {
    let servers = job["servers"].as_array().unwrap().len();
    assert!(servers >= 1, "{job}");
    if job["allocation"] == "by_target" {
        assert!(job["asked"].as_str().unwrap().contains(job["job"].as_str().unwrap()), "{job}");
        assert_eq!(job["promised"].as_array().unwrap().len(), servers, "{job}");
        assert!(!job["why"].as_array().unwrap().is_empty(), "{job}");
    } else {
        assert!(job["asked"].is_null() && job["promised"].is_null(), "{job}");
    }
    let (client, achieved) = (&job["client"], &job["achieved"]);
    assert_eq!(u64_at(achieved, "servers_reporting"), servers as u64, "{job}");
    assert!(u64_at(achieved, "busy_ms") >= 100, "{job}");
    if job["job"] == "bandwidth" {
        let written = u64_at(client, "bytes_written");
        assert!(written > 0 && written <= 16 << 20, "{job}");
        assert!(u64_at(achieved, "bytes_written") >= written, "{job}");
        assert!(u64_at(achieved, "bytes_read") >= u64_at(client, "bytes_read"), "{job}");
    } else {
        let operations = u64_at(client, "operations");
        // Create, lookup and unlink per file, at most the files asked for.
        assert!(operations > 0 && operations <= 3 * 400 && operations.is_multiple_of(3), "{job}");
        assert!(u64_at(achieved, "metadata_ops") >= operations, "{job}");
    }
    assert!(u64_at(job, "achieved_per_s") > 0, "{job}");
    assert!(u64_at(job, "target_per_s") > 0, "{job}");
    assert!(job["client"]["rate_per_s"].as_f64().unwrap() > 0.0, "{job}");
}
