//! `spillway pool …`, `spillway server …` and `spillway quota …`: what root or the admin group
//! manages (the manager checks; these commands only ask).

use spillway_manager::{AddServer, CreatePool, Pool, Quota, Server, SetQuota};
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
        ServerCommand::Add { address, pool, capacity, pfs, flags } => {
            let server: Server = flags.client()?.post(
                "/v1/servers",
                &AddServer { address, pool, capacity_bytes: capacity.unwrap_or(0), pfs_dir: pfs },
            )?;
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
            // Addresses may hold '/' (unix sockets): the API takes the id.
            let servers: Vec<Server> = client.get("/v1/servers")?;
            let Some(id) = servers
                .iter()
                .find(|s| s.address == server || server.parse::<u64>() == Ok(s.id))
                .map(|s| s.id)
            else {
                anyhow::bail!("no server {server:?} (give its id or address, as `spillway server list` shows)");
            };
            let lost: Server = client.post(&format!("/v1/servers/{id}/lost"), &())?;
            if flags.json {
                return print_json(&lost);
            }
            print_servers(&[lost]);
        }
    }
    Ok(())
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
            ]
        })
        .collect();
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
    ];
    print_table(&header, &rows);
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
