//! End to end: draining epochs whose bytes several servers hold (replicas, issue 16).
//!
//! Real `spillway serve` processes on Unix sockets draining to a PFS directory. Replicated
//! bytes are made by clients with local placement writing overlapping ranges of one file with
//! the same bytes to different servers, so the servers' extents overlap partly, as the
//! replicas of two writers with different piece boundaries do. The PFS copy must be exact and
//! every byte written to the PFS once.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{pattern, same_bytes, ServerProcess};
use spillway_proto::{DrainState, Durability, Endpoint};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const STRIPE: u64 = 64 * 1024;
const MIB: u64 = 1 << 20;

fn start(dir: &Path, index: usize, count: usize, pfs: &Path) -> ServerProcess {
    ServerProcess::builder(BIN, dir, &format!("s{index}"))
        .no_tcp()
        .unix_socket(socket(dir, index))
        .pfs_dir(pfs)
        .drain_peers(&endpoints(dir, count), index)
        // Each server on its own (simulated) host.
        .args(["--failure-domain", &format!("host{index}")])
        .rust_log("info")
        .env("SPILLWAY_DRAIN_STRIPE_BYTES", STRIPE.to_string())
        .env("SPILLWAY_DRAIN_WRITE_BYTES_MAX", (4 * STRIPE).to_string())
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MIN", "20")
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MAX", "200")
        .start()
}

