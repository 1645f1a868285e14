//! The libc functions this library stands in front of, found with `dlsym(RTLD_NEXT, …)` on
//! first use and kept. A call that is not Spillway's goes to these unchanged.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use libc::{mode_t, off_t, size_t, ssize_t};

/// One resolved symbol.
pub struct Symbol {
    name: &'static [u8],
    address: AtomicPtr<c_void>,
}

impl Symbol {
    pub const fn new(name: &'static [u8]) -> Symbol {
        Symbol { name, address: AtomicPtr::new(std::ptr::null_mut()) }
    }

    /// The next definition after this library's.
    ///
    /// # Panics
    /// Aborts the process if libc has no such symbol: nothing sensible can run without it.
    pub fn get(&self) -> *mut c_void {
        let known = self.address.load(Ordering::Acquire);
        if !known.is_null() {
            return known;
        }
        debug_assert!(self.name.ends_with(b"\0"));
        // SAFETY: a NUL-terminated name; RTLD_NEXT looks past this library.
        let found = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr().cast()) };
        if found.is_null() {
            let message = b"libspillway_preload: a libc symbol is missing\n";
            // SAFETY: writing a static buffer to stderr, then aborting.
            unsafe {
                libc::write(2, message.as_ptr().cast(), message.len());
                libc::abort();
            }
        }
        self.address.store(found, Ordering::Release);
        found
    }
}

/// Declares `pub unsafe fn name(args) -> ret` calling libc's `name` through [`Symbol`].
macro_rules! real {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            /// libc's own function of this name.
            ///
            /// # Safety
            /// As for the libc function.
            pub unsafe fn $name($($arg: $ty),*) -> $ret {
                static SYMBOL: Symbol = Symbol::new(concat!(stringify!($name), "\0").as_bytes());
                let address = SYMBOL.get();
                // SAFETY: the symbol is libc's function of this exact C signature.
                let function = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> $ret>(address) };
                // SAFETY: the caller upholds the function's contract.
                unsafe { function($($arg),*) }
            }
        )*
    };
}

real! {
    openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
    close(fd: c_int) -> c_int;
    read(fd: c_int, buffer: *mut c_void, count: size_t) -> ssize_t;
    write(fd: c_int, buffer: *const c_void, count: size_t) -> ssize_t;
    pread64(fd: c_int, buffer: *mut c_void, count: size_t, offset: off_t) -> ssize_t;
    pwrite64(fd: c_int, buffer: *const c_void, count: size_t, offset: off_t) -> ssize_t;
    readv(fd: c_int, iov: *const libc::iovec, count: c_int) -> ssize_t;
    writev(fd: c_int, iov: *const libc::iovec, count: c_int) -> ssize_t;
    preadv64(fd: c_int, iov: *const libc::iovec, count: c_int, offset: off_t) -> ssize_t;
    pwritev64(fd: c_int, iov: *const libc::iovec, count: c_int, offset: off_t) -> ssize_t;
    lseek64(fd: c_int, offset: off_t, whence: c_int) -> off_t;
    fsync(fd: c_int) -> c_int;
    fdatasync(fd: c_int) -> c_int;
    ftruncate64(fd: c_int, length: off_t) -> c_int;
    truncate64(path: *const c_char, length: off_t) -> c_int;
    fstatat64(dirfd: c_int, path: *const c_char, stat: *mut libc::stat64, flags: c_int) -> c_int;
    fstat64(fd: c_int, stat: *mut libc::stat64) -> c_int;
    statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: libc::c_uint, statx: *mut libc::statx) -> c_int;
    unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int;
    renameat2(olddirfd: c_int, old: *const c_char, newdirfd: c_int, new: *const c_char, flags: libc::c_uint) -> c_int;
    faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int;
    dup(fd: c_int) -> c_int;
    dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    dup2(old: c_int, new: c_int) -> c_int;
    fcntl(fd: c_int, cmd: c_int, arg: *mut c_void) -> c_int;
    ioctl(fd: c_int, request: libc::c_ulong, arg: *mut c_void) -> c_int;
    close_range(first: libc::c_uint, last: libc::c_uint, flags: c_int) -> c_int;
    fork() -> libc::pid_t;
    execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    posix_spawn(pid: *mut libc::pid_t, path: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    posix_spawnp(pid: *mut libc::pid_t, file: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    system(command: *const c_char) -> c_int;
    popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE;
    mmap64(address: *mut c_void, length: size_t, protection: c_int, flags: c_int, fd: c_int, offset: off_t) -> *mut c_void;
    umask(mask: mode_t) -> mode_t;
    fchmod(fd: c_int, mode: mode_t) -> c_int;
    fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int;
    futimens(fd: c_int, times: *const libc::timespec) -> c_int;
    fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE;
    fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE;
    _exit(status: c_int) -> ();
}
