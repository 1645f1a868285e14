//! The mount's test suites, parametrized by a root directory so that each runs first against a
//! plain local directory (which validates the suite itself) and then against a Spillway mount:
//!
//! - [`conformance`]: many small POSIX cases per operation, including the error cases; returns
//!   passed/total and the failures.
//! - [`random_ops`]: seeded random open/write/truncate/read/rename/unlink steps on two roots side
//!   by side, comparing after every step.
//! - [`tools`]: unmodified programs (cp -r + diff -r, tar, dd, Python sqlite3, git).
//!
//! Permission cases run as uid 1000 through `setpriv` and a one-line Python program that prints
//! the errno of the operation (0 on success).

#![allow(dead_code)]

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The unprivileged user of the permission cases.
pub const USER_UID: u32 = 1000;
pub const USER_GID: u32 = 1000;

type CaseResult = Result<(), String>;

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn expect_errno<T>(what: &str, result: std::io::Result<T>, want: i32) -> CaseResult {
    match result {
        Ok(_) => Err(format!("{what}: succeeded, expected errno {want}")),
        Err(e) if errno_of(&e) == want => Ok(()),
        Err(e) => Err(format!("{what}: got {e}, expected errno {want}")),
    }
}

fn ok<T>(what: &str, result: std::io::Result<T>) -> Result<T, String> {
    result.map_err(|e| format!("{what}: {e}"))
}

fn check(condition: bool, what: impl Into<String>) -> CaseResult {
    if condition {
        Ok(())
    } else {
        Err(what.into())
    }
}

fn cstr(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

fn last_error<T>(rc: libc::c_int, value: T) -> std::io::Result<T> {
    if rc == 0 {
        Ok(value)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> std::io::Result<()> {
    let (a, b) = (cstr(from), cstr(to));
    // SAFETY: valid NUL-terminated paths; AT_FDCWD.
    let rc =
        unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags) };
    last_error(rc, ())
}

fn mknod(path: &Path, mode: u32, dev: u64) -> std::io::Result<()> {
    let p = cstr(path);
    // SAFETY: valid path.
    let rc = unsafe { libc::mknod(p.as_ptr(), mode, dev) };
    last_error(rc, ())
}

fn utimens(path: &Path, atime: (i64, i64), mtime: (i64, i64)) -> std::io::Result<()> {
    let p = cstr(path);
    let times = [
        libc::timespec { tv_sec: atime.0, tv_nsec: atime.1 },
        libc::timespec { tv_sec: mtime.0, tv_nsec: mtime.1 },
    ];
    // SAFETY: valid path and a two-element array.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) };
    last_error(rc, ())
}

pub fn statvfs(path: &Path) -> std::io::Result<libc::statvfs> {
    let p = cstr(path);
    // SAFETY: zeroed statvfs is a valid out-parameter.
    let mut out: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is NUL-terminated and `out` a valid statvfs to fill.
    let rc = unsafe { libc::statvfs(p.as_ptr(), &mut out) };
    last_error(rc, out)
}

fn access(path: &Path, mode: i32) -> std::io::Result<()> {
    let p = cstr(path);
    // SAFETY: valid path.
    let rc = unsafe { libc::access(p.as_ptr(), mode) };
    last_error(rc, ())
}

/// The Python used for unprivileged helpers (outside /root, readable by uid 1000).
fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// Runs `code` (Python, with `os` imported and `p` bound to `path`) as uid 1000 (plus the
/// supplementary `groups`); returns the errno it raised, 0 if none.
pub fn as_user(path: &Path, code: &str, groups: &[u32]) -> Result<i32, String> {
    let program = format!(
        "import os, sys\np = sys.argv[1]\ntry:\n    {}\n    print(0)\nexcept OSError as e:\n    print(e.errno)\n",
        code.replace('\n', "\n    ")
    );
    let mut command = Command::new("setpriv");
    command.arg(format!("--reuid={USER_UID}")).arg(format!("--regid={USER_GID}"));
    if groups.is_empty() {
        command.arg("--clear-groups");
    } else {
        command.arg(format!(
            "--groups={}",
            groups.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",")
        ));
    }
    let out = command
        .arg(python())
        .arg("-c")
        .arg(&program)
        .arg(path)
        .current_dir("/")
        .output()
        .map_err(|e| format!("setpriv: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().parse().map_err(|_| {
        format!("helper printed {text:?}, stderr {}", String::from_utf8_lossy(&out.stderr))
    })
}

fn user_expect(path: &Path, code: &str, want: i32) -> CaseResult {
    user_expect_groups(path, code, want, &[])
}

fn user_expect_groups(path: &Path, code: &str, want: i32, groups: &[u32]) -> CaseResult {
    let got = as_user(path, code, groups)?;
    check(
        got == want,
        format!("as uid {USER_UID}: `{code}` on {}: errno {got}, expected {want}", path.display()),
    )
}

/// Deterministic bytes for a (seed, length).
pub fn bytes(seed: u64, length: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = vec![0u8; length];
    rng.fill(&mut out[..]);
    out
}

fn write_file(path: &Path, data: &[u8]) -> CaseResult {
    ok(&format!("write {}", path.display()), fs::write(path, data))
}

fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    ok(&format!("read {}", path.display()), fs::read(path))
}

