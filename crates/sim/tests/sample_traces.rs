//! The sample traces in traces/ — written by the Python converter (Darshan logs) and by the
//! Rust synthesizer — read, simulate and characterize. This is the Python → Rust half of the
//! cross-language compatibility check (python/tests/test_trace.py does Rust → Python).

use std::path::PathBuf;

use spillway_sim::characterize::{characterize, AllocationTarget, Peaks};
use spillway_sim::model::{simulate, sweep, time_ordered, SimConfig, WriteBack};
use spillway_sim::policy::PolicyKind;
use spillway_trace::{Op, Trace};

fn sample(name: &str) -> Trace {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces").join(name);
    Trace::read_path(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

#[test]
fn python_written_darshan_dxt_trace_reads_back_identically() {
    let trace = sample("darshan-dxt.spwt");
    // Data recorded by DXT, except the JVM's 39 STDIO reads, which come from counters.
    assert!(trace.meta.synthesized && !trace.meta.partial());
    assert!(trace.meta.source.starts_with("darshan-dxt"));
    assert_eq!(trace.meta.uid, 8699);
    assert_eq!(trace.meta.job_id, 1537455);
    assert!(trace.ops.iter().any(|op| op.op == Op::Read));
    // Re-encoding in Rust reproduces the Python bytes exactly.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces/darshan-dxt.spwt");
    let original = std::fs::read(path).unwrap();
    assert_eq!(trace.write_to(Vec::new()).unwrap(), original);
}

#[test]
fn every_sample_simulates_and_characterizes() {
    for name in ["darshan-dxt.spwt", "darshan-ior-hdf5.spwt", "synthetic-workflow.spwt"] {
        let trace = sample(name);
        let ops = time_ordered(&trace.ops);
        let base = SimConfig::reedbush(1 << 20);
        let (space, points) =
            sweep(&ops, &base, &[PolicyKind::Lru, PolicyKind::Lfu], &[0.1, 0.5, 1.0]).unwrap();
        assert!(space.chunks > 0, "{name}");
        for point in &points {
            assert!(
                point.relative_throughput > 0.0 && point.relative_throughput <= 1.0 + 1e-12,
                "{name}"
            );
        }
        let sync = SimConfig { write_back: WriteBack::Sync, capacity_bytes: space.bytes, ..base };
        let report = simulate(&ops, &sync).unwrap();
        assert_eq!(report.ops, trace.ops.len() as u64);
        let result =
            characterize(&trace, &Peaks::datawarp_cori(), AllocationTarget::default()).unwrap();
        assert_eq!(
            result.profile.read_ops + result.profile.write_ops + result.profile.metadata_ops,
            trace.ops.len() as u64
        );
    }
}

#[test]
fn datawarp_profile_fixtures_give_table2_pipelines() {
    use spillway_sim::characterize::Profile;
    let expected = [
        ("datawarp-swarp-resample.json", 5, 19),
        ("datawarp-swarp-coadd.json", 5, 21),
        ("datawarp-camp-builddb.json", 10, 3),
        ("datawarp-camp-reproject.json", 30, 4),
    ];
    for (name, data, metadata) in expected {
        let path =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces/profiles").join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let profile: Profile = serde_json::from_value(value["profile"].clone()).unwrap();
        let metrics = profile.metrics(&Peaks::datawarp_cori());
        assert_eq!(metrics.pipelines_to_saturate_data, Some(data), "{name}");
        assert_eq!(metrics.pipelines_to_saturate_metadata, Some(metadata), "{name}");
    }
}
