//! `LocalNamespace`: the namespace state machine, in process, with its journal.
//!
//! Every operation runs under one mutex: *plan* (read the [`State`], check the POSIX rules in
//! [`crate::permission`], compute [`Mutation`]s), *journal* (one record, one `write`), *apply*.
//! A failed journal write leaves the in-memory state untouched and marks the namespace broken:
//! later operations fail with EIO naming the journal, until the server restarts and recovers.
//! One mutex is the simplest thing that is obviously atomic; metadata operations take
//! microseconds, and `private` namespaces (one per compute node) are how metadata scales.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use spillway_types::EpochId;

use crate::clock::Clock;
use crate::journal::{Journal, JournalError, JournalHeader, JournalIo, PosixJournalIo, Recovery};
use crate::permission::{self, MAY_EXECUTE, MAY_READ, MAY_WRITE};
use crate::state::{Inode, Mutation, State};
use spillway_namespace::*;

/// Total and free bytes of the store that holds the namespace's data, and the capacity of the
/// reservation it belongs to if known (for `statfs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreCapacity {
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// The reservation's capacity when the namespace's data epoch is granted one: `statfs` then
    /// reports it as the size and the sum of the namespace's file sizes as the usage.
    pub reservation_bytes: Option<u64>,
}

/// Where `statfs` gets the capacity from (the server passes its store and the grant of the
/// namespace's data epoch; tests a fixed figure).
pub trait Capacity: Send + Sync {
    fn capacity(&self, data_epoch: EpochId) -> StoreCapacity;
}

/// A capacity that never changes.
#[derive(Clone, Copy, Debug, Default)]
pub struct FixedCapacity(pub StoreCapacity);

impl Capacity for FixedCapacity {
    fn capacity(&self, _data_epoch: EpochId) -> StoreCapacity {
        self.0
    }
}

/// Limits and checks of a [`LocalNamespace`].
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// Most inodes the namespace holds (ENOSPC beyond): bounds its memory, about 200 bytes each.
    pub inodes_max: u64,
    /// Check every invariant after every operation (O(inodes); tests and `strict` runs).
    pub check_invariants: bool,
    /// The journal is compacted into a snapshot at `sync` once it is this long and 4× the size
    /// of the last snapshot.
    pub compact_journal_bytes_min: u64,
    /// Most entries one `readdir` returns, whatever the caller asks.
    pub readdir_entries_max: u32,
    /// The journal's writes and syncs (tests inject faults with `FaultyJournalIo`).
    pub journal_io: Arc<dyn JournalIo>,
    /// Largest file size: a truncate or a recorded write past it is EFBIG. The server passes
    /// the store's `store.file_bytes_max`, so a namespace never names a size its store refuses.
    pub file_bytes_max: u64,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            inodes_max: 4_000_000,
            check_invariants: false,
            compact_journal_bytes_min: 16 << 20,
            readdir_entries_max: 4096,
            journal_io: Arc::new(PosixJournalIo),
            file_bytes_max: 1 << 44,
        }
    }
}

/// How a new namespace is set up (ignored, except the id, when the namespace exists).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceConfig {
    pub id: NamespaceId,
    pub data_epoch: EpochId,
    pub root_uid: u32,
    pub root_gid: u32,
    /// Permission bits of the root directory.
    pub root_mode: u32,
}

/// Why a namespace could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("namespace {id}: no journal at {path} (and create was not asked)")]
    NotFound { id: NamespaceId, path: PathBuf },
    #[error("namespace journal {path} belongs to namespace {found}, not {id}")]
    WrongNamespace { id: NamespaceId, found: NamespaceId, path: PathBuf },
    #[error("cannot create namespace directory {path}: {source}")]
    Directory { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Journal(#[from] JournalError),
}

struct Inner {
    state: State,
    journal: Option<Journal>,
    /// Set after a failed journal write: the reason, returned as EIO from then on.
    broken: Option<String>,
    /// Journal length right after the last compaction (or open).
    journal_bytes_at_snapshot: u64,
    /// Set by [`LocalNamespace::remove_journal`]: the namespace is gone with its data epoch.
    removed: bool,
}

/// The namespace state machine. See the module doc.
pub struct LocalNamespace {
    id: NamespaceId,
    data_epoch: EpochId,
    clock: Arc<dyn Clock>,
    capacity: Arc<dyn Capacity>,
    options: LocalOptions,
    inner: Mutex<Inner>,
}

/// The journal file of namespace `id` in `directory`.
pub fn journal_path(directory: &Path, id: NamespaceId) -> PathBuf {
    directory.join(format!("namespace-{id}.journal"))
}

fn root_mutations(config: &NamespaceConfig, now: Timestamp) -> Vec<Mutation> {
    let attr = Attr {
        ino: ROOT_INO,
        kind: FileKind::Directory,
        mode: config.root_mode & 0o7777,
        nlink: 2,
        uid: config.root_uid,
        gid: config.root_gid,
        size: 0,
        rdev: 0,
        atime: now,
        mtime: now,
        ctime: now,
        generation: 0,
    };
    vec![
        Mutation::NextIno(ROOT_INO + 1),
        Mutation::PutInode(Inode { attr, target: Vec::new(), parent: ROOT_INO }),
    ]
}

fn error(errno: i32, message: impl Into<String>) -> MetaError {
    MetaError::new(errno, message.into())
}

fn show(name: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(name))
}

/// Checks a name for a new entry: ENAMETOOLONG, EINVAL ('/' or NUL), ENOENT (empty).
fn check_name(name: &[u8]) -> Result<(), MetaError> {
    if name.is_empty() {
        return Err(error(libc::ENOENT, "empty name"));
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(error(
            libc::ENAMETOOLONG,
            format!("name of {} bytes exceeds NAME_MAX {NAME_BYTES_MAX}", name.len()),
        ));
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(error(libc::EINVAL, format!("name {} contains '/' or NUL", show(name))));
    }
    Ok(())
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// The pending changes of one operation: inodes changed (cloned on first touch), entry
/// mutations in order, inodes dropped, cookies handed out.
struct Plan<'a> {
    state: &'a State,
    now: Timestamp,
    next_ino: Option<Ino>,
    dirty: BTreeMap<Ino, Inode>,
    entries: Vec<Mutation>,
    drops: Vec<Ino>,
    cookies: BTreeMap<Ino, u64>,
}

