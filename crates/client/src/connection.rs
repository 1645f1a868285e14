//! One connection to one server: handshake, request ids, a window of pipelined requests.
//!
//! Requests are sent at once and their replies collected later, in order; at most
//! `window` are outstanding (the lesser of the client's wish and the server's
//! `in_flight_requests_max`), and pipelined writes carry at most `window_bytes_max` payload
//! bytes not yet acknowledged (so small writes pipeline deeply and large ones do not pile up). Write acknowledgements are collected lazily; the first failure is
//! kept and reported by the next [`ServerConnection::flush`].
//!
//! When the server's `HelloReply` asks for munge (a TCP connection to a server with
//! `server.auth = munge`), the handshake goes on with `Authenticate`: a munge credential, made by
//! the local `munged`, whose payload carries the connection's challenge. The connection then
//! runs as the credential's uid/gid, which the server confirms in `Authenticated`.

use std::collections::VecDeque;
use std::io::BufReader;
use std::path::Path;
use std::time::{Duration, Instant};

use spillway_proto::auth::credential_payload;
use spillway_proto::frame::{self, ReceiveError};
use spillway_proto::transport;
use spillway_proto::{
    AuthMethod, Connection, Endpoint, ErrorCode, Request, Response, ServerId, WriteExtent,
    CHALLENGE_BYTES, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN, WRITE_EXTENTS_MAX,
    WRITE_EXTENTS_VERSION, WRITE_ZEROS_VERSION,
};
use spillway_sys::munge::MungeContext;
use spillway_types::{EpochId, FileId};

use crate::ClientError;

/// How long a request keeps trying to open a closed or broken connection again, unless
/// [`crate::ClientOptions::reconnect_wait_max`] says otherwise: long enough for a server to
/// restart, bounded so an application is not stuck on a server that stays away.
pub const RECONNECT_WAIT_MAX_DEFAULT: Duration = Duration::from_secs(30);

/// Writes of one file gathered into one frame that is not sent yet: the bytes are copies (the
/// callers' buffers are free again). Adjacent writes extend an extent, whose CRC32C is extended
/// over each caller's bytes as they are copied; a write elsewhere in the file starts another
/// extent (a `WriteExtents` frame, to a server that speaks it).
struct Coalesced {
    epoch: EpochId,
    file: FileId,
    /// In the order written; their lengths add up to the gathered bytes.
    extents: Vec<WriteExtent>,
}

/// What to do with the reply of an outstanding request.
enum Pending {
    /// A write: check for an error, nothing else.
    WriteAck { bytes: u32 },
}

pub struct ServerConnection {
    pub endpoint: Endpoint,
    /// The sending half (unbuffered: a write's payload goes from the caller's slice to the socket).
    connection: Box<dyn Connection>,
    /// The receiving half, buffered: many small replies per syscall.
    reader: BufReader<Box<dyn Connection>>,
    next_request_id: u64,
    window: usize,
    window_bytes_max: u64,
    outstanding: VecDeque<(u64, Pending)>,
    /// Payload bytes of the pipelined writes in `outstanding`.
    outstanding_bytes: u64,
    deferred: Option<ClientError>,
    pub payload_bytes_max: u32,
    pub uid: u32,
    pub gid: u32,
    pub server_name: String,
    /// The server's id and incarnation from the last handshake (a reopened connection may
    /// reach a restarted server, or another one at the same address).
    pub server_id: ServerId,
    pub incarnation: u64,
    /// The server's failure domain from the last handshake (replicas go to distinct ones).
    pub failure_domain: String,
    body: Vec<u8>,
    /// Requests sent whose reply has not been received: 0 means the connection is quiet.
    unanswered: u64,
    /// Pipelined writes whose acknowledgement could not be received (the connection broke).
    lost_in_flight: usize,
    /// A reply wait lifted the bound on unacknowledged bytes ([`Connection::begin_quiet_wait`]);
    /// put back before the next send.
    quiet_wait: bool,
    /// How it was opened, to open it again when the server closed it while it was quiet.
    client_name: String,
    window_wanted: u32,
    munge_socket: Option<std::path::PathBuf>,
    /// A send or receive failed mid-stream: the next request opens the connection again.
    broken: bool,
    /// How long to keep trying to open a closed or broken connection again.
    reconnect_wait_max: Duration,
    /// The protocol version the server chose.
    version: u16,
    /// Largest frame writes are gathered into (0: every write is sent as it comes).
    coalesce_bytes_max: u64,
    /// The frame being gathered, if any, and its bytes (kept allocated between frames).
    coalesced: Option<Coalesced>,
    coalesced_bytes: Vec<u8>,
}

/// Bytes of zeros per write where a run of zeros must travel as bytes (to a server older than
/// `WriteZeros`, or a file written straight to the PFS).
pub(crate) const ZERO_BYTES_CHUNK: u64 = 1 << 20;

