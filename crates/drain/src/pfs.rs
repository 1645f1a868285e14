//! The parallel file system behind a small trait: a real POSIX implementation and a
//! fault-injecting wrapper for tests, plus the log of PFS writes used by the lock-switch metric.
//!
//! Visibility rule (docs/semantics.md, "Drain"): bytes are written to a *staging* name, fsync'd,
//! and only then renamed to the final name, after which the directory is fsync'd. A reader of
//! the PFS therefore sees a file under its final name only complete. The staging file of an N-1
//! file is shared by every server writing a domain of it (each writes only its own ranges), and
//! each server records that its part is durable with a *part marker* file; whoever creates the
//! last marker publishes (see [`crate::drainer`]). All paths given to a [`Pfs`] are relative
//! to its root; the root itself is never created by the drainer, so a missing or unmounted PFS
//! is reported as an error instead of silently filling the local disk.
//!
//! Safety on a shared PFS (docs/security.md): users can write where the drain writes (often a
//! mode 1777 directory) and plant symbolic links and files there. Every path is resolved under
//! the root without following any link (`spillway_sys::beneath`), every operation runs with the
//! file-system identity of the data's owner ([`PfsOwner`]; `spillway_sys::identity`), so files
//! are created as theirs and the PFS applies *their* permissions and quotas, and a staging file
//! or marker that is not a plain file of the owner's (a planted one) is refused.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use spillway_sys::beneath::Beneath;
use spillway_sys::identity::{FileIdentity, FsIdentity};

use crate::plan::PfsWrite;

/// A failed PFS operation: what was attempted, on which path, and the OS error.
#[derive(Debug, thiserror::Error)]
#[error("PFS {operation} {path}: {source}")]
pub struct PfsError {
    pub operation: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl PfsError {
    pub fn new(operation: &'static str, path: &Path, source: io::Error) -> Self {
        PfsError { operation, path: path.to_path_buf(), source }
    }
}

/// Whose a drained file is on the PFS: every operation for it runs as `identity`, and the
/// published file and the directories made for it get these permission bits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PfsOwner {
    pub identity: FileIdentity,
    /// Permission bits of the published file (at most `0o777`).
    pub file_mode: u32,
    /// Permission bits of the directories the drain creates on the way to it.
    pub directory_mode: u32,
}

impl PfsOwner {
    /// The identity of this process, private modes: for drains whose owner is not known and for
    /// benchmarks and tests that run as one user.
    pub fn this_process() -> PfsOwner {
        PfsOwner {
            identity: FileIdentity {
                uid: spillway_sys::user::euid(),
                gid: spillway_sys::user::egid(),
                groups: Vec::new(),
            },
            file_mode: 0o600,
            directory_mode: 0o700,
        }
    }
}

/// A file being written on the PFS (a staging file).
pub trait PfsFile: Send {
    /// Writes all of `data` at `offset`.
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), PfsError>;
    /// Grows the file to `bytes` if it is shorter (never shrinks: other servers write too).
    fn extend_to(&mut self, bytes: u64) -> Result<(), PfsError>;
    /// fsync: every byte written through this handle is durable when this returns.
    fn sync(&mut self) -> Result<(), PfsError>;
    /// Sets the permission bits the file will be published with.
    fn set_mode(&mut self, mode: u32) -> Result<(), PfsError>;
    /// Records which drain this file is ([`PublishedIdentity`], the extended attribute
    /// [`identity_xattr`]); made durable by the next [`PfsFile::sync`]. A PFS without these
    /// extended attributes refuses (`ENOTSUP`): the drain then fails, visibly, and publishes
    /// nothing.
    fn set_identity(&mut self, identity: &PublishedIdentity) -> Result<(), PfsError>;
    /// Hint: start writing back `offset..offset+length` now (so the final fsync has less to
    /// do). No durability promise; a no-op where unsupported.
    fn start_writeback(&mut self, offset: u64, length: u64) {
        let _ = (offset, length);
    }
}

/// The PFS: a directory tree. Paths are relative to the PFS root; every operation acts as
/// `owner`.
pub trait Pfs: Send + Sync {
    /// Creates the parent directories of `path` (not the root).
    fn create_parents(&self, path: &Path, owner: &PfsOwner) -> Result<(), PfsError>;
    /// Opens `path` for writing, creating it (private) if needed, never truncating; an existing
    /// file must be a plain file of the owner's.
    fn open_staging(&self, path: &Path, owner: &PfsOwner) -> Result<Box<dyn PfsFile>, PfsError>;
    /// Whether `path` is a plain file of the owner's (a published file, a part marker). Anything
    /// else there — nothing, a symbolic link, a directory, another user's file — is not: a
    /// file someone planted under a final name or a marker's name never counts as the drain's.
    fn holds_owned_file(&self, path: &Path, owner: &PfsOwner) -> Result<bool, PfsError>;
    /// What is under the final name `path`: nothing, a file this drain's identity says it
    /// published (of the owner's, plain, with [`identity_xattr`]), or something else.
    fn final_name_state(&self, path: &Path, owner: &PfsOwner) -> Result<AtFinalName, PfsError>;
    /// Sets `identity` on the existing staging file `path` (a plain file of the owner's) and
    /// fsyncs it; `false` if there is no file there (a peer published it meanwhile): never
    /// creates one.
    fn set_staging_identity(
        &self,
        path: &Path,
        owner: &PfsOwner,
        identity: &PublishedIdentity,
    ) -> Result<bool, PfsError>;
    /// Creates a marker file holding `content` (fsync'd) and fsyncs its directory
    /// (idempotent). The marker appears with its whole content (written at a temporary name,
    /// then renamed): a participant that sees it never reads a half-written one.
    fn create_marker(&self, path: &Path, owner: &PfsOwner, content: &[u8]) -> Result<(), PfsError>;
    /// The content of a marker (at most `bytes_max`) if `path` is a plain file of the owner's;
    /// `None` otherwise. The file is only opened once it is known to be a plain file.
    fn read_marker(
        &self,
        path: &Path,
        owner: &PfsOwner,
        bytes_max: usize,
    ) -> Result<Option<Vec<u8>>, PfsError>;
    /// Renames `from` to `to` and fsyncs the directory of `to`. With `replace` false the
    /// rename fails (`AlreadyExists`) if anything is at `to`.
    fn publish(
        &self,
        from: &Path,
        to: &Path,
        owner: &PfsOwner,
        replace: bool,
    ) -> Result<(), PfsError>;
    /// Removes a file; a missing file is not an error.
    fn remove(&self, path: &Path, owner: &PfsOwner) -> Result<(), PfsError>;
    /// Reads up to `buf.len()` bytes at `offset`; returns how many (short at end of file).
    fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8]) -> Result<usize, PfsError>;
}

/// The extended attribute every file the drain publishes carries (its [`PublishedIdentity`])
/// when the drain runs as root: in the `trusted` namespace, which only root can set or read, so
/// no user can forge it on a file of theirs (setting it needs `CAP_SYS_ADMIN`, which the
/// drainer keeps while it acts with the owner's file-system identity).
pub const IDENTITY_XATTR: &str = "trusted.spillway.drain";

