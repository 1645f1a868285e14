//! The FUSE mount end to end: real `spillway serve` processes, real FUSE mounts in temporary
//! directories, the suites of `mount_suite` run first on a plain directory (validating the
//! suite) and then on the mount.
//!
//! Every mount is owned by a guard that unmounts it (`fusermount3 -u -z`) even when the test
//! fails. The random test's seed is printed; replay with `SPILLWAY_MOUNT_SEED=<seed>`.

mod mount_suite;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use spillway_client::meta::{RemoteNamespace, RemoteOptions};
use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{MountGuard, ServerProcess};
use spillway_mount::MountConfig;
use spillway_namespace::Namespace;
use spillway_proto::Endpoint;
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

/// Servers for one test, with their data directories in `dir`.
fn servers(dir: &Path, count: usize) -> (Vec<ServerProcess>, Vec<Endpoint>) {
    spillway_harness::start_servers(BIN, dir, count, "64M")
}

fn clients(endpoints: &[Endpoint], count: usize) -> Vec<Client> {
    (0..count)
        .map(|_| {
            Client::connect(
                endpoints,
                ClientOptions { placement: Placement::striped_default(), ..Default::default() },
            )
            .unwrap()
        })
        .collect()
}

/// Namespace `id` on the first server (what `spillway mount --access striped` uses).
fn remote_namespace(endpoints: &[Endpoint], id: u64) -> Arc<dyn Namespace> {
    let options = RemoteOptions {
        create: true,
        data_epoch: EpochId(1_000 + id),
        root_mode: 0o755,
        ..RemoteOptions::default()
    };
    Arc::new(RemoteNamespace::open(&endpoints[0], id, &options).unwrap())
}

fn sh(script: &str) -> String {
    let out = std::process::Command::new("sh").arg("-c").arg(script).output().unwrap();
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mount_at(path: &Path, namespace: Arc<dyn Namespace>, endpoints: &[Endpoint]) -> MountGuard {
    spillway_harness::require_fuse("the mount tests");
    std::fs::create_dir_all(path).unwrap();
    let config = MountConfig::default();
    let mount =
        spillway_mount::mount(namespace, clients(endpoints, config.threads), path, config).unwrap();
    let guard = MountGuard::new(path, move || mount.unmount().map_err(|e| e.to_string()));
    let kind = spillway_harness::mounted(path);
    assert!(
        kind.as_deref().is_some_and(|t| t.starts_with("fuse")),
        "{} is not a FUSE mount: {kind:?}",
        path.display()
    );
    guard
}

fn tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    // Permission cases run as uid 1000, which must reach the directories.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn seed() -> u64 {
    match std::env::var("SPILLWAY_MOUNT_SEED") {
        Ok(s) => s.parse().expect("SPILLWAY_MOUNT_SEED is a number"),
        Err(_) => {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
                as u64
        }
    }
}

