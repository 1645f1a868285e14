//! The server's protocol layer over loopback TCP and Unix sockets, against a model backend:
//! handshake, pipelining, malformed input, backpressure, durability levels, identity, shutdown;
//! and against the real store where write payloads go straight into its DRAM ring.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use spillway_client::{Client, ClientOptions, Placement};
use spillway_proto::frame::{self, Kind};
use spillway_proto::{
    Durability, Endpoint, EpochGrant, EpochState, ErrorCode, Request, Response, WriteExtent,
    PROTOCOL_VERSION,
};
use spillway_server::{Backend, Fairness, Server, ServerOptions, ShutdownHandle, StoreBackend};
use spillway_types::{EpochId, StreamKey};
use support::ModelBackend;

fn options() -> ServerOptions {
    ServerOptions {
        server_name: "test".into(),
        failure_domain: "test-host".into(),
        connections_max: 16,
        payload_bytes_max: 1 << 20,
        in_flight_requests_max: 8,
        in_flight_bytes_max: 8 << 20,
        backpressure_wait: Duration::from_millis(300),
        default_durability: Durability::Ssd,
        shutdown_grace: Duration::from_secs(5),
        frame_stall: Duration::from_secs(30),
        managed: false,
        auth: spillway_proto::AuthMethod::None,
        munge_socket: None,
        fairness: Fairness::default(),
    }
}

struct Running {
    endpoints: Vec<Endpoint>,
    handle: ShutdownHandle,
    thread: Option<std::thread::JoinHandle<Result<(), spillway_server::ServeError>>>,
}

