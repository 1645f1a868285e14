//! Directory streams of our directories: `opendir`, `fdopendir`, `readdir(64)`, `readdir(64)_r`,
//! `rewinddir`, `telldir`, `seekdir`, `dirfd`, `closedir`. A stream of ours is a `DirStream`
//! allocated here; the `DIR *` handed out is its address, remembered so that a stream of
//! libc's (any other directory) goes to libc untouched. The listing is read from the
//! namespace a page at a time; positions are the namespace's entry cookies, which stay valid
//! while entries come and go (docs/design/namespace.md).

use std::collections::{HashSet, VecDeque};
use std::ffi::{c_char, c_int, c_long};
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;
use spillway_namespace::{DirEntry, FileKind};

use crate::intercept::{close, spillway_preload_openat};
use crate::runtime::{Fail, OpenFile};
use crate::{classify, fds, real, runtime};

/// Entries asked from the namespace per page.
const ENTRIES_PER_PAGE: u32 = 256;

static STREAMS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

struct DirStream {
    fd: c_int,
    file: Arc<OpenFile>,
    state: Mutex<Position>,
}

struct Position {
    page: VecDeque<DirEntry>,
    /// Cookie to ask the namespace after; the last entry handed out.
    after: u64,
    end: bool,
    /// The entry `readdir` last returned (valid until the next call on this stream).
    entry: Box<libc::dirent64>,
}

fn ours(dir: *mut libc::DIR) -> Option<&'static DirStream> {
    if dir.is_null() || !STREAMS.lock().contains(&(dir as usize)) {
        return None;
    }
    // SAFETY: a live stream made by `stream` (removed from STREAMS before it is freed).
    Some(unsafe { &*dir.cast::<DirStream>() })
}

/// A stream over our directory descriptor `fd`.
fn stream(fd: c_int, file: Arc<OpenFile>) -> *mut libc::DIR {
    // SAFETY: plain-old-data, zeroed.
    let entry: Box<libc::dirent64> = Box::new(unsafe { std::mem::zeroed() });
    let stream = Box::new(DirStream {
        fd,
        file,
        state: Mutex::new(Position { page: VecDeque::new(), after: 0, end: false, entry }),
    });
    let dir = Box::into_raw(stream).cast::<libc::DIR>();
    STREAMS.lock().insert(dir as usize);
    dir
}

