//! The namespaces this server holds (metadata service for the FUSE mount), and the handling of
//! namespace requests.
//!
//! A namespace lives on exactly one server. Namespaces are opened on demand (by a
//! `NamespaceOpen`, or by any request naming a namespace whose journal is on disk) and kept
//! open until the server stops or their data epoch is deleted; each persists as a journal under
//! `<store directory>/namespaces/` (see docs/design/namespace.md). Deleting an epoch
//! (`DeleteEpoch`: the manager does at a reservation's teardown) removes every namespace whose
//! data epoch it is, open or not, so namespaces do not outlive their reservations: neither
//! their journals on disk nor their slots among [`NAMESPACES_MAX`]. `statfs` reports the
//! capacity of the reservation whose grant covers the namespace's data epoch (and the sum of its
//! file sizes as used), or this server's store capacity when there is none.
//!
//! Caller trust: a request states the `Caller` it acts for. Only a root peer (the mount, whose
//! identity the kernel vouched for) is believed; a non-root peer's requests run as its own
//! uid/gid, with no supplementary groups, whatever it claims — like an NFS server trusting a
//! root-owned client. Non-root peers may also not claim a write handle for truncation, their
//! `Wrote` needs ownership or write permission, and they cannot create namespaces.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use spillway_meta::{
    Capacity, LocalNamespace, LocalOptions, NamespaceConfig, OpenError, StoreCapacity, SystemClock,
};
use spillway_namespace::{
    Caller, Change, DirEntry, Ino, MetaError, Namespace, NamespaceId, ROOT_INO,
};
use spillway_proto::{Identity, NamespaceRequest, NamespaceResponse, BODY_BYTES_MAX};
use spillway_types::EpochId;

use crate::backend::Backend;
use crate::namespace_watch::{SessionKey, WatchOptions, Watches};

/// Most namespaces one server holds open (each costs a file descriptor and its tree in memory).
pub const NAMESPACES_MAX: usize = 4096;

/// `statfs` figures from the store this server runs, and the reservation capacity the grant of
/// the namespace's data epoch carries (the manager puts the reservation's total there).
struct StoreCapacityProbe(Arc<dyn Backend>);

impl Capacity for StoreCapacityProbe {
    fn capacity(&self, data_epoch: EpochId) -> StoreCapacity {
        let usage = self.0.usage();
        let reservation_bytes = self
            .0
            .grant(data_epoch)
            .map(|grant| grant.reservation_capacity_bytes)
            .filter(|&bytes| bytes > 0);
        StoreCapacity {
            total_bytes: usage.ssd_bytes_max,
            free_bytes: usage.ssd_bytes_max.saturating_sub(usage.ssd_bytes_used),
            reservation_bytes,
        }
    }
}

/// Every namespace of this server.
pub struct NamespaceService {
    directory: PathBuf,
    capacity: Arc<dyn Capacity>,
    options: LocalOptions,
    open: Mutex<HashMap<NamespaceId, Arc<LocalNamespace>>>,
    /// The data epoch in the header of each journal on disk read so far by
    /// [`remove_for_epoch`](Self::remove_for_epoch) (a header never changes), so that deleting
    /// an epoch reads each journal's header once, not once per deletion. Locked only while
    /// `open` is held.
    journal_epochs: Mutex<HashMap<NamespaceId, EpochId>>,
    /// The latest [`REMOVED_REMEMBERED_MAX`] namespaces removed since the server started, with
    /// their data epoch: a request naming one (a mount still up after its reservation ended)
    /// is ESTALE saying why, and an `Open` with create does not bring it back empty. Locked only
    /// while `open` is held.
    removed: Mutex<RemovedNamespaces>,
    /// Changes and the mounts watching them (caching mounts' invalidations).
    watches: Watches,
}

/// What the server knows of the connection a namespace request came on.
pub struct NamespacePeer {
    /// The identity the kernel (or munge) established.
    pub identity: Identity,
    /// The change session this connection's `Hello` named (0: none).
    pub session: u64,
}

/// Most removed namespaces remembered (16 bytes each): a mount outliving its reservation by
/// more removals than this gets ENOENT instead of ESTALE.
pub const REMOVED_REMEMBERED_MAX: usize = 65_536;

