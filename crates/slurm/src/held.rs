//! Jobs held for a failed stage-in, or waiting for their performance targets, released once
//! the cause is gone.
//!
//! A stage-in that fails (a missing or unreadable source) makes Slurm hold the job (priority
//! 0, an operator's hold its user cannot release) and, with `Flags=TeardownFailure`, tear its
//! reservation down. Nothing in Slurm ever looks again. So data_in leaves a marker,
//! `<state dir>/held-<job>.json`, naming the job's user and its stage-in sources, and the
//! periodic pools refresh (slurmctld calls slurm_bb_pools every few seconds) checks each held
//! job's sources again *as its user*; once every one is there, it releases the job (`scontrol
//! release`), which runs setup and data_in again. At most [`RELEASES_MAX`] times per job: a
//! source that comes and goes must not make the job thrash. The marker is the hooks' own (in
//! the root-only state directory), so no user can have another's job released.
//!
//! A job whose performance targets (`bandwidth=`, `iops=`, `metadata=`) the pool cannot serve
//! now, beside what other reservations were promised, fails setup the same way (Slurm's
//! burst_buffer/lua accounts capacity only, so it cannot hold such a job as
//! `BurstBufferResources` by itself): setup leaves a marker with its `reservation create`
//! arguments, and the refresh asks the manager the same request as a dry run; once it would
//! be placed, the job is released and setup runs again.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::commands::output_within;
use crate::directive::{Stage, StageKind};
use crate::hooks::Hooks;
use crate::job::JobRecord;
use crate::node::note_on_job;

/// Releases per job after failed stage-ins; then it stays held for an operator.
pub(crate) const RELEASES_MAX: u32 = 5;

/// How long one `scontrol` call or one sources check may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A job held for its failed stage-in.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct HeldJob {
    pub(crate) job: u64,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// `KIND:PFS_PATH` of every stage-in source (what `bb sources-ready` checks).
    pub(crate) sources: Vec<String>,
    /// Times the refresh released the job so far.
    pub(crate) releases: u32,
    /// Set when the job waits for its performance targets instead: setup's `reservation
    /// create` arguments, which the refresh runs with `--dry-run`.
    #[serde(default)]
    pub(crate) targets: Option<Vec<String>>,
}

/// How the manager says targets can never be met (`CreateReservationError::TargetsUnmeetable`).
const TARGETS_UNMEETABLE: &str = "targets cannot be met";

/// Why a held job is not released this time.
enum Waiting {
    /// Not yet: asked again at the next refresh.
    For(String),
    /// Never, as things are (the pool's peaks cannot meet the targets): left to an operator.
    Never(String),
}

/// What Slurm says of a job the hooks hold a marker for.
#[derive(Debug, PartialEq)]
enum SlurmHold {
    /// Pending with priority 0, for the reason our data_in gave: held for its stage-in.
    Held,
    /// Pending with priority 0 for another reason: an operator's or the user's own hold
    /// (`scontrol hold`), which is theirs to release, never ours.
    HeldByOthers,
    /// Pending, not held: released and staging again, or about to be held (data_in wrote
    /// the marker before Slurm held the job).
    Pending,
    /// Running or ended: nothing to retry.
    Past,
    /// Slurm no longer knows the job.
    Gone,
}

impl Hooks {
    fn held_path(&self, job: u64) -> PathBuf {
        self.state_dir.join(format!("held-{job}.json"))
    }

    /// data_in failed for `record`'s job: write (or refresh, keeping its release count) the
    /// job's marker.
    pub(crate) fn note_held(&self, record: &JobRecord, stages: &[Stage]) -> anyhow::Result<()> {
        let releases = self.releases_so_far(record.job);
        let sources =
            stages.iter().map(|s| format!("{}:{}", s.kind.as_str(), s.pfs_path)).collect();
        let (job, uid, gid) = (record.job, record.uid, record.gid);
        self.write_held(&HeldJob { job, uid, gid, sources, releases, targets: None })
    }

    /// setup's request by targets must wait (`create`: its `reservation create` arguments):
    /// write (or refresh, keeping its release count) the job's marker.
    pub(crate) fn note_waiting_for_targets(
        &self,
        record: &JobRecord,
        create: Vec<String>,
    ) -> anyhow::Result<()> {
        let releases = self.releases_so_far(record.job);
        let (job, uid, gid) = (record.job, record.uid, record.gid);
        let targets = Some(create);
        self.write_held(&HeldJob { job, uid, gid, sources: Vec::new(), releases, targets })
    }

