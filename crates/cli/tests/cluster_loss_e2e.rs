//! A host lost for good on the namespace cluster (scripts/cluster/, issue 16): its namespace
//! deleted with its SSD directory (`Cluster::remove_host`), as a node that never comes back.
//!
//! Five hosts: the manager and the clients on host 1, a server on each of hosts 2-5 (munge
//! authentication, each its own failure domain, its host name). A reservation spans three of the
//! servers, the fourth is the spare re-replication copies onto. The clients are threads of this
//! test that enter host 1's network namespace (`setns`) and take munge credentials from host 1's
//! `munged`.
//!
//! - Lost during ingest: a replicas=2 writer streams an epoch while a host of the reservation is
//!   removed; that epoch's writes or commit fail with EIO naming the lost server
//!   (docs/design/replication.md, "Client"), and every byte of the epoch committed before reads
//!   back exactly from the survivors.
//! - Lost right after a `replicated` commit: every committed byte reads back from the survivors;
//!   `spillway server lost` degrades the reservation and re-replication restores two copies on
//!   two live hosts for every piece (read back through the new server list).
//! - Power lost during a commit (replicas=2; no FIN or RST reaches anyone): the commit fails
//!   with EIO naming the server within the keepalive bound instead of waiting, and the epoch
//!   committed before drains exactly from the survivors.
//! - Lost during the drain (replicas=2): the survivors drain every file exactly to the PFS.
//! - Lost with replicas=1 before the drain: the survivors report exactly the files and byte
//!   ranges only the lost server held, publish exactly the other files, and `spillway drain
//!   status` names the lost server.
//!
//! Needs root (namespaces, munged); fails with that message otherwise.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use spillway_client::{Client, ClientError, ClientOptions, Placement};
use spillway_harness::{pattern, Cluster, Host, ManagerProcess, ServerProcess};
use spillway_proto::{Durability, Endpoint};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const MIB: usize = 1 << 20;
const SERVER_PORT: u16 = 7200;
const MANAGER_PORT: u16 = 7300;
/// Stripe unit of the test clients: a piece is 1 MiB, each on two servers.
const STRIPE: u64 = MIB as u64;
/// Bound on waiting for the manager or the drains to see a change.
const WAIT: Duration = Duration::from_secs(90);

fn require_root() {
    assert_eq!(
        spillway_sys::user::euid(),
        0,
        "cluster_loss_e2e needs root (network and mount namespaces, munged); run `make test` \
         as root, as CI does"
    );
}

/// Runs `command`; the output, whatever the status.
fn output_of(command: &mut Command, what: &str) -> Output {
    command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {command:?}: {e}"))
}

/// What the tests need of a host to run a client thread in it.
#[derive(Clone)]
struct ClientHost {
    netns: String,
    munge_socket: PathBuf,
}

impl ClientHost {
    fn of(cluster: &Cluster, host: &Host) -> ClientHost {
        let pid_file = cluster.dir().join(format!("run/{}.pid", host.name()));
        let holder = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()));
        // The host's munged socket is on a tmpfs of its mount namespace, reached through its
        // holder process's root.
        let munge_socket =
            PathBuf::from(format!("/proc/{}/root/run/munge/munge.socket.2", holder.trim()));
        ClientHost { netns: host.netns().to_string(), munge_socket }
    }

    /// Moves the calling thread (and the threads it starts) into the host's network namespace.
    fn enter(&self) {
        let path = format!("/run/netns/{}", self.netns);
        let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: setns on a descriptor we own; it changes only this thread's namespace.
        let done = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(done, 0, "setns {path}: {}", std::io::Error::last_os_error());
    }

    /// Runs `f` on a thread inside the host.
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                self.enter();
                f()
            })
            .join()
            .unwrap()
        })
    }

    /// A replicas=`replicas` client of `servers` (call inside the host).
    fn client(&self, servers: &[String], replicas: u32, durability: Durability) -> Client {
        let endpoints: Vec<Endpoint> = servers.iter().map(|a| a.parse().unwrap()).collect();
        let options = ClientOptions {
            placement: Placement::Striped { stripe_unit_bytes: STRIPE, stripe_count: 3 },
            replicas,
            durability,
            munge_socket: Some(self.munge_socket.clone()),
            // A lost host never comes back: give up reconnecting to it soon.
            reconnect_wait_max: Duration::from_secs(2),
            ..ClientOptions::default()
        };
        Client::connect(&endpoints, options).unwrap_or_else(|e| panic!("connect {servers:?}: {e}"))
    }
}

