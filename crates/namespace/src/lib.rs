//! The contract between the namespace service and its users (the FUSE mount, the drain's
//! name map): the [`Namespace`] trait and the plain value types it takes and returns.
//!
//! Why a trait: the mount must not care whether the namespace runs in-process (`LocalNamespace`,
//! used by the server and by tests) or on a burst buffer server across the network
//! (`spillway_client::meta::RemoteNamespace`). Every method is one metadata operation, decided
//! atomically by the namespace, with POSIX errors chosen by the namespace (the mount forwards
//! `MetaError::errno` to the kernel unchanged).
//!
//! Conventions that both sides rely on:
//! - Inode numbers are never reused within a namespace; [`ROOT_INO`] is 1.
//! - Permission checks happen in the namespace, using the [`Caller`] passed per request. The
//!   mount walks paths component by component, so `lookup` checks search (x) permission on the
//!   parent; operations that take a parent directory check the parent's permissions.
//! - `Attr::mode` holds only the 12 permission bits (incl. suid/sgid/sticky); the file type is
//!   `Attr::kind`. [`Attr::st_mode`] combines them.
//! - A regular file's bytes live in the store as [`data_file_name`]`(namespace, ino, generation)`
//!   in the namespace's data epoch; `Attr::size` is the truth for EOF.

use spillway_types::EpochId;

/// An inode number inside one namespace.
pub type Ino = u64;
/// The root directory of every namespace.
pub const ROOT_INO: Ino = 1;
/// Identifies a namespace on its server (and names its data files).
pub type NamespaceId = u64;
/// Longest name of one directory entry, in bytes (Linux NAME_MAX); longer names get ENAMETOOLONG.
pub const NAME_BYTES_MAX: usize = 255;
/// Longest symlink target, in bytes (Linux PATH_MAX - 1 for the NUL); longer gets ENAMETOOLONG.
pub const SYMLINK_TARGET_BYTES_MAX: usize = 4095;

/// `rename` flag: fail with EEXIST if the target name exists (Linux value).
pub const RENAME_NOREPLACE: u32 = 1;
/// `rename` flag: atomically swap source and target, both must exist (Linux value).
pub const RENAME_EXCHANGE: u32 = 2;

/// `access` mask bits (POSIX values). `F_OK` (0) checks existence only.
pub const ACCESS_READ: i32 = 4;
/// See [`ACCESS_READ`].
pub const ACCESS_WRITE: i32 = 2;
/// See [`ACCESS_READ`].
pub const ACCESS_EXECUTE: i32 = 1;

/// Who performs an operation. The server accepts a caller passed by the peer only when the
/// peer's kernel-verified identity is root (the mount); otherwise it substitutes the peer's own
/// uid/gid (see docs/design/namespace.md, "Caller trust").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// Effective (FUSE: filesystem) user id.
    pub uid: u32,
    /// Effective (filesystem) group id.
    pub gid: u32,
    /// Supplementary group ids (may or may not repeat `gid`).
    pub groups: Vec<u32>,
    /// Process id, for logs only; never used for decisions.
    pub pid: u32,
}

impl Caller {
    /// Root with no supplementary groups.
    pub fn root() -> Caller {
        Caller { uid: 0, gid: 0, groups: Vec::new(), pid: 0 }
    }

    /// A plain user with the given primary group and no supplementary groups.
    pub fn user(uid: u32, gid: u32) -> Caller {
        Caller { uid, gid, groups: Vec::new(), pid: 0 }
    }

    /// Whether this caller bypasses permission checks (uid 0).
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether `gid` is the caller's primary or one of its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// The type of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileKind {
    /// Every kind, in wire-code order.
    pub const ALL: [FileKind; 7] = [
        FileKind::Regular,
        FileKind::Directory,
        FileKind::Symlink,
        FileKind::Fifo,
        FileKind::Socket,
        FileKind::CharDevice,
        FileKind::BlockDevice,
    ];

