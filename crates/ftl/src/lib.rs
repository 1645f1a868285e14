//! Page-mapped FTL simulator with multi-stream placement (SSD write amplification).
//!
//! Multi-stream and FDP SSDs are not available here, so Spillway carries a simulator a center can
//! use to decide how to map burst buffer data to streams (issue 7, after Koo et al., "An empirical
//! study of I/O separation for burst buffers in HPC systems", BIOS).
//!
//! Layers, bottom up:
//! - [`ssd`]: one SSD — page-mapped FTL, streams with their own open blocks, GC with greedy /
//!   FIFO / cost-benefit victims, GC reserve, TRIM, wear and a NAND time model.
//! - [`volume`]: several SSDs behind striping and a file system model: logical chunk
//!   allocation (stack / first-fit / next-fit) and TRIM on delete or not.
//! - [`mapping`]: stream mappings (legacy, user-ID and per-job via BIOS Algorithm 1 from
//!   `spillway-policy`, lifetime-aware grouping).
//! - workloads: [`synthetic`] (uniform, hot/cold), [`bios`] (BIOS synthetic burst buffer),
//!   [`replay`] (the store's SSD write log); [`workload`] describes them (TOML file and flags). A Darshan-derived trace workload is not built yet:
//!   it needs the trace format of the trace issue; it would plug in like [`replay`], turning
//!   per-job writes and job ends into write/delete events.
//! - [`device`]: the queued device service model (per-die queues, foreground GC blocking),
//!   the alternative to the fluid time model of [`ssd::NandTiming`].
//! - [`report`], [`experiment`] (the BIOS experiment), [`analytic`] (closed forms),
//!   [`knobs`] (the `ftl` knob section).

pub mod analytic;
pub mod bios;
pub mod device;
pub mod experiment;
pub mod knobs;
pub mod mapping;
pub mod replay;
pub mod report;
pub mod ssd;
pub mod synthetic;
pub mod volume;
pub mod workload;

pub use knobs::FtlKnobs;
pub use mapping::Mapping;
pub use report::RunReport;
pub use ssd::{GcPlacement, NandTiming, Ssd, SsdConfig, SsdCounters, VictimPolicy};