/// A temporary directory with its PFS directory and three servers draining to it.
fn three_servers() -> (tempfile::TempDir, PathBuf, Vec<ServerProcess>) {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    let servers = (0..3).map(|i| start(dir.path(), i, 3, &pfs)).collect();
    (dir, pfs, servers)
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

/// Writes `ranges[r]` of `content` to server r (one client each, local placement), commits.
fn write_overlapping(
    dir: &Path,
    epoch: EpochId,
    name: &str,
    content: &[u8],
    ranges: &[(u64, u64)],
) {
    let count = ranges.len();
    let mut clients: Vec<Client> = (0..count).map(|r| client(dir, count, r as u32)).collect();
    for (c, &(start, end)) in clients.iter_mut().zip(ranges) {
        c.begin_epoch(epoch);
        let mut file = c.create_file(epoch, name).unwrap();
        // In 100 000-byte writes: piece boundaries differ from server to server.
        let mut at = start;
        while at < end {
            let to = (at + 100_000).min(end);
            c.write(&mut file, at, &content[at as usize..to as usize]).unwrap();
            at = to;
        }
        c.flush().unwrap();
    }
    for c in &mut clients {
        c.commit_epoch(epoch).unwrap();
    }
}

fn wait_drained(c: &mut Client, epoch: EpochId) {
    let started = Instant::now();
    loop {
        let status = c.drain_status().unwrap();
        if status
            .iter()
            .all(|(_, l)| l.iter().any(|d| d.epoch == epoch && d.state == DrainState::Drained))
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "epoch {epoch} not drained: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The PFS bytes written for `epoch`, summed over the servers.
fn pfs_bytes_written(c: &mut Client, epoch: EpochId) -> u64 {
    let status = c.drain_status().unwrap();
    status
        .iter()
        .flat_map(|(_, l)| l.iter())
        .filter(|d| d.epoch == epoch)
        .map(|d| d.pfs_bytes_written)
        .sum()
}

#[test]
fn bytes_several_servers_hold_are_drained_once_and_exactly_in_both_modes() {
    let (dir, pfs, _servers) = three_servers();
    let size = 3 * MIB;
    // Server 0 holds 0..1.3 MiB, server 2 holds 1.2..3 MiB (the overlap held twice), server 1
    // only 2.5..2.6 MiB (also held by server 2). Shuffled, server 1's domain (1..2 MiB) is
    // gathered entirely from peers whose extents overlap partly.
    let ranges = [(0, 13 * MIB / 10), (25 * MIB / 10, 26 * MIB / 10), (12 * MIB / 10, size)];
    let mut c = client(dir.path(), 3, 0);
    for (epoch, mode) in [(EpochId(1), 1u8), (EpochId(2), 0u8)] {
        let content = pattern(epoch.0 * 77, size as usize);
        write_overlapping(dir.path(), epoch, "ckpt/replicated.dat", &content, &ranges);
        assert_eq!(c.request_drain(epoch, mode).unwrap(), 3);
        wait_drained(&mut c, epoch);
        let path = pfs.join(format!("epoch-{}/ckpt/replicated.dat", epoch.0));
        let got = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(got.len() as u64, size, "mode {mode}: size");
        assert!(same_bytes(&got, &content), "mode {mode}: the PFS copy differs");
        let identity = spillway_drain::pfs::published_identity(&path).unwrap().unwrap();
        assert_eq!((identity.epoch, identity.size), (epoch.0, size));
        if mode == 1 {
            assert_eq!(identity.crc32c, Some(crc32c::crc32c(&content)), "checksum");
        }
        // Every byte went to the PFS once, not once per holder.
        assert_eq!(pfs_bytes_written(&mut c, epoch), size, "mode {mode}: bytes written");
    }
}

#[test]
fn replicas_two_drain_exactly_with_each_byte_written_once_in_both_modes() {
    let (dir, pfs, _servers) = three_servers();
    let mut c = client(dir.path(), 3, 0);
    // Replicated durability drained shuffled, ssd drained naive.
    let rounds = [(EpochId(5), Durability::Replicated, 1u8), (EpochId(6), Durability::Ssd, 0u8)];
    for (epoch, durability, mode) in rounds {
        // Two ranks, replicas=2 over three hosts, 64 KiB stripes: an interleaved N-1 file and a
        // file per rank; every byte on two servers.
        let shared = pattern(epoch.0 * 3, 3_000_001);
        let mut expected = vec![("ckpt/shared.dat".to_string(), shared.clone())];
        let mut writers = Vec::new();
        for rank in 0..2u64 {
            let options = ClientOptions {
                placement: Placement::Striped { stripe_unit_bytes: STRIPE, stripe_count: 3 },
                replicas: 2,
                durability,
                ..ClientOptions::default()
            };
            let mut w = Client::connect(&endpoints(dir.path(), 3), options).unwrap();
            w.begin_epoch(epoch);
            let mut f = w.create_file(epoch, "ckpt/shared.dat").unwrap();
            let block = 40_000usize;
            let mut at = rank as usize * block;
            while at < shared.len() {
                let end = (at + block).min(shared.len());
                w.write(&mut f, at as u64, &shared[at..end]).unwrap();
                at += 2 * block;
            }
            let own = pattern(epoch.0 * 3 + 1 + rank, 500_000 + rank as usize * 4097);
            let name = format!("ckpt/rank{rank}.dat");
            let mut f = w.create_file(epoch, &name).unwrap();
            w.write(&mut f, 0, &own).unwrap();
            expected.push((name, own));
            w.flush().unwrap();
            writers.push(w);
        }
        for w in &mut writers {
            w.commit_epoch(epoch).unwrap();
        }
        let total: u64 = expected.iter().map(|(_, b)| b.len() as u64).sum();
        // Every byte is held twice.
        let status = c.status().unwrap();
        let held: u64 = status.iter().map(|s| s.ssd_bytes_used + s.dram_bytes_used).sum();
        assert!(held >= 2 * total, "replicas=2 holds {held} bytes for {total}");
        assert_eq!(c.request_drain(epoch, mode).unwrap(), 3);
        wait_drained(&mut c, epoch);
        for (name, bytes) in &expected {
            let path = pfs.join(format!("epoch-{}/{name}", epoch.0));
            let got = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(got.len() == bytes.len() && same_bytes(&got, bytes), "{name} differs");
            let identity = spillway_drain::pfs::published_identity(&path).unwrap().unwrap();
            if mode == 1 {
                assert_eq!(identity.crc32c, Some(crc32c::crc32c(bytes)), "{name}: checksum");
            }
        }
        // Each byte went to the PFS once, not once per replica.
        assert_eq!(pfs_bytes_written(&mut c, epoch), total, "{durability:?}: bytes written");
    }
}

#[test]
fn a_lost_server_is_named_and_nothing_is_published_or_freed_without_it() {
    let (dir, pfs, mut servers) = three_servers();
    // Each server holds its own third (no replicas): server 2's third exists nowhere else.
    let ranges = [(0, MIB), (MIB, 2 * MIB), (2 * MIB, 3 * MIB)];
    // A first checkpoint drains normally (the drains meet server 2 on host2).
    let mut c = client(dir.path(), 3, 0);
    let lost_id = c.server_identity(2).0;
    assert_eq!(c.server_failure_domain(2), "host2");
    let first = pattern(30, 3 * MIB as usize);
    write_overlapping(dir.path(), EpochId(2), "ckpt/thirds.dat", &first, &ranges);
    c.request_drain(EpochId(2), 1).unwrap();
    wait_drained(&mut c, EpochId(2));
    drop(c);
    let epoch = EpochId(3);
    let content = pattern(31, 3 * MIB as usize);
    write_overlapping(dir.path(), epoch, "ckpt/thirds.dat", &content, &ranges);
    // Server 2's host is lost for good: process killed, SSD directory gone.
    servers[2].sigkill().unwrap();
    std::fs::remove_dir_all(dir.path().join("s2-ssd")).unwrap();
    let survivors = &endpoints(dir.path(), 3)[..2];
    let options =
        ClientOptions { placement: Placement::Local { rank: 0 }, ..ClientOptions::default() };
    let mut c = Client::connect(survivors, options).unwrap();
    assert_eq!(c.request_drain(epoch, 1).unwrap(), 2);
    // Both survivors report the drain failing, naming the lost server: its position, address,
    // id and failure domain.
    let lost = lost_server_2(dir.path(), &lost_id);
    wait_until_every_server_reports(&mut c, epoch, "the lost server named", |d| {
        d.state == DrainState::Retrying && d.last_error.contains(&lost)
    });
    check_status_names_the_lost_server(dir.path(), epoch, &lost);
    // Nothing published (no file with zeros where server 2's third was), nothing freed: the
    // survivors' bytes stay readable in the burst buffer.
    assert!(!pfs.join("epoch-3/ckpt/thirds.dat").exists(), "published without server 2's part");
    let summary = c.list_epochs().unwrap().into_iter().find(|e| e.epoch == epoch).unwrap();
    assert_eq!(summary.state, spillway_proto::EpochState::Committed, "{summary:?}");
    let file = c.open_file(epoch, "ckpt/thirds.dat").unwrap();
    let mut back = vec![0u8; 2 * MIB as usize];
    c.read(&file, 0, &mut back).unwrap();
    assert!(back == content[..2 * MIB as usize], "survivors' bytes differ");
}

#[test]
fn a_server_lost_during_the_drain_never_leaves_a_wrong_file_on_the_pfs() {
    let (dir, pfs, mut servers) = three_servers();
    let epoch = EpochId(4);
    let size = 24 * MIB;
    let content = pattern(41, size as usize);
    let third = size / 3;
    let ranges = [(0, third), (third, 2 * third), (2 * third, size)];
    write_overlapping(dir.path(), epoch, "ckpt/big.dat", &content, &ranges);
    let mut c = client(dir.path(), 3, 0);
    assert_eq!(c.request_drain(epoch, 1).unwrap(), 3);
    // The drain has begun writing to the PFS somewhere (or finished).
    let started = Instant::now();
    while !c
        .drain_status()
        .unwrap()
        .iter()
        .flat_map(|(_, l)| l.iter())
        .any(|d| d.epoch == epoch && (d.pfs_bytes_written > 0 || d.state == DrainState::Drained))
    {
        assert!(started.elapsed() < Duration::from_secs(60), "the drain never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(c);
    // Server 2's host is lost while the drain runs (wherever it is by then).
    servers[2].sigkill().unwrap();
    std::fs::remove_dir_all(dir.path().join("s2-ssd")).unwrap();
    let survivors = &endpoints(dir.path(), 3)[..2];
    let options =
        ClientOptions { placement: Placement::Local { rank: 0 }, ..ClientOptions::default() };
    let mut c = Client::connect(survivors, options).unwrap();
    // Each survivor either finished (every part was written before the loss) or names the
    // lost server; it never settles otherwise.
    let lost = format!("cannot reach server 2 at {}", endpoints(dir.path(), 3)[2]);
    let started = Instant::now();
    loop {
        let status = c.drain_status().unwrap();
        let settled = status.iter().all(|(_, l)| {
            l.iter().any(|d| {
                d.epoch == epoch
                    && (d.state == DrainState::Drained
                        || (d.state == DrainState::Retrying && d.last_error.contains(&lost)))
            })
        });
        if settled {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "not settled: {status:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Whatever is under the final name is the whole file; otherwise nothing is.
    let path = pfs.join("epoch-4/ckpt/big.dat");
    if path.exists() {
        let got = std::fs::read(&path).unwrap();
        assert!(got.len() as u64 == size && same_bytes(&got, &content), "a wrong file published");
        eprintln!("the drain published the whole file before server 2 was lost");
    } else {
        eprintln!("server 2 was lost before the file was published: nothing published");
        let file = c.open_file(epoch, "ckpt/big.dat").unwrap();
        let mut back = vec![0u8; 2 * third as usize];
        c.read(&file, 0, &mut back).unwrap();
        assert!(back == content[..2 * third as usize], "survivors' bytes differ");
    }
}

/// `spillway drain status` over the whole reservation: the lost server 2 is unreachable, both
/// survivors' drains of `epoch` name it with `lost` (text and JSON).
fn check_status_names_the_lost_server(dir: &Path, epoch: EpochId, lost: &str) {
    let all: Vec<String> = endpoints(dir, 3).iter().map(|e| e.to_string()).collect();
    let cli = |extra: &[&str]| {
        let out = std::process::Command::new(BIN)
            .args(["drain", "status", "--servers", &all.join(",")])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let text = cli(&[]);
    assert!(text.contains(&format!("2 unreachable ({})", all[2])), "{text}");
    assert_eq!(text.matches(lost).count(), 2, "{text}");
    let json: serde_json::Value = serde_json::from_str(&cli(&["--json"])).unwrap();
    let listed = json["servers"].as_array().unwrap();
    assert_eq!(listed.len(), 3, "{json}");
    assert!(listed[2]["unreachable"].is_string(), "{json}");
    for survivor in &listed[..2] {
        let epochs = survivor["epochs"].as_array().unwrap();
        let e = epochs.iter().find(|e| e["epoch"] == epoch.0).unwrap();
        // Retrying, or running its next attempt (the last error stays shown meanwhile).
        assert!(e["state"] == "retrying" || e["state"] == "running", "{json}");
        assert!(e["last_error"].as_str().unwrap().contains(lost), "{json}");
    }
}

#[test]
fn a_host_replaced_by_an_empty_server_at_its_address_never_gets_a_truncated_file_published() {
    let (dir, pfs, mut servers) = three_servers();
    // One shared file, a third per server, each third's writer committing only to its server:
    // no survivor recorded server 2 as a participant.
    let ranges = [(0, MIB), (MIB, 2 * MIB), (2 * MIB, 3 * MIB)];
    let mut c = client(dir.path(), 3, 0);
    let lost_id = c.server_identity(2).0;
    write_overlapping(dir.path(), EpochId(2), "ckpt/thirds.dat", &pattern(30, 3 << 20), &ranges);
    c.request_drain(EpochId(2), 1).unwrap();
    wait_drained(&mut c, EpochId(2));
    drop(c);
    let epoch = EpochId(3);
    let content = pattern(31, 3 * MIB as usize);
    write_overlapping(dir.path(), epoch, "ckpt/thirds.dat", &content, &ranges);
    // Server 2's host is replaced: its SSD is gone, an empty server takes its address.
    servers[2].sigkill().unwrap();
    std::fs::remove_dir_all(dir.path().join("s2-ssd")).unwrap();
    let _replacement = ServerProcess::builder(BIN, dir.path(), "s2-replacement")
        .no_tcp()
        .unix_socket(socket(dir.path(), 2))
        .pfs_dir(&pfs)
        .drain_peers(&endpoints(dir.path(), 3), 2)
        .args(["--failure-domain", "host2b"])
        .start();
    let mut c = client(dir.path(), 3, 0);
    assert_eq!(c.request_drain(epoch, 1).unwrap(), 2, "only the survivors hold the epoch");
    let lost = format!("was {lost_id} in failure domain \"host2\" and now answers as");
    let started = Instant::now();
    loop {
        let status = c.drain_status().unwrap();
        for d in status.iter().flat_map(|(_, l)| l.iter()).filter(|d| d.epoch == epoch) {
            assert_ne!(
                d.state,
                DrainState::Drained,
                "drained without server 2's third: {status:?}"
            );
        }
        let refused = status[..2].iter().all(|(_, l)| {
            l.iter()
                .any(|d| d.epoch == epoch && d.failed_attempts >= 2 && d.last_error.contains(&lost))
        });
        if refused {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "not refused: {status:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!pfs.join("epoch-3/ckpt/thirds.dat").exists(), "a truncated file was published");
    // A survivor restarted since still knows (drain.peers in its SSD directory): its journaled
    // drain resumes and is refused again.
    servers[0].sigkill().unwrap();
    servers[0].restart().unwrap();
    let mut c = client(dir.path(), 3, 0);
    let started = Instant::now();
    while !c.drain_status().unwrap()[0]
        .1
        .iter()
        .any(|d| d.epoch == epoch && d.failed_attempts >= 2 && d.last_error.contains(&lost))
    {
        assert!(started.elapsed() < Duration::from_secs(60), "forgotten after a restart");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!pfs.join("epoch-3/ckpt/thirds.dat").exists(), "a truncated file was published");
    let file = c.open_file(epoch, "ckpt/thirds.dat").unwrap();
    let mut back = vec![0u8; 2 * MIB as usize];
    c.read(&file, 0, &mut back).unwrap();
    assert!(back == content[..2 * MIB as usize], "survivors' bytes differ");
}

/// Two ranks with replicas=2 over the three hosts (64 KiB stripes over every server): an
/// interleaved shared (N-1) file and a file per rank, committed at `ssd`. Returns the files.
fn write_replicated(dir: &Path, epoch: EpochId, shared_bytes: usize) -> Vec<(String, Vec<u8>)> {
    let shared = pattern(epoch.0 * 7, shared_bytes);
    let mut expected = vec![("ckpt/shared.dat".to_string(), shared.clone())];
    let mut writers = Vec::new();
    for rank in 0..2u64 {
        let options = ClientOptions {
            placement: Placement::Striped { stripe_unit_bytes: STRIPE, stripe_count: 3 },
            replicas: 2,
            durability: Durability::Ssd,
            ..ClientOptions::default()
        };
        let mut w = Client::connect(&endpoints(dir, 3), options).unwrap();
        w.begin_epoch(epoch);
        let mut f = w.create_file(epoch, "ckpt/shared.dat").unwrap();
        let block = 300_000usize;
        let mut at = rank as usize * block;
        while at < shared.len() {
            let end = (at + block).min(shared.len());
            w.write(&mut f, at as u64, &shared[at..end]).unwrap();
            at += 2 * block;
        }
        let own = pattern(epoch.0 * 7 + 1 + rank, shared_bytes / 3 + rank as usize * 4097);
        let name = format!("ckpt/rank{rank}.dat");
        let mut f = w.create_file(epoch, &name).unwrap();
        w.write(&mut f, 0, &own).unwrap();
        expected.push((name, own));
        // N-1: every writer's manifest before the barrier (the first commit seals the epoch).
        w.write_manifest(epoch).unwrap();
        writers.push(w);
    }
    for w in &mut writers {
        w.commit_epoch(epoch).unwrap();
    }
    expected
}

/// How a drain names server 2 when it cannot reach it (`lost_id`: the id it had).
fn lost_server_2(dir: &Path, lost_id: &impl std::fmt::Display) -> String {
    format!(
        "cannot reach server 2 at {}, last seen as {lost_id} in failure domain \"host2\"",
        endpoints(dir, 3)[2]
    )
}

/// Until every server connected to `c` reports `epoch`'s drain failed at least twice and
/// `reported` holds for it (bounded: 60 s, then a panic naming `what`).
fn wait_until_every_server_reports(
    c: &mut Client,
    epoch: EpochId,
    what: &str,
    reported: impl Fn(&spillway_proto::DrainInfo) -> bool,
) {
    let started = Instant::now();
    loop {
        let status = c.drain_status().unwrap();
        let all = status.iter().all(|(_, l)| {
            l.iter().any(|d| d.epoch == epoch && d.failed_attempts >= 2 && reported(d))
        });
        if all {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{what}: never; {status:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Server 2's host is lost for good: its process killed, its SSD directory deleted.
fn lose_server_2(dir: &Path, servers: &mut [ServerProcess]) {
    servers[2].sigkill().unwrap();
    std::fs::remove_dir_all(dir.join("s2-ssd")).unwrap();
}

/// A client of the two survivors (servers 0 and 1).
fn survivors_client(dir: &Path) -> Client {
    let options =
        ClientOptions { placement: Placement::Local { rank: 0 }, ..ClientOptions::default() };
    Client::connect(&endpoints(dir, 3)[..2], options).unwrap()
}

fn assert_published_exactly(pfs: &Path, epoch: EpochId, files: &[(String, Vec<u8>)]) {
    for (name, bytes) in files {
        let path = pfs.join(format!("epoch-{}/{name}", epoch.0));
        let got = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(got.len() == bytes.len() && same_bytes(&got, bytes), "{name} differs on the PFS");
        let identity = spillway_drain::pfs::published_identity(&path).unwrap().unwrap();
        assert_eq!((identity.epoch, identity.size), (epoch.0, bytes.len() as u64), "{name}");
    }
}

#[test]
fn replicas_two_drain_completely_from_the_survivors_of_a_host_lost_before_the_drain() {
    let (dir, pfs, mut servers) = three_servers();
    // One epoch drained shuffled, one naive.
    let rounds = [(EpochId(7), 1u8), (EpochId(8), 0u8)];
    let expected: Vec<_> =
        rounds.iter().map(|&(epoch, _)| write_replicated(dir.path(), epoch, 3_000_001)).collect();
    lose_server_2(dir.path(), &mut servers);
    for (&(epoch, mode), expected) in rounds.iter().zip(&expected) {
        let mut c = survivors_client(dir.path());
        assert_eq!(c.request_drain(epoch, mode).unwrap(), 2);
        wait_drained(&mut c, epoch);
        assert_published_exactly(&pfs, epoch, expected);
        // Drained: the survivors freed the epoch.
        let summary = c.list_epochs().unwrap().into_iter().find(|e| e.epoch == epoch);
        assert!(summary.is_none_or(|s| s.state == spillway_proto::EpochState::Drained));
    }
}

#[test]
fn replicas_two_drain_completely_from_the_survivors_of_a_host_lost_during_the_drain() {
    let (dir, pfs, mut servers) = three_servers();
    let epoch = EpochId(9);
    let expected = write_replicated(dir.path(), epoch, 24 * MIB as usize);
    let mut c = client(dir.path(), 3, 0);
    assert_eq!(c.request_drain(epoch, 1).unwrap(), 3);
    let started = Instant::now();
    while pfs_bytes_written(&mut c, epoch) == 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "the drain never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(c);
    lose_server_2(dir.path(), &mut servers);
    let mut c = survivors_client(dir.path());
    wait_drained(&mut c, epoch);
    assert_published_exactly(&pfs, epoch, &expected);
}

#[test]
fn replicas_one_reports_exactly_the_lost_files_and_ranges_and_publishes_the_rest() {
    let (dir, pfs, mut servers) = three_servers();
    let epoch = EpochId(10);
    let lost_id = client(dir.path(), 3, 0).server_identity(2).0;
    // Three ranks, local placement, replicas=1: a third each of a shared file, and a file each
    // (rank r's on server r only).
    let shared = pattern(101, 3 * MIB as usize);
    let mut clients: Vec<Client> = (0..3).map(|r| client(dir.path(), 3, r)).collect();
    let mut own = Vec::new();
    for (rank, c) in clients.iter_mut().enumerate() {
        c.begin_epoch(epoch);
        let mut f = c.create_file(epoch, "ckpt/shared.dat").unwrap();
        let third = rank * MIB as usize..(rank + 1) * MIB as usize;
        c.write(&mut f, third.start as u64, &shared[third.clone()]).unwrap();
        let name = format!("ckpt/rank{rank}.dat");
        let bytes = pattern(102 + rank as u64, 700_000 + rank * 1000);
        let mut f = c.create_file(epoch, &name).unwrap();
        c.write(&mut f, 0, &bytes).unwrap();
        own.push((name, bytes));
        c.write_manifest(epoch).unwrap();
    }
    for c in &mut clients {
        c.commit_epoch(epoch).unwrap();
    }
    drop(clients);
    lose_server_2(dir.path(), &mut servers);
    let mut c = survivors_client(dir.path());
    assert_eq!(c.request_drain(epoch, 1).unwrap(), 2);
    let losses = format!(
        "\"ckpt/rank2.dat\" bytes [0..{}]; \"ckpt/shared.dat\" bytes [{}..{}]",
        own[2].1.len(),
        2 * MIB,
        3 * MIB
    );
    let server = lost_server_2(dir.path(), &lost_id);
    let report = format!("no live server holds them: {losses}; lost with {server}");
    wait_until_every_server_reports(&mut c, epoch, "the loss reported", |d| {
        d.last_error.contains(&report)
    });
    // The files with lost bytes are not on the PFS; the others are, exactly.
    assert!(!pfs.join("epoch-10/ckpt/shared.dat").exists(), "published with lost bytes");
    assert!(!pfs.join("epoch-10/ckpt/rank2.dat").exists(), "published with lost bytes");
    assert_published_exactly(&pfs, epoch, &own[..2]);
    // Not freed: the survivors' bytes of the shared file stay readable.
    let file = c.open_file(epoch, "ckpt/shared.dat").unwrap();
    let mut back = vec![0u8; 2 * MIB as usize];
    c.read(&file, 0, &mut back).unwrap();
    assert!(back == shared[..2 * MIB as usize], "survivors' bytes differ");
}

/// Re-replication's case: an empty server takes the lost host's place in the list (a new id,
/// named by no manifest). It is never read from, and the survivors drain everything.
#[test]
fn replicas_two_drain_from_the_survivors_when_the_lost_host_is_replaced_at_its_address() {
    let (dir, pfs, mut servers) = three_servers();
    let epoch = EpochId(11);
    let expected = write_replicated(dir.path(), epoch, 3_000_001);
    lose_server_2(dir.path(), &mut servers);
    let _replacement = ServerProcess::builder(BIN, dir.path(), "s2-replacement")
        .no_tcp()
        .unix_socket(socket(dir.path(), 2))
        .pfs_dir(&pfs)
        .drain_peers(&endpoints(dir.path(), 3), 2)
        .args(["--failure-domain", "host2b"])
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MIN", "20")
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MAX", "200")
        .start();
    let mut c = client(dir.path(), 3, 0);
    assert_eq!(c.request_drain(epoch, 1).unwrap(), 2, "only the survivors hold the epoch");
    wait_drained(&mut survivors_client(dir.path()), epoch);
    assert_published_exactly(&pfs, epoch, &expected);
}

/// Files written as the mount does: the namespace (on server 0) names them, their bytes are
/// in `epoch` with two copies over the three hosts. Returns (path, store name, bytes) each.
fn write_through_namespace(
    ns: &spillway_client::meta::RemoteNamespace,
    writer: &mut Client,
    epoch: EpochId,
) -> Vec<(String, String, Vec<u8>)> {
    use spillway_namespace::{data_file_name, Caller, FileKind, Namespace, ROOT_INO};
    let root = Caller::root();
    let sub = ns.mkdir(&root, ROOT_INO, b"ckpt", 0o755, 0).unwrap();
    let mut files = Vec::new();
    for rank in 0..3u64 {
        let name = format!("rank{rank}.dat");
        let bytes = pattern(200 + rank, 1_000_000 + rank as usize * 333);
        let attr = ns
            .create(&root, sub.ino, name.as_bytes(), FileKind::Regular, 0o640, 0, 0, true)
            .unwrap();
        let store_name = data_file_name(ns.id(), attr.ino, attr.generation);
        let mut file = writer.create_file(epoch, &store_name).unwrap();
        writer.write(&mut file, 0, &bytes).unwrap();
        ns.wrote(&root, attr.ino, bytes.len() as u64).unwrap();
        files.push((format!("ckpt/{name}"), store_name, bytes));
    }
    writer.flush().unwrap();
    files
}

/// Writes one byte at `offset` of file `name` of `epoch` on one server, past the client
/// library's checks (which refuse Spillway's own names), as a hostile writer of the epoch can.
fn plant_sparse_file(server: &Endpoint, epoch: EpochId, name: &str, offset: u64) {
    use spillway_client::ServerConnection;
    use spillway_proto::{Request, Response};
    let mut c = ServerConnection::connect(server, "hostile", 4).unwrap();
    let open = Request::OpenFile { epoch, name: name.to_string(), create: true };
    let file = match c.call(&open, &[], None).unwrap().0 {
        Response::FileOpened { file, .. } => file,
        other => panic!("{other:?}"),
    };
    let write = Request::Write { epoch, file, offset, payload_crc32c: crc32c::crc32c(b"x") };
    assert!(matches!(c.call(&write, b"x", None).unwrap().0, Response::Written { .. }));
}

/// With namespace `options.namespace`'s server lost: opening it anew on `survivor` (a mount's,
/// or a stage-in's as root) is refused, creating nothing, since the epoch holds its files; a
/// namespace whose epoch holds none of its files is created as before.
fn no_empty_namespace_over_orphans(
    survivor: &Endpoint,
    namespace: u64,
    options: &spillway_client::meta::RemoteOptions,
    c: &mut Client,
) {
    use spillway_client::meta::{RemoteNamespace, RemoteOptions};
    let Err(error) = RemoteNamespace::open_guarded(survivor, namespace, options, c) else {
        panic!("an empty namespace was created over the epoch's files");
    };
    assert_eq!(error.errno, libc::EIO, "{error}");
    assert!(error.message.contains("its metadata was on a server that is gone"), "{error}");
    let existing = RemoteOptions { create: false, ..options.clone() };
    let Err(absent) = RemoteNamespace::open(survivor, namespace, &existing) else {
        panic!("namespace {namespace} exists on the survivor");
    };
    assert_eq!(absent.errno, libc::ENOENT, "nothing was created: {absent}");
    let fresh = RemoteOptions { data_epoch: EpochId(options.data_epoch.0 + 1), ..options.clone() };
    RemoteNamespace::open_guarded(survivor, namespace + 1, &fresh, c).unwrap();
}

#[test]
fn mount_files_keep_their_paths_when_the_namespace_server_is_lost_before_the_drain() {
    use spillway_client::meta::{RemoteNamespace, RemoteOptions};
    use spillway_client::ns_snapshot::Snapshot;
    use spillway_namespace::Namespace;

    let (dir, pfs, mut servers) = three_servers();
    let epoch = EpochId(21);
    let namespace = 77;
    // A striped namespace on server 0, as the manager creates for a reservation.
    let options = RemoteOptions { create: true, data_epoch: epoch, ..RemoteOptions::default() };
    let ns = RemoteNamespace::open(&endpoints(dir.path(), 3)[0], namespace, &options).unwrap();
    let placement = Placement::Striped { stripe_unit_bytes: STRIPE, stripe_count: 3 };
    let options_2 = ClientOptions {
        placement,
        replicas: 2,
        durability: Durability::Ssd,
        ..ClientOptions::default()
    };
    let mut writer = Client::connect(&endpoints(dir.path(), 3), options_2).unwrap();
    let files = write_through_namespace(&ns, &mut writer, epoch);
    // What stage-out does before sealing: the name map into the epoch on every server.
    // An older, shorter take first: the newest whole one counts.
    let older = Snapshot { namespace, data_epoch: epoch, taken_unix_ns: 1, entries: Vec::new() };
    writer.store_namespace_snapshot(&older).unwrap();
    let entries = ns.manifest().unwrap();
    let mut snapshot = Snapshot { namespace, data_epoch: epoch, taken_unix_ns: 2, entries };
    assert_eq!(snapshot.entries.len(), 3);
    // The epoch's writers could forge the snapshot: an owner in it is not believed (the files
    // are published as the epoch's owner, here root's unmanaged epoch).
    snapshot.entries[0].uid = 4242;
    snapshot.entries[0].gid = 4242;
    writer.store_namespace_snapshot(&snapshot).unwrap();
    // And a newer "snapshot" of one byte at 1 TiB (a sparse file its writer can make): refused
    // as damaged before anything that large is allocated, the older whole one used.
    for server in &endpoints(dir.path(), 3)[1..] {
        plant_sparse_file(
            server,
            epoch,
            &format!(".spillway/namespace/{namespace:016x}-{:016x}", u64::MAX),
            1 << 40,
        );
    }
    writer.commit_epoch(epoch).unwrap();
    drop((writer, ns));
    // The namespace's host goes for good, namespace journal and all.
    servers[0].sigkill().unwrap();
    std::fs::remove_dir_all(dir.path().join("s0-ssd")).unwrap();
    let local = ClientOptions { placement: Placement::Local { rank: 0 }, ..Default::default() };
    let mut c = Client::connect(&endpoints(dir.path(), 3)[1..], local).unwrap();
    no_empty_namespace_over_orphans(&endpoints(dir.path(), 3)[1], namespace, &options, &mut c);
    assert_eq!(c.request_drain(epoch, 1).unwrap(), 2);
    wait_drained(&mut c, epoch);
    for (path, store_name, bytes) in &files {
        let got = std::fs::read(pfs.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(same_bytes(&got, bytes) && got.len() == bytes.len(), "{path} differs");
        let meta = std::fs::metadata(pfs.join(path)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "{path}: owner from the snapshot");
        assert_eq!(meta.mode() & 0o777, 0o640, "{path}: the entry's permission bits");
        let under_store_name = pfs.join(format!("epoch-{}/{store_name}", epoch.0));
        assert!(!under_store_name.exists(), "{} published too", under_store_name.display());
    }
    // The snapshot is Spillway's own file: never published.
    assert!(!pfs.join(format!("epoch-{}/.spillway", epoch.0)).exists());
}
