//! Drained names of mount files: the store file `ns/<namespace>/<ino>.<generation>` of a file
//! written through `spillway mount` is published on the PFS under the POSIX path it has in its
//! namespace (`<pfs>/<path>`), not under its store name.
//!
//! The map comes from the namespace's manifest, asked of whichever server holds the namespace
//! (the drainer asks each peer in turn; the others answer ENOENT), once per namespace per
//! drain pass. Paths are the namespace's paths at drain time (a file renamed after the commit
//! is published under its new name). A store file the manifest does not list is dead (its inode
//! was unlinked, or truncated to 0, which starts a new generation) and is not published. If no
//! server holds the namespace any more (its server was lost), the map is the snapshot
//! stage-out stored in the epoch on every server (`spillway_client::ns_snapshot`); without one,
//! or for a path that is not UTF-8, the file keeps its store name so no data is lost. A namespace found on the servers whose data epoch is not the epoch being
//! drained is another incarnation of that id (ids restart after a manager database reset): its
//! paths are not this epoch's, and the drain refuses it (an error, retried, the data kept).
//! Reading a manifest needs root or the namespace root's owner: servers that
//! drain mount data run as root.

use std::collections::HashMap;

use spillway_client::meta::{RemoteNamespace, RemoteOptions};
use spillway_client::ns_snapshot::SnapshotLoad;
use spillway_client::{Client, ClientOptions};
use spillway_namespace::{parse_data_file_name, ManifestEntry, Namespace, NamespaceId};
use spillway_proto::Endpoint;
use spillway_types::EpochId;

use crate::drainer::DrainError;

/// Where one store file goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinalName {
    /// Not a mount file (or its namespace is gone): the usual `epoch-<E>/<name>`.
    Unchanged,
    /// A live mount file: this path relative to the PFS directory, published as its POSIX
    /// owner with its permission bits. From a snapshot (`owner_trusted` false) the owner is not
    /// taken from it: the epoch's writers could have forged it, and the drain publishes such a
    /// file as the epoch's owner.
    Path { path: String, uid: u32, gid: u32, mode: u32, owner_trusted: bool },
    /// A dead generation or an unlinked file: publish nothing.
    Dead,
}

/// A namespace's entries by store name, and whether their owners are to be believed (from the
/// live namespace, not from a snapshot).
type NameMap = (HashMap<String, ManifestEntry>, bool);

/// The manifests of the namespaces met during one drain pass.
pub struct NamespaceNames {
    /// The epoch being drained: a namespace's data epoch must be this one.
    epoch: EpochId,
    peers: Vec<Endpoint>,
    /// Where credentials come from when the peers require munge (`None`: libmunge's default).
    munge_socket: Option<std::path::PathBuf>,
    /// Per namespace met: its name map and whether it came from the live namespace (else from
    /// the snapshot in the epoch); `None`: neither exists.
    manifests: HashMap<NamespaceId, Option<NameMap>>,
}

impl NamespaceNames {
    pub fn new(
        epoch: EpochId,
        peers: Vec<Endpoint>,
        munge_socket: Option<std::path::PathBuf>,
    ) -> NamespaceNames {
        NamespaceNames { epoch, peers, munge_socket, manifests: HashMap::new() }
    }

    /// The final name of store file `name` (see the module doc).
    pub fn final_name(&mut self, name: &str) -> Result<FinalName, DrainError> {
        let Some((namespace, _, _)) = parse_data_file_name(name) else {
            return Ok(FinalName::Unchanged);
        };
        if !self.manifests.contains_key(&namespace) {
            let manifest = fetch(&self.peers, namespace, self.epoch, &self.munge_socket)?;
            self.manifests.insert(namespace, manifest);
        }
        let Some((manifest, owner_trusted)) = &self.manifests[&namespace] else {
            tracing::warn!(%name, namespace, "drain: no server holds this namespace any more; publishing under the store name");
            return Ok(FinalName::Unchanged);
        };
        Ok(match manifest.get(name) {
            None => FinalName::Dead,
            Some(entry) => match String::from_utf8(entry.path.clone()) {
                Ok(path) => FinalName::Path {
                    path,
                    uid: entry.uid,
                    gid: entry.gid,
                    mode: entry.mode & 0o777,
                    owner_trusted: *owner_trusted,
                },
                Err(_) => {
                    tracing::warn!(%name, path = %String::from_utf8_lossy(&entry.path), "drain: path is not UTF-8; publishing under the store name");
                    FinalName::Unchanged
                }
            },
        })
    }
}

/// The manifest of `namespace` from the first peer that holds it (trusted: the namespace is
/// the server's, created by root), else the snapshot in the epoch (not trusted for owners);
/// `None` if neither exists. A namespace whose data epoch is not `epoch` is refused (another
/// incarnation of the id).
fn fetch(
    peers: &[Endpoint],
    namespace: NamespaceId,
    epoch: EpochId,
    munge_socket: &Option<std::path::PathBuf>,
) -> Result<Option<NameMap>, DrainError> {
    let options = RemoteOptions {
        create: false,
        connections_max: 1,
        munge_socket: munge_socket.clone(),
        ..RemoteOptions::default()
    };
    for endpoint in peers {
        match RemoteNamespace::open(endpoint, namespace, &options) {
            Ok(remote) => {
                if remote.data_epoch() != epoch {
                    return Err(DrainError::NamespaceIncarnation {
                        namespace,
                        found: remote.data_epoch(),
                        epoch,
                    });
                }
                let manifest = remote.manifest().map_err(DrainError::Namespace)?;
                let map = manifest.into_iter().map(|entry| (entry.file_name.clone(), entry));
                return Ok(Some((map.collect(), true)));
            }
            Err(failure) if failure.errno == libc::ENOENT => continue,
            Err(failure) => return Err(DrainError::Namespace(failure)),
        }
    }
    // No live server holds the namespace (its server was lost): the name map stage-out stored
    // in the epoch on every server, if any.
    let options = ClientOptions { munge_socket: munge_socket.clone(), ..ClientOptions::default() };
    let mut client = Client::connect(peers, options).map_err(DrainError::Peer)?;
    match client.load_namespace_snapshot(epoch, namespace).map_err(DrainError::Peer)? {
        SnapshotLoad::Absent => Ok(None),
        SnapshotLoad::Damaged(why) => {
            tracing::warn!(namespace, %epoch, %why, "drain: the namespace's snapshot is damaged");
            Ok(None)
        }
        SnapshotLoad::Found(snapshot) => {
            tracing::info!(namespace, %epoch, files = snapshot.entries.len(), "drain: no server holds the namespace; paths from the snapshot stage-out stored");
            let map = snapshot.entries.into_iter().map(|e| (e.file_name.clone(), e));
            Ok(Some((map.collect(), false)))
        }
    }
}
