//! The FUSE file system: kernel requests turned into namespace operations (metadata) and store
//! reads and writes (data).
//!
//! Every metadata request goes to the [`Namespace`] with the caller's identity, and the
//! namespace decides permissions and errno (`default_permissions` is off: one place holds the
//! POSIX rules, the same for every mount and for the native API, including sticky directories
//! and suid/sgid clearing). Data requests go to the [`DataPlane`] slot of the inode.
//!
//! Caching (docs/design/mount.md): the kernel page cache is used without `keep_cache`, so every
//! open drops the file's cached pages (write-only handles bypass it); no writeback cache; entry
//! and attribute TTLs are [`MountConfig::attr_ttl`], and what other users change is dropped from
//! the kernel before their change returns ([`crate::cache`]); negative entries are never
//! cached. Together: close-to-open consistency between mounts: a close (FUSE flush) waits for
//! the file's writes to be acknowledged by the servers and reports its size to the namespace
//! (which returns once every other mount dropped the file's attributes), and an open on another
//! mount gets the current size and reads from the store.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use spillway_namespace::{
    Attr, Caller, FileKind, Ino, MetaError, Namespace, SetAttr, TimeSet, Timestamp,
};

use crate::cache::CacheTracker;
use crate::data::{DataError, DataPlane};
use crate::identity;

/// Largest write the kernel sends in one request (and the stripe unit), in bytes.
pub const MAX_WRITE_BYTES: u32 = 1 << 20;
/// Entry and attribute TTL of a mount unless told otherwise. Invalidations keep caches
/// consistent; the TTL bounds staleness only while the mount cannot hear from its namespace
/// server (a broken or restarting connection), and past a few seconds a longer one saves
/// almost nothing (one lookup per name in use per TTL).
pub const ATTR_TTL_DEFAULT: Duration = Duration::from_secs(5);

/// Directory entries asked from the namespace per readdir request.
const READDIR_ENTRIES_MAX: u32 = 256;

/// Settings of one mount.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// FUSE session threads, each reading requests from its own cloned `/dev/fuse` fd.
    pub threads: usize,
    /// How long the kernel may cache attributes and directory entries ([`ATTR_TTL_DEFAULT`]).
    /// Changes other users make are dropped from the cache before they return (with
    /// `watch_changes`), so the TTL only bounds staleness while the mount cannot hear from the
    /// namespace server. 0: nothing cached, every lookup and stat asks the namespace.
    pub attr_ttl: Duration,
    /// Subscribe to the namespace's changes and drop them from the kernel's cache. Only tests
    /// turn it off, to show what a TTL alone would leave stale.
    pub watch_changes: bool,
    /// Open file handles allowed at once (beyond: ENFILE).
    pub open_files_max: usize,
    /// Let users other than the mounting one (root) use the mount (`allow_other`).
    pub allow_other: bool,
    /// Shown as the source in /proc/mounts.
    pub fs_name: String,
    /// Honour device nodes (`dev`). Off (`nodev`) by default: a user who may create a device
    /// node elsewhere, or a root-made node staged in, must not open hardware through the mount.
    /// An admin's choice, never a user's.
    pub devices: bool,
    /// Report the mount's write phases to the data scheduler (crate::phases); `None`: not.
    pub phases: Option<crate::phases::PhaseReporting>,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            threads: 4,
            attr_ttl: ATTR_TTL_DEFAULT,
            watch_changes: true,
            open_files_max: 65_536,
            allow_other: true,
            fs_name: "spillway".to_string(),
            devices: false,
            phases: None,
        }
    }
}

/// An open regular file.
struct OpenFile {
    ino: Ino,
    writable: bool,
}

/// What the mount remembers of an open inode: its attributes as last returned by the namespace
/// (generation and size above all). An open file whose last name is removed keeps working on
/// these (the namespace answers ENOENT for it then, POSIX wants the file usable until closed).
struct InodeState {
    attr: Attr,
    opens: u32,
    /// A data write of this mount was already reported to the namespace (`wrote`: mtime,
    /// suid/sgid clearing); later writes only extend `pending`.
    reported: bool,
    /// End offset and caller of writes not yet reported to the namespace; reported at close,
    /// fsync, stat, truncate and open (see `push_pending`).
    pending: Option<(Caller, u64)>,
}

