//! `spillway demo` with real processes: two `spillway serve` servers draining to a PFS
//! directory, client ranks writing a checkpoint through the client library, the drain running in
//! the background while the application goes on, a SIGKILL, recovery, read-back, GC and clean
//! shutdown.
//!
//! This is what `make demo` shows (issue 4's "Done when"): the same binary re-executes itself as
//! two servers on loopback ports (SSD logs under a temporary directory in /var/tmp, a DRAM tier
//! small enough that the checkpoint spills to SSD, a `pfs` directory beside them standing in for
//! Lustre, drain peers over Unix sockets whose paths are known before the servers start), then
//! plays a job's ranks as threads, each with its own connections (the servers see independent
//! clients):
//!
//! 1. both servers start with `--pfs-dir`, `--drain-peers` and `--drain-self-index`;
//! 2. epochs 1 and 2 are N-N checkpoints (a file per rank, `local` placement, BurstMem style)
//!    committed at `memory` and at `ssd` durability; epoch 3 is N-1 (one shared file, disjoint
//!    ranges, striped over both servers) at `ssd` durability. Each is timed as the application
//!    sees it (first write to last commit) against writing the same bytes straight to files in
//!    a directory on the same disk with fsync;
//! 3. right after epoch 3's commit returns, its drain (coordinated shuffling) is requested and
//!    the application writes epoch 4 meanwhile; the timeline (commit, request, epoch 4's writes,
//!    publication, drained), the drain throughput, each server's stripe-aligned domain and the
//!    PFS file (CRC32C of every rank's range) are shown and checked;
//! 4. epoch 1 (N-N) is drained with the application idle, and every poll checks that no server
//!    frees space before the PFS files it holds parts of are published (fsync'd and renamed);
//! 5. with epoch 4 open, server 1 is killed with SIGKILL and restarted on the same SSD directory
//!    and port; every committed byte is read back through the client — from the PFS copy for the
//!    drained and freed epochs (`set_pfs_fallback`), from the burst buffer otherwise;
//! 6. the epochs and the servers' DRAM/SSD use are listed, the oldest epoch still held in the
//!    burst buffer is deleted and the space it held is shown coming back;
//! 7. unmodified programs (cp, dd, Python) write through the FUSE mount of the servers and read
//!    their files back, before and after a remount (skipped without /dev/fuse);
//! 8. both servers get SIGTERM and must exit 0.
//!
//! Server processes are owned by [`spillway_harness::ServerProcess`] guards that SIGKILL and reap
//! them on drop, so no path out of [`run`] (error or panic) leaves a server behind; and they are
//! started with `PR_SET_PDEATHSIG = SIGKILL`, so even a demo killed by a signal takes its servers
//! with it. Any byte that does not verify, on the PFS or read back, makes [`run`] fail, hence a
//! non-zero exit.
//!
//! `run_demo` is the list of steps, each a method of `demo::Demo`; the other modules hold what the
//! steps share: the servers (`cluster`), what the ranks write (`workload`), the watching of
//! background work (`watch`), the checks (`verify`), the printing (`report`) and step 7 (`mount`).

mod cluster;
mod demo;
mod mount;
mod report;
mod verify;
mod watch;
mod workload;

use std::path::PathBuf;

use anyhow::bail;
use spillway_types::MIB;

use crate::demo::Demo;

/// `spillway demo`'s flags.
#[derive(clap::Args)]
pub struct Args {
    /// Client ranks (threads, each with its own connections to every server).
    #[arg(long, default_value_t = 4)]
    ranks: u32,
    /// Bytes each rank writes per epoch, e.g. 16M.
    #[arg(long, default_value = "32M", value_parser = spillway_types::parse_size)]
    rank_bytes: u64,
    /// Size of one write call of a rank, e.g. 1M.
    #[arg(long, default_value = "1M", value_parser = spillway_types::parse_size)]
    transfer_bytes: u64,
    /// DRAM tier of each server (small, so that the checkpoint spills to SSD).
    #[arg(long, default_value = "32M", value_parser = spillway_types::parse_size)]
    dram_bytes: u64,
    /// SSD log segment size of each server (small, so that deleting an epoch frees whole segments).
    #[arg(long, default_value = "8M", value_parser = spillway_types::parse_size)]
    segment_bytes: u64,
    /// Directory under which the demo makes its temporary directory (removed at the end).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// The `spillway` executable to run as servers (default: this one).
    #[arg(long, hide = true)]
    server_bin: Option<PathBuf>,
}

