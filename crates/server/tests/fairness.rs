//! Fairness under hostile load, against an in-process server over the real store (files in a
//! temporary directory), a real `munged` (`spillway_harness::Munged`) and real unprivileged
//! users (`spillway_harness::TestUser`, this test binary re-executed as them through setpriv):
//! silent handshakes and idle connections are closed, a payload trickled below
//! `frame_bytes_per_second_min` is dropped and its budget released, one uid over
//! `connections_per_user_max` is refused while another still connects, and a well-behaved
//! client finishes its checkpoint while hundreds of idle and slow connections are attached.
//! Bounds are generous and nothing asserts a throughput. Needs root (it creates users).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{pattern, same_bytes, Munged, TestUser};
use spillway_proto::auth::credential_payload;
use spillway_proto::frame::{self, Header, Kind};
use spillway_proto::{
    AuthMethod, Durability, Endpoint, ErrorCode, Request, Response, CHALLENGE_BYTES,
    PROTOCOL_VERSION,
};
use spillway_server::{Fairness, Server, ServerOptions, ShutdownHandle, StoreBackend};
use spillway_types::EpochId;

mod log_capture;

const MIB: u64 = 1 << 20;
/// Set in a re-executed child: `<unix socket> <connections to open>`.
const CHILD_ENV: &str = "SPILLWAY_FAIRNESS_CHILD";

/// The first log line containing every needle, waited for up to 20 s.
fn logged(needles: &[&str]) -> String {
    log_capture::logged_within(needles, Duration::from_secs(20))
}

fn must_be_root() {
    assert_eq!(
        spillway_sys::user::euid(),
        0,
        "the fairness tests run as root (they create users and act as them); run them as root, as CI does"
    );
}

fn options(munged: Option<&Munged>, fairness: Fairness) -> ServerOptions {
    ServerOptions {
        server_name: "fairness-test".into(),
        failure_domain: "fairness-test-host".into(),
        connections_max: 512,
        payload_bytes_max: 16 << 20,
        in_flight_requests_max: 16,
        in_flight_bytes_max: 32 << 20,
        backpressure_wait: Duration::from_secs(10),
        default_durability: Durability::Ssd,
        shutdown_grace: Duration::from_secs(2),
        frame_stall: Duration::from_secs(30),
        managed: false,
        auth: if munged.is_some() { AuthMethod::Munge } else { AuthMethod::None },
        munge_socket: munged.map(|m| m.socket().to_path_buf()),
        fairness,
    }
}

