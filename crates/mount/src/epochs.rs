//! A read-only POSIX view of the caller's epochs, wherever tiering put them
//! (`spillway mount --epochs`, docs/design/mount.md, "The epochs view").
//!
//! The namespace mount shows a reservation's POSIX tree; applications that write epochs through
//! the native API or the C ABI (checkpoint libraries) have their files in epochs instead, and with
//! tiering (docs/design/ias.md) an epoch's phase may have gone to the burst buffer, straight to
//! the PFS or to a node's local NVM. This view lists them as `epoch-<E>/<name>`, the PFS's own
//! layout, so `ls`, `cp -r` and `diff` work on checkpoints without knowing the tier:
//!
//! - epochs the servers hold (listed per caller, so a user sees only epochs they may use);
//! - epochs on the PFS (`epoch-<E>` directories below `--pfs`: drained, or written there by a
//!   PFS phase and published at its commit);
//! - epochs the scheduler says are on some node's local tier and not moved yet: listed, but
//!   reading them answers EAGAIN naming the host, as the native API does (they are on the
//!   burst buffer once moved).
//!
//! Reads go through one [`Client`], whose open finds the bytes on the servers, else on the PFS.
//! Nothing here writes: every writing request is refused with EROFS, and the mount is
//! read-only in the kernel too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen,
    Request, SessionACL,
};
use parking_lot::Mutex;
use spillway_client::{Client, ClientError, FileHandle as EpochFile};
use spillway_types::EpochId;

use crate::{Mount, MountError, MAX_WRITE_BYTES};

/// Inodes the view hands out before it refuses new names (ENFILE); the kernel may hold any of
/// them, so they are never reused while mounted.
pub const INODES_MAX: usize = 1 << 20;
/// Open files at once (beyond: ENFILE).
pub const OPEN_FILES_MAX: usize = 1024;
/// Files of one epoch found by walking its PFS directory before the walk stops (and says so).
pub const PFS_FILES_PER_EPOCH_MAX: usize = 1 << 16;
/// How long one epoch's file list is reused: `ls -l` asks once per entry.
const LISTING_TTL: Duration = Duration::from_secs(1);
/// Epoch file lists kept at once.
const LISTINGS_CACHED_MAX: usize = 64;
/// Kernel cache time for entries and attributes (the view changes only as epochs are
/// committed, moved, drained or deleted).
const ATTR_TTL: Duration = Duration::from_secs(1);
/// The PFS directory of epoch `E` (the drain's layout).
const EPOCH_DIRECTORY_PREFIX: &str = "epoch-";

/// What an inode of the view is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Node {
    Root,
    /// A directory of an epoch: `path` "" is `epoch-<E>` itself, else a prefix of its names.
    Directory {
        epoch: EpochId,
        path: String,
    },
    File {
        epoch: EpochId,
        name: String,
    },
}

/// Inode numbers, stable while mounted: inode `i` is `nodes[i - 1]` (the root is 1).
struct Inodes {
    nodes: Vec<Node>,
    numbers: HashMap<Node, u64>,
}

impl Inodes {
    fn new() -> Inodes {
        Inodes { nodes: vec![Node::Root], numbers: HashMap::from([(Node::Root, 1)]) }
    }

    fn number(&mut self, node: Node) -> Result<u64, Errno> {
        if let Some(&ino) = self.numbers.get(&node) {
            return Ok(ino);
        }
        if self.nodes.len() >= INODES_MAX {
            tracing::warn!(INODES_MAX, "the epochs view has handed out all its inodes; remount it");
            return Err(Errno::ENFILE);
        }
        self.nodes.push(node.clone());
        let ino = self.nodes.len() as u64;
        self.numbers.insert(node, ino);
        Ok(ino)
    }

    fn node(&self, ino: u64) -> Result<Node, Errno> {
        let index =
            usize::try_from(ino).ok().and_then(|i| i.checked_sub(1)).ok_or(Errno::ENOENT)?;
        self.nodes.get(index).cloned().ok_or(Errno::ENOENT)
    }
}

