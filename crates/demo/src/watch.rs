//! Watching the servers do background work: a drain from request to every server reporting it
//! drained (with the PFS and the space in use polled alongside), space settling, GC reclaiming
//! segments, a memory commit reaching SSD.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use spillway_client::Client;
use spillway_proto::{DrainInfo, DrainState, Endpoint, ServerStatus};
use spillway_types::{format_bytes, EpochId};

use crate::cluster::admin;
use crate::workload::EpochPlan;

/// How long background work (memory → SSD catch-up, segment GC) may take to become visible.
const BACKGROUND_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the demo watches GC reclaim the segments of a drained or deleted epoch.
const GC_WAIT: Duration = Duration::from_secs(3);
/// How long a drain may take (it yields to ingest while the next epoch is written).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// What was seen while one epoch drained: from the request to every server reporting it drained.
pub(crate) struct DrainWatch {
    pub(crate) requested: Instant,
    /// First poll that found every file of the epoch under its final PFS name (complete, fsync'd).
    pub(crate) published: Option<Instant>,
    /// First poll at which the servers' space in use (DRAM + SSD) was the watch's threshold below
    /// the figure at the request.
    pub(crate) freed: Option<Instant>,
    pub(crate) drained: Instant,
    pub(crate) used_before: u64,
    pub(crate) used_after: u64,
    /// Per server: its drain status once drained.
    pub(crate) infos: Vec<(usize, DrainInfo)>,
}

/// Space in use (DRAM + SSD) on each server.
pub(crate) fn space_used(client: &mut Client) -> anyhow::Result<Vec<u64>> {
    Ok(client.status()?.iter().map(|s| s.ssd_bytes_used + s.dram_bytes_used).collect())
}

/// A file of a drained epoch: its final PFS name and the servers holding a part of it.
pub(crate) struct FinalFile {
    pub(crate) path: PathBuf,
    holders: Vec<usize>,
}

