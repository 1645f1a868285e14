//! Who may do what with an epoch on this server, and the root-only requests that say so.
//!
//! Every epoch request is checked against the epoch's grant, which the store keeps durably
//! (docs/semantics.md, "Ownership and grants"): the owner, the allowed uids and the members of
//! the allowed groups (the caller's groups from the user database) may use the epoch; root (the
//! manager, the mount, the drainers of peer servers) may use any. An epoch without a grant is
//! refused to everyone but root, except that creating data in an epoch the store does not hold
//! yet either claims it for the caller (an unmanaged server: the first uid wins, and the claim
//! is a grant record, so it survives restarts) or is refused (a managed server,
//! `server.managed`: only epochs the manager granted take data). Data the store holds without a
//! grant (revoked, from before grants, a drained epoch whose grant GC collected) is root's and
//! is never claimed.

use std::sync::OnceLock;

use spillway_proto::{EpochGrant, ErrorCode, Identity, Response};
use spillway_types::{EpochId, StreamKey};

use crate::backend::{assigned_stream_key, BackendError, GrantMode, ASSIGNED_STREAM_TAG};
use crate::Shared;

/// The peer of one connection: its established identity (kernel or munge), whether it is
/// privileged, and, looked up once when first needed, its groups in the user database.
pub(crate) struct Requester {
    pub identity: Identity,
    privileged: bool,
    groups: OnceLock<Vec<u32>>,
    /// The namespace change session this connection's changes belong to (named in its
    /// `Hello`; 0: none), so the session's own watcher is not waited for.
    pub namespace_session: u64,
}

impl Requester {
    /// `server_uid`: the uid this server runs as. Root and the server's own uid (the service
    /// account the manager, the mount and the peer drainers run as when the servers do not run
    /// as root) are privileged: they may use every epoch and grant and revoke.
    pub fn new(identity: Identity, server_uid: u32) -> Requester {
        let privileged = identity.uid == 0 || identity.uid == server_uid;
        Requester { identity, privileged, groups: OnceLock::new(), namespace_session: 0 }
    }

    /// Root or the server's own uid (see [`Requester::new`]).
    pub fn is_root(&self) -> bool {
        self.privileged
    }

    /// The peer's gid and the groups of its uid in the user database (`getgrouplist`). A failed
    /// look-up leaves just the gid (logged): group grants then do not apply.
    fn groups(&self) -> &[u32] {
        self.groups.get_or_init(|| {
            let Identity { uid, gid } = self.identity;
            let mut groups = spillway_sys::user::groups_of(uid, gid).unwrap_or_else(|error| {
                tracing::warn!(uid, %error, "cannot read the peer's groups; only its gid counts");
                Vec::new()
            });
            groups.push(gid);
            groups.sort_unstable();
            groups.dedup();
            groups
        })
    }

    /// Whether the grant lets this peer use its epoch (root may use every epoch).
    pub fn may_use(&self, grant: &EpochGrant) -> bool {
        let uid = self.identity.uid;
        self.privileged
            || uid == grant.owner_uid
            || grant.allowed_uids.contains(&uid)
            || (!grant.allowed_gids.is_empty()
                && self.groups().iter().any(|gid| grant.allowed_gids.contains(gid)))
    }
}

/// What a request does with an epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Intent {
    /// Creates data or state in it: `OpenFile` with create, `Write`, `Commit`. An epoch without
    /// a grant is claimed by the caller (unmanaged server) or refused (managed server).
    Create,
    /// Reads or changes what is there: list, stat, extents, read, sync, drain, delete.
    Use,
}

/// Checks that `peer` may act on `epoch` as `intent` says (claiming it first if that is how this
/// server hands out epochs).
pub(crate) fn authorize(
    shared: &Shared,
    peer: &Requester,
    epoch: EpochId,
    intent: Intent,
) -> Result<(), BackendError> {
    let Some(grant) = shared.backend.grant(epoch) else {
        return authorize_ungranted(shared, peer, epoch, intent);
    };
    if peer.may_use(&grant) {
        Ok(())
    } else {
        Err(not_yours(peer, epoch))
    }
}

