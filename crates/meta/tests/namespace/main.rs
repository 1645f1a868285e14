//! Tests of `LocalNamespace` through the `Namespace` trait: POSIX cases one errno at a time
//! (`posix`), a seeded comparison with a path-based reference model (`model`), and journal
//! recovery (`recovery`), and journal faults (`faults`). One test binary so the crate links once.

mod faults;
mod model;
mod posix;
mod recovery;

use std::sync::Arc;

use spillway_meta::*;
use spillway_namespace::*;
use spillway_types::EpochId;

pub const GIB: u64 = 1 << 30;

pub fn config(id: NamespaceId) -> NamespaceConfig {
    NamespaceConfig { id, data_epoch: EpochId(77), root_uid: 0, root_gid: 0, root_mode: 0o777 }
}

pub fn options() -> LocalOptions {
    LocalOptions { check_invariants: true, ..LocalOptions::default() }
}

pub fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(1_700_000_000_000_000_000, 1_000))
}

pub fn capacity() -> Arc<FixedCapacity> {
    Arc::new(FixedCapacity(StoreCapacity {
        total_bytes: 8 * GIB,
        free_bytes: 3 * GIB,
        reservation_bytes: None,
    }))
}

/// An in-memory namespace whose root is mode 0o777 (so users can create in it).
pub fn namespace() -> LocalNamespace {
    LocalNamespace::in_memory(&config(1), clock(), capacity(), options())
}

pub fn root() -> Caller {
    Caller::root()
}

/// A user whose primary group equals its uid.
pub fn user(uid: u32) -> Caller {
    Caller::user(uid, uid)
}

/// The errno of a failed result; panics on success.
#[track_caller]
pub fn errno<T: std::fmt::Debug>(result: Result<T, MetaError>) -> i32 {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(error) => error.errno,
    }
}
