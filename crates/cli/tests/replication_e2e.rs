//! End to end: replicated undrained data (issue 16). Real `spillway serve` processes on Unix
//! sockets, each with its own failure domain (`--failure-domain`), stand for servers on
//! distinct hosts; a client with `replicas = 2` writes every piece to 2 of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use spillway_client::manifest::{manifest_name, Manifest};
use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{pattern, same_bytes, ServerProcess};
use spillway_proto::{Durability, Endpoint};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const STRIPE: u64 = 64 * 1024;

fn socket(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("s{index}.sock"))
}

fn ssd_dir(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("s{index}-ssd"))
}

/// Server `index` in failure domain `domain`.
fn start(dir: &Path, index: usize, domain: &str) -> ServerProcess {
    ServerProcess::builder(BIN, dir, &format!("s{index}"))
        .no_tcp()
        .unix_socket(socket(dir, index))
        .args(["--failure-domain", domain])
        .start()
}

fn endpoints(dir: &Path, count: usize) -> Vec<Endpoint> {
    (0..count).map(|i| Endpoint::Unix(socket(dir, i))).collect()
}

fn options(placement: Placement, replicas: u32, durability: Durability) -> ClientOptions {
    ClientOptions {
        placement,
        replicas,
        durability,
        // A killed server is given up on quickly; the data has another holder.
        reconnect_wait_max: Duration::from_millis(300),
        ..ClientOptions::default()
    }
}

fn striped(count: u32) -> Placement {
    Placement::Striped { stripe_unit_bytes: STRIPE, stripe_count: count }
}

/// How many servers hold each byte of the file, as (offset, length, holders) runs, from each
/// server's own `Extents`.
fn holder_counts(client: &mut Client, epoch: EpochId, name: &str) -> BTreeMap<u64, Vec<usize>> {
    let file = client.open_file(epoch, name).unwrap();
    let mut per_stripe: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (server, extent) in client.extents(&file).unwrap() {
        let mut at = extent.offset;
        while at < extent.offset + extent.length {
            per_stripe.entry(at / STRIPE).or_default().push(server);
            at = (at / STRIPE + 1) * STRIPE;
        }
    }
    per_stripe
}

#[test]
fn two_replicas_on_distinct_domains_survive_a_lost_server_and_its_ssd() {
    let dir = tempfile::tempdir().unwrap();
    let mut servers: Vec<ServerProcess> =
        (0..3).map(|i| start(dir.path(), i, &format!("host{i}"))).collect();
    let mut client =
        Client::connect(&endpoints(dir.path(), 3), options(striped(3), 2, Durability::Replicated))
            .unwrap();
    let epoch = EpochId(7);
    let files = [("shared", pattern(1, 40 * STRIPE as usize + 123)), ("small", pattern(2, 5000))];
    for (name, data) in &files {
        let mut file = client.create_file(epoch, name).unwrap();
        // Two halves, as two writers of an N-1 file would.
        let half = data.len() / 2;
        client.write(&mut file, 0, &data[..half]).unwrap();
        client.write(&mut file, half as u64, &data[half..]).unwrap();
    }
    client.commit_epoch(epoch).unwrap();

    // Every stripe unit is on exactly 2 servers, of distinct domains, the ones replica_set names.
    for (name, data) in &files {
        let counts = holder_counts(&mut client, epoch, name);
        assert_eq!(counts.len() as u64, (data.len() as u64).div_ceil(STRIPE), "{name}");
        let file = client.open_file(epoch, name).unwrap();
        for (stripe, mut holders) in counts {
            holders.sort_unstable();
            assert_eq!(holders.len(), 2, "{name} stripe {stripe} on {holders:?}");
            assert_ne!(
                client.server_failure_domain(holders[0]),
                client.server_failure_domain(holders[1])
            );
            let primary =
                spillway_client::placement::split(striped(3), name, 3, stripe * STRIPE, 1, 1)[0]
                    .server;
            let mut expected = client.holders(primary);
            expected.sort_unstable();
            assert_eq!(holders, expected, "{name} stripe {stripe}");
        }
        assert!(file.servers().len() >= 2);
    }

    check_manifest(&mut client, epoch, &files);

    // Server 1's host is lost for good: the process and its SSD directory.
    servers[1].sigkill().unwrap();
    std::fs::remove_dir_all(ssd_dir(dir.path(), 1)).unwrap();
    for (name, data) in &files {
        let file = client.open_file(epoch, name).unwrap();
        assert_eq!(client.file_size(&file).unwrap(), data.len() as u64);
        let mut back = vec![0xAAu8; data.len()];
        client.read(&file, 0, &mut back).unwrap();
        assert!(same_bytes(&back, data), "{name} read back after the loss");
    }
    assert!(client.unreachable_servers().contains(&1));

    a_new_client_reads_from_the_survivors(dir.path(), epoch, &files);
    drop(servers);
}

