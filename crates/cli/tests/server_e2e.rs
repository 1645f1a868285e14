//! End to end: real `spillway serve` processes on loopback ports, real client processes.
//!
//! Client processes are this test binary re-executed with `SPILLWAY_E2E_CHILD` set: the
//! `child_writer` test then plays one MPI-like rank (write, flush, file-system barrier, commit)
//! and exits; in a normal run it returns at once.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{endpoint_list, pattern, ServerBuilder, ServerProcess};
use spillway_proto::frame;
use spillway_proto::{Durability, Endpoint, EpochState, ErrorCode, Response};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

/// A server of these tests: logs at `info` (tests grep its lines), TCP on an ephemeral port.
fn server(dir: &Path, name: &str) -> ServerBuilder {
    ServerProcess::builder(BIN, dir, name).rust_log("info")
}

const RANKS: u32 = 3;
const BLOCK: usize = 700_000; // not a multiple of the stripe unit on purpose
const STRIPE: u64 = 256 * 1024;

/// The patterns each rank writes: (epoch, file name, placement, offset).
fn rank_plan(rank: u32) -> Vec<(EpochId, String, Placement, u64)> {
    let striped = Placement::Striped { stripe_unit_bytes: STRIPE, stripe_count: 2 };
    vec![
        (EpochId(1), format!("nn/rank{rank}"), striped, 0),
        (EpochId(2), "n1/shared".to_string(), striped, rank as u64 * BLOCK as u64),
        (EpochId(3), "n1/local".to_string(), Placement::Local { rank }, rank as u64 * BLOCK as u64),
    ]
}

fn seed(rank: u32, epoch: EpochId) -> u64 {
    (rank as u64 + 1) * 1000 + epoch.0
}

fn endpoints_from_env() -> Vec<Endpoint> {
    std::env::var("SPILLWAY_E2E_SERVERS").unwrap().split(',').map(|s| s.parse().unwrap()).collect()
}

/// One client process (runs only when re-executed by `n_n_and_n_1_from_several_processes`).
#[test]
fn child_writer() {
    let Ok(rank) = std::env::var("SPILLWAY_E2E_CHILD") else { return };
    let rank: u32 = rank.parse().unwrap();
    let barrier = PathBuf::from(std::env::var("SPILLWAY_E2E_BARRIER").unwrap());
    let endpoints = endpoints_from_env();
    for (epoch, name, placement, offset) in rank_plan(rank) {
        let mut client = Client::connect(
            &endpoints,
            ClientOptions { placement, durability: Durability::Ssd, ..Default::default() },
        )
        .unwrap();
        client.begin_epoch(epoch);
        let mut file = client.create_file(epoch, &name).unwrap();
        let data = pattern(seed(rank, epoch), BLOCK);
        // Several writes per rank, in 100 000-byte transfers, pipelined.
        for (i, chunk) in data.chunks(100_000).enumerate() {
            client.write(&mut file, offset + (i * 100_000) as u64, chunk).unwrap();
        }
        client.flush().unwrap();
        // Barrier: every rank has written its part of this epoch.
        std::fs::write(barrier.join(format!("{}.{rank}", epoch.0)), b"").unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while (0..RANKS).any(|r| !barrier.join(format!("{}.{r}", epoch.0)).exists()) {
            assert!(Instant::now() < deadline, "barrier timed out");
            std::thread::sleep(Duration::from_millis(5));
        }
        client.commit_epoch(epoch).unwrap();
    }
}

fn reader(endpoints: &[Endpoint], placement: Placement) -> Client {
    Client::connect(endpoints, ClientOptions { placement, ..Default::default() }).unwrap()
}

fn verify_all_ranks(endpoints: &[Endpoint]) {
    for rank in 0..RANKS {
        for (epoch, name, placement, offset) in rank_plan(rank) {
            let placement = match placement {
                Placement::Local { .. } => Placement::Local { rank: 0 },
                other => other,
            };
            let mut client = reader(endpoints, placement);
            let file = client.open_file(epoch, &name).unwrap();
            let mut back = vec![0u8; BLOCK];
            client.read(&file, offset, &mut back).unwrap();
            assert!(
                back == pattern(seed(rank, epoch), BLOCK),
                "rank {rank} epoch {epoch} file {name}: bytes differ"
            );
        }
    }
}