/// The FUSE file system over one namespace and one reservation's servers.
pub struct SpillwayFs {
    namespace: Arc<dyn Namespace>,
    data: DataPlane,
    config: MountConfig,
    open_files: Mutex<HashMap<u64, OpenFile>>,
    next_handle: AtomicU64,
    inodes: Mutex<HashMap<Ino, InodeState>>,
    /// Held across reporting an inode's pending size to the namespace (take and RPC), and by a
    /// truncate across its own report and the shrink: a report of earlier writes sent by
    /// another FUSE thread (an asynchronous release, say) must never land after the shrink and
    /// grow the file back to a size it no longer has.
    size_reports: Mutex<()>,
    /// The reporter of write phases, if the mount reports them; dropped at unmount.
    phases: Option<crate::phases::Phases>,
    /// What was handed to the kernel with a TTL (for a reset), shared with the invalidator.
    cache: Arc<CacheTracker>,
}

fn errno(e: &MetaError) -> Errno {
    Errno::from_i32(e.errno)
}

fn data_errno(e: &DataError) -> Errno {
    tracing::warn!(error = %e, "data operation failed");
    Errno::from_i32(e.errno())
}

fn system_time(t: Timestamp) -> SystemTime {
    if t.seconds >= 0 {
        UNIX_EPOCH + Duration::new(t.seconds as u64, t.nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.seconds.unsigned_abs())
            + Duration::from_nanos(t.nanos as u64)
    }
}

fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp::new(d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            if d.subsec_nanos() == 0 {
                Timestamp::new(-(d.as_secs() as i64), 0)
            } else {
                Timestamp::new(-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
            }
        }
    }
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

/// The kernel's view of an inode.
pub fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.size.div_ceil(512),
        atime: system_time(attr.atime),
        mtime: system_time(attr.mtime),
        ctime: system_time(attr.ctime),
        crtime: system_time(attr.ctime),
        kind: file_type(attr.kind),
        perm: (attr.mode & 0o7777) as u16,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: MAX_WRITE_BYTES,
        flags: 0,
    }
}

/// How the kernel should treat a new handle. Write-only handles (and O_DIRECT ones) bypass the
/// page cache: the kernel then copies the application's bytes straight into the FUSE request
/// instead of into cached pages first (one copy less on the streaming-write path), and nothing
/// is lost, since a write-only handle can neither read nor be mapped shared. Other handles use
/// the page cache (readahead, mmap), dropped at every open.
fn open_flags(flags: i32) -> FopenFlags {
    if flags & libc::O_ACCMODE == libc::O_WRONLY || flags & libc::O_DIRECT != 0 {
        FopenFlags::FOPEN_DIRECT_IO
    } else {
        FopenFlags::empty()
    }
}

fn caller(req: &Request) -> Caller {
    identity::caller(req.uid(), req.gid(), req.pid())
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(timestamp(t)),
    }
}

impl SpillwayFs {
    pub fn new(namespace: Arc<dyn Namespace>, data: DataPlane, config: MountConfig) -> SpillwayFs {
        SpillwayFs {
            namespace,
            data,
            config,
            open_files: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            inodes: Mutex::new(HashMap::new()),
            size_reports: Mutex::new(()),
            phases: None,
            cache: Arc::new(CacheTracker::default()),
        }
    }

    /// The tracker of what this file system hands the kernel to cache.
    pub(crate) fn cache(&self) -> Arc<CacheTracker> {
        self.cache.clone()
    }

    /// Reports this mount's write phases through `phases`.
    pub(crate) fn with_phases(mut self, phases: Option<crate::phases::Phases>) -> SpillwayFs {
        self.phases = phases;
        self
    }

    fn ttl(&self) -> Duration {
        self.config.attr_ttl
    }

    /// Refreshes what we know of an open inode from attributes the namespace returned.
    fn observe(&self, attr: &Attr) {
        if let Some(state) = self.inodes.lock().get_mut(&attr.ino) {
            state.attr = attr.clone();
            // Writes not yet reported count for this mount.
            if let Some((_, end)) = &state.pending {
                state.attr.size = state.attr.size.max(*end);
            }
        }
    }

    /// Replies with the entry `parent/name` → `attr`, asked of the namespace since `mark`.
    fn reply_entry(
        &self,
        reply: ReplyEntry,
        mark: u64,
        parent: INodeNo,
        name: &OsStr,
        attr: &Attr,
    ) {
        self.observe(attr);
        let attr = self.with_pending(attr.clone());
        let ttl = self.cache.entry_ttl(mark, self.ttl(), parent.0, name.as_bytes(), attr.ino);
        reply.entry(&ttl, &file_attr(&attr), Generation(0));
    }

