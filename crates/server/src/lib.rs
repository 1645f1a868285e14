//! The burst buffer server: protocol handlers over one store.
//!
//! One process per burst buffer node. It listens on TCP and/or a Unix-domain socket,
//! establishes each peer's identity (from the kernel, or on TCP with `server.auth = munge` from
//! the munge credential the client sends right after `Hello`), and serves every connection with
//! two threads: a *reader* that decodes frames and reads write payloads straight into store memory
//! reserved for them ([`PendingWrite`]), and an *executor* that runs requests (publishing those
//! writes) in arrival order and writes replies.
//! Between them sits a bounded queue (`in_flight_requests_max`), so a client can pipeline that
//! many requests per connection and no more.
//!
//! Threads, not an async runtime: at 1 MiB transfers each request is a few hundred microseconds of
//! socket copying, connection counts are in the hundreds (bounded by
//! `connections_max`), and a blocking `read` straight into the final buffer is the fewest copies
//! and wakeups; an async runtime would add a scheduler hop per frame and buy nothing at these
//! counts. (Not A/B-measured against tokio yet; measured instead against the loopback limit by
//! `spillway bench ingress`.) When the store cannot reserve at once, the payload goes through a
//! buffer recycled in a bounded pool ([`budget::BufferPool`]) instead. Replies are buffered and
//! flushed when the queue runs dry, so small transfers do not pay a syscall each.
//!
//! Bounds: connections (`connections_max`), queued requests per connection
//! (`in_flight_requests_max`), payload bytes buffered over all connections
//! (`in_flight_bytes_max`, see [`budget`]), read reply buffers (one per connection, so at most
//! `connections_max × payload_bytes_max`), recycled buffers (a quarter of the in-flight budget,
//! at most 256 MiB), the time a write waits for space (`backpressure_wait_ms_max`) and the time a
//! client may stall mid-frame while its write holds ring space (`frame_stall_ms_max`), which also
//! bounds the wait for a munge client's `Authenticate` after the handshake.
//!
//! Fairness under hostile load ([`Fairness`]): every connection must finish Hello (+
//! Authenticate) within `handshake_timeout_ms`. One whose identity is not known yet (TCP on a
//! munge server, before its credential) counts against `handshakes_max` only; once identified
//! (at accept from the kernel, or by its credential) it counts against `connections_max` and,
//! unless it is root, against its uid's `connections_per_user_max`, and its writes against the
//! uid's `in_flight_bytes_per_user_max`. A connection with nothing in flight for `idle_timeout_ms` is
//! closed; a payload arriving slower than `frame_bytes_per_second_min` (after a grace window) is
//! dropped with its connection, releasing the budget it held.

mod access;
mod activity;
pub mod backend;
pub mod budget;
mod connection;
pub mod identity;
mod metrics;
pub mod namespace_service;
pub mod namespace_watch;
mod store_backend;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use spillway_config::server::{CommitDurability, ServerKnobs};
use spillway_config::Authentication;
use spillway_proto::transport::{self, BindError};
use spillway_proto::{AuthMethod, Durability, Endpoint, Listener};
use spillway_sys::munge::{MungeContext, MungeError};
use spillway_types::EpochId;

pub use backend::{
    assigned_stream_key, Backend, BackendError, GrantMode, PendingWrite, Usage, ASSIGNED_STREAM_TAG,
};

/// The server's view of a drainer (implemented by `spillway_drain::Drainer`): requests and
/// status travel over the protocol, the drainer does the work on its own threads.
pub trait DrainControl: Send + Sync + 'static {
    /// Queues a drain of `epoch` (`mode`: 0 naive, 1 shuffled). Must not block on the drain.
    fn request(&self, epoch: EpochId, mode: u8) -> Result<(), BackendError>;
    /// Called after every successful commit (auto-drain, if the drainer is configured so).
    fn committed(&self, epoch: EpochId);
    /// The drain state of every epoch the drainer knows of.
    fn status(&self) -> Vec<spillway_proto::DrainInfo>;
    /// Bytes written to the PFS by drains since the drainer started (a counter).
    fn pfs_bytes_written_total(&self) -> u64 {
        0
    }
}

