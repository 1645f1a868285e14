//! One client connection: handshake, a reader thread and an executor thread.
//!
//! The reader decodes frames and, for a write, reads the payload straight into store memory
//! reserved for it (a [`PendingWrite`]), which the executor publishes in request order; when the
//! store cannot reserve at once (DRAM above its high watermark, no capacity, a bad request) it
//! reserves budget and reads into a pooled buffer for `Backend::write` instead, which waits for
//! space and reports the error. It hands each request to the executor through a
//! bounded queue; the executor runs requests in order and is the only writer of replies, so
//! replies leave in request order. A frame whose *header* is bad means the stream is out of sync:
//! the reader queues an error reply and closes. A frame whose *body* is bad is answered with an
//! error reply and the connection goes on. Either way a warning names the peer and the problem.
//!
//! On a munge server (`server.auth = munge`) a TCP connection is not served before its
//! `Authenticate`: the handshake announces munge and a random challenge, and the next frame must
//! carry a credential that the local `munged` accepts and whose payload carries that challenge;
//! the connection then runs as the credential's uid/gid. Anything else is answered with
//! `PermissionDenied` naming the reason, logged with the peer, and the connection is closed.
//!
//! Fairness: a connection must finish its handshake within `handshake_timeout_ms`; until a
//! munge connection's credential is checked it counts against `handshakes_max` only. Once
//! identified (at accept from the kernel, or by its credential) it is admitted against `connections_max` and its uid's
//! `connections_per_user_max` (root exempt), or refused with `Busy`. The reader closes it after
//! `idle_timeout_ms` with nothing in flight ([`Activity`]), and drops a write whose payload
//! arrives slower than `frame_bytes_per_second_min` (measured per `frame_rate_window_ms`, the
//! first window being the grace); each write's payload is also charged to its uid's budget
//! (`in_flight_bytes_per_user_max`) until the store has it.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_proto::auth::credential_payload;
use spillway_proto::frame::{self, ReceiveError};
use spillway_proto::message::ServerStatus;
use spillway_proto::{
    AuthMethod, Connection, DrainInfo, Durability, ErrorCode, Extent, FileInfo, FrameError, Header,
    Identity, Participant, Request, Response, Transport, WriteExtent, BODY_BYTES_MAX,
    CHALLENGE_BYTES, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN,
};
use spillway_sys::munge::{MungeContext, MungeError};
use spillway_types::{EpochId, FileId};

use crate::access::{self, authorize, stream_of, Intent, Requester};
use crate::backend::{BackendError, PendingWrite};
use crate::budget::{ByteBudget, Reservation};
use crate::Shared;

/// How often a blocked read wakes to look at the shutdown flag.
const READ_POLL: Duration = Duration::from_millis(100);

/// A write's payload as the reader received it, with its charge to the writer's uid (`None`
/// for root), released once the store has it.
enum Payload {
    /// In store memory, to be published, with the CRC32C of each of its buffers.
    Placed(Box<dyn PendingWrite>, Option<Reservation>, Vec<u32>),
    /// In a pooled buffer charged to the in-flight budget, for `Backend::write`, with the
    /// CRC32C of each of its record-sized pieces.
    Buffered(Vec<u8>, Reservation, Option<Reservation>, Vec<u32>),
}

/// What the reader did with a request's payload.
enum Received {
    /// Not a write: no payload.
    Nothing,
    /// A write's payload, checked against the client's checksum.
    Payload(Payload),
    /// A write refused on receipt (its payload did not match its checksum); the reply is
    /// queued and nothing of the write was kept.
    Answered,
}

/// The CRC32C of consecutive pieces combined into the CRC of their concatenation. A write of one
/// piece (most writes) combines nothing: `crc32c_combine` costs tens of microseconds, which
/// only pieces of a record's size (MiBs) make negligible.
fn combined_crc(pieces: &[(u32, usize)]) -> u32 {
    match pieces {
        [] => crc32c::crc32c(&[]),
        [(first, _), rest @ ..] => rest.iter().fold(*first, |crc, &(piece_crc, length)| {
            crc32c::crc32c_combine(crc, piece_crc, length)
        }),
    }
}

/// What the executor tells the reader for the idle timeout: requests queued or running, and
/// when the last one finished.
pub(crate) struct Activity {
    in_flight: std::sync::atomic::AtomicU32,
    last_done: parking_lot::Mutex<Instant>,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            in_flight: std::sync::atomic::AtomicU32::new(0),
            last_done: parking_lot::Mutex::new(Instant::now()),
        }
    }

    fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    fn done(&self) {
        *self.last_done.lock() = Instant::now();
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// How long nothing has happened, given when the reader last received a byte.
    fn idle_for(&self, last_byte_at: Instant) -> Duration {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        last_byte_at.elapsed().min(self.last_done.lock().elapsed())
    }
}

/// A non-root uid's share of the server: its identified connections and its write budget.
pub(crate) struct UserEntry {
    connections: u32,
    budget: Arc<ByteBudget>,
}

/// An admitted connection's place in `connections_max` and in its uid's cap; given back on drop.
struct Admission<'a> {
    shared: &'a Shared,
    uid: u32,
    /// The uid's in-flight write budget; `None` for root.
    user_budget: Option<Arc<ByteBudget>>,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.shared.connections.fetch_sub(1, Ordering::SeqCst);
        if self.user_budget.is_some() {
            let mut users = self.shared.users.lock();
            if let Some(entry) = users.get_mut(&self.uid) {
                entry.connections -= 1;
                if entry.connections == 0 {
                    users.remove(&self.uid);
                }
            }
        }
    }
}

/// Admits an identified connection against `connections_max` and, unless root, its uid's
/// `connections_per_user_max`; else why not (answered `Busy`).
fn admit(shared: &Shared, uid: u32) -> Result<Admission<'_>, String> {
    let count = shared.connections.fetch_add(1, Ordering::SeqCst) + 1;
    let mut admission = Admission { shared, uid, user_budget: None };
    if count > shared.options.connections_max {
        return Err(format!(
            "server at its limit of {} connections (server.connections_max)",
            shared.options.connections_max
        ));
    }
    if uid == 0 {
        return Ok(admission);
    }
    let fairness = &shared.options.fairness;
    let mut users = shared.users.lock();
    let entry = users.entry(uid).or_insert_with(|| UserEntry {
        connections: 0,
        budget: Arc::new(ByteBudget::new(fairness.in_flight_bytes_per_user_max)),
    });
    if entry.connections >= fairness.connections_per_user_max {
        if entry.connections == 0 {
            users.remove(&uid);
        }
        return Err(format!(
            "uid {uid} already has {} connections to this server (server.connections_per_user_max)",
            fairness.connections_per_user_max
        ));
    }
    entry.connections += 1;
    admission.user_budget = Some(entry.budget.clone());
    Ok(admission)
}

/// A connection's place in `handshakes_max`, given back on drop (when identified or closed).
struct Handshaking<'a>(&'a Shared);

impl Drop for Handshaking<'_> {
    fn drop(&mut self) {
        self.0.handshakes.fetch_sub(1, Ordering::SeqCst);
    }
}

fn timed_out(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, message)
}

/// Work for the executor.
enum Job {
    Request { request_id: u64, request: Request, payload: Option<Payload>, received: Instant },
    Reply { request_id: u64, response: Response },
}