type Case = (&'static str, fn(&Path) -> CaseResult);

/// Every conformance case: name and body (run in its own empty directory).
pub fn cases() -> Vec<Case> {
    [
        create_cases(),
        open_flag_cases(),
        read_write_cases(),
        write_pattern_cases(),
        truncate_cases(),
        truncate_path_cases(),
        directory_cases(),
        unlink_cases(),
        readdir_cases(),
        rename_cases(),
        rename_special_cases(),
        symlink_cases(),
        hard_link_cases(),
        attribute_cases(),
        attribute_update_cases(),
        special_file_cases(),
        statfs_fsync_access_cases(),
        user_file_permission_cases(),
        user_directory_permission_cases(),
        user_privilege_cases(),
        user_special_file_permission_cases(),
        fallocate_cases(),
    ]
    .concat()
}

/// Creating and opening files, and the errors of create and open.
fn create_cases() -> Vec<Case> {
    vec![
        ("create_empty_file", |d| {
            let p = d.join("f");
            ok("create", File::create(&p))?;
            let m = ok("stat", fs::metadata(&p))?;
            check(m.is_file() && m.len() == 0, "new file is an empty regular file")
        }),
        ("create_excl_existing_eexist", |d| {
            let p = d.join("f");
            write_file(&p, b"x")?;
            expect_errno(
                "O_CREAT|O_EXCL",
                OpenOptions::new().write(true).create_new(true).open(&p),
                libc::EEXIST,
            )
        }),
        ("create_excl_new_ok", |d| {
            ok("O_CREAT|O_EXCL", OpenOptions::new().write(true).create_new(true).open(d.join("f")))
                .map(|_| ())
        }),
        ("open_missing_enoent", |d| {
            expect_errno("open", File::open(d.join("missing")), libc::ENOENT)
        }),
        ("create_in_missing_dir_enoent", |d| {
            expect_errno("create", File::create(d.join("no/f")), libc::ENOENT)
        }),
        ("open_through_file_enotdir", |d| {
            write_file(&d.join("f"), b"x")?;
            expect_errno("open f/x", File::open(d.join("f/x")), libc::ENOTDIR)
        }),
        ("open_dir_for_write_eisdir", |d| {
            ok("mkdir", fs::create_dir(d.join("sub")))?;
            expect_errno(
                "open dir O_WRONLY",
                OpenOptions::new().write(true).open(d.join("sub")),
                libc::EISDIR,
            )
        }),
        ("name_255_ok_256_enametoolong", |d| {
            let long = "n".repeat(255);
            write_file(&d.join(&long), b"x")?;
            check(read_file(&d.join(&long))? == b"x", "255-byte name reads back")?;
            expect_errno(
                "create 256-byte name",
                File::create(d.join("n".repeat(256))),
                libc::ENAMETOOLONG,
            )
        }),
    ]
}

/// `O_TRUNC`, `O_APPEND` and the mode a file is created with.
fn open_flag_cases() -> Vec<Case> {
    vec![
        ("open_trunc_empties", |d| {
            let p = d.join("f");
            write_file(&p, b"hello world")?;
            ok("O_TRUNC", OpenOptions::new().write(true).truncate(true).open(&p))?;
            check(ok("stat", fs::metadata(&p))?.len() == 0, "O_TRUNC leaves size 0")?;
            check(read_file(&p)?.is_empty(), "O_TRUNC leaves no bytes")
        }),
        ("open_trunc_then_write", |d| {
            let p = d.join("f");
            write_file(&p, &bytes(1, 100_000))?;
            write_file(&p, b"short")?;
            check(read_file(&p)? == b"short", "rewrite after O_TRUNC")
        }),
        ("append_appends", |d| {
            let p = d.join("f");
            write_file(&p, b"ab")?;
            let mut f = ok("open append", OpenOptions::new().append(true).open(&p))?;
            ok("write", f.write_all(b"cd"))?;
            ok("write", f.write_all(b"ef"))?;
            drop(f);
            check(read_file(&p)? == b"abcdef", "O_APPEND writes at the end")
        }),
        ("append_two_handles", |d| {
            let p = d.join("f");
            let mut a = ok("open a", OpenOptions::new().create(true).append(true).open(&p))?;
            let mut b = ok("open b", OpenOptions::new().append(true).open(&p))?;
            ok("a", a.write_all(b"11"))?;
            ok("b", b.write_all(b"22"))?;
            ok("a", a.write_all(b"33"))?;
            drop((a, b));
            check(read_file(&p)? == b"112233", "appends through two handles interleave at the end")
        }),
        ("create_mode_applied", |d| {
            let p = d.join("f");
            ok(
                "create 0600",
                OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(&p),
            )?;
            let mode = ok("stat", fs::metadata(&p))?.mode() & 0o7777;
            check(mode == 0o600, format!("mode {mode:o}, expected 600"))
        }),
        ("create_readonly_mode_still_writable_by_creator", |d| {
            let p = d.join("f");
            let mut f = ok(
                "create 0444",
                OpenOptions::new().write(true).create(true).truncate(false).mode(0o444).open(&p),
            )?;
            ok("write", f.write_all(b"data"))?;
            drop(f);
            check(read_file(&p)? == b"data", "creator writes through its handle")
        }),
    ]
}

/// Writes read back: whole files, a sparse hole, reads at and past the end.
fn read_write_cases() -> Vec<Case> {
    vec![
        ("write_read_back", |d| {
            let p = d.join("f");
            let data = bytes(2, 12345);
            write_file(&p, &data)?;
            check(read_file(&p)? == data, "content")?;
            check(ok("stat", fs::metadata(&p))?.len() == 12345, "size")
        }),
        ("large_write_read_back", |d| {
            let p = d.join("f");
            let data = bytes(3, 3 * 1024 * 1024 + 77);
            write_file(&p, &data)?;
            check(read_file(&p)? == data, "3 MiB content")
        }),
        ("pwrite_sparse_hole_reads_zeros", |d| {
            let p = d.join("f");
            let f = ok("create", File::create(&p))?;
            ok("pwrite", f.write_all_at(b"tail", (1 << 20) + 17))?;
            drop(f);
            let got = read_file(&p)?;
            check(got.len() == (1 << 20) + 21, format!("size {}", got.len()))?;
            check(
                got[..(1 << 20) + 17].iter().all(|&b| b == 0) && &got[(1 << 20) + 17..] == b"tail",
                "hole is zeros",
            )
        }),
        ("read_past_eof_empty", |d| {
            let p = d.join("f");
            write_file(&p, b"abc")?;
            let f = ok("open", File::open(&p))?;
            let mut buf = [7u8; 10];
            let n = ok("pread past EOF", f.read_at(&mut buf, 100))?;
            check(n == 0, "read past EOF returns 0 bytes")?;
            let n = ok("pread across EOF", f.read_at(&mut buf, 1))?;
            check(n == 2 && &buf[..2] == b"bc", "read across EOF is short")
        }),
    ]
}

/// Overwrites in place, unaligned chunks, and reads and fstat through the writing handle.
fn write_pattern_cases() -> Vec<Case> {
    vec![
        ("overwrite_middle", |d| {
            let p = d.join("f");
            write_file(&p, b"0123456789")?;
            let f = ok("open", OpenOptions::new().write(true).open(&p))?;
            ok("pwrite", f.write_all_at(b"ab", 4))?;
            drop(f);
            check(read_file(&p)? == b"0123ab6789", "overwrite in place")
        }),
        ("unaligned_chunks", |d| {
            let p = d.join("f");
            let data = bytes(4, 300_001);
            let mut f = ok("create", File::create(&p))?;
            for chunk in data.chunks(4093) {
                ok("write", f.write_all(chunk))?;
            }
            drop(f);
            check(read_file(&p)? == data, "many unaligned writes")
        }),
        ("read_write_same_handle", |d| {
            let p = d.join("f");
            let mut f = ok(
                "open rw",
                OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p),
            )?;
            ok("write", f.write_all(b"hello"))?;
            ok("seek", f.seek(SeekFrom::Start(0)))?;
            let mut s = String::new();
            ok("read", f.read_to_string(&mut s))?;
            check(s == "hello", "read own write through the same handle")
        }),
        ("fstat_size_follows_writes", |d| {
            let p = d.join("f");
            let f = ok("create", File::create(&p))?;
            ok("pwrite", f.write_all_at(b"x", 999))?;
            check(ok("fstat", f.metadata())?.len() == 1000, "fstat size after pwrite")
        }),
    ]
}

/// Truncation through a handle: shrink, grow, and writes after either.
fn truncate_cases() -> Vec<Case> {
    vec![
        ("truncate_shrink", |d| {
            let p = d.join("f");
            write_file(&p, b"0123456789")?;
            ok("truncate", OpenOptions::new().write(true).open(&p).and_then(|f| f.set_len(4)))?;
            check(read_file(&p)? == b"0123", "shrunk content")
        }),
        ("truncate_grow_zeros", |d| {
            let p = d.join("f");
            write_file(&p, b"ab")?;
            ok("truncate", OpenOptions::new().write(true).open(&p).and_then(|f| f.set_len(5000)))?;
            let got = read_file(&p)?;
            check(
                got.len() == 5000 && &got[..2] == b"ab" && got[2..].iter().all(|&b| b == 0),
                "grown with zeros",
            )
        }),
        ("truncate_shrink_then_grow_zeros", |d| {
            let p = d.join("f");
            write_file(&p, &bytes(5, 200_000))?;
            let f = ok("open", OpenOptions::new().write(true).open(&p))?;
            ok("shrink", f.set_len(1000))?;
            ok("grow", f.set_len(150_000))?;
            drop(f);
            let got = read_file(&p)?;
            check(got.len() == 150_000, "size")?;
            check(got[..1000] == bytes(5, 200_000)[..1000], "kept prefix")?;
            check(got[1000..].iter().all(|&b| b == 0), "no stale bytes after shrink + grow")
        }),
        ("truncate_shrink_then_write_past_gap", |d| {
            let p = d.join("f");
            write_file(&p, &bytes(6, 100_000))?;
            let f = ok("open", OpenOptions::new().write(true).open(&p))?;
            ok("shrink", f.set_len(10))?;
            ok("pwrite past", f.write_all_at(b"end", 90_000))?;
            drop(f);
            let got = read_file(&p)?;
            check(
                got.len() == 90_003
                    && got[10..90_000].iter().all(|&b| b == 0)
                    && &got[90_000..] == b"end",
                "gap is zeros",
            )
        }),
        ("ftruncate_zero_then_write_offset", |d| {
            let p = d.join("f");
            write_file(&p, b"abcdefghijklmnop")?;
            let f = ok("open", OpenOptions::new().write(true).open(&p))?;
            ok("truncate 0", f.set_len(0))?;
            ok("pwrite", f.write_all_at(b"Z", 10))?;
            drop(f);
            check(read_file(&p)? == b"\0\0\0\0\0\0\0\0\0\0Z", "old bytes gone after truncate to 0")
        }),
    ]
}

/// `truncate(2)` by path, of a directory and of a file.
fn truncate_path_cases() -> Vec<Case> {
    vec![
        ("truncate_path_dir_eisdir", |d| {
            ok("mkdir", fs::create_dir(d.join("sub")))?;
            let p = cstr(&d.join("sub"));
            // SAFETY: valid path.
            let rc = unsafe { libc::truncate(p.as_ptr(), 0) };
            expect_errno("truncate(dir)", last_error(rc, ()), libc::EISDIR)
        }),
        ("truncate_path_without_handle", |d| {
            let p = d.join("f");
            write_file(&p, b"0123456789")?;
            let c = cstr(&p);
            // SAFETY: valid path.
            let rc = unsafe { libc::truncate(c.as_ptr(), 3) };
            ok("truncate(path)", last_error(rc, ()))?;
            check(read_file(&p)? == b"012", "truncate(2) by path")
        }),
    ]
}