/// The identity attribute of a drain that does not run as root (servers running as the
/// application's uid): in the `user` namespace, which the owner can also set.
pub const IDENTITY_XATTR_UNPRIVILEGED: &str = "user.spillway.drain";

/// The identity attribute this process uses: [`IDENTITY_XATTR`] as root, else
/// [`IDENTITY_XATTR_UNPRIVILEGED`].
pub fn identity_xattr() -> &'static str {
    if spillway_sys::user::euid() == 0 {
        IDENTITY_XATTR
    } else {
        IDENTITY_XATTR_UNPRIVILEGED
    }
}

/// Which drain published a file: the epoch, the store file (for a mount file
/// `ns/<namespace>/<ino>.<generation>`, so the namespace incarnation too) and the size. Only a
/// final name carrying exactly this drain's identity counts as "already published".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedIdentity {
    pub epoch: u64,
    pub size: u64,
    /// CRC32C of the whole file (holes as zeros), combined from the participants' domain
    /// checksums; `None` where it is not known (naive drains, parts written before checksums).
    pub crc32c: Option<u32>,
    pub file: String,
}

impl PublishedIdentity {
    const PREFIX: &'static str = "spillway-drain/1 ";

    /// `spillway-drain/1 epoch=<E> size=<S> [crc32c=<8 hex> ]file=<store name>` (the name
    /// last: it may hold spaces).
    pub fn encode(&self) -> String {
        let crc = self.crc32c.map(|c| format!("crc32c={c:08x} ")).unwrap_or_default();
        format!("{}epoch={} size={} {crc}file={}", Self::PREFIX, self.epoch, self.size, self.file)
    }

    pub fn parse(text: &str) -> Option<PublishedIdentity> {
        let rest = text.strip_prefix(Self::PREFIX)?;
        let (epoch, rest) = rest.strip_prefix("epoch=")?.split_once(' ')?;
        let (size, mut rest) = rest.strip_prefix("size=")?.split_once(' ')?;
        let mut crc32c = None;
        if let Some(with_crc) = rest.strip_prefix("crc32c=") {
            let (crc, after) = with_crc.split_once(' ')?;
            crc32c = Some(u32::from_str_radix(crc, 16).ok()?);
            rest = after;
        }
        Some(PublishedIdentity {
            epoch: epoch.parse().ok()?,
            size: size.parse().ok()?,
            crc32c,
            file: rest.strip_prefix("file=")?.to_string(),
        })
    }
}

/// The drain identity recorded on the file at `path` (any path, not resolved beneath a PFS
/// root: for administrators and tests checking a published file); `None` without one.
pub fn published_identity(path: &Path) -> io::Result<Option<PublishedIdentity>> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    let name = std::ffi::CString::new(identity_xattr()).expect("no NUL in the name");
    let mut value = [0u8; 8192];
    // SAFETY: NUL-terminated strings and a live buffer of the given length.
    let read = unsafe {
        libc::lgetxattr(path.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), value.len())
    };
    if read < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENODATA) => Ok(None),
            _ => Err(error),
        };
    }
    Ok(PublishedIdentity::parse(&String::from_utf8_lossy(&value[..read as usize])))
}

/// What a final name holds (see [`Pfs::final_name_state`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AtFinalName {
    Absent,
    /// A plain file of the owner's that a drain published, and which.
    Published(PublishedIdentity),
    /// A symbolic link (holds no data; never followed): what it is.
    Link(String),
    /// Anything else (a user's own file, another user's, a directory): what it is.
    Other(String),
}

/// Name of the marker file `spillway drain mark-pfs DIR` writes in the PFS directory.
pub const PFS_MARKER_FILE: &str = ".spillway-pfs";

/// The marker of a PFS directory: a random id and the device the directory was on when
/// marked. A drain writes only where this marker is, on that device (an unmounted PFS leaves
/// the bare mount-point directory, without the marker, on another device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PfsMarker {
    pub id: String,
    pub device: u64,
}

impl PfsMarker {
    fn encode(&self) -> String {
        format!("spillway-pfs 1\nid {}\ndevice {}\n", self.id, self.device)
    }

    fn parse(text: &str) -> Option<PfsMarker> {
        let mut lines = text.lines();
        if lines.next()? != "spillway-pfs 1" {
            return None;
        }
        let id = lines.next()?.strip_prefix("id ")?.to_string();
        let device = lines.next()?.strip_prefix("device ")?.parse().ok()?;
        (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
            .then_some(PfsMarker { id, device })
    }
}

/// Marks `dir` as a PFS directory drains may write to (the admin's `spillway drain mark-pfs
/// DIR`, and every harness/demo/test setup through it): writes [`PFS_MARKER_FILE`] (mode 0644,
/// owned by the caller, normally root) with a random id and the device of `dir`. A valid
/// marker for the same device is kept (servers already running keep their id); one for
/// another device (the PFS was remounted with a new device number) is replaced.
pub fn mark_pfs(dir: &Path) -> io::Result<PfsMarker> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let device = std::fs::metadata(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("PFS directory {}: {e}", dir.display())))?
        .dev();
    if let Ok(existing) = read_marker(dir) {
        if existing.device == device {
            return Ok(existing);
        }
    }
    let marker = PfsMarker { id: format!("{:032x}", rand::random::<u128>()), device };
    let temporary = dir.join(format!(
        "{PFS_MARKER_FILE}.new-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let described = |e: io::Error, what: &str| {
        io::Error::new(e.kind(), format!("{what} {}: {e}", dir.display()))
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&temporary)
        .map_err(|e| described(e, "writing the PFS marker in"))?;
    let written = file
        .write_all(marker.encode().as_bytes())
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&temporary, dir.join(PFS_MARKER_FILE)))
        .and_then(|()| File::open(dir)?.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(described(e, "writing the PFS marker in"));
    }
    Ok(marker)
}

/// The marker of `dir`, checked: a plain file owned by root (or by this process's user), not
/// writable by others, on the directory's device, well formed.
pub fn read_marker(dir: &Path) -> io::Result<PfsMarker> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let tree = Beneath::open(dir)?;
    let mut file = tree.open_read(Path::new(PFS_MARKER_FILE))?;
    let meta = file.metadata()?;
    let owner_ok = meta.uid() == 0 || meta.uid() == spillway_sys::user::euid();
    if !meta.is_file() || !owner_ok || meta.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}/{PFS_MARKER_FILE} is not a plain file of root's that only root may write (uid {}, mode {:o}): not a marker spillway wrote",
                dir.display(),
                meta.uid(),
                meta.mode() & 0o7777
            ),
        ));
    }
    let mut text = String::new();
    file.by_ref().take(4096).read_to_string(&mut text)?;
    let marker = PfsMarker::parse(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}/{PFS_MARKER_FILE} is not a spillway PFS marker", dir.display()),
        )
    })?;
    if meta.dev() != marker.device {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}/{PFS_MARKER_FILE} records device {} but is on device {}",
                dir.display(),
                marker.device,
                meta.dev()
            ),
        ));
    }
    Ok(marker)
}