/// A reader that notices shutdown at frame boundaries: if the server is stopping and no byte
/// of the next frame has arrived, it reports end of stream; mid-frame it keeps reading until
/// the shutdown grace runs out. A peer that sends nothing for `stall_max` in the middle of a
/// frame is cut off: a half-received write holds store memory that the DRAM ring cannot reuse
/// until it is published or abandoned.
struct FrameReader<'a> {
    connection: Box<dyn Connection>,
    shutdown: &'a AtomicBool,
    grace: Duration,
    stall_max: Duration,
    frame_started: bool,
    last_byte_at: Instant,
    stopping_since: Option<Instant>,
    /// What the peer failed to send in time, for the stall message.
    stalled_on: &'static str,
    /// Until the handshake is done: when it must be done by.
    handshake_deadline: Option<Instant>,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    activity: Arc<Activity>,
    /// While a write's payload arrives: when the current measuring window began and the bytes
    /// received in it.
    rate: Option<(Instant, u64)>,
    rate_min: u64,
    rate_window: Duration,
}

impl FrameReader<'_> {
    /// A new frame begins; `started`: some of its bytes were already received.
    fn begin_frame(&mut self, started: bool) {
        self.frame_started = started;
        self.last_byte_at = Instant::now();
        self.stalled_on = "in the middle of a frame";
    }

    /// The next frame is owed now (a credential after the handshake): waiting for its first
    /// byte is bounded by `stall_max` like a stall inside a frame.
    fn expect_frame(&mut self, stalled_on: &'static str) {
        self.begin_frame(true);
        self.stalled_on = stalled_on;
    }

    /// A write's payload starts arriving: its pace is measured from now.
    fn begin_payload(&mut self) {
        self.rate = Some((Instant::now(), 0));
    }

    fn end_payload(&mut self) {
        self.rate = None;
    }

    /// The handshake deadline, the payload's minimum pace and the idle timeout.
    fn check_pace(&mut self) -> io::Result<()> {
        let now = Instant::now();
        if self.handshake_deadline.is_some_and(|deadline| now > deadline) {
            return Err(timed_out(format!(
                "handshake not completed within {} ms (server.handshake_timeout_ms)",
                self.handshake_timeout.as_millis()
            )));
        }
        if let Some((since, bytes)) = &mut self.rate {
            let elapsed = now.duration_since(*since);
            if elapsed >= self.rate_window {
                let per_second = (*bytes as f64 / elapsed.as_secs_f64()) as u64;
                if per_second < self.rate_min {
                    return Err(timed_out(format!(
                        "write payload arriving at {per_second} bytes/s over {} ms, below {} bytes/s (server.frame_bytes_per_second_min)",
                        elapsed.as_millis(),
                        self.rate_min
                    )));
                }
                *since = now;
                *bytes = 0;
            }
        }
        if !self.frame_started
            && self.handshake_deadline.is_none()
            && self.activity.idle_for(self.last_byte_at) > self.idle_timeout
        {
            return Err(timed_out(format!(
                "idle for {} ms with no request in flight (server.idle_timeout_ms)",
                self.idle_timeout.as_millis()
            )));
        }
        Ok(())
    }
}

impl Read for FrameReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.connection.read(buf) {
                Ok(n) => {
                    if n > 0 {
                        self.frame_started = true;
                        self.last_byte_at = Instant::now();
                        if let Some((_, bytes)) = &mut self.rate {
                            *bytes += n as u64;
                        }
                        self.check_pace()?;
                    }
                    return Ok(n);
                }
                Err(e)
                    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) =>
                {
                    if self.shutdown.load(Ordering::SeqCst) {
                        if !self.frame_started {
                            return Ok(0);
                        }
                        let since = *self.stopping_since.get_or_insert_with(Instant::now);
                        if since.elapsed() > self.grace {
                            return Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                "shutdown grace ran out mid-frame",
                            ));
                        }
                    }
                    if self.frame_started && self.last_byte_at.elapsed() > self.stall_max {
                        let message = format!(
                            "peer sent nothing for {} ms {} (server.frame_stall_ms_max)",
                            self.stall_max.as_millis(),
                            self.stalled_on
                        );
                        return Err(io::Error::new(io::ErrorKind::TimedOut, message));
                    }
                    self.check_pace()?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Buffer size of a connection's reader and reply writer: several small frames per syscall.
const STREAM_BUFFER_BYTES: usize = 64 * 1024;

fn send<W: Write + ?Sized>(
    writer: &mut W,
    request_id: u64,
    response: &Response,
    payload: &[u8],
) -> io::Result<()> {
    frame::write_frame(writer, response.kind(), request_id, &response.encode_body(), payload)
}

fn error_reply(code: ErrorCode, message: impl Into<String>) -> Response {
    Response::Error { code, message: message.into() }
}

/// Serves one connection to the end.
pub fn serve(shared: Arc<Shared>, mut connection: Box<dyn Connection>) {
    let peer = connection.peer();
    // On TCP a munge server takes the identity from the credential, not from the kernel.
    let munge = shared.munge.as_ref().filter(|_| connection.transport() == Transport::Tcp);
    let Some(Arrival { kernel_identity, mut admission, handshaking }) =
        arrive(&shared, &mut *connection, &peer, munge.is_some())
    else {
        return;
    };
    let Some((mut reader, mut writer)) = split_connection(&shared, connection, &peer) else {
        return;
    };
    let Some(offer) = handshake_offer(munge.is_some(), kernel_identity, &mut *writer, &peer) else {
        writer.shutdown();
        return;
    };
    let Some(client_name) = handshake(&shared, &mut reader, &mut *writer, &peer, &offer) else {
        writer.shutdown();
        return;
    };
    let identity = match munge {
        None => kernel_identity,
        Some(context) => {
            match authenticate(&shared, context, &mut reader, &mut *writer, &peer, &offer.challenge)
            {
                Some((identity, admitted)) => {
                    admission = Some(admitted);
                    identity
                }
                None => {
                    writer.shutdown();
                    return;
                }
            }
        }
    };
    reader.handshake_deadline = None;
    drop(handshaking);
    let Some(admission) = admission else { return };
    tracing::info!(%peer, uid = identity.uid, gid = identity.gid, auth = %offer.auth, "client connected");

    let activity = reader.activity.clone();
    let (sender, receiver) = sync_channel::<Job>(shared.options.in_flight_requests_max as usize);
    let mut requester = Requester::new(identity, spillway_sys::user::euid());
    requester.namespace_session = spillway_proto::session_of_client_name(&client_name);
    let Some(executor) = start_executor(&shared, receiver, writer, &peer, requester, activity)
    else {
        return;
    };
    // Buffered only after the handshake: the handshake reads exactly the Hello frame's bytes,
    // so whatever a client pipelined behind it is still in the socket for this buffer.
    let mut reader = BufReader::with_capacity(STREAM_BUFFER_BYTES, reader);
    let user_budget = admission.user_budget.clone();
    let connection = Peer { name: &peer, identity, user_budget: user_budget.as_ref() };
    let reason = read_loop(&shared, &mut reader, &sender, &connection);
    drop(sender);
    let _ = executor.join();
    reader.get_ref().connection.shutdown();
    tracing::info!(%peer, %reason, "client disconnected");
}

/// A connection just accepted: the kernel's identity and its admission, or (munge over TCP)
/// nobody yet and its place among the unauthenticated handshakes.
struct Arrival<'a> {
    kernel_identity: Identity,
    admission: Option<Admission<'a>>,
    handshaking: Option<Handshaking<'a>>,
}

