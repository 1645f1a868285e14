//! Draining committed epochs from the burst buffer to the parallel file system (PFS).
//!
//! BurstMem IV.A/IV.B: a committed epoch is written to a PFS directory in the background while
//! the application computes; only when every file is complete and fsync'd under its final name
//! is the epoch marked drained and its burst buffer space freed. Shared (N-1) files are written
//! with coordinated shuffling ([`plan`]): each server gathers a contiguous, stripe-aligned domain
//! from its peers and writes it sequentially, so no PFS stripe has two writers.
//!
//! Modules: [`plan`] (pure partitioning and metrics), [`pfs`] (the PFS behind a trait, with a
//! fault-injecting implementation and the write log), [`journal`] (crash-safe record of drain
//! requests), [`staging_key`] (the servers' secret behind staging names), [`drainer`] (the
//! asynchronous worker a server runs). Layout and guarantees:
//! docs/design/drain.md and docs/semantics.md ("Drain: when data reaches the PFS").

pub mod drainer;
pub mod journal;
pub mod namespace_names;
pub mod participants;
pub mod peer_ids;
pub mod pfs;
pub mod plan;
pub mod staging_key;
pub mod survivors;

pub use drainer::{
    yield_pause, DrainError, Drainer, DrainerOptions, IngestActivity, StartError,
    INGEST_IDLE_AFTER, YIELD_PAUSE_MAX,
};
pub use journal::{
    DrainMode, FaultyJournalFile, Journal, JournalError, JournalFaults, JournalFile,
};
pub use pfs::{
    Faults, FaultyPfs, IoBuffer, Pfs, PfsError, PfsFile, PfsOwner, PosixPfs, WriteLog,
    DIRECT_IO_ALIGN,
};
pub use plan::{chunk_writes, lock_switches, partition_domains, stripe_aligned_fraction, PfsWrite};
pub use staging_key::StagingKey;
