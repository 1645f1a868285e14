//! Client tracing end to end: a real `spillway serve` pair on loopback, a client with tracing
//! on writes a small two-file checkpoint, commits, reads it back, lists, deletes the epoch and drops; the trace it left
//! must list exactly those operations (names, offsets, lengths) and `spillway sim` must run on it.

use std::path::Path;
use std::process::Command;

use spillway_client::{traced_epoch_name, traced_file_name, Client, ClientOptions, Placement};
use spillway_harness::{pattern, ServerProcess};
use spillway_proto::Durability;
use spillway_trace::{Op, Trace};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

/// (file name, offset, length) of every write, in order.
const WRITES: [(&str, u64, usize); 5] = [
    ("ckpt/rank0", 0, 100_000),
    ("ckpt/rank0", 100_000, 150_000),
    ("ckpt/rank1", 0, 70_000),
    ("ckpt/rank0", 250_000, 1_000),
    ("ckpt/rank1", 70_000, 300_000),
];

#[test]
fn client_trace_records_a_checkpoint_and_sim_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let servers: Vec<ServerProcess> =
        (0..2).map(|i| ServerProcess::builder(BIN, dir.path(), &format!("s{i}")).start()).collect();
    let endpoints: Vec<_> = servers.iter().map(|s| s.endpoint().clone()).collect();
    let trace_path = dir.path().join("client.sptrace");
    let epoch = EpochId(7);
    let placement = Placement::Striped { stripe_unit_bytes: 64 * 1024, stripe_count: 2 };
    {
        let options = ClientOptions {
            placement,
            durability: Durability::Ssd,
            trace_path: Some(trace_path.clone()),
            trace_rank: 3,
            ..Default::default()
        };
        let mut client = Client::connect(&endpoints, options).unwrap();
        assert!(client.tracing());
        client.begin_epoch(epoch);
        let mut a = client.create_file(epoch, "ckpt/rank0").unwrap();
        let mut b = client.create_file(epoch, "ckpt/rank1").unwrap();
        for (seed, &(name, offset, length)) in WRITES.iter().enumerate() {
            let file = if name == "ckpt/rank0" { &mut a } else { &mut b };
            client.write(file, offset, &pattern(seed as u64, length)).unwrap();
        }
        client.commit_epoch(epoch).unwrap();
        let back_a = client.open_file(epoch, "ckpt/rank0").unwrap();
        let mut buffer = vec![0u8; 150_000];
        client.read(&back_a, 100_000, &mut buffer).unwrap();
        assert_eq!(buffer, pattern(1, 150_000));
        let files = client.list_files(epoch).unwrap();
        assert_eq!(files.len(), 2);
        client.delete_epoch(epoch).unwrap();
    } // drop: the trace's end record is written

    let trace = Trace::read_path(&trace_path).unwrap();
    assert_eq!(trace.meta.source, "spillway-client");
    assert_eq!(trace.meta.nprocs, 1);
    assert!(!trace.meta.synthesized);
    assert_eq!(trace.meta.uid, spillway_sys::user::uid());
    let got: Vec<(Op, String, u64, u64)> = trace
        .ops
        .iter()
        .map(|op| {
            assert_eq!(op.rank, 3);
            (op.op, trace.files[op.file as usize].clone(), op.offset, op.length)
        })
        .collect();
    let f = |name: &str| traced_file_name(epoch, name);
    let mut expected =
        vec![(Op::Create, f("ckpt/rank0"), 0, 0), (Op::Create, f("ckpt/rank1"), 0, 0)];
    expected.extend(
        WRITES.iter().map(|&(name, offset, length)| (Op::Write, f(name), offset, length as u64)),
    );
    expected.push((Op::Fsync, traced_epoch_name(epoch), 0, 0));
    expected.push((Op::Open, f("ckpt/rank0"), 0, 0));
    expected.push((Op::Read, f("ckpt/rank0"), 100_000, 150_000));
    expected.push((Op::Readdir, traced_epoch_name(epoch), 0, 0));
    expected.push((Op::Unlink, f("ckpt/rank0"), 0, 0));
    expected.push((Op::Unlink, f("ckpt/rank1"), 0, 0));
    assert_eq!(got, expected);
    // Times are since connect and in call order.
    assert!(trace.ops.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));

    run_sim(&trace_path);
}

fn run_sim(trace_path: &Path) {
    let output = Command::new(BIN).arg("sim").arg(trace_path).arg("--json").output().unwrap();
    assert!(
        output.status.success(),
        "spillway sim failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(report.get("ops_per_second").is_some(), "no ops_per_second in {report}");
}
