//! The test cluster end to end: hosts as Linux namespaces (scripts/cluster/,
//! `spillway_harness::Cluster`), and Spillway across them as on real nodes.
//!
//! - Up then down leaves no network namespace, interface, process or mount, checked from the
//!   machine itself; each host has its own hostname and `/tmp`.
//! - Servers on hosts 1-3 (munge authentication, each on its own host's address) and a manager
//!   on host 1 (registering them by those addresses; its heartbeats see them up) serve the CLI on
//!   host 4: a reservation, a stage-in and a stage-out through the client (bytes compared), a
//!   `spillway mount` on host 4 that host 3 and the machine do not see, and a stage-out through
//!   the drain path that publishes the files on the shared PFS directory.
//!
//! Needs root (namespaces, FUSE, munged); fails with that message otherwise.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use spillway_harness::{pattern, Cluster, Host, ManagerProcess, ServerProcess};
use spillway_proto::Endpoint;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const MIB: usize = 1 << 20;
/// Every server listens on this port of its own host's address (one network namespace each).
const SERVER_PORT: u16 = 7200;
const MANAGER_PORT: u16 = 7300;
/// The unprivileged uid commands run as in a host (`nobody` on Debian).
const NOBODY: u32 = 65534;

fn require_root() {
    assert_eq!(
        spillway_sys::user::euid(),
        0,
        "cluster_e2e needs root (network and mount namespaces, FUSE, munged); run `make test` \
         as root, as CI does"
    );
}

