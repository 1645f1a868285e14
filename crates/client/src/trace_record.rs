//! Client-side I/O tracing: records one Spillway trace operation per client call
//! (docs/design/trace.md, "Recorded by the client") so a real job's I/O can be fed to
//! `spillway sim` and `spillway characterize`.
//!
//! Why here and streaming: the client sees every call of the application with its true
//! offsets and lengths, and a trace of a long job can be large, so operations go straight to a
//! buffered file (bounded memory: the writer's 64 KiB buffer plus the interned file names).
//! Tracing must never fail the I/O it observes: the first tracing error is logged once to stderr
//! and tracing stops.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use spillway_trace::{JobMeta, Op, TraceOp, TraceWriter};

/// Environment variable that switches tracing on when `ClientOptions::trace_path` is `None`.
pub const TRACE_ENV: &str = "SPILLWAY_TRACE";

/// A trace being recorded; `None` writer once stopped (error or finished).
pub(crate) struct Tracer {
    writer: Option<TraceWriter<BufWriter<File>>>,
    path: PathBuf,
    connected: Instant,
    rank: u32,
}

impl Tracer {
    /// Starts a trace at `path`, replacing an existing file unless `exclusive` (then an existing
    /// file is an error: several clients started from one `SPILLWAY_TRACE` must never clobber
    /// each other's trace). An error here is reported once and tracing stays off.
    pub(crate) fn start(path: &Path, rank: u32, exclusive: bool) -> Option<Tracer> {
        let connected = Instant::now();
        let start_unix_us =
            SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
        let meta = JobMeta {
            uid: spillway_sys::user::uid(),
            nprocs: 1,
            job_id: std::env::var("SLURM_JOB_ID")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0),
            start_unix_us,
            // Unknown when the header is written; the trace is streamed, never rewritten.
            end_unix_us: 0,
            synthesized: false,
            source: "spillway-client".into(),
            executable: std::env::args().next().unwrap_or_default(),
        };
        let mut open = std::fs::OpenOptions::new();
        open.write(true);
        if exclusive {
            open.create_new(true);
        } else {
            open.create(true).truncate(true);
        }
        let opened = open
            .open(path)
            .map_err(|e| e.to_string())
            .and_then(|f| TraceWriter::new(BufWriter::new(f), &meta).map_err(|e| e.to_string()));
        match opened {
            Ok(writer) => {
                Some(Tracer { writer: Some(writer), path: path.to_path_buf(), connected, rank })
            }
            Err(e) => {
                eprintln!("spillway-client: tracing to {} disabled: {e}", path.display());
                None
            }
        }
    }

    /// Records one operation that started at `started` and ends now.
    pub(crate) fn record(
        &mut self,
        op: Op,
        name: &str,
        offset: u64,
        length: u64,
        started: Instant,
    ) {
        let Some(writer) = self.writer.as_mut() else { return };
        let time_ns = started.saturating_duration_since(self.connected).as_nanos() as u64;
        let duration_ns = started.elapsed().as_nanos() as u64;
        let result = writer.file_id(name).and_then(|file| {
            writer.write_op(&TraceOp {
                time_ns,
                duration_ns,
                offset,
                length,
                rank: self.rank,
                file,
                op,
            })
        });
        if let Err(e) = result {
            eprintln!("spillway-client: tracing to {} stopped: {e}", self.path.display());
            self.writer = None;
        }
    }

    /// Writes the end record; called on client drop.
    pub(crate) fn finish(&mut self) {
        if let Some(writer) = self.writer.take() {
            if let Err(e) = writer.finish() {
                eprintln!("spillway-client: finishing trace {} failed: {e}", self.path.display());
            }
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The trace path named by `SPILLWAY_TRACE`, with `%p` replaced by the process id and `%r` by
/// the rank (so every process and rank of a job can share one setting); `None` when unset or
/// empty.
pub(crate) fn path_from_env(rank: u32) -> Option<PathBuf> {
    let value = std::env::var_os(TRACE_ENV).filter(|v| !v.is_empty())?;
    let text = value.to_string_lossy();
    if !text.contains('%') {
        return Some(PathBuf::from(value));
    }
    Some(PathBuf::from(
        text.replace("%p", &std::process::id().to_string()).replace("%r", &rank.to_string()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_trace::Trace;

    #[test]
    fn records_stream_and_exclusive_refuses_existing_file() {
        let dir =
            std::env::temp_dir().join(format!("spillway-client-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.sptrace");
        let _ = std::fs::remove_file(&path);
        let mut tracer = Tracer::start(&path, 2, true).expect("new file");
        let started = Instant::now();
        tracer.record(Op::Write, "epoch-1/a", 10, 20, started);
        tracer.record(Op::Read, "epoch-1/a", 0, 30, started);
        drop(tracer);
        let trace = Trace::read_path(&path).unwrap();
        assert_eq!(trace.files, vec!["epoch-1/a".to_string()]);
        let ops: Vec<_> = trace.ops.iter().map(|o| (o.op, o.offset, o.length, o.rank)).collect();
        assert_eq!(ops, vec![(Op::Write, 10, 20, 2), (Op::Read, 0, 30, 2)]);
        // Exclusive start on an existing file: tracing stays off, the old trace is intact.
        assert!(Tracer::start(&path, 0, true).is_none());
        assert_eq!(Trace::read_path(&path).unwrap().ops.len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