/// Removed namespaces, oldest first, bounded by [`REMOVED_REMEMBERED_MAX`].
#[derive(Default)]
struct RemovedNamespaces {
    epochs: HashMap<NamespaceId, EpochId>,
    order: std::collections::VecDeque<NamespaceId>,
}

impl RemovedNamespaces {
    fn remember(&mut self, id: NamespaceId, epoch: EpochId) {
        if self.epochs.insert(id, epoch).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > REMOVED_REMEMBERED_MAX {
            let oldest = self.order.pop_front().expect("longer than the bound");
            self.epochs.remove(&oldest);
        }
    }
}

fn error(errno: i32, message: impl Into<String>) -> MetaError {
    MetaError::new(errno, message)
}

impl NamespaceService {
    /// A service keeping its journals in `directory` (created on first use), reporting the
    /// capacity of `backend`.
    pub fn new(
        directory: PathBuf,
        backend: Arc<dyn Backend>,
        options: LocalOptions,
        watch: WatchOptions,
    ) -> NamespaceService {
        NamespaceService {
            directory,
            capacity: Arc::new(StoreCapacityProbe(backend)),
            options,
            open: Mutex::new(HashMap::new()),
            journal_epochs: Mutex::new(HashMap::new()),
            removed: Mutex::new(RemovedNamespaces::default()),
            watches: Watches::new(watch),
        }
    }

    /// Opens (or creates) a namespace, returning it and whether it was created.
    pub fn open(
        &self,
        config: &NamespaceConfig,
        create: bool,
    ) -> Result<(Arc<LocalNamespace>, bool), MetaError> {
        let mut open = self.open.lock();
        if let Some(namespace) = open.get(&config.id) {
            return Ok((namespace.clone(), false));
        }
        if let Some(epoch) = self.removed.lock().epochs.get(&config.id) {
            let why = format!(
                "namespace {} was removed with its data epoch {epoch} (its reservation ended)",
                config.id
            );
            return Err(error(libc::ESTALE, why));
        }
        if open.len() >= NAMESPACES_MAX {
            return Err(error(
                libc::EMFILE,
                format!("this server holds its maximum of {NAMESPACES_MAX} namespaces"),
            ));
        }
        let opened = LocalNamespace::open(
            &self.directory,
            config,
            create,
            Arc::new(SystemClock),
            self.capacity.clone(),
            self.options.clone(),
        );
        let (namespace, created, recovery) = opened.map_err(|failure| match failure {
            OpenError::NotFound { .. } => error(libc::ENOENT, failure.to_string()),
            OpenError::Journal(ref journal) if journal.is_no_space() => {
                error(libc::ENOSPC, failure.to_string())
            }
            other => error(libc::EIO, other.to_string()),
        })?;
        if recovery.torn_bytes_cut > 0 {
            tracing::warn!(
                namespace = config.id,
                bytes = recovery.torn_bytes_cut,
                records = recovery.records,
                "namespace journal: cut a torn tail"
            );
        }
        tracing::info!(namespace = config.id, created, data_epoch = %namespace.data_epoch(), "namespace open");
        let namespace = Arc::new(namespace);
        open.insert(config.id, namespace.clone());
        Ok((namespace, created))
    }

    /// The namespace `id`, opened from its journal if needed (ENOENT if it has none).
    pub fn get(&self, id: NamespaceId) -> Result<Arc<LocalNamespace>, MetaError> {
        if let Some(namespace) = self.open.lock().get(&id) {
            return Ok(namespace.clone());
        }
        let config = NamespaceConfig {
            id,
            data_epoch: Default::default(),
            root_uid: 0,
            root_gid: 0,
            root_mode: 0o755,
        };
        self.open(&config, false).map(|(namespace, _)| namespace)
    }

