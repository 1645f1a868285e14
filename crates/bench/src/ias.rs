//! `spillway bench ias`: IAS Figs 5-7 on real, contending tiers (issue 17, docs/design/ias.md).
//!
//! A namespace cluster of 4 hosts (root): host1 runs the burst buffer server and the manager
//! (the data scheduler), its link shaped to `--bb-mbit`; host2 serves the PFS (MooseFS,
//! `Cluster::start_pfs`), its link shaped to `--pfs-mbit`; hosts 3 and 4 are compute nodes
//! whose node-local tier is a directory of their own. k synthetic applications, each a process
//! (`spillway bench ias-app`) on host 3 or 4, alternate compute (a sleep) and I/O phases of
//! `--phase-bytes` (one file per phase, committed at the phase's end); the compute time follows
//! from the I/O ratio r as IAS defines it: C = T_io · (1 − r) / r, T_io = the phase's time alone
//! on the burst buffer at its link rate. Starts are staggered by up to one step (seeded). Each
//! application drains what lands on the burst buffer to the PFS in the background through the
//! manager's drain scheduler, so drains and direct PFS phases contend as in production; at its
//! end it moves its node-local data on, drains everything and checks every byte on the PFS.
//!
//! Per strategy (same run, rotated order per point): the applications' average I/O time (the
//! sum of their phases' times, phase start to commit return). Sweeps: the I/O ratio 0.8 → 0.2,
//! the steps 4 → 32 and the applications 2 → 8 (`--quick`: a smaller sweep). Ratios:
//! `ia_over_hp_io_time` and `measured_over_ia_io_time`, medians over the sweep's points.

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use spillway_client::{Client, ClientOptions, NodeLocalOptions, Tier, TieringOptions};
use spillway_policy::Strategy;
use spillway_proto::{DrainState, Durability, Endpoint};
use spillway_types::EpochId;

use crate::stats::median;

#[derive(clap::Args)]
pub struct Args {
    /// Bytes each application writes per I/O phase.
    #[arg(long, default_value = "8M", value_parser = spillway_types::parse_size)]
    phase_bytes: u64,
    /// The burst buffer server's link, Mbit/s each way.
    #[arg(long, default_value_t = 320)]
    bb_mbit: u32,
    /// The PFS server's link, Mbit/s each way.
    #[arg(long, default_value_t = 160)]
    pfs_mbit: u32,
    /// PFS writers at once (jobs' direct phases and drains): manager.pfs_writers_max.
    #[arg(long, default_value_t = 2)]
    pfs_writers_max: u32,
    /// A smaller sweep (ratios 0.8 and 0.2, 4 and 8 steps, 2 and 4 applications).
    #[arg(long)]
    quick: bool,
    /// Seed of the staggered starts.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// One JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
}

/// One application (run inside a cluster host by the benchmark).
#[derive(clap::Args)]
pub struct AppArgs {
    #[arg(long)]
    servers: String,
    #[arg(long)]
    manager: String,
    #[arg(long)]
    job: String,
    #[arg(long)]
    strategy: String,
    #[arg(long)]
    steps: u32,
    #[arg(long)]
    phase_bytes: u64,
    #[arg(long)]
    compute_ms: u64,
    #[arg(long)]
    start_delay_ms: u64,
    #[arg(long)]
    node_local: PathBuf,
    #[arg(long)]
    pfs: PathBuf,
    #[arg(long)]
    epoch_base: u64,
}

/// What one application reports.
#[derive(Debug, Serialize, Deserialize)]
struct AppResult {
    phase_seconds: Vec<f64>,
    tiers: Vec<Tier>,
    /// From its start to every byte verified on the PFS.
    makespan_seconds: f64,
}

/// One point of a sweep.
#[derive(Clone, Copy, Debug, Serialize)]
struct Point {
    sweep: &'static str,
    apps: u32,
    steps: u32,
    io_ratio: f64,
}

