//! `spillway stage-in` / `spillway stage-out`: copy files and trees between the PFS and a
//! reservation, in this process (see `spillway_manager::stage` for why), with progress,
//! checksums and resume.
//!
//! `spillway stage-out --retry RESERVATION` finishes a rescue reservation (kept because its
//! job's stage-out failed): its owner redoes every stage-out the job asked for (files an
//! earlier run copied and verified are skipped), and only when all of them are copied and
//! verified is the reservation released.

use std::path::PathBuf;
use std::time::Duration;

use spillway_manager::stage::{self, ProgressMode, StageOptions, StageReport};
use spillway_manager::Reservation;

use super::manager_api::{flat, print_json, ManagerFlags};
use super::reservation::path_segment;
use spillway_types::format_bytes as bytes;

#[derive(clap::Args)]
pub struct Args {
    /// The reservation (id or name).
    #[arg(long, required_unless_present = "retry", conflicts_with = "retry")]
    reservation: Option<String>,
    /// Source (stage-in: a PFS path; stage-out: a path in the reservation).
    #[arg(required_unless_present = "retry", conflicts_with = "retry")]
    src: Option<String>,
    /// Destination (stage-in: a path in the reservation; stage-out: a PFS path).
    #[arg(required_unless_present = "retry", conflicts_with = "retry")]
    dst: Option<String>,
    /// Stage-out: finish the rescue reservation RESERVATION (its job's stage-out failed): redo
    /// its stage-outs, verify, then release it. Its owner only.
    #[arg(long, value_name = "RESERVATION", conflicts_with = "record")]
    retry: Option<String>,
    /// Stage-in: what SRC must be: any (a file or a tree), file, directory, or list (a file of
    /// `SOURCE DESTINATION` lines, each staged to DST/DESTINATION).
    #[arg(long = "type", value_name = "KIND", default_value = "any", value_parser = ["any", "file", "directory", "list"])]
    kind: String,
    /// A private reservation (a namespace per compute node): the node whose namespace is
    /// staged; it exists once that node mounted the reservation.
    #[arg(long, value_name = "NAME", conflicts_with = "retry")]
    node: Option<String>,
    /// Files copied at once (1-64).
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Progress record for resuming (default: under the temp dir, per uid, reservation and paths).
    #[arg(long)]
    record: Option<PathBuf>,
    /// bar, lines or none (default: a bar on a terminal, lines otherwise).
    #[arg(long)]
    progress: Option<String>,
    /// Stage-out: commit and drain the epoch through the drain path first, then copy the
    /// drained files.
    #[arg(long)]
    drain: bool,
    /// Stage-out: how long the wait for a PFS slot (the manager's cross-job drain scheduler)
    /// may take, and with --drain how long the drain may take (1 s to 30 days: a deadline
    /// past that would overflow the clock).
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=2_592_000))]
    drain_timeout_s: u64,
    #[command(flatten)]
    flags: ManagerFlags,
}

/// The active reservation `key`.
fn active_reservation(args: &Args, key: &str) -> anyhow::Result<Reservation> {
    let reservation: Reservation =
        args.flags.client()?.get(&format!("/v1/reservations/{}", path_segment(key)?))?;
    if reservation.state != spillway_manager::ReservationState::Active {
        anyhow::bail!(
            "reservation {} ({}) is {}",
            reservation.id,
            reservation.name,
            reservation.state.as_str()
        );
    }
    Ok(reservation)
}

/// The reservation and the stage's settings, for `src` to `dst` (the progress record: `--record`
/// or the default one for these paths, which a rerun or `--retry` finds again).
fn prepare(
    args: &Args,
    reservation: Reservation,
    direction: &str,
    (src, dst, node): (&str, &str, Option<&str>),
) -> anyhow::Result<(Reservation, StageOptions)> {
    let record = args
        .record
        .clone()
        .unwrap_or_else(|| stage::default_record_path(direction, &reservation, src, dst, node));
    let mut options = StageOptions::new(record);
    options.node = node.map(str::to_string);
    if !(1..=64).contains(&args.parallel) {
        anyhow::bail!("--parallel {}: expected 1 to 64 files at once", args.parallel);
    }
    options.parallel_files = args.parallel;
    options.progress = match args.progress.as_deref() {
        None => ProgressMode::for_stderr(),
        Some("bar") => ProgressMode::Bar,
        Some("lines") => ProgressMode::Lines { interval: Duration::from_secs(5) },
        Some("none") => ProgressMode::Silent,
        Some(other) => anyhow::bail!("--progress {other:?}: expected bar, lines or none"),
    };
    options.drain_first = args.drain;
    options.drain_timeout = Duration::from_secs(args.drain_timeout_s);
    // A stage-out's drain and copy write the PFS: they wait for a PFS slot from the manager's
    // cross-job drain scheduler (docs/design/ias.md). A stage-in only reads the PFS.
    options.drain_slots = Some(std::sync::Arc::new(args.flags.client()?.0));
    Ok((reservation, options))
}