/// Counts a new connection where it belongs; None: refused (answered, logged) or no identity.
fn arrive<'a>(
    shared: &'a Shared,
    connection: &mut dyn Connection,
    peer: &str,
    munge: bool,
) -> Option<Arrival<'a>> {
    if munge {
        // Nobody yet: counted apart, so unauthenticated connects cannot take the places of
        // identified clients.
        let handshaking = Handshaking(shared);
        let handshakes = shared.handshakes.fetch_add(1, Ordering::SeqCst) + 1;
        let handshakes_max = shared.options.fairness.handshakes_max;
        if handshakes > handshakes_max {
            let reason = format!(
                "server has {handshakes_max} unauthenticated connections in their handshake (server.handshakes_max); retry"
            );
            refuse_busy(connection, peer, 0, &reason);
            return None;
        }
        let kernel_identity = Identity::NOBODY;
        return Some(Arrival { kernel_identity, admission: None, handshaking: Some(handshaking) });
    }
    let kernel_identity = establish_identity(connection, peer)?;
    // Known from the kernel: admitted (or refused) before the handshake.
    match admit(shared, kernel_identity.uid) {
        Ok(admission) => {
            Some(Arrival { kernel_identity, admission: Some(admission), handshaking: None })
        }
        Err(reason) => {
            refuse_busy(connection, peer, 0, &reason);
            None
        }
    }
}

/// Refuses a connection over a limit: answers `Busy` naming it, logs it, closes.
fn refuse_busy(connection: &mut dyn Connection, peer: &str, request_id: u64, reason: &str) {
    tracing::warn!(%peer, %reason, "refusing connection: over a limit");
    let _ = send(&mut *connection, request_id, &error_reply(ErrorCode::Busy, reason), &[]);
    connection.shutdown();
}

/// Who is on the other end of a connection, for the reader.
struct Peer<'a> {
    name: &'a str,
    identity: Identity,
    /// The uid's in-flight write budget (`None`: root).
    user_budget: Option<&'a Arc<ByteBudget>>,
}

/// The peer's identity; if it cannot be established, answers `PermissionDenied` and closes.
fn establish_identity(connection: &mut dyn Connection, peer: &str) -> Option<Identity> {
    match connection.identity() {
        Ok(identity) => Some(identity),
        Err(error) => {
            tracing::warn!(%peer, %error, "refusing connection: cannot establish the peer's identity");
            let _ = send(
                &mut *connection,
                0,
                &error_reply(
                    ErrorCode::PermissionDenied,
                    format!("cannot establish your identity: {error}"),
                ),
                &[],
            );
            connection.shutdown();
            None
        }
    }
}

/// The frame reader (polling every `READ_POLL`) and a clone of the connection for replies.
fn split_connection<'a>(
    shared: &'a Shared,
    connection: Box<dyn Connection>,
    peer: &str,
) -> Option<(FrameReader<'a>, Box<dyn Connection>)> {
    if let Err(error) = connection.set_read_timeout(Some(READ_POLL)) {
        tracing::warn!(%peer, %error, "cannot set a read timeout; closing");
        return None;
    }
    let writer = match connection.try_clone_connection() {
        Ok(writer) => writer,
        Err(error) => {
            tracing::warn!(%peer, %error, "cannot clone the connection; closing");
            return None;
        }
    };
    let reader = FrameReader {
        connection,
        shutdown: &shared.shutdown,
        grace: shared.options.shutdown_grace,
        stall_max: shared.options.frame_stall,
        frame_started: false,
        last_byte_at: Instant::now(),
        stopping_since: None,
        stalled_on: "in the middle of a frame",
        handshake_deadline: Some(Instant::now() + shared.options.fairness.handshake_timeout),
        handshake_timeout: shared.options.fairness.handshake_timeout,
        idle_timeout: shared.options.fairness.idle_timeout,
        activity: Arc::new(Activity::new()),
        rate: None,
        rate_min: shared.options.fairness.frame_bytes_per_second_min,
        rate_window: shared.options.fairness.frame_rate_window,
    };
    Some((reader, writer))
}

/// Starts the executor thread: it runs the requests in order and is the only reply writer.
fn start_executor(
    shared: &Arc<Shared>,
    receiver: Receiver<Job>,
    writer: Box<dyn Connection>,
    peer: &str,
    identity: Requester,
    activity: Arc<Activity>,
) -> Option<std::thread::JoinHandle<()>> {
    let executor = {
        let shared = shared.clone();
        let peer = peer.to_string();
        std::thread::Builder::new()
            .name("executor".into())
            .spawn(move || execute(shared, receiver, writer, peer, identity, activity))
    };
    match executor {
        Ok(executor) => Some(executor),
        Err(error) => {
            tracing::error!(%peer, %error, "cannot start an executor thread; closing");
            None
        }
    }
}

/// What the `HelloReply` of a connection says about identity.
struct HandshakeOffer {
    /// The kernel's identity (`auth` None), or `nobody` until the credential arrives (Munge).
    identity: Identity,
    auth: AuthMethod,
    /// Random for a munge connection (the credential must carry it), zeros otherwise.
    challenge: [u8; CHALLENGE_BYTES],
}

/// The offer of a connection; with munge, a fresh random challenge. None: no randomness could
/// be had (answered `Internal`, logged); the connection must close.
fn handshake_offer(
    munge: bool,
    identity: Identity,
    writer: &mut dyn Connection,
    peer: &str,
) -> Option<HandshakeOffer> {
    let mut challenge = [0u8; CHALLENGE_BYTES];
    if !munge {
        return Some(HandshakeOffer { identity, auth: AuthMethod::None, challenge });
    }
    if let Err(error) = getrandom::getrandom(&mut challenge) {
        tracing::error!(%peer, %error, "cannot draw a challenge from getrandom; closing");
        let reply = error_reply(ErrorCode::Internal, format!("server has no randomness: {error}"));
        let _ = send(writer, 0, &reply, &[]);
        return None;
    }
    Some(HandshakeOffer { identity, auth: AuthMethod::Munge, challenge })
}

/// Reads the client's `Hello` and answers it; returns the client's name. None: the connection
/// must close.
fn handshake(
    shared: &Shared,
    reader: &mut FrameReader<'_>,
    writer: &mut dyn Connection,
    peer: &str,
    offer: &HandshakeOffer,
) -> Option<String> {
    let mut body = Vec::new();
    reader.begin_frame(false);
    let header = match frame::read_header_and_body(reader, &mut body, 0) {
        Ok(header) => header,
        Err(ReceiveError::Closed) => return None,
        Err(error) => {
            no_hello(writer, peer, &error);
            return None;
        }
    };
    let request = match Request::decode(header.kind, &body) {
        Ok(request) => request,
        Err(error) => {
            tracing::warn!(%peer, problem = %error, "malformed handshake; closing");
            let _ = send(
                writer,
                header.request_id,
                &error_reply(ErrorCode::BadFrame, format!("malformed handshake: {error}")),
                &[],
            );
            return None;
        }
    };
    let Request::Hello { version_min, version_max, client_name } = request else {
        tracing::warn!(%peer, problem = ?header.kind, "first frame is not Hello; closing");
        let _ = send(
            writer,
            header.request_id,
            &error_reply(
                ErrorCode::OutOfOrder,
                format!("expected Hello first, got {:?}", header.kind),
            ),
            &[],
        );
        return None;
    };
    let version = version_max.min(PROTOCOL_VERSION);
    if version < version_min.max(PROTOCOL_VERSION_MIN) {
        tracing::warn!(%peer, version_min, version_max, "no common protocol version; closing");
        let message = format!(
            "client speaks versions {version_min}..={version_max}, server {PROTOCOL_VERSION_MIN}..={PROTOCOL_VERSION}"
        );
        let _ = send(
            writer,
            header.request_id,
            &error_reply(ErrorCode::UnsupportedVersion, message),
            &[],
        );
        return None;
    }
    tracing::debug!(%peer, %client_name, version, "handshake");
    let reply = Response::Hello {
        version,
        payload_bytes_max: shared.options.payload_bytes_max,
        in_flight_requests_max: shared.options.in_flight_requests_max,
        uid: offer.identity.uid,
        gid: offer.identity.gid,
        server_name: shared.options.server_name.clone(),
        auth: offer.auth,
        challenge: offer.challenge,
        server_id: shared.identity.id,
        incarnation: shared.identity.incarnation,
        failure_domain: shared.options.failure_domain.clone(),
    };
    send(writer, header.request_id, &reply, &[]).ok().map(|()| client_name)
}

