//! The Darshan sample traces in traces/, written by the Python converter, read back and
//! re-encode to the same bytes: the Python → Rust half of the byte-compatibility check, kept
//! here as well as in spillway-sim so the trace crate checks its own format.

use std::path::PathBuf;

use spillway_trace::{Op, Trace, FLAG_PARTIAL, FLAG_SYNTHESIZED};

fn sample_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces").join(name)
}

#[test]
fn python_written_darshan_traces_re_encode_byte_for_byte() {
    for name in ["darshan-dxt.spwt", "darshan-ior-hdf5.spwt"] {
        let path = sample_path(name);
        let original = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let trace = Trace::read_from(&original[..]).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(trace.write_to(Vec::new()).unwrap(), original, "{name}");
        // POSIX data recorded by DXT; dxt.darshan's STDIO data (the JVM reading jvm.cfg) is
        // synthesized from counters, IOR's <STDOUT> left out; nothing missing.
        let synthesized = name == "darshan-dxt.spwt";
        let label = if synthesized { "darshan-dxt+counters" } else { "darshan-dxt" };
        assert!(trace.meta.source.starts_with(&format!("{label} (POSIX + STDIO; ")), "{name}");
        assert_eq!(trace.meta.synthesized, synthesized, "{name}");
        assert!(!trace.meta.partial(), "{name}");
        let flags = u16::from_le_bytes([original[10], original[11]]);
        let expected = if synthesized { FLAG_SYNTHESIZED } else { 0 };
        assert_eq!(flags, expected, "{name}: no {FLAG_PARTIAL:#x} bit");
        assert!(trace.ops.iter().any(|op| op.op == Op::Read), "{name}");
    }
}