/// `mkdir` and `rmdir`, their errors, and the link count of a directory.
fn directory_cases() -> Vec<Case> {
    vec![
        ("mkdir_stat", |d| {
            ok("mkdir", fs::create_dir(d.join("sub")))?;
            check(ok("stat", fs::metadata(d.join("sub")))?.is_dir(), "is a directory")
        }),
        ("mkdir_existing_eexist", |d| {
            ok("mkdir", fs::create_dir(d.join("sub")))?;
            expect_errno("mkdir again", fs::create_dir(d.join("sub")), libc::EEXIST)
        }),
        ("mkdir_over_file_eexist", |d| {
            write_file(&d.join("f"), b"")?;
            expect_errno("mkdir over file", fs::create_dir(d.join("f")), libc::EEXIST)
        }),
        ("mkdir_missing_parent_enoent", |d| {
            expect_errno("mkdir", fs::create_dir(d.join("a/b")), libc::ENOENT)
        }),
        ("rmdir_nonempty_enotempty", |d| {
            ok("mkdir", fs::create_dir_all(d.join("a/b")))?;
            expect_errno("rmdir", fs::remove_dir(d.join("a")), libc::ENOTEMPTY)
        }),
        ("rmdir_file_enotdir", |d| {
            write_file(&d.join("f"), b"")?;
            expect_errno("rmdir file", fs::remove_dir(d.join("f")), libc::ENOTDIR)
        }),
        ("rmdir_missing_enoent", |d| {
            expect_errno("rmdir", fs::remove_dir(d.join("missing")), libc::ENOENT)
        }),
        ("rmdir_empty_ok", |d| {
            ok("mkdir", fs::create_dir(d.join("a")))?;
            ok("rmdir", fs::remove_dir(d.join("a")))?;
            expect_errno("stat removed", fs::metadata(d.join("a")), libc::ENOENT)
        }),
        ("dir_nlink_counts_subdirs", |d| {
            ok("mkdir", fs::create_dir(d.join("a")))?;
            for i in 0..3 {
                ok("mkdir", fs::create_dir(d.join(format!("a/s{i}"))))?;
            }
            write_file(&d.join("a/file"), b"")?;
            let n = ok("stat", fs::metadata(d.join("a")))?.nlink();
            check(n == 5, format!("nlink {n}, expected 5"))
        }),
    ]
}

/// `unlink`, its errors, and a file that is open or re-created after it.
fn unlink_cases() -> Vec<Case> {
    vec![
        ("unlink_removes", |d| {
            let p = d.join("f");
            write_file(&p, b"x")?;
            ok("unlink", fs::remove_file(&p))?;
            expect_errno("stat", fs::metadata(&p), libc::ENOENT)
        }),
        ("unlink_dir_eisdir", |d| {
            ok("mkdir", fs::create_dir(d.join("sub")))?;
            expect_errno("unlink dir", fs::remove_file(d.join("sub")), libc::EISDIR)
        }),
        ("unlink_missing_enoent", |d| {
            expect_errno("unlink", fs::remove_file(d.join("missing")), libc::ENOENT)
        }),
        ("unlink_open_file_still_usable", |d| {
            let p = d.join("f");
            let mut f = ok(
                "open",
                OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p),
            )?;
            ok("write", f.write_all(b"before"))?;
            ok("unlink", fs::remove_file(&p))?;
            ok("write after unlink", f.write_all(b"+after"))?;
            let mut buf = vec![0u8; 12];
            ok("read after unlink", f.read_exact_at(&mut buf, 0))?;
            check(buf == b"before+after", "open handle keeps the file")?;
            expect_errno("stat path", fs::metadata(&p), libc::ENOENT)
        }),
        ("create_after_unlink_is_new_file", |d| {
            let p = d.join("f");
            write_file(&p, b"old content")?;
            ok("unlink", fs::remove_file(&p))?;
            write_file(&p, b"new")?;
            check(read_file(&p)? == b"new", "re-created file has only new bytes")
        }),
    ]
}

/// `readdir`: many entries, none, after an unlink, entry kinds, and not a directory.
fn readdir_cases() -> Vec<Case> {
    vec![
        ("readdir_many_entries", |d| {
            let dir = d.join("many");
            ok("mkdir", fs::create_dir(&dir))?;
            for i in 0..600 {
                ok(
                    "create",
                    File::create(dir.join(format!("entry-{i:04}-{}", "x".repeat(i % 40)))),
                )?;
            }
            let mut names: Vec<String> = ok("readdir", fs::read_dir(&dir))?
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            let mut want: Vec<String> =
                (0..600).map(|i| format!("entry-{i:04}-{}", "x".repeat(i % 40))).collect();
            want.sort();
            check(names == want, format!("{} names listed, expected 600", names.len()))
        }),
        ("readdir_empty", |d| {
            ok("mkdir", fs::create_dir(d.join("e")))?;
            check(
                ok("readdir", fs::read_dir(d.join("e")))?.count() == 0,
                "empty directory lists nothing",
            )
        }),
        ("readdir_after_unlink", |d| {
            for n in ["a", "b", "c"] {
                write_file(&d.join(n), b"")?;
            }
            ok("unlink", fs::remove_file(d.join("b")))?;
            let mut names: Vec<String> = ok("readdir", fs::read_dir(d))?
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            check(names == ["a", "c"], format!("listed {names:?}"))
        }),
        ("readdir_kinds", |d| {
            ok("mkdir", fs::create_dir(d.join("dir")))?;
            write_file(&d.join("file"), b"")?;
            ok("symlink", std::os::unix::fs::symlink("file", d.join("link")))?;
            for entry in ok("readdir", fs::read_dir(d))? {
                let entry = entry.unwrap();
                let t = ok("file_type", entry.file_type())?;
                let name = entry.file_name();
                let good = match name.to_str().unwrap() {
                    "dir" => t.is_dir(),
                    "file" => t.is_file(),
                    "link" => t.is_symlink(),
                    _ => false,
                };
                check(good, format!("kind of {name:?}"))?;
            }
            Ok(())
        }),
        ("readdir_not_dir_enotdir", |d| {
            write_file(&d.join("f"), b"")?;
            expect_errno("opendir file", fs::read_dir(d.join("f")), libc::ENOTDIR)
        }),
    ]
}

/// `rename` within and across directories, over files and directories.
fn rename_cases() -> Vec<Case> {
    vec![
        ("rename_same_dir", |d| {
            write_file(&d.join("a"), b"x")?;
            ok("rename", fs::rename(d.join("a"), d.join("b")))?;
            check(read_file(&d.join("b"))? == b"x", "moved")?;
            expect_errno("old name", fs::metadata(d.join("a")), libc::ENOENT)
        }),
        ("rename_across_dirs", |d| {
            ok("mkdir", fs::create_dir(d.join("x")))?;
            ok("mkdir", fs::create_dir(d.join("y")))?;
            write_file(&d.join("x/f"), b"data")?;
            ok("rename", fs::rename(d.join("x/f"), d.join("y/g")))?;
            check(read_file(&d.join("y/g"))? == b"data", "moved across directories")
        }),
        ("rename_replaces_file", |d| {
            write_file(&d.join("a"), b"new")?;
            write_file(&d.join("b"), b"old old old")?;
            ok("rename", fs::rename(d.join("a"), d.join("b")))?;
            check(read_file(&d.join("b"))? == b"new", "target replaced")
        }),
        ("rename_dir_over_empty_dir", |d| {
            ok("mkdir", fs::create_dir_all(d.join("a/inner")))?;
            ok("mkdir", fs::create_dir(d.join("b")))?;
            ok("rename", fs::rename(d.join("a"), d.join("b")))?;
            check(
                ok("stat", fs::metadata(d.join("b/inner")))?.is_dir(),
                "directory replaced the empty one",
            )
        }),
        ("rename_dir_over_nonempty_enotempty", |d| {
            ok("mkdir", fs::create_dir(d.join("a")))?;
            ok("mkdir", fs::create_dir_all(d.join("b/c")))?;
            let r = fs::rename(d.join("a"), d.join("b"));
            match r {
                Err(e) if errno_of(&e) == libc::ENOTEMPTY || errno_of(&e) == libc::EEXIST => Ok(()),
                other => Err(format!("rename over non-empty dir: {other:?}")),
            }
        }),
        ("rename_file_over_dir_eisdir", |d| {
            write_file(&d.join("f"), b"")?;
            ok("mkdir", fs::create_dir(d.join("dir")))?;
            expect_errno(
                "rename file over dir",
                fs::rename(d.join("f"), d.join("dir")),
                libc::EISDIR,
            )
        }),
        ("rename_dir_over_file_enotdir", |d| {
            write_file(&d.join("f"), b"")?;
            ok("mkdir", fs::create_dir(d.join("dir")))?;
            expect_errno(
                "rename dir over file",
                fs::rename(d.join("dir"), d.join("f")),
                libc::ENOTDIR,
            )
        }),
    ]
}

