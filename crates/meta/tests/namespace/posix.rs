//! POSIX cases against `LocalNamespace`, each checking one rule or one errno.

use libc::*;
use spillway_meta::*;
use spillway_namespace::*;
use spillway_namespace::{RENAME_EXCHANGE, RENAME_NOREPLACE};

use crate::{errno, namespace, root, user};

fn file(ns: &LocalNamespace, c: &Caller, parent: Ino, name: &str, mode: u32) -> Attr {
    ns.create(c, parent, name.as_bytes(), FileKind::Regular, mode, 0, 0, true).unwrap()
}

fn dir(ns: &LocalNamespace, c: &Caller, parent: Ino, name: &str, mode: u32) -> Attr {
    ns.mkdir(c, parent, name.as_bytes(), mode, 0).unwrap()
}

fn names(ns: &LocalNamespace, dir: Ino) -> Vec<String> {
    ns.readdir(&root(), dir, 0, 10_000)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect()
}

// ---- lookup ----

#[test]
fn lookup_finds_entries_dot_and_dotdot() {
    let ns = namespace();
    let d = dir(&ns, &root(), ROOT_INO, "d", 0o755);
    let f = file(&ns, &root(), d.ino, "f", 0o644);
    assert_eq!(ns.lookup(&root(), d.ino, b"f").unwrap().ino, f.ino);
    assert_eq!(ns.lookup(&root(), d.ino, b".").unwrap().ino, d.ino);
    assert_eq!(ns.lookup(&root(), d.ino, b"..").unwrap().ino, ROOT_INO);
    assert_eq!(ns.lookup(&root(), ROOT_INO, b"..").unwrap().ino, ROOT_INO);
}

#[test]
fn lookup_errors() {
    let ns = namespace();
    let f = file(&ns, &root(), ROOT_INO, "f", 0o644);
    let d = dir(&ns, &root(), ROOT_INO, "d", 0o700);
    file(&ns, &root(), d.ino, "inside", 0o644);
    assert_eq!(errno(ns.lookup(&root(), ROOT_INO, b"missing")), ENOENT);
    assert_eq!(errno(ns.lookup(&root(), f.ino, b"x")), ENOTDIR);
    assert_eq!(
        errno(ns.lookup(&user(5), d.ino, b"inside")),
        EACCES,
        "search permission on the parent"
    );
    assert_eq!(errno(ns.lookup(&root(), ROOT_INO, &[b'a'; 256])), ENAMETOOLONG);
    assert_eq!(errno(ns.lookup(&root(), 999, b"x")), ENOENT);
}

// ---- create / mknod ----

#[test]
fn create_applies_umask_owner_and_times() {
    let ns = namespace();
    let before = ns.getattr(ROOT_INO).unwrap();
    let a = ns.create(&user(10), ROOT_INO, b"f", FileKind::Regular, 0o666, 0o022, 0, true).unwrap();
    assert_eq!(
        (a.kind, a.mode, a.uid, a.gid, a.nlink, a.size),
        (FileKind::Regular, 0o644, 10, 10, 1, 0)
    );
    assert_eq!(a.st_mode(), 0o100644);
    assert_eq!(a.atime, a.mtime);
    assert_eq!(a.mtime, a.ctime);
    let after = ns.getattr(ROOT_INO).unwrap();
    assert!(after.mtime > before.mtime && after.ctime > before.ctime, "parent times move");
    assert_eq!(after.size, 1, "a directory's size is its entry count");
}

#[test]
fn create_exclusive_and_not() {
    let ns = namespace();
    let a = file(&ns, &root(), ROOT_INO, "f", 0o644);
    assert_eq!(
        errno(ns.create(&root(), ROOT_INO, b"f", FileKind::Regular, 0o600, 0, 0, true)),
        EEXIST
    );
    let again = ns.create(&root(), ROOT_INO, b"f", FileKind::Regular, 0o600, 0, 0, false).unwrap();
    assert_eq!(
        (again.ino, again.mode),
        (a.ino, 0o644),
        "non-exclusive create returns the existing file unchanged"
    );
    assert_eq!(
        errno(ns.create(&root(), ROOT_INO, b".", FileKind::Regular, 0o600, 0, 0, false)),
        EEXIST
    );
}

#[test]
fn create_errors() {
    let ns = namespace();
    let f = file(&ns, &root(), ROOT_INO, "f", 0o644);
    let locked = dir(&ns, &root(), ROOT_INO, "locked", 0o755);
    assert_eq!(
        errno(ns.create(&user(5), locked.ino, b"x", FileKind::Regular, 0o644, 0, 0, true)),
        EACCES
    );
    assert_eq!(
        errno(ns.create(&root(), f.ino, b"x", FileKind::Regular, 0o644, 0, 0, true)),
        ENOTDIR
    );
    assert_eq!(
        errno(ns.create(&root(), 12345, b"x", FileKind::Regular, 0o644, 0, 0, true)),
        ENOENT
    );
    assert_eq!(
        errno(ns.create(&root(), ROOT_INO, &[b'n'; 256], FileKind::Regular, 0o644, 0, 0, true)),
        ENAMETOOLONG
    );
    ns.create(&root(), ROOT_INO, &[b'n'; 255], FileKind::Regular, 0o644, 0, 0, true).unwrap();
    assert_eq!(
        errno(ns.create(&root(), ROOT_INO, b"a/b", FileKind::Regular, 0o644, 0, 0, true)),
        EINVAL
    );
    assert_eq!(
        errno(ns.create(&root(), ROOT_INO, b"", FileKind::Regular, 0o644, 0, 0, true)),
        ENOENT
    );
    assert_eq!(
        errno(ns.create(&root(), ROOT_INO, b"d", FileKind::Directory, 0o755, 0, 0, true)),
        EINVAL
    );
}

