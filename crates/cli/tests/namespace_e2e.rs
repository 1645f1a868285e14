//! End to end: the namespace (metadata) service in a real `spillway serve`, reached through
//! `RemoteNamespace`. Two clients see one tree; the tree survives SIGKILL and restart; a
//! non-root peer cannot act as another uid.
//!
//! The non-root peer is this test binary re-executed as uid/gid 4242 with
//! `SPILLWAY_NS_E2E_CHILD` set (the `child_unprivileged_peer` test then runs; in a normal run it
//! returns at once).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use spillway_client::meta::{RemoteNamespace, RemoteOptions};
use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{pattern, same_bytes, ServerProcess};
use spillway_namespace::{data_file_name, Caller, FileKind, Namespace, SetAttr, ROOT_INO};
use spillway_proto::{DrainState, Endpoint};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const NAMESPACE: u64 = 41;
const UNPRIVILEGED: u32 = 4242;

fn options(create: bool) -> RemoteOptions {
    RemoteOptions { create, data_epoch: EpochId(900), root_mode: 0o755, ..RemoteOptions::default() }
}

/// Every path under the root with (kind, size, nlink, uid, mode), sorted.
fn tree(ns: &dyn Namespace) -> Vec<(String, FileKind, u64, u32, u32, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let mut cookie = 0;
        loop {
            let page = ns.readdir(&Caller::root(), dir, cookie, 64).unwrap();
            let Some(last) = page.last() else { break };
            cookie = last.cookie;
            for entry in page.into_iter().filter(|e| e.name != b"." && e.name != b"..") {
                let path = format!("{prefix}/{}", String::from_utf8_lossy(&entry.name));
                let attr = ns.getattr(entry.ino).unwrap();
                if attr.kind == FileKind::Directory {
                    stack.push((entry.ino, path.clone()));
                }
                out.push((path, attr.kind, attr.size, attr.nlink, attr.uid, attr.mode));
            }
        }
    }
    out.sort();
    out
}

fn root() -> Caller {
    Caller::root()
}

#[test]
fn two_clients_share_a_tree_that_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::builder(BIN, dir.path(), "ns0").rust_log("info").start();
    let endpoint = server.endpoint().clone();
    let a = RemoteNamespace::open(&endpoint, NAMESPACE, &options(true)).unwrap();
    assert_eq!(a.data_epoch(), EpochId(900));
    let b = RemoteNamespace::open(&endpoint, NAMESPACE, &options(false)).unwrap();

    let project = build_and_change_from_both_clients(&a, &b);
    many_entries_page_through_readdir(&a, &b, project);

    // Durable point, then one more operation that is only written (not synced).
    a.sync().unwrap();
    a.unlink(&root(), project, b"f0000").unwrap();
    let before = tree(&a);

    server.sigkill().unwrap();
    let broken = a.getattr(ROOT_INO);
    assert_eq!(broken.unwrap_err().errno, libc::EIO, "a dead server is EIO");
    server.restart().unwrap();

    // The old clients reconnect on their own; a new client opens the existing namespace.
    assert_eq!(tree(&a), before);
    assert_eq!(tree(&b), before);
    let c = RemoteNamespace::open(&endpoint, NAMESPACE, &options(false)).unwrap();
    assert_eq!(c.data_epoch(), EpochId(900), "the data epoch is the namespace's, not the opener's");
    assert_eq!(tree(&c), before);
    assert!(!server.log_text().contains("panicked"));

    // A namespace that does not exist is ENOENT without create.
    assert_eq!(
        RemoteNamespace::open(&endpoint, 999, &options(false)).err().unwrap().errno,
        libc::ENOENT
    );

    unprivileged_peer_cannot_act_as_root(&a, &endpoint, dir.path());
    let status = server.sigterm_and_wait(Duration::from_secs(20)).unwrap();
    assert!(status.success(), "graceful shutdown (namespaces synced): {status:?}");
}

