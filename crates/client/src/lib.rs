//! Client library: server lists, striped and local placement, checkpoint API.
//!
//! A [`Client`] knows the servers of one reservation and places data over them
//! ([`Placement`]: `Striped` like DataWarp, `Local` like BurstMem). The checkpoint API follows
//! BurstMem: [`Client::create_file`] in an epoch, [`Client::write`] any byte range (many processes
//! may write disjoint ranges of one shared file: N-1; or a file each: N-N),
//! [`Client::commit_epoch`] (returns when every server this client wrote to holds the epoch at the
//! requested durability), [`Client::read`] any byte range from whichever servers hold it,
//! [`Client::list_epochs`], [`Client::delete_epoch`].
//!
//! Writes are pipelined: `write` returns once the request is on the wire, or copied into the frame
//! gathering the adjacent writes before it ([`ClientOptions::coalesce_bytes_max`]; the caller's
//! buffer is free again either way); acknowledgements are collected as the window fills and all
//! of them by [`Client::flush`] and [`Client::commit_epoch`], which send what is gathered first
//! and report the first failure.

mod connection;
pub mod manifest;
pub mod meta;
pub mod ns_snapshot;
pub mod placement;
mod replication;
pub mod tiering;
mod trace_record;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use spillway_proto::{
    DrainInfo, Durability, Endpoint, EpochGrant, EpochInfo, EpochState, ErrorCode, Extent,
    FileInfo, Participant, Request, Response, ServerId, ServerStatus,
    PARTICIPANT_ADDRESS_BYTES_MAX,
};
use spillway_types::{EpochId, FileId};

pub use connection::ServerConnection;
pub use placement::Placement;
pub use replication::{merge_extents, RESERVED_PREFIX};
pub use spillway_policy::{Strategy as TieringStrategy, Tier};
pub use tiering::{
    EpochLocation, NodeLocalOptions, PhaseBegin, PhaseEnd, TierService, TieringOptions,
};
pub use trace_record::TRACE_ENV;

use spillway_trace::Op as TraceKind;
use std::time::Instant;

/// Why a client operation failed. Names the server and, for server errors, the protocol code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("cannot connect to {endpoint}: {source}")]
    Connect { endpoint: Endpoint, source: std::io::Error },
    #[error("handshake with {endpoint} failed: {message}")]
    Handshake { endpoint: Endpoint, message: String },
    /// The server requires munge authentication and no credential could be made.
    #[error("server {endpoint} requires munge authentication: {message}")]
    Authentication { endpoint: Endpoint, message: String },
    #[error("connection to {endpoint}: {source}")]
    Io { endpoint: Endpoint, source: std::io::Error },
    #[error("protocol error from {endpoint}: {message}")]
    Protocol { endpoint: Endpoint, message: String },
    #[error("{endpoint}: {code}: {message}")]
    Server { endpoint: Endpoint, code: ErrorCode, message: String },
    #[error("{endpoint} answered {got}, expected {expected}")]
    UnexpectedReply { endpoint: Endpoint, expected: &'static str, got: String },
    #[error("file {name:?} of epoch {epoch} is not on any server")]
    NoSuchFile { epoch: EpochId, name: String },
    /// No server holds the epoch at all (never written, or deleted: a reservation destroyed).
    #[error("epoch {epoch} is not on any server (never written, or deleted) looking for {name:?}")]
    NoSuchEpoch { epoch: EpochId, name: String },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The connection broke with writes unacknowledged; their bytes are not held by the
    /// client, so they are lost (EIO at the next flush, fsync or close).
    #[error("connection to {endpoint} broke with {writes} writes unacknowledged: they may not have reached the server and cannot be sent again")]
    Unacknowledged { endpoint: Endpoint, writes: usize },
    /// The server restarted (or another one took its address) after this client wrote bytes
    /// there that were not yet synced or committed: they may be gone (EIO, never zeros).
    #[error("server {endpoint} restarted (now id {id}, incarnation {incarnation}) after this client wrote to {files} of epoch {epoch} without a sync or commit since: those writes may be lost")]
    ServerRestarted {
        endpoint: Endpoint,
        id: ServerId,
        incarnation: u64,
        epoch: EpochId,
        files: String,
    },
    /// Every server that holds a copy of the bytes is unreachable (EIO, never zeros).
    #[error("every holder of the bytes is unreachable: {servers}")]
    NoLiveHolder { servers: String },
    /// A server holding replicas of the epoch was lost before the commit: fewer than k copies
    /// are certain, so the commit is not reported as done (EIO).
    #[error("commit of epoch {epoch} failed: server {endpoint}, holding replicas of it (replicas = {replicas}), is lost: {cause}")]
    ReplicaLost { endpoint: Endpoint, epoch: EpochId, replicas: u32, cause: String },
    /// A tiered phase's own storage failed: its PFS directory or the node-local store.
    #[error("{tier} tier: {message}")]
    Tier { tier: &'static str, message: String, errno: i32 },
}

impl ClientError {
    /// The errno an application should see (the protocol's one table for server errors).
    pub fn errno(&self) -> i32 {
        match self {
            ClientError::Server { code, .. } => code.errno(),
            ClientError::NoSuchFile { .. } => ErrorCode::NoSuchFile.errno(),
            ClientError::NoSuchEpoch { .. } => ErrorCode::NoSuchEpoch.errno(),
            ClientError::InvalidArgument(_) => ErrorCode::InvalidArgument.errno(),
            ClientError::Authentication { .. } => ErrorCode::PermissionDenied.errno(),
            ClientError::Unacknowledged { .. }
            | ClientError::ServerRestarted { .. }
            | ClientError::NoLiveHolder { .. }
            | ClientError::ReplicaLost { .. } => libc_eio(),
            ClientError::Connect { source, .. } | ClientError::Io { source, .. } => {
                source.raw_os_error().unwrap_or(libc_eio())
            }
            ClientError::Tier { errno, .. } => *errno,
            _ => ErrorCode::BadFrame.errno(),
        }
    }

    /// The protocol code of a server-reported error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            _ => None,
        }
    }
}

fn libc_eio() -> i32 {
    ErrorCode::Io.errno()
}

/// Environment variable naming the `munged` socket clients get credentials from when a server
/// requires munge authentication (unset or empty: libmunge's default socket).
pub const MUNGE_SOCKET_ENV: &str = "SPILLWAY_MUNGE_SOCKET";

/// The munge socket from [`MUNGE_SOCKET_ENV`]; `None`: libmunge's default.
pub fn munge_socket_from_env() -> Option<std::path::PathBuf> {
    std::env::var_os(MUNGE_SOCKET_ENV).filter(|v| !v.is_empty()).map(Into::into)
}

