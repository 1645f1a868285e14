//! End to end: the native client gathers adjacent small writes into larger frames
//! (`ClientOptions::coalesce_bytes_max`) against real `spillway serve` processes, and nothing a
//! caller can observe changes: every byte reads back, failures are reported where they were
//! without coalescing, and a killed client loses only writes it never flushed.
//!
//! The killed client is this test binary re-executed with `SPILLWAY_SMALL_WRITES_CHILD` set
//! (`child_that_is_killed`, which returns at once in a normal run).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spillway_client::{Client, ClientOptions, FileHandle, Placement};
use spillway_harness::{endpoint_list, pattern, ServerBuilder, ServerProcess};
use spillway_proto::{Endpoint, ErrorCode};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const KIB: usize = 1 << 10;

fn server(dir: &Path, name: &str) -> ServerBuilder {
    ServerProcess::builder(BIN, dir, name).rust_log("warn")
}

fn two_servers(dir: &Path) -> (Vec<ServerProcess>, Vec<Endpoint>) {
    let servers = vec![server(dir, "a").start(), server(dir, "b").start()];
    let endpoints = servers.iter().map(|s| s.endpoint().clone()).collect();
    (servers, endpoints)
}

fn client(endpoints: &[Endpoint], stripe_unit_bytes: u64, coalesce_bytes_max: u64) -> Client {
    let options = ClientOptions {
        placement: Placement::Striped { stripe_unit_bytes, stripe_count: endpoints.len() as u32 },
        coalesce_bytes_max,
        ..ClientOptions::default()
    };
    Client::connect(endpoints, options).unwrap()
}

/// Requests every server has served so far, summed.
fn requests_served(endpoints: &[Endpoint]) -> u64 {
    let mut observer = Client::connect(endpoints, ClientOptions::default()).unwrap();
    observer.status().unwrap().iter().map(|s| s.requests_served).sum()
}

#[test]
fn sequential_small_writes_reach_the_servers_in_frames_of_up_to_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (_servers, endpoints) = two_servers(dir.path());
    let mut writer = client(&endpoints, 1 << 20, 1 << 20);
    let mut file = writer.create_file(EpochId(1), "sequential").unwrap();
    let data = pattern(7, 4 << 20);
    let before = requests_served(&endpoints);
    for (i, piece) in data.chunks(16 * KIB).enumerate() {
        writer.write(&mut file, (i * 16 * KIB) as u64, piece).unwrap();
    }
    writer.flush().unwrap();
    // 256 writes of 16 KiB: four 1 MiB frames, plus the observer's own requests (a handshake
    // and a status per server, twice).
    let frames = requests_served(&endpoints) - before;
    assert!(frames <= 12, "256 sequential 16 KiB writes took {frames} requests");
    let mut back = vec![0u8; data.len()];
    writer.read(&file, 0, &mut back).unwrap();
    assert!(back == data, "bytes differ");
}

/// One client's strided share of a shared file (every other 16 KiB block, as one of two
/// interleaved writers writes it): nothing is adjacent, so the pieces go as `WriteExtents`
/// frames of several extents, and the other blocks stay holes.
#[test]
fn strided_small_writes_reach_the_servers_in_frames_of_several_extents() {
    let dir = tempfile::tempdir().unwrap();
    let (_servers, endpoints) = two_servers(dir.path());
    let mut writer = client(&endpoints, 1 << 20, 1 << 20);
    let mut file = writer.create_file(EpochId(1), "strided").unwrap();
    let data = pattern(8, 8 << 20);
    let before = requests_served(&endpoints);
    for (i, piece) in data.chunks(16 * KIB).enumerate().filter(|(i, _)| i % 2 == 1) {
        writer.write(&mut file, (i * 16 * KIB) as u64, piece).unwrap();
    }
    writer.flush().unwrap();
    // 256 writes of 16 KiB, 4 MiB: four 1 MiB frames, plus the observer's own requests (a
    // handshake and a status per server, twice). One frame per write would be 256.
    let frames = requests_served(&endpoints) - before;
    assert!(frames <= 12, "256 strided 16 KiB writes took {frames} requests");
    let mut back = vec![0u8; data.len()];
    writer.read(&file, 0, &mut back).unwrap();
    for (i, (got, sent)) in back.chunks(16 * KIB).zip(data.chunks(16 * KIB)).enumerate() {
        if i % 2 == 1 {
            assert!(got == sent, "block {i} differs from what was written");
        } else {
            assert!(got.iter().all(|&b| b == 0), "block {i}, never written, is not a hole");
        }
    }
}