/// The port of the manager's TCP API in host1.
const MANAGER_PORT: u16 = 7420;

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.phase_bytes >= 1 << 20, "--phase-bytes must be at least 1 MiB");
    anyhow::ensure!(args.bb_mbit > 0 && args.pfs_mbit > 0, "--bb-mbit and --pfs-mbit must be > 0");
    anyhow::ensure!(args.pfs_writers_max > 0, "--pfs-writers-max must be > 0");
    let binary = std::env::current_exe()?;
    let cluster = spillway_harness::Cluster::start(4)?;
    let outcome = run_on(&args, &binary, &cluster);
    let down = cluster.down();
    let table = outcome?;
    down?;
    report(&args, &table)
}

/// Results per point: the average I/O time per strategy (in [`Strategy::ALL`] order) and the
/// makespans.
struct Row {
    point: Point,
    io_seconds: Vec<f64>,
    makespan_seconds: Vec<f64>,
    tiers: Vec<[u32; 3]>,
}

fn points(quick: bool) -> Vec<Point> {
    let (ratios, steps, apps): (&[f64], &[u32], &[u32]) = if quick {
        (&[0.8, 0.2], &[4, 8], &[2, 4])
    } else {
        (&[0.8, 0.6, 0.4, 0.2], &[4, 8, 16, 32], &[2, 4, 6, 8])
    };
    let mut out = Vec::new();
    out.extend(ratios.iter().map(|&r| Point { sweep: "io_ratio", apps: 2, steps: 4, io_ratio: r }));
    out.extend(steps.iter().map(|&s| Point { sweep: "steps", apps: 2, steps: s, io_ratio: 0.5 }));
    out.extend(apps.iter().map(|&a| Point { sweep: "apps", apps: a, steps: 4, io_ratio: 0.5 }));
    out
}

/// The shaped PFS and burst buffer, the manager and the server; what they need kept running.
struct Tiers {
    _server: spillway_harness::ServerProcess,
    _manager: spillway_harness::ManagerProcess,
    at: TierAddresses,
}

