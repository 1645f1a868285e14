//! `spillway bench targets`: two concurrent jobs, one bandwidth-bound and one metadata-bound,
//! each given a reservation by performance target; what each achieved against its target, and
//! the same two jobs on capacity-only reservations of the same bytes beside them (issue 22,
//! docs/design/targets.md §8).
//!
//! All real, on loopback: a `spillway manager` child, `--servers` `spillway serve` children, and
//! the CLI (this binary) against the manager as an administrator would run it: `pool create`,
//! `server add`, `server measure --pool` (a short `spillway bench peaks` against each server
//! alone), `server list` for the measured peaks. The targets are fractions of the pool's
//! measured peaks (the sum over its servers): `--bandwidth-fraction` of its bandwidth for job A,
//! `--metadata-fraction` of its metadata rate for job B. Then, twice — by target, then by
//! capacity alone — both reservations are created, the jobs run at the same time through the
//! native client against their reservation's servers and epoch, and the reservations are
//! destroyed; the destroy reply carries what the servers counted of each epoch
//! (`Reservation.achieved`).
//!
//! - Job A (bandwidth): `--bandwidth-threads` clients, each writing its share of
//!   `--bandwidth-job-bytes` in `--transfer-bytes` writes striped over the reservation's servers
//!   (1 MiB stripe units), then reading it back and checking it, up to `--read-passes` times;
//!   the writes stop at half of `--seconds`, the reads at `--seconds`.
//! - Job B (metadata): `--metadata-threads` clients, each a compute node as its mount would be
//!   (its own directory of the striped namespace, or its own private namespace), creating empty
//!   files, looking each up and unlinking it through the namespace service — one request per
//!   operation, as the servers count them — up to `--metadata-files` together or `--seconds`.
//!
//! Achieved rates are the servers' counts over the longest time any one server was busy with the
//! epoch (100 ms ticks); the client's own rate (its units over its wall time) is reported
//! beside. `ratios.achieved_over_target_min` is the lower of the two jobs' achieved / target by
//! target (issue 22: ≥ 0.8); `by_target_over_by_capacity_*` compare each job's achieved rate by
//! target with its rate on the capacity-only reservation. Nothing is asserted: the numbers are
//! reported as measured.

use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};
use spillway_client::meta::{RemoteNamespace, RemoteOptions};
use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{ManagerProcess, ServerProcess};
use spillway_manager::model::{Reservation, Server};
use spillway_namespace::{Caller, FileKind, Ino, Namespace, ROOT_INO};
use spillway_policy::namespace::{namespace_placement, NamespaceAccess};
use spillway_proto::Endpoint;
use spillway_types::{format_bytes, EpochId};

#[derive(clap::Args)]
pub struct Args {
    /// Servers in the pool.
    #[arg(long, default_value_t = 3)]
    servers: usize,
    /// Job A's bandwidth target as a fraction of the pool's measured bandwidth (the sum of its
    /// servers' peaks, each measured alone; servers sharing a machine's cores give together far
    /// less than that sum: docs/design/targets.md §8).
    #[arg(long, default_value_t = 0.25)]
    bandwidth_fraction: f64,
    /// Job B's metadata target as a fraction of the pool's measured striped metadata rate
    /// (each server's measured alone through its namespace service; job A's load on the same
    /// cores takes a good part of it: docs/design/targets.md §8).
    #[arg(long, default_value_t = 0.12)]
    metadata_fraction: f64,
    /// Upper bound on each job, seconds (job A writes for at most half of it).
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// Job A: bytes written (then read back), all its clients together; also the capacity both
    /// of its reservations ask for.
    #[arg(long, default_value = "1GiB", value_parser = spillway_types::parse_size)]
    bandwidth_job_bytes: u64,
    /// Job A: times it reads back what it wrote, at most (reads take no capacity, so the job
    /// goes on reading until `--seconds` without asking for more).
    #[arg(long, default_value_t = 16)]
    read_passes: u64,
    /// Job A: bytes per write and per read.
    #[arg(long, default_value = "4MiB", value_parser = spillway_types::parse_size)]
    transfer_bytes: u64,
    /// Job A: client threads.
    #[arg(long, default_value_t = 2)]
    bandwidth_threads: usize,
    /// Job B: files created and stat-ed, all its clients together.
    #[arg(long, default_value_t = 400_000)]
    metadata_files: u64,
    /// Job B: client threads.
    #[arg(long, default_value_t = 2)]
    metadata_threads: usize,
    /// The manager's fragment size (`manager.fragment_bytes`, and the pool's granularity). Job B's reservations ask for one
    /// fragment of capacity.
    #[arg(long, default_value = "1GiB", value_parser = spillway_types::parse_size)]
    fragment_bytes: u64,
    /// `server measure`: highest concurrency level of its `bench peaks` (two cores here: more
    /// threads measure no more, only longer).
    #[arg(long, default_value_t = 2)]
    measure_threads_max: usize,
    /// `server measure`: upper bound on each phase of each level, seconds.
    #[arg(long, default_value_t = 0.2)]
    measure_phase_seconds: f64,
    /// `server measure`: MiB each thread writes then reads in its bandwidth phase.
    #[arg(long, default_value_t = 64)]
    measure_file_mib_per_thread: u64,
    /// Directory for the manager, the servers' SSD logs and logs (default: a temporary
    /// directory under /var/tmp).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// One JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
}

