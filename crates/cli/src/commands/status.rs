//! `spillway status`: pools, servers, reservations, used/free, streams in use, drains in flight.
//!
//! The manager shows each caller what it may see: every reservation to root and the admin
//! group, their own and permitted ones to anyone else (with pool capacity but no stream keys).
//! `--aggregate` asks for capacity only, whoever asks (what `scontrol show bbstat` prints when
//! Slurm does not say who is asking).

use spillway_manager::Status;
use spillway_types::format_bytes as bytes;

use super::manager_api::{print_json, ManagerFlags};

#[derive(clap::Args)]
pub struct Args {
    /// Capacity only (pools, servers, totals), no reservations, whoever asks.
    #[arg(long)]
    aggregate: bool,
    #[command(flatten)]
    flags: ManagerFlags,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let path = if args.aggregate { "/v1/status?aggregate=1" } else { "/v1/status" };
    let status: Status = args.flags.client()?.get(path)?;
    if args.flags.json {
        return print_json(&status);
    }
    println!(
        "capacity {}  used {}  free {}  drains in flight {}",
        bytes(status.capacity_bytes),
        bytes(status.used_bytes),
        bytes(status.free_bytes),
        status.drains_in_flight
    );
    println!();
    super::pool::print_pools(&status.pools);
    println!();
    super::pool::print_servers(&status.servers);
    if !args.aggregate {
        println!();
        super::reservation::print_reservations(&status.reservations);
    }
    Ok(())
}