/// An epoch's files (names, sizes), as listed at one time.
type Listing = Arc<Vec<(String, u64)>>;

/// One entry of a directory of the view.
struct Entry {
    name: Vec<u8>,
    node: Node,
    size: u64,
}

/// An open file: the client's handle and the size seen at open (reads stop there).
struct OpenFile {
    file: EpochFile,
    size: u64,
}

/// The read-only epochs file system.
pub struct EpochsView {
    client: Mutex<Client>,
    pfs: Option<PathBuf>,
    inodes: Mutex<Inodes>,
    listings: Mutex<HashMap<EpochId, (Instant, Listing)>>,
    open_files: Mutex<HashMap<u64, OpenFile>>,
    next_handle: AtomicU64,
    /// Shown as every entry's owner: the view is the mounting user's.
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
}

fn client_errno(what: &str, error: &ClientError) -> Errno {
    tracing::warn!(%error, "epochs view: {what}");
    Errno::from_i32(error.errno())
}

/// Whether a PFS name is Spillway's own (a drain's or a PFS phase's staging file, the
/// directory's marker), never shown.
fn spillway_internal(component: &OsStr) -> bool {
    let bytes = component.as_bytes();
    bytes.starts_with(b".") && bytes.windows(8).any(|w| w == b"spillway")
}

/// `epoch-<E>` → E.
fn parse_epoch_directory(name: &[u8]) -> Option<EpochId> {
    let digits = name.strip_prefix(EPOCH_DIRECTORY_PREFIX.as_bytes())?;
    if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok().map(EpochId)
}

/// The epochs with a real `epoch-<E>` directory in `pfs` (a link or a file so named is not one).
fn pfs_epochs(pfs: &Path) -> std::io::Result<BTreeSet<EpochId>> {
    let mut epochs = BTreeSet::new();
    for entry in std::fs::read_dir(pfs)?.flatten() {
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if let (true, Some(epoch)) = (is_dir, parse_epoch_directory(entry.file_name().as_bytes())) {
            epochs.insert(epoch);
        }
    }
    Ok(epochs)
}

/// The regular files below `root`, as names relative to it with sizes; never follows a link.
fn walk_pfs_epoch(root: &Path) -> std::io::Result<Vec<(String, u64)>> {
    let mut files = Vec::new();
    let mut pending = vec![(root.to_path_buf(), String::new())];
    while let Some((directory, prefix)) = pending.pop() {
        for entry in std::fs::read_dir(&directory)? {
            let entry = entry?;
            let name = entry.file_name();
            if spillway_internal(&name) {
                continue;
            }
            let Some(name) = name.to_str() else { continue };
            let relative =
                if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
            let kind = entry.file_type()?;
            if kind.is_dir() {
                pending.push((entry.path(), relative));
            } else if kind.is_file() {
                files.push((relative, entry.metadata()?.len()));
            }
            if files.len() >= PFS_FILES_PER_EPOCH_MAX {
                tracing::warn!(directory = %root.display(), PFS_FILES_PER_EPOCH_MAX, "epochs view: listing cut short");
                return Ok(files);
            }
        }
    }
    Ok(files)
}

/// The entries of directory `path` of an epoch whose files are `files`: a name's next component
/// below `path`, as a directory if more components follow. A name that is also a prefix of
/// other names shows as the directory.
fn children(epoch: EpochId, path: &str, files: &[(String, u64)]) -> Vec<Entry> {
    let mut entries: BTreeMap<&str, Entry> = BTreeMap::new();
    for (name, size) in files {
        let rest = if path.is_empty() {
            name.as_str()
        } else {
            match name.strip_prefix(path).and_then(|r| r.strip_prefix('/')) {
                Some(rest) => rest,
                None => continue,
            }
        };
        let (component, deeper) = match rest.split_once('/') {
            Some((component, _)) => (component, true),
            None => (rest, false),
        };
        if component.is_empty() {
            continue;
        }
        let full =
            if path.is_empty() { component.to_string() } else { format!("{path}/{component}") };
        let node = if deeper {
            Node::Directory { epoch, path: full }
        } else {
            Node::File { epoch, name: full }
        };
        match entries.get(component) {
            Some(Entry { node: Node::Directory { .. }, .. }) => {}
            _ => {
                entries.insert(
                    component,
                    Entry { name: component.as_bytes().to_vec(), node, size: *size },
                );
            }
        }
    }
    entries.into_values().collect()
}

