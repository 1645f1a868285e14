//! The namespace under journal faults injected behind its `JournalIo` seam: ENOSPC is ENOSPC to
//! the caller with nothing half-applied and the namespace still working; EIO and a failed
//! fsync are sticky (the namespace refuses changes); the journal always recovers.

use std::path::Path;
use std::sync::Arc;

use spillway_meta::journal::{FaultyJournalIo, JournalFault, JournalFaultOp};
use spillway_meta::*;
use spillway_namespace::*;

use crate::recovery::tree;
use crate::{capacity, clock, config, errno, options, root};

fn open(dir: &Path, io: &Arc<FaultyJournalIo>) -> LocalNamespace {
    let options = LocalOptions { journal_io: io.clone(), ..options() };
    LocalNamespace::open(dir, &config(9), true, clock(), capacity(), options).unwrap().0
}

fn fault(op: JournalFaultOp, errno: i32, written_bytes: u64) -> JournalFault {
    JournalFault { op, skip: 0, errno, written_bytes }
}

fn journal_file_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        total += entry.unwrap().metadata().unwrap().len();
    }
    total
}

#[test]
fn enospc_on_an_append_is_enospc_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let io = FaultyJournalIo::new();
    let ns = open(dir.path(), &io);
    ns.mkdir(&root(), ROOT_INO, b"before", 0o755, 0).unwrap();
    let tree_before = tree(&ns);
    let bytes_before = ns.journal_bytes();
    // The append lands 7 bytes of its record, then the file system is full.
    io.inject(fault(JournalFaultOp::Write, libc::ENOSPC, 7));
    assert_eq!(errno(ns.mkdir(&root(), ROOT_INO, b"refused", 0o755, 0)), libc::ENOSPC);
    assert_eq!(io.pending(), 0);
    // Nothing half-applied: same tree, same journal, and the torn bytes are cut from the file.
    assert_eq!(tree(&ns), tree_before);
    assert_eq!(ns.journal_bytes(), bytes_before);
    assert_eq!(journal_file_bytes(dir.path()), bytes_before);
    // Not sticky: the next operation works.
    ns.mkdir(&root(), ROOT_INO, b"after", 0o755, 0).unwrap();
    ns.sync().unwrap();
    let tree_after = tree(&ns);
    drop(ns);
    let ns = open(dir.path(), &io);
    assert_eq!(tree(&ns), tree_after);
    assert!(ns.lookup(&root(), ROOT_INO, b"refused").is_err());
}

#[test]
fn an_io_error_on_an_append_is_sticky_and_the_journal_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let io = FaultyJournalIo::new();
    let ns = open(dir.path(), &io);
    ns.mkdir(&root(), ROOT_INO, b"kept", 0o755, 0).unwrap();
    ns.sync().unwrap();
    let kept = tree(&ns);
    io.inject(fault(JournalFaultOp::Write, libc::EIO, 5));
    assert_eq!(errno(ns.mkdir(&root(), ROOT_INO, b"lost", 0o755, 0)), libc::EIO);
    assert_eq!(errno(ns.mkdir(&root(), ROOT_INO, b"later", 0o755, 0)), libc::EIO);
    assert_eq!(errno(ns.sync()), libc::EIO);
    drop(ns);
    let ns = open(dir.path(), &io);
    assert_eq!(tree(&ns), kept);
}

#[test]
fn a_failed_fsync_is_sticky_never_retried_as_success() {
    let dir = tempfile::tempdir().unwrap();
    let io = FaultyJournalIo::new();
    let ns = open(dir.path(), &io);
    ns.mkdir(&root(), ROOT_INO, b"a", 0o755, 0).unwrap();
    // Even ENOSPC from fdatasync is an I/O error: the kernel may have dropped the pages.
    io.inject(fault(JournalFaultOp::Sync, libc::ENOSPC, 0));
    assert_eq!(errno(ns.sync()), libc::EIO);
    assert_eq!(errno(ns.sync()), libc::EIO);
    assert_eq!(errno(ns.mkdir(&root(), ROOT_INO, b"b", 0o755, 0)), libc::EIO);
}

#[test]
fn enospc_while_compacting_keeps_the_journal_and_the_namespace_working() {
    let dir = tempfile::tempdir().unwrap();
    let io = FaultyJournalIo::new();
    let ns = open(dir.path(), &io);
    for i in 0..20u32 {
        ns.mkdir(&root(), ROOT_INO, format!("d{i}").as_bytes(), 0o755, 0).unwrap();
    }
    let before = tree(&ns);
    io.inject(fault(JournalFaultOp::Write, libc::ENOSPC, 100));
    assert_eq!(errno(ns.compact()), libc::ENOSPC);
    // The half-written snapshot is gone; only the journal is left.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    ns.mkdir(&root(), ROOT_INO, b"after", 0o755, 0).unwrap();
    ns.compact().unwrap();
    ns.sync().unwrap();
    let after = tree(&ns);
    assert_eq!(after.len(), before.len() + 1);
    drop(ns);
    let ns = open(dir.path(), &io);
    assert_eq!(tree(&ns), after);
}