#[test]
fn n_n_and_n_1_from_several_processes_read_back_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let servers = [server(dir.path(), "a").start(), server(dir.path(), "b").start()];
    let endpoints: Vec<Endpoint> = servers.iter().map(|s| s.endpoint().clone()).collect();
    let list = endpoint_list(&endpoints);
    let barrier = dir.path().join("barrier");
    std::fs::create_dir(&barrier).unwrap();
    let children: Vec<Child> = (0..RANKS)
        .map(|rank| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
                .env("SPILLWAY_E2E_CHILD", rank.to_string())
                .env("SPILLWAY_E2E_SERVERS", &list)
                .env("SPILLWAY_E2E_BARRIER", &barrier)
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a client process failed");
    }
    verify_all_ranks(&endpoints);
    let mut client = reader(&endpoints, Placement::striped_default());
    let epochs = client.list_epochs().unwrap();
    assert_eq!(epochs.iter().map(|e| e.epoch.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(
        epochs.iter().all(|e| e.state == EpochState::Committed && e.servers == 2),
        "{epochs:?}"
    );
    let total: u64 = epochs.iter().map(|e| e.bytes).sum();
    // The servers also hold the ranks' epoch manifests (docs/design/replication.md), each on
    // at most both servers; the files themselves are exactly what was written.
    let mut data = 0;
    let mut manifest_bytes_max = 0;
    for e in &epochs {
        data += client.list_files(e.epoch).unwrap().iter().map(|(_, size)| size).sum::<u64>();
        let manifests = client.list_manifests(e.epoch).unwrap();
        assert!(!manifests.is_empty(), "epoch {} has no manifest", e.epoch);
        manifest_bytes_max += manifests.iter().map(|(_, size)| 2 * size).sum::<u64>();
    }
    assert_eq!(data, 3 * RANKS as u64 * BLOCK as u64);
    assert!(total > data && total - data <= manifest_bytes_max, "{total} {data}");
    assert_eq!(client.list_files(EpochId(1)).unwrap().len(), RANKS as usize);
    client.delete_epoch(EpochId(1)).unwrap();
    assert_eq!(client.list_epochs().unwrap().len(), 2);
}

#[test]
fn server_killed_after_commit_still_serves_every_committed_byte() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = server(dir.path(), "k").start();
    let endpoints = vec![server.endpoint().clone()];
    let mut client = reader(&endpoints, Placement::striped_default());
    let committed: Vec<(String, Vec<u8>)> =
        (0..4).map(|i| (format!("ckpt/{i}"), pattern(i, 1_500_000 + i as usize * 7))).collect();
    for (name, data) in &committed {
        let mut file = client.create_file(EpochId(10), name).unwrap();
        for (i, chunk) in data.chunks(1 << 20).enumerate() {
            client.write(&mut file, (i << 20) as u64, chunk).unwrap();
        }
    }
    client.commit_epoch(EpochId(10)).unwrap();
    // An epoch in progress at the crash.
    let mut open = client.create_file(EpochId(11), "partial").unwrap();
    client.write(&mut open, 0, &pattern(99, 1 << 20)).unwrap();
    client.flush().unwrap();
    drop(client);
    server.sigkill().unwrap();

    server.restart().unwrap();
    let endpoints = vec![server.endpoint().clone()];
    let mut client = reader(&endpoints, Placement::striped_default());
    for (name, data) in &committed {
        let file = client.open_file(EpochId(10), name).unwrap();
        let mut back = vec![0u8; data.len()];
        client.read(&file, 0, &mut back).unwrap();
        assert!(&back == data, "{name}: committed bytes differ after SIGKILL + restart");
        assert_eq!(client.file_size(&file).unwrap(), data.len() as u64);
    }
    let epochs = client.list_epochs().unwrap();
    let ten = epochs.iter().find(|e| e.epoch == EpochId(10)).expect("committed epoch listed");
    assert_eq!(ten.state, EpochState::Committed);
    assert!(server.log_text().contains("serving"));
}

#[test]
fn protocol_garbage_is_answered_logged_and_others_still_served() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), "g").start();
    let endpoints = vec![server.endpoint().clone()];
    let mut good = reader(&endpoints, Placement::striped_default());
    let Endpoint::Tcp(address) = server.endpoint().clone() else { panic!() };
    let mut bad = TcpStream::connect(address).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let peer = format!("tcp://{}", bad.local_addr().unwrap());
    bad.write_all(&[0xde, 0xad, 0xbe, 0xef].repeat(16)).unwrap();
    let mut body = Vec::new();
    let header = frame::read_header_and_body(&mut bad, &mut body, 0).unwrap();
    match Response::decode(header.kind, &body).unwrap() {
        Response::Error { code: ErrorCode::BadFrame, message } => {
            assert!(message.contains("magic"), "{message}")
        }
        other => panic!("expected an error frame, got {other:?}"),
    }
    let mut rest = Vec::new();
    assert_eq!(bad.read_to_end(&mut rest).unwrap_or(0), 0, "connection should be closed");
    // The log names the peer and the problem.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = server.log_text();
        if log.lines().any(|l| l.contains(&peer) && l.contains("bad magic")) {
            break;
        }
        assert!(Instant::now() < deadline, "no log line naming {peer} and the problem:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Everyone else is still served.
    let mut file = good.create_file(EpochId(1), "still-here").unwrap();
    good.write(&mut file, 0, b"served").unwrap();
    good.commit_epoch(EpochId(1)).unwrap();
    let mut back = [0u8; 6];
    good.read(&file, 0, &mut back).unwrap();
    assert_eq!(&back, b"served");
}

