//! The namespace (metadata) service that a burst buffer server runs: POSIX directories, inodes
//! and permissions for files whose bytes live in the store, as a state machine with a journal.
//!
//! The contract — the `Namespace` trait that the FUSE mount codes against, and the value types
//! it exchanges — is `spillway-namespace`, a crate without I/O. Implementations:
//! [`LocalNamespace`] (here: the in-process state machine plus its journal, run by the server
//! that holds the namespace) and `spillway_client::meta::RemoteNamespace` (the same trait over
//! the wire).

pub mod clock;
pub mod journal;
pub mod local;
pub mod permission;
pub mod state;

pub use clock::{Clock, ManualClock, SystemClock};
pub use local::{
    journal_path, Capacity, FixedCapacity, LocalNamespace, LocalOptions, NamespaceConfig,
    OpenError, StoreCapacity,
};