/// `rename` into itself or of a missing name, the `renameat2` flags, hard links, open files.
fn rename_special_cases() -> Vec<Case> {
    vec![
        ("rename_into_own_subdir_einval", |d| {
            ok("mkdir", fs::create_dir_all(d.join("a/b")))?;
            expect_errno(
                "rename a -> a/b/c",
                fs::rename(d.join("a"), d.join("a/b/c")),
                libc::EINVAL,
            )
        }),
        ("rename_missing_enoent", |d| {
            expect_errno("rename", fs::rename(d.join("no"), d.join("x")), libc::ENOENT)
        }),
        ("rename_noreplace_eexist", |d| {
            write_file(&d.join("a"), b"1")?;
            write_file(&d.join("b"), b"2")?;
            expect_errno(
                "RENAME_NOREPLACE",
                renameat2(&d.join("a"), &d.join("b"), libc::RENAME_NOREPLACE),
                libc::EEXIST,
            )?;
            check(read_file(&d.join("b"))? == b"2", "target untouched")
        }),
        ("rename_noreplace_new_ok", |d| {
            write_file(&d.join("a"), b"1")?;
            ok("RENAME_NOREPLACE", renameat2(&d.join("a"), &d.join("b"), libc::RENAME_NOREPLACE))?;
            check(read_file(&d.join("b"))? == b"1", "renamed")
        }),
        ("rename_exchange_swaps", |d| {
            write_file(&d.join("a"), b"A")?;
            ok("mkdir", fs::create_dir(d.join("b")))?;
            ok("RENAME_EXCHANGE", renameat2(&d.join("a"), &d.join("b"), libc::RENAME_EXCHANGE))?;
            check(ok("stat", fs::metadata(d.join("a")))?.is_dir(), "a is now the directory")?;
            check(read_file(&d.join("b"))? == b"A", "b is now the file")
        }),
        ("rename_exchange_missing_enoent", |d| {
            write_file(&d.join("a"), b"A")?;
            expect_errno(
                "RENAME_EXCHANGE",
                renameat2(&d.join("a"), &d.join("b"), libc::RENAME_EXCHANGE),
                libc::ENOENT,
            )
        }),
        ("rename_onto_own_hard_link_noop", |d| {
            write_file(&d.join("a"), b"x")?;
            ok("link", fs::hard_link(d.join("a"), d.join("b")))?;
            ok("rename", fs::rename(d.join("a"), d.join("b")))?;
            check(
                fs::metadata(d.join("a")).is_ok() && fs::metadata(d.join("b")).is_ok(),
                "both names remain",
            )
        }),
        ("rename_open_file_keeps_handle", |d| {
            let mut f = ok("create", File::create(d.join("a")))?;
            ok("rename", fs::rename(d.join("a"), d.join("b")))?;
            ok("write", f.write_all(b"via handle"))?;
            drop(f);
            check(read_file(&d.join("b"))? == b"via handle", "writes follow the inode")
        }),
    ]
}

/// Symbolic links: targets, following, dangling links and loops.
fn symlink_cases() -> Vec<Case> {
    vec![
        ("symlink_readlink", |d| {
            ok("symlink", std::os::unix::fs::symlink("some/target", d.join("l")))?;
            check(
                ok("readlink", fs::read_link(d.join("l")))? == Path::new("some/target"),
                "target stored verbatim",
            )
        }),
        ("symlink_follow", |d| {
            write_file(&d.join("f"), b"through link")?;
            ok("symlink", std::os::unix::fs::symlink("f", d.join("l")))?;
            check(read_file(&d.join("l"))? == b"through link", "read through the link")
        }),
        ("symlink_existing_eexist", |d| {
            write_file(&d.join("f"), b"")?;
            expect_errno(
                "symlink over file",
                std::os::unix::fs::symlink("x", d.join("f")),
                libc::EEXIST,
            )
        }),
        ("readlink_regular_einval", |d| {
            write_file(&d.join("f"), b"")?;
            expect_errno("readlink file", fs::read_link(d.join("f")), libc::EINVAL)
        }),
        ("symlink_dangling", |d| {
            ok("symlink", std::os::unix::fs::symlink("nowhere", d.join("l")))?;
            check(
                ok("lstat", fs::symlink_metadata(d.join("l")))?.file_type().is_symlink(),
                "lstat sees the link",
            )?;
            expect_errno("stat", fs::metadata(d.join("l")), libc::ENOENT)
        }),
        ("symlink_loop_eloop", |d| {
            ok("symlink", std::os::unix::fs::symlink("b", d.join("a")))?;
            ok("symlink", std::os::unix::fs::symlink("a", d.join("b")))?;
            expect_errno("open loop", File::open(d.join("a")), libc::ELOOP)
        }),
        ("symlink_size_is_target_length", |d| {
            ok("symlink", std::os::unix::fs::symlink("0123456789", d.join("l")))?;
            check(ok("lstat", fs::symlink_metadata(d.join("l")))?.len() == 10, "lstat size")
        }),
    ]
}

/// Hard links: a shared inode, the errors of `link`, and unlinking one name.
fn hard_link_cases() -> Vec<Case> {
    vec![
        ("link_shares_inode", |d| {
            write_file(&d.join("a"), b"shared")?;
            ok("link", fs::hard_link(d.join("a"), d.join("b")))?;
            let (ma, mb) =
                (ok("stat", fs::metadata(d.join("a")))?, ok("stat", fs::metadata(d.join("b")))?);
            check(ma.ino() == mb.ino() && ma.nlink() == 2, "same inode, two links")?;
            let f = ok("open b", OpenOptions::new().write(true).open(d.join("b")))?;
            ok("pwrite", f.write_all_at(b"S", 0))?;
            drop(f);
            check(
                read_file(&d.join("a"))? == b"Shared",
                "write through one link shows in the other",
            )
        }),
        ("link_dir_eperm", |d| {
            ok("mkdir", fs::create_dir(d.join("dir")))?;
            expect_errno("link dir", fs::hard_link(d.join("dir"), d.join("l")), libc::EPERM)
        }),
        ("link_existing_eexist", |d| {
            write_file(&d.join("a"), b"")?;
            write_file(&d.join("b"), b"")?;
            expect_errno("link over file", fs::hard_link(d.join("a"), d.join("b")), libc::EEXIST)
        }),
        ("link_unlink_one_keeps_other", |d| {
            write_file(&d.join("a"), b"keep")?;
            ok("link", fs::hard_link(d.join("a"), d.join("b")))?;
            ok("unlink", fs::remove_file(d.join("a")))?;
            check(read_file(&d.join("b"))? == b"keep", "content survives")?;
            check(ok("stat", fs::metadata(d.join("b")))?.nlink() == 1, "nlink back to 1")
        }),
        ("link_missing_enoent", |d| {
            expect_errno("link", fs::hard_link(d.join("no"), d.join("l")), libc::ENOENT)
        }),
    ]
}