    /// Replies with the attributes of `attr`'s inode, asked of the namespace since `mark`.
    fn reply_attr(&self, reply: ReplyAttr, mark: u64, attr: &Attr) {
        let ttl = self.cache.attr_ttl(mark, self.ttl(), attr.ino);
        reply.attr(&ttl, &file_attr(attr));
    }

    /// `attr` with the size grown by writes of this mount not yet reported to the namespace.
    fn with_pending(&self, mut attr: Attr) -> Attr {
        if let Some(state) = self.inodes.lock().get(&attr.ino) {
            if let Some((_, end)) = &state.pending {
                attr.size = attr.size.max(*end);
            }
        }
        attr
    }

    /// Reports writes of this mount that the namespace has not seen yet (size, mtime), once the
    /// inode's data slot has them acknowledged. The size of an open inode's writes is reported
    /// lazily, here: at close, fsync, stat, truncate and open, which is what close-to-open
    /// needs and saves one metadata round trip per write.
    fn push_pending(&self, ino: Ino) -> Result<(), Errno> {
        let _reporting = self.size_reports.lock();
        self.push_pending_locked(ino)
    }

    /// [`push_pending`](Self::push_pending) for a caller that holds `size_reports`.
    fn push_pending_locked(&self, ino: Ino) -> Result<(), Errno> {
        let Some((caller, end)) =
            self.inodes.lock().get_mut(&ino).and_then(|state| state.pending.take())
        else {
            return Ok(());
        };
        // The size may claim only bytes the servers hold: the file's writes first. A failure
        // stays for the file's close or fsync to report; the size is just not claimed.
        if let Err(e) = self.data.slot(ino).settle() {
            tracing::debug!(ino, error = %e, "size of unstored writes withdrawn");
            self.withdraw_size(ino);
            return Ok(());
        }
        match self.namespace.wrote(&caller, ino, end) {
            Ok(attr) => {
                self.observe(&attr);
                Ok(())
            }
            // Unlinked meanwhile: nobody else can see the size any more.
            Err(e) if e.errno == libc::ENOENT => Ok(()),
            Err(e) => Err(errno(&e)),
        }
    }

    /// After a failed flush: forgets the size this mount's unreported writes claimed, so the
    /// file does not grow over bytes the servers may have refused (they would read as zeros).
    fn withdraw_size(&self, ino: Ino) {
        if let Some(state) = self.inodes.lock().get_mut(&ino) {
            state.pending = None;
        }
        match self.namespace.getattr(ino) {
            Ok(attr) => self.observe(&attr),
            Err(e) => tracing::warn!(ino, error = %e, "re-reading a size after a failed write"),
        }
    }

    /// Registers an open handle of `attr`'s inode.
    fn open_handle(&self, attr: &Attr, writable: bool) -> Result<u64, Errno> {
        let mut files = self.open_files.lock();
        if files.len() >= self.config.open_files_max {
            return Err(Errno::ENFILE);
        }
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        files.insert(handle, OpenFile { ino: attr.ino, writable });
        let mut inodes = self.inodes.lock();
        let state = inodes.entry(attr.ino).or_insert(InodeState {
            attr: attr.clone(),
            opens: 0,
            reported: false,
            pending: None,
        });
        state.attr = attr.clone();
        state.opens += 1;
        Ok(handle)
    }

    /// The current generation and size of an inode (from the open state, else the namespace).
    fn state(&self, ino: Ino) -> Result<(u64, u64), Errno> {
        if let Some(state) = self.inodes.lock().get(&ino) {
            return Ok((state.attr.generation, state.attr.size));
        }
        let attr = self.namespace.getattr(ino).map_err(|e| errno(&e))?;
        Ok((attr.generation, attr.size))
    }

    /// The namespace's attributes of `ino`, or, for an open file whose last link is gone
    /// (ENOENT), the last ones seen with a link count of 0.
    fn current_attr(&self, ino: Ino) -> Result<Attr, Errno> {
        match self.namespace.getattr(ino) {
            Ok(attr) => {
                self.observe(&attr);
                Ok(self.with_pending(attr))
            }
            Err(e) if e.errno == libc::ENOENT => match self.inodes.lock().get_mut(&ino) {
                Some(state) => {
                    state.attr.nlink = 0;
                    Ok(state.attr.clone())
                }
                None => Err(errno(&e)),
            },
            Err(e) => Err(errno(&e)),
        }
    }

