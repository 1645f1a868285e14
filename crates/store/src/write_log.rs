//! The SSD write log: one text line per segment append or deletion, for the FTL simulator
//! (knob `store.ssd_write_log_path`; format in docs/design/log-format.md).
//!
//! Best effort by design: it observes the store, it is not part of it, so a failure to write it
//! is reported once (tracing) and then the log is switched off rather than failing user I/O.

use parking_lot::Mutex;
use spillway_types::{SegmentId, StreamKey};
use std::io::Write;

pub const WRITE_LOG_HEADER: &str = "# spillway ssd write log v1";

pub struct WriteLog {
    out: Mutex<Option<std::io::BufWriter<std::fs::File>>>,
}

impl WriteLog {
    /// Opens (appending) the log at `path`; an empty path switches it off.
    pub fn open(path: &str) -> std::io::Result<WriteLog> {
        if path.is_empty() {
            return Ok(WriteLog { out: Mutex::new(None) });
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        let fresh = file.metadata()?.len() == 0;
        let mut out = std::io::BufWriter::new(file);
        if fresh {
            writeln!(out, "{WRITE_LOG_HEADER}")?;
        }
        Ok(WriteLog { out: Mutex::new(Some(out)) })
    }

    pub fn write(
        &self,
        stream: StreamKey,
        segment: SegmentId,
        offset_bytes: u64,
        length_bytes: u64,
    ) {
        self.line(format_args!(
            "write {} {} {} {}",
            stream.0, segment.0, offset_bytes, length_bytes
        ));
    }

    pub fn delete(&self, segment: SegmentId, length_bytes: u64) {
        self.line(format_args!("delete {} {}", segment.0, length_bytes));
    }

    /// Pushes buffered lines to the file (called at sync points and on close).
    pub fn flush(&self) {
        let mut out = self.out.lock();
        if let Some(writer) = out.as_mut() {
            if let Err(error) = writer.flush() {
                tracing::warn!(%error, "ssd write log failed; switching it off");
                *out = None;
            }
        }
    }

    fn line(&self, line: std::fmt::Arguments<'_>) {
        let mut out = self.out.lock();
        if let Some(writer) = out.as_mut() {
            if let Err(error) = writeln!(writer, "{line}") {
                tracing::warn!(%error, "ssd write log failed; switching it off");
                *out = None;
            }
        }
    }
}

impl Drop for WriteLog {
    fn drop(&mut self) {
        self.flush();
    }
}
