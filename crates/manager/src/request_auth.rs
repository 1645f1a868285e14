//! Munge authentication of API requests over TCP (`manager.auth = munge`).
//!
//! Every request over TCP carries `Authorization: MUNGE <credential>`, a munge credential whose
//! payload binds it to that one request: [`credential_payload`] is
//! `spillway-manager-v1\0<METHOD> <TARGET> <crc>`, where TARGET is the request target as sent
//! (path and query) and crc the CRC32C of the body as 8 lowercase hex digits. The manager's
//! `munged` checks the key, the time to live and replays (a credential decoded once is refused
//! ever after), and the manager checks that the payload names this request: a captured header
//! cannot be replayed, nor moved to another method, path, query or body. The caller's uid and
//! gid are the credential's. Requests on the Unix socket keep `SO_PEERCRED` and ignore the header.

use spillway_proto::Identity;
use spillway_sys::munge::{MungeContext, MungeError};

/// What opens the payload of an API request's credential (NUL included).
pub const CREDENTIAL_PAYLOAD_PREFIX: &[u8] = b"spillway-manager-v1\0";

/// The scheme of the `Authorization` header.
pub const AUTHORIZATION_SCHEME: &str = "MUNGE";

/// The payload a request's credential must carry.
pub fn credential_payload(method: &str, target: &str, body: &[u8]) -> Vec<u8> {
    let mut payload = CREDENTIAL_PAYLOAD_PREFIX.to_vec();
    payload.extend_from_slice(format!("{method} {target} {:08x}", crc32c::crc32c(body)).as_bytes());
    payload
}

/// The `Authorization` header value for one request, credential made by `context`'s `munged`.
pub fn authorization(
    context: &MungeContext,
    method: &str,
    target: &str,
    body: &[u8],
) -> Result<String, MungeError> {
    let credential = context.encode(&credential_payload(method, target, body))?;
    Ok(format!("{AUTHORIZATION_SCHEME} {credential}"))
}

/// Why a request over TCP was not authenticated (answered 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestAuthError {
    #[error("this manager requires munge authentication over TCP: send `Authorization: MUNGE <credential>` (the spillway CLI does with SPILLWAY_MANAGER_AUTH=munge)")]
    Missing,
    #[error("Authorization header {scheme:?} is not `MUNGE <credential>`")]
    Scheme { scheme: String },
    #[error("munge credential refused: {0}")]
    Refused(MungeError),
    #[error("the manager cannot check munge credentials: {0}")]
    Unavailable(MungeError),
    #[error("munge credential of uid {uid} refused: it was made for another request (method, target or body differ)")]
    OtherRequest { uid: u32 },
}

/// The identity a request's `Authorization` header vouches for.
pub fn check_authorization(
    context: &MungeContext,
    header: Option<&str>,
    method: &str,
    target: &str,
    body: &[u8],
) -> Result<Identity, RequestAuthError> {
    let header = header.ok_or(RequestAuthError::Missing)?;
    let (scheme, credential) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    if !scheme.eq_ignore_ascii_case(AUTHORIZATION_SCHEME) {
        return Err(RequestAuthError::Scheme { scheme: scheme.to_string() });
    }
    let decoded = context.decode(credential.trim()).map_err(|error| match error {
        MungeError::Library { .. } | MungeError::SocketError { .. } | MungeError::Other { .. } => {
            RequestAuthError::Unavailable(error)
        }
        refused => RequestAuthError::Refused(refused),
    })?;
    if decoded.payload != credential_payload(method, target, body) {
        return Err(RequestAuthError::OtherRequest { uid: decoded.uid });
    }
    Ok(Identity { uid: decoded.uid, gid: decoded.gid })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payload_binds_method_target_and_body() {
        let payload = credential_payload("POST", "/v1/reservations?all=1", b"{}");
        let expected = format!(
            "spillway-manager-v1\0POST /v1/reservations?all=1 {:08x}",
            crc32c::crc32c(b"{}")
        );
        assert_eq!(payload, expected.as_bytes());
        assert_ne!(payload, credential_payload("POST", "/v1/reservations?all=1", b"{ }"));
        assert_ne!(payload, credential_payload("PUT", "/v1/reservations?all=1", b"{}"));
        assert_ne!(payload, credential_payload("POST", "/v1/reservations", b"{}"));
    }

    #[test]
    fn a_missing_or_foreign_header_is_refused_before_munged_is_asked() {
        let context = MungeContext::new()
            .with_socket(Some(std::env::temp_dir().join("spillway-no-munged-here.socket")));
        let check = |header| check_authorization(&context, header, "GET", "/v1/whoami", b"");
        assert_eq!(check(None), Err(RequestAuthError::Missing));
        assert!(matches!(check(Some("Bearer abc")), Err(RequestAuthError::Scheme { .. })));
        assert!(matches!(check(Some("MUNGE MUNGE:abc:")), Err(RequestAuthError::Unavailable(_))));
    }
}