/// A builds, B sees and changes, A sees B's changes. Returns the inode of `/project`.
fn build_and_change_from_both_clients(a: &RemoteNamespace, b: &RemoteNamespace) -> u64 {
    let project = a.mkdir(&root(), ROOT_INO, b"project", 0o755, 0o022).unwrap();
    let data =
        a.create(&root(), project.ino, b"data.bin", FileKind::Regular, 0o644, 0, 0, true).unwrap();
    a.wrote(&root(), data.ino, 1 << 20).unwrap();
    let seen = b.lookup(&root(), ROOT_INO, b"project").unwrap();
    assert_eq!(seen.ino, project.ino);
    assert_eq!(b.lookup(&root(), project.ino, b"data.bin").unwrap().size, 1 << 20);
    b.link(&root(), data.ino, ROOT_INO, b"hard").unwrap();
    b.symlink(&root(), project.ino, b"latest", b"data.bin").unwrap();
    b.rename(&root(), project.ino, b"data.bin", project.ino, b"step-1.bin", 0).unwrap();
    assert_eq!(a.getattr(data.ino).unwrap().nlink, 2);
    assert_eq!(
        a.readlink(a.lookup(&root(), project.ino, b"latest").unwrap().ino).unwrap(),
        b"data.bin"
    );
    assert_eq!(a.lookup(&root(), project.ino, b"data.bin").unwrap_err().errno, libc::ENOENT);
    assert_eq!(
        a.mkdir(&root(), ROOT_INO, b"project", 0o755, 0).unwrap_err().errno,
        libc::EEXIST,
        "errno crosses the wire"
    );
    let public = a.mkdir(&root(), ROOT_INO, b"public", 0o1777, 0).unwrap();
    assert_eq!(public.mode, 0o1777);
    project.ino
}

/// 300 files in `project` page through readdir; statfs and the manifest see them.
fn many_entries_page_through_readdir(a: &RemoteNamespace, b: &RemoteNamespace, project: u64) {
    // Many entries page through readdir.
    for i in 0..300 {
        a.create(
            &root(),
            project,
            format!("f{i:04}").as_bytes(),
            FileKind::Regular,
            0o600,
            0,
            0,
            true,
        )
        .unwrap();
    }
    assert_eq!(tree(b).len(), 3 + 2 + 300);
    let statfs = b.statfs().unwrap();
    assert!(statfs.blocks > 0 && statfs.name_bytes_max == 255);
    let manifest = b.manifest().unwrap();
    assert_eq!(manifest.len(), 301, "one line per regular file, hard links once");
    assert!(manifest.iter().any(|m| m.path == b"hard" || m.path == b"project/step-1.bin"));
}

/// The unprivileged peer (a separate process as uid 4242) cannot act as root.
fn unprivileged_peer_cannot_act_as_root(a: &RemoteNamespace, endpoint: &Endpoint, dir: &Path) {
    run_unprivileged_child(endpoint, dir);
    let public_tree = tree(a);
    let made: Vec<_> =
        public_tree.iter().filter(|(path, ..)| path.starts_with("/public/")).collect();
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0].4, UNPRIVILEGED, "created as the peer's own uid, not the claimed root");
    assert!(
        a.lookup(&root(), ROOT_INO, b"by-root").is_err(),
        "the claimed root could not write the root directory"
    );
}

/// Runs `child_unprivileged_peer` as uid/gid 4242 (so the test must run as root).
fn run_unprivileged_child(endpoint: &Endpoint, dir: &Path) {
    assert_eq!(
        spillway_sys::user::euid(),
        0,
        "namespace_e2e must run as root (it re-runs itself as uid {UNPRIVILEGED} to check that \
         a server does not believe a non-root peer's stated identity); run `make test` as root, \
         as CI does"
    );
    use std::os::unix::process::CommandExt;
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_unprivileged_peer", "--nocapture", "--test-threads=1"])
        .env("SPILLWAY_NS_E2E_CHILD", endpoint.to_string())
        .current_dir(dir)
        .uid(UNPRIVILEGED)
        .gid(UNPRIVILEGED)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "unprivileged child failed:\n{text}");
    assert!(text.contains("1 passed"), "the child test did not run:\n{text}");
}