    /// The `S_IFMT` bits of this kind (Linux values).
    pub fn type_bits(self) -> u32 {
        match self {
            FileKind::Regular => 0o100000,
            FileKind::Directory => 0o040000,
            FileKind::Symlink => 0o120000,
            FileKind::Fifo => 0o010000,
            FileKind::Socket => 0o140000,
            FileKind::CharDevice => 0o020000,
            FileKind::BlockDevice => 0o060000,
        }
    }

    /// The kind named by the `S_IFMT` bits of `mode`, if any.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        FileKind::ALL.into_iter().find(|kind| kind.type_bits() == mode & 0o170000)
    }

    /// Stable one-byte code used on the wire and in the journal.
    pub fn code(self) -> u8 {
        match self {
            FileKind::Regular => 1,
            FileKind::Directory => 2,
            FileKind::Symlink => 3,
            FileKind::Fifo => 4,
            FileKind::Socket => 5,
            FileKind::CharDevice => 6,
            FileKind::BlockDevice => 7,
        }
    }

    /// Inverse of [`FileKind::code`].
    pub fn from_code(code: u8) -> Option<FileKind> {
        FileKind::ALL.into_iter().find(|kind| kind.code() == code)
    }
}

/// A point in time, seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    pub seconds: i64,
    /// Always below 1_000_000_000.
    pub nanos: u32,
}

impl Timestamp {
    pub const fn new(seconds: i64, nanos: u32) -> Timestamp {
        Timestamp { seconds, nanos }
    }
}

/// Attributes of one inode, as `stat` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// The 12 permission bits (0o7777) including suid (0o4000), sgid (0o2000), sticky (0o1000).
    pub mode: u32,
    /// Number of directory entries naming this inode; directories count `.` and each child
    /// directory's `..` as usual (an empty directory has 2).
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// Regular file: logical size (truth for EOF). Symlink: target length. Directory: number of
    /// entries (informational). Others: 0.
    pub size: u64,
    /// Device number for char/block devices (Linux `dev_t` encoding, as passed to mknod), else 0.
    pub rdev: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Data generation of a regular file: its bytes live in the store file
    /// `ns/<namespace>/<ino>.<generation>`. Truncation to 0 starts a new generation. 0 for
    /// non-regular files.
    pub generation: u64,
}

impl Attr {
    /// `st_mode`: file type bits | permission bits.
    pub fn st_mode(&self) -> u32 {
        self.kind.type_bits() | (self.mode & 0o7777)
    }
}

/// How `setattr` sets a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    /// The namespace's clock now (utimensat UTIME_NOW): allowed to the owner or anyone with
    /// write permission.
    Now,
    /// An explicit time: allowed to the owner (and root) only.
    At(Timestamp),
}

/// What `setattr` changes; `None` fields are left alone. All changes apply atomically or none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// chmod: the 12 permission bits (higher bits ignored).
    pub mode: Option<u32>,
    /// chown owner (root only, unless unchanged).
    pub uid: Option<u32>,
    /// chown group (root, or the owner to one of its groups).
    pub gid: Option<u32>,
    /// truncate. Size 0 starts a new data generation. Needs write permission unless
    /// `via_writable_handle`.
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// The caller acts through a handle it opened for writing (ftruncate): the write permission
    /// check for `size` was done at open and is skipped here.
    pub via_writable_handle: bool,
}

/// One entry returned by `readdir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileKind,
    /// Pass this as `after_cookie` to continue after this entry. Cookies of a directory's
    /// entries only grow; an entry keeps its cookie while it stays in the directory, so a
    /// listing in progress neither repeats nor skips entries that are not changed meanwhile.
    pub cookie: u64,
}

/// `statfs` figures. Block counts come from the store's real capacity ([`FsStat::sized`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FsStat {
    pub block_bytes: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_avail: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_bytes_max: u32,
    /// The reservation's capacity over all its servers, when the namespace's data epoch carries
    /// one; 0: none (the file system is as large as the store).
    pub reservation_bytes: u64,
    /// The sizes of the namespace's regular files, summed (a hard-linked file once); counted
    /// only when `reservation_bytes` is set (0 otherwise: nothing uses it then).
    pub file_bytes: u64,
}