impl<'a> Plan<'a> {
    fn new(state: &'a State, now: Timestamp) -> Plan<'a> {
        Plan {
            state,
            now,
            next_ino: None,
            dirty: BTreeMap::new(),
            entries: Vec::new(),
            drops: Vec::new(),
            cookies: BTreeMap::new(),
        }
    }

    /// The inode as changed so far in this plan.
    fn inode(&mut self, ino: Ino) -> &mut Inode {
        let state = self.state;
        self.dirty
            .entry(ino)
            .or_insert_with(|| state.inode(ino).expect("plan touches an existing inode").clone())
    }

    /// Marks a directory's contents changed (mtime and ctime).
    fn touch_directory(&mut self, ino: Ino) {
        let now = self.now;
        let inode = self.inode(ino);
        inode.attr.mtime = now;
        inode.attr.ctime = now;
    }

    fn cookie(&mut self, dir: Ino) -> u64 {
        let state = self.state;
        let next = self
            .cookies
            .entry(dir)
            .or_insert_with(|| state.directory(dir).expect("directory").next_cookie);
        let cookie = *next;
        *next += 1;
        cookie
    }

    fn put_entry(&mut self, dir: Ino, name: &[u8], ino: Ino) {
        let cookie = self.cookie(dir);
        self.entries.push(Mutation::PutEntry { dir, name: name.to_vec(), ino, cookie });
    }

    fn drop_entry(&mut self, dir: Ino, name: &[u8]) {
        self.entries.push(Mutation::DropEntry { dir, name: name.to_vec() });
    }

    /// A new inode number.
    fn allocate(&mut self) -> Ino {
        let ino = self.next_ino.unwrap_or(self.state.next_ino);
        self.next_ino = Some(ino + 1);
        ino
    }

    /// Removes one link of a non-directory (dropping it with the last) or drops an empty
    /// directory (whose entry the caller removes or replaces).
    fn unlink_inode(&mut self, ino: Ino) {
        let now = self.now;
        let inode = self.inode(ino);
        if inode.attr.kind == FileKind::Directory {
            self.drops.push(ino);
            return;
        }
        inode.attr.nlink -= 1;
        inode.attr.ctime = now;
        if inode.attr.nlink == 0 {
            self.drops.push(ino);
        }
    }

    fn into_mutations(self) -> Vec<Mutation> {
        let mut out =
            Vec::with_capacity(2 + self.dirty.len() + self.entries.len() + self.drops.len());
        if let Some(next) = self.next_ino {
            out.push(Mutation::NextIno(next));
        }
        for (ino, inode) in self.dirty {
            if !self.drops.contains(&ino) {
                out.push(Mutation::PutInode(inode));
            }
        }
        out.extend(self.entries);
        out.extend(self.drops.into_iter().map(Mutation::DropInode));
        out
    }
}

/// The attributes of `ino` as `stat` shows them (a directory's size is its entry count).
fn attr_of(state: &State, ino: Ino) -> Result<Attr, MetaError> {
    let inode = state.inode(ino).ok_or_else(|| error(libc::ENOENT, format!("no inode {ino}")))?;
    let mut attr = inode.attr.clone();
    if attr.kind == FileKind::Directory {
        attr.size = state.directory(ino).map(|d| d.by_name.len() as u64).unwrap_or(0);
    }
    Ok(attr)
}

/// The directory `ino`: ENOENT or ENOTDIR.
fn directory_attr(state: &State, ino: Ino) -> Result<Attr, MetaError> {
    let attr = attr_of(state, ino)?;
    if attr.kind != FileKind::Directory {
        return Err(error(libc::ENOTDIR, format!("inode {ino} is not a directory")));
    }
    Ok(attr)
}

/// Whether directory `ancestor` is `ino` or one of its ancestors.
fn is_ancestor_or_self(state: &State, ancestor: Ino, mut ino: Ino) -> bool {
    for _ in 0..=state.directories.len() {
        if ino == ancestor {
            return true;
        }
        if ino == ROOT_INO {
            return false;
        }
        ino = state.inode(ino).map(|i| i.parent).unwrap_or(ROOT_INO);
    }
    panic!("directory {ino} does not reach the root: cycle in the namespace");
}

/// A rename's operands, looked up and checked to exist: `parent`/`name` moves to
/// `new_parent`/`new_name`, replacing or (`exchange`) swapping with `target` if there is one.
struct ResolvedRename<'a> {
    parent: Ino,
    name: &'a [u8],
    new_parent: Ino,
    new_name: &'a [u8],
    source_dir: Attr,
    target_dir: Attr,
    source: Ino,
    source_attr: Attr,
    target: Option<Ino>,
    target_attr: Option<Attr>,
    source_is_dir: bool,
    target_is_dir: bool,
    exchange: bool,
}

