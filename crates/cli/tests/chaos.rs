//! The fault-injection runner: nothing lost, nothing wrong under a final name.
//!
//! Each scenario starts a reservation of two real `spillway serve` processes whose PFS is a bind
//! mount (so it can be unmounted under the drain, leaving the bare mount-point directory, as a
//! failed PFS mount does), writes checkpoints of seeded random files through real clients,
//! commits, drains, and injects one fault at a seeded moment:
//!
//! | fault | when |
//! |---|---|
//! | SIGKILL a server, restart it on the same SSD directory | during ingest, during commit, during a naive drain, during a shuffled drain's write phase (watched for: its staging file exists) |
//! | unmount the PFS, mount it again later | during drain |
//! | fill the SSD file system (a small tmpfs) before `ssd_bytes_max`, free it later | during ingest |
//! | SIGKILL a `spillway mount` process, mount again | while an application writes and fsyncs files through it |
//! | SIGKILL a server under a running mount, restart it | while an application writes and fsyncs files through it |
//! | SIGKILL the manager, restart it on the same database | during `reservation create`, during `stage-out` |
//! | SIGKILL a server, restart it | during `stage-out` |
//! | unmount the stage-out's PFS, mount it again | during `stage-out` |
//! | fill the stage-out's PFS (a small tmpfs), free it | during `stage-out` |
//!
//! After each scenario it checks the invariant: every byte of every epoch whose commit returned
//! is either in the burst buffer (read back equal to what was written) or on the PFS under its
//! final name, equal to what was written; no final name on the PFS holds anything else, and an
//! epoch reported drained everywhere is complete on the PFS. Drains run in both modes (naive and
//! shuffled, docs/design/drain.md), seeded, and each mode is killed into at least once a run.
//!
//! Mount scenarios: every file whose `fsync` returned through the mount (the mount's commit
//! guarantee, docs/semantics.md "Mount") reads back whole through a new mount after the fault,
//! and after its data epoch is committed and drained it is equal on the PFS under its path.
//!
//! Manager and stage-out scenarios (a real manager, a reservation of two servers owned by uid
//! 1000, data staged in and committed, staged out by the owner to a PFS that is a bind mount of
//! a small tmpfs): every file under a final stage-out name equals what was staged; a
//! reservation whose create returned survives the manager's restart; a stage-out that failed
//! leaves the reservation, marked rescue as the Slurm hook does, and after the repair the
//! owner's `stage-out --retry` copies everything correctly and releases it.
//!
//! The seed is printed first; `SPILLWAY_CHAOS_SEED=<seed>` replays a run (the moments of the
//! faults are drawn from it; the servers' own thread timing is not, so a replay repeats the
//! same faults at the same offsets into the workload). `SPILLWAY_CHAOS_BUDGET_S` bounds the run
//! (default 40 s, what `make test` runs; `make chaos` runs longer); every fault runs once
//! whatever the budget. Needs root: bind, tmpfs and FUSE mounts, and the CLI run as uid 1000.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use spillway_client::{Client, ClientOptions, Placement, ServerConnection};
use spillway_harness::{endpoint_list, pattern, same_bytes, ManagerProcess, ServerProcess};
use spillway_proto::{DrainState, Durability, Endpoint, Request, Response};
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
    KillServerDuringNaiveDrain,
    KillServerDuringShuffle,
    UnmountPfsDuringDrain,
    FillSsdDuringIngest,
    KillMountDuringWrites,
    KillServerUnderMount,
    KillManagerDuringCreate,
    KillManagerDuringStageOut,
    KillServerDuringStageOut,
    UnmountPfsDuringStageOut,
    FillPfsDuringStageOut,
}

const FAULTS: [Fault; 13] = [
    Fault::KillServerDuringIngest,
    Fault::KillServerDuringCommit,
    Fault::KillServerDuringNaiveDrain,
    Fault::KillServerDuringShuffle,
    Fault::UnmountPfsDuringDrain,
    Fault::FillSsdDuringIngest,
    Fault::KillMountDuringWrites,
    Fault::KillServerUnderMount,
    Fault::KillManagerDuringCreate,
    Fault::KillManagerDuringStageOut,
    Fault::KillServerDuringStageOut,
    Fault::UnmountPfsDuringStageOut,
    Fault::FillPfsDuringStageOut,
];

/// Drain modes of `Request::Drain` (docs/design/drain.md).
const NAIVE: u8 = 0;
const SHUFFLED: u8 = 1;

fn mode_name(mode: u8) -> &'static str {
    if mode == NAIVE {
        "naive"
    } else {
        "shuffled"
    }
}

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

