//! Multi-node Slurm on the namespace cluster: four hosts (scripts/cluster/up.sh), the manager on
//! host1 (TCP with munge), three servers on host2..host4 (munge), slurmctld on host1 and a slurmd
//! on every host (scripts/slurm/start-cluster.sh), with Spillway's burst_buffer/lua hooks and its
//! per-node Prolog/Epilog.
//!
//! The unprivileged test user submits a 4-node job with a striped reservation, a stage-in and a
//! stage-out. Every node of the job has the reservation mounted at the same `$SPILLWAY_BB` before
//! the job starts (the prolog); an OpenMPI program (examples/mpi/checkpoint.c, compiled here with
//! Debian's `mpicc`, one rank per node) reads the staged-in input on every rank, writes an N-1
//! and an N-N checkpoint through the four mounts, and rank 0 reads the N-1 file back. After the
//! job every byte staged out to the PFS is checked against the pattern computed here, every host
//! is free of the mount and its process, and the reservation is destroyed. A second job on two
//! nodes with `access=private` shows that each node sees only its own namespace.
//!
//! Both Slurm releases: Debian 12's 22.05 on the machine, and Debian 13's 24.11 chrooted into the
//! root scripts/slurm/debian13-root.sh builds (start-cluster.sh's SPILLWAY_SLURM_ROOT), one after
//! the other. The root has no OpenMPI, so under 24.11 the 4-node job writes its N-1 and N-N
//! checkpoints with `srun` and `dd` through the same four mounts instead of the MPI program.
//!
//! Needs root, Slurm, munge, FUSE and OpenMPI (scripts/install-deps.sh); it FAILS with a message
//! naming what is missing rather than skipping.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use spillway_harness::{Cluster, Host, ManagerProcess, ServerProcess, SlurmRelease};

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const USER: &str = "spillway-test";
const MIB: u64 = 1 << 20;
/// The manager's TCP port on host1 (every host has its own addresses).
const MANAGER_PORT: u16 = 7100;
/// Each server's TCP port on its host.
const SERVER_PORT: u16 = 7070;
/// Bound on one job's run from submission to its end; generous for 2 shared cores.
const JOB_WAIT_MAX: Duration = Duration::from_secs(150);
/// Bound on a teardown after the job ended.
const TEARDOWN_WAIT_MAX: Duration = Duration::from_secs(60);
/// Each rank's block of the N-1 checkpoint, and the size of each N-N file.
const BLOCK_BYTES: u64 = 2 * MIB;
/// The staged-in input every rank reads.
const INPUT_BYTES: u64 = 3 * MIB + 4321;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn require_environment() {
    assert_eq!(
        spillway_sys::user::euid(),
        0,
        "the multi-node Slurm test must run as root (namespaces, slurmctld/slurmd, FUSE mounts); \
         run `make test` as root on CI"
    );
    let tools = [
        ("slurmctld", "slurm-wlm"),
        ("slurmd", "slurm-wlm"),
        ("sbatch", "slurm-wlm"),
        ("scontrol", "slurm-wlm"),
        ("munged", "munge"),
        ("mpicc", "libopenmpi-dev"),
        ("mpirun", "openmpi-bin"),
        ("fusermount3", "fuse3"),
        ("nsenter", "util-linux"),
        ("ip", "iproute2"),
    ];
    for (tool, package) in tools {
        let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
            .any(|dir| dir.join(tool).exists());
        assert!(
            found,
            "`{tool}` not found: install the Debian package {package} (scripts/install-deps.sh)"
        );
    }
}

/// The byte at `offset` of the staged-in input (the program checks the same function).
fn input_byte(offset: u64) -> u8 {
    ((offset * 13 + 5 + (offset >> 10)) & 0xff) as u8
}

/// The byte at `offset` of the N-1 checkpoint (computed here independently of the program).
fn n1_byte(offset: u64) -> u8 {
    (((offset * 7) ^ (offset >> 11) ^ 0x5a) & 0xff) as u8
}