/// The model of one epoch: each file's bytes as written (unwritten bytes are zeros).
struct Model {
    epoch: EpochId,
    files: Vec<(FileHandle, Vec<u8>, u64)>,
}

impl Model {
    fn new(writer: &mut Client, epoch: EpochId) -> Model {
        writer.begin_epoch(epoch);
        let files = (0..3)
            .map(|f| (writer.create_file(epoch, &format!("f{f}")).unwrap(), Vec::new(), 0))
            .collect();
        Model { epoch, files }
    }

    fn expected(&self, f: usize, offset: usize, length: usize) -> Vec<u8> {
        let bytes = &self.files[f].1;
        (offset..offset + length).map(|i| bytes.get(i).copied().unwrap_or(0)).collect()
    }
}

/// Writes of random sizes, sequential, strided and anywhere, interleaved with reads (by the
/// writer, and by another client after a flush), flushes, syncs and commits, over two servers
/// with a 64 KiB stripe unit: every read matches the model, and so does every byte at the end.
#[test]
fn coalesced_writes_read_back_exactly_as_a_model_says() {
    let seed: u64 = std::env::var("SPILLWAY_TEST_SEED").map_or(20, |s| s.parse().unwrap());
    eprintln!("seed {seed} (SPILLWAY_TEST_SEED replays it)");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let (_servers, endpoints) = two_servers(dir.path());
    let mut writer = client(&endpoints, 64 * KIB as u64, 1 << 20);
    let mut other = client(&endpoints, 64 * KIB as u64, 0);
    let mut models = vec![Model::new(&mut writer, EpochId(1))];
    for step in 0..1500u64 {
        let model = models.last_mut().unwrap();
        let f = rng.gen_range(0..model.files.len());
        match rng.gen_range(0..100) {
            0..=59 => {
                let (handle, bytes, cursor) = &mut model.files[f];
                let length = match rng.gen_range(0..4) {
                    0 => 16 * KIB,
                    1 => rng.gen_range(1..4 * KIB),
                    _ => rng.gen_range(1..80 * KIB),
                };
                let offset = match rng.gen_range(0..10) {
                    0..=5 => *cursor as usize,
                    6..=7 => *cursor as usize + rng.gen_range(1..3) * 16 * KIB,
                    _ => rng.gen_range(0..2 << 20),
                };
                let data = pattern(seed ^ (step << 8), length);
                writer.write(handle, offset as u64, &data).unwrap();
                if bytes.len() < offset + length {
                    bytes.resize(offset + length, 0);
                }
                bytes[offset..offset + length].copy_from_slice(&data);
                *cursor = (offset + length) as u64;
            }
            60..=79 => {
                let offset = rng.gen_range(0..(2 << 20));
                let length = rng.gen_range(1..200 * KIB);
                let mut back = vec![0u8; length];
                writer.read(&model.files[f].0, offset as u64, &mut back).unwrap();
                assert!(back == model.expected(f, offset, length), "step {step}: own read differs");
            }
            80..=87 => {
                writer.flush().unwrap();
                let handle = other.open_file(model.epoch, &format!("f{f}"));
                let Ok(handle) = handle else { continue }; // not written to any server yet
                let offset = rng.gen_range(0..(2 << 20));
                let length = rng.gen_range(1..200 * KIB);
                let mut back = vec![0u8; length];
                other.read(&handle, offset as u64, &mut back).unwrap();
                assert!(back == model.expected(f, offset, length), "step {step}: read differs");
            }
            88..=93 => writer.flush().unwrap(),
            94..=97 => writer.sync_epoch(model.epoch).unwrap(),
            _ => {
                let epoch = model.epoch;
                writer.commit_epoch(epoch).unwrap();
                models.push(Model::new(&mut writer, EpochId(epoch.0 + 1)));
            }
        }
    }
    let last = models.last().unwrap().epoch;
    writer.commit_epoch(last).unwrap();
    drop(writer);
    check_every_byte(&endpoints, &models);
}