fn run_conformance(root: &Path, what: &str) {
    let (passed, total, failures) = mount_suite::conformance(root);
    println!("POSIX conformance on {what}: {passed}/{total} cases passed");
    assert!(
        failures.is_empty(),
        "{} of {total} cases failed on {what}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn suites_pass_on_a_plain_directory() {
    let dir = tempdir();
    std::fs::create_dir(dir.path().join("conformance")).unwrap();
    run_conformance(&dir.path().join("conformance"), "a plain directory");
    let seed = seed();
    println!("random operations seed {seed} (replay: SPILLWAY_MOUNT_SEED={seed})");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    mount_suite::random_ops(&a, &b, seed, 500).unwrap();
    std::fs::create_dir(dir.path().join("tools")).unwrap();
    std::fs::create_dir(dir.path().join("scratch")).unwrap();
    mount_suite::tools(&dir.path().join("tools"), &dir.path().join("scratch")).unwrap();
}

#[test]
fn conformance_on_the_mount() {
    let dir = tempdir();
    let (_servers, endpoints) = servers(dir.path(), 2);
    let mount = mount_at(&dir.path().join("mnt"), remote_namespace(&endpoints, 1), &endpoints);
    run_conformance(mount.path(), "the Spillway mount");
    mount.unmount();
}

#[test]
fn random_operations_match_a_plain_directory() {
    let dir = tempdir();
    let (_servers, endpoints) = servers(dir.path(), 2);
    let mount = mount_at(&dir.path().join("mnt"), remote_namespace(&endpoints, 2), &endpoints);
    let seed = seed();
    println!("random operations seed {seed} (replay: SPILLWAY_MOUNT_SEED={seed})");
    let steps =
        mount_suite::random_ops(&mount.path().join("r"), &dir.path().join("plain"), seed, 2_000)
            .unwrap_or_else(|e| panic!("{e}\nreplay with SPILLWAY_MOUNT_SEED={seed}"));
    println!("{steps} random steps agreed");
    mount.unmount();
}

#[test]
fn unmodified_tools_on_the_mount() {
    let dir = tempdir();
    let (_servers, endpoints) = servers(dir.path(), 2);
    let mount = mount_at(&dir.path().join("mnt"), remote_namespace(&endpoints, 3), &endpoints);
    std::fs::create_dir(dir.path().join("scratch")).unwrap();
    mount_suite::tools(mount.path(), &dir.path().join("scratch")).unwrap();
    mount.unmount();
}

/// Piece `i` of `pieces` of a shared file written by 6 threads: 300 KiB each (so pieces
/// straddle the 1 MiB stripes that pick the data slot), and every piece written twice, first
/// with other bytes, by the same thread, so a second write overtaken by the first shows.
#[test]
fn threads_writing_one_file_disjoint_and_overlapping_read_back_exactly() {
    use std::os::unix::fs::FileExt;
    const PIECE: usize = 300 << 10;
    const THREADS: usize = 6;
    const PER_THREAD: usize = 8;
    let dir = tempdir();
    let (_servers, endpoints) = servers(dir.path(), 2);
    let mount = mount_at(&dir.path().join("mnt"), remote_namespace(&endpoints, 4), &endpoints);
    let path = mount.path().join("shared");
    let size = PIECE * THREADS * PER_THREAD;
    let expected = mount_suite::bytes(7, size);
    std::fs::File::create(&path).unwrap();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (path, expected) = (&path, &expected);
            scope.spawn(move || {
                let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
                let stale = mount_suite::bytes(100 + t as u64, PIECE);
                // Strided: thread t owns pieces t, t + THREADS, ...
                for k in 0..PER_THREAD {
                    let at = (k * THREADS + t) * PIECE;
                    file.write_all_at(&stale, at as u64).unwrap();
                    file.write_all_at(&expected[at..at + PIECE], at as u64).unwrap();
                }
            });
        }
    });
    // Readers of one file read in parallel (through different slots), each all of it.
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (path, expected) = (&path, &expected);
            scope.spawn(move || {
                let file = std::fs::File::open(path).unwrap();
                let mut back = vec![0u8; size];
                // Each reader starts somewhere else, so their reads overlap in time.
                let start = t * size / 4;
                file.read_exact_at(&mut back[start..], start as u64).unwrap();
                file.read_exact_at(&mut back[..start], 0).unwrap();
                let first_difference = back.iter().zip(expected).position(|(a, b)| a != b);
                assert_eq!(first_difference, None, "reader {t}");
            });
        }
    });
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size as u64);
    mount.unmount();
}

/// A thread writes through a handle it keeps open (its writes not yet flushed by a close),
/// another thread then opens the file and reads: it sees every write that returned, also
/// overwrites of bytes written just before, whichever data slots they went through.
#[test]
fn a_read_from_another_thread_sees_writes_that_returned() {
    use std::os::unix::fs::FileExt;
    let dir = tempdir();
    let (_servers, endpoints) = servers(dir.path(), 2);
    let mount = mount_at(&dir.path().join("mnt"), remote_namespace(&endpoints, 5), &endpoints);
    let path = mount.path().join("raw");
    let writer =
        std::fs::OpenOptions::new().create(true).truncate(true).write(true).open(&path).unwrap();
    let (tell, told) = std::sync::mpsc::channel::<(u64, Vec<u8>)>();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let path = &path;
        let reader = scope.spawn(move || {
            for (offset, bytes) in told {
                let file = std::fs::File::open(path).unwrap();
                let mut back = vec![0u8; bytes.len()];
                file.read_exact_at(&mut back, offset).unwrap();
                assert!(back == bytes, "{} bytes at {offset}: not the ones written", bytes.len());
                done.send(()).unwrap();
            }
        });
        for round in 0..24u64 {
            // Unaligned ranges crossing stripe boundaries, overwriting earlier rounds' bytes.
            let offset = (round % 5) * 700_000 + round * 4096;
            let bytes = mount_suite::bytes(round, 1_500_000);
            writer.write_all_at(&bytes, offset).unwrap();
            tell.send((offset, bytes)).unwrap();
            // The next round overwrites some of these bytes: only once they were checked.
            wait.recv().expect("the reader stopped");
        }
        drop(tell);
        reader.join().unwrap();
    });
    drop(writer);
    mount.unmount();
}

