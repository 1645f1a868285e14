//! The process's connection to the burst buffer and the file operations on it: what the FUSE
//! mount does for a kernel request (`crates/mount/src/fs.rs`), done here for a system call
//! without the kernel in between. Namespace requests go to the namespace's server, file bytes
//! through a [`DataPlane`] (the mount's own data path: write-behind per slot, failures pinned on
//! the files whose writes were in flight, sizes reported only for acknowledged bytes).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use spillway_mount::connect::data_clients;
use spillway_mount::data::{DataError, DataPlane};
use spillway_mount::fs::fallocate_zeroes;
use spillway_namespace::{
    Attr, Caller, FileKind, Ino, MetaError, Namespace, SetAttr, TimeSet, Timestamp, ROOT_INO,
};

use crate::config::Config;

/// Symbolic links followed in one path, as Linux's MAXSYMLINKS.
const SYMLINKS_MAX: u32 = 40;
/// Directory entries kept in the lookup cache before it is cleared (bounds memory).
const DIR_CACHE_ENTRIES_MAX: usize = 16_384;

/// Why a call is not completed here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fail {
    /// Fails with this errno.
    Errno(i32),
    /// Not Spillway's to do (a directory, a FIFO, a path that leaves the mount through `..` or
    /// a symbolic link): the caller hands the call to libc unchanged (the FUSE mount, if any).
    Pass,
}

impl From<&MetaError> for Fail {
    fn from(e: &MetaError) -> Fail {
        Fail::Errno(e.errno)
    }
}

impl From<MetaError> for Fail {
    fn from(e: MetaError) -> Fail {
        Fail::Errno(e.errno)
    }
}

impl From<DataError> for Fail {
    fn from(e: DataError) -> Fail {
        Fail::Errno(e.errno())
    }
}

pub type Outcome<T> = Result<T, Fail>;

/// The caller of this process's requests. The namespace server believes the ids only from a
/// root peer; a user's requests run as the user the kernel says the connection belongs to.
fn caller() -> Caller {
    // SAFETY: these calls cannot fail.
    let (uid, gid, pid) = unsafe { (libc::geteuid(), libc::getegid(), libc::getpid()) };
    // Only a root peer's groups are believed: nobody else's are worth a system call per request.
    let mut groups = Vec::new();
    if uid == 0 {
        groups = vec![0 as libc::gid_t; 256];
        // SAFETY: the buffer holds 256 gids.
        let count = unsafe { libc::getgroups(256, groups.as_mut_ptr()) };
        groups.truncate(usize::try_from(count).unwrap_or(0));
    }
    Caller { uid, gid, groups, pid: pid as u32 }
}

/// An open file description: what `open` made, shared by its `dup`s (and, as in the kernel,
/// its offset with them).
pub struct OpenFile {
    pub ino: Ino,
    /// A directory opened for listing (`O_DIRECTORY`, `opendir`): no data, no size reports.
    pub directory: bool,
    /// The absolute path it was opened by (to reopen it through the FUSE mount at exec).
    pub path: Vec<u8>,
    /// Status flags: the access mode, O_APPEND (F_SETFL changes it), O_NONBLOCK.
    pub flags: Mutex<i32>,
    pub offset: Mutex<u64>,
    /// The [`Runtime::generation`] that counts this file among its inode's opens (a forked
    /// child's new runtime adopts the files it inherited on first use).
    runtime_generation: AtomicU64,
}

impl OpenFile {
    pub fn readable(&self) -> bool {
        *self.flags.lock() & libc::O_ACCMODE != libc::O_WRONLY
    }

    pub fn writable(&self) -> bool {
        *self.flags.lock() & libc::O_ACCMODE != libc::O_RDONLY
    }
}

/// What this process knows of an inode it has open.
struct InodeState {
    attr: Attr,
    opens: u32,
    /// End offset of this process's writes not yet reported to the namespace.
    pending: Option<u64>,
}

/// Directory lookups kept for a while: a path's directories are not asked for again on every
/// call (mdtest's creates in one directory cost one request each, not one per component).
struct DirCache {
    ttl: Duration,
    entries: HashMap<(Ino, Vec<u8>), (Ino, Instant)>,
}

impl DirCache {
    fn get(&self, parent: Ino, name: &[u8]) -> Option<Ino> {
        let (ino, at) = self.entries.get(&(parent, name.to_vec()))?;
        (at.elapsed() < self.ttl).then_some(*ino)
    }

