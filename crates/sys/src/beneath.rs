//! Paths under a trusted directory, resolved without following symbolic links.
//!
//! A root process that writes into a directory users can also write (a PFS drain directory,
//! often mode 1777) must not be redirected by a symlink a user planted there: every name is
//! resolved with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` from
//! an open descriptor of the trusted directory, so `..`, absolute links and symlinks anywhere in
//! the path fail with `ELOOP`/`EXDEV` instead of leading outside or elsewhere. Operations that
//! name a final component (create, rename, unlink, stat) resolve the parent that way and then
//! act on the single name, which never follows a symlink either.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstatat, mkdirat, FileStat, Mode};

/// Resolution that stays under the directory and follows no link of any kind.
fn resolve_flags() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

/// A directory opened once by its trusted absolute path; everything else is relative to it.
pub struct Beneath {
    root: OwnedFd,
    root_path: PathBuf,
}

impl Beneath {
    /// Opens `root` (an administrator-configured path, trusted as given).
    pub fn open(root: &Path) -> io::Result<Beneath> {
        let fd = nix::fcntl::open(
            root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| describe(errno, "opening", root))?;
        Ok(Beneath { root: fd, root_path: root.to_path_buf() })
    }

    /// The trusted path this was opened with, for messages.
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Opens the existing file `relative` for reading, following no link.
    pub fn open_read(&self, relative: &Path) -> io::Result<File> {
        self.open_file(relative, OFlag::O_RDONLY, 0)
    }

    /// Opens `relative` for writing, creating it with `mode` if it does not exist (never
    /// truncating), following no link.
    pub fn open_or_create(&self, relative: &Path, mode: u32) -> io::Result<File> {
        self.open_file(relative, OFlag::O_WRONLY | OFlag::O_CREAT, mode)
    }

    /// Opens `relative` for reading and writing, creating it with `mode` if it does not exist
    /// (never truncating), following no link.
    pub fn open_or_create_read_write(&self, relative: &Path, mode: u32) -> io::Result<File> {
        self.open_file(relative, OFlag::O_RDWR | OFlag::O_CREAT, mode)
    }

    /// Opens the existing file `relative` for writing (never creating it), following no link.
    pub fn open_existing_for_write(&self, relative: &Path) -> io::Result<File> {
        self.open_file(relative, OFlag::O_WRONLY, 0)
    }

    /// Creates `relative` with `mode` for writing; it must not exist yet.
    pub fn create_new(&self, relative: &Path, mode: u32) -> io::Result<File> {
        self.open_file(relative, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL, mode)
    }

    /// Opens `relative` with `flags` (`O_CREAT` creates with `mode`), following no link.
    fn open_file(&self, relative: &Path, flags: OFlag, mode: u32) -> io::Result<File> {
        let (parent, name) = self.parent_of(relative)?;
        let how = OpenHow::new()
            .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .mode(Mode::from_bits_truncate(mode))
            .resolve(resolve_flags());
        let fd = openat2(&parent, name, how).map_err(|e| self.describe(e, "opening", relative))?;
        Ok(File::from(fd))
    }

