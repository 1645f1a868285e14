//! Real Slurm end to end, twice: Debian 12's Slurm 22.05 on the host and Debian 13's Slurm 24.11
//! in a Debian root built once by scripts/slurm/debian13-root.sh (cached under /var/cache/spillway)
//! and run by scripts/slurm/start.sh in a mount namespace of its own. Each run is a one-node
//! cluster (scripts/slurm/start.sh: munged, slurmctld,
//! slurmd on localhost with burst_buffer/lua and slurm/burst_buffer.lua), a real `spillway
//! manager` and two real `spillway serve` processes, jobs submitted with `#BB_LUA` lines by an
//! unprivileged user (root may not request burst buffers).
//!
//! Scenarios, in one cluster so the whole file stays well under its 4-minute budget:
//! a malformed directive rejected at sbatch with the token named; `scontrol show bbstat`
//! showing `spillway status`; a job whose stage-in data is visible through the mount, which
//! writes a checkpoint through the mount and stages it out to the PFS with the right bytes, and
//! whose reservation is gone after teardown; a persistent reservation shared by two consecutive
//! jobs; a job cancelled during stage-in and one cancelled while running, both leaving no mount,
//! no reservation and no leftover spillway process. And a hostile second user squatting a job: its
//! reservation for the first user's pending job is refused by the manager (which asks this
//! Slurm who owns the job); a `job-N` reservation squatted anyway (root made it, as a site with
//! `manager.job_owner_check = "none"` would let the user) makes the job's setup fail with the
//! squatter named and the job held, and teardown leaves the squatter's reservation alone. The
//! other attacks on the manager run without Slurm in manager_security.rs. Stage-out: a job with
//! `stage_out` and no `stage_in` delivers what it wrote through its mount; a stage-out that
//! fails (target not writable) keeps the reservation as a rescue reservation named in the
//! job's reason, listed to its owner with the error, refused to everyone else, and `stage-out
//! --retry` finishes it; a stage-out that never finished (record still says so) is kept by
//! teardown.
//!
//! The two releases call the hooks differently (23.02 passes uid, gid and job_info to most of
//! them; 24.05 requires slurm_bb_test_data_in/out): the same scenarios run on both, one release
//! at a time.
//!
//! Needs root, the Debian packages slurm-wlm, munge and debootstrap (scripts/install-deps.sh),
//! Debian's archive for the first build of the root, and FUSE. It
//! FAILS with a message naming what is missing rather than skipping: CI runs as root with those
//! packages, so a skip would hide a broken integration.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use spillway_harness::{pattern, ServerProcess, SlurmRelease};

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const USER: &str = "spillway-test";
/// The second, hostile, unprivileged user (created if missing).
const OTHER_USER: &str = "spillway-sec3";
const MIB: u64 = 1 << 20;
/// Bound on any one wait (job to finish, teardown to complete); generous for 2 shared cores.
const WAIT_MAX: Duration = Duration::from_secs(90);
/// 1 MiB files in the tree whose stage-in is cancelled.
const STUCK_FILES: usize = 48;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn require_environment() {
    let euid = spillway_sys::user::euid();
    assert_eq!(
        euid, 0,
        "the Slurm end-to-end test must run as root (it starts slurmctld/slurmd and mounts FUSE); \
         run `make test` as root on CI"
    );
    for tool in
        ["munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "useradd"]
    {
        let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
            .any(|dir| dir.join(tool).exists());
        assert!(found, "`{tool}` not found: install the Debian packages slurm-wlm and munge (scripts/install-deps.sh)");
    }
    let lua = Path::new("/usr/lib/x86_64-linux-gnu/slurm-wlm/burst_buffer_lua.so");
    assert!(
        lua.exists() || glob_plugin(),
        "Slurm's burst_buffer_lua.so plugin is missing (Debian slurm-wlm-basic-plugins)"
    );
}

fn glob_plugin() -> bool {
    [
        "/usr/lib/slurm-wlm",
        "/usr/lib64/slurm",
        "/usr/lib/slurm",
        "/usr/lib/aarch64-linux-gnu/slurm-wlm",
    ]
    .iter()
    .any(|d| Path::new(d).join("burst_buffer_lua.so").exists())
}

/// A loopback TCP port nobody listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The cluster; stopped (scripts/slurm/stop.sh) when dropped, even after a failed assertion.
struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
    /// The Debian root Slurm runs in, if not the host's Slurm.
    root: Option<PathBuf>,
}

impl Cluster {
    /// The directory whose wrappers run the clients of a cluster in a Debian root; the manager
    /// puts it first on its PATH (it asks `squeue` who owns a job).
    fn client_dir(dir: &Path) -> PathBuf {
        dir.join("bin")
    }