/// Default [`ClientOptions::coalesce_bytes_max`]: the frame size at which writes reach the
/// rate of the largest ones (docs/design/client.md).
pub const COALESCE_BYTES_MAX_DEFAULT: u64 = 1 << 20;

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    pub placement: Placement,
    /// Durability of `commit_epoch`.
    pub durability: Durability,
    /// Pipelined requests per server connection (capped by the server's limit).
    pub window: u32,
    /// Payload bytes of pipelined writes awaiting acknowledgement per server connection: deep
    /// pipelines for small writes, a bounded amount in flight for large ones.
    pub window_bytes_max: u64,
    /// Largest single write or read request (capped by the server's payload limit).
    pub transfer_bytes_max: u64,
    /// Adjacent writes of one file to one server are gathered into frames of up to this many
    /// bytes (capped by `transfer_bytes_max` and the server's payload limit) and sent when the
    /// next write is not adjacent, the frame is full, or before anything that must see them
    /// (docs/semantics.md, "Writes"); 0 sends every write as it comes. At most one frame is
    /// gathered per server connection.
    pub coalesce_bytes_max: u64,
    /// Name sent in the handshake (for the server's logs).
    pub client_name: String,
    /// Record a Spillway trace of this client's calls to this file (docs/design/trace.md,
    /// "Recorded by the client"). When `None`, `Client::connect` reads the environment variable
    /// `SPILLWAY_TRACE=<path>` instead (`%p` becomes the process id, `%r` the rank; the file must
    /// not exist yet, so clients sharing the setting never clobber each other's trace); unset or
    /// empty means no tracing. An explicit path is replaced if it exists.
    pub trace_path: Option<std::path::PathBuf>,
    /// Rank recorded in every traced operation.
    pub trace_rank: u32,
    /// The `munged` socket for credentials when a server requires munge authentication
    /// (`None`: libmunge's default). Defaults to `SPILLWAY_MUNGE_SOCKET` when set.
    pub munge_socket: Option<std::path::PathBuf>,
    /// How long a request keeps trying, with backoff (10 ms doubling to 1 s), to open again a
    /// connection that broke or that the server closed; default
    /// [`connection::RECONNECT_WAIT_MAX_DEFAULT`] (30 s).
    pub reconnect_wait_max: std::time::Duration,
    /// Copies of every piece, on servers of distinct failure domains (1..=4; 1: no replicas).
    /// Writes succeed when all copies are acknowledged; reads fall back to another copy.
    pub replicas: u32,
    /// The servers' failure domains in list order, when known from elsewhere (the reservation,
    /// an epoch manifest); empty: learnt from the handshakes. With replicas > 1 and this
    /// given, `connect` accepts servers it cannot reach (their copies are read elsewhere), and
    /// refuses servers announcing another domain than given.
    pub failure_domains: Vec<String>,
    /// Interference-aware tiering (docs/design/ias.md): each epoch's phase goes to the tier the
    /// data scheduler picks. `None`: every epoch goes to the burst buffer.
    pub tiering: Option<TieringOptions>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            placement: Placement::striped_default(),
            durability: Durability::ServerDefault,
            window: 64,
            window_bytes_max: 16 << 20,
            transfer_bytes_max: 4 << 20,
            coalesce_bytes_max: COALESCE_BYTES_MAX_DEFAULT,
            client_name: format!("spillway-client pid {}", std::process::id()),
            trace_path: None,
            trace_rank: 0,
            munge_socket: munge_socket_from_env(),
            reconnect_wait_max: connection::RECONNECT_WAIT_MAX_DEFAULT,
            replicas: 1,
            failure_domains: Vec::new(),
            tiering: None,
        }
    }
}

/// A file whose writes to a restarted server may be lost: reads of it fail, and the next
/// flush, sync or commit reports it once.
#[derive(Clone, Debug)]
struct LostWrites {
    server: usize,
    reported: bool,
}

/// An open file of an epoch: its id on each server that has it.
#[derive(Clone, Debug)]
pub struct FileHandle {
    pub epoch: EpochId,
    pub name: String,
    /// `ids[s]` is the file's id on server `s`, if that server has it.
    ids: Vec<Option<FileId>>,
    /// Set when the epoch was drained and freed in the burst buffer: reads come from this PFS
    /// copy instead (see [`Client::set_pfs_fallback`]).
    pfs_copy: Option<std::path::PathBuf>,
    /// Set when the epoch's phase went to the PFS or the node-local tier (tiering).
    direct: Option<tiering::Direct>,
}

impl FileHandle {
    /// Indices (in the reservation's server list) of the servers that have this file.
    pub fn servers(&self) -> Vec<usize> {
        self.ids.iter().enumerate().filter_map(|(s, id)| id.map(|_| s)).collect()
    }

    /// The PFS copy reads are served from, if the epoch is no longer in the burst buffer.
    pub fn pfs_copy(&self) -> Option<&std::path::Path> {
        self.pfs_copy.as_deref()
    }

    /// The tier this handle writes and reads: the PFS or node-local for a tiered phase, else
    /// the burst buffer (or the PFS copy of a drained epoch).
    pub fn tier(&self) -> Tier {
        match (&self.direct, &self.pfs_copy) {
            (Some(direct), _) => direct.tier(),
            (None, Some(_)) => Tier::Pfs,
            (None, None) => Tier::BurstBuffer,
        }
    }
}

/// An epoch as seen over all servers of the reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochSummary {
    pub epoch: EpochId,
    /// The least advanced state over the servers holding it (open < committed-in-memory < committed).
    pub state: EpochState,
    pub servers: usize,
    pub bytes: u64,
}

/// A client of one reservation's servers.
pub struct Client {
    servers: Vec<ServerConnection>,
    options: ClientOptions,
    /// Servers this client wrote to, per epoch (they must all commit it).
    touched: HashMap<EpochId, BTreeSet<usize>>,
    /// PFS directory drained epochs are found in (`<dir>/epoch-<E>/<name>`), if set.
    pfs_directory: Option<std::path::PathBuf>,
    /// The trace being recorded, if tracing is on; finished (end record) when the client drops.
    tracer: Option<trace_record::Tracer>,
    /// Files this client created, per epoch, while tracing (for the Unlink records of
    /// `delete_epoch`).
    traced_creates: HashMap<EpochId, BTreeSet<String>>,
    /// Each server's id and incarnation when this client last looked (a change means it
    /// restarted, or another server took its address).
    known: Vec<(ServerId, u64)>,
    /// Files written per (epoch, server) since the last sync or commit of the epoch: what a
    /// restart of that server may have lost.
    unsynced: HashMap<(EpochId, usize), BTreeSet<String>>,
    /// Files whose unsynced writes a restart may have lost.
    lost: BTreeMap<(EpochId, String), LostWrites>,
    /// Each server's failure domain at connect (replica placement depends on it).
    domains: Vec<String>,
    /// Servers found unreachable (replicas > 1): reads use other holders.
    unreachable: BTreeSet<usize>,
    /// This client's random id (names its manifests) and its last manifest's sequence number.
    client_id: u64,
    manifests_written: u64,
    /// The sequence number reserved for each epoch's next manifest, by its intent file.
    manifest_seq: HashMap<EpochId, u64>,
    /// Byte ranges written per epoch and file since the last manifest (start → end).
    written: HashMap<EpochId, BTreeMap<String, BTreeMap<u64, u64>>>,
    /// The tiering runtime, when tiering is on (dropped first: its mover may still need the
    /// burst buffer, through its own connections).
    tiering: Option<tiering::Runtime>,
}