impl EpochsView {
    /// A view through `client` (connected to the reservation's servers with the mounting
    /// user's identity), finding PFS epochs below `pfs`.
    pub fn new(client: Client, pfs: Option<PathBuf>) -> EpochsView {
        EpochsView {
            client: Mutex::new(client),
            pfs,
            inodes: Mutex::new(Inodes::new()),
            listings: Mutex::new(HashMap::new()),
            open_files: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            uid: spillway_sys::user::uid(),
            gid: spillway_sys::user::gid(),
            mounted_at: SystemTime::now(),
        }
    }

    fn attr(&self, ino: u64, node: &Node, size: u64) -> FileAttr {
        let (kind, perm, nlink) = match node {
            Node::File { .. } => (FileType::RegularFile, 0o444, 1),
            _ => (FileType::Directory, 0o555, 2),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: MAX_WRITE_BYTES,
            flags: 0,
        }
    }

    /// The PFS directory of `epoch`, if there is a real one.
    fn pfs_epoch_directory(&self, epoch: EpochId) -> Option<PathBuf> {
        let directory = self.pfs.as_ref()?.join(format!("{EPOCH_DIRECTORY_PREFIX}{}", epoch.0));
        let meta = std::fs::symlink_metadata(&directory).ok()?;
        meta.is_dir().then_some(directory)
    }

    /// Every epoch the caller has somewhere: on the servers, on the PFS, or located by the
    /// scheduler on a node's local tier.
    fn epochs(&self) -> Result<BTreeSet<EpochId>, Errno> {
        let mut client = self.client.lock();
        let mut epochs: BTreeSet<EpochId> = client
            .list_epochs()
            .map_err(|e| client_errno("listing the servers' epochs", &e))?
            .into_iter()
            .map(|summary| summary.epoch)
            .collect();
        match client.located_epochs() {
            Ok(located) => epochs.extend(located.into_iter().map(|l| l.epoch)),
            // The scheduler down hides only epochs it alone knows of.
            Err(error) => tracing::warn!(%error, "epochs view: the scheduler's locations"),
        }
        drop(client);
        if let Some(pfs) = &self.pfs {
            match pfs_epochs(pfs) {
                Ok(on_pfs) => epochs.extend(on_pfs),
                Err(error) => {
                    tracing::warn!(pfs = %pfs.display(), %error, "epochs view: listing the PFS")
                }
            }
        }
        Ok(epochs)
    }

    /// The files of `epoch` (names, sizes), from the servers if they hold it, else from its PFS
    /// directory; EAGAIN while it is on another node's local tier; ENOENT if nowhere.
    fn files(&self, epoch: EpochId) -> Result<Listing, Errno> {
        if let Some((at, files)) = self.listings.lock().get(&epoch) {
            if at.elapsed() < LISTING_TTL {
                return Ok(files.clone());
            }
        }
        let files = Arc::new(self.list_files(epoch)?);
        let mut listings = self.listings.lock();
        if listings.len() >= LISTINGS_CACHED_MAX {
            listings.retain(|_, (at, _)| at.elapsed() < LISTING_TTL);
            if listings.len() >= LISTINGS_CACHED_MAX {
                listings.clear();
            }
        }
        listings.insert(epoch, (Instant::now(), files.clone()));
        Ok(files)
    }

