//! End to end: real `spillway serve` processes draining to a PFS directory.
//!
//! Servers listen on Unix sockets whose paths are known in advance, so each gets the whole
//! reservation as `--drain-peers`. Clients are in-process `Client`s with local placement (rank r
//! writes to server r), writing an interleaved N-1 file and N-N files; the PFS copies are
//! compared byte for byte with what was written.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{pattern, same_bytes, ServerProcess};
use spillway_proto::{DrainState, Endpoint, EpochState};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const STRIPE: u64 = 64 * 1024;

/// Server `index` of `count`, sockets in `dir`, PFS at `pfs`; Unix socket only.
fn start(dir: &Path, index: usize, count: usize, pfs: &Path) -> ServerProcess {
    ServerProcess::builder(BIN, dir, &format!("s{index}"))
        .no_tcp()
        .unix_socket(socket(dir, index))
        .pfs_dir(pfs)
        .drain_peers(&endpoints(dir, count), index)
        .rust_log("info")
        .env("SPILLWAY_DRAIN_STRIPE_BYTES", STRIPE.to_string())
        .env("SPILLWAY_DRAIN_WRITE_BYTES_MAX", (4 * STRIPE).to_string())
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MIN", "20")
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MAX", "200")
        .start()
}

fn socket(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("s{index}.sock"))
}

fn endpoints(dir: &Path, count: usize) -> Vec<Endpoint> {
    (0..count).map(|i| Endpoint::Unix(socket(dir, i))).collect()
}

fn client(dir: &Path, count: usize, rank: u32) -> Client {
    let options =
        ClientOptions { placement: Placement::Local { rank }, ..ClientOptions::default() };
    Client::connect(&endpoints(dir, count), options).unwrap()
}

/// Every rank writes blocks rank, rank+R, … of the shared file and a file of its own; commits.
/// Returns the expected content of every file.
fn write_checkpoint(
    dir: &Path,
    count: usize,
    epoch: EpochId,
    shared_bytes: usize,
    block: usize,
) -> Vec<(String, Vec<u8>)> {
    let shared = pattern(epoch.0 * 1000 + 1, shared_bytes);
    let mut expected = vec![("ckpt/shared.dat".to_string(), shared.clone())];
    let mut clients: Vec<Client> = (0..count).map(|r| client(dir, count, r as u32)).collect();
    for (rank, c) in clients.iter_mut().enumerate() {
        c.begin_epoch(epoch);
        let mut file = c.create_file(epoch, "ckpt/shared.dat").unwrap();
        let mut offset = rank * block;
        while offset < shared_bytes {
            let end = (offset + block).min(shared_bytes);
            c.write(&mut file, offset as u64, &shared[offset..end]).unwrap();
            offset += count * block;
        }
        let own = pattern(epoch.0 * 1000 + 10 + rank as u64, 100_000 + rank * 4097);
        let name = format!("ckpt/rank{rank}.dat");
        let mut f = c.create_file(epoch, &name).unwrap();
        c.write(&mut f, 0, &own).unwrap();
        expected.push((name, own));
        c.flush().unwrap();
    }
    for c in &mut clients {
        c.commit_epoch(epoch).unwrap();
    }
    expected
}

fn wait_drained(c: &mut Client, epoch: EpochId, timeout: Duration) {
    let started = Instant::now();
    loop {
        let status = c.drain_status().unwrap();
        let states: Vec<Option<DrainState>> = status
            .iter()
            .map(|(_, list)| list.iter().find(|d| d.epoch == epoch).map(|d| d.state))
            .collect();
        if states.iter().all(|s| *s == Some(DrainState::Drained)) {
            return;
        }
        assert!(started.elapsed() < timeout, "epoch {epoch} not drained: {status:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn check_pfs(pfs: &Path, epoch: EpochId, expected: &[(String, Vec<u8>)], shuffled: bool) {
    let dir = pfs.join(format!("epoch-{}", epoch.0));
    for (name, bytes) in expected {
        let got = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got.len(), bytes.len(), "{name}: size");
        assert!(same_bytes(&got, bytes), "{name}: content differs");
        // Each file proves itself: this epoch, this size, and (shuffled: combined from every
        // participant's domain) the CRC32C of its bytes.
        let identity = spillway_drain::pfs::published_identity(&dir.join(name)).unwrap();
        let identity = identity.unwrap_or_else(|| panic!("{name}: no drain identity"));
        assert_eq!((identity.epoch, identity.size), (epoch.0, bytes.len() as u64), "{name}");
        if shuffled {
            assert_eq!(identity.crc32c, Some(crc32c::crc32c(bytes)), "{name}: checksum");
        }
    }
    // Nothing but final names: no staging file, no part marker left.
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            assert!(!name.starts_with('.'), "leftover {name} in {}", d.display());
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            }
        }
    }
}

