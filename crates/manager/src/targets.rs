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
        sum.bandwidth_bytes_per_s =
            sum.bandwidth_bytes_per_s.saturating_add(rates.bandwidth_bytes_per_s);
        sum.iops = sum.iops.saturating_add(rates.iops);
        sum.metadata_ops_per_s = sum.metadata_ops_per_s.saturating_add(rates.metadata_ops_per_s);
    }
    promised
}

/// A server's measured peaks as the planner takes them: one server's metadata rate is what
/// one striped namespace on it gets, and what the private namespaces it holds share. Not
/// measured: zeros, so it meets no rate.
fn peaks_of(server: &ServerRow) -> ServerPeaks {
    server.peaks.as_ref().map_or_else(ServerPeaks::default, |peaks| ServerPeaks {
        bandwidth_bytes_per_s: peaks.bandwidth_bytes_per_s,
        iops: peaks.iops,
        metadata_striped_ops_per_s: peaks.metadata_ops_per_s,
        metadata_private_ops_per_s: peaks.metadata_ops_per_s,
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