#[test]
fn existing_name_is_eexist_even_without_write_permission() {
    let ns = namespace();
    let locked = dir(&ns, &root(), ROOT_INO, "locked", 0o755);
    file(&ns, &root(), locked.ino, "f", 0o644);
    assert_eq!(
        errno(ns.create(&user(5), locked.ino, b"f", FileKind::Regular, 0o644, 0, 0, true)),
        EEXIST
    );
}

#[test]
fn special_files() {
    let ns = namespace();
    let fifo = ns.create(&user(3), ROOT_INO, b"fifo", FileKind::Fifo, 0o644, 0, 0, true).unwrap();
    assert_eq!(fifo.st_mode() & 0o170000, 0o010000);
    ns.create(&user(3), ROOT_INO, b"sock", FileKind::Socket, 0o644, 0, 0, true).unwrap();
    assert_eq!(
        errno(ns.create(&user(3), ROOT_INO, b"chr", FileKind::CharDevice, 0o644, 0, 0x0103, true)),
        EPERM
    );
    assert_eq!(
        errno(ns.create(&user(3), ROOT_INO, b"blk", FileKind::BlockDevice, 0o644, 0, 0x0801, true)),
        EPERM
    );
    let chr =
        ns.create(&root(), ROOT_INO, b"chr", FileKind::CharDevice, 0o644, 0, 0x0103, true).unwrap();
    assert_eq!((chr.kind, chr.rdev), (FileKind::CharDevice, 0x0103));
    assert_eq!(fifo.rdev, 0);
}

#[test]
fn sgid_directories_pass_on_their_group() {
    let ns = namespace();
    let shared = dir(&ns, &root(), ROOT_INO, "shared", 0o777);
    ns.setattr(
        &root(),
        shared.ino,
        &SetAttr { gid: Some(500), mode: Some(0o2777), ..SetAttr::default() },
    )
    .unwrap();
    let f = file(&ns, &user(10), shared.ino, "f", 0o2755);
    assert_eq!((f.gid, f.mode), (500, 0o755), "group inherited; sgid dropped for a non-member");
    let d = dir(&ns, &user(10), shared.ino, "sub", 0o755);
    assert_eq!((d.gid, d.mode & 0o2000), (500, 0o2000), "subdirectories inherit the sgid bit");
    let member = Caller { uid: 11, gid: 11, groups: vec![500], pid: 0 };
    assert_eq!(file(&ns, &member, shared.ino, "g", 0o2755).mode, 0o2755);
}

#[test]
fn inode_limit_is_enospc() {
    let ns = LocalNamespace::in_memory(
        &crate::config(1),
        crate::clock(),
        crate::capacity(),
        LocalOptions { inodes_max: 3, ..crate::options() },
    );
    file(&ns, &root(), ROOT_INO, "a", 0o644);
    dir(&ns, &root(), ROOT_INO, "b", 0o755);
    assert_eq!(
        errno(ns.create(&root(), ROOT_INO, b"c", FileKind::Regular, 0o644, 0, 0, true)),
        ENOSPC
    );
    assert_eq!(errno(ns.mkdir(&root(), ROOT_INO, b"c", 0o755, 0)), ENOSPC);
    assert_eq!(ns.statfs().unwrap().files_free, 0);
}

// ---- mkdir / rmdir ----

#[test]
fn mkdir_counts_links() {
    let ns = namespace();
    let d = dir(&ns, &root(), ROOT_INO, "d", 0o777);
    assert_eq!(d.nlink, 2);
    assert_eq!(ns.getattr(ROOT_INO).unwrap().nlink, 3);
    dir(&ns, &root(), d.ino, "e", 0o755);
    file(&ns, &root(), d.ino, "f", 0o644);
    assert_eq!(ns.getattr(d.ino).unwrap().nlink, 3, "files do not add links to the parent");
    assert_eq!(
        ns.mkdir(&root(), ROOT_INO, b"m", 0o7777, 0o022).unwrap().mode,
        0o1755,
        "mkdir keeps sticky, not suid/sgid"
    );
}

#[test]
fn mkdir_errors() {
    let ns = namespace();
    dir(&ns, &root(), ROOT_INO, "d", 0o755);
    assert_eq!(errno(ns.mkdir(&root(), ROOT_INO, b"d", 0o755, 0)), EEXIST);
    assert_eq!(errno(ns.mkdir(&root(), ROOT_INO, b"..", 0o755, 0)), EEXIST);
    let d = ns.lookup(&root(), ROOT_INO, b"d").unwrap();
    assert_eq!(errno(ns.mkdir(&user(4), d.ino, b"x", 0o755, 0)), EACCES);
}