/// Asks every server to drain `epoch` in `mode`, retrying (bounded) while a server is restarting.
fn request_drain(cluster: &Cluster, epoch: EpochId, mode: u8) {
    let started = Instant::now();
    loop {
        let asked = cluster
            .client(0)
            .and_then(|mut c| c.request_drain(epoch, mode).map_err(|e| e.to_string()));
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
    let mode = match fault {
        Fault::KillServerDuringNaiveDrain => NAIVE,
        Fault::KillServerDuringShuffle => SHUFFLED,
        _ => rng.below(2) as u8,
    };
    for e in epochs.iter().filter(|e| e.committed) {
        request_drain(&cluster, e.epoch, mode);
    }
    let mut phase = String::new();
    match fault {
        Fault::KillServerDuringNaiveDrain => {
            std::thread::sleep(Duration::from_millis(rng.below(150)));
            cluster.restart(victim);
        }
        Fault::KillServerDuringShuffle => {
            // Into the write phase: a staging file exists (participants are pulling each other's
            // ranges and writing their domains) and is not yet renamed to its final name.
            let seen = wait_for_staging(&cluster.pfs_backing, Duration::from_secs(3));
            std::thread::sleep(Duration::from_micros(rng.below(20_000)));
            let at_kill = !staging_files(&cluster.pfs_backing).is_empty();
            cluster.restart(victim);
            phase = format!(
                ", kill {} the shuffle",
                if seen && at_kill { "during" } else { "outside" }
            );
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
        "{label}: {} epochs, {committed} committed, {} drained ({} drain{phase}), block {block}",
        epochs.len(),
        drained.len(),
        mode_name(mode)
    )
}

/// Staging files of drains under `root` (`…staging`, not their part markers).
fn staging_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    // Bounded: the scenario's tree is a few directories deep.
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            } else if path.to_string_lossy().ends_with(".staging") {
                found.push(path);
            }
        }
    }
    found
}

/// Waits (polling, at most `max`) until a drain's staging file exists under `root`.
fn wait_for_staging(root: &Path, max: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < max {
        if !staging_files(root).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    false
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
    let only = fault_filter();
    eprintln!(
        "chaos: seed {seed:#x} (replay with SPILLWAY_CHAOS_SEED={seed:x}), budget {budget:?}"
    );
    let started = Instant::now();
    let mut rng = Rng(seed);
    let mut number = 0;
    let mut counts = [0u32; FAULTS.len()];
    // Every fault at least once, then seeded choices until the budget is spent.
    while number < SCENARIOS_MAX && (number < FAULTS.len() as u64 || started.elapsed() < budget) {
        let fault = if number < FAULTS.len() as u64 {
            FAULTS[number as usize]
        } else {
            FAULTS[rng.below(FAULTS.len() as u64) as usize]
        };
        let seed = rng.next();
        if only.as_ref().is_some_and(|only| !only.contains(&format!("{fault:?}"))) {
            number += 1;
            continue;
        }
        counts[FAULTS.iter().position(|f| *f == fault).unwrap()] += 1;
        let line = match fault {
            Fault::KillMountDuringWrites | Fault::KillServerUnderMount => {
                mount_scenario(number, seed, fault)
            }
            Fault::KillManagerDuringCreate
            | Fault::KillManagerDuringStageOut
            | Fault::KillServerDuringStageOut
            | Fault::UnmountPfsDuringStageOut
            | Fault::FillPfsDuringStageOut => stage_scenario(number, seed, fault),
            _ => scenario(number, seed, fault),
        };
        eprintln!("chaos: {line}");
        number += 1;
    }
    let per_fault: Vec<String> =
        FAULTS.iter().zip(counts).map(|(fault, count)| format!("{fault:?} {count}")).collect();
    eprintln!(
        "chaos: {} scenarios in {:?}, seed {seed:#x}: {}",
        counts.iter().sum::<u32>(),
        started.elapsed(),
        per_fault.join(", ")
    );
}

/// A `spillway mount` process in the foreground (so the runner knows its pid and can SIGKILL
/// it); on drop it is killed and its mount detached, so a failed assertion leaves nothing mounted.
struct FuseMount {
    child: Option<std::process::Child>,
    path: PathBuf,
    log: PathBuf,
}

impl FuseMount {
    /// Mounts namespace 1 of the cluster's servers (data epoch `epoch`) at `path`; waits
    /// (bounded) until the kernel lists the FUSE mount.
    fn start(cluster: &Cluster, path: &Path, epoch: EpochId, generation: u32) -> FuseMount {
        assert!(
            Path::new("/dev/fuse").exists(),
            "the chaos runner's mount scenarios need /dev/fuse (the fuse kernel module) and root"
        );
        std::fs::create_dir_all(path).unwrap();
        let log = cluster.dir.join(format!("mount-{generation}.log"));
        let mut command = Command::new(BIN);
        command
            .arg("mount")
            .arg("--servers")
            .arg(endpoint_list(&endpoints(&cluster.dir)))
            .args(["--namespace-id", "1", "--epoch", &epoch.0.to_string()])
            .arg(path)
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        spillway_sys::process::die_with_parent(&mut command);
        let child = command.spawn().unwrap();
        let mut mount = FuseMount { child: Some(child), path: path.to_path_buf(), log };
        let started = Instant::now();
        while !is_fuse_mounted(path) {
            let exited = mount.child.as_mut().unwrap().try_wait().unwrap();
            assert!(
                exited.is_none() && started.elapsed() < Duration::from_secs(30),
                "spillway mount {} did not come up ({exited:?}): {}",
                path.display(),
                mount.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        mount
    }

    fn log_text(&self) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 3000).to_string()
    }

    /// SIGKILL: the FUSE daemon dies with whatever it had queued; the kernel fails pending
    /// and later calls (ENOTCONN) until the dead mount is detached.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if is_fuse_mounted(&self.path) {
            run("umount", &["-l", path_str(&self.path)]);
        }
    }

    /// Orderly: SIGTERM makes it unmount, flush its data clients, sync the namespace and exit 0.
    fn stop(mut self, label: &str) {
        let mut child = self.child.take().unwrap();
        let _ = spillway_sys::signal::send(child.id(), spillway_sys::signal::Signal::SIGTERM);
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("{label}: the mount did not exit on SIGTERM: {}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "{label}: the mount exited with {status}: {}", self.log_text());
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        // Only a mount still served: one killed or stopped was detached then, and whatever is
        // mounted at the path now is a newer one's.
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            if is_fuse_mounted(&self.path) {
                let _ = Command::new("umount").arg("-l").arg(&self.path).status();
            }
        }
    }
}