fn report(direction: &str, report: &StageReport, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(report);
    }
    println!(
        "{direction}: {} files ({}) copied and verified, {} already complete, {} total in {:.1} s{}",
        report.files_copied,
        bytes(report.bytes_copied),
        report.files_skipped,
        bytes(report.bytes_total),
        report.elapsed_ms as f64 / 1000.0,
        if report.files_from_drained_copy > 0 {
            format!(", {} read from their drained copy", report.files_from_drained_copy)
        } else {
            String::new()
        }
    );
    Ok(())
}

/// `--reservation`, SRC and DST (clap requires them unless `--retry`).
fn named_stage(args: &Args) -> anyhow::Result<(&str, &str, &str)> {
    match (&args.reservation, &args.src, &args.dst) {
        (Some(reservation), Some(src), Some(dst)) => Ok((reservation, src, dst)),
        _ => anyhow::bail!(
            "give --reservation RESERVATION SRC DST (or stage-out --retry RESERVATION)"
        ),
    }
}

pub fn run_in(args: Args) -> anyhow::Result<()> {
    if args.drain {
        anyhow::bail!("--drain applies to stage-out only");
    }
    if args.retry.is_some() {
        anyhow::bail!("--retry applies to stage-out only (a rescue reservation's stage-outs)");
    }
    let (key, src, dst) = named_stage(&args)?;
    let reservation = active_reservation(&args, key)?;
    let pairs = match args.kind.as_str() {
        "list" => {
            if args.record.is_some() {
                anyhow::bail!(
                    "--record cannot be given with --type list (each entry keeps its own)"
                );
            }
            read_stage_list(std::path::Path::new(src), dst)?
        }
        kind => {
            check_source_kind(std::path::Path::new(src), kind)?;
            vec![(src.to_string(), dst.to_string())]
        }
    };
    let mut reports = Vec::with_capacity(pairs.len());
    for (src, dst) in &pairs {
        let (reservation, options) =
            prepare(&args, reservation.clone(), "in", (src, dst, args.node.as_deref()))?;
        let done = stage::stage_in(&reservation, std::path::Path::new(src), dst, &options)
            .map_err(|e| anyhow::anyhow!("{src} -> {dst}: {e}"))?;
        if !args.flags.json {
            report("stage-in", &done, false)?;
        }
        reports.push(done);
    }
    match (args.flags.json, reports.as_slice()) {
        (true, [one]) if args.kind != "list" => print_json(one),
        (true, _) => print_json(&reports),
        (false, _) => Ok(()),
    }
}

/// `--type file|directory`: SRC (symbolic links followed) is what was asked for.
fn check_source_kind(src: &std::path::Path, kind: &str) -> anyhow::Result<()> {
    if kind == "any" {
        return Ok(());
    }
    let meta = std::fs::metadata(src).map_err(|e| anyhow::anyhow!("{}: {e}", src.display()))?;
    let what = if meta.is_dir() {
        "a directory"
    } else if meta.is_file() {
        "a regular file"
    } else {
        "neither a regular file nor a directory"
    };
    match kind {
        "file" if !meta.is_file() => {
            anyhow::bail!("{}: is {what}, and type=file was asked", src.display())
        }
        "directory" if !meta.is_dir() => {
            anyhow::bail!("{}: is {what}, and type=directory was asked", src.display())
        }
        _ => Ok(()),
    }
}

/// Longest stage list read (bytes) and most entries taken from it.
const STAGE_LIST_BYTES_MAX: u64 = 1 << 20;
const STAGE_LIST_ENTRIES_MAX: usize = 10_000;