/// The PFS as a local POSIX directory (Lustre/GPFS mount point on a real center).
pub struct PosixPfs {
    root: PathBuf,
    log: Option<Arc<WriteLog>>,
    server: u32,
    /// The marker id this PFS was first verified with; a different one later is a different
    /// file system (a remount, another directory) and is refused.
    verified_marker: Mutex<Option<PfsMarker>>,
}

impl PosixPfs {
    /// `root` must exist when the drain runs (it is not created here).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        PosixPfs { root: root.into(), log: None, server: 0, verified_marker: Mutex::new(None) }
    }

    /// Records every data write as `(server, offset, length)` in `log`.
    pub fn with_log(mut self, log: Arc<WriteLog>, server: u32) -> Self {
        self.log = Some(log);
        self.server = server;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn full(&self, path: &Path) -> PathBuf {
        self.root.join(path)
    }

    /// The root, opened now (a missing root is the error a PFS that is not mounted gives).
    fn tree(&self) -> Result<Beneath, PfsError> {
        if !self.root.is_dir() {
            return Err(PfsError::new(
                "find root",
                &self.root,
                io::Error::new(
                    io::ErrorKind::NotFound,
                    "PFS root directory is missing (not mounted?)",
                ),
            ));
        }
        let tree =
            Beneath::open(&self.root).map_err(|e| PfsError::new("open root", &self.root, e))?;
        self.verify_marker()?;
        Ok(tree)
    }

    /// Before anything is written: the root holds the marker `mark-pfs` wrote, on the device
    /// it recorded, and the same marker as the first time (see [`mark_pfs`]).
    fn verify_marker(&self) -> Result<(), PfsError> {
        use std::os::unix::fs::MetadataExt;
        let refuse = |why: String| {
            PfsError::new(
                "verify PFS marker of",
                &self.root,
                io::Error::new(io::ErrorKind::NotFound, why),
            )
        };
        let device =
            std::fs::metadata(&self.root).map_err(|e| PfsError::new("stat", &self.root, e))?.dev();
        let marker = read_marker(&self.root).map_err(|e| {
            refuse(format!(
                "{e} (directory on device {device}; is the PFS mounted? an administrator marks it with `spillway drain mark-pfs {}`)",
                self.root.display()
            ))
        })?;
        if marker.device != device {
            return Err(refuse(format!(
                "the marker names device {} but the directory is on device {device} (not the                  PFS that was marked)",
                marker.device
            )));
        }
        let mut verified = self.verified_marker.lock();
        match &*verified {
            Some(first) if *first != marker => Err(refuse(format!(
                "marker id {} on device {} differs from {} on device {} that this server verified first: a different file system is mounted there",
                marker.id, marker.device, first.id, first.device
            ))),
            Some(_) => Ok(()),
            None => {
                *verified = Some(marker);
                Ok(())
            }
        }
    }

    /// Runs `operation` on the tree with the owner's file-system identity.
    fn as_owner<T>(
        &self,
        owner: &PfsOwner,
        path: &Path,
        operation: impl FnOnce(&Beneath) -> Result<T, PfsError>,
    ) -> Result<T, PfsError> {
        let tree = self.tree()?;
        let _identity =
            assume(&owner.identity).map_err(|e| PfsError::new("act as owner", path, e))?;
        operation(&tree)
    }
}

/// Takes `identity` for file access on this thread, or nothing if this process already is it;
/// a process that is neither root nor the owner cannot write as the owner.
fn assume(identity: &FileIdentity) -> io::Result<Option<FsIdentity>> {
    if spillway_sys::user::euid() != 0 {
        if identity.uid == spillway_sys::user::euid() {
            return Ok(None);
        }
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the drain runs as uid {} and cannot write as the data's owner uid {}",
                spillway_sys::user::euid(),
                identity.uid
            ),
        ));
    }
    FsIdentity::assume(identity).map(Some)
}

/// Checks that an opened staging file or marker is what the drain made: a plain file of the
/// owner's with one name. Anything else was planted (or hard-linked) by someone else.
fn check_owned_plain_file(file: &File, owner: &PfsOwner, path: &Path) -> Result<(), PfsError> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata().map_err(|e| PfsError::new("stat", path, e))?;
    let owned = meta.uid() == owner.identity.uid;
    if meta.file_type().is_file() && owned && meta.nlink() == 1 {
        return Ok(());
    }
    Err(PfsError::new(
        "check ownership of",
        path,
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "not a plain file of uid {} with one link (uid {}, {} links): refusing a file \
                 someone else placed there",
                owner.identity.uid,
                meta.uid(),
                meta.nlink()
            ),
        ),
    ))
}

/// Sets the drain identity attribute on an open file (`ENOTSUP` explained).
fn set_identity_on(file: &File, path: &Path, identity: &PublishedIdentity) -> Result<(), PfsError> {
    use std::os::fd::AsRawFd;
    let value = identity.encode();
    let name = std::ffi::CString::new(identity_xattr()).expect("no NUL in the name");
    // SAFETY: valid descriptor, NUL-terminated name, value pointer and length of a live
    // buffer.
    let result = unsafe {
        libc::fsetxattr(file.as_raw_fd(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0)
    };
    if result == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    let error = if error.raw_os_error() == Some(libc::ENOTSUP) {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "the PFS refuses extended attributes ({error}): the drain cannot mark what it publishes, so it publishes nothing here"
            ),
        )
    } else {
        error
    };
    Err(PfsError::new("set drain identity on", path, error))
}

/// Alignment (memory address, file offset and length) of direct (`O_DIRECT`) PFS writes; 4 KiB
/// satisfies every common logical block size.
pub const DIRECT_IO_ALIGN: usize = 4096;

