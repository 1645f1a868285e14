//! Who a server is: a random 128-bit id made at its first start and kept in its SSD directory,
//! and an incarnation that counts its starts. A server started empty at a lost server's address
//! has another id; a restarted one the same id and a higher incarnation. Clients learn both from
//! `HelloReply`; a commit names the servers (ids) the committer wrote the epoch to, so a drain
//! can tell a lost participant from one that never held anything.

use std::fmt;

/// Bytes of a [`ServerId`].
pub const SERVER_ID_BYTES: usize = 16;

/// Bytes of a cluster id: the random id of a manager's database, which every server it added
/// records (`JoinCluster`), so a server never serves two databases' reservations.
pub const CLUSTER_ID_BYTES: usize = 16;

/// A cluster id as 32 lowercase hex digits (how the manager's database and messages show it).
pub fn cluster_id_hex(id: &[u8; CLUSTER_ID_BYTES]) -> String {
    id.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The cluster id written as [`cluster_id_hex`] writes it.
pub fn parse_cluster_id(hex: &str) -> Option<[u8; CLUSTER_ID_BYTES]> {
    if hex.len() != 2 * CLUSTER_ID_BYTES || !hex.is_ascii() {
        return None;
    }
    let mut id = [0u8; CLUSTER_ID_BYTES];
    for (index, byte) in id.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * index..2 * index + 2], 16).ok()?;
    }
    Some(id)
}

/// Most participants one `Commit` may name (a reservation never spans more servers).
pub const COMMIT_PARTICIPANTS_MAX: usize = 256;

/// Longest address of a participant, in bytes (a Unix socket path is at most 108).
pub const PARTICIPANT_ADDRESS_BYTES_MAX: usize = 200;

// A `Commit` naming the most participants at the longest addresses fits in one body.
const _: () = assert!(
    9 + 4 + COMMIT_PARTICIPANTS_MAX * (SERVER_ID_BYTES + 2 + PARTICIPANT_ADDRESS_BYTES_MAX)
        <= crate::BODY_BYTES_MAX as usize
);

/// A server's id (random, from its identity file). All zeros is never a valid id.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerId(pub [u8; SERVER_ID_BYTES]);

impl ServerId {
    /// The all-zero id, which no server has.
    pub const NONE: ServerId = ServerId([0; SERVER_ID_BYTES]);

    pub fn is_none(&self) -> bool {
        *self == ServerId::NONE
    }
}

impl fmt::Display for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServerId({self})")
    }
}

/// A server a committer wrote an epoch to: its id and the address the committer reached it at
/// (for error messages; the id is what is checked).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Participant {
    pub id: ServerId,
    pub address: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ids_round_trip_as_hex() {
        let id: [u8; CLUSTER_ID_BYTES] = core::array::from_fn(|i| (i * 17) as u8);
        let hex = cluster_id_hex(&id);
        assert_eq!(hex.len(), 32);
        assert_eq!(parse_cluster_id(&hex), Some(id));
        assert_eq!(parse_cluster_id(&hex[1..]), None);
        assert_eq!(parse_cluster_id(&"zz".repeat(16)), None);
        assert_eq!(parse_cluster_id(&"é".repeat(16)), None);
    }
}