/// The pairs of a stage list (`--type list`): one `SOURCE DESTINATION` per line (quoted like
/// directive values; empty lines and `#` comments skipped), SOURCE an absolute PFS path and
/// DESTINATION relative to `dst` in the reservation. Read as the caller, like every source.
fn read_stage_list(list: &std::path::Path, dst: &str) -> anyhow::Result<Vec<(String, String)>> {
    let shown = list.display();
    let meta = std::fs::metadata(list).map_err(|e| anyhow::anyhow!("stage list {shown}: {e}"))?;
    if !meta.is_file() {
        anyhow::bail!("stage list {shown}: not a regular file");
    }
    if meta.len() > STAGE_LIST_BYTES_MAX {
        anyhow::bail!(
            "stage list {shown}: {} is more than the {} a list may hold",
            bytes(meta.len()),
            bytes(STAGE_LIST_BYTES_MAX)
        );
    }
    let text =
        std::fs::read_to_string(list).map_err(|e| anyhow::anyhow!("stage list {shown}: {e}"))?;
    let mut pairs = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let words = spillway_slurm::directive::split_quoted(trimmed).ok_or_else(|| {
            anyhow::anyhow!("stage list {shown} line {number}: unterminated quote")
        })?;
        let [source, destination] = words.as_slice() else {
            anyhow::bail!(
                "stage list {shown} line {number}: expected `SOURCE DESTINATION`, got {} words",
                words.len()
            );
        };
        if !source.starts_with('/') || source.split('/').any(|c| c == "..") {
            anyhow::bail!("stage list {shown} line {number}: {source:?}: the source must be an absolute PFS path without `..`");
        }
        if destination.starts_with('/') || destination.split('/').any(|c| c == "..") {
            anyhow::bail!("stage list {shown} line {number}: {destination:?}: the destination must be relative (to {dst:?}) without `..`");
        }
        if pairs.len() == STAGE_LIST_ENTRIES_MAX {
            anyhow::bail!("stage list {shown}: more than {STAGE_LIST_ENTRIES_MAX} entries");
        }
        let base = dst.trim_end_matches('/');
        let target = match base {
            "" | "." => destination.clone(),
            _ => format!("{base}/{destination}"),
        };
        pairs.push((source.clone(), target));
    }
    if pairs.is_empty() {
        anyhow::bail!("stage list {shown}: no `SOURCE DESTINATION` line");
    }
    Ok(pairs)
}

pub fn run_out(args: Args) -> anyhow::Result<()> {
    if args.kind != "any" {
        anyhow::bail!("--type applies to stage-in only (a stage-out copies a file or a tree, whichever its source is)");
    }
    if let Some(key) = args.retry.clone() {
        return retry_out(&args, &key);
    }
    let (key, src, dst) = named_stage(&args)?;
    let reservation = active_reservation(&args, key)?;
    let (reservation, options) =
        prepare(&args, reservation, "out", (src, dst, args.node.as_deref()))?;
    let done =
        stage::stage_out(&reservation, src, std::path::Path::new(dst), &options).map_err(flat)?;
    report("stage-out", &done, args.flags.json)
}

/// `stage-out --retry`: every stage-out of the rescue reservation, then its release. The first
/// failure stops it with the reservation kept (a later retry resumes from the progress records).
fn retry_out(args: &Args, key: &str) -> anyhow::Result<()> {
    let reservation = active_reservation(args, key)?;
    let Some(rescue) = reservation.rescue.clone() else {
        anyhow::bail!(
            "reservation {} is not a rescue reservation (no stage-out of it failed); stage out with --reservation {} SRC DST",
            reservation.name,
            reservation.name
        );
    };
    // Files land on the PFS as the caller: only the owner may finish it (root and admins see
    // it, but copying as them would give the owner's output someone else's files).
    let uid = spillway_sys::user::uid();
    if uid != reservation.owner {
        anyhow::bail!(
            "reservation {} is uid {}'s rescue reservation; only its owner may retry its stage-out (run it as uid {})",
            reservation.name,
            reservation.owner,
            reservation.owner
        );
    }
    if rescue.stage_outs.is_empty() {
        anyhow::bail!(
            "rescue reservation {} records no stage-out to redo; copy the data with --reservation {} SRC DST, then destroy it",
            reservation.name,
            reservation.name
        );
    }
    let mut total = StageReport::default();
    for pair in &rescue.stage_outs {
        let (reservation, options) = prepare(
            args,
            reservation.clone(),
            "out",
            (&pair.src, &pair.dst, pair.node.as_deref()),
        )?;
        let done =
            stage::stage_out(&reservation, &pair.src, std::path::Path::new(&pair.dst), &options)
                .map_err(|e| {
                    anyhow::anyhow!(
                        "stage-out {} -> {}: {e}; rescue reservation {} kept, retry when the cause is fixed",
                        pair.src,
                        pair.dst,
                        reservation.name
                    )
                })?;
        total.files_total += done.files_total;
        total.files_copied += done.files_copied;
        total.files_skipped += done.files_skipped;
        total.bytes_total += done.bytes_total;
        total.bytes_copied += done.bytes_copied;
        total.elapsed_ms += done.elapsed_ms;
        total.files_from_drained_copy += done.files_from_drained_copy;
    }
    let path = format!("/v1/reservations/{}", reservation.id);
    let released: Reservation = args.flags.client()?.delete(&path).map_err(|e| {
        anyhow::anyhow!(
            "every stage-out of {} is copied and verified, but releasing it failed: {e}",
            reservation.name
        )
    })?;
    report("stage-out --retry", &total, args.flags.json)?;
    if !args.flags.json {
        println!(
            "rescue reservation {} ({}) released: its data is on the PFS",
            released.id, released.name
        );
    }
    Ok(())
}
