//! The fault-injection runner: nothing lost, nothing wrong under a final name.
//!
//! Each scenario starts a reservation of two real `spillway serve` processes whose PFS is a bind
//! mount (so it can be unmounted under the drain, leaving the bare mount-point directory, as a
//! failed PFS mount does), writes checkpoints of seeded random files through real clients,
//! commits, drains, and injects one fault at a seeded moment:
//!
//! | fault | when |
//! |---|---|
//! | SIGKILL a server, restart it on the same SSD directory | during ingest, during commit, during drain (shuffle and publish) |
//! | unmount the PFS, mount it again later | during drain |
//! | fill the SSD file system (a small tmpfs) before `ssd_bytes_max`, free it later | during ingest |
//!
//! After each scenario it checks the invariant: every byte of every epoch whose commit returned
//! is either in the burst buffer (read back equal to what was written) or on the PFS under its
//! final name, equal to what was written; no final name on the PFS holds anything else, and an
//! epoch reported drained everywhere is complete on the PFS.
//!
//! The seed is printed first; `SPILLWAY_CHAOS_SEED=<seed>` replays a run (the moments of the
//! faults are drawn from it; the servers' own thread timing is not, so a replay repeats the
//! same faults at the same offsets into the workload). `SPILLWAY_CHAOS_BUDGET_S` bounds the run
//! (default 40 s, what `make test` runs; `make chaos` runs longer). Needs root: bind and tmpfs
//! mounts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{pattern, same_bytes, ServerProcess};
use spillway_proto::{DrainState, Endpoint};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const SERVERS: usize = 2;
const STRIPE: u64 = 64 * 1024;
/// How long a scenario waits for its drains to settle after the fault is repaired.
const SETTLE_MAX: Duration = Duration::from_secs(40);
/// At most this many scenarios, whatever the budget.
const SCENARIOS_MAX: u64 = 200;

/// SplitMix64: the runner's only source of randomness, so a seed replays the same choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    KillServerDuringIngest,
    KillServerDuringCommit,
    KillServerDuringDrain,
    UnmountPfsDuringDrain,
    FillSsdDuringIngest,
}

const FAULTS: [Fault; 5] = [
    Fault::KillServerDuringIngest,
    Fault::KillServerDuringCommit,
    Fault::KillServerDuringDrain,
    Fault::UnmountPfsDuringDrain,
    Fault::FillSsdDuringIngest,
];

/// A mount this runner made; unmounted (lazily, so a busy one cannot wedge the test) on drop.
struct MountGuard {
    target: PathBuf,
    mounted: bool,
}

impl MountGuard {
    fn bind(source: &Path, target: &Path) -> MountGuard {
        run("mount", &["--bind", path_str(source), path_str(target)]);
        MountGuard { target: target.to_path_buf(), mounted: true }
    }

    fn tmpfs(target: &Path, bytes: u64) -> MountGuard {
        run("mount", &["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs", path_str(target)]);
        MountGuard { target: target.to_path_buf(), mounted: true }
    }

    fn unmount(&mut self) {
        if self.mounted {
            run("umount", &["-l", path_str(&self.target)]);
            self.mounted = false;
        }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.target).status();
        }
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("chaos runner: cannot run {program}: {e}"));
    assert!(status.success(), "chaos runner: {program} {args:?} failed: {status}");
}

/// One scenario's reservation: servers on Unix sockets, a bind-mounted PFS.
struct Cluster {
    dir: PathBuf,
    servers: Vec<ServerProcess>,
    pfs: PathBuf,
    pfs_backing: PathBuf,
    pfs_mount: MountGuard,
    /// Field order matters: servers (above) are dropped before their SSD mounts.
    _ssd_mounts: Vec<MountGuard>,
}