#[test]
fn rmdir_rules() {
    let ns = namespace();
    let d = dir(&ns, &root(), ROOT_INO, "d", 0o777);
    file(&ns, &root(), d.ino, "f", 0o644);
    assert_eq!(errno(ns.rmdir(&root(), ROOT_INO, b"d")), ENOTEMPTY);
    assert_eq!(errno(ns.rmdir(&root(), d.ino, b"f")), ENOTDIR);
    assert_eq!(errno(ns.rmdir(&root(), d.ino, b".")), EINVAL);
    assert_eq!(errno(ns.rmdir(&root(), d.ino, b"..")), ENOTEMPTY);
    assert_eq!(errno(ns.rmdir(&root(), ROOT_INO, b"nope")), ENOENT);
    ns.unlink(&root(), d.ino, b"f").unwrap();
    ns.rmdir(&root(), ROOT_INO, b"d").unwrap();
    assert_eq!(ns.getattr(ROOT_INO).unwrap().nlink, 2);
    assert_eq!(errno(ns.getattr(d.ino)), ENOENT);
}

#[test]
fn rmdir_needs_write_on_the_parent() {
    let ns = namespace();
    let p = dir(&ns, &root(), ROOT_INO, "p", 0o755);
    dir(&ns, &root(), p.ino, "d", 0o777);
    assert_eq!(errno(ns.rmdir(&user(3), p.ino, b"d")), EACCES);
}

// ---- symlink / readlink ----

#[test]
fn symlinks() {
    let ns = namespace();
    let s = ns.symlink(&user(2), ROOT_INO, b"s", b"../some/where").unwrap();
    assert_eq!((s.kind, s.mode, s.size, s.uid), (FileKind::Symlink, 0o777, 13, 2));
    assert_eq!(ns.readlink(s.ino).unwrap(), b"../some/where");
    let f = file(&ns, &root(), ROOT_INO, "f", 0o644);
    assert_eq!(errno(ns.readlink(f.ino)), EINVAL);
    assert_eq!(errno(ns.symlink(&root(), ROOT_INO, b"s", b"x")), EEXIST);
    assert_eq!(errno(ns.symlink(&root(), ROOT_INO, b"e", b"")), ENOENT);
    assert_eq!(errno(ns.symlink(&root(), ROOT_INO, b"long", &[b'x'; 4096])), ENAMETOOLONG);
    assert_eq!(errno(ns.open(&root(), s.ino, O_RDONLY)), ELOOP);
}

// ---- link / unlink ----

#[test]
fn hard_links_share_the_inode() {
    let ns = namespace();
    let d = dir(&ns, &root(), ROOT_INO, "d", 0o755);
    let f = file(&ns, &root(), ROOT_INO, "f", 0o644);
    let linked = ns.link(&root(), f.ino, d.ino, b"g").unwrap();
    assert_eq!((linked.ino, linked.nlink), (f.ino, 2));
    assert!(linked.ctime > f.ctime);
    ns.unlink(&root(), ROOT_INO, b"f").unwrap();
    let left = ns.lookup(&root(), d.ino, b"g").unwrap();
    assert_eq!((left.ino, left.nlink), (f.ino, 1));
    ns.unlink(&root(), d.ino, b"g").unwrap();
    assert_eq!(errno(ns.getattr(f.ino)), ENOENT, "the inode goes with its last link");
    assert_eq!(errno(ns.link(&root(), f.ino, d.ino, b"h")), ENOENT);
}

#[test]
fn link_errors() {
    let ns = namespace();
    let d = dir(&ns, &root(), ROOT_INO, "d", 0o755);
    let f = file(&ns, &root(), ROOT_INO, "f", 0o644);
    assert_eq!(errno(ns.link(&root(), d.ino, ROOT_INO, b"d2")), EPERM);
    assert_eq!(errno(ns.link(&root(), f.ino, ROOT_INO, b"d")), EEXIST);
    assert_eq!(errno(ns.link(&user(3), f.ino, d.ino, b"x")), EACCES);
    assert_eq!(errno(ns.link(&root(), f.ino, f.ino, b"x")), ENOTDIR);
}

#[test]
fn unlink_errors() {
    let ns = namespace();
    let d = dir(&ns, &root(), ROOT_INO, "d", 0o755);
    file(&ns, &root(), d.ino, "f", 0o666);
    assert_eq!(errno(ns.unlink(&root(), ROOT_INO, b"d")), EISDIR);
    assert_eq!(errno(ns.unlink(&root(), ROOT_INO, b"nope")), ENOENT);
    assert_eq!(
        errno(ns.unlink(&user(3), d.ino, b"f")),
        EACCES,
        "write permission on the directory, not the file"
    );
    assert_eq!(errno(ns.unlink(&root(), d.ino, b".")), EISDIR);
}