impl<'a> ResolvedRename<'a> {
    /// Checks the flags, both directories and both names, and looks up the source and target.
    fn resolve(
        state: &State,
        c: &Caller,
        (parent, name): (Ino, &'a [u8]),
        (new_parent, new_name): (Ino, &'a [u8]),
        flags: u32,
    ) -> Result<ResolvedRename<'a>, MetaError> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags == RENAME_NOREPLACE | RENAME_EXCHANGE
        {
            return Err(error(libc::EINVAL, format!("rename flags {flags:#x}")));
        }
        let source_dir = directory_attr(state, parent)?;
        let target_dir = directory_attr(state, new_parent)?;
        if is_dot(name) || is_dot(new_name) {
            return Err(error(libc::EBUSY, "cannot rename . or .."));
        }
        check_name(name)?;
        check_name(new_name)?;
        permission::require(c, &source_dir, MAY_EXECUTE, "search")?;
        permission::require(c, &target_dir, MAY_EXECUTE, "search")?;
        let (source, _) = state.entry(parent, name).ok_or_else(|| {
            error(libc::ENOENT, format!("no {} in directory {parent}", show(name)))
        })?;
        let source_attr = attr_of(state, source)?;
        let target = state.entry(new_parent, new_name).map(|(ino, _)| ino);
        if flags & RENAME_EXCHANGE != 0 && target.is_none() {
            return Err(error(
                libc::ENOENT,
                format!("exchange: no {} in directory {new_parent}", show(new_name)),
            ));
        }
        if flags & RENAME_NOREPLACE != 0 && target.is_some() {
            return Err(error(
                libc::EEXIST,
                format!("{} exists in directory {new_parent}", show(new_name)),
            ));
        }
        let target_attr = target.map(|t| attr_of(state, t)).transpose()?;
        let source_is_dir = source_attr.kind == FileKind::Directory;
        let target_is_dir = target_attr.as_ref().is_some_and(|a| a.kind == FileKind::Directory);
        let exchange = flags & RENAME_EXCHANGE != 0;
        Ok(ResolvedRename {
            parent,
            name,
            new_parent,
            new_name,
            source_dir,
            target_dir,
            source,
            source_attr,
            target,
            target_attr,
            source_is_dir,
            target_is_dir,
            exchange,
        })
    }

    /// Checks the ancestry traps: no directory may end up inside its own subtree.
    fn check_ancestry(&self, state: &State) -> Result<(), MetaError> {
        let ResolvedRename {
            parent,
            name,
            new_parent,
            source,
            target,
            source_is_dir,
            target_is_dir,
            exchange,
            ..
        } = *self;
        if source_is_dir && parent != new_parent && is_ancestor_or_self(state, source, new_parent) {
            return Err(error(
                libc::EINVAL,
                format!("cannot move directory {source} into its own subtree"),
            ));
        }
        if let Some(target) = target.filter(|_| target_is_dir) {
            if parent != new_parent && is_ancestor_or_self(state, target, parent) {
                let errno = if exchange { libc::EINVAL } else { libc::ENOTEMPTY };
                return Err(error(
                    errno,
                    format!("directory {target} is an ancestor of {}", show(name)),
                ));
            }
        }
        Ok(())
    }

    /// Checks write and sticky-bit permission on the directories left, entered and replaced in.
    fn check_permissions(&self, c: &Caller) -> Result<(), MetaError> {
        let ResolvedRename { name, new_name, target, exchange, .. } = *self;
        let ResolvedRename { source_dir, target_dir, source_attr, target_attr, .. } = self;
        permission::require(c, source_dir, MAY_WRITE | MAY_EXECUTE, "rename from")?;
        permission::require_sticky(c, source_dir, source_attr, name)?;
        if target.is_none() || exchange {
            permission::require(c, target_dir, MAY_WRITE | MAY_EXECUTE, "rename into")?;
        }
        if let Some(target_attr) = target_attr {
            permission::require(c, target_dir, MAY_WRITE | MAY_EXECUTE, "rename over")?;
            permission::require_sticky(c, target_dir, target_attr, new_name)?;
        }
        Ok(())
    }

    /// Checks that a replaced target is a directory exactly when the source is one.
    fn check_kinds(&self) -> Result<(), MetaError> {
        let ResolvedRename { new_name, source_is_dir, target_is_dir, exchange, .. } = *self;
        if self.target_attr.is_some() && !exchange {
            if source_is_dir && !target_is_dir {
                return Err(error(
                    libc::ENOTDIR,
                    format!("cannot replace non-directory {} with a directory", show(new_name)),
                ));
            }
            if !source_is_dir && target_is_dir {
                return Err(error(
                    libc::EISDIR,
                    format!("cannot replace directory {} with a non-directory", show(new_name)),
                ));
            }
        }
        Ok(())
    }

    /// Checks write permission on each directory that moves to another parent.
    fn check_directory_moves(&self, c: &Caller) -> Result<(), MetaError> {
        let ResolvedRename { parent, new_parent, source_is_dir, target_is_dir, exchange, .. } =
            *self;
        if parent != new_parent {
            // Moving a directory rewrites its "..": that needs write permission on it.
            if source_is_dir {
                permission::require(
                    c,
                    &self.source_attr,
                    MAY_WRITE,
                    "moving a directory to another parent",
                )?;
            }
            if exchange && target_is_dir {
                permission::require(
                    c,
                    self.target_attr.as_ref().expect("target"),
                    MAY_WRITE,
                    "moving a directory to another parent",
                )?;
            }
        }
        Ok(())
    }

    /// Checks that a directory replaced (not exchanged) is empty.
    fn check_replaced_directory_is_empty(&self, state: &State) -> Result<(), MetaError> {
        let ResolvedRename { new_name, target_is_dir, exchange, .. } = *self;
        if let Some(target_attr) = self.target_attr.as_ref().filter(|_| !exchange && target_is_dir)
        {
            if state.directory(target_attr.ino).is_some_and(|d| !d.by_name.is_empty()) {
                return Err(error(
                    libc::ENOTEMPTY,
                    format!("directory {} is not empty", show(new_name)),
                ));
            }
        }
        Ok(())
    }

    /// Plans `RENAME_EXCHANGE`: the two names swap inodes, link counts and parents follow.
    fn plan_exchange(&self, plan: &mut Plan<'_>) {
        let ResolvedRename {
            parent,
            name,
            new_parent,
            new_name,
            source,
            target,
            source_is_dir,
            target_is_dir,
            ..
        } = *self;
        let now = plan.now;
        let target = target.expect("exchange target");
        plan.put_entry(parent, name, target);
        plan.put_entry(new_parent, new_name, source);
        if parent != new_parent {
            let delta = |gains: bool, loses: bool| gains as i64 - loses as i64;
            plan.inode(parent).attr.nlink =
                (self.source_dir.nlink as i64 + delta(target_is_dir, source_is_dir)) as u32;
            plan.inode(new_parent).attr.nlink =
                (self.target_dir.nlink as i64 + delta(source_is_dir, target_is_dir)) as u32;
            if source_is_dir {
                plan.inode(source).parent = new_parent;
            }
            if target_is_dir {
                plan.inode(target).parent = parent;
            }
        }
        plan.inode(target).attr.ctime = now;
    }

    /// Plans a plain rename: the name moves, unlinking any target it replaces.
    fn plan_move(&self, plan: &mut Plan<'_>) {
        let ResolvedRename {
            parent,
            name,
            new_parent,
            new_name,
            source,
            target,
            source_is_dir,
            target_is_dir,
            ..
        } = *self;
        plan.drop_entry(parent, name);
        plan.put_entry(new_parent, new_name, source);
        if let Some(target) = target {
            plan.unlink_inode(target);
            if target_is_dir {
                plan.inode(new_parent).attr.nlink -= 1;
            }
        }
        if source_is_dir && parent != new_parent {
            plan.inode(parent).attr.nlink -= 1;
            plan.inode(new_parent).attr.nlink += 1;
            plan.inode(source).parent = new_parent;
        }
    }
}

impl LocalNamespace {
    /// A namespace with no journal (lost when dropped): for tests and in-process use.
    pub fn in_memory(
        config: &NamespaceConfig,
        clock: Arc<dyn Clock>,
        capacity: Arc<dyn Capacity>,
        options: LocalOptions,
    ) -> LocalNamespace {
        let mut state = State::empty();
        for mutation in root_mutations(config, clock.now()) {
            state.apply(mutation).expect("root");
        }
        LocalNamespace::assemble(
            config.id,
            config.data_epoch,
            state,
            None,
            clock,
            capacity,
            options,
        )
    }