    /// Starts Slurm in `dir`; in `root` (with `shared`, the test's directory, bound into it)
    /// when given.
    fn start(dir: &Path, manager_socket: &Path, root: Option<&Path>, shared: &Path) -> Cluster {
        let script = repo_root().join("scripts/slurm/start.sh");
        let mut command = Command::new(&script);
        command
            .arg(dir)
            .arg(BIN)
            .env("SPILLWAY_MANAGER", manager_socket)
            .env("SPILLWAY_SLURM_PORT", free_port().to_string())
            .env("SPILLWAY_SLURMD_PORT", free_port().to_string());
        if let Some(root) = root {
            command.env("SPILLWAY_SLURM_ROOT", root).env("SPILLWAY_SLURM_ROOT_BIND", shared);
        }
        let output = command.output().unwrap();
        let cluster = Cluster {
            dir: dir.to_path_buf(),
            conf: dir.join("etc/slurm.conf"),
            root: root.map(Path::to_path_buf),
        };
        assert!(
            output.status.success(),
            "{} failed: {}\n{}",
            script.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        cluster
    }

    /// A Slurm client `program` of this cluster, run as root.
    fn command(&self, program: &str) -> Command {
        let mut command = match self.root {
            Some(_) => Command::new(Cluster::client_dir(&self.dir).join(program)),
            None => Command::new(program),
        };
        command.env("SLURM_CONF", &self.conf);
        command
    }

    /// A Slurm client `program` of this cluster, run as `uid`/`gid` (the root's wrappers switch
    /// user inside the root: entering it takes root).
    fn command_as(&self, program: &str, uid: u32, gid: u32) -> Command {
        let mut command = self.command(program);
        match self.root {
            Some(_) => {
                command.env("SPILLWAY_SLURM_AS", format!("{uid}:{gid}"));
            }
            None => {
                command.uid(uid).gid(gid);
            }
        }
        command
    }

    /// The process whose view of the file system is the jobs' view: this one, or for a root
    /// the holder of its mount namespace (whose root is the root).
    fn jobs_view(&self) -> String {
        match self.root {
            Some(_) => std::fs::read_to_string(self.dir.join("run/root-ns.pid"))
                .expect("the root's namespace holder is gone")
                .trim()
                .to_string(),
            None => "self".to_string(),
        }
    }

    /// `path` as this cluster's jobs see it (through the jobs' mount namespace and root, where
    /// the reservations are mounted).
    fn seen_by_jobs(&self, path: &Path) -> PathBuf {
        match self.root {
            Some(_) => Path::new("/proc")
                .join(self.jobs_view())
                .join("root")
                .join(path.strip_prefix("/").expect("an absolute path")),
            None => path.to_path_buf(),
        }
    }

    /// Whether something is mounted at `path` where this cluster's jobs see it (mount points
    /// are listed relative to the viewing process's root).
    fn is_mounted(&self, path: &Path) -> bool {
        let table = format!("/proc/{}/mountinfo", self.jobs_view());
        let text = std::fs::read_to_string(&table).unwrap();
        let wanted = path.to_string_lossy();
        text.lines().any(|line| line.split(' ').nth(4) == Some(&*wanted))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log/slurmctld.log")).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("scripts/slurm/stop.sh")).arg(&self.dir).status();
    }
}

/// `spillway manager`, SIGTERMed and reaped when dropped.
struct Manager {
    child: Child,
    socket: PathBuf,
}

impl Drop for Manager {
    fn drop(&mut self) {
        // The pid is our child's (not reaped yet); a failed send ends in the kill below.
        let _ = spillway_sys::signal::send(self.child.id(), spillway_sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Manager {
    /// Starts the manager; `slurm_clients`, when given, goes first on its PATH.
    fn start(dir: &Path, slurm_clients: Option<&Path>) -> Manager {
        let socket = dir.join("manager/manager.sock");
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        std::fs::set_permissions(socket.parent().unwrap(), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let config = dir.join("manager/manager.toml");
        std::fs::write(
            &config,
            // One user may hold every promise of the pool's peaks: the targets scenario makes
            // one job wait for another's promises on a two-server pool.
            format!(
                "[manager]\nfragment_bytes = {}\nheartbeat_ms = 500\ntargets_user_share_percent_max = 100\n",
                8 * MIB
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("manager/manager.log")).unwrap();
        let mut command = Command::new(BIN);
        if let Some(clients) = slurm_clients {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let mut dirs = vec![clients.to_path_buf()];
            dirs.extend(std::env::split_paths(&path));
            command.env("PATH", std::env::join_paths(dirs).unwrap());
        }
        let child = command
            .arg("manager")
            // scontrol (asked who owns a job) finds the test cluster, started after the manager.
            .env("SLURM_CONF", dir.join("slurm/etc/slurm.conf"))
            .arg("--config")
            .arg(&config)
            .arg("--socket")
            .arg(&socket)
            .arg("--db")
            .arg(dir.join("manager/manager.db"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let manager = Manager { child, socket };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if manager.socket.exists()
                && spillway(&manager.socket, &["pool", "list", "--json"]).status.success()
            {
                return manager;
            }
            assert!(
                Instant::now() < deadline,
                "the manager did not answer within 30 s; log: {}",
                std::fs::read_to_string(dir.join("manager/manager.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `spillway ARGS` as root against the manager.
fn spillway(socket: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("SPILLWAY_MANAGER", socket)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn spillway_ok(socket: &Path, args: &[&str]) -> String {
    let output = spillway(socket, args);
    assert!(
        output.status.success(),
        "spillway {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn reservation_exists(socket: &Path, name: &str) -> bool {
    spillway(socket, &["reservation", "show", name, "--json"]).status.success()
}

fn user_ids() -> (u32, u32) {
    ids_of(USER)
}

/// The uid and gid of `user`, which must exist.
fn ids_of(user: &str) -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id").arg(flag).arg(user).output().unwrap();
        assert!(out.status.success(), "user {user} missing");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    (id("-u"), id("-g"))
}

/// The second user's uid and gid, creating the user if missing.
fn other_user_ids() -> (u32, u32) {
    let user = spillway_harness::TestUser::create(OTHER_USER)
        .unwrap_or_else(|e| panic!("the second test user: {e}"));
    (user.uid, user.gid)
}

/// `spillway ARGS` as `uid`/`gid` against the manager.
fn spillway_as(socket: &Path, (uid, gid): (u32, u32), args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("SPILLWAY_MANAGER", socket)
        .stdin(Stdio::null())
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap()
}

/// Asserts that `output` failed with `needle` in its stderr.
fn assert_refused(output: &Output, needle: &str, what: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "{what} succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(stderr.contains(needle), "{what}: expected {needle:?} in {stderr:?}");
}

/// Submit `script` (written to `work/<name>.sh`) as the test user; the sbatch output.
fn sbatch(cluster: &Cluster, work: &Path, name: &str, script: &str, extra: &[&str]) -> Output {
    let (uid, gid) = user_ids();
    let path = work.join(format!("{name}.sh"));
    std::fs::write(&path, script).unwrap();
    std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
    cluster
        .command_as("sbatch", uid, gid)
        .arg("--parsable")
        .args(extra)
        .arg(&path)
        .current_dir(work)
        .output()
        .unwrap()
}

fn submit(cluster: &Cluster, work: &Path, name: &str, script: &str) -> u64 {
    let output = sbatch(cluster, work, name, script, &[]);
    assert!(output.status.success(), "sbatch {name}: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    text.trim()
        .split(';')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("sbatch printed {text:?}"))
}

/// `scontrol show job -o ID` as key=value pairs (empty once the job is purged).
fn job_fields(cluster: &Cluster, job: u64) -> std::collections::HashMap<String, String> {
    let output =
        cluster.command("scontrol").args(["show", "job", "-o", &job.to_string()]).output().unwrap();
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

fn job_state(cluster: &Cluster, job: u64) -> String {
    job_fields(cluster, job).get("JobState").cloned().unwrap_or_default()
}

fn wait_for(what: &str, cluster: &Cluster, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT_MAX;
    while !done() {
        if Instant::now() > deadline {
            let log = cluster.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!("timed out waiting for {what}; slurmctld log tail:\n{}", tail.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Wait until the job ended (any final state) and return that state.
fn wait_job_end(cluster: &Cluster, job: u64) -> String {
    let mut state = String::new();
    wait_for(&format!("job {job} to end"), cluster, || {
        state = job_state(cluster, job);
        matches!(
            state.as_str(),
            "COMPLETED"
                | "FAILED"
                | "CANCELLED"
                | "TIMEOUT"
                | "NODE_FAIL"
                | "OUT_OF_MEMORY"
                | "BOOT_FAIL"
                | "DEADLINE"
        )
    });
    state
}

/// Pids of spillway `verb` processes (e.g. `stage-in`) referring to the job.
fn leftover_pids(mountpoint: &Path, reservation: &str, verb: &str) -> Vec<u32> {
    leftover_processes(mountpoint, reservation)
        .iter()
        .filter(|line| line.split_whitespace().nth(2) == Some(verb))
        .filter_map(|line| line.split(':').next()?.parse().ok())
        .collect()
}

/// Spillway processes still referring to a job (its mount point or its reservation name), as
/// `pid: argv…` lines.
fn leftover_processes(mountpoint: &Path, reservation: &str) -> Vec<String> {
    let mut found = Vec::new();
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let spillway = args.first().is_some_and(|a| a.ends_with("spillway"));
        let mp = mountpoint.to_string_lossy();
        if spillway && args.iter().any(|a| *a == *mp || a == reservation) {
            found.push(format!("{pid}: {}", args.join(" ")));
        }
    }
    found
}

/// After the job ended: teardown has removed the mount, the reservation (unless persistent)
/// and every process of the job.
fn assert_cleaned_up(
    cluster: &Cluster,
    manager: &Manager,
    job: u64,
    reservation: &str,
    persistent: bool,
) {
    let mountpoint = cluster.dir.join(format!("mnt/job-{job}"));
    let record = cluster.dir.join(format!("bb-state/job-{job}.json"));
    wait_for(&format!("teardown of job {job}"), cluster, || {
        !record.exists()
            && !cluster.is_mounted(&mountpoint)
            && (persistent || !reservation_exists(&manager.socket, reservation))
            && leftover_processes(&mountpoint, reservation).is_empty()
    });
    assert!(!mountpoint.exists(), "mount point {} left behind", mountpoint.display());
    // use_persistent mount points (`job-<id>.<name>`) go too.
    let beside = format!("job-{job}.");
    let left: Vec<_> = std::fs::read_dir(cluster.dir.join("mnt"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&beside))
        .map(|entry| entry.path())
        .collect();
    assert!(left.is_empty(), "mount points of job {job} left behind: {left:?}");
    if persistent {
        assert!(
            reservation_exists(&manager.socket, reservation),
            "persistent reservation {reservation} destroyed by a job"
        );
    }
}

fn mount_available() -> bool {
    Command::new(BIN)
        .args(["mount", "--help"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// One release at a time: two clusters on two shared cores would make every wait a race.
static ONE_RELEASE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn slurm_22_05_end_to_end() {
    let _one = ONE_RELEASE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    end_to_end(SlurmRelease::Host2205);
}

#[test]
fn slurm_24_11_end_to_end() {
    let _one = ONE_RELEASE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    end_to_end(SlurmRelease::Debian13);
}

fn end_to_end(release: SlurmRelease) {
    require_environment();
    let root = release.root();
    let started = Instant::now();
    let tmp = tempfile::Builder::new().prefix("spillway-slurm-").tempdir_in("/tmp").unwrap();
    let dir = tmp.path().to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();

    // Two burst buffer servers draining to a shared PFS directory, one manager, one pool.
    let pfs = dir.join("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    std::fs::set_permissions(&pfs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let servers: Vec<ServerProcess> = (0..2)
        .map(|i| ServerProcess::builder(BIN, &dir, &format!("bb{i}")).pfs_dir(&pfs).start())
        .collect();
    let slurm_dir = dir.join("slurm");
    let manager =
        Manager::start(&dir, root.as_ref().map(|_| Cluster::client_dir(&slurm_dir)).as_deref());
    add_pool_with_servers(&manager, &servers, &pfs);

    // The users exist before Slurm starts: a root's Slurm sees the host's users as they were then.
    other_user_ids();
    let cluster = Cluster::start(&slurm_dir, &manager.socket, root.as_deref(), &dir);
    let version = slurm_version(&cluster, release);
    let testbed = Testbed::prepare(&cluster, &manager, &dir, &pfs);
    let cluster_ready = started.elapsed();
    let mut passed = Passed::new();

    // 1. A malformed directive is rejected at submission, naming the bad token.
    malformed_directive_rejected_at_sbatch(&testbed, &mut passed);
    // 1b. `#DW`, a late `#BB_LUA`, `--bb`, an unknown pool, an impossible size: refused too.
    ignored_requests_refused_at_sbatch(&testbed, &mut passed);
    // 2. `scontrol show bbstat` runs `spillway status`, which names the pool.
    bbstat_shows_spillway_status(&testbed, &mut passed);
    // A second user cannot reserve for the user's job; a squat made anyway fails its setup.
    job_squatting_refused(&testbed, &mut passed);

    let mount = mount_available();
    if !mount {
        println!("NOTE: `spillway mount --help` failed: the mount-dependent scenarios are not run");
    }

    // 3. Stage-in visible in the job, checkpoint written through the mount, staged out.
    let input = write_stage_in_input(&testbed);
    if mount {
        stage_in_checkpoint_and_stage_out(&testbed, &input, &mut passed);
    }
    // 3b. Stage-out without stage-in: the job's writes through the mount reach the PFS.
    if mount {
        stage_out_only(&testbed, &mut passed);
    }
    // 3b'. Long stage lines: quoted paths with spaces and colons, type=file|list, when=success.
    if mount {
        long_stage_lines(&testbed, &mut passed);
    }
    // 3b''. A private reservation, staged per node (slurm_cluster_e2e does it on two nodes).
    if mount {
        private_reservation_staged_per_node(&testbed, &mut passed);
    }
    // 3c. A failed stage-out keeps the reservation as a rescue; `stage-out --retry` finishes it.
    if mount {
        failed_stage_out_kept_as_rescue_then_retried(&testbed, &mut passed);
    }
    // 7 and 8 are done by Slurm's periodic pools refresh (about every 30 s): their ghost jobs
    // are made now and checked last, so one refresh serves both while the scenarios between run.
    let ghosts = Ghosts::make(&testbed);
    // 4. A persistent reservation shared by two consecutive jobs.
    if mount {
        persistent_reservation_shared_by_two_jobs(&testbed, &mut passed);
    }
    // 4b. Reservations by performance target: a job waits for another's promises; the pools
    // refresh that releases it also serves scenario 7, so it is checked after that one.
    let targets = mount.then(|| TargetJobs::start(&testbed, &mut passed));
    // 5. Cancelled during stage-in.
    cancelled_during_stage_in(&testbed, &mut passed);
    // 7. A stage-in that fails (missing source) holds the job and releases the reservation.
    failed_stage_in_holds_job_and_releases_reservation(&testbed, &mut passed);
    if let Some(targets) = targets {
        targets.finish(&testbed, &mut passed);
    }
    // 6. Cancelled while running with its reservation mounted.
    if mount {
        cancelled_while_running(&testbed, &mut passed);
    }
    // 7. A job whose teardown never ran.
    ghosts.lost_teardown_done_by_pools_refresh(&testbed, &mut passed);
    // 8. A job whose stage-out never finished (data_out killed): teardown keeps a rescue.
    ghosts.unfinished_stage_out_kept_by_teardown(&testbed, &mut passed);

    passed.print(version.trim(), started.elapsed(), cluster_ready);
    if let Some(copy) = std::env::var_os("SPILLWAY_SLURM_LOG_COPY") {
        let _ = std::fs::copy(cluster.dir.join("log/slurmctld.log"), copy);
    }
    drop(cluster);
    drop(manager);
    drop(servers);
}

/// `scontrol --version`, which must be `release`'s.
fn slurm_version(cluster: &Cluster, release: SlurmRelease) -> String {
    let version = cluster.command("scontrol").arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    assert!(
        version.starts_with(release.version_prefix()),
        "{release:?}: scontrol --version says {version:?}"
    );
    version
}

/// The pool `fast` with every server added to it, draining to `pfs`.
fn add_pool_with_servers(manager: &Manager, servers: &[ServerProcess], pfs: &Path) {
    spillway_ok(&manager.socket, &["pool", "create", "fast", "--granularity", &MIB.to_string()]);
    for server in servers {
        let address = server.endpoint().to_string();
        let pfs_text = pfs.to_string_lossy().into_owned();
        spillway_ok(
            &manager.socket,
            &[
                "server",
                "add",
                &address,
                "--pool",
                "fast",
                "--capacity",
                &(256 * MIB).to_string(),
                "--pfs",
                &pfs_text,
            ],
        );
    }
}

/// What the scenarios share: the cluster, the manager, the test user and its directories.
struct Testbed<'a> {
    cluster: &'a Cluster,
    manager: &'a Manager,
    uid: u32,
    gid: u32,
    /// The user's job scripts and their output.
    work: PathBuf,
    /// Stage-in sources on the PFS.
    pfs_in: PathBuf,
    /// Stage-out targets on the PFS.
    pfs_out: PathBuf,
}

impl<'a> Testbed<'a> {
    /// Makes the user's work directory and the PFS directories `in` and `out`, owned by the user.
    fn prepare(cluster: &'a Cluster, manager: &'a Manager, dir: &Path, pfs: &Path) -> Self {
        let (uid, gid) = user_ids();
        let work = dir.join("work");
        std::fs::create_dir_all(&work).unwrap();
        std::os::unix::fs::chown(&work, Some(uid), Some(gid)).unwrap();
        let pfs_in = pfs.join("in");
        let pfs_out = pfs.join("out");
        for d in [&pfs_in, &pfs_out] {
            std::fs::create_dir_all(d).unwrap();
            std::os::unix::fs::chown(d, Some(uid), Some(gid)).unwrap();
        }
        Testbed { cluster, manager, uid, gid, work, pfs_in, pfs_out }
    }

    /// Submits `script` as the test user; the job id.
    fn submit(&self, name: &str, script: &str) -> u64 {
        submit(self.cluster, &self.work, name, script)
    }

    /// Submits `script` held (`sbatch -H`) as the test user; the job id. Slurm does not set
    /// up a held job's burst buffer until it is released.
    fn submit_held(&self, name: &str, script: &str) -> u64 {
        let output = sbatch(self.cluster, &self.work, name, script, &["-H"]);
        assert!(
            output.status.success(),
            "sbatch -H {name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8_lossy(&output.stdout);
        text.trim()
            .split(';')
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("sbatch printed {text:?}"))
    }

    /// `scontrol release` of `job` as the test user, which must succeed.
    fn release(&self, job: u64) {
        let release = self
            .cluster
            .command_as("scontrol", self.uid, self.gid)
            .args(["release", &job.to_string()])
            .status()
            .unwrap();
        assert!(release.success(), "scontrol release {job}");
    }

    /// `scancel` of `job` as the test user, which must succeed.
    fn cancel(&self, job: u64) {
        let cancel = self
            .cluster
            .command_as("scancel", self.uid, self.gid)
            .arg(job.to_string())
            .status()
            .unwrap();
        assert!(cancel.success());
    }

    /// After the job ended: teardown left nothing behind (see `assert_cleaned_up`).
    fn assert_cleaned_up(&self, job: u64, reservation: &str, persistent: bool) {
        assert_cleaned_up(self.cluster, self.manager, job, reservation, persistent);
    }

    /// The job's output file `<prefix>-<job>.out` in the work directory, empty if missing.
    fn job_output(&self, prefix: &str, job: u64) -> String {
        std::fs::read_to_string(self.work.join(format!("{prefix}-{job}.out"))).unwrap_or_default()
    }
}

/// The scenarios passed so far, each with the seconds it took.
struct Passed {
    scenarios: Vec<(&'static str, f64)>,
    mark: Instant,
}

impl Passed {
    /// None passed yet; the first scenario is timed from now.
    fn new() -> Passed {
        Passed { scenarios: Vec::new(), mark: Instant::now() }
    }

    /// Records `scenario` as passed, timed from the previous one.
    fn pass(&mut self, scenario: &'static str) {
        self.scenarios.push((scenario, self.mark.elapsed().as_secs_f64()));
        self.mark = Instant::now();
    }

    /// Prints the scenarios passed and the times taken.
    fn print(&self, version: &str, total: Duration, cluster_ready: Duration) {
        println!("{version}: Slurm scenarios passed ({}):", self.scenarios.len());
        for (scenario, seconds) in &self.scenarios {
            println!("  - {scenario} ({seconds:.1} s)");
        }
        println!(
            "Slurm end-to-end time: {:.1} s total ({:.1} s to start manager, servers and cluster)",
            total.as_secs_f64(),
            cluster_ready.as_secs_f64()
        );
    }
}

/// A malformed directive is rejected at submission, naming the bad token.
fn malformed_directive_rejected_at_sbatch(testbed: &Testbed<'_>, passed: &mut Passed) {
    let (cluster, work) = (testbed.cluster, &testbed.work);
    let bad = sbatch(
        cluster,
        work,
        "bad",
        "#!/bin/sh\n#BB_LUA capacity=8M pool=fast colour=blue\ntrue\n",
        &[],
    );
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success(),
        "sbatch accepted a malformed directive: {}",
        String::from_utf8_lossy(&bad.stdout)
    );
    assert!(
        stderr.contains("colour=blue"),
        "sbatch's message does not name the bad token: {stderr}"
    );
    let bad_size = sbatch(
        cluster,
        work,
        "bad-size",
        "#!/bin/sh\n#BB_LUA capacity=8M pool=fast access=sideways\ntrue\n",
        &[],
    );
    assert!(!bad_size.status.success());
    assert!(String::from_utf8_lossy(&bad_size.stderr).contains("access=sideways"));
    passed.pass("malformed directive rejected at sbatch");
}

/// What Slurm alone would ignore (the job running with no buffer) or pend on forever is refused
/// by slurm/job_submit.lua, naming the line and the fix.
fn ignored_requests_refused_at_sbatch(testbed: &Testbed<'_>, passed: &mut Passed) {
    let (cluster, work) = (testbed.cluster, &testbed.work);
    // What Slurm alone would ignore (the job running with no buffer) or pend on forever is
    // refused by slurm/job_submit.lua, naming the line and the fix.
    let refusals: [(&str, &str, &[&str], &[&str]); 5] = [
        (
            "dw",
            "#!/bin/sh\n#SBATCH -N 1\n#DW jobdw capacity=8MB\ntrue\n",
            &[],
            &["line 3", "#BB_LUA capacity=SIZE"],
        ),
        (
            "late",
            "#!/bin/sh\necho start\n#BB_LUA capacity=8M pool=fast\ntrue\n",
            &[],
            &["line 3", "move it above line 2"],
        ),
        (
            "bb-option",
            "#!/bin/sh\ntrue\n",
            &["--bb", "capacity=8M pool=fast"],
            &["--bb", "#BB_LUA capacity=8M pool=fast"],
        ),
        (
            "no-pool",
            "#!/bin/sh\n#BB_LUA capacity=8M pool=nope\ntrue\n",
            &[],
            &["line 2", "no such pool", "fast"],
        ),
        (
            "too-big",
            "#!/bin/sh\n#BB_LUA capacity=1P pool=fast\ntrue\n",
            &[],
            &["line 2", "more than pool fast holds"],
        ),
    ];
    for (name, script, extra, needles) in refusals {
        let refused = sbatch(cluster, work, name, script, extra);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success(),
            "sbatch accepted the {name} script: {}",
            String::from_utf8_lossy(&refused.stdout)
        );
        for needle in needles {
            assert!(
                stderr.contains(needle),
                "sbatch's refusal of {name}: {needle:?} not in {stderr}"
            );
        }
    }
    passed.pass(
        "#DW, late #BB_LUA, --bb, unknown pool and impossible size refused at sbatch by line",
    );
}

/// `scontrol show bbstat` runs `spillway status`, which names the pool.
fn bbstat_shows_spillway_status(testbed: &Testbed<'_>, passed: &mut Passed) {
    let bbstat = testbed.cluster.command("scontrol").args(["show", "bbstat"]).output().unwrap();
    let bbstat_text = String::from_utf8_lossy(&bbstat.stdout);
    assert!(
        bbstat.status.success() && bbstat_text.contains("fast"),
        "bbstat: {bbstat_text}{}",
        String::from_utf8_lossy(&bbstat.stderr)
    );
    passed.pass("scontrol show bbstat shows spillway status");
}

/// The whole `scontrol -o show job` line of `job` (its Reason may hold spaces).
fn job_line(cluster: &Cluster, job: u64) -> String {
    let output =
        cluster.command("scontrol").args(["-o", "show", "job", &job.to_string()]).output().unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The reservation's JSON as root sees it (`reservation show --json`).
fn reservation_json(manager: &Manager, name: &str) -> serde_json::Value {
    let text = spillway_ok(&manager.socket, &["reservation", "show", name, "--json"]);
    serde_json::from_str(text.trim()).unwrap()
}

/// Job squatting, the one hostile scenario that needs Slurm. A second user asking for a
/// reservation for the test user's held job is refused: the manager asks Slurm who owns it (a
/// job id Slurm has not given out is refused too); the job's own user may reserve for it. Then
/// a `job-N` reservation that the second user holds when the job's setup runs (root creates
/// it here: the manager refuses the user's own attempt, and this setup check is what protects
/// a site that turned that off): setup fails naming that uid, Slurm holds the job with the
/// message, no record is written, and teardown leaves the reservation alone.
fn job_squatting_refused(testbed: &Testbed<'_>, passed: &mut Passed) {
    let (cluster, socket) = (testbed.cluster, &testbed.manager.socket);
    let script = format!(
        "#!/bin/sh\n#SBATCH -o {work}/squatted-%j.out\n#BB_LUA capacity=8M pool=fast\ntrue\n",
        work = testbed.work.display()
    );
    let job = testbed.submit_held("squatted", &script);
    let name = format!("job-{job}");
    let (squatter, squatter_gid) = other_user_ids();
    let job_text = job.to_string();
    let create =
        ["reservation", "create", "--capacity", "8M", "--pool", "fast", "--job", &job_text];
    assert_refused(
        &spillway_as(socket, (squatter, squatter_gid), &create),
        &format!(
            "job {job} belongs to uid {}; only its owner or root can reserve for it",
            testbed.uid
        ),
        "a second user reserving for the test user's job",
    );
    let future = (job + 1000).to_string();
    let ahead = ["reservation", "create", "--capacity", "8M", "--pool", "fast", "--job", &future];
    assert_refused(
        &spillway_as(socket, (squatter, squatter_gid), &ahead),
        "Slurm does not know job",
        "a job id not yet given",
    );
    assert!(!reservation_exists(socket, &name));
    let own = spillway_as(socket, (testbed.uid, testbed.gid), &create);
    assert!(
        own.status.success(),
        "the job's user reserving for it: {}",
        String::from_utf8_lossy(&own.stderr)
    );
    spillway_ok(socket, &["reservation", "destroy", &name]);

    let (uid_text, gid_text) = (squatter.to_string(), squatter_gid.to_string());
    let mut squat = create.to_vec();
    squat.extend(["--owner", &uid_text, "--group", &gid_text]);
    spillway_ok(socket, &squat);
    testbed.release(job);
    let wanted = format!("belongs to uid {squatter}, not to the job's uid {}", testbed.uid);
    wait_for(&format!("job {job} held by its failed setup"), cluster, || {
        job_line(cluster, job).contains(&wanted)
    });
    assert_eq!(job_state(cluster, job), "PENDING", "{}", job_line(cluster, job));
    // Slurm's "Teardown … ran for" line is verbose-level; its job record says it too.
    wait_for(&format!("job {job}'s teardown (Flags=TeardownFailure)"), cluster, || {
        job_fields(cluster, job).get("BurstBufferState").map(String::as_str) == Some("complete")
    });
    assert_eq!(
        reservation_json(testbed.manager, &name)["owner"],
        squatter,
        "teardown destroyed the squatter's reservation"
    );
    testbed.cancel(job);
    wait_job_end(cluster, job);
    assert!(
        !cluster.dir.join(format!("bb-state/job-{job}.json")).exists(),
        "a record for the refused setup"
    );
    assert_eq!(
        reservation_json(testbed.manager, &name)["owner"],
        squatter,
        "the squatter's reservation after the cancel"
    );
    spillway_ok(socket, &["reservation", "destroy", &name]);
    passed.pass(
        "job squatting: refused by the manager (Slurm asked), then by setup; teardown leaves it",
    );
}

/// Writes the stage-in source `data.bin` on the PFS, owned by the user; returns its bytes.
fn write_stage_in_input(testbed: &Testbed<'_>) -> Vec<u8> {
    let input = pattern(7, (3 * MIB + 12_345) as usize);
    std::fs::write(testbed.pfs_in.join("data.bin"), &input).unwrap();
    std::os::unix::fs::chown(testbed.pfs_in.join("data.bin"), Some(testbed.uid), Some(testbed.gid))
        .unwrap();
    input
}

/// Stage-in visible in the job, checkpoint written through the mount, staged out.
fn stage_in_checkpoint_and_stage_out(testbed: &Testbed<'_>, input: &[u8], passed: &mut Passed) {
    let cluster = testbed.cluster;
    let checkpoint_bytes = 2 * MIB + 777;
    let script = format!(
        "#!/bin/sh\n#SBATCH -o {work}/stage-%j.out\n\
         #BB_LUA capacity=24MiB pool=fast access=striped\n\
         #BB_LUA stage_in={pfs_in}/data.bin:input/data.bin\n\
         #BB_LUA stage_out=ckpt/state.bin:{pfs_out}/state.bin\n\
         set -e\necho \"bb=$SPILLWAY_BB\"\n\
         cmp \"$SPILLWAY_BB/input/data.bin\" {pfs_in}/data.bin && echo STAGE_IN_OK\n\
         mkdir -p \"$SPILLWAY_BB/ckpt\"\n\
         head -c {checkpoint_bytes} {pfs_in}/data.bin > \"$SPILLWAY_BB/ckpt/state.bin\"\n\
         sync \"$SPILLWAY_BB/ckpt/state.bin\"\necho CHECKPOINT_OK\n",
        work = testbed.work.display(),
        pfs_in = testbed.pfs_in.display(),
        pfs_out = testbed.pfs_out.display(),
    );
    let job = testbed.submit("stage", &script);
    let state = wait_job_end(cluster, job);
    let out = testbed.job_output("stage", job);
    assert_eq!(state, "COMPLETED", "job {job}: {out}\n{:?}", job_fields(cluster, job));
    assert!(
        out.contains(&format!("bb={}/mnt/job-{job}", cluster.dir.display())),
        "SPILLWAY_BB not set: {out}"
    );
    assert!(out.contains("STAGE_IN_OK"), "stage-in data not visible in the job: {out}");
    assert!(out.contains("CHECKPOINT_OK"), "checkpoint through the mount failed: {out}");
    passed.pass("stage-in data visible in the job");
    passed.pass("checkpoint written through the mount");
    testbed.assert_cleaned_up(job, &format!("job-{job}"), false);
    let staged = std::fs::read(testbed.pfs_out.join("state.bin"))
        .expect("stage-out wrote nothing to the PFS");
    assert_eq!(staged.len() as u64, checkpoint_bytes);
    assert!(
        staged == input[..checkpoint_bytes as usize],
        "stage-out bytes differ from the checkpoint"
    );
    passed.pass("stage-out data on the PFS with the right bytes");
    passed.pass("job reservation gone after teardown");
}

/// A job with `stage_out` and no `stage_in`: the mount is the first to touch the reservation's
/// epoch, and what the job writes through it must still be the owner's, so the owner's
/// stage-out delivers it (a mount that claimed the epoch as root made the stage-out fail, the
/// job end COMPLETED and teardown destroy the output).
fn stage_out_only(testbed: &Testbed<'_>, passed: &mut Passed) {
    let cluster = testbed.cluster;
    let bytes = MIB + 4321;
    let script = format!(
        "#!/bin/sh\n#SBATCH -o {work}/outonly-%j.out\n\
         #BB_LUA capacity=8MiB pool=fast access=striped\n\
         #BB_LUA stage_out=result/out.bin:{pfs_out}/only-out.bin\n\
         set -e\nmkdir -p \"$SPILLWAY_BB/result\"\n\
         head -c {bytes} {pfs_in}/data.bin > \"$SPILLWAY_BB/result/out.bin\"\nsync \"$SPILLWAY_BB/result/out.bin\"\necho WROTE\n",
        work = testbed.work.display(),
        pfs_in = testbed.pfs_in.display(),
        pfs_out = testbed.pfs_out.display(),
    );
    let job = testbed.submit("outonly", &script);
    let state = wait_job_end(cluster, job);
    let out = testbed.job_output("outonly", job);
    let fields = job_fields(cluster, job);
    assert_eq!(state, "COMPLETED", "job {job}: {out}\n{fields:?}");
    assert!(out.contains("WROTE"), "the job could not write through its mount: {out}");
    testbed.assert_cleaned_up(job, &format!("job-{job}"), false);
    let staged = std::fs::read(testbed.pfs_out.join("only-out.bin")).unwrap_or_else(|e| {
        panic!("job {job}: stage-out without stage-in delivered nothing ({e}); {fields:?}")
    });
    let input = std::fs::read(testbed.pfs_in.join("data.bin")).unwrap();
    assert!(staged == input[..bytes as usize], "stage-out bytes differ from what the job wrote");
    passed.pass("stage-out without stage-in delivers what the job wrote through its mount");
}

/// The long stage lines. A job stages in a file whose path has a space and a colon
/// (`type=file`, quoted) and the files a stage list names (`type=list`, one name with a space),
/// reads them through its mount, and sees its stage-in progress on the job (`AdminComment`); a
/// second job that exits 3 gets its `when=always` stage-out and not its `when=success` one.
/// `access=private` with stage lines: the node's prolog copies the stage-in into its own
/// namespace, the stage-out lands in `destination/<node>`; a stage-in that could not fit one
/// copy per node is refused by data_in (the job is held, naming the sizes).
fn private_reservation_staged_per_node(testbed: &Testbed<'_>, passed: &mut Passed) {
    let cluster = testbed.cluster;
    let input = testbed.pfs_in.join("private-in.bin");
    std::fs::write(&input, pattern(6, 300_000)).unwrap();
    let script = format!(
        "#!/bin/sh\n#SBATCH -o {work}/private-%j.out\n\
         #BB_LUA capacity=8MiB pool=fast access=private\n\
         #BB_LUA stage_in source={input} destination=in/input.bin type=file\n\
         #BB_LUA stage_out source=out destination={pfs_out}/private\n\
         set -e\ncmp \"$SPILLWAY_BB/in/input.bin\" {input}\n\
         mkdir \"$SPILLWAY_BB/out\"\necho \"from $SLURMD_NODENAME\" > \"$SPILLWAY_BB/out/node.txt\"\necho PRIVATE-OK\n",
        work = testbed.work.display(),
        input = input.display(),
        pfs_out = testbed.pfs_out.display(),
    );
    let job = testbed.submit("private", &script);
    let state = wait_job_end(cluster, job);
    let out = testbed.job_output("private", job);
    let line = job_line(cluster, job);
    assert_eq!(state, "COMPLETED", "job {job}: {out}\n{line}");
    assert!(out.contains("PRIVATE-OK"), "job {job} did not read its node's stage-in: {out}");
    testbed.assert_cleaned_up(job, &format!("job-{job}"), false);
    let staged = testbed.pfs_out.join("private/localhost/node.txt");
    let text = std::fs::read_to_string(&staged).unwrap_or_default();
    assert_eq!(text, "from localhost\n", "{}: job {job}: {line}", staged.display());
    passed.pass(
        "private reservation: stage-in in the node's prolog, stage-out into destination/<node>",
    );

    // 9 MiB into an 8 MiB reservation, once per node: refused before the job is scheduled.
    let big = testbed.pfs_in.join("private-big.bin");
    std::fs::write(&big, pattern(7, 9 * MIB as usize)).unwrap();
    let too_big = format!(
        "#!/bin/sh\n#SBATCH -o {work}/privbig-%j.out\n\
         #BB_LUA capacity=8MiB pool=fast access=private\n\
         #BB_LUA stage_in source={big} destination=big.bin\ntrue\n",
        work = testbed.work.display(),
        big = big.display(),
    );
    let job = testbed.submit("privbig", &too_big);
    let mut reason = String::new();
    wait_for(&format!("job {job} held: its stage-in cannot fit"), cluster, || {
        reason = job_fields(cluster, job).get("Reason").cloned().unwrap_or_default();
        reason.contains("private")
    });
    assert!(reason.contains("9.0_MiB") || reason.contains("9.0 MiB"), "job {job}: {reason}");
    testbed.cancel(job);
    wait_job_end(cluster, job);
    testbed.assert_cleaned_up(job, &format!("job-{job}"), false);
    passed
        .pass("private stage-in that cannot fit a copy per node held at data_in, naming the sizes");
}

fn long_stage_lines(testbed: &Testbed<'_>, passed: &mut Passed) {
    let cluster = testbed.cluster;
    let odd_dir = testbed.pfs_in.join("my run:1");
    std::fs::create_dir_all(&odd_dir).unwrap();
    let odd = odd_dir.join("in put.bin");
    std::fs::write(&odd, pattern(3, 100_000)).unwrap();
    let listed_a = testbed.pfs_in.join("listed a.bin");
    let listed_b = testbed.pfs_in.join("listed-b.bin");
    std::fs::write(&listed_a, pattern(4, 5_000)).unwrap();
    std::fs::write(&listed_b, pattern(5, 7_000)).unwrap();
    let list = testbed.pfs_in.join("stage.list");
    let list_text = format!(
        "# what the job reads\n\"{}\" 'a copy.bin'\n{} sub/b.bin\n",
        listed_a.display(),
        listed_b.display()
    );
    std::fs::write(&list, list_text).unwrap();
    let script = format!(
        "#!/bin/sh\n#SBATCH -o {work}/longstage-%j.out\n\
         #BB_LUA capacity=8MiB pool=fast\n\
         #BB_LUA stage_in source=\"{odd}\" destination=\"odd dir/in put.bin\" type=file\n\
         #BB_LUA stage_in source={list} destination=listed type=list\n\
         #BB_LUA stage_out source=out destination=\"{pfs_out}/long out\" when=success\n\
         set -e\ncmp \"$SPILLWAY_BB/odd dir/in put.bin\" \"{odd}\"\n\
         cmp \"$SPILLWAY_BB/listed/a copy.bin\" \"{a}\"\ncmp \"$SPILLWAY_BB/listed/sub/b.bin\" {b}\n\
         mkdir -p \"$SPILLWAY_BB/out\"\necho done > \"$SPILLWAY_BB/out/result.txt\"\necho STAGED-OK\n",
        work = testbed.work.display(),
        odd = odd.display(),
        list = list.display(),
        pfs_out = testbed.pfs_out.display(),
        a = listed_a.display(),
        b = listed_b.display(),
    );
    let job = testbed.submit("longstage", &script);
    let state = wait_job_end(cluster, job);
    let out = testbed.job_output("longstage", job);
    let line = job_line(cluster, job);
    assert_eq!(state, "COMPLETED", "job {job}: {out}\n{line}");
    assert!(out.contains("STAGED-OK"), "job {job} did not see its staged files: {out}");
    assert!(
        line.contains("AdminComment=spillway stage-in done (2 of 2)"),
        "job {job}: no stage-in progress on the job: {line}"
    );
    testbed.assert_cleaned_up(job, &format!("job-{job}"), false);
    let result = testbed.pfs_out.join("long out/result.txt");
    assert_eq!(std::fs::read_to_string(result).unwrap_or_default(), "done\n", "job {job}: {line}");
    passed.pass("long stage lines: quoted paths with space and colon, type=file and type=list");

    let failing = format!(
        "#!/bin/sh\n#SBATCH -o {work}/whenfail-%j.out\n\
         #BB_LUA capacity=8MiB pool=fast\n\
         #BB_LUA stage_out source=a destination={pfs_out}/when-success when=success\n\
         #BB_LUA stage_out source=b destination={pfs_out}/when-always when=always\n\
         mkdir -p \"$SPILLWAY_BB/a\" \"$SPILLWAY_BB/b\"\n\
         echo a > \"$SPILLWAY_BB/a/a.txt\"\necho b > \"$SPILLWAY_BB/b/b.txt\"\nexit 3\n",
        work = testbed.work.display(),
        pfs_out = testbed.pfs_out.display(),
    );
    let job = testbed.submit("whenfail", &failing);
    let state = wait_job_end(cluster, job);
    assert_eq!(state, "FAILED", "job {job}: {}", job_line(cluster, job));
    testbed.assert_cleaned_up(job, &format!("job-{job}"), false);
    let always = std::fs::read_to_string(testbed.pfs_out.join("when-always/b.txt"));
    assert_eq!(always.unwrap_or_default(), "b\n", "when=always not staged out: {}", cluster.log());
    assert!(
        !testbed.pfs_out.join("when-success").exists(),
        "when=success staged out for a job that exited 3"
    );
    passed.pass("stage_out when=success skipped for a failed job, when=always delivered");
}

/// A stage-out that fails (the PFS target directory is not writable by the user): the job is
/// not a clean success (its reason names the rescue reservation and the error), teardown keeps
/// the reservation as a rescue reservation listed to its owner with the error, another user
/// can neither see nor retry it, and once the cause is fixed `stage-out --retry` delivers the
/// files and releases it.
fn failed_stage_out_kept_as_rescue_then_retried(testbed: &Testbed<'_>, passed: &mut Passed) {
    let (cluster, socket) = (testbed.cluster, &testbed.manager.socket);
    let user = (testbed.uid, testbed.gid);
    let locked = testbed.pfs_out.parent().unwrap().join("locked");
    std::fs::create_dir_all(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&locked, Some(0), Some(0)).unwrap();
    let bytes = 2 * MIB + 99;
    let script = format!(
        "#!/bin/sh\n#SBATCH -o {work}/rescue-%j.out\n\
         #BB_LUA capacity=8MiB pool=fast access=striped\n\
         #BB_LUA stage_out=res/result.bin:{locked}/result.bin\n\
         set -e\nmkdir -p \"$SPILLWAY_BB/res\"\n\
         head -c {bytes} {pfs_in}/data.bin > \"$SPILLWAY_BB/res/result.bin\"\nsync \"$SPILLWAY_BB/res/result.bin\"\necho WROTE\n",
        work = testbed.work.display(),
        pfs_in = testbed.pfs_in.display(),
        locked = locked.display(),
    );
    let job = testbed.submit("rescue", &script);
    let name = format!("job-{job}");
    let state = wait_job_end(cluster, job);
    let out = testbed.job_output("rescue", job);
    assert!(out.contains("WROTE"), "job {job} did not write its output: {out}");
    // Teardown ran (record gone, mount gone) and kept the reservation.
    testbed.assert_cleaned_up(job, &name, true);
    let fields = job_fields(cluster, job);
    let said = format!(
        "{} {} {}",
        fields.get("Reason").cloned().unwrap_or_default(),
        fields.get("SystemComment").cloned().unwrap_or_default(),
        fields.get("Comment").cloned().unwrap_or_default()
    );
    println!("job {job} with a failed stage-out ended {state}: {said}");
    // `scontrol show job -o` splits values at spaces: look for words, not whole sentences.
    assert!(
        said.contains("rescue") && said.contains(&name),
        "job {job} ({state}) does not name its rescue reservation {name}: {fields:?}"
    );
    passed.pass("failed stage-out: the job's reason names the rescue reservation");

    assert_rescue_listed_and_guarded(testbed, job, &locked);
    passed.pass("rescue reservation listed to its owner with the error, invisible to others");

    // The cause fixed, the owner's retry delivers the output and releases the reservation.
    std::os::unix::fs::chown(&locked, Some(testbed.uid), Some(testbed.gid)).unwrap();
    let retry = spillway_as(socket, user, &["stage-out", "--retry", &name, "--progress", "none"]);
    assert!(
        retry.status.success(),
        "retry failed: {}{}",
        String::from_utf8_lossy(&retry.stdout),
        String::from_utf8_lossy(&retry.stderr)
    );
    let staged = std::fs::read(locked.join("result.bin")).expect("retry delivered nothing");
    let input = std::fs::read(testbed.pfs_in.join("data.bin")).unwrap();
    assert!(staged == input[..bytes as usize], "retried stage-out bytes differ");
    assert!(!reservation_exists(socket, &name), "the rescue reservation was not released");
    passed.pass("stage-out --retry delivers the files and releases the rescue reservation");
}

/// Job `job`'s kept reservation is a rescue listed to its owner with the error, invisible to
/// another user, who cannot retry it, and teardown's destroy is refused.
fn assert_rescue_listed_and_guarded(testbed: &Testbed<'_>, job: u64, locked: &Path) {
    let socket = &testbed.manager.socket;
    let user = (testbed.uid, testbed.gid);
    let name = format!("job-{job}");
    let shown: serde_json::Value =
        serde_json::from_str(spillway_ok(socket, &["reservation", "show", &name, "--json"]).trim())
            .unwrap();
    let error = shown["rescue"]["error"].as_str().unwrap_or_default().to_string();
    assert!(
        error.contains("stage-out failed") && error.contains("ermission denied"),
        "rescue error: {shown}"
    );
    let listed = spillway_as(socket, user, &["reservation", "list"]);
    let listed_text = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{listed:?}");
    assert!(
        listed_text.contains(&format!("rescue {name}: stage-out failed"))
            && listed_text.contains("ermission denied"),
        "the owner's list does not show the rescue and its error: {listed_text}"
    );
    let status = spillway_as(socket, user, &["status"]);
    assert!(
        String::from_utf8_lossy(&status.stdout).contains(&format!("rescue {name}")),
        "the owner's status does not show the rescue: {status:?}"
    );
    // Another user neither sees nor finishes it; root's teardown-style destroy is refused.
    let other = other_user_ids();
    let other_list = spillway_as(socket, other, &["reservation", "list"]);
    assert!(
        !String::from_utf8_lossy(&other_list.stdout).contains(&name),
        "another user sees the rescue reservation: {other_list:?}"
    );
    assert_refused(
        &spillway_as(socket, other, &["stage-out", "--retry", &name, "--progress", "none"]),
        "no reservation",
        "another user's retry",
    );
    assert_refused(
        &spillway(socket, &["reservation", "destroy", &name, "--job", &job.to_string()]),
        "rescue reservation",
        "a teardown destroy of the rescue reservation",
    );
    // Root sees it but does not copy the owner's files as root.
    assert_refused(
        &spillway(socket, &["stage-out", "--retry", &name, "--progress", "none"]),
        "only its owner may retry",
        "root's retry",
    );
    assert!(!locked.join("result.bin").exists(), "nothing may be published by the refusals");
}

/// A persistent reservation shared by two consecutive jobs.
fn persistent_reservation_shared_by_two_jobs(testbed: &Testbed<'_>, passed: &mut Passed) {
    let cluster = testbed.cluster;
    let writer = format!(
        "#!/bin/sh\n#SBATCH -o {work}/pw-%j.out\n\
         #BB_LUA create_persistent name=shared1 capacity=16M pool=fast\n\
         set -e\necho persisted-by-first-job > \"$SPILLWAY_BB/note.txt\"\nsync \"$SPILLWAY_BB/note.txt\"\necho WROTE\n",
        work = testbed.work.display()
    );
    let first = testbed.submit("persistent-writer", &writer);
    assert_eq!(wait_job_end(cluster, first), "COMPLETED", "{:?}", job_fields(cluster, first));
    testbed.assert_cleaned_up(first, "shared1", true);

    // create_persistent of a name that exists: the job is held with the fix named, and the
    // reservation is left alone.
    let again = testbed.submit("persistent-again", &writer);
    let mut reason = String::new();
    wait_for(&format!("job {again} held: shared1 exists"), cluster, || {
        reason = job_line(cluster, again);
        reason.contains("already_exists") || reason.contains("already exists")
    });
    assert!(reason.contains("persistent=shared1"), "job {again}: {reason}");
    testbed.cancel(again);
    wait_job_end(cluster, again);
    testbed.assert_cleaned_up(again, "shared1", true);
    passed.pass("create_persistent of an existing name held with the fix named");

    // The last job of the campaign has its own reservation and uses shared1 beside it, at
    // $SPILLWAY_BB_SHARED1, then destroys it.
    let reader = format!(
        "#!/bin/sh\n#SBATCH -o {work}/pr-%j.out\n#BB_LUA capacity=8M pool=fast\n\
         #BB_LUA use_persistent name=shared1\n#BB_LUA destroy_persistent name=shared1\n\
         set -e\ncat \"$SPILLWAY_BB_SHARED1/note.txt\"\necho own > \"$SPILLWAY_BB/own.txt\"\n\
         echo \"own=$(cat \"$SPILLWAY_BB/own.txt\") at $SPILLWAY_BB beside $SPILLWAY_BB_SHARED1\"\n\
         ls \"$SPILLWAY_BB_SHARED1\"\n",
        work = testbed.work.display()
    );
    let second = testbed.submit("persistent-reader", &reader);
    assert_eq!(wait_job_end(cluster, second), "COMPLETED", "{:?}", job_fields(cluster, second));
    let out = testbed.job_output("pr", second);
    assert!(
        out.contains("persisted-by-first-job"),
        "second job did not see the first job's file: {out}"
    );
    let mounts = cluster.dir.join("mnt");
    let expected = format!(
        "own=own at {own} beside {beside}",
        own = mounts.join(format!("job-{second}")).display(),
        beside = mounts.join(format!("job-{second}.shared1")).display()
    );
    assert!(out.contains(&expected), "expected {expected:?} in the job's output: {out}");
    assert!(!out.contains("own.txt"), "the job's own file is in shared1: {out}");
    // Its teardown destroyed its own reservation and shared1 (destroy_persistent, as the job's
    // user, after unregistering the job from it).
    testbed.assert_cleaned_up(second, &format!("job-{second}"), false);
    assert!(!reservation_exists(&testbed.manager.socket, "shared1"), "shared1 not destroyed");
    passed.pass("persistent reservation created by one job, used beside its own reservation by the next and destroyed");
}

/// Cancelled during stage-in. The stage copies a tree of many files; as soon as its
/// `spillway stage-in` process appears it is frozen (SIGSTOP), so the cancel always lands
/// while the copy is in flight, however fast the machine.
fn cancelled_during_stage_in(testbed: &Testbed<'_>, passed: &mut Passed) {
    let (cluster, uid, gid) = (testbed.cluster, testbed.uid, testbed.gid);
    let many = testbed.pfs_in.join("many");
    std::fs::create_dir_all(&many).unwrap();
    for i in 0..STUCK_FILES {
        let file = many.join(format!("part-{i:03}"));
        std::fs::write(&file, pattern(100 + i as u64, MIB as usize)).unwrap();
        std::os::unix::fs::chown(&file, Some(uid), Some(gid)).unwrap();
    }
    std::os::unix::fs::chown(&many, Some(uid), Some(gid)).unwrap();
    let stuck = format!(
        "#!/bin/sh\n#SBATCH -o {work}/stuck-%j.out\n#BB_LUA capacity=96M pool=fast stage_in={many}:many\ntrue\n",
        work = testbed.work.display(),
        many = many.display()
    );
    let job = testbed.submit("stuck", &stuck);
    let reservation = format!("job-{job}");
    let mountpoint = cluster.dir.join(format!("mnt/job-{job}"));
    let deadline = Instant::now() + WAIT_MAX;
    let frozen = loop {
        let stage = leftover_pids(&mountpoint, &reservation, "stage-in");
        if let Some(&pid) = stage.first() {
            spillway_sys::signal::send(pid, spillway_sys::signal::Signal::SIGSTOP).unwrap();
            break pid;
        }
        let state = job_state(cluster, job);
        assert!(
            state == "PENDING" || state.is_empty(),
            "job {job} reached {state} before its stage-in process was seen: raise STUCK_FILES"
        );
        assert!(Instant::now() < deadline, "job {job}: no stage-in process within {WAIT_MAX:?}");
        std::thread::sleep(Duration::from_millis(10));
    };
    println!("stage-in of job {job} frozen mid-copy (pid {frozen}); cancelling");
    testbed.cancel(job);
    wait_job_end(cluster, job);
    testbed.assert_cleaned_up(job, &reservation, false);
    passed.pass("job cancelled during stage-in cleaned up");
}

/// A stage-in that fails (missing source) holds the job with the error as its reason and
/// releases the reservation at once (Flags=TeardownFailure); cancelling it leaves nothing.
fn failed_stage_in_holds_job_and_releases_reservation(testbed: &Testbed<'_>, passed: &mut Passed) {
    let cluster = testbed.cluster;
    let missing = format!(
        "#!/bin/sh\n#SBATCH -o {work}/missing-%j.out\n#BB_LUA capacity=8M pool=fast stage_in={pfs_in}/missing.bin:x\ntrue\n",
        work = testbed.work.display(),
        pfs_in = testbed.pfs_in.display()
    );
    let job = testbed.submit("missing", &missing);
    let reservation = format!("job-{job}");
    let mut reason = String::new();
    wait_for(&format!("job {job} held for its failed stage-in"), cluster, || {
        reason = job_fields(cluster, job).get("Reason").cloned().unwrap_or_default();
        reason.contains("missing.bin")
    });
    assert_eq!(job_state(cluster, job), "PENDING", "reason {reason}");
    wait_for(&format!("job {job}'s reservation released"), cluster, || {
        !reservation_exists(&testbed.manager.socket, &reservation)
    });
    passed.pass("failed stage-in holds the job with the error and releases the reservation");

    // The cause goes away: the pools refresh sees the source, as the user, and releases the job,
    // whose stage-in now succeeds.
    std::fs::write(testbed.pfs_in.join("missing.bin"), b"here now\n").unwrap();
    let state = wait_job_end(cluster, job);
    let line = job_line(cluster, job);
    assert_eq!(state, "COMPLETED", "job {job} not released once its source was there: {line}");
    // Nothing else releases a held job here; its second stage-in ran to the end.
    assert!(line.contains("AdminComment=spillway stage-in done (1 of 1)"), "job {job}: {line}");
    testbed.assert_cleaned_up(job, &reservation, false);
    passed.pass("held job released and run once its stage-in source is there");
}

/// `#BB_LUA bandwidth=` as the (unprivileged) test user. The pool's servers are measured
/// (`spillway server measure`); a job asks 1.5× the slower server's bandwidth peak, so the plan
/// stripes it over both servers, promising 0.75× on each. A second job asking the same while the
/// first runs cannot be met beside those promises: its setup fails, Slurm holds it with the
/// manager's reason, and the pools refresh releases it once the first job's teardown released
/// its promises (a dry run of its request succeeds); it then runs. The first job's record shows
/// its targets and what its servers counted of its writes. A target beyond the pool's peaks is
/// held with the reason and never released.
struct TargetJobs {
    first: u64,
    second: u64,
    /// The first job's reservation while it ran.
    reservation: serde_json::Value,
}

impl TargetJobs {
    /// Up to the second job held, and the first told to end.
    fn start(testbed: &Testbed<'_>, passed: &mut Passed) -> TargetJobs {
        let (cluster, socket) = (testbed.cluster, &testbed.manager.socket);
        let target = format!("{}MiB/s", TargetJobs::measured_target(socket) / MIB);
        let first = testbed.submit("target1", &TargetJobs::script(testbed, "target1", &target));
        wait_for(&format!("job {first} running"), cluster, || {
            job_state(cluster, first) == "RUNNING"
        });
        let reservation = reservation_json(testbed.manager, &format!("job-{first}"));
        assert_eq!(reservation["servers"].as_array().unwrap().len(), 2, "{reservation}");
        let asked = reservation["targets"]["asked"]["bandwidth_bytes_per_s"].as_u64().unwrap();
        assert_eq!(format!("{}MiB/s", asked / MIB), target, "{reservation}");
        let second = testbed.submit("target2", &TargetJobs::script(testbed, "target2", &target));
        let mut reason = String::new();
        wait_for(&format!("job {second} held for its targets"), cluster, || {
            reason = job_fields(cluster, second).get("Reason").cloned().unwrap_or_default();
            reason.contains("performance_targets")
        });
        assert!(reason.contains("not_now:_bandwidth"), "{reason}");
        assert_eq!(job_state(cluster, second), "PENDING", "{reason}");
        assert!(!reservation_exists(socket, &format!("job-{second}")));
        passed.pass("a job whose bandwidth= cannot be met beside another's promises waits, held with the reason");
        std::fs::write(testbed.work.join("targets-go"), b"").unwrap();
        TargetJobs { first, second, reservation }
    }

    /// Measures the pool's two servers and returns a bandwidth target between the faster
    /// one's peak and twice the slower one's: only both together meet it. Quick measurements
    /// on a loaded machine can differ by more than 2×: measured again then, at most 3 times.
    fn measured_target(socket: &Path) -> u64 {
        let quick = ["--threads-max", "1", "--phase-seconds", "0.3", "--file-mib-per-thread", "8"];
        let measure = [&["server", "measure", "--pool", "fast", "--json"][..], &quick].concat();
        let mut peaks = Vec::new();
        for _ in 0..3 {
            let measured: serde_json::Value =
                serde_json::from_str(spillway_ok(socket, &measure).trim()).unwrap();
            peaks = measured
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["peaks"]["bandwidth_bytes_per_s"].as_u64().unwrap())
                .collect();
            let (slowest, fastest) = (*peaks.iter().min().unwrap(), *peaks.iter().max().unwrap());
            // Whole MiB/s, strictly between.
            let target = (fastest + 2 * slowest) / 2 / MIB * MIB;
            if target > fastest && target <= 2 * slowest {
                return target;
            }
        }
        panic!(
            "the two servers' bandwidth peaks differ by more than 2× in 3 measurements: {peaks:?}"
        )
    }

    /// A job asking `bandwidth`: it writes a checkpoint through its mount, then waits (at most
    /// 120 s) for the test to say go.
    fn script(testbed: &Testbed<'_>, name: &str, bandwidth: &str) -> String {
        format!(
            "#!/bin/sh\n#SBATCH -o {work}/{name}-%j.out\n#BB_LUA bandwidth={bandwidth}\n\
             set -e\nhead -c {bytes} /dev/zero > \"$SPILLWAY_BB/ckpt\"\nsync \"$SPILLWAY_BB/ckpt\"\n\
             i=0; while [ ! -e {work}/targets-go ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done\n\
             echo WROTE\n",
            work = testbed.work.display(),
            bytes = 4 * MIB,
        )
    }

    /// The second job released and run; the first's record; a target that can never be met.
    fn finish(self, testbed: &Testbed<'_>, passed: &mut Passed) {
        let TargetJobs { first, second, reservation } = self;
        let cluster = testbed.cluster;
        let first_state = wait_job_end(cluster, first);
        assert_eq!(first_state, "COMPLETED", "{}", testbed.job_output("target1", first));
        let second_state = wait_job_end(cluster, second);
        let line = job_line(cluster, second);
        assert_eq!(
            second_state, "COMPLETED",
            "job {second} not released once its targets fit: {line}"
        );
        assert!(line.contains("its performance targets fit now; released"), "{line}");
        assert!(testbed.job_output("target2", second).contains("WROTE"));
        testbed.assert_cleaned_up(second, &format!("job-{second}"), false);
        let ended = reservation_json(testbed.manager, &reservation["id"].to_string());
        let written = ended["achieved"]["bytes_written"].as_u64().unwrap_or(0);
        assert!(written >= 4 * MIB, "achieved not recorded at teardown: {ended}");
        assert_eq!(ended["targets"]["asked"], reservation["targets"]["asked"], "{ended}");
        passed.pass("the waiting job is released and runs once the first job's promises end; achieved recorded");

        let never = testbed.submit("target3", &TargetJobs::script(testbed, "target3", "100TiB/s"));
        let mut reason = String::new();
        wait_for(&format!("job {never} held, its targets unmeetable"), cluster, || {
            reason = job_fields(cluster, never).get("Reason").cloned().unwrap_or_default();
            reason.contains("targets_cannot_be_met")
        });
        assert!(reason.contains("never"), "{reason}");
        testbed.cancel(never);
        wait_job_end(cluster, never);
        passed.pass("a bandwidth= beyond the pool's measured peaks is held naming the limit");
    }
}

/// Cancelled while running with its reservation mounted.
fn cancelled_while_running(testbed: &Testbed<'_>, passed: &mut Passed) {
    let cluster = testbed.cluster;
    let long = format!(
        "#!/bin/sh\n#SBATCH -o {work}/long-%j.out\n#BB_LUA capacity=8M pool=fast\n\
         echo started > \"$SPILLWAY_BB/started\"\nsleep 300\n",
        work = testbed.work.display()
    );
    let job = testbed.submit("long", &long);
    let mountpoint = cluster.dir.join(format!("mnt/job-{job}"));
    wait_for(&format!("job {job} running with its mount"), cluster, || {
        job_state(cluster, job) == "RUNNING"
            && cluster.is_mounted(&mountpoint)
            && cluster.seen_by_jobs(&mountpoint.join("started")).exists()
    });
    testbed.cancel(job);
    assert_eq!(wait_job_end(cluster, job), "CANCELLED");
    testbed.assert_cleaned_up(job, &format!("job-{job}"), false);
    passed.pass("job cancelled while running cleaned up");
}

/// Jobs whose teardown only Slurm's periodic pools refresh can do (`ghost_job`): made early,
/// checked by scenarios 7 and 8 at the end.
struct Ghosts {
    /// Scenario 7: teardown never ran.
    lost: (u64, String),
    /// Scenario 8: its stage-out never finished (reservation name, job record).
    unfinished: (u64, String, std::path::PathBuf),
}

impl Ghosts {
    fn make(testbed: &Testbed<'_>) -> Ghosts {
        let lost = 4_000_000u64;
        let (lost_reservation, _) = ghost_job(testbed, lost, serde_json::json!({}));
        let unfinished = 4_000_001u64;
        let (name, path) = ghost_job(
            testbed,
            unfinished,
            serde_json::json!({
                "stage_out_unfinished": "the job ran but its stage-out did not finish (post_run or data_out failed, timed out or was killed)",
            }),
        );
        Ghosts { lost: (lost, lost_reservation), unfinished: (unfinished, name, path) }
    }

    /// A job whose teardown never ran. Slurm 22.05 may kill the teardown it queued for a
    /// cancel before the hook detaches (scenario 5 then fails now and then); nothing retries
    /// it. Here the lost teardown is made certain: a job record and reservation for a job Slurm
    /// never had. The periodic pools refresh must tear them down.
    fn lost_teardown_done_by_pools_refresh(&self, testbed: &Testbed<'_>, passed: &mut Passed) {
        let (ghost, reservation) = &self.lost;
        testbed.assert_cleaned_up(*ghost, reservation, false);
        passed.pass("job whose teardown was lost torn down by the pools refresh");
    }

    /// A job that ran with a `stage_out=` line but whose stage-out never finished (Slurm
    /// killed data_out on its timeout, or on a cancel, before it could tell the manager): its
    /// record still says so. Made certain as in scenario 7: the teardown the pools refresh
    /// runs keeps the reservation as a rescue reservation instead of destroying it.
    fn unfinished_stage_out_kept_by_teardown(&self, testbed: &Testbed<'_>, passed: &mut Passed) {
        let (uid, gid) = (testbed.uid, testbed.gid);
        let socket = &testbed.manager.socket;
        let (ghost, name, path) = &self.unfinished;
        wait_for(&format!("teardown of job {ghost}"), testbed.cluster, || !path.exists());
        let shown = spillway_ok(socket, &["reservation", "show", name, "--json"]);
        let shown: serde_json::Value = serde_json::from_str(shown.trim()).unwrap();
        assert!(
            shown["rescue"]["error"].as_str().unwrap_or_default().contains("did not finish"),
            "teardown did not keep {name} as a rescue: {shown}"
        );
        // Its owner gives it up explicitly (nothing else may before the expiry).
        let destroyed = spillway_as(socket, (uid, gid), &["reservation", "destroy", name]);
        assert!(destroyed.status.success(), "{destroyed:?}");
        passed.pass("unfinished stage-out: teardown keeps the reservation as a rescue");
    }
}

/// A reservation for job `ghost` (which Slurm never had) owned by the test user, and the job
/// record the hooks would have left for it, with `extra` fields; returns the reservation's name
/// and the path of the record.
fn ghost_job(
    testbed: &Testbed<'_>,
    ghost: u64,
    extra: serde_json::Value,
) -> (String, std::path::PathBuf) {
    let (uid, gid) = (testbed.uid, testbed.gid);
    let name = format!("job-{ghost}");
    let (ghost_id, uid_text, gid_text) = (ghost.to_string(), uid.to_string(), gid.to_string());
    let created = spillway_ok(
        &testbed.manager.socket,
        &[
            "reservation",
            "create",
            "--capacity",
            "8M",
            "--pool",
            "fast",
            "--job",
            &ghost_id,
            "--owner",
            &uid_text,
            "--group",
            &gid_text,
            "--json",
        ],
    );
    let id =
        serde_json::from_str::<serde_json::Value>(created.trim()).unwrap()["id"].as_u64().unwrap();
    let mut record = serde_json::json!({
        "job": ghost, "uid": uid, "gid": gid, "reservation": name, "persistent": false,
        "reservation_id": id,
    });
    for (key, value) in extra.as_object().expect("extra record fields are an object") {
        record[key] = value.clone();
    }
    let path = testbed.cluster.dir.join(format!("bb-state/job-{ghost}.json"));
    std::fs::write(&path, record.to_string()).unwrap();
    (name, path)
}
