//! The journal: a namespace survives reopening, a torn tail is cut, compaction keeps the tree
//! and never lets inode numbers be reused, damaged headers are refused.

use std::io::Write;
use std::path::Path;

use spillway_meta::*;
use spillway_namespace::*;

use crate::{capacity, clock, config, options, root, user};

fn open(
    dir: &Path,
    create: bool,
) -> Result<(LocalNamespace, bool, spillway_meta::journal::Recovery), OpenError> {
    LocalNamespace::open(dir, &config(9), create, clock(), capacity(), options())
}

/// Every path with its attributes (minus atime), in a canonical order.
pub fn tree(ns: &dyn Namespace) -> Vec<(String, Attr, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let mut cookie = 0;
        loop {
            let page = ns.readdir(&Caller::root(), dir, cookie, 50).unwrap();
            let Some(last) = page.last() else { break };
            cookie = last.cookie;
            for entry in page {
                if entry.name == b"." || entry.name == b".." {
                    continue;
                }
                let path = format!("{prefix}/{}", String::from_utf8_lossy(&entry.name));
                let attr = ns.getattr(entry.ino).unwrap();
                let target = if attr.kind == FileKind::Symlink {
                    ns.readlink(entry.ino).unwrap()
                } else {
                    Vec::new()
                };
                if attr.kind == FileKind::Directory {
                    stack.push((entry.ino, path.clone()));
                }
                out.push((path, attr, target));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn populate(ns: &LocalNamespace) {
    let d = ns.mkdir(&root(), ROOT_INO, b"dir", 0o755, 0).unwrap();
    let f = ns.create(&user(5), ROOT_INO, b"file", FileKind::Regular, 0o644, 0, 0, true).unwrap();
    ns.wrote(&user(5), f.ino, 12345).unwrap();
    ns.link(&root(), f.ino, d.ino, b"hard").unwrap();
    ns.symlink(&root(), d.ino, b"sym", b"../file").unwrap();
    ns.create(&root(), d.ino, b"fifo", FileKind::Fifo, 0o600, 0, 0, true).unwrap();
    let sub = ns.mkdir(&root(), d.ino, b"sub", 0o700, 0).unwrap();
    ns.rename(&root(), d.ino, b"sub", ROOT_INO, b"moved", 0).unwrap();
    ns.setattr(
        &root(),
        sub.ino,
        &SetAttr { uid: Some(7), mode: Some(0o1777), ..SetAttr::default() },
    )
    .unwrap();
    ns.create(&root(), ROOT_INO, b"gone", FileKind::Regular, 0o644, 0, 0, true).unwrap();
    ns.unlink(&root(), ROOT_INO, b"gone").unwrap();
}

#[test]
fn a_namespace_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(open(dir.path(), false), Err(OpenError::NotFound { .. })));
    let (ns, created, _) = open(dir.path(), true).unwrap();
    assert!(created);
    populate(&ns);
    let before = tree(&ns);
    assert_eq!(before.len(), 6);
    ns.sync().unwrap();
    drop(ns);
    let (again, created, recovery) = open(dir.path(), true).unwrap();
    assert!(!created);
    assert_eq!(recovery.torn_bytes_cut, 0);
    assert_eq!(tree(&again), before);
    assert_eq!(again.data_epoch(), spillway_types::EpochId(77));
    again.check_invariants().unwrap();
}

#[test]
fn unsynced_operations_survive_a_process_crash() {
    // Every operation is written to the file before it returns, so dropping the namespace
    // without sync (what SIGKILL does to the process) loses nothing; sync is for power loss.
    let dir = tempfile::tempdir().unwrap();
    let (ns, _, _) = open(dir.path(), true).unwrap();
    populate(&ns);
    let before = tree(&ns);
    std::mem::forget(ns);
    let (again, _, _) = open(dir.path(), false).unwrap();
    assert_eq!(tree(&again), before);
}

#[test]
fn a_torn_tail_is_cut_back_to_the_last_whole_operation() {
    let dir = tempfile::tempdir().unwrap();
    let (ns, _, _) = open(dir.path(), true).unwrap();
    populate(&ns);
    let before = tree(&ns);
    let length_before = ns.journal_bytes();
    ns.mkdir(&root(), ROOT_INO, b"last", 0o755, 0).unwrap();
    let length_after = ns.journal_bytes();
    drop(ns);
    let full = std::fs::read(journal_path(dir.path(), 9)).unwrap();
    // Every cut inside the last record recovers the state before it.
    for cut in [length_before + 1, length_before + 15, length_after - 1] {
        let scratch = tempfile::tempdir().unwrap();
        let path = journal_path(scratch.path(), 9);
        std::fs::write(&path, &full[..cut as usize]).unwrap();
        let (again, _, recovery) = open(scratch.path(), false).unwrap();
        assert_eq!(recovery.torn_bytes_cut, cut - length_before, "cut at {cut}");
        assert_eq!(tree(&again), before);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            length_before,
            "the tail is removed from the file"
        );
        // Appending after recovery works and survives another reopen.
        again.mkdir(&root(), ROOT_INO, b"after", 0o755, 0).unwrap();
        drop(again);
        let (third, _, recovery) = open(scratch.path(), false).unwrap();
        assert_eq!(recovery.torn_bytes_cut, 0);
        assert!(third.lookup(&root(), ROOT_INO, b"after").is_ok());
    }
}