/// Calls `write(at, zeros)` for `[offset, offset + length)` in writes of at most `chunk` bytes
/// of zeros (one buffer, reused).
pub(crate) fn zeros_as_bytes(
    offset: u64,
    length: u64,
    chunk: u64,
    mut write: impl FnMut(u64, &[u8]) -> Result<(), ClientError>,
) -> Result<(), ClientError> {
    let zeros = vec![0u8; length.min(chunk.max(1)) as usize];
    let mut at = 0;
    while at < length {
        let n = (length - at).min(zeros.len() as u64) as usize;
        write(offset + at, &zeros[..n])?;
        at += n as u64;
    }
    Ok(())
}

impl ServerConnection {
    /// Connects and shakes hands; a munge server gets a credential from the `munged` named by
    /// `SPILLWAY_MUNGE_SOCKET` (else libmunge's default socket).
    pub fn connect(
        endpoint: &Endpoint,
        client_name: &str,
        window_wanted: u32,
    ) -> Result<ServerConnection, ClientError> {
        let munge_socket = crate::munge_socket_from_env();
        Self::connect_with_munge_socket(
            endpoint,
            client_name,
            window_wanted,
            munge_socket.as_deref(),
        )
    }

    /// Connects and shakes hands; a munge server gets a credential from the `munged` listening
    /// on `munge_socket` (`None`: libmunge's default socket).
    pub fn connect_with_munge_socket(
        endpoint: &Endpoint,
        client_name: &str,
        window_wanted: u32,
        munge_socket: Option<&Path>,
    ) -> Result<ServerConnection, ClientError> {
        let connection = transport::connect(endpoint)
            .map_err(|source| ClientError::Connect { endpoint: endpoint.clone(), source })?;
        let reader = connection
            .try_clone_connection()
            .map_err(|source| ClientError::Connect { endpoint: endpoint.clone(), source })?;
        let mut this = ServerConnection::unconnected(
            endpoint,
            (connection, reader),
            client_name,
            window_wanted,
            munge_socket,
        );
        let hello = Request::Hello {
            version_min: PROTOCOL_VERSION_MIN,
            version_max: PROTOCOL_VERSION,
            client_name: client_name.to_string(),
        };
        match this.call(&hello, &[], None)? {
            (
                Response::Hello {
                    version,
                    payload_bytes_max,
                    in_flight_requests_max,
                    uid,
                    gid,
                    server_name,
                    auth,
                    challenge,
                    server_id,
                    incarnation,
                    failure_domain,
                },
                _,
            ) => {
                if !(PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&version) {
                    return Err(ClientError::Handshake {
                        endpoint: endpoint.clone(),
                        message: format!("server chose version {version}, which we do not speak"),
                    });
                }
                this.version = version;
                this.payload_bytes_max = payload_bytes_max;
                this.window = window_wanted.clamp(1, in_flight_requests_max.max(1)) as usize;
                (this.uid, this.gid) = match auth {
                    AuthMethod::None => (uid, gid),
                    AuthMethod::Munge => this.authenticate(&challenge, munge_socket)?,
                };
                this.server_name = server_name;
                this.server_id = server_id;
                this.incarnation = incarnation;
                this.failure_domain = failure_domain;
                Ok(this)
            }
            (other, _) => Err(this.unexpected("HelloReply", &other)),
        }
    }

    /// A connection to a server that could not be reached at connect, in failure domain
    /// `failure_domain` (known from elsewhere: the reservation, a manifest). It counts as
    /// broken: every request first tries to open it (for `reconnect_wait_max`), so a server
    /// that comes back is used again.
    pub fn unreached(
        endpoint: &Endpoint,
        client_name: &str,
        window_wanted: u32,
        munge_socket: Option<&Path>,
        failure_domain: &str,
    ) -> ServerConnection {
        let mut this = ServerConnection::unconnected(
            endpoint,
            (Box::new(Unreached), Box::new(Unreached)),
            client_name,
            window_wanted,
            munge_socket,
        );
        this.broken = true;
        // Never the smallest: the reachable servers' limits bound the pieces.
        this.payload_bytes_max = spillway_proto::PAYLOAD_BYTES_LIMIT;
        this.failure_domain = failure_domain.to_string();
        this
    }

    /// A connection before its handshake: nothing learnt from the server yet.
    fn unconnected(
        endpoint: &Endpoint,
        (connection, reader): (Box<dyn Connection>, Box<dyn Connection>),
        client_name: &str,
        window_wanted: u32,
        munge_socket: Option<&Path>,
    ) -> ServerConnection {
        ServerConnection {
            endpoint: endpoint.clone(),
            reader: BufReader::with_capacity(64 * 1024, reader),
            connection,
            next_request_id: 1,
            window: 1,
            window_bytes_max: u64::MAX,
            outstanding: VecDeque::new(),
            outstanding_bytes: 0,
            deferred: None,
            payload_bytes_max: 0,
            uid: 0,
            gid: 0,
            server_name: String::new(),
            server_id: ServerId::NONE,
            incarnation: 0,
            failure_domain: String::new(),
            body: Vec::new(),
            unanswered: 0,
            lost_in_flight: 0,
            quiet_wait: false,
            client_name: client_name.to_string(),
            window_wanted,
            munge_socket: munge_socket.map(Path::to_path_buf),
            broken: false,
            reconnect_wait_max: RECONNECT_WAIT_MAX_DEFAULT,
            version: PROTOCOL_VERSION_MIN,
            coalesce_bytes_max: 0,
            coalesced: None,
            coalesced_bytes: Vec::new(),
        }
    }