/// The cluster with its manager and servers.
struct Site {
    servers: Vec<Option<ServerProcess>>,
    /// Server addresses, in host order (host2 … host5).
    addresses: Vec<String>,
    manager: ManagerProcess,
    pfs: PathBuf,
    client_host: ClientHost,
    cluster: Cluster,
}

impl Site {
    fn start() -> Site {
        let cluster = Cluster::started(5);
        let pfs = cluster.dir().join("pfs");
        std::fs::create_dir(&pfs).unwrap();
        let hosts = &cluster.hosts()[1..];
        let endpoints: Vec<Endpoint> =
            hosts.iter().map(|h| Endpoint::Tcp(h.socket_address(SERVER_PORT))).collect();
        let servers = hosts
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let server =
                    ServerProcess::builder(BIN, cluster.dir(), &format!("s-{}", host.name()))
                        .in_host(host)
                        .listen(&host.socket_address(SERVER_PORT).to_string())
                        .pfs_dir(&pfs)
                        .drain_peers(&endpoints, i)
                        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MIN", "20")
                        .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MAX", "200")
                        .env("SPILLWAY_DRAIN_WRITE_BYTES_MAX", MIB.to_string())
                        .rust_log("info")
                        .start();
                Some(server)
            })
            .collect();
        let addresses = hosts.iter().map(|h| h.socket_address(SERVER_PORT).to_string()).collect();
        let manager = ManagerProcess::start_in_host(
            cluster.host(0),
            MANAGER_PORT,
            Path::new(BIN),
            &cluster.dir().join("manager"),
            &[
                ("SPILLWAY_MANAGER_FRAGMENT_BYTES", &(8 * MIB).to_string()),
                ("SPILLWAY_MANAGER_STRIPE_SERVERS_MAX", "3"),
                ("SPILLWAY_MANAGER_HEARTBEAT_MS", "200"),
                ("SPILLWAY_MANAGER_HEARTBEAT_MISSES_MAX", "2"),
                ("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "none"),
            ],
        );
        let client_host = ClientHost::of(&cluster, cluster.host(0));
        let site = Site { servers, addresses, manager, pfs, client_host, cluster };
        site.add_servers();
        site
    }

    /// The CLI on host 1 as root.
    fn cli(&self, args: &[&str]) -> Output {
        let mut command = self.manager.cli_in_host(self.cluster.host(0), Path::new(BIN), None);
        output_of(command.args(args), &format!("spillway {args:?}"))
    }

    /// The CLI on host 1, `--json`, expecting success.
    fn json(&self, args: &[&str]) -> Value {
        let output = self.cli(&[args, &["--json"]].concat());
        assert!(
            output.status.success(),
            "spillway {args:?} on host1 failed: {}\nmanager log:\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.manager.log_text()
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!("spillway {args:?}: not JSON ({e}): {}", String::from_utf8_lossy(&output.stdout))
        })
    }

    /// A pool with the four servers; returns once heartbeats taught the manager their hosts.
    fn add_servers(&self) {
        self.json(&["pool", "create", "cluster", "--granularity", "8MiB"]);
        let pfs = self.pfs.to_str().unwrap();
        for address in &self.addresses {
            let add = ["server", "add", address, "--pool", "cluster", "--capacity", "96MiB"];
            self.json(&[&add[..], &["--pfs", pfs]].concat());
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let list = self.json(&["server", "list"]);
            let known = list.as_array().unwrap().iter().filter(|s| {
                s["healthy"] == true && s["failure_domain"].is_string() && s["auth"] == "munge"
            });
            if known.count() == self.addresses.len() {
                return;
            }
            assert!(Instant::now() < deadline, "servers never seen up: {list}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A reservation named `name` with `replicas` copies: (its servers in order, its epoch).
    fn reservation(&self, name: &str, replicas: u32) -> (Vec<String>, EpochId) {
        let k = replicas.to_string();
        let created = self.json(&[
            "reservation",
            "create",
            "--capacity",
            "48MiB",
            "--replicas",
            &k,
            "--persistent",
            name,
        ]);
        let servers = string_list(&created["servers"]);
        assert_eq!(servers.len(), 3, "{created}");
        (servers, EpochId(created["epoch"].as_u64().unwrap()))
    }

    /// The host of the server at `address`, removed for good; its process reaped.
    fn lose(&mut self, address: &str) -> String {
        self.remove(address, false)
    }

    /// [`lose`](Self::lose) as a power loss: its link is cut first, so nobody gets a FIN or RST.
    fn lose_power(&mut self, address: &str) -> String {
        self.remove(address, true)
    }

    /// The server at `address` stops (SIGSTOP): its kernel still acknowledges what it is sent,
    /// nothing is answered.
    fn freeze(&self, address: &str) {
        let index = self.addresses.iter().position(|a| a == address).unwrap();
        let pid = self.servers[index].as_ref().unwrap().pid();
        // SAFETY: a signal to our own child process.
        let done = unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
        assert_eq!(done, 0, "SIGSTOP {pid}: {}", std::io::Error::last_os_error());
    }

    fn remove(&mut self, address: &str, silently: bool) -> String {
        let index = self.addresses.iter().position(|a| a == address).unwrap();
        let host = self.cluster.host(index + 1).clone();
        if silently {
            self.cluster.remove_host_silently(host.name()).unwrap();
        } else {
            self.cluster.remove_host(host.name()).unwrap();
        }
        assert!(!host.ssd_dir().exists(), "{}: SSD directory left", host.name());
        drop(self.servers[index].take());
        host.name().to_string()
    }

    /// `spillway drain start` of `epoch` from host 1, asking the servers but `victim`.
    fn drain_from_survivors(&self, servers: &[String], victim: &str, epoch: EpochId) {
        let survivors: Vec<String> =
            servers.iter().filter(|s| *s != victim).map(|a| format!("tcp://{a}")).collect();
        let epoch = epoch.0.to_string();
        let args = ["drain", "start", &epoch, "--servers", &survivors.join(",")];
        let output =
            output_of(self.cluster.host(0).command(BIN).args(args), "spillway drain start");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    }

    /// `spillway drain status` over `servers` from host 1 (text, or `json`).
    fn drain_status(&self, servers: &[String], json: bool) -> String {
        let list: Vec<String> = servers.iter().map(|a| format!("tcp://{a}")).collect();
        let mut command = self.cluster.host(0).command(BIN);
        command.args(["drain", "status", "--servers", &list.join(",")]);
        if json {
            command.arg("--json");
        }
        let output = output_of(&mut command, "spillway drain status");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    }
}

fn string_list(value: &Value) -> Vec<String> {
    value.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
}

/// Writes `files` into `epoch` and commits.
fn write_and_commit(client: &mut Client, epoch: EpochId, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        let mut file = client.create_file(epoch, name).unwrap();
        client.write(&mut file, 0, data).unwrap();
    }
    client.commit_epoch(epoch).unwrap();
}

/// Reads every file back whole through `client` and compares.
fn read_back(client: &mut Client, epoch: EpochId, files: &[(String, Vec<u8>)], when: &str) {
    for (name, data) in files {
        let file = client.open_file(epoch, name).unwrap_or_else(|e| panic!("{when}: {name}: {e}"));
        let mut back = vec![0u8; data.len()];
        client.read(&file, 0, &mut back).unwrap_or_else(|e| panic!("{when}: {name}: {e}"));
        assert!(back == *data, "{when}: {name}: bytes differ");
    }
}

/// Checkpoint files of an epoch: sizes not multiples of the stripe.
fn checkpoint(seed: u64) -> Vec<(String, Vec<u8>)> {
    vec![
        ("ckpt/a.dat".to_string(), pattern(seed, 7 * MIB + 4321)),
        ("ckpt/b.dat".into(), pattern(seed + 1, 2 * MIB + 17)),
    ]
}

#[test]
fn a_host_lost_during_ingest_fails_that_epoch_and_keeps_every_committed_byte() {
    require_root();
    let mut site = Site::start();
    let (servers, first) = site.reservation("ingest", 2);
    let second = EpochId(first.0 + 1);
    let committed = checkpoint(1);
    let streamed = pattern(2, 24 * MIB);
    let victim = servers[1].clone();
    let host = site.client_host.clone();
    let (servers_w, committed_w, streamed_w) = (servers.clone(), committed.clone(), &streamed);
    let (started_tx, started_rx) = mpsc::channel();
    let (lost_tx, lost_rx) = mpsc::channel::<()>();
    let (outcome, ()) = std::thread::scope(|s| {
        let writer = s.spawn(move || {
            host.enter();
            let (servers, committed, streamed) = (servers_w, committed_w, streamed_w);
            let mut client = host.client(&servers, 2, Durability::Replicated);
            write_and_commit(&mut client, first, &committed);
            client.begin_epoch(second);
            let mut file = client.create_file(second, "ckpt/streamed.dat").unwrap();
            let mut write_error = None;
            for (i, chunk) in streamed.chunks(MIB).enumerate() {
                if i == 4 {
                    // A sixth streamed (and acknowledged): the host goes now.
                    client.flush().unwrap();
                    started_tx.send(()).unwrap();
                    lost_rx.recv().unwrap();
                }
                if let Err(error) = client.write(&mut file, (i * MIB) as u64, chunk) {
                    write_error = Some(error);
                    break;
                }
            }
            let commit = client.commit_epoch(second);
            read_back(&mut client, first, &committed, "after the loss");
            (write_error, commit)
        });
        started_rx.recv_timeout(WAIT).expect("the writer never streamed");
        site.lose(&victim);
        lost_tx.send(()).unwrap();
        (writer.join().unwrap(), ())
    });
    let (write_error, commit) = outcome;
    // A write after the loss fails naming the server (its reconnect found no route); the
    // commit then fails with EIO naming it: the epoch is never reported committed with one copy.
    if let Some(error) = write_error {
        assert!(
            error.to_string().contains(&victim),
            "the write error does not name {victim}: {error}"
        );
    }
    let error: ClientError = match commit {
        Ok(()) => panic!("the epoch streaming while {victim} was lost committed with one copy"),
        Err(error) => error,
    };
    assert_eq!(error.errno(), libc::EIO, "{error}");
    assert!(
        error.to_string().contains(&victim),
        "the commit error does not name {victim}: {error}"
    );
}

/// Per data file of the epoch, per stripe piece, the indexes of the servers holding all of it.
fn holders(client: &mut Client, epoch: EpochId) -> Vec<(String, Vec<Vec<usize>>)> {
    let mut out = Vec::new();
    for (name, size) in client.list_files(epoch).unwrap() {
        let file = client.open_file(epoch, &name).unwrap();
        let extents = client.extents(&file).unwrap();
        let pieces = (0..size.div_ceil(STRIPE))
            .map(|piece| {
                let start = piece * STRIPE;
                let end = (start + STRIPE).min(size);
                let mut held: Vec<usize> = extents
                    .iter()
                    .filter(|(_, e)| e.offset <= start && end <= e.offset + e.length)
                    .map(|&(server, _)| server)
                    .collect();
                held.sort_unstable();
                held.dedup();
                held
            })
            .collect();
        out.push((name, pieces));
    }
    out
}

/// Polls `reservation show` until its repair says `restored`, within [`WAIT`].
fn wait_restored(site: &Site, name: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let shown = site.json(&["reservation", "show", name]);
        if shown["repair"]["state"] == "restored" {
            return shown;
        }
        assert!(Instant::now() < deadline, "never restored: {shown}\n{}", site.manager.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_host_lost_after_a_replicated_commit_loses_nothing_and_two_copies_are_restored() {
    require_root();
    let mut site = Site::start();
    let (servers, epoch) = site.reservation("ckpt", 2);
    let files = checkpoint(10);
    let host = site.client_host.clone();
    let victim = servers[1].clone();
    let mut writer = host.run(|| host.client(&servers, 2, Durability::Replicated));
    host.run(|| write_and_commit(&mut writer, epoch, &files));
    // The commit returned: the host goes, for good.
    let lost_host = site.lose(&victim);
    host.run(|| read_back(&mut writer, epoch, &files, "from the survivors"));
    drop(writer);

    let lost = site.json(&["server", "lost", &victim]);
    assert!(lost["lost_unix_s"].is_u64(), "{lost}");
    // Degraded (or already being repaired): either way the reservation names the lost server.
    let shown = site.json(&["reservation", "show", "ckpt"]);
    let names_it = shown["degraded"]["lost_servers"][0] == victim.as_str()
        || shown["repair"]["lost"] == victim.as_str();
    assert!(names_it, "the reservation does not name {victim}: {shown}");
    let restored = wait_restored(&site, "ckpt");
    assert!(restored["degraded"].is_null(), "{restored}");
    assert_eq!(restored["repair"]["lost"], victim.as_str(), "{restored}");
    let new_list = string_list(&restored["servers"]);
    let spare = site.addresses.iter().find(|a| !servers.contains(a)).unwrap().clone();
    assert_eq!(new_list, vec![servers[0].clone(), spare, servers[2].clone()], "{restored}");

    // Every piece is again on two live servers of two hosts, and reads back through them.
    host.run(|| {
        let mut client = host.client(&new_list, 2, Durability::Replicated);
        read_back(&mut client, epoch, &files, "after re-replication");
        let domains: Vec<String> =
            (0..3).map(|i| client.server_failure_domain(i).to_string()).collect();
        assert!(!domains.contains(&lost_host), "{domains:?}");
        for (name, pieces) in holders(&mut client, epoch) {
            for (piece, held) in pieces.iter().enumerate() {
                let hosts: Vec<&String> = held.iter().map(|&i| &domains[i]).collect();
                assert!(held.len() == 2 && hosts[0] != hosts[1], "{name} piece {piece}: {held:?}");
            }
        }
    });
}

#[test]
fn a_host_that_loses_power_during_a_commit_fails_it_and_the_epoch_before_drains_from_the_survivors()
{
    require_root();
    let mut site = Site::start();
    let (servers, first) = site.reservation("power", 2);
    let second = EpochId(first.0 + 1);
    let committed = drain_checkpoint(50);
    let pending = checkpoint(60);
    let host = site.client_host.clone();
    let victim = servers[1].clone();
    let mut client = host.run(|| {
        let mut client = host.client(&servers, 2, Durability::Ssd);
        write_and_commit(&mut client, first, &committed);
        client.begin_epoch(second);
        for (name, data) in &pending {
            let mut file = client.create_file(second, name).unwrap();
            client.write(&mut file, 0, data).unwrap();
        }
        client.flush().unwrap();
        client
    });
    // Every byte of the second epoch is acknowledged by two hosts. Its commit starts while the
    // victim's server answers nothing, and the victim's host then loses power mid-commit.
    site.freeze(&victim);
    let (done_tx, done_rx) = mpsc::channel();
    let outcome = std::thread::scope(|s| {
        let client = &mut client;
        s.spawn(move || {
            host.enter();
            done_tx.send(client.commit_epoch(second)).unwrap();
        });
        std::thread::sleep(Duration::from_secs(1));
        assert!(done_rx.try_recv().is_err(), "the commit returned while {victim} answered nothing");
        site.lose_power(&victim);
        let lost_at = Instant::now();
        // Bounded: the keepalive probes (docs/design/protocol.md) reset the quiet connection in
        // about 30 s; the bound on unacknowledged bytes (120 s) must not stretch that.
        let outcome = done_rx
            .recv_timeout(Duration::from_secs(90))
            .expect("the commit still waits on a host that lost power 90 s ago");
        eprintln!("the commit failed {:?} after the power loss", lost_at.elapsed());
        outcome
    });
    let error = match outcome {
        Ok(()) => panic!("epoch {second} committed while {victim} held a copy and lost power"),
        Err(error) => error,
    };
    assert_eq!(error.errno(), libc::EIO, "{error}");
    assert!(error.to_string().contains(&victim), "the error does not name {victim}: {error}");
    // The epoch committed before: every byte from the survivors, and drained by them exactly.
    let host = site.client_host.clone();
    host.run(|| read_back(&mut client, first, &committed, "after the power loss"));
    drop(client);
    site.drain_from_survivors(&servers, &victim, first);
    let status = drain_settled(&site, &servers, first, &victim, None);
    for (name, data) in &committed {
        let path = site.pfs.join(format!("epoch-{}/{name}", first.0));
        assert!(nothing_wrong_published(&path, data), "{name} not published: {status}");
    }
}

/// Until every survivor's drain of `epoch` is drained (`failing_with` `None`), or not drained
/// with an error holding `failing_with`, and `spillway drain status` lists `victim` as
/// unreachable: that status (JSON).
fn drain_settled(
    site: &Site,
    servers: &[String],
    epoch: EpochId,
    victim: &str,
    failing_with: Option<&str>,
) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let status: Value = serde_json::from_str(&site.drain_status(servers, true)).unwrap();
        let listed = status["servers"].as_array().unwrap();
        let settled = servers.iter().zip(listed).all(|(address, server)| {
            if address == victim {
                return server["unreachable"].is_string();
            }
            let epochs = server["epochs"].as_array().cloned().unwrap_or_default();
            epochs.iter().any(|e| {
                e["epoch"] == epoch.0
                    && match failing_with {
                        None => e["state"] == "drained",
                        Some(needle) => {
                            e["state"] != "drained"
                                && e["last_error"].as_str().is_some_and(|m| m.contains(needle))
                        }
                    }
            })
        });
        if settled && listed.len() == servers.len() {
            return status;
        }
        assert!(Instant::now() < deadline, "drains never settled: {status}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whatever is under `path` is exactly `data`.
fn nothing_wrong_published(path: &Path, data: &[u8]) -> bool {
    match std::fs::read(path) {
        Ok(got) => {
            assert!(got == data, "a wrong file published at {}", path.display());
            true
        }
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{}: {e}", path.display());
            false
        }
    }
}

/// A checkpoint of many files, so that the drain has many parts to write.
fn drain_checkpoint(seed: u64) -> Vec<(String, Vec<u8>)> {
    (0..6u64).map(|i| (format!("ckpt/rank{i}.dat"), pattern(seed + i, 4 * MIB + 1000))).collect()
}

#[test]
fn a_host_lost_during_the_drain_of_two_copies_is_drained_exactly_from_the_survivor() {
    require_root();
    let mut site = Site::start();
    let (servers, epoch) = site.reservation("two", 2);
    let files = drain_checkpoint(20);
    let host = site.client_host.clone();
    let started = host.run(|| {
        let mut client = host.client(&servers, 2, Durability::Ssd);
        write_and_commit(&mut client, epoch, &files);
        client.request_drain(epoch, 1).unwrap()
    });
    assert_eq!(started, 3);
    // The drain runs (wherever it is by now): a host goes.
    let victim = servers[2].clone();
    let epoch_dir = site.pfs.join(format!("epoch-{}/ckpt", epoch.0));
    let before =
        files.iter().filter(|(n, _)| site.pfs.join(format!("epoch-{}/{n}", epoch.0)).exists());
    let before = before.count();
    site.lose(&victim);
    eprintln!(
        "{before} of {} files were published when the host was lost ({})",
        files.len(),
        epoch_dir.display()
    );
    let status = drain_settled(&site, &servers, epoch, &victim, None);
    let text = site.drain_status(&servers, false);
    assert!(text.contains("unreachable") && text.contains(&victim), "{text}");
    // The survivors drained everything: every file is on the PFS, exactly.
    for (name, data) in &files {
        let path = site.pfs.join(format!("epoch-{}/{name}", epoch.0));
        assert!(nothing_wrong_published(&path, data), "{name} not published: {status}");
    }
}

/// The loss report expected when server `lost` (an index) is gone: per file (in name order)
/// the coalesced byte ranges of its pieces only that server holds, as the drain words them.
fn expected_losses(
    holders: &[(String, Vec<Vec<usize>>)],
    sizes: &[(String, usize)],
    lost: usize,
) -> String {
    let mut reports = Vec::new();
    for (name, pieces) in holders {
        let size = sizes.iter().find(|(n, _)| n == name).unwrap().1 as u64;
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for (piece, held) in pieces.iter().enumerate() {
            if held.as_slice() != [lost] {
                continue;
            }
            let (start, end) = (piece as u64 * STRIPE, ((piece as u64 + 1) * STRIPE).min(size));
            match ranges.last_mut() {
                Some(last) if last.1 == start => last.1 = end,
                _ => ranges.push((start, end)),
            }
        }
        if !ranges.is_empty() {
            let ranges: Vec<String> = ranges.iter().map(|(a, b)| format!("{a}..{b}")).collect();
            reports.push(format!("{name:?} bytes [{}]", ranges.join(", ")));
        }
    }
    reports.join("; ")
}

#[test]
fn a_host_lost_with_one_copy_is_reported_exactly_and_the_rest_drained() {
    require_root();
    let mut site = Site::start();
    let (servers, epoch) = site.reservation("one", 1);
    // Big files have stripes on every server; a small one is on one server only.
    let mut files = drain_checkpoint(30);
    files.extend((0..4u64).map(|i| (format!("ckpt/small{i}.dat"), pattern(40 + i, 300_000))));
    let host = site.client_host.clone();
    let victim = servers[1].clone();
    let mut held = host.run(|| {
        let mut client = host.client(&servers, 1, Durability::Ssd);
        write_and_commit(&mut client, epoch, &files);
        holders(&mut client, epoch)
    });
    held.sort();
    let sizes: Vec<(String, usize)> = files.iter().map(|(n, d)| (n.clone(), d.len())).collect();
    let losses = expected_losses(&held, &sizes, 1);
    let intact: Vec<&String> =
        held.iter().filter(|(_, p)| !p.iter().any(|h| h == &[1])).map(|(n, _)| n).collect();
    assert!(!intact.is_empty(), "no file lies wholly on the survivors: {held:?}");
    site.lose(&victim);
    site.drain_from_survivors(&servers, &victim, epoch);
    let report = format!(
        "no live server holds them: {losses}; lost with cannot reach server 1 at tcp://{victim}"
    );
    let status = drain_settled(&site, &servers, epoch, &victim, Some(&report));
    for server in status["servers"].as_array().unwrap().iter().filter(|s| s["epochs"].is_array()) {
        let e = server["epochs"].as_array().unwrap().iter().find(|e| e["epoch"] == epoch.0);
        let error = e.and_then(|e| e["last_error"].as_str()).unwrap_or_default();
        assert!(error.contains(&report), "expected {report:?} in {status}");
    }
    for (name, data) in &files {
        let path = site.pfs.join(format!("epoch-{}/{name}", epoch.0));
        let published = nothing_wrong_published(&path, data);
        assert_eq!(published, intact.contains(&name), "{name}: published {published}; {status}");
    }
    let text = site.drain_status(&servers, false);
    assert!(text.contains("unreachable") && text.contains(&victim), "{text}");
}

/// `spillway …` on host 1 as root against the manager, expecting success: its stdout.
fn cli_ok(site: &Site, args: &[&str]) -> String {
    let output = site.cli(args);
    assert!(
        output.status.success(),
        "spillway {args:?}: {}\nmanager log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        site.manager.log_text()
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_namespace_host_lost_before_the_stage_out_costs_no_path_with_a_snapshot() {
    use spillway_client::ns_snapshot::SnapshotLoad;
    require_root();
    let mut site = Site::start();
    let (servers, epoch) = site.reservation("names", 2);
    // A job's files, staged in (as the job's data would be written through its mount).
    let source = site.cluster.dir().join("source");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..4u64)
        .map(|i| {
            let name = if i % 2 == 0 { format!("rank{i}.dat") } else { format!("sub/rank{i}.dat") };
            (name, pattern(70 + i, 3 * MIB + 1234 * i as usize))
        })
        .collect();
    for (name, data) in &files {
        std::fs::write(source.join(name), data).unwrap();
    }
    let src = source.to_str().unwrap();
    cli_ok(&site, &["stage-in", "--reservation", "names", src, "/ckpt", "--progress", "none"]);
    // What Slurm's post_run does once every node has unmounted.
    let stored = cli_ok(&site, &["reservation", "snapshot", "names"]);
    assert!(stored.contains("(4 files)"), "{stored}");
    // The epoch's writer can forge a newer snapshot: here one file's size becomes 2^62.
    let namespace = site.json(&["reservation", "show", "names"])["namespace_id"].as_u64().unwrap();
    let host = site.client_host.clone();
    host.run(|| {
        let mut client = host.client(&servers, 2, Durability::Ssd);
        let SnapshotLoad::Found(mut forged) =
            client.load_namespace_snapshot(epoch, namespace).unwrap()
        else {
            panic!("no snapshot stored");
        };
        assert_eq!(forged.entries.len(), 4);
        let entry = forged.entries.iter_mut().find(|e| e.path.ends_with(b"rank3.dat")).unwrap();
        entry.size = 1 << 62;
        forged.taken_unix_ns += 1;
        client.store_namespace_snapshot(&forged).unwrap();
    });
    // The namespace's host (the reservation's first server) is lost for good.
    site.lose(&servers[0]);
    let out = site.cluster.dir().join("out");
    let dst = out.to_str().unwrap();
    // One file at a time, in name order: the forged one is the last, and refused.
    let args = ["stage-out", "--reservation", "names", "/ckpt", dst, "--parallel", "1"];
    let refused = site.cli(&args);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a forged size was staged out");
    assert!(stderr.contains("sub/rank3.dat") && stderr.contains("4611686018427387904"), "{stderr}");
    let left: Vec<_> =
        std::fs::read_dir(out.join("sub")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec!["rank1.dat"], "only the whole files are on the PFS, no partial copy");
    for (name, data) in &files[..3] {
        let got = std::fs::read(out.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(got == *data, "{name}: other bytes staged out");
    }
}