/// Logs why no Hello arrived: too late (closed silently) or malformed (answered).
fn no_hello(writer: &mut dyn Connection, peer: &str, error: &ReceiveError) {
    if let ReceiveError::Io(error) = error {
        if error.kind() == io::ErrorKind::TimedOut {
            tracing::warn!(%peer, reason = %error, "closing connection: no Hello in time");
            return;
        }
    }
    tracing::warn!(%peer, problem = %error, "malformed handshake; closing");
    let reply = error_reply(code_of(error), format!("malformed handshake: {error}"));
    let _ = send(writer, 0, &reply, &[]);
}

/// Reads the `Authenticate` that must follow the handshake of a munge connection, checks its
/// credential and admits the uid (`connections_max`, `connections_per_user_max`). The wait is
/// bounded by `frame_stall_ms_max` and the handshake timeout. None: refused (answered
/// `PermissionDenied` naming the reason, or `Busy` over a limit, logged with the peer); the
/// connection must close.
fn authenticate<'s>(
    shared: &'s Shared,
    context: &MungeContext,
    reader: &mut FrameReader<'_>,
    writer: &mut dyn Connection,
    peer: &str,
    challenge: &[u8; CHALLENGE_BYTES],
) -> Option<(Identity, Admission<'s>)> {
    let mut body = Vec::new();
    reader.expect_frame("after Hello instead of Authenticate");
    let (request_id, refusal) = match frame::read_header_and_body(reader, &mut body, 0) {
        Err(ReceiveError::Closed) => return None,
        Err(error) => (0, format!("no Authenticate frame: {error}")),
        Ok(header) => match Request::decode(header.kind, &body) {
            Ok(Request::Authenticate { credential }) => {
                match check_credential(context, &credential, challenge) {
                    Ok(identity) => {
                        let admission = match admit(shared, identity.uid) {
                            Ok(admission) => admission,
                            Err(reason) => {
                                refuse_busy(writer, peer, header.request_id, &reason);
                                return None;
                            }
                        };
                        let reply = Response::Authenticated { uid: identity.uid, gid: identity.gid };
                        return send(writer, header.request_id, &reply, &[])
                            .is_ok()
                            .then_some((identity, admission));
                    }
                    Err(reason) => (header.request_id, reason),
                }
            }
            Ok(other) => (
                header.request_id,
                format!(
                    "this server requires munge authentication (server.auth = munge): expected Authenticate after Hello, got {:?}",
                    other.kind()
                ),
            ),
            Err(error) => (header.request_id, format!("malformed Authenticate: {error}")),
        },
    };
    tracing::warn!(%peer, reason = %refusal, "refusing connection: munge authentication failed");
    let _ = send(writer, request_id, &error_reply(ErrorCode::PermissionDenied, refusal), &[]);
    None
}

/// The identity a credential vouches for, if `munged` accepts it and it was made for this
/// connection's challenge; else why not.
fn check_credential(
    context: &MungeContext,
    credential: &str,
    challenge: &[u8; CHALLENGE_BYTES],
) -> Result<Identity, String> {
    let decoded = context.decode(credential).map_err(|error| match error {
        MungeError::Library { .. } | MungeError::SocketError { .. } | MungeError::Other { .. } => {
            format!("the server cannot check munge credentials: {error}")
        }
        refused => format!("munge credential refused: {refused}"),
    })?;
    if decoded.payload != credential_payload(challenge) {
        return Err(format!(
            "munge credential of uid {} refused: it was not made for this connection (its payload does not carry this connection's challenge)",
            decoded.uid
        ));
    }
    Ok(Identity { uid: decoded.uid, gid: decoded.gid })
}

fn code_of(error: &ReceiveError) -> ErrorCode {
    match error {
        ReceiveError::Frame(
            FrameError::BodyTooLarge { .. } | FrameError::PayloadTooLarge { .. },
        ) => ErrorCode::TooLarge,
        _ => ErrorCode::BadFrame,
    }
}

/// Reads frames until the peer leaves, the stream breaks or the server stops. Returns why.
fn read_loop(
    shared: &Arc<Shared>,
    reader: &mut BufReader<FrameReader<'_>>,
    sender: &std::sync::mpsc::SyncSender<Job>,
    connection: &Peer<'_>,
) -> String {
    let peer = connection.name;
    let mut body = Vec::with_capacity(256);
    loop {
        let header = match read_frame(shared, reader, &mut body, sender, peer) {
            Ok(header) => header,
            Err(reason) => return reason,
        };
        let request = match decode_request(reader, &header, &body, sender, peer) {
            Ok(Some(request)) => request,
            Ok(None) => continue,
            Err(reason) => return reason,
        };
        let payload = match receive_payload(shared, reader, &header, &request, connection, sender) {
            Ok(Received::Nothing) => None,
            Ok(Received::Payload(payload)) => Some(payload),
            Ok(Received::Answered) => continue,
            Err(reason) => return reason,
        };
        let received = Instant::now();
        reader.get_ref().activity.started();
        if sender
            .send(Job::Request { request_id: header.request_id, request, payload, received })
            .is_err()
        {
            return "executor stopped (reply could not be sent)".into();
        }
    }
}

/// Reads the next frame's header and body. Err: why the connection ends.
fn read_frame(
    shared: &Shared,
    reader: &mut BufReader<FrameReader<'_>>,
    body: &mut Vec<u8>,
    sender: &std::sync::mpsc::SyncSender<Job>,
    peer: &str,
) -> Result<Header, String> {
    // Bytes of the next frame may already sit in the buffer: then it has started.
    let started = !reader.buffer().is_empty();
    reader.get_mut().begin_frame(started);
    match frame::read_header_and_body(reader, body, shared.options.payload_bytes_max) {
        Ok(header) => Ok(header),
        Err(ReceiveError::Closed) => Err(if shared.shutdown.load(Ordering::SeqCst) {
            "server shutting down".into()
        } else {
            "closed by peer".into()
        }),
        Err(error @ ReceiveError::Frame(_)) => {
            // The header is bad: lengths cannot be trusted, the stream is out of sync.
            tracing::warn!(%peer, problem = %error, "malformed frame; closing the connection");
            let _ = sender.send(Job::Reply {
                request_id: 0,
                response: error_reply(
                    code_of(&error),
                    format!("malformed frame: {error}; closing"),
                ),
            });
            Err(format!("malformed frame: {error}"))
        }
        Err(error) => {
            tracing::warn!(%peer, problem = %error, "connection broken");
            Err(error.to_string())
        }
    }
}

