//! `spillway bench replication`: checkpoint time at `replicated` durability with 2 copies
//! against `ssd` and `memory` with 1, in the same run (issue 16).
//!
//! Three servers in three failure domains: with `--cluster` (root), a namespace cluster of 4
//! hosts (scripts/cluster, docs/design/cluster.md) with a server on each of hosts 1-3 (munge
//! authentication, failure domain = host name) and the benchmark itself re-run on host 4 with
//! `--servers`; with `--servers A,B,C`, those servers; otherwise three `spillway serve` processes
//! on loopback TCP with `--failure-domain host0..2` (one machine: the copies share its CPUs and
//! memory bus, which the cluster's hosts do too, but not its network stack). C client
//! threads each write their own file (N-N, striped over the servers, `--transfer-bytes` per
//! write), flush, meet at a barrier and commit; the time is from the first write to the last
//! commit's return. Each round measures the three modes in a rotated order and deletes each
//! checkpoint after it; the ratios are the medians of the per-round ratios:
//! `ssd_over_replicated` = ssd time / replicated time (target ≥ 1.0) and
//! `replicated_vs_memory` = replicated bandwidth / memory bandwidth (target ≥ 0.45: the second
//! copy doubles the bytes on the wire).

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use anyhow::Context;
use spillway_client::{Client, ClientOptions, Placement};
use spillway_proto::{Durability, Endpoint};
use spillway_types::EpochId;

use crate::stats::{gigabytes_per_second, median};

#[derive(clap::Args)]
pub struct Args {
    /// Client threads, each writing its own file.
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// Size of the whole checkpoint (all clients' files).
    #[arg(long, default_value = "512M", value_parser = spillway_types::parse_size)]
    total_bytes: u64,
    /// Bytes per write.
    #[arg(long, default_value = "1M", value_parser = spillway_types::parse_size)]
    transfer_bytes: u64,
    /// Rounds; each measures every mode once (in a rotated order). Seven, because one mode's
    /// checkpoint takes well under a second here and single rounds swing by a third.
    #[arg(long, default_value_t = 7)]
    rounds: u32,
    /// Directory for the servers' SSD logs (default: a temporary directory under /var/tmp).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// One JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Measure against these three servers (comma-separated `host:port` or socket paths, in
    /// distinct failure domains) instead of starting them.
    #[arg(long, conflicts_with = "cluster")]
    servers: Option<String>,
    /// Start a namespace cluster of 4 hosts: servers on hosts 1-3, the clients on host 4 (root).
    #[arg(long)]
    cluster: bool,
}

/// Servers, each its own failure domain.
const SERVERS: usize = 3;

/// One way of checkpointing.
#[derive(Clone, Copy)]
struct Mode {
    name: &'static str,
    replicas: u32,
    durability: Durability,
}

const MODES: [Mode; 3] = [
    Mode { name: "replicated", replicas: 2, durability: Durability::Replicated },
    Mode { name: "ssd", replicas: 1, durability: Durability::Ssd },
    Mode { name: "memory", replicas: 1, durability: Durability::Memory },
];

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.clients > 0 && args.rounds > 0, "--clients and --rounds must be > 0");
    anyhow::ensure!(args.transfer_bytes > 0, "--transfer-bytes must be > 0");
    let per_client = args.total_bytes / args.clients as u64;
    anyhow::ensure!(per_client > 0, "--total-bytes must give every client at least a byte");
    if args.cluster {
        return run_on_cluster(&args);
    }
    if let Some(list) = &args.servers {
        let endpoints = list
            .split(',')
            .map(|s| {
                s.trim().parse::<Endpoint>().map_err(|e| anyhow::anyhow!("--servers {s:?}: {e}"))
            })
            .collect::<anyhow::Result<Vec<Endpoint>>>()?;
        anyhow::ensure!(endpoints.len() == SERVERS, "--servers needs {SERVERS} servers");
        let seconds = measure(&args, &endpoints)?;
        return report(&args, &setup(&endpoints)?, &seconds);
    }
    let temporary;
    let work = match &args.dir {
        Some(dir) => dir.clone(),
        None => {
            temporary = tempfile::Builder::new()
                .prefix("spillway-bench-replication")
                .tempdir_in("/var/tmp")?;
            temporary.path().to_path_buf()
        }
    };
    std::fs::create_dir_all(&work)?;
    // Each server holds 2/3 of a replicated checkpoint; records carry a 64-byte header each.
    let share = args.total_bytes * 2 / SERVERS as u64;
    let dram = crate::dram_bytes_holding(share + share / args.transfer_bytes * 64, 64 << 20);
    let mut servers = Vec::new();
    for i in 0..SERVERS {
        let ssd = work.join(format!("ssd-{i}"));
        let server_args: Vec<String> = vec![
            "--failure-domain".into(),
            format!("host{i}"),
            "--ssd-bytes".into(),
            (share * 3 + (1 << 30)).to_string(),
        ];
        servers.push(crate::start_server(&work, &format!("s{i}"), &ssd, dram, &server_args)?);
    }
    let endpoints: Vec<Endpoint> = servers.iter().map(|s| s.endpoint().clone()).collect();
    let seconds = measure(&args, &endpoints)?;
    let setup = setup(&endpoints)?;
    drop(servers);
    report(&args, &setup, &seconds)
}