    /// The releases the job's marker counts (0 without one): a marker written again keeps them.
    fn releases_so_far(&self, job: u64) -> u32 {
        std::fs::read(self.held_path(job))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<HeldJob>(&bytes).ok())
            .map_or(0, |held| held.releases)
    }

    fn write_held(&self, held: &HeldJob) -> anyhow::Result<()> {
        self.write_state(&self.held_path(held.job), held)
    }

    /// Every marker: release the held jobs whose sources are all there now, forget the jobs
    /// Slurm released, ran or forgot. Failures are logged to stderr; the refresh goes on.
    pub(crate) fn retry_held(&self) {
        let entries = std::fs::read_dir(&self.state_dir).into_iter().flatten().flatten();
        let markers: Vec<PathBuf> = entries
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with("held-") && n.ends_with(".json") && !n.ends_with(".tmp")
                })
            })
            .collect();
        for marker in markers {
            if let Err(e) = self.retry_one(&marker) {
                eprintln!("spillway bb: held job {}: {e:#}", marker.display());
            }
        }
    }

    fn retry_one(&self, marker: &Path) -> anyhow::Result<()> {
        let bytes =
            std::fs::read(marker).with_context(|| format!("reading {}", marker.display()))?;
        let Ok(mut held) = serde_json::from_slice::<HeldJob>(&bytes) else {
            // Not ours, or half written by a crash: nothing to act on.
            return std::fs::remove_file(marker).context("removing an unreadable marker");
        };
        match slurm_hold(held.job) {
            Some(SlurmHold::Held) => {}
            Some(SlurmHold::Pending) => return Ok(()),
            Some(SlurmHold::HeldByOthers) => {
                return std::fs::remove_file(marker).context("removing the marker");
            }
            Some(SlurmHold::Past | SlurmHold::Gone) => {
                return std::fs::remove_file(marker).context("removing the marker");
            }
            None => return Ok(()), // Slurm did not answer: ask again next time
        }
        let cause = if held.targets.is_some() { "setup" } else { "stage-in" };
        if held.releases >= RELEASES_MAX {
            note_on_job(
                held.job,
                &format!("spillway: {cause} failed {} times; not released again: `scontrol release {}` as an operator once the cause is gone", held.releases + 1, held.job),
            );
            return std::fs::remove_file(marker).context("removing the marker");
        }
        let ready = match &held.targets {
            Some(create) => self.targets_fit(&held, create),
            None => self.sources_ready(&held).map(drop).map_err(|missing| {
                Waiting::For(format!("held until its stage-in sources are there: {missing}"))
            }),
        };
        match ready {
            Ok(()) => {}
            Err(Waiting::For(what)) => {
                // The job's reason already names the error; say what is awaited.
                note_on_job(held.job, &format!("spillway: {what}"));
                return Ok(());
            }
            Err(Waiting::Never(why)) => {
                note_on_job(held.job, &format!("spillway: not released: {why}"));
                return std::fs::remove_file(marker).context("removing the marker");
            }
        }
        let mut release = Command::new("scontrol");
        release.args(["release", &held.job.to_string()]).stdin(Stdio::null());
        output_within(&mut release, CALL_TIMEOUT, "scontrol release")?;
        held.releases += 1;
        self.write_held(&held)?;
        let now = match held.targets {
            Some(_) => "its performance targets fit now",
            None => "stage-in sources are there now",
        };
        let retry = format!("retry {} of {RELEASES_MAX}", held.releases);
        note_on_job(held.job, &format!("spillway: {now}; released ({retry})"));
        println!("spillway bb: job {}: {now}; released", held.job);
        Ok(())
    }

    /// Whether setup's request by targets (`create`) would be placed now: a dry run of it. Or
    /// whether the job's user has its reservation already: Slurm 22.05 may run setup again by
    /// itself while the job is held, and once that succeeds a dry run can only say the name is
    /// taken; released, setup adopts the reservation.
    fn targets_fit(&self, held: &HeldJob, create: &[String]) -> Result<(), Waiting> {
        let name = create
            .iter()
            .position(|word| word == "--persistent")
            .and_then(|at| create.get(at + 1).cloned())
            .unwrap_or_else(|| crate::job::job_reservation_name(held.job));
        let show = ["reservation", "show", name.as_str(), "--json"];
        if let Ok(shown) = self.manager_timed(&show, CALL_TIMEOUT) {
            let owner = serde_json::from_str::<serde_json::Value>(shown.trim())
                .ok()
                .and_then(|reservation| reservation["owner"].as_u64());
            if owner == Some(u64::from(held.uid)) {
                return Ok(());
            }
        }
        let mut args: Vec<&str> = create.iter().map(String::as_str).collect();
        args.push("--dry-run");
        let why = match self.manager_timed(&args, CALL_TIMEOUT) {
            Ok(_) => return Ok(()),
            Err(e) => format!("{e:#}"),
        };
        if why.contains(TARGETS_UNMEETABLE) {
            return Err(Waiting::Never(why));
        }
        // Busy, or the manager down, or a quota reached meanwhile: ask again next time.
        Err(Waiting::For(format!("waits for its performance targets: {why}")))
    }

    /// Runs `spillway bb sources-ready` as the job's user; `Err` carries its complaint.
    fn sources_ready(&self, held: &HeldJob) -> Result<u64, String> {
        self.sources_ready_as(held.uid, held.gid, &held.sources)
    }

    /// Runs `spillway bb sources-ready SOURCES` as `uid`/`gid` and its groups: the sources'
    /// bytes, or its complaint.
    pub(crate) fn sources_ready_as(
        &self,
        uid: u32,
        gid: u32,
        sources: &[String],
    ) -> Result<u64, String> {
        let mut command = self.spillway().map_err(|e| format!("{e:#}"))?;
        command.args(["bb", "sources-ready"]).args(sources);
        let groups = spillway_sys::user::groups_of(uid, gid)
            .map_err(|e| format!("groups of uid {uid}: {e}"))?;
        spillway_sys::process::run_as(&mut command, uid, gid, &groups);
        let output = output_within(&mut command, CALL_TIMEOUT, "spillway bb sources-ready")
            .map_err(|e| format!("{e:#}"))?;
        output
            .trim()
            .parse()
            .map_err(|_| format!("spillway bb sources-ready printed {output:?}, not a byte count"))
    }
}

