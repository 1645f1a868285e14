//! Munge authentication at the protocol level (`server.auth = munge`), against real `munged`
//! daemons (`spillway_harness::Munged`, each with its own key) and an in-process server over a
//! model backend: the client authenticates and works; every bad credential, and anything but
//! `Authenticate` after `Hello`, is refused with `PermissionDenied`, logged with the peer and
//! the reason, and the connection is closed; Unix sockets keep `SO_PEERCRED`.

// The model backend's inspection methods serve crates/server/tests/protocol.rs.
#[allow(dead_code)]
mod support;

mod log_capture;

use std::io::Read;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::Munged;
use spillway_proto::auth::credential_payload;
use spillway_proto::frame;
use spillway_proto::{
    AuthMethod, Durability, Endpoint, ErrorCode, Identity, Request, Response, CHALLENGE_BYTES,
    PROTOCOL_VERSION,
};
use spillway_server::{Fairness, Server, ServerOptions, ShutdownHandle};
use spillway_types::EpochId;
use support::ModelBackend;

/// The log line that refused `peer` (the server logs as it closes).
fn refusal_logged(peer: &str) -> String {
    log_capture::logged_within(&[peer, "refusing"], Duration::from_secs(2))
}

fn options(munged: &Munged) -> ServerOptions {
    ServerOptions {
        server_name: "auth-test".into(),
        failure_domain: "auth-test-host".into(),
        connections_max: 16,
        payload_bytes_max: 1 << 20,
        in_flight_requests_max: 8,
        in_flight_bytes_max: 8 << 20,
        backpressure_wait: Duration::from_millis(300),
        default_durability: Durability::Ssd,
        shutdown_grace: Duration::from_secs(5),
        frame_stall: Duration::from_secs(30),
        managed: false,
        auth: AuthMethod::Munge,
        munge_socket: Some(munged.socket().to_path_buf()),
        fairness: Fairness::default(),
    }
}