/// Where the servers and clients run, for the report.
fn setup(endpoints: &[Endpoint]) -> anyhow::Result<String> {
    let client = Client::connect(endpoints, ClientOptions::default())?;
    let domains: Vec<String> =
        (0..endpoints.len()).map(|i| client.server_failure_domain(i).to_string()).collect();
    let here = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    Ok(format!(
        "servers {} in failure domains {}; client threads on host {}",
        endpoints.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        domains.join(", "),
        here.trim()
    ))
}

/// Every round's seconds per mode (in [`MODES`] order).
fn measure(args: &Args, endpoints: &[Endpoint]) -> anyhow::Result<Vec<Vec<f64>>> {
    let mut seconds: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    let mut epoch = 0u64;
    for round in 0..args.rounds as usize {
        for step in 0..MODES.len() {
            let index = (round + step) % MODES.len();
            epoch += 1;
            let took = checkpoint(args, endpoints, EpochId(epoch), MODES[index])
                .with_context(|| format!("round {round}, {}", MODES[index].name))?;
            seconds[index].push(took);
        }
    }
    Ok(seconds)
}

/// A 4-host namespace cluster: a server on each of hosts 1-3, this benchmark with `--servers`
/// on host 4; its report is passed through.
fn run_on_cluster(args: &Args) -> anyhow::Result<()> {
    let binary = std::env::current_exe()?;
    let cluster = spillway_harness::Cluster::start(4)?;
    let share = args.total_bytes * 2 / SERVERS as u64;
    let dram = crate::dram_bytes_holding(share + share / args.transfer_bytes * 64, 64 << 20);
    let mut servers = Vec::new();
    for i in 0..SERVERS {
        let name = format!("s{}", i + 1);
        let server = spillway_harness::ServerBuilder::new(&binary, cluster.dir(), &name)
            .in_host(cluster.host(i))
            .dram_bytes(&dram.to_string())
            .args(["--ssd-bytes".to_string(), (share * 3 + (1 << 30)).to_string()])
            .rust_log("warn")
            .graceful_drop(std::time::Duration::from_secs(30))
            .spawn()?;
        servers.push(server);
    }
    let list: Vec<String> = servers.iter().map(|s| s.endpoint().to_string()).collect();
    let mut command = cluster.host(SERVERS).command(&binary);
    command.args(["bench", "replication", "--servers", &list.join(",")]);
    command.args(["--clients", &args.clients.to_string(), "--rounds", &args.rounds.to_string()]);
    command.args(["--total-bytes", &args.total_bytes.to_string()]);
    command.args(["--transfer-bytes", &args.transfer_bytes.to_string()]);
    if args.json {
        command.arg("--json");
    }
    let output = command.output().context("running the clients on host 4")?;
    drop(servers);
    cluster.down()?;
    anyhow::ensure!(
        output.status.success(),
        "the clients on host 4 failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    print!("{}", String::from_utf8_lossy(&output.stdout));
    Ok(())
}

/// C threads write their files, flush, meet at a barrier and commit; seconds from the first
/// write to the last commit. The checkpoint is then checked (sizes, a sample of bytes) and
/// deleted.
fn checkpoint(
    args: &Args,
    endpoints: &[Endpoint],
    epoch: EpochId,
    mode: Mode,
) -> anyhow::Result<f64> {
    let clients = args.clients as usize;
    let start = Arc::new(Barrier::new(clients + 1));
    let written = Arc::new(Barrier::new(clients));
    let mut threads = Vec::new();
    for rank in 0..clients {
        let (endpoints, start, written) = (endpoints.to_vec(), start.clone(), written.clone());
        let (bytes, transfer) = (args.total_bytes / clients as u64, args.transfer_bytes);
        threads.push(std::thread::spawn(move || -> anyhow::Result<()> {
            let mut client = Client::connect(&endpoints, client_options(mode, rank as u32))?;
            let mut file = client.create_file(epoch, &format!("ckpt/rank{rank}"))?;
            let buffer = block(rank as u64, transfer as usize);
            start.wait();
            let mut at = 0;
            while at < bytes {
                let length = transfer.min(bytes - at) as usize;
                client.write(&mut file, at, &buffer[..length])?;
                at += length as u64;
            }
            client.flush()?;
            written.wait(); // the end of the write phase (an MPI barrier)
            client.commit_epoch(epoch)?;
            Ok(())
        }));
    }
    start.wait();
    let started = Instant::now();
    let mut first_error = None;
    for thread in threads {
        let result = thread.join().map_err(|_| anyhow::anyhow!("client thread panicked"))?;
        if let Err(error) = result {
            first_error.get_or_insert(error);
        }
    }
    let took = started.elapsed().as_secs_f64();
    if let Some(error) = first_error {
        return Err(error);
    }
    verify_and_delete(args, endpoints, epoch, mode)?;
    Ok(took)
}

fn client_options(mode: Mode, rank: u32) -> ClientOptions {
    ClientOptions {
        placement: Placement::Striped { stripe_unit_bytes: 1 << 20, stripe_count: u32::MAX },
        replicas: mode.replicas,
        durability: mode.durability,
        window: 64,
        client_name: format!("bench replication rank {rank}"),
        ..ClientOptions::default()
    }
}

/// Deterministic bytes of one client's writes.
pub(crate) fn block(seed: u64, length: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(length + 8);
    while out.len() < length {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(length);
    out
}

/// Every file has its size and its first and last writes read back right; then the epoch goes.
fn verify_and_delete(
    args: &Args,
    endpoints: &[Endpoint],
    epoch: EpochId,
    mode: Mode,
) -> anyhow::Result<()> {
    let mut client = Client::connect(endpoints, client_options(mode, 0))?;
    let bytes = args.total_bytes / args.clients as u64;
    for rank in 0..args.clients as u64 {
        let file = client.open_file(epoch, &format!("ckpt/rank{rank}"))?;
        anyhow::ensure!(client.file_size(&file)? == bytes, "{} rank {rank}: wrong size", mode.name);
        let expected = block(rank, args.transfer_bytes.min(bytes) as usize);
        let last = (bytes - 1) / args.transfer_bytes * args.transfer_bytes;
        for at in [0, last] {
            let mut back = vec![0u8; (bytes - at).min(args.transfer_bytes) as usize];
            client.read(&file, at, &mut back)?;
            anyhow::ensure!(
                back == expected[..back.len()],
                "{} rank {rank}: bytes at {at} differ",
                mode.name
            );
        }
    }
    client.delete_epoch(epoch)?;
    Ok(())
}

/// The medians, bandwidths and ratios, as a table or JSON.
fn report(args: &Args, setup: &str, seconds: &[Vec<f64>]) -> anyhow::Result<()> {
    let bytes = args.total_bytes / args.clients as u64 * args.clients as u64;
    let per_round = |f: &dyn Fn(usize) -> f64| median((0..args.rounds as usize).map(f));
    let ssd_over_replicated = per_round(&|r| seconds[1][r] / seconds[0][r]);
    let replicated_vs_memory = per_round(&|r| seconds[2][r] / seconds[0][r]);
    let modes: Vec<serde_json::Value> = MODES
        .iter()
        .zip(seconds)
        .map(|(mode, list)| {
            let m = median(list.iter().copied());
            serde_json::json!({
                "mode": mode.name,
                "replicas": mode.replicas,
                "seconds": list,
                "median_seconds": m,
                "gb_per_s": gigabytes_per_second(bytes, m),
            })
        })
        .collect();
    if args.json {
        let out = serde_json::json!({
            "benchmark": "replication",
            "setup": setup,
            "clients": args.clients,
            "total_bytes": bytes,
            "transfer_bytes": args.transfer_bytes,
            "rounds": args.rounds,
            "modes": modes,
            "ratios": {
                "ssd_over_replicated": ssd_over_replicated,
                "replicated_vs_memory": replicated_vs_memory,
            },
            "targets": { "ssd_over_replicated": 1.0, "replicated_vs_memory": 0.45 },
            "ratio_basis": "medians of per-round ratios of checkpoint times (first write to last commit); replicated_vs_memory is bandwidth, i.e. memory time / replicated time",
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "checkpoint of {} by {} clients, {} rounds; {setup}",
        spillway_types::format_bytes(bytes),
        args.clients,
        args.rounds
    );
    for mode in &modes {
        println!(
            "  {:<10} k={}  median {:>7.3} s  {:>6.2} GB/s",
            mode["mode"].as_str().unwrap_or(""),
            mode["replicas"],
            mode["median_seconds"].as_f64().unwrap_or(0.0),
            mode["gb_per_s"].as_f64().unwrap_or(0.0)
        );
    }
    println!("  ssd_over_replicated  {ssd_over_replicated:.2} (target >= 1.0)");
    println!("  replicated_vs_memory {replicated_vs_memory:.2} (target >= 0.45)");
    Ok(())
}