/// Decodes the request; a bad body or a second Hello is answered here (None). Err: why it ends.
fn decode_request(
    reader: &mut BufReader<FrameReader<'_>>,
    header: &Header,
    body: &[u8],
    sender: &std::sync::mpsc::SyncSender<Job>,
    peer: &str,
) -> Result<Option<Request>, String> {
    let request = match Request::decode(header.kind, body) {
        Ok(request) => request,
        Err(error) => {
            // The header was sound: skip the payload and keep the connection.
            tracing::warn!(%peer, request_id = header.request_id, problem = %error, "malformed request body; answering with an error");
            if header.payload_bytes > 0 && discard(reader, header.payload_bytes as u64).is_err() {
                return Err("connection broken while skipping a bad frame's payload".into());
            }
            let reply = Job::Reply {
                request_id: header.request_id,
                response: error_reply(
                    ErrorCode::BadFrame,
                    format!("malformed {:?} body: {error}", header.kind),
                ),
            };
            if sender.send(reply).is_err() {
                return Err("executor stopped".into());
            }
            return Ok(None);
        }
    };
    if let Request::Hello { .. } | Request::Authenticate { .. } = request {
        let problem = format!("{:?} after the handshake", header.kind);
        tracing::warn!(%peer, request_id = header.request_id, %problem, "out-of-order frame; answering with an error");
        let reply = Job::Reply {
            request_id: header.request_id,
            response: error_reply(ErrorCode::OutOfOrder, problem),
        };
        if sender.send(reply).is_err() {
            return Err("executor stopped".into());
        }
        return Ok(None);
    }
    Ok(Some(request))
}

/// Receives a write's payload into store memory or a pooled buffer and checks each extent
/// against the client's checksum; a mismatch is answered here and nothing of the write is kept.
fn receive_payload(
    shared: &Shared,
    reader: &mut BufReader<FrameReader<'_>>,
    header: &Header,
    request: &Request,
    connection: &Peer<'_>,
    sender: &std::sync::mpsc::SyncSender<Job>,
) -> Result<Received, String> {
    let single;
    let (epoch, file, extents): (EpochId, FileId, &[WriteExtent]) = match request {
        Request::Write { epoch, file, offset, payload_crc32c } => {
            single = [WriteExtent {
                offset: *offset,
                length: header.payload_bytes,
                crc32c: *payload_crc32c,
            }];
            (*epoch, *file, &single)
        }
        Request::WriteExtents { epoch, file, extents } => (*epoch, *file, extents),
        _ => return Ok(Received::Nothing),
    };
    let peer = connection.name;
    let length = header.payload_bytes as usize;
    let extents_bytes: u64 = extents.iter().map(|e| e.length as u64).sum();
    if extents_bytes != length as u64 {
        let problem = format!(
            "WriteExtents to epoch {epoch} file {file}: its {} extents add up to {extents_bytes} \
             bytes but the payload has {length}; nothing was written",
            extents.len()
        );
        return answer_refused(reader, header, sender, peer, ErrorCode::BadFrame, problem);
    }
    let (payload, pieces, received) =
        read_write_payload(shared, reader, connection, epoch, file, extents, length);
    if let Err(error) = received {
        // Dropping the payload abandons a placed write: nothing of it is stored.
        tracing::warn!(%peer, request_id = header.request_id, problem = %error, "write payload cut short");
        return Err(format!("write payload cut short: {error}"));
    }
    if let Some((extent, arrived_crc)) = first_corrupt_extent(extents, &pieces) {
        // Dropping the payload abandons a placed write (its slot was never published) and
        // returns a buffered one's budget: nothing of the write is admitted.
        drop(payload);
        let problem = format!(
            "write to epoch {epoch} file {file} at offset {} ({} bytes): payload CRC32C \
             {arrived_crc:#010x} differs from the client's {:#010x}; nothing was written",
            extent.offset, extent.length, extent.crc32c
        );
        tracing::warn!(%peer, request_id = header.request_id, %problem, "write payload corrupt in flight");
        return queue_error(sender, header, ErrorCode::ChecksumMismatch, problem);
    }
    Ok(Received::Payload(payload))
}

/// Reads a write's `length`-byte payload into store memory (one reservation for all its
/// extents) or, without room there, a pooled buffer; with the CRC32C and length of each
/// record-sized piece (none spanning two extents), and whether the payload arrived whole.
fn read_write_payload(
    shared: &Shared,
    reader: &mut BufReader<FrameReader<'_>>,
    connection: &Peer<'_>,
    epoch: EpochId,
    file: FileId,
    extents: &[WriteExtent],
    length: usize,
) -> (Payload, Vec<(u32, usize)>, Result<(), ReceiveError>) {
    let stream = stream_of(shared, connection.identity, epoch);
    // The uid's share first (it may wait for the uid's earlier writes), then store or budget.
    let user_reservation = connection.user_budget.map(|budget| budget.reserve(length as u64));
    let placed = if length > 0 {
        let targets: Vec<(u64, usize)> =
            extents.iter().map(|e| (e.offset, e.length as usize)).collect();
        shared.backend.reserve_write(stream, epoch, file, &targets)
    } else {
        None
    };
    // Each piece's CRC is taken right after the piece arrives, while it is still in cache: the
    // one pass over the payload that checks the client's checksums and gives the store its
    // record checksums.
    let mut pieces: Vec<(u32, usize)> = Vec::new();
    let (payload, received) = match placed {
        Some(mut pending) => {
            reader.get_mut().begin_payload();
            let received = pending.buffers().into_iter().try_for_each(|buffer| {
                frame::read_payload(reader, buffer)?;
                pieces.push((crc32c::crc32c(buffer), buffer.len()));
                Ok(())
            });
            let crcs = pieces.iter().map(|&(crc, _)| crc).collect();
            (Payload::Placed(pending, user_reservation, crcs), received)
        }
        None => {
            let reservation = shared.budget.reserve(length as u64);
            let mut buffer = shared.pool.take(length);
            reader.get_mut().begin_payload();
            let received = frame::read_payload(reader, &mut buffer);
            if received.is_ok() {
                let piece_bytes = shared.backend.record_payload_bytes().max(1);
                let mut at = 0;
                for extent in extents {
                    let bytes = &buffer[at..at + extent.length as usize];
                    pieces.extend(bytes.chunks(piece_bytes).map(|p| (crc32c::crc32c(p), p.len())));
                    at += bytes.len();
                }
            }
            let crcs = pieces.iter().map(|&(crc, _)| crc).collect();
            (Payload::Buffered(buffer, reservation, user_reservation, crcs), received)
        }
    };
    reader.get_mut().end_payload();
    (payload, pieces, received)
}

/// The first extent whose pieces (consecutive, none spanning two extents) do not add up to the
/// client's CRC32C, with the CRC that arrived.
fn first_corrupt_extent<'e>(
    extents: &'e [WriteExtent],
    pieces: &[(u32, usize)],
) -> Option<(&'e WriteExtent, u32)> {
    let mut rest = pieces;
    for extent in extents {
        let mut covered = 0;
        let count = rest
            .iter()
            .take_while(|&&(_, bytes)| {
                let take = covered < extent.length as usize;
                covered += bytes;
                take
            })
            .count();
        let (own, after) = rest.split_at(count);
        debug_assert_eq!(own.iter().map(|&(_, b)| b).sum::<usize>(), extent.length as usize);
        let arrived = combined_crc(own);
        if arrived != extent.crc32c {
            return Some((extent, arrived));
        }
        rest = after;
    }
    None
}

/// Skips a refused write's payload and queues the error reply (the connection stays).
fn answer_refused(
    reader: &mut BufReader<FrameReader<'_>>,
    header: &Header,
    sender: &std::sync::mpsc::SyncSender<Job>,
    peer: &str,
    code: ErrorCode,
    problem: String,
) -> Result<Received, String> {
    tracing::warn!(%peer, request_id = header.request_id, %problem, "write refused on receipt");
    if discard(reader, header.payload_bytes as u64).is_err() {
        return Err("connection broken while skipping a refused write's payload".into());
    }
    queue_error(sender, header, code, problem)
}