const POOL: &str = "bench";

/// The two jobs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bandwidth,
    Metadata,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Bandwidth => "bandwidth",
            Kind::Metadata => "metadata",
        }
    }

    /// The achieved rate that answers this job's target.
    fn achieved_rate(self, reservation: &Reservation) -> u64 {
        reservation.achieved.as_ref().map_or(0, |a| match self {
            Kind::Bandwidth => a.bandwidth_bytes_per_s,
            Kind::Metadata => a.metadata_ops_per_s,
        })
    }
}

/// What one job's clients did: bytes (job A) or operations (job B), and the wall time from the
/// common start to its last client's end.
#[derive(Clone, Copy, Default)]
struct ClientCount {
    bytes_written: u64,
    bytes_read: u64,
    operations: u64,
    seconds: f64,
}

impl ClientCount {
    fn units(&self, kind: Kind) -> u64 {
        match kind {
            Kind::Bandwidth => self.bytes_written + self.bytes_read,
            Kind::Metadata => self.operations,
        }
    }

    fn rate(&self, kind: Kind) -> f64 {
        if self.seconds > 0.0 {
            self.units(kind) as f64 / self.seconds
        } else {
            0.0
        }
    }

    fn add(&mut self, other: ClientCount) {
        self.bytes_written += other.bytes_written;
        self.bytes_read += other.bytes_read;
        self.operations += other.operations;
        self.seconds = self.seconds.max(other.seconds);
    }
}

/// One job on one reservation.
struct JobRun {
    kind: Kind,
    allocation: &'static str,
    target: u64,
    created: Reservation,
    destroyed: Reservation,
    client: ClientCount,
}

/// The targets, derived from the measured peaks.
struct Targets {
    pool_bandwidth: u64,
    pool_metadata: u64,
    bandwidth: u64,
    metadata: u64,
}

/// The manager and the way to run the CLI against it.
struct Bench<'a> {
    args: &'a Args,
    binary: PathBuf,
    manager: ManagerProcess,
}