fn is_fuse_mounted(path: &Path) -> bool {
    let wanted = path.display().to_string();
    std::fs::read_to_string("/proc/mounts").unwrap_or_default().lines().any(|line| {
        let mut fields = line.split(' ');
        fields.nth(1) == Some(wanted.as_str())
            && fields.next().is_some_and(|t| t.starts_with("fuse"))
    })
}

/// The application, a separate process (as a job's is: a process of the runner holding files of
/// the mount open would make every child it forks flush them at exec, blocking the runner on the
/// fault it injects): for each file create, write in `piece`-byte writes, fsync, close; prints
/// the files whose fsync returned OK (their bytes are promised). Errors are expected once the
/// fault strikes; the next file is tried (a bounded list).
fn start_application(
    root: &Path,
    sources: &Path,
    files: &[(String, Vec<u8>)],
    piece: usize,
) -> std::process::Child {
    const SCRIPT: &str = r#"
import os, sys
root, sources, piece = sys.argv[1], sys.argv[2], int(sys.argv[3])
# Everything relative to the mount's root held open: once the mount is gone, calls fail
# instead of landing in the bare mount point.
root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
print("started", flush=True)
for name in sys.argv[4:]:
    try:
        data = open(os.path.join(sources, name.replace("/", "_")), "rb").read()
        parts = name.split("/")
        for depth in range(1, len(parts)):
            try:
                os.mkdir("/".join(parts[:depth]), 0o755, dir_fd=root_fd)
            except FileExistsError:
                pass
        fd = os.open(name, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644, dir_fd=root_fd)
        try:
            for start in range(0, len(data), piece):
                view = memoryview(data)[start:start + piece]
                while len(view):
                    view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        print("synced " + name, flush=True)
    except OSError as error:
        print("failed " + name + ": " + str(error), flush=True)
"#;
    std::fs::create_dir_all(sources).unwrap();
    for (name, bytes) in files {
        std::fs::write(sources.join(name.replace('/', "_")), bytes).unwrap();
    }
    Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(root)
        .arg(sources)
        .arg(piece.to_string())
        .args(files.iter().map(|(name, _)| name))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("the mount scenarios' application needs python3: {e}"))
}

/// Commits `epoch` on every server that holds it, as the stage-out's drain path does for a
/// mount's data epoch (the mount never commits; its writers are gone).
fn commit_everywhere(endpoints: &[Endpoint], epoch: EpochId) -> Result<(), String> {
    for endpoint in endpoints {
        let mut connection = ServerConnection::connect(endpoint, "chaos commit", 1)
            .map_err(|e| format!("connect {endpoint}: {e}"))?;
        match connection.call(&Request::ListEpochs { from_epoch: epoch }, &[], None) {
            Ok((Response::Epochs(list), ())) if list.first().is_some_and(|e| e.epoch == epoch) => {}
            Ok(_) => continue,
            Err(e) => return Err(format!("list epochs on {endpoint}: {e}")),
        }
        let commit =
            Request::Commit { epoch, durability: Durability::Ssd, participants: Vec::new() };
        match connection.call(&commit, &[], None) {
            Ok((Response::Committed { .. }, ())) => {}
            Ok((other, ())) => return Err(format!("commit on {endpoint}: {:?}", other.kind())),
            Err(e) => return Err(format!("commit on {endpoint}: {e}")),
        }
    }
    Ok(())
}