/// [`authorize`] for an epoch without a grant.
fn authorize_ungranted(
    shared: &Shared,
    peer: &Requester,
    epoch: EpochId,
    intent: Intent,
) -> Result<(), BackendError> {
    match intent {
        // Nothing to protect in an epoch the store does not hold: the request names the
        // missing epoch itself. One it holds without a grant is root's.
        Intent::Use if peer.is_root() || !shared.backend.has_epoch(epoch) => Ok(()),
        Intent::Use => Err(BackendError::new(
            ErrorCode::PermissionDenied,
            format!(
                "epoch {epoch} is not granted to anyone on this server; only root may use it \
                 (request runs as uid {})",
                peer.identity.uid
            ),
        )),
        Intent::Create if peer.is_root() && shared.options.managed => Ok(()),
        Intent::Create if shared.options.managed => Err(BackendError::new(
            ErrorCode::PermissionDenied,
            format!(
                "epoch {epoch} is not granted to any reservation on this server (a managed \
                 server takes data only for epochs the manager granted; request runs as uid {})",
                peer.identity.uid
            ),
        )),
        // Data the store holds without a grant is root's: writing to it claims nothing.
        Intent::Create if !peer.is_root() && shared.backend.has_epoch(epoch) => {
            Err(BackendError::new(
                ErrorCode::PermissionDenied,
                format!(
                    "epoch {epoch} holds data and no grant on this server; only root may use it \
                     (request runs as uid {})",
                    peer.identity.uid
                ),
            ))
        }
        Intent::Create => {
            let claim = EpochGrant {
                owner_uid: peer.identity.uid,
                owner_gid: peer.identity.gid,
                ..EpochGrant::default()
            };
            let in_force = shared.backend.grant_epoch(epoch, claim, GrantMode::IfAbsent)?;
            if peer.may_use(&in_force) {
                Ok(())
            } else {
                Err(not_yours(peer, epoch))
            }
        }
    }
}

fn not_yours(peer: &Requester, epoch: EpochId) -> BackendError {
    BackendError::new(
        ErrorCode::PermissionDenied,
        format!(
            "epoch {epoch} is granted to another user on this server (request runs as uid {})",
            peer.identity.uid
        ),
    )
}

/// Whether `peer` may see `epoch` in listings (`ListEpochs`, `DrainStatus`): root sees all,
/// others only epochs granted to them.
pub(crate) fn may_see(shared: &Shared, peer: &Requester, epoch: EpochId) -> bool {
    peer.is_root() || shared.backend.grant(epoch).is_some_and(|grant| peer.may_use(&grant))
}

/// The store stream of a write: the stream the epoch's grant assigns (keys with the top bit
/// set, so they never share segments with a uid), else the writer's uid.
pub(crate) fn stream_of(shared: &Shared, identity: Identity, epoch: EpochId) -> StreamKey {
    match shared.backend.grant(epoch).and_then(|grant| grant.stream) {
        Some(stream) => assigned_stream_key(stream),
        None => StreamKey(identity.uid as u64),
    }
}

/// Refuses a request only root or the server's own uid (the manager) may make.
fn root_only(peer: &Requester, what: &str) -> Result<(), BackendError> {
    if peer.is_root() {
        return Ok(());
    }
    Err(BackendError::new(
        ErrorCode::PermissionDenied,
        format!(
            "only root or the server's own uid (the manager) {what}; request runs as uid {}",
            peer.identity.uid
        ),
    ))
}

/// `GrantEpoch`: root records the manager's grant of the epoch (replacing any earlier grant or
/// claim; an unchanged grant writes nothing, so the heartbeat may repeat it).
pub(crate) fn grant_epoch(
    shared: &Shared,
    peer: &Requester,
    epoch: EpochId,
    grant: EpochGrant,
) -> Result<Response, BackendError> {
    root_only(peer, "grants epochs")?;
    shared.backend.grant_epoch(epoch, grant, GrantMode::Replace)?;
    shared.activity.granted(epoch);
    Ok(Response::EpochGranted { epoch })
}