    /// Removes every namespace whose data epoch is `epoch` (just deleted), open or only on
    /// disk: an open one is retired (its holders get ESTALE for changes) and its journal
    /// deleted; a journal not open is read for its header only. Returns the ids removed;
    /// failures are logged and leave that journal for the next deletion of the epoch.
    pub fn remove_for_epoch(&self, epoch: EpochId) -> Vec<NamespaceId> {
        // Held throughout: no open of a journal being deleted.
        let mut open = self.open.lock();
        let mut removed = Vec::new();
        let mut remembered = self.removed.lock();
        let of_epoch: Vec<NamespaceId> =
            open.iter().filter(|(_, ns)| ns.data_epoch() == epoch).map(|(&id, _)| id).collect();
        for id in of_epoch {
            let namespace = open.remove(&id).expect("listed just above");
            match namespace.remove_journal(&self.directory) {
                Ok(()) => removed.push(id),
                Err(failure) => {
                    tracing::error!(namespace = id, %epoch, %failure, "cannot delete the journal of a removed namespace")
                }
            }
        }
        let mut journal_epochs = self.journal_epochs.lock();
        let Ok(entries) = std::fs::read_dir(&self.directory) else { return removed };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let id = name
                .to_str()
                .and_then(|n| n.strip_prefix("namespace-")?.strip_suffix(".journal")?.parse().ok());
            let Some(id) = id.filter(|id: &NamespaceId| !open.contains_key(id)) else { continue };
            let path = entry.path();
            let data_epoch = match journal_epochs.get(&id) {
                Some(&data_epoch) => data_epoch,
                None => match spillway_meta::journal::Journal::read_header(&path) {
                    Ok(header) if header.namespace == id => {
                        journal_epochs.insert(id, header.data_epoch);
                        header.data_epoch
                    }
                    Ok(_) | Err(_) => {
                        tracing::warn!(path = %path.display(), "namespace journal with an unreadable or foreign header: left alone");
                        continue;
                    }
                },
            };
            if data_epoch != epoch {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    journal_epochs.remove(&id);
                    removed.push(id);
                }
                Err(failure) => {
                    tracing::error!(namespace = id, %epoch, %failure, "cannot delete the journal of a removed namespace")
                }
            }
        }
        for &id in &removed {
            remembered.remember(id, epoch);
            self.watches.forget(id);
        }
        removed
    }

    /// Makes every open namespace durable (graceful shutdown). Returns the first failure.
    pub fn sync_all(&self) -> Result<(), MetaError> {
        let namespaces: Vec<_> = self.open.lock().values().cloned().collect();
        let mut first = Ok(());
        for namespace in namespaces {
            if let Err(failure) = namespace.sync() {
                tracing::error!(namespace = namespace.id(), %failure, "namespace sync failed");
                if first.is_ok() {
                    first = Err(failure);
                }
            }
        }
        first
    }

    /// Runs one request for a peer with this kernel-established identity.
    pub fn handle(&self, peer: &NamespacePeer, mut request: NamespaceRequest) -> NamespaceResponse {
        let identity = peer.identity;
        let trusted = identity.uid == 0;
        if !trusted {
            if let Some(caller) = request.caller_mut() {
                *caller = Caller {
                    uid: identity.uid,
                    gid: identity.gid,
                    groups: Vec::new(),
                    pid: caller.pid,
                };
            }
            if let NamespaceRequest::SetAttr { set, .. } = &mut request {
                set.via_writable_handle = false;
            }
        }
        let session = peer.session;
        let origin = (session != 0).then_some(SessionKey { uid: identity.uid, session });
        match self.run(identity, trusted, origin, request) {
            Ok(response) => response,
            Err(failure) => {
                NamespaceResponse::Error { errno: failure.errno, message: failure.message }
            }
        }
    }

    fn run(
        &self,
        identity: Identity,
        trusted: bool,
        origin: Option<SessionKey>,
        request: NamespaceRequest,
    ) -> Result<NamespaceResponse, MetaError> {
        use NamespaceRequest as R;
        if let R::Open { namespace, create, data_epoch, root_uid, root_gid, root_mode } = request {
            let config =
                NamespaceConfig { id: namespace, data_epoch, root_uid, root_gid, root_mode };
            return self.open_for_peer(identity, trusted, &config, create);
        }
        let ns = self.get(request.namespace())?;
        if let R::Watch { namespace, session, since } = request {
            if session == 0 {
                return Err(error(libc::EINVAL, "a watch session must not be 0"));
            }
            let key = SessionKey { uid: identity.uid, session };
            return match self.watches.poll(namespace, key, trusted, since) {
                Ok(changes) => Ok(NamespaceResponse::Changes(changes)),
                Err(refused) => Err(error(refused.errno(), refused.to_string())),
            };
        }
        let namespace = ns.id();
        let changes = changes_of(&ns, &request);
        // A new name needs no mount's acknowledgement (see `Watches::announce`); every other
        // change is answered once the other mounts dropped what they cached of it.
        let adds_a_name = matches!(request, R::Create { .. } | R::Mkdir { .. } | R::Symlink { .. });
        let response = self.apply(&ns, identity, trusted, request)?;
        if adds_a_name {
            self.watches.announce(namespace, origin, changes);
        } else {
            self.watches.publish(namespace, origin, changes);
        }
        Ok(response)
    }

    /// Runs a request on namespace `ns` (neither `Open` nor a watch).
    fn apply(
        &self,
        ns: &LocalNamespace,
        identity: Identity,
        trusted: bool,
        request: NamespaceRequest,
    ) -> Result<NamespaceResponse, MetaError> {
        use NamespaceRequest as R;
        use NamespaceResponse as A;
        Ok(match request {
            R::Open { .. } | R::Watch { .. } => unreachable!("handled by run"),
            R::Sync { .. } => {
                ns.sync()?;
                A::Done
            }
            R::Manifest { from_index, .. } => manifest_page(ns, identity, trusted, from_index)?,
            R::Lookup { caller, parent, name, .. } => A::Attr(ns.lookup(&caller, parent, &name)?),
            R::GetAttr { ino, .. } => A::Attr(ns.getattr(ino)?),
            R::SetAttr { caller, ino, set, .. } => A::Attr(ns.setattr(&caller, ino, &set)?),
            R::Create { caller, parent, name, kind, mode, umask, rdev, exclusive, .. } => {
                A::Attr(ns.create(&caller, parent, &name, kind, mode, umask, rdev, exclusive)?)
            }
            R::Mkdir { caller, parent, name, mode, umask, .. } => {
                A::Attr(ns.mkdir(&caller, parent, &name, mode, umask)?)
            }
            R::Symlink { caller, parent, name, target, .. } => {
                A::Attr(ns.symlink(&caller, parent, &name, &target)?)
            }
            R::Readlink { ino, .. } => A::Target(ns.readlink(ino)?),
            R::Link { caller, ino, new_parent, new_name, .. } => {
                A::Attr(ns.link(&caller, ino, new_parent, &new_name)?)
            }
            R::Unlink { caller, parent, name, .. } => {
                ns.unlink(&caller, parent, &name)?;
                A::Done
            }
            R::Rmdir { caller, parent, name, .. } => {
                ns.rmdir(&caller, parent, &name)?;
                A::Done
            }
            R::Rename { caller, parent, name, new_parent, new_name, flags, .. } => {
                ns.rename(&caller, parent, &name, new_parent, &new_name, flags)?;
                A::Done
            }
            R::Readdir { caller, dir, after_cookie, entries_max, .. } => {
                A::Entries(readdir_page(ns, &caller, dir, after_cookie, entries_max)?)
            }
            R::OpenInode { caller, ino, flags, .. } => A::Attr(ns.open(&caller, ino, flags)?),
            R::Access { caller, ino, mask, .. } => {
                ns.access(&caller, ino, mask)?;
                A::Done
            }
            R::Wrote { caller, ino, end_offset, .. } => {
                if !trusted {
                    check_may_write(ns, &caller, ino)?;
                }
                A::Attr(ns.wrote(&caller, ino, end_offset)?)
            }
            R::Statfs { .. } => A::Stat(ns.statfs()?),
        })
    }

    /// `Open` for a peer: opens (or creates) the namespace; says whether it was created.
    fn open_for_peer(
        &self,
        identity: Identity,
        trusted: bool,
        config: &NamespaceConfig,
        create: bool,
    ) -> Result<NamespaceResponse, MetaError> {
        let namespace = config.id;
        // Only root (the mount, the manager) creates namespaces: a user must not squat an
        // id a job's mount will use. Anyone may open an existing one.
        if create && !trusted && self.get(namespace).is_err() {
            return Err(error(
                libc::EPERM,
                format!(
                    "only root creates namespaces (namespace {namespace}, peer uid {})",
                    identity.uid
                ),
            ));
        }
        let (ns, created) = self.open(config, create)?;
        Ok(NamespaceResponse::Opened { namespace, data_epoch: ns.data_epoch(), created })
    }
}

