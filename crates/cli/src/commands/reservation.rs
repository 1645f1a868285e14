//! `spillway reservation create|show|list|modify|destroy|snapshot`: burst buffer reservations.
//!
//! Job-scoped reservations are named `job-<JOBID>` and destroyed at teardown; persistent ones
//! are named and destroyed explicitly. The manager decides pool, servers, stream and epoch and
//! checks ownership from the socket's peer credentials; root (or the admin group) may create for
//! another uid with `--owner UID --group GID` (the Slurm hooks do).

use spillway_manager::{
    Access, CreateReservation, Degraded, MarkRescue, ModifyReservation, RegisterJob,
    RepairProgress, Reservation, StageOutPair,
};
use spillway_types::parse_size;

use super::manager_api::{print_json, print_table, ManagerFlags};
use spillway_types::format_bytes as bytes;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

fn parse_access(text: &str) -> Result<Access, String> {
    text.parse::<Access>()
}

#[derive(clap::Subcommand)]
enum Command {
    /// Create a reservation; prints it (with --json: one object).
    Create(Box<CreateArgs>),
    /// Show one reservation by id or name.
    Show {
        reservation: String,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// List your reservations (root and admins: --all for everyone's).
    List {
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Grow a reservation on its servers, or share a persistent one (its owner, root or the
    /// admin group).
    Modify {
        reservation: String,
        #[command(flatten)]
        change: ModifyFlags,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Destroy a reservation and delete its data on the servers.
    Destroy {
        reservation: String,
        /// Refuse unless the reservation belongs to this job (teardown's safety check).
        #[arg(long, value_name = "JOBID")]
        job: Option<String>,
        /// Destroy a persistent reservation even though Slurm jobs use it (root only).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Record that a Slurm job uses a persistent reservation (root or admin group; the Slurm
    /// setup hook does): it is not destroyed under the job.
    RegisterJob {
        reservation: String,
        #[arg(long, value_name = "JOBID")]
        job: String,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Keep a job reservation whose stage-out failed as a rescue reservation (root or admin
    /// group; the Slurm stage-out hook does): teardown leaves it, its owner finishes it with
    /// `spillway stage-out --retry`.
    MarkRescue {
        reservation: String,
        /// The stage-out error.
        #[arg(long)]
        error: String,
        /// A stage-out's source in the reservation (repeatable; paired in order with --to).
        #[arg(long = "from", value_name = "PATH")]
        from: Vec<String>,
        /// A stage-out's PFS destination (repeatable; paired in order with --from).
        #[arg(long = "to", value_name = "PATH")]
        to: Vec<String>,
        /// A private reservation's: the node whose namespace each --from is in (one per
        /// --from, in order, or none).
        #[arg(long = "node", value_name = "NAME")]
        node: Vec<String>,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Store the reservation's namespace (its file names and paths) in its data epoch on every
    /// server, so that losing the server holding the namespace loses no path: stage-out and
    /// the drain then use the newest snapshot (Slurm's post_run takes one after every job).
    Snapshot {
        reservation: String,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Record that a Slurm job no longer uses a persistent reservation (the teardown hook does).
    UnregisterJob {
        reservation: String,
        #[arg(long, value_name = "JOBID")]
        job: String,
        #[command(flatten)]
        flags: ManagerFlags,
    },
}

/// What `reservation modify` changes.
#[derive(clap::Args)]
struct ModifyFlags {
    /// The new capacity; never smaller (its data may already live anywhere in it).
    #[arg(long, value_parser = parse_size)]
    capacity: Option<u64>,
    /// Persistent: let this uid use it (repeatable).
    #[arg(long = "share-uid", value_name = "UID")]
    share_uids: Vec<u32>,
    /// Persistent: let members of this group use it (repeatable).
    #[arg(long = "share-gid", value_name = "GID")]
    share_gids: Vec<u32>,
    /// Persistent: no longer let this uid use it (repeatable).
    #[arg(long = "unshare-uid", value_name = "UID")]
    unshare_uids: Vec<u32>,
    /// Persistent: no longer let this group use it (repeatable).
    #[arg(long = "unshare-gid", value_name = "GID")]
    unshare_gids: Vec<u32>,
}

/// `reservation modify`: the change as the API takes it.
fn modify(reservation: &str, change: ModifyFlags, flags: &ManagerFlags) -> anyhow::Result<()> {
    let change = ModifyReservation {
        capacity_bytes: change.capacity,
        share_uids: change.share_uids,
        share_gids: change.share_gids,
        unshare_uids: change.unshare_uids,
        unshare_gids: change.unshare_gids,
    };
    let path = format!("/v1/reservations/{}", path_segment(reservation)?);
    let modified: Reservation = flags.client()?.patch(&path, &change)?;
    show(&modified, flags.json)
}

/// A tiering strategy by name, for `--tiering`.
/// Performance targets of `reservation create` (docs/design/targets.md): the manager places the
/// reservation on servers whose measured peaks, less what is already promised there, meet them.
/// `reservation create`.
#[derive(clap::Args)]
struct CreateArgs {
    /// Capacity (64MiB, 200GiB, 1G = GiB, 10GB = 10^10 bytes); granted in whole fragments.
    /// May be left out when a performance target is given (the plan's fragments are then
    /// the capacity).
    #[arg(long, value_parser = parse_size, required_unless_present_any = ["bandwidth", "iops", "metadata"])]
    capacity: Option<u64>,
    #[command(flatten)]
    targets: TargetFlags,
    /// Pool; chosen by BIOS Algorithm 2 when absent.
    #[arg(long)]
    pool: Option<String>,
    /// striped (one namespace for every node; the default) or private (one per node). With a
    /// metadata target, left out: the plan chooses.
    #[arg(long, value_parser = parse_access)]
    access: Option<Access>,
    /// Make it persistent under this name (else job-scoped).
    #[arg(long, value_name = "NAME")]
    persistent: Option<String>,
    /// The Slurm job id (names job-scoped reservations `job-<JOBID>`).
    #[arg(long, value_name = "JOBID")]
    job: Option<String>,
    /// Create for this uid (root or admin group only); needs --group.
    #[arg(long, value_name = "UID")]
    owner: Option<u32>,
    #[arg(long, value_name = "GID")]
    group: Option<u32>,
    /// Persistent: other uids allowed to use it (repeatable).
    #[arg(long = "allow-uid", value_name = "UID")]
    allow_uids: Vec<u32>,
    /// Persistent: groups whose members may use it (repeatable).
    #[arg(long = "allow-gid", value_name = "GID")]
    allow_gids: Vec<u32>,
    /// Copies of every committed byte until drained, each on another host (1–4); capacity
    /// is taken K times on the servers.
    #[arg(long, value_name = "K", default_value_t = 1)]
    replicas: u32,
    /// Tiering strategy of its jobs' I/O phases: baseline, high-priority,
    /// interference-aware or measured (default: the site's, manager.tiering_default).
    #[arg(long, value_name = "STRATEGY", value_parser = parse_strategy)]
    tiering: Option<spillway_policy::Strategy>,
    /// Only check and place the request: print the reservation it would be (id 0), or the
    /// error creating it would give now; nothing is created.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    flags: ManagerFlags,
}

#[derive(clap::Args)]
struct TargetFlags {
    /// Bandwidth target, e.g. 2GiB/s or 500MB/s.
    #[arg(long, value_parser = |t: &str| spillway_policy::targets::parse_bandwidth(t).map_err(|e| e.to_string()))]
    bandwidth: Option<u64>,
    /// Small-operation (4 KiB) target, operations per second, e.g. 20k.
    #[arg(long, value_parser = |t: &str| spillway_policy::targets::parse_ops_rate("iops", t).map_err(|e| e.to_string()))]
    iops: Option<u64>,
    /// Metadata target, operations per second, e.g. 5k/s.
    #[arg(long, value_parser = |t: &str| spillway_policy::targets::parse_ops_rate("metadata", t).map_err(|e| e.to_string()))]
    metadata: Option<u64>,
}

fn parse_strategy(text: &str) -> Result<spillway_policy::Strategy, String> {
    spillway_policy::Strategy::parse(text).ok_or_else(|| {
        format!("{text:?}: expected baseline, high-priority, interference-aware or measured")
    })
}

/// `reservation list [--all]`.
fn list(all: bool, flags: &ManagerFlags) -> anyhow::Result<()> {
    let path = if all { "/v1/reservations?all=1" } else { "/v1/reservations" };
    let list: Vec<Reservation> = flags.client()?.get(path)?;
    if flags.json {
        return print_json(&list);
    }
    print_reservations(&list);
    Ok(())
}

/// `reservation create`.
fn create(args: CreateArgs) -> anyhow::Result<()> {
    let CreateArgs {
        capacity,
        targets,
        pool,
        access,
        persistent,
        job,
        owner,
        group,
        allow_uids,
        allow_gids,
        replicas,
        tiering,
        dry_run,
        flags,
    } = args;
    let request = CreateReservation {
        capacity_bytes: capacity.unwrap_or(0),
        bandwidth_bytes_per_s: targets.bandwidth,
        iops: targets.iops,
        metadata_ops_per_s: targets.metadata,
        pool,
        access,
        persistent,
        job,
        owner,
        group,
        allowed_uids: allow_uids,
        allowed_gids: allow_gids,
        replicas: Some(replicas),
        tiering,
        dry_run,
    };
    let reservation: Reservation = flags.client()?.post("/v1/reservations", &request)?;
    if dry_run && !flags.json {
        println!("dry run: nothing was created; the reservation would be:");
    }
    show(&reservation, flags.json)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Create(args) => create(*args),
        Command::Show { reservation, flags } => {
            let reservation: Reservation = flags
                .client()?
                .get(&format!("/v1/reservations/{}", path_segment(&reservation)?))?;
            show(&reservation, flags.json)
        }
        Command::List { all, flags } => list(all, &flags),
        Command::Modify { reservation, change, flags } => modify(&reservation, change, &flags),
        Command::Destroy { reservation, job, force, flags } => {
            destroy(&reservation, job.as_deref(), force, &flags)
        }
        Command::RegisterJob { reservation, job, flags } => {
            let path = format!("/v1/reservations/{}/jobs", path_segment(&reservation)?);
            let registered: Reservation =
                flags.client()?.post(&path, &RegisterJob { job: path_segment(&job)?.into() })?;
            show(&registered, flags.json)
        }
        Command::MarkRescue { reservation, error, from, to, node, flags } => {
            mark_rescue(&reservation, error, (from, to, node), &flags)
        }
        Command::Snapshot { reservation, flags } => snapshot(&reservation, &flags),
        Command::UnregisterJob { reservation, job, flags } => {
            let path = format!(
                "/v1/reservations/{}/jobs/{}",
                path_segment(&reservation)?,
                path_segment(&job)?
            );
            let unregistered: Reservation = flags.client()?.delete(&path)?;
            show(&unregistered, flags.json)
        }
    }
}

/// `reservation snapshot`: the namespace's name map stored in its data epoch.
fn snapshot(reservation: &str, flags: &ManagerFlags) -> anyhow::Result<()> {
    let reservation: Reservation =
        flags.client()?.get(&format!("/v1/reservations/{}", path_segment(reservation)?))?;
    let files = spillway_manager::stage::snapshot_namespace(&reservation)?;
    if flags.json {
        return print_json(&serde_json::json!({ "reservation": reservation.name, "files": files }));
    }
    println!("reservation {}: snapshot of its namespace stored ({files} files)", reservation.name);
    Ok(())
}

/// `reservation mark-rescue`: the stage-outs are the `--from`/`--to` pairs (with `--node`, a
/// private reservation's), in order.
fn mark_rescue(
    reservation: &str,
    error: String,
    (from, to, nodes): (Vec<String>, Vec<String>, Vec<String>),
    flags: &ManagerFlags,
) -> anyhow::Result<()> {
    if from.len() != to.len() {
        anyhow::bail!("{} --from and {} --to: give one --to per --from", from.len(), to.len());
    }
    if !nodes.is_empty() && nodes.len() != from.len() {
        anyhow::bail!(
            "{} --from and {} --node: give one --node per --from, or none",
            from.len(),
            nodes.len()
        );
    }
    let mut nodes = nodes.into_iter();
    let stage_outs = from
        .into_iter()
        .zip(to)
        .map(|(src, dst)| StageOutPair { src, dst, node: nodes.next() })
        .collect();
    let path = format!("/v1/reservations/{}/rescue", path_segment(reservation)?);
    let marked: Reservation = flags.client()?.post(&path, &MarkRescue { error, stage_outs })?;
    show(&marked, flags.json)
}

/// `reservation destroy`: `?job=` for teardown's check, `force=1` for a reservation in use.
fn destroy(
    reservation: &str,
    job: Option<&str>,
    force: bool,
    flags: &ManagerFlags,
) -> anyhow::Result<()> {
    let mut query = Vec::new();
    if let Some(job) = job {
        query.push(format!("job={}", path_segment(job)?));
    }
    if force {
        query.push("force=1".to_string());
    }
    let mut path = format!("/v1/reservations/{}", path_segment(reservation)?);
    if !query.is_empty() {
        path.push('?');
        path.push_str(&query.join("&"));
    }
    let destroyed: Reservation = flags.client()?.delete(&path)?;
    if flags.json {
        return print_json(&destroyed);
    }
    println!("destroyed reservation {} ({})", destroyed.id, destroyed.name);
    Ok(())
}

/// Ids, names and job ids are `[A-Za-z0-9._-]`; anything else cannot name a reservation.
pub fn path_segment(text: &str) -> anyhow::Result<&str> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        anyhow::bail!(
            "{text:?} is not a reservation id, name or job id (letters, digits, '.', '_', '-')"
        );
    }
    Ok(text)
}

fn show(reservation: &Reservation, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(reservation);
    }
    let r = reservation;
    let servers: Vec<String> = r
        .servers
        .iter()
        .zip(&r.server_fragments)
        .enumerate()
        .map(|(i, (s, f))| match r.server_domains.get(i).cloned().flatten() {
            Some(host) => format!("{s} ({f} fragments, host {host})"),
            None => format!("{s} ({f} fragments)"),
        })
        .collect();
    let rows = vec![
        ("id", r.id.to_string()),
        ("name", r.name.clone()),
        ("owner", format!("uid {} gid {}", r.owner, r.group)),
        (
            "kind",
            if r.persistent {
                "persistent".into()
            } else {
                format!("job {}", r.job.as_deref().unwrap_or("-"))
            },
        ),
        (
            "capacity",
            format!(
                "{} ({} fragments of {}; asked {})",
                bytes(r.capacity_bytes),
                r.fragments,
                bytes(r.fragment_bytes),
                bytes(r.requested_bytes)
            ),
        ),
        ("pool", r.pool.clone()),
        ("replicas", r.replicas.to_string()),
        ("tiering", r.tiering.map_or("site default".into(), |s| s.name().to_string())),
        ("servers", servers.join(", ")),
        ("access", r.access.as_str().into()),
        ("epoch", r.epoch.to_string()),
        ("namespace", r.namespace_id.to_string()),
        ("stream", r.stream.to_string()),
        ("state", state_of(r)),
        (
            "used by",
            if r.jobs.is_empty() { "-".into() } else { format!("jobs {}", r.jobs.join(", ")) },
        ),
    ];
    for (key, value) in rows {
        println!("{key:<10} {value}");
    }
    if let Some(degraded) = &r.degraded {
        println!("{:<10} {}", "degraded", degraded_line(degraded));
    }
    if let Some(repair) = &r.repair {
        println!("{:<10} {}", "repair", repair_line(repair));
    }
    print_targets_and_achieved(r);
    if let Some(rescue) = &r.rescue {
        println!("{:<10} {}", "rescue", rescue.error);
        println!("{:<10} spillway stage-out --retry {}", "retry", r.name);
        println!(
            "{:<10} reclaimable by root and admins from unix time {}",
            "expiry", rescue.reclaimable_unix_s
        );
    }
    Ok(())
}

/// `reservation show`: what a reservation by targets asked and each server promised, and what
/// it achieved (recorded at its teardown).
fn print_targets_and_achieved(r: &Reservation) {
    if let Some(targets) = &r.targets {
        println!("{:<10} {}", "targets", targets.asked);
        for (server, promised) in r.servers.iter().zip(&targets.promised) {
            println!("{:<10} {server}: {}", "promised", rates_text(promised));
        }
        for reason in &targets.why {
            println!("{:<10} {reason}", "why");
        }
    }
    if let Some(achieved) = &r.achieved {
        println!(
            "{:<10} {}/s, {} IOPS, {} metadata ops/s over {:.1} s busy ({} written, {} read; {} of {} servers reported)",
            "achieved",
            bytes(achieved.bandwidth_bytes_per_s),
            achieved.iops,
            achieved.metadata_ops_per_s,
            achieved.busy_ms as f64 / 1000.0,
            bytes(achieved.bytes_written),
            bytes(achieved.bytes_read),
            achieved.servers_reporting,
            r.servers.len()
        );
    }
}

/// `2GiB/s 20k 5k/s`: bandwidth, IOPS, metadata operations per second.
pub fn rates_text(rates: &spillway_policy::targets::Rates) -> String {
    use spillway_policy::targets::{format_bandwidth, format_iops, format_metadata_rate};
    format!(
        "{} {} IOPS {} metadata",
        format_bandwidth(rates.bandwidth_bytes_per_s),
        format_iops(rates.iops),
        format_metadata_rate(rates.metadata_ops_per_s)
    )
}

/// Ended reservations by performance targets: what each asked beside what its servers counted
/// (`-` when its teardown recorded nothing), and each asked rate's achieved/asked ratio.
pub fn print_ended_by_targets(list: &[Reservation]) {
    let rows: Vec<Vec<String>> = list
        .iter()
        .filter_map(|r| {
            let asked = r.targets.as_ref()?.asked;
            let (achieved, ratios) = match &r.achieved {
                Some(a) => achieved_against(&asked, a),
                None => ("-".into(), "-".into()),
            };
            Some(vec![
                r.id.to_string(),
                r.name.clone(),
                r.owner.to_string(),
                asked.to_string(),
                achieved,
                ratios,
            ])
        })
        .collect();
    print_table(&["ID", "NAME", "OWNER", "ASKED", "ACHIEVED", "ACHIEVED/ASKED"], &rows);
}

/// The achieved rates in the dimensions `asked` names (directive syntax), and each ratio.
fn achieved_against(
    asked: &spillway_policy::targets::Targets,
    achieved: &spillway_manager::Achieved,
) -> (String, String) {
    let got = spillway_policy::targets::Targets {
        capacity_bytes: None,
        bandwidth_bytes_per_s: asked.bandwidth_bytes_per_s.map(|_| achieved.bandwidth_bytes_per_s),
        iops: asked.iops.map(|_| achieved.iops),
        metadata_ops_per_s: asked.metadata_ops_per_s.map(|_| achieved.metadata_ops_per_s),
    };
    let pairs = [
        ("bandwidth", asked.bandwidth_bytes_per_s, got.bandwidth_bytes_per_s),
        ("iops", asked.iops, got.iops),
        ("metadata", asked.metadata_ops_per_s, got.metadata_ops_per_s),
    ];
    let ratios: Vec<String> = pairs
        .iter()
        .filter_map(|&(name, asked, got)| {
            let (asked, got) = (asked?, got?);
            Some(format!("{name} {:.2}", got as f64 / asked.max(1) as f64))
        })
        .collect();
    // Display writes `bandwidth=0B/s` for nothing counted; a rate of 0 is still shown.
    (got.to_string(), ratios.join(" "))
}

pub fn print_reservations(list: &[Reservation]) {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|r| {
            vec![
                r.id.to_string(),
                r.name.clone(),
                r.owner.to_string(),
                bytes(r.capacity_bytes),
                r.pool.clone(),
                r.servers.len().to_string(),
                r.access.as_str().into(),
                r.stream.to_string(),
                r.epoch.to_string(),
                state_of(r),
            ]
        })
        .collect();
    print_table(
        &[
            "ID", "NAME", "OWNER", "CAPACITY", "POOL", "SERVERS", "ACCESS", "STREAM", "EPOCH",
            "STATE",
        ],
        &rows,
    );
    for r in list {
        if let Some(degraded) = &r.degraded {
            println!("degraded {}: {}", r.name, degraded_line(degraded));
        }
        if let Some(repair) = &r.repair {
            println!("repair {}: {}", r.name, repair_line(repair));
        }
    }
    // A rescue reservation's error and how to finish it: the owner must see both.
    for r in list {
        if let Some(rescue) = &r.rescue {
            println!(
                "rescue {}: {} (finish it: spillway stage-out --retry {}; root and admins may reclaim it from unix time {})",
                r.name, rescue.error, r.name, rescue.reclaimable_unix_s
            );
        }
    }
}

/// `rescue`, `degraded` (a server lost), or the state.
fn state_of(r: &Reservation) -> String {
    if r.rescue.is_some() {
        "rescue".into()
    } else if r.degraded.is_some() {
        "degraded".into()
    } else {
        r.state.as_str().into()
    }
}

/// Re-replication progress, then `replicas restored`.
fn repair_line(repair: &RepairProgress) -> String {
    match repair.state.as_str() {
        "restored" => format!(
            "replicas restored ({} copied from the survivors of {} onto {})",
            bytes(repair.copied_bytes),
            repair.lost,
            repair.replacement
        ),
        state => format!(
            "{state}: {} of {} copied onto {} (replacing {}){}",
            bytes(repair.copied_bytes),
            bytes(repair.total_bytes),
            repair.replacement,
            repair.lost,
            repair.error.as_deref().map(|e| format!("; {e}")).unwrap_or_default()
        ),
    }
}

fn degraded_line(degraded: &Degraded) -> String {
    format!(
        "lost {}; {}; replacement: {}",
        degraded.lost_servers.join(", "),
        degraded.detail,
        degraded.replacement.as_deref().unwrap_or("none"),
    )
}