/// A mount over the cluster's servers; an application writes files through it while the mount
/// process or a server is SIGKILLed at a seeded moment. Every fsync'd file must read back whole
/// through the (new) mount, and after its epoch is committed and drained, equal on the PFS.
fn mount_scenario(number: u64, seed: u64, fault: Fault) -> String {
    let label = format!("scenario {number} ({fault:?}, seed {seed:#x})");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), None);
    let epoch = EpochId(number * 10 + 1);
    let mnt = dir.path().join("mnt");
    let mut mount = FuseMount::start(&cluster, &mnt, epoch, 0);
    let files: Vec<(String, Vec<u8>)> = (0..4 + rng.below(9))
        .map(|i| {
            let bytes = 1 + rng.below(3 << 20) as usize;
            (format!("job/dir{}/out{i}.dat", i % 2), pattern(rng.next(), bytes))
        })
        .collect();
    let piece = [4096usize, 65_536, 1 << 20][rng.below(3) as usize];
    let victim = rng.below(SERVERS as u64) as usize;
    let delay = Duration::from_millis(rng.below(80));
    let mut application = start_application(&mnt, &dir.path().join("sources"), &files, piece);
    // The fault's moment counts from the application's start (it holds the mount's root).
    let mut started = String::new();
    let mut stdout = std::io::BufReader::new(application.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut stdout, &mut started).unwrap();
    assert_eq!(started, "started\n", "{label}: the application did not start");
    std::thread::sleep(delay);
    match fault {
        Fault::KillMountDuringWrites => mount.kill(),
        _ => cluster.restart(victim),
    }
    let mut phases = vec![("fault", Instant::now())];
    let synced = wait_for_application(&label, application, stdout, &files, &mount, &cluster);
    phases.push(("writer", Instant::now()));
    if fault == Fault::KillMountDuringWrites {
        mount = FuseMount::start(&cluster, &mnt, epoch, 1);
    }
    let promised = synced.iter().filter(|s| **s).count();
    check_through_mount(&label, &mount, &files, &synced, &cluster);
    phases.push(("read back", Instant::now()));
    mount.stop(&label);
    phases.push(("unmount", Instant::now()));
    commit_everywhere(&endpoints(&cluster.dir), epoch)
        .unwrap_or_else(|e| panic!("{label}: {e}\n{}", cluster.logs()));
    let mode = rng.below(2) as u8;
    request_drain(&cluster, epoch, mode);
    let record = [Epoch { epoch, files: Vec::new(), committed: true }];
    let drained = settle(&cluster, &record);
    phases.push(("drain", Instant::now()));
    let timing: Vec<String> = phases
        .windows(2)
        .map(|w| format!("{} {} ms", w[1].0, (w[1].1 - w[0].1).as_millis()))
        .collect();
    check_mount_files_on_pfs(&label, &cluster, &files, &synced, !drained.is_empty());
    format!(
        "{label}: 1 epoch, {}/{} files fsync'd, {} drained ({} drain), pieces {piece}; {}",
        promised,
        files.len(),
        drained.len(),
        mode_name(mode),
        timing.join(", ")
    )
}

/// The owner of the stage scenarios' reservations (the CLI runs as it through setpriv).
const OWNER: u32 = 1000;

/// A manager over the cluster's servers, its files in `<dir>/manager`; restarted on the same
/// database after a SIGKILL. Logs of earlier runs are kept for failure messages.
struct Manager {
    dir: PathBuf,
    process: ManagerProcess,
    earlier_logs: String,
}