impl FsStat {
    /// The block size `statfs` reports.
    pub const BLOCK_BYTES: u32 = 4096;

    /// The block counts for a store of `store_total` bytes with `store_free` free: with a
    /// reservation, its capacity is the size and the files' bytes are used (free: the rest, at
    /// most what the store has free); without, the store's size and free space. The namespace
    /// server applies it to its own store, a mount to the sum over the reservation's servers.
    pub fn sized(mut self, store_total: u64, store_free: u64) -> FsStat {
        let (total, free) = match self.reservation_bytes {
            0 => (store_total, store_free.min(store_total)),
            reservation => {
                (reservation, reservation.saturating_sub(self.file_bytes).min(store_free))
            }
        };
        let block = u64::from(Self::BLOCK_BYTES);
        self.block_bytes = Self::BLOCK_BYTES;
        self.blocks = total / block;
        self.blocks_free = free / block;
        self.blocks_avail = free / block;
        self
    }
}

/// One line of the drain's name map: a store file and the POSIX path of one of its links.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestEntry {
    /// The store file name, `ns/<namespace>/<ino>.<generation>`.
    pub file_name: String,
    /// Path relative to the namespace root, components separated by `/`, no leading `/`.
    pub path: Vec<u8>,
    /// Logical size: the drained copy is cut (or zero-extended) to this length.
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: Timestamp,
}

/// The error of any namespace operation: the errno the namespace chose plus a message naming
/// the problem (inode, name, rule).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message} (errno {errno})")]
pub struct MetaError {
    /// A positive Linux errno (ENOENT, EACCES, ...).
    pub errno: i32,
    pub message: String,
}

impl MetaError {
    pub fn new(errno: i32, message: impl Into<String>) -> MetaError {
        debug_assert!(errno > 0, "errno must be positive");
        MetaError { errno, message: message.into() }
    }
}

/// The name of the store file that holds the bytes of generation `generation` of inode `ino`
/// of namespace `namespace`: `ns/<namespace>/<ino>.<generation>` (decimal).
pub fn data_file_name(namespace: NamespaceId, ino: Ino, generation: u64) -> String {
    format!("ns/{namespace}/{ino}.{generation}")
}

/// Inverse of [`data_file_name`]: `(namespace, ino, generation)`, or `None` for any other name.
pub fn parse_data_file_name(name: &str) -> Option<(NamespaceId, Ino, u64)> {
    let rest = name.strip_prefix("ns/")?;
    let (namespace, file) = rest.split_once('/')?;
    let (ino, generation) = file.split_once('.')?;
    let parse = |text: &str| -> Option<u64> {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        text.parse().ok()
    };
    Some((parse(namespace)?, parse(ino)?, parse(generation)?))
}

/// A POSIX namespace. Every method is atomic with respect to the others. Errors carry the errno
/// to return to the application.
pub trait Namespace: Send + Sync {
    /// This namespace's id (names its data files).
    fn id(&self) -> NamespaceId;

    /// The entry `name` in directory `parent`. Needs search (x) permission on `parent`.
    /// `.` and `..` are resolved too. ENOENT, ENOTDIR, EACCES, ENAMETOOLONG.
    fn lookup(&self, c: &Caller, parent: Ino, name: &[u8]) -> Result<Attr, MetaError>;

    /// Attributes of `ino` (no permission needed). ENOENT once the last link is gone.
    fn getattr(&self, ino: Ino) -> Result<Attr, MetaError>;

    /// chmod / chown / truncate / utimens, with the POSIX permission rules (non-owner chmod
    /// EPERM, chown by non-root, sgid cleared when the group is not the caller's, suid/sgid
    /// cleared on chown), ctime updated. Returns the new attributes.
    fn setattr(&self, c: &Caller, ino: Ino, set: &SetAttr) -> Result<Attr, MetaError>;