    /// Sends `Authenticate` with a credential for `challenge` from the `munged` at
    /// `munge_socket`; the uid/gid the server established from it.
    fn authenticate(
        &mut self,
        challenge: &[u8; CHALLENGE_BYTES],
        munge_socket: Option<&Path>,
    ) -> Result<(u32, u32), ClientError> {
        let context = MungeContext::new().with_socket(munge_socket.map(Path::to_path_buf));
        let credential = context.encode(&credential_payload(challenge)).map_err(|error| {
            ClientError::Authentication {
                endpoint: self.endpoint.clone(),
                message: error.to_string(),
            }
        })?;
        match self.call(&Request::Authenticate { credential }, &[], None)? {
            (Response::Authenticated { uid, gid }, ()) => Ok((uid, gid)),
            (other, ()) => Err(self.unexpected("Authenticated", &other)),
        }
    }

    /// How long the next request keeps trying (with backoff) to open a connection the server
    /// closed or that broke, before it fails.
    pub fn with_reconnect_wait_max(mut self, wait: Duration) -> ServerConnection {
        self.reconnect_wait_max = wait;
        self
    }

    /// Gathers adjacent pipelined writes of one file into frames of up to `bytes` (capped by
    /// the server's payload limit); 0 sends every write as it comes. A gathered frame is sent
    /// when the next write is not adjacent or would overflow it, when it is full, and before
    /// anything else this connection sends or waits for (`flush`, every call, every read).
    pub fn with_coalesce_bytes_max(mut self, bytes: u64) -> ServerConnection {
        self.coalesce_bytes_max = bytes;
        self
    }

    /// Bounds the payload bytes of pipelined writes awaiting acknowledgement (one write is
    /// always allowed, whatever its size).
    pub fn with_window_bytes_max(mut self, bytes: u64) -> ServerConnection {
        self.window_bytes_max = bytes.max(1);
        self
    }

    fn unexpected(&self, expected: &'static str, got: &Response) -> ClientError {
        match got {
            Response::Error { code, message } => ClientError::Server {
                endpoint: self.endpoint.clone(),
                code: *code,
                message: message.clone(),
            },
            other => ClientError::UnexpectedReply {
                endpoint: self.endpoint.clone(),
                expected,
                got: format!("{:?}", other.kind()),
            },
        }
    }

    fn io(&self, source: std::io::Error) -> ClientError {
        ClientError::Io { endpoint: self.endpoint.clone(), source }
    }