    fn list_files(&self, epoch: EpochId) -> Result<Vec<(String, u64)>, Errno> {
        let mut client = self.client.lock();
        let on_servers = client
            .list_epochs()
            .map_err(|e| client_errno("listing the servers' epochs", &e))?
            .iter()
            .any(|summary| summary.epoch == epoch);
        if on_servers {
            return client
                .list_files(epoch)
                .map_err(|e| client_errno(&format!("listing epoch {epoch}"), &e));
        }
        if let Some(directory) = self.pfs_epoch_directory(epoch) {
            drop(client);
            return walk_pfs_epoch(&directory).map_err(|error| {
                tracing::warn!(directory = %directory.display(), %error, "epochs view: listing the PFS");
                Errno::from_i32(error.raw_os_error().unwrap_or(libc::EIO))
            });
        }
        match client.held_elsewhere(epoch) {
            Some(error) => Err(client_errno(&format!("epoch {epoch}"), &error)),
            None => Err(Errno::ENOENT),
        }
    }

    /// The entries of a directory of the view.
    fn entries(&self, node: &Node) -> Result<Vec<Entry>, Errno> {
        match node {
            Node::Root => Ok(self
                .epochs()?
                .into_iter()
                .map(|epoch| Entry {
                    name: format!("{EPOCH_DIRECTORY_PREFIX}{}", epoch.0).into_bytes(),
                    node: Node::Directory { epoch, path: String::new() },
                    size: 0,
                })
                .collect()),
            Node::Directory { epoch, path } => Ok(children(*epoch, path, &self.files(*epoch)?)),
            Node::File { .. } => Err(Errno::ENOTDIR),
        }
    }

    /// The size of a node now (a file's from its epoch's listing; ENOENT once gone).
    fn size(&self, node: &Node) -> Result<u64, Errno> {
        match node {
            Node::File { epoch, name } => self
                .files(*epoch)?
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, size)| *size)
                .ok_or(Errno::ENOENT),
            _ => Ok(0),
        }
    }

    fn parent_of(&self, node: &Node) -> Result<u64, Errno> {
        let parent = match node {
            Node::Root => Node::Root,
            Node::Directory { path, .. } if path.is_empty() => Node::Root,
            Node::Directory { epoch, path } | Node::File { epoch, name: path } => {
                let up = path.rsplit_once('/').map_or("", |(up, _)| up);
                Node::Directory { epoch: *epoch, path: up.to_string() }
            }
        };
        self.inodes.lock().number(parent)
    }

    fn do_lookup(&self, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        let parent = self.inodes.lock().node(parent)?;
        let entry = self
            .entries(&parent)?
            .into_iter()
            .find(|entry| entry.name == name.as_bytes())
            .ok_or(Errno::ENOENT)?;
        let ino = self.inodes.lock().number(entry.node.clone())?;
        Ok(self.attr(ino, &entry.node, entry.size))
    }

    fn do_open(&self, ino: u64, flags: i32) -> Result<u64, Errno> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(Errno::EROFS);
        }
        let Node::File { epoch, name } = self.inodes.lock().node(ino)? else {
            return Err(Errno::EISDIR);
        };
        if self.open_files.lock().len() >= OPEN_FILES_MAX {
            return Err(Errno::ENFILE);
        }
        let mut client = self.client.lock();
        let what = format!("opening {name:?} of epoch {epoch}");
        let file = client.open_file(epoch, &name).map_err(|e| client_errno(&what, &e))?;
        let size = client.file_size(&file).map_err(|e| client_errno(&what, &e))?;
        drop(client);
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.open_files.lock().insert(handle, OpenFile { file, size });
        Ok(handle)
    }

    fn do_read(&self, handle: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let open_files = self.open_files.lock();
        let open = open_files.get(&handle).ok_or(Errno::EBADF)?;
        if offset >= open.size {
            return Ok(Vec::new());
        }
        let mut buffer = vec![0u8; u64::from(size).min(open.size - offset) as usize];
        let file = open.file.clone();
        drop(open_files);
        self.client.lock().read(&file, offset, &mut buffer).map_err(|e| {
            client_errno(&format!("reading {:?} of epoch {}", file.name, file.epoch), &e)
        })?;
        Ok(buffer)
    }
}

