//! The manager's HTTP/1.1 + JSON API server: a small hand-written server on std threads.
//!
//! Hand-written rather than a framework because the caller's identity must come from the
//! socket itself (`SO_PEERCRED`, or the loopback TCP owner), which the transports of
//! `spillway-proto` already provide, and because the API is a dozen control-plane requests a
//! minute, not a data path. With `manager.auth = munge`, a request over TCP is authenticated by
//! its `Authorization: MUNGE` header instead (see [`crate::request_auth`]; 401 without a valid
//! one). One request per connection (`Connection: close`), so there is no
//! keep-alive state. Bounded: connections served at once, in total and per uid
//! (`connections_max`, `connections_per_uid_max`; more get a 503 with `Retry-After` at once,
//! see [`crate::admission`]), request size (`request_bytes_max`; 413), and the time one
//! connection may take to send its whole request (`request_timeout_ms`, a deadline over every
//! read, not per read, so a client trickling bytes is cut off too; 408) and again to take its
//! reply. Malformed requests get a 4xx naming the problem; nothing a client sends can panic the
//! server.
//!
//! Endpoints (docs/design/manager.md): `GET /v1/whoami`, `GET|POST /v1/pools`,
//! `DELETE /v1/pools/<name>`, `GET|POST /v1/servers`, `POST /v1/servers/<id>/lost|remove`, `PUT /v1/servers/<id>/peaks`,
//! `GET|POST /v1/reservations[?all=1]`,
//! `GET|PATCH|DELETE /v1/reservations/<id|name>[?job=J&force=1]`,
//! `POST /v1/reservations/<id|name>/jobs`, `DELETE /v1/reservations/<id|name>/jobs/<job>`,
//! `POST /v1/reservations/<id|name>/rescue`,
//! `GET /v1/quotas`, `PUT /v1/quotas/<uid>`, `GET /v1/status[?aggregate=1]`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use spillway_config::Authentication;
use spillway_proto::{Connection, Identity, Listener, Transport};
use spillway_sys::munge::MungeContext;

use crate::admission::{reply_and_linger, ConnectionSlots, Refuser, BUSY_RETRY_AFTER_S};
use crate::model::ErrorBody;
use crate::request_auth::{check_authorization, RequestAuthError};
use crate::service::{ApiError, Manager, StatusView};

/// A parsed request.
#[derive(Debug)]
struct Request {
    method: String,
    /// The request target as sent (path and query), which a munge credential binds.
    target: String,
    path: String,
    query: BTreeMap<String, String>,
    /// The `Authorization` header, if any.
    authorization: Option<String>,
    body: Vec<u8>,
}

/// What the head of a request says.
struct Head<'a> {
    method: &'a str,
    target: &'a str,
    content_length: usize,
    authorization: Option<&'a str>,
}

/// What went wrong while reading a request (answered with a 4xx).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
enum RequestError {
    #[error("request larger than {limit} bytes (knob manager.request_bytes_max)")]
    TooLarge { limit: usize },
    #[error("request not received in time (knob manager.request_timeout_ms)")]
    Timeout,
    #[error("connection closed before the request was complete")]
    Truncated,
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("reading the request: {0}")]
    Io(std::io::Error),
}

impl RequestError {
    fn status(&self) -> u16 {
        match self {
            RequestError::TooLarge { .. } => 413,
            RequestError::Timeout => 408,
            _ => 400,
        }
    }
}

fn find_header_end(buffer: &[u8]) -> Option<usize> {
    buffer.windows(4).position(|w| w == b"\r\n\r\n")
}

/// The connection's request, read in full by `deadline` (else [`RequestError::Timeout`]).
fn read_request(
    connection: &mut dyn Connection,
    limit: usize,
    deadline: Instant,
) -> Result<Request, RequestError> {
    let mut reader = RequestReader { connection, chunk: [0u8; 4096], deadline };
    let mut buffer = Vec::with_capacity(1024);
    let header_end = reader.read_head(&mut buffer, limit)?;
    let head = std::str::from_utf8(&buffer[..header_end])
        .map_err(|_| RequestError::Malformed("request head is not UTF-8".into()))?;
    let Head { method, target, content_length, authorization } = parse_head(head)?;
    let body = reader.read_body(&buffer, header_end, content_length, limit)?;
    let (path, query_text) = target.split_once('?').unwrap_or((target, ""));
    Ok(Request {
        method: method.to_string(),
        target: target.to_string(),
        path: path.to_string(),
        query: parse_query(query_text),
        authorization: authorization.map(str::to_string),
        body,
    })
}