#[test]
fn sticky_directories_restrict_deletion() {
    let ns = namespace();
    let tmp = dir(&ns, &root(), ROOT_INO, "tmp", 0o1777);
    file(&ns, &user(10), tmp.ino, "mine", 0o666);
    dir(&ns, &user(10), tmp.ino, "mydir", 0o777);
    assert_eq!(errno(ns.unlink(&user(11), tmp.ino, b"mine")), EPERM);
    assert_eq!(errno(ns.rmdir(&user(11), tmp.ino, b"mydir")), EPERM);
    assert_eq!(errno(ns.rename(&user(11), tmp.ino, b"mine", tmp.ino, b"stolen", 0)), EPERM);
    file(&ns, &user(11), tmp.ino, "theirs", 0o666);
    assert_eq!(
        errno(ns.rename(&user(11), tmp.ino, b"theirs", tmp.ino, b"mine", 0)),
        EPERM,
        "cannot replace another's file"
    );
    ns.unlink(&user(10), tmp.ino, b"mine").unwrap();
    ns.rmdir(&root(), tmp.ino, b"mydir").unwrap();
    // The directory's owner may delete anything in it.
    let owned = dir(&ns, &user(20), ROOT_INO, "owned", 0o1777);
    file(&ns, &user(21), owned.ino, "x", 0o644);
    ns.unlink(&user(20), owned.ino, b"x").unwrap();
}

// ---- rename ----

#[test]
fn rename_file_over_file_replaces_it() {
    let ns = namespace();
    let a = file(&ns, &root(), ROOT_INO, "a", 0o644);
    let b = file(&ns, &root(), ROOT_INO, "b", 0o644);
    ns.rename(&root(), ROOT_INO, b"a", ROOT_INO, b"b", 0).unwrap();
    assert_eq!(ns.lookup(&root(), ROOT_INO, b"b").unwrap().ino, a.ino);
    assert_eq!(errno(ns.lookup(&root(), ROOT_INO, b"a")), ENOENT);
    assert_eq!(errno(ns.getattr(b.ino)), ENOENT);
    assert!(ns.getattr(a.ino).unwrap().ctime > a.ctime, "rename updates ctime");
}

#[test]
fn rename_directory_over_empty_directory_and_across_parents() {
    let ns = namespace();
    let p = dir(&ns, &root(), ROOT_INO, "p", 0o755);
    let q = dir(&ns, &root(), ROOT_INO, "q", 0o755);
    let d = dir(&ns, &root(), p.ino, "d", 0o755);
    let empty = dir(&ns, &root(), q.ino, "empty", 0o755);
    ns.rename(&root(), p.ino, b"d", q.ino, b"empty", 0).unwrap();
    assert_eq!(errno(ns.getattr(empty.ino)), ENOENT);
    assert_eq!(ns.lookup(&root(), d.ino, b"..").unwrap().ino, q.ino, ".. follows the move");
    assert_eq!(ns.getattr(p.ino).unwrap().nlink, 2);
    assert_eq!(ns.getattr(q.ino).unwrap().nlink, 3);
}

#[test]
fn rename_kind_errors() {
    let ns = namespace();
    let d = dir(&ns, &root(), ROOT_INO, "d", 0o755);
    let full = dir(&ns, &root(), ROOT_INO, "full", 0o755);
    file(&ns, &root(), full.ino, "x", 0o644);
    file(&ns, &root(), ROOT_INO, "f", 0o644);
    assert_eq!(errno(ns.rename(&root(), ROOT_INO, b"d", ROOT_INO, b"f", 0)), ENOTDIR);
    assert_eq!(errno(ns.rename(&root(), ROOT_INO, b"f", ROOT_INO, b"d", 0)), EISDIR);
    assert_eq!(errno(ns.rename(&root(), ROOT_INO, b"d", ROOT_INO, b"full", 0)), ENOTEMPTY);
    assert_eq!(errno(ns.rename(&root(), ROOT_INO, b"nope", ROOT_INO, b"x", 0)), ENOENT);
    assert_eq!(errno(ns.rename(&root(), ROOT_INO, b"f", d.ino, &[b'l'; 256], 0)), ENAMETOOLONG);
    assert_eq!(
        errno(ns.rename(&root(), ROOT_INO, b"f", ROOT_INO, b"g", 4)),
        EINVAL,
        "unknown flag"
    );
    assert_eq!(
        errno(ns.rename(
            &root(),
            ROOT_INO,
            b"f",
            ROOT_INO,
            b"g",
            RENAME_EXCHANGE | RENAME_NOREPLACE
        )),
        EINVAL
    );
    assert_eq!(errno(ns.rename(&root(), ROOT_INO, b".", ROOT_INO, b"g", 0)), EBUSY);
}

#[test]
fn rename_into_own_subtree_is_einval() {
    let ns = namespace();
    let a = dir(&ns, &root(), ROOT_INO, "a", 0o755);
    let b = dir(&ns, &root(), a.ino, "b", 0o755);
    let c = dir(&ns, &root(), b.ino, "c", 0o755);
    assert_eq!(errno(ns.rename(&root(), ROOT_INO, b"a", c.ino, b"a", 0)), EINVAL);
    assert_eq!(errno(ns.rename(&root(), ROOT_INO, b"a", a.ino, b"x", 0)), EINVAL);
    assert_eq!(
        errno(ns.rename(&root(), b.ino, b"c", ROOT_INO, b"a", 0)),
        ENOTEMPTY,
        "over an ancestor"
    );
    ns.rename(&root(), b.ino, b"c", ROOT_INO, b"c", 0).unwrap();
    ns.check_invariants().unwrap();
}

#[test]
fn rename_noreplace() {
    let ns = namespace();
    file(&ns, &root(), ROOT_INO, "a", 0o644);
    file(&ns, &root(), ROOT_INO, "b", 0o644);
    assert_eq!(errno(ns.rename(&root(), ROOT_INO, b"a", ROOT_INO, b"b", RENAME_NOREPLACE)), EEXIST);
    ns.rename(&root(), ROOT_INO, b"a", ROOT_INO, b"c", RENAME_NOREPLACE).unwrap();
}