/// A zeroed heap buffer aligned to [`DIRECT_IO_ALIGN`], so a PFS write from it can bypass the
/// page cache. Dereferences to `[u8]`.
pub struct IoBuffer {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: IoBuffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for IoBuffer {}
// SAFETY: shared references only read the bytes (mutation needs `&mut`), like a Vec<u8>.
unsafe impl Sync for IoBuffer {}

impl IoBuffer {
    pub fn zeroed(len: usize) -> IoBuffer {
        if len == 0 {
            return IoBuffer { ptr: std::ptr::NonNull::<u8>::dangling(), len };
        }
        let layout = std::alloc::Layout::from_size_align(len, DIRECT_IO_ALIGN)
            .expect("buffer size overflows");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        IoBuffer { ptr, len }
    }
}

impl std::ops::Deref for IoBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes (or dangling with len 0) and initialised (zeroed).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for IoBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for IoBuffer {
    fn drop(&mut self) {
        if self.len > 0 {
            let layout = std::alloc::Layout::from_size_align(self.len, DIRECT_IO_ALIGN)
                .expect("layout was valid at allocation");
            // SAFETY: allocated in `zeroed` with this very layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

struct PosixFile {
    file: File,
    /// The same file opened with `O_DIRECT`, if the file system allows it: large aligned
    /// writes go through it and skip the page cache (no copy into it, no writeback later; the
    /// final fsync still makes them and the block allocation durable). `None` after an
    /// `EINVAL` (file system without direct I/O).
    direct: Option<File>,
    path: PathBuf,
    log: Option<Arc<WriteLog>>,
    server: u32,
}

impl PosixFile {
    /// Writes the aligned prefix of `data` with direct I/O if it qualifies; returns how many
    /// bytes were written that way (0: write it all through the page cache).
    fn write_direct(&mut self, offset: u64, data: &[u8]) -> Result<usize, PfsError> {
        const DIRECT_WRITE_BYTES_MIN: usize = 256 * 1024;
        let prefix = data.len() - data.len() % DIRECT_IO_ALIGN;
        let aligned = offset.is_multiple_of(DIRECT_IO_ALIGN as u64)
            && (data.as_ptr() as usize).is_multiple_of(DIRECT_IO_ALIGN);
        let Some(direct) = &self.direct else { return Ok(0) };
        if !aligned || prefix < DIRECT_WRITE_BYTES_MIN {
            return Ok(0);
        }
        match direct.write_all_at(&data[..prefix], offset) {
            Ok(()) => Ok(prefix),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::info!(path = %self.path.display(), "PFS refuses direct I/O here; writing through the page cache");
                self.direct = None;
                Ok(0)
            }
            Err(e) => Err(PfsError::new("write (direct I/O)", &self.path, e)),
        }
    }
}

impl PfsFile for PosixFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), PfsError> {
        let done = self.write_direct(offset, data)?;
        if done < data.len() {
            self.file
                .write_all_at(&data[done..], offset + done as u64)
                .map_err(|e| PfsError::new("write", &self.path, e))?;
        }
        if let Some(log) = &self.log {
            log.record(self.server, offset, data.len() as u64);
        }
        Ok(())
    }

    fn extend_to(&mut self, bytes: u64) -> Result<(), PfsError> {
        let len = self.file.metadata().map_err(|e| PfsError::new("stat", &self.path, e))?.len();
        if len < bytes {
            self.file.set_len(bytes).map_err(|e| PfsError::new("extend", &self.path, e))?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<(), PfsError> {
        self.file.sync_all().map_err(|e| PfsError::new("fsync", &self.path, e))
    }

    fn set_mode(&mut self, mode: u32) -> Result<(), PfsError> {
        use std::os::unix::fs::PermissionsExt;
        self.file
            .set_permissions(std::fs::Permissions::from_mode(mode & 0o777))
            .map_err(|e| PfsError::new("chmod", &self.path, e))
    }

    fn set_identity(&mut self, identity: &PublishedIdentity) -> Result<(), PfsError> {
        set_identity_on(&self.file, &self.path, identity)
    }

    fn start_writeback(&mut self, offset: u64, length: u64) {
        use std::os::fd::AsRawFd;
        // SAFETY: plain syscall on an open descriptor; failure only loses the hint.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset as i64,
                length as i64,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
    }
}

impl Pfs for PosixPfs {
    fn create_parents(&self, path: &Path, owner: &PfsOwner) -> Result<(), PfsError> {
        let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) else {
            return self.tree().map(|_| ());
        };
        self.as_owner(owner, parent, |tree| {
            tree.create_directories(parent, owner.directory_mode)
                .map_err(|e| PfsError::new("create directory", &self.full(parent), e))
        })
    }

    fn open_staging(&self, path: &Path, owner: &PfsOwner) -> Result<Box<dyn PfsFile>, PfsError> {
        let full = self.full(path);
        let (file, direct) = self.as_owner(owner, path, |tree| {
            let file = tree
                .open_or_create(path, 0o600)
                .map_err(|e| PfsError::new("open for writing", &full, e))?;
            check_owned_plain_file(&file, owner, &full)?;
            // The same inode again with O_DIRECT, through our own descriptor (never by name).
            let direct = {
                use std::os::fd::AsRawFd;
                use std::os::unix::fs::OpenOptionsExt;
                OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
                    .ok()
            };
            Ok((file, direct))
        })?;
        Ok(Box::new(PosixFile {
            file,
            direct,
            path: full,
            log: self.log.clone(),
            server: self.server,
        }))
    }

    fn holds_owned_file(&self, path: &Path, owner: &PfsOwner) -> Result<bool, PfsError> {
        self.as_owner(owner, path, |tree| {
            let stat = tree.stat(path).map_err(|e| PfsError::new("stat", &self.full(path), e))?;
            Ok(stat.is_some_and(|s| {
                s.st_mode & libc::S_IFMT == libc::S_IFREG && s.st_uid == owner.identity.uid
            }))
        })
    }

    fn final_name_state(&self, path: &Path, owner: &PfsOwner) -> Result<AtFinalName, PfsError> {
        let full = self.full(path);
        let tree = self.tree()?;
        let Some(stat) = tree.stat(path).map_err(|e| PfsError::new("stat", &full, e))? else {
            return Ok(AtFinalName::Absent);
        };
        if stat.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Ok(AtFinalName::Link(format!(
                "{} (a symbolic link of uid {})",
                full.display(),
                stat.st_uid
            )));
        }
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG || stat.st_uid != owner.identity.uid {
            return Ok(AtFinalName::Other(format!(
                "{} (uid {}, type {:o}), not a file of uid {}",
                full.display(),
                stat.st_uid,
                stat.st_mode & libc::S_IFMT,
                owner.identity.uid
            )));
        }
        // A path descriptor: the file itself is not opened; its attribute is read through it.
        let fd = match tree.open_path(path) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(AtFinalName::Absent),
            Err(e) => return Err(PfsError::new("open", &full, e)),
        };
        let fd = File::from(fd);
        let meta = fd.metadata().map_err(|e| PfsError::new("stat", &full, e))?;
        if !meta.file_type().is_file()
            || std::os::unix::fs::MetadataExt::uid(&meta) != owner.identity.uid
        {
            return Ok(AtFinalName::Other(format!("{} (changed while looked at)", full.display())));
        }
        use std::os::fd::AsRawFd;
        let proc_path = std::ffi::CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .expect("no NUL in a number");
        let name = std::ffi::CString::new(identity_xattr()).expect("no NUL in the name");
        let mut value = [0u8; 8192];
        // SAFETY: NUL-terminated strings and a live buffer of the given length.
        let read = unsafe {
            libc::getxattr(
                proc_path.as_ptr(),
                name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if read < 0 {
            let error = io::Error::last_os_error();
            return match error.raw_os_error() {
                Some(libc::ENODATA) | Some(libc::ENOTSUP) => Ok(AtFinalName::Other(format!(
                    "{}, a file of uid {} the drain did not publish (no {})",
                    full.display(),
                    owner.identity.uid,
                    identity_xattr()
                ))),
                _ => Err(PfsError::new("read drain identity of", &full, error)),
            };
        }
        let text = String::from_utf8_lossy(&value[..read as usize]);
        Ok(match PublishedIdentity::parse(&text) {
            Some(identity) => AtFinalName::Published(identity),
            None => AtFinalName::Other(format!(
                "{} with an unreadable {} {text:?}",
                full.display(),
                identity_xattr()
            )),
        })
    }

    fn create_marker(&self, path: &Path, owner: &PfsOwner, content: &[u8]) -> Result<(), PfsError> {
        let full = self.full(path);
        // Written at a temporary name and renamed: another participant that sees the marker
        // reads its whole content (the part's checksum), never an empty file being written.
        let mut writing = path.as_os_str().to_owned();
        writing.push(".writing");
        let writing = PathBuf::from(writing);
        self.as_owner(owner, path, |tree| {
            // Something at the marker's name that is not the owner's plain file (planted) is
            // refused, never replaced.
            match tree.open_read(path) {
                Ok(existing) => check_owned_plain_file(&existing, owner, &full)?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(PfsError::new("open marker", &full, e)),
            }
            let file = tree
                .open_or_create(&writing, 0o600)
                .map_err(|e| PfsError::new("create marker", &full, e))?;
            check_owned_plain_file(&file, owner, &full)?;
            let written = file
                .write_all_at(content, 0)
                .and_then(|()| file.set_len(content.len() as u64))
                .and_then(|()| file.sync_all())
                .map_err(|e| PfsError::new("write marker", &full, e))
                .and_then(|()| {
                    tree.rename(&writing, path)
                        .map_err(|e| PfsError::new("rename marker", &full, e))
                });
            if written.is_err() {
                let _ = tree.remove_file(&writing);
            }
            written?;
            tree.sync_parent(path).map_err(|e| PfsError::new("fsync directory of", &full, e))
        })
    }

    fn set_staging_identity(
        &self,
        path: &Path,
        owner: &PfsOwner,
        identity: &PublishedIdentity,
    ) -> Result<bool, PfsError> {
        let full = self.full(path);
        self.as_owner(owner, path, |tree| {
            let file = match tree.open_existing_for_write(path) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(PfsError::new("open for writing", &full, e)),
            };
            check_owned_plain_file(&file, owner, &full)?;
            set_identity_on(&file, &full, identity)?;
            file.sync_all().map_err(|e| PfsError::new("fsync", &full, e))?;
            Ok(true)
        })
    }