#[test]
fn n1_and_nn_drain_in_both_modes_and_reads_fall_back_to_the_pfs() {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    let servers: Vec<ServerProcess> = (0..3).map(|i| start(dir.path(), i, 3, &pfs)).collect();
    // 16 KiB interleaved blocks, an odd tail: 3 domains of whole 64 KiB stripes + a short one.
    let shuffled = write_checkpoint(dir.path(), 3, EpochId(1), 1_000_003, 16 * 1024);
    let naive = write_checkpoint(dir.path(), 3, EpochId(2), 700_001, 5000);
    let mut c = client(dir.path(), 3, 0);
    assert_eq!(c.request_drain(EpochId(1), 1).unwrap(), 3);
    assert_eq!(c.request_drain(EpochId(2), 0).unwrap(), 3);
    wait_drained(&mut c, EpochId(1), Duration::from_secs(30));
    wait_drained(&mut c, EpochId(2), Duration::from_secs(30));
    check_pfs(&pfs, EpochId(1), &shuffled, true);
    check_pfs(&pfs, EpochId(2), &naive, false);
    // Shuffled: each server wrote only stripe-aligned chunks of its domain.
    let status = c.drain_status().unwrap();
    let calls = |epoch: u64| -> u64 {
        status
            .iter()
            .flat_map(|(_, l)| l.iter())
            .filter(|d| d.epoch.0 == epoch)
            .map(|d| d.pfs_write_calls)
            .sum()
    };
    assert!(calls(2) > 3 * calls(1), "naive {} vs shuffled {} write calls", calls(2), calls(1));
    // Drained epochs leave the burst buffer; reads fall back to the PFS copy.
    for e in c.list_epochs().unwrap() {
        assert!(e.state == EpochState::Drained, "{e:?}");
    }
    let mut reader = client(dir.path(), 3, 0);
    reader.set_pfs_fallback(&pfs);
    let (name, bytes) = &shuffled[0];
    let file = reader.open_file(EpochId(1), name).unwrap();
    let mut back = vec![0u8; 50_000];
    reader.read(&file, 123_456, &mut back).unwrap();
    assert!(back == bytes[123_456..173_456], "read through the PFS fallback differs");
    drop(servers);
}