#[test]
fn a_flipped_byte_in_the_last_record_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (ns, _, _) = open(dir.path(), true).unwrap();
    populate(&ns);
    let before = tree(&ns);
    let length_before = ns.journal_bytes();
    ns.create(&root(), ROOT_INO, b"victim", FileKind::Regular, 0o644, 0, 0, true).unwrap();
    drop(ns);
    let path = journal_path(dir.path(), 9);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = length_before as usize + 20;
    bytes[at] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let (again, _, recovery) = open(dir.path(), false).unwrap();
    assert!(recovery.torn_bytes_cut > 0);
    assert_eq!(tree(&again), before);
}

#[test]
fn garbage_appended_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (ns, _, _) = open(dir.path(), true).unwrap();
    populate(&ns);
    let before = tree(&ns);
    drop(ns);
    let mut file =
        std::fs::OpenOptions::new().append(true).open(journal_path(dir.path(), 9)).unwrap();
    file.write_all(&[0xAB; 100]).unwrap();
    drop(file);
    let (again, _, recovery) = open(dir.path(), false).unwrap();
    assert_eq!(recovery.torn_bytes_cut, 100);
    assert_eq!(tree(&again), before);
}

#[test]
fn compaction_keeps_the_tree_and_never_reuses_inode_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let (ns, _, _) = open(dir.path(), true).unwrap();
    populate(&ns);
    for i in 0..200 {
        let f = ns
            .create(
                &root(),
                ROOT_INO,
                format!("tmp{i}").as_bytes(),
                FileKind::Regular,
                0o644,
                0,
                0,
                true,
            )
            .unwrap();
        ns.wrote(&root(), f.ino, i).unwrap();
        ns.unlink(&root(), ROOT_INO, format!("tmp{i}").as_bytes()).unwrap();
    }
    let highest =
        ns.create(&root(), ROOT_INO, b"highest", FileKind::Regular, 0o644, 0, 0, true).unwrap();
    ns.unlink(&root(), ROOT_INO, b"highest").unwrap();
    let before = tree(&ns);
    let long = ns.journal_bytes();
    ns.compact().unwrap();
    assert!(ns.journal_bytes() < long / 4, "{} -> {}", long, ns.journal_bytes());
    assert_eq!(tree(&ns), before);
    let next = ns.create(&root(), ROOT_INO, b"next", FileKind::Regular, 0o644, 0, 0, true).unwrap();
    assert!(next.ino > highest.ino);
    drop(ns);
    let (again, _, _) = open(dir.path(), false).unwrap();
    let fresh =
        again.create(&root(), ROOT_INO, b"fresh", FileKind::Regular, 0o644, 0, 0, true).unwrap();
    assert!(fresh.ino > next.ino, "inode numbers are not reused after compaction and reopening");
    let mut expected = before;
    expected.push(("/next".into(), again.getattr(next.ino).unwrap(), Vec::new()));
    expected.push(("/fresh".into(), fresh, Vec::new()));
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(tree(&again), expected);
}

