//! The client side of the manager's API, used by the `spillway` CLI and the Slurm hooks.
//!
//! One HTTP/1.1 request per connection over the manager's Unix socket (or TCP), JSON in and
//! out. On the Unix socket (and loopback TCP without munge) the manager identifies the caller
//! from the socket, so nothing about identity is sent. A manager with `manager.auth = munge`
//! wants every request over TCP to carry `Authorization: MUNGE <credential>`
//! ([`crate::request_auth`]); the client sends it when `SPILLWAY_MANAGER_AUTH=munge`, and
//! otherwise learns it from the manager: a 401 naming munge is retried once with the header
//! (nothing was done for the refused request). `SPILLWAY_MANAGER_AUTH=none` never sends it.
//! Credentials come from the `munged` at `SPILLWAY_MUNGE_SOCKET` (else libmunge's default).
//! Error replies become [`ApiClientError::Api`] carrying the manager's message, which already
//! names the problem (and is what the CLI prints).

use std::io::{Read, Write};
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::Serialize;
use spillway_proto::Endpoint;
use spillway_sys::munge::MungeContext;

use crate::model::ErrorBody;

/// Environment variable saying whether API requests over TCP carry a munge credential:
/// `munge` (always), `none` (never); unset: after the manager asked for it with a 401.
pub const MANAGER_AUTH_ENV: &str = "SPILLWAY_MANAGER_AUTH";

/// When the client signs requests over TCP with a munge credential.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestSigning {
    /// Every request over TCP (`SPILLWAY_MANAGER_AUTH=munge`).
    Always,
    /// Never (`SPILLWAY_MANAGER_AUTH=none`).
    Never,
    /// When a request was refused with a 401 naming munge, once more with a credential.
    WhenAsked,
}

impl RequestSigning {
    /// From [`MANAGER_AUTH_ENV`].
    pub fn from_env() -> Result<RequestSigning, ApiClientError> {
        match std::env::var(MANAGER_AUTH_ENV).unwrap_or_default().as_str() {
            "" => Ok(RequestSigning::WhenAsked),
            "munge" => Ok(RequestSigning::Always),
            "none" => Ok(RequestSigning::Never),
            other => Err(ApiClientError::Address {
                address: format!("{MANAGER_AUTH_ENV}={other}"),
                reason: "expected munge or none".into(),
            }),
        }
    }
}

/// Where the CLI finds the manager when `--manager` is not given and `SPILLWAY_MANAGER` unset.
pub const DEFAULT_MANAGER_SOCKET: &str = "/run/spillway/manager.sock";

/// Largest reply the client accepts.
const REPLY_BYTES_MAX: usize = 64 << 20;

/// Why an API call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiClientError {
    #[error("manager address {address:?}: {reason}")]
    Address { address: String, reason: String },
    #[error("cannot connect to the manager at {endpoint}: {source} (is `spillway manager` running? --manager / SPILLWAY_MANAGER)")]
    Connect { endpoint: Endpoint, source: std::io::Error },
    #[error("talking to the manager at {endpoint}: {source}")]
    Io { endpoint: Endpoint, source: std::io::Error },
    #[error("the manager at {endpoint} sent a malformed reply: {reason}")]
    BadReply { endpoint: Endpoint, reason: String },
    #[error("the manager at {endpoint} requires munge authentication: {source}")]
    Credential { endpoint: Endpoint, source: spillway_sys::munge::MungeError },
    /// The manager refused: its message names the problem.
    #[error("{message}")]
    Api { status: u16, kind: String, message: String },
}

impl ApiClientError {
    /// The manager's error kind (`not_found`, `quota_exceeded`, …), if it answered with one.
    pub fn kind(&self) -> Option<&str> {
        match self {
            ApiClientError::Api { kind, .. } => Some(kind),
            _ => None,
        }
    }
}

/// A client of one manager.
#[derive(Clone, Debug)]
pub struct ApiClient {
    endpoint: Endpoint,
    signing: RequestSigning,
    munge: MungeContext,
}

impl ApiClient {
    /// `address`: a socket path (`/run/spillway/manager.sock`), `unix:///path`, or
    /// `tcp://127.0.0.1:PORT` / `127.0.0.1:PORT`.
    pub fn new(address: &str) -> Result<ApiClient, ApiClientError> {
        let endpoint = if address.starts_with('/') || address.starts_with('.') {
            Endpoint::Unix(PathBuf::from(address))
        } else {
            address.parse().map_err(|reason| ApiClientError::Address {
                address: address.to_string(),
                reason,
            })?
        };
        let munge = MungeContext::new().with_socket(spillway_client::munge_socket_from_env());
        Ok(ApiClient { endpoint, signing: RequestSigning::from_env()?, munge })
    }