impl Filesystem for EpochsView {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.do_lookup(parent.0, name) {
            Ok(attr) => reply.entry(&ATTR_TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let node = self.inodes.lock().node(ino.0);
        let result = node.and_then(|node| Ok(self.attr(ino.0, &node, self.size(&node)?)));
        match result {
            Ok(attr) => reply.attr(&ATTR_TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.do_open(ino.0, flags.0) {
            Ok(handle) => reply.opened(FileHandle(handle), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.do_read(fh.0, offset, size) {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: fuser::ReplyEmpty,
    ) {
        self.open_files.lock().remove(&fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let node = self.inodes.lock().node(ino.0);
        match node {
            Ok(Node::File { .. }) => reply.error(Errno::ENOTDIR),
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Not `self.inodes.lock().node(…).and_then(…)`: the guard would live through the
        // closure, which takes the lock again.
        let node = self.inodes.lock().node(ino.0);
        let listed = node.and_then(|node| {
            let parent = self.parent_of(&node)?;
            Ok((parent, self.entries(&node)?))
        });
        let (parent, entries) = match listed {
            Ok(listed) => listed,
            Err(e) => return reply.error(e),
        };
        let dots = [
            (ino.0, FileType::Directory, b".".to_vec()),
            (parent, FileType::Directory, b"..".to_vec()),
        ];
        let mut all = dots.into_iter().map(Ok).collect::<Vec<Result<_, Errno>>>();
        for entry in entries {
            let kind = match entry.node {
                Node::File { .. } => FileType::RegularFile,
                _ => FileType::Directory,
            };
            all.push(self.inodes.lock().number(entry.node).map(|ino| (ino, kind, entry.name)));
        }
        for (index, item) in all.into_iter().enumerate().skip(offset as usize) {
            let (entry_ino, kind, name) = match item {
                Ok(item) => item,
                Err(e) => return reply.error(e),
            };
            if reply.add(INodeNo(entry_ino), index as u64 + 1, kind, OsStr::from_bytes(&name)) {
                break;
            }
        }
        reply.ok();
    }
}

/// Mounts the read-only epochs view at `mountpoint` for the mounting user alone; returns once
/// the kernel has it. `pfs`: where drained and PFS-written epochs are (`epoch-<E>/…`).
pub fn mount_epochs(
    client: Client,
    pfs: Option<PathBuf>,
    mountpoint: &Path,
    fs_name: &str,
) -> Result<Mount, MountError> {
    crate::check_mountpoint(mountpoint)?;
    let mut options = Config::default();
    options.mount_options = vec![
        MountOption::FSName(fs_name.to_string()),
        MountOption::Subtype("spillway-epochs".to_string()),
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::DefaultPermissions,
    ];
    options.acl = SessionACL::Owner;
    options.n_threads = Some(2);
    options.clone_fd = true;
    let session = fuser::spawn_mount(EpochsView::new(client, pfs), mountpoint, &options)
        .map_err(|source| MountError::Mount { path: mountpoint.to_path_buf(), source })?;
    Ok(Mount { session: Some(session), mountpoint: mountpoint.to_path_buf(), _invalidator: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(entries: &[Entry]) -> Vec<(String, bool, u64)> {
        entries
            .iter()
            .map(|e| {
                (
                    String::from_utf8(e.name.clone()).unwrap(),
                    matches!(e.node, Node::Directory { .. }),
                    e.size,
                )
            })
            .collect()
    }

    #[test]
    fn an_epochs_names_become_a_tree_and_a_name_that_is_also_a_prefix_shows_as_the_directory() {
        let files: Vec<(String, u64)> =
            [("ckpt", 1), ("out/a", 2), ("out/b", 3), ("out/deep/c", 4), ("out", 9)]
                .iter()
                .map(|(n, s)| ((*n).to_string(), *s))
                .collect();
        let epoch = EpochId(7);
        assert_eq!(
            names(&children(epoch, "", &files)),
            vec![("ckpt".into(), false, 1), ("out".into(), true, 2)]
        );
        assert_eq!(
            names(&children(epoch, "out", &files)),
            vec![("a".into(), false, 2), ("b".into(), false, 3), ("deep".into(), true, 4)]
        );
        assert_eq!(names(&children(epoch, "out/deep", &files)), vec![("c".into(), false, 4)]);
        assert!(children(epoch, "nothing", &files).is_empty());
        // "outer" is not below "out".
        let outer = vec![("outer/x".to_string(), 1)];
        assert!(children(epoch, "out", &outer).is_empty());
    }

    #[test]
    fn epoch_directory_names_parse_strictly_and_spillway_files_are_hidden() {
        assert_eq!(parse_epoch_directory(b"epoch-12"), Some(EpochId(12)));
        for bad in
            [&b"epoch-"[..], b"epoch-1x", b"epoch--1", b"Epoch-1", b"epoch-99999999999999999999999"]
        {
            assert_eq!(parse_epoch_directory(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert!(spillway_internal(OsStr::new(".ckpt.spillway-direct")));
        assert!(spillway_internal(OsStr::new(".ckpt.spillway-e3-00ff.staging")));
        assert!(spillway_internal(OsStr::new(".spillway-pfs")));
        assert!(!spillway_internal(OsStr::new(".hidden")));
        assert!(!spillway_internal(OsStr::new("spillway-results")));
    }

    #[test]
    fn the_pfs_walk_lists_regular_files_only_and_never_follows_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("epoch-3");
        std::fs::create_dir_all(root.join("out/deep")).unwrap();
        std::fs::write(root.join("ckpt"), b"12345").unwrap();
        std::fs::write(root.join("out/deep/c"), b"1").unwrap();
        std::fs::write(root.join("out/.c.spillway-direct"), b"partial").unwrap();
        let outside = dir.path().join("secret");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("s"), b"no").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.join("s"), root.join("file-link")).unwrap();
        let mut files = walk_pfs_epoch(&root).unwrap();
        files.sort();
        assert_eq!(files, vec![("ckpt".to_string(), 5), ("out/deep/c".to_string(), 1)]);
    }

    #[test]
    fn only_real_epoch_directories_on_the_pfs_are_epochs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("epoch-3")).unwrap();
        std::fs::create_dir(dir.path().join("epoch-x")).unwrap();
        std::fs::create_dir(dir.path().join("unrelated")).unwrap();
        std::fs::write(dir.path().join("epoch-4"), b"a file, not a directory").unwrap();
        // A link planted as an epoch (to another user's tree, or to /) is not listed.
        std::os::unix::fs::symlink("/", dir.path().join("epoch-5")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("epoch-3"), dir.path().join("epoch-6")).unwrap();
        assert_eq!(pfs_epochs(dir.path()).unwrap(), BTreeSet::from([EpochId(3)]));
        assert!(pfs_epochs(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn inode_numbers_are_stable_and_unknown_ones_are_enoent() {
        let mut inodes = Inodes::new();
        let a = Node::File { epoch: EpochId(1), name: "a".into() };
        let first = inodes.number(a.clone()).unwrap();
        assert_eq!(inodes.number(a.clone()).unwrap(), first);
        assert_eq!(inodes.node(first).unwrap(), a);
        assert_eq!(inodes.node(1).unwrap(), Node::Root);
        assert_eq!(inodes.node(0), Err(Errno::ENOENT));
        assert_eq!(inodes.node(first + 1), Err(Errno::ENOENT));
    }
}