    fn put(&mut self, parent: Ino, name: &[u8], ino: Ino) {
        if self.ttl.is_zero() {
            return;
        }
        if self.entries.len() >= DIR_CACHE_ENTRIES_MAX {
            self.entries.clear();
        }
        self.entries.insert((parent, name.to_vec()), (ino, Instant::now()));
    }
}

/// A path resolved up to its last component.
pub struct Resolved {
    pub parent: Ino,
    /// The last component (never `.` or `..`; empty for the namespace's root).
    pub name: Vec<u8>,
    /// Some directory on the way came from the cache: an ENOENT may be stale.
    used_cache: bool,
}

/// One process's view of the burst buffer.
pub struct Runtime {
    pub config: Config,
    namespace: Arc<dyn Namespace>,
    data: DataPlane,
    inodes: Mutex<HashMap<Ino, InodeState>>,
    dirs: Mutex<DirCache>,
    /// Held across taking an inode's pending size and reporting it, and by a truncate across its
    /// report and the shrink (as the mount's `size_reports`).
    size_reports: Mutex<()>,
    /// Inodes whose bytes this process read or wrote (its data slot may hold their store
    /// handles and pinned failures); the others' opens and closes need no data-plane round
    /// trip (mdtest's empty files, a `stat`-and-close).
    data_used: Mutex<HashSet<Ino>>,
    /// `st_dev` of the FUSE mount, or a fixed number without one.
    pub device: u64,
    /// Distinguishes this runtime from the parent's after a fork.
    generation: u64,
}

/// Runtimes made in this process image so far (each fork's child makes one more).
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