/// What a request will change, as caches must drop it (computed before it runs: an unlinked
/// name no longer tells its inode). Requests that change nothing: none. A name created is
/// only its directory's change: no mount caches a name as absent.
fn changes_of(ns: &LocalNamespace, request: &NamespaceRequest) -> Vec<Change> {
    use NamespaceRequest as R;
    let child = |parent: Ino, name: &[u8]| ns.lookup(&Caller::root(), parent, name).ok();
    let entry = |parent: Ino, name: &[u8]| Change::Entry { parent, name: name.to_vec() };
    match request {
        R::SetAttr { ino, .. } | R::Wrote { ino, .. } => vec![Change::Inode(*ino)],
        R::OpenInode { ino, flags, .. } if flags & libc::O_TRUNC != 0 => {
            vec![Change::Inode(*ino)]
        }
        R::Create { parent, .. } | R::Mkdir { parent, .. } | R::Symlink { parent, .. } => {
            vec![Change::Inode(*parent)]
        }
        R::Link { ino, new_parent, .. } => vec![Change::Inode(*ino), Change::Inode(*new_parent)],
        R::Unlink { parent, name, .. } | R::Rmdir { parent, name, .. } => {
            let mut changes = vec![entry(*parent, name), Change::Inode(*parent)];
            changes.extend(child(*parent, name).map(|attr| Change::Inode(attr.ino)));
            changes
        }
        R::Rename { parent, name, new_parent, new_name, .. } => {
            let mut changes =
                vec![entry(*parent, name), entry(*new_parent, new_name), Change::Inode(*parent)];
            if new_parent != parent {
                changes.push(Change::Inode(*new_parent));
            }
            for (dir, name) in [(*parent, name), (*new_parent, new_name)] {
                changes.extend(child(dir, name).map(|attr| Change::Inode(attr.ino)));
            }
            changes
        }
        _ => Vec::new(),
    }
}

