//! The exported libc functions. Each checks, cheaply, whether the call is Spillway's (a path
//! under the mount point, a descriptor of ours) and otherwise calls libc's own function with the
//! same arguments. The variadic ones (`open`, `openat`, `fcntl`, `ioctl`, `execl*`) have their C
//! entry points in `variadic.c`, which call the `spillway_preload_*` functions here.

#![allow(clippy::missing_safety_doc)] // each is the libc function of the same name

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Arc;

use libc::{mode_t, off_t, size_t, ssize_t};
use spillway_namespace::{Attr, SetAttr};

use crate::runtime::{Fail, OpenFile, Outcome, Runtime};
use crate::{classify, fds, real, runtime};

fn set_errno(errno: i32) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = errno };
}

/// -1 with errno set (Fail::Pass never gets here: callers hand those to libc).
fn failed<T: From<i8>>(fail: Fail) -> T {
    set_errno(match fail {
        Fail::Errno(errno) => errno,
        Fail::Pass => libc::EIO,
    });
    T::from(-1)
}

/// The runtime and open file behind `fd`, if it is ours.
fn ours(fd: c_int) -> Option<(Arc<Runtime>, Arc<OpenFile>)> {
    let file = fds::get(fd)?;
    let runtime = runtime()?;
    runtime.adopt(&file);
    Some((runtime, file))
}

// ---------------------------------------------------------------------------------------------
// open and close

#[no_mangle]
pub unsafe extern "C" fn spillway_preload_openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    let pass = || {
        // SAFETY: the caller's arguments, unchanged.
        unsafe { real::openat(dirfd, path, flags, mode) }
    };
    // O_PATH and O_TMPFILE opens are the file system's.
    if flags & libc::O_PATH != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE {
        return pass();
    }
    let Some((inside, absolute)) = classify(dirfd, path) else { return pass() };
    let Some(runtime) = runtime() else { return pass() };
    let Some(fd) = fds::new_shadow(flags & libc::O_CLOEXEC != 0) else { return pass() };
    let opened = if flags & libc::O_DIRECTORY != 0 {
        runtime.open_directory(&inside, flags, absolute)
    } else {
        runtime.open(&inside, flags, mode, absolute)
    };
    match opened {
        Ok(file) => {
            fds::insert(fd, file.clone());
            // Standard input, output or error (a program that closed one): stdio uses them
            // with calls no preload library sees, so they go through the FUSE mount if any.
            if fd <= 2 && crate::fuse_device(&runtime.config.mountpoint).is_some() {
                hand_over_one(&runtime, fd, &file, flags & libc::O_CLOEXEC != 0);
            }
            fd
        }
        Err(fail) => {
            // SAFETY: the shadow made above, not yet handed out.
            unsafe { real::close(fd) };
            match fail {
                Fail::Pass => pass(),
                fail => failed(fail),
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: creat is this open.
    unsafe {
        spillway_preload_openat(
            libc::AT_FDCWD,
            path,
            libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
            mode,
        )
    }
}

/// Closes our descriptor `fd`: its writes reported (every close, as FUSE's flush), the shadow
/// closed whatever happens (as close(2)).
fn close_ours(runtime: &Runtime, fd: c_int) -> c_int {
    let Some((file, last)) = fds::remove(fd) else { return 0 };
    let result = runtime.close(&file, last);
    // SAFETY: our shadow descriptor.
    unsafe { real::close(fd) };
    match result {
        Ok(()) => 0,
        Err(fail) => failed(fail),
    }
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    match ours(fd) {
        Some((runtime, _)) => close_ours(&runtime, fd),
        // SAFETY: the caller's argument.
        None => unsafe { real::close(fd) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        for (fd, _) in fds::all() {
            if (first..=last).contains(&(fd as c_uint)) {
                if let Some((runtime, _)) = ours(fd) {
                    close_ours(&runtime, fd);
                }
            }
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::close_range(first, last, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(lowest: c_int) {
    // SAFETY: closefrom is this close_range.
    unsafe { close_range(lowest.max(0) as c_uint, c_uint::MAX, 0) };
}

// ---------------------------------------------------------------------------------------------
// reading and writing

/// A read or write at the file's offset (advanced) or at `at` (pread/pwrite: unchanged).
fn transfer(
    runtime: &Runtime,
    file: &OpenFile,
    at: Option<u64>,
    op: impl FnOnce(u64) -> Outcome<usize>,
    append: bool,
) -> ssize_t {
    let result = match at {
        Some(offset) => op(offset),
        None => {
            let mut offset = file.offset.lock();
            if append {
                match runtime.size(file) {
                    Ok(size) => *offset = size,
                    Err(fail) => return failed(fail),
                }
            }
            let done = op(*offset);
            if let Ok(n) = done {
                *offset += n as u64;
            }
            done
        }
    };
    match result {
        Ok(n) => n as ssize_t,
        Err(fail) => failed(fail),
    }
}

/// `count` bytes at `buffer` as a slice (empty for a null pointer with no bytes).
///
/// # Safety
/// `buffer` points to `count` bytes, as libc's contract says.
unsafe fn bytes<'a>(buffer: *const c_void, count: size_t) -> &'a [u8] {
    if count == 0 || buffer.is_null() {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(buffer.cast(), count) }
}

/// # Safety
/// As [`bytes`], writable.
unsafe fn bytes_mut<'a>(buffer: *mut c_void, count: size_t) -> &'a mut [u8] {
    if count == 0 || buffer.is_null() {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(buffer.cast(), count) }
}

fn offset_argument(offset: off_t) -> Result<u64, Fail> {
    u64::try_from(offset).map_err(|_| Fail::Errno(libc::EINVAL))
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buffer: *mut c_void, count: size_t) -> ssize_t {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::read(fd, buffer, count) };
    };
    // SAFETY: libc's contract for read.
    let buffer = unsafe { bytes_mut(buffer, count) };
    transfer(&runtime, &file, None, |offset| runtime.read(&file, offset, buffer), false)
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buffer: *const c_void, count: size_t) -> ssize_t {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::write(fd, buffer, count) };
    };
    // SAFETY: libc's contract for write.
    let data = unsafe { bytes(buffer, count) };
    let append = *file.flags.lock() & libc::O_APPEND != 0;
    transfer(&runtime, &file, None, |offset| runtime.write(&file, offset, data), append)
}

#[no_mangle]
pub unsafe extern "C" fn pread64(
    fd: c_int,
    buffer: *mut c_void,
    count: size_t,
    offset: off_t,
) -> ssize_t {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::pread64(fd, buffer, count, offset) };
    };
    let offset = match offset_argument(offset) {
        Ok(offset) => offset,
        Err(fail) => return failed(fail),
    };
    // SAFETY: libc's contract for pread.
    let buffer = unsafe { bytes_mut(buffer, count) };
    transfer(&runtime, &file, Some(offset), |at| runtime.read(&file, at, buffer), false)
}

#[no_mangle]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buffer: *const c_void,
    count: size_t,
    offset: off_t,
) -> ssize_t {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::pwrite64(fd, buffer, count, offset) };
    };
    let offset = match offset_argument(offset) {
        Ok(offset) => offset,
        Err(fail) => return failed(fail),
    };
    // SAFETY: libc's contract for pwrite.
    let data = unsafe { bytes(buffer, count) };
    transfer(&runtime, &file, Some(offset), |at| runtime.write(&file, at, data), false)
}

