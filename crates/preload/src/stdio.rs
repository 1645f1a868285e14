//! `fopen` and `fdopen` of our files: glibc's stdio opens and reads files with its internal
//! calls, which no preload library sees, so a `FILE` of ours is a `fopencookie` stream whose
//! reads, writes, seeks and close are this library's, and whose `fileno` is our descriptor.

use std::ffi::{c_char, c_int, c_void, CStr};

use libc::{size_t, ssize_t};

use crate::intercept::{close, lseek64, read, spillway_preload_openat, write};
use crate::{classify, fds, real};

type ReadFn = unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t;
type WriteFn = unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t;
type SeekFn = unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int;
type CloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// glibc's `cookie_io_functions_t`.
#[repr(C)]
struct CookieIo {
    read: Option<ReadFn>,
    write: Option<WriteFn>,
    seek: Option<SeekFn>,
    close: Option<CloseFn>,
}

unsafe extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut libc::FILE;
}

/// The cookie is the descriptor number itself.
fn descriptor(cookie: *mut c_void) -> c_int {
    cookie as usize as c_int
}

unsafe extern "C" fn cookie_read(
    cookie: *mut c_void,
    buffer: *mut c_char,
    size: size_t,
) -> ssize_t {
    // SAFETY: stdio's buffer of `size` bytes.
    unsafe { read(descriptor(cookie), buffer.cast(), size) }
}

unsafe extern "C" fn cookie_write(
    cookie: *mut c_void,
    buffer: *const c_char,
    size: size_t,
) -> ssize_t {
    // SAFETY: stdio's buffer of `size` bytes.
    let written = unsafe { write(descriptor(cookie), buffer.cast(), size) };
    // A cookie write must not return -1 for a partial failure; 0 tells stdio it failed.
    written.max(0)
}

unsafe extern "C" fn cookie_seek(cookie: *mut c_void, position: *mut i64, whence: c_int) -> c_int {
    // SAFETY: stdio passes a valid position to read and update.
    unsafe {
        let at = lseek64(descriptor(cookie), *position, whence);
        if at < 0 {
            return -1;
        }
        *position = at;
    }
    0
}

unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    // SAFETY: closing the stream's descriptor, once (stdio calls this once).
    unsafe { close(descriptor(cookie)) }
}

/// A stream over our descriptor `fd`.
///
/// # Safety
/// `mode` is a NUL-terminated stdio mode.
unsafe fn stream(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    let io = CookieIo {
        read: Some(cookie_read),
        write: Some(cookie_write),
        seek: Some(cookie_seek),
        close: Some(cookie_close),
    };
    // SAFETY: the cookie is a plain number; the callbacks match glibc's types.
    let file = unsafe { fopencookie(fd as usize as *mut c_void, mode, io) };
    if !file.is_null() {
        set_fileno(file, fd);
    }
    file
}

/// Byte offset of `_fileno` in glibc's `struct _IO_FILE` on 64-bit Linux: an int and its
/// padding, then thirteen pointers (libio's layout, part of glibc's ABI since 2.1).
const FILENO_OFFSET: usize = 8 + 13 * 8;

/// Makes `fileno(file)` answer `fd` instead of a cookie stream's -1: programs (git's config
/// reader, for one) fstat the descriptor of a stream they opened. glibc reads and writes a
/// cookie stream through its callbacks only, never through `_fileno`. The write is checked
/// with `fileno` and undone if this glibc lays the structure out otherwise.
fn set_fileno(file: *mut libc::FILE, fd: c_int) {
    // SAFETY: `file` is a live stream glibc just made; the field is an int at FILENO_OFFSET,
    // and `fileno` reads that field (checked below).
    unsafe {
        let field = file.cast::<u8>().add(FILENO_OFFSET).cast::<c_int>();
        // glibc marks a cookie stream's descriptor -2 ("open, no descriptor").
        let before = field.read();
        if !matches!(before, -1 | -2) {
            return;
        }
        field.write(fd);
        if libc::fileno(file) != fd {
            field.write(before);
        }
    }
}

/// open(2) flags of a stdio mode ("r", "w+", "ae", "wx", …); `None` for a bad mode.
fn open_flags(mode: &[u8]) -> Option<c_int> {
    let (first, rest) = mode.split_first()?;
    let plus = rest.contains(&b'+');
    let mut flags = match (first, plus) {
        (b'r', false) => libc::O_RDONLY,
        (b'r', true) => libc::O_RDWR,
        (b'w', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        (b'w', true) => libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
        (b'a', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        (b'a', true) => libc::O_RDWR | libc::O_CREAT | libc::O_APPEND,
        _ => return None,
    };
    for &c in rest {
        match c {
            b'e' => flags |= libc::O_CLOEXEC,
            b'x' => flags |= libc::O_EXCL,
            _ => {}
        }
    }
    Some(flags)
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    if mode.is_null() || classify(libc::AT_FDCWD, path).is_none() {
        // SAFETY: the caller's arguments.
        return unsafe { real::fopen64(path, mode) };
    }
    // SAFETY: a NUL-terminated mode (libc's contract).
    let Some(flags) = open_flags(unsafe { CStr::from_ptr(mode) }.to_bytes()) else {
        // SAFETY: the calling thread's errno.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        return std::ptr::null_mut();
    };
    // SAFETY: our open with the caller's path.
    let fd = unsafe { spillway_preload_openat(libc::AT_FDCWD, path, flags, 0o666) };
    if fd < 0 {
        return std::ptr::null_mut();
    }
    if !fds::maybe_ours(fd) {
        // libc opened it (not a regular file of ours): its own stream.
        // SAFETY: a descriptor we just opened and the caller's mode.
        return unsafe { real::fdopen(fd, mode) };
    }
    // SAFETY: our descriptor and the caller's mode.
    let file = unsafe { stream(fd, mode) };
    if file.is_null() {
        // SAFETY: our descriptor, not handed out.
        unsafe { close(fd) };
    }
    file
}

#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: the same function.
    unsafe { fopen64(path, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    if fds::get(fd).is_some() && !mode.is_null() {
        // SAFETY: our descriptor and the caller's mode.
        return unsafe { stream(fd, mode) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::fdopen(fd, mode) }
}