/// `chmod`, `chown` and `utimensat` set what they are given.
fn attribute_cases() -> Vec<Case> {
    vec![
        ("chmod_sets_mode", |d| {
            let p = d.join("f");
            write_file(&p, b"")?;
            ok("chmod", fs::set_permissions(&p, fs::Permissions::from_mode(0o4751)))?;
            let mode = ok("stat", fs::metadata(&p))?.mode() & 0o7777;
            check(mode == 0o4751, format!("mode {mode:o}"))
        }),
        ("chown_root", |d| {
            let p = d.join("f");
            write_file(&p, b"")?;
            ok("chown", std::os::unix::fs::chown(&p, Some(1234), Some(5678)))?;
            let m = ok("stat", fs::metadata(&p))?;
            check(m.uid() == 1234 && m.gid() == 5678, "owner and group changed")
        }),
        ("chown_clears_suid_sgid", |d| {
            let p = d.join("f");
            write_file(&p, b"")?;
            ok("chmod", fs::set_permissions(&p, fs::Permissions::from_mode(0o6755)))?;
            ok("chown", std::os::unix::fs::chown(&p, Some(USER_UID), Some(USER_GID)))?;
            let mode = ok("stat", fs::metadata(&p))?.mode() & 0o7777;
            check(mode & 0o6000 == 0, format!("mode {mode:o} after chown"))
        }),
        ("utimens_explicit", |d| {
            let p = d.join("f");
            write_file(&p, b"")?;
            ok("utimensat", utimens(&p, (1_000_000_000, 5), (1_100_000_000, 123_456_789)))?;
            let m = ok("stat", fs::metadata(&p))?;
            check(
                m.atime() == 1_000_000_000
                    && m.mtime() == 1_100_000_000
                    && m.mtime_nsec() == 123_456_789,
                "times set",
            )
        }),
        ("utimens_now", |d| {
            let p = d.join("f");
            write_file(&p, b"")?;
            ok("utimensat", utimens(&p, (1, 0), (1, 0)))?;
            ok("utimensat now", utimens(&p, (0, libc::UTIME_NOW), (0, libc::UTIME_NOW)))?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            let m = ok("stat", fs::metadata(&p))?;
            check((m.mtime() - now).abs() < 60, "mtime is now")
        }),
    ]
}

/// The times that writes and `chmod` move, and `chmod` of a missing file.
fn attribute_update_cases() -> Vec<Case> {
    vec![
        ("write_updates_mtime", |d| {
            let p = d.join("f");
            write_file(&p, b"a")?;
            ok("utimensat", utimens(&p, (1000, 0), (1000, 0)))?;
            let f = ok("open", OpenOptions::new().write(true).open(&p))?;
            ok("pwrite", f.write_all_at(b"b", 1))?;
            drop(f);
            check(ok("stat", fs::metadata(&p))?.mtime() > 1000, "mtime moved on write")
        }),
        ("chmod_updates_ctime", |d| {
            let p = d.join("f");
            write_file(&p, b"")?;
            let before = ok("stat", fs::metadata(&p))?;
            std::thread::sleep(std::time::Duration::from_millis(20));
            ok("chmod", fs::set_permissions(&p, fs::Permissions::from_mode(0o600)))?;
            let after = ok("stat", fs::metadata(&p))?;
            check(
                (after.ctime(), after.ctime_nsec()) > (before.ctime(), before.ctime_nsec()),
                "ctime moved on chmod",
            )
        }),
        ("chmod_missing_enoent", |d| {
            expect_errno(
                "chmod",
                fs::set_permissions(d.join("no"), fs::Permissions::from_mode(0o600)),
                libc::ENOENT,
            )
        }),
    ]
}

/// FIFOs, sockets and character devices made with `mkfifo` and `mknod`.
fn special_file_cases() -> Vec<Case> {
    vec![
        ("mkfifo", |d| {
            let p = d.join("fifo");
            let c = cstr(&p);
            // SAFETY: valid path.
            ok("mkfifo", last_error(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, ()))?;
            use std::os::unix::fs::FileTypeExt;
            check(ok("lstat", fs::symlink_metadata(&p))?.file_type().is_fifo(), "is a FIFO")
        }),
        ("mknod_socket", |d| {
            let p = d.join("sock");
            ok("mknod", mknod(&p, libc::S_IFSOCK | 0o600, 0))?;
            use std::os::unix::fs::FileTypeExt;
            check(ok("lstat", fs::symlink_metadata(&p))?.file_type().is_socket(), "is a socket")
        }),
        ("mknod_char_device_root", |d| {
            let p = d.join("null");
            let dev = libc::makedev(1, 3);
            ok("mknod", mknod(&p, libc::S_IFCHR | 0o666, dev))?;
            let m = ok("lstat", fs::symlink_metadata(&p))?;
            use std::os::unix::fs::FileTypeExt;
            check(
                m.file_type().is_char_device() && m.rdev() == dev,
                format!("char device rdev {:x}", m.rdev()),
            )
        }),
        ("mknod_existing_eexist", |d| {
            write_file(&d.join("f"), b"")?;
            expect_errno("mknod", mknod(&d.join("f"), libc::S_IFIFO | 0o600, 0), libc::EEXIST)
        }),
    ]
}

/// `statvfs`, `fsync` and `fdatasync`, `access`, and a path near `PATH_MAX`.
fn statfs_fsync_access_cases() -> Vec<Case> {
    vec![
        ("statfs_reports_capacity", |d| {
            let s = ok("statvfs", statvfs(d))?;
            check(
                s.f_blocks > 0 && s.f_bsize > 0 && s.f_namemax == 255,
                format!("blocks {} bsize {} namemax {}", s.f_blocks, s.f_bsize, s.f_namemax),
            )
        }),
        ("fsync_and_fdatasync", |d| {
            let mut f = ok("create", File::create(d.join("f")))?;
            ok("write", f.write_all(&bytes(7, 100_000)))?;
            ok("fsync", f.sync_all())?;
            ok("fdatasync", f.sync_data())?;
            check(read_file(&d.join("f"))? == bytes(7, 100_000), "content after fsync")
        }),
        ("fsync_dir", |d| {
            let f = ok("open dir", File::open(d))?;
            ok("fsync dir", f.sync_all())
        }),
        ("access_root_ok_missing_enoent", |d| {
            write_file(&d.join("f"), b"")?;
            ok("access", access(&d.join("f"), libc::R_OK | libc::W_OK))?;
            expect_errno("access missing", access(&d.join("no"), libc::F_OK), libc::ENOENT)
        }),
        ("path_near_path_max", |d| {
            // Nested 200-byte names up to ~3900 bytes of path below the case directory.
            let mut p = d.to_path_buf();
            let base = d.as_os_str().len();
            while p.as_os_str().len() + 201 < base + 3600 {
                p.push("d".repeat(200));
                ok("mkdir", fs::create_dir(&p))?;
            }
            p.push("file");
            write_file(&p, b"deep")?;
            check(read_file(&p)? == b"deep", "deep file")
        }),
    ]
}

/// Permissions on files, checked as uid 1000.
fn user_file_permission_cases() -> Vec<Case> {
    vec![
        ("user_create_in_root_dir_eacces", |d| {
            ok("chmod", fs::set_permissions(d, fs::Permissions::from_mode(0o755)))?;
            user_expect(&d.join("f"), "open(p, 'w')", libc::EACCES)
        }),
        ("user_read_0600_eacces", |d| {
            let p = d.join("f");
            write_file(&p, b"secret")?;
            ok("chmod", fs::set_permissions(&p, fs::Permissions::from_mode(0o600)))?;
            user_expect(&p, "open(p).read()", libc::EACCES)
        }),
        ("user_read_0644_ok", |d| {
            let p = d.join("f");
            write_file(&p, b"public")?;
            ok("chmod", fs::set_permissions(&p, fs::Permissions::from_mode(0o644)))?;
            user_expect(&p, "assert open(p).read() == 'public'", 0)
        }),
        ("user_write_0644_eacces", |d| {
            let p = d.join("f");
            write_file(&p, b"")?;
            ok("chmod", fs::set_permissions(&p, fs::Permissions::from_mode(0o644)))?;
            user_expect(&p, "open(p, 'r+')", libc::EACCES)
        }),
        ("user_access_w_ok_eacces", |d| {
            let p = d.join("f");
            write_file(&p, b"")?;
            ok("chmod", fs::set_permissions(&p, fs::Permissions::from_mode(0o644)))?;
            user_expect(
                &p,
                "import errno\nif not os.access(p, os.W_OK): raise OSError(errno.EACCES, 'denied')",
                libc::EACCES,
            )
        }),
        ("user_chmod_others_file_eperm", |d| {
            let p = d.join("f");
            write_file(&p, b"")?;
            user_expect(&p, "os.chmod(p, 0o777)", libc::EPERM)
        }),
        ("user_chown_eperm", |d| {
            let p = d.join("f");
            write_file(&p, b"")?;
            ok("chown", std::os::unix::fs::chown(&p, Some(USER_UID), Some(USER_GID)))?;
            user_expect(&p, "os.chown(p, 0, 0)", libc::EPERM)
        }),
        ("user_create_in_0777_dir_ok", |d| {
            ok("chmod", fs::set_permissions(d, fs::Permissions::from_mode(0o777)))?;
            user_expect(&d.join("mine"), "open(p, 'w').write('x')", 0)?;
            let m = ok("stat", fs::metadata(d.join("mine")))?;
            check(m.uid() == USER_UID && m.gid() == USER_GID, "file owned by the creating user")
        }),
    ]
}