impl Runtime {
    pub fn connect(config: Config) -> Result<Runtime, String> {
        use spillway_client::meta::{RemoteNamespace, RemoteOptions};
        let endpoint = &config.servers[config.namespace_server];
        let options = RemoteOptions {
            create: false,
            connections_max: config.slots * 2,
            ..RemoteOptions::default()
        };
        let namespace = RemoteNamespace::open(endpoint, config.namespace_id, &options)
            .map_err(|e| format!("opening namespace {} on {endpoint}: {e}", config.namespace_id))?;
        let epoch = namespace.data_epoch();
        let clients = data_clients(&config.servers, config.slots, config.replicas)
            .map_err(|e| format!("connecting to the servers: {e}"))?;
        let data = DataPlane::inline(clients, config.namespace_id, epoch);
        let device = crate::fuse_device(&config.mountpoint).unwrap_or(0x5350_4c57);
        Ok(Runtime {
            dirs: Mutex::new(DirCache { ttl: config.dir_cache_ttl, entries: HashMap::new() }),
            config,
            namespace: Arc::new(namespace),
            data,
            inodes: Mutex::new(HashMap::new()),
            size_reports: Mutex::new(()),
            data_used: Mutex::new(HashSet::new()),
            device,
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Splits a mount-relative path into its components.
    fn components(path: &[u8]) -> VecDeque<Vec<u8>> {
        path.split(|&b| b == b'/').filter(|c| !c.is_empty()).map(<[u8]>::to_vec).collect()
    }

    fn lookup_dir(&self, c: &Caller, parent: Ino, name: &[u8], cached: &mut bool) -> Outcome<Attr> {
        if let Some(ino) = self.dirs.lock().get(parent, name) {
            *cached = true;
            // Only the kind and number matter on the way: a directory it was, a directory it is
            // taken to be for the cache's lifetime (docs/design/preload.md, "Consistency").
            return Ok(placeholder(ino));
        }
        let attr = self.namespace.lookup(c, parent, name)?;
        if attr.kind == FileKind::Directory {
            self.dirs.lock().put(parent, name, attr.ino);
        }
        Ok(attr)
    }

    /// Walks `path` (relative to the mount point) to the directory holding its last component,
    /// following symbolic links on the way. `..` above the root, or a link out of the mount,
    /// is [`Fail::Pass`].
    pub fn resolve(&self, c: &Caller, path: &[u8]) -> Outcome<Resolved> {
        let mut queue = Self::components(path);
        let mut stack = vec![ROOT_INO];
        let mut links = 0;
        let mut used_cache = false;
        while let Some(name) = queue.pop_front() {
            let parent = *stack.last().expect("the root stays");
            match name.as_slice() {
                b"." => continue,
                b".." => {
                    if stack.len() == 1 {
                        return Err(Fail::Pass);
                    }
                    stack.pop();
                    continue;
                }
                _ => {}
            }
            if queue.is_empty() {
                return Ok(Resolved { parent, name, used_cache });
            }
            let attr = self.lookup_dir(c, parent, &name, &mut used_cache)?;
            match attr.kind {
                FileKind::Directory => stack.push(attr.ino),
                FileKind::Symlink => {
                    links += 1;
                    if links > SYMLINKS_MAX {
                        return Err(Fail::Errno(libc::ELOOP));
                    }
                    let target = self.namespace.readlink(attr.ino)?;
                    if target.starts_with(b"/") {
                        let inside = self.config.inside(&target).ok_or(Fail::Pass)?;
                        stack.truncate(1);
                        prepend(&mut queue, Self::components(&inside));
                    } else {
                        prepend(&mut queue, Self::components(&target));
                    }
                }
                _ => return Err(Fail::Errno(libc::ENOTDIR)),
            }
        }
        // The path named the root or ended in `.`/`..`: a directory, the mount's to serve.
        Err(Fail::Pass)
    }

    /// The attributes of `path`'s last component, following a final symbolic link when
    /// `follow`; a directory's too (stat serves them).
    pub fn stat_path(&self, path: &[u8], follow: bool) -> Outcome<Attr> {
        let mut path = path.to_vec();
        for _ in 0..SYMLINKS_MAX {
            if Self::components(&path).is_empty() {
                return Ok(self.namespace.getattr(ROOT_INO)?);
            }
            let attr =
                self.on_path(&path, |c, at| Ok(self.namespace.lookup(c, at.parent, &at.name)?))?;
            if attr.kind != FileKind::Symlink || !follow {
                return Ok(self.with_pending(attr));
            }
            path = self.link_target(&path, attr.ino)?;
        }
        Err(Fail::Errno(libc::ELOOP))
    }

    /// The path a final symbolic link at `path` points to, relative to the mount point.
    fn link_target(&self, path: &[u8], ino: Ino) -> Outcome<Vec<u8>> {
        let target = self.namespace.readlink(ino)?;
        if target.starts_with(b"/") {
            return self.config.inside(&target).ok_or(Fail::Pass);
        }
        let parent = path.iter().rposition(|&b| b == b'/').map_or(&path[..0], |end| &path[..end]);
        let mut joined = parent.to_vec();
        joined.push(b'/');
        joined.extend_from_slice(&target);
        Ok(joined)
    }

    /// Runs `op`; if it fails with ENOENT or ENOTDIR after a walk through cached directories,
    /// the cache is dropped and the caller's walk must be redone (returns the failure as is
    /// when nothing was cached).
    fn retry_stale<T>(&self, resolved: &Resolved, op: impl Fn() -> Outcome<T>) -> Outcome<T> {
        let result = op();
        if resolved.used_cache && matches!(result, Err(Fail::Errno(libc::ENOENT | libc::ENOTDIR))) {
            self.dirs.lock().entries.clear();
            return Err(Fail::Errno(libc::ESTALE));
        }
        result
    }

    /// Runs `op` on a freshly resolved path; an ESTALE (a cached directory was gone) resolves
    /// again, once, without the cache.
    pub fn on_path<T>(
        &self,
        path: &[u8],
        op: impl Fn(&Caller, &Resolved) -> Outcome<T>,
    ) -> Outcome<T> {
        let c = caller();
        for _ in 0..2 {
            let resolved = self.resolve(&c, path)?;
            match self.retry_stale(&resolved, || op(&c, &resolved)) {
                Err(Fail::Errno(libc::ESTALE)) => continue,
                other => return other,
            }
        }
        Err(Fail::Errno(libc::ENOENT))
    }

    /// open(2) of a regular file; anything else is [`Fail::Pass`].
    pub fn open(
        &self,
        path: &[u8],
        flags: i32,
        mode: u32,
        absolute: Vec<u8>,
    ) -> Outcome<Arc<OpenFile>> {
        let mut path = path.to_vec();
        for _ in 0..SYMLINKS_MAX {
            let attr = self.on_path(&path, |c, at| self.open_at(c, at, flags, mode))?;
            if attr.kind == FileKind::Symlink {
                if flags & libc::O_NOFOLLOW != 0 {
                    return Err(Fail::Errno(libc::ELOOP));
                }
                path = self.link_target(&path, attr.ino)?;
                continue;
            }
            if attr.kind != FileKind::Regular {
                return Err(Fail::Pass);
            }
            if self.data_used.lock().contains(&attr.ino) {
                self.data.slot(attr.ino).forget(attr.ino); // close-to-open: find its bytes afresh
            }
            let mut inodes = self.inodes.lock();
            let state = inodes.entry(attr.ino).or_insert(InodeState {
                attr: attr.clone(),
                opens: 0,
                pending: None,
            });
            let size = state.pending.map_or(attr.size, |end| end.max(attr.size));
            state.attr = Attr { size, ..attr.clone() };
            state.opens += 1;
            return Ok(Arc::new(OpenFile {
                ino: attr.ino,
                directory: false,
                path: absolute,
                flags: Mutex::new(flags & (libc::O_ACCMODE | libc::O_APPEND | libc::O_NONBLOCK)),
                offset: Mutex::new(0),
                runtime_generation: AtomicU64::new(self.generation),
            }));
        }
        Err(Fail::Errno(libc::ELOOP))
    }

    /// The namespace side of open: create (O_CREAT), or look up and open; a symbolic link or a
    /// non-regular file comes back as is for the caller to follow or pass on.
    fn open_at(&self, c: &Caller, at: &Resolved, flags: i32, mode: u32) -> Outcome<Attr> {
        if flags & libc::O_CREAT != 0 {
            let created = self.namespace.create(
                c,
                at.parent,
                &at.name,
                FileKind::Regular,
                mode & 0o7777,
                crate::umask(),
                0,
                true,
            );
            match created {
                Ok(attr) => return Ok(attr),
                Err(e) if e.errno == libc::EEXIST && flags & libc::O_EXCL == 0 => {}
                Err(e) => return Err(e.into()),
            }
        }
        let attr = self.namespace.lookup(c, at.parent, &at.name)?;
        if attr.kind != FileKind::Regular {
            if attr.kind == FileKind::Directory && flags & libc::O_ACCMODE != libc::O_RDONLY {
                return Err(Fail::Errno(libc::EISDIR));
            }
            return Ok(attr);
        }
        // Another open file's unreported writes must not outlive an O_TRUNC of this one.
        let reporting = self.size_reports.lock();
        self.push_pending_locked(attr.ino)?;
        let opened = self.namespace.open(c, attr.ino, flags)?;
        drop(reporting);
        Ok(opened)
    }

    /// open(2) of a directory with `O_DIRECTORY` (and `opendir`): read permission is checked
    /// now, as the kernel does; the listing is read with [`Runtime::read_directory`].
    pub fn open_directory(
        &self,
        path: &[u8],
        flags: i32,
        absolute: Vec<u8>,
    ) -> Outcome<Arc<OpenFile>> {
        let attr = self.stat_path(path, flags & libc::O_NOFOLLOW == 0)?;
        if attr.kind == FileKind::Symlink {
            return Err(Fail::Errno(libc::ELOOP));
        }
        if attr.kind != FileKind::Directory {
            return Err(Fail::Errno(libc::ENOTDIR));
        }
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & (libc::O_CREAT | libc::O_TRUNC) != 0
        {
            return Err(Fail::Errno(libc::EISDIR));
        }
        self.namespace.access(&caller(), attr.ino, spillway_namespace::ACCESS_READ)?;
        Ok(Arc::new(OpenFile {
            ino: attr.ino,
            directory: true,
            path: absolute,
            flags: Mutex::new(libc::O_RDONLY | libc::O_DIRECTORY),
            offset: Mutex::new(0),
            runtime_generation: AtomicU64::new(self.generation),
        }))
    }

    /// Up to `entries_max` entries of a directory after `after_cookie` (`.` and `..` first).
    pub fn read_directory(
        &self,
        file: &OpenFile,
        after_cookie: u64,
        entries_max: u32,
    ) -> Outcome<Vec<spillway_namespace::DirEntry>> {
        Ok(self.namespace.readdir(&caller(), file.ino, after_cookie, entries_max)?)
    }

    /// Counts `file`, inherited through fork from the parent's runtime, among this runtime's
    /// opens of its inode (once).
    pub fn adopt(&self, file: &OpenFile) {
        let seen = file.runtime_generation.load(Ordering::Acquire);
        if file.directory {
            return;
        }
        if seen == self.generation
            || file
                .runtime_generation
                .compare_exchange(seen, self.generation, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        let attr = self.namespace.getattr(file.ino).unwrap_or_else(|_| placeholder(file.ino));
        let mut inodes = self.inodes.lock();
        let state = inodes.entry(file.ino).or_insert(InodeState { attr, opens: 0, pending: None });
        state.opens += 1;
    }

    /// The size and generation this process uses for `ino`.
    fn state(&self, ino: Ino) -> Outcome<(u64, u64)> {
        if let Some(state) = self.inodes.lock().get(&ino) {
            return Ok((state.attr.generation, state.attr.size));
        }
        let attr = self.namespace.getattr(ino)?;
        Ok((attr.generation, attr.size))
    }

    /// `attr` with the size grown by this process's writes not yet reported.
    fn with_pending(&self, mut attr: Attr) -> Attr {
        if let Some(state) = self.inodes.lock().get(&attr.ino) {
            attr.size = attr.size.max(state.attr.size);
        }
        attr
    }

    /// The size of the file (with this process's writes).
    pub fn size(&self, file: &OpenFile) -> Outcome<u64> {
        Ok(self.state(file.ino)?.1)
    }

    pub fn read(&self, file: &OpenFile, offset: u64, buffer: &mut [u8]) -> Outcome<usize> {
        if file.directory {
            return Err(Fail::Errno(libc::EISDIR));
        }
        if !file.readable() {
            return Err(Fail::Errno(libc::EBADF));
        }
        self.data_used.lock().insert(file.ino);
        let mut slot = self.data.slot(file.ino);
        let (generation, size) = self.state(file.ino)?;
        if offset >= size || buffer.is_empty() {
            return Ok(0);
        }
        let length = (buffer.len() as u64).min(size - offset) as usize;
        slot.read(file.ino, generation, offset, &mut buffer[..length], size)?;
        Ok(length)
    }

    pub fn write(&self, file: &OpenFile, offset: u64, data: &[u8]) -> Outcome<usize> {
        if !file.writable() {
            return Err(Fail::Errno(libc::EBADF));
        }
        if data.is_empty() {
            return Ok(0);
        }
        let end = offset.checked_add(data.len() as u64).ok_or(Fail::Errno(libc::EFBIG))?;
        if self.data.store_full() {
            return Err(Fail::Errno(libc::ENOSPC));
        }
        let ino = file.ino;
        self.data_used.lock().insert(ino);
        let mut slot = self.data.slot(ino);
        let (generation, _) = self.state(ino)?;
        slot.write(ino, generation, offset, data)?;
        drop(slot);
        let clears_set_id = {
            let mut inodes = self.inodes.lock();
            let state = inodes.get_mut(&ino).ok_or(Fail::Errno(libc::EBADF))?;
            state.attr.size = state.attr.size.max(end);
            let first = state.pending.is_none();
            state.pending = Some(state.pending.map_or(end, |e| e.max(end)));
            // A write clears suid/sgid at once (the mount's first-write report); without those
            // bits, mtime and size are reported together at close or fsync.
            first && state.attr.mode & 0o6000 != 0
        };
        if clears_set_id {
            let attr = self.namespace.wrote(&caller(), ino, 0)?;
            if let Some(state) = self.inodes.lock().get_mut(&ino) {
                state.attr.mode = attr.mode;
            }
        }
        Ok(data.len())
    }

    /// Reports this process's unreported writes of `ino` once the servers acknowledged them.
    fn push_pending(&self, ino: Ino) -> Outcome<()> {
        let _reporting = self.size_reports.lock();
        self.push_pending_locked(ino)
    }

    fn push_pending_locked(&self, ino: Ino) -> Outcome<()> {
        let Some(end) = self.inodes.lock().get_mut(&ino).and_then(|state| state.pending.take())
        else {
            return Ok(());
        };
        if self.data.slot(ino).settle().is_err() {
            self.withdraw_size(ino);
            return Ok(());
        }
        match self.namespace.wrote(&caller(), ino, end) {
            Ok(attr) => {
                if let Some(state) = self.inodes.lock().get_mut(&ino) {
                    state.attr = Attr { size: attr.size.max(state.attr.size), ..attr };
                }
                Ok(())
            }
            Err(e) if e.errno == libc::ENOENT => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// After a failed flush: the size this process's writes claimed is forgotten.
    fn withdraw_size(&self, ino: Ino) {
        let attr = self.namespace.getattr(ino);
        if let Some(state) = self.inodes.lock().get_mut(&ino) {
            state.pending = None;
            if let Ok(attr) = attr {
                state.attr = attr;
            }
        }
    }

    /// close(2) of one descriptor (every close reports, as FUSE's flush): the file's write
    /// failures, then its size. `last`: no descriptor of this process refers to the file any
    /// more.
    pub fn close(&self, file: &OpenFile, last: bool) -> Outcome<()> {
        if file.directory {
            return Ok(());
        }
        let ino = file.ino;
        let used = self.data_used.lock().contains(&ino);
        let flushed = if used { self.data.slot(ino).flush() } else { Ok(()) };
        let result = match flushed {
            Err(e) => {
                self.withdraw_size(ino);
                Err(Fail::from(e))
            }
            Ok(()) => self.push_pending(ino),
        };
        if last {
            let mut inodes = self.inodes.lock();
            let gone = inodes.get_mut(&ino).is_some_and(|state| {
                state.opens = state.opens.saturating_sub(1);
                state.opens == 0
            });
            if gone {
                inodes.remove(&ino);
                drop(inodes);
                if self.data_used.lock().remove(&ino) {
                    self.data.slot(ino).release(ino);
                }
            }
        }
        result
    }

    /// fsync(2): the file's writes acknowledged and made durable on the servers, its size and
    /// the namespace durable.
    pub fn fsync(&self, file: &OpenFile) -> Outcome<()> {
        if file.directory {
            // A directory's fsync (after a rename, say): its entries are in the journal.
            return Ok(self.namespace.sync()?);
        }
        if let Err(e) = self.data.slot(file.ino).sync() {
            self.withdraw_size(file.ino);
            return Err(e.into());
        }
        self.push_pending(file.ino)?;
        Ok(self.namespace.sync()?)
    }

    /// The file's attributes now (with this process's writes).
    pub fn fstat(&self, file: &OpenFile) -> Outcome<Attr> {
        match self.namespace.getattr(file.ino) {
            Ok(attr) => {
                if let Some(state) = self.inodes.lock().get_mut(&file.ino) {
                    let size =
                        attr.size.max(if state.pending.is_some() { state.attr.size } else { 0 });
                    state.attr = Attr { size, ..attr.clone() };
                }
                Ok(self.with_pending(attr))
            }
            // Unlinked while open: what we saw last, with no links.
            Err(e) if e.errno == libc::ENOENT => match self.inodes.lock().get(&file.ino) {
                Some(state) => Ok(Attr { nlink: 0, ..state.attr.clone() }),
                None => Err(e.into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// ftruncate(2), as the mount's setattr of a size: the store never shrinks a file, so what
    /// it holds past a smaller size is overwritten with zeros.
    pub fn truncate(&self, file: &OpenFile, size: u64) -> Outcome<()> {
        if !file.writable() {
            return Err(Fail::Errno(libc::EINVAL));
        }
        let ino = file.ino;
        let reporting = self.size_reports.lock();
        self.push_pending_locked(ino)?;
        self.data_used.lock().insert(ino);
        let mut slot = self.data.slot(ino);
        let current = self.fstat(file)?;
        let shrinks = size < current.size;
        if shrinks {
            let _ = slot.settle(); // a failure stays pinned for close/fsync
        }
        let set = SetAttr { size: Some(size), via_writable_handle: true, ..SetAttr::default() };
        let attr = match self.namespace.setattr(&caller(), ino, &set) {
            Ok(attr) => attr,
            // ftruncate of an open file whose last name is gone: only this process sees it.
            Err(e) if e.errno == libc::ENOENT && current.nlink == 0 => {
                Attr { size, ..current.clone() }
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(state) = self.inodes.lock().get_mut(&ino) {
            state.attr = attr.clone();
        }
        drop(reporting);
        if shrinks && attr.generation == current.generation {
            slot.zero_fill(ino, current.generation, size, u64::MAX)?;
        }
        Ok(())
    }

    /// fallocate(2), as the mount's: mode 0 and KEEP_SIZE reserve nothing (the store allocates
    /// at write) and only grow the size without KEEP_SIZE; PUNCH_HOLE|KEEP_SIZE and ZERO_RANGE
    /// make the range read as zeros by overwriting what the store holds there. Others:
    /// EOPNOTSUPP.
    pub fn allocate(&self, file: &OpenFile, mode: i32, offset: u64, length: u64) -> Outcome<()> {
        if !file.writable() {
            return Err(Fail::Errno(libc::EBADF));
        }
        let end = offset.checked_add(length).ok_or(Fail::Errno(libc::EFBIG))?;
        let zeroes = fallocate_zeroes(mode).ok_or(Fail::Errno(libc::EOPNOTSUPP))?;
        let ino = file.ino;
        if zeroes {
            let reporting = self.size_reports.lock();
            self.push_pending_locked(ino)?;
            self.data_used.lock().insert(ino);
            let mut slot = self.data.slot(ino);
            let (generation, size) = self.state(ino)?;
            slot.zero_fill(ino, generation, offset, end.min(size))?;
            drop(slot);
            drop(reporting);
            match self.namespace.wrote(&caller(), ino, 0) {
                Err(e) if e.errno != libc::ENOENT => return Err(e.into()),
                _ => {}
            }
        }
        if mode & libc::FALLOC_FL_KEEP_SIZE != 0 || end <= self.size(file)? {
            return Ok(());
        }
        self.truncate(file, end)
    }

    /// fchmod, fchown, futimens.
    pub fn set_attributes(&self, file: &OpenFile, set: &SetAttr) -> Outcome<()> {
        self.push_pending(file.ino)?;
        let attr = self.namespace.setattr(&caller(), file.ino, set)?;
        if let Some(state) = self.inodes.lock().get_mut(&file.ino) {
            state.attr = Attr { size: state.attr.size.max(attr.size), ..attr };
        }
        Ok(())
    }

    pub fn unlink(&self, path: &[u8], directory: bool) -> Outcome<()> {
        self.on_path(path, |c, at| {
            if directory {
                self.namespace.rmdir(c, at.parent, &at.name)?;
            } else {
                self.namespace.unlink(c, at.parent, &at.name)?;
            }
            Ok(())
        })
    }

    pub fn mkdir(&self, path: &[u8], mode: u32) -> Outcome<()> {
        self.on_path(path, |c, at| {
            let attr =
                self.namespace.mkdir(c, at.parent, &at.name, mode & 0o7777, crate::umask())?;
            self.dirs.lock().put(at.parent, &at.name, attr.ino);
            Ok(())
        })
    }

    pub fn rename(&self, from: &[u8], to: &[u8], flags: u32) -> Outcome<()> {
        let c = caller();
        let source = self.resolve(&c, from)?;
        let target = self.resolve(&c, to)?;
        self.namespace.rename(
            &c,
            source.parent,
            &source.name,
            target.parent,
            &target.name,
            flags,
        )?;
        // A renamed directory's cached entries would lead the old path to it.
        self.dirs.lock().entries.clear();
        Ok(())
    }

    pub fn access(&self, path: &[u8], mask: i32) -> Outcome<()> {
        let attr = self.stat_path(path, true)?;
        if mask == libc::F_OK {
            return Ok(());
        }
        Ok(self.namespace.access(&caller(), attr.ino, mask)?)
    }

    /// Every open file's writes sent and sizes reported: before exec, fork and exit, since the
    /// writes live in this process's memory.
    pub fn flush_everything(&self) {
        let _ = self.data.flush_all();
        let inodes: Vec<Ino> = self.inodes.lock().keys().copied().collect();
        for ino in inodes {
            let _ = self.push_pending(ino);
        }
    }
}

fn prepend(queue: &mut VecDeque<Vec<u8>>, front: VecDeque<Vec<u8>>) {
    for component in front.into_iter().rev() {
        queue.push_front(component);
    }
}

/// Attributes standing in for a cached directory the namespace no longer answers for (the walk
/// then fails at the next step and is redone without the cache).
fn placeholder(ino: Ino) -> Attr {
    let zero = Timestamp::new(0, 0);
    Attr {
        ino,
        kind: FileKind::Directory,
        mode: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        size: 0,
        rdev: 0,
        atime: zero,
        mtime: zero,
        ctime: zero,
        generation: 0,
    }
}

/// `futimens` times as the namespace takes them.
pub fn time_set(time: &libc::timespec) -> Option<TimeSet> {
    match time.tv_nsec {
        libc::UTIME_OMIT => None,
        libc::UTIME_NOW => Some(TimeSet::Now),
        nanos => Some(TimeSet::At(Timestamp::new(time.tv_sec, nanos as u32))),
    }
}