    /// Creates every missing directory of `relative` with `mode`, following no link; an
    /// existing component must be a directory.
    pub fn create_directories(&self, relative: &Path, mode: u32) -> io::Result<()> {
        let mut at: Option<OwnedFd> = None;
        let mut walked = PathBuf::new();
        for name in components(relative)? {
            walked.push(name);
            let dir = at.as_ref().map_or(self.root.as_fd(), |fd| fd.as_fd());
            match mkdirat(dir, name, Mode::from_bits_truncate(mode)) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                Err(errno) => return Err(self.describe(errno, "creating directory", &walked)),
            }
            let how = OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
                .resolve(resolve_flags());
            let next = openat2(dir, name, how)
                .map_err(|e| self.describe(e, "opening directory", &walked))?;
            at = Some(next);
        }
        Ok(())
    }

    /// `lstat` of `relative`; `Ok(None)` when it does not exist.
    pub fn stat(&self, relative: &Path) -> io::Result<Option<FileStat>> {
        let (parent, name) = match self.parent_of(relative) {
            Ok(found) => found,
            // No parent directory: nothing there either.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        match fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some(stat)),
            Err(nix::errno::Errno::ENOENT) => Ok(None),
            Err(errno) => Err(self.describe(errno, "stat of", relative)),
        }
    }

    /// Renames `from` to `to` (both relative), replacing `to`; the names themselves are never
    /// followed if they are links.
    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (from_parent, from_name) = self.parent_of(from)?;
        let (to_parent, to_name) = self.parent_of(to)?;
        nix::fcntl::renameat(&from_parent, from_name, &to_parent, to_name)
            .map_err(|e| self.describe(e, "renaming to", to))
    }

    /// Renames `from` to `to` only if nothing is at `to` (`AlreadyExists` otherwise): a
    /// publish that must not replace what another writer put there in the meantime.
    pub fn rename_noreplace(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (from_parent, from_name) = self.parent_of(from)?;
        let (to_parent, to_name) = self.parent_of(to)?;
        match nix::fcntl::renameat2(
            &from_parent,
            from_name,
            &to_parent,
            to_name,
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        ) {
            Ok(()) => Ok(()),
            // File systems without rename flags (MooseFS and other FUSE file systems, older
            // NFS) say EINVAL: a hard link is just as atomic about an existing target (EEXIST),
            // then the old name goes.
            Err(nix::errno::Errno::EINVAL) => {
                nix::unistd::linkat(
                    &from_parent,
                    from_name,
                    &to_parent,
                    to_name,
                    nix::fcntl::AtFlags::empty(),
                )
                .map_err(|e| self.describe(e, "linking (not replacing) to", to))?;
                nix::unistd::unlinkat(
                    &from_parent,
                    from_name,
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                )
                .map_err(|e| self.describe(e, "removing the old name after linking to", to))
            }
            Err(errno) => Err(self.describe(errno, "renaming (not replacing) to", to)),
        }
    }

    /// Opens `relative` as a path descriptor (`O_PATH`, following no link): for `fstat` and
    /// extended attributes, without opening the file itself (a FIFO or device planted there
    /// is not opened).
    pub fn open_path(&self, relative: &Path) -> io::Result<OwnedFd> {
        let (parent, name) = self.parent_of(relative)?;
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(resolve_flags());
        openat2(&parent, name, how).map_err(|e| self.describe(e, "opening", relative))
    }

    /// Removes the file `relative`; a missing one is not an error.
    pub fn remove_file(&self, relative: &Path) -> io::Result<()> {
        let (parent, name) = self.parent_of(relative)?;
        match nix::unistd::unlinkat(&parent, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
            Err(errno) => Err(self.describe(errno, "removing", relative)),
        }
    }

    /// fsync of the directory holding `relative` (after creating or renaming a name in it).
    pub fn sync_parent(&self, relative: &Path) -> io::Result<()> {
        let parent = relative.parent().unwrap_or(Path::new(""));
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(resolve_flags());
        let target: &Path = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
        let fd = openat2(&self.root, target, how)
            .map_err(|e| self.describe(e, "opening directory", target))?;
        File::from(fd).sync_all()
    }

    /// The parent directory of `relative` (opened beneath the root, as a path descriptor) and
    /// its last component.
    fn parent_of<'a>(&self, relative: &'a Path) -> io::Result<(OwnedFd, &'a OsStr)> {
        let names = components(relative)?;
        let (name, parents) = names.split_last().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "empty path under the directory")
        })?;
        let parent_path: PathBuf = parents.iter().collect();
        let target: &Path =
            if parent_path.as_os_str().is_empty() { Path::new(".") } else { &parent_path };
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(resolve_flags());
        let fd = openat2(&self.root, target, how)
            .map_err(|e| self.describe(e, "opening directory", target))?;
        Ok((fd, name))
    }

    fn describe(&self, errno: nix::errno::Errno, what: &str, relative: &Path) -> io::Error {
        describe(errno, what, &self.root_path.join(relative))
    }
}

