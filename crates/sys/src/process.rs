//! What a child process does between fork and exec, set up on a `Command`.
//!
//! Each hook runs in the forked child, where only async-signal-safe calls are allowed: no
//! allocation, no locks. Everything a hook needs is prepared before the fork.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::unistd::{Gid, Uid};

/// The child runs as `uid`/`gid` with exactly `groups` as its supplementary groups (for
/// example [`crate::user::groups_of`]); it fails to start if the process may not switch.
pub fn run_as(command: &mut Command, uid: u32, gid: u32, groups: &[u32]) {
    let groups: Vec<Gid> = groups.iter().copied().map(Gid::from_raw).collect();
    // SAFETY: the hook makes only setgroups, setgid and setuid system calls (async-signal-safe)
    // on data prepared before the fork, and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            nix::unistd::setgroups(&groups)?;
            nix::unistd::setgid(Gid::from_raw(gid))?;
            nix::unistd::setuid(Uid::from_raw(uid))?;
            Ok(())
        });
    }
}

/// The kernel SIGKILLs the child when this process dies, even without a destructor running
/// (`PR_SET_PDEATHSIG`): no server or mount outlives a demo or benchmark that was killed.
pub fn die_with_parent(command: &mut Command) {
    // SAFETY: the hook makes one prctl system call (async-signal-safe) and allocates nothing.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            Ok(())
        });
    }
}

/// The child starts with file-creation mask `mask` (tests give 0, so that the modes of what
/// the child creates are the ones it sets itself).
pub fn with_umask(command: &mut Command, mask: u32) {
    let mask = nix::sys::stat::Mode::from_bits_truncate(mask as nix::libc::mode_t);
    // SAFETY: the hook makes one umask system call (async-signal-safe) and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            nix::sys::stat::umask(mask);
            Ok(())
        });
    }
}

/// The child starts a new session (so the caller's terminal or job step does not take it down)
/// and keeps none of the caller's descriptors above stderr across its exec.
pub fn detach(command: &mut Command) {
    // SAFETY: the hook makes only setsid and close_range system calls (async-signal-safe) and
    // allocates nothing.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()?;
            close_descriptors_on_exec_in_child();
            Ok(())
        });
    }
}

/// Marks every descriptor of this process above stderr close-on-exec, so that the children it
/// starts from now on get only stdin, stdout and stderr (a caller's result pipe, such as Slurm's
/// reading a hook's output until EOF, must not stay open for a child's lifetime).
pub fn close_inherited_descriptors_on_exec() -> io::Result<()> {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str().and_then(|name| name.parse().ok()))
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: fcntl on a descriptor number touches no memory; a stale number (the read_dir
        // handle, closed by now) fails with EBADF, which is harmless.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

/// `close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`, for a forked child. Kernels without close_range
/// return ENOSYS and keep the descriptors, which only delays a reader waiting for EOF.
fn close_descriptors_on_exec_in_child() {
    const CLOSE_RANGE_CLOEXEC: u32 = 4;
    // SAFETY: a plain system call with integer arguments.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn detached_children_keep_no_inherited_descriptor() {
        let file = tempfile_in_proc();
        let fd = file.as_raw_fd();
        let mut command = Command::new("sh");
        command.arg("-c").arg(format!("test -e /proc/self/fd/{fd} && echo open || echo closed"));
        detach(&mut command);
        // Rust opens files close-on-exec; clear the flag to see `detach` set it again.
        // SAFETY: fcntl on our own open descriptor.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
        let output = command.output().unwrap();
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "closed");
    }

    #[test]
    fn running_as_another_user_needs_root_and_says_so_otherwise() {
        let mut command = Command::new("id");
        command.arg("-u");
        run_as(&mut command, 65534, 65534, &[65534]);
        match command.output() {
            Ok(output) => {
                assert_eq!(crate::user::euid(), 0, "only root may switch users");
                assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "65534");
            }
            Err(error) => {
                assert_ne!(crate::user::euid(), 0, "root failed to switch: {error}");
                assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
            }
        }
    }

    fn tempfile_in_proc() -> std::fs::File {
        std::fs::File::open("/proc/self/status").unwrap()
    }
}