impl Bench<'_> {
    /// `spillway <words> --json` against the manager; its JSON output.
    fn cli(&self, words: &[&str]) -> anyhow::Result<Value> {
        let output = self
            .manager
            .cli(&self.binary, None)
            .args(words)
            .arg("--json")
            .output()
            .with_context(|| format!("running spillway {}", words.join(" ")))?;
        anyhow::ensure!(
            output.status.success(),
            "spillway {} failed: {}",
            words.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        serde_json::from_slice(&output.stdout)
            .with_context(|| format!("spillway {}: output is not JSON", words.join(" ")))
    }

    fn reservation(&self, words: &[&str]) -> anyhow::Result<Reservation> {
        Ok(serde_json::from_value(self.cli(words)?)?)
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    validate(&args)?;
    let temporary;
    let work = match &args.dir {
        Some(dir) => dir.clone(),
        None => {
            temporary =
                tempfile::Builder::new().prefix("spillway-bench-targets").tempdir_in("/var/tmp")?;
            temporary.path().to_path_buf()
        }
    };
    std::fs::create_dir_all(&work)?;
    let binary = std::env::current_exe()?;
    let servers = start_servers(&args, &work)?;
    // Whoever runs the benchmark administers its manager (a TOML string: a gid alone would be
    // read as a number).
    // Fragments are the manager's `fragment_bytes` (the pool's granularity is told the same).
    let gid = format!("\"{}\"", spillway_sys::user::gid());
    let fragment = args.fragment_bytes.to_string();
    let env = [
        ("SPILLWAY_MANAGER_ADMIN_GROUP", gid.as_str()),
        ("SPILLWAY_MANAGER_FRAGMENT_BYTES", fragment.as_str()),
    ];
    let manager = ManagerProcess::start(&binary, &work.join("manager"), &env);
    let bench = Bench { args: &args, binary, manager };
    let measured = measure(&bench, &servers)?;
    let targets = choose_targets(&args, &measured)?;
    let by_target = run_phase(&bench, &targets, true)?;
    let by_capacity = run_phase(&bench, &targets, false)?;
    drop(servers);
    report(&args, &measured, &targets, &by_target, &by_capacity)
}

fn validate(args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.servers > 0, "--servers must be > 0");
    for (name, fraction) in [
        ("--bandwidth-fraction", args.bandwidth_fraction),
        ("--metadata-fraction", args.metadata_fraction),
    ] {
        anyhow::ensure!(fraction > 0.0 && fraction <= 1.0, "{name} must be in (0, 1]");
    }
    anyhow::ensure!(args.seconds > 0.0 && args.seconds.is_finite(), "--seconds must be > 0");
    anyhow::ensure!(
        args.bandwidth_threads > 0 && args.metadata_threads > 0,
        "--bandwidth-threads and --metadata-threads must be > 0"
    );
    anyhow::ensure!(args.transfer_bytes > 0, "--transfer-bytes must be > 0");
    anyhow::ensure!(
        args.bandwidth_job_bytes >= args.transfer_bytes * args.bandwidth_threads as u64,
        "--bandwidth-job-bytes must give every thread at least one transfer"
    );
    anyhow::ensure!(args.metadata_files > 0, "--metadata-files must be > 0");
    anyhow::ensure!(args.read_passes > 0, "--read-passes must be > 0");
    anyhow::ensure!(args.fragment_bytes >= 4096, "--fragment-bytes must be at least 4 KiB");
    Ok(())
}

/// `--servers` servers, each able to hold both jobs' largest reservation twice over.
fn start_servers(args: &Args, work: &Path) -> anyhow::Result<Vec<ServerProcess>> {
    let largest = args.bandwidth_job_bytes.next_multiple_of(args.fragment_bytes);
    let ssd_bytes = 2 * (largest + args.fragment_bytes) + (1 << 30);
    let dram = crate::dram_bytes_holding(args.bandwidth_job_bytes, 256 << 20);
    let mut servers = Vec::new();
    for i in 0..args.servers {
        let ssd = work.join(format!("ssd-{i}"));
        let server_args = vec!["--ssd-bytes".to_string(), ssd_bytes.to_string()];
        servers.push(crate::start_server(work, &format!("s{i}"), &ssd, dram, &server_args)?);
    }
    Ok(servers)
}

/// The pool and its servers registered with the manager and measured; the servers as the
/// manager lists them (with their peaks).
fn measure(bench: &Bench<'_>, servers: &[ServerProcess]) -> anyhow::Result<Vec<Server>> {
    let args = bench.args;
    let fragment = args.fragment_bytes.to_string();
    bench.cli(&["pool", "create", POOL, "--granularity", &fragment])?;
    for server in servers {
        let address = server.endpoint().to_string();
        let address = address.strip_prefix("tcp://").unwrap_or(&address).to_string();
        bench.cli(&["server", "add", &address, "--pool", POOL])?;
    }
    let started = Instant::now();
    bench.cli(&[
        "server",
        "measure",
        "--pool",
        POOL,
        "--threads-max",
        &args.measure_threads_max.to_string(),
        "--phase-seconds",
        &args.measure_phase_seconds.to_string(),
        "--file-mib-per-thread",
        &args.measure_file_mib_per_thread.to_string(),
    ])?;
    if !args.json {
        println!(
            "measured {} server(s) with `spillway server measure` in {:.1} s",
            servers.len(),
            started.elapsed().as_secs_f64()
        );
    }
    let listed: Vec<Server> = serde_json::from_value(bench.cli(&["server", "list"])?)?;
    Ok(listed.into_iter().filter(|s| s.pool == POOL).collect())
}