    fn read_marker(
        &self,
        path: &Path,
        owner: &PfsOwner,
        bytes_max: usize,
    ) -> Result<Option<Vec<u8>>, PfsError> {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let full = self.full(path);
        self.as_owner(owner, path, |tree| {
            let fd = match tree.open_path(path) {
                Ok(fd) => File::from(fd),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(PfsError::new("open", &full, e)),
            };
            let meta = fd.metadata().map_err(|e| PfsError::new("stat", &full, e))?;
            if !meta.file_type().is_file() || meta.uid() != owner.identity.uid {
                return Ok(None);
            }
            // Reopened through the path descriptor: the same plain file, never a FIFO swapped in.
            let file = File::open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                .map_err(|e| PfsError::new("open for reading", &full, e))?;
            let mut content = Vec::new();
            file.take(bytes_max as u64)
                .read_to_end(&mut content)
                .map_err(|e| PfsError::new("read", &full, e))?;
            Ok(Some(content))
        })
    }

    fn publish(
        &self,
        from: &Path,
        to: &Path,
        owner: &PfsOwner,
        replace: bool,
    ) -> Result<(), PfsError> {
        let full = self.full(to);
        self.as_owner(owner, to, |tree| {
            let renamed =
                if replace { tree.rename(from, to) } else { tree.rename_noreplace(from, to) };
            renamed.map_err(|e| PfsError::new("rename to final name", &full, e))?;
            tree.sync_parent(to).map_err(|e| PfsError::new("fsync directory of", &full, e))
        })
    }

    fn remove(&self, path: &Path, owner: &PfsOwner) -> Result<(), PfsError> {
        self.as_owner(owner, path, |tree| {
            tree.remove_file(path).map_err(|e| PfsError::new("remove", &self.full(path), e))
        })
    }

    fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8]) -> Result<usize, PfsError> {
        let full = self.full(path);
        let file = self
            .tree()?
            .open_read(path)
            .map_err(|e| PfsError::new("open for reading", &full, e))?;
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(PfsError::new("read", &full, e)),
            }
        }
        Ok(done)
    }
}

/// Log of PFS data writes, in the order they completed, shared by the servers of one process
/// (the benchmark) or kept per server. Bounded: beyond `entries_max` only the count grows.
pub struct WriteLog {
    entries: Mutex<Vec<PfsWrite>>,
    entries_max: usize,
    writes: AtomicU64,
    bytes: AtomicU64,
    sequence: AtomicU64,
}

impl WriteLog {
    pub fn new(entries_max: usize) -> Self {
        WriteLog {
            entries: Mutex::new(Vec::new()),
            entries_max,
            writes: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            sequence: AtomicU64::new(0),
        }
    }

    pub fn record(&self, server: u32, offset: u64, length: u64) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(length, Ordering::Relaxed);
        let mut entries = self.entries.lock();
        if entries.len() < self.entries_max {
            let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
            entries.push(PfsWrite { sequence, server, offset, length });
        }
    }

    /// Writes recorded (including those beyond the entry bound).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Whether some writes were counted but not kept.
    pub fn truncated(&self) -> bool {
        self.writes() as usize > self.entries.lock().len()
    }

    pub fn take(&self) -> Vec<PfsWrite> {
        self.writes.store(0, Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
        std::mem::take(&mut *self.entries.lock())
    }
}

/// Microseconds since the Unix epoch (for status timestamps).
pub fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// Which operations a [`FaultyPfs`] fails.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Fail every data write (as `EROFS`, a read-only PFS).
    pub read_only: bool,
    /// Fail every fsync of a data file (as `EIO`).
    pub fsync_fails: bool,
    /// Fail writes after this many more bytes (as `ENOSPC`); `None` for no limit.
    pub space_left_bytes: Option<u64>,
    /// Panic when a staging file is opened (a bug in a drain attempt: it must be caught and
    /// the epoch quarantined, not kill the drainer or crash-loop the server).
    pub panic_on_open: bool,
}

/// Wraps a [`Pfs`] and injects the failures in its [`Faults`], switchable at run time.
pub struct FaultyPfs<P: Pfs> {
    inner: P,
    faults: Arc<Mutex<Faults>>,
}

impl<P: Pfs> FaultyPfs<P> {
    pub fn new(inner: P) -> (Self, Arc<Mutex<Faults>>) {
        let faults = Arc::new(Mutex::new(Faults::default()));
        (FaultyPfs { inner, faults: faults.clone() }, faults)
    }

    fn check_mutation(&self, operation: &'static str, path: &Path) -> Result<(), PfsError> {
        if self.faults.lock().read_only {
            return Err(PfsError::new(operation, path, io::Error::from_raw_os_error(libc::EROFS)));
        }
        Ok(())
    }
}

struct FaultyFile {
    inner: Box<dyn PfsFile>,
    faults: Arc<Mutex<Faults>>,
    path: PathBuf,
}