    /// Overrides when requests over TCP are signed with a munge credential, and by which
    /// `munged` (`None`: libmunge's default socket).
    pub fn with_signing(
        mut self,
        signing: RequestSigning,
        munge_socket: Option<PathBuf>,
    ) -> ApiClient {
        self.signing = signing;
        self.munge = MungeContext::new().with_socket(munge_socket);
        self
    }

    /// The address from `--manager`, else `SPILLWAY_MANAGER`, else the default socket.
    pub fn from_flag(flag: Option<&str>) -> Result<ApiClient, ApiClientError> {
        let from_env = std::env::var("SPILLWAY_MANAGER").ok().filter(|v| !v.is_empty());
        ApiClient::new(flag.or(from_env.as_deref()).unwrap_or(DEFAULT_MANAGER_SOCKET))
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiClientError> {
        self.call("GET", path, None)
    }

    pub fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiClientError> {
        self.call("DELETE", path, None)
    }

    pub fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ApiClientError> {
        self.call("POST", path, Some(serde_json::to_vec(body).expect("API types serialize")))
    }

    pub fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ApiClientError> {
        self.call("PUT", path, Some(serde_json::to_vec(body).expect("API types serialize")))
    }

    fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ApiClientError> {
        let body = body.unwrap_or_default();
        let tcp = matches!(self.endpoint, Endpoint::Tcp(_));
        let sign = tcp && self.signing == RequestSigning::Always;
        match self.exchange(method, path, &body, sign) {
            Err(error)
                if tcp
                    && !sign
                    && self.signing == RequestSigning::WhenAsked
                    && asks_for_munge(&error) =>
            {
                self.exchange(method, path, &body, true)
            }
            outcome => outcome,
        }
    }

    /// One request on a new connection, with a munge credential if `sign`.
    fn exchange<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        sign: bool,
    ) -> Result<T, ApiClientError> {
        let endpoint = &self.endpoint;
        let io = |source| ApiClientError::Io { endpoint: endpoint.clone(), source };
        let bad = |reason: String| ApiClientError::BadReply { endpoint: endpoint.clone(), reason };
        let authorization = if sign {
            let value =
                crate::request_auth::authorization(&self.munge, method, path, body).map_err(
                    |source| ApiClientError::Credential { endpoint: endpoint.clone(), source },
                )?;
            format!("Authorization: {value}\r\n")
        } else {
            String::new()
        };
        let mut connection = spillway_proto::transport::connect(endpoint)
            .map_err(|source| ApiClientError::Connect { endpoint: endpoint.clone(), source })?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: spillway-manager\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{authorization}Connection: close\r\n\r\n",
            body.len()
        );
        connection.write_all(head.as_bytes()).map_err(io)?;
        connection.write_all(body).map_err(io)?;
        connection.flush().map_err(io)?;
        let mut reply = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match connection.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    reply.extend_from_slice(&chunk[..n]);
                    if reply.len() > REPLY_BYTES_MAX {
                        return Err(bad(format!("reply larger than {REPLY_BYTES_MAX} bytes")));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e)),
            }
        }
        let split = reply
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| bad("no end of headers".into()))?;
        let head =
            std::str::from_utf8(&reply[..split]).map_err(|_| bad("head is not UTF-8".into()))?;
        let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| {
            bad(format!("status line {:?}", head.lines().next().unwrap_or_default()))
        })?;
        let payload = &reply[split + 4..];
        if (200..300).contains(&status) {
            serde_json::from_slice(payload).map_err(|e| bad(format!("{method} {path}: {e}")))
        } else {
            match serde_json::from_slice::<ErrorBody>(payload) {
                Ok(error) => {
                    Err(ApiClientError::Api { status, kind: error.kind, message: error.error })
                }
                Err(_) => Err(ApiClientError::Api {
                    status,
                    kind: "http".into(),
                    message: format!(
                        "manager answered HTTP {status}: {}",
                        String::from_utf8_lossy(payload)
                    ),
                }),
            }
        }
    }
}

/// A 401 that names munge: the manager wants a credential on every request over TCP.
fn asks_for_munge(error: &ApiClientError) -> bool {
    matches!(error, ApiClientError::Api { status: 401, kind, .. } if kind == "munge_required")
}
