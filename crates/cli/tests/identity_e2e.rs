//! End to end: server identity and incarnation (`HelloReply`), and the drain's refusal to
//! publish an epoch one of whose participants was lost and replaced by an empty server at its
//! address (issue 15: such a drain published the lost stripes as zeros under the final name).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use spillway_client::{Client, ClientOptions, Placement, ServerConnection};
use spillway_harness::{pattern, same_bytes, ServerProcess};
use spillway_proto::{DrainState, Durability, Endpoint, Request};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const STRIPE: u64 = 64 * 1024;

fn socket(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("s{index}.sock"))
}

fn endpoints(dir: &Path, count: usize) -> Vec<Endpoint> {
    (0..count).map(|i| Endpoint::Unix(socket(dir, i))).collect()
}

/// Server `index` of `count` under the log and SSD name `name`, draining to `pfs`.
fn start(dir: &Path, name: &str, index: usize, count: usize, pfs: &Path) -> ServerProcess {
    ServerProcess::builder(BIN, dir, name)
        .no_tcp()
        .unix_socket(socket(dir, index))
        .pfs_dir(pfs)
        .drain_peers(&endpoints(dir, count), index)
        .rust_log("info")
        .env("SPILLWAY_DRAIN_STRIPE_BYTES", STRIPE.to_string())
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MIN", "20")
        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MAX", "200")
        .start()
}

fn striped_client(dir: &Path, count: usize) -> Client {
    let options = ClientOptions {
        placement: Placement::Striped { stripe_unit_bytes: STRIPE, stripe_count: count as u32 },
        ..ClientOptions::default()
    };
    Client::connect(&endpoints(dir, count), options).unwrap()
}

#[test]
fn the_id_survives_a_restart_the_incarnation_counts_it_and_a_damaged_file_stops_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    let mut server = start(dir.path(), "s0", 0, 1, &pfs);
    let (id, incarnation) = striped_client(dir.path(), 1).server_identity(0);
    assert!(!id.is_none());
    assert_eq!(incarnation, 1, "the first start");
    server.sigterm_and_wait(Duration::from_secs(20)).unwrap();
    server.restart().unwrap();
    assert_eq!(striped_client(dir.path(), 1).server_identity(0), (id, 2));
    server.sigkill().unwrap();
    server.restart().unwrap();
    assert_eq!(striped_client(dir.path(), 1).server_identity(0), (id, 3), "a crash counts too");
    server.sigterm_and_wait(Duration::from_secs(20)).unwrap();

    let identity_file = dir.path().join("s0-ssd").join("IDENTITY");
    let mut bytes = std::fs::read(&identity_file).unwrap();
    bytes[12] ^= 0x40;
    std::fs::write(&identity_file, &bytes).unwrap();
    let error = server.restart().expect_err("a damaged identity file must stop the server");
    let message = error.to_string();
    assert!(message.contains(&identity_file.display().to_string()), "{message}");
    assert!(message.contains("damaged"), "{message}");
    assert_eq!(std::fs::read(&identity_file).unwrap(), bytes, "the damaged file was replaced");
}

#[test]
fn servers_announce_their_failure_domain_in_hello_and_status_and_refuse_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let named = ServerProcess::builder(BIN, dir.path(), "named")
        .no_tcp()
        .unix_socket(socket(dir.path(), 0))
        .args(["--failure-domain", "rack1.node-7"])
        .start();
    let unnamed = ServerProcess::builder(BIN, dir.path(), "unnamed")
        .no_tcp()
        .unix_socket(socket(dir.path(), 1))
        .start();
    let mut client = striped_client(dir.path(), 2);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    assert_eq!(client.server_failure_domain(0), "rack1.node-7");
    assert_eq!(client.server_failure_domain(1), host, "the default is the host name");
    let domains: Vec<String> =
        client.status().unwrap().into_iter().map(|s| s.failure_domain).collect();
    assert_eq!(domains, ["rack1.node-7".to_string(), host]);
    drop((named, unnamed));

    let refused = ServerProcess::builder(BIN, dir.path(), "bad")
        .no_tcp()
        .unix_socket(socket(dir.path(), 2))
        .args(["--failure-domain", "../etc"])
        .spawn();
    let Err(error) = refused else { panic!("a bad failure domain must stop the server") };
    let message = error.to_string();
    assert!(message.contains("server.failure_domain"), "{message}");
}

#[test]
fn a_lost_participant_replaced_by_an_empty_server_stops_the_drain_and_nothing_is_published() {
    lost_participant_stops_the_drain(false);
}

/// The mount's way: the writer only syncs (fsync), stage-out seals the epoch with a commit that
/// names no participants; the participants the syncs named still hold the drain.
#[test]
fn participants_named_by_syncs_hold_the_drain_of_an_epoch_sealed_without_them() {
    lost_participant_stops_the_drain(true);
}

