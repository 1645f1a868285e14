//! `spillway`: one binary, one subcommand per role. This crate parses the command line and
//! dispatches; the work lives elsewhere:
//!
//! - [`daemons`]: `serve` and `manager`, the long-running processes (wiring of the server,
//!   drain and manager crates);
//! - [`commands`]: short-lived user and operator commands (`mount`, `reservation`, `stage-in`,
//!   `status`, `drain`, …) against the servers and the manager;
//! - [`planning`]: `ftl`, `sim` and `characterize`, front ends of `spillway-ftl` and
//!   `spillway-sim`;
//! - the crates `spillway-bench` (`bench …`), `spillway-demo` (`demo`) and `spillway-slurm`
//!   (`bb …`, the Slurm hooks), which declare their own flags next to their code.

use clap::{CommandFactory, Parser, Subcommand};

mod commands;
mod daemons;
mod logging;
mod planning;

use commands::{drain, generate, mount, pool, reservation, stage, status, tiers};
use daemons::{manager, serve};
use planning::{characterize, ftl, sim};

#[derive(Parser)]
#[command(name = "spillway", version, about = "Spillway: a burst buffer for HPC centers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the end-to-end demonstration (what `make demo` shows).
    Demo(spillway_demo::Args),
    /// Mount a reservation's burst buffer as a POSIX file system (FUSE).
    Mount(mount::Args),
    /// Unmount a Spillway mount (its process flushes, syncs and exits).
    Umount(mount::UmountArgs),
    /// Run a burst buffer server owning one store.
    Serve(serve::Args),
    /// Slurm burst_buffer/lua hooks (called by slurm/burst_buffer.lua).
    Bb(spillway_slurm::Args),
    /// Run the manager (control plane) in the foreground.
    Manager(manager::Args),
    /// Burst buffer pools (create: root or admin group).
    Pool(pool::Args),
    /// Burst buffer servers known to the manager (add: root or admin group).
    Server(pool::ServerArgs),
    /// Per-user capacity quotas (set: root or admin group).
    Quota(pool::QuotaArgs),
    /// Reservations: create, show, list, destroy.
    Reservation(reservation::Args),
    /// Copy files or a tree from the PFS into a reservation.
    StageIn(stage::Args),
    /// Copy files or a tree from a reservation to the PFS.
    StageOut(stage::Args),
    /// Pools, servers, reservations, used/free, streams, drains.
    Status(status::Args),
    /// Drain epochs to the PFS: start, wait, status.
    Drain(drain::Args),
    /// Tiering: the shared tiers' load, PFS drain slots and phases in progress.
    Tiers(tiers::Args),
    /// Benchmarks: each measures its baselines in the same run and reports ratios.
    #[command(subcommand)]
    Bench(spillway_bench::Command),
    /// SSD wear: FTL simulator with multi-stream placement.
    Ftl(ftl::Args),
    /// Trace-driven burst buffer simulator (Xu/Sato two-level model).
    Sim(sim::Args),
    /// Characterize a workflow trace against measured peaks and advise an allocation.
    Characterize(characterize::Args),
    /// Print the configuration reference (every knob, unit, default) as Markdown.
    ConfigDoc,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(generate::CompletionsArgs),
    /// Write man pages for spillway and every subcommand into a directory.
    Man(generate::ManArgs),
}

impl Command {
    /// How much the command logs, and whether it asked for JSON logs.
    fn logging(&self) -> (logging::Verbosity, bool) {
        use logging::Verbosity::{Command as Short, Service};
        match self {
            Command::Serve(args) => (Service, args.log_json()),
            Command::Manager(args) => (Service, args.log_json()),
            Command::Mount(_) => (Service, false),
            _ => (Short, false),
        }
    }
}

fn main() {
    logging::exit_quietly_on_closed_stdout();
    let command = Cli::parse().command;
    let (verbosity, json) = command.logging();
    logging::init(verbosity, json);
    let result = match command {
        Command::Demo(args) => spillway_demo::run(args),
        Command::Mount(args) => mount::run(args),
        Command::Umount(args) => mount::run_umount(args),
        Command::Serve(args) => serve::run(args),
        Command::Bb(args) => spillway_slurm::run(args),
        Command::Manager(args) => manager::run(args),
        Command::Pool(args) => pool::run(args),
        Command::Server(args) => pool::run_server(args),
        Command::Quota(args) => pool::run_quota(args),
        Command::Reservation(args) => reservation::run(args),
        Command::StageIn(args) => stage::run_in(args),
        Command::StageOut(args) => stage::run_out(args),
        Command::Status(args) => status::run(args),
        Command::Drain(args) => drain::run(args),
        Command::Tiers(args) => tiers::run(args),
        Command::Bench(command) => spillway_bench::run(command),
        Command::Ftl(args) => ftl::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Characterize(args) => characterize::run(args),
        Command::ConfigDoc => {
            print_config_reference();
            Ok(())
        }
        Command::Completions(args) => {
            generate::completions(&args, Cli::command());
            Ok(())
        }
        Command::Man(args) => generate::man_pages(&args, Cli::command()),
    };
    if let Err(error) = result {
        eprintln!("spillway: {error:#}");
        std::process::exit(1);
    }
}

/// The daemons' knob sections plus the simulators' (which the config crate cannot name without
/// depending on them), as Markdown.
fn print_config_reference() {
    let mut knobs = spillway_config::Config::describe();
    knobs.extend(spillway_ftl::FtlKnobs::describe());
    print!("{}", spillway_config::render_reference(&knobs));
}
