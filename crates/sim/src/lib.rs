//! Planning tools for burst buffers over the Spillway trace format (the leaf crate
//! `spillway-trace`): a trace-driven two-level simulator (Xu/Sato), synthetic workflow traces,
//! and workflow characterization with allocation advice (Daley et al., DataWarp).
//!
//! Why one crate: all three read traces and have no I/O beyond reading and writing them,
//! so the CLI (`spillway sim`, `spillway characterize`) stays a thin layer of flags and output
//! formatting. Eviction policies are pure code in [`policy`] so a daemon can share them.

pub mod characterize;
pub mod ias;
pub mod model;
pub mod policy;
pub mod report;
pub mod reservation;
pub mod synth;

pub use characterize::{characterize, AllocationTarget, Bound, Characterization, Peaks, Profile};
pub use ias::{
    compare_strategies, simulate_strategy, synthetic_jobs, trace_job, IasConfig, IasError,
    IasReport, JobSpec, StrategyReport, SyntheticWorkload,
};
pub use model::{
    access_space, simulate, sweep, Level, SimConfig, SimReport, SweepPoint, WriteBack,
};
pub use policy::{EvictionPolicy, PolicyKind};
pub use reservation::{parse_request, replay_request, Pool, ReplayOptions, RequestReplay};