/// Reads a request's bytes from a connection, all of them by one deadline.
struct RequestReader<'a> {
    connection: &'a mut dyn Connection,
    chunk: [u8; 4096],
    deadline: Instant,
}

impl RequestReader<'_> {
    /// Reads into `buffer` until it holds the whole head (within `limit`); returns where it
    /// ends.
    fn read_head(&mut self, buffer: &mut Vec<u8>, limit: usize) -> Result<usize, RequestError> {
        loop {
            if let Some(end) = find_header_end(buffer) {
                return Ok(end);
            }
            if buffer.len() >= limit {
                return Err(RequestError::TooLarge { limit });
            }
            let want = self.chunk.len().min(limit - buffer.len());
            let n = self.read_some(want)?;
            buffer.extend_from_slice(&self.chunk[..n]);
        }
    }

    /// The body: the bytes after the head in `buffer`, then the rest up to `content_length`.
    fn read_body(
        &mut self,
        buffer: &[u8],
        header_end: usize,
        content_length: usize,
        limit: usize,
    ) -> Result<Vec<u8>, RequestError> {
        let body_start = header_end + 4;
        if body_start.saturating_add(content_length) > limit {
            return Err(RequestError::TooLarge { limit });
        }
        let mut body = buffer[body_start..].to_vec();
        if body.len() > content_length {
            return Err(RequestError::Malformed("more bytes than Content-Length".into()));
        }
        while body.len() < content_length {
            let want = self.chunk.len().min(content_length - body.len());
            let n = self.read_some(want)?;
            body.extend_from_slice(&self.chunk[..n]);
        }
        Ok(body)
    }

    /// One read of up to `want` bytes into `chunk` (again if interrupted), blocking no later
    /// than the deadline; never returns 0 bytes.
    fn read_some(&mut self, want: usize) -> Result<usize, RequestError> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RequestError::Timeout);
            }
            self.connection.set_read_timeout(Some(left)).map_err(RequestError::Io)?;
            match self.connection.read(&mut self.chunk[..want]) {
                Ok(0) => return Err(RequestError::Truncated),
                Ok(n) => return Ok(n),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(RequestError::Timeout)
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(RequestError::Io(e)),
            }
        }
    }
}

/// The request line's method and target, the `Content-Length` of the head (0 if absent) and
/// its `Authorization`.
fn parse_head(head: &str) -> Result<Head<'_>, RequestError> {
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(RequestError::Malformed(format!("request line {request_line:?}")));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(RequestError::Malformed(format!("unsupported version {version:?}")));
    }
    let mut content_length = 0usize;
    let mut authorization = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(RequestError::Malformed(format!("header line {line:?}")));
        };
        if name.trim().eq_ignore_ascii_case("content-length") {
            content_length = value.trim().parse().map_err(|_| {
                RequestError::Malformed(format!("Content-Length {:?}", value.trim()))
            })?;
        } else if name.trim().eq_ignore_ascii_case("authorization") {
            authorization = Some(value.trim());
        } else if name.trim().eq_ignore_ascii_case("transfer-encoding") {
            return Err(RequestError::Malformed(
                "Transfer-Encoding is not supported; send Content-Length".into(),
            ));
        }
    }
    Ok(Head { method, target, content_length, authorization })
}

/// The query's `key=value` pairs (a key without `=` has an empty value).
fn parse_query(query_text: &str) -> BTreeMap<String, String> {
    query_text
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        507 => "Insufficient Storage",
        _ => "Status",
    }
}