/// Reads the server's ingest counter (bytes written by clients so far): the drainer yields
/// bandwidth while it moves.
/// Holds the server weakly (the drainer it feeds is owned by the server: no cycle).
#[derive(Clone)]
pub struct IngestProbe(std::sync::Weak<Shared>);

impl IngestProbe {
    /// Bytes clients wrote so far; 0 once the server is gone.
    pub fn bytes_written(&self) -> u64 {
        self.0.upgrade().map(|s| s.counters.bytes_written.load(Ordering::Relaxed)).unwrap_or(0)
    }
}
pub use identity::{IdentityError, ServerIdentity};
pub use store_backend::StoreBackend;

/// The server's limits and defaults, derived from [`ServerKnobs`].
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub server_name: String,
    /// The failure domain announced in `HelloReply` and `StatusReply` (valid by
    /// [`spillway_types::is_failure_domain`]; [`failure_domain_of`] resolves the knob).
    pub failure_domain: String,
    pub connections_max: u32,
    pub payload_bytes_max: u32,
    pub in_flight_requests_max: u32,
    pub in_flight_bytes_max: u64,
    pub backpressure_wait: Duration,
    pub default_durability: Durability,
    pub shutdown_grace: Duration,
    pub frame_stall: Duration,
    /// Take data only for epochs the manager granted (`server.managed`); otherwise the first
    /// uid to create an epoch claims it.
    pub managed: bool,
    /// How TCP peers are authenticated; Unix-socket peers always by `SO_PEERCRED`.
    pub auth: AuthMethod,
    /// `munged`'s socket for checking credentials (`None`: libmunge's default).
    pub munge_socket: Option<std::path::PathBuf>,
    /// Timeouts and per-uid caps against hostile clients.
    pub fairness: Fairness,
}

/// What keeps one client, or a flood of connections, from starving the others.
#[derive(Clone, Debug)]
pub struct Fairness {
    /// From accept to a completed Hello (+ Authenticate); then the connection is closed.
    pub handshake_timeout: Duration,
    /// Unauthenticated connections in their handshake at once (apart from `connections_max`).
    pub handshakes_max: u32,
    /// Nothing in flight and no frame arriving for this long: the connection is closed.
    pub idle_timeout: Duration,
    /// Slowest accepted arrival of a payload, in bytes per second.
    pub frame_bytes_per_second_min: u64,
    /// Grace and measuring window of `frame_bytes_per_second_min`.
    pub frame_rate_window: Duration,
    /// Identified connections per uid (root exempt).
    pub connections_per_user_max: u32,
    /// Write payload bytes in flight per uid (root exempt).
    pub in_flight_bytes_per_user_max: u64,
    /// Longest a namespace change waits for other mounts' watchers to acknowledge it (then
    /// the laggards are stale and not waited for again).
    pub namespace_invalidation_wait: Duration,
    /// Namespace change watchers per non-root uid per namespace, stale ones counted (root
    /// exempt: its watchers are the mounts).
    pub namespace_watchers_per_user_max: u32,
}

impl Fairness {
    pub fn from_knobs(knobs: &ServerKnobs) -> Self {
        Fairness {
            handshake_timeout: Duration::from_millis(knobs.handshake_timeout_ms),
            handshakes_max: knobs.handshakes_max,
            idle_timeout: Duration::from_millis(knobs.idle_timeout_ms),
            frame_bytes_per_second_min: knobs.frame_bytes_per_second_min,
            frame_rate_window: Duration::from_millis(knobs.frame_rate_window_ms),
            connections_per_user_max: knobs.connections_per_user_max,
            in_flight_bytes_per_user_max: knobs.in_flight_bytes_per_user_max,
            namespace_invalidation_wait: Duration::from_millis(
                knobs.namespace_invalidation_wait_ms,
            ),
            namespace_watchers_per_user_max: knobs.namespace_watchers_per_user_max,
        }
    }
}

impl Default for Fairness {
    /// The knobs' defaults.
    fn default() -> Self {
        Fairness::from_knobs(&ServerKnobs::default())
    }
}