/// The mount reads a sequential reader's next bytes ahead (2 MiB windows, the next one in the
/// background): a write through the same mount, by another handle, lands inside the reader's
/// windows and is read back at once; a write another mount made and closed is read by the next
/// open. Only the bytes the kernel has not cached are the mount's to serve, so every overwrite
/// lies past what the reader has read so far.
#[test]
fn readahead_never_serves_bytes_a_later_write_replaced() {
    use std::os::unix::fs::FileExt;
    let dir = tempdir();
    let (_servers, endpoints) = servers(dir.path(), 2);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let ma = MountGuard::spillway(BIN, &endpoints, &a, &["--access", "striped"]);
    let mb = MountGuard::spillway(BIN, &endpoints, &b, &["--access", "striped"]);
    let size = 12usize << 20;
    let original = spillway_harness::pattern(1, size);
    std::fs::write(a.join("f"), &original).unwrap();
    let mut expected = original.clone();
    let check = |file: &std::fs::File, expected: &[u8], offset: usize, length: usize| {
        let mut back = vec![0u8; length];
        file.read_exact_at(&mut back, offset as u64).unwrap();
        assert!(back == expected[offset..offset + length], "{length} bytes at {offset}");
    };

    // Both handles open first: an open drops the inode's windows by itself.
    let writer = std::fs::OpenOptions::new().write(true).open(a.join("f")).unwrap();
    let reader = std::fs::File::open(a.join("f")).unwrap();
    // Starts the windows ([0, 2 MiB) read, [2, 4) fetched in the background).
    check(&reader, &expected, 0, 128 << 10);
    for (offset, seed) in [(1_500_000, 2), (3 << 20, 3)] {
        let bytes = spillway_harness::pattern(seed, 300_000);
        writer.write_all_at(&bytes, offset as u64).unwrap();
        expected[offset..offset + bytes.len()].copy_from_slice(&bytes);
    }
    // Sequentially on from where the reader was: through both overwritten ranges.
    for offset in (128 << 10..6 << 20).step_by(128 << 10) {
        check(&reader, &expected, offset, 128 << 10);
    }
    drop(writer);

    // Another mount overwrites bytes ahead of the reader and closes: the next open sees them.
    let bytes = spillway_harness::pattern(4, 1 << 20);
    let other = std::fs::OpenOptions::new().write(true).open(b.join("f")).unwrap();
    other.write_all_at(&bytes, 8 << 20).unwrap();
    drop(other);
    expected[8 << 20..9 << 20].copy_from_slice(&bytes);
    let reopened = std::fs::File::open(a.join("f")).unwrap();
    for offset in (6 << 20..size).step_by(1 << 20) {
        check(&reopened, &expected, offset, 1 << 20);
    }
    assert!(std::fs::read(a.join("f")).unwrap() == expected, "the whole file, read again");
    drop((reader, reopened, ma, mb));
}

#[test]
fn two_mounts_share_a_striped_namespace_and_private_ones_are_separate() {
    let dir = tempdir();
    let (_servers, endpoints) = servers(dir.path(), 2);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    {
        let _ma = MountGuard::spillway(BIN, &endpoints, &a, &["--access", "striped"]);
        let _mb = MountGuard::spillway(BIN, &endpoints, &b, &["--access", "striped"]);
        // One process writes through mount a, another reads through mount b.
        sh(&format!("mkdir -p {0}/shared/dir && printf 'from a' > {0}/shared/dir/note && dd if=/dev/zero of={0}/shared/zeros bs=1M count=3 status=none", a.display()));
        assert_eq!(sh(&format!("cat {}/shared/dir/note", b.display())), "from a");
        assert_eq!(std::fs::metadata(b.join("shared/zeros")).unwrap().len(), 3 << 20);
        // And back: a rename on b shows on a.
        sh(&format!(
            "mv {0}/shared/dir/note {0}/shared/renamed && printf ' and b' >> {0}/shared/renamed",
            b.display()
        ));
        assert_eq!(sh(&format!("cat {}/shared/renamed", a.display())), "from a and b");
        assert!(!a.join("shared/dir/note").exists());
    }
    {
        let _ma =
            MountGuard::spillway(BIN, &endpoints, &a, &["--access", "private", "--node", "node-a"]);
        let _mb =
            MountGuard::spillway(BIN, &endpoints, &b, &["--access", "private", "--node", "node-b"]);
        assert!(!a.join("shared").exists(), "a private namespace starts empty");
        sh(&format!("printf mine > {}/only-a", a.display()));
        sh(&format!("printf other > {}/only-b", b.display()));
        assert!(
            !b.join("only-a").exists() && !a.join("only-b").exists(),
            "private namespaces are separate"
        );
        assert_eq!(std::fs::read(a.join("only-a")).unwrap(), b"mine");
    }
    {
        // Remounting node-a's private namespace finds its tree again.
        let _ma =
            MountGuard::spillway(BIN, &endpoints, &a, &["--access", "private", "--node", "node-a"]);
        assert_eq!(std::fs::read(a.join("only-a")).unwrap(), b"mine");
    }
}

