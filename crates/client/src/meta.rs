//! `RemoteNamespace`: the `Namespace` trait over the wire, to the server that holds the
//! namespace.
//!
//! One operation is one request and one reply (no pipelining: metadata operations depend on
//! each other, and latency is what matters). Threads of the mount share a small bounded pool of
//! connections, so independent operations do not queue behind each other. A failure of the
//! connection is EIO for that operation; the broken connection is dropped and the next
//! operation connects again (the server reopens the namespace from its journal if it
//! restarted). Operations that change nothing (lookup, getattr, readdir, readlink, access,
//! statfs) are retried once on a fresh connection, the others are not: a create whose reply was
//! lost may have happened.
//!
//! Every connection is bound to this handle's change session (a random number its `Hello`
//! names),
//! and [`Namespace::watch`] subscribes to the changes of other sessions on a connection of its
//! own: a caching mount drops what they changed (docs/design/mount.md, "Caching and the
//! visibility rule").

use std::sync::{Condvar, Mutex};

use spillway_namespace::{
    Attr, Caller, Changes, DirEntry, FileKind, FsStat, Ino, ManifestEntry, MetaError, Namespace,
    NamespaceId, SetAttr, Watch,
};
use spillway_proto::{Endpoint, NamespaceRequest, NamespaceResponse, Request, Response};
use spillway_types::EpochId;

use crate::connection::ServerConnection;
use crate::ClientError;

/// How to open (or create) a remote namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteOptions {
    /// Create the namespace if the server has none of this id.
    pub create: bool,
    /// The data epoch of a namespace created now (an existing one keeps its own).
    pub data_epoch: EpochId,
    /// Owner and permission bits of the root of a namespace created now (only root peers may
    /// create namespaces; others open existing ones).
    pub root_uid: u32,
    pub root_gid: u32,
    pub root_mode: u32,
    /// Most connections to the server at once (one per concurrent operation).
    pub connections_max: usize,
    /// The `munged` socket for credentials when the server requires munge authentication
    /// (`None`: libmunge's default). Defaults to `SPILLWAY_MUNGE_SOCKET` when set.
    pub munge_socket: Option<std::path::PathBuf>,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            create: true,
            data_epoch: EpochId(1),
            root_uid: 0,
            root_gid: 0,
            root_mode: 0o755,
            connections_max: 8,
            munge_socket: crate::munge_socket_from_env(),
        }
    }
}

struct Pool {
    idle: Vec<ServerConnection>,
    /// Connections in existence (idle + in use).
    open: usize,
}

/// A namespace on a burst buffer server.
pub struct RemoteNamespace {
    endpoint: Endpoint,
    id: NamespaceId,
    data_epoch: EpochId,
    connections_max: usize,
    munge_socket: Option<std::path::PathBuf>,
    /// This handle's change session (never 0): its changes are not sent to its own watcher.
    session: u64,
    pool: Mutex<Pool>,
    returned: Condvar,
}

/// A random session number (never 0); the time and pid if the kernel has no randomness.
fn new_session() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::getrandom(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        bytes = (nanos ^ (u64::from(std::process::id()) << 32)).to_le_bytes();
    }
    u64::from_le_bytes(bytes).max(1)
}

/// A failure that is not the namespace's answer: a protocol error keeps its errno from the
/// one table; a broken or refused connection is EIO (what a file system reports when its
/// backing store is unreachable), with the cause in the message.
fn transport(endpoint: &Endpoint, failure: ClientError) -> MetaError {
    let errno = match &failure {
        ClientError::Server { .. } => failure.errno(),
        _ => libc::EIO,
    };
    MetaError::new(errno, format!("namespace server {endpoint}: {failure}"))
}

impl RemoteNamespace {
    /// Connects to `endpoint` and opens namespace `id` there (creating it if asked).
    pub fn open(
        endpoint: &Endpoint,
        id: NamespaceId,
        options: &RemoteOptions,
    ) -> Result<RemoteNamespace, MetaError> {
        assert!(options.connections_max > 0);
        let mut this = RemoteNamespace {
            endpoint: endpoint.clone(),
            id,
            data_epoch: options.data_epoch,
            connections_max: options.connections_max,
            munge_socket: options.munge_socket.clone(),
            session: new_session(),
            pool: Mutex::new(Pool { idle: Vec::new(), open: 0 }),
            returned: Condvar::new(),
        };
        let request = NamespaceRequest::Open {
            namespace: id,
            create: options.create,
            data_epoch: options.data_epoch,
            root_uid: options.root_uid,
            root_gid: options.root_gid,
            root_mode: options.root_mode,
        };
        match this.call(request)? {
            NamespaceResponse::Opened { namespace, data_epoch, .. } if namespace == id => {
                this.data_epoch = data_epoch
            }
            other => return Err(this.unexpected("NamespaceOpened", &other)),
        }
        Ok(this)
    }