#[test]
fn sigterm_finishes_and_syncs_memory_commits() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = server(dir.path(), "t").durability("memory").start();
    let endpoints = vec![server.endpoint().clone()];
    let mut client = reader(&endpoints, Placement::striped_default());
    let data = pattern(5, 3 << 20);
    let mut file = client.create_file(EpochId(4), "m").unwrap();
    client.write(&mut file, 0, &data).unwrap();
    client.commit_epoch(EpochId(4)).unwrap(); // server default: memory
    drop(client);
    let status = server.sigterm_and_wait(Duration::from_secs(60)).unwrap();
    assert!(status.success(), "server exit status {status:?}; log:\n{}", server.log_text());
    assert!(server.log_text().contains("shutdown complete"));
    let server = self::server(dir.path(), "t").start();
    let mut client = reader(std::slice::from_ref(server.endpoint()), Placement::striped_default());
    let file = client.open_file(EpochId(4), "m").unwrap();
    let mut back = vec![0u8; data.len()];
    client.read(&file, 0, &mut back).unwrap();
    assert!(back == data, "memory-committed epoch lost over a graceful restart");
}

#[test]
fn non_loopback_listen_is_refused_without_insecure_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--dram-bytes", "32M"])
        .arg("--ssd-dir")
        .arg(dir.path().join("ssd"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("insecure_tcp"), "{stderr}");
}

#[test]
fn full_store_waits_then_fails_with_enospc_and_succeeds_once_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), "full")
        .args(["--ssd-bytes", "32M"])
        .env("SPILLWAY_STORE_SEGMENT_BYTES_MAX", "8388608")
        .env("SPILLWAY_SERVER_BACKPRESSURE_WAIT_MS_MAX", "1500")
        .start();
    let endpoints = vec![server.endpoint().clone()];
    let options = || ClientOptions { transfer_bytes_max: 16 << 20, ..Default::default() };
    let mut client = Client::connect(&endpoints, options()).unwrap();
    let mut old = client.create_file(EpochId(1), "old").unwrap();
    client.write(&mut old, 0, &pattern(1, 20 << 20)).unwrap();
    client.commit_epoch(EpochId(1)).unwrap();
    let mut new = client.create_file(EpochId(2), "new").unwrap();
    let data = pattern(2, 14 << 20);
    client.write(&mut new, 0, &data).unwrap();
    let error = client.flush().unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::NoSpace), "{error}");
    assert_eq!(error.errno(), libc::ENOSPC);
    assert!(error.to_string().contains("after waiting"), "{error}");
    // Committed data untouched.
    let mut back = vec![0u8; 20 << 20];
    client.read(&old, 0, &mut back).unwrap();
    assert!(back == pattern(1, 20 << 20));
    // Retry while another client deletes the old epoch: the write waits, then lands.
    let deleter = {
        let endpoints = endpoints.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            Client::connect(&endpoints, ClientOptions::default())
                .unwrap()
                .delete_epoch(EpochId(1))
                .unwrap();
        })
    };
    client.write(&mut new, 0, &data).unwrap();
    client.flush().unwrap();
    deleter.join().unwrap();
    client.commit_epoch(EpochId(2)).unwrap();
    let mut back = vec![0u8; data.len()];
    client.read(&new, 0, &mut back).unwrap();
    assert!(back == data);
    assert!(server.log_text().contains("store full"), "backpressure not logged");
}

#[test]
fn unix_socket_clients_run_as_the_kernel_reported_uid() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bb.sock");
    let server = server(dir.path(), "u").unix_socket(&socket).start();
    assert_eq!(server.endpoints().len(), 2, "{:?}", server.endpoints());
    let unix = Endpoint::Unix(socket);
    assert!(server.endpoints().contains(&unix));
    let mut client = reader(std::slice::from_ref(&unix), Placement::striped_default());
    assert_eq!(client.identity(), (spillway_sys::user::uid(), spillway_sys::user::gid()));
    let mut file = client.create_file(EpochId(1), "over-unix").unwrap();
    client.write(&mut file, 0, b"unix bytes").unwrap();
    client.commit_epoch(EpochId(1)).unwrap();
    // The same data over TCP: one store behind both listeners.
    let mut tcp = reader(std::slice::from_ref(server.endpoint()), Placement::striped_default());
    let file = tcp.open_file(EpochId(1), "over-unix").unwrap();
    let mut back = [0u8; 10];
    tcp.read(&file, 0, &mut back).unwrap();
    assert_eq!(&back, b"unix bytes");
    assert!(server.log_text().contains("unix:pid="), "unix peer not logged");
}
