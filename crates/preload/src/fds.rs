//! Descriptors this library owns. Each is a real descriptor number, held in the kernel by an
//! `O_PATH` open of `/dev/null` (the "shadow"): the kernel hands out numbers, `dup`, close-on-exec
//! and inheritance work as for any descriptor, and a call that reaches the kernel without this
//! library (a raw system call, a static child after exec) fails with EBADF instead of reading
//! or writing anything. The table maps the number to the open file description.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use parking_lot::{Mutex, MutexGuard};

use crate::real;
use crate::runtime::OpenFile;

/// Descriptor numbers this library tracks; an open that would get a higher number goes to
/// libc (the bitmap below is what keeps `read(2)` of other descriptors cheap).
pub const TRACKED_FDS_MAX: usize = 1 << 16;

static OURS: [AtomicU64; TRACKED_FDS_MAX / 64] =
    [const { AtomicU64::new(0) }; TRACKED_FDS_MAX / 64];
static TABLE: LazyLock<Mutex<HashMap<c_int, Arc<OpenFile>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn bit(fd: c_int) -> Option<(usize, u64)> {
    let fd = usize::try_from(fd).ok().filter(|&fd| fd < TRACKED_FDS_MAX)?;
    Some((fd / 64, 1u64 << (fd % 64)))
}

/// Whether `fd` may be ours: one atomic load, so every other descriptor's calls cost nothing.
pub fn maybe_ours(fd: c_int) -> bool {
    bit(fd).is_some_and(|(word, mask)| OURS[word].load(Ordering::Acquire) & mask != 0)
}

/// Whether the kernel's descriptor `fd` is still a shadow (an `O_PATH` descriptor): a raw
/// `close` that bypassed this library may have let the number go to another file.
fn still_shadow(fd: c_int) -> bool {
    // SAFETY: F_GETFL takes no argument.
    let flags = unsafe { real::fcntl(fd, libc::F_GETFL, std::ptr::null_mut()) };
    flags >= 0 && flags & libc::O_PATH != 0
}

/// The open file behind `fd`, if `fd` is ours.
pub fn get(fd: c_int) -> Option<Arc<OpenFile>> {
    if !maybe_ours(fd) {
        return None;
    }
    let file = TABLE.lock().get(&fd).cloned()?;
    if !still_shadow(fd) {
        forget(fd);
        return None;
    }
    Some(file)
}

pub fn insert(fd: c_int, file: Arc<OpenFile>) {
    let (word, mask) = bit(fd).expect("shadow numbers are checked at creation");
    TABLE.lock().insert(fd, file);
    OURS[word].fetch_or(mask, Ordering::Release);
}

/// Removes `fd`; the file, and whether no other descriptor refers to it any more.
pub fn remove(fd: c_int) -> Option<(Arc<OpenFile>, bool)> {
    let (word, mask) = bit(fd)?;
    let mut table = TABLE.lock();
    let file = table.remove(&fd)?;
    OURS[word].fetch_and(!mask, Ordering::Release);
    let last = !table.values().any(|other| Arc::ptr_eq(other, &file));
    Some((file, last))
}

/// Drops `fd` from the table without closing anything (the kernel already did).
fn forget(fd: c_int) {
    let _ = remove(fd);
}

/// Every descriptor of ours, in number order.
pub fn all() -> Vec<(c_int, Arc<OpenFile>)> {
    let mut all: Vec<_> = TABLE.lock().iter().map(|(fd, f)| (*fd, f.clone())).collect();
    all.sort_by_key(|(fd, _)| *fd);
    all
}

/// The table locked (held across fork so the child's copy is whole).
pub fn lock() -> MutexGuard<'static, HashMap<c_int, Arc<OpenFile>>> {
    TABLE.lock()
}

/// A new shadow descriptor, or `None` (too high a number, or none left: the caller lets libc
/// open the file instead).
pub fn new_shadow(cloexec: bool) -> Option<c_int> {
    let flags = libc::O_PATH | if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { real::openat(libc::AT_FDCWD, c"/dev/null".as_ptr(), flags, 0) };
    if fd < 0 {
        return None;
    }
    if bit(fd).is_none() {
        // SAFETY: closing the descriptor just opened.
        unsafe { real::close(fd) };
        return None;
    }
    Some(fd)
}
