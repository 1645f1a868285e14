//! The client side of the manager's API, used by the `spillway` CLI and the Slurm hooks.
//!
//! One HTTP/1.1 request per connection over the manager's Unix socket (or loopback TCP), JSON
//! in and out. The manager identifies the caller from the socket, so nothing about identity is
//! sent. Error replies become [`ApiClientError::Api`] carrying the manager's message, which
//! already names the problem (and is what the CLI prints).

use std::io::{Read, Write};
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::Serialize;
use spillway_proto::Endpoint;

use crate::model::ErrorBody;

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
        Ok(ApiClient { endpoint })
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
        let endpoint = &self.endpoint;
        let io = |source| ApiClientError::Io { endpoint: endpoint.clone(), source };
        let bad = |reason: String| ApiClientError::BadReply { endpoint: endpoint.clone(), reason };
        let mut connection = spillway_proto::transport::connect(endpoint)
            .map_err(|source| ApiClientError::Connect { endpoint: endpoint.clone(), source })?;
        let body = body.unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: spillway-manager\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        connection.write_all(head.as_bytes()).map_err(io)?;
        connection.write_all(&body).map_err(io)?;
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
