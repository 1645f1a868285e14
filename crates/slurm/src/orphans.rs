//! The periodic reaper of lost teardowns: for every job record left in the state directory, ask
//! Slurm (`scontrol -o show job`) whether the job is gone or long ended, and tear it down then.

use std::process::Command;

use crate::hooks::Hooks;

/// How long after a job ended its record may stay before the pools refresh tears it down (a
/// normal teardown takes seconds; Slurm calls slurm_bb_pools about every 30 s).
const ORPHAN_GRACE_S: i64 = 30;

impl Hooks {
    /// Tears down jobs whose teardown never ran. Slurm 22.05 kills every script of a pending job
    /// that is cancelled, and that can hit the teardown it has just queued before the hook has
    /// detached from the script's process group; a killed teardown is not retried. So the
    /// periodic pools refresh tears down any job whose record is still here although Slurm has
    /// forgotten the job, or the job ended more than [`ORPHAN_GRACE_S`] ago with no stage-out
    /// still to run. Teardown is idempotent, so racing a slow regular one does no harm.
    /// Failures are logged to stderr; the refresh goes on.
    pub(crate) fn reap_orphans(&self) {
        for job in self.recorded_jobs() {
            if slurm_says_orphaned(job) {
                match self.teardown(job, true, None) {
                    Ok(()) => {
                        eprintln!("spillway bb: job {job}: its teardown never ran; torn down now")
                    }
                    Err(e) => eprintln!(
                        "spillway bb: job {job}: tearing down after a lost teardown: {e:#}"
                    ),
                }
            }
        }
    }
}

/// Whether Slurm no longer knows `job`, or knows it as ended long enough ago
/// ([`job_is_orphaned`]).
fn slurm_says_orphaned(job: u64) -> bool {
    match Command::new("scontrol").args(["-o", "show", "job", &job.to_string()]).output() {
        Ok(output) if output.status.success() => {
            job_is_orphaned(&String::from_utf8_lossy(&output.stdout), now_unix_s())
        }
        Ok(output) => String::from_utf8_lossy(&output.stderr).contains("Invalid job id"),
        Err(_) => false, // no scontrol here: nothing to learn
    }
}

fn now_unix_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Whether a job (one line of `scontrol -o show job`) has ended, more than [`ORPHAN_GRACE_S`]
/// before `now`, in a state that leaves nothing for its burst buffer to do but teardown.
fn job_is_orphaned(line: &str, now: i64) -> bool {
    let field = |key: &str| {
        line.split_whitespace().find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
    };
    const ENDED: [&str; 9] = [
        "CANCELLED",
        "COMPLETED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    ];
    let ended = field("JobState").is_some_and(|state| ENDED.contains(&state));
    let staging_out =
        field("BurstBufferState").is_some_and(|state| matches!(state, "post-run" | "staging-out"));
    let end = field("EndTime").and_then(local_time_unix_s);
    ended && !staging_out && end.is_some_and(|end| now - end > ORPHAN_GRACE_S)
}

/// `YYYY-MM-DDTHH:MM:SS` in local time (how scontrol prints times) as Unix seconds.
fn local_time_unix_s(text: &str) -> Option<i64> {
    let number = |range: std::ops::Range<usize>| text.get(range)?.parse::<i32>().ok();
    if text.len() != 19 {
        return None;
    }
    spillway_sys::time::local_time_unix_s(
        number(0..4)?,
        number(5..7)?,
        number(8..10)?,
        number(11..13)?,
        number(14..16)?,
        number(17..19)?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_jobs_without_stage_out_are_orphans_after_the_grace() {
        let end = local_time_unix_s("2026-11-22T18:05:07").unwrap();
        let line = |state: &str, bb: &str| {
            format!("JobId=6 JobName=stuck JobState={state} Reason=None EndTime=2026-11-22T18:05:07 BurstBufferState={bb} Partition=debug")
        };
        assert!(job_is_orphaned(&line("CANCELLED", "teardown"), end + ORPHAN_GRACE_S + 1));
        assert!(
            !job_is_orphaned(&line("CANCELLED", "teardown"), end + ORPHAN_GRACE_S - 1),
            "within the grace"
        );
        assert!(
            !job_is_orphaned(&line("COMPLETED", "staging-out"), end + 3600),
            "stage-out still running"
        );
        assert!(!job_is_orphaned(&line("PENDING", "staging-in"), end + 3600), "not ended");
        assert!(
            !job_is_orphaned("JobId=6 JobState=CANCELLED EndTime=Unknown", end + 3600),
            "no end time"
        );
        assert_eq!(
            local_time_unix_s("2026-11-22T18:05:67"),
            local_time_unix_s("2026-11-22T18:06:07")
        );
        assert_eq!(local_time_unix_s("yesterday"), None);
    }
}
