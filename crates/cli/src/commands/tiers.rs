//! `spillway tiers`: the tiering scheduler's view (docs/design/ias.md): the site's default
//! strategy, the shared tiers' load as the next decision sees it, the PFS drain slots, and the
//! caller's phases in progress (everyone's for root and the admin group).

use spillway_manager::tiering::TiersView;
use spillway_types::format_bytes as bytes;

use super::manager_api::{print_json, ManagerFlags};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    flags: ManagerFlags,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let view: TiersView = args.flags.client()?.get("/v1/tiers")?;
    if args.flags.json {
        return print_json(&view);
    }
    let snapshot = &view.snapshot;
    println!(
        "default strategy {}  active jobs {}",
        view.strategy_default.name(),
        snapshot.active_jobs
    );
    for (name, load) in [("burst buffer", &snapshot.burst_buffer), ("pfs", &snapshot.pfs)] {
        let bandwidth = match load.bandwidth_bytes_per_s {
            0 => "not measured".to_string(),
            rate => format!("{}/s", bytes(rate)),
        };
        println!(
            "  {name:<12} jobs in a phase {:>3}  queued {:>10}  observed {bandwidth}",
            load.concurrent_jobs,
            bytes(load.queued_bytes)
        );
    }
    println!(
        "drains: {} running, {} waiting, PFS writers max {}",
        view.drains_running, view.drains_waiting, view.pfs_writers_max
    );
    if !view.phases.is_empty() {
        println!(
            "\n  {:>6} {:<24} {:>10} {:<13} {:>7} {:>10}",
            "uid", "job", "epoch", "tier", "clients", "expected"
        );
        for phase in &view.phases {
            println!(
                "  {:>6} {:<24} {:>10} {:<13} {:>7} {:>10}",
                phase.uid,
                phase.job,
                phase.epoch,
                phase.tier.name(),
                phase.clients,
                bytes(phase.expected_bytes)
            );
        }
    }
    Ok(())
}
