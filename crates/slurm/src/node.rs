//! The per-node hooks: Slurm's `Prolog` and `Epilog` (slurm.conf, `PrologFlags=Alloc,
//! DeferBatch`) run `spillway bb prolog` / `bb epilog` on every node of a job's allocation, so
//! each node mounts the job's reservation at the same `$SPILLWAY_BB` before the job starts and
//! unmounts it after.
//!
//! The prolog runs on a compute node, which has neither the job script nor the controller's
//! job records: it learns the job's reservation from the manager (over TCP with munge from
//! another host), which knows it by the job id — the job reservation `job-<id>` carries the job,
//! a persistent one lists the jobs registered with it. Jobs without a burst buffer have neither,
//! and the prolog does nothing for them.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use crate::commands::{output_within, Reservation};
use crate::hooks::Hooks;
use crate::job::{beside_registration, job_reservation_name};
use crate::processes::is_mounted;

impl Hooks {
    /// Prolog: mount the reservation of `job` (run by `uid`) on this node, named `node` for a
    /// private namespace. Nothing for a job without one. A failed mount leaves nothing mounted
    /// and no mount process, and the error names the job, the node and the reason (slurmd
    /// logs it, drains the node and requeues the job held).
    pub(crate) fn prolog(&self, job: u64, uid: u32, gid: u32, node: &str) -> anyhow::Result<()> {
        // Every job runs the prolog: one Slurm says has no burst buffer needs nothing of the
        // manager, so it runs even while the manager is down.
        if job_has_burst_buffer(job) == Some(false) {
            return Ok(());
        }
        let (own, beside) = self.reservations_of_job(job)?;
        let Some(reservation) = own else { return Ok(()) };
        // A persistent reservation lists the job only once setup checked the job's user may
        // use it; a job reservation must be the job user's own (setup refused a squatter's).
        if !reservation.persistent && reservation.owner != Some(uid) {
            bail!(
                "job {job} on node {node}: reservation {} (uid {}) is not the job's: refusing to mount it for uid {uid}",
                reservation.name,
                reservation.owner.map_or_else(|| "unknown".into(), |o| o.to_string())
            );
        }
        let mut mounts = std::iter::once((self.mountpoint(job), &reservation))
            .chain(beside.iter().map(|r| (self.beside_mountpoint(job, &r.name), r)));
        let result = mounts
            .try_for_each(|(mountpoint, reservation)| {
                self.mount_reservation(job, reservation, (uid, gid), node, &mountpoint)
            })
            .and_then(|()| match reservation.access.as_deref() {
                // This node's namespace is mounted (created): its copy of the stage-ins.
                Some("private") => self.private_stage_in(job, &reservation, (uid, gid), node),
                _ => Ok(()),
            });
        if let Err(e) = result {
            // Nothing half-mounted stays behind: no mount, no serving process.
            let cleanup = self.unmount(job).err();
            let cleanup = cleanup.map(|c| format!("; cleaning up failed too: {c:#}"));
            let message = format!("job {job} on node {node}: {e:#}{}", cleanup.unwrap_or_default());
            note_on_job(job, &format!("spillway prolog failed: {message}"));
            bail!(message);
        }
        Ok(())
    }

    /// Epilog: unmount the job's reservation on this node if it is mounted (lazily if the mount
    /// is wedged) and kill a mount process that outlived it. Idempotent, no manager call. The
    /// mount point directory stays: it may be shared with other nodes (teardown removes it).
    pub(crate) fn epilog(&self, job: u64, node: &str) -> anyhow::Result<()> {
        self.unmount(job).map_err(|e| anyhow!("job {job} on node {node}: {e:#}"))
    }

    /// The active reservations of `job`: its own (its job reservation, else the persistent
    /// one registered under the job's id; `None` when it has neither: no burst buffer), and the
    /// persistent ones its `use_persistent` lines registered it with, to mount beside.
    fn reservations_of_job(
        &self,
        job: u64,
    ) -> anyhow::Result<(Option<Reservation>, Vec<Reservation>)> {
        let job_text = job.to_string();
        let beside_key = beside_registration(job);
        let listed = self.manager(&["reservation", "list", "--all", "--json"])?;
        let all: Vec<Reservation> = serde_json::from_str(listed.trim()).with_context(|| {
            format!("parsing `reservation list --all --json` output {listed:?}")
        })?;
        let active = all.into_iter().filter(|r| r.state.as_deref() != Some("destroyed"));
        let (mut own_job, mut own_persistent, mut beside) = (None, None, Vec::new());
        for reservation in active {
            if !reservation.persistent {
                let is_own = reservation.name == job_reservation_name(job)
                    && reservation.job.as_deref() == Some(job_text.as_str());
                if is_own {
                    own_job = Some(reservation);
                }
            } else if reservation.jobs.contains(&beside_key) {
                beside.push(reservation);
            } else if reservation.jobs.contains(&job_text) {
                own_persistent = own_persistent.or(Some(reservation));
            }
        }
        Ok((own_job.or(own_persistent), beside))
    }