/// A new client (an application restarting) reaches two of the three servers: given the
/// domains (from the reservation or a manifest) it reads everything from the survivors.
fn a_new_client_reads_from_the_survivors(dir: &Path, epoch: EpochId, files: &[(&str, Vec<u8>)]) {
    let without =
        Client::connect(&endpoints(dir, 3), options(striped(3), 2, Durability::Replicated));
    let Err(error) = without else { panic!("a lost server without the domains given") };
    assert!(error.to_string().contains("s1.sock"), "{error}");
    let domains: Vec<String> = (0..3).map(|i| format!("host{i}")).collect();
    let restarted = ClientOptions {
        failure_domains: domains.clone(),
        ..options(striped(3), 2, Durability::Replicated)
    };
    let mut reader = Client::connect(&endpoints(dir, 3), restarted.clone()).unwrap();
    assert_eq!(reader.unreachable_servers().iter().copied().collect::<Vec<_>>(), [1]);
    for (name, data) in files {
        let file = reader.open_file(epoch, name).unwrap();
        let mut back = vec![0u8; data.len()];
        reader.read(&file, 0, &mut back).unwrap();
        assert!(same_bytes(&back, data), "{name} read by a new client after the loss");
    }
    let mut wrong = domains;
    wrong[0] = "elsewhere".into();
    let refused =
        Client::connect(&endpoints(dir, 3), ClientOptions { failure_domains: wrong, ..restarted });
    let Err(error) = refused else { panic!("a server announcing another domain") };
    assert!(error.to_string().contains("elsewhere"), "{error}");
}

/// The commit left one manifest, on every participant, naming the servers with their domains
/// and every byte range written; `list_files` does not show it.
fn check_manifest(client: &mut Client, epoch: EpochId, files: &[(&str, Vec<u8>)]) {
    let manifests = client.list_manifests(epoch).unwrap();
    let expected = manifest_name(client.client_id(), 1);
    let names: Vec<&str> = manifests.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [expected.as_str()]);
    let listed: Vec<String> = client.list_files(epoch).unwrap().into_iter().map(|f| f.0).collect();
    assert_eq!(listed, ["shared", "small"], "the manifest is not a user file");
    let file = client.open_file(epoch, &expected).unwrap();
    assert_eq!(file.servers(), [0, 1, 2], "on every participant");
    let mut bytes = vec![0u8; manifests[0].1 as usize];
    for server in 0..3 {
        client.read_ranges(&file, 0, &mut bytes, vec![(server, 0, manifests[0].1)]).unwrap();
        let manifest = Manifest::decode(&bytes).unwrap();
        assert_eq!((manifest.epoch, manifest.replicas, manifest.commit_seq), (epoch, 2, 1));
        let domains: Vec<&str> =
            manifest.servers.iter().map(|s| s.failure_domain.as_str()).collect();
        assert_eq!(domains, ["host0", "host1", "host2"]);
        assert_eq!(manifest.servers[2].id, client.server_identity(2).0);
        for (name, data) in files {
            let entry = manifest.files.iter().find(|f| f.name == *name).unwrap();
            assert_eq!(entry.ranges, [(0, data.len() as u64)], "{name}: halves coalesced");
        }
    }
}