/// Most entries `bb sources-ready` visits under a directory source before it stops counting.
const SOURCE_ENTRIES_MAX: usize = 1_000_000;

/// `spillway bb sources-ready KIND:PATH…` (run as the job's user): every source is there, of
/// its kind, and readable by this user; returns the bytes of their regular files (a list's
/// entries are not counted).
pub(crate) fn sources_ready(sources: &[String]) -> anyhow::Result<u64> {
    let mut bytes = 0u64;
    for source in sources {
        let (kind, path) =
            source.split_once(':').with_context(|| format!("{source:?}: expected KIND:PATH"))?;
        let path = Path::new(path);
        let kind = match kind {
            "any" => StageKind::Any,
            "file" => StageKind::File,
            "directory" => StageKind::Directory,
            "list" => StageKind::List,
            other => anyhow::bail!("{source:?}: unknown kind {other:?}"),
        };
        let meta = std::fs::metadata(path).with_context(|| path.display().to_string())?;
        let readable = if meta.is_dir() {
            std::fs::read_dir(path).map(drop)
        } else {
            std::fs::File::open(path).map(drop)
        };
        readable.with_context(|| path.display().to_string())?;
        let fits = match kind {
            StageKind::Any => meta.is_file() || meta.is_dir(),
            StageKind::File | StageKind::List => meta.is_file(),
            StageKind::Directory => meta.is_dir(),
        };
        if !fits {
            anyhow::bail!("{}: not a {}", path.display(), kind.as_str());
        }
        bytes = bytes.saturating_add(match kind {
            StageKind::List => 0,
            _ if meta.is_dir() => tree_bytes(path)?,
            _ => meta.len(),
        });
    }
    Ok(bytes)
}

