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
    /// Show it again every SECONDS until interrupted (a terminal is cleared first; with --json,
    /// one object per line).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    watch: Option<u64>,
    /// With --watch: stop after this many showings.
    #[arg(long, value_name = "N", requires = "watch", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    #[command(flatten)]
    flags: ManagerFlags,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let path = if args.aggregate { "/v1/status?aggregate=1" } else { "/v1/status" };
    let client = args.flags.client()?;
    let Some(every_s) = args.watch else {
        let status: Status = client.get(path)?;
        return show(&status, &args);
    };
    use std::io::IsTerminal;
    let clear = !args.flags.json && std::io::stdout().is_terminal();
    let mut shown = 0u64;
    loop {
        // A manager that does not answer for a round is reported, not fatal: watching is for
        // seeing it come back.
        let status: Result<Status, _> = client.get(path);
        if clear {
            print!("\x1b[H\x1b[2J");
        }
        match status {
            Ok(status) if args.flags.json => {
                println!("{}", serde_json::to_string(&status).expect("status serializes"));
            }
            Ok(status) => {
                println!("every {every_s} s, at {} (unix s)\n", now_unix_s());
                show(&status, &args)?;
            }
            Err(error) => eprintln!("spillway status: {error}"),
        }
        use std::io::Write;
        std::io::stdout().flush()?;
        shown += 1;
        if args.count.is_some_and(|count| shown >= count) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs(every_s));
    }
}

fn now_unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// One showing: JSON, or the totals, pools, servers and reservations as tables.
fn show(status: &Status, args: &Args) -> anyhow::Result<()> {
    if args.flags.json {
        return print_json(status);
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
        if !status.ended_by_targets.is_empty() {
            println!();
            println!("ended reservations by performance targets (latest first):");
            super::reservation::print_ended_by_targets(&status.ended_by_targets);
        }
    }
    Ok(())
}