impl Cluster {
    fn start(dir: &Path, ssd_tmpfs_bytes: Option<u64>) -> Cluster {
        let pfs_backing = dir.join("pfs-backing");
        let pfs = dir.join("pfs");
        std::fs::create_dir_all(&pfs_backing).unwrap();
        std::fs::create_dir_all(&pfs).unwrap();
        // Owners create their epoch directories on a scratch PFS (docs/semantics.md, "Drain").
        set_mode(&pfs_backing, 0o1777);
        let pfs_mount = MountGuard::bind(&pfs_backing, &pfs);
        mark_pfs(&pfs);
        let mut ssd_mounts = Vec::new();
        let mut servers = Vec::new();
        for index in 0..SERVERS {
            let ssd = dir.join(format!("ssd{index}"));
            std::fs::create_dir_all(&ssd).unwrap();
            if let Some(bytes) = ssd_tmpfs_bytes {
                ssd_mounts.push(MountGuard::tmpfs(&ssd, bytes));
            }
            servers.push(
                ServerProcess::builder(BIN, dir, &format!("s{index}"))
                    .no_tcp()
                    .unix_socket(socket(dir, index))
                    .ssd_dir(&ssd)
                    .pfs_dir(&pfs)
                    .drain_peers(&endpoints(dir), index)
                    .rust_log("info")
                    .env("SPILLWAY_DRAIN_STRIPE_BYTES", STRIPE.to_string())
                    .env("SPILLWAY_DRAIN_WRITE_BYTES_MAX", (4 * STRIPE).to_string())
                    .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MIN", "20")
                    .env("SPILLWAY_DRAIN_RETRY_BACKOFF_MS_MAX", "300")
                    .env("SPILLWAY_SERVER_BACKPRESSURE_WAIT_MS_MAX", "200")
                    .start(),
            );
        }
        Cluster {
            dir: dir.to_path_buf(),
            servers,
            pfs,
            pfs_backing,
            pfs_mount,
            _ssd_mounts: ssd_mounts,
        }
    }

    fn client(&self, rank: u32) -> Result<Client, String> {
        let options = ClientOptions {
            placement: if rank == u32::MAX {
                Placement::Striped { stripe_unit_bytes: STRIPE, stripe_count: u32::MAX }
            } else {
                Placement::Local { rank }
            },
            ..ClientOptions::default()
        };
        Client::connect(&endpoints(&self.dir), options).map_err(|e| e.to_string())
    }

    /// Kill server `index` if it still runs (the fault thread may have) and start it again.
    fn restart(&mut self, index: usize) {
        self.servers[index].sigkill().unwrap();
        self.servers[index].restart().unwrap_or_else(|e| panic!("restart s{index}: {e}"));
    }

    fn logs(&self) -> String {
        self.servers
            .iter()
            .map(|s| format!("--- {} ---\n{}", s.name(), tail(&s.log_text(), 4000)))
            .collect()
    }
}

