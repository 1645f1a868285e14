//! Running `spillway …` children (the contract CLI, with the manager socket in their
//! environment) and checking their exit status and output, and the manager's answer to
//! `reservation show` read from it.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::hooks::Hooks;

/// The manager's view of a reservation (`reservation show --json`); unknown fields are ignored.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Reservation {
    pub(crate) id: u64,
    pub(crate) name: String,
    /// `active` or `destroyed` (a reservation shown by id may be destroyed).
    #[serde(default)]
    pub(crate) state: Option<String>,
    #[serde(default)]
    pub(crate) owner: Option<u32>,
    #[serde(default)]
    pub(crate) group: Option<u32>,
    #[serde(default)]
    pub(crate) persistent: bool,
    /// The Slurm job of a job reservation.
    #[serde(default)]
    pub(crate) job: Option<String>,
    /// The Slurm jobs registered with a persistent reservation.
    #[serde(default)]
    pub(crate) jobs: Vec<String>,
    #[serde(default)]
    pub(crate) capacity_bytes: Option<u64>,
    #[serde(default)]
    pub(crate) allowed_uids: Vec<u32>,
    #[serde(default)]
    pub(crate) allowed_gids: Vec<u32>,
    #[serde(default)]
    pub(crate) servers: Vec<String>,
    #[serde(default)]
    pub(crate) access: Option<String>,
    #[serde(default)]
    pub(crate) epoch: Option<u64>,
    #[serde(default)]
    pub(crate) namespace_id: Option<u64>,
    /// Copies of every piece on distinct hosts (absent from an older manager: 1).
    #[serde(default)]
    pub(crate) replicas: Option<u32>,
    /// Set when a stage-out failed and the manager keeps the reservation for its owner.
    #[serde(default)]
    pub(crate) rescue: Option<serde_json::Value>,
}

impl Hooks {
    /// A `spillway …` manager command, with the manager socket in its environment.
    pub(crate) fn spillway(&self) -> anyhow::Result<Command> {
        let exe = std::env::current_exe().context("locating the spillway binary")?;
        let mut command = Command::new(exe);
        if let Some(manager) = &self.manager {
            command.env("SPILLWAY_MANAGER", manager);
        }
        command.stdin(Stdio::null());
        Ok(command)
    }

    /// Run a manager command as root (the hooks' own identity) and return its stdout.
    pub(crate) fn manager(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut command = self.spillway()?;
        command.args(args);
        output_of(&mut command, &args.join(" "))
    }

    /// `reservation show NAME --json`; `Ok(None)` when the manager says it does not exist.
    pub(crate) fn show_reservation(&self, name: &str) -> anyhow::Result<Option<Reservation>> {
        let mut command = self.spillway()?;
        command.args(["reservation", "show", name, "--json"]);
        let output = command.output().context("running spillway reservation show")?;
        if output.status.success() {
            let text = String::from_utf8_lossy(&output.stdout);
            let reservation: Reservation =
                serde_json::from_str(text.trim()).with_context(|| {
                    format!("parsing `reservation show {name} --json` output {text:?}")
                })?;
            return Ok(Some(reservation));
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        if is_not_found(&stderr) {
            return Ok(None);
        }
        bail!("spillway reservation show {name}: {}", stderr.trim())
    }

    /// A manager call bounded by `timeout`, for callers that must never hang (the pools refresh).
    pub(crate) fn manager_timed(&self, args: &[&str], timeout: Duration) -> anyhow::Result<String> {
        let mut command = self.spillway()?;
        command.args(args);
        output_within(&mut command, timeout, &format!("spillway {}", args.join(" ")))
    }

    /// A manager call that may find the reservation gone: `Ok(false)` when the manager says it
    /// does not exist (teardown after it was destroyed), `Ok(true)` when the call succeeded.
    pub(crate) fn manager_unless_gone(&self, args: &[&str]) -> anyhow::Result<bool> {
        let mut command = self.spillway()?;
        command.args(args);
        let output =
            command.output().with_context(|| format!("running spillway {}", args.join(" ")))?;
        if !output.status.success() && is_not_found(&String::from_utf8_lossy(&output.stderr)) {
            return Ok(false);
        }
        checked(output, &format!("spillway {}", args.join(" ")))?;
        Ok(true)
    }
}

/// Most bytes kept of each of a bounded command's stdout and stderr (`scontrol show hostnames`
/// of a large job is tens of KiB; nothing it runs answers more).
const OUTPUT_BYTES_MAX: u64 = 16 << 20;

/// Runs `command` (named `what` in errors), killed if it has not finished within `timeout`;
/// its stdout, or an error with its stderr unless it exited 0. Both pipes are read while it
/// runs, so an answer larger than a pipe holds does not stall it until the timeout.
pub(crate) fn output_within(
    command: &mut Command,
    timeout: Duration,
    what: &str,
) -> anyhow::Result<String> {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().with_context(|| format!("running {what}"))?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(pipe) = pipe {
                let _ = pipe.take(OUTPUT_BYTES_MAX).read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            // The readers end when the pipes close (a grandchild may hold them: not joined).
            bail!("{what}: no answer within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let joined = |reader: std::thread::JoinHandle<Vec<u8>>| reader.join().unwrap_or_default();
    checked(Output { status, stdout: joined(stdout), stderr: joined(stderr) }, what)
}

/// The manager's "no such reservation" error (exit 1, one line naming it).
fn is_not_found(stderr: &str) -> bool {
    let lower = stderr.to_ascii_lowercase();
    lower.contains("no reservation")
        || lower.contains("no active reservation")
        || lower.contains("not found")
        || lower.contains("no such")
}

/// Run `command`, fail with its stderr (naming `what`) unless it exits 0; return its stdout.
pub(crate) fn output_of(command: &mut Command, what: &str) -> anyhow::Result<String> {
    let output = command.output().with_context(|| format!("running {what}"))?;
    checked(output, what)
}

/// The stdout of a finished child; an error naming `what`, with its stderr, unless it exited 0.
fn checked(output: Output, what: &str) -> anyhow::Result<String> {
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stderr = stderr.trim();
        bail!("{what}: {} ({})", if stderr.is_empty() { "failed" } else { stderr }, output.status);
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_command_may_answer_more_than_a_pipe_holds() {
        let mut command = Command::new("sh");
        command.args(["-c", "head -c 300000 /dev/zero; echo done >&2"]);
        let out = output_within(&mut command, Duration::from_secs(30), "head").unwrap();
        assert_eq!(out.len(), 300_000);
        let mut slow = Command::new("sleep");
        slow.arg("30");
        let error = output_within(&mut slow, Duration::from_millis(100), "sleep").unwrap_err();
        assert!(error.to_string().contains("no answer within"), "{error}");
    }

    #[test]
    fn not_found_messages() {
        assert!(is_not_found("spillway: no reservation \"job-9\" visible to uid 0"));
        assert!(is_not_found("spillway: no active reservation \"5\" visible to uid 0"));
        assert!(!is_not_found("spillway: permission denied"));
    }
}