/// The pool's peaks (sums over its measured servers) and the fractions of them asked for.
fn choose_targets(args: &Args, servers: &[Server]) -> anyhow::Result<Targets> {
    let peaks: Vec<_> = servers.iter().filter_map(|s| s.peaks.as_ref()).collect();
    anyhow::ensure!(peaks.len() == servers.len(), "a server of the pool was not measured");
    let pool_bandwidth: u64 = peaks.iter().map(|p| p.bandwidth_bytes_per_s).sum();
    // Job B runs in one striped namespace when its target fits one (as the defaults do): its
    // servers' striped peaks, measured through the namespace service (the epoch index's rate
    // when a measurement lacks them).
    let pool_metadata: u64 =
        peaks.iter().map(|p| p.metadata_striped_ops_per_s.unwrap_or(p.metadata_ops_per_s)).sum();
    let fraction_of = |peak: u64, fraction: f64| ((peak as f64 * fraction).ceil() as u64).max(1);
    Ok(Targets {
        pool_bandwidth,
        pool_metadata,
        bandwidth: fraction_of(pool_bandwidth, args.bandwidth_fraction),
        metadata: fraction_of(pool_metadata, args.metadata_fraction),
    })
}

/// Both reservations (by target, or by the same capacity alone), both jobs at once, both
/// reservations destroyed: job A's run, then job B's.
fn run_phase(bench: &Bench<'_>, targets: &Targets, by_target: bool) -> anyhow::Result<[JobRun; 2]> {
    let args = bench.args;
    let (a_capacity, b_capacity) =
        (args.bandwidth_job_bytes.to_string(), args.fragment_bytes.to_string());
    let (bandwidth, metadata) = (format!("{}/s", targets.bandwidth), targets.metadata.to_string());
    let mut a_words = vec!["reservation", "create", "--pool", POOL, "--capacity", &a_capacity];
    let mut b_words = vec!["reservation", "create", "--pool", POOL, "--capacity", &b_capacity];
    if by_target {
        a_words.extend(["--bandwidth", &bandwidth]);
        b_words.extend(["--metadata", &metadata]);
    }
    let a = bench.reservation(&a_words)?;
    let b = bench.reservation(&b_words)?;
    let allocation = if by_target { "by_target" } else { "by_capacity" };
    if !args.json {
        println!("{allocation}:");
        print_plan(Kind::Bandwidth, &a);
        print_plan(Kind::Metadata, &b);
    }
    let jobs = run_jobs(args, &a, &b);
    // Destroyed whether or not the jobs succeeded: nothing is left holding the servers.
    let a_destroyed = bench.reservation(&["reservation", "destroy", &a.name]);
    let b_destroyed = bench.reservation(&["reservation", "destroy", &b.name]);
    let (a_client, b_client) = jobs?;
    let run = |kind, target, created, destroyed, client| JobRun {
        kind,
        allocation,
        target,
        created,
        destroyed,
        client,
    };
    Ok([
        run(Kind::Bandwidth, targets.bandwidth, a, a_destroyed?, a_client),
        run(Kind::Metadata, targets.metadata, b, b_destroyed?, b_client),
    ])
}

fn print_plan(kind: Kind, reservation: &Reservation) {
    println!(
        "  job {} on {} ({}): {} server(s) {}, {} namespace, {} granted",
        kind.name(),
        reservation.name,
        reservation.targets.as_ref().map_or("capacity only".to_string(), |t| t.asked.to_string()),
        reservation.servers.len(),
        reservation.servers.join(", "),
        access_name(reservation),
        format_bytes(reservation.capacity_bytes)
    );
    for why in reservation.targets.iter().flat_map(|t| &t.why) {
        println!("    {why}");
    }
}