/// Sticky, search and read permissions on directories, checked as uid 1000.
fn user_directory_permission_cases() -> Vec<Case> {
    vec![
        ("user_sticky_unlink_others_eperm", |d| {
            ok("chmod", fs::set_permissions(d, fs::Permissions::from_mode(0o1777)))?;
            write_file(&d.join("roots"), b"")?;
            let got = as_user(&d.join("roots"), "os.unlink(p)", &[])?;
            check(
                got == libc::EPERM || got == libc::EACCES,
                format!("errno {got}, expected EPERM"),
            )?;
            check(d.join("roots").exists(), "file still there")
        }),
        ("user_sticky_unlink_own_ok", |d| {
            ok("chmod", fs::set_permissions(d, fs::Permissions::from_mode(0o1777)))?;
            user_expect(&d.join("mine"), "open(p, 'w').close()\nos.unlink(p)", 0)
        }),
        ("user_nonsticky_unlink_others_ok", |d| {
            ok("chmod", fs::set_permissions(d, fs::Permissions::from_mode(0o777)))?;
            write_file(&d.join("roots"), b"")?;
            user_expect(&d.join("roots"), "os.unlink(p)", 0)
        }),
        ("user_search_denied_eacces", |d| {
            ok("mkdir", fs::create_dir(d.join("private")))?;
            write_file(&d.join("private/f"), b"")?;
            ok("chmod", fs::set_permissions(d.join("private"), fs::Permissions::from_mode(0o700)))?;
            user_expect(&d.join("private/f"), "os.stat(p)", libc::EACCES)
        }),
        ("user_readdir_denied_eacces", |d| {
            ok("mkdir", fs::create_dir(d.join("noread")))?;
            ok("chmod", fs::set_permissions(d.join("noread"), fs::Permissions::from_mode(0o711)))?;
            user_expect(&d.join("noread"), "os.listdir(p)", libc::EACCES)
        }),
    ]
}

/// What only owners, group members or root may do, checked as uid 1000.
fn user_privilege_cases() -> Vec<Case> {
    vec![
        ("user_write_clears_suid", |d| {
            let p = d.join("f");
            write_file(&p, b"abc")?;
            ok("chmod", fs::set_permissions(&p, fs::Permissions::from_mode(0o4777)))?;
            user_expect(&p, "f = open(p, 'r+')\nf.write('X')\nf.close()", 0)?;
            let mode = ok("stat", fs::metadata(&p))?.mode() & 0o7777;
            check(mode & 0o4000 == 0, format!("mode {mode:o} after a write by another user"))
        }),
        ("user_group_member_reads", |d| {
            let p = d.join("f");
            write_file(&p, b"group")?;
            ok("chown", std::os::unix::fs::chown(&p, Some(0), Some(4242)))?;
            ok("chmod", fs::set_permissions(&p, fs::Permissions::from_mode(0o640)))?;
            user_expect_groups(&p, "open(p).read()", 0, &[4242])?;
            user_expect(&p, "open(p).read()", libc::EACCES)
        }),
        ("user_utimes_explicit_on_others_eperm", |d| {
            let p = d.join("f");
            write_file(&p, b"")?;
            ok("chmod", fs::set_permissions(&p, fs::Permissions::from_mode(0o666)))?;
            user_expect(&p, "os.utime(p, (1, 1))", libc::EPERM)?;
            user_expect(&p, "os.utime(p)", 0)
        }),
        ("user_owner_chmod_ok", |d| {
            let p = d.join("f");
            write_file(&p, b"")?;
            ok("chown", std::os::unix::fs::chown(&p, Some(USER_UID), Some(USER_GID)))?;
            user_expect(&p, "os.chmod(p, 0o600)", 0)?;
            check(ok("stat", fs::metadata(&p))?.mode() & 0o7777 == 0o600, "owner changed the mode")
        }),
        ("user_mknod_chardev_eperm", |d| {
            ok("chmod", fs::set_permissions(d, fs::Permissions::from_mode(0o777)))?;
            user_expect(&d.join("dev"), "os.mknod(p, 0o20666, os.makedev(1, 3))", libc::EPERM)
        }),
    ]
}

/// The kernel opens FIFOs, sockets and device nodes without asking the file system; their
/// mode bits must hold all the same (pjdfstest open/06 and friends), checked as uid 1000.
fn user_special_file_permission_cases() -> Vec<Case> {
    vec![
        ("user_open_fifo_0600_eacces", |d| {
            let p = d.join("fifo");
            ok("mknod", mknod(&p, libc::S_IFIFO | 0o600, 0))?;
            user_expect(&p, "os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK))", libc::EACCES)
        }),
        ("user_open_fifo_0644_read_ok_write_eacces", |d| {
            let p = d.join("fifo");
            ok("mknod", mknod(&p, libc::S_IFIFO | 0o644, 0))?;
            user_expect(&p, "os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK))", 0)?;
            // Permitted, this would be ENXIO (no reader); not permitted, EACCES comes first.
            user_expect(&p, "os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))", libc::EACCES)
        }),
        ("user_connect_socket_0600_eacces", |d| {
            let p = d.join("sock");
            ok("mknod", mknod(&p, libc::S_IFSOCK | 0o600, 0))?;
            // Permitted, this would be ECONNREFUSED (nobody listens); connect needs write.
            user_expect(
                &p,
                "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect(p)",
                libc::EACCES,
            )?;
            ok("chmod", fs::set_permissions(&p, fs::Permissions::from_mode(0o666)))?;
            user_expect(
                &p,
                "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect(p)",
                libc::ECONNREFUSED,
            )
        }),
        ("user_open_char_device_0600_eacces", |d| {
            let p = d.join("null");
            ok("mknod", mknod(&p, libc::S_IFCHR | 0o600, libc::makedev(1, 3)))?;
            user_expect(&p, "os.close(os.open(p, os.O_RDONLY))", libc::EACCES)
        }),
    ]
}

fn fallocate(file: &File, mode: i32, offset: i64, length: i64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor; fallocate reads no memory of ours.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, length) };
    last_error(rc, ())
}

/// A 64 KiB file of pattern 3, opened read-write.
fn patterned(d: &Path) -> Result<(File, Vec<u8>), String> {
    let data = bytes(3, 65_536);
    write_file(&d.join("f"), &data)?;
    let file = ok("open", OpenOptions::new().read(true).write(true).open(d.join("f")))?;
    Ok((file, data))
}

/// fallocate(2): preallocation, punching holes and zeroing ranges.
fn fallocate_cases() -> Vec<Case> {
    vec![
        ("fallocate_grows_keep_size_does_not", |d| {
            let file = ok("create", File::create(d.join("f")))?;
            ok("fallocate", fallocate(&file, 0, 0, 100_000))?;
            check(ok("stat", file.metadata())?.len() == 100_000, "mode 0 grows to 100000")?;
            ok("fallocate keep", fallocate(&file, libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20))?;
            check(ok("stat", file.metadata())?.len() == 100_000, "KEEP_SIZE keeps the size")?;
            check(read_file(&d.join("f"))? == vec![0u8; 100_000], "preallocated bytes read zero")
        }),
        ("fallocate_punch_hole_reads_zeros", |d| {
            let (file, mut data) = patterned(d)?;
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            ok("punch", fallocate(&file, mode, 4096, 8192))?;
            data[4096..12_288].fill(0);
            check(ok("stat", file.metadata())?.len() == 65_536, "punching keeps the size")?;
            check(read_file(&d.join("f"))? == data, "the hole reads zeros, the rest is intact")?;
            // A hole past the end changes nothing.
            ok("punch past end", fallocate(&file, mode, 100_000, 4096))?;
            check(ok("stat", file.metadata())?.len() == 65_536, "size after a hole past EOF")
        }),
        ("fallocate_zero_range_grows", |d| {
            let (file, mut data) = patterned(d)?;
            ok("zero range", fallocate(&file, libc::FALLOC_FL_ZERO_RANGE, 60_000, 10_000))?;
            data.truncate(60_000);
            data.resize(70_000, 0);
            check(read_file(&d.join("f"))? == data, "zeros from 60000 to the new size 70000")
        }),
        ("fallocate_zero_range_keep_size", |d| {
            let (file, mut data) = patterned(d)?;
            let mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
            ok("zero range", fallocate(&file, mode, 65_000, 10_000))?;
            data[65_000..].fill(0);
            check(read_file(&d.join("f"))? == data, "zeros up to the unchanged size")
        }),
        ("fallocate_punch_without_keep_size_einval_or_eopnotsupp", |d| {
            let (file, _) = patterned(d)?;
            let result = fallocate(&file, libc::FALLOC_FL_PUNCH_HOLE, 0, 4096);
            let errno = result.err().and_then(|e| e.raw_os_error());
            check(
                matches!(errno, Some(libc::EINVAL | libc::EOPNOTSUPP)),
                format!("PUNCH_HOLE alone: errno {errno:?}"),
            )
        }),
    ]
}

