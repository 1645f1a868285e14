//! `spillway-manager`: the control plane of the burst buffer.
//!
//! The manager knows the servers (address, pool, capacity, health by heartbeat), the pools and
//! every reservation, and keeps that state in SQLite so it survives a restart ([`db`]). It
//! grants capacity in fragments over a pool's servers, picks the pool by BIOS Algorithm 2 and
//! the stream id by BIOS Algorithm 1, enforces quotas and ownership ([`service`]), and serves
//! all of it as HTTP/JSON on a Unix socket whose peer credentials identify the caller
//! ([`http`]), and optionally on TCP (the loopback owner, or a munge credential per request:
//! [`request_auth`]). Its own connections to servers (heartbeats, streams, namespaces, deletes)
//! run as root and authenticate with munge when a server asks, through `manager.munge_socket`.
//! The CLI talks to it through [`api`]; staging data between the PFS and a reservation runs in
//! the CLI process ([`stage`]), so bulk data never passes through the
//! manager and PFS files are read and written with the caller's own permissions.

pub mod admin;
pub mod admission;
pub mod api;
pub mod db;
pub mod heartbeat;
pub mod http;
pub mod identity;
pub mod job_owner;
pub mod job_use;
mod metrics;
pub mod model;
pub mod peaks;
pub mod replicate;
pub mod request_auth;
pub mod rescue;
pub mod service;
pub mod stage;
mod targets;
pub mod tiering;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use spillway_config::ManagerKnobs;
use spillway_proto::{Endpoint, EpochGrant};

pub use api::{ApiClient, ApiClientError};
pub use identity::Caller;
pub use job_owner::{JobOwnerError, JobOwners};
pub use model::*;
pub use service::{Clock, Manager, StatusView, SystemClock};