fn validate(args: &Args) -> anyhow::Result<()> {
    if args.ranks == 0 || args.ranks > 64 {
        bail!("--ranks {}: expected 1 to 64", args.ranks);
    }
    if args.rank_bytes == 0 || args.rank_bytes > 1024 * MIB {
        bail!("--rank-bytes {}: expected 1 byte to 1 GiB", args.rank_bytes);
    }
    if args.transfer_bytes == 0 || args.transfer_bytes > 16 * MIB {
        bail!("--transfer-bytes {}: expected 1 byte to 16 MiB", args.transfer_bytes);
    }
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    run_demo(args).map(|_| ())
}

/// What the demo checked, for its test.
#[derive(Debug, Default)]
#[cfg_attr(not(test), allow(dead_code))]
struct DemoSummary {
    /// Bytes of PFS copies verified against the CRC32C of what the ranks wrote.
    pfs_bytes_verified: u64,
    /// Rank parts read back through the client from a PFS copy (drained and freed epochs).
    parts_read_from_pfs: usize,
    /// Space (DRAM + SSD) freed after the N-N epoch was drained, with the application idle.
    bytes_freed_after_drain: u64,
}

/// The demo's steps, in order (see the crate documentation).
fn run_demo(args: Args) -> anyhow::Result<DemoSummary> {
    validate(&args)?;
    let mut demo = Demo::new(args)?;
    demo.print_intro();
    demo.start_servers()?;
    demo.checkpoint()?;
    demo.drain_while_writing()?;
    demo.drain_idle()?;
    demo.crash_and_recover()?;
    demo.delete_and_gc()?;
    demo.mount()?;
    demo.shut_down()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The whole demo with small sizes, against the `spillway` binary cargo built beside this
    /// test binary (`cargo test --workspace` builds it for the binary's integration tests).
    #[test]
    fn demo_runs() {
        let exe = std::env::current_exe().unwrap();
        let bin = exe.parent().and_then(Path::parent).map(|d| d.join("spillway")).unwrap();
        assert!(
            bin.exists(),
            "{} not built (run `cargo test --workspace`, or `cargo build -p spillway` first)",
            bin.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let args = Args {
            ranks: 2,
            rank_bytes: 8 * MIB + 12_345,
            transfer_bytes: 256 * 1024,
            dram_bytes: 12 * MIB,
            segment_bytes: 6 * MIB,
            dir: dir.path().to_path_buf(),
            server_bin: Some(bin),
        };
        let summary = run_demo(args).unwrap();
        // Both drained epochs (N-1 and N-N) were found intact on the PFS, and every part of them
        // was read back through the client's PFS fallback after GC freed them.
        assert_eq!(summary.pfs_bytes_verified, 2 * 2 * (8 * MIB + 12_345), "{summary:?}");
        assert_eq!(summary.parts_read_from_pfs, 2 + 2, "{summary:?}");
        // The first epoch starts at the head of the SSD logs: whole segments held only its bytes.
        assert!(summary.bytes_freed_after_drain > 0, "{summary:?}");
        // Everything the demo made is gone.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn bad_arguments_are_refused_before_anything_starts() {
        let dir = tempfile::tempdir().unwrap();
        let args = Args {
            ranks: 0,
            rank_bytes: MIB,
            transfer_bytes: MIB,
            dram_bytes: 32 * MIB,
            segment_bytes: 8 * MIB,
            dir: dir.path().to_path_buf(),
            server_bin: Some(PathBuf::from("/nonexistent/spillway")),
        };
        let error = run(args).unwrap_err().to_string();
        assert!(error.contains("--ranks 0"), "{error}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
