//! Staging a private reservation (`access=private`: a namespace per compute node, see
//! `spillway_policy::namespace`). The node names are known only once Slurm allocated the job,
//! after data_in, so:
//!
//! - **stage-in**: data_in checks, as the job's user, that every source is there, of its kind
//!   and readable, and that one copy per node the job asks for fits the reservation; then each
//!   node's prolog, once it mounted its namespace, copies every source into it as the job's
//!   user (the prolog has no script: it reads it with `scontrol write batch_script`);
//! - **stage-out**: data_out copies each node's `source` into `destination/<node>`, one
//!   directory per node of the job (`scontrol show hostnames` of its NodeList); a node without
//!   `source` fails the stage-out like a missing source of a striped one (the reservation is
//!   kept as a rescue reservation, each pair with its node).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};

use crate::commands::{output_within, Reservation};
use crate::directive::{self, Directive, Stage};
use crate::hooks::{Hooks, StageDirection};
use crate::job::JobRecord;
use crate::node::{field, show_job};

/// How long one `scontrol` call may take.
const SCONTROL_WAIT: Duration = Duration::from_secs(10);

/// One `spillway stage-in|stage-out` a hook runs: a directive's stage, with the node whose
/// namespace it copies for a private reservation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StageRun {
    pub(crate) stage: Stage,
    pub(crate) node: Option<String>,
}

/// A directive's stages as they are: no node (a striped reservation, any stage-in data_in runs).
pub(crate) fn plain_runs(stages: &[Stage]) -> Vec<StageRun> {
    stages.iter().map(|stage| StageRun { stage: stage.clone(), node: None }).collect()
}

/// A private reservation's stage-outs as data_out runs them: each once per node of `nodes`,
/// from that node's namespace into `destination/<node>`.
pub(crate) fn per_node_stage_outs(stages: &[Stage], nodes: &[String]) -> Vec<StageRun> {
    let mut runs = Vec::with_capacity(stages.len() * nodes.len());
    for stage in stages {
        for node in nodes {
            let pfs_path = format!("{}/{node}", stage.pfs_path.trim_end_matches('/'));
            let stage = Stage { pfs_path, ..stage.clone() };
            runs.push(StageRun { stage, node: Some(node.clone()) });
        }
    }
    runs
}

/// The nodes Slurm allocated to `job` (its NodeList, expanded by `scontrol show hostnames`).
pub(crate) fn job_nodes(job: u64) -> anyhow::Result<Vec<String>> {
    let line = show_job(job)?;
    let list = field(&line, "NodeList")
        .filter(|list| !list.is_empty() && *list != "(null)")
        .ok_or_else(|| anyhow!("job {job}: Slurm names no node of the job"))?;
    let mut expand = Command::new("scontrol");
    expand.args(["show", "hostnames", list]).stdin(Stdio::null());
    let names = output_within(&mut expand, SCONTROL_WAIT, "scontrol show hostnames")?;
    let nodes: Vec<String> =
        names.lines().map(str::trim).filter(|n| !n.is_empty()).map(String::from).collect();
    if nodes.is_empty() {
        bail!("job {job}: `scontrol show hostnames {list}` names no node");
    }
    if let Some(node) = nodes.iter().find(|node| !names_a_directory(node)) {
        bail!("job {job}: node name {node:?} cannot name a stage-out directory");
    }
    Ok(nodes)
}