impl Manager {
    fn start(dir: &Path) -> Manager {
        let dir = dir.join("manager");
        let process = ManagerProcess::start(
            Path::new(BIN),
            &dir,
            &[
                ("SPILLWAY_MANAGER_FRAGMENT_BYTES", "8388608"),
                ("SPILLWAY_MANAGER_HEARTBEAT_MS", "200"),
                ("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "none"),
            ],
        );
        Manager { dir, process, earlier_logs: String::new() }
    }

    /// SIGKILL (if a fault thread has not already) and start again on the same database.
    fn restart(&mut self) {
        let _ =
            spillway_sys::signal::send(self.process.pid(), spillway_sys::signal::Signal::SIGKILL);
        self.earlier_logs.push_str(&self.process.log_text());
        self.earlier_logs.push_str("--- manager restarted ---\n");
        let dir = self.dir.clone();
        let fresh = Manager::start(dir.parent().unwrap());
        // The old process is reaped when its handle drops here.
        self.process = fresh.process;
    }

    fn logs(&self) -> String {
        format!(
            "--- manager ---\n{}",
            tail(&format!("{}{}", self.earlier_logs, self.process.log_text()), 4000)
        )
    }
}

/// The CLI as root (`uid` None) or as `uid`; its record files go under `tmp`.
fn cli(manager: &Manager, uid: Option<u32>, tmp: &Path, args: &[&str]) -> Command {
    let mut command = manager.process.cli(Path::new(BIN), uid);
    command
        .args(args)
        .env("TMPDIR", tmp)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    command
}

/// Runs a CLI command to its end (bounded: a hung command fails the scenario); Ok(stdout) or
/// Err(stderr).
fn finish(label: &str, mut child: std::process::Child, what: &str) -> Result<String, String> {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("{label}: `spillway {what}` hung for two minutes");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let output = child.wait_with_output().unwrap();
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_string())
    }
}

fn cli_run(
    label: &str,
    manager: &Manager,
    uid: Option<u32>,
    tmp: &Path,
    args: &[&str],
) -> Result<String, String> {
    let child = cli(manager, uid, tmp, args).spawn().unwrap();
    finish(label, child, &args.join(" "))
}

/// Runs a CLI command again (bounded) while it fails: a server or the manager is still coming
/// back (grants arrive with a heartbeat). Panics with the last error when it never succeeds.
fn cli_until_ok(
    label: &str,
    manager: &Manager,
    cluster: &Cluster,
    uid: Option<u32>,
    tmp: &Path,
    args: &[&str],
) -> (String, u32) {
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match cli_run(label, manager, uid, tmp, args) {
            Ok(out) => return (out, attempts),
            Err(error) if started.elapsed() < Duration::from_secs(20) => {
                let _ = error;
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(error) => panic!(
                "{label}: spillway {args:?} as {uid:?} still fails after {attempts} attempts: {error}\n{}\n{}",
                manager.logs(),
                cluster.logs()
            ),
        }
    }
}

/// Every regular file under `out`: it must be one of `files` (relative name) and equal to it;
/// the stage-out's partial copies (`.<name>.spillway-part`) are not final names. Returns how
/// many final names hold their file.
fn check_stage_out(label: &str, out: &Path, files: &[(String, Vec<u8>)], logs: &str) -> usize {
    let mut complete = 0;
    let mut stack = vec![out.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(path);
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.ends_with(".spillway-part") {
                continue;
            }
            let relative = path.strip_prefix(out).unwrap().to_string_lossy().into_owned();
            let Some((_, bytes)) = files.iter().find(|(n, _)| *n == relative) else {
                panic!(
                    "{label}: {} is under a final stage-out name but was never staged\n{logs}",
                    path.display()
                );
            };
            let got = std::fs::read(&path).unwrap();
            assert!(
                got.len() == bytes.len() && same_bytes(&got, bytes),
                "{label}: {} is wrong under its final stage-out name: {} bytes, {} expected\n{logs}",
                path.display(),
                got.len(),
                bytes.len()
            );
            complete += 1;
        }
    }
    complete
}

/// One stage scenario's world. Field order is drop order: the PFS bind mount before the tmpfs
/// under it, both before the temporary directory.
struct Stage {
    label: String,
    tmp: PathBuf,
    backing: PathBuf,
    out_pfs: PathBuf,
    out_mount: MountGuard,
    _backing_mount: MountGuard,
    cluster: Cluster,
    manager: Manager,
    _dir: tempfile::TempDir,
}

impl Stage {
    /// Servers, a manager with pool `chaos` holding them, and the stage-out's PFS: a bind mount
    /// of a tmpfs (so it can be filled and unmounted) whose bare mount point is root's 0755, as
    /// on a real node, so the owner cannot write there.
    fn start(label: String) -> Stage {
        let dir = tempfile::tempdir().unwrap();
        set_mode(dir.path(), 0o755);
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        set_mode(&tmp, 0o1777);
        let backing = dir.path().join("out-backing");
        std::fs::create_dir(&backing).unwrap();
        let backing_mount = MountGuard::tmpfs(&backing, 48 << 20);
        set_mode(&backing, 0o1777);
        let out_pfs = dir.path().join("out-pfs");
        std::fs::create_dir(&out_pfs).unwrap();
        set_mode(&out_pfs, 0o755);
        let out_mount = MountGuard::bind(&backing, &out_pfs);
        let cluster = Cluster::start(dir.path(), None);
        let manager = Manager::start(dir.path());
        let stage = Stage {
            label,
            tmp,
            backing,
            out_pfs,
            out_mount,
            _backing_mount: backing_mount,
            cluster,
            manager,
            _dir: dir,
        };
        stage.run(&["pool", "create", "chaos", "--granularity", "8MiB"]);
        for endpoint in endpoints(&stage.cluster.dir) {
            let endpoint = endpoint.to_string();
            stage.run(&["server", "add", &endpoint, "--pool", "chaos", "--capacity", "256MiB"]);
        }
        stage
    }