/// Permission bits of a socket directory the manager creates: anyone may reach the socket
/// (whose own mode is `manager.socket_mode`, `0666` by default: identity comes from
/// `SO_PEERCRED`, not from who may connect).
const SOCKET_DIRECTORY_MODE: u32 = 0o755;

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    #[error("{0}")]
    Database(#[from] db::OpenError),
    #[error("reading the database at start: {0}")]
    Read(#[from] service::ReadError),
    #[error("{0}")]
    Config(#[from] spillway_config::ConfigError),
    #[error("knob manager.admin_group: {0}")]
    AdminGroup(String),
    #[error("cannot create the socket directory {path}: {source}")]
    SocketDirectory { path: PathBuf, source: std::io::Error },
    #[error("cannot set mode {mode:o} on socket {path}: {source}")]
    SocketMode { path: PathBuf, mode: u32, source: std::io::Error },
    #[error("{0}")]
    Bind(#[from] spillway_proto::transport::BindError),
    #[error("knob manager.listen_address = {address:?}: {reason}")]
    ListenAddress { address: String, reason: String },
    #[error("knob manager.metrics_listen_address = {address:?}: {source}")]
    Metrics { address: String, source: std::io::Error },
}

/// Runs the manager until `stop` is set: opens the database, starts the heartbeat, serves the
/// API. `on_listening` is called with every endpoint once it accepts connections.
pub fn run_daemon(
    knobs: ManagerKnobs,
    stop: Arc<AtomicBool>,
    on_listening: &dyn Fn(&Endpoint),
) -> Result<(), DaemonError> {
    let admin_gid = identity::resolve_group(&knobs.admin_group).map_err(DaemonError::AdminGroup)?;
    if knobs.job_owner_check == spillway_config::JobOwnerCheck::Slurm
        && !job_owner::squeue_on_path()
    {
        tracing::warn!(
            "manager.job_owner_check = \"slurm\" but no squeue on PATH: users' reservations for \
             Slurm jobs (--job) will be refused; set it to \"none\" on a site without Slurm"
        );
    }
    let db = db::Db::open(Path::new(&knobs.database_path))?;
    let manager = Arc::new(Manager::new(db, knobs.clone(), admin_gid, Arc::new(SystemClock))?);
    let mut listeners = Vec::new();
    if !knobs.socket_path.is_empty() {
        let path = PathBuf::from(&knobs.socket_path);
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            // A directory the manager creates lets everyone reach the socket, whatever the
            // umask (DirBuilder's mode is narrowed by it, so the bits are set afterwards).
            let created = !parent.exists();
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            let directory_error =
                |source| DaemonError::SocketDirectory { path: parent.to_path_buf(), source };
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(SOCKET_DIRECTORY_MODE)
                .create(parent)
                .map_err(directory_error)?;
            if created {
                std::fs::set_permissions(
                    parent,
                    std::fs::Permissions::from_mode(SOCKET_DIRECTORY_MODE),
                )
                .map_err(directory_error)?;
            }
        }
        let listener = spillway_proto::transport::bind(&Endpoint::Unix(path.clone()), false)?;
        use std::os::unix::fs::PermissionsExt;
        let mode = knobs.socket_mode_bits()?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(|source| DaemonError::SocketMode { path: path.clone(), mode, source })?;
        listeners.push(listener);
    }
    if !knobs.listen_address.is_empty() {
        let address: std::net::SocketAddr =
            knobs.listen_address.parse().map_err(|e: std::net::AddrParseError| {
                DaemonError::ListenAddress {
                    address: knobs.listen_address.clone(),
                    reason: e.to_string(),
                }
            })?;
        // Remote callers only when each request is authenticated with munge.
        let remote_allowed = knobs.auth == spillway_config::Authentication::Munge;
        listeners.push(spillway_proto::transport::bind(&Endpoint::Tcp(address), remote_allowed)?);
    }
    let _metrics = start_metrics(&knobs.metrics_listen_address, &manager)?;
    let background = spawn_background(&manager, &stop);
    for listener in &listeners {
        on_listening(&listener.endpoint());
    }
    http::serve(Arc::clone(&manager), listeners, Arc::clone(&stop));
    for thread in background {
        let _ = thread.join();
    }
    if !knobs.socket_path.is_empty() {
        let _ = std::fs::remove_file(&knobs.socket_path);
    }
    Ok(())
}

/// The `/metrics` listener, if `manager.metrics_listen_address` names one.
fn start_metrics(
    address: &str,
    manager: &Arc<Manager>,
) -> Result<Option<spillway_metrics::MetricsServer>, DaemonError> {
    if address.is_empty() {
        return Ok(None);
    }
    let of = Arc::clone(manager);
    let render: spillway_metrics::Render = Arc::new(move || metrics::render(&of, &of.api_latency));
    let server = spillway_metrics::serve(address, render)
        .map_err(|source| DaemonError::Metrics { address: address.to_string(), source })?;
    tracing::info!(address = %server.local_addr(), "metrics at /metrics");
    Ok(Some(server))
}

/// The heartbeat thread and the re-replication thread, both until `stop` is set.
fn spawn_background(
    manager: &Arc<Manager>,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    let heartbeat = {
        let (manager, stop) = (Arc::clone(manager), Arc::clone(stop));
        std::thread::Builder::new()
            .name("manager-heartbeat".into())
            .spawn(move || {
                let prober = heartbeat::ClientProber::of(&manager);
                heartbeat::run(manager, Arc::new(prober), stop)
            })
            .expect("spawning the heartbeat thread")
    };
    let repair = {
        let (manager, stop) = (Arc::clone(manager), Arc::clone(stop));
        std::thread::Builder::new()
            .name("manager-repair".into())
            .spawn(move || replicate::run(manager, stop))
            .expect("spawning the re-replication thread")
    };
    vec![heartbeat, repair]
}

/// Creates a striped reservation's POSIX namespace (the one its mounts show and stage-in fills)
/// on its first server: id `namespace_id`, data epoch `epoch`, root directory owned by the
/// reservation's owner, mode 0755. Only root may create namespaces on a server, so the manager
/// (root) does it when the reservation is created; private reservations get one namespace per
/// compute node, created by each node's mount. Creating an existing namespace is harmless.
/// `munge_socket`: where credentials come from if the server requires munge.
pub fn create_reservation_namespace(
    reservation: &Reservation,
    munge_socket: Option<&Path>,
) -> Result<(), String> {
    if reservation.access != Access::Striped {
        return Ok(());
    }
    let servers: Vec<Endpoint> =
        reservation.servers.iter().map(|s| s.parse::<Endpoint>()).collect::<Result<_, _>>()?;
    if servers.is_empty() {
        return Err(format!("reservation {} has no servers", reservation.name));
    }
    let place = spillway_policy::namespace::namespace_placement(
        spillway_policy::namespace::NamespaceAccess::Striped,
        reservation.namespace_id,
        "",
        servers.len(),
    );
    let options = spillway_client::meta::RemoteOptions {
        create: true,
        data_epoch: spillway_types::EpochId(reservation.epoch),
        root_uid: reservation.owner,
        root_gid: reservation.group,
        root_mode: 0o755,
        connections_max: 1,
        munge_socket: munge_socket.map(Path::to_path_buf),
    };
    spillway_client::meta::RemoteNamespace::open(&servers[place.server], place.namespace, &options)
        .map(|_| ())
        .map_err(|e| {
            format!("creating namespace {} on {}: {e}", place.namespace, servers[place.server])
        })
}

/// The grant of the reservation's epoch on its server at `stripe_index` (in stripe order): the
/// owner, the allowed uids and groups of a persistent reservation, the capacity of the
/// fragments placed on that server, the reservation's whole capacity (what `statfs` of its
/// namespace reports) and the SSD stream BIOS Algorithm 1 chose for it.
pub fn reservation_grant(reservation: &Reservation, stripe_index: usize) -> EpochGrant {
    let (allowed_uids, allowed_gids) = if reservation.persistent {
        (reservation.allowed_uids.clone(), reservation.allowed_gids.clone())
    } else {
        (Vec::new(), Vec::new())
    };
    // Placement puts whole fragments on every server it picks, and a grant's capacity 0 would
    // mean "no limit": a reservation without fragments on a server is a bug, not a grant.
    assert_eq!(
        reservation.servers.len(),
        reservation.server_fragments.len(),
        "reservation {}: servers and server_fragments are parallel",
        reservation.id
    );
    let fragments = reservation.server_fragments[stripe_index];
    assert!(
        fragments > 0 && reservation.fragment_bytes > 0,
        "reservation {}: no capacity on server {stripe_index}",
        reservation.id
    );
    EpochGrant {
        owner_uid: reservation.owner,
        owner_gid: reservation.group,
        allowed_uids,
        allowed_gids,
        capacity_bytes: fragments * reservation.fragment_bytes,
        reservation_capacity_bytes: reservation.capacity_bytes,
        stream: Some(reservation.stream as u64),
    }
}

/// Sends each of the reservation's servers the grant of its epoch there
/// ([`reservation_grant`]): from then on a managed server takes the epoch's data only from the
/// owner, the allowed users and groups, and root, up to its share of the capacity, into the
/// reservation's stream. Called when the reservation is created (and, through
/// [`grant_reservations`], every heartbeat). Returns each server the grant did not reach, with
/// why.
pub fn grant_reservation(
    reservation: &Reservation,
    munge_socket: Option<&Path>,
) -> Vec<(String, String)> {
    grant_reservations(std::slice::from_ref(reservation), munge_socket)
        .into_iter()
        .map(|failure| (failure.server, failure.error))
        .collect()
}

/// A grant that did not reach a server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantFailure {
    pub reservation: u64,
    pub server: String,
    pub error: String,
}

/// Sends every grant of `reservations` ([`reservation_grant`]) to its server, over one
/// connection per server (one authentication each, however many reservations it holds). The
/// heartbeat calls it with every active reservation, so a server that was down, or lost its
/// disk, catches up; an unchanged grant costs a server nothing.
pub fn grant_reservations(
    reservations: &[Reservation],
    munge_socket: Option<&Path>,
) -> Vec<GrantFailure> {
    let mut by_server: std::collections::BTreeMap<&str, Vec<(&Reservation, EpochGrant)>> =
        std::collections::BTreeMap::new();
    for reservation in reservations {
        for (index, address) in reservation.servers.iter().enumerate() {
            // A lost server is never granted again (its host may not even refuse connections).
            if reservation.degraded.as_ref().is_some_and(|d| d.lost_servers.contains(address)) {
                continue;
            }
            let grant = reservation_grant(reservation, index);
            by_server.entry(address.as_str()).or_default().push((reservation, grant));
        }
    }
    let mut failures = Vec::new();
    for (address, grants) in by_server {
        let mut client = match connect_one(address, "spillway-manager grants", munge_socket) {
            Ok(client) => client,
            Err(error) => {
                failures.extend(grants.iter().map(|(reservation, _)| GrantFailure {
                    reservation: reservation.id,
                    server: address.to_string(),
                    error: format!("granting epoch {}: {error}", reservation.epoch),
                }));
                continue;
            }
        };
        for (reservation, grant) in grants {
            let epoch = spillway_types::EpochId(reservation.epoch);
            if let Err(error) = client.grant_epoch(epoch, &grant) {
                failures.push(GrantFailure {
                    reservation: reservation.id,
                    server: address.to_string(),
                    error: format!("granting epoch {epoch}: {error}"),
                });
            }
        }
    }
    failures
}

/// A client of the one server at `address` (credentials from `munge_socket` if the server
/// requires munge).
fn connect_one(
    address: &str,
    client_name: &str,
    munge_socket: Option<&Path>,
) -> Result<spillway_client::Client, String> {
    let endpoint = address.parse::<Endpoint>()?;
    let options = spillway_client::ClientOptions {
        client_name: client_name.into(),
        munge_socket: munge_socket.map(Path::to_path_buf),
        ..Default::default()
    };
    spillway_client::Client::connect(&[endpoint], options).map_err(|e| e.to_string())
}

/// Retires a destroyed reservation's data on each of its servers: revokes the grant of its
/// epoch (so nobody but root may use what is left; the reply says what the server saw of the
/// epoch since its grant), then deletes the epoch. Best effort: a server that cannot be reached
/// is logged (its store keeps the epoch, and the grant, until deleted by hand or drained); the
/// reservation's capacity is already free in the manager. Returns what each server that
/// answered the revoke saw.
pub fn retire_reservation_data(
    reservation: &Reservation,
    munge_socket: Option<&Path>,
) -> Vec<spillway_proto::EpochActivity> {
    let epoch = spillway_types::EpochId(reservation.epoch);
    let mut seen = Vec::with_capacity(reservation.servers.len());
    for address in &reservation.servers {
        let outcome = connect_one(address, "spillway-manager teardown", munge_socket).and_then(
            |mut client| {
                let activity =
                    client.revoke_epoch(epoch).map_err(|e| format!("revoking the grant: {e}"))?;
                seen.extend(activity);
                client.delete_epoch(epoch).map_err(|e| format!("deleting the epoch: {e}"))
            },
        );
        if let Err(error) = outcome {
            tracing::warn!(
                reservation = reservation.id, server = %address, epoch = reservation.epoch, %error,
                "could not retire the destroyed reservation's data"
            );
        }
    }
    seen
}

#[cfg(test)]
mod grant_tests {
    use super::*;

    fn reservation(persistent: bool) -> Reservation {
        Reservation {
            id: 7,
            name: "r".into(),
            owner: 1000,
            group: 100,
            job: None,
            persistent,
            capacity_bytes: 24 << 20,
            requested_bytes: 20 << 20,
            fragments: 3,
            fragment_bytes: 8 << 20,
            servers: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
            server_fragments: vec![2, 1],
            server_pfs_dirs: vec![None, None],
            pool: "p".into(),
            access: Access::Striped,
            epoch: 9,
            namespace_id: 3,
            stream: 5,
            state: ReservationState::Active,
            created_unix_s: 0,
            allowed_uids: vec![1001],
            allowed_gids: vec![4242],
            jobs: Vec::new(),
            rescue: None,
            replicas: 1,
            tiering: None,
            server_domains: vec![None, None],
            degraded: None,
            repair: None,
            achieved: None,
            targets: None,
        }
    }

    #[test]
    fn each_server_is_granted_its_share_and_the_reservation_its_whole() {
        let persistent = reservation(true);
        let first = reservation_grant(&persistent, 0);
        assert_eq!((first.owner_uid, first.owner_gid), (1000, 100));
        assert_eq!(first.capacity_bytes, 16 << 20, "two 8 MiB fragments on the first server");
        assert_eq!(reservation_grant(&persistent, 1).capacity_bytes, 8 << 20);
        assert_eq!(first.reservation_capacity_bytes, 24 << 20);
        assert_eq!(first.stream, Some(5));
        assert_eq!((first.allowed_uids, first.allowed_gids), (vec![1001], vec![4242]));
        // A job-scoped reservation is its owner's alone, whatever was stored with it.
        let job = reservation_grant(&reservation(false), 0);
        assert!(job.allowed_uids.is_empty() && job.allowed_gids.is_empty());
    }
}