    /// `spillway mount --background` of `reservation` at `mountpoint`, then check it is
    /// mounted; already mounted (a re-run) is success.
    fn mount_reservation(
        &self,
        job: u64,
        reservation: &Reservation,
        (uid, gid): (u32, u32),
        node: &str,
        mountpoint: &Path,
    ) -> anyhow::Result<()> {
        let name = &reservation.name;
        if is_mounted(mountpoint)? {
            return Ok(());
        }
        std::fs::create_dir_all(mountpoint)
            .with_context(|| format!("creating mount point {}", mountpoint.display()))?;
        let namespace_id = reservation
            .namespace_id
            .ok_or_else(|| anyhow!("reservation {name} has no namespace_id"))?;
        if reservation.servers.is_empty() {
            bail!("reservation {name} has no servers");
        }
        let access = reservation.access.clone().unwrap_or_else(|| "striped".into());
        // The namespace root belongs to the reservation's owner: private (0700) for a job
        // reservation, sticky and shared (1777, like /tmp) for a persistent one, whose allowed
        // users and groups the manager decides.
        let owner =
            format!("{}:{}", reservation.owner.unwrap_or(uid), reservation.group.unwrap_or(gid));
        let mode = if reservation.persistent { "1777" } else { "0700" };
        let log = self.mount_log_path(mountpoint, node);
        std::fs::create_dir_all(&self.state_dir)
            .with_context(|| format!("creating {}", self.state_dir.display()))?;
        // The serving process stays behind: it must not inherit a pipe of ours (or the Lua's
        // popen, or slurmd's), or whoever reads that pipe waits for it until its timeout. Its
        // output goes to the log file instead.
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut mount = self.spillway()?;
        mount
            .args(["mount", "--servers", &reservation.servers.join(","), "--access", &access])
            .args(["--node", node])
            .args(["--replicas", &reservation.replicas.unwrap_or(1).to_string()])
            .args(["--namespace-id", &namespace_id.to_string()])
            .args(["--epoch", &reservation.epoch.unwrap_or(1).to_string()])
            .args(["--root-owner", &owner, "--root-mode", mode])
            // The job's writes through the mount count as its phases on the burst buffer for
            // the data scheduler (docs/design/ias.md).
            .args(["--tiering-job", &job.to_string()])
            .arg("--log")
            .arg(&log)
            .arg("--background")
            .arg(mountpoint)
            .stdout(out.try_clone()?)
            .stderr(out);
        let status = mount.status().context("running spillway mount")?;
        if !status.success() {
            bail!(
                "mounting {name} on {} failed ({status}): {}",
                mountpoint.display(),
                log_tail(&log)
            );
        }
        if !is_mounted(mountpoint)? {
            bail!("`spillway mount` succeeded but {} is not a mount point", mountpoint.display());
        }
        Ok(())
    }
}

/// `scontrol -o show job JOB`: the job's one line of `key=value` fields (read them with
/// [`field`]), or scontrol's error; bounded to 5 s.
pub(crate) fn show_job(job: u64) -> anyhow::Result<String> {
    let mut command = Command::new("scontrol");
    command.args(["-o", "show", "job", &job.to_string()]).stdin(Stdio::null());
    output_within(&mut command, Duration::from_secs(5), "scontrol show job")
}

/// Whether Slurm lists a burst buffer request for `job` (`BurstBuffer=` in `scontrol -o show
/// job`); `None` when scontrol cannot say within 5 s (the prolog then asks the manager).
fn job_has_burst_buffer(job: u64) -> Option<bool> {
    has_burst_buffer(&show_job(job).ok()?)
}

/// Whether `job` exited 0 (`ExitCode=0:0` in `scontrol -o show job`); `None` when scontrol
/// cannot say within 5 s.
pub(crate) fn job_succeeded(job: u64) -> Option<bool> {
    let line = show_job(job).ok()?;
    field(&line, "JobId")?;
    Some(field(&line, "ExitCode")? == "0:0")
}

/// Whether a line of `scontrol -o show job` has a burst buffer request; `None` if it is not a
/// job's line.
fn has_burst_buffer(line: &str) -> Option<bool> {
    field(line, "JobId")?;
    Some(field(line, "BurstBuffer").is_some_and(|value| !value.is_empty()))
}

