//! `libspillway_preload.so`: loaded with `LD_PRELOAD`, it sends the POSIX calls of unmodified
//! programs on paths under a Spillway mount point straight to the burst buffer servers, without
//! the kernel's FUSE round trips; every other call goes to libc untouched. See
//! docs/design/preload.md for what is intercepted, the consistency each path gives, and what
//! falls back to the FUSE mount.
//!
//! - [`config`]: the environment that turns it on (`SPILLWAY_PRELOAD_MOUNT`, the servers, the
//!   namespace);
//! - [`runtime`]: the connection (namespace and data plane, as the mount's) and the file
//!   operations;
//! - `fds`: the descriptors it owns (real numbers held by `O_PATH` shadows);
//! - `intercept` and `variadic.c`: the exported libc functions; `stdio`: `fopen` and
//!   `fdopen` through `fopencookie`; `dirs`: `opendir` and `readdir` of our directories;
//! - `real`: libc's own functions, for everything that is not ours.

pub mod config;
mod dirs;
mod fds;
mod intercept;
mod real;
pub mod runtime;
mod stdio;
mod variadic;

use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::config::Config;
use crate::runtime::Runtime;

/// `f_type` of a FUSE file system (linux/magic.h).
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

static CONFIG: OnceLock<Option<Config>> = OnceLock::new();

/// This process's runtime and the pid it was made in (a forked child makes its own).
static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = parking_lot::const_mutex(None);
/// Connecting failed in this process: calls go to libc (said once on stderr).
static UNREACHABLE: AtomicBool = AtomicBool::new(false);

/// The configuration, if the library is turned on (a bad one is reported once and ignored).
pub(crate) fn config() -> Option<&'static Config> {
    CONFIG
        .get_or_init(|| match Config::from_env()? {
            Ok(config) => Some(config),
            Err(message) => {
                say(&format!("{message}; calls go to the file system"));
                None
            }
        })
        .as_ref()
}

/// One line on stderr, prefixed, without allocating through stdio.
pub(crate) fn say(message: &str) {
    let line = format!("libspillway_preload: {message}\n");
    // SAFETY: writing a buffer we own to stderr.
    unsafe { real::write(2, line.as_ptr().cast(), line.len()) };
}

fn pid() -> u32 {
    // SAFETY: getpid cannot fail.
    unsafe { libc::getpid() as u32 }
}

/// The runtime, connecting on first use; `None` if the library is off or cannot connect.
pub(crate) fn runtime() -> Option<Arc<Runtime>> {
    let config = config()?;
    let mut slot = RUNTIME.lock();
    let pid = pid();
    match slot.as_ref() {
        Some((made_in, runtime)) if *made_in == pid => return Some(runtime.clone()),
        Some(_) => {
            // Forked without our fork(): the parent's worker threads do not exist here. Its
            // runtime cannot be dropped (that would join them), so it is left behind.
            std::mem::forget(slot.take());
            UNREACHABLE.store(false, Ordering::Relaxed);
        }
        None => {}
    }
    if UNREACHABLE.load(Ordering::Relaxed) {
        return None;
    }
    match Runtime::connect(config.clone()) {
        Ok(runtime) => {
            let runtime = Arc::new(runtime);
            *slot = Some((pid, runtime.clone()));
            Some(runtime)
        }
        Err(message) => {
            UNREACHABLE.store(true, Ordering::Relaxed);
            say(&format!("{message}; calls go to the file system"));
            None
        }
    }
}

/// The runtime if this process already has one (no connecting).
pub(crate) fn existing_runtime() -> Option<Arc<Runtime>> {
    let slot = RUNTIME.lock();
    slot.as_ref().filter(|(made_in, _)| *made_in == pid()).map(|(_, r)| r.clone())
}

/// In a forked child: the parent's runtime is left behind (its threads are not here).
pub(crate) fn forget_runtime_after_fork(slot: &mut Option<(u32, Arc<Runtime>)>) {
    std::mem::forget(slot.take());
    UNREACHABLE.store(false, Ordering::Relaxed);
}

pub(crate) fn runtime_slot() -> parking_lot::MutexGuard<'static, Option<(u32, Arc<Runtime>)>> {
    RUNTIME.lock()
}

/// The process's umask, kept by the `umask` wrapper (read from /proc at first use).
static UMASK: AtomicU32 = AtomicU32::new(u32::MAX);

pub(crate) fn umask() -> u32 {
    let known = UMASK.load(Ordering::Relaxed);
    if known != u32::MAX {
        return known;
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .unwrap_or(0o022);
    UMASK.store(mask, Ordering::Relaxed);
    mask
}

pub(crate) fn set_umask(mask: u32) {
    UMASK.store(mask & 0o777, Ordering::Relaxed);
}

/// `st_dev` of the FUSE mount at `mountpoint`, if one is there.
pub(crate) fn fuse_device(mountpoint: &[u8]) -> Option<u64> {
    let path = std::ffi::CString::new(mountpoint).ok()?;
    // SAFETY: zeroed plain-old-data filled by statfs.
    let mut fs: libc::statfs64 = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and buffer.
    if unsafe { libc::statfs64(path.as_ptr(), &mut fs) } != 0 || fs.f_type != FUSE_SUPER_MAGIC {
        return None;
    }
    // SAFETY: zeroed plain-old-data filled by the call.
    let mut stat: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and buffer; libc's own fstatat, not ours.
    let rc = unsafe { real::fstatat64(libc::AT_FDCWD, path.as_ptr(), &mut stat, 0) };
    (rc == 0).then_some(stat.st_dev)
}

/// Where a path argument points: below the mount point (relative to it, and the absolute path)
/// or elsewhere (`None`: libc's). Relative paths are taken from the working directory or, for
/// the `*at` calls, from `dirfd`'s path.
pub(crate) fn classify(dirfd: c_int, path: *const c_char) -> Option<(Vec<u8>, Vec<u8>)> {
    let config = config()?;
    if path.is_null() {
        return None;
    }
    // SAFETY: libc's contract: a NUL-terminated string.
    let path = unsafe { CStr::from_ptr(path) }.to_bytes();
    if path.is_empty() {
        return None;
    }
    let absolute = if path.starts_with(b"/") {
        path.to_vec()
    } else {
        let mut base = if dirfd == libc::AT_FDCWD {
            std::env::current_dir().ok()?.into_os_string().into_encoded_bytes()
        } else if let Some(directory) = fds::get(dirfd).filter(|f| f.directory) {
            directory.path.clone()
        } else {
            std::fs::read_link(format!("/proc/self/fd/{dirfd}"))
                .ok()?
                .into_os_string()
                .into_encoded_bytes()
        };
        base.push(b'/');
        base.extend_from_slice(path);
        base
    };
    let inside = config.inside(&absolute)?;
    Some((inside, config::normalize(&absolute)?))
}

/// Runs at load: writes that live in this process's memory are sent before it exits.
extern "C" fn at_load() {
    extern "C" fn at_exit() {
        if let Some(runtime) = existing_runtime() {
            runtime.flush_everything();
        }
    }
    if config().is_some() {
        // SAFETY: registering a plain function.
        unsafe { libc::atexit(at_exit) };
    }
}

#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load;
