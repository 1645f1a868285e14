//! Site authentication in the handshake: what a `HelloReply` asks of the client, and the bytes a
//! munge credential must carry to be accepted on one connection.
//!
//! With `server.auth = munge`, a server answers `Hello` on TCP with [`AuthMethod::Munge`] and a
//! random [`CHALLENGE_BYTES`]-byte challenge; the client encodes a munge credential whose payload
//! is [`credential_payload`] of that challenge and sends it in `Authenticate`. The server's
//! `munged` checks key, time to live and replay; the server checks the payload, so a credential
//! captured on one connection is refused on any other, even by a server whose `munged` has never
//! seen it (and so cannot call it a replay).

/// Bytes of the per-connection challenge in `HelloReply`.
pub const CHALLENGE_BYTES: usize = 32;

/// What opens the payload of a connection's munge credential (NUL included), before the
/// challenge.
pub const CREDENTIAL_PAYLOAD_PREFIX: &[u8] = b"spillway-auth-v2\0";

/// How the server establishes a connection's identity, as the handshake announces it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AuthMethod {
    /// Wire 0: the identity in `HelloReply` is established (by the kernel); requests follow.
    #[default]
    None,
    /// Wire 1: the client must send `Authenticate` with a munge credential next.
    Munge,
}

impl AuthMethod {
    pub fn wire(self) -> u8 {
        match self {
            AuthMethod::None => 0,
            AuthMethod::Munge => 1,
        }
    }

    pub fn from_wire(value: u8) -> Option<AuthMethod> {
        match value {
            0 => Some(AuthMethod::None),
            1 => Some(AuthMethod::Munge),
            _ => None,
        }
    }
}

impl std::fmt::Display for AuthMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AuthMethod::None => "none",
            AuthMethod::Munge => "munge",
        })
    }
}

/// The payload a connection's munge credential must carry: the prefix, then the challenge.
pub fn credential_payload(challenge: &[u8; CHALLENGE_BYTES]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(CREDENTIAL_PAYLOAD_PREFIX.len() + CHALLENGE_BYTES);
    payload.extend_from_slice(CREDENTIAL_PAYLOAD_PREFIX);
    payload.extend_from_slice(challenge);
    payload
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payload_is_the_prefix_then_the_challenge() {
        let challenge = [7u8; CHALLENGE_BYTES];
        let payload = credential_payload(&challenge);
        assert_eq!(payload.len(), 17 + 32);
        assert_eq!(&payload[..17], b"spillway-auth-v2\0");
        assert_eq!(&payload[17..], &challenge);
    }

    #[test]
    fn methods_round_trip_and_others_are_refused() {
        for method in [AuthMethod::None, AuthMethod::Munge] {
            assert_eq!(AuthMethod::from_wire(method.wire()), Some(method));
        }
        assert_eq!(AuthMethod::from_wire(2), None);
    }
}
