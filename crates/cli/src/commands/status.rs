//! `spillway status`: pools, servers, reservations, used/free, streams in use, drains in flight.

use spillway_manager::Status;
use spillway_types::format_bytes as bytes;

use super::manager_api::{print_json, ManagerFlags};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    flags: ManagerFlags,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let status: Status = args.flags.client()?.get("/v1/status")?;
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
    println!();
    super::reservation::print_reservations(&status.reservations);
    Ok(())
}