/// `Manifest`: for root or the owner, the entries from `from_index` that fit in one body.
fn manifest_page(
    ns: &LocalNamespace,
    identity: Identity,
    trusted: bool,
    from_index: u64,
) -> Result<NamespaceResponse, MetaError> {
    let root = ns.getattr(ROOT_INO)?;
    if !trusted && identity.uid != root.uid {
        return Err(error(
            libc::EACCES,
            format!(
                "the manifest of namespace {} is for root or its owner (uid {})",
                ns.id(),
                root.uid
            ),
        ));
    }
    let mut bytes = 4usize;
    let page = ns
        .manifest()?
        .into_iter()
        .skip(from_index.min(usize::MAX as u64) as usize)
        .take_while(|entry| {
            bytes += NamespaceResponse::manifest_entry_bytes(entry);
            bytes <= BODY_BYTES_MAX as usize
        })
        .collect();
    Ok(NamespaceResponse::Manifest(page))
}

/// `Readdir`: the directory's entries after `after_cookie` that fit in one body.
fn readdir_page(
    ns: &LocalNamespace,
    caller: &Caller,
    dir: Ino,
    after_cookie: u64,
    entries_max: u32,
) -> Result<Vec<DirEntry>, MetaError> {
    let mut bytes = 4usize;
    Ok(ns
        .readdir(caller, dir, after_cookie, entries_max)?
        .into_iter()
        .take_while(|entry| {
            bytes += NamespaceResponse::dir_entry_bytes(entry);
            bytes <= BODY_BYTES_MAX as usize
        })
        .collect())
}

/// A non-root peer's `Wrote` needs ownership of the inode or write permission on it.
fn check_may_write(ns: &LocalNamespace, caller: &Caller, ino: Ino) -> Result<(), MetaError> {
    let attr = ns.getattr(ino)?;
    if attr.uid != caller.uid {
        ns.access(caller, ino, spillway_namespace::ACCESS_WRITE)?;
    }
    Ok(())
}
