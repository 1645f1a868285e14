//! `spillway pool …`, `spillway server …` and `spillway quota …`: what root or the admin group
//! manages (the manager checks; these commands only ask).

use spillway_manager::{AddServer, CreatePool, Pool, Quota, Server, ServerRemoval, SetQuota};
use spillway_types::parse_size;

use super::manager_api::{print_json, print_table, ManagerFlags};
use spillway_types::format_bytes as bytes;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: PoolCommand,
}

#[derive(clap::Subcommand)]
enum PoolCommand {
    /// Create a pool (root or admin group).
    Create {
        name: String,
        /// Allocation unit reported to Slurm (sizes: 64MiB, 1G = GiB, 10GB = 10^10).
        #[arg(long, value_parser = parse_size)]
        granularity: u64,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Delete an empty pool (root or admin group): remove its servers first.
    Delete {
        name: String,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// List pools with capacity, use and streams.
    List {
        #[command(flatten)]
        flags: ManagerFlags,
    },
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        PoolCommand::Create { name, granularity, flags } => {
            let pool: Pool = flags
                .client()?
                .post("/v1/pools", &CreatePool { name, granularity_bytes: granularity })?;
            if flags.json {
                return print_json(&pool);
            }
            print_pools(&[pool]);
        }
        PoolCommand::Delete { name, flags } => {
            if name.contains('/') {
                anyhow::bail!("no pool named {name:?} (pool names have no '/')");
            }
            let deleted: serde_json::Value =
                flags.client()?.delete(&format!("/v1/pools/{name}"))?;
            if flags.json {
                return print_json(&deleted);
            }
            println!("pool {name} deleted");
        }
        PoolCommand::List { flags } => {
            let pools: Vec<Pool> = flags.client()?.get("/v1/pools")?;
            if flags.json {
                return print_json(&pools);
            }
            print_pools(&pools);
        }
    }
    Ok(())
}

pub fn print_pools(pools: &[Pool]) {
    let rows: Vec<Vec<String>> = pools
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                bytes(p.granularity_bytes),
                format!("{}/{}", p.servers_healthy, p.servers),
                bytes(p.capacity_bytes),
                bytes(p.used_bytes),
                bytes(p.free_bytes),
                p.reservations.to_string(),
                p.keys_per_stream.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(","),
            ]
        })
        .collect();
    print_table(
        &[
            "POOL",
            "GRANULARITY",
            "UP/SERVERS",
            "CAPACITY",
            "USED",
            "FREE",
            "RESERVATIONS",
            "KEYS/STREAM",
        ],
        &rows,
    );
}

#[derive(clap::Args)]
pub struct ServerArgs {
    #[command(subcommand)]
    command: ServerCommand,
}

