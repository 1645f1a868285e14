//! `spillway bench ingress --json` with tiny settings: real servers, real client workers, real
//! memcached and the direct-to-disk baseline. Rates, ratios and CPU figures are timings: only
//! their presence and sign are checked, never their values (nor the 0.9 goal).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

fn run(extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let output = Command::new(BIN)
        .args(["bench", "ingress", "--json", "--single", "--repeat", "1"])
        .args(["--bytes-per-client", "8M", "--transfer-bytes", "1M", "--dir"])
        .arg(dir.path())
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    serde_json::from_slice(&output.stdout).unwrap()
}

fn positive(value: &serde_json::Value, key: &str) -> f64 {
    let number = value[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {value}"));
    assert!(number > 0.0, "{key} = {number} in {value}");
    number
}

#[test]
fn every_subject_is_measured_with_its_cpu_cost() {
    let report = run(&[]);
    let row = &report["rows"][0];
    for subject in ["spillway_nn_memory", "memcached", "loopback", "direct_pfs", "spillway_nn_ssd"]
    {
        positive(row, &format!("{subject}_gbps"));
        // Busy CPU of a region can round to 0 on a fast run; never negative, never absent.
        let cpu = row["cpu_seconds_per_gb"][subject].as_f64().unwrap_or_else(|| panic!("{row}"));
        assert!(cpu >= 0.0, "{subject}: {cpu}");
    }
    for ratio in ["vs_memcached", "vs_loopback", "ssd_vs_direct_pfs"] {
        positive(&report["ratios"], ratio);
    }
    assert_eq!(row["ssd_vs_direct_pfs_per_repeat"].as_array().unwrap().len(), 1);
    let tails: Vec<&String> = row["tail_seconds"].as_object().unwrap().keys().collect();
    assert!(!tails.iter().any(|t| t.contains("memory") || *t == "memcached"), "{row}");
}

#[test]
fn the_work_directory_is_fresh_private_and_removed_and_nothing_else_is_touched() {
    // A shared directory like /var/tmp: another user's entries at the names the bench once
    // used (`spillway-bench-ingress-<pid>`, `pfs`) stay as they were, and the bench's own
    // directory, created 0700 under a random name, is gone afterwards.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let victim = dir.path().join("victim");
    std::fs::create_dir_all(victim.join("pfs")).unwrap();
    std::fs::write(victim.join("pfs/rank0"), b"keep").unwrap();
    for pid in ["1", "2"] {
        let name = dir.path().join(format!("spillway-bench-ingress-{pid}"));
        std::os::unix::fs::symlink(&victim, name).unwrap();
    }
    let output = Command::new(BIN)
        .args(["bench", "ingress", "--json", "--single", "--repeat", "1", "--durable-only"])
        .args(["--bytes-per-client", "4M", "--transfer-bytes", "1M", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(std::fs::read(victim.join("pfs/rank0")).unwrap(), b"keep");
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["spillway-bench-ingress-1", "spillway-bench-ingress-2", "victim"]);
}

#[test]
fn a_missing_directory_is_refused_by_name() {
    let output = Command::new(BIN)
        .args(["bench", "ingress", "--single", "--durable-only", "--dir", "/nonexistent/spillway"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/nonexistent/spillway"), "{stderr}");
}

#[test]
fn durable_only_measures_the_disk_subjects_alone() {
    let report = run(&["--durable-only"]);
    assert_eq!(report["durable_only"], true);
    let row = &report["rows"][0];
    positive(row, "direct_pfs_gbps");
    positive(row, "spillway_nn_ssd_gbps");
    positive(row, "spillway_n1_ssd_gbps");
    assert!(row.get("memcached_gbps").is_none() && row.get("loopback_gbps").is_none(), "{row}");
    let subjects: Vec<&String> = row["cpu_seconds_per_gb"].as_object().unwrap().keys().collect();
    assert_eq!(
        subjects,
        ["direct_pfs", "spillway_n1_ssd", "spillway_nn_ssd", "spillway_nn_ssd_direct_io"]
    );
    // The durability tail: every durable subject has one (memory subjects never do), and it
    // lies within its run.
    let tails = row["tail_seconds"].as_object().unwrap();
    assert_eq!(tails.keys().collect::<Vec<_>>(), subjects, "{row}");
    for (subject, tail) in tails {
        let tail = tail.as_f64().unwrap();
        let run_seconds = 2.0 * 8.0 * 1048576.0 / 1e9 / positive(row, &format!("{subject}_gbps"));
        assert!((0.0..=run_seconds).contains(&tail), "{subject}: tail {tail} of {run_seconds} s");
    }
    assert!(report["ratios"].get("vs_memcached").is_none(), "{report}");
    for ratio in ["ssd_vs_direct_pfs", "ssd_direct_io_vs_direct_pfs", "direct_io_vs_buffered"] {
        positive(&report["ratios"], ratio);
    }
}

#[test]
fn small_writes_compare_16_kib_with_1_mib_writes_sequential_and_strided() {
    let report = run(&["--small-writes", "--servers", "2"]);
    assert_eq!(report["benchmark"], "ingress-small-writes");
    let rows = report["rows"].as_array().unwrap();
    let layouts: Vec<&str> = rows.iter().map(|r| r["layout"].as_str().unwrap()).collect();
    assert_eq!(layouts, ["sequential", "strided"]);
    for row in rows {
        positive(row, "small_gbps");
        positive(row, "large_gbps");
        positive(row, "small_vs_large");
    }
    for ratio in ["small_vs_large_writes", "small_vs_large_writes_strided"] {
        positive(&report["ratios"], ratio);
    }
}
