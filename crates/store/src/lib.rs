//! Log-structured DRAM+SSD store: segments, stacked ordered index, epoch GC, recovery.
//!
//! One store per burst buffer server (BurstMem's BStore). Writes are appended to a bounded DRAM
//! ring; above a high watermark a background flusher appends the oldest records to per-stream
//! segment files on the SSD (one stream never shares a segment with another; each segment gets
//! the stream's write-lifetime hint). A stacked ordered index (epoch → file → offset → extent)
//! answers epoch, epoch-range, file and byte-range queries. `commit` makes an epoch durable with
//! group commit; drained or deleted epochs turn dead, whole dead segments are deleted and a
//! cost-benefit compactor cleans the emptiest ones when space runs low. Recovery verifies every
//! CRC, cuts torn tails and refuses corruption. The byte format is in docs/design/log-format.md,
//! the guarantees in docs/semantics.md ("Store: write, commit, restart").
//!
//! ```no_run
//! use spillway_config::StoreKnobs;
//! use spillway_store::{Durability, Store};
//! use spillway_types::{EpochId, FileId, StreamKey};
//!
//! let knobs = StoreKnobs { ssd_directory: "/var/tmp/spillway-ssd".into(), ..StoreKnobs::default() };
//! let store = Store::open(&knobs)?;
//! let (stream, epoch, file) = (StreamKey(1), EpochId(7), FileId(1));
//! store.name_file(epoch, file, "ckpt/rank0.dat")?;
//! store.write(stream, epoch, file, 0, b"checkpoint bytes")?;
//! store.commit(epoch, Durability::Ssd)?; // durable in the SSD log when this returns
//! let mut back = vec![0u8; 16];
//! store.read(epoch, file, 0, &mut back)?;
//! store.mark_drained(epoch)?; // after the drain put it on the PFS: its bytes are now dead
//! store.close()?;
//! # Ok::<(), spillway_store::Error>(())
//! ```

mod arena;
mod commit;
mod direct;
mod error;
mod flusher;
pub mod format;
mod gc;
mod grant;
pub mod index;
mod participants;
mod recovery;
mod slot;
pub mod storage;
mod store;
mod sync_behind;
mod write_log;

pub use error::{
    CommitError, EpochPhase, Error, GrantError, LifecycleError, OpenError, ParticipantsError,
    ReadError, RevokeError, SpaceLimit, SyncError, WriteError,
};
pub use flusher::FlusherMode;
pub use format::META_STREAM;
pub use grant::{EpochGrant, GrantMode, GrantOutcome};
pub use participants::EpochParticipant;
pub use slot::WriteSlot;
pub use storage::{CrashPlan, PosixStorage, SegmentFile, SimStorage, Storage};
pub use store::RESERVE_FILE_NAME;
pub use store::{
    write_hint_for, Durability, EpochInfo, ExtentInfo, FileInfo, GcReport, RecoveryReport, Store,
    StoreStats, Tier, WriteHints,
};
pub use write_log::WRITE_LOG_HEADER;