/// Queues the error reply of a write refused on receipt.
fn queue_error(
    sender: &std::sync::mpsc::SyncSender<Job>,
    header: &Header,
    code: ErrorCode,
    problem: String,
) -> Result<Received, String> {
    let reply = Job::Reply { request_id: header.request_id, response: error_reply(code, problem) };
    if sender.send(reply).is_err() {
        return Err("executor stopped".into());
    }
    Ok(Received::Answered)
}

fn discard(reader: &mut impl Read, mut bytes: u64) -> io::Result<()> {
    let mut sink = [0u8; 64 * 1024];
    while bytes > 0 {
        let n = (bytes as usize).min(sink.len());
        reader.read_exact(&mut sink[..n])?;
        bytes -= n as u64;
    }
    Ok(())
}

/// Runs requests in order and writes the replies.
fn execute(
    shared: Arc<Shared>,
    receiver: Receiver<Job>,
    writer: Box<dyn Connection>,
    peer: String,
    identity: Requester,
    activity: Arc<Activity>,
) {
    let mut broken = false;
    let mut last_no_space: Option<Instant> = None;
    // Replies are buffered and flushed whenever the queue runs dry, so a burst of small
    // requests costs one send syscall, not one each.
    let mut writer = BufWriter::with_capacity(STREAM_BUFFER_BYTES, writer);
    loop {
        let job = match receiver.try_recv() {
            Ok(job) => job,
            Err(std::sync::mpsc::TryRecvError::Empty) => {
                if !broken {
                    if let Err(error) = writer.flush() {
                        tracing::warn!(%peer, %error, "cannot send replies; closing");
                        writer.get_ref().shutdown();
                        broken = true;
                    }
                }
                match receiver.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            }
            Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
        };
        let is_request = matches!(job, Job::Request { .. });
        if broken {
            // Drain the queue so the reader's budget reservations are released.
            drop(job);
            if is_request {
                activity.done();
            }
            continue;
        }
        let result = match job {
            Job::Reply { request_id, response } => send(&mut writer, request_id, &response, &[]),
            Job::Request { request_id, request, payload, received } => {
                // The backpressure bound is per batch, not per write: writes that were already
                // queued when an earlier one ran out of space get no wait of their own
                // (otherwise N pipelined writes would wait N times the bound); a write sent
                // after that failure (a retry) waits again.
                let fail_fast = last_no_space.is_some_and(|at| received <= at);
                let wait =
                    if fail_fast { Duration::ZERO } else { shared.options.backpressure_wait };
                let kind = crate::metrics::request_kind(&request);
                let (response, read_data) =
                    run_with_payload(&shared, &identity, request, payload, wait);
                shared.latency.observe(kind, received.elapsed());
                if matches!(response, Response::Error { code: ErrorCode::NoSpace, .. }) {
                    last_no_space = Some(Instant::now());
                }
                if let Response::Error { code, message } = &response {
                    tracing::debug!(%peer, request_id, %code, %message, "request failed");
                }
                shared.counters.requests_served.fetch_add(1, Ordering::Relaxed);
                let payload = read_data.as_deref().unwrap_or(&[]);
                send(&mut writer, request_id, &response, payload)
            }
        };
        if is_request {
            activity.done();
        }
        if let Err(error) = result {
            tracing::warn!(%peer, %error, "cannot send a reply; closing");
            writer.get_ref().shutdown();
            broken = true;
        }
    }
    if !broken {
        let _ = writer.flush();
    }
}

/// Runs one request with its payload; the payload's budget is released once the store has it.
fn run_with_payload(
    shared: &Shared,
    identity: &Requester,
    request: Request,
    payload: Option<Payload>,
    wait: Duration,
) -> (Response, Option<Vec<u8>>) {
    match payload {
        Some(Payload::Placed(pending, user_reservation, crcs)) => {
            let reply = handle(shared, identity, request, WriteData::Placed(pending, &crcs), wait);
            drop(user_reservation);
            reply
        }
        Some(Payload::Buffered(buffer, reservation, user_reservation, crcs)) => {
            let reply = handle(shared, identity, request, WriteData::Bytes(&buffer, &crcs), wait);
            drop(reservation);
            drop(user_reservation);
            shared.pool.give(buffer);
            reply
        }
        None => handle(shared, identity, request, WriteData::Bytes(&[], &[]), wait),
    }
}

/// Runs one request. Returns the reply and, for reads, the payload to send with it.
/// A write request's payload, as the executor hands it to [`run`].
/// Each comes with the checked CRC32C of its buffers or record-sized pieces.
enum WriteData<'a> {
    Placed(Box<dyn PendingWrite>, &'a [u32]),
    Bytes(&'a [u8], &'a [u32]),
}

impl WriteData<'_> {
    fn len(&self) -> usize {
        match self {
            WriteData::Placed(pending, _) => pending.payload_bytes(),
            WriteData::Bytes(bytes, _) => bytes.len(),
        }
    }
}

fn handle(
    shared: &Shared,
    identity: &Requester,
    request: Request,
    data: WriteData<'_>,
    wait: Duration,
) -> Reply {
    let write_bytes = data.len() as u64;
    let counted = crate::activity::Counted::of(&request, write_bytes);
    match run(shared, identity, request, data, wait) {
        Ok(reply) => {
            shared.activity.record(counted);
            reply
        }
        Err(error) => (error_reply(error.code, error.message), None),
    }
}

type Reply = (Response, Option<Vec<u8>>);

fn run(
    shared: &Shared,
    peer: &Requester,
    request: Request,
    data: WriteData<'_>,
    wait: Duration,
) -> Result<Reply, BackendError> {
    let backend = &*shared.backend;
    let plain = |response| Ok((response, None));
    match request {
        Request::Hello { .. } | Request::Authenticate { .. } => {
            unreachable!("the reader answers handshake frames after the handshake itself")
        }
        Request::OpenFile { epoch, name, create } => open_file(shared, peer, epoch, &name, create),
        Request::Write { epoch, file, offset, payload_crc32c } => {
            let extent = WriteExtent { offset, length: data.len() as u32, crc32c: payload_crc32c };
            write(shared, peer, epoch, file, &[extent], data, wait)
        }
        Request::WriteExtents { epoch, file, extents } => {
            write(shared, peer, epoch, file, &extents, data, wait)
        }
        Request::WriteZeros { epoch, file, offset, length } => {
            write_zeros(shared, peer, WriteTarget { epoch, file, offset }, length, wait)
        }
        Request::Read { epoch, file, offset, length } => {
            read(shared, peer, epoch, file, offset, length)
        }
        Request::Commit { epoch, durability, participants } => {
            commit(shared, peer, epoch, durability, &participants)
        }
        Request::ListEpochs { from_epoch } => {
            plain(Response::Epochs(list_epochs(shared, peer, from_epoch)?))
        }
        Request::ListFiles { epoch, from_file } => {
            authorize(shared, peer, epoch, Intent::Use)?;
            let mut files = backend.files(epoch)?;
            files.retain(|f| f.file >= from_file);
            files.sort_by_key(|f| f.file);
            plain(Response::Files(fit_files(files)))
        }
        Request::Stat { epoch, file } => {
            authorize(shared, peer, epoch, Intent::Use)?;
            plain(Response::FileStat(backend.stat(epoch, file)?))
        }
        Request::Extents { epoch, file, from_offset } => {
            authorize(shared, peer, epoch, Intent::Use)?;
            let extents: Vec<Extent> = backend
                .extents(epoch, file)?
                .into_iter()
                .filter(|e| e.offset + e.length > from_offset)
                .take((BODY_BYTES_MAX as usize - 4) / 16)
                .collect();
            plain(Response::Extents(extents))
        }
        Request::DeleteEpoch { epoch } => plain(delete_epoch(shared, peer, epoch)?),
        Request::AssignStream { epoch, stream } => {
            plain(access::assign_stream(shared, peer, epoch, stream)?)
        }
        Request::GrantEpoch { epoch, grant } => {
            plain(access::grant_epoch(shared, peer, epoch, grant)?)
        }
        Request::RevokeEpoch { epoch } => plain(access::revoke_epoch(shared, peer, epoch)?),
        Request::JoinCluster { cluster_id } => {
            plain(access::join_cluster(shared, peer, cluster_id)?)
        }
        Request::Sync { epoch, participants } => {
            // Only the epoch's records are spilled; the fsync round is shared with concurrent
            // syncs and commits of any connection.
            authorize(shared, peer, epoch, Intent::Use)?;
            backend.record_participants(epoch, &participants)?;
            backend.sync_epoch(epoch)?;
            plain(Response::Synced { epoch })
        }
        Request::Drain { epoch, mode } => drain(shared, peer, epoch, mode),
        Request::DrainStatus => plain(Response::DrainStatus(drain_status(shared, peer))),
        Request::Namespace(request) => namespace(shared, peer, request),
        Request::Status => plain(Response::Status(server_status(shared))),
    }
}

