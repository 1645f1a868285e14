//! The namespace (metadata) service of Spillway: POSIX directories, inodes and permissions for
//! files whose bytes live in the burst buffer store.
//!
//! [`namespace`] is the contract: the [`Namespace`] trait that the FUSE mount codes against, and
//! the value types it exchanges. Implementations: `LocalNamespace` (in this crate, the in-process
//! state machine plus its journal, run by the server that holds the namespace) and
//! `spillway_client::meta::RemoteNamespace` (the same trait over the wire).

pub mod clock;
pub mod journal;
pub mod local;
pub mod namespace;
pub mod permission;
pub mod state;

pub use clock::{Clock, ManualClock, SystemClock};
pub use local::{
    journal_path, Capacity, FixedCapacity, LocalNamespace, LocalOptions, NamespaceConfig,
    OpenError, StoreCapacity,
};
pub use namespace::{
    data_file_name, parse_data_file_name, Attr, Caller, DirEntry, FileKind, FsStat, Ino,
    ManifestEntry, MetaError, Namespace, NamespaceId, SetAttr, TimeSet, Timestamp, ACCESS_EXECUTE,
    ACCESS_READ, ACCESS_WRITE, NAME_BYTES_MAX, RENAME_EXCHANGE, RENAME_NOREPLACE, ROOT_INO,
    SYMLINK_TARGET_BYTES_MAX,
};
