//! Pure placement and scheduling decisions shared by the daemons and the simulators.
//!
//! Every decision here is a function `(state snapshot, event) -> decision` with no I/O, no clock
//! and no randomness: the caller passes "now" in and applies the decision it gets back. That is
//! what lets the manager, the store and the FTL simulator (`spillway-ftl`) make the *same*
//! decisions, and lets tests check them against the algorithms of the BIOS paper line by line.
//!
//! - [`stream`]: BIOS Algorithm 1, key (user or job) → SSD stream id with a per-device limit,
//!   least-used sharing when streams run out, and periodic reclaim of idle keys.
//! - [`pool`]: BIOS Algorithm 2, stream-aware choice of a burst buffer pool for a new job.
//! - [`fragments`]: a reservation's capacity → fixed-size fragments → the servers it stripes
//!   over (DataWarp's fragments), respecting free space and health.
//! - [`targets`]: performance targets (bandwidth, IOPS, metadata ops/s, capacity) → servers,
//!   stripe count, namespace mode and fragments, from each server's peaks minus what is already
//!   promised on it; wait when promises are full, never when beyond the pool's peaks.
//! - [`namespace`]: which server holds a mount's namespace (striped: the first; private:
//!   `hash(node) % servers`) and the namespace id a node uses.
//! - [`replicas`]: the servers that hold the k replicas of a piece: the primary, then the next
//!   servers in ring order on failure domains (hosts) not yet in the set.
//! - [`tiering`]: IAS, the tier (node-local, burst buffer, PFS) an I/O phase writes to per
//!   strategy (Algorithm 1 among them), and which drains of all reservations may use the PFS now.
//! - [`lifetime`]: lifetime-aware grouping (the improvement BIOS 7.2 proposes): keys whose data
//!   is expected to die at similar times share a stream.

pub mod fragments;
pub mod lifetime;
pub mod namespace;
pub mod pool;
pub mod replicas;
pub mod stream;
pub mod targets;
pub mod tiering;

pub use lifetime::{lifetime_stream, LifetimeEstimate};
pub use pool::{select_pool, PoolChoice, PoolState};
pub use replicas::{replica_set, ReplicaError, REPLICAS_MAX};
pub use stream::{StreamDecision, StreamTable, StreamTableLimits};
pub use tiering::{choose_tier, next_drains, Strategy, Tier, TierChoice, TierLoad, TierSnapshot};