struct Running {
    endpoints: Vec<Endpoint>,
    handle: ShutdownHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn start(options: ServerOptions, endpoints: &[Endpoint]) -> Running {
    log_capture::captured();
    let backend = Arc::new(ModelBackend::new(1 << 30));
    let server = Server::bind(options, backend, endpoints, false).unwrap();
    let endpoints = server.endpoints();
    let handle = server.shutdown_handle();
    let thread = Some(std::thread::spawn(move || server.run().unwrap()));
    Running { endpoints, handle, thread }
}

fn start_tcp(munged: &Munged) -> Running {
    start(options(munged), &["127.0.0.1:0".parse().unwrap()])
}

fn tcp(running: &Running) -> TcpStream {
    let Endpoint::Tcp(address) = running.endpoints[0] else { panic!("not TCP") };
    let stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream
}

/// `tcp://<our address>`: how the server names this connection in its log.
fn peer_name(stream: &TcpStream) -> String {
    format!("tcp://{}", stream.local_addr().unwrap())
}

fn send(stream: &mut TcpStream, id: u64, request: &Request) {
    frame::write_frame(stream, request.kind(), id, &request.encode_body(), &[]).unwrap();
}

fn receive(stream: &mut TcpStream) -> (u64, Response) {
    let mut body = Vec::new();
    let header = frame::read_header_and_body(stream, &mut body, 1 << 24).unwrap();
    (header.request_id, Response::decode(header.kind, &body).unwrap())
}

/// Sends `Hello`; the reply must ask for munge. Returns the challenge.
fn hello(stream: &mut TcpStream) -> [u8; CHALLENGE_BYTES] {
    let hello = Request::Hello {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        client_name: "raw".into(),
    };
    send(stream, 1, &hello);
    match receive(stream) {
        (1, Response::Hello { auth: AuthMethod::Munge, challenge, uid, gid, .. }) => {
            assert_eq!(Identity { uid, gid }, Identity::NOBODY, "nothing is established yet");
            challenge
        }
        other => panic!("{other:?}"),
    }
}

fn expect_closed(stream: &mut TcpStream) {
    let mut rest = Vec::new();
    let n = stream.read_to_end(&mut rest).unwrap_or(0);
    assert_eq!(n, 0, "connection should be closed, got {n} more bytes");
}

/// Sends `request` after the handshake and expects `PermissionDenied` containing `reason`, a
/// closed connection and a log line naming the peer and the reason.
fn expect_refused(stream: &mut TcpStream, request: &Request, reason: &str) {
    send(stream, 2, request);
    match receive(stream) {
        (2, Response::Error { code: ErrorCode::PermissionDenied, message }) => {
            assert!(message.contains(reason), "{message:?} does not say {reason:?}")
        }
        other => panic!("expected PermissionDenied ({reason}), got {other:?}"),
    }
    expect_closed(stream);
    let line = refusal_logged(&peer_name(stream));
    assert!(line.contains(reason) && line.contains("WARN"), "{line}");
}

fn authenticate(credential: String) -> Request {
    Request::Authenticate { credential }
}

#[test]
fn a_client_authenticates_then_writes_reads_and_commits_as_the_credentials_uid() {
    let munged = Munged::started();
    let running = start_tcp(&munged);
    let options = ClientOptions {
        placement: Placement::striped_default(),
        munge_socket: Some(munged.socket().to_path_buf()),
        ..Default::default()
    };
    let mut client = Client::connect(&running.endpoints, options).unwrap();
    let me = (spillway_sys::user::euid(), spillway_sys::user::egid());
    assert_eq!(client.identity(), me, "the credential's uid/gid, confirmed by Authenticated");
    let epoch = EpochId(7);
    client.begin_epoch(epoch);
    let mut file = client.create_file(epoch, "checkpoint").unwrap();
    let data = spillway_harness::pattern(7, 300_000);
    client.write(&mut file, 0, &data).unwrap();
    client.commit_epoch(epoch).unwrap();
    let mut back = vec![0; data.len()];
    client.read(&file, 0, &mut back).unwrap();
    assert!(back == data, "read back what was written");
    let status = client.status().unwrap();
    assert_eq!(status[0].auth, AuthMethod::Munge, "Status says how TCP clients authenticate");
}

#[test]
fn every_connection_gets_its_own_challenge() {
    let munged = Munged::started();
    let running = start_tcp(&munged);
    let first = hello(&mut tcp(&running));
    let second = hello(&mut tcp(&running));
    assert_ne!(first, second);
    assert_ne!(first, [0; CHALLENGE_BYTES]);
}

#[test]
fn a_credential_of_another_munge_key_is_refused() {
    let (munged, forger) = (Munged::started(), Munged::started());
    let running = start_tcp(&munged);
    let mut stream = tcp(&running);
    let challenge = hello(&mut stream);
    let forged = forger.context().encode(&credential_payload(&challenge)).unwrap();
    expect_refused(&mut stream, &authenticate(forged), "invalid credential");
    // The client library says the same to its caller.
    let options =
        ClientOptions { munge_socket: Some(forger.socket().into()), ..Default::default() };
    let error = Client::connect(&running.endpoints, options).err().expect("forged");
    assert_eq!(error.code(), Some(ErrorCode::PermissionDenied), "{error}");
    assert!(error.to_string().contains("invalid credential"), "{error}");
}

#[test]
fn a_credential_replayed_on_a_second_connection_is_refused() {
    let munged = Munged::started();
    let running = start_tcp(&munged);
    let mut first = tcp(&running);
    let challenge = hello(&mut first);
    let credential = munged.context().encode(&credential_payload(&challenge)).unwrap();
    send(&mut first, 2, &authenticate(credential.clone()));
    assert!(matches!(receive(&mut first), (2, Response::Authenticated { .. })));
    let mut second = tcp(&running);
    hello(&mut second);
    expect_refused(&mut second, &authenticate(credential), "replayed credential");
    // The first connection is not disturbed.
    send(&mut first, 3, &Request::ListEpochs { from_epoch: EpochId(0) });
    assert!(matches!(receive(&mut first), (3, Response::Epochs(_))));
}

#[test]
fn an_expired_credential_is_refused() {
    let munged = Munged::started();
    let running = start_tcp(&munged);
    let mut stream = tcp(&running);
    let challenge = hello(&mut stream);
    let short_lived = munged.context().with_ttl(Duration::from_secs(1));
    let credential = short_lived.encode(&credential_payload(&challenge)).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    expect_refused(&mut stream, &authenticate(credential), "expired credential");
}

#[test]
fn a_credential_for_another_challenge_is_refused() {
    let munged = Munged::started();
    let running = start_tcp(&munged);
    let mut elsewhere = tcp(&running);
    let other_challenge = hello(&mut elsewhere);
    let mut stream = tcp(&running);
    hello(&mut stream);
    let credential = munged.context().encode(&credential_payload(&other_challenge)).unwrap();
    expect_refused(&mut stream, &authenticate(credential), "not made for this connection");
    // Nor does a valid credential with some other payload open the door.
    let mut stream = tcp(&running);
    hello(&mut stream);
    let credential = munged.context().encode(b"spillway-auth-v2\0").unwrap();
    expect_refused(&mut stream, &authenticate(credential), "not made for this connection");
}

#[test]
fn a_request_instead_of_authenticate_is_refused() {
    let munged = Munged::started();
    let running = start_tcp(&munged);
    let mut stream = tcp(&running);
    hello(&mut stream);
    expect_refused(&mut stream, &Request::Status, "expected Authenticate after Hello");
    // A write right after Hello is refused the same way, its payload never read as a request.
    let mut stream = tcp(&running);
    hello(&mut stream);
    let write = Request::Write {
        epoch: EpochId(1),
        file: spillway_types::FileId(1),
        offset: 0,
        payload_crc32c: crc32c::crc32c(&[1; 64]),
    };
    frame::write_frame(&mut stream, write.kind(), 2, &write.encode_body(), &[1; 64]).unwrap();
    let (_, response) = receive(&mut stream);
    assert!(
        matches!(response, Response::Error { code: ErrorCode::PermissionDenied, .. }),
        "{response:?}"
    );
    expect_closed(&mut stream);
}

#[test]
fn garbage_credentials_are_refused() {
    let munged = Munged::started();
    let running = start_tcp(&munged);
    for garbage in ["", "garbage", "MUNGE:AAAAAAAAAAAA:"] {
        let mut stream = tcp(&running);
        hello(&mut stream);
        expect_refused(&mut stream, &authenticate(garbage.into()), "invalid credential");
    }
}

#[test]
fn silence_after_hello_is_cut_off_at_the_frame_stall_bound() {
    let munged = Munged::started();
    let running = start(
        ServerOptions { frame_stall: Duration::from_millis(300), ..options(&munged) },
        &["127.0.0.1:0".parse().unwrap()],
    );
    let mut stream = tcp(&running);
    hello(&mut stream);
    match receive(&mut stream) {
        (0, Response::Error { code: ErrorCode::PermissionDenied, message }) => {
            assert!(message.contains("instead of Authenticate"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    expect_closed(&mut stream);
    refusal_logged(&peer_name(&stream));
}

#[test]
fn authenticate_twice_or_on_an_established_connection_is_out_of_order() {
    let munged = Munged::started();
    let running = start_tcp(&munged);
    let mut stream = tcp(&running);
    let challenge = hello(&mut stream);
    let credential = munged.context().encode(&credential_payload(&challenge)).unwrap();
    send(&mut stream, 2, &authenticate(credential));
    assert!(matches!(receive(&mut stream), (2, Response::Authenticated { .. })));
    let again = munged.context().encode(&credential_payload(&challenge)).unwrap();
    send(&mut stream, 3, &authenticate(again));
    assert!(matches!(
        receive(&mut stream),
        (3, Response::Error { code: ErrorCode::OutOfOrder, .. })
    ));
    send(&mut stream, 4, &Request::Status);
    assert!(matches!(receive(&mut stream), (4, Response::Status(_))), "the connection stays");
}

#[test]
fn unix_socket_peers_keep_so_peercred_on_a_munge_server() {
    let munged = Munged::started();
    let dir = tempfile::tempdir().unwrap();
    let running = start(options(&munged), &[Endpoint::Unix(dir.path().join("s.sock"))]);
    // No munged behind this socket: a client that tried munge would fail.
    let options = ClientOptions {
        munge_socket: Some(dir.path().join("no-munged-here")),
        ..Default::default()
    };
    let mut client = Client::connect(&running.endpoints, options).unwrap();
    assert_eq!(client.identity(), (spillway_sys::user::uid(), spillway_sys::user::gid()));
    client.list_epochs().unwrap();
}

#[test]
fn a_client_without_a_reachable_munged_is_told_so() {
    let munged = Munged::started();
    let running = start_tcp(&munged);
    let missing = std::env::temp_dir().join("spillway-auth-test-no-munged.socket");
    let options = ClientOptions { munge_socket: Some(missing.clone()), ..Default::default() };
    let error = Client::connect(&running.endpoints, options).err().expect("no munged");
    let text = error.to_string();
    assert!(text.contains("requires munge authentication"), "{text}");
    assert!(
        text.contains("munged not reachable at") && text.contains(&missing.display().to_string()),
        "{text}"
    );
}
