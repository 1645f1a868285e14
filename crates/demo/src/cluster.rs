//! The demo's two servers: their names, files and flags (`spillway-harness` starts and owns the
//! processes), and the admin client that asks them about their epochs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use spillway_client::{Client, ClientOptions};
use spillway_harness::ServerBuilder;
use spillway_proto::{Endpoint, EpochState};
use spillway_types::{EpochId, MIB};

use crate::Args;

/// The servers of the demo, in drain order.
pub(crate) const SERVER_NAMES: [&str; 2] = ["bb0", "bb1"];
/// The server killed and restarted (step 5).
pub(crate) const VICTIM: usize = 1;
/// How long a server may take to exit after SIGTERM.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// PFS stripe size the servers drain with (`drain.stripe_bytes`): shuffled domains start on it.
pub(crate) const DRAIN_STRIPE_BYTES: u64 = MIB;
/// Largest PFS write of the drain (`drain.write_bytes_max`, a multiple of the stripe).
pub(crate) const DRAIN_WRITE_BYTES_MAX: u64 = 8 * MIB;

/// SSD capacity of each demo server: at least 1 GiB, and room for all four epochs (each server
/// holds about half of each) with slack for segments shared between epochs.
pub(crate) fn ssd_bytes(args: &Args) -> u64 {
    (3 * args.ranks as u64 * args.rank_bytes).max(1024 * MIB)
}

/// Server `index` of the demo: its DRAM tier, `--ssd-bytes`, segment and drain knobs, draining
/// to `pfs` with `peers`, among which its own Unix socket.
pub(crate) fn demo_server(
    bin: &Path,
    root: &Path,
    index: usize,
    peers: &[Endpoint],
    pfs: &Path,
    args: &Args,
) -> ServerBuilder {
    let name = SERVER_NAMES[index];
    ServerBuilder::new(bin, root, name)
        .ssd_dir(ssd_dir(root, name))
        .dram_bytes(&args.dram_bytes.to_string())
        .args(["--ssd-bytes".to_string(), ssd_bytes(args).to_string()])
        .unix_socket(socket_path(root, name))
        .pfs_dir(pfs)
        .drain_peers(peers, index)
        .env("SPILLWAY_STORE_SEGMENT_BYTES_MAX", args.segment_bytes.to_string())
        .env("SPILLWAY_DRAIN_STRIPE_BYTES", DRAIN_STRIPE_BYTES.to_string())
        .env("SPILLWAY_DRAIN_WRITE_BYTES_MAX", DRAIN_WRITE_BYTES_MAX.to_string())
        .rust_log("info")
}

/// The SSD log directory of server `name`.
pub(crate) fn ssd_dir(root: &Path, name: &str) -> PathBuf {
    root.join(format!("{name}-ssd"))
}

/// The Unix socket of server `name`, through which its drain peers reach it.
fn socket_path(root: &Path, name: &str) -> PathBuf {
    root.join(format!("{name}.sock"))
}

/// The drain peers of every server, in [`SERVER_NAMES`] order: their Unix sockets, whose paths
/// are known before any server starts (unlike the TCP ports).
pub(crate) fn drain_peers(root: &Path) -> Vec<Endpoint> {
    SERVER_NAMES.iter().map(|name| Endpoint::Unix(socket_path(root, name))).collect()
}

/// The last lines of a server's log, for error messages (the log dies with the temp dir).
pub(crate) fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(15)..].join("\n  ");
    format!("; last lines of {}:\n  {tail}", log.display())
}

/// A client of every server, for listing, status, drains and deletion.
pub(crate) fn admin(endpoints: &[Endpoint]) -> anyhow::Result<Client> {
    Client::connect(
        endpoints,
        ClientOptions { client_name: "demo admin".into(), ..ClientOptions::default() },
    )
    .context("admin client: connecting")
}

/// One server's own view of its epochs (state, bytes).
pub(crate) fn server_epochs(
    endpoint: &Endpoint,
) -> anyhow::Result<BTreeMap<EpochId, (EpochState, u64)>> {
    let mut client = admin(std::slice::from_ref(endpoint))?;
    Ok(client.list_epochs()?.into_iter().map(|e| (e.epoch, (e.state, e.bytes))).collect())
}