/// The head of a reply with `body_length` bytes of JSON; `Retry-After` when given.
fn response_head(status: u16, body_length: usize, retry_after_s: Option<u64>) -> String {
    let retry_after =
        retry_after_s.map(|seconds| format!("Retry-After: {seconds}\r\n")).unwrap_or_default();
    // A 401 names the scheme that would have been accepted.
    let challenge = if status == 401 { "WWW-Authenticate: MUNGE\r\n" } else { "" };
    format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {body_length}\r\n{retry_after}{challenge}Connection: close\r\n\r\n",
        reason(status),
    )
}

/// Writes `bytes`, each write blocking no later than `deadline`.
fn write_all_by(
    connection: &mut dyn Connection,
    mut bytes: &[u8],
    deadline: Instant,
) -> std::io::Result<()> {
    while !bytes.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        connection.set_write_timeout(Some(left))?;
        match connection.write(bytes) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sends a reply, all of it by `deadline`.
fn write_response(
    connection: &mut dyn Connection,
    status: u16,
    body: &[u8],
    deadline: Instant,
) -> std::io::Result<()> {
    write_all_by(connection, response_head(status, body.len(), None).as_bytes(), deadline)?;
    write_all_by(connection, body, deadline)?;
    connection.flush()
}

type Reply = (u16, Vec<u8>);

fn json<T: Serialize>(status: u16, value: &T) -> Reply {
    (status, serde_json::to_vec(value).expect("API types serialize"))
}

fn error_reply(status: u16, kind: &str, message: String) -> Reply {
    json(status, &ErrorBody { error: message, kind: kind.to_string() })
}

fn api_error<E: ApiError>(error: E) -> Reply {
    if error.status() >= 500 {
        tracing::error!(%error, "API request failed");
    }
    error_reply(error.status(), error.kind(), error.to_string())
}

fn result<T: Serialize, E: ApiError>(status: u16, outcome: Result<T, E>) -> Reply {
    match outcome {
        Ok(value) => json(status, &value),
        Err(error) => api_error(error),
    }
}

fn body<T: DeserializeOwned>(request: &Request) -> Result<T, Reply> {
    serde_json::from_slice(&request.body).map_err(|e| {
        error_reply(
            400,
            "invalid",
            format!("request body of {} {}: {e}", request.method, request.path),
        )
    })
}

impl Request {
    /// Whether the query sets `name` (`name=1` or `name=true`).
    fn flag(&self, name: &str) -> bool {
        self.query.get(name).is_some_and(|v| v == "1" || v == "true")
    }
}

/// Answers one request as `caller`.
fn route(manager: &Manager, caller: &crate::Caller, request: &Request) -> Reply {
    let segments: Vec<&str> = request.path.trim_start_matches('/').split('/').collect();
    let method = request.method.as_str();
    match (method, segments.as_slice()) {
        ("GET", ["v1", "whoami"]) => json(200, &manager.whoami(caller)),
        ("GET", ["v1", "status"]) => {
            let view =
                if request.flag("aggregate") { StatusView::Aggregate } else { StatusView::Caller };
            result(200, manager.status(caller, view))
        }
        ("GET", ["v1", "pools"]) => result(200, manager.list_pools(caller)),
        ("POST", ["v1", "pools"]) => match body(request) {
            Ok(create) => result(201, manager.create_pool(caller, &create)),
            Err(reply) => reply,
        },
        ("DELETE", ["v1", "pools", name]) => result(
            200,
            manager.delete_pool(caller, name).map(|()| serde_json::json!({ "deleted": name })),
        ),
        ("GET", ["v1", "servers"]) => result(200, manager.list_servers()),
        ("POST", ["v1", "servers"]) => match body(request) {
            Ok(add) => {
                let prober = crate::heartbeat::ClientProber::of(manager);
                result(201, manager.add_server_probed(caller, &add, &|a| prober.identify(a)))
            }
            Err(reply) => reply,
        },
        ("POST", ["v1", "servers", key, "lost"]) => {
            result(200, manager.declare_server_lost(caller, key))
        }
        ("POST", ["v1", "servers", key, "remove"]) => {
            result(200, manager.remove_server(caller, key))
        }
        ("PUT", ["v1", "servers", key, "peaks"]) => match body(request) {
            Ok(peaks) => result(200, manager.set_server_peaks(caller, key, &peaks)),
            Err(reply) => reply,
        },
        (_, ["v1", "reservations", ..]) => route_reservations(manager, caller, request, &segments),
        (_, ["v1", "tiers", ..]) => route_tiers(manager, caller, request, &segments),
        ("GET", ["v1", "quotas"]) => result(200, manager.quotas(caller)),
        ("PUT", ["v1", "quotas", uid]) => match uid.parse::<u32>() {
            Ok(uid) => match body(request) {
                Ok(set) => result(200, manager.set_quota(caller, uid, &set)),
                Err(reply) => reply,
            },
            Err(_) => error_reply(400, "invalid", format!("uid {uid:?} is not a number")),
        },
        (_, ["v1", "whoami" | "status" | "pools" | "servers" | "quotas", ..]) => {
            method_not_allowed(request)
        }
        _ => error_reply(404, "no_such_endpoint", format!("no endpoint {method} {}", request.path)),
    }
}

fn method_not_allowed(request: &Request) -> Reply {
    error_reply(
        405,
        "method_not_allowed",
        format!("{} is not allowed on {}", request.method, request.path),
    )
}

/// `/v1/tiers…`: phase reports, the tiers' load, drains' PFS slots (crate::tiering).
fn route_tiers(
    manager: &Manager,
    caller: &crate::Caller,
    request: &Request,
    segments: &[&str],
) -> Reply {
    let ticket = |text: &str| {
        text.parse::<u64>().map_err(|_| {
            error_reply(400, "invalid", format!("drain ticket {text:?} is not a number"))
        })
    };
    match (request.method.as_str(), segments) {
        ("GET", ["v1", "tiers"]) => json(200, &manager.tiers(caller)),
        ("POST", ["v1", "tiers", "phases"]) => match body(request) {
            Ok(report) => result(200, manager.report_phase(caller, &report)),
            Err(reply) => reply,
        },
        ("POST", ["v1", "tiers", "locations"]) => match body(request) {
            Ok(location) => result(200, manager.record_location(caller, &location)),
            Err(reply) => reply,
        },
        ("GET", ["v1", "tiers", "locations"]) => json(200, &manager.locations(caller)),
        ("GET", ["v1", "tiers", "locations", epoch]) => match epoch.parse::<u64>() {
            Ok(epoch) => result(200, manager.locate(caller, epoch)),
            Err(_) => error_reply(400, "invalid", format!("epoch {epoch:?} is not a number")),
        },
        ("POST", ["v1", "tiers", "drains"]) => match body(request) {
            Ok(ask) => result(201, manager.ask_drain(caller, &ask)),
            Err(reply) => reply,
        },
        ("GET", ["v1", "tiers", "drains", id]) => match ticket(id) {
            Ok(id) => result(200, manager.poll_drain(caller, id)),
            Err(reply) => reply,
        },
        ("POST", ["v1", "tiers", "drains", id, "done"]) => match (ticket(id), body(request)) {
            (Ok(id), Ok(done)) => result(200, manager.release_drain(caller, id, &done)),
            (Err(reply), _) | (_, Err(reply)) => reply,
        },
        _ => method_not_allowed(request),
    }
}

/// `/v1/reservations…`: list, create, show, destroy, and the jobs using one.
fn route_reservations(
    manager: &Manager,
    caller: &crate::Caller,
    request: &Request,
    segments: &[&str],
) -> Reply {
    match (request.method.as_str(), segments) {
        ("GET", ["v1", "reservations"]) => {
            result(200, manager.list_reservations(caller, request.flag("all")))
        }
        ("POST", ["v1", "reservations"]) => match body::<crate::CreateReservation>(request) {
            Ok(create) => create_reservation(manager, caller, &create),
            Err(reply) => reply,
        },
        ("GET", ["v1", "reservations", key]) => result(200, manager.show_reservation(caller, key)),
        ("PATCH", ["v1", "reservations", key]) => match body::<crate::ModifyReservation>(request) {
            Ok(change) => result(200, modify_reservation(manager, caller, key, &change)),
            Err(reply) => reply,
        },
        ("DELETE", ["v1", "reservations", key]) => {
            let job = request.query.get("job").map(String::as_str);
            // Until the revoke is sent: see `Manager::grants`.
            let _grants = grants_or_wait_out(manager);
            match manager.destroy_reservation(caller, key, job, request.flag("force")) {
                Ok(destroyed) => {
                    let mut reservation = destroyed.reservation;
                    let seen = crate::retire_reservation_data(
                        &reservation,
                        manager.knobs().munge_socket_path().as_deref(),
                    );
                    match manager.record_achieved(reservation.id, &seen) {
                        Ok(achieved) => reservation.achieved = Some(achieved),
                        // Destroyed all the same: only the record is missing.
                        Err(error) => {
                            tracing::warn!(reservation = reservation.id, %error, "could not record the achieved I/O")
                        }
                    }
                    json(200, &reservation)
                }
                Err(error) => api_error(error),
            }
        }
        ("POST", ["v1", "reservations", key, "jobs"]) => {
            match body::<crate::RegisterJob>(request) {
                Ok(register) => result(200, manager.register_job(caller, key, &register.job)),
                Err(reply) => reply,
            }
        }
        ("DELETE", ["v1", "reservations", key, "jobs", job]) => {
            result(200, manager.unregister_job(caller, key, job))
        }
        ("POST", ["v1", "reservations", key, "rescue"]) => {
            match body::<crate::MarkRescue>(request) {
                Ok(mark) => result(200, manager.mark_rescue(caller, key, &mark)),
                Err(reply) => reply,
            }
        }
        _ => method_not_allowed(request),
    }
}

/// `Manager::grants` for a reservation change, or `None` (logged) once `GRANTS_WAIT_MAX` has
/// passed: the change then goes on without it.
fn grants_or_wait_out(manager: &Manager) -> Option<std::sync::MutexGuard<'_, ()>> {
    let guard = crate::service::lock_within(&manager.grants, crate::service::GRANTS_WAIT_MAX);
    if guard.is_none() {
        tracing::warn!("the heartbeat has held the grants for too long (a server that does not answer?): changing the reservation without waiting");
    }
    guard
}