/// The vectors of readv/writev as (pointer, length) pairs.
///
/// # Safety
/// `iov` points to `count` iovecs.
unsafe fn vectors<'a>(iov: *const libc::iovec, count: c_int) -> Result<&'a [libc::iovec], Fail> {
    let count = usize::try_from(count).map_err(|_| Fail::Errno(libc::EINVAL))?;
    if count > libc::UIO_MAXIOV as usize {
        return Err(Fail::Errno(libc::EINVAL));
    }
    if count == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(iov, count) })
}

/// readv/preadv: the vectors filled in order from `at` (or the offset), stopping at EOF.
fn read_vectors(
    runtime: &Runtime,
    file: &OpenFile,
    vectors: &[libc::iovec],
    at: Option<u64>,
) -> ssize_t {
    transfer(
        runtime,
        file,
        at,
        |start| {
            let mut done = 0usize;
            for v in vectors {
                // SAFETY: each iovec describes a buffer of the caller's.
                let buffer = unsafe { bytes_mut(v.iov_base, v.iov_len) };
                let n = runtime.read(file, start + done as u64, buffer)?;
                done += n;
                if n < buffer.len() {
                    break;
                }
            }
            Ok(done)
        },
        false,
    )
}

fn write_vectors(
    runtime: &Runtime,
    file: &OpenFile,
    vectors: &[libc::iovec],
    at: Option<u64>,
) -> ssize_t {
    let append = at.is_none() && *file.flags.lock() & libc::O_APPEND != 0;
    transfer(
        runtime,
        file,
        at,
        |start| {
            let mut done = 0usize;
            for v in vectors {
                // SAFETY: each iovec describes a buffer of the caller's.
                let data = unsafe { bytes(v.iov_base, v.iov_len) };
                done += runtime.write(file, start + done as u64, data)?;
            }
            Ok(done)
        },
        append,
    )
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, count: c_int) -> ssize_t {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::readv(fd, iov, count) };
    };
    // SAFETY: libc's contract for readv.
    match unsafe { vectors(iov, count) } {
        Ok(v) => read_vectors(&runtime, &file, v, None),
        Err(fail) => failed(fail),
    }
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, count: c_int) -> ssize_t {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::writev(fd, iov, count) };
    };
    // SAFETY: libc's contract for writev.
    match unsafe { vectors(iov, count) } {
        Ok(v) => write_vectors(&runtime, &file, v, None),
        Err(fail) => failed(fail),
    }
}

#[no_mangle]
pub unsafe extern "C" fn preadv64(
    fd: c_int,
    iov: *const libc::iovec,
    count: c_int,
    offset: off_t,
) -> ssize_t {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::preadv64(fd, iov, count, offset) };
    };
    // SAFETY: libc's contract for preadv.
    match (unsafe { vectors(iov, count) }, offset_argument(offset)) {
        (Ok(v), Ok(at)) => read_vectors(&runtime, &file, v, Some(at)),
        (Err(fail), _) | (_, Err(fail)) => failed(fail),
    }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    iov: *const libc::iovec,
    count: c_int,
    offset: off_t,
) -> ssize_t {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::pwritev64(fd, iov, count, offset) };
    };
    // SAFETY: libc's contract for pwritev.
    match (unsafe { vectors(iov, count) }, offset_argument(offset)) {
        (Ok(v), Ok(at)) => write_vectors(&runtime, &file, v, Some(at)),
        (Err(fail), _) | (_, Err(fail)) => failed(fail),
    }
}