#[test]
fn rename_exchange_swaps_a_file_and_a_directory_across_parents() {
    let ns = namespace();
    let p = dir(&ns, &root(), ROOT_INO, "p", 0o755);
    let q = dir(&ns, &root(), ROOT_INO, "q", 0o755);
    let f = file(&ns, &root(), p.ino, "f", 0o644);
    let d = dir(&ns, &root(), q.ino, "d", 0o755);
    ns.rename(&root(), p.ino, b"f", q.ino, b"d", RENAME_EXCHANGE).unwrap();
    assert_eq!(ns.lookup(&root(), p.ino, b"f").unwrap().ino, d.ino);
    assert_eq!(ns.lookup(&root(), q.ino, b"d").unwrap().ino, f.ino);
    assert_eq!(ns.lookup(&root(), d.ino, b"..").unwrap().ino, p.ino);
    assert_eq!((ns.getattr(p.ino).unwrap().nlink, ns.getattr(q.ino).unwrap().nlink), (3, 2));
    assert_eq!(errno(ns.rename(&root(), p.ino, b"f", q.ino, b"missing", RENAME_EXCHANGE)), ENOENT);
}

#[test]
fn rename_between_links_of_one_inode_does_nothing() {
    let ns = namespace();
    let f = file(&ns, &root(), ROOT_INO, "f", 0o644);
    ns.link(&root(), f.ino, ROOT_INO, b"g").unwrap();
    ns.rename(&root(), ROOT_INO, b"f", ROOT_INO, b"g", 0).unwrap();
    assert_eq!(names(&ns, ROOT_INO), [".", "..", "f", "g"]);
    assert_eq!(ns.getattr(f.ino).unwrap().nlink, 2);
}

#[test]
fn rename_permissions() {
    let ns = namespace();
    let locked = dir(&ns, &root(), ROOT_INO, "locked", 0o755);
    file(&ns, &root(), locked.ino, "f", 0o666);
    assert_eq!(errno(ns.rename(&user(3), locked.ino, b"f", ROOT_INO, b"g", 0)), EACCES);
    // Moving someone else's directory to a new parent needs write permission on it ("..").
    let theirs = dir(&ns, &user(4), ROOT_INO, "theirs", 0o755);
    let mine = dir(&ns, &user(3), ROOT_INO, "mine", 0o755);
    assert_eq!(errno(ns.rename(&user(3), ROOT_INO, b"theirs", mine.ino, b"t", 0)), EACCES);
    ns.rename(&user(3), ROOT_INO, b"theirs", ROOT_INO, b"renamed", 0).unwrap();
    assert_eq!(ns.lookup(&root(), ROOT_INO, b"renamed").unwrap().ino, theirs.ino);
}

// ---- readdir ----

#[test]
fn readdir_lists_in_creation_order_with_dot_entries() {
    let ns = namespace();
    for name in ["c", "a", "b"] {
        file(&ns, &root(), ROOT_INO, name, 0o644);
    }
    dir(&ns, &root(), ROOT_INO, "z", 0o755);
    let entries = ns.readdir(&root(), ROOT_INO, 0, 100).unwrap();
    let listed: Vec<_> =
        entries.iter().map(|e| (String::from_utf8(e.name.clone()).unwrap(), e.kind)).collect();
    assert_eq!(listed[0], (".".to_string(), FileKind::Directory));
    assert_eq!(listed[1], ("..".to_string(), FileKind::Directory));
    assert_eq!(
        &listed[2..],
        [
            ("c".into(), FileKind::Regular),
            ("a".into(), FileKind::Regular),
            ("b".into(), FileKind::Regular),
            ("z".into(), FileKind::Directory)
        ]
    );
    assert!(entries.windows(2).all(|w| w[0].cookie < w[1].cookie));
    assert!(
        ns.readdir(&root(), ROOT_INO, entries.last().unwrap().cookie, 100).unwrap().is_empty(),
        "empty = end"
    );
}

#[test]
fn readdir_cookies_survive_concurrent_changes() {
    let ns = namespace();
    for i in 0..100 {
        file(&ns, &root(), ROOT_INO, &format!("f{i:03}"), 0o644);
    }
    let first = ns.readdir(&root(), ROOT_INO, 0, 30).unwrap();
    assert_eq!(first.len(), 30);
    // Meanwhile: delete listed and unlisted entries, add new ones, rename one not yet listed.
    ns.unlink(&root(), ROOT_INO, b"f000").unwrap();
    ns.unlink(&root(), ROOT_INO, b"f050").unwrap();
    ns.rename(&root(), ROOT_INO, b"f060", ROOT_INO, b"moved", 0).unwrap();
    file(&ns, &root(), ROOT_INO, "new", 0o644);
    let mut seen: Vec<String> =
        first.iter().map(|e| String::from_utf8(e.name.clone()).unwrap()).collect();
    let mut cookie = first.last().unwrap().cookie;
    loop {
        let page = ns.readdir(&root(), ROOT_INO, cookie, 7).unwrap();
        let Some(last) = page.last() else { break };
        cookie = last.cookie;
        seen.extend(page.iter().map(|e| String::from_utf8(e.name.clone()).unwrap()));
    }
    let unique: std::collections::BTreeSet<_> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no entry listed twice");
    for i in 0..100 {
        let name = format!("f{i:03}");
        if ![0, 50, 60].contains(&i) {
            assert!(unique.contains(&name), "{name} unchanged during the listing but skipped");
        }
    }
    assert!(!unique.contains("f050"), "deleted before it was reached");
    assert!(
        unique.contains("new") && unique.contains("moved"),
        "entries added meanwhile come after"
    );
}

