//! The per-job state in the state directory, and the names derived from a job id: the JSON
//! record `setup` writes (the only hook Slurm gives the uid/gid) and every later hook reads,
//! the job's mount point, its mount log, and the name of its job reservation.

use std::path::PathBuf;

use anyhow::{anyhow, Context};
use serde::{Deserialize, Serialize};

use crate::hooks::Hooks;

/// What `setup` learned that later hooks need (only setup receives the uid/gid), and what it
/// made: the record is written before setup asks the manager for anything, and again with the
/// reservation's id once setup created (or adopted) the job's reservation or registered the job
/// with a persistent one. Teardown destroys only that reservation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct JobRecord {
    pub(crate) job: u64,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) reservation: String,
    pub(crate) persistent: bool,
    /// The manager's id of `reservation`, once setup created or adopted it for this job (job
    /// reservation) or registered the job with it (persistent); `None` before.
    #[serde(default)]
    pub(crate) reservation_id: Option<u64>,
    /// Set once the job runs with `stage_out=` lines (end of pre_run), replaced by the error
    /// if the stage-out fails, cleared only when every stage-out succeeded. While set, teardown
    /// never destroys the reservation and has the manager keep it as a rescue reservation: a
    /// post_run or data_out that Slurm killed (timeout, cancel) or that failed before telling
    /// the manager loses nothing.
    pub(crate) stage_out_unfinished: Option<String>,
    /// The persistent reservations of the job's `use_persistent` lines, recorded before setup
    /// registers the job with any of them: teardown unregisters each.
    #[serde(default)]
    pub(crate) uses: Vec<String>,
    /// The namespace mode of the reservation setup created or adopted (`striped`, `private`):
    /// with performance targets the manager's plan chooses it, and an existing persistent
    /// reservation has its own; `None` before setup got it (then the directive's `access=`).
    #[serde(default)]
    pub(crate) access: Option<String>,
}

impl JobRecord {
    /// Whether the job's reservation has private namespaces (one per node), which are staged
    /// node by node.
    pub(crate) fn private(&self, directive: Option<&crate::directive::Directive>) -> bool {
        match self.access.as_deref() {
            Some(access) => access == "private",
            None => directive.and_then(|d| d.access) == Some(crate::directive::Access::Private),
        }
    }
}

/// The reservation name of a job-scoped reservation (the manager's naming, see the contract).
pub(crate) fn job_reservation_name(job: u64) -> String {
    format!("job-{job}")
}

/// The job key setup registers with a persistent reservation the job uses beside its own
/// (`use_persistent`): `<id>.use`. The prolog, which has no job script, mounts what is
/// registered under `<id>` as `$SPILLWAY_BB` and what is registered under this key beside it.
pub(crate) fn beside_registration(job: u64) -> String {
    format!("{job}.use")
}

impl Hooks {
    /// The job's record: `<state dir>/job-<id>.json`.
    pub(crate) fn record_path(&self, job: u64) -> PathBuf {
        self.state_dir.join(format!("job-{job}.json"))
    }

    /// Write the record atomically.
    pub(crate) fn write_record(&self, record: &JobRecord) -> anyhow::Result<()> {
        self.write_state(&self.record_path(record.job), record)
    }

    /// Write `value` as JSON to `path` in the state directory, atomically (a temporary file
    /// renamed over it), creating the directory if missing.
    pub(crate) fn write_state(
        &self,
        path: &std::path::Path,
        value: &impl Serialize,
    ) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.state_dir)
            .with_context(|| format!("creating state directory {}", self.state_dir.display()))?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(value)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        Ok(())
    }

    /// The job's record; `Ok(None)` when it has none.
    pub(crate) fn read_record(&self, job: u64) -> anyhow::Result<Option<JobRecord>> {
        let path = self.record_path(job);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(
                serde_json::from_slice(&bytes)
                    .with_context(|| format!("parsing {}", path.display()))?,
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// The job's record, which every hook after setup needs.
    pub(crate) fn require_record(&self, job: u64) -> anyhow::Result<JobRecord> {
        self.read_record(job)?.ok_or_else(|| {
            anyhow!(
                "job {job}: no record {} (setup did not run or failed)",
                self.record_path(job).display()
            )
        })
    }

    /// The jobs that have a record in the state directory (none when it cannot be listed).
    pub(crate) fn recorded_jobs(&self) -> impl Iterator<Item = u64> {
        let entries = std::fs::read_dir(&self.state_dir).into_iter().flatten();
        entries.flatten().filter_map(|entry| {
            let name = entry.file_name();
            name.to_str()
                .and_then(|n| n.strip_prefix("job-")?.strip_suffix(".json")?.parse::<u64>().ok())
        })
    }

    /// Where the job's reservation is mounted: `<mount root>/job-<id>`.
    pub(crate) fn mountpoint(&self, job: u64) -> PathBuf {
        self.mount_root.join(format!("job-{job}"))
    }

    /// Where the job mounts persistent reservation `name` of a `use_persistent` line:
    /// `<mount root>/job-<id>.<name>` (names have no `/`).
    pub(crate) fn beside_mountpoint(&self, job: u64, name: &str) -> PathBuf {
        self.mount_root.join(format!("job-{job}.{name}"))
    }

    /// Every mount point directory of the job on this host: `$SPILLWAY_BB`'s and those of
    /// its `use_persistent` reservations (found in the mount root: the epilog has no record).
    pub(crate) fn job_mountpoints(&self, job: u64) -> Vec<PathBuf> {
        let prefix = format!("job-{job}.");
        let entries = std::fs::read_dir(&self.mount_root).into_iter().flatten().flatten();
        let beside = entries
            .filter(|entry| entry.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)))
            .map(|entry| entry.path());
        std::iter::once(self.mountpoint(job)).chain(beside).collect()
    }

    /// Removes every node's mount log of the job (teardown, once the job is gone everywhere).
    pub(crate) fn remove_mount_logs(&self, job: u64) {
        let prefix = format!("job-{job}.");
        let entries = std::fs::read_dir(&self.state_dir).into_iter().flatten().flatten();
        for entry in entries {
            let name = entry.file_name();
            let is_log =
                name.to_str().is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".mount.log"));
            if is_log {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// Where the `spillway mount` of `mountpoint` on `node` writes its output:
    /// `<state dir>/job-<id>.<node>.mount.log` for `$SPILLWAY_BB`, `job-<id>.<name>.<node>.…`
    /// for a `use_persistent` one (one per node: the state directory may be shared).
    pub(crate) fn mount_log_path(&self, mountpoint: &std::path::Path, node: &str) -> PathBuf {
        let node: String = node
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
            .collect();
        let mounted = mountpoint.file_name().unwrap_or_default().to_string_lossy();
        self.state_dir.join(format!("{mounted}.{node}.mount.log"))
    }
}