    /// Opens namespace `config.id` from its journal in `directory` (replaying it and cutting a
    /// torn tail), or creates it there if `create`. Returns whether it was created.
    pub fn open(
        directory: &Path,
        config: &NamespaceConfig,
        create: bool,
        clock: Arc<dyn Clock>,
        capacity: Arc<dyn Capacity>,
        options: LocalOptions,
    ) -> Result<(LocalNamespace, bool, Recovery), OpenError> {
        let path = journal_path(directory, config.id);
        if path.exists() {
            let (journal, state, recovery) = Journal::open(options.journal_io.clone(), &path)?;
            let header = journal.header();
            if header.namespace != config.id {
                return Err(OpenError::WrongNamespace {
                    id: config.id,
                    found: header.namespace,
                    path,
                });
            }
            if recovery.torn_bytes_cut > 0 {
                tracing_warn(&path, &recovery);
            }
            let namespace = LocalNamespace::assemble(
                config.id,
                header.data_epoch,
                state,
                Some(journal),
                clock,
                capacity,
                options,
            );
            return Ok((namespace, false, recovery));
        }
        if !create {
            return Err(OpenError::NotFound { id: config.id, path });
        }
        std::fs::create_dir_all(directory)
            .map_err(|source| OpenError::Directory { path: directory.to_path_buf(), source })?;
        let initial = root_mutations(config, clock.now());
        let header = JournalHeader { namespace: config.id, data_epoch: config.data_epoch };
        let journal = Journal::create(options.journal_io.clone(), &path, header, &initial)?;
        let mut state = State::empty();
        for mutation in initial {
            state.apply(mutation).expect("root");
        }
        let namespace = LocalNamespace::assemble(
            config.id,
            config.data_epoch,
            state,
            Some(journal),
            clock,
            capacity,
            options,
        );
        Ok((namespace, true, Recovery { records: 1, torn_bytes_cut: 0 }))
    }

    fn assemble(
        id: NamespaceId,
        data_epoch: EpochId,
        state: State,
        journal: Option<Journal>,
        clock: Arc<dyn Clock>,
        capacity: Arc<dyn Capacity>,
        options: LocalOptions,
    ) -> LocalNamespace {
        state
            .check()
            .unwrap_or_else(|violation| panic!("namespace {id} starts inconsistent: {violation}"));
        let journal_bytes_at_snapshot = journal.as_ref().map(|j| j.bytes()).unwrap_or(0);
        LocalNamespace {
            id,
            data_epoch,
            clock,
            capacity,
            options,
            inner: Mutex::new(Inner {
                state,
                journal,
                broken: None,
                journal_bytes_at_snapshot,
                removed: false,
            }),
        }
    }

    /// Number of inodes (for tests and status).
    pub fn inode_count(&self) -> u64 {
        self.inner.lock().state.inodes.len() as u64
    }

    /// Runs the invariant check now (tests).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.inner.lock().state.check()
    }

    /// Read-only access under the lock.
    fn read<T>(&self, f: impl FnOnce(&State) -> Result<T, MetaError>) -> Result<T, MetaError> {
        let inner = self.inner.lock();
        f(&inner.state)
    }