#[test]
fn readdir_errors() {
    let ns = namespace();
    let f = file(&ns, &root(), ROOT_INO, "f", 0o644);
    let d = dir(&ns, &root(), ROOT_INO, "d", 0o311);
    assert_eq!(errno(ns.readdir(&root(), f.ino, 0, 10)), ENOTDIR);
    assert_eq!(errno(ns.readdir(&user(5), d.ino, 0, 10)), EACCES);
    assert_eq!(ns.readdir(&root(), d.ino, 0, 1).unwrap().len(), 1, "entries_max is respected");
}

// ---- open / access ----

#[test]
fn open_checks_the_access_mode() {
    let ns = namespace();
    let wo = file(&ns, &user(10), ROOT_INO, "wo", 0o200);
    assert_eq!(errno(ns.open(&user(10), wo.ino, O_RDONLY)), EACCES);
    ns.open(&user(10), wo.ino, O_WRONLY).unwrap();
    assert_eq!(errno(ns.open(&user(10), wo.ino, O_RDWR)), EACCES);
    ns.open(&root(), wo.ino, O_RDWR).unwrap();
    let other = file(&ns, &user(10), ROOT_INO, "other", 0o604);
    ns.open(&user(11), other.ino, O_RDONLY).unwrap();
    assert_eq!(errno(ns.open(&user(11), other.ino, O_WRONLY)), EACCES);
    assert_eq!(errno(ns.open(&root(), ROOT_INO, O_WRONLY)), EISDIR);
    ns.open(&root(), ROOT_INO, O_RDONLY | O_DIRECTORY).unwrap();
    assert_eq!(errno(ns.open(&root(), other.ino, 3)), EINVAL);
}

#[test]
fn open_with_o_trunc_starts_a_new_generation() {
    let ns = namespace();
    let f = file(&ns, &user(10), ROOT_INO, "f", 0o644);
    ns.wrote(&user(10), f.ino, 4096).unwrap();
    let reopened = ns.open(&user(10), f.ino, O_WRONLY | O_TRUNC).unwrap();
    assert_eq!((reopened.size, reopened.generation), (0, f.generation + 1));
    assert!(reopened.mtime > f.mtime);
    assert_eq!(
        errno(ns.open(&user(11), f.ino, O_RDONLY | O_TRUNC)),
        EACCES,
        "O_TRUNC needs write permission"
    );
    let plain = ns.open(&user(10), f.ino, O_RDWR).unwrap();
    assert_eq!(plain.generation, reopened.generation);
}

#[test]
fn access_masks() {
    let ns = namespace();
    let f = file(&ns, &user(10), ROOT_INO, "f", 0o640);
    ns.access(&user(10), f.ino, 0).unwrap();
    ns.access(&user(10), f.ino, ACCESS_READ | ACCESS_WRITE).unwrap();
    assert_eq!(errno(ns.access(&user(10), f.ino, ACCESS_EXECUTE)), EACCES);
    let member = Caller { uid: 11, gid: 1, groups: vec![10], pid: 0 };
    ns.access(&member, f.ino, ACCESS_READ).unwrap();
    assert_eq!(errno(ns.access(&member, f.ino, ACCESS_WRITE)), EACCES);
    assert_eq!(errno(ns.access(&user(12), f.ino, ACCESS_READ)), EACCES);
    ns.access(&root(), f.ino, ACCESS_READ | ACCESS_WRITE).unwrap();
    assert_eq!(errno(ns.access(&root(), f.ino, ACCESS_EXECUTE)), EACCES, "root needs some x bit");
    assert_eq!(errno(ns.access(&root(), f.ino, 8)), EINVAL);
    assert_eq!(errno(ns.access(&root(), 4242, 0)), ENOENT);
}

// ---- setattr ----

#[test]
fn chmod_rules() {
    let ns = namespace();
    let f = file(&ns, &user(10), ROOT_INO, "f", 0o644);
    assert_eq!(
        errno(ns.setattr(&user(11), f.ino, &SetAttr { mode: Some(0o777), ..SetAttr::default() })),
        EPERM
    );
    let changed = ns
        .setattr(&user(10), f.ino, &SetAttr { mode: Some(0o4711), ..SetAttr::default() })
        .unwrap();
    assert_eq!(changed.mode, 0o4711);
    assert!(changed.ctime > f.ctime);
    let nonmember = ns
        .setattr(
            &Caller::user(10, 99),
            f.ino,
            &SetAttr { mode: Some(0o2755), ..SetAttr::default() },
        )
        .unwrap();
    assert_eq!(nonmember.mode, 0o755, "sgid silently dropped for a non-member");
}