/// Runs every case in its own directory under `root`; returns (passed, total, failures).
pub fn conformance(root: &Path) -> (usize, usize, Vec<String>) {
    let cases = cases();
    let total = cases.len();
    let mut failures = Vec::new();
    for (index, (name, body)) in cases.into_iter().enumerate() {
        let dir = root.join(format!("case-{index:03}-{name}"));
        if let Err(e) = fs::create_dir(&dir) {
            failures.push(format!("{name}: cannot create its directory {}: {e}", dir.display()));
            continue;
        }
        if let Err(message) = body(&dir) {
            failures.push(format!("{name}: {message}"));
        }
    }
    (total - failures.len(), total, failures)
}

/// One side of the randomized test: a root and its open handles, by file name.
struct Side {
    root: PathBuf,
    handles: Vec<(String, File)>,
}

/// The names the random operations work on.
const RANDOM_NAMES: [&str; 6] = ["f0", "f1", "f2", "f3", "sub/f4", "sub/f5"];

/// One operation's result on one side: what it read (empty for the others), or the errno.
type Outcome = Result<String, i32>;

/// One random step, drawn once and applied to both sides.
struct Step {
    /// Which operation, 0..100 (the ranges in `apply_to_path` and `apply_to_handle`).
    op: i32,
    name: &'static str,
    other: &'static str,
    offset: u64,
    length: usize,
    data: Vec<u8>,
    size: u64,
    handle_index: usize,
}

impl Step {
    /// Draws the next step from `rng`.
    fn draw(rng: &mut ChaCha8Rng) -> Step {
        let op = rng.gen_range(0..100);
        let name = RANDOM_NAMES[rng.gen_range(0..RANDOM_NAMES.len())];
        let other = RANDOM_NAMES[rng.gen_range(0..RANDOM_NAMES.len())];
        let offset: u64 =
            if rng.gen_bool(0.1) { rng.gen_range(0..3 << 20) } else { rng.gen_range(0..200_000) };
        let length: usize =
            if rng.gen_bool(0.05) { rng.gen_range(0..2 << 20) } else { rng.gen_range(0..70_000) };
        let data = bytes(rng.gen(), length);
        let size: u64 = rng.gen_range(0..250_000);
        let handle_index: usize = rng.gen();
        Step { op, name, other, offset, length, data, size, handle_index }
    }

    /// Applies the step to one side; returns its description and outcome.
    fn apply(&self, side: &mut Side) -> (String, Outcome) {
        match self.op {
            0..=76 => self.apply_to_path(side),
            _ => self.apply_to_handle(side),
        }
    }

    /// The operations on a path: pwrite, truncate, read, rename, unlink, rewrite, append.
    fn apply_to_path(&self, side: &Side) -> (String, Outcome) {
        let Step { name, other, offset, length, size, .. } = *self;
        let path = side.root.join(name);
        match self.op {
            0..=24 => (
                format!("pwrite {name} @{offset} +{length}"),
                (|| {
                    let f =
                        OpenOptions::new().write(true).create(true).truncate(false).open(&path)?;
                    f.write_all_at(&self.data, offset)
                })()
                .map(|_| String::new())
                .map_err(|e| errno_of(&e)),
            ),
            25..=34 => (
                format!("truncate {name} to {size}"),
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_len(size))
                    .map(|_| String::new())
                    .map_err(|e| errno_of(&e)),
            ),
            35..=44 => (
                format!("read {name} @{offset} +{length}"),
                read_range(&path, offset, length).map_err(|e: std::io::Error| errno_of(&e)),
            ),
            45..=54 => (
                format!("rename {name} -> {other}"),
                fs::rename(&path, side.root.join(other))
                    .map(|_| String::new())
                    .map_err(|e| errno_of(&e)),
            ),
            55..=62 => (
                format!("unlink {name}"),
                fs::remove_file(&path).map(|_| String::new()).map_err(|e| errno_of(&e)),
            ),
            63..=69 => (
                format!("O_TRUNC write {name} +{length}"),
                fs::write(&path, &self.data).map(|_| String::new()).map_err(|e| errno_of(&e)),
            ),
            _ => (
                format!("append {name} +{length}"),
                OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(&path)
                    .and_then(|mut f| f.write_all(&self.data))
                    .map(|_| String::new())
                    .map_err(|e| errno_of(&e)),
            ),
        }
    }

    /// The operations on open handles: open one (keeping the last four), pwrite, ftruncate.
    fn apply_to_handle(&self, side: &mut Side) -> (String, Outcome) {
        let Step { name, offset, length, size, handle_index, .. } = *self;
        match self.op {
            77..=84 => (
                format!("open handle on {name}"),
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(side.root.join(name))
                    .map(|f| {
                        side.handles.push((name.to_string(), f));
                        if side.handles.len() > 4 {
                            side.handles.remove(0);
                        }
                        String::new()
                    })
                    .map_err(|e| errno_of(&e)),
            ),
            85..=94 => {
                if side.handles.is_empty() {
                    ("no handle".to_string(), Ok(String::new()))
                } else {
                    let i = handle_index % side.handles.len();
                    let (hname, f) = &side.handles[i];
                    (
                        format!("pwrite via handle {i} ({hname}) @{offset} +{length}"),
                        f.write_all_at(&self.data, offset)
                            .map(|_| String::new())
                            .map_err(|e| errno_of(&e)),
                    )
                }
            }
            95..=96 => {
                if side.handles.is_empty() {
                    ("no handle".to_string(), Ok(String::new()))
                } else {
                    let i = handle_index % side.handles.len();
                    let (hname, f) = &side.handles[i];
                    (
                        format!("ftruncate handle {i} ({hname}) to {size}"),
                        f.set_len(size).map(|_| String::new()).map_err(|e| errno_of(&e)),
                    )
                }
            }
            _ => {
                if side.handles.is_empty() {
                    ("no handle".to_string(), Ok(String::new()))
                } else {
                    let i = handle_index % side.handles.len();
                    let (hname, f) = &side.handles[i];
                    let (mode, what) = match size % 3 {
                        0 => (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, "punch hole"),
                        1 => (libc::FALLOC_FL_ZERO_RANGE, "zero range"),
                        _ => (
                            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                            "zero range, keep size",
                        ),
                    };
                    (
                        format!("fallocate {what} via handle {i} ({hname}) @{offset} +{length}"),
                        fallocate(f, mode, offset as i64, length.max(1) as i64)
                            .map(|_| String::new())
                            .map_err(|e| errno_of(&e)),
                    )
                }
            }
        }
    }
}

/// Reads `length` bytes at `offset` (fewer at the end of the file); describes them by size and CRC.
fn read_range(path: &Path, offset: u64, length: usize) -> std::io::Result<String> {
    let f = File::open(path)?;
    let mut buf = vec![0u8; length];
    let mut done = 0;
    loop {
        let n = f.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 || done + n == length {
            done += n;
            break;
        }
        done += n;
    }
    buf.truncate(done);
    Ok(format!("{} bytes crc {:08x}", done, crc(&buf)))
}

/// Random operations on `a` and `b` side by side; after every step the touched files and the
/// directory listing must agree. Returns the number of steps run.
pub fn random_ops(a: &Path, b: &Path, seed: u64, steps: usize) -> Result<usize, String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut sides = [
        Side { root: a.to_path_buf(), handles: Vec::new() },
        Side { root: b.to_path_buf(), handles: Vec::new() },
    ];
    for side in &sides {
        fs::create_dir_all(side.root.join("sub")).map_err(|e| e.to_string())?;
    }
    for step in 0..steps {
        let drawn = Step::draw(&mut rng);
        let mut description = String::new();
        let mut outcomes = Vec::new();
        for side in &mut sides {
            let (text, outcome) = drawn.apply(side);
            description = text;
            outcomes.push(outcome);
        }
        if outcomes[0] != outcomes[1] {
            return Err(format!(
                "seed {seed} step {step} ({description}): outcomes differ: {:?} vs {:?}",
                outcomes[0], outcomes[1]
            ));
        }
        // Compare the touched names and the listing after every step; everything every 50.
        let compare: Vec<&str> =
            if step % 50 == 49 { RANDOM_NAMES.to_vec() } else { vec![drawn.name, drawn.other] };
        compare_files(&sides[0].root, &sides[1].root, &compare)
            .and_then(|()| compare_listings(&sides[0].root, &sides[1].root))
            .map_err(|difference| {
                format!("seed {seed} step {step} ({description}): {difference}")
            })?;
    }
    Ok(steps)
}