#[test]
fn sync_compacts_a_long_journal() {
    let dir = tempfile::tempdir().unwrap();
    // Operations alone compact at twice this (128 KiB); sync at once (64 KiB).
    let small = LocalOptions { compact_journal_bytes_min: 64 << 10, ..options() };
    let (ns, _, _) =
        LocalNamespace::open(dir.path(), &config(9), true, clock(), capacity(), small).unwrap();
    let f = ns.create(&root(), ROOT_INO, b"f", FileKind::Regular, 0o644, 0, 0, true).unwrap();
    for i in 0..800 {
        ns.wrote(&root(), f.ino, i * 10).unwrap();
    }
    let long = ns.journal_bytes();
    assert!(long > 64 << 10 && long < 128 << 10, "{long}");
    ns.sync().unwrap();
    assert!(ns.journal_bytes() < 1024, "compacted to {} bytes", ns.journal_bytes());
    assert_eq!(ns.getattr(f.ino).unwrap().size, 7990);
}

#[test]
fn a_journal_nobody_syncs_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let small = LocalOptions { compact_journal_bytes_min: 4096, ..options() };
    let (ns, _, _) =
        LocalNamespace::open(dir.path(), &config(9), true, clock(), capacity(), small.clone())
            .unwrap();
    let f = ns.create(&root(), ROOT_INO, b"f", FileKind::Regular, 0o644, 0, 0, true).unwrap();
    let mut longest = 0;
    for i in 0..2000 {
        ns.wrote(&root(), f.ino, i).unwrap();
        longest = longest.max(ns.journal_bytes());
    }
    assert!(longest < 4 * 8192, "journal grew to {longest} bytes");
    drop(ns);
    let (again, _, _) =
        LocalNamespace::open(dir.path(), &config(9), false, clock(), capacity(), small).unwrap();
    assert_eq!(again.getattr(f.ino).unwrap().size, 1999);
}

#[test]
fn damaged_or_foreign_journals_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (ns, _, _) = open(dir.path(), true).unwrap();
    drop(ns);
    let path = journal_path(dir.path(), 9);
    // Another namespace's journal under this name.
    let other = dir.path().join("other");
    let cfg = config(10);
    drop(LocalNamespace::open(&other, &cfg, true, clock(), capacity(), options()).unwrap());
    std::fs::copy(journal_path(&other, 10), &path).unwrap();
    assert!(matches!(open(dir.path(), false), Err(OpenError::WrongNamespace { found: 10, .. })));
    // A flipped header byte.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[17] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let error = open(dir.path(), false).err().expect("refused");
    assert!(error.to_string().contains("checksum"), "{error}");
    // No root record at all.
    let mut bytes = std::fs::read(journal_path(&other, 10)).unwrap();
    bytes.truncate(spillway_meta::journal::HEADER_BYTES + 3);
    std::fs::write(journal_path(&other, 10), &bytes).unwrap();
    let error = LocalNamespace::open(&other, &cfg, false, clock(), capacity(), options())
        .err()
        .expect("refused");
    assert!(error.to_string().contains("root"), "{error}");
}

#[test]
fn records_round_trip() {
    use spillway_meta::journal::{decode_record, encode_record, snapshot_mutations};
    let ns = crate::namespace();
    populate(&ns);
    // Rebuild through the public state: a snapshot of a populated in-memory namespace is not
    // reachable, so encode the mutations of a fresh state instead.
    let mut state = spillway_meta::state::State::empty();
    let root_attr = ns.getattr(ROOT_INO).unwrap();
    state
        .apply(spillway_meta::state::Mutation::PutInode(spillway_meta::state::Inode {
            attr: root_attr,
            target: Vec::new(),
            parent: ROOT_INO,
        }))
        .unwrap();
    let mutations = snapshot_mutations(&state);
    let record = encode_record(5, &mutations);
    let (decoded, length) = decode_record(&record, 5).unwrap().unwrap();
    assert_eq!((decoded, length), (mutations, record.len()));
    assert_eq!(decode_record(&record, 6).unwrap(), None, "wrong sequence number = end");
    assert_eq!(decode_record(&record[..record.len() - 1], 5).unwrap(), None);
}