/// The mount's line in /proc/mounts: (type, options).
fn mount_entry(path: &Path) -> (String, String) {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(&path.display().to_string()))
        .unwrap_or_else(|| panic!("{} is not mounted:\n{mounts}", path.display()));
    let fields: Vec<&str> = line.split(' ').collect();
    (fields[2].to_string(), fields[3].to_string())
}

/// Opens `path` read-only and non-blocking; the errno on failure.
fn open_errno(path: &Path) -> i32 {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path) {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

#[test]
fn the_mount_is_fuse_spillway_and_device_nodes_need_allow_devices() {
    let dir = tempdir();
    let (_servers, endpoints) = servers(dir.path(), 1);
    let path = dir.path().join("mnt");
    let null = libc::makedev(1, 3);
    {
        let _mount = MountGuard::spillway(BIN, &endpoints, &path, &[]);
        let (kind, options) = mount_entry(&path);
        assert_eq!(kind, "fuse.spillway", "tools recognise the file system by its type");
        assert!(options.split(',').any(|o| o == "nodev"), "{options}");
        assert!(options.split(',').any(|o| o == "default_permissions"), "{options}");
        let node =
            std::ffi::CString::new(path.join("null").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid path.
        let rc = unsafe { libc::mknod(node.as_ptr(), libc::S_IFCHR | 0o666, null) };
        assert_eq!(rc, 0, "mknod: {}", std::io::Error::last_os_error());
        // Even root cannot open hardware through a nodev mount; the node itself is kept.
        assert_eq!(open_errno(&path.join("null")), libc::EACCES);
    }
    {
        let _mount = MountGuard::spillway(BIN, &endpoints, &path, &["--allow-devices"]);
        let (_, options) = mount_entry(&path);
        assert!(!options.split(',').any(|o| o == "nodev"), "{options}");
        assert_eq!(open_errno(&path.join("null")), 0, "an admin's --allow-devices honours it");
    }
}

#[test]
fn statfs_counts_every_server_of_the_reservation() {
    let dir = tempdir();
    let (_servers, endpoints) = servers(dir.path(), 3);
    let mount = mount_at(&dir.path().join("mnt"), remote_namespace(&endpoints, 1), &endpoints);
    let statuses = clients(&endpoints, 1).remove(0).status().unwrap();
    let total: u64 = statuses.iter().map(|s| s.ssd_bytes_max).sum();
    let free: u64 = statuses.iter().map(|s| s.ssd_bytes_max - s.ssd_bytes_used).sum();
    let s = mount_suite::statvfs(mount.path()).unwrap();
    assert_eq!(s.f_frsize, 4096);
    assert_eq!(
        s.f_blocks * s.f_frsize,
        total / 4096 * 4096,
        "df shows the three servers' space, not the first one's {}",
        statuses[0].ssd_bytes_max
    );
    assert!(s.f_bavail * s.f_frsize <= free && s.f_bavail > 0, "{} of {free}", s.f_bavail);
    mount.unmount();
}

#[test]
fn a_full_store_fails_writes_with_enospc_and_never_shows_zeros() {
    use std::io::Write;
    let dir = tempdir();
    // 24 MiB of SSD log and a short backpressure bound: a 64 MiB file cannot fit.
    let server = ServerProcess::builder(BIN, dir.path(), "small")
        .dram_bytes("4M")
        .env("SPILLWAY_STORE_SSD_BYTES_MAX", (24u64 << 20).to_string())
        .env("SPILLWAY_STORE_SEGMENT_BYTES_MAX", (1u64 << 20).to_string())
        .env("SPILLWAY_STORE_RECORD_PAYLOAD_BYTES_MAX", (256u64 << 10).to_string())
        .env("SPILLWAY_SERVER_BACKPRESSURE_WAIT_MS_MAX", "300")
        .start();
    let endpoints = vec![server.endpoint().clone()];
    let mount = mount_at(&dir.path().join("mnt"), remote_namespace(&endpoints, 77), &endpoints);
    let path = mount.path().join("checkpoint");
    let data = mount_suite::bytes(42, 64 << 20);
    let mut file = std::fs::File::create(&path).unwrap();
    let mut written = 0usize;
    let mut failure = None;
    for chunk in data.chunks(1 << 20) {
        match file.write_all(chunk) {
            Ok(()) => written += chunk.len(),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    // A child process closes its copy of the descriptor at exec (FUSE sends a flush for it),
    // and a stat settles the writes: neither may take the error this process's fsync owes.
    assert!(std::process::Command::new("true").status().unwrap().success());
    let stat = std::fs::metadata(&path);
    assert!(stat.is_ok(), "stat takes no error a close or fsync owes: {stat:?}");
    let synced = file.sync_all();
    drop(file);
    let errno = failure.as_ref().or(synced.as_ref().err()).and_then(|e| e.raw_os_error());
    assert_eq!(errno, Some(libc::ENOSPC), "write {failure:?}, fsync {synced:?}");
    // write(2) fails once the mount has learnt of a refusal (after the client's pipeline
    // window); before that the failure comes at fsync or close.
    println!("write(2) accepted {written} bytes; error {errno:?}");
    // Whatever size the file shows, its bytes are the ones written: no zeros where the
    // servers refused data.
    let size = std::fs::metadata(&path).unwrap().len() as usize;
    let back = std::fs::read(&path).unwrap();
    assert_eq!(back.len(), size);
    assert!(size < data.len(), "the size claims {size} bytes of a file that did not fit");
    let first_difference = back.iter().zip(&data).position(|(a, b)| a != b);
    assert_eq!(first_difference, None, "of {size} bytes shown ({written} written)");
    mount.unmount();
}

#[test]
fn fsync_through_the_mount_survives_a_crash_of_every_server() {
    let dir = tempdir();
    let (mut servers, endpoints) = servers(dir.path(), 2);
    let path = dir.path().join("m");
    let expected: Vec<u8> =
        (0..3u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    std::fs::write(dir.path().join("expected"), &expected).unwrap();
    {
        let _mount = MountGuard::spillway(BIN, &endpoints, &path, &["--access", "striped"]);
        // An unmodified program: write, fsync, and nothing else (no close before the crash
        // matters: the servers die while the file is still open in the writer's view).
        sh(&format!(
            "python3 -c 'import os; data = open(\"{}\", \"rb\").read(); fd = os.open(\"{}/ckpt.bin\", os.O_CREAT | os.O_WRONLY, 0o644); os.write(fd, data); os.fsync(fd); os.close(fd)'",
            dir.path().join("expected").display(),
            path.display()
        ));
        // 3 MiB sit far below the 64 MiB DRAM log's spill watermark: only the Sync that fsync
        // sent put them on the SSD log.
        for server in &mut servers {
            server.sigkill().unwrap();
        }
    }
    for server in &mut servers {
        server.restart().unwrap();
    }
    let endpoints: Vec<Endpoint> = servers.iter().map(|s| s.endpoint().clone()).collect();
    let _mount = MountGuard::spillway(BIN, &endpoints, &path, &["--access", "striped"]);
    let got = std::fs::read(path.join("ckpt.bin")).unwrap();
    assert!(
        spillway_harness::same_bytes(&got, &expected),
        "the fsync'd file lost bytes across the crash"
    );
}

/// `GET /metrics` of a server started with `SPILLWAY_SERVER_METRICS_LISTEN_ADDRESS`: the value
/// of the sample `name` (0 when absent).
fn metric(port: u16, name: &str) -> f64 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Issue 23: `fsync` of a file asks only the servers holding its writes that no sync covered
/// (the `commit` request kind counts `Commit` and `Sync`), and nothing at all when nothing is
/// unsynced; the file reads back.
#[test]
fn fsync_of_a_file_written_to_one_server_does_not_ask_the_idle_one() {
    let dir = tempdir();
    let ports: Vec<u16> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port())
        .collect();
    let servers: Vec<ServerProcess> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            ServerProcess::builder(BIN, dir.path(), &format!("s{i}"))
                .dram_bytes("64M")
                .env("SPILLWAY_SERVER_METRICS_LISTEN_ADDRESS", format!("127.0.0.1:{port}"))
                .start()
        })
        .collect();
    let endpoints: Vec<Endpoint> = servers.iter().map(|s| s.endpoint().clone()).collect();
    let mount = mount_at(&dir.path().join("m"), remote_namespace(&endpoints, 23), &endpoints);
    let ingest = |s: usize| metric(ports[s], "spillway_server_ingest_bytes_total");
    let syncs = |s: usize| {
        metric(ports[s], "spillway_server_request_duration_seconds_count{kind=\"commit\"}")
    };
    // 64 KiB: less than one 1 MiB stripe unit, so on one server only.
    let content = spillway_harness::pattern(23, 64 << 10);
    let before = [ingest(0), ingest(1)];
    let mut file = std::fs::File::create(mount.path().join("one-server.bin")).unwrap();
    std::io::Write::write_all(&mut file, &content).unwrap();
    drop(file); // close: acknowledged by the holder, not synced
    let grown: Vec<f64> = (0..2).map(|s| ingest(s) - before[s]).collect();
    let holder = grown.iter().position(|&g| g >= content.len() as f64).unwrap();
    let idle = 1 - holder;
    assert!(grown[idle] < content.len() as f64, "written to both servers: {grown:?}");

    let syncs_before = [syncs(0), syncs(1)];
    let file =
        std::fs::OpenOptions::new().write(true).open(mount.path().join("one-server.bin")).unwrap();
    file.sync_all().unwrap();
    assert_eq!(syncs(holder), syncs_before[holder] + 1.0, "the holder syncs once");
    assert_eq!(syncs(idle), syncs_before[idle], "the idle server was asked to sync");
    file.sync_all().unwrap();
    assert_eq!(
        [syncs(0), syncs(1)][holder],
        syncs_before[holder] + 1.0,
        "nothing unsynced, yet a server was asked again"
    );
    assert_eq!(syncs(idle), syncs_before[idle]);
    drop(file);
    let got = std::fs::read(mount.path().join("one-server.bin")).unwrap();
    assert!(spillway_harness::same_bytes(&got, &content));
    mount.unmount();
}

/// Issue 15: a data server restarted while a job writes through the mount. The mount opens
/// its connections again; what was fsync'd is intact; what was written but not fsync'd reads
/// as EIO naming the server (never zeros) and its next fsync fails with EIO; new writes work.
#[test]
fn a_server_restarted_under_the_mount_loses_only_unsynced_data_and_says_so() {
    let dir = tempdir();
    let (mut servers, endpoints) = servers(dir.path(), 2);
    let path = dir.path().join("m");
    // The namespace lives on server 0, which stays up; server 1 holds data only.
    let mount = mount_at(&path, remote_namespace(&endpoints, 15), &endpoints);
    let content = |seed: u64| spillway_harness::pattern(seed, 3 << 20);
    let (synced, unsynced, later) = (content(1), content(2), content(3));
    let write = |name: &str, bytes: &[u8], fsync: bool| {
        let mut file = std::fs::File::create(mount.path().join(name)).unwrap();
        std::io::Write::write_all(&mut file, bytes).unwrap();
        if fsync {
            file.sync_all().unwrap();
        }
    };
    write("synced.bin", &synced, true);
    // Written and closed (acknowledged, in the servers' DRAM) but never fsync'd.
    write("unsynced.bin", &unsynced, false);
    servers[1].sigkill().unwrap();
    servers[1].restart().unwrap();

    let file = std::fs::OpenOptions::new().write(true).open(mount.path().join("unsynced.bin"));
    let error = file.unwrap().sync_all().expect_err("the next fsync reports the loss");
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    let error = std::fs::read(mount.path().join("unsynced.bin"))
        .expect_err("data a restart lost must not read back (as zeros or otherwise)");
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    let got = std::fs::read(mount.path().join("synced.bin")).unwrap();
    assert!(spillway_harness::same_bytes(&got, &synced), "fsync'd data changed across a restart");

    write("later.bin", &later, true);
    let got = std::fs::read(mount.path().join("later.bin")).unwrap();
    assert!(spillway_harness::same_bytes(&got, &later), "a write after the restart");
    mount.unmount();
}

/// Issue 15: the data epoch deleted on every server under a running mount (a reservation
/// destroyed under its job): reading a file fails (ESTALE: the namespace went with the epoch),
/// never returns NULs.
#[test]
fn a_mount_whose_data_epoch_vanished_fails_reads_instead_of_returning_zeros() {
    let dir = tempdir();
    let (_servers, endpoints) = servers(dir.path(), 2);
    let path = dir.path().join("m");
    let mount = mount_at(&path, remote_namespace(&endpoints, 16), &endpoints);
    let bytes = spillway_harness::pattern(16, 3 << 20);
    let mut file = std::fs::File::create(mount.path().join("data.bin")).unwrap();
    std::io::Write::write_all(&mut file, &bytes).unwrap();
    file.sync_all().unwrap();
    drop(file);
    assert!(spillway_harness::same_bytes(
        &std::fs::read(mount.path().join("data.bin")).unwrap(),
        &bytes
    ));
    clients(&endpoints, 1).pop().unwrap().delete_epoch(EpochId(1_016)).unwrap();
    let error = std::fs::read(mount.path().join("data.bin"))
        .expect_err("a file of a vanished epoch must not read (as NULs or otherwise)");
    // The server removed the namespace with its data epoch: a stale mount.
    assert_eq!(error.raw_os_error(), Some(libc::ESTALE), "{error}");
    drop(mount);
}

/// Writers of one file on different mounts, each its own range (an N-1 checkpoint from several
/// nodes): another mount's block sits in the store before its size reaches the namespace, and
/// a write past EOF here over that range must leave it alone (zeroing the gap clobbered it and
/// lost checkpoint blocks in the 4-node Slurm test).
#[test]
fn a_write_past_eof_keeps_what_another_mount_wrote_beyond_the_size() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let dir = tempdir();
    let (_servers, endpoints) = servers(dir.path(), 2);
    let namespace = remote_namespace(&endpoints, 17);
    let mount = mount_at(&dir.path().join("m"), namespace.clone(), &endpoints);
    let path = mount.path().join("n1.ckpt");
    std::fs::write(&path, b"x").unwrap();
    let ino = std::fs::metadata(&path).unwrap().ino();
    let generation = namespace.getattr(ino).unwrap().generation;
    // The other writer's block [1 MiB, 2 MiB): in the store, its size not in the namespace yet.
    let block = spillway_harness::pattern(17, 1 << 20);
    let mut other = clients(&endpoints, 1).pop().unwrap();
    other.begin_epoch(EpochId(1_017));
    let name = spillway_namespace::data_file_name(17, ino, generation);
    let mut handle = other.create_file(EpochId(1_017), &name).unwrap();
    other.write(&mut handle, 1 << 20, &block).unwrap();
    other.flush().unwrap();
    // This mount writes its own block at 3 MiB, past EOF (1 byte), leaving a gap over it.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&spillway_harness::pattern(18, 1 << 20), 3 << 20).unwrap();
    file.sync_all().unwrap();
    drop(file);
    let got = std::fs::read(&path).unwrap();
    assert_eq!(got.len(), 4 << 20);
    assert!(
        spillway_harness::same_bytes(&got[1 << 20..2 << 20], &block),
        "a write past EOF on one mount overwrote another writer's block with zeros"
    );
    assert!(got[1..1 << 20].iter().all(|&b| b == 0), "the true hole reads as zeros");
    drop(mount);
}

/// A file shrunk to a nonzero size and grown again reads zeros where its old bytes were (the
/// shrink zeroed them in the store; the write past EOF does not).
#[test]
fn a_shrunk_file_grown_again_reads_zeros_over_its_old_bytes() {
    use std::os::unix::fs::FileExt;
    let dir = tempdir();
    let (_servers, endpoints) = servers(dir.path(), 2);
    let mount = mount_at(&dir.path().join("m"), remote_namespace(&endpoints, 19), &endpoints);
    let path = mount.path().join("f");
    std::fs::write(&path, spillway_harness::pattern(19, 3 << 20)).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(4096).unwrap();
    file.write_all_at(b"end", (3 << 20) + 5).unwrap();
    file.sync_all().unwrap();
    drop(file);
    let got = std::fs::read(&path).unwrap();
    assert_eq!(got.len(), (3 << 20) + 8);
    assert!(got[4096..(3 << 20) + 5].iter().all(|&b| b == 0), "old bytes showed after the shrink");
    assert_eq!(&got[(3 << 20) + 5..], b"end");
    drop(mount);
}

/// Payload bytes the servers hold of a mount's data epoch (overwrites counted again).
fn stored_bytes(endpoints: &[Endpoint], epoch: EpochId) -> u64 {
    let epochs = clients(endpoints, 1).remove(0).list_epochs().unwrap();
    epochs.iter().find(|e| e.epoch == epoch).map_or(0, |e| e.bytes)
}

/// Issue 21: a punched hole, a zeroed range and a shrinking truncate cost a small record per
/// stripe unit, not their length in zeros, and read back as zeros around the bytes kept.
#[test]
fn punched_holes_zeroed_ranges_and_shrinks_cost_no_space() {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let dir = tempdir();
    let (_servers, endpoints) = servers(dir.path(), 2);
    let mount = mount_at(&dir.path().join("m"), remote_namespace(&endpoints, 23), &endpoints);
    let epoch = EpochId(1_023);
    let path = mount.path().join("f");
    let size = 32usize << 20;
    let mut expected = spillway_harness::pattern(23, size);
    std::fs::write(&path, &expected).unwrap();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    file.sync_all().unwrap();
    let written = stored_bytes(&endpoints, epoch);
    assert!(written >= size as u64, "{written} bytes stored of {size} written");
    let fallocate = |mode: i32, offset: usize, length: usize| {
        // SAFETY: a valid descriptor; fallocate reads no memory of ours.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as i64, length as i64) };
        assert_eq!(rc, 0, "fallocate {mode:#x}: {}", std::io::Error::last_os_error());
    };
    // 20 MiB punched (not aligned to stripes), 6 MiB zeroed, then everything past 30 MiB + 5
    // cut off and the file grown back by a write.
    fallocate(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 1_000_000, 20 << 20);
    expected[1_000_000..1_000_000 + (20 << 20)].fill(0);
    fallocate(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE, 22 << 20, 6 << 20);
    expected[22 << 20..28 << 20].fill(0);
    file.set_len((30 << 20) + 5).unwrap();
    file.write_all_at(b"tail", size as u64 - 4).unwrap();
    expected[(30 << 20) + 5..size - 4].fill(0);
    expected[size - 4..].copy_from_slice(b"tail");
    file.sync_all().unwrap();
    drop(file);
    let added = stored_bytes(&endpoints, epoch) - written;
    println!("28 MiB of zeros and 4 bytes written stored {added} bytes");
    // A run of zeros stores 8 bytes per stripe unit per server: some hundreds of bytes here,
    // where writing the zeros would have added 28 MiB.
    assert!(added < 64 << 10, "{added} bytes stored for 28 MiB of zeros and 4 bytes written");
    let got = std::fs::read(&path).unwrap();
    assert_eq!(got.len(), size);
    let first_difference = got.iter().zip(&expected).position(|(a, b)| a != b);
    assert_eq!(first_difference, None, "the file differs from what was written, punched and cut");
    drop(mount);
}

/// Issue 15: the server holding the namespace (and data) restarted under the mount: fsync'd
/// files are listed and read back intact, and new files can be made.
#[test]
fn the_namespace_server_restarted_under_the_mount_keeps_fsynced_files() {
    let dir = tempdir();
    let (mut servers, endpoints) = servers(dir.path(), 2);
    let path = dir.path().join("m");
    let mount = mount_at(&path, remote_namespace(&endpoints, 17), &endpoints);
    let bytes = spillway_harness::pattern(17, 3 << 20);
    let mut file = std::fs::File::create(mount.path().join("kept.bin")).unwrap();
    std::io::Write::write_all(&mut file, &bytes).unwrap();
    file.sync_all().unwrap();
    drop(file);
    servers[0].sigkill().unwrap();
    servers[0].restart().unwrap();
    let got = std::fs::read(mount.path().join("kept.bin")).unwrap();
    assert!(spillway_harness::same_bytes(&got, &bytes), "fsync'd file changed across a restart");
    std::fs::write(mount.path().join("new.bin"), b"after the restart").unwrap();
    assert_eq!(std::fs::read(mount.path().join("new.bin")).unwrap(), b"after the restart");
    drop(mount);
}