fn lost_participant_stops_the_drain(sealed_by_stage_out: bool) {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    std::fs::set_permissions(&pfs, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let survivor = start(dir.path(), "s0", 0, 2, &pfs);
    let mut lost = start(dir.path(), "s1", 1, 2, &pfs);
    let epoch = EpochId(7);
    let name = "ckpt/striped.dat";
    let data = pattern(7, 6 * STRIPE as usize + 1234);
    let mut client = striped_client(dir.path(), 2);
    let lost_id = client.server_identity(1).0;
    client.begin_epoch(epoch);
    let mut file = client.create_file(epoch, name).unwrap();
    client.write(&mut file, 0, &data).unwrap();
    if sealed_by_stage_out {
        client.sync_epoch(epoch).unwrap();
        let survivor_endpoint = Endpoint::Unix(socket(dir.path(), 0));
        let mut raw = ServerConnection::connect(&survivor_endpoint, "stage-out", 1).unwrap();
        let seal = Request::Commit { epoch, durability: Durability::Ssd, participants: vec![] };
        raw.call(&seal, &[], None).unwrap();
    } else {
        client.commit_epoch(epoch).unwrap();
    }
    drop(client);

    // Server 1 is lost with its SSD; an empty server takes its address.
    lost.sigkill().unwrap();
    let _replacement = start(dir.path(), "s1-replacement", 1, 2, &pfs);
    let mut client = striped_client(dir.path(), 2);
    assert_ne!(client.server_identity(1).0, lost_id, "a new SSD directory is a new server");
    assert_eq!(client.request_drain(epoch, 1).unwrap(), 1, "only the survivor holds the epoch");

    let started = Instant::now();
    let error = loop {
        let status = client.drain_status().unwrap();
        let info = status[0].1.iter().find(|d| d.epoch == epoch).cloned();
        let drained = info.as_ref().is_some_and(|d| d.state == DrainState::Drained);
        assert!(!drained, "drained and freed with a lost participant: {status:?}");
        if let Some(info) = info.filter(|d| d.failed_attempts >= 2) {
            assert_eq!(info.state, DrainState::Retrying, "{info:?}");
            break info.last_error;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no failed attempt: {status:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(error.contains(&lost_id.to_string()), "the lost server's id is named: {error}");
    assert!(error.contains(&socket(dir.path(), 1).display().to_string()), "{error}");
    assert!(error.contains("epoch 7"), "{error}");
    assert!(error.contains(name), "the files held here are named: {error}");
    let final_name = pfs.join("epoch-7").join(name);
    assert!(!final_name.exists(), "{} was published with a lost participant", final_name.display());
    assert!(survivor.log_text().contains(&lost_id.to_string()), "the failure is logged");

    // The survivor's parts are still in the burst buffer, byte for byte.
    let file = client.open_file(epoch, name).unwrap();
    let extents = client.extents(&file).unwrap();
    assert!(!extents.is_empty());
    for (server, extent) in extents {
        assert_eq!(server, 0, "only the survivor holds parts now");
        let (start, length) = (extent.offset as usize, extent.length as usize);
        let mut back = vec![0u8; length];
        client.read(&file, extent.offset, &mut back).unwrap();
        assert!(same_bytes(&back, &data[start..start + length]), "bytes at {start} differ");
    }
}

#[test]
fn a_client_reconnects_after_a_restart_mid_stream_and_reports_what_may_be_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::builder(BIN, dir.path(), "s0")
        .no_tcp()
        .unix_socket(socket(dir.path(), 0))
        .start();
    let mut client = striped_client(dir.path(), 1);
    let (epoch, kept) = (EpochId(3), EpochId(4));
    let data = pattern(3, 4 << 20);
    client.begin_epoch(kept);
    let mut synced = client.create_file(kept, "synced.dat").unwrap();
    client.write(&mut synced, 0, &data).unwrap();
    client.sync_epoch(kept).unwrap();
    client.begin_epoch(epoch);
    let mut file = client.create_file(epoch, "lost.dat").unwrap();
    // The epoch's first write stores the manifest intent synchronously (acknowledged before
    // any data): done before the freeze, so that the writes below are only pipelined.
    client.write(&mut file, 64 << 10, &data[..4096]).unwrap();
    client.flush().unwrap();
    // Pipelined into a frozen server (small enough for the socket's buffer), so it dies with
    // the writes unacknowledged whatever the machine's load.
    let lost = &data[..64 << 10];
    spillway_sys::signal::send(server.pid(), spillway_sys::signal::Signal::SIGSTOP).unwrap();
    client.write(&mut file, 0, lost).unwrap();
    server.sigkill().unwrap();
    server.restart().unwrap();

    let mut errors = Vec::new();
    for _ in 0..3 {
        match client.flush() {
            Ok(()) => break,
            Err(error) => errors.push(error),
        }
    }
    assert!(!errors.is_empty(), "writes the dead server never acknowledged were reported lost");
    assert!(
        errors.iter().all(|e| e.errno() == libc::EIO || e.errno() == libc::ECONNRESET),
        "{errors:?}"
    );
    assert!(client.flush().is_ok(), "the loss is reported once; the connection works again");
    assert_eq!(client.server_identity(0).1, 2, "the client reached the new incarnation");

    let mut back = vec![0u8; lost.len()];
    let error = client.read(&file, 0, &mut back).expect_err("lost writes never read as zeros");
    assert_eq!(error.errno(), libc::EIO, "{error}");
    assert!(error.to_string().contains("lost.dat"), "{error}");
    let error = client.commit_epoch(epoch).expect_err("an epoch that lost writes is not sealed");
    assert_eq!(error.errno(), libc::EIO, "{error}");
    let mut back = vec![0u8; data.len()];
    client.read(&synced, 0, &mut back).unwrap();
    assert!(same_bytes(&back, &data), "synced data is intact after the restart");
    let mut again = client.create_file(kept, "after.dat").unwrap();
    client.write(&mut again, 0, &data[..1 << 20]).unwrap();
    client.commit_epoch(kept).unwrap();
}