#[derive(clap::Subcommand)]
enum ServerCommand {
    /// Register a burst buffer server (root or admin group).
    Add {
        /// The server: HOST:PORT (a host name or an IP; beyond loopback the manager needs
        /// manager.auth = munge) or unix:///path. It must be running: the manager asks it who
        /// it is and how big its store is.
        address: String,
        #[arg(long)]
        pool: String,
        /// Capacity to grant from it (default: its whole store, store.ssd_bytes_max; never more).
        #[arg(long, value_parser = parse_size)]
        capacity: Option<u64>,
        /// The server's drain directory (its --pfs), for stage-out of drained epochs.
        #[arg(long)]
        pfs: Option<String>,
        /// Then measure its peaks as `spillway server measure` does (seconds of load on it).
        #[arg(long)]
        measure: bool,
        #[command(flatten)]
        measure_flags: MeasureFlags,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Measure servers' peaks (bandwidth, IOPS, metadata operations per second) with `spillway
    /// bench peaks` against each server alone, one after the other, and record them in the
    /// manager, which divides them among reservations that ask for performance targets (root or
    /// admin group). Each server gets a few seconds of load: measure it while it is idle.
    Measure {
        /// Servers by id or address (as `spillway server list` shows); none: every server of
        /// --pool, or every server that is up.
        servers: Vec<String>,
        #[arg(long)]
        pool: Option<String>,
        #[command(flatten)]
        measure_flags: MeasureFlags,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Take a server out of service (root or admin group): it gets no new fragments at once and
    /// is removed when no reservation holds data on it and its drains are done (running jobs'
    /// data is not moved; their reservations are named). Asking again tells where it stands.
    Remove {
        /// The server's id or address, as `spillway server list` shows it.
        server: String,
        /// Wait until it is removed, printing what it waits for.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds (exit status 1).
        #[arg(long, value_name = "SECONDS", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..=7 * 86_400))]
        timeout_s: u64,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// List servers with health, host (failure domain) and use.
    List {
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Declare a server lost for good (root or admin group): its data is gone, it gets nothing
    /// new and never comes back; reservations on it show `degraded`.
    Lost {
        /// The server's id or address, as `spillway server list` shows it.
        server: String,
        #[command(flatten)]
        flags: ManagerFlags,
    },
}

pub fn run_server(args: ServerArgs) -> anyhow::Result<()> {
    match args.command {
        ServerCommand::Add { address, pool, capacity, pfs, measure, measure_flags, flags } => {
            let client = flags.client()?;
            let mut server: Server = client.post(
                "/v1/servers",
                &AddServer { address, pool, capacity_bytes: capacity.unwrap_or(0), pfs_dir: pfs },
            )?;
            if measure {
                server = measure_server(&client, &server, &measure_flags)?;
            }
            if flags.json {
                return print_json(&server);
            }
            print_servers(&[server]);
        }
        ServerCommand::List { flags } => {
            let servers: Vec<Server> = flags.client()?.get("/v1/servers")?;
            if flags.json {
                return print_json(&servers);
            }
            print_servers(&servers);
        }
        ServerCommand::Lost { server, flags } => {
            let client = flags.client()?;
            let id = server_id(&client, &server)?;
            let lost: Server = client.post(&format!("/v1/servers/{id}/lost"), &())?;
            if flags.json {
                return print_json(&lost);
            }
            print_servers(&[lost]);
        }
        ServerCommand::Remove { server, wait, timeout_s, flags } => {
            remove_server(&server, wait, timeout_s, &flags)?;
        }
        ServerCommand::Measure { servers, pool, measure_flags, flags } => {
            let client = flags.client()?;
            // Refused before loading any server, not after.
            let whoami: serde_json::Value = client.get("/v1/whoami")?;
            if whoami["admin"] != true {
                anyhow::bail!(
                    "uid {} may not record server peaks (root or the admin group only)",
                    whoami["uid"]
                );
            }
            let chosen = servers_to_measure(&client, &servers, pool.as_deref())?;
            let mut measured = Vec::with_capacity(chosen.len());
            for server in &chosen {
                measured.push(measure_server(&client, server, &measure_flags)?);
            }
            if flags.json {
                return print_json(&measured);
            }
            print_servers(&measured);
        }
    }
    Ok(())
}

/// How `server measure` loads each server (a short `spillway bench peaks`).
#[derive(clap::Args)]
struct MeasureFlags {
    /// Highest concurrency level: 1, 2, 4, … threads up to this.
    #[arg(long, default_value_t = 4)]
    threads_max: usize,
    /// Upper bound on each phase of each level, seconds.
    #[arg(long, default_value_t = 1.0)]
    phase_seconds: f64,
    /// Bandwidth phase: MiB each thread writes then reads.
    #[arg(long, default_value_t = 64)]
    file_mib_per_thread: u64,
}

/// The servers `server measure` names (all that are up, or those of `pool`, when none).
fn servers_to_measure(
    client: &super::manager_api::Api,
    keys: &[String],
    pool: Option<&str>,
) -> anyhow::Result<Vec<Server>> {
    let servers: Vec<Server> = client.get("/v1/servers")?;
    if keys.is_empty() {
        let chosen: Vec<Server> = servers
            .into_iter()
            .filter(|s| pool.is_none_or(|p| s.pool == p))
            .filter(|s| s.healthy && s.lost_unix_s.is_none() && s.retiring_unix_s.is_none())
            .collect();
        if chosen.is_empty() {
            anyhow::bail!(
                "no server that is up{} to measure",
                pool.map_or(String::new(), |p| format!(" in pool {p}"))
            );
        }
        return Ok(chosen);
    }
    keys.iter()
        .map(|key| {
            let address = key.strip_prefix("tcp://").unwrap_or(key);
            servers
                .iter()
                .find(|s| s.address == address || key.parse::<u64>() == Ok(s.id))
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("no server {key:?} (see `spillway server list`)"))
        })
        .collect()
}

/// Measures `server` alone with `spillway bench peaks` and records the peaks in the manager.
fn measure_server(
    client: &super::manager_api::Api,
    server: &Server,
    how: &MeasureFlags,
) -> anyhow::Result<Server> {
    let endpoint: spillway_proto::Endpoint =
        server.address.parse().map_err(|e| anyhow::anyhow!("server {}: {e}", server.address))?;
    let args = spillway_bench::peaks::Args {
        target: None,
        servers: vec![endpoint],
        commit_durability: spillway_bench::peaks::CommitDurability::Server,
        replicas: 1,
        threads_max: how.threads_max,
        file_mib_per_thread: how.file_mib_per_thread,
        transfer_kib: 8192,
        small_transfer_bytes: 4096,
        metadata_files_per_thread: 2000,
        phase_seconds: how.phase_seconds,
        sync_small_writes: false,
        json: false,
        output: None,
    };
    eprintln!(
        "measuring {} (spillway bench peaks, up to {} threads)…",
        server.address, how.threads_max
    );
    let (levels, peaks) = spillway_bench::peaks::measure(&args)
        .map_err(|e| anyhow::anyhow!("measuring {}: {e:#}", server.address))?;
    let whole = |rate: f64| (rate.round() as u64).max(1);
    let conditions = format!(
        "spillway bench peaks --servers {} --threads-max {} --phase-seconds {} \
         --file-mib-per-thread {} (8 MiB transfers, 4 KiB small, 2000 files per thread), \
         from host {}",
        server.address,
        how.threads_max,
        how.phase_seconds,
        how.file_mib_per_thread,
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim(),
    );
    let per_mode = spillway_bench::peaks::namespace_peaks_of(&levels);
    let set = spillway_manager::SetServerPeaks {
        bandwidth_bytes_per_s: whole(peaks.bandwidth_bytes_per_second),
        iops: whole(peaks.iops),
        metadata_ops_per_s: whole(peaks.metadata_ops_per_second),
        conditions,
        metadata_striped_ops_per_s: per_mode.map(|(striped, _)| whole(striped)),
        metadata_private_ops_per_s: per_mode.map(|(_, private)| whole(private)),
    };
    client.put(&format!("/v1/servers/{}/peaks", server.id), &set)
}

/// The id of a server given by id or address (addresses may hold '/': the API takes the id);
/// `tcp://HOST:PORT` names the server stored as `HOST:PORT`.
fn server_id(client: &super::manager_api::Api, server: &str) -> anyhow::Result<u64> {
    let servers: Vec<Server> = client.get("/v1/servers")?;
    let address = server.strip_prefix("tcp://").unwrap_or(server);
    servers
        .iter()
        .find(|s| s.address == address || server.parse::<u64>() == Ok(s.id))
        .map(|s| s.id)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no server {server:?} (give its id or address, as `spillway server list` shows)"
            )
        })
}