fn access_name(reservation: &Reservation) -> String {
    serde_json::to_value(reservation.access)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Both jobs at once: every client of both connects, then all start together.
fn run_jobs(
    args: &Args,
    a: &Reservation,
    b: &Reservation,
) -> anyhow::Result<(ClientCount, ClientCount)> {
    let start = Barrier::new(args.bandwidth_threads + args.metadata_threads);
    let a_endpoints = endpoints(a)?;
    let seconds = Duration::from_secs_f64(args.seconds);
    std::thread::scope(|scope| {
        let a_threads: Vec<_> = (0..args.bandwidth_threads)
            .map(|thread| {
                let (start, endpoints) = (&start, &a_endpoints);
                scope.spawn(move || {
                    bandwidth_client(args, endpoints, EpochId(a.epoch), thread, start, seconds)
                })
            })
            .collect();
        let b_threads: Vec<_> = (0..args.metadata_threads)
            .map(|thread| {
                let start = &start;
                scope.spawn(move || metadata_client(args, b, thread, start, seconds))
            })
            .collect();
        Ok((join_all(a_threads, "job A")?, join_all(b_threads, "job B")?))
    })
}

fn join_all(
    threads: Vec<std::thread::ScopedJoinHandle<'_, anyhow::Result<ClientCount>>>,
    job: &str,
) -> anyhow::Result<ClientCount> {
    let mut total = ClientCount::default();
    let mut first_error = None;
    for thread in threads {
        match thread.join().map_err(|_| anyhow::anyhow!("{job}: a client thread panicked"))? {
            Ok(count) => total.add(count),
            Err(error) => {
                first_error.get_or_insert(error.context(job.to_string()));
            }
        }
    }
    first_error.map_or(Ok(total), Err)
}

fn endpoints(reservation: &Reservation) -> anyhow::Result<Vec<Endpoint>> {
    reservation
        .servers
        .iter()
        .map(|s| s.parse::<Endpoint>().map_err(|e| anyhow::anyhow!("server {s}: {e}")))
        .collect()
}

/// Waits at `start` even when connecting failed, so the other clients are not left waiting.
fn connect_then_wait(
    endpoints: &[Endpoint],
    options: ClientOptions,
    start: &Barrier,
) -> anyhow::Result<Client> {
    let client = Client::connect(endpoints, options);
    start.wait();
    Ok(client?)
}

/// Job A's client `thread`: writes its share, flushes, reads it back and checks it.
fn bandwidth_client(
    args: &Args,
    endpoints: &[Endpoint],
    epoch: EpochId,
    thread: usize,
    start: &Barrier,
    seconds: Duration,
) -> anyhow::Result<ClientCount> {
    let options = ClientOptions {
        placement: Placement::striped_default(),
        client_name: format!("spillway bench targets: job A client {thread}"),
        ..ClientOptions::default()
    };
    let mut client = connect_then_wait(endpoints, options, start)?;
    let started = Instant::now();
    let share = args.bandwidth_job_bytes / args.bandwidth_threads as u64;
    let transfer = args.transfer_bytes;
    let block = crate::replication::block(thread as u64, transfer as usize);
    let name = format!("a.{thread}");
    let mut file = client.create_file(epoch, &name)?;
    let mut written = 0u64;
    while written < share && started.elapsed() < seconds / 2 {
        let length = transfer.min(share - written) as usize;
        client.write(&mut file, written, &block[..length])?;
        written += length as u64;
    }
    client.flush()?;
    let mut back = vec![0u8; transfer as usize];
    let mut read = 0u64;
    while read < written * args.read_passes && started.elapsed() < seconds {
        let at = read % written;
        let length = transfer.min(written - at) as usize;
        client.read(&file, at, &mut back[..length])?;
        anyhow::ensure!(back[..length] == block[..length], "{name}: bytes at {at} differ");
        read += length as u64;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(ClientCount { bytes_written: written, bytes_read: read, operations: 0, seconds })
}

/// Job B's client `thread`, one compute node as the mount would be: in the reservation's
/// namespace (striped: the one on its first server, each node in its own directory; private:
/// this node's own, created as the mount creates it, which only root may), creates empty files,
/// looks each up and unlinks it — MDTest's create, stat and remove through the namespace
/// service, one request each, as the servers count them.
fn metadata_client(
    args: &Args,
    reservation: &Reservation,
    thread: usize,
    start: &Barrier,
    seconds: Duration,
) -> anyhow::Result<ClientCount> {
    let opened = open_node_namespace(reservation, thread);
    start.wait();
    let (namespace, directory) = opened?;
    let caller = Caller::root();
    let started = Instant::now();
    let files = args.metadata_files / args.metadata_threads as u64
        + u64::from((thread as u64) < args.metadata_files % args.metadata_threads as u64);
    let mut done = 0u64;
    while done < files && started.elapsed() < seconds {
        let name = format!("b.{done}");
        let created = namespace
            .create(&caller, directory, name.as_bytes(), FileKind::Regular, 0o644, 0, 0, true)
            .with_context(|| format!("job B node {thread}: create {name}"))?;
        let looked_up = namespace.lookup(&caller, directory, name.as_bytes())?;
        anyhow::ensure!(looked_up.ino == created.ino, "{name}: lookup found another inode");
        namespace.unlink(&caller, directory, name.as_bytes())?;
        done += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(ClientCount { bytes_written: 0, bytes_read: 0, operations: 3 * done, seconds })
}

/// Job B's node `thread`: its namespace and the directory it works in (untimed).
fn open_node_namespace(
    reservation: &Reservation,
    thread: usize,
) -> anyhow::Result<(RemoteNamespace, Ino)> {
    let servers = endpoints(reservation)?;
    let node = format!("bench-node-{thread}");
    let private = reservation.access == spillway_manager::Access::Private;
    let access = if private { NamespaceAccess::Private } else { NamespaceAccess::Striped };
    let place = namespace_placement(access, reservation.namespace_id, &node, servers.len());
    let options = RemoteOptions {
        create: private,
        data_epoch: EpochId(reservation.epoch),
        root_uid: reservation.owner,
        root_gid: reservation.group,
        root_mode: 0o755,
        connections_max: 1,
        ..RemoteOptions::default()
    };
    let namespace = RemoteNamespace::open(&servers[place.server], place.namespace, &options)
        .map_err(|e| {
            anyhow::anyhow!(
                "job B node {thread}: namespace {} on {}: {e}{}",
                place.namespace,
                servers[place.server],
                if private {
                    " (a private namespace is created by its node's mount, as root)"
                } else {
                    ""
                }
            )
        })?;
    let directory = if private {
        ROOT_INO
    } else {
        namespace
            .mkdir(&Caller::root(), ROOT_INO, node.as_bytes(), 0o755, 0)
            .map_err(|e| anyhow::anyhow!("job B node {thread}: mkdir {node}: {e}"))?
            .ino
    };
    Ok((namespace, directory))
}

/// One job's row.
fn row(job: &JobRun) -> Value {
    let achieved = job.kind.achieved_rate(&job.destroyed);
    json!({
        "job": job.kind.name(),
        "allocation": job.allocation,
        "reservation": job.created.name,
        "asked": job.created.targets.as_ref().map(|t| t.asked.to_string()),
        "target_per_s": job.target,
        "servers": job.created.servers,
        "access": access_name(&job.created),
        "capacity_bytes": job.created.capacity_bytes,
        "promised": job.created.targets.as_ref().map(|t| &t.promised),
        "why": job.created.targets.as_ref().map(|t| &t.why),
        "client": {
            "bytes_written": job.client.bytes_written,
            "bytes_read": job.client.bytes_read,
            "operations": job.client.operations,
            "seconds": job.client.seconds,
            "rate_per_s": job.client.rate(job.kind),
        },
        "achieved": job.destroyed.achieved,
        "achieved_per_s": achieved,
        "achieved_over_target": achieved as f64 / job.target as f64,
    })
}

fn ratio(numerator: u64, denominator: u64) -> f64 {
    if denominator == 0 {
        f64::INFINITY
    } else {
        numerator as f64 / denominator as f64
    }
}

/// The table, or one JSON object.
fn report(
    args: &Args,
    servers: &[Server],
    targets: &Targets,
    by_target: &[JobRun; 2],
    by_capacity: &[JobRun; 2],
) -> anyhow::Result<()> {
    let achieved = |job: &JobRun| job.kind.achieved_rate(&job.destroyed);
    let over_target = |job: &JobRun| achieved(job) as f64 / job.target as f64;
    let ratios = json!({
        "achieved_over_target_min": over_target(&by_target[0]).min(over_target(&by_target[1])),
        "by_target_over_by_capacity_bandwidth": ratio(achieved(&by_target[0]), achieved(&by_capacity[0])),
        "by_target_over_by_capacity_metadata": ratio(achieved(&by_target[1]), achieved(&by_capacity[1])),
    });
    let peaks: Vec<Value> =
        servers.iter().map(|s| json!({ "server": s.address, "peaks": s.peaks })).collect();
    let jobs: Vec<Value> = by_target.iter().chain(by_capacity).map(row).collect();
    if args.json {
        let out = json!({
            "benchmark": "targets",
            "servers": args.servers,
            "seconds": args.seconds,
            "peaks": peaks,
            "pool_peaks": {
                "bandwidth_bytes_per_s": targets.pool_bandwidth,
                "metadata_ops_per_s": targets.pool_metadata,
            },
            "fractions": { "bandwidth": args.bandwidth_fraction, "metadata": args.metadata_fraction },
            "targets": {
                "bandwidth_bytes_per_s": targets.bandwidth,
                "metadata_ops_per_s": targets.metadata,
            },
            "jobs": jobs,
            "ratios": ratios,
            "goals": { "achieved_over_target_min": 0.8 },
            "ratio_basis": "achieved = the servers' counts of each reservation's epoch over the longest time one server was busy with it (100 ms ticks), recorded at destroy; targets are fractions of the pool's measured peaks (sums of per-server peaks measured alone)",
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    print_table(args, targets, by_target, by_capacity, &ratios);
    Ok(())
}

fn rate_text(kind: Kind, rate: f64) -> String {
    match kind {
        Kind::Bandwidth => format!("{}/s", format_bytes(rate as u64)),
        Kind::Metadata => format!("{rate:.0} ops/s"),
    }
}

fn print_table(
    args: &Args,
    targets: &Targets,
    by_target: &[JobRun; 2],
    by_capacity: &[JobRun; 2],
    ratios: &Value,
) {
    println!(
        "pool peaks (sum of {} servers, each measured alone): {}, {}; targets: bandwidth {} ({}), metadata {} ({})",
        args.servers,
        rate_text(Kind::Bandwidth, targets.pool_bandwidth as f64),
        rate_text(Kind::Metadata, targets.pool_metadata as f64),
        rate_text(Kind::Bandwidth, targets.bandwidth as f64),
        args.bandwidth_fraction,
        rate_text(Kind::Metadata, targets.metadata as f64),
        args.metadata_fraction,
    );
    println!(
        "  {:<10} {:<12} {:>7} {:>8} {:>16} {:>16} {:>16} {:>8}",
        "job", "allocation", "servers", "access", "target", "achieved", "client", "ach/tgt"
    );
    for job in by_target.iter().chain(by_capacity) {
        let achieved = job.kind.achieved_rate(&job.destroyed);
        println!(
            "  {:<10} {:<12} {:>7} {:>8} {:>16} {:>16} {:>16} {:>8.2}",
            job.kind.name(),
            job.allocation,
            job.created.servers.len(),
            access_name(&job.created),
            rate_text(job.kind, job.target as f64),
            rate_text(job.kind, achieved as f64),
            rate_text(job.kind, job.client.rate(job.kind)),
            achieved as f64 / job.target as f64,
        );
    }
    let get = |key: &str| ratios[key].as_f64().unwrap_or(0.0);
    println!(
        "  achieved_over_target_min {:.2} (goal >= 0.8); by target over by capacity: bandwidth {:.2}, metadata {:.2}",
        get("achieved_over_target_min"),
        get("by_target_over_by_capacity_bandwidth"),
        get("by_target_over_by_capacity_metadata"),
    );
}