#[test]
fn a_replica_lost_before_the_commit_fails_it_with_eio_and_earlier_epochs_stay() {
    let dir = tempfile::tempdir().unwrap();
    let mut servers: Vec<ServerProcess> =
        (0..3).map(|i| start(dir.path(), i, &format!("host{i}"))).collect();
    let mut client =
        Client::connect(&endpoints(dir.path(), 3), options(striped(3), 2, Durability::Ssd))
            .unwrap();
    let data = pattern(3, 12 * STRIPE as usize);
    let mut first = client.create_file(EpochId(1), "ckpt").unwrap();
    client.write(&mut first, 0, &data).unwrap();
    client.commit_epoch(EpochId(1)).unwrap();

    let mut second = client.create_file(EpochId(2), "ckpt").unwrap();
    client.write(&mut second, 0, &data).unwrap();
    client.flush().unwrap();
    servers[2].sigkill().unwrap();
    let error = client.commit_epoch(EpochId(2)).expect_err("a commit with a lost replica");
    assert_eq!(error.errno(), libc::EIO, "{error}");
    let message = error.to_string();
    assert!(message.contains(&socket(dir.path(), 2).display().to_string()), "{message}");
    assert!(message.contains("epoch 2"), "{message}");

    // The epoch committed before is untouched and reads back whole from the survivors.
    let file = client.open_file(EpochId(1), "ckpt").unwrap();
    let mut back = vec![0u8; data.len()];
    client.read(&file, 0, &mut back).unwrap();
    assert!(same_bytes(&back, &data));
    drop(servers);
}

#[test]
fn local_placement_replicas_merge_extents_and_read_from_a_survivor() {
    let dir = tempfile::tempdir().unwrap();
    let mut servers: Vec<ServerProcess> =
        (0..3).map(|i| start(dir.path(), i, &format!("host{i}"))).collect();
    let data = pattern(4, 300_000);
    let mut writer = Client::connect(
        &endpoints(dir.path(), 3),
        options(Placement::Local { rank: 1 }, 2, Durability::Replicated),
    )
    .unwrap();
    let mut file = writer.create_file(EpochId(3), "n-1").unwrap();
    writer.write(&mut file, 0, &data[..100_000]).unwrap();
    writer.write(&mut file, 100_000, &data[100_000..]).unwrap();
    writer.commit_epoch(EpochId(3)).unwrap();
    let opened = writer.open_file(EpochId(3), "n-1").unwrap();
    let extents = writer.extents(&opened).unwrap();
    let held: u64 = extents.iter().map(|(_, e)| e.length).sum();
    assert_eq!(held, 2 * data.len() as u64, "two copies: {extents:?}");
    let merged = spillway_client::merge_extents(extents);
    assert_eq!(merged.iter().map(|(_, e)| e.length).sum::<u64>(), data.len() as u64);

    servers[1].sigkill().unwrap();
    std::fs::remove_dir_all(ssd_dir(dir.path(), 1)).unwrap();
    let file = writer.open_file(EpochId(3), "n-1").unwrap();
    let mut back = vec![0u8; data.len()];
    writer.read(&file, 0, &mut back).unwrap();
    assert!(same_bytes(&back, &data));
    drop(servers);
}

#[test]
fn replicas_need_distinct_domains_and_names_under_spillway_are_reserved() {
    let dir = tempfile::tempdir().unwrap();
    let servers: Vec<ServerProcess> = (0..2).map(|i| start(dir.path(), i, "same-host")).collect();
    let refused =
        Client::connect(&endpoints(dir.path(), 2), options(striped(2), 2, Durability::Ssd));
    let Err(error) = refused else { panic!("two replicas on one host") };
    let message = error.to_string();
    assert!(
        message.contains("2 distinct failure domains") && message.contains("same-host"),
        "{message}"
    );
    assert_eq!(error.errno(), libc::EINVAL);
    let refused =
        Client::connect(&endpoints(dir.path(), 2), options(striped(2), 1, Durability::Replicated));
    let Err(error) = refused else { panic!("replicated durability with one copy") };
    assert!(error.to_string().contains("replicas >= 2"), "{error}");

    let mut client =
        Client::connect(&endpoints(dir.path(), 2), options(striped(2), 1, Durability::Ssd))
            .unwrap();
    let error = client.create_file(EpochId(1), ".spillway/manifest/x").unwrap_err();
    assert!(error.to_string().contains("reserved"), "{error}");
    assert_eq!(error.errno(), libc::EINVAL);
    drop(servers);
}