    /// The CLI as root; it must succeed.
    fn run(&self, args: &[&str]) -> String {
        cli_run(&self.label, &self.manager, None, &self.tmp, args).unwrap_or_else(|e| {
            panic!("{}: spillway {args:?}: {e}\n{}", self.label, self.manager.logs())
        })
    }

    fn logs(&self) -> String {
        both_logs(&self.manager, &self.cluster)
    }

    /// Creates uid 1000's reservation for `job`, with the manager SIGKILLed under the create
    /// for that fault: a create that answered must survive the restart.
    fn create(&mut self, rng: &mut Rng, fault: Fault, job: &str) -> &'static str {
        let label = self.label.clone();
        let (name, owner) = (format!("job-{job}"), OWNER.to_string());
        let create = [
            "reservation",
            "create",
            "--capacity",
            "32MiB",
            "--job",
            job,
            "--owner",
            &owner,
            "--group",
            &owner,
            "--json",
        ];
        let child = cli(&self.manager, None, &self.tmp, &create).spawn().unwrap();
        if fault != Fault::KillManagerDuringCreate {
            finish(&label, child, "reservation create").unwrap_or_else(|e| {
                panic!("{label}: reservation create: {e}\n{}", self.manager.logs())
            });
            return "";
        }
        std::thread::sleep(Duration::from_micros(rng.below(25_000)));
        let created = finish(&label, child, "reservation create");
        self.manager.restart();
        let show = ["reservation", "show", &name, "--json"];
        match (&created, &cli_run(&label, &self.manager, None, &self.tmp, &show)) {
            (Ok(answer), Ok(now)) => {
                let (a, b): (serde_json::Value, serde_json::Value) =
                    (serde_json::from_str(answer).unwrap(), serde_json::from_str(now).unwrap());
                assert!(
                    a["id"] == b["id"] && a["epoch"] == b["epoch"],
                    "{label}: {name} changed across the manager's restart: {a} then {b}"
                );
                ", create answered"
            }
            (Ok(answer), Err(e)) => panic!(
                "{label}: reservation create answered {answer} but after the manager's restart: {e}\n{}",
                self.manager.logs()
            ),
            (Err(_), Ok(_)) => ", create failed, reservation kept",
            (Err(_), Err(_)) => {
                self.run(&create);
                ", create failed, nothing kept"
            }
        }
    }

    /// The job's data: seeded files staged in by the owner, then committed (the job ended).
    fn stage_in_and_commit(&self, rng: &mut Rng, name: &str) -> Vec<(String, Vec<u8>)> {
        let src = self.tmp.parent().unwrap().join("src");
        let files: Vec<(String, Vec<u8>)> = (0..3 + rng.below(5))
            .map(|i| {
                let bytes = rng.below(3 << 20) as usize;
                (format!("d{}/f{i}.dat", i % 3), pattern(rng.next(), bytes))
            })
            .collect();
        for (relative, bytes) in &files {
            let path = src.join(relative);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, bytes).unwrap();
        }
        let src_arg = src.to_str().unwrap();
        let stage_in = ["stage-in", "--reservation", name, src_arg, "/data", "--progress", "none"];
        let (label, tmp) = (&self.label, &self.tmp);
        cli_until_ok(label, &self.manager, &self.cluster, Some(OWNER), tmp, &stage_in);
        let shown = self.run(&["reservation", "show", name, "--json"]);
        let reservation: serde_json::Value = serde_json::from_str(&shown).unwrap();
        let epoch = EpochId(reservation["epoch"].as_u64().unwrap());
        commit_everywhere(&endpoints(&self.cluster.dir), epoch)
            .unwrap_or_else(|e| panic!("{label}: {e}\n{}", self.cluster.logs()));
        files
    }

    /// The owner's stage-out of /data to `out` with the fault at a seeded moment, then the
    /// repair. Returns the stage-out's result and whether a copy was under way at the fault.
    fn stage_out_with_fault(
        &mut self,
        rng: &mut Rng,
        fault: Fault,
        name: &str,
        out: &Path,
    ) -> (Result<String, String>, bool) {
        let out_arg = out.to_str().unwrap();
        let stage_out = [
            "stage-out",
            "--reservation",
            name,
            "/data",
            out_arg,
            "--progress",
            "none",
            "--parallel",
            "1",
        ];
        let victim = rng.below(SERVERS as u64) as usize;
        let child = cli(&self.manager, Some(OWNER), &self.tmp, &stage_out).spawn().unwrap();
        let mut copying = false;
        if fault == Fault::KillManagerDuringStageOut {
            // The stage-out asks the manager for the reservation first, then copies on its own.
            std::thread::sleep(Duration::from_micros(rng.below(15_000)));
        } else if fault == Fault::FillPfsDuringStageOut {
            // Filling takes a while itself: start it early.
            std::thread::sleep(Duration::from_micros(rng.below(10_000)));
        } else {
            // Into the copy: once a partial copy (`.<name>.spillway-part`) exists (bounded
            // wait), a seeded moment later.
            let waited = Instant::now();
            while !copying && waited.elapsed() < Duration::from_secs(10) {
                copying = !partial_copies(out).is_empty();
                std::thread::sleep(Duration::from_micros(100));
            }
            std::thread::sleep(Duration::from_micros(rng.below(3_000)));
        }
        let mut filler = None;
        match fault {
            Fault::KillManagerDuringStageOut => {
                let pid = self.manager.process.pid();
                let _ = spillway_sys::signal::send(pid, spillway_sys::signal::Signal::SIGKILL);
            }
            Fault::KillServerDuringStageOut => {
                let _ = self.cluster.servers[victim].sigkill();
            }
            Fault::UnmountPfsDuringStageOut => self.out_mount.unmount(),
            Fault::FillPfsDuringStageOut => filler = Some(fill(&self.backing, 256 << 10)),
            _ => {}
        }
        let staged_out = finish(&self.label, child, "stage-out");
        if fault == Fault::UnmountPfsDuringStageOut {
            let bare: Vec<_> = std::fs::read_dir(&self.out_pfs).unwrap().collect();
            assert!(
                bare.is_empty(),
                "{}: the stage-out wrote into the bare PFS mount point: {bare:?}\n{}",
                self.label,
                self.logs()
            );
        }
        match fault {
            Fault::KillManagerDuringStageOut => self.manager.restart(),
            Fault::KillServerDuringStageOut => self.cluster.restart(victim),
            Fault::UnmountPfsDuringStageOut => {
                self.out_mount = MountGuard::bind(&self.backing, &self.out_pfs);
            }
            _ => {}
        }
        if let Some(path) = filler {
            std::fs::remove_file(path).unwrap();
        }
        (staged_out, copying)
    }

    /// After a failed stage-out: what the stage-out hook does (keep the reservation as a
    /// rescue naming the stage-out), then the owner's retry, which must copy every file
    /// correctly and release the reservation. Returns the retry's attempts.
    fn rescue_and_retry(&self, name: &str, out: &Path, files: &[(String, Vec<u8>)]) -> u32 {
        let label = &self.label;
        let out_arg = out.to_str().unwrap();
        let mark = [
            "reservation",
            "mark-rescue",
            name,
            "--error",
            "chaos: stage-out failed",
            "--from",
            "/data",
            "--to",
            out_arg,
        ];
        cli_until_ok(label, &self.manager, &self.cluster, None, &self.tmp, &mark);
        let shown = self.run(&["reservation", "show", name]);
        assert!(shown.contains("rescue"), "{label}: {name} is not kept as a rescue: {shown}");
        let retry = ["stage-out", "--retry", name, "--progress", "none"];
        let (_, attempts) =
            cli_until_ok(label, &self.manager, &self.cluster, Some(OWNER), &self.tmp, &retry);
        let complete = check_stage_out(label, out, files, &self.logs());
        assert_eq!(
            complete,
            files.len(),
            "{label}: stage-out --retry succeeded but only {complete} of {} files are under their final names\n{}",
            files.len(),
            self.logs()
        );
        let gone = cli_run(label, &self.manager, None, &self.tmp, &["reservation", "show", name]);
        assert!(gone.is_err(), "{label}: {name} was not released after its retry: {gone:?}");
        attempts
    }
}

