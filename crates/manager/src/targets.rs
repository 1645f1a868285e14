//! Placement by performance targets (docs/design/targets.md): a pool's servers as
//! `spillway_policy::targets::plan` sees them — free space and health, measured peaks
//! (`spillway server measure`), and the rates active reservations were promised there — and
//! what a plan leaves on the reservation's row.

use std::collections::BTreeMap;

use spillway_policy::targets::{Rates, ServerLoad, ServerPeaks, TargetPlan};

use crate::db::{ReservationRow, ServerRow, TargetsRow};
use crate::model::CreateReservation;
use crate::service::server_space;

/// The rates active reservations by target promised on each server, by server id.
pub(crate) fn promised_per_server(active: &[ReservationRow]) -> BTreeMap<u64, Rates> {
    let mut promised: BTreeMap<u64, Rates> = BTreeMap::new();
    for (server, rates) in
        active.iter().filter_map(|r| r.targets.as_ref()).flat_map(|t| &t.promised)
    {
        let sum = promised.entry(*server).or_default();
        *sum = add(*sum, *rates);
    }
    promised
}

/// A server's measured peaks as the planner takes them: metadata per namespace mode as
/// measured through its namespace service; from a measurement without them (older, or not
/// root), the one metadata rate stands for both modes. Not measured: zeros, so it meets no rate.
fn peaks_of(server: &ServerRow) -> ServerPeaks {
    server.peaks.as_ref().map_or_else(ServerPeaks::default, |peaks| ServerPeaks {
        bandwidth_bytes_per_s: peaks.bandwidth_bytes_per_s,
        iops: peaks.iops,
        metadata_striped_ops_per_s: peaks
            .metadata_striped_ops_per_s
            .unwrap_or(peaks.metadata_ops_per_s),
        metadata_private_ops_per_s: peaks
            .metadata_private_ops_per_s
            .unwrap_or(peaks.metadata_ops_per_s),
    })
}

/// The servers of one pool as the planner sees them.
pub(crate) fn loads(
    pool_servers: &[&ServerRow],
    used_per_server: &BTreeMap<u64, u64>,
    promised: &BTreeMap<u64, Rates>,
) -> Vec<ServerLoad> {
    pool_servers
        .iter()
        .map(|server| ServerLoad {
            space: server_space(server, used_per_server),
            peaks: peaks_of(server),
            promised: promised.get(&server.id).copied().unwrap_or_default(),
        })
        .collect()
}

/// What the reservation's row keeps of its plan.
pub(crate) fn row_of(request: &CreateReservation, plan: &TargetPlan) -> TargetsRow {
    TargetsRow {
        asked: request.targets(),
        promised: plan.promised_per_server.clone(),
        why: plan.why.clone(),
    }
}

/// Refuses a plan that would leave `owner_uid` holding more than `share_percent` of the pool's
/// measured peak promised, in any dimension: its active reservations' promises in `pool_id` plus
/// the plan's. The reason names the dimension and the numbers.
pub(crate) fn check_user_share(
    owner_uid: u32,
    pool_id: u64,
    share_percent: u32,
    servers: &[ServerRow],
    active: &[ReservationRow],
    plan: &TargetPlan,
) -> Result<(), String> {
    let mine: Vec<ReservationRow> = active
        .iter()
        .filter(|r| r.owner_uid == owner_uid && r.pool_id == pool_id)
        .cloned()
        .collect();
    let held = promised_per_server(&mine).into_values().fold(Rates::default(), add);
    let held = plan.promised_per_server.iter().map(|&(_, r)| r).fold(held, add);
    let peak = servers
        .iter()
        .filter(|s| s.pool_id == pool_id)
        .filter_map(|s| s.peaks.as_ref())
        .map(|p| Rates {
            bandwidth_bytes_per_s: p.bandwidth_bytes_per_s,
            iops: p.iops,
            metadata_ops_per_s: p.metadata_ops_per_s,
        })
        .fold(Rates::default(), add);
    let allowed = |peak: u64| (peak as u128 * share_percent as u128 / 100) as u64;
    for (what, held, peak) in [
        ("bytes/s of bandwidth", held.bandwidth_bytes_per_s, peak.bandwidth_bytes_per_s),
        ("IOPS", held.iops, peak.iops),
        ("metadata ops/s", held.metadata_ops_per_s, peak.metadata_ops_per_s),
    ] {
        if held > allowed(peak) {
            return Err(format!(
                "uid {owner_uid} would hold {held} {what} promised in this pool, more than \
                 {share_percent}% of its measured {peak}"
            ));
        }
    }
    Ok(())
}

fn add(a: Rates, b: Rates) -> Rates {
    Rates {
        bandwidth_bytes_per_s: a.bandwidth_bytes_per_s.saturating_add(b.bandwidth_bytes_per_s),
        iops: a.iops.saturating_add(b.iops),
        metadata_ops_per_s: a.metadata_ops_per_s.saturating_add(b.metadata_ops_per_s),
    }
}