#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut libc::DIR {
    if classify(libc::AT_FDCWD, path).is_none() {
        // SAFETY: libc's opendir with the caller's path.
        return unsafe { real_opendir(path) };
    }
    // SAFETY: our open with the caller's path.
    let fd = unsafe {
        spillway_preload_openat(
            libc::AT_FDCWD,
            path,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return std::ptr::null_mut();
    }
    match fds::get(fd) {
        Some(file) if file.directory => stream(fd, file),
        // libc opened it (the walk left the mount): its own stream.
        // SAFETY: a descriptor just opened for it.
        _ => unsafe { real_fdopendir(fd) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut libc::DIR {
    match fds::get(fd) {
        Some(file) if file.directory => stream(fd, file),
        Some(_) => {
            // SAFETY: the calling thread's errno.
            unsafe { *libc::__errno_location() = libc::ENOTDIR };
            std::ptr::null_mut()
        }
        // SAFETY: the caller's argument.
        None => unsafe { real_fdopendir(fd) },
    }
}

/// `d_type` of a kind.
fn dirent_type(kind: FileKind) -> u8 {
    match kind {
        FileKind::Regular => libc::DT_REG,
        FileKind::Directory => libc::DT_DIR,
        FileKind::Symlink => libc::DT_LNK,
        FileKind::Fifo => libc::DT_FIFO,
        FileKind::Socket => libc::DT_SOCK,
        FileKind::CharDevice => libc::DT_CHR,
        FileKind::BlockDevice => libc::DT_BLK,
    }
}

/// The next entry of our stream, or null at the end (errno untouched) or on a failure (errno
/// set).
fn next(stream: &DirStream) -> *mut libc::dirent64 {
    // The end of a listing is told apart from a failure by errno being unchanged, and the
    // namespace request may leave EAGAIN behind from its socket: put the caller's back.
    // SAFETY: the calling thread's errno.
    let saved = unsafe { *libc::__errno_location() };
    let entry = next_entry(stream);
    if !entry.is_null() || stream.state.lock().end {
        // SAFETY: the calling thread's errno.
        unsafe { *libc::__errno_location() = saved };
    }
    entry
}

fn next_entry(stream: &DirStream) -> *mut libc::dirent64 {
    let mut position = stream.state.lock();
    if position.page.is_empty() && !position.end {
        let Some(runtime) = runtime() else {
            // SAFETY: the calling thread's errno.
            unsafe { *libc::__errno_location() = libc::EIO };
            return std::ptr::null_mut();
        };
        match runtime.read_directory(&stream.file, position.after, ENTRIES_PER_PAGE) {
            Ok(page) if page.is_empty() => position.end = true,
            Ok(page) => position.page = page.into(),
            Err(fail) => {
                let errno = if let Fail::Errno(e) = fail { e } else { libc::EIO };
                // SAFETY: the calling thread's errno.
                unsafe { *libc::__errno_location() = errno };
                return std::ptr::null_mut();
            }
        }
    }
    let Some(entry) = position.page.pop_front() else { return std::ptr::null_mut() };
    position.after = entry.cookie;
    let out = &mut *position.entry;
    out.d_ino = entry.ino;
    out.d_off = entry.cookie as i64;
    out.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
    out.d_type = dirent_type(entry.kind);
    let length = entry.name.len().min(out.d_name.len() - 1);
    for (to, from) in out.d_name.iter_mut().zip(&entry.name[..length]) {
        *to = *from as c_char;
    }
    out.d_name[length] = 0;
    std::ptr::from_mut(out)
}

#[no_mangle]
pub unsafe extern "C" fn readdir64(dir: *mut libc::DIR) -> *mut libc::dirent64 {
    match ours(dir) {
        Some(stream) => next(stream),
        // SAFETY: the caller's stream.
        None => unsafe { real_readdir64(dir) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn readdir(dir: *mut libc::DIR) -> *mut libc::dirent64 {
    // SAFETY: the same function (struct dirent is struct dirent64 here).
    unsafe { readdir64(dir) }
}

#[no_mangle]
pub unsafe extern "C" fn readdir64_r(
    dir: *mut libc::DIR,
    entry: *mut libc::dirent64,
    result: *mut *mut libc::dirent64,
) -> c_int {
    let Some(stream) = ours(dir) else {
        // SAFETY: the caller's arguments.
        return unsafe { real_readdir64_r(dir, entry, result) };
    };
    // SAFETY: the calling thread's errno, cleared to tell the end from a failure.
    unsafe { *libc::__errno_location() = 0 };
    let next = next(stream);
    // SAFETY: the caller's buffers, as readdir_r's contract says.
    unsafe {
        if next.is_null() {
            *result = std::ptr::null_mut();
            return *libc::__errno_location();
        }
        entry.write(next.read());
        *result = entry;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn readdir_r(
    dir: *mut libc::DIR,
    entry: *mut libc::dirent64,
    result: *mut *mut libc::dirent64,
) -> c_int {
    // SAFETY: the same function.
    unsafe { readdir64_r(dir, entry, result) }
}

#[no_mangle]
pub unsafe extern "C" fn rewinddir(dir: *mut libc::DIR) {
    match ours(dir) {
        Some(stream) => seek(stream, 0),
        // SAFETY: the caller's stream.
        None => unsafe { real_rewinddir(dir) },
    }
}

fn seek(stream: &DirStream, cookie: u64) {
    let mut position = stream.state.lock();
    position.page.clear();
    position.after = cookie;
    position.end = false;
}

#[no_mangle]
pub unsafe extern "C" fn telldir(dir: *mut libc::DIR) -> c_long {
    match ours(dir) {
        Some(stream) => stream.state.lock().after as c_long,
        // SAFETY: the caller's stream.
        None => unsafe { real_telldir(dir) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn seekdir(dir: *mut libc::DIR, location: c_long) {
    match ours(dir) {
        Some(stream) => seek(stream, location as u64),
        // SAFETY: the caller's arguments.
        None => unsafe { real_seekdir(dir, location) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn dirfd(dir: *mut libc::DIR) -> c_int {
    match ours(dir) {
        Some(stream) => stream.fd,
        // SAFETY: the caller's stream.
        None => unsafe { real_dirfd(dir) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn closedir(dir: *mut libc::DIR) -> c_int {
    if ours(dir).is_none() {
        // SAFETY: the caller's stream.
        return unsafe { real_closedir(dir) };
    }
    STREAMS.lock().remove(&(dir as usize));
    // SAFETY: made by `stream` with Box::into_raw and no longer in STREAMS.
    let stream = unsafe { Box::from_raw(dir.cast::<DirStream>()) };
    // SAFETY: the stream's descriptor, closed once, here.
    unsafe { close(stream.fd) }
}

// libc's own stream functions (`real.rs` holds the others; these are used here only).
macro_rules! real_directory_calls {
    ($($name:ident = $symbol:literal ($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            /// libc's function of this name.
            ///
            /// # Safety
            /// As the libc function.
            unsafe fn $name($($arg: $ty),*) -> $ret {
                static SYMBOL: real::Symbol = real::Symbol::new($symbol);
                let address = SYMBOL.get();
                // SAFETY: the symbol is libc's function of this exact C signature.
                let function = unsafe { std::mem::transmute::<*mut std::ffi::c_void, unsafe extern "C" fn($($ty),*) -> $ret>(address) };
                // SAFETY: the caller upholds the function's contract.
                unsafe { function($($arg),*) }
            }
        )*
    };
}

real_directory_calls! {
    real_opendir = b"opendir\0" (path: *const c_char) -> *mut libc::DIR;
    real_fdopendir = b"fdopendir\0" (fd: c_int) -> *mut libc::DIR;
    real_readdir64 = b"readdir64\0" (dir: *mut libc::DIR) -> *mut libc::dirent64;
    real_readdir64_r = b"readdir64_r\0" (dir: *mut libc::DIR, entry: *mut libc::dirent64, result: *mut *mut libc::dirent64) -> c_int;
    real_rewinddir = b"rewinddir\0" (dir: *mut libc::DIR) -> ();
    real_telldir = b"telldir\0" (dir: *mut libc::DIR) -> c_long;
    real_seekdir = b"seekdir\0" (dir: *mut libc::DIR, location: c_long) -> ();
    real_dirfd = b"dirfd\0" (dir: *mut libc::DIR) -> c_int;
    real_closedir = b"closedir\0" (dir: *mut libc::DIR) -> c_int;
}