/// Changes the reservation, then (best effort; the heartbeat re-sends grants until every server
/// has it) sends its new grant, holding `Manager::grants` until then.
fn modify_reservation(
    manager: &Manager,
    caller: &crate::Caller,
    key: &str,
    change: &crate::ModifyReservation,
) -> Result<crate::Reservation, crate::admin::ModifyReservationError> {
    let _grants = grants_or_wait_out(manager);
    let reservation = manager.modify_reservation(caller, key, change)?;
    let munge_socket = manager.knobs().munge_socket_path();
    for (server, error) in crate::grant_reservation(&reservation, munge_socket.as_deref()) {
        tracing::warn!(reservation = reservation.id, %server, %error, "could not grant the reservation's new capacity or sharing");
    }
    Ok(reservation)
}

/// Creates the reservation, then (best effort) its namespace and its grants on the servers.
fn create_reservation(
    manager: &Manager,
    caller: &crate::Caller,
    create: &crate::CreateReservation,
) -> Reply {
    let reservation = match manager.create_reservation(caller, create) {
        Ok(reservation) => reservation,
        Err(error) => return api_error(error),
    };
    if create.dry_run {
        return json(200, &reservation);
    }
    let munge_socket = manager.knobs().munge_socket_path();
    // Best effort: without it, stage-in as a user fails naming the namespace, and the job's
    // mount (root) creates it at pre_run.
    if let Err(error) = crate::create_reservation_namespace(&reservation, munge_socket.as_deref()) {
        tracing::warn!(reservation = reservation.id, %error, "could not create the reservation's namespace");
    }
    // Best effort too: the heartbeat grants it again until every server has it.
    for (server, error) in crate::grant_reservation(&reservation, munge_socket.as_deref()) {
        tracing::warn!(reservation = reservation.id, %server, %error, "could not grant the reservation's epoch");
    }
    json(201, &reservation)
}

