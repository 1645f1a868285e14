//! Starts and owns the child processes of the `spillway` binary — servers above all — for the
//! demo, the benchmarks and the end-to-end tests, and the deterministic data they write.
//!
//! Everything that runs a server needs the same dance: spawn the binary with the flags of its
//! scenario, wait for the `listening <endpoint>…` line (bounded, with the server's stderr in the
//! error when it never comes), kill or SIGTERM it, restart it on the same directories and port,
//! read its log, and never leak a process when a step fails. [`ServerProcess`] does that once;
//! the binary is a parameter (tests pass `env!("CARGO_BIN_EXE_spillway")`, the demo and the
//! benchmarks `std::env::current_exe()`). [`Reaped`] owns any other child (a load generator,
//! memcached). [`Munged`] runs a private `munged` with its own key for munge authentication
//! (a second one, with another key, forges credentials). [`pattern`] and [`same_bytes`] are the
//! shared data generator and comparison. [`ManagerProcess`] is a `spillway manager` for the
//! end-to-end tests. [`TestUser`] is an unprivileged account the security
//! tests create and act as. [`Cluster`] starts hosts in Linux namespaces (scripts/cluster/) and
//! runs commands, servers and a manager inside them ([`Host`]). [`SlurmRelease`] is the Slurm a
//! test cluster runs (the machine's 22.05, or 24.11 in a cached Debian 13 root).
//! [`preload_library`] builds and finds `libspillway_preload.so` for the tests that load it.
//! [`MountGuard`] owns a test's FUSE mount (in its own process or `spillway mount
//! --background`) and unmounts it even when the test fails; [`start_servers`] starts the
//! servers such a test mounts.

#![forbid(unsafe_code)]

mod artifacts;
mod child;
mod cluster;
mod data;
mod manager;
mod mount;
mod munged;
mod server;
mod slurm;
mod users;

pub use artifacts::{preload_library, PRELOAD_LIBRARY};
pub use child::Reaped;
pub use cluster::{Cluster, ClusterError, Host, SharedPfs};
pub use data::{files_under, pattern, same_bytes};
pub use manager::ManagerProcess;
pub use mount::{mounted, require_fuse, MountGuard};
pub use munged::{Munged, MungedError, MUNGED_KEY_BYTES, MUNGED_READY_TIMEOUT};
pub use server::{ServerBuilder, ServerError, ServerProcess, READY_TIMEOUT_DEFAULT};
pub use slurm::SlurmRelease;
pub use users::{TestUser, UserError};

use spillway_proto::Endpoint;

/// `a,b,c`: the comma-separated endpoint list the CLI and the test children take.
pub fn endpoint_list(endpoints: &[Endpoint]) -> String {
    endpoints.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(",")
}

/// `count` servers named `s0`, `s1`, … of `binary`, their data directories in `dir`, each with
/// `dram_bytes` of DRAM (`--dram-bytes`), and their endpoints in the same order.
pub fn start_servers(
    binary: impl AsRef<std::path::Path>,
    dir: &std::path::Path,
    count: usize,
    dram_bytes: &str,
) -> (Vec<ServerProcess>, Vec<Endpoint>) {
    let servers: Vec<ServerProcess> = (0..count)
        .map(|i| {
            ServerProcess::builder(binary.as_ref(), dir, &format!("s{i}"))
                .dram_bytes(dram_bytes)
                .start()
        })
        .collect();
    let endpoints = servers.iter().map(|s| s.endpoint().clone()).collect();
    (servers, endpoints)
}
