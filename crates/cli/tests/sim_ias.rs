//! `spillway sim ias --json`: one run per strategy over the same synthetic jobs, with the IAS
//! ratios; and a bad flag value is refused with the flag's name.

use std::process::Command;

#[test]
fn sim_ias_json_reports_four_strategies_and_the_ratios() {
    let output = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["sim", "ias", "--jobs", "4", "--steps", "3", "--phase-bytes", "8GiB", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success(), "spillway sim ias failed: {output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let names: Vec<&str> = report["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|strategy| strategy["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["baseline", "high-priority", "interference-aware", "measured"]);
    for strategy in report["strategies"].as_array().unwrap() {
        assert_eq!(strategy["jobs"].as_array().unwrap().len(), 4);
        assert!(strategy["average_io_time_seconds"].as_f64().unwrap() > 0.0);
        assert_eq!(strategy["bytes_on_pfs"], strategy["bytes_written"]);
        assert!(strategy.get("decisions").is_none(), "decisions only with --decisions");
    }
    for ratio in ["ia_over_hp_io_time", "ia_over_baseline_io_time", "measured_over_ia_io_time"] {
        let value = report["ratios"][ratio].as_f64();
        assert!(value.is_some_and(|value| value > 0.0), "{ratio}: {}", report["ratios"]);
    }
}

#[test]
fn sim_ias_names_the_bad_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["sim", "ias", "--pfs-bandwidth", "fast"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--pfs-bandwidth"), "{stderr}");
}