    /// Removes this namespace for good, because its data epoch was deleted: closes and deletes
    /// its journal (in `directory`) and refuses changes from then on (ESTALE). Under the lock,
    /// so no operation or compaction in flight on another thread can write the journal back.
    /// Whoever still holds the namespace reads what it held in memory.
    pub fn remove_journal(&self, directory: &Path) -> std::io::Result<()> {
        let mut inner = self.inner.lock();
        inner.removed = true;
        inner.journal = None;
        match std::fs::remove_file(journal_path(directory, self.id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn check_not_removed(&self, inner: &Inner) -> Result<(), MetaError> {
        if inner.removed {
            let message = format!(
                "namespace {} was removed with its data epoch {}",
                self.id, self.data_epoch
            );
            return Err(error(libc::ESTALE, message));
        }
        Ok(())
    }

    /// Plans, journals and applies one operation, then reports from the new state.
    fn mutate<T, R>(
        &self,
        plan: impl FnOnce(&State, Timestamp) -> Result<(Vec<Mutation>, T), MetaError>,
        report: impl FnOnce(&State, T) -> Result<R, MetaError>,
    ) -> Result<R, MetaError> {
        let mut inner = self.inner.lock();
        self.check_not_removed(&inner)?;
        if let Some(reason) = &inner.broken {
            return Err(error(
                libc::EIO,
                format!("namespace {} refuses changes after a journal failure: {reason}", self.id),
            ));
        }
        let now = self.clock.now();
        let (mutations, value) = plan(&inner.state, now)?;
        if !mutations.is_empty() {
            if let Some(journal) = inner.journal.as_mut() {
                if let Err(failure) = journal.append(&mutations) {
                    let reason = failure.to_string();
                    if failure.is_no_space() {
                        // Cut back: nothing of the operation is journaled or applied.
                        return Err(error(libc::ENOSPC, reason));
                    }
                    inner.broken = Some(reason.clone());
                    return Err(error(libc::EIO, reason));
                }
            }
            for mutation in mutations {
                if let Err(bug) = inner.state.apply(mutation.clone()) {
                    panic!(
                        "namespace {}: planned mutation {mutation:?} does not apply: {bug}",
                        self.id
                    );
                }
            }
            if self.options.check_invariants {
                if let Err(violation) = inner.state.check() {
                    panic!("namespace {}: invariant violated: {violation}", self.id);
                }
            }
            // Bound the journal even if nobody syncs: compact at twice the `sync` threshold.
            // A failure marks the namespace broken (reported by the next operation); this
            // operation is journaled and stands.
            let long = inner.journal.as_ref().is_some_and(|j| {
                j.bytes() >= 2 * self.options.compact_journal_bytes_min
                    && j.bytes() >= 8 * inner.journal_bytes_at_snapshot
            });
            if long {
                let _ = self.maybe_compact(&mut inner);
            }
        }
        report(&inner.state, value)
    }

    fn full(&self, state: &State) -> Result<(), MetaError> {
        if state.inodes.len() as u64 >= self.options.inodes_max {
            return Err(error(
                libc::ENOSPC,
                format!(
                    "namespace {} holds its maximum of {} inodes",
                    self.id, self.options.inodes_max
                ),
            ));
        }
        Ok(())
    }

    /// Shared part of create/mkdir/symlink: checks the parent and name, returns the parent attr,
    /// or the existing entry's inode.
    fn prepare_new(
        &self,
        state: &State,
        c: &Caller,
        parent: Ino,
        name: &[u8],
    ) -> Result<(Attr, Option<Ino>), MetaError> {
        let dir = directory_attr(state, parent)?;
        check_name(name)?;
        permission::require(c, &dir, MAY_EXECUTE, "search")?;
        if is_dot(name) {
            return Err(error(libc::EEXIST, format!("{} exists in every directory", show(name))));
        }
        if let Some((ino, _)) = state.entry(parent, name) {
            return Ok((dir, Some(ino)));
        }
        Ok((dir, None))
    }

    #[allow(clippy::too_many_arguments)]
    fn new_inode(
        &self,
        plan: &mut Plan<'_>,
        c: &Caller,
        dir: &Attr,
        kind: FileKind,
        mode: u32,
        rdev: u32,
        target: &[u8],
    ) -> Ino {
        let ino = plan.allocate();
        let (uid, gid, mode) = permission::new_inode_owner(c, dir, kind, mode);
        let now = plan.now;
        let attr = Attr {
            ino,
            kind,
            mode,
            nlink: if kind == FileKind::Directory { 2 } else { 1 },
            uid,
            gid,
            size: target.len() as u64,
            rdev: if matches!(kind, FileKind::CharDevice | FileKind::BlockDevice) {
                rdev
            } else {
                0
            },
            atime: now,
            mtime: now,
            ctime: now,
            generation: 0,
        };
        let parent = if kind == FileKind::Directory { dir.ino } else { 0 };
        plan.dirty.insert(ino, Inode { attr, target: target.to_vec(), parent });
        ino
    }

    /// The truncation part of setattr/open: size, generation, times, privilege bits.
    fn truncate(plan: &mut Plan<'_>, c: &Caller, ino: Ino, size: u64) {
        let now = plan.now;
        let inode = plan.inode(ino);
        if size == 0 {
            inode.attr.generation += 1;
        }
        inode.attr.size = size;
        inode.attr.mtime = now;
        inode.attr.ctime = now;
        inode.attr.mode = permission::mode_after_write(c, &inode.attr);
    }

    fn plan_rename(
        &self,
        state: &State,
        now: Timestamp,
        c: &Caller,
        (parent, name): (Ino, &[u8]),
        (new_parent, new_name): (Ino, &[u8]),
        flags: u32,
    ) -> Result<Vec<Mutation>, MetaError> {
        let rename =
            ResolvedRename::resolve(state, c, (parent, name), (new_parent, new_name), flags)?;
        // Linux's order: the ancestry traps first, then "same inode", then permissions, then
        // the kinds of source and target.
        rename.check_ancestry(state)?;
        if rename.target == Some(rename.source) {
            return Ok(Vec::new()); // two links of one inode: POSIX says do nothing
        }
        rename.check_permissions(c)?;
        rename.check_kinds()?;
        rename.check_directory_moves(c)?;
        rename.check_replaced_directory_is_empty(state)?;
        let mut plan = Plan::new(state, now);
        if rename.exchange {
            rename.plan_exchange(&mut plan);
        } else {
            rename.plan_move(&mut plan);
        }
        plan.inode(rename.source).attr.ctime = now;
        plan.touch_directory(parent);
        plan.touch_directory(new_parent);
        Ok(plan.into_mutations())
    }

    /// EFBIG when a file would end past `file_bytes_max` (and never past i64::MAX).
    fn check_file_size(&self, end: u64, what: &str) -> Result<(), MetaError> {
        let largest = self.options.file_bytes_max.min(i64::MAX as u64);
        if end > largest {
            return Err(error(
                libc::EFBIG,
                format!("{what} {end} is beyond the largest file ({largest} bytes)"),
            ));
        }
        Ok(())
    }

    fn plan_setattr(
        &self,
        state: &State,
        now: Timestamp,
        c: &Caller,
        ino: Ino,
        set: &SetAttr,
    ) -> Result<Vec<Mutation>, MetaError> {
        let original = attr_of(state, ino)?;
        let changes_anything = set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.size.is_some()
            || set.atime.is_some()
            || set.mtime.is_some();
        if !changes_anything {
            return Ok(Vec::new());
        }
        let mut plan = Plan::new(state, now);
        if set.uid.is_some() || set.gid.is_some() {
            permission::check_chown(c, &original, set.uid, set.gid)?;
            let inode = plan.inode(ino);
            inode.attr.uid = set.uid.unwrap_or(inode.attr.uid);
            inode.attr.gid = set.gid.unwrap_or(inode.attr.gid);
            inode.attr.mode = permission::mode_after_chown(&inode.attr);
        }
        if let Some(mode) = set.mode {
            let current = plan.inode(ino).attr.clone();
            // Permission against the owner before this call; group membership for sgid against
            // the group after it.
            let checked = Attr { uid: original.uid, ..current };
            plan.inode(ino).attr.mode = permission::chmod_mode(c, &checked, mode)?;
        }
        if let Some(size) = set.size {
            match original.kind {
                FileKind::Regular => {}
                FileKind::Directory => {
                    return Err(error(libc::EISDIR, format!("truncate of directory {ino}")))
                }
                other => {
                    return Err(error(libc::EINVAL, format!("truncate of {other:?} inode {ino}")))
                }
            }
            self.check_file_size(size, "size")?;
            if !set.via_writable_handle {
                permission::require(c, &original, MAY_WRITE, "truncate")?;
            }
            Self::truncate(&mut plan, c, ino, size);
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let explicit = matches!(set.atime, Some(TimeSet::At(_)))
                || matches!(set.mtime, Some(TimeSet::At(_)));
            permission::check_set_times(c, &original, explicit)?;
            let resolve = |t: TimeSet| match t {
                TimeSet::Now => now,
                TimeSet::At(at) => at,
            };
            for t in [set.atime, set.mtime].into_iter().flatten() {
                if let TimeSet::At(at) = t {
                    if at.nanos >= 1_000_000_000 {
                        return Err(error(
                            libc::EINVAL,
                            format!("nanoseconds {} out of range", at.nanos),
                        ));
                    }
                }
            }
            let inode = plan.inode(ino);
            if let Some(t) = set.atime {
                inode.attr.atime = resolve(t);
            }
            if let Some(t) = set.mtime {
                inode.attr.mtime = resolve(t);
            }
        }
        plan.inode(ino).attr.ctime = now;
        Ok(plan.into_mutations())
    }

    /// Compacts the journal if it has grown enough since the last snapshot.
    fn maybe_compact(&self, inner: &mut Inner) -> Result<(), MetaError> {
        let Some(journal) = inner.journal.as_mut() else { return Ok(()) };
        let grown = journal.bytes() >= self.options.compact_journal_bytes_min
            && journal.bytes() >= 4 * inner.journal_bytes_at_snapshot;
        if grown {
            match journal.compact(&inner.state) {
                Ok(()) => inner.journal_bytes_at_snapshot = journal.bytes(),
                // The journal is intact (the snapshot file was removed): compact later.
                Err(failure) if failure.is_no_space() => {}
                Err(failure) => {
                    let reason = failure.to_string();
                    inner.broken = Some(reason.clone());
                    return Err(error(libc::EIO, reason));
                }
            }
        }
        Ok(())
    }

    /// Rewrites the journal as a snapshot now (tests; the server compacts at `sync`).
    pub fn compact(&self) -> Result<(), MetaError> {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        if let Some(journal) = inner.journal.as_mut() {
            journal.compact(&inner.state).map_err(|e| {
                error(if e.is_no_space() { libc::ENOSPC } else { libc::EIO }, e.to_string())
            })?;
            inner.journal_bytes_at_snapshot = journal.bytes();
        }
        Ok(())
    }

    /// The journal's length in bytes (0 in memory).
    pub fn journal_bytes(&self) -> u64 {
        self.inner.lock().journal.as_ref().map(|j| j.bytes()).unwrap_or(0)
    }
}

fn tracing_warn(path: &Path, recovery: &Recovery) {
    // The crate has no logging dependency: recovery facts go to stderr once per open.
    eprintln!(
        "namespace journal {}: cut a torn tail of {} bytes after {} good records",
        path.display(),
        recovery.torn_bytes_cut,
        recovery.records
    );
}

impl Namespace for LocalNamespace {
    fn id(&self) -> NamespaceId {
        self.id
    }

    fn lookup(&self, c: &Caller, parent: Ino, name: &[u8]) -> Result<Attr, MetaError> {
        self.read(|state| {
            let dir = directory_attr(state, parent)?;
            if name.len() > NAME_BYTES_MAX {
                return Err(error(
                    libc::ENAMETOOLONG,
                    format!("name of {} bytes exceeds NAME_MAX {NAME_BYTES_MAX}", name.len()),
                ));
            }
            permission::require(c, &dir, MAY_EXECUTE, "search")?;
            match name {
                b"." => Ok(dir),
                b".." => attr_of(state, state.inode(parent).expect("directory").parent),
                _ => {
                    let (ino, _) = state.entry(parent, name).ok_or_else(|| {
                        error(libc::ENOENT, format!("no {} in directory {parent}", show(name)))
                    })?;
                    attr_of(state, ino)
                }
            }
        })
    }

    fn getattr(&self, ino: Ino) -> Result<Attr, MetaError> {
        self.read(|state| attr_of(state, ino))
    }

    fn setattr(&self, c: &Caller, ino: Ino, set: &SetAttr) -> Result<Attr, MetaError> {
        self.mutate(
            |state, now| Ok((self.plan_setattr(state, now, c, ino, set)?, ())),
            |state, ()| attr_of(state, ino),
        )
    }

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
    ) -> Result<Attr, MetaError> {
        self.mutate(
            |state, now| {
                if matches!(kind, FileKind::Directory | FileKind::Symlink) {
                    return Err(error(
                        libc::EINVAL,
                        format!("create of a {kind:?}: use mkdir or symlink"),
                    ));
                }
                let (dir, existing) = self.prepare_new(state, c, parent, name)?;
                if let Some(ino) = existing {
                    if exclusive {
                        return Err(error(
                            libc::EEXIST,
                            format!("{} exists in directory {parent}", show(name)),
                        ));
                    }
                    return Ok((Vec::new(), ino));
                }
                permission::require(c, &dir, MAY_WRITE | MAY_EXECUTE, "create in")?;
                if matches!(kind, FileKind::CharDevice | FileKind::BlockDevice) && !c.is_root() {
                    return Err(error(
                        libc::EPERM,
                        format!("mknod of a {kind:?} needs root (caller uid {})", c.uid),
                    ));
                }
                self.full(state)?;
                let mut plan = Plan::new(state, now);
                let ino = self.new_inode(&mut plan, c, &dir, kind, mode & !umask, rdev, &[]);
                plan.put_entry(parent, name, ino);
                plan.touch_directory(parent);
                Ok((plan.into_mutations(), ino))
            },
            attr_of,
        )
    }

    fn mkdir(
        &self,
        c: &Caller,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Attr, MetaError> {
        self.mutate(
            |state, now| {
                let (dir, existing) = self.prepare_new(state, c, parent, name)?;
                if existing.is_some() {
                    return Err(error(
                        libc::EEXIST,
                        format!("{} exists in directory {parent}", show(name)),
                    ));
                }
                permission::require(c, &dir, MAY_WRITE | MAY_EXECUTE, "mkdir in")?;
                if dir.nlink == u32::MAX {
                    return Err(error(
                        libc::EMLINK,
                        format!("directory {parent} has the most subdirectories possible"),
                    ));
                }
                self.full(state)?;
                let mut plan = Plan::new(state, now);
                let ino = self.new_inode(
                    &mut plan,
                    c,
                    &dir,
                    FileKind::Directory,
                    mode & !umask & 0o1777,
                    0,
                    &[],
                );
                plan.put_entry(parent, name, ino);
                plan.inode(parent).attr.nlink += 1;
                plan.touch_directory(parent);
                Ok((plan.into_mutations(), ino))
            },
            attr_of,
        )
    }

    fn symlink(
        &self,
        c: &Caller,
        parent: Ino,
        name: &[u8],
        target: &[u8],
    ) -> Result<Attr, MetaError> {
        self.mutate(
            |state, now| {
                let (dir, existing) = self.prepare_new(state, c, parent, name)?;
                if existing.is_some() {
                    return Err(error(
                        libc::EEXIST,
                        format!("{} exists in directory {parent}", show(name)),
                    ));
                }
                if target.is_empty() {
                    return Err(error(libc::ENOENT, "empty symlink target"));
                }
                if target.len() > SYMLINK_TARGET_BYTES_MAX || target.contains(&0) {
                    return Err(error(
                        libc::ENAMETOOLONG,
                        format!(
                            "symlink target of {} bytes (max {SYMLINK_TARGET_BYTES_MAX})",
                            target.len()
                        ),
                    ));
                }
                permission::require(c, &dir, MAY_WRITE | MAY_EXECUTE, "symlink in")?;
                self.full(state)?;
                let mut plan = Plan::new(state, now);
                let ino = self.new_inode(&mut plan, c, &dir, FileKind::Symlink, 0o777, 0, target);
                plan.put_entry(parent, name, ino);
                plan.touch_directory(parent);
                Ok((plan.into_mutations(), ino))
            },
            attr_of,
        )
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>, MetaError> {
        self.read(|state| {
            let inode =
                state.inode(ino).ok_or_else(|| error(libc::ENOENT, format!("no inode {ino}")))?;
            if inode.attr.kind != FileKind::Symlink {
                return Err(error(libc::EINVAL, format!("inode {ino} is not a symlink")));
            }
            Ok(inode.target.clone())
        })
    }

    fn link(
        &self,
        c: &Caller,
        ino: Ino,
        new_parent: Ino,
        new_name: &[u8],
    ) -> Result<Attr, MetaError> {
        self.mutate(
            |state, now| {
                let source = attr_of(state, ino)?;
                let (dir, existing) = self.prepare_new(state, c, new_parent, new_name)?;
                if source.kind == FileKind::Directory {
                    return Err(error(libc::EPERM, format!("hard link to directory {ino}")));
                }
                if existing.is_some() {
                    return Err(error(
                        libc::EEXIST,
                        format!("{} exists in directory {new_parent}", show(new_name)),
                    ));
                }
                permission::require(c, &dir, MAY_WRITE | MAY_EXECUTE, "link in")?;
                if source.nlink == u32::MAX {
                    return Err(error(
                        libc::EMLINK,
                        format!("inode {ino} has the most links possible"),
                    ));
                }
                let mut plan = Plan::new(state, now);
                let inode = plan.inode(ino);
                inode.attr.nlink += 1;
                inode.attr.ctime = now;
                plan.put_entry(new_parent, new_name, ino);
                plan.touch_directory(new_parent);
                Ok((plan.into_mutations(), ino))
            },
            attr_of,
        )
    }

    fn unlink(&self, c: &Caller, parent: Ino, name: &[u8]) -> Result<(), MetaError> {
        self.mutate(
            |state, now| {
                let dir = directory_attr(state, parent)?;
                permission::require(c, &dir, MAY_EXECUTE, "search")?;
                if is_dot(name) {
                    return Err(error(libc::EISDIR, format!("unlink of {}", show(name))));
                }
                check_name(name)?;
                let (ino, _) = state.entry(parent, name).ok_or_else(|| {
                    error(libc::ENOENT, format!("no {} in directory {parent}", show(name)))
                })?;
                let victim = attr_of(state, ino)?;
                permission::require(c, &dir, MAY_WRITE | MAY_EXECUTE, "unlink in")?;
                permission::require_sticky(c, &dir, &victim, name)?;
                if victim.kind == FileKind::Directory {
                    return Err(error(
                        libc::EISDIR,
                        format!("{} is a directory (use rmdir)", show(name)),
                    ));
                }
                let mut plan = Plan::new(state, now);
                plan.drop_entry(parent, name);
                plan.unlink_inode(ino);
                plan.touch_directory(parent);
                Ok((plan.into_mutations(), ()))
            },
            |_, ()| Ok(()),
        )
    }

    fn rmdir(&self, c: &Caller, parent: Ino, name: &[u8]) -> Result<(), MetaError> {
        self.mutate(
            |state, now| {
                let dir = directory_attr(state, parent)?;
                permission::require(c, &dir, MAY_EXECUTE, "search")?;
                match name {
                    b"." => return Err(error(libc::EINVAL, "rmdir of .")),
                    b".." => return Err(error(libc::ENOTEMPTY, "rmdir of ..")),
                    _ => check_name(name)?,
                }
                let (ino, _) = state.entry(parent, name).ok_or_else(|| {
                    error(libc::ENOENT, format!("no {} in directory {parent}", show(name)))
                })?;
                let victim = attr_of(state, ino)?;
                permission::require(c, &dir, MAY_WRITE | MAY_EXECUTE, "rmdir in")?;
                permission::require_sticky(c, &dir, &victim, name)?;
                if victim.kind != FileKind::Directory {
                    return Err(error(libc::ENOTDIR, format!("{} is not a directory", show(name))));
                }
                if victim.size > 0 {
                    return Err(error(
                        libc::ENOTEMPTY,
                        format!("directory {} holds {} entries", show(name), victim.size),
                    ));
                }
                let mut plan = Plan::new(state, now);
                plan.drop_entry(parent, name);
                plan.unlink_inode(ino);
                plan.inode(parent).attr.nlink -= 1;
                plan.touch_directory(parent);
                Ok((plan.into_mutations(), ()))
            },
            |_, ()| Ok(()),
        )
    }

    fn rename(
        &self,
        c: &Caller,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> Result<(), MetaError> {
        self.mutate(
            |state, now| {
                Ok((
                    self.plan_rename(state, now, c, (parent, name), (new_parent, new_name), flags)?,
                    (),
                ))
            },
            |_, ()| Ok(()),
        )
    }

    fn readdir(
        &self,
        c: &Caller,
        dir: Ino,
        after_cookie: u64,
        entries_max: u32,
    ) -> Result<Vec<DirEntry>, MetaError> {
        self.read(|state| {
            let attr = directory_attr(state, dir)?;
            permission::require(c, &attr, MAY_READ, "readdir")?;
            let entries_max = entries_max.min(self.options.readdir_entries_max) as usize;
            let mut out = Vec::with_capacity(entries_max.min(256));
            if after_cookie < 1 && out.len() < entries_max {
                out.push(DirEntry {
                    name: b".".to_vec(),
                    ino: dir,
                    kind: FileKind::Directory,
                    cookie: 1,
                });
            }
            if after_cookie < 2 && out.len() < entries_max {
                let parent = state.inode(dir).expect("directory").parent;
                out.push(DirEntry {
                    name: b"..".to_vec(),
                    ino: parent,
                    kind: FileKind::Directory,
                    cookie: 2,
                });
            }
            let directory = state.directory(dir).expect("directory");
            for (&cookie, name) in directory.by_cookie.range(after_cookie.max(2) + 1..) {
                if out.len() >= entries_max {
                    break;
                }
                let (ino, _) = directory.by_name[name];
                let kind = state.inode(ino).expect("entry names an inode").attr.kind;
                out.push(DirEntry { name: name.clone(), ino, kind, cookie });
            }
            Ok(out)
        })
    }

    fn open(&self, c: &Caller, ino: Ino, flags: i32) -> Result<Attr, MetaError> {
        self.mutate(
            |state, now| {
                let attr = attr_of(state, ino)?;
                let mask = match flags & libc::O_ACCMODE {
                    libc::O_RDONLY => MAY_READ,
                    libc::O_WRONLY => MAY_WRITE,
                    libc::O_RDWR => MAY_READ | MAY_WRITE,
                    other => return Err(error(libc::EINVAL, format!("open access mode {other}"))),
                };
                let truncate = flags & libc::O_TRUNC != 0;
                match attr.kind {
                    FileKind::Directory if mask & MAY_WRITE != 0 || truncate => {
                        return Err(error(
                            libc::EISDIR,
                            format!("inode {ino} is a directory: cannot open for writing"),
                        ))
                    }
                    FileKind::Symlink => {
                        return Err(error(libc::ELOOP, format!("inode {ino} is a symlink")))
                    }
                    _ => {}
                }
                let mask = if truncate { mask | MAY_WRITE } else { mask };
                permission::require(c, &attr, mask, "open")?;
                if !(truncate && attr.kind == FileKind::Regular) {
                    return Ok((Vec::new(), ()));
                }
                let mut plan = Plan::new(state, now);
                Self::truncate(&mut plan, c, ino, 0);
                Ok((plan.into_mutations(), ()))
            },
            |state, ()| attr_of(state, ino),
        )
    }

    fn access(&self, c: &Caller, ino: Ino, mask: i32) -> Result<(), MetaError> {
        self.read(|state| {
            let attr = attr_of(state, ino)?;
            if mask & !7 != 0 || mask < 0 {
                return Err(error(libc::EINVAL, format!("access mask {mask:#o}")));
            }
            permission::require(c, &attr, mask as u32, "access")
        })
    }

    fn wrote(&self, c: &Caller, ino: Ino, end_offset: u64) -> Result<Attr, MetaError> {
        self.mutate(
            |state, now| {
                let attr = attr_of(state, ino)?;
                if attr.kind != FileKind::Regular {
                    return Err(error(
                        libc::EINVAL,
                        format!("data write recorded on {:?} inode {ino}", attr.kind),
                    ));
                }
                self.check_file_size(end_offset, "write ending at")?;
                let mut plan = Plan::new(state, now);
                let inode = plan.inode(ino);
                inode.attr.size = inode.attr.size.max(end_offset);
                inode.attr.mtime = now;
                inode.attr.ctime = now;
                inode.attr.mode = permission::mode_after_write(c, &inode.attr);
                Ok((plan.into_mutations(), ()))
            },
            |state, ()| attr_of(state, ino),
        )
    }

    /// The store's size and free space; for a namespace whose data epoch is granted a
    /// reservation capacity, that capacity as the size and the sum of its regular files' sizes
    /// as the space used (free: the rest, at most what the store has free): [`FsStat::sized`].
    fn statfs(&self) -> Result<FsStat, MetaError> {
        let capacity = self.capacity.capacity(self.data_epoch);
        // Summing the files walks every inode: only a reservation-sized answer needs it, so a
        // `df` loop on a large namespace without one costs nothing.
        let file_bytes = match capacity.reservation_bytes {
            None => 0,
            Some(_) => self.read(|state| {
                Ok(state
                    .inodes
                    .values()
                    .filter(|inode| inode.attr.kind == FileKind::Regular)
                    .map(|inode| inode.attr.size)
                    .sum::<u64>())
            })?,
        };
        let inodes = self.inode_count();
        let stat = FsStat {
            files: self.options.inodes_max,
            files_free: self.options.inodes_max.saturating_sub(inodes),
            name_bytes_max: NAME_BYTES_MAX as u32,
            reservation_bytes: capacity.reservation_bytes.unwrap_or(0),
            file_bytes,
            ..FsStat::default()
        };
        Ok(stat.sized(capacity.total_bytes, capacity.free_bytes))
    }

    fn sync(&self) -> Result<(), MetaError> {
        let mut inner = self.inner.lock();
        self.check_not_removed(&inner)?;
        if let Some(reason) = &inner.broken {
            return Err(error(
                libc::EIO,
                format!("namespace {} cannot sync after a journal failure: {reason}", self.id),
            ));
        }
        if let Some(journal) = inner.journal.as_mut() {
            if let Err(failure) = journal.sync() {
                let reason = failure.to_string();
                inner.broken = Some(reason.clone());
                return Err(error(libc::EIO, reason));
            }
        }
        self.maybe_compact(&mut inner)
    }

    fn manifest(&self) -> Result<Vec<ManifestEntry>, MetaError> {
        self.read(|state| {
            let mut out = Vec::new();
            let mut seen = std::collections::HashSet::new();
            // Depth-first, entries in cookie order: deterministic, first link wins.
            let mut stack: Vec<(Ino, Vec<u8>)> = vec![(ROOT_INO, Vec::new())];
            while let Some((dir, prefix)) = stack.pop() {
                let directory = state.directory(dir).expect("directory on the stack");
                let mut subdirectories = Vec::new();
                for name in directory.by_cookie.values() {
                    let (ino, _) = directory.by_name[name];
                    let inode = state.inode(ino).expect("entry names an inode");
                    let mut path = prefix.clone();
                    if !path.is_empty() {
                        path.push(b'/');
                    }
                    path.extend_from_slice(name);
                    match inode.attr.kind {
                        FileKind::Directory => subdirectories.push((ino, path)),
                        FileKind::Regular if seen.insert(ino) => {
                            let a = &inode.attr;
                            out.push(ManifestEntry {
                                file_name: data_file_name(self.id, ino, a.generation),
                                path,
                                size: a.size,
                                mode: a.mode,
                                uid: a.uid,
                                gid: a.gid,
                                mtime: a.mtime,
                            });
                        }
                        _ => {}
                    }
                }
                stack.extend(subdirectories.into_iter().rev());
            }
            Ok(out)
        })
    }

    fn data_epoch(&self) -> EpochId {
        self.data_epoch
    }
}