fn tail(text: &str, bytes: usize) -> &str {
    let start = text.len().saturating_sub(bytes);
    let start = (start..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
    &text[start..]
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The setup step every PFS needs before a drain writes to it.
fn mark_pfs(pfs: &Path) {
    let status = Command::new(BIN).args(["drain", "mark-pfs"]).arg(pfs).status().unwrap();
    assert!(status.success(), "spillway drain mark-pfs {}: {status}", pfs.display());
}

fn socket(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("s{index}.sock"))
}

fn endpoints(dir: &Path) -> Vec<Endpoint> {
    (0..SERVERS).map(|i| Endpoint::Unix(socket(dir, i))).collect()
}

/// What one epoch should hold, and whether its commit returned (only then is it promised).
struct Epoch {
    epoch: EpochId,
    files: Vec<(String, Vec<u8>)>,
    committed: bool,
}

/// Seeded files: a shared N-1 file written by every rank in interleaved blocks and a file per
/// rank, sizes from a few bytes to a few MiB.
fn plan_epoch(rng: &mut Rng, epoch: EpochId) -> Vec<(String, Vec<u8>)> {
    let shared_bytes = 1 + rng.below(3 << 20) as usize;
    let mut files = vec![("ckpt/shared.dat".to_string(), pattern(rng.next(), shared_bytes))];
    for rank in 0..SERVERS {
        let bytes = 1 + rng.below(1 << 20) as usize;
        files.push((format!("ckpt/e{}-rank{rank}.dat", epoch.0), pattern(rng.next(), bytes)));
    }
    files
}

/// Writes `files` (shared file interleaved by rank, own files by their rank); `Err` names the
/// first failure. Writes that fail are expected under faults.
fn write_epoch(
    cluster: &Cluster,
    epoch: EpochId,
    files: &[(String, Vec<u8>)],
    block: usize,
) -> Result<Vec<Client>, String> {
    let mut clients = Vec::new();
    for rank in 0..SERVERS {
        let mut c = cluster.client(rank as u32)?;
        c.begin_epoch(epoch);
        let (name, shared) = &files[0];
        let mut file = c.create_file(epoch, name).map_err(|e| e.to_string())?;
        let mut offset = rank * block;
        while offset < shared.len() {
            let end = (offset + block).min(shared.len());
            c.write(&mut file, offset as u64, &shared[offset..end]).map_err(|e| e.to_string())?;
            offset += SERVERS * block;
        }
        let (name, own) = &files[1 + rank];
        let mut f = c.create_file(epoch, name).map_err(|e| e.to_string())?;
        for (index, chunk) in own.chunks(block).enumerate() {
            c.write(&mut f, (index * block) as u64, chunk).map_err(|e| e.to_string())?;
        }
        c.flush().map_err(|e| e.to_string())?;
        clients.push(c);
    }
    Ok(clients)
}

fn commit(clients: &mut [Client], epoch: EpochId) -> Result<(), String> {
    for c in clients {
        c.commit_epoch(epoch).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// SIGKILL server `pid` after `delay`, from another thread.
fn kill_later(pid: u32, delay: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        let _ = spillway_sys::signal::send(pid, spillway_sys::signal::Signal::SIGKILL);
    })
}

/// Asks every server to drain `epoch`, retrying (bounded) while a server is restarting.
fn request_drain(cluster: &Cluster, epoch: EpochId) {
    let started = Instant::now();
    loop {
        let asked = cluster
            .client(0)
            .and_then(|mut c| c.request_drain(epoch, 1).map_err(|e| e.to_string()));
        match asked {
            Ok(_) => return,
            Err(error) if started.elapsed() < Duration::from_secs(10) => {
                let _ = error;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(error) => panic!("drain request of {epoch} failed: {error}\n{}", cluster.logs()),
        }
    }
}

/// Waits until every committed epoch is drained on every server, or `SETTLE_MAX`; returns the
/// epochs drained everywhere.
fn settle(cluster: &Cluster, epochs: &[Epoch]) -> Vec<EpochId> {
    let started = Instant::now();
    loop {
        let drained: Vec<EpochId> = match cluster.client(0) {
            Ok(mut c) => match c.drain_status() {
                Ok(status) => epochs
                    .iter()
                    .filter(|e| e.committed)
                    .map(|e| e.epoch)
                    .filter(|epoch| {
                        status.iter().all(|(_, list)| {
                            list.iter().any(|d| d.epoch == *epoch && d.state == DrainState::Drained)
                        })
                    })
                    .collect(),
                Err(_) => Vec::new(),
            },
            Err(_) => Vec::new(),
        };
        let want = epochs.iter().filter(|e| e.committed).count();
        if drained.len() == want || started.elapsed() >= SETTLE_MAX {
            return drained;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The invariant (module doc). Panics naming the scenario, file and what was found.
fn check(cluster: &Cluster, epochs: &[Epoch], drained: &[EpochId], label: &str) {
    let mut reader = cluster.client(0).unwrap_or_else(|e| panic!("{label}: connect: {e}"));
    for epoch in epochs {
        let epoch_dir = cluster.pfs.join(format!("epoch-{}", epoch.epoch.0));
        for (name, bytes) in &epoch.files {
            let on_pfs = std::fs::read(epoch_dir.join(name)).ok();
            if let Some(got) = &on_pfs {
                // Whatever is under a final name must be exactly what was written, committed or not.
                assert!(
                    epoch.committed,
                    "{label}: {name} of uncommitted {} is on the PFS",
                    epoch.epoch
                );
                assert!(
                    got.len() == bytes.len() && same_bytes(got, bytes),
                    "{label}: {name} of {} is wrong on the PFS ({} bytes, {} expected)\n{}",
                    epoch.epoch,
                    got.len(),
                    bytes.len(),
                    cluster.logs()
                );
                continue;
            }
            if !epoch.committed {
                continue;
            }
            assert!(
                !drained.contains(&epoch.epoch),
                "{label}: {} is drained everywhere but {name} is not on the PFS\n{}",
                epoch.epoch,
                cluster.logs()
            );
            // Not on the PFS: it must be in the buffer, whole.
            let file = reader.open_file(epoch.epoch, name).unwrap_or_else(|e| {
                panic!(
                    "{label}: committed {name} of {} is lost: {e}\n{}",
                    epoch.epoch,
                    cluster.logs()
                )
            });
            let mut back = vec![0u8; bytes.len()];
            reader.read(&file, 0, &mut back).unwrap_or_else(|e| {
                panic!("{label}: read {name} of {}: {e}\n{}", epoch.epoch, cluster.logs())
            });
            assert!(
                same_bytes(&back, bytes),
                "{label}: {name} of {} reads back wrong from the buffer",
                epoch.epoch
            );
        }
    }
}

/// Runs one scenario of `fault`; returns a line for the summary.
fn scenario(number: u64, seed: u64, fault: Fault) -> String {
    let label = format!("scenario {number} ({fault:?}, seed {seed:#x})");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let ssd_tmpfs = (fault == Fault::FillSsdDuringIngest).then_some(96 << 20);
    let mut cluster = Cluster::start(dir.path(), ssd_tmpfs);
    let block = [4096usize, 65_536, 1 << 20][rng.below(3) as usize];
    let victim = rng.below(SERVERS as u64) as usize;
    let epochs = ingest(&mut cluster, &mut rng, fault, victim, number, block);
    for e in epochs.iter().filter(|e| e.committed) {
        request_drain(&cluster, e.epoch);
    }
    match fault {
        Fault::KillServerDuringDrain => {
            std::thread::sleep(Duration::from_millis(rng.below(150)));
            cluster.restart(victim);
        }
        Fault::UnmountPfsDuringDrain => {
            std::thread::sleep(Duration::from_millis(rng.below(150)));
            cluster.pfs_mount.unmount();
            // Drains run against the bare mount point for a while.
            std::thread::sleep(Duration::from_millis(200 + rng.below(300)));
            let bare: Vec<_> = std::fs::read_dir(&cluster.pfs).unwrap().collect();
            assert!(
                bare.is_empty(),
                "{label}: the drain wrote into the bare PFS mount point: {bare:?}\n{}",
                cluster.logs()
            );
            cluster.pfs_mount = MountGuard::bind(&cluster.pfs_backing, &cluster.pfs);
        }
        _ => {}
    }
    let drained = settle(&cluster, &epochs);
    check(&cluster, &epochs, &drained, &label);
    let committed = epochs.iter().filter(|e| e.committed).count();
    format!(
        "{label}: {} epochs, {committed} committed, {} drained, block {block}",
        epochs.len(),
        drained.len()
    )
}

/// Writes and commits one to three epochs; the ingest faults strike during the last one and are
/// repaired (server restarted, disk space given back) before this returns.
fn ingest(
    cluster: &mut Cluster,
    rng: &mut Rng,
    fault: Fault,
    victim: usize,
    number: u64,
    block: usize,
) -> Vec<Epoch> {
    let mut epochs = Vec::new();
    let epoch_count = 1 + rng.below(3);
    let mut filler = None;
    for n in 0..epoch_count {
        let epoch = EpochId(number * 10 + n + 1);
        let files = plan_epoch(rng, epoch);
        let faulted_now = n == epoch_count - 1;
        let pid = cluster.servers[victim].pid();
        let killer = (fault == Fault::KillServerDuringIngest && faulted_now)
            .then(|| kill_later(pid, Duration::from_millis(rng.below(60))));
        if fault == Fault::FillSsdDuringIngest && faulted_now {
            filler = Some(fill(&cluster.dir.join(format!("ssd{victim}")), 4 << 20));
        }
        let committed = match write_epoch(cluster, epoch, &files, block) {
            Ok(mut clients) => {
                let killer = (fault == Fault::KillServerDuringCommit && faulted_now)
                    .then(|| kill_later(pid, Duration::from_micros(rng.below(3000))));
                let result = commit(&mut clients, epoch);
                if let Some(k) = killer {
                    k.join().unwrap();
                }
                result.is_ok()
            }
            Err(_) => false,
        };
        if let Some(k) = killer {
            k.join().unwrap();
        }
        epochs.push(Epoch { epoch, files, committed });
    }
    if matches!(fault, Fault::KillServerDuringIngest | Fault::KillServerDuringCommit) {
        cluster.restart(victim);
    }
    if let Some(path) = filler {
        std::fs::remove_file(path).unwrap();
    }
    epochs
}

/// Fills the file system of `dir` until about `leave` bytes are free; returns the filler's path.
fn fill(dir: &Path, leave: u64) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    // Real blocks (tmpfs has no holes to hide behind) until the file system refuses more.
    let zeros = vec![0u8; 1 << 20];
    let mut written: u64 = 0;
    while written < 1 << 40 {
        match file.write(&zeros) {
            Ok(0) | Err(_) => break,
            Ok(n) => written += n as u64,
        }
    }
    file.set_len(written.saturating_sub(leave)).unwrap();
    path
}

#[test]
fn every_committed_byte_survives_kills_full_disks_and_a_lost_pfs() {
    assert!(
        spillway_sys::user::euid() == 0,
        "the chaos runner needs root (it bind-mounts the PFS and mounts tmpfs SSD directories); run it as root"
    );
    let seed = std::env::var("SPILLWAY_CHAOS_SEED")
        .ok()
        .map(|s| {
            let s = s.trim_start_matches("0x");
            u64::from_str_radix(s, 16).unwrap_or_else(|e| panic!("SPILLWAY_CHAOS_SEED {s}: {e}"))
        })
        .unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
                as u64
        });
    let budget = Duration::from_secs(
        std::env::var("SPILLWAY_CHAOS_BUDGET_S")
            .ok()
            .map(|s| s.parse().expect("SPILLWAY_CHAOS_BUDGET_S is seconds"))
            .unwrap_or(40),
    );
    eprintln!(
        "chaos: seed {seed:#x} (replay with SPILLWAY_CHAOS_SEED={seed:x}), budget {budget:?}"
    );
    let started = Instant::now();
    let mut rng = Rng(seed);
    let mut number = 0;
    // Every fault at least once, then seeded choices until the budget is spent.
    while number < SCENARIOS_MAX && (number < FAULTS.len() as u64 || started.elapsed() < budget) {
        let fault = if number < FAULTS.len() as u64 {
            FAULTS[number as usize]
        } else {
            FAULTS[rng.below(FAULTS.len() as u64) as usize]
        };
        let line = scenario(number, rng.next(), fault);
        eprintln!("chaos: {line}");
        number += 1;
    }
    eprintln!("chaos: {number} scenarios in {:?}, seed {seed:#x}", started.elapsed());
}