    fn do_write(&self, req: &Request, ino: Ino, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        if self.data.store_full() {
            return Err(Errno::ENOSPC);
        }
        let caller = caller(req);
        let _writing = self.data.writing();
        let mut slot = self.data.slot(ino);
        // A gap left past EOF already reads as zeros: a shrinking truncate zeroed what the
        // store held past the new size (do_setattr). Zeroing the gap here instead would
        // overwrite what writers on other mounts put there before their size reached the
        // namespace (an N-1 checkpoint from several nodes lost blocks that way).
        let (generation, _) = self.state(ino)?;
        slot.write(ino, generation, offset, data).map_err(|e| data_errno(&e))?;
        if let Some(phases) = &self.phases {
            phases.wrote(data.len() as u64);
        }
        // The size grows only once the bytes are acknowledged (push_pending flushes first);
        // the first write of an open file reports the rest (mtime, suid clearing) at once.
        let first = {
            let mut inodes = self.inodes.lock();
            match inodes.get_mut(&ino) {
                Some(state) => {
                    state.attr.size = state.attr.size.max(end);
                    let pending_end = state.pending.as_ref().map_or(end, |(_, e)| end.max(*e));
                    state.pending = Some((caller.clone(), pending_end));
                    !state.reported
                }
                None => true,
            }
        };
        if !first {
            return Ok(());
        }
        let tracked = self.inodes.lock().contains_key(&ino);
        // An inode this mount does not track (no open handle) has nowhere to keep a pending
        // size: it reports the end at once, as before.
        match self.namespace.wrote(&caller, ino, if tracked { 0 } else { end }) {
            Ok(attr) => {
                self.observe(&attr);
                if let Some(state) = self.inodes.lock().get_mut(&ino) {
                    state.reported = true;
                }
            }
            // Unlinked while open: the bytes still count for this mount's open handles.
            Err(e) if e.errno == libc::ENOENT => match self.inodes.lock().get_mut(&ino) {
                Some(state) => state.attr.size = state.attr.size.max(end),
                None => return Err(errno(&e)),
            },
            Err(e) => return Err(errno(&e)),
        }
        Ok(())
    }

    fn do_setattr(&self, caller: &Caller, ino: Ino, set: &SetAttr) -> Result<Attr, Errno> {
        let Some(new_size) = set.size else {
            self.push_pending(ino)?;
            let attr = self.namespace.setattr(caller, ino, set).map_err(|e| errno(&e))?;
            self.observe(&attr);
            return Ok(attr);
        };
        let reporting = self.size_reports.lock();
        self.push_pending_locked(ino)?;
        // Truncate: hold the inode's data slot so no write of this mount interleaves.
        let mut slot = self.data.slot(ino);
        let current = self.current_attr(ino)?;
        let shrinks = current.kind == FileKind::Regular && new_size < current.size;
        if shrinks {
            // Writes of this mount still in flight must land before the size shrinks, or
            // they would sit past the new EOF and escape the zeroing below. A failure among
            // them stays pinned for the file's close or fsync (they will not land later).
            if let Err(e) = slot.settle() {
                tracing::debug!(ino, error = %e, "truncating over failed writes");
            }
        }
        let attr = match self.namespace.setattr(caller, ino, set) {
            Ok(attr) => {
                self.observe(&attr);
                attr
            }
            // ftruncate of an open file whose last link is gone: only this mount sees it.
            Err(e) if e.errno == libc::ENOENT && current.nlink == 0 => {
                let mut inodes = self.inodes.lock();
                let state = inodes.get_mut(&ino).ok_or_else(|| errno(&e))?;
                state.attr.size = new_size;
                state.attr.clone()
            }
            Err(e) => return Err(errno(&e)),
        };
        drop(reporting);
        // The store never shrinks a file: zero what it holds past the new size (bounded by its
        // high-water mark), so the file reads zeros there when it grows again. Truncating to 0
        // starts a new generation instead, which holds nothing.
        if shrinks && attr.generation == current.generation {
            slot.zero_fill(ino, current.generation, new_size, u64::MAX)
                .map_err(|e| data_errno(&e))?;
        }
        Ok(attr)
    }
}