impl ServerOptions {
    pub fn from_knobs(knobs: &ServerKnobs) -> Self {
        ServerOptions {
            server_name: knobs.server_name.clone(),
            failure_domain: failure_domain_of(knobs),
            connections_max: knobs.connections_max,
            payload_bytes_max: knobs.payload_bytes_max,
            in_flight_requests_max: knobs.in_flight_requests_max,
            in_flight_bytes_max: knobs.in_flight_bytes_max,
            backpressure_wait: Duration::from_millis(knobs.backpressure_wait_ms_max),
            default_durability: match knobs.commit_durability {
                CommitDurability::Ssd => Durability::Ssd,
                CommitDurability::Memory => Durability::Memory,
            },
            shutdown_grace: Duration::from_millis(knobs.shutdown_grace_ms_max),
            frame_stall: Duration::from_millis(knobs.frame_stall_ms_max),
            managed: knobs.managed,
            auth: match knobs.auth {
                Authentication::None => AuthMethod::None,
                Authentication::Munge => AuthMethod::Munge,
            },
            munge_socket: knobs.munge_socket_path(),
            fairness: Fairness::from_knobs(knobs),
        }
    }
}

/// The failure domain `knobs` give: `server.failure_domain`, or when that is empty this host's
/// name (the UTS nodename, as uname(2) reports it). A host name that is not a valid domain name
/// (unreadable, or with characters outside `[A-Za-z0-9._-]`) becomes `unnamed-host`, logged:
/// servers that share it are taken for one domain, which only refuses replica placements, never
/// puts two replicas on one host.
pub fn failure_domain_of(knobs: &ServerKnobs) -> String {
    if !knobs.failure_domain.is_empty() {
        return knobs.failure_domain.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .unwrap_or_default();
    if spillway_types::is_failure_domain(&host) {
        return host;
    }
    tracing::warn!(host_name = %host, "the host name is not a valid failure domain; using unnamed-host (set server.failure_domain)");
    "unnamed-host".to_string()
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("no listener configured: give a TCP address or a Unix socket path")]
    NoListener,
    #[error("failure domain {0:?} is not [A-Za-z0-9][A-Za-z0-9._-]* of at most 64 bytes")]
    FailureDomain(String),
    #[error("cannot start thread {name}: {source}")]
    Thread { name: String, source: std::io::Error },
    #[error("final sync of the store at shutdown failed: {0}")]
    FinalSync(BackendError),
    #[error("server.auth = munge, but {0}")]
    Munge(MungeError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

/// Counters reported by `status`.
#[derive(Default)]
pub(crate) struct Counters {
    pub requests_served: AtomicU64,
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
}

/// State shared by the accept loop and every connection.
pub(crate) struct Shared {
    pub backend: Arc<dyn Backend>,
    pub options: ServerOptions,
    pub budget: Arc<budget::ByteBudget>,
    pub pool: budget::BufferPool,
    pub shutdown: AtomicBool,
    /// Identified connections (against `connections_max`).
    pub connections: AtomicU32,
    /// Connections in their handshake (against `handshakes_max`).
    pub handshakes: AtomicU32,
    /// Per non-root uid: identified connections and its in-flight write budget.
    pub users: Mutex<HashMap<u32, connection::UserEntry>>,
    pub counters: Counters,
    /// The drainer, if this server drains to a PFS (set once, before or while serving).
    pub drain: std::sync::OnceLock<Arc<dyn DrainControl>>,
    /// The namespaces (metadata service) this server holds, if attached.
    pub namespaces: std::sync::OnceLock<Arc<namespace_service::NamespaceService>>,
    /// How credentials are checked, when TCP peers must authenticate with munge.
    pub munge: Option<MungeContext>,
    /// Who this server is (`HelloReply`, `StatusReply`).
    pub identity: ServerIdentity,
    /// The cluster it serves (`JoinCluster`); in memory unless a file was attached.
    pub cluster: std::sync::OnceLock<identity::ClusterMembership>,
    /// Request latency by kind, for the metrics.
    pub latency: metrics::Latency,
    /// What each granted epoch saw, for the manager's record of achieved rates.
    pub activity: activity::ActivityBoard,
}

/// The munge context of a server with `auth = munge` (`None` otherwise), after checking that
/// libmunge loads and asking `munged` for one credential.
fn munge_context(options: &ServerOptions) -> Result<Option<MungeContext>, ServeError> {
    if options.auth != AuthMethod::Munge {
        return Ok(None);
    }
    let context = MungeContext::new().with_socket(options.munge_socket.clone());
    match context.encode(b"spillway server start") {
        Ok(_) => {
            tracing::info!(socket = %context.socket_description(), "authenticating TCP clients with munge")
        }
        Err(error @ MungeError::Library { .. }) => return Err(ServeError::Munge(error)),
        Err(error) => {
            tracing::warn!(%error, "munge authentication is on but munged does not answer: TCP clients are refused until it does")
        }
    }
    Ok(Some(context))
}

/// A handle that asks a running server to shut down gracefully (what SIGTERM does).
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Shared>);

impl ShutdownHandle {
    /// Stop accepting, finish in-flight requests, sync memory-durability epochs, return from
    /// [`Server::run`].
    pub fn shutdown(&self) {
        self.0.shutdown.store(true, Ordering::SeqCst);
    }
}

/// A bound, not yet running server.
pub struct Server {
    shared: Arc<Shared>,
    listeners: Vec<Box<dyn Listener>>,
}

impl Server {
    /// Binds every endpoint, as a server without an identity file: a new random id at every
    /// start, incarnation 0 (servers embedded in tests and benchmarks; `spillway serve` uses
    /// [`Server::bind_as`] with the identity kept in its SSD directory).
    pub fn bind(
        options: ServerOptions,
        backend: Arc<dyn Backend>,
        endpoints: &[Endpoint],
        insecure_tcp: bool,
    ) -> Result<Server, ServeError> {
        let identity = ServerIdentity::ephemeral()?;
        Server::bind_as(options, backend, endpoints, insecure_tcp, identity)
    }

    /// Binds every endpoint; the server announces `identity`. Non-loopback TCP needs munge
    /// authentication or `insecure_tcp` (which logs a warning). With munge, libmunge must load;
    /// an unreachable `munged` is only a warning (TCP clients are refused until it answers).
    pub fn bind_as(
        options: ServerOptions,
        backend: Arc<dyn Backend>,
        endpoints: &[Endpoint],
        insecure_tcp: bool,
        identity: ServerIdentity,
    ) -> Result<Server, ServeError> {
        assert!(options.in_flight_bytes_max >= options.payload_bytes_max as u64);
        assert!(options.in_flight_requests_max > 0 && options.connections_max > 0);
        assert!(options.fairness.in_flight_bytes_per_user_max >= options.payload_bytes_max as u64);
        assert!(
            options.fairness.handshakes_max > 0 && options.fairness.connections_per_user_max > 0
        );
        if endpoints.is_empty() {
            return Err(ServeError::NoListener);
        }
        if !spillway_types::is_failure_domain(&options.failure_domain) {
            return Err(ServeError::FailureDomain(options.failure_domain));
        }
        let munge = munge_context(&options)?;
        let mut listeners = Vec::new();
        for endpoint in endpoints {
            if let Endpoint::Tcp(address) = endpoint {
                if !address.ip().is_loopback() && munge.is_none() {
                    tracing::warn!(%address, "listening on a non-loopback TCP address WITHOUT AUTHENTICATION (server.auth = none, --insecure-tcp): any host that can reach it acts as nobody, and reads and writes every epoch nobody may; set server.auth = munge");
                }
            }
            listeners.push(transport::bind(endpoint, insecure_tcp || munge.is_some())?);
        }
        let shared = Arc::new(Shared {
            budget: Arc::new(budget::ByteBudget::new(options.in_flight_bytes_max)),
            // Enough recycled buffers for steady streaming, never more than 1/4 of the budget.
            pool: budget::BufferPool::new((options.in_flight_bytes_max / 4).min(256 << 20)),
            backend,
            options,
            shutdown: AtomicBool::new(false),
            connections: AtomicU32::new(0),
            handshakes: AtomicU32::new(0),
            users: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            drain: std::sync::OnceLock::new(),
            namespaces: std::sync::OnceLock::new(),
            cluster: std::sync::OnceLock::new(),
            munge,
            identity,
            latency: metrics::Latency::default(),
            activity: activity::ActivityBoard::default(),
        });
        Ok(Server { shared, listeners })
    }

    /// Where the server listens (real ports, if port 0 was asked).
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.listeners.iter().map(|l| l.endpoint()).collect()
    }

    /// Keeps the cluster this server serves in `directory` (its SSD directory, `CLUSTER`) rather
    /// than in memory. Returns false if already attached (or a `JoinCluster` came first).
    pub fn attach_cluster_file(&self, directory: &std::path::Path) -> Result<bool, IdentityError> {
        let membership = identity::ClusterMembership::load(directory)?;
        Ok(self.shared.cluster.set(membership).is_ok())
    }

    /// Attaches a drainer: `Drain`/`DrainStatus` requests go to it, commits notify it.
    /// Returns false if one was already attached.
    pub fn attach_drain(&self, control: Arc<dyn DrainControl>) -> bool {
        self.shared.drain.set(control).is_ok()
    }

    /// Serves namespace (metadata) requests, keeping namespace journals in `directory`
    /// (normally `<store directory>/namespaces`); `file_bytes_max` is the store's
    /// `store.file_bytes_max` (no namespace file may be larger than its store accepts).
    /// Returns false if already attached.
    pub fn attach_namespaces(&self, directory: std::path::PathBuf, file_bytes_max: u64) -> bool {
        let service = namespace_service::NamespaceService::new(
            directory,
            self.shared.backend.clone(),
            spillway_meta::LocalOptions {
                file_bytes_max,
                ..spillway_meta::LocalOptions::default()
            },
            namespace_watch::WatchOptions {
                ack_wait: self.shared.options.fairness.namespace_invalidation_wait,
                watchers_per_user_max: self.shared.options.fairness.namespace_watchers_per_user_max
                    as usize,
                ..namespace_watch::WatchOptions::default()
            },
        );
        self.shared.namespaces.set(Arc::new(service)).is_ok()
    }

    /// Renders this server's Prometheus samples (for `spillway_metrics::serve`); empty once
    /// the server is gone.
    pub fn metrics(&self) -> spillway_metrics::Render {
        let shared = Arc::downgrade(&self.shared);
        Arc::new(move || shared.upgrade().map(|s| metrics::render(&s)).unwrap_or_default())
    }

    /// A reader of the ingest counter (for the drainer's bandwidth cap).
    pub fn ingest_probe(&self) -> IngestProbe {
        IngestProbe(Arc::downgrade(&self.shared))
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shared.clone())
    }

    /// Serves until shut down, then drains: stops accepting, lets every connection finish the
    /// requests it has received, waits for background SSD commits, returns.
    pub fn run(self) -> Result<(), ServeError> {
        let shared = self.shared;
        let endpoints: Vec<String> =
            self.listeners.iter().map(|l| l.endpoint().to_string()).collect();
        tracing::info!(server = %shared.options.server_name, endpoints = ?endpoints, id = %shared.identity.id, incarnation = shared.identity.incarnation, failure_domain = %shared.options.failure_domain, "serving");
        let mut workers: Vec<JoinHandle<()>> = Vec::new();
        let mut next_connection = 0u64;
        while !shared.shutdown.load(Ordering::SeqCst) {
            let mut accepted_any = false;
            for listener in &self.listeners {
                match listener.accept() {
                    Ok(Some(conn)) => {
                        accepted_any = true;
                        next_connection += 1;
                        workers.retain(|w| !w.is_finished());
                        let shared = shared.clone();
                        let name = format!("conn-{next_connection}");
                        let spawned = std::thread::Builder::new()
                            .name(name.clone())
                            .spawn(move || connection::serve(shared, conn));
                        match spawned {
                            Ok(handle) => workers.push(handle),
                            Err(error) => {
                                tracing::error!(%error, "cannot start a connection thread; connection dropped")
                            }
                        }
                    }
                    Ok(None) => {}
                    Err(error) => {
                        // EMFILE and friends: log and back off instead of spinning.
                        tracing::error!(listener = %listener.endpoint(), %error, "accept failed");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
            if !accepted_any {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        tracing::info!(
            connections = shared.connections.load(Ordering::SeqCst),
            "shutting down: no longer accepting, finishing in-flight requests"
        );
        drop(self.listeners);
        for worker in workers {
            let _ = worker.join();
        }
        if let Some(namespaces) = shared.namespaces.get() {
            if let Err(failure) = namespaces.sync_all() {
                tracing::error!(%failure, "final namespace sync failed");
            }
        }
        shared.backend.sync().map_err(ServeError::FinalSync)?;
        tracing::info!("shutdown complete: in-flight requests finished, store synced");
        Ok(())
    }
}
