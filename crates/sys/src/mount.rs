//! Unmounting (FUSE mounts of `spillway mount`).

use std::io;
use std::path::Path;

use nix::mount::MntFlags;

/// Unmounts `path`; `lazy` detaches it now and lets the kernel finish once it is no longer busy
/// (`MNT_DETACH`).
pub fn unmount(path: &Path, lazy: bool) -> io::Result<()> {
    let flags = if lazy { MntFlags::MNT_DETACH } else { MntFlags::empty() };
    nix::mount::umount2(path, flags).map_err(io::Error::from)
}
