//! `spillway characterize --request`: the `#BB_LUA` line a job should use, on the sample traces
//! and the DataWarp paper's profiles, read back by the targets' own parser.

use std::path::PathBuf;
use std::process::Command;

use spillway_policy::targets::Targets;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

fn repository(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

fn spillway(args: &[&str]) -> String {
    let output = Command::new(BIN).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "spillway {args:?}: {}; stderr: {stderr}", output.status);
    String::from_utf8(output.stdout).unwrap()
}

/// The targets of a `#BB_LUA` line, which must be the whole output.
fn directive_targets(stdout: &str) -> Targets {
    let line = stdout.strip_suffix('\n').unwrap_or(stdout);
    assert!(!line.contains('\n'), "one line expected: {stdout:?}");
    let targets =
        line.strip_prefix("#BB_LUA ").unwrap_or_else(|| panic!("not a directive: {line:?}"));
    targets.parse().unwrap_or_else(|error| panic!("{line:?} does not parse back: {error}"))
}

#[test]
fn sample_traces_give_a_directive_that_parses_back_and_matches_the_json() {
    for name in [
        "traces/synthetic-workflow.spwt",
        "traces/darshan-dxt.spwt",
        "traces/darshan-ior-hdf5.spwt",
    ] {
        let trace = repository(name);
        let trace = trace.to_str().unwrap();
        let targets = directive_targets(&spillway(&["characterize", trace, "--request"]));
        assert!(targets.has_rates(), "{name}: {targets}");
        let json: serde_json::Value =
            serde_json::from_str(&spillway(&["characterize", trace, "--request", "--json"]))
                .unwrap();
        assert_eq!(json["request"]["directive"], format!("#BB_LUA {targets}"), "{name}");
        let from_json: Targets =
            serde_json::from_value(json["request"]["targets"].clone()).unwrap();
        assert_eq!(from_json, targets, "{name}");
        assert!(json["metrics"].is_object(), "{name}: the characterization is still there");
        // Twice the pipelines never ask for less.
        let doubled =
            directive_targets(&spillway(&["characterize", trace, "--request", "--pipelines", "2"]));
        for (one, two) in [
            (targets.bandwidth_bytes_per_s, doubled.bandwidth_bytes_per_s),
            (targets.iops, doubled.iops),
            (targets.metadata_ops_per_s, doubled.metadata_ops_per_s),
            (targets.capacity_bytes, doubled.capacity_bytes),
        ] {
            assert!(two >= one, "{name}: {targets} then {doubled}");
        }
    }
}

#[test]
fn camp_builddb_at_64_pipelines_asks_for_metadata() {
    let profile = repository("traces/profiles/datawarp-camp-builddb.json");
    let stdout = spillway(&[
        "characterize",
        "--profile",
        profile.to_str().unwrap(),
        "--pipelines",
        "64",
        "--request",
    ]);
    assert_eq!(stdout, "#BB_LUA capacity=4800MiB bandwidth=2100MiB/s iops=610k metadata=600k/s\n");
}