/// Checks that the files `names` read the same (or fail with the same errno) under `a` and `b`.
fn compare_files(a: &Path, b: &Path, names: &[&str]) -> Result<(), String> {
    for n in names {
        let x = fs::read(a.join(n)).map_err(|e| errno_of(&e));
        let y = fs::read(b.join(n)).map_err(|e| errno_of(&e));
        if x != y {
            let describe = |r: &Result<Vec<u8>, i32>| match r {
                Ok(v) => format!("{} bytes crc {:08x}", v.len(), crc(v)),
                Err(e) => format!("errno {e}"),
            };
            let first_diff = match (&x, &y) {
                (Ok(x), Ok(y)) => x
                    .iter()
                    .zip(y.iter())
                    .position(|(p, q)| p != q)
                    .map(|p| format!(", first difference at byte {p}"))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            return Err(format!("{n} differs: {} vs {}{first_diff}", describe(&x), describe(&y)));
        }
    }
    Ok(())
}

/// Checks that `a` and `b` list the same names in their root and `sub` directories.
fn compare_listings(a: &Path, b: &Path) -> Result<(), String> {
    let list = |root: &Path| -> Vec<String> {
        let mut names: Vec<String> = ["", "sub"]
            .iter()
            .flat_map(|d| {
                fs::read_dir(root.join(d))
                    .into_iter()
                    .flatten()
                    .map(move |e| format!("{d}/{}", e.unwrap().file_name().to_string_lossy()))
            })
            .collect();
        names.sort();
        names
    };
    let (la, lb) = (list(a), list(b));
    if la != lb {
        return Err(format!("listings differ: {la:?} vs {lb:?}"));
    }
    Ok(())
}

fn crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

fn run(command: &mut Command) -> Result<String, String> {
    let out = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{command:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Builds a small tree of files (nested directories, a 2 MiB file, a symlink, empty files).
pub fn make_tree(dir: &Path) -> Result<(), String> {
    let e = |e: std::io::Error| e.to_string();
    for d in ["a/b/c", "a/d", "e"] {
        fs::create_dir_all(dir.join(d)).map_err(e)?;
    }
    for i in 0..30 {
        let sub = ["a", "a/b", "a/b/c", "a/d", "e"][i % 5];
        fs::write(dir.join(sub).join(format!("file{i}")), bytes(i as u64, i * 1777)).map_err(e)?;
    }
    fs::write(dir.join("big"), bytes(99, 2 << 20)).map_err(e)?;
    std::os::unix::fs::symlink("a/b/file1", dir.join("link")).map_err(e)?;
    Ok(())
}

/// Unmodified tools working inside `root` (a directory on the file system under test), with
/// `scratch` a plain local directory for the reference copies.
pub fn tools(root: &Path, scratch: &Path) -> Result<(), String> {
    let source = scratch.join("tree");
    make_tree(&source)?;
    copy_and_tar(root, &source)?;
    dd_round_trip_and_patch(root, scratch)?;
    sqlite_with_rollback_journal(root)?;
    git_commit_and_fsck(root, scratch, &source)
}

/// `cp -r`, `tar` create and extract on the file system under test, each compared with `diff -r`.
fn copy_and_tar(root: &Path, source: &Path) -> Result<(), String> {
    // cp -r and diff -r
    run(Command::new("cp").arg("-r").arg(source).arg(root.join("copy")))?;
    run(Command::new("diff").arg("-r").arg(source).arg(root.join("copy")))?;
    // tar create on the mount, extract on the mount, compare
    run(Command::new("tar").arg("-C").arg(root).arg("-cf").arg(root.join("tree.tar")).arg("copy"))?;
    fs::create_dir(root.join("untar")).map_err(|e| e.to_string())?;
    run(Command::new("tar")
        .arg("-C")
        .arg(root.join("untar"))
        .arg("-xf")
        .arg(root.join("tree.tar")))?;
    run(Command::new("diff").arg("-r").arg(source).arg(root.join("untar/copy")))?;
    Ok(())
}

/// `dd` in and out in different block sizes, then a patch in the middle without truncating.
fn dd_round_trip_and_patch(root: &Path, scratch: &Path) -> Result<(), String> {
    // dd: 8 MiB in 1 MiB blocks with fsync, then read back with dd into the scratch dir
    fs::write(scratch.join("dd.in"), bytes(5, 8 << 20)).map_err(|e| e.to_string())?;
    run(Command::new("dd")
        .arg(format!("if={}", scratch.join("dd.in").display()))
        .arg(format!("of={}", root.join("dd.out").display()))
        .args(["bs=1M", "conv=fsync", "status=none"]))?;
    run(Command::new("dd")
        .arg(format!("if={}", root.join("dd.out").display()))
        .arg(format!("of={}", scratch.join("dd.back").display()))
        .args(["bs=64k", "status=none"]))?;
    run(Command::new("cmp").arg(scratch.join("dd.in")).arg(scratch.join("dd.back")))?;
    // dd seek: patch 4 KiB in the middle without truncating
    run(Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", root.join("dd.out").display()))
        .args(["bs=4k", "count=1", "seek=100", "conv=notrunc", "status=none"]))?;
    let patched = fs::read(root.join("dd.out")).map_err(|e| e.to_string())?;
    let mut want = bytes(5, 8 << 20);
    want[400 * 1024..404 * 1024].fill(0);
    check(patched == want, "dd conv=notrunc patch")
}

/// Python's sqlite3 with its rollback journal: inserts, deletes, a rolled-back transaction.
fn sqlite_with_rollback_journal(root: &Path) -> Result<(), String> {
    let program = r#"
import sqlite3, sys, os
path = sys.argv[1]
db = sqlite3.connect(path)
db.execute("PRAGMA journal_mode=DELETE")
db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
for batch in range(20):
    with db:
        db.executemany("INSERT INTO t (v) VALUES (?)", [("row %d %s" % (batch * 100 + i, "x" * (i % 50)),) for i in range(100)])
with db:
    db.execute("DELETE FROM t WHERE k % 3 = 0")
try:
    with db:
        db.execute("INSERT INTO t (v) VALUES ('rolled back')")
        raise RuntimeError("abort")
except RuntimeError:
    pass
db.close()
db = sqlite3.connect(path)
count = db.execute("SELECT count(*) FROM t").fetchone()[0]
assert count == 2000 - 666, count
assert db.execute("SELECT count(*) FROM t WHERE v = 'rolled back'").fetchone()[0] == 0
assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
print(count)
"#;
    let out = run(Command::new("python3").arg("-c").arg(program).arg(root.join("test.db")))?;
    check(out.trim() == "1334", format!("sqlite printed {out:?}"))
}

/// git init, add, commit, then verify with fsck, a clean status and the log of both commits.
fn git_commit_and_fsck(root: &Path, scratch: &Path, source: &Path) -> Result<(), String> {
    let repo = root.join("repo");
    run(Command::new("cp").arg("-r").arg(source).arg(&repo))?;
    let git = |args: &[&str]| {
        let mut c = Command::new("git");
        c.arg("-C")
            .arg(&repo)
            .args([
                "-c",
                "user.name=Spillway Test",
                "-c",
                "user.email=test@spillway.invalid",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args);
        c.env("GIT_CONFIG_NOSYSTEM", "1").env("HOME", scratch);
        c
    };
    run(&mut git(&["init", "-q"]))?;
    run(&mut git(&["add", "-A"]))?;
    run(&mut git(&["commit", "-q", "-m", "first commit on the mount"]))?;
    fs::write(repo.join("e/file4"), b"changed").map_err(|e| e.to_string())?;
    run(&mut git(&["commit", "-q", "-a", "-m", "second"]))?;
    run(&mut git(&["fsck", "--strict"]))?;
    let status = run(&mut git(&["status", "--porcelain"]))?;
    check(status.trim().is_empty(), format!("git status not clean: {status}"))?;
    let log = run(&mut git(&["log", "--oneline"]))?;
    check(log.lines().count() == 2, format!("git log: {log}"))
}