/// `server remove [--wait]`: asks again every few seconds until removed, printing what it waits
/// for whenever that changes.
fn remove_server(
    server: &str,
    wait: bool,
    timeout_s: u64,
    flags: &ManagerFlags,
) -> anyhow::Result<()> {
    const POLL: std::time::Duration = std::time::Duration::from_secs(2);
    let client = flags.client()?;
    let id = server_id(&client, server)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout_s);
    let mut shown: Option<Vec<String>> = None;
    let path = format!("/v1/servers/{id}/remove");
    let mut first = true;
    loop {
        let removal: ServerRemoval = match client.0.post(&path, &()) {
            Ok(removal) => removal,
            // Retiring before, gone now: the heartbeat finished the removal between two asks.
            Err(error) if !first && error.kind() == Some("not_found") => {
                if flags.json {
                    return print_json(&serde_json::json!({ "id": id, "removed": true }));
                }
                println!("server {server} removed");
                return Ok(());
            }
            Err(error) => return Err(super::manager_api::flat(error)),
        };
        first = false;
        if flags.json && (removal.removed || !wait) {
            return print_json(&removal);
        }
        let address = &removal.server.address;
        if removal.removed {
            println!("server {address} removed");
            return Ok(());
        }
        if shown.as_ref() != Some(&removal.waiting_for) {
            if !flags.json {
                println!(
                    "server {address} is retiring (no new fragments); its removal waits for: {}",
                    removal.waiting_for.join("; ")
                );
            }
            shown = Some(removal.waiting_for);
        }
        if !wait {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            anyhow::bail!("server {address} was not removed within {timeout_s} s (it stays retiring; run `spillway server remove` again to see where it stands)");
        }
        std::thread::sleep(POLL);
    }
}