/// N-1 with replicas: two writers of one shared file; the first commit seals the epoch, the
/// second writer's commit still succeeds (its manifest, written before the barrier with
/// `write_manifest`, is on every server); every byte reads back.
#[test]
fn two_writers_of_a_shared_file_both_commit_and_both_manifests_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let servers: Vec<ServerProcess> =
        (0..3).map(|i| start(dir.path(), i, &format!("host{i}"))).collect();
    let connect = || {
        Client::connect(&endpoints(dir.path(), 3), options(striped(3), 2, Durability::Replicated))
            .unwrap()
    };
    let (mut a, mut b) = (connect(), connect());
    let epoch = EpochId(11);
    let data = pattern(5, 8 * STRIPE as usize);
    let half = data.len() / 2;
    let mut file_a = a.create_file(epoch, "n-1").unwrap();
    let mut file_b = b.create_file(epoch, "n-1").unwrap();
    a.write(&mut file_a, 0, &data[..half]).unwrap();
    b.write(&mut file_b, half as u64, &data[half..]).unwrap();
    b.write_manifest(epoch).unwrap();
    // The barrier; then both commit, a first.
    a.commit_epoch(epoch).unwrap();
    b.commit_epoch(epoch).unwrap();
    let names: Vec<String> = a.list_manifests(epoch).unwrap().into_iter().map(|m| m.0).collect();
    let mut expected = vec![manifest_name(a.client_id(), 1), manifest_name(b.client_id(), 1)];
    expected.sort();
    assert_eq!(names, expected);
    let file = a.open_file(epoch, "n-1").unwrap();
    let mut back = vec![0u8; data.len()];
    a.read(&file, 0, &mut back).unwrap();
    assert!(same_bytes(&back, &data));
    drop(servers);
}

/// The drain publishes the user's files and never the manifests under `.spillway/`.
#[test]
fn the_drain_never_publishes_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    std::fs::set_permissions(&pfs, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let marked = std::process::Command::new(BIN).args(["drain", "mark-pfs"]).arg(&pfs).status();
    assert!(marked.unwrap().success());
    let peers = endpoints(dir.path(), 2);
    let servers: Vec<ServerProcess> = (0..2)
        .map(|i| {
            ServerProcess::builder(BIN, dir.path(), &format!("s{i}"))
                .no_tcp()
                .unix_socket(socket(dir.path(), i))
                .args(["--failure-domain", &format!("host{i}")])
                .pfs_dir(&pfs)
                .drain_peers(&peers, i)
                .start()
        })
        .collect();
    let mut client = Client::connect(&peers, options(striped(2), 1, Durability::Ssd)).unwrap();
    let epoch = EpochId(5);
    let data = pattern(6, 3 * STRIPE as usize + 77);
    let mut file = client.create_file(epoch, "out/ckpt").unwrap();
    client.write(&mut file, 0, &data).unwrap();
    client.commit_epoch(epoch).unwrap();
    assert_eq!(client.list_manifests(epoch).unwrap().len(), 1);
    client.request_drain(epoch, 1).unwrap();
    let started = std::time::Instant::now();
    while !client.drain_status().unwrap().iter().all(|(_, list)| {
        list.iter().any(|d| d.epoch == epoch && d.state == spillway_proto::DrainState::Drained)
    }) {
        assert!(started.elapsed() < Duration::from_secs(60), "{:?}", client.drain_status());
        std::thread::sleep(Duration::from_millis(20));
    }
    let published = pfs.join("epoch-5");
    assert!(same_bytes(&std::fs::read(published.join("out/ckpt")).unwrap(), &data));
    let entries: Vec<String> = std::fs::read_dir(&published)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries, ["out"], "only the user's files are published");
    drop(servers);
}