/// The unprivileged peer (runs only when re-executed by the test above).
#[test]
fn child_unprivileged_peer() {
    let Ok(endpoint) = std::env::var("SPILLWAY_NS_E2E_CHILD") else { return };
    assert_eq!(spillway_sys::user::uid(), UNPRIVILEGED);
    let endpoint: Endpoint = endpoint.parse().unwrap();
    let ns = RemoteNamespace::open(&endpoint, NAMESPACE, &options(false)).unwrap();
    let claimed_root = Caller { uid: 0, gid: 0, groups: vec![0], pid: 1 };
    // The root directory is 0755 root: the claimed root identity is not believed.
    let denied =
        ns.create(&claimed_root, ROOT_INO, b"by-root", FileKind::Regular, 0o644, 0, 0, true);
    assert_eq!(denied.unwrap_err().errno, libc::EACCES);
    let public = ns.lookup(&claimed_root, ROOT_INO, b"public").unwrap();
    let mine = ns
        .create(&claimed_root, public.ino, b"mine", FileKind::Regular, 0o644, 0, 0, true)
        .unwrap();
    assert_eq!(mine.uid, UNPRIVILEGED);
    let chown =
        ns.setattr(&claimed_root, mine.ino, &SetAttr { uid: Some(0), ..SetAttr::default() });
    assert_eq!(chown.unwrap_err().errno, libc::EPERM);
    let hard = ns.lookup(&claimed_root, ROOT_INO, b"hard").unwrap();
    let steal =
        ns.setattr(&claimed_root, hard.ino, &SetAttr { mode: Some(0o777), ..SetAttr::default() });
    assert_eq!(steal.unwrap_err().errno, libc::EPERM);
    let truncate = ns.setattr(
        &claimed_root,
        hard.ino,
        &SetAttr { size: Some(0), via_writable_handle: true, ..SetAttr::default() },
    );
    assert_eq!(truncate.unwrap_err().errno, libc::EACCES, "a write handle is not believed either");
    assert_eq!(ns.wrote(&claimed_root, hard.ino, 1 << 30).unwrap_err().errno, libc::EACCES);
    assert_eq!(ns.manifest().unwrap_err().errno, libc::EACCES);
    let squat = RemoteNamespace::open(&endpoint, NAMESPACE + 1, &options(true));
    assert_eq!(squat.err().unwrap().errno, libc::EPERM, "only root creates namespaces");
}

