//! Server health: every `heartbeat_ms` the manager asks each server for its `Status`.
//!
//! A server that answers is up (its miss count resets); one that does not answer counts a miss,
//! and `heartbeat_misses_max` consecutive misses mark it down, so new reservations avoid it
//! (`fragments::allocate` skips unhealthy servers). The probe sits behind [`Prober`] so the
//! bookkeeping is tested without processes; [`ClientProber`] is the real one, over
//! `spillway-client`. Servers are probed one after another (a control-plane rate; a dead
//! loopback server refuses the connection at once).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_client::{Client, ClientOptions};
use spillway_proto::{DrainState, Endpoint};

use crate::service::{Manager, Probe};

/// Asks one server whether it is alive.
pub trait Prober: Send + Sync {
    fn probe(&self, address: &str) -> Result<Probe, String>;
}

/// The real prober: connect, `Status`, `DrainStatus` (drains in flight; a server without a
/// drainer simply reports none).
pub struct ClientProber {
    /// Where credentials come from when a server requires munge (`None`: libmunge's default).
    pub munge_socket: Option<std::path::PathBuf>,
    /// The manager's cluster: every probe asks the server to serve it (`JoinCluster`), and a
    /// server serving another is not up for this manager.
    pub cluster_id: [u8; spillway_proto::CLUSTER_ID_BYTES],
}

impl ClientProber {
    /// The prober of `manager`: its munge socket and cluster.
    pub fn of(manager: &Manager) -> ClientProber {
        ClientProber {
            munge_socket: manager.knobs().munge_socket_path(),
            cluster_id: manager.cluster_id(),
        }
    }

    /// A root connection to the one server at `address`, as `client_name`.
    fn connect(&self, address: &str, client_name: &str) -> Result<Client, String> {
        let endpoint: Endpoint = address.parse()?;
        let options = ClientOptions {
            client_name: client_name.into(),
            munge_socket: self.munge_socket.clone(),
            ..Default::default()
        };
        Client::connect(&[endpoint], options).map_err(|e| format!("does not answer: {e}"))
    }

    /// Asks the server to serve this manager's cluster; the cluster it serves.
    fn join(&self, client: &mut Client) -> Result<[u8; spillway_proto::CLUSTER_ID_BYTES], String> {
        // The server answered: an error here is its own (its disk full while it records the
        // cluster, say), not a server that is down.
        let serves = client
            .join_cluster(self.cluster_id)
            .map_err(|e| format!("answered JoinCluster with an error: {e}"))?;
        serves.first().copied().ok_or_else(|| "the server sent no cluster".to_string())
    }
}

impl Prober for ClientProber {
    fn probe(&self, address: &str) -> Result<Probe, String> {
        let mut client = self.connect(address, "spillway-manager heartbeat")?;
        let serves = self.join(&mut client)?;
        if serves != self.cluster_id {
            return Err(format!(
                "it serves another cluster ({}), not this manager's ({})",
                spillway_proto::cluster_id_hex(&serves),
                spillway_proto::cluster_id_hex(&self.cluster_id)
            ));
        }
        let status = client.status().map_err(|e| e.to_string())?;
        let auth = status.first().map(|s| s.auth.to_string()).unwrap_or_default();
        let identity = status
            .first()
            .map(|s| format!("{} #{}", s.server_id, s.incarnation))
            .unwrap_or_default();
        let drains_in_flight = match client.drain_status() {
            Ok(per_server) => per_server
                .iter()
                .flat_map(|(_, list)| list.iter())
                .filter(|d| d.state != DrainState::Drained)
                .count() as u32,
            Err(_) => 0,
        };
        let failure_domain =
            status.first().map(|s| s.failure_domain.clone()).filter(|d| !d.is_empty());
        // Root sees every epoch; the listing is paged by the client.
        let epoch_bytes = match client.epochs_on(0) {
            Ok(epochs) => epochs.iter().map(|e| (e.epoch.0, e.bytes)).collect(),
            Err(_) => Default::default(),
        };
        Ok(Probe { drains_in_flight, auth, identity, failure_domain, epoch_bytes })
    }
}

/// What `server add` learns from a server before registering it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerFacts {
    /// The id the server keeps in its store directory (`Status`'s `server_id`).
    pub server_id: String,
    /// Its store's SSD size (`store.ssd_bytes_max`): the most capacity it can be given.
    pub ssd_bytes_max: u64,
    /// The cluster it serves after being asked to serve this manager's (`JoinCluster`).
    pub cluster_id: [u8; spillway_proto::CLUSTER_ID_BYTES],
}

impl ClientProber {
    /// Connects to the server at `address`, asks it to serve this manager's cluster (the first
    /// manager to ask keeps it), and asks who it is and how big its store is.
    pub fn identify(&self, address: &str) -> Result<ServerFacts, String> {
        let mut client = self.connect(address, "spillway-manager server add")?;
        let cluster_id = self.join(&mut client)?;
        let status = client.status().map_err(|e| format!("answered Status with an error: {e}"))?;
        let status = status.first().ok_or("the server sent no status")?;
        Ok(ServerFacts {
            server_id: status.server_id.to_string(),
            ssd_bytes_max: status.ssd_bytes_max,
            cluster_id,
        })
    }
}

/// One round: probe every server, record the results.
pub fn heartbeat_round(manager: &Manager, prober: &dyn Prober) {
    let servers = match manager.server_addresses() {
        Ok(servers) => servers,
        Err(error) => {
            tracing::error!(%error, "heartbeat cannot list servers");
            return;
        }
    };
    let results: Vec<(u64, Result<Probe, String>)> =
        servers.iter().map(|(id, address)| (*id, prober.probe(address))).collect();
    if let Err(error) = manager.record_heartbeats(&results) {
        tracing::error!(%error, "heartbeat cannot record results");
    }
    // After the probes: a retiring server's drains in flight are this round's.
    if let Err(error) = manager.finish_retirements() {
        tracing::error!(%error, "heartbeat cannot finish server removals");
    }
}

/// Re-sends every active reservation's grants to its servers, so a server that was down (or
/// lost its state) when the reservation was created takes the reservation's data within a
/// heartbeat; an unchanged grant costs a server nothing.
fn reassert_grants(manager: &Manager) {
    let Some(_grants) =
        crate::service::lock_within(&manager.grants, crate::service::GRANTS_WAIT_MAX)
    else {
        tracing::warn!(
            "a reservation change has held the grants for too long: no re-grant this round"
        );
        return;
    };
    let root = manager.caller(0, 0);
    let mut reservations = match manager.list_reservations(&root, true) {
        Ok(list) => list,
        Err(error) => {
            tracing::error!(%error, "heartbeat cannot list reservations");
            return;
        }
    };
    reservations.retain(|r| r.state == crate::model::ReservationState::Active);
    let munge_socket = manager.knobs().munge_socket_path();
    for failure in crate::grant_reservations(&reservations, munge_socket.as_deref()) {
        let crate::GrantFailure { reservation, server, error } = failure;
        tracing::debug!(reservation, %server, %error, "grant not delivered this round");
    }
}

/// Runs heartbeat rounds every `heartbeat_ms` until `stop` is set.
pub fn run(manager: Arc<Manager>, prober: Arc<dyn Prober>, stop: Arc<AtomicBool>) {
    let period = Duration::from_millis(manager.knobs().heartbeat_ms);
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        heartbeat_round(&manager, prober.as_ref());
        reassert_grants(&manager);
        while started.elapsed() < period && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20).min(period));
        }
    }
}