/// The fallocate(2) modes the mount (and the preload library) serve: `Some(false)` for mode 0
/// and `FALLOC_FL_KEEP_SIZE` (nothing to reserve), `Some(true)` for `PUNCH_HOLE | KEEP_SIZE`
/// and `ZERO_RANGE` with or without `KEEP_SIZE` (the range must read as zeros); `None` for the
/// rest (collapse, insert, unshare, punch without keep-size: EOPNOTSUPP).
pub fn fallocate_zeroes(mode: i32) -> Option<bool> {
    const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
    const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
    const ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE;
    match mode {
        0 | KEEP_SIZE => Some(false),
        m if m == PUNCH_HOLE | KEEP_SIZE || m == ZERO_RANGE || m == ZERO_RANGE | KEEP_SIZE => {
            Some(true)
        }
        _ => None,
    }
}

impl SpillwayFs {
    /// fallocate(2): mode 0 and `FALLOC_FL_KEEP_SIZE` reserve nothing (the store allocates at
    /// write; a reservation's capacity is checked there) and only grow the size without
    /// KEEP_SIZE; `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE` and `FALLOC_FL_ZERO_RANGE` make the
    /// range read as zeros by overwriting what the store holds there (up to its high-water mark:
    /// beyond, it holds nothing). The store has no holes yet, so zeros over written bytes cost
    /// space until the epoch is drained or deleted. Collapse, insert and unshare: EOPNOTSUPP.
    fn do_fallocate(
        &self,
        caller: &Caller,
        ino: Ino,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        let Some(zeroes) = fallocate_zeroes(mode) else { return Err(Errno::EOPNOTSUPP) };
        if zeroes {
            let reporting = self.size_reports.lock();
            self.push_pending_locked(ino)?;
            // Held so no write of this mount interleaves between the size and the zeros.
            let mut slot = self.data.slot(ino);
            let (generation, size) = self.state(ino)?;
            slot.zero_fill(ino, generation, offset, end.min(size)).map_err(|e| data_errno(&e))?;
            drop(slot);
            drop(reporting);
            // A hole punched is a modification: mtime and ctime, as for a write (not for a
            // file whose last name is gone: nobody else can see it).
            match self.namespace.wrote(caller, ino, 0) {
                Ok(attr) => self.observe(&attr),
                Err(e) if e.errno == libc::ENOENT => {}
                Err(e) => return Err(errno(&e)),
            }
        }
        if mode & libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Ok(());
        }
        let (_, size) = self.state(ino)?;
        if end <= size {
            return Ok(());
        }
        let set = SetAttr { size: Some(end), via_writable_handle: true, ..SetAttr::default() };
        self.do_setattr(caller, ino, &set).map(|_| ())
    }
}