    /// [`open`](Self::open), but a namespace is created only when its data epoch holds none of
    /// its files (`ns/<id>/…`) on any server of `data`: otherwise its metadata was on a server
    /// that is gone (lost, or replaced by re-replication), and an empty namespace over those
    /// files would hide them from every mount and stage-out (EIO, naming them, instead).
    pub fn open_guarded(
        endpoint: &Endpoint,
        id: NamespaceId,
        options: &RemoteOptions,
        data: &mut crate::Client,
    ) -> Result<RemoteNamespace, MetaError> {
        if !options.create {
            return Self::open(endpoint, id, options);
        }
        let existing = RemoteOptions { create: false, ..options.clone() };
        match Self::open(endpoint, id, &existing) {
            Err(e) if e.errno == libc::ENOENT => {}
            other => return other,
        }
        let epoch = options.data_epoch;
        let files = match data.list_files(epoch) {
            Ok(files) => files,
            Err(e) if e.code() == Some(spillway_proto::ErrorCode::NoSuchEpoch) => Vec::new(),
            Err(e) => {
                let message = format!("listing epoch {epoch} before creating namespace {id}: {e}");
                return Err(MetaError::new(libc::EIO, message));
            }
        };
        let prefix = format!("ns/{id}/");
        let orphans: Vec<&String> =
            files.iter().map(|(name, _)| name).filter(|n| n.starts_with(&prefix)).collect();
        if let Some(first) = orphans.first() {
            return Err(MetaError::new(
                libc::EIO,
                format!(
                    "namespace {id} is not on {endpoint}, but its data epoch {epoch} holds {} of \
                     its files ({first}, …): its metadata was on a server that is gone (lost or \
                     replaced); refusing to create an empty namespace that would hide them. \
                     They stay in the burst buffer: a drain publishes them under the paths of \
                     the snapshot stage-out stored, if any, else under their store names",
                    orphans.len()
                ),
            ));
        }
        Self::open(endpoint, id, options)
    }

    /// The namespace's id.
    pub fn id(&self) -> NamespaceId {
        self.id
    }

    /// The server this namespace lives on.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    fn unexpected(&self, expected: &str, got: &NamespaceResponse) -> MetaError {
        MetaError::new(
            libc::EPROTO,
            format!(
                "namespace server {}: expected {expected}, got {:?}",
                self.endpoint,
                got.kind()
            ),
        )
    }

    fn take(&self) -> Result<ServerConnection, MetaError> {
        let mut pool = self.pool.lock().expect("namespace connection pool poisoned");
        loop {
            if let Some(connection) = pool.idle.pop() {
                return Ok(connection);
            }
            if pool.open < self.connections_max {
                pool.open += 1;
                drop(pool);
                return self.connect_bound().inspect_err(|_| self.give(None));
            }
            pool = self.returned.wait(pool).expect("namespace connection pool poisoned");
        }
    }

    /// A new connection, bound to this handle's change session (its `Hello` names it, so a
    /// transparent reconnect keeps the binding).
    fn connect_bound(&self) -> Result<ServerConnection, MetaError> {
        ServerConnection::connect_with_munge_socket(
            &self.endpoint,
            &spillway_proto::session_client_name("spillway-meta", self.session),
            1,
            self.munge_socket.as_deref(),
        )
        .map_err(|failure| transport(&self.endpoint, failure))
    }

    /// Returns a connection to the pool (`None`: it broke and is gone).
    fn give(&self, connection: Option<ServerConnection>) {
        let mut pool = self.pool.lock().expect("namespace connection pool poisoned");
        match connection {
            Some(connection) => pool.idle.push(connection),
            None => pool.open -= 1,
        }
        drop(pool);
        self.returned.notify_one();
    }

    /// One round trip. Namespace failures come back as the namespace's errno.
    fn call(&self, request: NamespaceRequest) -> Result<NamespaceResponse, MetaError> {
        let retry = matches!(
            request,
            NamespaceRequest::Lookup { .. }
                | NamespaceRequest::GetAttr { .. }
                | NamespaceRequest::Readdir { .. }
                | NamespaceRequest::Readlink { .. }
                | NamespaceRequest::Access { .. }
                | NamespaceRequest::Statfs { .. }
        );
        let request = Request::Namespace(request);
        for attempt in 0..2 {
            let mut connection = self.take()?;
            match connection.call(&request, &[], None) {
                Ok((Response::Namespace(NamespaceResponse::Error { errno, message }), ())) => {
                    self.give(Some(connection));
                    return Err(MetaError::new(errno, message));
                }
                Ok((Response::Namespace(response), ())) => {
                    self.give(Some(connection));
                    return Ok(response);
                }
                Ok((other, ())) => {
                    self.give(None);
                    return Err(MetaError::new(
                        libc::EPROTO,
                        format!(
                            "namespace server {}: unexpected {:?}",
                            self.endpoint,
                            other.kind()
                        ),
                    ));
                }
                Err(failure @ ClientError::Server { .. }) => {
                    // The server answered with a protocol error: the connection is still sound.
                    self.give(Some(connection));
                    return Err(transport(&self.endpoint, failure));
                }
                Err(failure) => {
                    self.give(None);
                    if !(retry && attempt == 0) {
                        return Err(transport(&self.endpoint, failure));
                    }
                }
            }
        }
        unreachable!("the second attempt returns")
    }

    fn attr(&self, request: NamespaceRequest) -> Result<Attr, MetaError> {
        match self.call(request)? {
            NamespaceResponse::Attr(attr) => Ok(attr),
            other => Err(self.unexpected("NsAttr", &other)),
        }
    }

    fn done(&self, request: NamespaceRequest) -> Result<(), MetaError> {
        match self.call(request)? {
            NamespaceResponse::Done => Ok(()),
            other => Err(self.unexpected("NsDone", &other)),
        }
    }
}