impl Running {
    fn stop(mut self) -> Result<(), spillway_server::ServeError> {
        self.handle.shutdown();
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start_with(
    options: ServerOptions,
    backend: Arc<dyn Backend>,
    endpoints: &[Endpoint],
) -> Running {
    let server = Server::bind(options, backend, endpoints, false).unwrap();
    let endpoints = server.endpoints();
    let handle = server.shutdown_handle();
    let thread = Some(std::thread::spawn(move || server.run()));
    Running { endpoints, handle, thread }
}

fn start(backend: Arc<ModelBackend>) -> Running {
    start_with(options(), backend, &["127.0.0.1:0".parse().unwrap()])
}

fn tcp(running: &Running) -> TcpStream {
    let Endpoint::Tcp(address) = running.endpoints[0] else { panic!() };
    let stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream
}

fn send(stream: &mut TcpStream, id: u64, request: &Request, payload: &[u8]) {
    frame::write_frame(stream, request.kind(), id, &request.encode_body(), payload).unwrap();
}

fn receive(stream: &mut TcpStream) -> (u64, Response, Vec<u8>) {
    let mut body = Vec::new();
    let header = frame::read_header_and_body(stream, &mut body, 1 << 24).unwrap();
    let mut payload = vec![0; header.payload_bytes as usize];
    frame::read_payload(stream, &mut payload).unwrap();
    (header.request_id, Response::decode(header.kind, &body).unwrap(), payload)
}

fn hello(stream: &mut TcpStream) {
    send(
        stream,
        1,
        &Request::Hello {
            version_min: 1,
            version_max: PROTOCOL_VERSION,
            client_name: "raw".into(),
        },
        &[],
    );
    let (id, response, _) = receive(stream);
    assert_eq!(id, 1);
    assert!(matches!(response, Response::Hello { .. }), "{response:?}");
}

fn expect_closed(stream: &mut TcpStream) {
    let mut rest = Vec::new();
    let n = stream.read_to_end(&mut rest).unwrap_or(0);
    assert_eq!(n, 0, "connection should be closed, got {n} more bytes");
}

fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn client(running: &Running, placement: Placement) -> Client {
    let options =
        ClientOptions { placement, window: 8, transfer_bytes_max: 256 << 10, ..Default::default() };
    Client::connect(&running.endpoints, options).unwrap()
}

#[test]
fn pipelined_writes_read_back_bit_exact() {
    let running = start(Arc::new(ModelBackend::new(1 << 30)));
    let mut c = client(&running, Placement::striped_default());
    let epoch = EpochId(1);
    c.begin_epoch(epoch);
    let mut file = c.create_file(epoch, "rank0").unwrap();
    let data = pattern(1, 3 << 20);
    for (i, chunk) in data.chunks(100_000).enumerate() {
        c.write(&mut file, (i * 100_000) as u64, chunk).unwrap();
    }
    c.commit_epoch(epoch).unwrap();
    let mut back = vec![0; data.len()];
    c.read(&file, 0, &mut back).unwrap();
    assert!(back == data, "read back differs");
    let mut middle = vec![0; 777];
    c.read(&file, 1_000_001, &mut middle).unwrap();
    assert_eq!(&middle[..], &data[1_000_001..1_000_778]);
    assert_eq!(c.file_size(&file).unwrap(), data.len() as u64);
    let epochs = c.list_epochs().unwrap();
    assert_eq!(epochs.len(), 1);
    assert_eq!(epochs[0].state, EpochState::Committed);
    assert_eq!(c.list_files(epoch).unwrap(), vec![("rank0".to_string(), data.len() as u64)]);
    c.delete_epoch(epoch).unwrap();
    assert!(c.list_epochs().unwrap().is_empty());
    drop(c);
    running.stop().unwrap();
}

#[test]
fn n_to_1_over_two_servers_striped_and_local() {
    let a = start(Arc::new(ModelBackend::new(1 << 30)));
    let b = start(Arc::new(ModelBackend::new(1 << 30)));
    let endpoints = vec![a.endpoints[0].clone(), b.endpoints[0].clone()];
    let unit = 64 * 1024;
    for (epoch, placement) in [(EpochId(7), None), (EpochId(8), Some(()))] {
        let block = 200_000usize; // not stripe-aligned on purpose
        let writers: Vec<_> = (0..3u32)
            .map(|rank| {
                let endpoints = endpoints.clone();
                std::thread::spawn(move || {
                    let placement = match placement {
                        None => Placement::Striped { stripe_unit_bytes: unit, stripe_count: 2 },
                        Some(()) => Placement::Local { rank },
                    };
                    let mut c = Client::connect(
                        &endpoints,
                        ClientOptions { placement, ..Default::default() },
                    )
                    .unwrap();
                    let mut file = c.create_file(epoch, "shared").unwrap();
                    let data = pattern(rank as u64 + epoch.0, block);
                    c.write(&mut file, rank as u64 * block as u64, &data).unwrap();
                    c.flush().unwrap();
                    c
                })
            })
            .collect();
        let mut clients: Vec<Client> = writers.into_iter().map(|t| t.join().unwrap()).collect();
        // The barrier is the join above; every rank commits.
        for c in &mut clients {
            c.commit_epoch(epoch).unwrap();
        }
        let placement = match placement {
            None => Placement::Striped { stripe_unit_bytes: unit, stripe_count: 2 },
            Some(()) => Placement::Local { rank: 99 },
        };
        let mut reader =
            Client::connect(&endpoints, ClientOptions { placement, ..Default::default() }).unwrap();
        let file = reader.open_file(epoch, "shared").unwrap();
        let mut back = vec![0; 3 * block];
        reader.read(&file, 0, &mut back).unwrap();
        for rank in 0..3 {
            let expected = pattern(rank as u64 + epoch.0, block);
            assert!(
                back[rank * block..(rank + 1) * block] == expected[..],
                "rank {rank} differs ({placement:?})"
            );
        }
        let summary = reader.list_epochs().unwrap().into_iter().find(|e| e.epoch == epoch).unwrap();
        assert_eq!(summary.servers, 2, "{placement:?} should use both servers");
    }
}

#[test]
fn garbage_gets_an_error_and_a_close_and_others_are_still_served() {
    let running = start(Arc::new(ModelBackend::new(1 << 30)));
    let mut good = client(&running, Placement::striped_default());
    let mut bad = tcp(&running);
    bad.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\0\0\0\0\0").unwrap();
    let (_, response, _) = receive(&mut bad);
    match response {
        Response::Error { code: ErrorCode::BadFrame, message } => {
            assert!(message.contains("magic"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    expect_closed(&mut bad);
    // A valid header but a body that does not decode: error reply, connection stays.
    let mut sloppy = tcp(&running);
    hello(&mut sloppy);
    frame::write_frame(&mut sloppy, Kind::Commit, 5, &[1, 2, 3], &[]).unwrap();
    let (id, response, _) = receive(&mut sloppy);
    assert_eq!(id, 5);
    assert!(matches!(response, Response::Error { code: ErrorCode::BadFrame, .. }), "{response:?}");
    send(&mut sloppy, 6, &Request::Status, &[]);
    assert!(matches!(receive(&mut sloppy), (6, Response::Status(_), _)));
    // Truncated frame then hang-up: the server just drops it.
    let mut truncated = tcp(&running);
    hello(&mut truncated);
    let full = Request::Write {
        epoch: EpochId(1),
        file: spillway_types::FileId(1),
        offset: 0,
        payload_crc32c: 0,
    }
    .encode_body();
    let header = frame::Header {
        kind: Kind::Write,
        request_id: 9,
        body_bytes: full.len() as u32,
        payload_bytes: 100,
    }
    .encode();
    truncated.write_all(&header).unwrap();
    truncated.write_all(&full[..5]).unwrap();
    drop(truncated);
    // Someone else is still served.
    let status = good.status().unwrap();
    assert!(status[0].requests_served >= 1);
}

#[test]
fn out_of_order_oversized_and_version_mismatch_are_refused() {
    let running = start(Arc::new(ModelBackend::new(1 << 30)));
    // Anything before Hello.
    let mut s = tcp(&running);
    send(&mut s, 3, &Request::Status, &[]);
    assert!(matches!(receive(&mut s).1, Response::Error { code: ErrorCode::OutOfOrder, .. }));
    expect_closed(&mut s);
    // A second Hello: error, connection stays.
    let mut s = tcp(&running);
    hello(&mut s);
    send(
        &mut s,
        2,
        &Request::Hello { version_min: 1, version_max: 1, client_name: "again".into() },
        &[],
    );
    assert!(matches!(receive(&mut s), (2, Response::Error { code: ErrorCode::OutOfOrder, .. }, _)));
    send(&mut s, 3, &Request::ListEpochs { from_epoch: EpochId(0) }, &[]);
    assert!(matches!(receive(&mut s), (3, Response::Epochs(_), _)));
    // A payload over the negotiated maximum: the stream cannot be trusted, error and close.
    let header = frame::Header {
        kind: Kind::Write,
        request_id: 4,
        body_bytes: 24,
        payload_bytes: (1 << 20) + 1,
    }
    .encode();
    s.write_all(&header).unwrap();
    assert!(matches!(receive(&mut s).1, Response::Error { code: ErrorCode::TooLarge, .. }));
    expect_closed(&mut s);
    // No common version.
    let mut s = tcp(&running);
    send(
        &mut s,
        1,
        &Request::Hello { version_min: 50, version_max: 60, client_name: "future".into() },
        &[],
    );
    match receive(&mut s).1 {
        Response::Error { code: ErrorCode::UnsupportedVersion, message } => {
            assert!(message.contains("50..=60"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    expect_closed(&mut s);
}

#[test]
fn full_store_applies_backpressure_then_fails_clearly() {
    let backend = Arc::new(ModelBackend::new(1 << 20));
    let running = start(backend.clone());
    let mut c = client(&running, Placement::striped_default());
    let mut old = c.create_file(EpochId(1), "old").unwrap();
    c.write(&mut old, 0, &pattern(1, 1 << 20)).unwrap();
    c.commit_epoch(EpochId(1)).unwrap();
    // Store full: a write with nobody freeing space fails after the bounded wait with ENOSPC.
    let mut new = c.create_file(EpochId(2), "new").unwrap();
    c.write(&mut new, 0, &pattern(2, 4096)).unwrap();
    let error = c.flush().unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::NoSpace), "{error}");
    assert_eq!(error.errno(), libc::ENOSPC);
    assert!(error.to_string().contains("after waiting"), "{error}");
    // The same write succeeds when another client frees space during the wait.
    let endpoints = running.endpoints.clone();
    let freer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let mut other = Client::connect(&endpoints, ClientOptions::default()).unwrap();
        other.delete_epoch(EpochId(1)).unwrap();
    });
    c.write(&mut new, 0, &pattern(2, 4096)).unwrap();
    c.flush().unwrap();
    freer.join().unwrap();
    assert_eq!(backend.used(), 4096);
}

#[test]
fn a_commit_whose_manifest_does_not_fit_says_so() {
    // Two servers filled to the last byte: the data fits, the epoch manifest (kept on every
    // server for a drain from the survivors of a lost one) does not, and the error says which.
    let a = start(Arc::new(ModelBackend::new(1 << 20)));
    let b = start(Arc::new(ModelBackend::new(1 << 20)));
    let endpoints = vec![a.endpoints[0].clone(), b.endpoints[0].clone()];
    let placement = Placement::Striped { stripe_unit_bytes: 64 * 1024, stripe_count: 2 };
    let mut c =
        Client::connect(&endpoints, ClientOptions { placement, ..Default::default() }).unwrap();
    let mut file = c.create_file(EpochId(3), "full").unwrap();
    c.write(&mut file, 0, &pattern(3, 2 << 20)).unwrap();
    c.flush().unwrap();
    let error = c.commit_epoch(EpochId(3)).unwrap_err();
    assert_eq!(error.errno(), libc::ENOSPC, "{error}");
    assert!(error.to_string().contains("storing the epoch manifest"), "{error}");
}

#[test]
fn memory_durability_seals_the_epoch_and_shutdown_syncs() {
    let backend = Arc::new(ModelBackend::new(1 << 30));
    let running = start(backend.clone());
    let options = ClientOptions { durability: Durability::Memory, ..Default::default() };
    let mut c = Client::connect(&running.endpoints, options).unwrap();
    let mut file = c.create_file(EpochId(3), "f").unwrap();
    c.write(&mut file, 0, b"hello").unwrap();
    c.commit_epoch(EpochId(3)).unwrap();
    // Sealed at once: a later write is refused (EROFS).
    c.write(&mut file, 5, b"late").unwrap();
    let error = c.flush().unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::EpochReadOnly), "{error}");
    // Shutdown syncs the store.
    drop(c);
    running.stop().unwrap();
    assert_eq!(backend.commits(), 1);
    assert_eq!(backend.syncs(), 1);
}

#[test]
fn shutdown_finishes_in_flight_writes() {
    let backend = Arc::new(ModelBackend::new(1 << 30));
    let running = start(backend.clone());
    let mut c = client(&running, Placement::striped_default());
    let mut file = c.create_file(EpochId(1), "f").unwrap();
    let data = pattern(5, 4 << 20);
    for (i, chunk) in data.chunks(256 << 10).enumerate() {
        c.write(&mut file, (i * (256 << 10)) as u64, chunk).unwrap();
    }
    // Writes are on the wire, some not yet acknowledged; stop the server now.
    running.handle.shutdown();
    c.flush().unwrap();
    drop(c);
    running.stop().unwrap();
    assert_eq!(backend.used(), data.len() as u64);
}

#[test]
fn unix_socket_identity_comes_from_the_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::Unix(dir.path().join("s.sock"));
    let running = start_with(
        options(),
        Arc::new(ModelBackend::new(1 << 20)),
        std::slice::from_ref(&endpoint),
    );
    let c = Client::connect(&[endpoint], ClientOptions::default()).unwrap();
    assert_eq!(c.identity(), (spillway_sys::user::uid(), spillway_sys::user::gid()));
    drop(c);
    running.stop().unwrap();
}

#[test]
fn connection_limit_is_enforced() {
    let running = start_with(
        ServerOptions { connections_max: 1, ..options() },
        Arc::new(ModelBackend::new(1 << 20)),
        &["127.0.0.1:0".parse().unwrap()],
    );
    let mut first = client(&running, Placement::striped_default());
    let error = Client::connect(&running.endpoints, ClientOptions::default())
        .err()
        .expect("second connection refused");
    assert_eq!(error.code(), Some(ErrorCode::Busy), "{error}");
    first.status().unwrap();
}

#[test]
fn listings_page_past_one_body() {
    let running = start(Arc::new(ModelBackend::new(1 << 30)));
    let mut c = client(&running, Placement::striped_default());
    // 2000 files with 40-byte names do not fit in one 64 KiB body.
    let names: Vec<String> =
        (0..2000).map(|i| format!("checkpoint/rank{i:06}/data-file-name.bin")).collect();
    for name in &names {
        let mut file = c.create_file(EpochId(1), name).unwrap();
        c.write(&mut file, 0, b"x").unwrap();
    }
    for epoch in 2..3000u64 {
        c.create_file(EpochId(epoch), "f").unwrap();
    }
    c.flush().unwrap();
    let listed = c.list_files(EpochId(1)).unwrap();
    assert_eq!(listed.len(), names.len());
    assert!(listed.iter().all(|(_, size)| *size == 1));
    assert_eq!(c.list_epochs().unwrap().len(), 2999);
}

#[test]
fn assigned_streams_reach_the_backend_and_other_epochs_keep_the_uid_stream() {
    let backend = Arc::new(ModelBackend::new(1 << 30));
    let running = start(Arc::clone(&backend));
    let mut c = client(&running, Placement::striped_default());
    let uid = c.identity().0;
    if uid != 0 {
        // Only root may assign streams; the refusal is checked instead.
        let error = c.assign_stream(EpochId(7), 3).unwrap_err();
        assert_eq!(error.errno(), libc::EACCES, "{error}");
        return;
    }
    // AssignStream changes the stream of a granted epoch only.
    let error = c.assign_stream(EpochId(7), 3).unwrap_err();
    assert_eq!(error.errno(), libc::ENOENT, "{error}");
    c.grant_epoch(EpochId(7), &EpochGrant { owner_uid: uid, owner_gid: uid, ..Default::default() })
        .unwrap();
    c.assign_stream(EpochId(7), 3).unwrap();
    assert_eq!(backend.grant(EpochId(7)).unwrap().stream, Some(3), "kept in the grant");
    assert!(
        c.assign_stream(EpochId(7), 1 << 63).is_err(),
        "a stream id with the tag bit is refused"
    );
    for epoch in [EpochId(7), EpochId(8)] {
        c.begin_epoch(epoch);
        let mut file = c.create_file(epoch, "rank0").unwrap();
        c.write(&mut file, 0, &pattern(epoch.0, 300_000)).unwrap();
        c.commit_epoch(epoch).unwrap();
    }
    assert_eq!(backend.write_streams(EpochId(7)), vec![StreamKey((1 << 63) | 3)]);
    assert_eq!(backend.write_streams(EpochId(8)), vec![StreamKey(uid as u64)]);
    drop(c);
    running.stop().unwrap();
}

/// A server over a real store (in simulated storage) with 64 MiB of DRAM: writes below the
/// high watermark are read off the socket straight into the ring.
fn start_store(options: ServerOptions) -> (Running, Arc<StoreBackend>) {
    let knobs = spillway_config::StoreKnobs {
        dram_bytes_max: 64 << 20,
        dram_prefault: false,
        ssd_bytes_max: 1 << 30,
        ..spillway_config::StoreKnobs::default()
    };
    let storage = spillway_store::SimStorage::new();
    let store =
        spillway_store::Store::open_with(&knobs, storage as Arc<dyn spillway_store::Storage>)
            .unwrap();
    let backend = Arc::new(StoreBackend::new(store));
    (start_with(options, backend.clone(), &["127.0.0.1:0".parse().unwrap()]), backend)
}

/// A write of `data` at `offset` of `file` in epoch 1, with the checksum of `data`.
fn write(file: spillway_types::FileId, offset: u64, data: &[u8]) -> Request {
    Request::Write { epoch: EpochId(1), file, offset, payload_crc32c: crc32c::crc32c(data) }
}

fn open_file(
    stream: &mut TcpStream,
    id: u64,
    epoch: EpochId,
    name: &str,
) -> spillway_types::FileId {
    send(stream, id, &Request::OpenFile { epoch, name: name.into(), create: true }, &[]);
    match receive(stream) {
        (got, Response::FileOpened { file, .. }, _) if got == id => file,
        other => panic!("{other:?}"),
    }
}

#[test]
fn placed_writes_keep_request_order_around_a_pipelined_commit() {
    let (running, backend) = start_store(options());
    let mut raw = tcp(&running);
    hello(&mut raw);
    let file = open_file(&mut raw, 2, EpochId(1), "f");
    // Write, commit, write, all pipelined: the reader has the second write's payload in store
    // memory before the executor commits, yet the commit neither waits for it nor takes it in,
    // and the late write is refused as a write after a commit is.
    let first = pattern(1, 512 << 10);
    send(&mut raw, 3, &write(file, 0, &first), &first);
    send(
        &mut raw,
        4,
        &Request::Commit {
            epoch: EpochId(1),
            durability: Durability::Ssd,
            participants: Vec::new(),
        },
        &[],
    );
    let late = pattern(2, 512 << 10);
    send(&mut raw, 5, &write(file, 1 << 20, &late), &late);
    assert!(matches!(receive(&mut raw), (3, Response::Written { bytes }, _) if bytes == 512 << 10));
    assert!(matches!(receive(&mut raw), (4, Response::Committed { .. }, _)));
    match receive(&mut raw) {
        (5, Response::Error { code: ErrorCode::EpochReadOnly, .. }, _) => {}
        other => panic!("late write: {other:?}"),
    }
    assert_eq!(backend.store().stat(EpochId(1), file).unwrap().size_bytes, 512 << 10);
    let mut back = vec![0u8; 512 << 10];
    backend.store().read(EpochId(1), file, 0, &mut back).unwrap();
    assert!(back == first);
    assert_eq!(
        backend.store().stats().write_through_records,
        0,
        "the writes did not go through DRAM"
    );
    backend.store().check_invariants();
}

#[test]
fn a_client_that_stalls_or_dies_mid_payload_leaves_nothing_behind() {
    let (running, backend) =
        start_store(ServerOptions { frame_stall: Duration::from_millis(300), ..options() });
    let header_and_half = |stream: &mut TcpStream, id: u64, file| {
        // Half the payload arrives, so the checksum is never compared.
        let body =
            Request::Write { epoch: EpochId(1), file, offset: 0, payload_crc32c: 0 }.encode_body();
        let header = frame::Header {
            kind: Kind::Write,
            request_id: id,
            body_bytes: body.len() as u32,
            payload_bytes: 1 << 20,
        }
        .encode();
        stream.write_all(&header).unwrap();
        stream.write_all(&body).unwrap();
        stream.write_all(&pattern(3, 512 << 10)).unwrap();
    };
    let mut stalled = tcp(&running);
    hello(&mut stalled);
    let file = open_file(&mut stalled, 2, EpochId(1), "f");
    header_and_half(&mut stalled, 3, file);
    let mut dying = tcp(&running);
    hello(&mut dying);
    header_and_half(&mut dying, 3, file);
    drop(dying);
    // Others are served meanwhile.
    let mut good = client(&running, Placement::striped_default());
    let mut other = good.create_file(EpochId(2), "g").unwrap();
    good.write(&mut other, 0, &pattern(4, 1 << 20)).unwrap();
    good.commit_epoch(EpochId(2)).unwrap();
    // The stalled connection is cut after frame_stall, and neither half write was stored.
    expect_closed(&mut stalled);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while backend.usage().dram_bytes_used > 1 << 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "abandoned writes still hold DRAM: {:?}",
            backend.usage()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(backend.store().stat(EpochId(1), file).is_some_and(|info| info.size_bytes == 0));
    backend.store().check_invariants();
}

/// A grant from root (the manager) sets who owns the epoch, its capacity here and its stream;
/// a write that would take the epoch past that capacity fails with EDQUOT and writes nothing,
/// on the placed path (straight into DRAM) and the buffered one alike.
#[test]
fn a_write_past_the_granted_capacity_fails_with_edquot_and_writes_nothing() {
    let (running, backend) = start_store(options());
    // Each write below is one request (a request is refused whole; a larger client write is
    // several requests, and those before the limit are stored).
    let options = ClientOptions {
        placement: Placement::Striped { stripe_unit_bytes: 4 << 20, stripe_count: 1 },
        transfer_bytes_max: 1 << 20,
        ..Default::default()
    };
    let mut c = Client::connect(&running.endpoints, options).unwrap();
    assert_eq!(c.identity().0, 0, "the protocol tests run as root (they grant epochs)");
    let epoch = EpochId(5);
    let grant = EpochGrant {
        owner_uid: 1000,
        owner_gid: 1000,
        capacity_bytes: 1 << 20,
        reservation_capacity_bytes: 4 << 20,
        stream: Some(2),
        ..EpochGrant::default()
    };
    c.grant_epoch(epoch, &grant).unwrap();
    assert_eq!(backend.grant(epoch), Some(grant.clone()));
    let first = pattern(7, 768 << 10);
    let mut file = c.create_file(epoch, "ckpt").unwrap();
    c.write(&mut file, 0, &first).unwrap();
    c.flush().unwrap();
    c.write(&mut file, 768 << 10, &pattern(8, 512 << 10)).unwrap();
    let error = c.flush().unwrap_err();
    assert_eq!(error.errno(), libc::EDQUOT, "{error}");
    assert!(error.to_string().contains("granted capacity"), "{error}");
    let listed = c.list_epochs().unwrap();
    assert_eq!(listed.iter().find(|e| e.epoch == epoch).unwrap().bytes, 768 << 10);
    let mut back = vec![0u8; 1 << 20];
    c.read(&file, 0, &mut back).unwrap();
    assert!(back[..768 << 10] == first[..] && back[768 << 10..].iter().all(|&b| b == 0));
    // The grant's stream took the writes; a revoked grant leaves the epoch to root alone.
    let written = backend.store().stream_usage_bytes(spillway_server::assigned_stream_key(2));
    assert!(written >= 768 << 10, "{written}");
    // What the revoke reports of the epoch since its grant: the stored write, not the refused
    // one; the read; the create, list and the read's lookups as metadata.
    let seen = c.revoke_epoch(epoch).unwrap();
    assert_eq!(backend.grant(epoch), None);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].bytes_written, 768 << 10, "{seen:?}");
    assert!(seen[0].write_ops >= 1 && seen[0].read_ops >= 1, "{seen:?}");
    assert!(seen[0].bytes_read >= 768 << 10, "{seen:?}");
    assert!(seen[0].metadata_ops >= 1 && seen[0].busy_ms >= 100, "{seen:?}");
    let again = c.revoke_epoch(epoch).unwrap();
    assert_eq!(again[0], spillway_proto::EpochActivity::default(), "no grant, nothing counted");
    drop(c);
    running.stop().unwrap();
}

/// An unmanaged server records the first creator's claim as a grant; a managed one takes root's
/// data in an ungranted epoch without claiming it (only the manager's grant says whose it is).
#[test]
fn claims_are_grants_on_an_unmanaged_server_and_absent_on_a_managed_one() {
    for managed in [false, true] {
        let (running, backend) = start_store(ServerOptions { managed, ..options() });
        let mut c = client(&running, Placement::striped_default());
        let mut file = c.create_file(EpochId(9), "f").unwrap();
        c.write(&mut file, 0, b"root's bytes").unwrap();
        c.commit_epoch(EpochId(9)).unwrap();
        let claimed = backend.grant(EpochId(9));
        if managed {
            assert_eq!(claimed, None, "a managed server never claims");
        } else {
            let root_claim = EpochGrant { owner_uid: 0, owner_gid: 0, ..EpochGrant::default() };
            assert_eq!(claimed, Some(root_claim));
        }
        // The manager's grant replaces a claim; repeating it writes nothing more.
        let grant = EpochGrant { owner_uid: 1000, owner_gid: 1000, ..EpochGrant::default() };
        c.grant_epoch(EpochId(9), &grant).unwrap();
        let metadata = backend.store().stats().metadata_bytes;
        c.grant_epoch(EpochId(9), &grant).unwrap();
        assert_eq!(backend.store().stats().metadata_bytes, metadata, "idempotent");
        assert_eq!(backend.grant(EpochId(9)), Some(grant));
        drop(c);
        running.stop().unwrap();
    }
}

/// Sends `data` as a write at `offset` whose checksum is that of `data` with one byte flipped:
/// what a payload corrupted between the client's buffer and the server's memory looks like.
fn send_corrupted(
    stream: &mut TcpStream,
    id: u64,
    file: spillway_types::FileId,
    offset: u64,
    data: &[u8],
) {
    let mut checksummed = data.to_vec();
    checksummed[data.len() / 2] ^= 0x10;
    send(stream, id, &write(file, offset, &checksummed), data);
}

fn expect_checksum_mismatch(stream: &mut TcpStream, id: u64, offset: u64) {
    match receive(stream) {
        (got, Response::Error { code: ErrorCode::ChecksumMismatch, message }, _) if got == id => {
            assert!(
                message.contains("epoch 1")
                    && message.contains(&format!("offset {offset}"))
                    && message.contains("nothing was written"),
                "the error does not name the write: {message}"
            );
        }
        other => panic!("corrupt payload at {offset}: {other:?}"),
    }
}

/// A server on the real store (in simulated storage) whose records hold at most 64 KiB, so a
/// write of a few hundred KiB is several ring records.
fn start_store_with_64k_records() -> (Running, Arc<StoreBackend>) {
    let knobs = spillway_config::StoreKnobs {
        dram_bytes_max: 64 << 20,
        dram_prefault: false,
        ssd_bytes_max: 1 << 30,
        record_payload_bytes_max: 64 << 10,
        ..spillway_config::StoreKnobs::default()
    };
    let storage = spillway_store::SimStorage::new();
    let store =
        spillway_store::Store::open_with(&knobs, storage as Arc<dyn spillway_store::Storage>)
            .unwrap();
    let backend = Arc::new(StoreBackend::new(store));
    let running = start_with(options(), backend.clone(), &["127.0.0.1:0".parse().unwrap()]);
    (running, backend)
}

#[test]
fn a_payload_that_differs_from_its_checksum_is_refused_whole_in_the_store_slot() {
    // Records of 64 KiB: a 512 KiB write is eight ring records whose CRCs must combine to the
    // client's.
    let (running, backend) = start_store_with_64k_records();
    let mut raw = tcp(&running);
    hello(&mut raw);
    let file = open_file(&mut raw, 2, EpochId(1), "f");
    let first = pattern(1, 512 << 10);
    send(&mut raw, 3, &write(file, 0, &first), &first);
    assert!(matches!(receive(&mut raw), (3, Response::Written { bytes }, _) if bytes == 512 << 10));
    let stats = backend.store().stats();
    let free = backend.store().free_bytes();
    // An overwrite of the same range and a write past it, both corrupted in flight.
    send_corrupted(&mut raw, 4, file, 0, &pattern(2, 512 << 10));
    send_corrupted(&mut raw, 5, file, 1 << 20, &pattern(3, 100 << 10));
    expect_checksum_mismatch(&mut raw, 4, 0);
    expect_checksum_mismatch(&mut raw, 5, 1 << 20);
    // The connection stays usable, and nothing of either write was admitted.
    send(&mut raw, 6, &Request::Status, &[]);
    assert!(matches!(receive(&mut raw), (6, Response::Status(_), _)));
    let after = backend.store().stats();
    assert_eq!(after.user_payload_bytes, stats.user_payload_bytes);
    // The refused slots' ring space turned dead (it is reclaimed once the tail passes it) and
    // their capacity returned.
    assert_eq!(backend.store().free_bytes(), free, "the refused slots kept their capacity");
    assert_eq!(backend.store().stat(EpochId(1), file).unwrap().size_bytes, 512 << 10);
    let mut back = vec![0u8; 512 << 10];
    backend.store().read(EpochId(1), file, 0, &mut back).unwrap();
    assert!(back == first, "a refused overwrite changed the file");
    backend.store().check_invariants();
    // Damage after ingest: a read of the damaged record is an error naming it, never bytes.
    backend.store().inject_corruption(EpochId(1), file, 200_000).unwrap().unwrap();
    send(&mut raw, 7, &Request::Read { epoch: EpochId(1), file, offset: 196_608, length: 10 }, &[]);
    match receive(&mut raw) {
        (7, Response::Error { code: ErrorCode::ChecksumMismatch, message }, payload) => {
            assert!(payload.is_empty());
            assert!(message.contains("epoch 1 file 1 bytes 196608..262144"), "{message}");
        }
        other => panic!("read of a damaged record: {other:?}"),
    }
    assert_eq!(ErrorCode::ChecksumMismatch.errno(), libc::EIO);
}

fn extents_of(pieces: &[(u64, Vec<u8>)]) -> Vec<WriteExtent> {
    pieces
        .iter()
        .map(|(offset, data)| WriteExtent {
            offset: *offset,
            length: data.len() as u32,
            crc32c: crc32c::crc32c(data),
        })
        .collect()
}

fn read_raw(
    stream: &mut TcpStream,
    id: u64,
    file: spillway_types::FileId,
    offset: u64,
    length: u32,
) -> Vec<u8> {
    send(stream, id, &Request::Read { epoch: EpochId(1), file, offset, length }, &[]);
    match receive(stream) {
        (got, Response::ReadData { .. }, payload) if got == id => payload,
        other => panic!("read at {offset}: {other:?}"),
    }
}

/// `WriteExtents` against `running`: the extents land where they say (a 100 KiB one spanning
/// two 64 KiB records between 4 KiB ones, the last overlapping nothing), a frame with one
/// corrupt extent or with lengths that do not add up to its payload is refused whole, and the
/// connection stays usable.
fn write_extents_land_or_are_refused_whole(running: &Running) {
    let mut raw = tcp(running);
    hello(&mut raw);
    let file = open_file(&mut raw, 2, EpochId(1), "strided");
    let pieces =
        [(0u64, pattern(1, 4096)), (65_536, pattern(2, 100 << 10)), (8192, pattern(3, 4096))];
    let payload: Vec<u8> = pieces.iter().flat_map(|(_, d)| d.clone()).collect();
    let request = Request::WriteExtents { epoch: EpochId(1), file, extents: extents_of(&pieces) };
    send(&mut raw, 3, &request, &payload);
    assert!(
        matches!(receive(&mut raw), (3, Response::Written { bytes }, _) if bytes as usize == payload.len())
    );
    let later = [(1u64 << 20, pattern(4, 4096)), (2 << 20, pattern(5, 4096))];
    let later_payload: Vec<u8> = later.iter().flat_map(|(_, d)| d.clone()).collect();
    let mut corrupt = extents_of(&later);
    corrupt[1].crc32c ^= 1;
    send(
        &mut raw,
        4,
        &Request::WriteExtents { epoch: EpochId(1), file, extents: corrupt },
        &later_payload,
    );
    expect_checksum_mismatch(&mut raw, 4, 2 << 20);
    let mut short = extents_of(&later);
    short[0].length -= 1;
    send(
        &mut raw,
        5,
        &Request::WriteExtents { epoch: EpochId(1), file, extents: short },
        &later_payload,
    );
    match receive(&mut raw) {
        (5, Response::Error { code: ErrorCode::BadFrame, message }, _) => {
            assert!(message.contains("add up to 8191 bytes but the payload has 8192"), "{message}")
        }
        other => panic!("extents that do not add up: {other:?}"),
    }
    let back = read_raw(&mut raw, 6, file, 0, 65_536 + (100 << 10));
    assert!(back[..4096] == pieces[0].1[..], "first extent");
    assert!(back[4096..8192].iter().all(|&b| b == 0), "the hole between the extents");
    assert!(back[8192..12_288] == pieces[2].1[..], "third extent");
    assert!(back[12_288..65_536].iter().all(|&b| b == 0), "the hole before the second");
    assert!(back[65_536..] == pieces[1].1[..], "second extent");
    for (id, (offset, _)) in (7..).zip(&later) {
        let back = read_raw(&mut raw, id, file, *offset, 4096);
        assert!(back.iter().all(|&b| b == 0), "a refused frame wrote at {offset}");
    }
}

#[test]
fn write_extents_land_or_are_refused_whole_in_store_slots_and_pooled_buffers() {
    let (running, backend) = start_store_with_64k_records();
    write_extents_land_or_are_refused_whole(&running);
    assert_eq!(backend.store().stats().write_through_records, 0, "the slots were not used");
    backend.store().check_invariants();
    // The model backend never offers a slot: every extent is written from a pooled buffer,
    // and the model checks it gets the CRC of each of its 64 KiB pieces.
    write_extents_land_or_are_refused_whole(&start(Arc::new(ModelBackend::new(1 << 30))));
}

#[test]
fn a_payload_that_differs_from_its_checksum_is_refused_whole_in_a_pooled_buffer() {
    // The model backend never offers a slot: every payload goes through a pooled buffer, and
    // the model checks it gets the CRC of each of its 64 KiB pieces.
    let backend = Arc::new(ModelBackend::new(1 << 30));
    let running = start(backend.clone());
    let mut raw = tcp(&running);
    hello(&mut raw);
    send(
        &mut raw,
        2,
        &Request::OpenFile { epoch: EpochId(1), name: "f".into(), create: true },
        &[],
    );
    let file = match receive(&mut raw) {
        (2, Response::FileOpened { file, .. }, _) => file,
        other => panic!("{other:?}"),
    };
    let data = pattern(4, 300 << 10);
    send_corrupted(&mut raw, 3, file, 4096, &data);
    expect_checksum_mismatch(&mut raw, 3, 4096);
    assert_eq!(backend.used(), 0, "a refused payload reached the backend");
    send(&mut raw, 4, &write(file, 4096, &data), &data);
    assert!(matches!(receive(&mut raw), (4, Response::Written { bytes }, _) if bytes == 300 << 10));
    assert_eq!(backend.used(), 300 << 10);
}

/// Issue 23: `Client::sync_files` (the mount's `fsync` of one file) sends `Sync` only to the
/// servers holding writes of that file no sync covered yet, none when there are none, while
/// the manifest of what the client wrote still reaches every server; `sync_epoch` still asks
/// every server the client wrote the epoch to.
#[test]
fn syncing_one_file_asks_only_the_servers_holding_its_unsynced_writes() {
    let backends = [Arc::new(ModelBackend::new(1 << 30)), Arc::new(ModelBackend::new(1 << 30))];
    let running: Vec<Running> = backends.iter().map(|b| start(b.clone())).collect();
    let endpoints: Vec<Endpoint> = running.iter().map(|r| r.endpoints[0].clone()).collect();
    // A stripe set of one server: every byte of a file is on its first server.
    let placement = Placement::Striped { stripe_unit_bytes: 1 << 20, stripe_count: 1 };
    let named_on = |server: usize| {
        (0..)
            .map(|i| format!("file-{i}."))
            .find(|n| spillway_client::placement::first_server(n, 2) == server)
            .unwrap()
    };
    let (on_0, on_1) = (named_on(0), named_on(1));
    let mut c =
        Client::connect(&endpoints, ClientOptions { placement, ..Default::default() }).unwrap();
    let epoch = EpochId(23);
    let syncs = || [backends[0].syncs(), backends[1].syncs()];
    let mut file_0 = c.create_file(epoch, &on_0).unwrap();
    let mut file_1 = c.create_file(epoch, &on_1).unwrap();
    c.write(&mut file_0, 0, b"held by server 0").unwrap();
    c.write(&mut file_1, 0, b"held by server 1").unwrap();

    c.sync_files(epoch, &on_0).unwrap();
    assert_eq!(syncs(), [1, 0], "only the holder of the file's unsynced writes is asked");
    for endpoint in &endpoints {
        let mut alone =
            Client::connect(std::slice::from_ref(endpoint), ClientOptions::default()).unwrap();
        assert_eq!(
            alone.list_manifests(epoch).unwrap().len(),
            1,
            "the manifest reaches {endpoint} too (an epoch sealed by someone else needs it)"
        );
    }
    c.sync_files(epoch, &on_0).unwrap();
    assert_eq!(syncs(), [1, 0], "nothing unsynced: no Sync at all");
    c.sync_files(epoch, &on_1).unwrap();
    assert_eq!(syncs(), [1, 1]);

    c.write(&mut file_0, 100, b"more").unwrap();
    c.sync_files(epoch, &on_1).unwrap();
    assert_eq!(syncs(), [1, 1], "the other file's new write is not this file's");
    c.sync_files(epoch, "file-").unwrap();
    assert_eq!(syncs(), [2, 1], "a prefix covering both files asks the one holding new writes");
    c.sync_epoch(epoch).unwrap();
    assert_eq!(syncs(), [3, 2], "sync_epoch asks every server written to, as before");
    let mut back = vec![0u8; 4];
    c.read(&file_0, 100, &mut back).unwrap();
    assert_eq!(&back, b"more");
}