/// A server's measured peaks as `reservation show` writes rates.
fn peaks_text(peaks: &spillway_manager::ServerPeaks) -> String {
    let rates = super::reservation::rates_text(&spillway_policy::targets::Rates {
        bandwidth_bytes_per_s: peaks.bandwidth_bytes_per_s,
        iops: peaks.iops,
        metadata_ops_per_s: peaks.metadata_ops_per_s,
    });
    match (peaks.metadata_striped_ops_per_s, peaks.metadata_private_ops_per_s) {
        (Some(striped), Some(private)) => {
            format!("{rates} (namespaces: striped {striped}/s, private {private}/s)")
        }
        _ => rates,
    }
}

pub fn print_servers(servers: &[Server]) {
    let rows: Vec<Vec<String>> = servers
        .iter()
        .map(|s| {
            vec![
                s.address.clone(),
                s.pool.clone(),
                if s.lost_unix_s.is_some() {
                    "LOST".into()
                } else if s.retiring_unix_s.is_some() {
                    "retiring".into()
                } else if s.healthy {
                    "up".into()
                } else {
                    format!("DOWN ({} missed)", s.misses)
                },
                s.failure_domain.clone().unwrap_or_else(|| "-".into()),
                bytes(s.capacity_bytes),
                bytes(s.used_bytes),
                s.drains_in_flight.to_string(),
                s.auth.clone().unwrap_or_else(|| "-".into()),
                s.identity.clone().unwrap_or_else(|| "-".into()),
                s.pfs_dir.clone().unwrap_or_else(|| "-".into()),
                s.peaks.as_ref().map_or_else(|| "-".into(), peaks_text),
                s.promised.as_ref().map_or_else(|| "-".into(), super::reservation::rates_text),
            ]
        })
        .collect();
    // PEAKS: bandwidth, IOPS, metadata operations per second (`spillway server measure`);
    // PROMISED: what active reservations by performance target were promised of them.
    // HOST: the failure domain its heartbeats announce (copies go to distinct hosts).
    // AUTH: how the server authenticates TCP clients (none: only loopback peers are known).
    // ID #INCARNATION: a new id at an address is another (empty) server, a higher incarnation
    // the same one restarted.
    let header = [
        "SERVER",
        "POOL",
        "HEALTH",
        "HOST",
        "CAPACITY",
        "USED",
        "DRAINS",
        "AUTH",
        "ID #INCARNATION",
        "PFS",
        "PEAKS",
        "PROMISED",
    ];
    print_table(&header, &rows);
    // When and how each server's peaks were taken: what a promise by target is worth.
    for s in servers {
        if let Some(peaks) = &s.peaks {
            println!(
                "peaks of {} measured {}: {}",
                s.address,
                spillway_types::format_unix_utc(peaks.measured_unix_s),
                peaks.conditions
            );
        }
    }
}

#[derive(clap::Args)]
pub struct QuotaArgs {
    #[command(subcommand)]
    command: QuotaCommand,
}

#[derive(clap::Subcommand)]
enum QuotaCommand {
    /// Set a user's quota (root or admin group); 0 = unlimited.
    Set {
        uid: u32,
        #[arg(value_parser = parse_size)]
        bytes: u64,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Show quotas (your own; every row for root and admins).
    List {
        #[command(flatten)]
        flags: ManagerFlags,
    },
}

pub fn run_quota(args: QuotaArgs) -> anyhow::Result<()> {
    let (quotas, flags): (Vec<Quota>, ManagerFlags) = match args.command {
        QuotaCommand::Set { uid, bytes, flags } => {
            (vec![flags.client()?.put(&format!("/v1/quotas/{uid}"), &SetQuota { bytes })?], flags)
        }
        QuotaCommand::List { flags } => (flags.client()?.get("/v1/quotas")?, flags),
    };
    if flags.json {
        return print_json(&quotas);
    }
    let rows: Vec<Vec<String>> = quotas
        .iter()
        .map(|q| {
            vec![
                q.uid.to_string(),
                if q.bytes == 0 { "unlimited".into() } else { bytes(q.bytes) },
                bytes(q.used_bytes),
                if q.default { "default".into() } else { "set".into() },
            ]
        })
        .collect();
    print_table(&["UID", "QUOTA", "USED", "SOURCE"], &rows);
    Ok(())
}
