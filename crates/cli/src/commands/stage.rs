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
    src: &str,
    dst: &str,
) -> anyhow::Result<(Reservation, StageOptions)> {
    let record = args
        .record
        .clone()
        .unwrap_or_else(|| stage::default_record_path(direction, &reservation, src, dst));
    let mut options = StageOptions::new(record);
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
    let (reservation, options) = prepare(&args, reservation, "in", src, dst)?;
    let done =
        stage::stage_in(&reservation, std::path::Path::new(src), dst, &options).map_err(flat)?;
    report("stage-in", &done, args.flags.json)
}

pub fn run_out(args: Args) -> anyhow::Result<()> {
    if let Some(key) = args.retry.clone() {
        return retry_out(&args, &key);
    }
    let (key, src, dst) = named_stage(&args)?;
    let reservation = active_reservation(&args, key)?;
    let (reservation, options) = prepare(&args, reservation, "out", src, dst)?;
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
        let (reservation, options) =
            prepare(args, reservation.clone(), "out", &pair.src, &pair.dst)?;
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