#[test]
fn chown_rules() {
    let ns = namespace();
    let f = file(&ns, &user(10), ROOT_INO, "f", 0o6755);
    assert_eq!(
        errno(ns.setattr(&user(10), f.ino, &SetAttr { uid: Some(11), ..SetAttr::default() })),
        EPERM
    );
    assert_eq!(
        errno(ns.setattr(&user(10), f.ino, &SetAttr { gid: Some(30), ..SetAttr::default() })),
        EPERM
    );
    let in_group = Caller { uid: 10, gid: 10, groups: vec![30], pid: 0 };
    let changed =
        ns.setattr(&in_group, f.ino, &SetAttr { gid: Some(30), ..SetAttr::default() }).unwrap();
    assert_eq!((changed.gid, changed.mode), (30, 0o755), "chgrp drops suid and sgid");
    ns.setattr(&root(), f.ino, &SetAttr { mode: Some(0o6755), ..SetAttr::default() }).unwrap();
    let by_root = ns
        .setattr(&root(), f.ino, &SetAttr { uid: Some(20), gid: Some(20), ..SetAttr::default() })
        .unwrap();
    assert_eq!(
        (by_root.uid, by_root.gid, by_root.mode),
        (20, 20, 0o755),
        "even root's chown drops them"
    );
    let d = dir(&ns, &root(), ROOT_INO, "d", 0o755);
    ns.setattr(&root(), d.ino, &SetAttr { mode: Some(0o2755), ..SetAttr::default() }).unwrap();
    assert_eq!(
        ns.setattr(&root(), d.ino, &SetAttr { uid: Some(5), ..SetAttr::default() }).unwrap().mode,
        0o2755,
        "directories keep sgid"
    );
}

