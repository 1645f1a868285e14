//! `spillway`: one binary, one subcommand per role. Each subcommand lives in its own module with
//! an `Args` struct (its flags) and a `run` function; this file only dispatches.

use clap::{Parser, Subcommand};

mod bb;
mod bench_egress;
mod bench_ingress;
mod bench_mount;
mod bench_peaks;
mod bench_store;
mod characterize;
mod demo;
mod drain;
mod ftl;
mod manager;
mod mount;
mod pool;
mod reaped;
mod reservation;
mod serve;
mod sim;
mod stage;
mod status;

#[derive(Parser)]
#[command(name = "spillway", version, about = "Spillway: a burst buffer for HPC centers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the end-to-end demonstration (what `make demo` shows).
    Demo(demo::Args),
    /// Mount a reservation's burst buffer as a POSIX file system (FUSE).
    Mount(mount::Args),
    /// Unmount a Spillway mount (its process flushes, syncs and exits).
    Umount(mount::UmountArgs),
    /// Run a burst buffer server owning one store.
    Serve(serve::Args),
    /// Slurm burst_buffer/lua hooks (called by slurm/burst_buffer.lua).
    Bb(bb::Args),
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
    /// Benchmarks: each measures its baselines in the same run and reports ratios.
    #[command(subcommand)]
    Bench(Bench),
    /// SSD wear: FTL simulator with multi-stream placement.
    Ftl(ftl::Args),
    /// Trace-driven burst buffer simulator (Xu/Sato two-level model).
    Sim(sim::Args),
    /// Characterize a workflow trace against measured peaks and advise an allocation.
    Characterize(characterize::Args),
    /// Print the configuration reference (every knob, unit, default) as Markdown.
    ConfigDoc,
}

#[derive(Subcommand)]
enum Bench {
    /// Store ingest: DRAM, SSD spill and commit against memcpy and plain file baselines.
    Store(bench_store::Args),
    /// Client ingress through servers against Memcached, loopback TCP and direct-to-disk.
    Ingress(bench_ingress::Args),
    /// Peak bandwidth, IOPS and metadata rate of a target with rising concurrency.
    Peaks(bench_peaks::Args),
    /// Drain to the PFS: naive against coordinated shuffling, sequential-write baseline.
    Egress(bench_egress::Args),
    /// The FUSE mount: sequential writes against the native client, metadata striped against
    /// private namespaces and a local directory.
    Mount(bench_mount::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Mount(args) => mount::run(args),
        Command::Umount(args) => mount::run_umount(args),
        Command::Serve(args) => serve::run(args),
        Command::Bb(args) => bb::run(args),
        Command::Manager(args) => manager::run(args),
        Command::Pool(args) => pool::run(args),
        Command::Server(args) => pool::run_server(args),
        Command::Quota(args) => pool::run_quota(args),
        Command::Reservation(args) => reservation::run(args),
        Command::StageIn(args) => stage::run_in(args),
        Command::StageOut(args) => stage::run_out(args),
        Command::Status(args) => status::run(args),
        Command::Drain(args) => drain::run(args),
        Command::Bench(Bench::Store(args)) => bench_store::run(args),
        Command::Bench(Bench::Ingress(args)) => bench_ingress::run(args),
        Command::Bench(Bench::Peaks(args)) => bench_peaks::run(args),
        Command::Bench(Bench::Egress(args)) => bench_egress::run(args),
        Command::Bench(Bench::Mount(args)) => bench_mount::run(args),
        Command::Ftl(args) => ftl::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Characterize(args) => characterize::run(args),
        Command::ConfigDoc => {
            // The daemon's sections plus the simulators' (which the config crate cannot name
            // without depending on them).
            let mut knobs = spillway_config::Config::describe();
            knobs.extend(spillway_ftl::FtlKnobs::describe());
            print!("{}", spillway_config::render_reference(&knobs));
            Ok(())
        }
    };
    if let Err(error) = result {
        eprintln!("spillway: {error:#}");
        std::process::exit(1);
    }
}