/// Runs `command`, expects success, returns its output; the error shows both streams.
fn run(command: &mut Command, what: &str) -> Output {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `sh -c script` inside `host`; its stdout.
fn shell(host: &Host, script: &str) -> String {
    text(&run(host.command("sh").args(["-c", script]), &format!("{} on {}", script, host.name())))
}

/// The machine's own view: network namespaces, interfaces, mount table.
fn outside_view() -> (String, String, String) {
    let netns = text(&run(Command::new("ip").args(["netns", "list"]), "ip netns list"));
    let links = text(&run(Command::new("ip").args(["-o", "link", "show"]), "ip link"));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    (netns, links, mounts)
}

/// The interface names of `ip -o link show` output, sorted.
fn interface_names(links: &str) -> Vec<String> {
    let mut names: Vec<String> =
        links.lines().filter_map(|l| l.split(':').nth(1)).map(|n| n.trim().to_string()).collect();
    names.sort();
    names
}

/// Pids of the processes in a network namespace, seen from the machine.
fn pids_in(netns: &str) -> Vec<String> {
    text(&run(Command::new("ip").args(["netns", "pids", netns]), "ip netns pids"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Whether `pid` is a live process: neither gone nor a zombie its parent has not reaped yet
/// (stopped processes are reparented to init, which reaps them when it gets to it).
fn running(pid: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesized command name, which may hold spaces.
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some(Some('Z' | 'X')))
}

#[test]
fn up_then_down_leaves_no_namespace_interface_process_or_mount() {
    require_root();
    let (_, links_before, _) = outside_view();
    let cluster = Cluster::started(3);
    let dir = cluster.dir().to_path_buf();
    let tag = cluster.tag().to_string();
    let (netns, links_up, _) = outside_view();
    assert_eq!(
        interface_names(&links_up),
        interface_names(&links_before),
        "up.sh changed the machine's own interfaces"
    );
    for host in cluster.hosts() {
        assert!(netns.contains(host.netns()), "{} missing from {netns}", host.netns());
        assert_eq!(shell(host, "hostname").trim(), host.name());
        // Its own /tmp: a file written there is in no other host's /tmp nor the machine's.
        shell(host, &format!("echo {} > /tmp/whoami", host.name()));
    }
    for host in cluster.hosts() {
        assert_eq!(shell(host, "cat /tmp/whoami").trim(), host.name());
    }
    // An unprivileged user in a host gets credentials from the host's munged that another
    // host's munged accepts (one key for the cluster), with no socket flag.
    let credential =
        run(cluster.host(0).command_as(NOBODY, "munge").arg("-n"), "munge -n as nobody on host1");
    let mut unmunge = cluster
        .host(2)
        .command("unmunge")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    unmunge.stdin.take().unwrap().write_all(&credential.stdout).unwrap();
    let decoded = unmunge.wait_with_output().unwrap();
    let decoded_text = text(&decoded);
    assert!(decoded.status.success(), "unmunge on host3: {decoded_text}");
    assert!(decoded_text.contains(&format!("({NOBODY})")), "{decoded_text}");
    assert!(decoded_text.contains("ENCODE_HOST:     host1"), "{decoded_text}");
    assert_ne!(
        std::fs::read_to_string("/tmp/whoami").unwrap_or_default().trim(),
        cluster.host(0).name(),
        "a host's /tmp leaked to the machine"
    );
    // Processes to stop: one that obeys SIGTERM, and on host1, which stays up until down.sh,
    // one that ignores it (down.sh must SIGKILL it).
    for (host, script) in [
        (cluster.host(1), "sleep 600 >/dev/null 2>&1 &"),
        (cluster.host(0), "trap '' TERM; sleep 600 >/dev/null 2>&1 &"),
    ] {
        shell(host, script);
    }
    let pids: Vec<String> = cluster.hosts().iter().flat_map(|h| pids_in(h.netns())).collect();
    assert!(pids.len() >= 5, "holders, munged's and sleeps: {pids:?}");
    let mut cluster = cluster;
    host_removed_for_good_while_the_others_run(&mut cluster);

    cluster.down().unwrap();

    let (netns, links, mounts) = outside_view();
    assert!(!netns.contains(&format!("spw-{tag}-")), "namespaces left: {netns}");
    assert_eq!(
        interface_names(&links),
        interface_names(&links_before),
        "interfaces of the machine changed"
    );
    assert!(!mounts.contains(dir.to_str().unwrap()), "mounts left: {mounts}");
    for pid in pids {
        assert!(!running(&pid), "process {pid} is still running");
    }
    assert!(!dir.exists(), "{} left", dir.display());
}

/// A cluster whose owner (a test process) dies without stopping it is stopped by its watchdog:
/// a killed test run leaves nothing behind.
#[test]
fn a_cluster_whose_owner_dies_is_stopped() {
    require_root();
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cluster");
    let mut owner = Command::new("sleep").arg("600").spawn().unwrap();
    let parent = std::env::temp_dir().join(format!("spillway-orphan-{}", std::process::id()));
    let dir = parent.join("cluster");
    let up = run(
        Command::new(scripts.join("up.sh"))
            .arg(&dir)
            .arg("2")
            .env("SPILLWAY_CLUSTER_OWNER_PID", owner.id().to_string()),
        "up.sh with an owner",
    );
    let tag = text(&up).lines().find_map(|l| l.strip_prefix("CLUSTER_TAG=")).unwrap().to_string();
    owner.kill().unwrap();
    owner.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (netns, _, _) = outside_view();
        if !netns.contains(&format!("spw-{tag}-")) && !dir.exists() {
            break;
        }
        if Instant::now() >= deadline {
            // Clean up for the next run before failing.
            let _ = Command::new(scripts.join("down.sh")).arg(&dir).status();
            panic!(
                "the watchdog did not stop cluster {tag} ({netns}); log: {:?}",
                std::fs::read_to_string(dir.join("log/watchdog.log"))
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::remove_dir_all(&parent).unwrap();
}

/// host3 is lost (its SSD directory with it), host2 silently (link cut first): their
/// namespaces, processes and directories are gone, host1 still reaches nobody but works.
fn host_removed_for_good_while_the_others_run(cluster: &mut Cluster) {
    let (host2, host3) = (cluster.host(1).clone(), cluster.host(2).clone());
    std::fs::write(host3.ssd_dir().join("segment"), b"committed bytes").unwrap();
    let pids = pids_in(host3.netns());
    assert!(!pids.is_empty());
    cluster.remove_host(host3.name()).unwrap();
    cluster.remove_host_silently(host2.name()).unwrap();
    let (netns, _, _) = outside_view();
    for host in [&host2, &host3] {
        assert!(!netns.contains(host.netns()), "{} still exists: {netns}", host.netns());
        assert!(cluster.is_removed(host.name()));
        let output = host.command("true").output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains("no host"), "{stderr}");
    }
    assert!(!host3.ssd_dir().exists(), "the lost host's SSD directory is still there");
    for pid in pids {
        assert!(!running(&pid), "process {pid} of host3 survived");
    }
    let host1 = cluster.host(0);
    assert_eq!(shell(host1, "hostname").trim(), "host1");
    assert!(host1.ssd_dir().is_dir());
    // Removing it again is not an error (a test's cleanup may race its own removal).
    cluster.remove_host(host3.name()).unwrap();
}

/// The manager on host 1, the CLI on host 4.
struct Site<'a> {
    cluster: &'a Cluster,
    manager: ManagerProcess,
}

impl Site<'_> {
    fn client_host(&self) -> &Host {
        self.cluster.host(3)
    }

    /// The CLI on host 4 as root, `--json`, expecting success.
    fn json(&self, args: &[&str]) -> Value {
        let mut command = self.manager.cli_in_host(self.client_host(), Path::new(BIN), None);
        command.args(args).arg("--json");
        let output = command.stdin(Stdio::null()).output().unwrap();
        assert!(
            output.status.success(),
            "spillway {args:?} on host4 failed: {}\nmanager log:\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.manager.log_text()
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!("spillway {args:?}: not JSON ({e}): {}", String::from_utf8_lossy(&output.stdout))
        })
    }
}

#[test]
fn servers_on_three_hosts_serve_a_client_on_a_fourth() {
    require_root();
    let cluster = Cluster::started(4);
    let pfs = cluster.dir().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    let (servers, endpoints) = servers_on_hosts_1_to_3(&cluster, &pfs);
    let manager = ManagerProcess::start_in_host(
        cluster.host(0),
        MANAGER_PORT,
        Path::new(BIN),
        &cluster.dir().join("manager"),
        &[
            ("SPILLWAY_MANAGER_FRAGMENT_BYTES", &(8 * MIB).to_string()),
            ("SPILLWAY_MANAGER_STRIPE_SERVERS_MAX", "3"),
            ("SPILLWAY_MANAGER_HEARTBEAT_MS", "200"),
            ("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "none"),
        ],
    );
    let site = Site { cluster: &cluster, manager };
    servers_registered_by_host_address_and_up(&site, &endpoints, &pfs);
    let (reservation, mount_args) = reservation_over_hosts_1_to_3(&site);
    let id = reservation["id"].as_u64().unwrap().to_string();

    let files = stage_in_and_out_through_the_client(&site, &id);
    mount_on_host4_hidden_from_host3_and_the_machine(&site, &mount_args, &files);
    drain_publishes_on_the_shared_pfs(&site, &id, &pfs, &files);
    // A mount left behind on host 4, as a crashed job would: down.sh unmounts and stops it
    // (with the servers still running) and leaves nothing.
    let point = cluster.dir().join("mnt");
    run(
        cluster.host(3).command(BIN).args(&mount_args).arg("--background").arg(&point),
        "spillway mount on host4 (left behind)",
    );
    drop(site);
    let dir = cluster.dir().to_path_buf();
    cluster.down().unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(dir.to_str().unwrap()), "mounts left: {mounts}");
    assert!(!dir.exists());
    drop(servers);
}

/// A server on each of hosts 1-3, on its host's address with munge, draining to `pfs`.
fn servers_on_hosts_1_to_3(cluster: &Cluster, pfs: &Path) -> (Vec<ServerProcess>, Vec<Endpoint>) {
    let endpoints: Vec<Endpoint> =
        (0..3).map(|i| Endpoint::Tcp(cluster.host(i).socket_address(SERVER_PORT))).collect();
    let servers: Vec<ServerProcess> = (0..3)
        .map(|i| {
            ServerProcess::builder(BIN, cluster.dir(), &format!("s{}", i + 1))
                .in_host(cluster.host(i))
                .listen(&cluster.host(i).socket_address(SERVER_PORT).to_string())
                .pfs_dir(pfs)
                .drain_peers(&endpoints, i)
                .rust_log("info")
                .start()
        })
        .collect();
    // exec.sh execs its way to the daemon: the harness's child is the server itself (so it is
    // killed and reaped as on one host), in its host's network namespace.
    for (server, host) in servers.iter().zip(cluster.hosts()) {
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", server.pid())).unwrap();
        assert_eq!(comm.trim(), "spillway", "the child of {} is not the server", server.name());
        assert!(pids_in(host.netns()).contains(&server.pid().to_string()));
    }
    (servers, endpoints)
}

/// A reservation made from host 4, striped over the three servers; and the `spillway mount`
/// arguments (without the mount point) of its namespace.
fn reservation_over_hosts_1_to_3(site: &Site<'_>) -> (Value, Vec<String>) {
    let reservation = site.json(&["reservation", "create", "--capacity", "24MiB"]);
    let mut servers: Vec<String> = reservation["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    let in_order = servers.join(",");
    servers.sort();
    let mut expected: Vec<String> =
        (0..3).map(|i| site.cluster.host(i).socket_address(SERVER_PORT).to_string()).collect();
    expected.sort();
    assert_eq!(servers, expected, "{reservation}");
    let mount_args = vec![
        "mount".to_string(),
        "--servers".into(),
        in_order,
        "--namespace-id".into(),
        reservation["namespace_id"].to_string(),
        "--epoch".into(),
        reservation["epoch"].to_string(),
    ];
    (reservation, mount_args)
}

/// Root on host 4 adds a pool and the three servers by their hosts' addresses; the manager's
/// heartbeats (from host 1, with munge) see all three up.
fn servers_registered_by_host_address_and_up(site: &Site<'_>, endpoints: &[Endpoint], pfs: &Path) {
    site.json(&["pool", "create", "cluster", "--granularity", "8MiB"]);
    for endpoint in endpoints {
        let address = endpoint.to_string();
        let address = address.trim_start_matches("tcp://");
        let added = site.json(&[
            "server",
            "add",
            address,
            "--pool",
            "cluster",
            "--capacity",
            "64MiB",
            "--pfs",
            pfs.to_str().unwrap(),
        ]);
        assert_eq!(added["address"], address, "{added}");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = site.json(&["server", "list"]);
        // Seen by a heartbeat (a new server counts as healthy until one misses), over munge.
        let up = list
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| {
                s["healthy"] == true && s["last_seen_unix_s"].is_u64() && s["auth"] == "munge"
            })
            .count();
        if up == endpoints.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "heartbeats did not see the servers up: {list}\nmanager log:\n{}",
            site.manager.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Files staged in from a directory every host shares, then staged out and compared: bytes
/// written, committed and read back by the client on host 4 over the servers' addresses.
fn stage_in_and_out_through_the_client(site: &Site<'_>, id: &str) -> Vec<(String, Vec<u8>)> {
    let dir = site.cluster.dir();
    let files =
        vec![("a.dat".to_string(), pattern(1, 3 * MIB + 4321)), ("b.dat".into(), pattern(2, 777))];
    let source = dir.join("source");
    std::fs::create_dir(&source).unwrap();
    for (name, data) in &files {
        std::fs::write(source.join(name), data).unwrap();
    }
    let report = site.json(&[
        "stage-in",
        "--reservation",
        id,
        source.to_str().unwrap(),
        "/input",
        "--progress",
        "none",
    ]);
    assert_eq!(report["files_copied"], files.len(), "{report}");
    let out = dir.join("staged-out");
    let report = site.json(&["stage-out", "--reservation", id, "/input", out.to_str().unwrap()]);
    assert_eq!(report["files_copied"], files.len(), "{report}");
    for (name, data) in &files {
        assert!(std::fs::read(out.join(name)).unwrap() == *data, "{name}: bytes differ");
    }
    files
}

/// A `spillway mount` of the reservation on host 4, on a directory every host shares: host 4
/// reads the staged files and writes a new one through it; host 3 and the machine see only the
/// empty directory and no such mount.
fn mount_on_host4_hidden_from_host3_and_the_machine(
    site: &Site<'_>,
    mount_args: &[String],
    files: &[(String, Vec<u8>)],
) {
    let dir = site.cluster.dir();
    let point = dir.join("mnt");
    std::fs::create_dir(&point).unwrap();
    let point_text = point.to_str().unwrap();
    let host4 = site.client_host();
    run(
        host4
            .command(BIN)
            .args(mount_args)
            .arg("--background")
            .arg("--log")
            .arg(dir.join("mount.log"))
            .arg(&point),
        "spillway mount on host4",
    );
    let written = pattern(3, 2 * MIB + 17);
    std::fs::write(dir.join("new.src"), &written).unwrap();
    shell(
        host4,
        &format!(
            "cp {0}/new.src {1}/input/new.dat && cmp {0}/new.src {1}/input/new.dat",
            dir.display(),
            point_text
        ),
    );
    for (name, data) in files {
        let back = run(host4.command("cat").arg(point.join("input").join(name)), "cat on host4");
        assert!(back.stdout == *data, "{name} through the mount on host4: bytes differ");
    }
    let mounted = |mountinfo: &str| mountinfo.lines().any(|l| l.contains(point_text));
    assert!(mounted(&shell(host4, "cat /proc/self/mountinfo")), "host4 does not see its mount");
    let host3 = site.cluster.host(2);
    assert!(!mounted(&shell(host3, "cat /proc/self/mountinfo")), "host3 sees host4's mount");
    assert_eq!(shell(host3, &format!("ls -A {point_text}")), "", "host3 sees files in the mount");
    assert!(
        !mounted(&std::fs::read_to_string("/proc/self/mountinfo").unwrap()),
        "the machine sees it"
    );
    assert_eq!(std::fs::read_dir(&point).unwrap().count(), 0, "the machine sees files in it");
    run(host4.command(BIN).args(["umount", point_text]), "spillway umount on host4");
    assert!(!mounted(&shell(host4, "cat /proc/self/mountinfo")), "host4 still has its mount");
}

/// Stage-out through the drain path: the servers drain the epoch to the shared PFS directory and
/// the copy is read from the drained files, which hold the right bytes.
fn drain_publishes_on_the_shared_pfs(
    site: &Site<'_>,
    id: &str,
    pfs: &Path,
    files: &[(String, Vec<u8>)],
) {
    let out = site.cluster.dir().join("drained-out");
    let report = site.json(&[
        "stage-out",
        "--drain",
        "--drain-timeout-s",
        "120",
        "--reservation",
        id,
        "/input",
        out.to_str().unwrap(),
    ]);
    let written = std::fs::read(site.cluster.dir().join("new.src")).unwrap();
    let mut expected: Vec<(String, Vec<u8>)> = files.to_vec();
    expected.push(("new.dat".into(), written));
    assert_eq!(report["files_copied"], expected.len(), "{report}");
    assert_eq!(report["files_from_drained_copy"], expected.len(), "{report}");
    let published = published_files(pfs);
    for (name, data) in &expected {
        assert!(std::fs::read(out.join(name)).unwrap() == *data, "{name}: bytes differ");
        assert!(
            published.iter().any(|p| std::fs::read(p).unwrap() == *data),
            "{name}: no file with its bytes on the PFS ({published:?})"
        );
    }
}

/// Every regular file under `root` (the drain's marker left out).
fn published_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if !path.ends_with(".spillway-pfs") {
                found.push(path);
            }
        }
    }
    found
}