/// Puts `message` on the job as its `AdminComment`, which `scontrol show job` shows its user (a
/// failed prolog's cause, where Slurm's own reason only says the launch failed; stage-in
/// progress). Best effort, bounded: nothing depends on it, and the hooks log the same.
pub(crate) fn note_on_job(job: u64, message: &str) {
    let mut command = Command::new("scontrol");
    command
        .args(["update", &format!("JobId={job}")])
        .arg(format!("AdminComment={message}"))
        .stdin(Stdio::null());
    if let Err(e) = output_within(&mut command, Duration::from_secs(5), "scontrol update") {
        eprintln!("job {job}: could not note the failure on the job: {e:#}");
    }
}

/// The last lines of the mount's log, one line, for an error message.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(5).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
}

/// How long post_run waits for the job's epilogs (burst_buffer.conf's `OtherTimeout`, which
/// bounds post_run, must be longer).
const EPILOG_WAIT: Duration = Duration::from_secs(20);

/// Waits until Slurm no longer shows `job` as COMPLETING: slurmctld clears that flag once
/// every node of the job reported its epilog done, so every node's mount is gone and what the
/// job wrote was flushed to the servers. Slurm 22.05 starts post_run when the job ends, while
/// the epilogs still run. A job Slurm does not know has nothing to wait for; an `scontrol` that
/// cannot answer is an error (post_run then keeps a job's data as a rescue reservation).
pub(crate) fn wait_for_epilogs(job: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    let deadline = started + EPILOG_WAIT;
    loop {
        let output = Command::new("scontrol")
            .args(["-o", "show", "job", &job.to_string()])
            .stdin(Stdio::null())
            .output();
        let output =
            output.context("running scontrol to see whether the job's epilogs are done")?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            if stderr.contains("Invalid job id") {
                return Ok(()); // Slurm forgot the job: nothing of it runs anywhere
            }
            bail!("job {job}: scontrol show job: {} ({})", stderr.trim(), output.status);
        }
        let line = String::from_utf8_lossy(&output.stdout).into_owned();
        if !is_completing(&line) {
            // The slurmctld log shows this before data_out's line: the order, checked.
            println!(
                "job {job}: every node's epilog is done ({}; waited {:.1} s)",
                field(&line, "NodeList").unwrap_or("no nodes"),
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "job {job}: the epilogs of its nodes ({}) have not finished after {EPILOG_WAIT:?}, so a node may still have the reservation mounted",
                field(&line, "NodeList").unwrap_or("unknown")
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Whether a line of `scontrol -o show job` shows the job still completing.
fn is_completing(line: &str) -> bool {
    field(line, "JobState") == Some("COMPLETING")
}

/// The value of `key=` in a line of `scontrol -o show job`.
pub(crate) fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completing_is_read_from_the_job_state() {
        let line = |state: &str| {
            format!("JobId=7 JobName=ckpt JobState={state} Reason=None NodeList=h[1-4] BurstBufferState=post-run")
        };
        assert!(is_completing(&line("COMPLETING")));
        assert!(!is_completing(&line("COMPLETED")));
        assert!(!is_completing(&line("CANCELLED")));
        assert_eq!(field(&line("COMPLETING"), "NodeList"), Some("h[1-4]"));
    }

    #[test]
    fn the_epilog_of_a_job_with_nothing_mounted_succeeds_every_time() {
        let dir = std::env::temp_dir().join(format!("spillway-epilog-{}", std::process::id()));
        let hooks = Hooks {
            manager: None,
            directive: "BB_LUA".into(),
            state_dir: dir.join("state"),
            mount_root: dir.join("mnt"),
        };
        hooks.epilog(7, "n1").expect("no mount point at all");
        std::fs::create_dir_all(hooks.mountpoint(7)).unwrap();
        hooks.epilog(7, "n1").expect("an unmounted mount point");
        hooks.epilog(7, "n1").expect("again: idempotent");
        assert!(hooks.mountpoint(7).is_dir(), "the epilog leaves the (maybe shared) directory");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_burst_buffer_request_is_read_from_the_job() {
        let with = "JobId=7 JobName=ckpt UserId=u(999) BurstBuffer=#BB_LUA capacity=16MiB pool=fast BurstBufferState=staged-in";
        assert_eq!(has_burst_buffer(with), Some(true));
        assert_eq!(
            has_burst_buffer("JobId=8 JobName=plain UserId=u(999) JobState=RUNNING"),
            Some(false)
        );
        assert_eq!(has_burst_buffer("slurm_load_jobs error: Invalid job id specified"), None);
    }
}
