//! Acting on files as another user, on one thread only.
//!
//! A root daemon that writes users' data into a shared file system (the PFS drain) must create
//! files owned by the data's owner, and let the file system apply *the owner's* permissions and
//! quotas, not root's. Linux keeps a file-system identity (fsuid, fsgid, supplementary groups)
//! per thread: [`FsIdentity::assume`] switches the calling thread's to the owner's, which also
//! drops root's file capabilities (CAP_DAC_OVERRIDE, CAP_FOWNER, …) for file access on this
//! thread, and the guard switches back when dropped. Other threads keep running as root.
//!
//! The system calls are made raw: glibc's `setgroups` changes every thread of the process,
//! which is exactly what must not happen here.

use std::io;

use nix::unistd::{Gid, Uid};

/// Supplementary groups a thread may carry (the kernel's `NGROUPS_MAX`).
pub const GROUPS_MAX: usize = 65_536;

/// Who a thread acts as on files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary gid need not be repeated).
    pub groups: Vec<u32>,
}

/// The calling thread's file-system identity is someone else's until this is dropped.
#[must_use = "the identity is restored when the guard is dropped"]
pub struct FsIdentity {
    previous_uid: Uid,
    previous_gid: Gid,
    previous_groups: Vec<libc::gid_t>,
    /// The guard belongs to the thread that made it (the identity is that thread's).
    _not_send: std::marker::PhantomData<*const ()>,
}

impl FsIdentity {
    /// Switches the calling thread to `identity` for file access. Needs root (CAP_SETUID and
    /// CAP_SETGID); fails, changing nothing, otherwise.
    pub fn assume(identity: &FileIdentity) -> io::Result<FsIdentity> {
        if identity.groups.len() > GROUPS_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} supplementary groups (at most {GROUPS_MAX})", identity.groups.len()),
            ));
        }
        let previous_groups = thread_groups()?;
        set_thread_groups(&identity.groups)?;
        let previous_gid = nix::unistd::setfsgid(Gid::from_raw(identity.gid));
        let previous_uid = nix::unistd::setfsuid(Uid::from_raw(identity.uid));
        // setfsuid/setfsgid report no error: read back to know whether they took effect.
        let now_uid = nix::unistd::setfsuid(Uid::from_raw(identity.uid));
        let now_gid = nix::unistd::setfsgid(Gid::from_raw(identity.gid));
        let guard = FsIdentity {
            previous_uid,
            previous_gid,
            previous_groups,
            _not_send: Default::default(),
        };
        if now_uid.as_raw() != identity.uid || now_gid.as_raw() != identity.gid {
            drop(guard);
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "cannot act as uid {} gid {} on files (needs root)",
                    identity.uid, identity.gid
                ),
            ));
        }
        Ok(guard)
    }
}

impl Drop for FsIdentity {
    fn drop(&mut self) {
        nix::unistd::setfsuid(self.previous_uid);
        nix::unistd::setfsgid(self.previous_gid);
        // Restoring the groups root had cannot fail for root; nothing useful to do if it did.
        let _ = set_thread_groups(&self.previous_groups);
    }
}

/// The calling thread's supplementary groups.
fn thread_groups() -> io::Result<Vec<libc::gid_t>> {
    // SAFETY: a zero size asks only for the count; no buffer is written.
    let count = unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<u32>()) };
    if count < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![0 as libc::gid_t; count as usize];
    // SAFETY: `groups` has room for `count` entries.
    let written = unsafe { libc::syscall(libc::SYS_getgroups, count, groups.as_mut_ptr()) };
    if written < 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(written as usize);
    Ok(groups)
}

/// Sets the calling thread's supplementary groups only (`gid_t` is `u32` on Linux).
fn set_thread_groups(groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: the kernel reads `groups.len()` entries from a valid slice.
    let result = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn files_are_created_as_the_assumed_user_on_this_thread_only() {
        assert_eq!(crate::user::euid(), 0, "this test needs root, as `make test` runs");
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o1777))
            .unwrap();
        let owner = FileIdentity { uid: 4321, gid: 4322, groups: vec![4323] };
        let path = dir.path().join("as-owner");
        let root_file = dir.path().join("as-root");
        // Both threads write while the first one has assumed the owner's identity.
        let assumed = std::sync::Barrier::new(2);
        let written = std::sync::Barrier::new(2);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let _as_owner = FsIdentity::assume(&owner).unwrap();
                assumed.wait();
                std::fs::write(&path, b"x").unwrap();
                written.wait();
            });
            scope.spawn(|| {
                assumed.wait();
                std::fs::write(&root_file, b"y").unwrap();
                written.wait();
            });
        });
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (4321, 4322));
        assert_eq!(std::fs::metadata(dir.path().join("as-root")).unwrap().uid(), 0);
        // Back to root on this thread: root may write where the owner may not.
        std::fs::write(dir.path().join("after"), b"z").unwrap();
        assert_eq!(std::fs::metadata(dir.path().join("after")).unwrap().uid(), 0);
    }

    #[test]
    fn the_owner_s_permissions_apply_not_root_s() {
        assert_eq!(crate::user::euid(), 0, "this test needs root, as `make test` runs");
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("root-only");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        let owner = FileIdentity { uid: 4321, gid: 4321, groups: Vec::new() };
        let guard = FsIdentity::assume(&owner).unwrap();
        let error = std::fs::write(private.join("f"), b"x").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        drop(guard);
        std::fs::write(private.join("f"), b"x").unwrap();
    }
}