/// Serves one admitted connection: reads its request by the deadline, answers it as the
/// caller the kernel vouched for (or, with `munge`, the request's credential), and sends the
/// reply by a second deadline.
fn handle(
    manager: &Manager,
    mut connection: Box<dyn Connection>,
    identity: Identity,
    munge: Option<MungeContext>,
) {
    let peer = connection.peer();
    let knobs = manager.knobs();
    let time_limit = Duration::from_millis(knobs.request_timeout_ms);
    let limit = knobs.request_bytes_max as usize;
    let request = match read_request(connection.as_mut(), limit, Instant::now() + time_limit) {
        Ok(request) => request,
        Err(error) => {
            tracing::warn!(%peer, uid = identity.uid, %error, "bad API request");
            let (status, body) = error_reply(error.status(), "bad_request", error.to_string());
            // Part of the request may be unread: close lingering, so the client gets the reply.
            reply_and_linger(connection, response_head(status, body.len(), None).as_bytes(), &body);
            return;
        }
    };
    let started = Instant::now();
    let (status, body) = match request_identity(munge.as_ref(), identity, &request) {
        Ok(identity) => {
            let caller = manager.caller(identity.uid, identity.gid);
            let reply = route(manager, &caller, &request);
            tracing::debug!(%peer, uid = caller.uid, method = %request.method, path = %request.path, status = reply.0, "request");
            reply
        }
        Err(RequestAuthError::Unavailable(error)) => {
            tracing::error!(%peer, %error, "cannot check an API request's munge credential");
            let message = format!("the manager cannot check munge credentials: {error}");
            error_reply(503, "munge_unavailable", message)
        }
        Err(refusal) => {
            tracing::warn!(%peer, method = %request.method, path = %request.path, reason = %refusal, "refusing API request: munge authentication failed");
            error_reply(401, "munge_required", refusal.to_string())
        }
    };
    if let Err(error) =
        write_response(connection.as_mut(), status, &body, Instant::now() + time_limit)
    {
        tracing::debug!(%peer, %error, "could not send the reply");
    }
    manager.api_latency.observe(started.elapsed());
    connection.shutdown();
}

