//! `spillway bench …`: every benchmark of Spillway, each measuring its baselines in the same run
//! and reporting ratios (this machine's disk and loopback drift too much between runs for
//! numbers measured at another time to be compared).
//!
//! One module per benchmark, each with its flags ([`Command`]'s variants) and a `run`:
//! [`store`] (store ingest against memcpy and plain files), [`ingress`] (clients through real
//! servers against memcached, loopback TCP and direct writes), [`egress`] (drain: naive against
//! coordinated shuffling), [`peaks`] (bandwidth, IOPS and metadata peaks of a target, read by
//! `spillway characterize`) and [`mount`] (the FUSE mount against the native client and a local
//! directory), [`replication`] (2 replicas at `replicated` durability against 1 copy at `ssd`
//! and `memory`), [`ias`] (tiering strategies on a cluster with shaped tiers), [`targets`] (two
//! concurrent jobs on reservations by bandwidth and metadata target through a real manager:
//! achieved against target, capacity-only reservations of the same bytes beside). Servers run as
//! `spillway serve` children owned by `spillway-harness`, or in process; [`stats`] holds the
//! arithmetic every benchmark shares.

pub mod egress;
pub mod ias;
pub mod ingress;
pub mod io500;
pub mod mount;
pub mod mount_durable;
pub mod mount_ior;
pub mod mount_stat;
pub mod peaks;
pub mod replication;
pub mod small_writes;
pub mod stats;
pub mod store;
pub mod targets;

/// `spillway bench <benchmark>`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Store ingest: DRAM, SSD spill and commit against memcpy and plain file baselines.
    Store(store::Args),
    /// Client ingress through servers against Memcached, loopback TCP and direct-to-disk.
    Ingress(ingress::Args),
    /// Peak bandwidth, IOPS and metadata rate of a target with rising concurrency.
    Peaks(peaks::Args),
    /// Drain to the PFS: naive against coordinated shuffling, sequential-write baseline.
    Egress(egress::Args),
    /// The FUSE mount: sequential writes against the native client, metadata striped against
    /// private namespaces and a local directory.
    Mount(mount::Args),
    /// Checkpoint time with 2 replicas at `replicated` durability against 1 copy at `ssd` and
    /// `memory`, three servers in three failure domains.
    Replication(replication::Args),
    /// Interference-aware tiering (IAS Figs 5-7): average I/O time of applications sharing a
    /// shaped burst buffer, a shaped MooseFS PFS and node-local tiers, per strategy.
    Ias(ias::Args),
    /// Two concurrent jobs on reservations by bandwidth and metadata target: achieved vs target.
    Targets(targets::Args),
    /// IO500's shapes (ior-easy, ior-hard, mdtest-easy, mdtest-hard) through the native client
    /// and the mount, a plain directory on the same disk as the baseline.
    Io500(io500::Args),
    /// One process of `bench io500` (run by it).
    #[command(hide = true)]
    Io500Worker(io500::WorkerArgs),
    /// One application of `bench ias` (run by it inside a cluster host).
    #[command(hide = true)]
    IasApp(ias::AppArgs),
}

/// Runs one benchmark.
pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Store(args) => store::run(args),
        Command::Ingress(args) => ingress::run(args),
        Command::Peaks(args) => peaks::run(args),
        Command::Egress(args) => egress::run(args),
        Command::Mount(args) => mount::run(args),
        Command::Replication(args) => replication::run(args),
        Command::Ias(args) => ias::run(args),
        Command::Targets(args) => targets::run(args),
        Command::Io500(args) => io500::run(args),
        Command::Io500Worker(args) => io500::run_worker(args),
        Command::IasApp(args) => ias::run_app(args),
    }
}

/// DRAM log that holds `bytes` below the flusher's 75 % high watermark, plus `headroom_bytes`.
pub(crate) fn dram_bytes_holding(bytes: u64, headroom_bytes: u64) -> u64 {
    (bytes * 10 / 7 + headroom_bytes).next_multiple_of(1 << 20)
}

/// Starts `spillway serve` (this binary) on a loopback port with its SSD log in `ssd_dir`, its
/// log in `<work>/server-<name>.log` and the extra `args`. Dropping it SIGTERMs the server and
/// waits for its graceful exit, so a failed measurement leaves nothing half-done behind.
pub(crate) fn start_server(
    work: &std::path::Path,
    name: &str,
    ssd_dir: &std::path::Path,
    dram_bytes: u64,
    args: &[String],
) -> anyhow::Result<spillway_harness::ServerProcess> {
    let binary = std::env::current_exe()?;
    let server = spillway_harness::ServerBuilder::new(binary, work, name)
        .ssd_dir(ssd_dir)
        .dram_bytes(&dram_bytes.to_string())
        .log_file(work.join(format!("server-{name}.log")))
        .rust_log("warn")
        .args(args)
        .graceful_drop(std::time::Duration::from_secs(30))
        .spawn()?;
    Ok(server)
}