impl Namespace for RemoteNamespace {
    fn id(&self) -> NamespaceId {
        self.id
    }

    fn lookup(&self, c: &Caller, parent: Ino, name: &[u8]) -> Result<Attr, MetaError> {
        self.attr(NamespaceRequest::Lookup {
            namespace: self.id,
            caller: c.clone(),
            parent,
            name: name.to_vec(),
        })
    }

    fn getattr(&self, ino: Ino) -> Result<Attr, MetaError> {
        self.attr(NamespaceRequest::GetAttr { namespace: self.id, ino })
    }

    fn setattr(&self, c: &Caller, ino: Ino, set: &SetAttr) -> Result<Attr, MetaError> {
        self.attr(NamespaceRequest::SetAttr {
            namespace: self.id,
            caller: c.clone(),
            ino,
            set: set.clone(),
        })
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
        self.attr(NamespaceRequest::Create {
            namespace: self.id,
            caller: c.clone(),
            parent,
            name: name.to_vec(),
            kind,
            mode,
            umask,
            rdev,
            exclusive,
        })
    }

    fn mkdir(
        &self,
        c: &Caller,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Attr, MetaError> {
        self.attr(NamespaceRequest::Mkdir {
            namespace: self.id,
            caller: c.clone(),
            parent,
            name: name.to_vec(),
            mode,
            umask,
        })
    }

    fn symlink(
        &self,
        c: &Caller,
        parent: Ino,
        name: &[u8],
        target: &[u8],
    ) -> Result<Attr, MetaError> {
        self.attr(NamespaceRequest::Symlink {
            namespace: self.id,
            caller: c.clone(),
            parent,
            name: name.to_vec(),
            target: target.to_vec(),
        })
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>, MetaError> {
        match self.call(NamespaceRequest::Readlink { namespace: self.id, ino })? {
            NamespaceResponse::Target(target) => Ok(target),
            other => Err(self.unexpected("NsTarget", &other)),
        }
    }

    fn link(
        &self,
        c: &Caller,
        ino: Ino,
        new_parent: Ino,
        new_name: &[u8],
    ) -> Result<Attr, MetaError> {
        self.attr(NamespaceRequest::Link {
            namespace: self.id,
            caller: c.clone(),
            ino,
            new_parent,
            new_name: new_name.to_vec(),
        })
    }

    fn unlink(&self, c: &Caller, parent: Ino, name: &[u8]) -> Result<(), MetaError> {
        self.done(NamespaceRequest::Unlink {
            namespace: self.id,
            caller: c.clone(),
            parent,
            name: name.to_vec(),
        })
    }

    fn rmdir(&self, c: &Caller, parent: Ino, name: &[u8]) -> Result<(), MetaError> {
        self.done(NamespaceRequest::Rmdir {
            namespace: self.id,
            caller: c.clone(),
            parent,
            name: name.to_vec(),
        })
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
        self.done(NamespaceRequest::Rename {
            namespace: self.id,
            caller: c.clone(),
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            flags,
        })
    }

    fn readdir(
        &self,
        c: &Caller,
        dir: Ino,
        after_cookie: u64,
        entries_max: u32,
    ) -> Result<Vec<DirEntry>, MetaError> {
        match self.call(NamespaceRequest::Readdir {
            namespace: self.id,
            caller: c.clone(),
            dir,
            after_cookie,
            entries_max,
        })? {
            NamespaceResponse::Entries(entries) => Ok(entries),
            other => Err(self.unexpected("NsEntries", &other)),
        }
    }

    fn open(&self, c: &Caller, ino: Ino, flags: i32) -> Result<Attr, MetaError> {
        self.attr(NamespaceRequest::OpenInode { namespace: self.id, caller: c.clone(), ino, flags })
    }

    fn access(&self, c: &Caller, ino: Ino, mask: i32) -> Result<(), MetaError> {
        self.done(NamespaceRequest::Access { namespace: self.id, caller: c.clone(), ino, mask })
    }

    fn wrote(&self, c: &Caller, ino: Ino, end_offset: u64) -> Result<Attr, MetaError> {
        self.attr(NamespaceRequest::Wrote {
            namespace: self.id,
            caller: c.clone(),
            ino,
            end_offset,
        })
    }

    fn statfs(&self) -> Result<FsStat, MetaError> {
        match self.call(NamespaceRequest::Statfs { namespace: self.id })? {
            NamespaceResponse::Stat(stat) => Ok(stat),
            other => Err(self.unexpected("NsStat", &other)),
        }
    }

    fn sync(&self) -> Result<(), MetaError> {
        self.done(NamespaceRequest::Sync { namespace: self.id })
    }

    fn manifest(&self) -> Result<Vec<ManifestEntry>, MetaError> {
        let mut out = Vec::new();
        loop {
            match self.call(NamespaceRequest::Manifest {
                namespace: self.id,
                from_index: out.len() as u64,
            })? {
                NamespaceResponse::Manifest(page) if page.is_empty() => return Ok(out),
                NamespaceResponse::Manifest(page) => out.extend(page),
                other => return Err(self.unexpected("NamespaceManifestPage", &other)),
            }
        }
    }

    fn watch(&self) -> Result<Option<Box<dyn Watch>>, MetaError> {
        Ok(Some(Box::new(RemoteWatch {
            endpoint: self.endpoint.clone(),
            namespace: self.id,
            session: self.session,
            munge_socket: self.munge_socket.clone(),
            connection: None,
        })))
    }

    fn data_epoch(&self) -> EpochId {
        self.data_epoch
    }
}

/// The changes other sessions make to a remote namespace, long-polled on a connection of its
/// own (opened at the first poll, and again after it breaks: the server keeps the watcher by
/// uid and session, not by connection).
struct RemoteWatch {
    endpoint: Endpoint,
    namespace: NamespaceId,
    session: u64,
    munge_socket: Option<std::path::PathBuf>,
    connection: Option<ServerConnection>,
}

impl Watch for RemoteWatch {
    fn end(&mut self, _since: u64) {
        // Leaving drops this watcher from every change's wait: no acknowledgement needed.
        let _ = self.next(spillway_namespace::WATCH_END);
    }

    fn next(&mut self, since: u64) -> Result<Changes, MetaError> {
        let mut connection = match self.connection.take() {
            Some(connection) => connection,
            None => ServerConnection::connect_with_munge_socket(
                &self.endpoint,
                "spillway-meta-watch",
                1,
                self.munge_socket.as_deref(),
            )
            .map_err(|failure| transport(&self.endpoint, failure))?,
        };
        let request = Request::Namespace(NamespaceRequest::Watch {
            namespace: self.namespace,
            session: self.session,
            since,
        });
        match connection.call(&request, &[], None) {
            Ok((Response::Namespace(NamespaceResponse::Changes(changes)), ())) => {
                self.connection = Some(connection);
                Ok(changes)
            }
            Ok((Response::Namespace(NamespaceResponse::Error { errno, message }), ())) => {
                self.connection = Some(connection);
                Err(MetaError::new(errno, message))
            }
            Ok((other, ())) => Err(MetaError::new(
                libc::EPROTO,
                format!("namespace server {}: unexpected {:?}", self.endpoint, other.kind()),
            )),
            Err(failure) => Err(transport(&self.endpoint, failure)),
        }
    }
}