#[test]
fn unwritable_pfs_is_retried_and_reported_and_space_is_freed_only_after_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    // The epoch's directory cannot be created: a plain file is in the way (as root, permission
    // bits would not stop us; this fails the same way a read-only or broken mount does).
    std::fs::write(pfs.join("epoch-5"), b"in the way").unwrap();
    let _servers: Vec<ServerProcess> = (0..2).map(|i| start(dir.path(), i, 2, &pfs)).collect();
    let expected = write_checkpoint(dir.path(), 2, EpochId(5), 3_000_000, 64 * 1024);
    let mut c = client(dir.path(), 2, 0);
    let used_before: u64 =
        c.status().unwrap().iter().map(|s| s.ssd_bytes_used + s.dram_bytes_used).sum();
    c.request_drain(EpochId(5), 1).unwrap();
    // Wait for a reported failure.
    let started = Instant::now();
    loop {
        let status = c.drain_status().unwrap();
        let failing = status.iter().all(|(_, l)| {
            l.iter().any(|d| {
                d.epoch == EpochId(5)
                    && d.state == DrainState::Retrying
                    && d.failed_attempts >= 2
                    && d.last_error.contains("epoch-5")
            })
        });
        if failing {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "no retry reported: {status:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Meanwhile the data is safe and readable in the burst buffer, nothing is freed.
    let epochs = c.list_epochs().unwrap();
    assert!(
        epochs.iter().any(|e| e.epoch == EpochId(5) && e.state != EpochState::Drained),
        "{epochs:?}"
    );
    let file = c.open_file(EpochId(5), "ckpt/shared.dat").unwrap();
    let mut back = vec![0u8; 300_000];
    c.read(&file, 1_000_000, &mut back).unwrap();
    assert!(back == expected[0].1[1_000_000..1_300_000], "burst buffer read differs");
    assert!(!pfs.join("epoch-5").is_dir());
    // Fix the PFS: the drain finishes by itself.
    std::fs::remove_file(pfs.join("epoch-5")).unwrap();
    wait_drained(&mut c, EpochId(5), Duration::from_secs(30));
    check_pfs(&pfs, EpochId(5), &expected, true);
    let used_after: u64 =
        c.status().unwrap().iter().map(|s| s.ssd_bytes_used + s.dram_bytes_used).sum();
    assert!(used_after < used_before, "space not freed after drain: {used_before} -> {used_after}");
}

#[test]
fn server_killed_mid_drain_resumes_from_its_journal() {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    // No PFS yet (not mounted): both servers journal the request and retry.
    let mut servers: Vec<ServerProcess> = (0..2).map(|i| start(dir.path(), i, 2, &pfs)).collect();
    let expected = write_checkpoint(dir.path(), 2, EpochId(3), 2_000_000, 16 * 1024);
    let mut c = client(dir.path(), 2, 0);
    c.request_drain(EpochId(3), 1).unwrap();
    let started = Instant::now();
    while !c
        .drain_status()
        .unwrap()
        .iter()
        .all(|(_, l)| l.iter().any(|d| d.epoch == EpochId(3) && d.failed_attempts > 0))
    {
        assert!(started.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(c);
    // Server 1 dies with its drain journaled but not done; then the PFS appears. Server 0
    // writes its domain but cannot finish: it needs server 1's bytes and part.
    servers[1].sigkill().unwrap();
    std::fs::create_dir(&pfs).unwrap();
    let marked = std::process::Command::new(BIN).args(["drain", "mark-pfs"]).arg(&pfs).status();
    assert!(marked.unwrap().success(), "spillway drain mark-pfs");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!pfs.join("epoch-3/ckpt/shared.dat").exists(), "published without server 1's part");
    // Restart: the journal re-queues the drain, nobody asks again.
    servers[1].restart().unwrap();
    let mut c = client(dir.path(), 2, 0);
    wait_drained(&mut c, EpochId(3), Duration::from_secs(30));
    check_pfs(&pfs, EpochId(3), &expected, true);
    let log = servers[1].log_text();
    assert!(log.contains("resuming a journaled drain"), "{log}");
}

#[test]
fn a_quarantined_drain_fails_drain_wait_survives_a_restart_and_drain_start_releases_it() {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    // A plain file where the epoch's directory goes: every attempt fails.
    std::fs::write(pfs.join("epoch-6"), b"in the way").unwrap();
    let mut server = ServerProcess::builder(BIN, dir.path(), "s0")
        .no_tcp()
        .unix_socket(socket(dir.path(), 0))
        .pfs_dir(&pfs)
        .drain_peers(&endpoints(dir.path(), 1), 0)
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MIN", "10")
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MAX", "50")
        .env("SPILLWAY_DRAIN_QUARANTINE_AFTER_FAILURES", "3")
        .start();
    let expected = write_checkpoint(dir.path(), 1, EpochId(6), 200_000, 64 * 1024);
    let servers = format!("unix://{}", socket(dir.path(), 0).display());
    let drain = |args: &[&str]| {
        std::process::Command::new(BIN)
            .arg("drain")
            .args(args)
            .args(["--servers", &servers])
            .output()
            .unwrap()
    };
    // `drain start --wait` fails once the drain is quarantined, naming why and what to do.
    let out = drain(&["start", "6", "--wait", "--timeout-s", "60"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "drain wait must fail on a quarantined drain");
    assert!(
        stderr.contains("quarantined")
            && stderr.contains("epoch-6")
            && stderr.contains("drain start 6"),
        "{stderr}"
    );
    // After a crash and restart it is still quarantined (not replayed), shown in `drain status`.
    server.sigkill().unwrap();
    server.restart().unwrap();
    let out = drain(&["status"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("quarantined"), "{stdout}");
    let mut c = client(dir.path(), 1, 0);
    let held = c.list_epochs().unwrap().into_iter().find(|e| e.epoch == EpochId(6)).unwrap();
    assert_ne!(held.state, EpochState::Drained, "the data is kept");
    // The obstacle is gone; an explicit request releases the epoch and it drains.
    std::fs::remove_file(pfs.join("epoch-6")).unwrap();
    let out = drain(&["start", "6", "--wait", "--timeout-s", "60"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    check_pfs(&pfs, EpochId(6), &expected, true);
}