/// A fresh client reads every file of every model whole: the bytes are the model's.
fn check_every_byte(endpoints: &[Endpoint], models: &[Model]) {
    let mut reader = client(endpoints, 64 * KIB as u64, 0);
    for model in models {
        for (f, (_, bytes, _)) in model.files.iter().enumerate() {
            if bytes.is_empty() {
                continue;
            }
            let handle = reader.open_file(model.epoch, &format!("f{f}")).unwrap();
            let mut back = vec![0u8; bytes.len()];
            reader.read(&handle, 0, &mut back).unwrap();
            assert!(back == *bytes, "epoch {} file f{f}: bytes differ", model.epoch);
        }
    }
}

/// What a writer saw of each call: the write calls' results, then two flushes'.
fn outcomes(endpoints: &[Endpoint], name: &str, coalesce_bytes_max: u64) -> Vec<String> {
    let mut writer = client(endpoints, 1 << 20, coalesce_bytes_max);
    let mut file = writer.create_file(EpochId(1), name).unwrap();
    let mut seen = Vec::new();
    // 1.25 MiB in 16 KiB writes into a server whose files end at 1 MiB.
    for i in 0..80 {
        let result = writer.write(&mut file, (i * 16 * KIB) as u64, &pattern(i as u64, 16 * KIB));
        seen.push(format!("write {i}: {:?}", result.map_err(|e| e.code())));
    }
    for flush in 0..2 {
        let result = writer.flush();
        seen.push(format!("flush {flush}: {:?}", result.map_err(|e| e.code())));
    }
    seen
}

/// A write refused by the server (`FileTooLarge`, past `store.file_bytes_max`) inside a gathered
/// frame is reported where it is without coalescing: not by `write`, by the next `flush`, once.
#[test]
fn a_refused_coalesced_write_is_reported_where_an_uncoalesced_one_is() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), "small-files")
        .env("SPILLWAY_STORE_FILE_BYTES_MAX", (1u64 << 20).to_string())
        .start();
    let endpoints = vec![server.endpoint().clone()];
    let plain = outcomes(&endpoints, "plain", 0);
    let coalesced = outcomes(&endpoints, "coalesced", 1 << 20);
    assert_eq!(coalesced, plain);
    assert_eq!(
        plain[80],
        format!("flush 0: {:?}", Err::<(), _>(Some(ErrorCode::FileTooLarge))),
        "{plain:?}"
    );
    assert_eq!(plain[81], "flush 1: Ok(())");
}

