//! `spillway stage-in` / `spillway stage-out`: copy files and trees between the PFS and a
//! reservation, in this process (see `spillway_manager::stage` for why), with progress,
//! checksums and resume.

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
    #[arg(long)]
    reservation: String,
    /// Source (stage-in: a PFS path; stage-out: a path in the reservation).
    src: String,
    /// Destination (stage-in: a path in the reservation; stage-out: a PFS path).
    dst: String,
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
    /// Stage-out with --drain: how long the drain may take.
    #[arg(long, default_value_t = 600)]
    drain_timeout_s: u64,
    #[command(flatten)]
    flags: ManagerFlags,
}

fn prepare(args: &Args, direction: &str) -> anyhow::Result<(Reservation, StageOptions)> {
    let reservation: Reservation = args
        .flags
        .client()?
        .get(&format!("/v1/reservations/{}", path_segment(&args.reservation)?))?;
    if reservation.state != spillway_manager::ReservationState::Active {
        anyhow::bail!(
            "reservation {} ({}) is {}",
            reservation.id,
            reservation.name,
            reservation.state.as_str()
        );
    }
    let record = args.record.clone().unwrap_or_else(|| {
        stage::default_record_path(direction, &reservation, &args.src, &args.dst)
    });
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

pub fn run_in(args: Args) -> anyhow::Result<()> {
    if args.drain {
        anyhow::bail!("--drain applies to stage-out only");
    }
    let (reservation, options) = prepare(&args, "in")?;
    let done = stage::stage_in(&reservation, std::path::Path::new(&args.src), &args.dst, &options)
        .map_err(flat)?;
    report("stage-in", &done, args.flags.json)
}

pub fn run_out(args: Args) -> anyhow::Result<()> {
    let (reservation, options) = prepare(&args, "out")?;
    let done = stage::stage_out(&reservation, &args.src, std::path::Path::new(&args.dst), &options)
        .map_err(flat)?;
    report("stage-out", &done, args.flags.json)
}