    /// Creates a non-directory (regular, FIFO, socket, char/block device; char/block only for
    /// root, else EPERM) named `name` in `parent`, with permission bits `mode & !umask`.
    /// Needs write+search on `parent`. If the name exists: EEXIST when `exclusive`, otherwise
    /// the existing inode's attributes are returned unchanged (the mount then calls `open`).
    /// A freshly created file may be opened in any mode by its creator whatever its mode bits.
    /// Group: the caller's gid, or the parent's gid if the parent has sgid.
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        c: &Caller,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        umask: u32,
        rdev: u32,
        exclusive: bool,
    ) -> Result<Attr, MetaError>;

    /// Creates a directory (`mode & !umask`, sgid inherited from an sgid parent).
    fn mkdir(
        &self,
        c: &Caller,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Attr, MetaError>;

    /// Creates a symlink (mode 0o777) to `target` (stored verbatim, not resolved).
    fn symlink(
        &self,
        c: &Caller,
        parent: Ino,
        name: &[u8],
        target: &[u8],
    ) -> Result<Attr, MetaError>;

    /// The target of a symlink; EINVAL for other kinds.
    fn readlink(&self, ino: Ino) -> Result<Vec<u8>, MetaError>;

    /// Adds the name `new_name` in `new_parent` for the existing non-directory `ino` (EPERM for
    /// directories). Returns the inode's attributes (nlink incremented, ctime updated).
    fn link(
        &self,
        c: &Caller,
        ino: Ino,
        new_parent: Ino,
        new_name: &[u8],
    ) -> Result<Attr, MetaError>;

    /// Removes a non-directory name (EISDIR for directories). Sticky `parent`: only the owner of
    /// the file or of the directory (or root) may. The inode disappears with its last link.
    fn unlink(&self, c: &Caller, parent: Ino, name: &[u8]) -> Result<(), MetaError>;

    /// Removes an empty directory (ENOTEMPTY, ENOTDIR, EINVAL for `.`, EBUSY for the root).
    fn rmdir(&self, c: &Caller, parent: Ino, name: &[u8]) -> Result<(), MetaError>;

    /// rename(2)/renameat2(2): replaces an existing target (file over file, directory over empty
    /// directory), EISDIR/ENOTDIR on a kind mismatch, ENOTEMPTY, EINVAL when moving a directory
    /// into its own subtree; `flags` is 0, [`RENAME_NOREPLACE`] (EEXIST) or [`RENAME_EXCHANGE`]
    /// (both must exist). Renaming a name onto a link of the same inode does nothing.
    #[allow(clippy::too_many_arguments)]
    fn rename(
        &self,
        c: &Caller,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> Result<(), MetaError>;

    /// Up to `entries_max` entries of directory `dir` whose cookie is greater than
    /// `after_cookie`, in cookie order; 0 starts at the beginning and an empty result means the
    /// end. The listing starts with `.` (cookie 1) and `..` (cookie 2). Needs read permission.
    fn readdir(
        &self,
        c: &Caller,
        dir: Ino,
        after_cookie: u64,
        entries_max: u32,
    ) -> Result<Vec<DirEntry>, MetaError>;

    /// Checks that the caller may open `ino` with open(2) `flags` (access mode O_RDONLY /
    /// O_WRONLY / O_RDWR; EISDIR for writing a directory). With O_TRUNC on a regular file the
    /// file is truncated to 0 (new generation) as part of the open. Returns the attributes.
    fn open(&self, c: &Caller, ino: Ino, flags: i32) -> Result<Attr, MetaError>;

    /// access(2): `mask` is a combination of [`ACCESS_READ`], [`ACCESS_WRITE`],
    /// [`ACCESS_EXECUTE`], or 0 for existence. EACCES when denied.
    fn access(&self, c: &Caller, ino: Ino, mask: i32) -> Result<(), MetaError>;

    /// Records a data write that ended at `end_offset`: size = max(size, end_offset), mtime and
    /// ctime = now, suid (and sgid with group exec) cleared when the caller is not root.
    fn wrote(&self, c: &Caller, ino: Ino, end_offset: u64) -> Result<Attr, MetaError>;

    /// File system figures (store capacity, inode counts, NAME_MAX).
    fn statfs(&self) -> Result<FsStat, MetaError>;

    /// Makes every operation completed so far durable (survives a server crash).
    fn sync(&self) -> Result<(), MetaError>;

    /// The drain's name map: every regular file with at least one link, with the path of one
    /// of its links. Files are listed once even with several hard links.
    fn manifest(&self) -> Result<Vec<ManifestEntry>, MetaError>;

    /// The epoch in the store that holds this namespace's file data.
    fn data_epoch(&self) -> EpochId;

    /// A subscription to the changes other users make to this namespace, so a cache of its
    /// names and attributes (the mount's kernel cache) can drop what they changed. `None`: this
    /// namespace has no other users to hear from (an in-process namespace), or does not offer
    /// it. See docs/design/mount.md, "Caching and the visibility rule".
    fn watch(&self) -> Result<Option<Box<dyn Watch>>, MetaError> {
        Ok(None)
    }
}

/// What another user changed in a namespace, as a cache must drop it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Change {
    /// The attributes of this inode changed (size, mode, owner, times, link count; for a
    /// directory also its entries: a name created in it, which no cache holds as absent).
    Inode(Ino),
    /// The entry `name` of directory `parent` now names another inode or none.
    Entry { parent: Ino, name: Vec<u8> },
}