/// The normal components of a relative path; anything else (`..`, `/`, `.`) is refused.
fn components(relative: &Path) -> io::Result<Vec<&OsStr>> {
    relative
        .components()
        .map(|component| match component {
            Component::Normal(name) => Ok(name),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a plain relative path", relative.display()),
            )),
        })
        .collect()
}

/// An OS error naming the operation and the path; a link met during resolution says so.
fn describe(errno: nix::errno::Errno, what: &str, path: &Path) -> io::Error {
    let why = match errno {
        nix::errno::Errno::ELOOP | nix::errno::Errno::EXDEV | nix::errno::Errno::ENOTDIR => {
            " (a symbolic link, a non-directory on the way, or a path leading outside: refused)"
                .to_string()
        }
        _ => String::new(),
    };
    io::Error::new(
        io::Error::from(errno).kind(),
        format!("{what} {}: {errno}{why}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn creates_opens_renames_and_removes_beneath() {
        let dir = tempfile_dir();
        let tree = Beneath::open(dir.path()).unwrap();
        tree.create_directories(Path::new("a/b"), 0o755).unwrap();
        let mut file = tree.create_new(Path::new("a/b/f"), 0o600).unwrap();
        assert!(tree.create_new(Path::new("a/b/f"), 0o600).is_err());
        file.write_all(b"bytes").unwrap();
        tree.rename(Path::new("a/b/f"), Path::new("a/g")).unwrap();
        assert_eq!(std::fs::read(dir.path().join("a/g")).unwrap(), b"bytes");
        assert!(tree.stat(Path::new("a/b/f")).unwrap().is_none());
        tree.sync_parent(Path::new("a/g")).unwrap();
        tree.remove_file(Path::new("a/g")).unwrap();
        tree.remove_file(Path::new("a/g")).unwrap();
        assert!(tree.stat(Path::new("a/g")).unwrap().is_none());
        assert!(tree.stat(Path::new("missing/dir/f")).unwrap().is_none(), "no parent: absent");
    }

    #[test]
    fn planted_symlinks_are_never_followed() {
        let dir = tempfile_dir();
        let outside = tempfile_dir();
        std::fs::write(outside.path().join("victim"), b"root's file").unwrap();
        let tree = Beneath::open(dir.path()).unwrap();
        // A link as the final name, as a directory on the way, and to a directory outside.
        std::os::unix::fs::symlink(outside.path().join("victim"), dir.path().join("f")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("d")).unwrap();
        let error = tree.open_or_create(Path::new("f"), 0o600).unwrap_err();
        assert!(error.to_string().contains("refused"), "{error}");
        let error = tree.open_or_create(Path::new("d/victim"), 0o600).unwrap_err();
        assert!(error.to_string().contains("refused"), "{error}");
        let error = tree.create_directories(Path::new("d/sub"), 0o755).unwrap_err();
        assert!(error.to_string().contains("refused"), "{error}");
        assert!(tree.open_or_create(Path::new("../x"), 0o600).is_err());
        assert!(tree.open_read(Path::new("d/victim")).is_err());
        assert_eq!(std::fs::read(outside.path().join("victim")).unwrap(), b"root's file");
        assert!(!outside.path().join("sub").exists());
        // Renaming onto a planted link replaces the link, not what it points to.
        tree.create_new(Path::new("new"), 0o600).unwrap();
        tree.rename(Path::new("new"), Path::new("f")).unwrap();
        assert_eq!(std::fs::read(outside.path().join("victim")).unwrap(), b"root's file");
        assert!(!std::fs::symlink_metadata(dir.path().join("f")).unwrap().file_type().is_symlink());
    }

    fn tempfile_dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }
}