impl PfsFile for FaultyFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), PfsError> {
        {
            let mut faults = self.faults.lock();
            if faults.read_only {
                return Err(PfsError::new(
                    "write",
                    &self.path,
                    io::Error::from_raw_os_error(libc::EROFS),
                ));
            }
            if let Some(left) = faults.space_left_bytes.as_mut() {
                if *left < data.len() as u64 {
                    return Err(PfsError::new(
                        "write",
                        &self.path,
                        io::Error::from_raw_os_error(libc::ENOSPC),
                    ));
                }
                *left -= data.len() as u64;
            }
        }
        self.inner.write_at(offset, data)
    }

    fn extend_to(&mut self, bytes: u64) -> Result<(), PfsError> {
        if self.faults.lock().read_only {
            return Err(PfsError::new(
                "extend",
                &self.path,
                io::Error::from_raw_os_error(libc::EROFS),
            ));
        }
        self.inner.extend_to(bytes)
    }

    fn start_writeback(&mut self, offset: u64, length: u64) {
        self.inner.start_writeback(offset, length)
    }

    fn set_mode(&mut self, mode: u32) -> Result<(), PfsError> {
        self.inner.set_mode(mode)
    }

    fn set_identity(&mut self, identity: &PublishedIdentity) -> Result<(), PfsError> {
        self.inner.set_identity(identity)
    }

    fn sync(&mut self) -> Result<(), PfsError> {
        if self.faults.lock().fsync_fails {
            return Err(PfsError::new(
                "fsync",
                &self.path,
                io::Error::from_raw_os_error(libc::EIO),
            ));
        }
        self.inner.sync()
    }
}