/// The identity a request runs as: the kernel's, or with munge the credential's.
fn request_identity(
    munge: Option<&MungeContext>,
    kernel_identity: Identity,
    request: &Request,
) -> Result<Identity, RequestAuthError> {
    match munge {
        None => Ok(kernel_identity),
        Some(context) => check_authorization(
            context,
            request.authorization.as_deref(),
            &request.method,
            &request.target,
            &request.body,
        ),
    }
}

/// Serves the API on `listeners` until `stop` is set; returns after in-flight requests finish.
pub fn serve(manager: Arc<Manager>, listeners: Vec<Box<dyn Listener>>, stop: Arc<AtomicBool>) {
    let knobs = manager.knobs();
    let slots = ConnectionSlots::new(
        knobs.connections_max as usize,
        knobs.connections_per_uid_max as usize,
    );
    let refuser = Refuser::new(knobs.connections_max as usize);
    while !stop.load(Ordering::Relaxed) {
        let mut accepted_any = false;
        for listener in &listeners {
            match listener.accept() {
                Ok(Some(connection)) => {
                    accepted_any = true;
                    admit(&manager, &slots, &refuser, connection);
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(endpoint = %listener.endpoint(), %error, "accept failed");
                }
            }
        }
        if !accepted_any {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // Let in-flight requests finish (bounded by the request and reply deadlines plus the work).
    let deadline = Instant::now() + Duration::from_millis(manager.knobs().request_timeout_ms) * 2;
    while slots.in_use() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Serves `connection` on its own thread if its uid has a free slot; refuses it otherwise
/// (403 without an identity, 503 with `Retry-After` when busy).
fn admit(
    manager: &Arc<Manager>,
    slots: &Arc<ConnectionSlots>,
    refuser: &Refuser,
    connection: Box<dyn Connection>,
) {
    // Over TCP a munge manager takes the identity from each request's credential, known only
    // once the request is read: until then such connections count as `nobody`'s.
    let knobs = manager.knobs();
    let munge = (knobs.auth == Authentication::Munge && connection.transport() == Transport::Tcp)
        .then(|| MungeContext::new().with_socket(knobs.munge_socket_path()));
    let identity = match connection.identity() {
        _ if munge.is_some() => Identity::NOBODY,
        Ok(identity) => identity,
        Err(error) => {
            tracing::warn!(peer = %connection.peer(), %error, "cannot establish the caller's identity");
            let (status, body) =
                error_reply(403, "no_identity", format!("cannot establish your identity: {error}"));
            refuser.refuse(connection, response_head(status, body.len(), None), body);
            return;
        }
    };
    match slots.try_take(identity.uid) {
        Ok(slot) => {
            let manager = Arc::clone(manager);
            let spawned = std::thread::Builder::new().name("manager-api".into()).spawn(move || {
                handle(&manager, connection, identity, munge);
                drop(slot);
            });
            if let Err(error) = spawned {
                tracing::error!(%error, "cannot start an API thread");
            }
        }
        Err(busy) => {
            tracing::debug!(peer = %connection.peer(), uid = identity.uid, %busy, "API busy");
            let (status, body) = error_reply(503, "busy", busy.to_string());
            refuser.refuse(
                connection,
                response_head(status, body.len(), Some(BUSY_RETRY_AFTER_S)),
                body,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// An in-memory connection: reads from `input`, collects what is written.
    struct Fake {
        input: std::io::Cursor<Vec<u8>>,
    }
    impl Read for Fake {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(buf)
        }
    }
    impl Write for Fake {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl Connection for Fake {
        fn transport(&self) -> Transport {
            Transport::Unix
        }
        fn peer(&self) -> String {
            "fake".into()
        }
        fn identity(&self) -> std::io::Result<spillway_proto::Identity> {
            Ok(spillway_proto::Identity { uid: 1, gid: 1 })
        }
        fn try_clone_connection(&self) -> std::io::Result<Box<dyn Connection>> {
            Err(std::io::Error::other("the fake connection cannot be cloned"))
        }
        fn set_read_timeout(&self, _: Option<Duration>) -> std::io::Result<()> {
            Ok(())
        }
        fn set_write_timeout(&self, _: Option<Duration>) -> std::io::Result<()> {
            Ok(())
        }
        fn shutdown_write(&self) {}
        fn shutdown(&self) {}
        fn peer_closed(&self) -> std::io::Result<bool> {
            Ok(false)
        }
    }

    fn parse(bytes: &[u8], limit: usize) -> Result<Request, RequestError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        read_request(&mut Fake { input: std::io::Cursor::new(bytes.to_vec()) }, limit, deadline)
    }

    #[test]
    fn parses_request_line_query_and_body() {
        let request = parse(
            b"POST /v1/reservations?all=1&job=7 HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
            4096,
        )
        .unwrap();
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/v1/reservations");
        assert_eq!(request.query.get("job").map(String::as_str), Some("7"));
        assert_eq!(request.target, "/v1/reservations?all=1&job=7");
        assert_eq!(request.body, b"{}");
        assert_eq!(request.authorization, None);
        let signed =
            parse(b"GET /v1/whoami HTTP/1.1\r\nauthorization:  MUNGE MUNGE:abc: \r\n\r\n", 4096)
                .unwrap();
        assert_eq!(signed.authorization.as_deref(), Some("MUNGE MUNGE:abc:"));
    }

    #[test]
    fn bad_requests_are_named_not_panics() {
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\nContent-Length: 9999\r\n\r\n", 1024),
            Err(RequestError::TooLarge { .. })
        ));
        assert!(matches!(parse(&[b'a'; 5000], 1024), Err(RequestError::TooLarge { .. })));
        assert!(matches!(parse(b"GET /\r\n\r\n", 1024), Err(RequestError::Malformed(_))));
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 1024),
            Err(RequestError::Malformed(_))
        ));
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", 1024),
            Err(RequestError::Truncated)
        ));
        assert!(matches!(parse(b"GET / HTTP/1.1\r\n", 1024), Err(RequestError::Truncated)));
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\n\xff\xfe\r\n\r\n", 1024),
            Err(RequestError::Malformed(_))
        ));
    }
}
