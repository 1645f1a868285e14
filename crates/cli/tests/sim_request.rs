//! `spillway sim TRACE --request`: the line `spillway characterize --request` prints, fed to
//! `sim --request`, replays the trace against the reservation the manager's planner gives it
//! (docs/design/targets.md §5b). No assertion on timings measured by the clock: every number
//! checked is the model's.

use std::path::PathBuf;
use std::process::{Command, Output};

use spillway_policy::targets::Targets;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

fn repository(path: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
    path.to_str().unwrap().to_string()
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn spillway(args: &[&str]) -> String {
    let output = run(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "spillway {args:?}: {}; stderr: {stderr}", output.status);
    String::from_utf8(output.stdout).unwrap()
}

fn failure(args: &[&str]) -> String {
    let output = run(args);
    assert!(!output.status.success(), "spillway {args:?} should fail");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn characterize_request_line_replays_against_its_reservation() {
    let trace = repository("traces/synthetic-workflow.spwt");
    let line = spillway(&["characterize", &trace, "--request", "--pipelines", "8"]);
    let line = line.trim_end();
    let asked: Targets = line.strip_prefix("#BB_LUA ").unwrap().parse().unwrap();
    let stdout = spillway(&[
        "sim",
        &trace,
        "--request",
        line,
        "--pool-servers",
        "16",
        "--pipelines",
        "8",
        "--json",
    ]);
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let from_json: Targets = serde_json::from_value(json["request"].clone()).unwrap();
    assert_eq!(from_json, asked, "the whole directive line is accepted");
    assert_eq!(json["pipelines"], 8);
    assert_eq!(json["pool"]["servers"], 16);
    assert_eq!(json["staged_in"], true);
    let by_targets = &json["by_targets"];
    let plan = &by_targets["plan"];
    let servers = plan["stripe_count"].as_u64().unwrap();
    assert!((1..=16).contains(&servers), "{plan}");
    assert_eq!(plan["servers"].as_array().unwrap().len() as u64, servers);
    assert!(plan["namespace"] == "striped" || plan["namespace"] == "private", "{plan}");
    assert!(!plan["why"].as_array().unwrap().is_empty());
    assert_eq!(plan["promised_per_server"].as_array().unwrap().len() as u64, servers);
    // The reservation at its servers' peaks: n × the Cori fragment's 6 GiB/s.
    let at_peaks = &by_targets["at_peaks"];
    let bandwidth = at_peaks["rates"]["bandwidth_bytes_per_s"].as_f64().unwrap();
    assert_eq!(bandwidth, servers as f64 * 6.0 * (1u64 << 30) as f64);
    assert!(at_peaks["io_time_seconds"].as_f64().unwrap() > 0.0);
    let checks = at_peaks["targets"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["target"].as_str().unwrap()).collect();
    let expected: Vec<&str> = [
        asked.bandwidth_bytes_per_s.map(|_| "bandwidth"),
        asked.iops.map(|_| "iops"),
        asked.metadata_ops_per_s.map(|_| "metadata"),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert_eq!(names, expected);
    for check in checks {
        assert!(check["met"].is_boolean(), "{check}");
        assert!(check["achieved"].as_f64().unwrap() > 0.0, "{check}");
    }
    assert!(by_targets["at_promise"].is_object(), "targets are promised");
    // The comparison: the same capacity by capacity alone, promised nothing.
    let capacity = &json["capacity_only"];
    assert_eq!(json["capacity_only_bytes"], asked.capacity_bytes.unwrap());
    assert!(capacity["plan"]["stripe_count"].as_u64().unwrap() <= servers);
    assert!(capacity["at_promise"].is_null());
    assert!(json["capacity_only_error"].is_null());
    let faster = at_peaks["io_time_seconds"].as_f64().unwrap()
        <= capacity["at_peaks"]["io_time_seconds"].as_f64().unwrap();
    assert!(faster, "more servers never make the I/O slower");
    // The table says the same in words.
    let table =
        spillway(&["sim", &trace, "--request", line, "--pool-servers", "16", "--pipelines", "8"]);
    for needle in ["by targets (", "capacity only (", "targets at peaks", "I/O time (s)", "why: "] {
        assert!(table.contains(needle), "{needle:?} missing from:\n{table}");
    }
}

#[test]
fn request_errors_name_the_flag_and_the_value() {
    let trace = repository("traces/synthetic-workflow.spwt");
    let unknown = failure(&[
        "sim",
        &trace,
        "--request",
        "#BB_LUA pool=fast bandwidth=1GiB/s",
        "--pool-servers",
        "4",
    ]);
    assert!(
        unknown.contains("--request") && unknown.contains("unknown key(s) \"pool\""),
        "{unknown}"
    );
    let no_pool = failure(&["sim", &trace, "--request", "bandwidth=1GiB/s"]);
    assert!(no_pool.contains("--pool-servers"), "{no_pool}");
    let never = failure(&["sim", &trace, "--request", "bandwidth=100GiB/s", "--pool-servers", "4"]);
    assert!(
        never.contains("targets cannot be met: never: bandwidth 100.0 GiB/s asked, at most 24.0 GiB/s from 4 server(s)"),
        "{never}"
    );
    let wait = failure(&[
        "sim",
        &trace,
        "--request",
        "bandwidth=10GiB/s",
        "--pool-servers",
        "4",
        "--promised",
        "bandwidth=5GiB/s",
        "--promised-servers",
        "3",
    ]);
    assert!(wait.contains("targets not available now: not now: bandwidth"), "{wait}");
}