fn start_tiers(
    args: &Args,
    binary: &std::path::Path,
    cluster: &spillway_harness::Cluster,
) -> anyhow::Result<Tiers> {
    let pfs = cluster.start_pfs("host2", args.pfs_mbit)?;
    cluster.shape_link("host1", args.bb_mbit)?;
    let bb_host = cluster.host(0);
    let pfs_writers = args.pfs_writers_max.to_string();
    let manager = spillway_harness::ManagerProcess::start_in_host(
        bb_host,
        MANAGER_PORT,
        binary,
        &cluster.dir().join("manager"),
        &[
            ("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "none"),
            ("SPILLWAY_MANAGER_PFS_WRITERS_MAX", &pfs_writers),
        ],
    );
    let server = spillway_harness::ServerBuilder::new(binary, cluster.dir(), "bb")
        .in_host(bb_host)
        .pfs_dir(pfs.mount_path())
        .dram_bytes(&(2u64 << 30).to_string())
        .durability("memory")
        .rust_log("warn")
        .graceful_drop(Duration::from_secs(30))
        .spawn()?;
    let at = TierAddresses {
        servers: server.endpoint().to_string(),
        manager: format!("tcp://{}", bb_host.socket_address(MANAGER_PORT)),
        pfs: pfs.mount_path().to_path_buf(),
    };
    Ok(Tiers { _server: server, _manager: manager, at })
}

fn run_on(
    args: &Args,
    binary: &std::path::Path,
    cluster: &spillway_harness::Cluster,
) -> anyhow::Result<Vec<Row>> {
    let tiers_up = start_tiers(args, binary, cluster)?;
    let tiers_at = &tiers_up.at;
    // Alone on the burst buffer a phase takes this long: the I/O ratio's reference.
    let alone_s = args.phase_bytes as f64 * 8.0 / (f64::from(args.bb_mbit) * 1e6);
    let mut rows = Vec::new();
    let mut run_index = 0u64;
    let mut seed = args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for (index, point) in points(args.quick).into_iter().enumerate() {
        let compute_ms =
            (alone_s * (1.0 - point.io_ratio) / point.io_ratio * 1000.0).round() as u64;
        let mut io_seconds = vec![0.0; Strategy::ALL.len()];
        let mut makespan_seconds = vec![0.0; Strategy::ALL.len()];
        let mut tiers = vec![[0u32; 3]; Strategy::ALL.len()];
        for turn in 0..Strategy::ALL.len() {
            let which = (index + turn) % Strategy::ALL.len();
            let strategy = Strategy::ALL[which];
            run_index += 1;
            let mut delays = Vec::new();
            for _ in 0..point.apps {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                delays.push(seed % (compute_ms + (alone_s * 1000.0) as u64).max(1));
            }
            let run = Run { point, strategy, run_index, compute_ms, delays };
            let results = run_applications(args, binary, cluster, tiers_at, &run)?;
            let apps = results.len() as f64;
            io_seconds[which] =
                results.iter().map(|r| r.phase_seconds.iter().sum::<f64>()).sum::<f64>() / apps;
            makespan_seconds[which] =
                results.iter().map(|r| r.makespan_seconds).fold(0.0, f64::max);
            for tier in results.iter().flat_map(|r| r.tiers.iter()) {
                tiers[which][Tier::ALL.iter().position(|t| t == tier).unwrap_or(0)] += 1;
            }
            if !args.json {
                eprintln!(
                    "  {:<9} apps {} steps {:>2} r {:.1}  {:<18} avg I/O {:>7.3} s",
                    point.sweep,
                    point.apps,
                    point.steps,
                    point.io_ratio,
                    strategy.name(),
                    io_seconds[which]
                );
            }
        }
        rows.push(Row { point, io_seconds, makespan_seconds, tiers });
    }
    drop(tiers_up);
    Ok(rows)
}

/// Where the applications find the tiers.
struct TierAddresses {
    servers: String,
    manager: String,
    pfs: PathBuf,
}

/// One strategy's run at one point.
struct Run {
    point: Point,
    strategy: Strategy,
    run_index: u64,
    compute_ms: u64,
    /// Each application's start delay.
    delays: Vec<u64>,
}

/// Starts the run's applications on hosts 3 and 4 and collects their reports.
fn run_applications(
    args: &Args,
    binary: &std::path::Path,
    cluster: &spillway_harness::Cluster,
    tiers: &TierAddresses,
    run: &Run,
) -> anyhow::Result<Vec<AppResult>> {
    let mut children = Vec::new();
    for (app, delay) in run.delays.iter().enumerate() {
        let host = cluster.host(2 + app % 2);
        let mut command = host.command(binary);
        command
            .env("SPILLWAY_MANAGER_AUTH", "munge")
            .env("RUST_LOG", "warn")
            .args(["bench", "ias-app", "--servers", &tiers.servers, "--manager", &tiers.manager])
            .args(["--job", &format!("run{}-app{app}", run.run_index)])
            .args(["--strategy", run.strategy.name(), "--steps", &run.point.steps.to_string()])
            .args(["--phase-bytes", &args.phase_bytes.to_string()])
            .args(["--compute-ms", &run.compute_ms.to_string()])
            .args(["--start-delay-ms", &delay.to_string()])
            .arg("--node-local")
            .arg(host.ssd_dir().join("node-local"))
            .arg("--pfs")
            .arg(&tiers.pfs)
            .args(["--epoch-base", &((run.run_index * 100 + app as u64) * 1000).to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        children.push(command.spawn().context("starting an application")?);
    }
    let mut results = Vec::new();
    for child in children {
        let output = child.wait_with_output()?;
        anyhow::ensure!(
            output.status.success(),
            "{} with {} applications: an application failed: {}",
            run.strategy.name(),
            run.point.apps,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        let result: AppResult = serde_json::from_slice(&output.stdout).with_context(|| {
            format!("an application's report: {}", String::from_utf8_lossy(&output.stdout))
        })?;
        results.push(result);
    }
    Ok(results)
}

fn strategy_index(strategy: Strategy) -> usize {
    Strategy::ALL.iter().position(|s| *s == strategy).expect("a strategy")
}

/// Every point, per strategy: average I/O time, makespan, phases per tier.
fn table_json(rows: &[Row]) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|row| {
            let per: serde_json::Map<String, serde_json::Value> = Strategy::ALL
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let value = serde_json::json!({
                        "avg_io_seconds": row.io_seconds[i],
                        "makespan_seconds": row.makespan_seconds[i],
                        "phases_per_tier": {
                            "node-local": row.tiers[i][0],
                            "burst-buffer": row.tiers[i][1],
                            "pfs": row.tiers[i][2],
                        },
                    });
                    (s.name().to_string(), value)
                })
                .collect();
            serde_json::json!({ "point": row.point, "strategies": per })
        })
        .collect()
}