/// The bytes of the regular files under `root` (symbolic links not followed), counting at most
/// [`SOURCE_ENTRIES_MAX`] entries.
fn tree_bytes(root: &Path) -> anyhow::Result<u64> {
    let (mut bytes, mut entries) = (0u64, 0usize);
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| dir.display().to_string())? {
            let entry = entry.with_context(|| dir.display().to_string())?;
            entries += 1;
            if entries > SOURCE_ENTRIES_MAX {
                anyhow::bail!("{}: more than {SOURCE_ENTRIES_MAX} entries", root.display());
            }
            let meta = entry.metadata().with_context(|| entry.path().display().to_string())?;
            if meta.is_dir() {
                pending.push(entry.path());
            } else if meta.is_file() {
                bytes = bytes.saturating_add(meta.len());
            }
        }
    }
    Ok(bytes)
}

/// Whether Slurm holds `job` (pending at priority 0); `None` when scontrol cannot say.
fn slurm_hold(job: u64) -> Option<SlurmHold> {
    match crate::node::show_job(job) {
        Ok(line) => Some(hold_of(&line)),
        Err(e) if format!("{e:#}").contains("Invalid job id") => Some(SlurmHold::Gone),
        Err(_) => None,
    }
}

/// The hold a line of `scontrol -o show job` shows. A stage-in failure's reason is data_in's
/// message (`burst_buffer/lua:_…:_spillway:_job_7:_stage-in_…`, blanks as `_`); a hold by
/// `scontrol hold` says `JobHeldAdmin` or `JobHeldUser`.
fn hold_of(line: &str) -> SlurmHold {
    let field = |key: &str| {
        line.split_whitespace().find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
    };
    let ours = field("Reason").is_some_and(|reason| reason.contains("spillway"));
    match (field("JobId"), field("JobState"), field("Priority")) {
        (None, _, _) => SlurmHold::Gone,
        (Some(_), Some("PENDING"), Some("0")) if ours => SlurmHold::Held,
        (Some(_), Some("PENDING"), Some("0")) => SlurmHold::HeldByOthers,
        (Some(_), Some("PENDING"), _) => SlurmHold::Pending,
        _ => SlurmHold::Past,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pending_job_at_priority_zero_is_held() {
        let line = |state: &str, priority: &str| {
            format!(
                "JobId=7 Priority={priority} JobState={state} Reason=burst_buffer/lua:_slurm_bb_data_in:_spillway:_job_7:_failed"
            )
        };
        assert_eq!(hold_of(&line("PENDING", "0")), SlurmHold::Held);
        // An operator's or the user's own hold is never ours to release.
        let admin = "JobId=7 Priority=0 JobState=PENDING Reason=JobHeldAdmin Dependency=(null)";
        assert_eq!(hold_of(admin), SlurmHold::HeldByOthers);
        let user = "JobId=7 Priority=0 JobState=PENDING Reason=JobHeldUser";
        assert_eq!(hold_of(user), SlurmHold::HeldByOthers);
        assert_eq!(hold_of(&line("PENDING", "4294901758")), SlurmHold::Pending);
        assert_eq!(hold_of(&line("RUNNING", "0")), SlurmHold::Past);
        assert_eq!(hold_of(&line("CANCELLED", "0")), SlurmHold::Past);
        assert_eq!(hold_of(""), SlurmHold::Gone);
    }

    #[test]
    fn sources_are_checked_by_kind_and_readability() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let (file, dir_path) = (file.display().to_string(), dir.path().display().to_string());
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/g"), b"yyy").unwrap();
        let bytes = sources_ready(&[
            format!("file:{file}"),
            format!("directory:{dir_path}"),
            format!("any:{dir_path}"),
        ])
        .unwrap();
        assert_eq!(bytes, 1 + 4 + 4, "the file, then the tree (f and sub/g) twice");
        assert_eq!(
            sources_ready(&[format!("list:{file}")]).unwrap(),
            0,
            "a list's entries are not counted"
        );
        let wrong = sources_ready(&[format!("directory:{file}")]).unwrap_err();
        assert!(format!("{wrong:#}").contains("not a directory"), "{wrong:#}");
        let missing = sources_ready(&[format!("any:{dir_path}/nope")]).unwrap_err();
        assert!(format!("{missing:#}").contains("nope"), "{missing:#}");
        assert!(sources_ready(&["file".to_string()]).is_err());
    }
}
