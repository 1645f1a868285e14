//! Connecting a mount to a reservation: which namespace on which server, and the data clients.
//!
//! Shared by `spillway mount` and `spillway bench mount`, so that both place and open namespaces
//! exactly as the manager, stage-in and every other mount do (the placement rule itself is
//! `spillway_policy::namespace`).

use std::sync::Arc;

use spillway_client::meta::{RemoteNamespace, RemoteOptions};
use spillway_client::{Client, ClientError, ClientOptions, Placement};
use spillway_namespace::{MetaError, Namespace, NamespaceId};
use spillway_policy::namespace::NamespaceAccess;
use spillway_proto::Endpoint;
use spillway_types::EpochId;

/// The data epoch of mount namespaces unless the mount is told otherwise.
pub const MOUNT_EPOCH_DEFAULT: u64 = 1_000_000;
/// The namespace id of the striped namespace unless the mount is told otherwise.
pub const STRIPED_NAMESPACE_ID_DEFAULT: u64 = 1;

/// Why a mount could not reach its namespace or its servers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    #[error("opening namespace {id} on {endpoint}: {source}")]
    Namespace { id: NamespaceId, endpoint: Endpoint, source: MetaError },
    #[error("connecting to the servers: {0}")]
    Servers(#[from] ClientError),
}

/// The namespace a mount uses: its id and the index of the server that holds it.
/// `namespace_id` is the reservation's (base) namespace id, [`STRIPED_NAMESPACE_ID_DEFAULT`]
/// when `None`.
pub fn namespace_placement(
    access: NamespaceAccess,
    node: &str,
    namespace_id: Option<u64>,
    servers: usize,
) -> (NamespaceId, usize) {
    let place = spillway_policy::namespace::namespace_placement(
        access,
        namespace_id.unwrap_or(STRIPED_NAMESPACE_ID_DEFAULT),
        node,
        servers,
    );
    (place.namespace, place.server)
}

/// How a namespace is created when the server has none yet.
#[derive(Clone, Copy, Debug)]
pub struct NamespaceRoot {
    /// The epoch that holds the files' bytes.
    pub data_epoch: EpochId,
    pub uid: u32,
    pub gid: u32,
    /// Permission bits of the root directory.
    pub mode: u32,
}

/// Opens namespace `id` on the server at `endpoint`, creating it with `root` if the server has
/// none; `connections` (the mount's session threads) bounds concurrent operations. With
/// `guard` (a data client of the reservation), it is not created over files of its data epoch
/// whose metadata is gone (`RemoteNamespace::open_guarded`).
pub fn connect_namespace(
    endpoint: &Endpoint,
    id: NamespaceId,
    root: NamespaceRoot,
    connections: usize,
    guard: Option<&mut Client>,
) -> Result<Arc<dyn Namespace>, ConnectError> {
    let options = RemoteOptions {
        create: true,
        data_epoch: root.data_epoch,
        root_uid: root.uid,
        root_gid: root.gid,
        root_mode: root.mode,
        connections_max: connections.max(1) * 2,
        // The mount's process environment names the munged (SPILLWAY_MUNGE_SOCKET).
        ..RemoteOptions::default()
    };
    let namespace = match guard {
        Some(data) => RemoteNamespace::open_guarded(endpoint, id, &options, data),
        None => RemoteNamespace::open(endpoint, id, &options),
    }
    .map_err(|source| ConnectError::Namespace { id, endpoint: endpoint.clone(), source })?;
    Ok(Arc::new(namespace))
}

/// Data clients for a mount: one per session thread, striped over every server, each piece
/// on `replicas` servers of distinct failure domains (the reservation's `replicas`).
pub fn data_clients(
    endpoints: &[Endpoint],
    count: usize,
    replicas: u32,
) -> Result<Vec<Client>, ConnectError> {
    (0..count)
        .map(|slot| {
            let options = ClientOptions {
                placement: Placement::striped_default(),
                replicas,
                client_name: format!("spillway mount pid {} slot {slot}", std::process::id()),
                ..Default::default()
            };
            Ok(Client::connect(endpoints, options)?)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_namespaces_spread_over_servers() {
        let mut used = std::collections::BTreeSet::new();
        for node in 0..32 {
            let (id, server) =
                namespace_placement(NamespaceAccess::Private, &format!("nid{node:05}"), None, 4);
            assert!(id != STRIPED_NAMESPACE_ID_DEFAULT && server < 4);
            used.insert(server);
        }
        assert_eq!(used.len(), 4, "32 nodes use every one of 4 servers");
        assert_eq!(
            namespace_placement(NamespaceAccess::Striped, "any", None, 4),
            (STRIPED_NAMESPACE_ID_DEFAULT, 0)
        );
        assert_ne!(
            namespace_placement(NamespaceAccess::Private, "n1", Some(9), 4).0,
            namespace_placement(NamespaceAccess::Private, "n2", Some(9), 4).0
        );
    }
}