/// A server over the real store in `dir`, on loopback TCP and a Unix socket anyone may use.
struct Running {
    tcp: std::net::SocketAddr,
    unix: PathBuf,
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

impl Running {
    fn tcp_endpoint(&self) -> Endpoint {
        Endpoint::Tcp(self.tcp)
    }
    fn unix_endpoint(&self) -> Endpoint {
        Endpoint::Unix(self.unix.clone())
    }
}

fn start(dir: &Path, options: ServerOptions) -> Running {
    use std::os::unix::fs::PermissionsExt;
    log_capture::captured();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let knobs = spillway_config::StoreKnobs {
        ssd_directory: dir.join("ssd").display().to_string(),
        dram_bytes_max: 128 * MIB,
        dram_prefault: false,
        ssd_bytes_max: 4 << 30,
        ..spillway_config::StoreKnobs::default()
    };
    let store = spillway_store::Store::open(&knobs).unwrap();
    let backend = Arc::new(StoreBackend::new(store));
    let unix = dir.join("server.sock");
    let endpoints = ["127.0.0.1:0".parse().unwrap(), Endpoint::Unix(unix.clone())];
    let server = Server::bind(options, backend, &endpoints, false).unwrap();
    // Users reach the socket; the kernel still tells the server who they are.
    std::fs::set_permissions(&unix, std::fs::Permissions::from_mode(0o666)).unwrap();
    let Endpoint::Tcp(tcp) = server.endpoints()[0] else { panic!("TCP first") };
    let handle = server.shutdown_handle();
    let thread = Some(std::thread::spawn(move || server.run().unwrap()));
    Running { tcp, unix, handle, thread }
}

fn send(stream: &mut TcpStream, id: u64, request: &Request) {
    frame::write_frame(stream, request.kind(), id, &request.encode_body(), &[]).unwrap();
}

fn receive(stream: &mut TcpStream) -> (u64, Response) {
    let mut body = Vec::new();
    let header = frame::read_header_and_body(stream, &mut body, 32 << 20).unwrap();
    (header.request_id, Response::decode(header.kind, &body).unwrap())
}

fn raw(running: &Running) -> TcpStream {
    let stream = TcpStream::connect(running.tcp).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream
}

/// Hello (and with `munged`, Authenticate as this process's uid) on a raw connection.
fn handshake(stream: &mut TcpStream, munged: Option<&Munged>) {
    let hello = Request::Hello {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        client_name: "raw".into(),
    };
    send(stream, 1, &hello);
    let challenge: [u8; CHALLENGE_BYTES] = match receive(stream) {
        (1, Response::Hello { challenge, .. }) => challenge,
        other => panic!("{other:?}"),
    };
    if let Some(munged) = munged {
        let credential = munged.context().encode(&credential_payload(&challenge)).unwrap();
        send(stream, 2, &Request::Authenticate { credential });
        assert!(matches!(receive(stream), (2, Response::Authenticated { .. })));
    }
}

/// Waits until the server closes `stream` (end of stream or reset), at most `within`.
fn closed_within(stream: &mut TcpStream, within: Duration) -> Duration {
    let started = Instant::now();
    stream.set_read_timeout(Some(within)).unwrap();
    let mut sink = [0u8; 4096];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return started.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return started.elapsed(),
            // A signal to this test process (another test's child exiting) is no answer.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("not closed within {within:?}: {e}"),
        }
    }
}