/// A real manager and two servers; uid 1000's job reservation is created (the manager maybe
/// killed during it), data staged in and committed, then staged out by the owner to a PFS that
/// is a bind mount of a small tmpfs while the fault strikes. Checks the module doc's invariant.
fn stage_scenario(number: u64, seed: u64, fault: Fault) -> String {
    let label = format!("scenario {number} ({fault:?}, seed {seed:#x})");
    let mut rng = Rng(seed);
    let mut stage = Stage::start(label.clone());
    let job = (100 + number).to_string();
    let name = format!("job-{job}");
    let create_note = stage.create(&mut rng, fault, &job);
    let files = stage.stage_in_and_commit(&mut rng, &name);
    let out = stage.out_pfs.join(format!("out-{number}"));
    let (staged_out, copying) = stage.stage_out_with_fault(&mut rng, fault, &name, &out);
    let complete_after_fault = check_stage_out(&label, &out, &files, &stage.logs());
    let outcome = if staged_out.is_ok() {
        assert_eq!(
            complete_after_fault,
            files.len(),
            "{label}: stage-out succeeded but only {complete_after_fault} of {} files are under their final names\n{}",
            files.len(),
            stage.logs()
        );
        format!("stage-out completed (copying at the fault: {copying})")
    } else {
        let attempts = stage.rescue_and_retry(&name, &out, &files);
        format!(
            "stage-out failed (copying at the fault: {copying}; {complete_after_fault} files already final), rescue kept, retry completed in {attempts} attempt(s)"
        )
    };
    format!(
        "{label}: {} files, {} bytes staged, 1 epoch committed{create_note}, {outcome}",
        files.len(),
        files.iter().map(|(_, b)| b.len()).sum::<usize>()
    )
}