impl Filesystem for SpillwayFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(nearest) = config.set_max_write(MAX_WRITE_BYTES) {
            tracing::warn!(max_write_bytes = nearest, "kernel refused a 1 MiB max_write");
        }
        let _ = config.set_max_readahead(MAX_WRITE_BYTES);
        let _ = config.set_max_background(64);
        // O_TRUNC arrives with open (the namespace truncates atomically); the namespace clears
        // suid/sgid on write, chown and truncate; directory operations may run in parallel.
        for flag in [
            InitFlags::FUSE_ATOMIC_O_TRUNC,
            InitFlags::FUSE_HANDLE_KILLPRIV,
            InitFlags::FUSE_PARALLEL_DIROPS,
        ] {
            if config.add_capabilities(flag).is_err() {
                tracing::info!(?flag, "kernel does not offer FUSE capability");
            }
        }
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.data.flush_all() {
            tracing::error!(error = %e, "flushing writes at unmount failed");
        }
        // Ends the phase in progress and leaves the scheduler's active jobs.
        self.phases = None;
        if let Err(e) = self.namespace.sync() {
            tracing::error!(error = %e, "namespace sync at unmount failed");
        }
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mark = self.cache.mark();
        // An absent name is answered as an error, which the kernel does not cache: a create on
        // another mount needs no invalidation of names.
        match self.namespace.lookup(&caller(req), parent.0, name.as_bytes()) {
            Ok(attr) => self.reply_entry(reply, mark, parent, name, &attr),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let mark = self.cache.mark();
        if let Err(e) = self.push_pending(ino.0) {
            return reply.error(e);
        }
        match self.current_attr(ino.0) {
            Ok(attr) => self.reply_attr(reply, mark, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let via_writable_handle =
            fh.is_some_and(|fh| self.open_files.lock().get(&fh.0).is_some_and(|f| f.writable));
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            via_writable_handle,
        };
        let mark = self.cache.mark();
        match self.do_setattr(&caller(req), ino.0, &set) {
            Ok(attr) => self.reply_attr(reply, mark, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.namespace.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let kind = match FileKind::from_mode(mode) {
            Some(FileKind::Directory | FileKind::Symlink) | None => {
                return reply.error(Errno::EINVAL)
            }
            Some(kind) => kind,
        };
        let mark = self.cache.mark();
        match self.namespace.create(
            &caller(req),
            parent.0,
            name.as_bytes(),
            kind,
            mode & 0o7777,
            umask,
            rdev,
            true,
        ) {
            Ok(attr) => self.reply_entry(reply, mark, parent, name, &attr),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mark = self.cache.mark();
        match self.namespace.mkdir(&caller(req), parent.0, name.as_bytes(), mode & 0o7777, umask) {
            Ok(attr) => self.reply_entry(reply, mark, parent, name, &attr),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.namespace.unlink(&caller(req), parent.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.namespace.rmdir(&caller(req), parent.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let mark = self.cache.mark();
        match self.namespace.symlink(
            &caller(req),
            parent.0,
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
        ) {
            Ok(attr) => self.reply_entry(reply, mark, parent, link_name, &attr),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match self.namespace.rename(
            &caller(req),
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.bits(),
        ) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mark = self.cache.mark();
        match self.namespace.link(&caller(req), ino.0, newparent.0, newname.as_bytes()) {
            Ok(attr) => self.reply_entry(reply, mark, newparent, newname, &attr),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        // Another handle's unreported writes must not outlive an O_TRUNC of this open: report
        // them first, and (truncating) let no other report land between that and the open.
        let reporting = self.size_reports.lock();
        if let Err(e) = self.push_pending_locked(ino.0) {
            return reply.error(e);
        }
        let reporting = (flags.0 & libc::O_TRUNC != 0).then_some(reporting);
        let attr = match self.namespace.open(&caller(req), ino.0, flags.0) {
            Ok(attr) => attr,
            Err(e) => return reply.error(errno(&e)),
        };
        drop(reporting);
        // Close-to-open: resolve the store file afresh.
        self.data.slot(ino.0).forget(ino.0);
        let writable = flags.0 & libc::O_ACCMODE != libc::O_RDONLY;
        match self.open_handle(&attr, writable) {
            Ok(fh) => reply.opened(FileHandle(fh), open_flags(flags.0)),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut slot = self.data.slot(ino.0);
        let (generation, file_size) = match self.state(ino.0) {
            Ok(state) => state,
            Err(e) => return reply.error(e),
        };
        if offset >= file_size {
            return reply.data(&[]);
        }
        let length = (size as u64).min(file_size - offset) as usize;
        let mut reply = Some(reply);
        let deliver = |bytes: &[u8]| reply.take().expect("replied once").data(bytes);
        if let Err(e) = slot.read_with(ino.0, generation, offset, length, file_size, deliver) {
            reply.take().expect("not replied on failure").error(data_errno(&e));
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.do_write(req, ino.0, offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2): report any write failure of this file's pipeline, then the size.
        if let Err(e) = self.data.slot(ino.0).flush() {
            self.withdraw_size(ino.0);
            return reply.error(data_errno(&e));
        }
        match self.push_pending(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let ino = self.open_files.lock().remove(&fh.0).map_or(ino.0, |file| file.ino);
        if let Err(e) = self.push_pending(ino) {
            tracing::error!(ino, errno = ?e, "reporting the size of a closed file failed");
        }
        let last = {
            let mut inodes = self.inodes.lock();
            match inodes.get_mut(&ino) {
                Some(state) => {
                    state.opens = state.opens.saturating_sub(1);
                    let last = state.opens == 0;
                    if last {
                        inodes.remove(&ino);
                    }
                    last
                }
                None => true,
            }
        };
        if last {
            self.data.slot(ino).release(ino);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if let Err(e) = self.data.slot(ino.0).sync() {
            self.withdraw_size(ino.0);
            return reply.error(data_errno(&e));
        }
        if let Err(e) = self.push_pending(ino.0) {
            return reply.error(e);
        }
        match self.namespace.sync() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.namespace.getattr(ino.0) {
            Ok(attr) if attr.kind != FileKind::Directory => reply.error(Errno::ENOTDIR),
            Ok(_) => {
                match self.namespace.access(&caller(req), ino.0, spillway_namespace::ACCESS_READ) {
                    Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
                    Err(e) => reply.error(errno(&e)),
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let caller = caller(req);
        let mut after = offset;
        loop {
            let entries = match self.namespace.readdir(&caller, ino.0, after, READDIR_ENTRIES_MAX) {
                Ok(entries) => entries,
                Err(e) => return reply.error(errno(&e)),
            };
            if entries.is_empty() {
                return reply.ok();
            }
            for entry in entries {
                if reply.add(
                    INodeNo(entry.ino),
                    entry.cookie,
                    file_type(entry.kind),
                    OsStr::from_bytes(&entry.name),
                ) {
                    return reply.ok();
                }
                after = entry.cookie;
            }
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.namespace.sync() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // The namespace server knows the reservation and the files; the space is every
        // server's. If a server does not answer, its namespace server's own view will do.
        let stat = self.namespace.statfs().map(|stat| match self.data.store_capacity() {
            Ok(store) => stat.sized(store.total_bytes, store.free_bytes),
            Err(e) => {
                tracing::warn!(error = %e, "statfs shows the namespace server's space only");
                stat
            }
        });
        match stat {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_avail,
                s.files,
                s.files_free,
                s.block_bytes,
                s.name_bytes_max,
                s.block_bytes,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        // No extended attributes: an empty list.
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        match self.namespace.access(&caller(req), ino.0, mask.bits()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let caller = caller(req);
        let mark = self.cache.mark();
        let exclusive = flags & libc::O_EXCL != 0;
        // Create exclusively first: a file we just created may be opened in any mode by us; an
        // existing one (O_CREAT without O_EXCL) goes through the open permission check.
        let attr = match self.namespace.create(
            &caller,
            parent.0,
            name.as_bytes(),
            FileKind::Regular,
            mode & 0o7777,
            umask,
            0,
            true,
        ) {
            Ok(attr) => attr,
            Err(e) if e.errno == libc::EEXIST && !exclusive => {
                let existing = match self.namespace.lookup(&caller, parent.0, name.as_bytes()) {
                    Ok(attr) => attr,
                    Err(e) => return reply.error(errno(&e)),
                };
                // As in `open`: no size report lands between this one and an O_TRUNC.
                let reporting = self.size_reports.lock();
                if let Err(e) = self.push_pending_locked(existing.ino) {
                    return reply.error(e);
                }
                let _reporting = (flags & libc::O_TRUNC != 0).then_some(reporting);
                match self.namespace.open(&caller, existing.ino, flags) {
                    Ok(attr) => attr,
                    Err(e) => return reply.error(errno(&e)),
                }
            }
            Err(e) => return reply.error(errno(&e)),
        };
        self.data.slot(attr.ino).forget(attr.ino);
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let ttl = self.cache.entry_ttl(mark, self.ttl(), parent.0, name.as_bytes(), attr.ino);
        match self.open_handle(&attr, writable) {
            Ok(fh) => reply.created(
                &ttl,
                &file_attr(&attr),
                Generation(0),
                FileHandle(fh),
                open_flags(flags),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.do_fallocate(&caller(req), ino.0, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallocate_modes_served_and_refused() {
        use libc::{
            FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE, FALLOC_FL_KEEP_SIZE,
            FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE,
        };
        for (mode, served) in [
            (0, Some(false)),
            (FALLOC_FL_KEEP_SIZE, Some(false)),
            (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, Some(true)),
            (FALLOC_FL_ZERO_RANGE, Some(true)),
            (FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, Some(true)),
            (FALLOC_FL_PUNCH_HOLE, None),
            (FALLOC_FL_COLLAPSE_RANGE, None),
            (FALLOC_FL_INSERT_RANGE, None),
        ] {
            assert_eq!(fallocate_zeroes(mode), served, "mode {mode:#x}");
        }
    }

    #[test]
    fn timestamps_round_trip_through_system_time() {
        for t in [
            Timestamp::new(0, 0),
            Timestamp::new(1_700_000_000, 123_456_789),
            Timestamp::new(-5, 250_000_000),
        ] {
            assert_eq!(timestamp(system_time(t)), t);
        }
    }
}