    /// A reply that could not be received: the connection closing (between frames or inside
    /// one: the server died or restarted) is a broken connection (`Io`, EIO; another holder
    /// of replicated bytes is asked), not a protocol violation; bytes that make no frame are.
    fn receive_error(&self, error: ReceiveError) -> ClientError {
        match error {
            ReceiveError::Io(source) => self.io(source),
            ReceiveError::Closed | ReceiveError::TruncatedFrame { .. } => self
                .io(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, error.to_string())),
            other => ClientError::Protocol {
                endpoint: self.endpoint.clone(),
                message: other.to_string(),
            },
        }
    }

    /// Opens the connection again (handshake and, if asked, authentication included) if the
    /// server closed it while nothing was outstanding: servers close connections idle for
    /// `server.idle_timeout_ms`, and a checkpointing application or a mount may well be quiet
    /// that long. Nothing is lost: no request was in flight.
    ///
    /// A connection that broke mid-stream (the server died or restarted) is opened again too,
    /// with backoff for at most `reconnect_wait_max`; the writes it had not acknowledged are
    /// lost (their bytes were the caller's and are not held here), which the next `flush`
    /// reports ([`ClientError::Unacknowledged`], EIO). The new handshake may show another
    /// incarnation or id: the [`crate::Client`] checks.
    fn reopen_if_closed(&mut self) -> Result<(), ClientError> {
        let closed_while_quiet = self.next_request_id > 1
            && self.unanswered == 0
            && self.reader.buffer().is_empty()
            && self.connection.peer_closed().unwrap_or(false);
        if !self.broken && !closed_while_quiet {
            return Ok(());
        }
        let started = Instant::now();
        let mut pause = Duration::from_millis(10);
        let mut fresh = loop {
            match ServerConnection::connect_with_munge_socket(
                &self.endpoint,
                &self.client_name,
                self.window_wanted,
                self.munge_socket.as_deref(),
            ) {
                Ok(fresh) => break fresh,
                Err(error) if started.elapsed() >= self.reconnect_wait_max => return Err(error),
                Err(ClientError::Connect { .. } | ClientError::Io { .. }) => {
                    std::thread::sleep(pause.min(self.reconnect_wait_max));
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(error) => return Err(error),
            }
        };
        fresh.window_bytes_max = self.window_bytes_max;
        fresh.reconnect_wait_max = self.reconnect_wait_max;
        fresh.coalesce_bytes_max = self.coalesce_bytes_max;
        // Gathered writes were accepted on the old connection. The same server (it closed the
        // connection while idle) gets them now: it never saw them. A restarted one does not:
        // sent when accepted they would have died with the old incarnation, unacknowledged,
        // and they are reported as such.
        let gathered = self.coalesced.take();
        let same_server =
            fresh.server_id == self.server_id && fresh.incarnation == self.incarnation;
        let mut lost = self.outstanding.len() + self.lost_in_flight;
        if gathered.is_some() && same_server {
            fresh.coalesced = gathered;
            std::mem::swap(&mut fresh.coalesced_bytes, &mut self.coalesced_bytes);
        } else if gathered.is_some() {
            lost += 1;
        }
        fresh.deferred = self.deferred.take();
        if lost > 0 && fresh.deferred.is_none() {
            fresh.deferred =
                Some(ClientError::Unacknowledged { endpoint: self.endpoint.clone(), writes: lost });
        }
        *self = fresh;
        Ok(())
    }

    fn send(&mut self, request: &Request, payload: &[u8]) -> Result<u64, ClientError> {
        self.reopen_if_closed()?;
        self.end_quiet_wait()?;
        let id = self.next_request_id;
        self.next_request_id += 1;
        self.unanswered += 1;
        let sent = frame::write_frame(
            &mut *self.connection,
            request.kind(),
            id,
            &request.encode_body(),
            payload,
        );
        if let Err(error) = sent {
            self.broken = true;
            return Err(self.io(error));
        }
        Ok(id)
    }

    /// Before a reply that may take long (a commit, a sync, any call): once the request is
    /// acknowledged, a peer that lost power is noticed by keepalive alone, in about 30 s
    /// instead of 120 (docs/design/protocol.md).
    fn begin_quiet_wait(&mut self) -> Result<(), ClientError> {
        if !self.reader.buffer().is_empty() || self.quiet_wait {
            return Ok(());
        }
        match self.connection.begin_quiet_wait() {
            Ok(lifted) => {
                self.quiet_wait = lifted;
                Ok(())
            }
            Err(error) => {
                self.broken = true;
                Err(self.io(error))
            }
        }
    }

    fn end_quiet_wait(&mut self) -> Result<(), ClientError> {
        if !self.quiet_wait {
            return Ok(());
        }
        self.quiet_wait = false;
        self.connection.end_quiet_wait().map_err(|error| {
            self.broken = true;
            self.io(error)
        })
    }

    /// Receives one reply; a connection whose stream failed is marked broken (opened again by
    /// the next request).
    fn receive(&mut self, read_into: Option<&mut [u8]>) -> Result<(u64, Response), ClientError> {
        let received = self.receive_frame(read_into);
        if received.is_err() {
            self.broken = true;
        }
        received
    }

    /// Receives one reply; a `ReadData` payload is read into `read_into` (which must be exactly
    /// the payload's size).
    fn receive_frame(
        &mut self,
        read_into: Option<&mut [u8]>,
    ) -> Result<(u64, Response), ClientError> {
        let max = self.payload_bytes_max.max(1);
        let header = match frame::read_header_and_body(&mut self.reader, &mut self.body, max) {
            Ok(header) => {
                self.unanswered = self.unanswered.saturating_sub(1);
                header
            }
            Err(error) => return Err(self.receive_error(error)),
        };
        let response = Response::decode(header.kind, &self.body).map_err(|e| {
            ClientError::Protocol { endpoint: self.endpoint.clone(), message: e.to_string() }
        })?;
        if let Response::ReadData { payload_crc32c } = response {
            match read_into {
                Some(buffer) if buffer.len() == header.payload_bytes as usize => {
                    frame::read_payload(&mut self.reader, buffer)
                        .map_err(|e| self.receive_error(e))?;
                    // The server derived the CRC from the data's write-time checksums: bytes
                    // changed on the way (its buffer, the socket, ours) are never handed out.
                    let received = crc32c::crc32c(buffer);
                    if received != payload_crc32c {
                        let message = format!(
                            "read reply from {}: the {} bytes received have CRC32C \
                             {received:#010x}, the server sent {payload_crc32c:#010x}; the \
                             bytes are not used",
                            self.endpoint,
                            buffer.len()
                        );
                        let response =
                            Response::Error { code: ErrorCode::ChecksumMismatch, message };
                        return Ok((header.request_id, response));
                    }
                }
                _ => {
                    return Err(ClientError::Protocol {
                        endpoint: self.endpoint.clone(),
                        message: format!(
                            "unexpected read payload of {} bytes",
                            header.payload_bytes
                        ),
                    })
                }
            }
        }
        Ok((header.request_id, response))
    }

    /// Receives the oldest outstanding pipelined reply and settles it.
    fn settle_one(&mut self) -> Result<(), ClientError> {
        let (id, pending) =
            self.outstanding.pop_front().expect("settle_one with nothing outstanding");
        let Pending::WriteAck { bytes } = pending;
        self.outstanding_bytes -= bytes as u64;
        let (reply_id, response) = self.receive(None).inspect_err(|_| self.lost_in_flight += 1)?;
        if reply_id != id {
            return Err(ClientError::Protocol {
                endpoint: self.endpoint.clone(),
                message: format!("reply for request {reply_id}, expected {id}"),
            });
        }
        match (pending, response) {
            (Pending::WriteAck { bytes }, Response::Written { bytes: got }) if got == bytes => {
                Ok(())
            }
            (Pending::WriteAck { .. }, other) => {
                let error = self.unexpected("Written", &other);
                if self.deferred.is_none() {
                    self.deferred = Some(error);
                }
                Ok(())
            }
        }
    }

    /// Sends a write without waiting for its acknowledgement (at most `window` requests and
    /// `window_bytes_max` payload bytes outstanding), or, with coalescing on, gathers it with
    /// the adjacent writes before it into one frame (sent later, see
    /// [`ServerConnection::with_coalesce_bytes_max`]).
    ///
    /// The CRC32C the frame carries is taken here, from the caller's `data`, before the bytes
    /// are copied or sent: the server refuses a payload that arrives different, and the store
    /// keeps it as the record's checksum. A gathered frame's CRC is extended write by write.
    pub fn write_pipelined(
        &mut self,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ClientError> {
        assert!(data.len() <= self.payload_bytes_max as usize);
        // As a send would: the write goes to whatever answers now (the client compares the
        // server's incarnation right after this call).
        self.reopen_if_closed()?;
        let bound = self.coalesce_bytes_max.min(self.payload_bytes_max as u64);
        let length = data.len() as u64;
        let several_extents = self.version >= WRITE_EXTENTS_VERSION;
        if let Some(gathering) = &mut self.coalesced {
            let gathered = self.coalesced_bytes.len() as u64;
            let same_file = gathering.epoch == epoch && gathering.file == file;
            // No empty extent in a `WriteExtents` (only the first can be: one write of 0 bytes).
            let another_extent = same_file
                && several_extents
                && gathering.extents.len() < WRITE_EXTENTS_MAX
                && length > 0
                && gathering.extents[0].length > 0;
            let last = gathering.extents.last_mut().expect("a gathered frame has an extent");
            let adjacent = same_file
                && last.offset.checked_add(last.length as u64) == Some(offset)
                && last.length as u64 + length <= u32::MAX as u64;
            if (adjacent || another_extent) && gathered + length <= bound {
                if adjacent {
                    last.crc32c = crc32c::crc32c_append(last.crc32c, data);
                    last.length += length as u32;
                } else {
                    let crc32c = crc32c::crc32c(data);
                    gathering.extents.push(WriteExtent { offset, length: length as u32, crc32c });
                }
                self.coalesced_bytes.extend_from_slice(data);
                if gathered + length == bound {
                    self.send_coalesced()?;
                }
                return Ok(());
            }
            self.send_coalesced()?;
        }
        let payload_crc32c = crc32c::crc32c(data);
        if length < bound {
            let extent = WriteExtent { offset, length: length as u32, crc32c: payload_crc32c };
            self.coalesced = Some(Coalesced { epoch, file, extents: vec![extent] });
            self.coalesced_bytes.clear();
            self.coalesced_bytes.extend_from_slice(data);
            return Ok(());
        }
        self.send_write(&Request::Write { epoch, file, offset, payload_crc32c }, data)
    }

    /// Sends a run of zeros after the writes gathered or sent before it (the server executes a
    /// connection's requests in order): one `WriteZeros`, acknowledged like a write, to a
    /// server that chose version 6; to an older one, the zeros as bytes.
    pub fn write_zeros_pipelined(
        &mut self,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        length: u64,
    ) -> Result<(), ClientError> {
        if self.version < WRITE_ZEROS_VERSION {
            let chunk = (self.payload_bytes_max as u64).min(ZERO_BYTES_CHUNK);
            return zeros_as_bytes(offset, length, chunk, |at, zeros| {
                self.write_pipelined(epoch, file, at, zeros)
            });
        }
        self.reopen_if_closed()?;
        self.send_coalesced()?;
        self.send_write(&Request::WriteZeros { epoch, file, offset, length }, &[])
    }

    /// Sends the gathered frame, if any: one `Write` for one extent, else one `WriteExtents`.
    fn send_coalesced(&mut self) -> Result<(), ClientError> {
        let Some(Coalesced { epoch, file, extents }) = self.coalesced.take() else {
            return Ok(());
        };
        let request = match extents[..] {
            [WriteExtent { offset, crc32c, .. }] => {
                Request::Write { epoch, file, offset, payload_crc32c: crc32c }
            }
            // Gathered only for a server that chose version 5 or later, and taken over after a
            // reconnection only by the same server process (id and incarnation).
            _ => Request::WriteExtents { epoch, file, extents },
        };
        let bytes = std::mem::take(&mut self.coalesced_bytes);
        let sent = self.send_write(&request, &bytes);
        self.coalesced_bytes = bytes;
        // A failure is the gathered writes' failure, reported once by this error (as a failed
        // send of each would have been), by the write, flush or call that sent the frame.
        sent
    }

    /// Sends one write frame as soon as the window has room for it.
    fn send_write(&mut self, request: &Request, data: &[u8]) -> Result<(), ClientError> {
        while self.outstanding.len() >= self.window
            || (!self.outstanding.is_empty()
                && self.outstanding_bytes + data.len() as u64 > self.window_bytes_max)
        {
            self.settle_one()?;
        }
        let id = self.send(request, data)?;
        self.outstanding.push_back((id, Pending::WriteAck { bytes: data.len() as u32 }));
        self.outstanding_bytes += data.len() as u64;
        Ok(())
    }

    /// Whether writes sent on this connection still wait for their acknowledgement, are
    /// gathered and not sent yet, or have a failure to report (what `flush` would wait for or
    /// return).
    pub fn has_pending_writes(&self) -> bool {
        !self.outstanding.is_empty()
            || self.coalesced.is_some()
            || self.deferred.is_some()
            || self.lost_in_flight > 0
    }

    /// Sends the gathered writes, waits for every outstanding reply; reports the first failure.
    pub fn flush(&mut self) -> Result<(), ClientError> {
        // A broken connection has nothing more to say: open it again, which turns its
        // unacknowledged writes into the deferred failure reported below.
        self.reopen_if_closed()?;
        self.send_coalesced()?;
        while !self.outstanding.is_empty() {
            self.settle_one()?;
        }
        match self.deferred.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// One request, one reply (after settling anything pipelined). `read_into` receives a
    /// `ReadData` payload.
    pub fn call(
        &mut self,
        request: &Request,
        payload: &[u8],
        read_into: Option<&mut [u8]>,
    ) -> Result<(Response, ()), ClientError> {
        self.flush()?;
        let id = self.send(request, payload)?;
        self.begin_quiet_wait()?;
        let (reply_id, response) = self.receive(read_into)?;
        if reply_id != id && !matches!(response, Response::Error { .. }) {
            return Err(ClientError::Protocol {
                endpoint: self.endpoint.clone(),
                message: format!("reply for request {reply_id}, expected {id}"),
            });
        }
        if let Response::Error { code, message } = response {
            return Err(ClientError::Server { endpoint: self.endpoint.clone(), code, message });
        }
        Ok((response, ()))
    }

    /// Sends a request without waiting (after settling anything pipelined); pair with
    /// [`ServerConnection::finish_call`]. Lets one client wait on many servers at once.
    pub fn start_call(&mut self, request: &Request) -> Result<u64, ClientError> {
        self.flush()?;
        self.send(request, &[])
    }

    /// Receives the reply of a [`ServerConnection::start_call`].
    pub fn finish_call(&mut self, id: u64) -> Result<Response, ClientError> {
        self.begin_quiet_wait()?;
        let (reply_id, response) = self.receive(None)?;
        if let Response::Error { code, message } = response {
            return Err(ClientError::Server { endpoint: self.endpoint.clone(), code, message });
        }
        if reply_id != id {
            return Err(ClientError::Protocol {
                endpoint: self.endpoint.clone(),
                message: format!("reply for request {reply_id}, expected {id}"),
            });
        }
        Ok(response)
    }

    /// Pipelined reads: sends up to `window` read requests, then collects replies in order.
    pub fn read_many(&mut self, requests: &mut [(Request, &mut [u8])]) -> Result<(), ClientError> {
        self.flush()?;
        let mut sent: VecDeque<(u64, usize)> = VecDeque::new();
        let mut next = 0;
        while next < requests.len() || !sent.is_empty() {
            while next < requests.len() && sent.len() < self.window {
                let id = self.send(&requests[next].0, &[])?;
                sent.push_back((id, next));
                next += 1;
            }
            let (id, index) = sent.pop_front().expect("something outstanding");
            let (reply_id, response) = self.receive(Some(&mut *requests[index].1))?;
            if let Response::Error { code, message } = response {
                // Drain the rest so the connection stays usable, then report.
                while let Some((_, i)) = sent.pop_front() {
                    let _ = self.receive(Some(&mut *requests[i].1));
                }
                return Err(ClientError::Server { endpoint: self.endpoint.clone(), code, message });
            }
            if reply_id != id || !matches!(response, Response::ReadData { .. }) {
                return Err(ClientError::Protocol {
                    endpoint: self.endpoint.clone(),
                    message: format!("reply {reply_id} {:?} to read request {id}", response.kind()),
                });
            }
        }
        Ok(())
    }
}

impl Drop for ServerConnection {
    /// Gathered writes are sent, as they would have been by `write_pipelined` without
    /// coalescing (unacknowledged: a client dropped without a flush never learns their fate).
    fn drop(&mut self) {
        if self.coalesced.is_some() && !self.broken {
            let _ = self.send_coalesced();
        }
    }
}

/// One connection's share of [`read_parallel`]: the read requests and the buffer each reply
/// fills.
pub type ReadJob<'connection, 'buffer> =
    (&'connection mut ServerConnection, Vec<(Request, &'buffer mut [u8])>);

/// Pipelined reads on several connections at once: each keeps up to its `window` read
/// requests outstanding, sent in batches (one syscall for many small request frames), and
/// replies are collected round robin, so every server works at the same time. The first
/// failure is returned after every connection's outstanding replies are collected (a
/// connection that broke is left as it is).
pub fn read_parallel(jobs: &mut [ReadJob<'_, '_>]) -> Result<(), ClientError> {
    for (connection, _) in jobs.iter_mut() {
        connection.flush()?;
    }
    let mut sent: Vec<VecDeque<(u64, usize)>> = jobs.iter().map(|_| VecDeque::new()).collect();
    let mut next: Vec<usize> = vec![0; jobs.len()];
    let mut broken: Vec<bool> = vec![false; jobs.len()];
    let mut first_error: Option<ClientError> = None;
    let mut batch = Vec::new();
    loop {
        let mut waiting = false;
        for (j, (connection, requests)) in jobs.iter_mut().enumerate() {
            if broken[j] {
                continue;
            }
            // Top up the window when half of it has come back.
            let refill = sent[j].len() <= connection.window / 2;
            if first_error.is_none() && refill && next[j] < requests.len() {
                let batch_sent =
                    connection.send_read_batch(requests, &mut sent[j], &mut next[j], &mut batch);
                if let Err(error) = batch_sent {
                    first_error.get_or_insert(error);
                    broken[j] = true;
                    continue;
                }
            }
            let Some((id, index)) = sent[j].pop_front() else { continue };
            waiting = true;
            if connection.collect_read_reply(id, &mut *requests[index].1, &mut first_error) {
                broken[j] = true;
            }
        }
        if !waiting
            && (first_error.is_some()
                || jobs.iter().enumerate().all(|(j, (_, r))| broken[j] || next[j] >= r.len()))
        {
            break;
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

impl ServerConnection {
    /// Sends the next read requests of `requests` in one batch, up to a full window.
    fn send_read_batch(
        &mut self,
        requests: &[(Request, &mut [u8])],
        sent: &mut VecDeque<(u64, usize)>,
        next: &mut usize,
        batch: &mut Vec<u8>,
    ) -> Result<(), ClientError> {
        use std::io::Write;
        if sent.is_empty() {
            self.reopen_if_closed()?;
        }
        batch.clear();
        while *next < requests.len() && sent.len() < self.window {
            let id = self.next_request_id;
            self.next_request_id += 1;
            self.unanswered += 1;
            let request = &requests[*next].0;
            frame::write_frame(&mut *batch, request.kind(), id, &request.encode_body(), &[])
                .expect("encoding into a Vec cannot fail");
            sent.push_back((id, *next));
            *next += 1;
        }
        self.end_quiet_wait()?;
        if let Err(error) = self.connection.write_all(batch) {
            self.broken = true;
            return Err(self.io(error));
        }
        Ok(())
    }

    /// Collects the reply to read request `id` into `buffer`; returns whether the connection broke.
    fn collect_read_reply(
        &mut self,
        id: u64,
        buffer: &mut [u8],
        first_error: &mut Option<ClientError>,
    ) -> bool {
        match self.receive(Some(buffer)) {
            Ok((_, Response::Error { code, message })) => {
                first_error.get_or_insert(ClientError::Server {
                    endpoint: self.endpoint.clone(),
                    code,
                    message,
                });
                false
            }
            Ok((reply_id, response))
                if reply_id != id || !matches!(response, Response::ReadData { .. }) =>
            {
                first_error.get_or_insert(ClientError::Protocol {
                    endpoint: self.endpoint.clone(),
                    message: format!("reply {reply_id} {:?} to read request {id}", response.kind()),
                });
                true
            }
            Ok(_) => false,
            Err(error) => {
                first_error.get_or_insert(error);
                true
            }
        }
    }
}

/// The stand-in stream of a server never reached: every read and write fails.
struct Unreached;

impl std::io::Read for Unreached {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::NotConnected.into())
    }
}

impl std::io::Write for Unreached {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::NotConnected.into())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Connection for Unreached {
    fn transport(&self) -> spillway_proto::Transport {
        spillway_proto::Transport::Unix
    }
    fn peer(&self) -> String {
        "(never reached)".into()
    }
    fn identity(&self) -> std::io::Result<spillway_proto::Identity> {
        Err(std::io::ErrorKind::NotConnected.into())
    }
    fn try_clone_connection(&self) -> std::io::Result<Box<dyn Connection>> {
        Ok(Box::new(Unreached))
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
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_proto::frame::Header;
    use std::net::TcpListener;
    use std::time::Duration;

    /// Reads one frame (header, body, payload) from a raw stream.
    fn read_frame(stream: &mut std::net::TcpStream) -> std::io::Result<Header> {
        let mut body = Vec::new();
        let header = frame::read_header_and_body(stream, &mut body, 1 << 24)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut payload = vec![0u8; header.payload_bytes as usize];
        frame::read_payload(stream, &mut payload)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(header)
    }

    /// Answers the handshake of the one connection `listener` accepts.
    fn accept_and_greet(listener: &TcpListener) -> std::net::TcpStream {
        let (mut stream, _) = listener.accept().unwrap();
        let hello = read_frame(&mut stream).unwrap();
        let reply = Response::Hello {
            version: PROTOCOL_VERSION,
            payload_bytes_max: 1 << 20,
            in_flight_requests_max: 128,
            uid: 0,
            gid: 0,
            server_name: "fake".into(),
            auth: AuthMethod::None,
            challenge: [0; CHALLENGE_BYTES],
            server_id: ServerId([1; 16]),
            incarnation: 1,
            failure_domain: "fake-host".into(),
        };
        frame::write_frame(&mut stream, reply.kind(), hello.request_id, &reply.encode_body(), &[])
            .unwrap();
        stream
    }

    #[test]
    fn read_bytes_that_differ_from_the_servers_checksum_are_refused_and_the_connection_lives_on() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let data = vec![5u8; 4096];
        let good = crc32c::crc32c(&data);
        // Two reads: the first reply's bytes changed after the server took their CRC.
        let sent = data.clone();
        let server = std::thread::spawn(move || {
            let mut stream = accept_and_greet(&listener);
            for crc in [good ^ 1, good] {
                let read = read_frame(&mut stream).unwrap();
                let reply = Response::ReadData { payload_crc32c: crc };
                frame::write_frame(
                    &mut stream,
                    reply.kind(),
                    read.request_id,
                    &reply.encode_body(),
                    &sent,
                )
                .unwrap();
            }
        });
        let endpoint = Endpoint::Tcp(address);
        let mut connection = ServerConnection::connect(&endpoint, "test", 8).unwrap();
        let read = Request::Read { epoch: EpochId(1), file: FileId(1), offset: 0, length: 4096 };
        let mut buffer = vec![0u8; 4096];
        match connection.read_many(&mut [(read.clone(), &mut buffer[..])]) {
            Err(error @ ClientError::Server { code: ErrorCode::ChecksumMismatch, .. }) => {
                assert_eq!(error.errno(), libc::EIO);
            }
            other => panic!("a damaged read reply was accepted: {other:?}"),
        }
        connection.read_many(&mut [(read, &mut buffer[..])]).unwrap();
        assert!(buffer == data);
        server.join().unwrap();
    }

    #[test]
    fn a_server_that_closes_the_connection_under_a_request_is_a_broken_connection_not_a_protocol_error(
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        // The server dies with the request read and unanswered (its kernel closes the socket).
        let server = std::thread::spawn(move || {
            let mut stream = accept_and_greet(&listener);
            read_frame(&mut stream).unwrap();
        });
        let endpoint = Endpoint::Tcp(address);
        let mut connection = ServerConnection::connect(&endpoint, "test", 8).unwrap();
        let read = Request::Read { epoch: EpochId(1), file: FileId(1), offset: 0, length: 4096 };
        let mut buffer = vec![0u8; 4096];
        let result = connection.read_many(&mut [(read, &mut buffer[..])]);
        server.join().unwrap();
        let error = result.expect_err("a reply never sent");
        assert!(matches!(error, ClientError::Io { .. }), "{error:?}");
        assert_eq!(error.errno(), libc::EIO, "{error}");
        assert!(error.to_string().contains("closed"), "{error}");
        assert!(crate::replication::unreachable_endpoint(&error).is_some(), "{error}");
    }

    #[test]
    fn pipelined_writes_stop_at_the_byte_window_until_acknowledged() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        // A server that acknowledges nothing until the client has stopped sending.
        let server = std::thread::spawn(move || {
            let mut stream = accept_and_greet(&listener);
            stream.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
            let mut ids = Vec::new();
            while let Ok(header) = read_frame(&mut stream) {
                ids.push(header.request_id);
            }
            let before_any_ack = ids.len();
            stream.set_read_timeout(None).unwrap();
            for written in 0..5 {
                let id = if written < ids.len() {
                    ids[written]
                } else {
                    read_frame(&mut stream).unwrap().request_id
                };
                let ack = Response::Written { bytes: 400 << 10 };
                frame::write_frame(&mut stream, ack.kind(), id, &ack.encode_body(), &[]).unwrap();
            }
            before_any_ack
        });
        let endpoint = Endpoint::Tcp(address);
        let mut connection = ServerConnection::connect(&endpoint, "test", 128)
            .unwrap()
            .with_window_bytes_max(1 << 20);
        let data = vec![7u8; 400 << 10];
        for i in 0..5u64 {
            connection.write_pipelined(EpochId(1), FileId(1), i * (400 << 10), &data).unwrap();
        }
        connection.flush().unwrap();
        // Two 400 KiB writes fit in 1 MiB; the third waited for an acknowledgement.
        assert_eq!(server.join().unwrap(), 2);
    }
}
