//! The manager's Prometheus samples (docs/design/operations.md, "Metrics"): pools (capacity,
//! use, healthy servers, SSD streams in use), servers, reservations (how many, and each one's
//! granted capacity and bytes held), the tiering board (jobs per tier, observed bandwidth, PFS drain slots) and
//! API request latency. Rendered at each scrape, as an admin sees them.

use spillway_metrics::{Exposition, Histogram};

use crate::service::StatusView;
use crate::Manager;

/// One gauge family from owned label values: `(labels, value)` with `String` values.
fn family(out: &mut Exposition, name: &str, help: &str, samples: &[(Vec<(&str, String)>, f64)]) {
    let borrowed: Vec<(Vec<(&str, &str)>, f64)> = samples
        .iter()
        .map(|(labels, value)| (labels.iter().map(|(k, v)| (*k, v.as_str())).collect(), *value))
        .collect();
    let samples: Vec<(&[(&str, &str)], f64)> =
        borrowed.iter().map(|(labels, value)| (&labels[..], *value)).collect();
    out.gauge_family(name, help, &samples);
}

/// Every sample of the manager now.
pub(crate) fn render(manager: &Manager, api_latency: &Histogram) -> String {
    let mut out = Exposition::new();
    let admin = crate::Caller { uid: 0, gid: 0, groups: vec![0], admin: true };
    match manager.status(&admin, StatusView::Caller) {
        Ok(status) => {
            pools(&mut out, &status.pools);
            servers(&mut out, &status.servers);
            let written = manager.written_bytes().unwrap_or_default();
            reservations(&mut out, &status.reservations, &written);
        }
        Err(error) => tracing::warn!(%error, "metrics: reading the manager's status"),
    }
    tiering(&mut out, &manager.tiers(&admin));
    out.histogram_family(
        "spillway_manager_request_duration_seconds",
        "From an API request's arrival to its answer.",
        &[(&[], api_latency)],
    );
    out.finish()
}

type Samples<'a> = Vec<(Vec<(&'a str, String)>, f64)>;
type PoolValue = dyn Fn(&crate::model::Pool) -> f64;

fn pools(out: &mut Exposition, pools: &[crate::model::Pool]) {
    let each = |value: &PoolValue| -> Samples<'_> {
        pools.iter().map(|p| (vec![("pool", p.name.clone())], value(p))).collect()
    };
    let gauges: [(&str, &str, &PoolValue); 6] = [
        ("spillway_manager_pool_capacity_bytes", "Capacity of the pool's servers.", &|p| {
            p.capacity_bytes as f64
        }),
        ("spillway_manager_pool_used_bytes", "Capacity granted to reservations.", &|p| {
            p.used_bytes as f64
        }),
        ("spillway_manager_pool_free_bytes", "Capacity not granted.", &|p| p.free_bytes as f64),
        ("spillway_manager_pool_servers_healthy", "Servers answering heartbeats.", &|p| {
            p.servers_healthy as f64
        }),
        ("spillway_manager_pool_servers", "Servers in the pool.", &|p| p.servers as f64),
        (
            "spillway_manager_pool_streams_in_use",
            "SSD stream ids of the pool held by at least one key (BIOS).",
            &|p| p.keys_per_stream.iter().filter(|keys| **keys > 0).count() as f64,
        ),
    ];
    for (name, help, value) in gauges {
        family(out, name, help, &each(value));
    }
}

fn servers(out: &mut Exposition, servers: &[crate::model::Server]) {
    let up: Samples<'_> = servers
        .iter()
        .map(|s| {
            let labels = vec![("server", s.address.clone()), ("pool", s.pool.clone())];
            (labels, f64::from(u8::from(s.healthy)))
        })
        .collect();
    family(out, "spillway_manager_server_up", "1 if the server answered its last heartbeats.", &up);
}

fn reservations(
    out: &mut Exposition,
    reservations: &[crate::model::Reservation],
    written: &std::collections::BTreeMap<u64, u64>,
) {
    let labels = |r: &crate::model::Reservation| {
        vec![
            ("reservation", r.name.clone()),
            ("pool", r.pool.clone()),
            ("owner", r.owner.to_string()),
        ]
    };
    let capacity: Samples<'_> =
        reservations.iter().map(|r| (labels(r), r.capacity_bytes as f64)).collect();
    let bytes: Samples<'_> = reservations
        .iter()
        .map(|r| (labels(r), written.get(&r.id).copied().unwrap_or(0) as f64))
        .collect();
    family(
        out,
        "spillway_manager_reservation_written_bytes",
        "Payload bytes each active reservation holds on its servers, at their last heartbeats.",
        &bytes,
    );
    out.gauge("spillway_manager_reservations", "Active reservations.", capacity.len() as f64);
    family(
        out,
        "spillway_manager_reservation_capacity_bytes",
        "Capacity granted to each active reservation.",
        &capacity,
    );
}

fn tiering(out: &mut Exposition, tiers: &crate::tiering::TiersView) {
    let tier = |name: &str, value: f64| (vec![("tier", name.to_string())], value);
    let state = |name: &str, value: u32| (vec![("state", name.to_string())], f64::from(value));
    let snapshot = &tiers.snapshot;
    out.gauge(
        "spillway_manager_active_jobs",
        "Jobs active on the system (IAS's N).",
        f64::from(snapshot.active_jobs),
    );
    family(
        out,
        "spillway_manager_tier_jobs",
        "Jobs in an I/O phase on each shared tier.",
        &[
            tier("burst-buffer", f64::from(snapshot.burst_buffer.concurrent_jobs)),
            tier("pfs", f64::from(snapshot.pfs.concurrent_jobs)),
        ],
    );
    family(
        out,
        "spillway_manager_tier_bandwidth_bytes_per_second",
        "Aggregate bandwidth observed on each shared tier (0: not measured yet).",
        &[
            tier("burst-buffer", snapshot.burst_buffer.bandwidth_bytes_per_s as f64),
            tier("pfs", snapshot.pfs.bandwidth_bytes_per_s as f64),
        ],
    );
    family(
        out,
        "spillway_manager_pfs_drains",
        "Drains holding a PFS slot (running) or waiting for one.",
        &[state("running", tiers.drains_running), state("waiting", tiers.drains_waiting)],
    );
}