fn report(args: &Args, rows: &[Row]) -> anyhow::Result<()> {
    let ratio = |num: Strategy, den: Strategy| {
        median(
            rows.iter()
                .map(|r| r.io_seconds[strategy_index(num)] / r.io_seconds[strategy_index(den)]),
        )
    };
    let ia_over_hp = ratio(Strategy::InterferenceAware, Strategy::HighPriority);
    let ia_over_baseline = ratio(Strategy::InterferenceAware, Strategy::Baseline);
    let measured_over_ia = ratio(Strategy::Measured, Strategy::InterferenceAware);
    let table = table_json(rows);
    if args.json {
        let out = serde_json::json!({
            "benchmark": "ias",
            "setup": format!(
                "4-host namespace cluster: burst buffer server + manager on host1 ({} Mbit/s), MooseFS PFS on host2 ({} Mbit/s), applications on hosts 3-4 with node-local directories; {} per phase; pfs_writers_max {}",
                args.bb_mbit, args.pfs_mbit, spillway_types::format_bytes(args.phase_bytes), args.pfs_writers_max
            ),
            "table": table,
            "ratios": {
                "ia_over_hp_io_time": ia_over_hp,
                "ia_over_baseline_io_time": ia_over_baseline,
                "measured_over_ia_io_time": measured_over_ia,
            },
            "targets": { "ia_over_hp_io_time": 1.0, "measured_over_ia_io_time": 1.0 },
            "ratio_basis": "medians over the sweep's points of per-point ratios of the applications' average I/O time (sum of phase times, phase start to commit return)",
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "average I/O time per application (s); burst buffer {} Mbit/s, PFS {} Mbit/s, {} per phase",
        args.bb_mbit,
        args.pfs_mbit,
        spillway_types::format_bytes(args.phase_bytes)
    );
    println!(
        "  {:<9} {:>4} {:>5} {:>5}  {:>9} {:>9} {:>9} {:>9}",
        "sweep", "apps", "steps", "r", "baseline", "hp", "ia", "measured"
    );
    for row in rows {
        let p = row.point;
        println!(
            "  {:<9} {:>4} {:>5} {:>5.1}  {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            p.sweep,
            p.apps,
            p.steps,
            p.io_ratio,
            row.io_seconds[0],
            row.io_seconds[1],
            row.io_seconds[2],
            row.io_seconds[3]
        );
    }
    println!("  ia_over_hp_io_time        {ia_over_hp:.2} (target <= 1.0)");
    println!("  ia_over_baseline_io_time  {ia_over_baseline:.2}");
    println!("  measured_over_ia_io_time  {measured_over_ia:.2} (target <= 1.0)");
    Ok(())
}

/// One application: phases through a tiering client, drains of what lands on the burst buffer
/// through the manager's scheduler, and at the end every byte checked on the PFS.
pub fn run_app(args: AppArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let strategy =
        Strategy::parse(&args.strategy).with_context(|| format!("--strategy {}", args.strategy))?;
    let endpoints = args
        .servers
        .split(',')
        .map(|s| s.trim().parse::<Endpoint>().map_err(|e| anyhow::anyhow!("--servers {s:?}: {e}")))
        .collect::<anyhow::Result<Vec<Endpoint>>>()?;
    let api = spillway_manager::ApiClient::new(&args.manager)?;
    let tiering = TieringOptions {
        strategy: Some(strategy),
        pfs_directory: Some(args.pfs.clone()),
        node_local: Some(NodeLocalOptions {
            directory: args.node_local.clone(),
            capacity_bytes: (args.phase_bytes * u64::from(args.steps) * 2).max(64 << 20),
            bandwidth_bytes_per_s: 0,
        }),
        service: Some(Arc::new(spillway_manager::tiering::ManagerTiers::new(api.clone()))),
        begin_wait_max: Duration::from_secs(2),
        ..TieringOptions::new(args.job.clone())
    };
    let options = |tiering| ClientOptions {
        durability: Durability::Memory,
        client_name: format!("bench ias {}", args.job),
        tiering,
        ..ClientOptions::default()
    };
    let mut client = Client::connect(&endpoints, options(Some(tiering)))?;
    // Drains of burst buffer epochs, one at a time, each under a PFS slot.
    let (to_drain, drains) = mpsc::channel::<EpochId>();
    let drainer = start_drainer(&endpoints, &api, &args, options(None), drains);
    std::thread::sleep(Duration::from_millis(args.start_delay_ms));
    let data = crate::replication::block(args.epoch_base, args.phase_bytes as usize);
    let mut phase_seconds = Vec::new();
    let mut tiers = Vec::new();
    let mut node_local = Vec::new();
    for step in 0..u64::from(args.steps) {
        std::thread::sleep(Duration::from_millis(args.compute_ms));
        let epoch = EpochId(args.epoch_base + step);
        let phase = Instant::now();
        let mut file = client.create_file(epoch, "ckpt")?;
        for (i, piece) in data.chunks(1 << 20).enumerate() {
            client.write(&mut file, (i as u64) << 20, piece)?;
        }
        client.commit_epoch(epoch)?;
        phase_seconds.push(phase.elapsed().as_secs_f64());
        tiers.push(file.tier());
        match file.tier() {
            Tier::BurstBuffer => to_drain.send(epoch)?,
            Tier::NodeLocal => node_local.push(epoch),
            Tier::Pfs => {}
        }
    }
    // Node-local epochs go to the burst buffer, then drain like the others.
    client.settle_tiers()?;
    for epoch in node_local {
        to_drain.send(epoch)?;
    }
    drop(to_drain);
    drainer.join().map_err(|_| anyhow::anyhow!("the drain thread panicked"))??;
    drop(client);
    verify_and_remove(&args, &endpoints, &data, options(None))?;
    let result =
        AppResult { phase_seconds, tiers, makespan_seconds: started.elapsed().as_secs_f64() };
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

/// The application's drain thread: every epoch it is sent, drained under a PFS slot.
fn start_drainer(
    endpoints: &[Endpoint],
    api: &spillway_manager::ApiClient,
    args: &AppArgs,
    options: ClientOptions,
    drains: mpsc::Receiver<EpochId>,
) -> std::thread::JoinHandle<anyhow::Result<()>> {
    let (endpoints, api, label, bytes) =
        (endpoints.to_vec(), api.clone(), args.job.clone(), args.phase_bytes);
    std::thread::spawn(move || -> anyhow::Result<()> {
        let mut bb = Client::connect(&endpoints, options)?;
        for epoch in drains {
            let mut slot = spillway_manager::tiering::DrainSlot::acquire(
                &api,
                &label,
                0,
                Duration::from_secs(600),
            )?;
            bb.request_drain(epoch, 1)?;
            wait_drained(&mut bb, epoch)?;
            slot.bytes = bytes;
        }
        Ok(())
    })
}

/// Every phase's file is on the PFS, whole and right; then it goes (the PFS is small).
fn verify_and_remove(
    args: &AppArgs,
    endpoints: &[Endpoint],
    data: &[u8],
    options: ClientOptions,
) -> anyhow::Result<()> {
    let mut bb = Client::connect(endpoints, options)?;
    for step in 0..u64::from(args.steps) {
        let epoch = EpochId(args.epoch_base + step);
        let path = args.pfs.join(format!("epoch-{}", epoch.0)).join("ckpt");
        let back = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        anyhow::ensure!(back == data, "{} differs from what phase {step} wrote", path.display());
        let _ = bb.delete_epoch(epoch);
        std::fs::remove_dir_all(path.parent().expect("epoch directory"))?;
    }
    Ok(())
}

fn wait_drained(client: &mut Client, epoch: EpochId) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let status = client.drain_status()?;
        let infos: Vec<_> =
            status.iter().flat_map(|(_, list)| list.iter().filter(|d| d.epoch == epoch)).collect();
        if !infos.is_empty() && infos.iter().all(|d| d.state == DrainState::Drained) {
            return Ok(());
        }
        if let Some(d) = infos.iter().find(|d| d.state == DrainState::Quarantined) {
            anyhow::bail!("drain of epoch {} quarantined: {}", epoch.0, d.last_error);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "drain of epoch {} did not finish in 600 s",
            epoch.0
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