/// Two servers draining to one PFS; the namespace on server 0, file data striped over both.
/// After commit and drain, every live file is on the PFS under its namespace path with its
/// bytes, as their POSIX owners with their modes; dead generations and unlinked files are not
/// published.
#[test]
fn drained_mount_files_land_under_their_paths() {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    // A scratch directory: the drain creates there as each file's owner.
    std::fs::set_permissions(&pfs, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let (_servers, sockets) = draining_servers(dir.path(), &pfs);
    let epoch = EpochId(5);
    let ns = RemoteNamespace::open(
        &sockets[0],
        77,
        &RemoteOptions { data_epoch: epoch, ..options(true) },
    )
    .unwrap();
    let mut client = Client::connect(
        &sockets,
        ClientOptions {
            placement: Placement::Striped { stripe_unit_bytes: 64 * 1024, stripe_count: 2 },
            ..ClientOptions::default()
        },
    )
    .unwrap();
    client.begin_epoch(epoch);
    let written = write_live_dead_and_unlinked_files(&ns, &mut client, epoch);
    client.flush().unwrap();
    ns.sync().unwrap();
    client.commit_epoch(epoch).unwrap();
    client.request_drain(epoch, 1).unwrap();
    wait_until_drained(&mut client, epoch);

    let got = std::fs::read(pfs.join("results/run-1/field-final.dat")).unwrap();
    assert!(
        got.len() == written.deep.len() && same_bytes(&got, &written.deep),
        "results/run-1/field-final.dat differs"
    );
    let got = std::fs::read(pfs.join("summary.txt")).unwrap();
    assert!(
        got.len() == written.top.len() && same_bytes(&got, &written.top),
        "summary.txt differs"
    );
    assert_eq!(
        published_files(&pfs),
        ["results/empty.flag", "results/run-1/field-final.dat", "summary.txt"],
        "only live files, only under their paths"
    );
    assert_eq!(std::fs::metadata(pfs.join("results/empty.flag")).unwrap().len(), 0);
    // Each published file belongs to its POSIX owner, with its mode, not to the root drainer.
    use std::os::unix::fs::MetadataExt;
    let owner_and_mode = |path: &str| {
        let meta = std::fs::metadata(pfs.join(path)).unwrap();
        (meta.uid(), meta.gid(), meta.mode() & 0o7777)
    };
    assert_eq!(owner_and_mode("summary.txt"), (SUMMARY_OWNER, SUMMARY_OWNER, 0o640));
    assert_eq!(owner_and_mode("results/run-1/field-final.dat"), (0, 0, 0o644));
}

/// The owner (uid and gid) `summary.txt` is given through the namespace before the drain.
const SUMMARY_OWNER: u32 = 4243;

/// Two servers on Unix sockets draining to `pfs`, each with both as its drain peers.
fn draining_servers(dir: &Path, pfs: &Path) -> (Vec<ServerProcess>, Vec<Endpoint>) {
    let sockets: Vec<Endpoint> =
        (0..2).map(|i| Endpoint::Unix(dir.join(format!("s{i}.sock")))).collect();
    let servers: Vec<ServerProcess> = (0..2)
        .map(|i| {
            ServerProcess::builder(BIN, dir, &format!("s{i}"))
                .no_tcp()
                .unix_socket(dir.join(format!("s{i}.sock")))
                .pfs_dir(pfs)
                .drain_peers(&sockets, i)
                .rust_log("info")
                .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MIN", "20")
                .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MAX", "200")
                .start()
        })
        .collect();
    (servers, sockets)
}

/// The bytes of the two files that must be published.
struct LiveBytes {
    /// `results/run-1/field-final.dat`.
    deep: Vec<u8>,
    /// `summary.txt`, second generation.
    top: Vec<u8>,
}

/// Writes files that are renamed, rewritten after `O_TRUNC`, unlinked, or never written.
fn write_live_dead_and_unlinked_files(
    ns: &RemoteNamespace,
    client: &mut Client,
    epoch: EpochId,
) -> LiveBytes {
    // Writes `bytes` as the current generation of `ino`, then records the write.
    let mut write = |ino: u64, bytes: &[u8]| {
        let attr = ns.getattr(ino).unwrap();
        let mut file =
            client.create_file(epoch, &data_file_name(77, ino, attr.generation)).unwrap();
        client.write(&mut file, 0, bytes).unwrap();
        ns.wrote(&root(), ino, bytes.len() as u64).unwrap();
    };
    let a = ns.mkdir(&root(), ROOT_INO, b"results", 0o755, 0).unwrap();
    let b = ns.mkdir(&root(), a.ino, b"run-1", 0o755, 0).unwrap();
    let deep =
        ns.create(&root(), b.ino, b"field.dat", FileKind::Regular, 0o644, 0, 0, true).unwrap();
    let deep_bytes = pattern(1, 300_000);
    write(deep.ino, &deep_bytes);
    let top =
        ns.create(&root(), ROOT_INO, b"summary.txt", FileKind::Regular, 0o644, 0, 0, true).unwrap();
    write(top.ino, &pattern(2, 1000));
    // Rewritten after O_TRUNC: the first generation is dead, the second is the file.
    ns.open(&root(), top.ino, libc::O_WRONLY | libc::O_TRUNC).unwrap();
    let top_bytes = pattern(3, 70_000);
    write(top.ino, &top_bytes);
    // Written, then unlinked: never published.
    let gone =
        ns.create(&root(), ROOT_INO, b"scratch.tmp", FileKind::Regular, 0o644, 0, 0, true).unwrap();
    write(gone.ino, &pattern(4, 5000));
    ns.unlink(&root(), ROOT_INO, b"scratch.tmp").unwrap();
    // Given away (chown, chmod): published as its new owner with its new mode.
    let given = SetAttr {
        uid: Some(SUMMARY_OWNER),
        gid: Some(SUMMARY_OWNER),
        mode: Some(0o640),
        ..SetAttr::default()
    };
    ns.setattr(&root(), top.ino, &given).unwrap();
    // Created but never written: the mount creates its (empty) store file at create time.
    let empty =
        ns.create(&root(), a.ino, b"empty.flag", FileKind::Regular, 0o644, 0, 0, true).unwrap();
    client.create_file(epoch, &data_file_name(77, empty.ino, empty.generation)).unwrap();
    // Renamed after its data was written: published under the new name.
    ns.rename(&root(), b.ino, b"field.dat", b.ino, b"field-final.dat", 0).unwrap();
    LiveBytes { deep: deep_bytes, top: top_bytes }
}

/// Waits (at most 30 s) until every server reports `epoch` drained.
fn wait_until_drained(client: &mut Client, epoch: EpochId) {
    let started = Instant::now();
    loop {
        let status = client.drain_status().unwrap();
        let drained = status.iter().all(|(_, list)| {
            list.iter().any(|d| d.epoch == epoch && d.state == DrainState::Drained)
        });
        if drained {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "not drained: {status:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every file under `pfs`, as a path relative to it, sorted.
fn published_files(pfs: &Path) -> Vec<String> {
    let mut published = Vec::new();
    let mut stack = vec![pfs.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            } else if entry.path() == pfs.join(spillway_drain::pfs::PFS_MARKER_FILE) {
                // The administrator's PFS marker, not a drained file.
            } else {
                published
                    .push(entry.path().strip_prefix(pfs).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    published.sort();
    published
}

/// The journal file of namespace `id` anywhere under `dir`, if there is one.
fn journal_of(dir: &Path, id: u64) -> Option<std::path::PathBuf> {
    let name = format!("namespace-{id}.journal");
    spillway_harness::files_under(dir)
        .into_iter()
        .find(|path| path.file_name().and_then(|n| n.to_str()) == Some(name.as_str()))
}

/// Namespaces go with their data epoch: deleting the epoch (what the manager does at a
/// reservation's teardown) removes the namespace's journal, and the server answers ESTALE for
/// it, to a client that still had it open and to an open that may create it; another epoch's
/// namespace stays. After a restart, when nothing is open, a deletion finds the journal on disk.
#[test]
fn namespaces_are_removed_with_their_data_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::builder(BIN, dir.path(), "ns-gc").start();
    let endpoint = server.endpoint().clone();
    let with_epoch = |epoch: u64| RemoteOptions { data_epoch: EpochId(epoch), ..options(true) };
    let doomed = RemoteNamespace::open(&endpoint, 71, &with_epoch(710)).unwrap();
    let kept = RemoteNamespace::open(&endpoint, 72, &with_epoch(720)).unwrap();
    for ns in [&doomed, &kept] {
        ns.mkdir(&root(), ROOT_INO, b"run", 0o755, 0).unwrap();
        ns.sync().unwrap();
    }
    let mut client =
        Client::connect(std::slice::from_ref(&endpoint), ClientOptions::default()).unwrap();
    for epoch in [710, 720] {
        let mut file = client.create_file(EpochId(epoch), "data").unwrap();
        client.write(&mut file, 0, b"bytes").unwrap();
        client.flush().unwrap();
    }
    assert!(journal_of(dir.path(), 71).is_some() && journal_of(dir.path(), 72).is_some());

    client.delete_epoch(EpochId(710)).unwrap();
    assert_eq!(journal_of(dir.path(), 71), None, "the journal outlived its data epoch");
    assert!(journal_of(dir.path(), 72).is_some(), "another epoch's namespace was removed");
    let stale = doomed.mkdir(&root(), ROOT_INO, b"more", 0o755, 0).unwrap_err();
    assert_eq!(stale.errno, libc::ESTALE, "{stale}");
    assert!(stale.to_string().contains("removed with its data epoch 710"), "{stale}");
    // Not even brought back empty by an open that may create (a mount's reconnection).
    let gone = RemoteNamespace::open(&endpoint, 71, &with_epoch(710)).err().unwrap();
    assert_eq!(gone.errno, libc::ESTALE, "{gone}");
    assert!(kept.lookup(&root(), ROOT_INO, b"run").is_ok());

    // Nothing open after a restart: the deletion reads the journals' headers.
    drop((doomed, kept, client));
    assert!(server.sigterm_and_wait(Duration::from_secs(20)).unwrap().success());
    server.restart().unwrap();
    let mut client =
        Client::connect(std::slice::from_ref(&endpoint), ClientOptions::default()).unwrap();
    client.delete_epoch(EpochId(720)).unwrap();
    assert_eq!(journal_of(dir.path(), 72), None, "a journal not open outlived its data epoch");
    assert!(server.log_text().contains("namespaces removed with their data epoch"));
    assert!(!server.log_text().contains("panicked"));
}
