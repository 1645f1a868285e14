//! The planning tools a center runs before it buys or sizes a burst buffer: SSD wear under
//! stream placements (`ftl`), a trace-driven buffer simulation (`sim`) and a workflow's
//! characterization with allocation advice (`characterize`). Each parses its flags, calls
//! `spillway-ftl` or `spillway-sim`, and formats the result.

pub mod characterize;
pub mod ftl;
pub mod sim;
pub mod sim_ias;
pub mod sim_request;

/// Reads a trace for a planning tool. A partial trace (its producer's input was incomplete,
/// e.g. Darshan ran out of memory) is said on stderr whatever the output format, so no report
/// built on it goes out without the warning.
pub fn read_trace(path: &std::path::Path) -> anyhow::Result<spillway_trace::Trace> {
    use anyhow::Context;
    let trace = spillway_trace::Trace::read_path(path)
        .with_context(|| format!("reading trace {}", path.display()))?;
    if let Some(missing) = trace.meta.partial_warning() {
        eprintln!("warning: trace {} is partial: {missing}", path.display());
    }
    Ok(trace)
}