/// One answer of a [`Watch`]: the changes after the version asked from, up to `version`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Changes {
    /// The version these changes bring the watcher to (ask from it next: that acknowledges them).
    pub version: u64,
    /// Changes were lost to this watcher (it fell behind the server's ring, or did not
    /// acknowledge in time): drop everything cached. `changes` is empty then.
    pub reset: bool,
    pub changes: Vec<Change>,
}

/// A subscription to a namespace's changes (see [`Namespace::watch`]).
pub trait Watch: Send {
    /// The changes after `since`, waiting a bounded time for some (empty: none came). Asking
    /// acknowledges every change up to `since`: the caller has dropped them from its cache.
    fn next(&mut self, since: u64) -> Result<Changes, MetaError>;

    /// Ends the subscription (after acknowledging `since`), so that no change waits for this
    /// watcher any more. Best effort: a watcher that cannot say so is forgotten by the server
    /// after a while.
    fn end(&mut self, since: u64) {
        let _ = since;
    }
}

/// The `since` of a watch poll that ends the subscription instead (see [`Watch::end`]).
pub const WATCH_END: u64 = u64::MAX;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_file_names_round_trip() {
        assert_eq!(data_file_name(7, 42, 3), "ns/7/42.3");
        assert_eq!(parse_data_file_name("ns/7/42.3"), Some((7, 42, 3)));
        assert_eq!(parse_data_file_name("ns/7/42"), None);
        assert_eq!(parse_data_file_name("ns/7/+4.2"), None);
        assert_eq!(parse_data_file_name("data/7/42.3"), None);
        assert_eq!(parse_data_file_name("ns/7/42.3.1"), None);
    }

    #[test]
    fn kinds_round_trip_through_mode_and_code() {
        for kind in FileKind::ALL {
            assert_eq!(FileKind::from_mode(kind.type_bits() | 0o755), Some(kind));
            assert_eq!(FileKind::from_code(kind.code()), Some(kind));
        }
        assert_eq!(FileKind::from_code(0), None);
        assert_eq!(FileKind::from_mode(0o755), None);
    }

    #[test]
    fn namespace_is_object_safe() {
        fn takes(_: Option<&dyn Namespace>) {}
        takes(None);
    }
}
