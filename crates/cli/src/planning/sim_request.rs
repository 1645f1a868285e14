//! `spillway sim TRACE --request "bandwidth=… metadata=…" --pool-servers N`: plans the request
//! over a described pool with the manager's planner and replays the trace against the
//! reservation it gives, beside one of the same capacity asked by capacity alone
//! (docs/design/targets.md §5b). Flags and output only; the model is
//! `spillway_sim::reservation`.

use anyhow::{bail, Context};
use serde_json::json;
use spillway_policy::targets::{Rates, Targets};
use spillway_sim::model::SimConfig;
use spillway_sim::reservation::{
    parse_request, plan_text, replay_request, replay_table, Pool, ReplayOptions, RequestReplay,
};
use spillway_trace::{Trace, TraceOp};
use spillway_types::format_bytes;

use super::characterize::PeakArgs;

/// The request and the pool it is planned on.
#[derive(clap::Args)]
pub struct RequestArgs {
    /// Replay against a reservation by performance targets: `capacity=… bandwidth=… iops=…
    /// metadata=…`, as `spillway characterize --request` prints it (a `#BB_LUA` or `#DW
    /// jobdw` prefix is accepted). Needs --pool-servers.
    #[arg(long, conflicts_with_all = ["capacity_mib", "bb_fraction", "svg"])]
    pub request: Option<String>,
    /// With --request: servers in the pool, each with the peaks of --peaks (or the flags).
    #[arg(long, requires = "request")]
    pub pool_servers: Option<u32>,
    #[command(flatten)]
    pub peaks: PeakArgs,
    /// With --request: fragment size, GiB (manager.fragment_bytes; default as the manager's).
    #[arg(long, default_value_t = 200, requires = "request")]
    pub fragment_gib: u64,
    /// With --request: free space on each server, GiB.
    #[arg(long, default_value_t = 6400, requires = "request")]
    pub server_free_gib: u64,
    /// With --request: most servers a reservation stripes over (manager.stripe_servers_max).
    #[arg(long, default_value_t = 16, requires = "request")]
    pub stripe_servers_max: u32,
    /// With --request: rates already promised to other reservations on each server, e.g.
    /// `bandwidth=3GiB/s iops=20k`.
    #[arg(long, requires = "request")]
    pub promised: Option<String>,
    /// With --request: read the trace's inputs from the PFS on first use instead of having them
    /// staged in before the job starts.
    #[arg(long, requires = "request")]
    pub no_stage_in: bool,
    /// With --promised: on the first this many servers only (default: every server).
    #[arg(long, requires = "promised")]
    pub promised_servers: Option<u32>,
}

impl RequestArgs {
    /// Peaks without --request would be silently ignored: refuse them.
    pub fn refuse_without_request(&self) -> anyhow::Result<()> {
        let peaks = &self.peaks;
        if peaks.peaks.is_some()
            || peaks.peak_bandwidth_mib_per_s.is_some()
            || peaks.peak_iops.is_some()
            || peaks.peak_metadata_ops_per_s.is_some()
        {
            bail!("--peaks and --peak-* describe the pool of --request; give --request too");
        }
        Ok(())
    }

    fn pool(&self) -> anyhow::Result<Pool> {
        let Some(servers) = self.pool_servers else {
            bail!("--request needs --pool-servers N (the servers of the pool to plan on)");
        };
        if servers == 0 {
            bail!("--pool-servers must be at least 1");
        }
        if self.fragment_gib == 0 {
            bail!("--fragment-gib must be at least 1");
        }
        let peaks = self.peaks.peaks()?;
        peaks.validate().context("--peaks")?;
        let promised = match &self.promised {
            None => Rates::default(),
            Some(text) => promised_rates(text)?,
        };
        Ok(Pool {
            servers,
            peaks,
            free_bytes_per_server: self.server_free_gib.saturating_mul(1 << 30),
            fragment_bytes: self.fragment_gib << 30,
            stripe_servers_max: self.stripe_servers_max,
            promised,
            promised_servers: self.promised_servers.unwrap_or(servers),
        })
    }
}

/// `--promised`: rates only.
fn promised_rates(text: &str) -> anyhow::Result<Rates> {
    let targets: Targets =
        text.parse().map_err(|error| anyhow::anyhow!("--promised {text:?}: {error}"))?;
    if targets.capacity_bytes.is_some() {
        bail!(
            "--promised {text:?}: promises are rates (bandwidth=, iops=, metadata=), not capacity"
        );
    }
    Ok(Rates {
        bandwidth_bytes_per_s: targets.bandwidth_bytes_per_s.unwrap_or(0),
        iops: targets.iops.unwrap_or(0),
        metadata_ops_per_s: targets.metadata_ops_per_s.unwrap_or(0),
    })
}

