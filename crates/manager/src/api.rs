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
//!
//! A busy manager answers `503` with `Retry-After` (kind `busy`) before reading the request, so
//! any request is safe to send again: the client waits as asked and retries, for at most
//! [`BUSY_RETRY_BUDGET`] in all. The reply is read up to its `Content-Length`, and a reply that
//! arrived in full counts even if sending the request failed (a refused connection may be shut
//! before the request was written).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

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

/// How long in all a call keeps retrying while the manager answers busy (503, `busy`).
pub const BUSY_RETRY_BUDGET: Duration = Duration::from_secs(60);

/// The shortest and the longest wait between two tries, whatever `Retry-After` says.
const BUSY_RETRY_WAIT_MIN: Duration = Duration::from_millis(100);
const BUSY_RETRY_WAIT_MAX: Duration = Duration::from_secs(5);

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
    reply_silence_max: Duration,
}

/// How long a reply may stay silent before the request fails. A manager that accepted the
/// connection and hangs (stopped, deadlocked) must not hang its callers forever: the tiering
/// runtime's and the mount's reporter threads are joined when a job's process or mount ends.
/// Generous: the manager answers within its own `manager.request_timeout_ms` (10 s).
pub const REPLY_SILENCE_MAX: Duration = Duration::from_secs(120);

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
        Ok(ApiClient {
            endpoint,
            signing: RequestSigning::from_env()?,
            munge,
            reply_silence_max: REPLY_SILENCE_MAX,
        })
    }

    /// Overrides [`REPLY_SILENCE_MAX`].
    pub fn with_reply_silence_max(mut self, silence: Duration) -> ApiClient {
        self.reply_silence_max = silence;
        self
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

    pub fn patch<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ApiClientError> {
        self.call("PATCH", path, Some(serde_json::to_vec(body).expect("API types serialize")))
    }

    /// One call, retried while the manager answers busy, for at most [`BUSY_RETRY_BUDGET`],
    /// and once with a credential if the manager asks for munge.
    fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ApiClientError> {
        let body = body.unwrap_or_default();
        let tcp = matches!(self.endpoint, Endpoint::Tcp(_));
        let mut sign = tcp && self.signing == RequestSigning::Always;
        let give_up = Instant::now() + BUSY_RETRY_BUDGET;
        loop {
            let reply = self.exchange(method, path, &body, sign)?;
            if reply.status == 401
                && tcp
                && !sign
                && self.signing == RequestSigning::WhenAsked
                && error_kind(&reply).as_deref() == Some("munge_required")
            {
                // Nothing was done for the refused request: send it again, signed.
                sign = true;
                continue;
            }
            if reply.status == 503 && Instant::now() < give_up {
                if let Some(kind) = error_kind(&reply) {
                    if kind == "busy" {
                        let wait = reply.retry_after.unwrap_or(BUSY_RETRY_WAIT_MAX);
                        let left = give_up.saturating_duration_since(Instant::now());
                        let wait = wait.clamp(BUSY_RETRY_WAIT_MIN, BUSY_RETRY_WAIT_MAX);
                        std::thread::sleep(wait.min(left));
                        continue;
                    }
                }
            }
            return self.decode(method, path, reply);
        }
    }

    /// Sends one request on a new connection, with a munge credential if `sign`, and reads
    /// its reply.
    fn exchange(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        sign: bool,
    ) -> Result<Reply, ApiClientError> {
        let endpoint = &self.endpoint;
        let io = |source| ApiClientError::Io { endpoint: endpoint.clone(), source };
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
        connection.set_read_timeout(Some(self.reply_silence_max)).map_err(io)?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: spillway-manager\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{authorization}Connection: close\r\n\r\n",
            body.len()
        );
        let sent = connection
            .write_all(head.as_bytes())
            .and_then(|()| connection.write_all(body))
            .and_then(|()| connection.flush());
        // A refused connection may be shut before the request is written: its reply still counts.
        match (read_reply(connection.as_mut()), sent) {
            (Ok(ReplyRead::Complete(reply)), _) => Ok(reply),
            (_, Err(error)) => Err(io(error)),
            (Ok(ReplyRead::Partial(bytes)), Ok(())) => self.parse_partial(bytes),
            (Err(error), Ok(())) => Err(io(error)),
        }
    }

    /// A reply that ended without `Content-Length` bytes of body: malformed.
    fn parse_partial(&self, bytes: Vec<u8>) -> Result<Reply, ApiClientError> {
        let reason = if bytes.len() > REPLY_BYTES_MAX {
            format!("reply larger than {REPLY_BYTES_MAX} bytes")
        } else if parse_head(&bytes).is_some() {
            "the connection closed before the end of the reply".to_string()
        } else {
            format!("no complete reply head (with Content-Length) in {} bytes", bytes.len())
        };
        Err(ApiClientError::BadReply { endpoint: self.endpoint.clone(), reason })
    }

    /// The value of a 2xx reply, or the manager's error.
    fn decode<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        reply: Reply,
    ) -> Result<T, ApiClientError> {
        let Reply { status, body, .. } = reply;
        if (200..300).contains(&status) {
            return serde_json::from_slice(&body).map_err(|e| ApiClientError::BadReply {
                endpoint: self.endpoint.clone(),
                reason: format!("{method} {path}: {e}"),
            });
        }
        match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(error) => {
                Err(ApiClientError::Api { status, kind: error.kind, message: error.error })
            }
            Err(_) => Err(ApiClientError::Api {
                status,
                kind: "http".into(),
                message: format!(
                    "manager answered HTTP {status}: {}",
                    String::from_utf8_lossy(&body)
                ),
            }),
        }
    }
}