/// `DeleteEpoch`: the epoch, and its namespaces, which name files of the epoch only.
fn delete_epoch(
    shared: &Shared,
    peer: &Requester,
    epoch: EpochId,
) -> Result<Response, BackendError> {
    authorize(shared, peer, epoch, Intent::Use)?;
    shared.backend.delete_epoch(epoch)?;
    if let Some(namespaces) = shared.namespaces.get() {
        let removed = namespaces.remove_for_epoch(epoch);
        if !removed.is_empty() {
            tracing::info!(%epoch, namespaces = ?removed, "namespaces removed with their data epoch");
        }
    }
    Ok(Response::Deleted { epoch })
}

/// `ListEpochs`: the epochs from `from_epoch` this peer may see, as many as fit in one body.
fn list_epochs(
    shared: &Shared,
    peer: &Requester,
    from_epoch: EpochId,
) -> Result<Vec<spillway_proto::EpochInfo>, BackendError> {
    let epochs = shared.backend.epochs()?;
    Ok(epochs
        .into_iter()
        .filter(|e| e.epoch >= from_epoch && access::may_see(shared, peer, e.epoch))
        // 25 bytes per entry after a 4-byte count; the client pages for the rest.
        .take((BODY_BYTES_MAX as usize - 4) / 25)
        .collect())
}

/// A namespace (metadata service) request, answered by this server's namespace service.
fn namespace(
    shared: &Shared,
    peer: &Requester,
    request: spillway_proto::NamespaceRequest,
) -> Result<Reply, BackendError> {
    let service = shared.namespaces.get().ok_or_else(|| {
        BackendError::new(
            ErrorCode::InvalidArgument,
            "this server has no namespace service (started without a store directory)",
        )
    })?;
    // A namespace is as private as its data epoch: only those who may use the epoch (and root)
    // see its tree or change it. A namespace that does not exist yet is the service's to answer.
    if !peer.is_root() {
        if let Ok(existing) = service.get(request.namespace()) {
            let data_epoch = spillway_namespace::Namespace::data_epoch(&*existing);
            if let Err(refused) = authorize(shared, peer, data_epoch, Intent::Use) {
                let response = spillway_proto::NamespaceResponse::Error {
                    errno: refused.code.errno(),
                    message: format!("namespace {}: {}", request.namespace(), refused.message),
                };
                return Ok((Response::Namespace(response), None));
            }
        }
    }
    let namespace = request.namespace();
    let connection = crate::namespace_service::NamespacePeer {
        identity: peer.identity,
        session: peer.namespace_session,
    };
    let response = service.handle(&connection, request);
    // Metadata work on the reservation's behalf: counted on its data epoch.
    if let Ok(existing) = service.get(namespace) {
        let epoch = spillway_namespace::Namespace::data_epoch(&*existing);
        shared.activity.record(crate::activity::Counted::Metadata { epoch });
    }
    Ok((Response::Namespace(response), None))
}

/// `OpenFile`: checks the name, authorizes (claiming the epoch if it creates) and opens.
fn open_file(
    shared: &Shared,
    peer: &Requester,
    epoch: EpochId,
    name: &str,
    create: bool,
) -> Result<Reply, BackendError> {
    if name.is_empty() || name.len() > spillway_proto::NAME_BYTES_MAX || name.contains('\0') {
        return Err(BackendError::new(
            ErrorCode::InvalidArgument,
            format!("bad file name {name:?}"),
        ));
    }
    authorize(shared, peer, epoch, if create { Intent::Create } else { Intent::Use })?;
    let stream = stream_of(shared, peer.identity, epoch);
    let (file, created) = shared.backend.open_file(stream, epoch, name, create)?;
    Ok((Response::FileOpened { file, created }, None))
}

/// `Write`: publishes a placed payload, or writes a buffered one waiting up to `wait` for space.
fn write(
    shared: &Shared,
    peer: &Requester,
    epoch: EpochId,
    file: FileId,
    extents: &[WriteExtent],
    data: WriteData<'_>,
    wait: Duration,
) -> Result<Reply, BackendError> {
    // A refused placed write is dropped unpublished: nothing of it is stored.
    authorize(shared, peer, epoch, Intent::Create)?;
    let length = match data {
        WriteData::Placed(pending, crcs) => {
            let length = pending.payload_bytes();
            pending.publish(crcs)?;
            length
        }
        WriteData::Bytes(data, crcs) => {
            // Extent by extent: a later extent refused (no space after the wait, quota, file
            // size limit) fails the frame part way, leaving the extents before written (the
            // client reports the whole frame failed).
            let piece_bytes = shared.backend.record_payload_bytes().max(1);
            let (mut at, mut crc_at) = (0, 0);
            for extent in extents {
                let offset = extent.offset;
                let bytes = &data[at..at + extent.length as usize];
                offset.checked_add(bytes.len() as u64).ok_or_else(|| {
                    BackendError::new(
                        ErrorCode::InvalidArgument,
                        format!("write at offset {offset} of {} bytes overflows", bytes.len()),
                    )
                })?;
                let piece_crcs = &crcs[crc_at..crc_at + bytes.len().div_ceil(piece_bytes)];
                let target = WriteTarget { epoch, file, offset };
                write_with_backpressure(shared, peer.identity, target, bytes, piece_crcs, wait)?;
                at += bytes.len();
                crc_at += piece_crcs.len();
            }
            data.len()
        }
    };
    shared.counters.bytes_written.fetch_add(length as u64, Ordering::Relaxed);
    Ok((Response::Written { bytes: length as u32 }, None))
}

/// `WriteZeros`: a run of zeros, written as the store can (one small record), with the
/// write's authorization, backpressure and answer (`Written` of 0 payload bytes).
fn write_zeros(
    shared: &Shared,
    peer: &Requester,
    target: WriteTarget,
    length: u64,
    wait: Duration,
) -> Result<Reply, BackendError> {
    authorize(shared, peer, target.epoch, Intent::Create)?;
    let WriteTarget { epoch, file, offset } = target;
    offset.checked_add(length).ok_or_else(|| {
        BackendError::new(
            ErrorCode::InvalidArgument,
            format!("run of {length} zeros at offset {offset} overflows"),
        )
    })?;
    // What a full store must free for it: one small record (its size is the store's business;
    // a record header's worth is what the wait asks for).
    with_backpressure(shared, epoch, 64, wait, || {
        let stream = stream_of(shared, peer.identity, epoch);
        shared.backend.write_zeros(stream, epoch, file, offset, length)
    })?;
    Ok((Response::Written { bytes: 0 }, None))
}