#[test]
fn truncate_rules() {
    let ns = namespace();
    let f = file(&ns, &user(10), ROOT_INO, "f", 0o644);
    ns.wrote(&user(10), f.ino, 10_000).unwrap();
    let shrunk =
        ns.setattr(&user(10), f.ino, &SetAttr { size: Some(100), ..SetAttr::default() }).unwrap();
    assert_eq!(
        (shrunk.size, shrunk.generation),
        (100, f.generation),
        "shrinking keeps the generation"
    );
    let zero =
        ns.setattr(&user(10), f.ino, &SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
    assert_eq!(
        (zero.size, zero.generation),
        (0, f.generation + 1),
        "truncating to 0 starts a new generation"
    );
    assert_eq!(
        errno(ns.setattr(&user(11), f.ino, &SetAttr { size: Some(5), ..SetAttr::default() })),
        EACCES
    );
    ns.setattr(
        &user(11),
        f.ino,
        &SetAttr { size: Some(5), via_writable_handle: true, ..SetAttr::default() },
    )
    .unwrap();
    assert_eq!(
        errno(ns.setattr(&root(), ROOT_INO, &SetAttr { size: Some(0), ..SetAttr::default() })),
        EISDIR
    );
    let fifo = ns.create(&root(), ROOT_INO, b"p", FileKind::Fifo, 0o666, 0, 0, true).unwrap();
    assert_eq!(
        errno(ns.setattr(&root(), fifo.ino, &SetAttr { size: Some(0), ..SetAttr::default() })),
        EINVAL
    );
    assert_eq!(
        errno(ns.setattr(&root(), f.ino, &SetAttr { size: Some(u64::MAX), ..SetAttr::default() })),
        EFBIG
    );
    // The largest file is the store's (`file_bytes_max`, 2^44 by default), not just i64::MAX:
    // a namespace never names a size its store would refuse to hold.
    let largest = LocalOptions::default().file_bytes_max;
    assert_eq!(largest, 1 << 44);
    let set = |size| SetAttr { size: Some(size), ..SetAttr::default() };
    assert_eq!(ns.setattr(&root(), f.ino, &set(largest)).unwrap().size, largest);
    assert_eq!(errno(ns.setattr(&root(), f.ino, &set(largest + 1))), EFBIG);
    assert_eq!(errno(ns.setattr(&root(), f.ino, &set(1 << 63))), EFBIG);
    assert_eq!(errno(ns.wrote(&root(), f.ino, (1 << 63) + 10)), EFBIG);
}

#[test]
fn utimens_rules() {
    let ns = namespace();
    let f = file(&ns, &user(10), ROOT_INO, "f", 0o646);
    let at = Timestamp::new(1_000, 5);
    let set = ns
        .setattr(
            &user(10),
            f.ino,
            &SetAttr {
                atime: Some(TimeSet::At(at)),
                mtime: Some(TimeSet::At(at)),
                ..SetAttr::default()
            },
        )
        .unwrap();
    assert_eq!((set.atime, set.mtime), (at, at));
    assert!(set.ctime > f.ctime, "ctime is never set by the caller");
    assert_eq!(
        errno(ns.setattr(
            &user(11),
            f.ino,
            &SetAttr { mtime: Some(TimeSet::At(at)), ..SetAttr::default() }
        )),
        EPERM
    );
    let now = ns
        .setattr(&user(11), f.ino, &SetAttr { mtime: Some(TimeSet::Now), ..SetAttr::default() })
        .unwrap();
    assert!(now.mtime > at, "write permission allows setting now");
    let g = file(&ns, &user(10), ROOT_INO, "g", 0o644);
    assert_eq!(
        errno(ns.setattr(
            &user(11),
            g.ino,
            &SetAttr { atime: Some(TimeSet::Now), ..SetAttr::default() }
        )),
        EACCES
    );
    let bad = Timestamp { seconds: 1, nanos: 1_000_000_000 };
    assert_eq!(
        errno(ns.setattr(
            &user(10),
            g.ino,
            &SetAttr { atime: Some(TimeSet::At(bad)), ..SetAttr::default() }
        )),
        EINVAL
    );
}

#[test]
fn setattr_is_all_or_nothing() {
    let ns = namespace();
    let f = file(&ns, &user(10), ROOT_INO, "f", 0o644);
    // chmod would be allowed, but the chown in the same call is not: nothing changes.
    let failed = ns.setattr(
        &user(10),
        f.ino,
        &SetAttr { mode: Some(0o600), uid: Some(11), ..SetAttr::default() },
    );
    assert_eq!(errno(failed), EPERM);
    assert_eq!(ns.getattr(f.ino).unwrap(), f);
    assert_eq!(
        ns.setattr(&user(99), f.ino, &SetAttr::default()).unwrap(),
        f,
        "an empty setattr changes nothing"
    );
}

// ---- wrote ----

#[test]
fn wrote_grows_size_and_drops_privilege_bits_for_non_root() {
    let ns = namespace();
    let f = file(&ns, &user(10), ROOT_INO, "f", 0o6775);
    assert_eq!(f.mode, 0o6775);
    let a = ns.wrote(&user(10), f.ino, 1 << 20).unwrap();
    assert_eq!((a.size, a.mode), (1 << 20, 0o775));
    assert!(a.mtime > f.mtime && a.ctime > f.ctime);
    let b = ns.wrote(&user(10), f.ino, 10).unwrap();
    assert_eq!(b.size, 1 << 20, "a write inside the file does not shrink it");
    ns.setattr(&root(), f.ino, &SetAttr { mode: Some(0o4755), ..SetAttr::default() }).unwrap();
    assert_eq!(ns.wrote(&root(), f.ino, 5).unwrap().mode, 0o4755, "root's writes keep them");
    assert_eq!(errno(ns.wrote(&root(), ROOT_INO, 5)), EINVAL);
}

// ---- statfs / manifest ----

#[test]
fn statfs_reports_the_store_capacity() {
    let ns = namespace();
    file(&ns, &root(), ROOT_INO, "f", 0o644);
    let s = ns.statfs().unwrap();
    assert_eq!(
        (s.block_bytes, s.blocks, s.blocks_free, s.blocks_avail),
        (4096, 8 * crate::GIB / 4096, 3 * crate::GIB / 4096, 3 * crate::GIB / 4096)
    );
    assert_eq!((s.files, s.files_free, s.name_bytes_max), (4_000_000, 4_000_000 - 2, 255));
}

#[test]
fn statfs_reports_the_reservation_capacity_and_the_file_sizes_as_used() {
    let capacity = std::sync::Arc::new(FixedCapacity(StoreCapacity {
        total_bytes: 8 * crate::GIB,
        free_bytes: 3 * crate::GIB,
        reservation_bytes: Some(64 << 20),
    }));
    let ns =
        LocalNamespace::in_memory(&crate::config(1), crate::clock(), capacity, crate::options());
    let f = file(&ns, &root(), ROOT_INO, "f", 0o644);
    ns.wrote(&root(), f.ino, 3 << 20).unwrap();
    let g = file(&ns, &root(), ROOT_INO, "g", 0o644);
    ns.wrote(&root(), g.ino, 1 << 20).unwrap();
    ns.link(&root(), g.ino, ROOT_INO, b"g-again").unwrap();
    ns.mkdir(&root(), ROOT_INO, b"d", 0o755, 0).unwrap();
    let s = ns.statfs().unwrap();
    assert_eq!(s.blocks, (64 << 20) / 4096);
    assert_eq!(s.blocks_free, (60 << 20) / 4096, "hard links and directories count no bytes");
    assert_eq!(s.blocks_avail, s.blocks_free);
}

#[test]
fn manifest_maps_data_files_to_paths() {
    let ns = namespace();
    let a = dir(&ns, &root(), ROOT_INO, "a", 0o755);
    let b = dir(&ns, &root(), a.ino, "b", 0o777);
    let deep = file(&ns, &user(3), b.ino, "deep.dat", 0o640);
    ns.wrote(&user(3), deep.ino, 123).unwrap();
    let top = file(&ns, &root(), ROOT_INO, "top", 0o644);
    ns.link(&root(), top.ino, b.ino, b"again").unwrap();
    ns.symlink(&root(), ROOT_INO, b"s", b"top").unwrap();
    ns.open(&root(), top.ino, O_WRONLY | O_TRUNC).unwrap();
    let manifest = ns.manifest().unwrap();
    let pairs: Vec<_> = manifest
        .iter()
        .map(|m| (m.file_name.clone(), String::from_utf8(m.path.clone()).unwrap(), m.size))
        .collect();
    assert_eq!(
        pairs,
        [
            (format!("ns/1/{}.1", top.ino), "top".to_string(), 0),
            (format!("ns/1/{}.0", deep.ino), "a/b/deep.dat".to_string(), 123)
        ]
    );
    assert_eq!((manifest[1].uid, manifest[1].mode), (3, 0o640));
}