impl<P: Pfs> Pfs for FaultyPfs<P> {
    fn create_parents(&self, path: &Path, owner: &PfsOwner) -> Result<(), PfsError> {
        self.inner.create_parents(path, owner)
    }
    fn open_staging(&self, path: &Path, owner: &PfsOwner) -> Result<Box<dyn PfsFile>, PfsError> {
        self.check_mutation("open for writing", path)?;
        if self.faults.lock().panic_on_open {
            panic!("injected panic opening {}", path.display());
        }
        let inner = self.inner.open_staging(path, owner)?;
        Ok(Box::new(FaultyFile { inner, faults: self.faults.clone(), path: path.to_path_buf() }))
    }
    fn holds_owned_file(&self, path: &Path, owner: &PfsOwner) -> Result<bool, PfsError> {
        self.inner.holds_owned_file(path, owner)
    }
    fn create_marker(&self, path: &Path, owner: &PfsOwner, content: &[u8]) -> Result<(), PfsError> {
        self.check_mutation("create marker", path)?;
        self.inner.create_marker(path, owner, content)
    }
    fn read_marker(
        &self,
        path: &Path,
        owner: &PfsOwner,
        bytes_max: usize,
    ) -> Result<Option<Vec<u8>>, PfsError> {
        self.inner.read_marker(path, owner, bytes_max)
    }
    fn set_staging_identity(
        &self,
        path: &Path,
        owner: &PfsOwner,
        identity: &PublishedIdentity,
    ) -> Result<bool, PfsError> {
        self.check_mutation("set drain identity on", path)?;
        if self.faults.lock().fsync_fails {
            return Err(PfsError::new("fsync", path, io::Error::from_raw_os_error(libc::EIO)));
        }
        self.inner.set_staging_identity(path, owner, identity)
    }
    fn final_name_state(&self, path: &Path, owner: &PfsOwner) -> Result<AtFinalName, PfsError> {
        self.inner.final_name_state(path, owner)
    }
    fn publish(
        &self,
        from: &Path,
        to: &Path,
        owner: &PfsOwner,
        replace: bool,
    ) -> Result<(), PfsError> {
        self.check_mutation("rename to final name", to)?;
        self.inner.publish(from, to, owner, replace)
    }
    fn remove(&self, path: &Path, owner: &PfsOwner) -> Result<(), PfsError> {
        self.check_mutation("remove", path)?;
        self.inner.remove(path, owner)
    }
    fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8]) -> Result<usize, PfsError> {
        self.inner.read_at(path, offset, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_looks_for_the_same_marker() {
        assert_eq!(PFS_MARKER_FILE, spillway_client::tiering::PFS_MARKER_FILE);
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn me() -> PfsOwner {
        PfsOwner::this_process()
    }

    /// A user's identity (the tests run as root, as `make test` does).
    fn user(uid: u32) -> PfsOwner {
        assert_eq!(spillway_sys::user::euid(), 0, "this test needs root, as `make test` runs");
        PfsOwner {
            identity: FileIdentity { uid, gid: uid, groups: Vec::new() },
            file_mode: 0o640,
            directory_mode: 0o750,
        }
    }

    /// A private directory marked as the PFS.
    fn marked_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        mark_pfs(dir.path()).unwrap();
        dir
    }

    /// A PFS root like a center's scratch: mode 1777, every user may create and plant files.
    fn shared_root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        mark_pfs(dir.path()).unwrap();
        dir
    }

    #[test]
    fn files_and_directories_are_created_as_the_owner_with_its_modes() {
        let dir = shared_root();
        let pfs = PosixPfs::new(dir.path());
        let owner = user(5101);
        let (staging, final_name) = (Path::new("run/ckpt/.f.staging"), Path::new("run/ckpt/f"));
        pfs.create_parents(staging, &owner).unwrap();
        let mut file = pfs.open_staging(staging, &owner).unwrap();
        file.write_at(0, b"data").unwrap();
        file.set_mode(owner.file_mode).unwrap();
        file.sync().unwrap();
        pfs.publish(staging, final_name, &owner, true).unwrap();
        let meta = std::fs::metadata(dir.path().join(final_name)).unwrap();
        assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o7777), (5101, 5101, 0o640));
        let dir_meta = std::fs::metadata(dir.path().join("run/ckpt")).unwrap();
        assert_eq!((dir_meta.uid(), dir_meta.mode() & 0o7777), (5101, 0o750));
    }

    #[test]
    fn the_owner_s_permissions_apply_on_the_pfs() {
        let dir = shared_root();
        std::fs::create_dir(dir.path().join("admins")).unwrap();
        std::fs::set_permissions(dir.path().join("admins"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let pfs = PosixPfs::new(dir.path());
        let error = pfs.open_staging(Path::new("admins/.x.staging"), &user(5102)).err().unwrap();
        assert_eq!(error.source.kind(), io::ErrorKind::PermissionDenied, "{error}");
        assert!(!dir.path().join("admins/.x.staging").exists());
    }

    #[test]
    fn symlinks_planted_by_a_user_are_never_followed() {
        let dir = shared_root();
        let private = tempfile::tempdir().unwrap();
        let secret = private.path().join("root-file");
        std::fs::write(&secret, b"root's").unwrap();
        let pfs = PosixPfs::new(dir.path());
        let owner = user(5103);
        // As the staging name, as a directory on the way, and as the final name.
        std::os::unix::fs::symlink(&secret, dir.path().join(".a.staging")).unwrap();
        std::os::unix::fs::symlink(private.path(), dir.path().join("sub")).unwrap();
        assert!(pfs.open_staging(Path::new(".a.staging"), &owner).is_err());
        assert!(pfs.create_parents(Path::new("sub/x/.b.staging"), &owner).is_err());
        assert!(pfs.open_staging(Path::new("sub/.c.staging"), &owner).is_err());
        // A symlink at the final name belongs to whoever planted it: in a sticky directory the
        // owner may not replace it, so the publish is refused and nothing is written through it.
        std::os::unix::fs::symlink(&secret, dir.path().join("final")).unwrap();
        let mut file = pfs.open_staging(Path::new(".d.staging"), &owner).unwrap();
        file.write_at(0, b"user bytes").unwrap();
        let error =
            pfs.publish(Path::new(".d.staging"), Path::new("final"), &owner, true).unwrap_err();
        assert_eq!(error.source.kind(), io::ErrorKind::PermissionDenied, "{error}");
        assert_eq!(std::fs::read(&secret).unwrap(), b"root's");
        assert!(!private.path().join("x").exists() && !private.path().join(".c.staging").exists());
        assert!(std::fs::symlink_metadata(dir.path().join("final")).unwrap().is_symlink());
    }

    #[test]
    fn a_marker_appears_whole_and_leaves_no_temporary_name() {
        let dir = shared_root();
        let pfs = PosixPfs::new(dir.path());
        let owner = user(5110);
        let content = b"spillway-part/1 crc32c=0000abcd bytes=42\n";
        pfs.create_marker(Path::new(".m.part"), &owner, content).unwrap();
        // Again (idempotent), over the owner's own marker.
        pfs.create_marker(Path::new(".m.part"), &owner, content).unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name != PFS_MARKER_FILE)
            .collect();
        assert_eq!(names, [".m.part"], "only the marker, no .writing file");
        assert_eq!(pfs.read_marker(Path::new(".m.part"), &owner, 256).unwrap().unwrap(), content);
    }

    #[test]
    fn a_planted_staging_file_or_marker_is_refused() {
        let dir = shared_root();
        let pfs = PosixPfs::new(dir.path());
        // Another user creates the staging name first (to read the victim's bytes later).
        {
            let attacker = user(5104);
            let mut planted = pfs.open_staging(Path::new(".v.staging"), &attacker).unwrap();
            planted.set_mode(0o666).unwrap();
        }
        let error = pfs.open_staging(Path::new(".v.staging"), &user(5105)).err().unwrap();
        assert!(error.to_string().contains("someone else placed there"), "{error}");
        let error = pfs.create_marker(Path::new(".v.staging"), &user(5105), b"").unwrap_err();
        assert!(error.to_string().contains("someone else placed there"), "{error}");
        // A hard link to one of the victim's own files is refused too (two links).
        let owner = user(5105);
        drop(pfs.open_staging(Path::new("own"), &owner).unwrap());
        std::fs::hard_link(dir.path().join("own"), dir.path().join(".w.staging")).unwrap();
        assert!(pfs.open_staging(Path::new(".w.staging"), &owner).is_err());
    }

    #[test]
    fn only_the_owner_s_plain_file_counts_as_published() {
        let dir = shared_root();
        let pfs = PosixPfs::new(dir.path());
        let (owner, planter) = (user(5108), user(5109));
        // The planter's file, a link and a directory under names the drain checks.
        drop(pfs.open_staging(Path::new("planted"), &planter).unwrap());
        std::os::unix::fs::symlink("planted", dir.path().join("link")).unwrap();
        std::fs::create_dir(dir.path().join("dir")).unwrap();
        for name in ["planted", "link", "dir", "absent"] {
            assert!(!pfs.holds_owned_file(Path::new(name), &owner).unwrap(), "{name}");
        }
        drop(pfs.open_staging(Path::new("mine"), &owner).unwrap());
        assert!(pfs.holds_owned_file(Path::new("mine"), &owner).unwrap());
    }

    #[test]
    fn another_user_s_final_file_in_a_sticky_directory_is_not_replaced() {
        let dir = shared_root();
        let pfs = PosixPfs::new(dir.path());
        let other = user(5106);
        drop(pfs.open_staging(Path::new(".o.staging"), &other).unwrap());
        pfs.publish(Path::new(".o.staging"), Path::new("result"), &other, true).unwrap();
        let owner = user(5107);
        drop(pfs.open_staging(Path::new(".n.staging"), &owner).unwrap());
        let error =
            pfs.publish(Path::new(".n.staging"), Path::new("result"), &owner, true).unwrap_err();
        assert_eq!(error.source.kind(), io::ErrorKind::PermissionDenied, "{error}");
        assert_eq!(std::fs::metadata(dir.path().join("result")).unwrap().uid(), 5106);
    }

    #[test]
    fn aligned_buffers_take_the_direct_path_and_read_back_exactly() {
        let dir = marked_dir();
        let log = Arc::new(WriteLog::new(100));
        let pfs = PosixPfs::new(dir.path()).with_log(log.clone(), 0);
        let staging = Path::new("f.staging");
        let mut f = pfs.open_staging(staging, &me()).unwrap();
        // 1 MiB + 1000 bytes at a 1 MiB offset: an aligned direct prefix and a buffered tail;
        // then an unaligned buffer (a Vec slice) that must go through the page cache.
        let mut big = IoBuffer::zeroed((1 << 20) + 1000);
        assert_eq!(big.as_ptr() as usize % DIRECT_IO_ALIGN, 0);
        for (i, b) in big.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        f.write_at(1 << 20, &big).unwrap();
        let small: Vec<u8> = (0..5000u32).map(|i| (i % 7) as u8 + 1).collect();
        f.write_at(100, &small[1..]).unwrap();
        f.sync().unwrap();
        let back = std::fs::read(dir.path().join(staging)).unwrap();
        assert_eq!(back.len(), (2 << 20) + 1000);
        assert_eq!(&back[(1 << 20)..], &big[..]);
        assert_eq!(&back[100..100 + 4999], &small[1..]);
        assert!(
            back[..100].iter().all(|&b| b == 0) && back[5099..(1 << 20)].iter().all(|&b| b == 0)
        );
        // One logged write per call, whichever path it took.
        assert_eq!(log.writes(), 2);
        assert!(IoBuffer::zeroed(0).is_empty());
    }

    #[test]
    fn staging_then_publish_makes_final_visible_only_at_the_end() {
        let dir = marked_dir();
        let log = Arc::new(WriteLog::new(100));
        let pfs = PosixPfs::new(dir.path()).with_log(log.clone(), 3);
        let staging = Path::new("epoch-1/.a.dat.staging");
        let final_name = Path::new("epoch-1/a.dat");
        pfs.create_parents(staging, &me()).unwrap();
        let mut f = pfs.open_staging(staging, &me()).unwrap();
        f.write_at(4, b"world").unwrap();
        f.write_at(0, b"hey ").unwrap();
        f.extend_to(12).unwrap();
        f.sync().unwrap();
        assert!(!pfs.holds_owned_file(final_name, &me()).unwrap());
        pfs.publish(staging, final_name, &me(), true).unwrap();
        assert!(!pfs.holds_owned_file(staging, &me()).unwrap());
        let mut buf = [0u8; 20];
        let n = pfs.read_at(final_name, 0, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hey world\0\0\0");
        let entries = log.take();
        assert_eq!(entries.len(), 2);
        assert_eq!((entries[0].server, entries[0].offset, entries[0].length), (3, 4, 5));
    }

    #[test]
    fn missing_root_is_an_error_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("not-mounted");
        let pfs = PosixPfs::new(&root);
        let err = pfs.create_parents(Path::new("epoch-1/x"), &me()).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        assert!(!root.exists());
    }

    #[test]
    fn faults_switch_on_and_off() {
        let dir = marked_dir();
        let (pfs, faults) = FaultyPfs::new(PosixPfs::new(dir.path()));
        faults.lock().read_only = true;
        let err = pfs.open_staging(Path::new("x"), &me()).err().unwrap();
        assert_eq!(err.source.raw_os_error(), Some(libc::EROFS));
        faults.lock().read_only = false;
        faults.lock().space_left_bytes = Some(3);
        let mut f = pfs.open_staging(Path::new("x"), &me()).unwrap();
        f.write_at(0, b"ab").unwrap();
        assert_eq!(f.write_at(2, b"cd").unwrap_err().source.raw_os_error(), Some(libc::ENOSPC));
        faults.lock().fsync_fails = true;
        assert!(f.sync().is_err());
    }

    #[test]
    fn an_unmarked_directory_gets_nothing_written_and_the_error_says_why() {
        // The PFS is not mounted: its bare mount-point directory exists, without the marker.
        let dir = tempfile::tempdir().unwrap();
        let pfs = PosixPfs::new(dir.path());
        let error = pfs.create_parents(Path::new("epoch-1/a"), &me()).unwrap_err();
        assert!(error.to_string().contains("mark-pfs"), "{error}");
        assert!(pfs.open_staging(Path::new(".a.staging"), &me()).is_err());
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "nothing written");
        // Marked (as the admin does after mounting), it works; marking again keeps the id.
        let marker = mark_pfs(dir.path()).unwrap();
        assert_eq!(mark_pfs(dir.path()).unwrap(), marker);
        pfs.create_parents(Path::new("epoch-1/a"), &me()).unwrap();
    }

    #[test]
    fn a_marker_of_another_device_or_another_id_is_refused_naming_both() {
        let dir = marked_dir();
        let pfs = PosixPfs::new(dir.path());
        pfs.create_parents(Path::new("x/y"), &me()).unwrap();
        let first = read_marker(dir.path()).unwrap();
        // Another file system mounted there (here: its marker replaced): refused, both named.
        std::fs::remove_file(dir.path().join(PFS_MARKER_FILE)).unwrap();
        let second = mark_pfs(dir.path()).unwrap();
        assert_ne!(first.id, second.id);
        let error = pfs.open_staging(Path::new(".s.staging"), &me()).err().unwrap().to_string();
        assert!(error.contains(&first.id) && error.contains(&second.id), "{error}");
        // A marker copied from another device: its recorded device is not this one.
        let foreign = PfsMarker { id: "ab".repeat(16), device: second.device + 1 };
        std::fs::write(dir.path().join(PFS_MARKER_FILE), foreign.encode()).unwrap();
        let error = PosixPfs::new(dir.path()).create_parents(Path::new("z/w"), &me());
        let error = error.unwrap_err().to_string();
        assert!(
            error.contains(&format!("device {}", second.device + 1))
                && error.contains(&format!("device {}", second.device)),
            "{error}"
        );
        assert!(!dir.path().join("z").exists() && !dir.path().join(".s.staging").exists());
    }

    #[test]
    fn a_marker_users_could_write_is_not_a_marker() {
        use std::os::unix::fs::PermissionsExt;
        let dir = marked_dir();
        let marker = dir.path().join(PFS_MARKER_FILE);
        std::fs::set_permissions(&marker, std::fs::Permissions::from_mode(0o666)).unwrap();
        let error = PosixPfs::new(dir.path()).create_parents(Path::new("a/b"), &me()).unwrap_err();
        assert!(error.to_string().contains("not a marker spillway wrote"), "{error}");
    }

    #[test]
    fn the_final_name_is_ours_only_with_our_identity() {
        let dir = shared_root();
        let pfs = PosixPfs::new(dir.path());
        let owner = user(5110);
        let final_name = Path::new("out.dat");
        assert_eq!(pfs.final_name_state(final_name, &owner).unwrap(), AtFinalName::Absent);
        // The owner's own file (not drained): not proof of anything, even with an identity the
        // owner forged in the attribute namespace users may set.
        drop(pfs.open_staging(final_name, &owner).unwrap());
        assert!(matches!(pfs.final_name_state(final_name, &owner).unwrap(), AtFinalName::Other(_)));
        let forged =
            PublishedIdentity { epoch: 9, size: 3, crc32c: Some(0xabc), file: "ns/4/7.1 x".into() };
        let path = std::ffi::CString::new(dir.path().join(final_name).to_str().unwrap()).unwrap();
        let name = std::ffi::CString::new(IDENTITY_XATTR_UNPRIVILEGED).unwrap();
        let value = forged.encode();
        // SAFETY: NUL-terminated strings and a live buffer.
        let set = unsafe {
            libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0)
        };
        assert_eq!(set, 0, "{}", io::Error::last_os_error());
        assert!(matches!(pfs.final_name_state(final_name, &owner).unwrap(), AtFinalName::Other(_)));
        // A drained file carries its identity through the rename.
        let identity =
            PublishedIdentity { epoch: 9, size: 3, crc32c: Some(0xabc), file: "ns/4/7.1 x".into() };
        let mut staging = pfs.open_staging(Path::new(".s.staging"), &owner).unwrap();
        staging.write_at(0, b"abc").unwrap();
        staging.set_identity(&identity).unwrap();
        staging.sync().unwrap();
        // Not replacing: the owner's unmarked file stays.
        let error = pfs.publish(Path::new(".s.staging"), final_name, &owner, false).unwrap_err();
        assert_eq!(error.source.kind(), io::ErrorKind::AlreadyExists, "{error}");
        pfs.publish(Path::new(".s.staging"), final_name, &owner, true).unwrap();
        assert_eq!(
            pfs.final_name_state(final_name, &owner).unwrap(),
            AtFinalName::Published(identity.clone())
        );
        // For another owner the same file is someone else's.
        assert!(matches!(
            pfs.final_name_state(final_name, &user(5111)).unwrap(),
            AtFinalName::Other(_)
        ));
        assert_eq!(PublishedIdentity::parse(&identity.encode()), Some(identity.clone()));
        // The publisher's identity goes on an existing staging file only, never a new one.
        let gone = Path::new(".gone.staging");
        assert!(!pfs.set_staging_identity(gone, &owner, &identity).unwrap());
        assert!(!dir.path().join(gone).exists());
        drop(pfs.open_staging(gone, &owner).unwrap());
        assert!(pfs.set_staging_identity(gone, &owner, &identity).unwrap());
        let unknown = PublishedIdentity { crc32c: None, ..identity };
        assert_eq!(PublishedIdentity::parse(&unknown.encode()), Some(unknown));
        assert_eq!(PublishedIdentity::parse("spillway-drain/1 epoch=x size=1 file=a"), None);
    }
}