/// Gathered writes of a client dropped without a flush still reach the server (as sent writes
/// did before coalescing).
#[test]
fn a_client_dropped_without_a_flush_still_sends_what_it_gathered() {
    let dir = tempfile::tempdir().unwrap();
    let (_servers, endpoints) = two_servers(dir.path());
    let mut writer = client(&endpoints, 1 << 20, 1 << 20);
    let mut file = writer.create_file(EpochId(1), "dropped").unwrap();
    let data = pattern(3, 64 * KIB);
    for (i, piece) in data.chunks(16 * KIB).enumerate() {
        writer.write(&mut file, (i * 16 * KIB) as u64, piece).unwrap();
    }
    drop(writer);
    let mut reader = client(&endpoints, 1 << 20, 0);
    let file = reader.open_file(EpochId(1), "dropped").unwrap();
    let mut back = vec![0u8; data.len()];
    // The writes were sent, not acknowledged: the server stores them a moment later.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        reader.read(&file, 0, &mut back).unwrap();
        if back == data {
            break;
        }
        assert!(Instant::now() < deadline, "the dropped client's gathered writes never arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const CHILD_ENV: &str = "SPILLWAY_SMALL_WRITES_CHILD";
const FLUSHED_BYTES: usize = 1 << 20;
const GATHERED_BYTES: usize = 128 * KIB;

/// The client that is killed (runs only when re-executed by the test below): 1 MiB written in
/// 16 KiB writes and flushed, then 128 KiB more written (gathered, not flushed), then it waits.
#[test]
fn child_that_is_killed() {
    let Ok(servers) = std::env::var(CHILD_ENV) else { return };
    let endpoints: Vec<Endpoint> = servers.split(',').map(|s| s.parse().unwrap()).collect();
    let mut writer = client(&endpoints, 1 << 20, 1 << 20);
    let mut file = writer.create_file(EpochId(1), "killed").unwrap();
    let data = pattern(11, FLUSHED_BYTES + GATHERED_BYTES);
    let (flushed, gathered) = data.split_at(FLUSHED_BYTES);
    for (i, piece) in flushed.chunks(16 * KIB).enumerate() {
        writer.write(&mut file, (i * 16 * KIB) as u64, piece).unwrap();
    }
    writer.flush().unwrap();
    for (i, piece) in gathered.chunks(16 * KIB).enumerate() {
        writer.write(&mut file, (FLUSHED_BYTES + i * 16 * KIB) as u64, piece).unwrap();
    }
    println!("written");
    std::thread::sleep(Duration::from_secs(600));
}

/// A client killed with writes gathered and unflushed: what its last flush acknowledged is all
/// there; the rest, never acknowledged, is all there or absent, never other bytes.
#[test]
fn a_killed_client_loses_only_what_it_never_flushed() {
    let dir = tempfile::tempdir().unwrap();
    let (_servers, endpoints) = two_servers(dir.path());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_that_is_killed", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, endpoint_list(&endpoints))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // libtest prints "test child_that_is_killed ... " before the child's own line.
    let written = lines.any(|l| l.is_ok_and(|l| l.trim_end().ends_with("written")));
    if !written {
        child.kill().unwrap();
    }
    assert!(written, "the child never wrote");
    child.kill().unwrap();
    child.wait().unwrap();
    let data = pattern(11, FLUSHED_BYTES + GATHERED_BYTES);
    let mut reader = client(&endpoints, 1 << 20, 0);
    let file = reader.open_file(EpochId(1), "killed").unwrap();
    let mut back = vec![0u8; data.len()];
    reader.read(&file, 0, &mut back).unwrap();
    assert!(back[..FLUSHED_BYTES] == data[..FLUSHED_BYTES], "flushed bytes were lost");
    let tail = &back[FLUSHED_BYTES..];
    assert!(
        tail == &data[FLUSHED_BYTES..] || tail.iter().all(|&b| b == 0),
        "the unflushed writes came back as other bytes"
    );
}

/// Writes gathered while the server closes the idle connection (`server.idle_timeout_ms`) go to
/// the same server once the connection is opened again: nothing is lost or reported.
#[test]
fn writes_gathered_across_an_idle_close_reach_the_same_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), "idle").env("SPILLWAY_SERVER_IDLE_TIMEOUT_MS", "100").start();
    let endpoints = vec![server.endpoint().clone()];
    let mut writer = client(&endpoints, 1 << 20, 1 << 20);
    let mut file = writer.create_file(EpochId(1), "idle").unwrap();
    let data = pattern(5, 48 * KIB);
    writer.write(&mut file, 0, &data[..16 * KIB]).unwrap();
    // Quiet until the server has closed the writer's connection under the gathered frame
    // (only the observer's own connection is left).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut observer = Client::connect(&endpoints, ClientOptions::default()).unwrap();
        if observer.status().unwrap()[0].connections == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the server never closed the idle connection");
        std::thread::sleep(Duration::from_millis(50));
    }
    writer.write(&mut file, 16 * KIB as u64, &data[16 * KIB..]).unwrap();
    writer.flush().unwrap();
    writer.commit_epoch(EpochId(1)).unwrap();
    let mut back = vec![0u8; data.len()];
    writer.read(&file, 0, &mut back).unwrap();
    assert!(back == data, "bytes differ");
}