/// Whether a node name can be the stage-out directory `destination/<node>`: letters, digits,
/// `.`, `_`, `-`, not starting with `.` (never `..`, a hidden name or a path).
fn names_a_directory(node: &str) -> bool {
    !node.is_empty()
        && !node.starts_with('.')
        && node.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl Hooks {
    /// The job's script as slurmctld keeps it (`scontrol write batch_script JOB FILE`, the file
    /// in the root-only state directory, removed again): the prolog runs on a compute node,
    /// which has no copy.
    fn job_script(&self, job: u64, node: &str) -> anyhow::Result<String> {
        let node: String = node
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
            .collect();
        let path = self.state_dir.join(format!("job-{job}.{node}.script"));
        std::fs::create_dir_all(&self.state_dir)
            .with_context(|| format!("creating {}", self.state_dir.display()))?;
        let _ = std::fs::remove_file(&path); // scontrol refuses to overwrite a file
        let mut command = Command::new("scontrol");
        command.args(["write", "batch_script", &job.to_string()]).arg(&path).stdin(Stdio::null());
        let written = output_within(&mut command, SCONTROL_WAIT, "scontrol write batch_script");
        let script = written.and_then(|_| {
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
        });
        let _ = std::fs::remove_file(&path);
        Ok(String::from_utf8_lossy(&script?).into_owned())
    }
}

impl Hooks {
    /// data_in of a private reservation: nothing is copied yet (the nodes are not known), but
    /// every source must be there for the job's user, and one copy per node the job asks for
    /// must fit the reservation; a failure holds the job as a failed stage-in does.
    pub(crate) fn check_private_stage_in(
        &self,
        record: &JobRecord,
        stages: &[Stage],
    ) -> anyhow::Result<()> {
        let job = record.job;
        let sources: Vec<String> =
            stages.iter().map(|s| format!("{}:{}", s.kind.as_str(), s.pfs_path)).collect();
        let bytes = self
            .sources_ready_as(record.uid, record.gid, &sources)
            .map_err(|e| anyhow!("job {job}: stage-in: {e}"))?;
        let nodes = job_node_count(job).unwrap_or(1);
        let reservation = self
            .show_reservation(&record.reservation)?
            .ok_or_else(|| anyhow!("job {job}: reservation {} is gone", record.reservation))?;
        let needed = bytes.saturating_mul(nodes);
        if let Some(capacity) = reservation.capacity_bytes.filter(|c| needed > *c) {
            bail!(
                "job {job}: stage-in of {} into the private namespace of each node ({nodes}) needs {}, more than reservation {} holds ({}): ask for a larger capacity=, or use access=striped (one copy all nodes share)",
                spillway_types::format_bytes(bytes),
                spillway_types::format_bytes(needed),
                record.reservation,
                spillway_types::format_bytes(capacity)
            );
        }
        crate::node::note_on_job(
            job,
            &format!(
                "spillway stage-in: {} sources checked ({}); each node copies them into its private namespace before the job starts",
                stages.len(),
                spillway_types::format_bytes(bytes)
            ),
        );
        Ok(())
    }

    /// Prolog of a private reservation, once `node` mounted its namespace: copy the job's
    /// stage-ins into it as the job's user.
    pub(crate) fn private_stage_in(
        &self,
        job: u64,
        reservation: &Reservation,
        (uid, gid): (u32, u32),
        node: &str,
    ) -> anyhow::Result<()> {
        let script = self.job_script(job, node)?;
        let directive: Option<Directive> = directive::parse_script(&script, &self.directive)
            .map_err(|e| anyhow!("the job's #{} lines: {e}", self.directive))?;
        let Some(directive) = directive else { return Ok(()) };
        if directive.stage_in.is_empty() {
            return Ok(());
        }
        let record = JobRecord {
            job,
            uid,
            gid,
            reservation: reservation.id.to_string(),
            persistent: reservation.persistent,
            reservation_id: Some(reservation.id),
            stage_out_unfinished: None,
            uses: Vec::new(),
            access: reservation.access.clone(),
        };
        let runs: Vec<StageRun> = directive
            .stage_in
            .iter()
            .map(|stage| StageRun { stage: stage.clone(), node: Some(node.to_string()) })
            .collect();
        self.run_stages(&record, &runs, StageDirection::In)
    }

    /// The stage-out destination `parent` of a private reservation's per-node copies, made as
    /// the job's user when missing (never its parents: an unmounted PFS must not get them).
    pub(crate) fn make_stage_out_directory(
        &self,
        record: &JobRecord,
        parent: &Path,
    ) -> anyhow::Result<()> {
        if parent.is_dir() {
            return Ok(());
        }
        let mut mkdir = Command::new("mkdir");
        mkdir.arg("--").arg(parent);
        let groups = spillway_sys::user::groups_of(record.uid, record.gid)
            .with_context(|| format!("groups of uid {}", record.uid))?;
        spillway_sys::process::run_as(&mut mkdir, record.uid, record.gid, &groups);
        let what = format!("mkdir {} (as uid {})", parent.display(), record.uid);
        crate::commands::output_of(&mut mkdir, &what).map(drop)
    }
}

/// The nodes `job` asks for (`NumNodes=` of `scontrol show job`, its lower bound when a
/// range); `None` when scontrol cannot say.
fn job_node_count(job: u64) -> Option<u64> {
    let line = show_job(job).ok()?;
    let low = field(&line, "NumNodes")?.split('-').next()?;
    low.parse().ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_node_names_become_directories() {
        for good in ["host1", "nid00042", "node-3.cluster_a"] {
            assert!(names_a_directory(good), "{good}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "../x", "a b", "a\0b", "n\u{e9}"] {
            assert!(!names_a_directory(bad), "{bad:?}");
        }
    }

    #[test]
    fn private_stage_outs_go_to_one_directory_per_node() {
        let stage = Stage {
            pfs_path: "/pfs/out/".into(),
            reservation_path: "ckpt".into(),
            kind: directive::StageKind::Any,
            when: directive::StageWhen::Always,
        };
        let nodes = ["n1".to_string(), "n2".to_string()];
        let runs = per_node_stage_outs(std::slice::from_ref(&stage), &nodes);
        let targets: Vec<(&str, Option<&str>)> =
            runs.iter().map(|r| (r.stage.pfs_path.as_str(), r.node.as_deref())).collect();
        assert_eq!(targets, [("/pfs/out/n1", Some("n1")), ("/pfs/out/n2", Some("n2"))]);
        let striped = plain_runs(std::slice::from_ref(&stage));
        assert_eq!(striped, [StageRun { stage, node: None }]);
    }
}
