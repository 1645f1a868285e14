//! Who owns a Slurm job, asked of Slurm itself.
//!
//! A job reservation (`--job N`, named `job-N`) is what the Slurm setup hook of job N mounts and
//! what its teardown destroys, so a user may reserve only for a job they own: before creating
//! one for a non-root caller, the manager asks Slurm who owns job N (knob
//! `manager.job_owner_check`). The question sits behind [`JobOwners`] so unit tests answer it
//! without Slurm; [`Squeue`] is the real one: `squeue --noheader --states=all --jobs=N
//! --format=%U`, bounded by `manager.job_owner_timeout_ms`, which prints the numeric uid and
//! nothing else. Not `scontrol show job`: its one-line form prints the job name, which the job's
//! owner chooses, before `UserId=`, so a name holding `UserId=other(uid)` would name another
//! owner. `squeue` is found on the manager's `PATH` and finds the cluster through the manager's
//! environment (`SLURM_CONF`) as any Slurm client does.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Most bytes of `squeue` output read (one job, or an array's tasks, fits easily).
const SCONTROL_OUTPUT_BYTES_MAX: u64 = 1 << 20;

/// Answers who owns a Slurm job.
pub trait JobOwners: Send + Sync {
    /// The uid owning `job` (a Slurm job id: digits).
    fn owner_of(&self, job: &str) -> Result<u32, JobOwnerError>;
}

/// Why Slurm could not say who owns a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JobOwnerError {
    /// Slurm answered: there is no such job.
    #[error("Slurm does not know job {job}")]
    UnknownJob { job: String },
    /// Slurm could not be asked, or its answer could not be read.
    #[error("{reason}")]
    Unavailable { reason: String },
}

/// The real question: `squeue … --jobs=N --format=%U`, killed after `timeout`.
pub struct Squeue {
    pub timeout: Duration,
}

/// What a finished command printed.
struct CommandOutput {
    success: bool,
    status: String,
    stdout: String,
    stderr: String,
}

impl JobOwners for Squeue {
    fn owner_of(&self, job: &str) -> Result<u32, JobOwnerError> {
        let what = format!("squeue --jobs={job} --format=%U");
        let mut command = Command::new("squeue");
        command.args(["--noheader", "--states=all", &format!("--jobs={job}"), "--format=%U"]);
        let output = run_bounded(&mut command, self.timeout)
            .map_err(|reason| JobOwnerError::Unavailable { reason: format!("{what}: {reason}") })?;
        if !output.success {
            if output.stderr.contains("Invalid job id") {
                return Err(JobOwnerError::UnknownJob { job: job.to_string() });
            }
            return Err(JobOwnerError::Unavailable {
                reason: format!("{what} failed ({}): {}", output.status, output.stderr.trim()),
            });
        }
        owner_uid_of(&output.stdout).ok_or_else(|| JobOwnerError::Unavailable {
            reason: format!(
                "{what} printed no single numeric uid: {:?}",
                output.stdout.chars().take(200).collect::<String>()
            ),
        })
    }
}

/// Whether an executable `squeue` is on `PATH` (checked at start, to warn when the job owner
/// check cannot work).
pub fn squeue_on_path() -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join("squeue"))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// The uid `squeue --format=%U` printed: one line per job (an array prints one per task), every
/// line the same number; anything else is no answer.
pub fn owner_uid_of(text: &str) -> Option<u32> {
    let mut uids = text.lines().map(str::trim).filter(|line| !line.is_empty());
    let first: u32 = uids.next()?.parse().ok()?;
    uids.all(|line| line.parse() == Ok(first)).then_some(first)
}

/// Runs `command` with its output captured, killing it after `timeout`.
fn run_bounded(command: &mut Command, timeout: Duration) -> Result<CommandOutput, String> {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|e| format!("cannot run it: {e}"))?;
    let pid = child.id();
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let (sender, receiver) = mpsc::channel();
    // The child stays unreaped until this thread's wait returns, so its pid cannot be reused
    // before the kill below.
    std::thread::spawn(move || {
        let read = |pipe: Option<Box<dyn Read + Send>>| {
            let mut text = String::new();
            if let Some(pipe) = pipe {
                let _ = pipe.take(SCONTROL_OUTPUT_BYTES_MAX).read_to_string(&mut text);
            }
            text
        };
        let stderr_reader = std::thread::spawn(move || read(stderr.map(|p| Box::new(p) as _)));
        let stdout = read(stdout.map(|p| Box::new(p) as _));
        let stderr = stderr_reader.join().unwrap_or_default();
        let _ = sender.send(child.wait().map(|status| CommandOutput {
            success: status.success(),
            status: status.to_string(),
            stdout,
            stderr,
        }));
    });
    match receiver.recv_timeout(timeout) {
        Ok(result) => result.map_err(|e| format!("waiting for it: {e}")),
        Err(_) => {
            let _ = spillway_sys::signal::send(pid, spillway_sys::signal::Signal::SIGKILL);
            Err(format!(
                "no answer within {} ms (knob manager.job_owner_timeout_ms)",
                timeout.as_millis()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uid_is_read_from_squeue_output() {
        assert_eq!(owner_uid_of("999\n"), Some(999));
        assert_eq!(owner_uid_of("1000\n1000\n1000\n"), Some(1000), "an array's tasks");
        assert_eq!(owner_uid_of(""), None);
        assert_eq!(owner_uid_of("1000\n1001\n"), None, "two owners is no answer");
        assert_eq!(owner_uid_of("alice\n"), None);
        assert_eq!(owner_uid_of("-1\n"), None);
        // What a job name could smuggle into `scontrol -o show job` is not a uid here.
        assert_eq!(owner_uid_of("x UserId=root(0)\n"), None);
    }

    #[test]
    fn a_command_that_hangs_is_killed_at_the_timeout() {
        let started = std::time::Instant::now();
        let error =
            run_bounded(Command::new("sleep").arg("30"), Duration::from_millis(200)).err().unwrap();
        assert!(error.contains("no answer within 200 ms"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(20));
        let output = run_bounded(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(20),
        )
        .unwrap();
        assert!(!output.success);
        assert_eq!((output.stdout.trim(), output.stderr.trim()), ("out", "err"));
        let error = run_bounded(&mut Command::new("/nonexistent/scontrol"), Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(error.contains("cannot run it"), "{error}");
    }
}