impl Client {
    /// Connects to every server (in the reservation's order; placement depends on it).
    pub fn connect(endpoints: &[Endpoint], options: ClientOptions) -> Result<Client, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::InvalidArgument("empty server list".into()));
        }
        if let Placement::Striped { stripe_unit_bytes: 0, .. } = options.placement {
            return Err(ClientError::InvalidArgument("stripe unit of 0 bytes".into()));
        }
        let (servers, unreachable) = replication::connect_all(endpoints, &options)?;
        let known = servers.iter().map(|s| (s.server_id, s.incarnation)).collect();
        let domains: Vec<String> = servers.iter().map(|s| s.failure_domain.clone()).collect();
        replication::check_options(&options, &domains)?;
        let tracer = match &options.trace_path {
            Some(path) => trace_record::Tracer::start(path, options.trace_rank, false),
            None => trace_record::path_from_env(options.trace_rank)
                .and_then(|path| trace_record::Tracer::start(&path, options.trace_rank, true)),
        };
        let client_id = replication::random_client_id()?;
        let tiering = match options.tiering.clone() {
            None => None,
            Some(tiering_options) => {
                let endpoints = endpoints.to_vec();
                let mut mover_options = options.clone();
                mover_options.tiering = None;
                mover_options.client_name = format!("{} (node-local mover)", options.client_name);
                let connect = Box::new(move || Client::connect(&endpoints, mover_options));
                Some(
                    tiering::Runtime::start(tiering_options, client_id, connect)
                        .map_err(ClientError::InvalidArgument)?,
                )
            }
        };
        let pfs_directory = options.tiering.as_ref().and_then(|t| t.pfs_directory.clone());
        Ok(Client {
            servers,
            options,
            touched: HashMap::new(),
            pfs_directory,
            tracer,
            traced_creates: HashMap::new(),
            known,
            unsynced: HashMap::new(),
            lost: BTreeMap::new(),
            domains,
            unreachable,
            client_id,
            manifests_written: 0,
            manifest_seq: HashMap::new(),
            written: HashMap::new(),
            tiering,
        })
    }

    /// Notices servers whose id or incarnation changed since this client last looked (their
    /// connection was opened again): the files written there since the last sync or commit
    /// become lost writes.
    fn note_restarts(&mut self) {
        for (server, connection) in self.servers.iter().enumerate() {
            let now = (connection.server_id, connection.incarnation);
            if self.known[server] == now {
                continue;
            }
            self.known[server] = now;
            let affected: Vec<(EpochId, usize)> =
                self.unsynced.keys().filter(|(_, s)| *s == server).copied().collect();
            for key in affected {
                for name in self.unsynced.remove(&key).unwrap_or_default() {
                    self.lost.insert((key.0, name), LostWrites { server, reported: false });
                }
            }
        }
    }

    /// The error for lost writes to `names` of `epoch` on `server`.
    fn lost_error(&self, epoch: EpochId, names: &[String], server: usize) -> ClientError {
        let (id, incarnation) = self.known[server];
        ClientError::ServerRestarted {
            endpoint: self.servers[server].endpoint.clone(),
            id,
            incarnation,
            epoch,
            files: names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", "),
        }
    }

    /// Reports the lost writes of `epoch`'s files that `wanted` selects: those not reported
    /// yet, or with `again` every one.
    fn report_lost(
        &mut self,
        epoch: EpochId,
        again: bool,
        wanted: impl Fn(&str) -> bool,
    ) -> Result<(), ClientError> {
        self.note_restarts();
        let mut first: Option<(EpochId, usize, Vec<String>)> = None;
        for ((e, name), lost) in self.lost.iter_mut() {
            if (lost.reported && !again) || *e != epoch || !wanted(name) {
                continue;
            }
            match &mut first {
                None => first = Some((*e, lost.server, vec![name.clone()])),
                Some((fe, fs, names)) if *fe == *e && *fs == lost.server => {
                    names.push(name.clone())
                }
                Some(_) => continue,
            }
            lost.reported = true;
        }
        match first {
            None => Ok(()),
            Some((e, server, names)) => Err(self.lost_error(e, &names, server)),
        }
    }

    /// After a sync or commit of `epoch` succeeded on every server: nothing written so far can
    /// be lost by a restart any more.
    fn synced(&mut self, epoch: EpochId) {
        self.unsynced.retain(|(e, _), _| *e != epoch);
    }

    /// Records one traced operation (no-op when tracing is off).
    fn trace(&mut self, op: TraceKind, name: &str, offset: u64, length: u64, started: Instant) {
        if let Some(tracer) = self.tracer.as_mut() {
            tracer.record(op, name, offset, length, started);
        }
    }

    /// Whether this client records a trace.
    pub fn tracing(&self) -> bool {
        self.tracer.is_some()
    }

    /// This client's random id, which names its manifests.
    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    pub fn server_count(&self) -> usize {
        self.servers.len()
    }

    /// The id and incarnation of server `index` (from its last handshake).
    pub fn server_identity(&self, index: usize) -> (ServerId, u64) {
        (self.servers[index].server_id, self.servers[index].incarnation)
    }

    /// The failure domain of server `index` (from its last handshake).
    pub fn server_failure_domain(&self, index: usize) -> &str {
        &self.servers[index].failure_domain
    }

    /// Where server `index` is reached.
    pub fn endpoint(&self, index: usize) -> &Endpoint {
        &self.servers[index].endpoint
    }

    /// The states of the epochs server `index` holds, from `ListEpochs` on that server alone;
    /// the server's id and incarnation after the call are those of the server that answered.
    pub fn epochs_on(&mut self, index: usize) -> Result<Vec<EpochInfo>, ClientError> {
        every_epoch_on(&mut self.servers[index])
    }

    /// The identity the first server established for this client (uid, gid).
    pub fn identity(&self) -> (u32, u32) {
        (self.servers[0].uid, self.servers[0].gid)
    }

    fn piece_bytes_max(&self) -> u64 {
        let server_max = self.servers.iter().map(|s| s.payload_bytes_max as u64).min().unwrap_or(1);
        self.options.transfer_bytes_max.min(server_max).max(1)
    }

    /// Begins an epoch (BurstMem's checkpoint timestamp). Epochs are created on the servers by
    /// their first file; this only records that the caller starts writing it.
    pub fn begin_epoch(&mut self, epoch: EpochId) {
        self.touched.entry(epoch).or_default();
    }

    /// Creates (or opens, if another process created it) a file on every server of its stripe
    /// set.
    pub fn create_file(&mut self, epoch: EpochId, name: &str) -> Result<FileHandle, ClientError> {
        replication::check_user_name(name)?;
        let started = Instant::now();
        let handle = self.create_file_untraced(epoch, name)?;
        if self.tracer.is_some() {
            self.trace(TraceKind::Create, &traced_file_name(epoch, name), 0, 0, started);
            self.traced_creates.entry(epoch).or_default().insert(name.to_string());
        }
        Ok(handle)
    }

    fn create_file_untraced(
        &mut self,
        epoch: EpochId,
        name: &str,
    ) -> Result<FileHandle, ClientError> {
        if let Some(handle) = self.create_tiered(epoch, name)? {
            return Ok(handle);
        }
        let mut ids = vec![None; self.servers.len()];
        let holders: BTreeSet<usize> =
            placement::stripe_set(self.options.placement, name, self.servers.len())
                .into_iter()
                .flat_map(|primary| self.holders(primary))
                .collect();
        for server in holders {
            let request = Request::OpenFile { epoch, name: name.to_string(), create: true };
            match self.servers[server].call(&request, &[], None)? {
                (Response::FileOpened { file, .. }, ()) => ids[server] = Some(file),
                (other, ()) => return Err(unexpected(&self.servers[server], "FileOpened", &other)),
            }
            self.touched.entry(epoch).or_default().insert(server);
        }
        Ok(FileHandle { epoch, name: name.to_string(), ids, pfs_copy: None, direct: None })
    }

    /// Opens an existing file for reading: asks every server, keeps those that have it.
    pub fn open_file(&mut self, epoch: EpochId, name: &str) -> Result<FileHandle, ClientError> {
        let started = Instant::now();
        let handle = self.open_file_untraced(epoch, name)?;
        if self.tracer.is_some() {
            self.trace(TraceKind::Open, &traced_file_name(epoch, name), 0, 0, started);
        }
        Ok(handle)
    }

    fn open_file_untraced(
        &mut self,
        epoch: EpochId,
        name: &str,
    ) -> Result<FileHandle, ClientError> {
        if let Some(handle) = self.open_tiered(epoch, name)? {
            return Ok(handle);
        }
        // Restart read path: once an epoch is drained its PFS copy is the data (the burst
        // buffer may have freed the bytes already).
        if let Some(copy) = self.pfs_path(epoch, name) {
            if copy.is_file() {
                let drained =
                    match self.list_epochs_untraced()?.into_iter().find(|e| e.epoch == epoch) {
                        None => true,
                        Some(summary) => summary.state == EpochState::Drained,
                    };
                if drained {
                    return Ok(FileHandle {
                        epoch,
                        name: name.to_string(),
                        ids: vec![None; self.servers.len()],
                        pfs_copy: Some(copy),
                        direct: None,
                    });
                }
            }
        }
        let mut ids = vec![None; self.servers.len()];
        let mut epoch_somewhere = false;
        for (server, id) in ids.iter_mut().enumerate() {
            if self.unreachable.contains(&server) {
                continue;
            }
            let request = Request::OpenFile { epoch, name: name.to_string(), create: false };
            let connection = &mut self.servers[server];
            match connection.call(&request, &[], None) {
                Ok((Response::FileOpened { file, .. }, ())) => {
                    *id = Some(file);
                    epoch_somewhere = true;
                }
                Ok((other, ())) => return Err(unexpected(connection, "FileOpened", &other)),
                Err(e) if e.code() == Some(ErrorCode::NoSuchFile) => epoch_somewhere = true,
                Err(e) if e.code() == Some(ErrorCode::NoSuchEpoch) => {}
                // Another holder has the bytes; reads skip this server from now on.
                Err(e) if self.note_unreachable(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if ids.iter().all(Option::is_none) {
            // Not on the burst buffer: maybe still on another node's local tier.
            if let Some(elsewhere) = self.held_elsewhere(epoch) {
                return Err(elsewhere);
            }
        }
        if !epoch_somewhere {
            return Err(ClientError::NoSuchEpoch { epoch, name: name.to_string() });
        }
        if ids.iter().all(Option::is_none) {
            return Err(ClientError::NoSuchFile { epoch, name: name.to_string() });
        }
        Ok(FileHandle { epoch, name: name.to_string(), ids, pfs_copy: None, direct: None })
    }

    /// Where drained epochs are found on the PFS: `open_file` of a file no server has any more
    /// opens `<directory>/epoch-<E>/<name>` instead, if it exists (the drain's final name).
    pub fn set_pfs_fallback(&mut self, directory: impl Into<std::path::PathBuf>) {
        self.pfs_directory = Some(directory.into());
    }

    fn pfs_path(&self, epoch: EpochId, name: &str) -> Option<std::path::PathBuf> {
        let dir = self.pfs_directory.as_ref()?;
        Some(dir.join(tiering::pfs_relative_path(epoch, name).ok()?))
    }

    fn file_on(&mut self, file: &mut FileHandle, server: usize) -> Result<FileId, ClientError> {
        if let Some(id) = file.ids[server] {
            return Ok(id);
        }
        // Local placement over a handle opened elsewhere: create the file on our server.
        let request =
            Request::OpenFile { epoch: file.epoch, name: file.name.clone(), create: true };
        match self.servers[server].call(&request, &[], None)? {
            (Response::FileOpened { file: id, .. }, ()) => {
                file.ids[server] = Some(id);
                Ok(id)
            }
            (other, ()) => Err(unexpected(&self.servers[server], "FileOpened", &other)),
        }
    }

    /// Writes `data` at `offset`. Returns once the requests are sent or gathered with the
    /// adjacent writes before them (sent by the next non-adjacent write, a full frame, or
    /// anything that must see them: flush, sync, commit, read); failures surface by the next
    /// `flush` or `commit_epoch` at the latest.
    pub fn write(
        &mut self,
        file: &mut FileHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ClientError> {
        let started = Instant::now();
        self.write_untraced(file, offset, data)?;
        if self.tracer.is_some() {
            self.trace(
                TraceKind::Write,
                &traced_file_name(file.epoch, &file.name),
                offset,
                data.len() as u64,
                started,
            );
        }
        Ok(())
    }

    fn write_untraced(
        &mut self,
        file: &mut FileHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ClientError> {
        offset.checked_add(data.len() as u64).ok_or_else(|| {
            ClientError::InvalidArgument(format!(
                "write of {} bytes at offset {offset} overflows",
                data.len()
            ))
        })?;
        if file.direct.is_some() && self.write_tiered(file, offset, data)? {
            return Ok(());
        }
        if let Some(runtime) = &mut self.tiering {
            runtime.wrote(file.epoch, data.len() as u64);
        }
        let pieces = placement::split(
            self.options.placement,
            &file.name,
            self.servers.len(),
            offset,
            data.len() as u64,
            self.piece_bytes_max(),
        );
        self.note_range_written(file, offset, data.len() as u64)?;
        for piece in pieces {
            let start = (piece.offset - offset) as usize;
            let bytes = &data[start..start + piece.length as usize];
            for server in self.holders(piece.server) {
                let id = self.file_on(file, server)?;
                // Sent, or gathered with the adjacent writes before it; its CRC32C taken from
                // the caller's buffer either way.
                let sent =
                    self.servers[server].write_pipelined(file.epoch, id, piece.offset, bytes);
                self.note_piece_sent(file, server, sent)?;
            }
        }
        Ok(())
    }

    /// Makes `[offset, offset + length)` of the file read as zeros (fallocate's punch hole and
    /// zero range, a shrinking truncate's zero-fill). Each server holding part of the range
    /// keeps its part as one small record per stripe unit instead of the bytes; a server of
    /// an older protocol version, or a file written straight to the PFS, gets the zeros as
    /// bytes. Ordered with this client's writes and reported like them (by the next `flush`
    /// or `commit_epoch` at the latest).
    pub fn write_zeros(
        &mut self,
        file: &mut FileHandle,
        offset: u64,
        length: u64,
    ) -> Result<(), ClientError> {
        offset.checked_add(length).ok_or_else(|| {
            ClientError::InvalidArgument(format!(
                "run of {length} zeros at offset {offset} overflows"
            ))
        })?;
        if file.direct.is_some() {
            return connection::zeros_as_bytes(
                offset,
                length,
                connection::ZERO_BYTES_CHUNK,
                |at, zeros| self.write_untraced(file, at, zeros),
            );
        }
        let pieces = placement::split(
            self.options.placement,
            &file.name,
            self.servers.len(),
            offset,
            length,
            // Pieces end only at stripe units: a run of zeros has no payload to bound.
            length.max(1),
        );
        self.note_range_written(file, offset, length)?;
        for piece in pieces {
            for server in self.holders(piece.server) {
                let id = self.file_on(file, server)?;
                let sent = self.servers[server].write_zeros_pipelined(
                    file.epoch,
                    id,
                    piece.offset,
                    piece.length,
                );
                self.note_piece_sent(file, server, sent)?;
            }
        }
        Ok(())
    }

    /// Before the pieces of a write (or run of zeros) go out: with several servers, the
    /// epoch's intent and the file's written ranges, which survivors of a server loss need.
    fn note_range_written(
        &mut self,
        file: &FileHandle,
        offset: u64,
        length: u64,
    ) -> Result<(), ClientError> {
        // With one server nothing survives its loss: no intents or manifests to keep.
        if self.servers.len() > 1 {
            if !self.written.contains_key(&file.epoch) {
                self.write_intent(file.epoch)?;
            }
            let ranges = self.written.entry(file.epoch).or_default();
            // The name is cloned once per file, not once per write (small writes add up).
            if !ranges.contains_key(&file.name) {
                ranges.insert(file.name.clone(), BTreeMap::new());
            }
            let file_ranges = ranges.get_mut(&file.name).expect("inserted above");
            manifest::add_range(file_ranges, offset, length);
        }
        Ok(())
    }

    /// After a piece was handed to `server`'s connection (`sent`): notes a restart the
    /// connection met, then, if it went out, that the server holds unsynced bytes of the file.
    fn note_piece_sent(
        &mut self,
        file: &FileHandle,
        server: usize,
        sent: Result<(), ClientError>,
    ) -> Result<(), ClientError> {
        // A reopened connection may reach a restarted server: what was written there before
        // is lost; this piece went to the new incarnation.
        self.note_restarts();
        sent?;
        self.touched.entry(file.epoch).or_default().insert(server);
        let unsynced = self.unsynced.entry((file.epoch, server)).or_default();
        if !unsynced.contains(&file.name) {
            unsynced.insert(file.name.clone());
        }
        Ok(())
    }

    /// Waits until every write sent so far is acknowledged (in the servers' DRAM logs).
    pub fn flush(&mut self) -> Result<(), ClientError> {
        let mut first = None;
        for (index, server) in self.servers.iter_mut().enumerate() {
            // A server found unreachable with nothing of ours in flight has nothing to settle
            // (its writes, if any, fail the commit, which asks it).
            if self.unreachable.contains(&index) && !server.has_pending_writes() {
                continue;
            }
            if let Err(e) = server.flush() {
                first.get_or_insert(e);
            }
        }
        self.note_restarts();
        first.map_or(Ok(()), Err)
    }

    /// Fails with [`ClientError::ServerRestarted`] (EIO), once, if a server restart may have
    /// lost writes this client made to files of `epoch` whose names start with `name_prefix`
    /// (not synced or committed before the restart). What the mount's close and fsync ask.
    pub fn report_lost_writes(
        &mut self,
        epoch: EpochId,
        name_prefix: &str,
    ) -> Result<(), ClientError> {
        self.report_lost(epoch, false, |name| name.starts_with(name_prefix))
    }

    /// Commits the epoch on every server this client wrote it to; returns when all of them hold
    /// it at the configured durability. In an N-1 checkpoint every process calls it after the
    /// barrier that ends the write phase (committing twice is harmless).
    pub fn commit_epoch(&mut self, epoch: EpochId) -> Result<(), ClientError> {
        let started = Instant::now();
        self.commit_epoch_untraced(epoch)?;
        if self.tracer.is_some() {
            self.trace(TraceKind::Fsync, &traced_epoch_name(epoch), 0, 0, started);
        }
        Ok(())
    }

    /// Every server this client wrote the epoch to, by id (what `Commit` and `Sync` name): each
    /// records them, and its drain publishes nothing of the epoch unless all of them are there
    /// with these ids.
    fn participants(&self, epoch: EpochId) -> Vec<Participant> {
        let touched = self.touched.get(&epoch).into_iter().flatten();
        touched
            .map(|&server| Participant {
                id: self.known[server].0,
                address: participant_address(&self.servers[server].endpoint),
            })
            .collect()
    }

    fn commit_epoch_untraced(&mut self, epoch: EpochId) -> Result<(), ClientError> {
        let tier = self.tiering.as_ref().and_then(|t| t.tier_of(epoch));
        if matches!(tier, None | Some(Tier::BurstBuffer)) {
            self.commit_on_holders(epoch).map_err(|error| self.commit_failure(epoch, error))?;
        }
        self.commit_tiered(epoch)
    }

    /// Commits on every server this client wrote the epoch to (all holders of its pieces),
    /// after writing its manifest there.
    fn commit_on_holders(&mut self, epoch: EpochId) -> Result<(), ClientError> {
        self.flush()?;
        self.write_manifest_to_participants(epoch, true)?;
        let participants = self.participants(epoch);
        let request = Request::Commit { epoch, durability: self.options.durability, participants };
        let committed = self.call_touched_servers(epoch, &request, "Committed", |r| {
            matches!(r, Response::Committed { .. })
        });
        // Sealing an epoch that lost writes would let it drain with holes where they were:
        // refused as long as this client knows of any (delete the epoch, or write it anew).
        self.report_lost(epoch, true, |_| true)?;
        committed?;
        self.synced(epoch);
        Ok(())
    }

    /// Makes every byte this client wrote to the epoch durable in the SSD log of each server it
    /// wrote to, without sealing the epoch (the mount's `fsync` asks fewer servers:
    /// [`Client::sync_files`]). Later writes may follow. Writes this client's manifest of what
    /// it wrote since its last one to every server first.
    ///
    /// Writes a server restart lost before the sync are not made durable by it: they are
    /// reported by [`Client::report_lost_writes`] and `commit_epoch`, and reads of their files
    /// fail.
    pub fn sync_epoch(&mut self, epoch: EpochId) -> Result<(), ClientError> {
        if self.sync_tiered(epoch)? {
            return Ok(());
        }
        self.flush()?;
        // What was written since the last manifest, so that an epoch sealed by someone else
        // (stage-out after the mounts' fsyncs) has every writer's manifest.
        self.write_manifest_to_participants(epoch, true)?;
        let request = Request::Sync { epoch, participants: self.participants(epoch) };
        let synced = self.call_touched_servers(epoch, &request, "Synced", |r| {
            matches!(r, Response::Synced { .. })
        });
        self.note_restarts();
        synced?;
        self.synced(epoch);
        Ok(())
    }

    /// [`Client::sync_epoch`] for the files of `epoch` whose names start with `name_prefix`:
    /// `Sync` goes only to the servers holding writes of such a file that no sync or commit
    /// covered yet, and to none when there are none (the mount's `fsync` of one file). Every
    /// write this client sent is acknowledged first, and this client's manifest of what it
    /// wrote since its last one goes to every server before the `Sync`, as in `sync_epoch`.
    ///
    /// A `Sync` makes everything a server acknowledged durable, so each server asked has no
    /// unsynced write of this client afterwards, whatever its file.
    pub fn sync_files(&mut self, epoch: EpochId, name_prefix: &str) -> Result<(), ClientError> {
        if self.sync_tiered(epoch)? {
            return Ok(());
        }
        self.flush()?;
        let servers = self.servers_with_unsynced(epoch, name_prefix);
        if servers.is_empty() {
            return Ok(());
        }
        // Written everywhere, as by `sync_epoch`: a seal by someone else must find it on every
        // server; durable here on the servers asked, elsewhere at their next sync or commit
        // (the survivor rule needs it on one live server: docs/design/drain.md).
        self.write_manifest_to_participants(epoch, true)?;
        let request = Request::Sync { epoch, participants: self.participants(epoch) };
        let synced = self
            .call_servers(&servers, &request, "Synced", |r| matches!(r, Response::Synced { .. }));
        // A server that restarted meanwhile lost what it had: lost writes, not synced ones.
        self.note_restarts();
        synced?;
        for server in servers {
            self.unsynced.remove(&(epoch, server));
        }
        Ok(())
    }

    /// The servers holding writes to files of `epoch` named `name_prefix…` that no sync or
    /// commit covered yet, in server order.
    fn servers_with_unsynced(&self, epoch: EpochId, name_prefix: &str) -> Vec<usize> {
        let mut servers: Vec<usize> = self
            .unsynced
            .iter()
            .filter(|((e, _), names)| {
                *e == epoch && names.iter().any(|n| n.starts_with(name_prefix))
            })
            .map(|((_, server), _)| *server)
            .collect();
        servers.sort_unstable();
        servers
    }

    /// Tells every server of this client that the epoch's writes go to SSD stream `stream` (the
    /// manager's BIOS Algorithm 1 choice). Only root may; the servers refuse anyone else.
    pub fn assign_stream(&mut self, epoch: EpochId, stream: u64) -> Result<(), ClientError> {
        let servers: Vec<usize> = (0..self.servers.len()).collect();
        self.call_servers(
            &servers,
            &Request::AssignStream { epoch, stream },
            "StreamAssigned",
            |r| matches!(r, Response::StreamAssigned { .. }),
        )
    }

    /// Grants the epoch on every server of this client, as `grant` says (root only: the
    /// manager). Replaces any earlier grant; repeating it is harmless.
    pub fn grant_epoch(&mut self, epoch: EpochId, grant: &EpochGrant) -> Result<(), ClientError> {
        let servers: Vec<usize> = (0..self.servers.len()).collect();
        let request = Request::GrantEpoch { epoch, grant: grant.clone() };
        self.call_servers(&servers, &request, "EpochGranted", |r| {
            matches!(r, Response::EpochGranted { .. })
        })
    }

    /// Asks every server of this client to serve `cluster_id` (root only: the manager); the
    /// cluster each serves afterwards, in server order (another one: it was another's first).
    pub fn join_cluster(
        &mut self,
        cluster_id: [u8; spillway_proto::CLUSTER_ID_BYTES],
    ) -> Result<Vec<[u8; spillway_proto::CLUSTER_ID_BYTES]>, ClientError> {
        let mut serves = Vec::with_capacity(self.servers.len());
        for connection in &mut self.servers {
            match connection.call(&Request::JoinCluster { cluster_id }, &[], None)? {
                (Response::ClusterJoined { cluster_id }, ()) => serves.push(cluster_id),
                (other, ()) => return Err(unexpected(connection, "ClusterJoined", &other)),
            }
        }
        Ok(serves)
    }

    /// Revokes the epoch's grant on every server of this client (root only: the manager);
    /// afterwards only root may use the epoch there. Returns what each server saw of the epoch
    /// since its grant, in server order.
    pub fn revoke_epoch(
        &mut self,
        epoch: EpochId,
    ) -> Result<Vec<spillway_proto::EpochActivity>, ClientError> {
        let mut seen = Vec::with_capacity(self.servers.len());
        for connection in &mut self.servers {
            match connection.call(&Request::RevokeEpoch { epoch }, &[], None)? {
                (Response::EpochRevoked { activity, .. }, ()) => seen.push(activity),
                (other, ()) => return Err(unexpected(connection, "EpochRevoked", &other)),
            }
        }
        Ok(seen)
    }

    /// Flushes the pipeline, then sends `request` to every server this client wrote the epoch to
    /// (all first, then collects, so the servers work in parallel); the first failure wins.
    fn call_touched_servers(
        &mut self,
        epoch: EpochId,
        request: &Request,
        expected: &'static str,
        is_expected: impl Fn(&Response) -> bool,
    ) -> Result<(), ClientError> {
        self.flush()?;
        let servers: Vec<usize> =
            self.touched.get(&epoch).map(|s| s.iter().copied().collect()).unwrap_or_default();
        self.call_servers(&servers, request, expected, is_expected)
    }

    /// Sends `request` to each of `servers` (all first, then collects, so the servers work in
    /// parallel); the first failure wins.
    fn call_servers(
        &mut self,
        servers: &[usize],
        request: &Request,
        expected: &'static str,
        is_expected: impl Fn(&Response) -> bool,
    ) -> Result<(), ClientError> {
        let mut ids = Vec::with_capacity(servers.len());
        for &server in servers {
            ids.push((server, self.servers[server].start_call(request)?));
        }
        let mut first = None;
        for (server, id) in ids {
            let connection = &mut self.servers[server];
            match connection.finish_call(id) {
                Ok(response) if is_expected(&response) => {}
                Ok(other) => {
                    first.get_or_insert(unexpected(connection, expected, &other));
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The byte ranges of the file each server holds (asked, for local placement).
    fn extents_by_server(
        &mut self,
        file: &FileHandle,
    ) -> Result<Vec<(usize, Extent)>, ClientError> {
        let mut out = Vec::new();
        for (server, id) in file.ids.iter().enumerate() {
            let Some(id) = *id else { continue };
            if self.unreachable.contains(&server) {
                continue;
            }
            let mut from_offset = 0;
            loop {
                let request = Request::Extents { epoch: file.epoch, file: id, from_offset };
                let list = match self.servers[server].call(&request, &[], None) {
                    Ok((Response::Extents(list), ())) => list,
                    Ok((other, ())) => {
                        return Err(unexpected(&self.servers[server], "Extents", &other))
                    }
                    // Another holder has the bytes (replicas > 1).
                    Err(e) if self.note_unreachable(&e) => break,
                    Err(e) => return Err(e),
                };
                let Some(last) = list.last() else { break };
                let next = last.offset + last.length;
                out.extend(list.into_iter().map(|e| (server, e)));
                if next <= from_offset {
                    break;
                }
                from_offset = next;
            }
        }
        Ok(out)
    }

    /// Reads `buffer.len()` bytes at `offset` from whichever servers hold them; bytes nobody
    /// wrote read as zeros.
    pub fn read(
        &mut self,
        file: &FileHandle,
        offset: u64,
        buffer: &mut [u8],
    ) -> Result<(), ClientError> {
        let started = Instant::now();
        let read = self.read_untraced(file, offset, buffer);
        // Bytes a restart lost read as holes: never hand them out as zeros.
        self.note_restarts();
        if let Some(lost) = self.lost.get(&(file.epoch, file.name.clone())) {
            return Err(self.lost_error(file.epoch, std::slice::from_ref(&file.name), lost.server));
        }
        read?;
        if self.tracer.is_some() {
            self.trace(
                TraceKind::Read,
                &traced_file_name(file.epoch, &file.name),
                offset,
                buffer.len() as u64,
                started,
            );
        }
        Ok(())
    }

    fn read_untraced(
        &mut self,
        file: &FileHandle,
        offset: u64,
        buffer: &mut [u8],
    ) -> Result<(), ClientError> {
        let end = offset.checked_add(buffer.len() as u64).ok_or_else(|| {
            ClientError::InvalidArgument(format!(
                "read of {} bytes at offset {offset} overflows",
                buffer.len()
            ))
        })?;
        self.flush()?;
        if let Some(copy) = &file.pfs_copy {
            return read_pfs_copy(copy, offset, buffer);
        }
        if file.direct.is_some() {
            return self.read_tiered(file, offset, buffer);
        }
        // A holder found unreachable mid-read is skipped and the read planned again over the
        // others; each round marks one more server, so this ends.
        loop {
            buffer.fill(0);
            let wanted = self.plan_read(file, offset, end)?;
            match self.read_ranges(file, offset, buffer, wanted) {
                Err(e) if self.note_unreachable(&e) => continue,
                done => return done,
            }
        }
    }

    /// Which server to read each part of `[offset, end)` of the file from: `(server, file
    /// offset, length)`, each at most the payload limit long; bytes nobody holds are left out.
    fn plan_read(
        &mut self,
        file: &FileHandle,
        offset: u64,
        end: u64,
    ) -> Result<Vec<(usize, u64, u64)>, ClientError> {
        let piece_max = self.piece_bytes_max();
        let mut wanted: Vec<(usize, u64, u64)> = Vec::new();
        match self.options.placement {
            Placement::Striped { .. } => {
                for piece in placement::split(
                    self.options.placement,
                    &file.name,
                    self.servers.len(),
                    offset,
                    end - offset,
                    piece_max,
                ) {
                    if let Some(server) =
                        self.live_holder(piece.server, |s| file.ids[s].is_some())?
                    {
                        wanted.push((server, piece.offset, piece.length));
                    }
                }
            }
            Placement::Local { .. } => {
                // Disjoint writers are the contract; where holders overlap (replicas, or
                // writers that overlapped) each byte is read once, from the lowest server.
                let extents = merge_extents(self.extents_by_server(file)?);
                for (server, extent) in extents {
                    let start = extent.offset.max(offset);
                    let stop = (extent.offset + extent.length).min(end);
                    let mut at = start;
                    while at < stop {
                        let length = (stop - at).min(piece_max);
                        wanted.push((server, at, length));
                        at += length;
                    }
                }
            }
        }
        Ok(wanted)
    }

    /// The byte ranges of the file each server holds, as `(server index, extent)`, by server.
    pub fn extents(&mut self, file: &FileHandle) -> Result<Vec<(usize, Extent)>, ClientError> {
        self.extents_by_server(file)
    }

    /// Fills the parts of `buffer` (which starts at file offset `offset`) named by `wanted`
    /// (`(server, file offset, length)`, each inside the buffer, at most the payload limit
    /// long) from those servers, pipelined per server. Other bytes of `buffer` are untouched.
    pub fn read_ranges(
        &mut self,
        file: &FileHandle,
        offset: u64,
        buffer: &mut [u8],
        wanted: Vec<(usize, u64, u64)>,
    ) -> Result<(), ClientError> {
        let end = offset + buffer.len() as u64;
        for &(server, at, length) in &wanted {
            if server >= self.servers.len()
                || file.ids[server].is_none()
                || at < offset
                || at + length > end
                || length > self.piece_bytes_max()
            {
                return Err(ClientError::InvalidArgument(format!("range {at}+{length} on server {server} is outside the buffer or the file's servers")));
            }
        }
        // Group per server and pipeline; the slices of `buffer` are disjoint.
        let mut per_server: BTreeMap<usize, Vec<(u64, u64)>> = BTreeMap::new();
        for (server, at, length) in wanted {
            per_server.entry(server).or_default().push((at, length));
        }
        // One pass over the buffer in offset order hands each range its own disjoint slice; a
        // range overlapping one already taken (any server) is skipped: those bytes come once.
        let mut all: Vec<(u64, u64, usize)> = per_server
            .into_iter()
            .flat_map(|(s, r)| r.into_iter().map(move |(at, l)| (at, l, s)))
            .collect();
        all.sort_unstable();
        let mut slices: BTreeMap<usize, Vec<(Request, &mut [u8])>> = BTreeMap::new();
        let mut rest: &mut [u8] = &mut *buffer;
        let mut rest_offset = offset;
        for (at, length, server) in all {
            if at < rest_offset {
                continue;
            }
            let id = file.ids[server].expect("only servers holding the file are asked");
            let (_, tail) = std::mem::take(&mut rest).split_at_mut((at - rest_offset) as usize);
            let (piece, tail) = tail.split_at_mut(length as usize);
            rest = tail;
            rest_offset = at + length;
            slices.entry(server).or_default().push((
                Request::Read { epoch: file.epoch, file: id, offset: at, length: length as u32 },
                piece,
            ));
        }
        // Every server at once (each pipelined), not one after another.
        let mut jobs: Vec<connection::ReadJob<'_, '_>> = Vec::new();
        for (server, connection) in self.servers.iter_mut().enumerate() {
            if let Some(list) = slices.remove(&server) {
                jobs.push((connection, list));
            }
        }
        connection::read_parallel(&mut jobs)
    }

    /// The file's size: one past the highest byte any server holds.
    pub fn file_size(&mut self, file: &FileHandle) -> Result<u64, ClientError> {
        if file.direct.is_some() {
            return self.file_size_tiered(file);
        }
        if let Some(copy) = &file.pfs_copy {
            return std::fs::metadata(copy).map(|m| m.len()).map_err(|source| ClientError::Io {
                endpoint: Endpoint::Unix(copy.clone()),
                source,
            });
        }
        let mut size = 0;
        for (server, id) in file.ids.iter().enumerate() {
            let Some(id) = *id else { continue };
            if self.unreachable.contains(&server) {
                continue;
            }
            let request = Request::Stat { epoch: file.epoch, file: id };
            match self.servers[server].call(&request, &[], None) {
                Ok((Response::FileStat(info), ())) => size = size.max(info.size_bytes),
                Ok((other, ())) => {
                    return Err(unexpected(&self.servers[server], "FileStat", &other))
                }
                // Every byte it held has another holder (replicas > 1).
                Err(e) if self.note_unreachable(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(size)
    }

    /// Every epoch on any server, merged.
    pub fn list_epochs(&mut self) -> Result<Vec<EpochSummary>, ClientError> {
        let started = Instant::now();
        let epochs = self.list_epochs_untraced()?;
        if self.tracer.is_some() {
            self.trace(TraceKind::Readdir, "/", 0, 0, started);
        }
        Ok(epochs)
    }

    fn list_epochs_untraced(&mut self) -> Result<Vec<EpochSummary>, ClientError> {
        let mut merged: BTreeMap<EpochId, EpochSummary> = BTreeMap::new();
        for connection in &mut self.servers {
            for info in every_epoch_on(connection)? {
                let entry = merged.entry(info.epoch).or_insert(EpochSummary {
                    epoch: info.epoch,
                    state: info.state,
                    servers: 0,
                    bytes: 0,
                });
                entry.servers += 1;
                entry.bytes += info.bytes;
                entry.state = least_advanced(entry.state, info.state);
            }
        }
        Ok(merged.into_values().collect())
    }

    /// Every file of an epoch, merged over servers (sizes are the maximum over servers).
    pub fn list_files(&mut self, epoch: EpochId) -> Result<Vec<(String, u64)>, ClientError> {
        let started = Instant::now();
        let files = self.list_files_untraced(epoch)?;
        if self.tracer.is_some() {
            self.trace(TraceKind::Readdir, &traced_epoch_name(epoch), 0, 0, started);
        }
        Ok(files)
    }

    fn list_files_untraced(&mut self, epoch: EpochId) -> Result<Vec<(String, u64)>, ClientError> {
        self.list_files_where(epoch, false)
    }

    /// The epoch's manifests (`.spillway/manifest/…`, every client's) on any server, with sizes.
    pub fn list_manifests(&mut self, epoch: EpochId) -> Result<Vec<(String, u64)>, ClientError> {
        let mut all = self.list_files_where(epoch, true)?;
        all.retain(|(name, _)| name.starts_with(manifest::MANIFEST_DIRECTORY));
        Ok(all)
    }

    /// The epoch's manifest intents (`.spillway/intent/…`, every client's) on any server.
    pub fn list_intents(&mut self, epoch: EpochId) -> Result<Vec<String>, ClientError> {
        let mut all = self.list_files_where(epoch, true)?;
        all.retain(|(name, _)| name.starts_with(manifest::INTENT_DIRECTORY));
        Ok(all.into_iter().map(|(name, _)| name).collect())
    }

    /// Every file of an epoch merged over servers: the user's, or (`reserved`) Spillway's own.
    fn list_files_where(
        &mut self,
        epoch: EpochId,
        reserved: bool,
    ) -> Result<Vec<(String, u64)>, ClientError> {
        let mut merged: BTreeMap<String, u64> = BTreeMap::new();
        for server in 0..self.servers.len() {
            // With replicas, every byte a lost server held has another holder that lists it.
            if self.unreachable.contains(&server) {
                continue;
            }
            let mut from_file = FileId(0);
            loop {
                let request = Request::ListFiles { epoch, from_file };
                let list = match self.servers[server].call(&request, &[], None) {
                    Ok((Response::Files(list), ())) => list,
                    Ok((other, ())) => {
                        return Err(unexpected(&self.servers[server], "Files", &other))
                    }
                    Err(e) if e.code() == Some(ErrorCode::NoSuchEpoch) => break,
                    Err(e) if self.note_unreachable(&e) => break,
                    Err(e) => return Err(e),
                };
                let Some(last) = list.last().map(|f| f.file) else { break };
                for FileInfo { name, size_bytes, .. } in list {
                    if name.starts_with(RESERVED_PREFIX) != reserved {
                        continue;
                    }
                    let size = merged.entry(name).or_insert(0);
                    *size = (*size).max(size_bytes);
                }
                match last.0.checked_add(1) {
                    Some(next) if next > from_file.0 => from_file = FileId(next),
                    _ => break,
                }
            }
        }
        Ok(merged.into_iter().collect())
    }

    /// Deletes the epoch on every server that has it.
    pub fn delete_epoch(&mut self, epoch: EpochId) -> Result<(), ClientError> {
        let started = Instant::now();
        self.delete_epoch_untraced(epoch)?;
        if let Some(created) = self.traced_creates.remove(&epoch) {
            for name in created {
                self.trace(TraceKind::Unlink, &traced_file_name(epoch, &name), 0, 0, started);
            }
        }
        Ok(())
    }

    fn delete_epoch_untraced(&mut self, epoch: EpochId) -> Result<(), ClientError> {
        if let Some(runtime) = &mut self.tiering {
            runtime.delete(epoch);
        }
        self.flush()?;
        for connection in &mut self.servers {
            match connection.call(&Request::DeleteEpoch { epoch }, &[], None) {
                Ok((Response::Deleted { .. }, ())) => {}
                Ok((other, ())) => return Err(unexpected(connection, "Deleted", &other)),
                Err(e) if e.code() == Some(ErrorCode::NoSuchEpoch) => {}
                Err(e) => return Err(e),
            }
        }
        self.touched.remove(&epoch);
        self.written.remove(&epoch);
        Ok(())
    }

    /// Asks every server holding `epoch` to drain it to the PFS (`mode`: 0 naive, 1 shuffled);
    /// returns once queued. Servers that do not have the epoch are skipped.
    pub fn request_drain(&mut self, epoch: EpochId, mode: u8) -> Result<usize, ClientError> {
        self.flush()?;
        let mut queued = 0;
        for connection in &mut self.servers {
            match connection.call(&Request::Drain { epoch, mode }, &[], None) {
                Ok((Response::DrainQueued { .. }, ())) => queued += 1,
                Ok((other, ())) => return Err(unexpected(connection, "DrainQueued", &other)),
                Err(e) if e.code() == Some(ErrorCode::NoSuchEpoch) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(queued)
    }

    /// Every server's drain status, `(server index, epochs)`.
    pub fn drain_status(&mut self) -> Result<Vec<(usize, Vec<DrainInfo>)>, ClientError> {
        let mut out = Vec::new();
        for (index, connection) in self.servers.iter_mut().enumerate() {
            match connection.call(&Request::DrainStatus, &[], None)? {
                (Response::DrainStatus(list), ()) => out.push((index, list)),
                (other, ()) => return Err(unexpected(connection, "DrainStatus", &other)),
            }
        }
        Ok(out)
    }

    /// Every server's status.
    pub fn status(&mut self) -> Result<Vec<ServerStatus>, ClientError> {
        let mut out = Vec::new();
        for connection in &mut self.servers {
            match connection.call(&Request::Status, &[], None)? {
                (Response::Status(status), ()) => out.push(status),
                (other, ()) => return Err(unexpected(connection, "Status", &other)),
            }
        }
        Ok(out)
    }
}

/// A participant's address as recorded: the endpoint, control characters replaced, cut to
/// what a record holds.
fn participant_address(endpoint: &Endpoint) -> String {
    let mut address: String =
        endpoint.to_string().chars().map(|c| if c.is_control() { '?' } else { c }).collect();
    let mut end = address.len().min(PARTICIPANT_ADDRESS_BYTES_MAX);
    while !address.is_char_boundary(end) {
        end -= 1;
    }
    address.truncate(end);
    address
}

fn read_pfs_copy(
    path: &std::path::Path,
    offset: u64,
    buffer: &mut [u8],
) -> Result<(), ClientError> {
    use std::os::unix::fs::FileExt;
    let io = |source| ClientError::Io { endpoint: Endpoint::Unix(path.to_path_buf()), source };
    let file = std::fs::File::open(path).map_err(io)?;
    buffer.fill(0);
    let mut done = 0;
    while done < buffer.len() {
        match file.read_at(&mut buffer[done..], offset + done as u64) {
            Ok(0) => break, // past the end reads as zeros, as in the burst buffer
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    Ok(())
}

fn least_advanced(a: EpochState, b: EpochState) -> EpochState {
    fn rank(s: EpochState) -> u8 {
        match s {
            EpochState::Open => 0,
            EpochState::CommittedMemory => 1,
            EpochState::Committed => 2,
            EpochState::Drained => 3,
        }
    }
    if rank(a) <= rank(b) {
        a
    } else {
        b
    }
}

/// Every epoch one server holds, paging through `ListEpochs`.
fn every_epoch_on(connection: &mut ServerConnection) -> Result<Vec<EpochInfo>, ClientError> {
    let mut out = Vec::new();
    let mut from_epoch = EpochId(0);
    loop {
        let list: Vec<EpochInfo> =
            match connection.call(&Request::ListEpochs { from_epoch }, &[], None)? {
                (Response::Epochs(list), ()) => list,
                (other, ()) => return Err(unexpected(connection, "Epochs", &other)),
            };
        let Some(last) = list.last().map(|e| e.epoch) else { break };
        out.extend(list);
        match last.0.checked_add(1) {
            Some(next) if next > from_epoch.0 => from_epoch = EpochId(next),
            _ => break,
        }
    }
    Ok(out)
}

fn unexpected(
    connection: &ServerConnection,
    expected: &'static str,
    got: &Response,
) -> ClientError {
    match got {
        Response::Error { code, message } => ClientError::Server {
            endpoint: connection.endpoint.clone(),
            code: *code,
            message: message.clone(),
        },
        other => ClientError::UnexpectedReply {
            endpoint: connection.endpoint.clone(),
            expected,
            got: format!("{:?}", other.kind()),
        },
    }
}

/// The name a traced file operation records: `epoch-<E>/<name>`, the layout drained epochs
/// have on the PFS.
pub fn traced_file_name(epoch: EpochId, name: &str) -> String {
    format!("{}/{name}", traced_epoch_name(epoch))
}

/// The name traced epoch-wide operations (commit, list files) record: `epoch-<E>`.
pub fn traced_epoch_name(epoch: EpochId) -> String {
    format!("epoch-{}", epoch.0)
}

/// Largest of Spillway's own files (epoch manifests, namespace snapshots) a reader loads whole.
/// Their writers set their size (one byte at offset 2^44 makes a sparse file that large), so a
/// larger one is refused as damaged before anything is allocated.
pub const OWN_FILE_BYTES_MAX: u64 = 256 << 20;

/// `(server, offset, length)` reads of a whole file of `size` bytes from one server (for
/// [`Client::read_ranges`]), in pieces the payload limit takes: for Spillway's own files,
/// which every server holds whole.
pub fn whole_file_reads(server: usize, size: u64) -> Vec<(usize, u64, u64)> {
    const PIECE: u64 = 1 << 20;
    (0..size.div_ceil(PIECE)).map(|i| (server, i * PIECE, PIECE.min(size - i * PIECE))).collect()
}