/// The byte at `offset` of rank `rank`'s N-N checkpoint.
fn nn_byte(rank: u64, offset: u64) -> u8 {
    ((offset * 11 + rank * 29 + (offset >> 9)) & 0xff) as u8
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

/// `spillway ARGS` as root against the manager's Unix socket (shared by the hosts' files).
fn spillway_ok(manager: &ManagerProcess, args: &[&str]) -> String {
    let output = Command::new(BIN)
        .args(args)
        .env("SPILLWAY_MANAGER", &manager.socket)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "spillway {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn reservation_exists(manager: &ManagerProcess, name: &str) -> bool {
    Command::new(BIN)
        .args(["reservation", "show", name, "--json"])
        .env("SPILLWAY_MANAGER", &manager.socket)
        .stdin(Stdio::null())
        .output()
        .unwrap()
        .status
        .success()
}

/// Slurm on the cluster (scripts/slurm/start-cluster.sh); stopped when dropped.
struct Slurm {
    cluster_dir: PathBuf,
    dir: PathBuf,
    conf: PathBuf,
    controller: Host,
    subnet: String,
    /// The Debian root Slurm runs in (its clients through the wrappers in `dir/bin`).
    root: Option<PathBuf>,
}

impl Slurm {
    fn start(cluster: &Cluster, manager_tcp: &str, root: Option<&Path>) -> Slurm {
        let script = repo_root().join("scripts/slurm/start-cluster.sh");
        let mut command = Command::new(&script);
        command.arg(cluster.dir()).arg(BIN).env("SPILLWAY_MANAGER", manager_tcp);
        if let Some(root) = root {
            command.env("SPILLWAY_SLURM_ROOT", root);
        }
        let output = command.stdin(Stdio::null()).output().unwrap();
        let slurm = Slurm {
            cluster_dir: cluster.dir().to_path_buf(),
            dir: cluster.dir().join("slurm"),
            conf: cluster.dir().join("slurm/etc/slurm.conf"),
            controller: cluster.host(0).clone(),
            subnet: cluster_env_value(cluster.dir(), "CLUSTER_SUBNET"),
            root: root.map(Path::to_path_buf),
        };
        assert!(
            output.status.success(),
            "{} failed: {}{}",
            script.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        slurm
    }

    /// Slurm's `program` on the controller's host with this cluster's SLURM_CONF (the root's,
    /// through its wrapper, when Slurm runs in one).
    fn command(&self, program: &str) -> Command {
        let program = match self.root {
            Some(_) => self.dir.join("bin").join(program).to_string_lossy().into_owned(),
            None => program.to_string(),
        };
        let mut command = self.controller.command(&program);
        command.env("SLURM_CONF", &self.conf).stdin(Stdio::null());
        command
    }

    /// Slurm's `program` on the controller's host as the test user (its groups too; in a root,
    /// its wrapper switches user inside: entering the root takes root).
    fn command_as_user(&self, program: &str) -> Command {
        let (uid, gid) = ids_of(USER);
        if self.root.is_some() {
            let mut command = self.command(program);
            command.env("SPILLWAY_SLURM_AS", format!("{uid}:{gid}"));
            return command;
        }
        let mut command = self.command("setpriv");
        command
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg("--init-groups")
            .arg(program);
        command
    }

    /// Where a host (outside Slurm's root) sees `path` as Slurm's daemons and jobs see it.
    fn host_path(&self, path: &Path) -> PathBuf {
        match &self.root {
            Some(root) => root.join(path.strip_prefix("/").unwrap_or(path)),
            None => path.to_path_buf(),
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("log/slurmctld.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// `scontrol show job -o ID` as key=value pairs.
    fn job_fields(&self, job: u64) -> std::collections::HashMap<String, String> {
        let output =
            self.command("scontrol").args(["-o", "show", "job", &job.to_string()]).output();
        String::from_utf8_lossy(&output.unwrap().stdout)
            .split_whitespace()
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect()
    }

    /// Submits `script` (written to `work/<name>.sh`) as the test user; the job id.
    fn submit(&self, work: &Path, name: &str, script: &str) -> u64 {
        let (uid, gid) = ids_of(USER);
        let path = work.join(format!("{name}.sh"));
        std::fs::write(&path, script).unwrap();
        std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
        let output = self
            .command_as_user("sbatch")
            .arg("--parsable")
            .arg(&path)
            .current_dir(work)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "sbatch {name}: {}",
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

    /// Waits (bounded) until the job ended; its final state.
    fn wait_job_end(&self, job: u64) -> String {
        let deadline = Instant::now() + JOB_WAIT_MAX;
        loop {
            let state = self.job_fields(job).get("JobState").cloned().unwrap_or_default();
            let ended = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL"];
            if ended.contains(&state.as_str()) {
                return state;
            }
            assert!(
                Instant::now() < deadline,
                "job {job} not ended after {JOB_WAIT_MAX:?} (state {state:?}); {:?}\nslurmctld log tail:\n{}",
                self.job_fields(job),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("scripts/slurm/stop-cluster.sh"))
            .arg(&self.cluster_dir)
            .stdin(Stdio::null())
            .output();
    }
}

/// A value of the cluster's cluster.env.
fn cluster_env_value(dir: &Path, key: &str) -> String {
    let text = std::fs::read_to_string(dir.join("cluster.env")).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
        .map(|v| v.trim_matches('\'').to_string())
        .unwrap_or_else(|| panic!("no {key} in cluster.env"))
}

/// The manager on host1, three servers on host2..host4 in pool `fast`, draining to `pfs`.
fn start_spillway(cluster: &Cluster, pfs: &Path) -> (ManagerProcess, Vec<ServerProcess>) {
    let dir = cluster.dir();
    let fragment_bytes = (8 * MIB).to_string();
    let manager = ManagerProcess::start_in_host(
        cluster.host(0),
        MANAGER_PORT,
        Path::new(BIN),
        &dir.join("manager"),
        &[
            ("SPILLWAY_MANAGER_FRAGMENT_BYTES", &fragment_bytes),
            ("SPILLWAY_MANAGER_HEARTBEAT_MS", "500"),
        ],
    );
    let servers: Vec<ServerProcess> = (1..4)
        .map(|i| {
            ServerProcess::builder(BIN, dir, &format!("bb{i}"))
                .in_host(cluster.host(i))
                .listen(&cluster.host(i).socket_address(SERVER_PORT).to_string())
                .pfs_dir(pfs)
                .start()
        })
        .collect();
    spillway_ok(&manager, &["pool", "create", "fast", "--granularity", &MIB.to_string()]);
    for server in &servers {
        let pfs_text = pfs.to_string_lossy().into_owned();
        let address = server.endpoint().to_string();
        let capacity = (256 * MIB).to_string();
        spillway_ok(
            &manager,
            &[
                "server",
                "add",
                &address,
                "--pool",
                "fast",
                "--capacity",
                &capacity,
                "--pfs",
                &pfs_text,
            ],
        );
    }
    (manager, servers)
}

/// Compiles the MPI program with Debian's mpicc into `dir`; its path.
fn compile_checkpoint_program(dir: &Path) -> PathBuf {
    let program = dir.join("checkpoint");
    let source = repo_root().join("examples/mpi/checkpoint.c");
    let output = Command::new("mpicc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&program)
        .arg(&source)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "mpicc {}: {}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    program
}

/// A directory the test user owns, readable by everyone.
fn user_dir(path: &Path) -> PathBuf {
    let (uid, gid) = ids_of(USER);
    std::fs::create_dir_all(path).unwrap();
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_path_buf()
}

/// One release at a time: two 4-host clusters on two shared cores would make every wait a race.
static ONE_RELEASE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn four_node_jobs_on_slurm_22_05() {
    let _one = ONE_RELEASE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    four_node_jobs(SlurmRelease::Host2205);
}

#[test]
fn four_node_jobs_on_slurm_24_11() {
    let _one = ONE_RELEASE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    four_node_jobs(SlurmRelease::Debian13);
}

fn four_node_jobs(release: SlurmRelease) {
    require_environment();
    let root = release.root();
    let started = Instant::now();
    let cluster = Cluster::started(4);
    let dir = cluster.dir().to_path_buf();
    let pfs = dir.join("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    std::fs::set_permissions(&pfs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (manager, servers) = start_spillway(&cluster, &pfs);
    let manager_tcp = manager.tcp_address().expect("the manager listens on TCP").to_string();
    let slurm = Slurm::start(&cluster, &manager_tcp, root.as_deref());
    let version = slurm.command("scontrol").arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    assert!(version.starts_with(release.version_prefix()), "scontrol --version: {version:?}");
    // The MPI program runs where the machine's OpenMPI is (22.05); in the root, srun and dd.
    let program = root.is_none().then(|| compile_checkpoint_program(&dir));
    let work = user_dir(&dir.join("work"));
    let pfs_in = user_dir(&pfs.join("in"));
    let pfs_out = user_dir(&pfs.join("out"));
    println!("cluster, manager, servers and Slurm up in {:.1} s", started.elapsed().as_secs_f64());

    striped_checkpoint_job(
        &slurm,
        &cluster,
        &manager,
        &Paths { work: &work, pfs_in: &pfs_in, pfs_out: &pfs_out, program: program.as_deref() },
    );
    println!(
        "{}: 4-node striped job verified at {:.1} s",
        version.trim(),
        started.elapsed().as_secs_f64()
    );
    let paths =
        Paths { work: &work, pfs_in: &pfs_in, pfs_out: &pfs_out, program: program.as_deref() };
    private_namespaces_job(&slurm, &cluster, &manager, &paths);
    println!("2-node private job verified at {:.1} s", started.elapsed().as_secs_f64());
    failed_prolog_mount_holds_the_job(&slurm, &cluster, &manager, &work);
    println!("failed prolog mount verified at {:.1} s", started.elapsed().as_secs_f64());

    drop(slurm);
    drop(servers);
    drop(manager);
    cluster.down().expect("cluster down leaves nothing behind");
}

/// Where the striped job's files are.
struct Paths<'a> {
    work: &'a Path,
    pfs_in: &'a Path,
    pfs_out: &'a Path,
    /// The MPI checkpoint program; `None`: the job writes its checkpoints with srun and dd.
    program: Option<&'a Path>,
}

/// The 4-node job: stage-in, N-1 and N-N checkpoints through the mounts, stage-out.
fn striped_checkpoint_job(
    slurm: &Slurm,
    cluster: &Cluster,
    manager: &ManagerProcess,
    paths: &Paths<'_>,
) {
    let (uid, gid) = ids_of(USER);
    let input: Vec<u8> = (0..INPUT_BYTES).map(input_byte).collect();
    let input_path = paths.pfs_in.join("input.bin");
    std::fs::write(&input_path, &input).unwrap();
    std::os::unix::fs::chown(&input_path, Some(uid), Some(gid)).unwrap();
    let header = format!(
        "#!/bin/sh\n#SBATCH -N 4\n#SBATCH --ntasks-per-node=1\n#SBATCH -t 5\n#SBATCH -o {work}/ckpt-%j.out\n\
         #BB_LUA capacity=64MiB pool=fast access=striped\n\
         #BB_LUA stage_in={pfs_in}:input\n\
         #BB_LUA stage_out=ckpt:{pfs_out}/ckpt\n\
         set -e\necho \"bb=$SPILLWAY_BB\"\n\
         srun sh -c 'echo \"mounted on $(hostname): $(grep -c \" $SPILLWAY_BB \" /proc/self/mountinfo)\"'\n",
        work = paths.work.display(),
        pfs_in = paths.pfs_in.display(),
        pfs_out = paths.pfs_out.display(),
    );
    let body = match paths.program {
        Some(program) => format!(
            "mpirun --mca btl tcp,self --mca btl_tcp_if_include {subnet} --mca oob_tcp_if_include {subnet} \
             --map-by ppr:1:node {program} \"$SPILLWAY_BB/input/input.bin\" {input_bytes} \"$SPILLWAY_BB/ckpt\" {block}\n",
            subnet = slurm.subnet,
            program = program.display(),
            input_bytes = INPUT_BYTES,
            block = BLOCK_BYTES,
        ),
        None => dd_checkpoints(paths.work, &input_path),
    };
    let script = header + &body;
    let job = slurm.submit(paths.work, "ckpt", &script);
    let state = slurm.wait_job_end(job);
    let out =
        std::fs::read_to_string(paths.work.join(format!("ckpt-{job}.out"))).unwrap_or_default();
    assert_eq!(
        state,
        "COMPLETED",
        "job {job}: {out}\n{:?}\n{}",
        slurm.job_fields(job),
        slurm.log_tail()
    );
    let mountpoint = slurm.dir.join(format!("mnt/job-{job}"));
    assert!(out.contains(&format!("bb={}", mountpoint.display())), "SPILLWAY_BB: {out}");
    for host in cluster.hosts() {
        assert!(
            out.contains(&format!("mounted on {}: 1", host.name())),
            "{} had no mount: {out}",
            host.name()
        );
        assert!(
            out.contains(&format!("on {}: input ok", host.name())),
            "{} did not read the input: {out}",
            host.name()
        );
    }
    assert!(out.contains("checkpoint ok: 4 ranks"), "the MPI program did not verify: {out}");
    wait_torn_down(slurm, cluster, manager, job);
    check_epilogs_before_stage_out(slurm, job);
    check_staged_out(&paths.pfs_out.join("ckpt"));
}

/// Without MPI: the same checks and checkpoints as the MPI program, one `srun` task per node.
/// Every node compares the staged-in input through its mount; each writes its block of the
/// N-1 file (at its rank's offset, through its own mount) and its N-N file with `dd`, copied
/// from the expected checkpoints written here into `work/expected`; the batch step then
/// compares the whole N-1 file.
fn dd_checkpoints(work: &Path, input: &Path) -> String {
    let expected = user_dir(&work.join("expected"));
    let n1: Vec<u8> = (0..4 * BLOCK_BYTES).map(n1_byte).collect();
    std::fs::write(expected.join("n1.ckpt"), n1).unwrap();
    for rank in 0..4u64 {
        let nn: Vec<u8> = (0..BLOCK_BYTES).map(|offset| nn_byte(rank, offset)).collect();
        std::fs::write(expected.join(format!("rank-{rank}.ckpt")), nn).unwrap();
    }
    format!(
        "srun sh -c 'cmp \"$SPILLWAY_BB/input/input.bin\" {input} && echo \"on $(hostname): input ok\"'\n\
         mkdir -p \"$SPILLWAY_BB/ckpt/nn\"\n: > \"$SPILLWAY_BB/ckpt/n1.ckpt\"\n\
         srun sh -c 'dd if={expected}/n1.ckpt of=\"$SPILLWAY_BB/ckpt/n1.ckpt\" bs={block} skip=$SLURM_PROCID seek=$SLURM_PROCID count=1 conv=notrunc,fsync status=none && \
         dd if={expected}/rank-$SLURM_PROCID.ckpt of=\"$SPILLWAY_BB/ckpt/nn/rank-$SLURM_PROCID.ckpt\" bs={block} conv=fsync status=none'\n\
         cmp \"$SPILLWAY_BB/ckpt/n1.ckpt\" {expected}/n1.ckpt && echo \"checkpoint ok: 4 ranks\"\n",
        input = input.display(),
        expected = expected.display(),
        block = BLOCK_BYTES,
    )
}

/// slurmctld's log shows post_run's "every node's epilog is done" for the job before its
/// data_out (Slurm starts the stage-out while the epilogs still run; post_run waits for them).
fn check_epilogs_before_stage_out(slurm: &Slurm, job: u64) {
    let log = std::fs::read_to_string(slurm.dir.join("log/slurmctld.log")).unwrap();
    let line_of = |needle: &str| log.lines().position(|line| line.contains(needle));
    let epilogs = line_of(&format!("job {job}: every node's epilog is done"));
    let data_out = line_of(&format!("data_out job {job}: stage-out"));
    assert!(
        matches!((epilogs, data_out), (Some(e), Some(d)) if e < d),
        "job {job}: post_run's epilog line ({epilogs:?}) must come before data_out's ({data_out:?})\n{}",
        slurm.log_tail()
    );
    // Then post_run stored the namespace's snapshot, for a stage-out after losing its host.
    let snapshot =
        line_of(&format!("job {job}: reservation job-{job}: snapshot of its namespace stored"));
    assert!(
        matches!((snapshot, data_out), (Some(s), Some(d)) if s < d),
        "job {job}: post_run's snapshot line ({snapshot:?}) must come before data_out's ({data_out:?})\n{}",
        slurm.log_tail()
    );
}

/// Every byte the stage-out wrote: the N-1 file and the four N-N files.
fn check_staged_out(dir: &Path) {
    let n1 = std::fs::read(dir.join("n1.ckpt")).expect("N-1 checkpoint not staged out");
    assert_eq!(n1.len() as u64, 4 * BLOCK_BYTES, "N-1 checkpoint size");
    if let Some(bad) = (0..n1.len()).find(|&i| n1[i] != n1_byte(i as u64)) {
        panic!("N-1 checkpoint byte {bad} is {}, expected {}", n1[bad], n1_byte(bad as u64));
    }
    for rank in 0..4u64 {
        let path = dir.join(format!("nn/rank-{rank}.ckpt"));
        let nn = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(nn.len() as u64, BLOCK_BYTES, "{} size", path.display());
        if let Some(bad) = (0..nn.len()).find(|&i| nn[i] != nn_byte(rank, i as u64)) {
            panic!(
                "{} byte {bad} is {}, expected {}",
                path.display(),
                nn[bad],
                nn_byte(rank, bad as u64)
            );
        }
    }
}

/// After the job: its record gone, its reservation destroyed, no host with the mount or a
/// mount process of it.
fn wait_torn_down(slurm: &Slurm, cluster: &Cluster, manager: &ManagerProcess, job: u64) {
    let mountpoint = slurm.dir.join(format!("mnt/job-{job}"));
    let record = slurm.dir.join(format!("bb-state/job-{job}.json"));
    let deadline = Instant::now() + TEARDOWN_WAIT_MAX;
    loop {
        let seen_at = slurm.host_path(&mountpoint);
        let mounted: Vec<&str> = cluster
            .hosts()
            .iter()
            .filter(|host| host_has_mount(host, &seen_at))
            .map(|host| host.name())
            .collect();
        let processes = mount_processes(&mountpoint);
        let reservation = reservation_exists(manager, &format!("job-{job}"));
        if mounted.is_empty() && processes.is_empty() && !reservation && !record.exists() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "job {job} not torn down after {TEARDOWN_WAIT_MAX:?}: mounted on {mounted:?}, mount processes {processes:?}, reservation left: {reservation}, record left: {}\n{}",
            record.exists(),
            slurm.log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether `mountpoint` is mounted in `host` (its own mount namespace).
fn host_has_mount(host: &Host, mountpoint: &Path) -> bool {
    let output: Output = host.command("cat").arg("/proc/self/mountinfo").output().unwrap();
    assert!(output.status.success(), "reading {}'s mountinfo", host.name());
    let wanted = mountpoint.to_string_lossy();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(&*wanted))
}

/// `spillway mount` processes (of any host: the hosts share one pid namespace) of `mountpoint`.
fn mount_processes(mountpoint: &Path) -> Vec<u32> {
    let wanted = mountpoint.to_string_lossy();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let raw = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<String> =
                raw.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            let is_mount = args.first()?.ends_with("spillway") && args.get(1)? == "mount";
            (is_mount && args.iter().any(|a| *a == *wanted)).then_some(pid)
        })
        .collect()
}

/// A 2-node job with `access=private`, staged: each node's prolog copies the stage-in into its
/// own namespace; each node writes a file named after itself into `$SPILLWAY_BB/out` and, after
/// both wrote, lists it: each sees only its own; the stage-out puts each node's `out` into
/// `destination/<node>`.
fn private_namespaces_job(
    slurm: &Slurm,
    cluster: &Cluster,
    manager: &ManagerProcess,
    paths: &Paths<'_>,
) {
    let (uid, gid) = ids_of(USER);
    let input = paths.pfs_in.join("private-input.txt");
    std::fs::write(&input, "staged into every node\n").unwrap();
    std::os::unix::fs::chown(&input, Some(uid), Some(gid)).unwrap();
    let destination = paths.pfs_out.join("private");
    let script = format!(
        "#!/bin/sh\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n#SBATCH -t 5\n#SBATCH -o {work}/private-%j.out\n\
         #BB_LUA capacity=16MiB pool=fast access=private\n\
         #BB_LUA stage_in source={input} destination=in.txt type=file\n\
         #BB_LUA stage_out source=out destination={destination}\n\
         set -e\n\
         srun sh -c 'echo \"$(hostname) has input: $(cat \"$SPILLWAY_BB/in.txt\")\"'\n\
         srun sh -c 'mkdir \"$SPILLWAY_BB/out\" && echo mine > \"$SPILLWAY_BB/out/from-$(hostname)\"'\n\
         srun sh -c 'echo \"$(hostname) sees: $(ls \"$SPILLWAY_BB/out\" | tr \"\\n\" \" \")\"'\n",
        work = paths.work.display(),
        input = input.display(),
        destination = destination.display(),
    );
    let job = slurm.submit(paths.work, "private", &script);
    let state = slurm.wait_job_end(job);
    let out =
        std::fs::read_to_string(paths.work.join(format!("private-{job}.out"))).unwrap_or_default();
    assert_eq!(
        state,
        "COMPLETED",
        "job {job}: {out}\n{:?}\n{}",
        slurm.job_fields(job),
        slurm.log_tail()
    );
    let nodes = slurm.job_fields(job).get("NodeList").cloned().unwrap_or_default();
    let had_input =
        out.lines().filter(|l| l.ends_with(" has input: staged into every node")).count();
    assert_eq!(
        had_input, 2,
        "both nodes read the stage-in in their own namespace (nodes {nodes}): {out}"
    );
    let lines: Vec<&str> = out.lines().filter(|line| line.contains(" sees: ")).collect();
    assert_eq!(lines.len(), 2, "two nodes listed their namespace (nodes {nodes}): {out}");
    let mut hosts = Vec::new();
    for line in lines {
        let (host, seen) = line.split_once(" sees: ").unwrap();
        assert_eq!(seen.trim(), format!("from-{host}"), "{host} sees another node's files: {out}");
        hosts.push(host.to_string());
    }
    wait_torn_down(slurm, cluster, manager, job);
    // One directory per node, holding that node's `out` only.
    let mut staged: Vec<String> = std::fs::read_dir(&destination)
        .unwrap_or_else(|e| panic!("{}: {e} (job {job}: {out})", destination.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    staged.sort();
    hosts.sort();
    assert_eq!(staged, hosts, "stage-out directories of job {job} (nodes {nodes})");
    for host in &hosts {
        let node_dir = destination.join(host);
        let files: Vec<String> = std::fs::read_dir(&node_dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(files, [format!("from-{host}")], "{}", node_dir.display());
        assert_eq!(std::fs::read_to_string(node_dir.join(&files[0])).unwrap(), "mine\n");
    }
}

/// host4's mount root is read-only. A job without burst buffer still runs on every node; for a
/// 4-node job with one, host4's prolog cannot mount the reservation: the job never runs, slurmd's log and the job name the job, the node and the reason, no host
/// keeps a mount, and cancelling the job destroys the reservation.
fn failed_prolog_mount_holds_the_job(
    slurm: &Slurm,
    cluster: &Cluster,
    manager: &ManagerProcess,
    work: &Path,
) {
    let host = cluster.host(3);
    // As the host sees the mount root of Slurm's jobs (in the Debian root, when there is one).
    let root = slurm.host_path(&slurm.dir.join("mnt"));
    let blocked = host
        .command("mount")
        .args(["-t", "tmpfs", "-o", "ro,size=1m", "spillway-ro"])
        .arg(&root)
        .status();
    assert!(blocked.unwrap().success(), "making {}'s mount root read-only", host.name());
    // A job without a burst buffer needs no mount: the prolog lets it run everywhere.
    let plain = format!(
        "#!/bin/sh\n#SBATCH -N 4\n#SBATCH --ntasks-per-node=1\n#SBATCH -t 5\n#SBATCH -o {work}/plain-%j.out\nsrun hostname\n",
        work = work.display(),
    );
    let plain_job = slurm.submit(work, "plain", &plain);
    assert_eq!(
        slurm.wait_job_end(plain_job),
        "COMPLETED",
        "job {plain_job} without a burst buffer"
    );
    let script = format!(
        "#!/bin/sh\n#SBATCH -N 4\n#SBATCH --ntasks-per-node=1\n#SBATCH -t 5\n#SBATCH -o {work}/blocked-%j.out\n\
         #BB_LUA capacity=16MiB pool=fast access=striped\n\
         echo RAN\n",
        work = work.display(),
    );
    let job = slurm.submit(work, "blocked", &script);
    let slurmd_log = slurm.dir.join(format!("log/slurmd-{}.log", host.name()));
    let needle = format!("job {job} on node {}: creating mount point", host.name());
    let deadline = Instant::now() + JOB_WAIT_MAX;
    while !std::fs::read_to_string(&slurmd_log).unwrap_or_default().contains(&needle) {
        assert!(
            Instant::now() < deadline,
            "slurmd on {} never logged {needle:?}\n{}",
            host.name(),
            slurm.log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // AdminComment holds spaces: look for the message in the whole line.
    let show = || {
        let output =
            slurm.command("scontrol").args(["-o", "show", "job", &job.to_string()]).output();
        String::from_utf8_lossy(&output.unwrap().stdout).into_owned()
    };
    let comment = format!("AdminComment=spillway prolog failed: {needle}");
    let mut line = show();
    while !line.contains(&comment) {
        assert!(Instant::now() < deadline, "job {job} does not name the failure: {line}");
        std::thread::sleep(Duration::from_millis(500));
        line = show();
    }
    let output = work.join(format!("blocked-{job}.out"));
    assert!(
        !std::fs::read_to_string(&output).unwrap_or_default().contains("RAN"),
        "the job ran without its mount on every node"
    );
    let cancel = slurm.command("scancel").arg(job.to_string()).status().unwrap();
    assert!(cancel.success(), "scancel {job}");
    wait_torn_down(slurm, cluster, manager, job);
    assert!(
        host.command("umount").arg(&root).status().unwrap().success(),
        "unmounting the read-only root"
    );
    let resume = slurm
        .command("scontrol")
        .args(["update", &format!("NodeName={}", host.name()), "State=RESUME"])
        .status();
    assert!(resume.unwrap().success(), "resuming {}", host.name());
}