#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, offset: off_t, whence: c_int) -> off_t {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::lseek64(fd, offset, whence) };
    };
    let mut position = file.offset.lock();
    let size = || runtime.size(&file).map(|s| s as i128);
    let target = match whence {
        libc::SEEK_SET => Ok(i128::from(offset)),
        libc::SEEK_CUR => Ok(*position as i128 + i128::from(offset)),
        libc::SEEK_END => size().map(|s| s + i128::from(offset)),
        // The store keeps no holes: all of the file is data.
        libc::SEEK_DATA => size().and_then(|s| {
            if i128::from(offset) < s {
                Ok(i128::from(offset))
            } else {
                Err(Fail::Errno(libc::ENXIO))
            }
        }),
        libc::SEEK_HOLE => size().and_then(|s| {
            if i128::from(offset) < s {
                Ok(s)
            } else {
                Err(Fail::Errno(libc::ENXIO))
            }
        }),
        _ => Err(Fail::Errno(libc::EINVAL)),
    };
    match target {
        Ok(t) if (0..=i128::from(i64::MAX)).contains(&t) => {
            *position = t as u64;
            t as off_t
        }
        Ok(_) => failed(Fail::Errno(libc::EINVAL)),
        Err(fail) => failed(fail),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    match ours(fd) {
        Some((runtime, file)) => runtime.fsync(&file).map_or_else(failed, |()| 0),
        // SAFETY: the caller's argument.
        None => unsafe { real::fsync(fd) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    match ours(fd) {
        Some((runtime, file)) => runtime.fsync(&file).map_or_else(failed, |()| 0),
        // SAFETY: the caller's argument.
        None => unsafe { real::fdatasync(fd) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, length: off_t) -> c_int {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::ftruncate64(fd, length) };
    };
    match offset_argument(length).and_then(|size| runtime.truncate(&file, size)) {
        Ok(()) => 0,
        Err(fail) => failed(fail),
    }
}

#[no_mangle]
pub unsafe extern "C" fn truncate64(path: *const c_char, length: off_t) -> c_int {
    if classify(libc::AT_FDCWD, path).is_some() {
        // As the kernel does it: open for writing, truncate, close.
        // SAFETY: our own open, ftruncate and close on a descriptor we opened.
        unsafe {
            let fd = spillway_preload_openat(libc::AT_FDCWD, path, libc::O_WRONLY, 0);
            if fd < 0 {
                return -1;
            }
            let rc = ftruncate64(fd, length);
            let errno = *libc::__errno_location();
            close(fd);
            set_errno(errno);
            return rc;
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::truncate64(path, length) }
}

// ---------------------------------------------------------------------------------------------
// stat

fn fill_stat(runtime: &Runtime, attr: &Attr, out: *mut libc::stat64) {
    // SAFETY: zeroed plain-old-data, then written to the caller's buffer.
    let mut stat: libc::stat64 = unsafe { std::mem::zeroed() };
    stat.st_dev = runtime.device;
    stat.st_ino = attr.ino;
    stat.st_mode = attr.st_mode();
    stat.st_nlink = u64::from(attr.nlink);
    stat.st_uid = attr.uid;
    stat.st_gid = attr.gid;
    stat.st_rdev = u64::from(attr.rdev);
    stat.st_size = attr.size as i64;
    stat.st_blksize = i64::from(spillway_mount::MAX_WRITE_BYTES);
    stat.st_blocks = attr.size.div_ceil(512) as i64;
    stat.st_atime = attr.atime.seconds;
    stat.st_atime_nsec = i64::from(attr.atime.nanos);
    stat.st_mtime = attr.mtime.seconds;
    stat.st_mtime_nsec = i64::from(attr.mtime.nanos);
    stat.st_ctime = attr.ctime.seconds;
    stat.st_ctime_nsec = i64::from(attr.ctime.nanos);
    // SAFETY: libc's contract: `out` points to a struct stat.
    unsafe { out.write(stat) };
}

/// stat/lstat/fstatat of a path: ours, or `None` for libc's.
fn stat_path(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    out: *mut libc::stat64,
) -> Option<c_int> {
    let (inside, _) = classify(dirfd, path)?;
    let runtime = runtime()?;
    match runtime.stat_path(&inside, flags & libc::AT_SYMLINK_NOFOLLOW == 0) {
        Ok(attr) => {
            fill_stat(&runtime, &attr, out);
            Some(0)
        }
        Err(Fail::Pass) => None,
        Err(fail) => Some(failed(fail)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    out: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() {
        // SAFETY: a NUL-terminated string.
        if unsafe { CStr::from_ptr(path) }.is_empty() {
            // SAFETY: fstat of the descriptor.
            return unsafe { fstat64(dirfd, out) };
        }
    }
    // SAFETY: the caller's arguments.
    stat_path(dirfd, path, flags, out)
        .unwrap_or_else(|| unsafe { real::fstatat64(dirfd, path, out, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, out: *mut libc::stat64) -> c_int {
    // SAFETY: stat is fstatat from the working directory.
    unsafe { fstatat64(libc::AT_FDCWD, path, out, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lstat64(path: *const c_char, out: *mut libc::stat64) -> c_int {
    // SAFETY: lstat is fstatat without following a final link.
    unsafe { fstatat64(libc::AT_FDCWD, path, out, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, out: *mut libc::stat64) -> c_int {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::fstat64(fd, out) };
    };
    match runtime.fstat(&file) {
        Ok(attr) => {
            fill_stat(&runtime, &attr, out);
            0
        }
        Err(fail) => failed(fail),
    }
}

fn fill_statx(runtime: &Runtime, attr: &Attr, out: *mut libc::statx) {
    let time = |t: spillway_namespace::Timestamp| {
        // SAFETY: zeroed plain-old-data (its padding is private).
        let mut stamp: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        stamp.tv_sec = t.seconds;
        stamp.tv_nsec = t.nanos;
        stamp
    };
    // SAFETY: zeroed plain-old-data, then written to the caller's buffer.
    let mut x: libc::statx = unsafe { std::mem::zeroed() };
    x.stx_mask = libc::STATX_BASIC_STATS;
    x.stx_blksize = spillway_mount::MAX_WRITE_BYTES;
    x.stx_nlink = attr.nlink;
    x.stx_uid = attr.uid;
    x.stx_gid = attr.gid;
    x.stx_mode = attr.st_mode() as u16;
    x.stx_ino = attr.ino;
    x.stx_size = attr.size;
    x.stx_blocks = attr.size.div_ceil(512);
    x.stx_atime = time(attr.atime);
    x.stx_mtime = time(attr.mtime);
    x.stx_ctime = time(attr.ctime);
    x.stx_rdev_major = libc::major(u64::from(attr.rdev));
    x.stx_rdev_minor = libc::minor(u64::from(attr.rdev));
    x.stx_dev_major = libc::major(runtime.device);
    x.stx_dev_minor = libc::minor(runtime.device);
    // SAFETY: libc's contract: `out` points to a struct statx.
    unsafe { out.write(x) };
}

#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    out: *mut libc::statx,
) -> c_int {
    // SAFETY: a NUL-terminated string per libc's contract.
    let empty = !path.is_null() && unsafe { CStr::from_ptr(path) }.is_empty();
    let attr = if empty && flags & libc::AT_EMPTY_PATH != 0 {
        ours(dirfd).map(|(runtime, file)| (runtime.fstat(&file), runtime))
    } else {
        classify(dirfd, path).and_then(|(inside, _)| {
            let runtime = runtime()?;
            let attr = runtime.stat_path(&inside, flags & libc::AT_SYMLINK_NOFOLLOW == 0);
            (attr != Err(Fail::Pass)).then_some((attr, runtime))
        })
    };
    match attr {
        Some((Ok(attr), runtime)) => {
            fill_statx(&runtime, &attr, out);
            0
        }
        Some((Err(fail), _)) => failed(fail),
        // SAFETY: the caller's arguments.
        None => unsafe { real::statx(dirfd, path, flags, mask, out) },
    }
}

// ---------------------------------------------------------------------------------------------
// names

/// A path call: ours (its result) or `None` for libc's.
fn on_path(
    dirfd: c_int,
    path: *const c_char,
    op: impl FnOnce(&Runtime, &[u8]) -> Outcome<()>,
) -> Option<c_int> {
    let (inside, _) = classify(dirfd, path)?;
    let runtime = runtime()?;
    match op(&runtime, &inside) {
        Ok(()) => Some(0),
        Err(Fail::Pass) => None,
        Err(fail) => Some(failed(fail)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    let directory = flags & libc::AT_REMOVEDIR != 0;
    on_path(dirfd, path, |runtime, inside| runtime.unlink(inside, directory))
        // SAFETY: the caller's arguments.
        .unwrap_or_else(|| unsafe { real::unlinkat(dirfd, path, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: unlink is unlinkat from the working directory.
    unsafe { unlinkat(libc::AT_FDCWD, path, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    // SAFETY: rmdir is unlinkat with AT_REMOVEDIR.
    unsafe { unlinkat(libc::AT_FDCWD, path, libc::AT_REMOVEDIR) }
}

#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    on_path(dirfd, path, |runtime, inside| runtime.mkdir(inside, mode))
        // SAFETY: the caller's arguments.
        .unwrap_or_else(|| unsafe { real::mkdirat(dirfd, path, mode) })
}

#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: mkdir is mkdirat from the working directory.
    unsafe { mkdirat(libc::AT_FDCWD, path, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn renameat2(
    olddirfd: c_int,
    old: *const c_char,
    newdirfd: c_int,
    new: *const c_char,
    flags: c_uint,
) -> c_int {
    match (classify(olddirfd, old), classify(newdirfd, new)) {
        (Some((from, _)), Some((to, _))) => {
            if let Some(runtime) = runtime() {
                match runtime.rename(&from, &to, flags) {
                    Ok(()) => return 0,
                    Err(Fail::Pass) => {}
                    Err(fail) => return failed(fail),
                }
            }
        }
        // Between the burst buffer and another file system: as the kernel says for that.
        (Some(_), None) | (None, Some(_)) if runtime().is_some() => {
            return failed(Fail::Errno(libc::EXDEV));
        }
        _ => {}
    }
    // SAFETY: the caller's arguments.
    unsafe { real::renameat2(olddirfd, old, newdirfd, new, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn renameat(
    olddirfd: c_int,
    old: *const c_char,
    newdirfd: c_int,
    new: *const c_char,
) -> c_int {
    // SAFETY: renameat is renameat2 without flags.
    unsafe { renameat2(olddirfd, old, newdirfd, new, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn rename(old: *const c_char, new: *const c_char) -> c_int {
    // SAFETY: rename is renameat2 from the working directory.
    unsafe { renameat2(libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    // AT_EACCESS and the real ids: the namespace checks the effective ids, which are the real
    // ones for unprivileged programs; set-id programs go to libc.
    on_path(dirfd, path, |runtime, inside| runtime.access(inside, mode))
        // SAFETY: the caller's arguments.
        .unwrap_or_else(|| unsafe { real::faccessat(dirfd, path, mode, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: access is faccessat from the working directory.
    unsafe { faccessat(libc::AT_FDCWD, path, mode, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    let Some((_, file)) = ours(fd) else {
        // SAFETY: libc's fchdir, not interposed further.
        return unsafe { libc::syscall(libc::SYS_fchdir, fd) as c_int };
    };
    if !file.directory {
        return failed(Fail::Errno(libc::ENOTDIR));
    }
    // The working directory is the kernel's: the mount's directory at that path (ENOENT
    // without a mount).
    match std::ffi::CString::new(file.path.clone()) {
        // SAFETY: a NUL-terminated path.
        Ok(path) => unsafe { libc::syscall(libc::SYS_chdir, path.as_ptr()) as c_int },
        Err(_) => failed(Fail::Errno(libc::ENOENT)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn umask(mask: mode_t) -> mode_t {
    // SAFETY: the caller's argument.
    let old = unsafe { real::umask(mask) };
    crate::set_umask(mask);
    old
}

// ---------------------------------------------------------------------------------------------
// descriptors

/// Registers `copy` (a kernel duplicate of a shadow) for `file`; -1/EMFILE past the tracked
/// numbers (the duplicate is closed again).
fn register_copy(copy: c_int, file: Arc<OpenFile>) -> c_int {
    if copy < 0 {
        return copy;
    }
    if usize::try_from(copy).is_ok_and(|n| n < fds::TRACKED_FDS_MAX) {
        fds::insert(copy, file);
        return copy;
    }
    // SAFETY: the duplicate just made.
    unsafe { real::close(copy) };
    failed(Fail::Errno(libc::EMFILE))
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the caller's argument; the kernel duplicates the shadow.
    let copy = unsafe { real::dup(fd) };
    match ours(fd) {
        Some((_, file)) => register_copy(copy, file),
        None => copy,
    }
}

/// dup2/dup3: `new` first stops being ours (closed as close(2) would), then becomes a copy.
fn duplicate_onto(old: c_int, new: c_int, flags: c_int, three: bool) -> c_int {
    let mut source = ours(old);
    // Standard input, output and error are read and written by stdio with libc's internal
    // calls, which no preload library sees: a file of ours goes there through the FUSE mount
    // (the source first, so both numbers share one offset as dup2 promises).
    if let Some((runtime, file)) = &source {
        if (0..=2).contains(&new) && old != new {
            runtime.flush_everything();
            if crate::fuse_device(&runtime.config.mountpoint).is_some() {
                // SAFETY: F_GETFD takes no argument.
                let fd_flags = unsafe { real::fcntl(old, libc::F_GETFD, std::ptr::null_mut()) };
                if hand_over_one(runtime, old, file, fd_flags & libc::FD_CLOEXEC != 0) {
                    source = None;
                }
            }
        }
    }
    if old != new {
        if let Some((runtime, _)) = ours(new) {
            let (file, last) = match fds::remove(new) {
                Some(removed) => removed,
                None => return failed(Fail::Errno(libc::EBADF)),
            };
            // dup2 closes silently: a failure stays pinned for the file's other closes.
            let _ = runtime.close(&file, last);
        }
    }
    let copy = if three {
        // SAFETY: the caller's arguments.
        unsafe { real::dup3(old, new, flags) }
    } else {
        // SAFETY: the caller's arguments.
        unsafe { real::dup2(old, new) }
    };
    match source {
        Some((_, file)) if copy >= 0 && old != new => register_copy(copy, file),
        _ => copy,
    }
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    duplicate_onto(old, new, 0, false)
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    duplicate_onto(old, new, flags, true)
}

#[no_mangle]
pub unsafe extern "C" fn spillway_preload_fcntl(fd: c_int, cmd: c_int, arg: *mut c_void) -> c_int {
    let Some((_, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::fcntl(fd, cmd, arg) };
    };
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: duplicating our shadow as asked.
            register_copy(unsafe { real::fcntl(fd, cmd, arg) }, file)
        }
        // Close-on-exec lives on the shadow, where the kernel applies it.
        // SAFETY: the caller's arguments, on our shadow.
        libc::F_GETFD | libc::F_SETFD => unsafe { real::fcntl(fd, cmd, arg) },
        libc::F_GETFL => *file.flags.lock(),
        libc::F_SETFL => {
            let changeable = libc::O_APPEND | libc::O_NONBLOCK;
            let mut flags = file.flags.lock();
            *flags = (*flags & !changeable) | (arg as usize as c_int & changeable);
            0
        }
        // Record locks are the kernel's: the file goes on through the FUSE mount, which has
        // them (docs/design/preload.md); without a mount there are none.
        libc::F_GETLK
        | libc::F_SETLK
        | libc::F_SETLKW
        | libc::F_OFD_GETLK
        | libc::F_OFD_SETLK
        | libc::F_OFD_SETLKW => {
            if hand_over_for_locking(fd) {
                // SAFETY: the caller's arguments, on the descriptor now the mount's.
                unsafe { real::fcntl(fd, cmd, arg) }
            } else {
                failed(Fail::Errno(libc::ENOLCK))
            }
        }
        _ => failed(Fail::Errno(libc::EINVAL)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn spillway_preload_ioctl(
    fd: c_int,
    request: libc::c_ulong,
    arg: *mut c_void,
) -> c_int {
    if ours(fd).is_some() {
        // No ioctl applies to a burst buffer file (FICLONE callers copy instead).
        return failed(Fail::Errno(libc::ENOTTY));
    }
    // SAFETY: the caller's arguments.
    unsafe { real::ioctl(fd, request, arg) }
}

/// Before a lock on our descriptor `fd`: it is handed over to the FUSE mount (which keeps
/// locks as any kernel file system does); false without a mount.
fn hand_over_for_locking(fd: c_int) -> bool {
    let Some((runtime, file)) = ours(fd) else { return false };
    runtime.flush_everything();
    if crate::fuse_device(&runtime.config.mountpoint).is_none() {
        return false;
    }
    // SAFETY: F_GETFD takes no argument.
    let fd_flags = unsafe { real::fcntl(fd, libc::F_GETFD, std::ptr::null_mut()) };
    hand_over_one(&runtime, fd, &file, fd_flags >= 0 && fd_flags & libc::FD_CLOEXEC != 0)
}

#[no_mangle]
pub unsafe extern "C" fn flock(fd: c_int, operation: c_int) -> c_int {
    if ours(fd).is_some() && !hand_over_for_locking(fd) {
        return failed(Fail::Errno(libc::ENOLCK));
    }
    // SAFETY: libc's flock with the caller's arguments (not interposed further).
    unsafe { libc::syscall(libc::SYS_flock, fd, operation) as c_int }
}

#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::fchmod(fd, mode) };
    };
    let set = SetAttr { mode: Some(mode & 0o7777), ..SetAttr::default() };
    runtime.set_attributes(&file, &set).map_or_else(failed, |()| 0)
}

#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::fchown(fd, uid, gid) };
    };
    let keep = |id: u32| (id != u32::MAX).then_some(id);
    let set = SetAttr { uid: keep(uid), gid: keep(gid), ..SetAttr::default() };
    runtime.set_attributes(&file, &set).map_or_else(failed, |()| 0)
}

#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { real::futimens(fd, times) };
    };
    let (atime, mtime) = if times.is_null() {
        (Some(spillway_namespace::TimeSet::Now), Some(spillway_namespace::TimeSet::Now))
    } else {
        // SAFETY: libc's contract: two timespecs.
        let pair = unsafe { std::slice::from_raw_parts(times, 2) };
        (runtime::time_set(&pair[0]), runtime::time_set(&pair[1]))
    };
    let set = SetAttr { atime, mtime, ..SetAttr::default() };
    runtime.set_attributes(&file, &set).map_or_else(failed, |()| 0)
}

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise64(
    fd: c_int,
    offset: off_t,
    length: off_t,
    advice: c_int,
) -> c_int {
    if ours(fd).is_some() {
        return 0; // advice only
    }
    // SAFETY: libc's own call with the caller's arguments.
    let rc = unsafe { libc::syscall(libc::SYS_fadvise64, fd, offset, length, advice) };
    if rc < 0 {
        // SAFETY: the calling thread's errno.
        unsafe { *libc::__errno_location() }
    } else {
        0
    }
}

/// fallocate of ours (`Runtime::allocate`).
fn allocate(
    runtime: &Runtime,
    file: &OpenFile,
    mode: c_int,
    offset: off_t,
    length: off_t,
) -> Outcome<()> {
    if offset < 0 || length <= 0 {
        return Err(Fail::Errno(libc::EINVAL));
    }
    runtime.allocate(file, mode, offset as u64, length as u64)
}

#[no_mangle]
pub unsafe extern "C" fn fallocate64(
    fd: c_int,
    mode: c_int,
    offset: off_t,
    length: off_t,
) -> c_int {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_fallocate, fd, mode, offset, length) as c_int };
    };
    allocate(&runtime, &file, mode, offset, length).map_or_else(failed, |()| 0)
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, offset: off_t, length: off_t) -> c_int {
    let Some((runtime, file)) = ours(fd) else {
        // SAFETY: the caller's arguments.
        let rc = unsafe { libc::syscall(libc::SYS_fallocate, fd, 0, offset, length) };
        // SAFETY: the calling thread's errno.
        return if rc < 0 { unsafe { *libc::__errno_location() } } else { 0 };
    };
    match allocate(&runtime, &file, 0, offset, length) {
        Ok(()) => 0,
        Err(Fail::Errno(errno)) => errno,
        Err(Fail::Pass) => libc::EIO,
    }
}

// Copies inside the kernel cannot see our files: the callers (cp, cat, shutil) fall back to
// read and write on these errors.
#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut i64,
    fd_out: c_int,
    off_out: *mut i64,
    length: size_t,
    flags: c_uint,
) -> ssize_t {
    if ours(fd_in).is_some() || ours(fd_out).is_some() {
        return failed(Fail::Errno(libc::EXDEV));
    }
    // SAFETY: the caller's arguments.
    unsafe {
        libc::syscall(libc::SYS_copy_file_range, fd_in, off_in, fd_out, off_out, length, flags)
            as ssize_t
    }
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    if ours(out_fd).is_some() || ours(in_fd).is_some() {
        return failed(Fail::Errno(libc::EINVAL));
    }
    // SAFETY: the caller's arguments.
    unsafe { libc::syscall(libc::SYS_sendfile, out_fd, in_fd, offset, count) as ssize_t }
}

#[no_mangle]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut i64,
    fd_out: c_int,
    off_out: *mut i64,
    length: size_t,
    flags: c_uint,
) -> ssize_t {
    if ours(fd_in).is_some() || ours(fd_out).is_some() {
        return failed(Fail::Errno(libc::EINVAL));
    }
    // SAFETY: the caller's arguments.
    unsafe {
        libc::syscall(libc::SYS_splice, fd_in, off_in, fd_out, off_out, length, flags) as ssize_t
    }
}

/// Opens our file through the FUSE mount (checking it is the same inode): for mmap and for
/// handing descriptors to another program. `None` without a FUSE mount.
fn reopen_through_mount(file: &OpenFile, flags: c_int) -> Option<c_int> {
    let path = std::ffi::CString::new(file.path.clone()).ok()?;
    // SAFETY: a NUL-terminated path; libc's openat (the FUSE mount serves it).
    let fd = unsafe { real::openat(libc::AT_FDCWD, path.as_ptr(), flags, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: zeroed plain-old-data filled by fstat.
    let mut stat: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: our descriptor and buffer.
    let same = unsafe { real::fstat64(fd, &mut stat) } == 0 && stat.st_ino == file.ino;
    if !same {
        // SAFETY: our descriptor.
        unsafe { real::close(fd) };
        return None;
    }
    Some(fd)
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(
    address: *mut c_void,
    length: size_t,
    protection: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    let mine = if flags & libc::MAP_ANONYMOUS == 0 { ours(fd) } else { None };
    let Some((runtime, file)) = mine else {
        // SAFETY: the caller's arguments.
        return unsafe { real::mmap64(address, length, protection, flags, fd, offset) };
    };
    // A mapping is the kernel's: map the file through the FUSE mount, after our writes.
    runtime.flush_everything();
    let writable = protection & libc::PROT_WRITE != 0 && flags & libc::MAP_SHARED != 0;
    let access = if writable { libc::O_RDWR } else { libc::O_RDONLY };
    let Some(through) = reopen_through_mount(&file, access | libc::O_CLOEXEC) else {
        set_errno(libc::ENODEV);
        return libc::MAP_FAILED;
    };
    // SAFETY: mapping the reopened file as asked; the mapping keeps it referenced.
    let mapped = unsafe { real::mmap64(address, length, protection, flags, through, offset) };
    // SAFETY: our descriptor.
    unsafe { real::close(through) };
    mapped
}

// ---------------------------------------------------------------------------------------------
// processes

/// Which of our descriptors [`hand_over_descriptors`] replaces.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HandOver {
    /// Those a new program image inherits (not close-on-exec): before exec, spawn, system.
    Inheritable,
    /// All of them: before fork, so that parent and child share each file's offset, as they
    /// would any file's.
    All,
}

/// Before another program image or a child process: every write of ours is sent and its size
/// reported (they live in this process's memory), and our descriptors are replaced, under the
/// same numbers, by the files opened through the FUSE mount at the same offsets, so the new
/// program (with or without this library, static or not) and this process share them as they
/// would any file. Without a FUSE mount the shadows stay: a new program gets EBADF on them,
/// never wrong bytes, and a forked child has its own offsets (docs/design/preload.md).
fn hand_over_descriptors(which: HandOver) {
    let Some(runtime) = crate::existing_runtime() else { return };
    runtime.flush_everything();
    if crate::fuse_device(&runtime.config.mountpoint).is_none() {
        return;
    }
    for (fd, file) in fds::all() {
        // SAFETY: F_GETFD takes no argument.
        let fd_flags = unsafe { real::fcntl(fd, libc::F_GETFD, std::ptr::null_mut()) };
        let cloexec = fd_flags >= 0 && fd_flags & libc::FD_CLOEXEC != 0;
        if fd_flags < 0 || (cloexec && which == HandOver::Inheritable) {
            continue;
        }
        hand_over_one(&runtime, fd, &file, cloexec);
    }
}

/// Replaces our descriptor `fd` by `file` opened through the FUSE mount at the same offset
/// (its writes already sent); false if the mount cannot open it (the shadow stays).
fn hand_over_one(runtime: &Runtime, fd: c_int, file: &OpenFile, cloexec: bool) -> bool {
    let status = *file.flags.lock() & (libc::O_ACCMODE | libc::O_APPEND | libc::O_NONBLOCK);
    let Some(through) = reopen_through_mount(file, status | libc::O_CLOEXEC) else {
        crate::say(&format!(
            "descriptor {fd} ({}) could not be reopened through the mount: a new program gets EBADF on it",
            String::from_utf8_lossy(&file.path)
        ));
        return false;
    };
    // SAFETY: our descriptors: position the reopened file, then put it at `fd`.
    unsafe {
        real::lseek64(through, *file.offset.lock() as off_t, libc::SEEK_SET);
        real::dup3(through, fd, if cloexec { libc::O_CLOEXEC } else { 0 });
        real::close(through);
    }
    if let Some((file, last)) = fds::remove(fd) {
        let _ = runtime.close(&file, last);
    }
    true
}

#[no_mangle]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    hand_over_descriptors(HandOver::All);
    // The table and the runtime slot are held across fork, so the child's copies are whole.
    let table = fds::lock();
    let mut slot = crate::runtime_slot();
    // SAFETY: fork.
    let pid = unsafe { real::fork() };
    if pid == 0 {
        // The parent's threads (data workers) are not in the child: it connects anew.
        crate::forget_runtime_after_fork(&mut slot);
    }
    drop(slot);
    drop(table);
    pid
}

/// vfork is fork here: the child of a vfork may not call what this library does on the way
/// (and fork is what vfork may always be).
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: as fork.
    unsafe { fork() }
}

#[no_mangle]
pub unsafe extern "C" fn spillway_preload_exec(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    search: c_int,
) -> c_int {
    hand_over_descriptors(HandOver::Inheritable);
    if search != 0 {
        // SAFETY: the caller's arguments.
        unsafe { real::execvpe(file, argv, envp) }
    } else {
        // SAFETY: the caller's arguments.
        unsafe { real::execve(file, argv, envp) }
    }
}

unsafe extern "C" {
    static environ: *const *const c_char;
}

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { spillway_preload_exec(path, argv, envp, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments and this process's environment.
    unsafe { spillway_preload_exec(path, argv, environ, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments and this process's environment.
    unsafe { spillway_preload_exec(file, argv, environ, 1) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { spillway_preload_exec(file, argv, envp, 1) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    hand_over_descriptors(HandOver::Inheritable);
    // SAFETY: the caller's arguments.
    unsafe { real::posix_spawn(pid, path, actions, attr, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    hand_over_descriptors(HandOver::Inheritable);
    // SAFETY: the caller's arguments.
    unsafe { real::posix_spawnp(pid, file, actions, attr, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    hand_over_descriptors(HandOver::Inheritable);
    // SAFETY: the caller's argument.
    unsafe { real::system(command) }
}

#[no_mangle]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    hand_over_descriptors(HandOver::Inheritable);
    // SAFETY: the caller's arguments.
    unsafe { real::popen(command, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    if let Some(runtime) = crate::existing_runtime() {
        runtime.flush_everything();
    }
    // SAFETY: ends the process.
    unsafe { real::_exit(status) };
    // SAFETY: not reached; _exit does not return.
    unsafe { libc::abort() }
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // SAFETY: the same function.
    unsafe { _exit(status) }
}

// ---------------------------------------------------------------------------------------------
// extended attributes: the burst buffer keeps none (as the mount: get and set EOPNOTSUPP, the
// list empty)

/// Whether a path call is ours (and the library is connected).
fn path_is_ours(path: *const c_char) -> bool {
    classify(libc::AT_FDCWD, path).is_some() && runtime().is_some()
}

macro_rules! xattr_calls {
    ($($name:ident($target:ident: $tty:ty $(, $arg:ident: $ty:ty)*) -> $ret:ty = $fail:expr, $syscall:ident, $ours:ident;)*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($target: $tty $(, $arg: $ty)*) -> $ret {
                if $ours($target) {
                    return $fail;
                }
                // SAFETY: the caller's arguments, to the system call libc would make.
                unsafe { libc::syscall(libc::$syscall, $target $(, $arg)*) as $ret }
            }
        )*
    };
}

fn fd_is_ours(fd: c_int) -> bool {
    ours(fd).is_some()
}

fn not_supported<T: From<i8>>() -> T {
    failed(Fail::Errno(libc::EOPNOTSUPP))
}

xattr_calls! {
    getxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t = not_supported(), SYS_getxattr, path_is_ours;
    lgetxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t = not_supported(), SYS_lgetxattr, path_is_ours;
    fgetxattr(fd: c_int, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t = not_supported(), SYS_fgetxattr, fd_is_ours;
    listxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t = 0, SYS_listxattr, path_is_ours;
    llistxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t = 0, SYS_llistxattr, path_is_ours;
    flistxattr(fd: c_int, list: *mut c_char, size: size_t) -> ssize_t = 0, SYS_flistxattr, fd_is_ours;
    setxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int = not_supported(), SYS_setxattr, path_is_ours;
    lsetxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int = not_supported(), SYS_lsetxattr, path_is_ours;
    fsetxattr(fd: c_int, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int = not_supported(), SYS_fsetxattr, fd_is_ours;
    removexattr(path: *const c_char, name: *const c_char) -> c_int = not_supported(), SYS_removexattr, path_is_ours;
    lremovexattr(path: *const c_char, name: *const c_char) -> c_int = not_supported(), SYS_lremovexattr, path_is_ours;
    fremovexattr(fd: c_int, name: *const c_char) -> c_int = not_supported(), SYS_fremovexattr, fd_is_ours;
}

// Other names of the functions above (the 64-bit forms are the same on 64-bit Linux, glibc <
// 2.33's `__xstat` family is what programs built against it call).
macro_rules! same_as {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $target:ident($($call:ident),*);)*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                // SAFETY: the same function under another name, with the caller's arguments.
                unsafe { $target($($call),*) }
            }
        )*
    };
}

same_as! {
    creat64(path: *const c_char, mode: mode_t) -> c_int = creat(path, mode);
    pread(fd: c_int, buffer: *mut c_void, count: size_t, offset: off_t) -> ssize_t = pread64(fd, buffer, count, offset);
    pwrite(fd: c_int, buffer: *const c_void, count: size_t, offset: off_t) -> ssize_t = pwrite64(fd, buffer, count, offset);
    preadv(fd: c_int, iov: *const libc::iovec, count: c_int, offset: off_t) -> ssize_t = preadv64(fd, iov, count, offset);
    pwritev(fd: c_int, iov: *const libc::iovec, count: c_int, offset: off_t) -> ssize_t = pwritev64(fd, iov, count, offset);
    lseek(fd: c_int, offset: off_t, whence: c_int) -> off_t = lseek64(fd, offset, whence);
    ftruncate(fd: c_int, length: off_t) -> c_int = ftruncate64(fd, length);
    truncate(path: *const c_char, length: off_t) -> c_int = truncate64(path, length);
    fstatat(dirfd: c_int, path: *const c_char, out: *mut libc::stat64, flags: c_int) -> c_int = fstatat64(dirfd, path, out, flags);
    stat(path: *const c_char, out: *mut libc::stat64) -> c_int = stat64(path, out);
    lstat(path: *const c_char, out: *mut libc::stat64) -> c_int = lstat64(path, out);
    fstat(fd: c_int, out: *mut libc::stat64) -> c_int = fstat64(fd, out);
    __xstat64(_version: c_int, path: *const c_char, out: *mut libc::stat64) -> c_int = stat64(path, out);
    __xstat(_version: c_int, path: *const c_char, out: *mut libc::stat64) -> c_int = stat64(path, out);
    __lxstat64(_version: c_int, path: *const c_char, out: *mut libc::stat64) -> c_int = lstat64(path, out);
    __lxstat(_version: c_int, path: *const c_char, out: *mut libc::stat64) -> c_int = lstat64(path, out);
    __fxstat64(_version: c_int, fd: c_int, out: *mut libc::stat64) -> c_int = fstat64(fd, out);
    __fxstat(_version: c_int, fd: c_int, out: *mut libc::stat64) -> c_int = fstat64(fd, out);
    __fxstatat64(_version: c_int, dirfd: c_int, path: *const c_char, out: *mut libc::stat64, flags: c_int) -> c_int = fstatat64(dirfd, path, out, flags);
    __fxstatat(_version: c_int, dirfd: c_int, path: *const c_char, out: *mut libc::stat64, flags: c_int) -> c_int = fstatat64(dirfd, path, out, flags);
    posix_fadvise(fd: c_int, offset: off_t, length: off_t, advice: c_int) -> c_int = posix_fadvise64(fd, offset, length, advice);
    fallocate(fd: c_int, mode: c_int, offset: off_t, length: off_t) -> c_int = fallocate64(fd, mode, offset, length);
    posix_fallocate(fd: c_int, offset: off_t, length: off_t) -> c_int = posix_fallocate64(fd, offset, length);
    sendfile(out_fd: c_int, in_fd: c_int, offset: *mut off_t, count: size_t) -> ssize_t = sendfile64(out_fd, in_fd, offset, count);
    mmap(address: *mut c_void, length: size_t, protection: c_int, flags: c_int, fd: c_int, offset: off_t) -> *mut c_void = mmap64(address, length, protection, flags, fd, offset);
}