/// `Read`: checks the length against `payload_bytes_max` and reads into a reply buffer.
fn read(
    shared: &Shared,
    peer: &Requester,
    epoch: EpochId,
    file: FileId,
    offset: u64,
    length: u32,
) -> Result<Reply, BackendError> {
    authorize(shared, peer, epoch, Intent::Use)?;
    if length > shared.options.payload_bytes_max {
        return Err(BackendError::new(
            ErrorCode::TooLarge,
            format!(
                "read of {length} bytes exceeds payload_bytes_max {}",
                shared.options.payload_bytes_max
            ),
        ));
    }
    offset.checked_add(length as u64).ok_or_else(|| {
        BackendError::new(
            ErrorCode::InvalidArgument,
            format!("read at offset {offset} of {length} bytes overflows"),
        )
    })?;
    // Not charged to the write budget (an executor waiting on it while readers hold
    // it could deadlock); bounded instead by one reply buffer per connection:
    // connections_max × payload_bytes_max.
    let mut buffer = vec![0u8; length as usize];
    let payload_crc32c = shared.backend.read(epoch, file, offset, &mut buffer)?;
    shared.counters.bytes_read.fetch_add(length as u64, Ordering::Relaxed);
    Ok((Response::ReadData { payload_crc32c }, Some(buffer)))
}

/// `Commit`: commits at the asked (or the server's default) durability and tells the drainer.
fn commit(
    shared: &Shared,
    peer: &Requester,
    epoch: EpochId,
    durability: Durability,
    participants: &[Participant],
) -> Result<Reply, BackendError> {
    authorize(shared, peer, epoch, Intent::Create)?;
    let durability = match durability {
        Durability::ServerDefault => shared.options.default_durability,
        other => other,
    };
    // Before the commit record: a committed epoch always has its participants on record, so a
    // drain never mistakes a lost participant for one that held nothing.
    shared.backend.record_participants(epoch, participants)?;
    shared.backend.commit(epoch, durability)?;
    if let Some(drain) = shared.drain.get() {
        drain.committed(epoch);
    }
    Ok((Response::Committed { epoch, durability }, None))
}

/// `Drain`: queues a drain of an epoch this server holds, if it has a PFS to drain to.
fn drain(
    shared: &Shared,
    peer: &Requester,
    epoch: EpochId,
    mode: u8,
) -> Result<Reply, BackendError> {
    authorize(shared, peer, epoch, Intent::Use)?;
    let drain = shared.drain.get().ok_or_else(|| {
        BackendError::new(
            ErrorCode::InvalidArgument,
            "this server has no PFS to drain to (drain.pfs_directory is not set)",
        )
    })?;
    if !shared.backend.has_epoch(epoch) {
        return Err(BackendError::new(ErrorCode::NoSuchEpoch, format!("no epoch {epoch} here")));
    }
    drain.request(epoch, mode)?;
    Ok((Response::DrainQueued { epoch }, None))
}

/// `DrainStatus`: the drainer's status of the epochs this peer may see, the newest that fit in
/// one body.
fn drain_status(shared: &Shared, peer: &Requester) -> Vec<DrainInfo> {
    let mut list = shared.drain.get().map(|d| d.status()).unwrap_or_default();
    list.retain(|d| access::may_see(shared, peer, d.epoch));
    // 64 bytes per entry plus the error text after a 4-byte count: keep the newest that fit.
    let mut bytes = 4usize;
    list.reverse();
    list.retain(|d| {
        bytes += 64 + d.last_error.len().min(spillway_proto::NAME_BYTES_MAX);
        bytes <= BODY_BYTES_MAX as usize
    });
    list.reverse();
    list
}

/// `Status`: this server's connections, budget, counters and store usage.
fn server_status(shared: &Shared) -> ServerStatus {
    let backend = &*shared.backend;
    let usage = backend.usage();
    let epochs = backend.epochs().map(|e| e.len() as u64).unwrap_or(0);
    ServerStatus {
        server_name: shared.options.server_name.clone(),
        connections: shared.connections.load(Ordering::SeqCst),
        connections_max: shared.options.connections_max,
        in_flight_bytes: shared.budget.used(),
        in_flight_bytes_max: shared.budget.max(),
        requests_served: shared.counters.requests_served.load(Ordering::Relaxed),
        bytes_written: shared.counters.bytes_written.load(Ordering::Relaxed),
        bytes_read: shared.counters.bytes_read.load(Ordering::Relaxed),
        dram_bytes_used: usage.dram_bytes_used,
        dram_bytes_max: usage.dram_bytes_max,
        ssd_bytes_used: usage.ssd_bytes_used,
        ssd_bytes_max: usage.ssd_bytes_max,
        epochs,
        auth: shared.options.auth,
        server_id: shared.identity.id,
        incarnation: shared.identity.incarnation,
        failure_domain: shared.options.failure_domain.clone(),
    }
}

/// Keeps as many files as fit in one body.
fn fit_files(files: Vec<FileInfo>) -> Vec<FileInfo> {
    let mut bytes = 4usize;
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        bytes += 8 + 2 + file.name.len() + 16;
        if bytes > BODY_BYTES_MAX as usize {
            break;
        }
        out.push(file);
    }
    out
}

/// Where a write goes.
struct WriteTarget {
    epoch: EpochId,
    file: spillway_types::FileId,
    offset: u64,
}

/// A write that finds the store full waits up to `wait` for space instead of failing at once:
/// a drain or a delete may free space any moment.
fn write_with_backpressure(
    shared: &Shared,
    identity: Identity,
    target: WriteTarget,
    data: &[u8],
    piece_crcs: &[u32],
    wait: Duration,
) -> Result<(), BackendError> {
    let WriteTarget { epoch, file, offset } = target;
    with_backpressure(shared, epoch, data.len() as u64, wait, || {
        let stream = stream_of(shared, identity, epoch);
        shared.backend.write(stream, epoch, file, offset, data, piece_crcs)
    })
}

/// Runs `write` until it does not answer `NoSpace` or `wait` has passed, waiting for `bytes`
/// of space in between (the epoch's stream is looked up on every try: a grant may move it).
fn with_backpressure(
    shared: &Shared,
    epoch: EpochId,
    bytes: u64,
    wait: Duration,
    write: impl Fn() -> Result<(), BackendError>,
) -> Result<(), BackendError> {
    let deadline = Instant::now() + wait;
    let mut waited = false;
    loop {
        match write() {
            Err(error) if error.code == ErrorCode::NoSpace => {
                let now = Instant::now();
                if now >= deadline || shared.shutdown.load(Ordering::SeqCst) {
                    return Err(BackendError::new(
                        ErrorCode::NoSpace,
                        format!(
                            "{} (store still full after waiting {wait:?} for space)",
                            error.message
                        ),
                    ));
                }
                if !waited {
                    tracing::info!(%epoch, bytes, "store full: write waits for space");
                    waited = true;
                }
                // Wake at least every 50 ms: shutdown, or space freed the backend cannot see.
                shared
                    .backend
                    .wait_for_space(bytes, (deadline - now).min(Duration::from_millis(50)));
            }
            other => return other,
        }
    }
}