fn both_logs(manager: &Manager, cluster: &Cluster) -> String {
    format!("{}\n{}", manager.logs(), cluster.logs())
}

/// The stage-out's partial copies under `out`.
fn partial_copies(out: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![out.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            } else if path.to_string_lossy().ends_with(".spillway-part") {
                found.push(path);
            }
        }
    }
    found
}

/// Every file whose fsync returned reads back whole through `mount`.
fn check_through_mount(
    label: &str,
    mount: &FuseMount,
    files: &[(String, Vec<u8>)],
    synced: &[bool],
    cluster: &Cluster,
) {
    for ((name, bytes), _) in files.iter().zip(synced).filter(|(_, synced)| **synced) {
        let got = std::fs::read(mount.path.join(name)).unwrap_or_else(|e| {
            panic!(
                "{label}: {name} (fsync returned) does not read through the mount: {e}\nmount log: {}\n{}",
                mount.log_text(),
                cluster.logs()
            )
        });
        assert!(
            got.len() == bytes.len() && same_bytes(&got, bytes),
            "{label}: {name} (fsync returned) reads back wrong through the mount: {} bytes, {} expected\n{}",
            got.len(),
            bytes.len(),
            cluster.logs()
        );
    }
}

/// Every file whose fsync returned is equal on the PFS (mount files are published under their
/// POSIX paths, directly in the PFS directory), and there once its epoch is drained.
fn check_mount_files_on_pfs(
    label: &str,
    cluster: &Cluster,
    files: &[(String, Vec<u8>)],
    synced: &[bool],
    drained: bool,
) {
    for ((name, bytes), _) in files.iter().zip(synced).filter(|(_, synced)| **synced) {
        match std::fs::read(cluster.pfs.join(name)) {
            Ok(got) => assert!(
                got.len() == bytes.len() && same_bytes(&got, bytes),
                "{label}: {name} (fsync returned) is wrong on the PFS: {} bytes, {} expected\n{}",
                got.len(),
                bytes.len(),
                cluster.logs()
            ),
            Err(e) => assert!(
                !drained,
                "{label}: the mount's epoch is drained everywhere but {name} (fsync returned) is not on the PFS: {e}\n{}",
                cluster.logs()
            ),
        }
    }
}

/// `SPILLWAY_CHAOS_FAULTS`, for replaying one failure: only these faults run (Debug names,
/// comma-separated); the others' scenarios are drawn but skipped, so each scenario keeps its
/// number and seed.
fn fault_filter() -> Option<Vec<String>> {
    let only: Vec<String> = std::env::var("SPILLWAY_CHAOS_FAULTS")
        .ok()?
        .split(',')
        .map(|f| f.trim().to_string())
        .collect();
    for name in &only {
        assert!(
            FAULTS.iter().any(|f| format!("{f:?}") == *name),
            "SPILLWAY_CHAOS_FAULTS names {name:?}, not one of {FAULTS:?}"
        );
    }
    Some(only)
}

/// Waits (bounded) for the application to end; which files' fsync returned OK.
fn wait_for_application(
    label: &str,
    mut application: std::process::Child,
    mut stdout: std::io::BufReader<std::process::ChildStdout>,
    files: &[(String, Vec<u8>)],
    mount: &FuseMount,
    cluster: &Cluster,
) -> Vec<bool> {
    // Bounded: an application blocked for good in a call to the mount is a failure, not a wait.
    let waited = Instant::now();
    while application.try_wait().unwrap().is_none() {
        if waited.elapsed() >= Duration::from_secs(60) {
            let _ = application.kill();
        }
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "{label}: the application's calls through the mount hang 60 s after the fault\nmount log: {}\n{}",
            mount.log_text(),
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut report = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut report).unwrap();
    let synced: Vec<bool> = files
        .iter()
        .map(|(name, _)| report.lines().any(|line| line == format!("synced {name}")))
        .collect();
    synced
}