/// Polls drain status, space in use and the PFS until `epoch` is drained on every server that
/// holds it. With `free_threshold` (no other epoch growing meanwhile), fails if a server's space
/// in use fell by that much before every file it holds a part of was published: each server
/// frees an epoch's space once its own files are on the PFS, whatever its peers are doing.
pub(crate) fn watch_drain(
    endpoints: &[Endpoint],
    epoch: EpochId,
    requested: Instant,
    used_before: &[u64],
    files: &[FinalFile],
    free_threshold: Option<u64>,
) -> anyhow::Result<DrainWatch> {
    let mut client = admin(endpoints)?;
    let mut published = None;
    let mut freed = None;
    loop {
        let used = space_used(&mut client)?;
        let status = client.drain_status()?;
        let now = Instant::now();
        let on_pfs: Vec<bool> = files.iter().map(|f| f.path.is_file()).collect();
        if published.is_none() && on_pfs.iter().all(|&p| p) {
            published = Some(now);
        }
        if let Some(threshold) = free_threshold {
            for (server, (&now_used, &before)) in used.iter().zip(used_before).enumerate() {
                if now_used.saturating_add(threshold) > before {
                    continue;
                }
                if let Some((file, _)) =
                    files.iter().zip(&on_pfs).find(|(f, &p)| !p && f.holders.contains(&server))
                {
                    bail!(
                        "epoch {epoch}: server {server} freed space ({} -> {}) before {} was published on the PFS",
                        format_bytes(before),
                        format_bytes(now_used),
                        file.path.display()
                    );
                }
                freed.get_or_insert(now);
            }
        }
        let infos: Vec<(usize, DrainInfo)> = status
            .iter()
            .filter_map(|(server, list)| {
                list.iter().find(|d| d.epoch == epoch).map(|d| (*server, d.clone()))
            })
            .collect();
        if !infos.is_empty() && infos.iter().all(|(_, d)| d.state == DrainState::Drained) {
            if published.is_none() {
                bail!("epoch {epoch}: reported drained but not every file is under its final PFS name");
            }
            return Ok(DrainWatch {
                requested,
                published,
                freed,
                drained: now,
                used_before: used_before.iter().sum(),
                used_after: used.iter().sum(),
                infos,
            });
        }
        if requested.elapsed() > DRAIN_TIMEOUT {
            let report: Vec<String> = infos
                .iter()
                .map(|(s, d)| {
                    format!(
                        "server {s}: {} ({} failed attempts) {}",
                        d.state, d.failed_attempts, d.last_error
                    )
                })
                .collect();
            bail!("epoch {epoch} not drained after {DRAIN_TIMEOUT:?}: {}", report.join("; "));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Every server's DRAM + SSD use once background work has settled (two equal readings 100 ms apart).
pub(crate) fn settled_use(client: &mut Client) -> anyhow::Result<Vec<u64>> {
    let started = Instant::now();
    let mut last = Vec::new();
    loop {
        let used = space_used(client)?;
        if used == last || started.elapsed() > BACKGROUND_TIMEOUT {
            return Ok(used);
        }
        last = used;
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The final PFS names of an epoch's files and which servers hold parts of each.
pub(crate) fn final_files(
    endpoints: &[Endpoint],
    pfs: &Path,
    plan: &EpochPlan,
    ranks: u32,
) -> anyhow::Result<Vec<FinalFile>> {
    let mut client = admin(endpoints)?;
    let names: std::collections::BTreeSet<String> = (0..ranks).map(|r| plan.file_name(r)).collect();
    names
        .into_iter()
        .map(|name| {
            let file = client
                .open_file(plan.epoch, &name)
                .with_context(|| format!("opening {name} of epoch {}", plan.epoch))?;
            Ok(FinalFile {
                path: pfs.join(format!("epoch-{}", plan.epoch.0)).join(&name),
                holders: file.servers(),
            })
        })
        .collect()
}

/// Waits until `check` holds on the merged epoch list; returns how long that took.
pub(crate) fn wait_for(
    endpoints: &[Endpoint],
    what: &str,
    mut check: impl FnMut(&mut Client) -> anyhow::Result<bool>,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut client = admin(endpoints)?;
    loop {
        if check(&mut client)? {
            return Ok(started.elapsed());
        }
        if started.elapsed() > BACKGROUND_TIMEOUT {
            bail!("{what}: not done after {BACKGROUND_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// After `drained`, polls until some server's space in use is `threshold` below `used_before`
/// (GC freed part of the drained epoch), for at most [`GC_WAIT`]; returns when that was seen.
pub(crate) fn first_freed(
    client: &mut Client,
    drained: Instant,
    used_before: &[u64],
    threshold: u64,
) -> anyhow::Result<Option<Instant>> {
    while drained.elapsed() < GC_WAIT {
        std::thread::sleep(Duration::from_millis(5));
        let used = space_used(client)?;
        if used.iter().zip(used_before).any(|(&u, &b)| u.saturating_add(threshold) <= b) {
            return Ok(Some(Instant::now()));
        }
    }
    Ok(None)
}

/// After an epoch's deletion, waits (at most [`GC_WAIT`]) for the servers' SSD use to drop
/// below `ssd_before`; returns the settled statuses and when the first segments went.
pub(crate) fn wait_for_gc(
    client: &mut Client,
    ssd_before: u64,
) -> anyhow::Result<(Vec<ServerStatus>, Duration)> {
    let started = Instant::now();
    let mut statuses = client.status()?;
    while statuses.iter().map(|s| s.ssd_bytes_used).sum::<u64>() >= ssd_before
        && started.elapsed() < GC_WAIT
    {
        std::thread::sleep(Duration::from_millis(10));
        statuses = client.status()?;
    }
    let first_freed = started.elapsed();
    if first_freed < GC_WAIT {
        // Let the GC round that started finish, then take the settled figure.
        std::thread::sleep(Duration::from_millis(200));
        statuses = client.status()?;
    }
    Ok((statuses, first_freed))
}