/// A reply: status, `Retry-After` and body.
struct Reply {
    status: u16,
    retry_after: Option<Duration>,
    body: Vec<u8>,
}

/// What reading a reply gave: all of it, or the bytes before the connection ended.
enum ReplyRead {
    Complete(Reply),
    Partial(Vec<u8>),
}

/// The head's status, `Retry-After` (seconds) and `Content-Length`, and where the body starts;
/// `None` until the head is complete and valid.
fn parse_head(bytes: &[u8]) -> Option<(u16, Option<Duration>, usize, usize)> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&bytes[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let (mut retry_after, mut length) = (None, None);
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse().ok()?);
        } else if name.eq_ignore_ascii_case("retry-after") {
            retry_after = value.parse().ok().map(Duration::from_secs);
        }
    }
    Some((status, retry_after, length?, end + 4))
}

/// Reads a reply up to its `Content-Length`; what follows, or an error after it, is ignored.
fn read_reply(connection: &mut dyn spillway_proto::Connection) -> std::io::Result<ReplyRead> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some((status, retry_after, length, start)) = parse_head(&bytes) {
            if bytes.len() >= start + length {
                let body = bytes[start..start + length].to_vec();
                return Ok(ReplyRead::Complete(Reply { status, retry_after, body }));
            }
        }
        if bytes.len() > REPLY_BYTES_MAX {
            return Ok(ReplyRead::Partial(bytes));
        }
        match connection.read(&mut chunk) {
            Ok(0) => return Ok(ReplyRead::Partial(bytes)),
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if bytes.is_empty() => return Err(e),
            Err(_) => return Ok(ReplyRead::Partial(bytes)),
        }
    }
}

/// The `kind` of an error reply's JSON body, if it has one.
fn error_kind(reply: &Reply) -> Option<String> {
    serde_json::from_slice::<ErrorBody>(&reply.body).ok().map(|error| error.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manager_that_accepts_and_never_answers_fails_the_request_instead_of_hanging_it() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("hung.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let (_connection, _) = listener.accept().unwrap();
            // Holds the connection open, silent, until the test is done (bounded).
            let _ = released.recv_timeout(Duration::from_secs(60));
        });
        let client = ApiClient::new(&socket.to_string_lossy())
            .unwrap()
            .with_reply_silence_max(Duration::from_millis(200));
        let error = client.get::<serde_json::Value>("/v1/status").unwrap_err().to_string();
        release.send(()).unwrap();
        holder.join().unwrap();
        assert!(
            error.contains("temporarily unavailable") || error.contains("timed out"),
            "the silent reply should time out: {error}"
        );
    }
}