/// `JoinCluster`: root (the manager adding this server) names the cluster; the server keeps the
/// first it was given (durably, when it has a cluster file) and answers the one it serves.
pub(crate) fn join_cluster(
    shared: &Shared,
    peer: &Requester,
    cluster_id: [u8; spillway_proto::CLUSTER_ID_BYTES],
) -> Result<Response, BackendError> {
    root_only(peer, "joins clusters")?;
    let membership = shared.cluster.get_or_init(crate::identity::ClusterMembership::ephemeral);
    let serves = membership
        .join(cluster_id)
        .map_err(|error| BackendError::new(ErrorCode::Io, error.to_string()))?;
    if serves != cluster_id {
        tracing::warn!(
            asked = %spillway_proto::cluster_id_hex(&cluster_id),
            serves = %spillway_proto::cluster_id_hex(&serves),
            "a manager of another cluster asked this server to join it: refused (the manager says so)"
        );
    }
    Ok(Response::ClusterJoined { cluster_id: serves })
}

/// `RevokeEpoch`: root revokes the epoch's grant; afterwards only root may use the epoch.
pub(crate) fn revoke_epoch(
    shared: &Shared,
    peer: &Requester,
    epoch: EpochId,
) -> Result<Response, BackendError> {
    root_only(peer, "revokes epoch grants")?;
    let revoked = shared.backend.revoke_grant(epoch)?;
    let activity = shared.activity.revoked(epoch);
    Ok(Response::EpochRevoked { epoch, revoked, activity })
}

/// `AssignStream` (before `GrantEpoch` carried the stream): root sets the SSD stream of a
/// granted epoch, durably, as part of its grant.
pub(crate) fn assign_stream(
    shared: &Shared,
    peer: &Requester,
    epoch: EpochId,
    stream: u64,
) -> Result<Response, BackendError> {
    root_only(peer, "assigns SSD streams")?;
    if stream & ASSIGNED_STREAM_TAG != 0 {
        return Err(BackendError::new(
            ErrorCode::InvalidArgument,
            format!("stream id {stream} is out of range (below 2^63)"),
        ));
    }
    let mut grant = shared.backend.grant(epoch).ok_or_else(|| {
        BackendError::new(
            ErrorCode::NoSuchEpoch,
            format!(
                "epoch {epoch} has no grant on this server: AssignStream changes the stream of a \
                 granted epoch (GrantEpoch grants it with its stream)"
            ),
        )
    })?;
    grant.stream = Some(stream);
    shared.backend.grant_epoch(epoch, grant, GrantMode::Replace)?;
    Ok(Response::StreamAssigned { epoch, stream })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32, gid: u32, server_uid: u32) -> Requester {
        Requester::new(Identity { uid, gid }, server_uid)
    }

    #[test]
    fn the_owner_allowed_uids_allowed_groups_and_privileged_peers_may_use_a_grant() {
        let grant = EpochGrant {
            owner_uid: 1000,
            owner_gid: 1000,
            allowed_uids: vec![1001],
            allowed_gids: vec![4242],
            ..EpochGrant::default()
        };
        assert!(peer(1000, 1000, 0).may_use(&grant), "the owner");
        assert!(peer(1001, 1001, 0).may_use(&grant), "an allowed uid");
        // The peer's own gid always counts among its groups (whatever the user database says).
        assert!(peer(1002, 4242, 0).may_use(&grant), "a member of an allowed group");
        assert!(!peer(1002, 1002, 0).may_use(&grant), "anyone else");
        assert!(!peer(1000, 1000, 0).may_use(&EpochGrant::default()), "a grant to root only");
        assert!(peer(0, 0, 1234).may_use(&grant), "root");
        let service = peer(1234, 1234, 1234);
        assert!(service.is_root() && service.may_use(&grant), "the server's own uid");
        assert!(!peer(1002, 1002, 1234).is_root());
    }

    #[test]
    fn only_privileged_peers_pass_root_only() {
        assert!(root_only(&peer(0, 0, 0), "grants epochs").is_ok());
        assert!(root_only(&peer(77, 77, 77), "grants epochs").is_ok());
        let error = root_only(&peer(1000, 1000, 0), "grants epochs").unwrap_err();
        assert_eq!(error.code, ErrorCode::PermissionDenied);
        assert!(error.message.contains("uid 1000"), "{}", error.message);
    }
}