#[test]
fn a_silent_or_trickled_handshake_is_closed_at_the_handshake_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let fairness =
        Fairness { handshake_timeout: Duration::from_millis(500), ..Fairness::default() };
    let running = start(dir.path(), options(None, fairness));
    let mut silent = raw(&running);
    let peer = format!("tcp://{}", silent.local_addr().unwrap());
    closed_within(&mut silent, Duration::from_secs(10));
    let line = logged(&[&peer, "handshake not completed within 500 ms"]);
    assert!(line.contains("WARN"), "{line}");
    // A Hello sent a byte at a time, each in time for the stall bound, still has its deadline.
    let mut trickled = raw(&running);
    let hello = Request::Hello {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        client_name: "slow".into(),
    };
    let mut bytes = Vec::new();
    frame::write_frame(&mut bytes, hello.kind(), 1, &hello.encode_body(), &[]).unwrap();
    let started = Instant::now();
    let mut refused = false;
    for byte in bytes {
        if trickled.write_all(&[byte]).is_err() {
            refused = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !refused {
        let mut rest = Vec::new();
        let _ = trickled.read_to_end(&mut rest);
    }
    assert!(started.elapsed() < Duration::from_secs(20));
    // A connection that shakes hands in time is served.
    let mut client = Client::connect(&[running.tcp_endpoint()], ClientOptions::default()).unwrap();
    client.list_epochs().unwrap();
}

#[test]
fn an_idle_connection_is_closed_at_the_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let fairness = Fairness { idle_timeout: Duration::from_millis(700), ..Fairness::default() };
    let running = start(dir.path(), options(None, fairness));
    let mut idle = raw(&running);
    handshake(&mut idle, None);
    let peer = format!("tcp://{}", idle.local_addr().unwrap());
    let after = closed_within(&mut idle, Duration::from_secs(10));
    assert!(after >= Duration::from_millis(500), "closed after {after:?}, before the timeout");
    logged(&[&peer, "idle for 700 ms with no request in flight"]);
    // The client library opens a connection the server closed while quiet again, for writes,
    // calls and reads alike: an application checkpointing every hour keeps working.
    let mut client = Client::connect(
        &[running.tcp_endpoint()],
        ClientOptions { placement: Placement::striped_default(), ..ClientOptions::default() },
    )
    .unwrap();
    checkpoint(&mut client, EpochId(3), 4 * MIB);
    std::thread::sleep(Duration::from_millis(1500));
    let reopened = client.open_file(EpochId(3), "checkpoint").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut back = vec![0u8; MIB as usize];
    client.read(&reopened, MIB, &mut back).unwrap();
    assert!(same_bytes(&back, &pattern(3, 4 * MIB as usize)[MIB as usize..2 * MIB as usize]));
    std::thread::sleep(Duration::from_millis(1500));
    checkpoint(&mut client, EpochId(4), 4 * MIB);
    let closures = String::from_utf8_lossy(&log_capture::captured().lock().unwrap())
        .matches("idle for 700 ms with no request in flight")
        .count();
    assert!(closures >= 4, "the server closed the quiet client only {} times", closures - 1);
    // A client that keeps asking is not idle.
    let mut busy = raw(&running);
    handshake(&mut busy, None);
    for id in 10..20 {
        send(&mut busy, id, &Request::ListEpochs { from_epoch: EpochId(0) });
        assert!(matches!(receive(&mut busy), (got, Response::Epochs(_)) if got == id));
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Opens a file of `epoch` on a raw connection, then sends the header and body of a write of
/// `payload_bytes` whose CRC32C is `payload_crc32c` and returns; the caller sends (or
/// trickles) the payload.
fn start_write(
    stream: &mut TcpStream,
    epoch: EpochId,
    name: &str,
    payload_bytes: u32,
    payload_crc32c: u32,
) {
    send(stream, 3, &Request::OpenFile { epoch, name: name.into(), create: true });
    let file = match receive(stream) {
        (3, Response::FileOpened { file, .. }) => file,
        other => panic!("{other:?}"),
    };
    let write = Request::Write { epoch, file, offset: 0, payload_crc32c };
    let body = write.encode_body();
    let header =
        Header { kind: Kind::Write, request_id: 4, body_bytes: body.len() as u32, payload_bytes };
    stream.write_all(&header.encode()).unwrap();
    stream.write_all(&body).unwrap();
}

/// Sends one byte every `every` until the server closes the connection; the time that took.
fn trickle_until_closed(mut stream: TcpStream, every: Duration, within: Duration) -> Duration {
    let started = Instant::now();
    stream.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    let mut sink = [0u8; 1024];
    while started.elapsed() < within {
        if stream.write_all(&[0x5a]).is_err() {
            return started.elapsed();
        }
        match stream.read(&mut sink) {
            Ok(0) => return started.elapsed(),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return started.elapsed(),
            _ => {}
        }
        std::thread::sleep(every);
    }
    panic!("a payload trickled at one byte per {every:?} was not cut off within {within:?}");
}

/// Writes `bytes` to `epoch` (one file, 1 MiB writes), commits at ssd, reads a sample back.
fn checkpoint(client: &mut Client, epoch: EpochId, bytes: u64) {
    let data = pattern(epoch.0, bytes as usize);
    client.begin_epoch(epoch);
    let mut file = client.create_file(epoch, "checkpoint").unwrap();
    for (i, chunk) in data.chunks(MIB as usize).enumerate() {
        client.write(&mut file, i as u64 * MIB, chunk).unwrap();
    }
    client.commit_epoch(epoch).unwrap();
    let reopened = client.open_file(epoch, "checkpoint").unwrap();
    let mut back = vec![0u8; MIB as usize];
    let at = bytes / 2;
    client.read(&reopened, at, &mut back).unwrap();
    assert!(same_bytes(&back, &data[at as usize..at as usize + MIB as usize]));
}

#[test]
fn a_trickled_payload_is_cut_off_and_its_budget_released() {
    let dir = tempfile::tempdir().unwrap();
    let fairness = Fairness {
        frame_bytes_per_second_min: MIB,
        frame_rate_window: Duration::from_millis(500),
        ..Fairness::default()
    };
    // The whole write budget is one payload: a slow sender that kept it would stop everyone.
    let running = start(
        dir.path(),
        ServerOptions { in_flight_bytes_max: 16 << 20, ..options(None, fairness) },
    );
    let mut slow = raw(&running);
    handshake(&mut slow, None);
    let peer = format!("tcp://{}", slow.local_addr().unwrap());
    // The payload never arrives whole, so its checksum is never compared.
    start_write(&mut slow, EpochId(7), "slow", 16 << 20, 0);
    // One byte every 100 ms: well inside frame_stall_ms_max, far below the minimum pace.
    let took = trickle_until_closed(slow, Duration::from_millis(100), Duration::from_secs(20));
    assert!(took < Duration::from_secs(10), "cut off after {took:?}");
    logged(&[&peer, "server.frame_bytes_per_second_min"]);
    // Its budget is free again: a full-size write goes through.
    let mut client = Client::connect(
        &[running.tcp_endpoint()],
        ClientOptions { placement: Placement::striped_default(), ..ClientOptions::default() },
    )
    .unwrap();
    checkpoint(&mut client, EpochId(8), 32 * MIB);
    // A sender that keeps up is not cut off by the measurement.
    let mut fast = raw(&running);
    handshake(&mut fast, None);
    let payload = pattern(9, 4 << 20);
    start_write(&mut fast, EpochId(9), "fast", 4 << 20, crc32c::crc32c(&payload));
    for chunk in payload.chunks(256 << 10) {
        fast.write_all(chunk).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(matches!(receive(&mut fast), (4, Response::Written { .. })));
}

/// A child process (this test binary, re-executed as `user`) holding `count` connections to
/// the Unix socket until its stdin closes; stdout says how many were admitted.
struct Holder {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Holder {
    fn spawn(user: &TestUser, socket: &Path, count: u32) -> Holder {
        let mut child = user
            .command(std::env::current_exe().unwrap())
            .args(["--exact", "child_holds_connections", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{} {count}", socket.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Holder { child, stdout }
    }

    /// The child's report: (admitted, refused, first refusal message).
    fn report(&mut self) -> (u32, u32, String) {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "the child exited without a report");
            // libtest prints the test's name on the same line before it.
            if let Some((_, rest)) = line.trim().split_once("HOLDING ") {
                let mut parts = rest.splitn(3, ' ');
                let admitted = parts.next().unwrap().parse().unwrap();
                let refused = parts.next().unwrap().parse().unwrap();
                return (admitted, refused, parts.next().unwrap_or("").to_string());
            }
        }
    }

    /// Closes its stdin: it drops its connections and exits, successfully.
    fn release(mut self) {
        drop(self.child.stdin.take());
        let mut rest = String::new();
        let _ = self.stdout.read_to_string(&mut rest);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "child failed: {rest}");
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The re-executed child (does nothing unless `CHILD_ENV` is set).
#[test]
fn child_holds_connections() {
    let Ok(what) = std::env::var(CHILD_ENV) else { return };
    let (socket, count) = what.split_once(' ').unwrap();
    let endpoint = Endpoint::Unix(PathBuf::from(socket));
    let mut held = Vec::new();
    let (mut refused, mut first_refusal) = (0, String::new());
    for _ in 0..count.parse::<u32>().unwrap() {
        match Client::connect(std::slice::from_ref(&endpoint), ClientOptions::default()) {
            Ok(client) => held.push(client),
            Err(error) => {
                assert_eq!(error.code(), Some(ErrorCode::Busy), "{error}");
                if refused == 0 {
                    first_refusal = error.to_string().replace('\n', " ");
                }
                refused += 1;
            }
        }
    }
    println!("HOLDING {} {refused} {first_refusal}", held.len());
    std::io::stdout().flush().unwrap();
    let mut sink = String::new();
    let _ = std::io::stdin().read_to_string(&mut sink);
    drop(held);
}

#[test]
fn one_uid_over_its_connection_cap_is_refused_while_another_uid_connects() {
    must_be_root();
    let (hog, other) =
        (TestUser::create("spw-fair-hog").unwrap(), TestUser::create("spw-fair-other").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let fairness = Fairness { connections_per_user_max: 8, ..Fairness::default() };
    let running = start(dir.path(), options(None, fairness));
    let mut hogging = Holder::spawn(&hog, &running.unix, 40);
    let (admitted, refused, message) = hogging.report();
    assert_eq!((admitted, refused), (8, 32), "{message}");
    assert!(message.contains("server.connections_per_user_max"), "{message}");
    assert!(message.contains(&format!("uid {}", hog.uid)), "{message}");
    logged(&["refusing connection: over a limit", &format!("uid {} already has 8", hog.uid)]);
    // Another uid is not affected, nor is root.
    let mut second = Holder::spawn(&other, &running.unix, 2);
    assert_eq!(second.report().0, 2);
    second.release();
    Client::connect(&[running.unix_endpoint()], ClientOptions::default()).unwrap();
    // Once the hog lets go, its places are free again.
    hogging.release();
    let mut again = Holder::spawn(&hog, &running.unix, 8);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (admitted, _, message) = again.report();
        if admitted == 8 {
            break;
        }
        // Its old connections may still be closing on the server: try again.
        assert!(Instant::now() < deadline, "{admitted} of 8 admitted after release: {message}");
        again.release();
        std::thread::sleep(Duration::from_millis(200));
        again = Holder::spawn(&hog, &running.unix, 8);
    }
    again.release();
}

#[test]
fn a_checkpoint_completes_while_hundreds_of_idle_and_slow_connections_are_attached() {
    must_be_root();
    let hog = TestUser::create("spw-fair-hog").unwrap();
    let munged = Munged::started();
    let dir = tempfile::tempdir().unwrap();
    let fairness = Fairness {
        handshake_timeout: Duration::from_secs(3),
        handshakes_max: 128,
        frame_bytes_per_second_min: MIB,
        frame_rate_window: Duration::from_secs(4),
        connections_per_user_max: 64,
        ..Fairness::default()
    };
    let running = start(dir.path(), options(Some(&munged), fairness));
    // Four authenticated writers, soon to trickle 16 MiB payloads.
    let mut slow: Vec<TcpStream> = (0..4).map(|_| raw(&running)).collect();
    for stream in &mut slow {
        handshake(stream, Some(&munged));
    }
    // 300 TCP connects that never say Hello: at most handshakes_max are kept, and only until
    // the handshake timeout.
    let silent: Vec<TcpStream> = (0..300).map(|_| raw(&running)).collect();
    // One user holding every idle connection it can get over the Unix socket (SO_PEERCRED).
    let mut hogging = Holder::spawn(&hog, &running.unix, 256);
    let (admitted, refused, message) = hogging.report();
    assert_eq!((admitted, refused), (64, 192), "{message}");
    // The slow writers start: together they hold 64 MiB of the store's memory and budget
    // until the pace check (a 4 s window) cuts them off.
    let slow: Vec<std::thread::JoinHandle<Duration>> = slow
        .into_iter()
        .enumerate()
        .map(|(i, mut stream)| {
            start_write(&mut stream, EpochId(100 + i as u64), "slow", 16 << 20, 0);
            std::thread::spawn(move || {
                trickle_until_closed(stream, Duration::from_millis(200), Duration::from_secs(60))
            })
        })
        .collect();
    // A Unix-socket client is not held up by the unauthenticated flood.
    let mut local = Client::connect(&[running.unix_endpoint()], ClientOptions::default()).unwrap();
    local.list_epochs().unwrap();
    // The well-behaved client over munge TCP: connects (once handshake places free up, if the
    // flood holds them all), writes and commits its checkpoint.
    let options = ClientOptions {
        placement: Placement::striped_default(),
        munge_socket: Some(munged.socket().to_path_buf()),
        ..ClientOptions::default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut client = loop {
        match Client::connect(&[running.tcp_endpoint()], options.clone()) {
            Ok(client) => break client,
            Err(error) if error.code() == Some(ErrorCode::Busy) => {
                assert!(Instant::now() < deadline, "still refused: {error}");
                assert!(error.to_string().contains("server.handshakes_max"), "{error}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(error) => panic!("{error}"),
        }
    };
    checkpoint(&mut client, EpochId(1), 64 * MIB);
    for writer in slow {
        let took = writer.join().unwrap();
        assert!(took < Duration::from_secs(30), "a slow writer was cut off only after {took:?}");
    }
    logged(&["server.frame_bytes_per_second_min"]);
    logged(&["server.handshakes_max"]);
    logged(&["handshake not completed within 3000 ms"]);
    hogging.release();
    drop(silent);
}