/// The trace being replayed.
pub struct Replayed<'a> {
    pub trace: &'a Trace,
    pub name: &'a str,
    /// Time-ordered.
    pub ops: &'a [TraceOp],
}

pub fn run(
    args: &super::sim::Args,
    replayed: &Replayed<'_>,
    base: SimConfig,
) -> anyhow::Result<()> {
    let flags = &args.request;
    let text = flags.request.as_deref().unwrap_or_default();
    let request =
        parse_request(text).map_err(|error| anyhow::anyhow!("--request {text:?}: {error}"))?;
    let pool = flags.pool()?;
    let options = ReplayOptions {
        base,
        pipelines: args.pipelines.unwrap_or(1),
        staged_in: !flags.no_stage_in,
    };
    if options.pipelines == 0 {
        bail!("--pipelines must be at least 1");
    }
    let result = replay_request(replayed.ops, &request, &pool, &options)
        .map_err(|error| anyhow::anyhow!("--request {request}: {error}"))?;
    if args.json {
        print_json(replayed, &pool, &options, &result)
    } else {
        print_text(replayed, &pool, flags.peaks.defaulted(), &result);
        Ok(())
    }
}

fn print_json(
    replayed: &Replayed<'_>,
    pool: &Pool,
    options: &ReplayOptions,
    result: &RequestReplay,
) -> anyhow::Result<()> {
    let trace = replayed.trace;
    let mut output = serde_json::to_value(result)?;
    output["request_text"] = json!(result.request.to_string());
    output["trace"] = json!({
        "name": replayed.name,
        "source": trace.meta.source,
        "executable": trace.meta.executable,
        "synthesized": trace.meta.synthesized,
        "partial": trace.meta.partial_warning(),
        "ops": trace.ops.len(),
        "files": trace.files.len(),
    });
    output["pool"] = serde_json::to_value(pool)?;
    output["chunk_bytes"] = json!(options.base.chunk_bytes);
    output["pfs"] = serde_json::to_value(options.base.pfs)?;
    output["policy"] = serde_json::to_value(options.base.policy)?;
    output["write_back"] = serde_json::to_value(options.base.write_back)?;
    output["staged_in"] = json!(options.staged_in);
    println!("{}", serde_json::to_string_pretty(&output)?);
    Ok(())
}

fn print_text(replayed: &Replayed<'_>, pool: &Pool, default_peaks: bool, result: &RequestReplay) {
    let model = &result.by_targets.at_peaks.model;
    println!(
        "trace {}: {} ops ({} data, {} metadata); a job of {} pipeline(s) like it",
        replayed.name,
        replayed.trace.ops.len(),
        model.data_ops,
        model.metadata_ops,
        result.pipelines
    );
    let peaks = pool.server_peaks();
    println!(
        "pool: {} server(s), each {}/s, {} IOPS, {} metadata ops/s{}; fragments of {}; at most {} servers per reservation",
        pool.servers,
        format_bytes(peaks.bandwidth_bytes_per_s),
        peaks.iops,
        peaks.metadata_striped_ops_per_s,
        if default_peaks { " (the DataWarp paper's Cori fragment: measure yours with `spillway bench peaks`)" } else { "" },
        format_bytes(pool.fragment_bytes),
        pool.stripe_servers_max
    );
    if pool.promised != Rates::default() {
        println!(
            "already promised on servers 1-{}: {}/s, {} IOPS, {} metadata ops/s each",
            pool.promised_servers.min(pool.servers),
            format_bytes(pool.promised.bandwidth_bytes_per_s),
            pool.promised.iops,
            pool.promised.metadata_ops_per_s
        );
    }
    print!("{}", plan_text("by targets", &result.by_targets.plan));
    match (&result.capacity_only, &result.capacity_only_error) {
        (Some(capacity), _) => print!("{}", plan_text("capacity only", &capacity.plan)),
        (None, error) => println!(
            "capacity only (capacity={}): {}",
            spillway_policy::targets::format_capacity(result.capacity_only_bytes),
            error.as_deref().unwrap_or("not placed")
        ),
    }
    println!();
    print!("{}", replay_table(result));
}
