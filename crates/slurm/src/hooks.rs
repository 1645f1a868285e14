//! The hooks: the settings every hook shares ([`Hooks`]) and one method per `spillway bb`
//! subcommand, each doing its hook's steps in order (the helpers they use live in the sibling
//! modules: the job record, processes, commands, pools, orphans).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};

use crate::commands::{output_of, Reservation};
use crate::directive::{self, Directive};
use crate::job::{beside_registration, job_reservation_name, JobRecord};
use crate::node::{job_succeeded, note_on_job};
use crate::pools;
use crate::private::{job_nodes, per_node_stage_outs, plain_runs, StageRun};
use crate::processes::{find_processes, is_mount_of, is_mounted, is_stage_of, kill_all};

/// Which way `stage` copies: PFS to reservation (data_in) or back (data_out).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum StageDirection {
    In,
    Out,
}

/// Settings shared by every hook.
pub(crate) struct Hooks {
    pub(crate) manager: Option<PathBuf>,
    pub(crate) directive: String,
    pub(crate) state_dir: PathBuf,
    pub(crate) mount_root: PathBuf,
}

impl Hooks {
    /// The job script as text. Bytes that are not UTF-8 (a Latin-1 comment, a binary
    /// here-document) are harmless outside the directive lines, where Slurm runs the script as
    /// it is, and are replaced here; in a directive line they are refused, naming the line (a
    /// path would otherwise be staged under another name).
    fn read_script(&self, script: &Path) -> anyhow::Result<String> {
        let bytes = std::fs::read(script)
            .with_context(|| format!("reading job script {}", script.display()))?;
        let bytes = match String::from_utf8(bytes) {
            Ok(text) => return Ok(text),
            Err(not_utf8) => not_utf8.into_bytes(),
        };
        let marker = format!("#{}", self.directive);
        for (index, line) in bytes.split(|b| *b == b'\n').enumerate() {
            if line.starts_with(marker.as_bytes()) && std::str::from_utf8(line).is_err() {
                bail!(
                    "line {}: this #{} line is not UTF-8: write its paths and names in UTF-8",
                    index + 1,
                    self.directive
                );
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The script's directive; `Ok(None)` when it has no directive line.
    fn read_directive(&self, script: &Path) -> anyhow::Result<Option<Directive>> {
        let text = self.read_script(script)?;
        directive::parse_script(&text, &self.directive)
            .map_err(|e| anyhow!("{}: {e}", script.display()))
    }

    /// The script's directive, which every hook but teardown needs.
    fn require_directive(&self, script: &Path) -> anyhow::Result<Directive> {
        self.read_directive(script)?.ok_or_else(|| {
            anyhow!("{}: no #{} line in the job script", script.display(), self.directive)
        })
    }

    /// slurm_bb_job_process: check the script's directive lines (local parsing only).
    pub(crate) fn validate(&self, script: &Path) -> anyhow::Result<()> {
        let text = self.read_script(script)?;
        // The message goes to the submitting user through sbatch: name the line and token, not
        // the copy of the script in slurmctld's state directory. No directive line at all is odd
        // (Slurm calls job_process only when it saw one) but harmless: no burst buffer.
        directive::parse_script(&text, &self.directive)
            .map_err(|e| anyhow!("invalid #{} directive: {e}", self.directive))?;
        Ok(())
    }

    /// job_submit/lua: what Slurm would ignore, and the pool and size against the pools cache
    /// (a cache that cannot be read only skips those checks: Slurm still refuses an unknown
    /// pool, less clearly).
    pub(crate) fn submit_check(
        &self,
        script: &Path,
        bb_option: Option<&str>,
        pools_cache: Option<&Path>,
    ) -> anyhow::Result<()> {
        let text = self.read_script(script)?;
        let pools = pools_cache.and_then(|cache| pools::pool_sizes(cache).ok());
        directive::check_submission(&text, &self.directive, bb_option, pools.as_deref())
            .map_err(|e| anyhow!("burst buffer request refused: {e}"))
    }

    /// slurm_bb_setup: create (or reuse) the job's reservation for uid/gid, recording in the
    /// job's record which reservation that is. An existing `job-N` that another user holds is
    /// refused (its owner squatted the name), an existing persistent one the job's user may not
    /// use too; the job then gets held with the message.
    pub(crate) fn setup(
        &self,
        job: u64,
        uid: u32,
        gid: u32,
        slurm_pool: Option<&str>,
        script: &Path,
    ) -> anyhow::Result<()> {
        let directive = self.require_directive(script)?;
        check_setup_request(job, uid, slurm_pool, &directive)?;
        let (reservation, persistent) = match &directive.persistent {
            Some(name) => (name.clone(), true),
            None => (job_reservation_name(job), false),
        };
        let mut record = JobRecord {
            job,
            uid,
            gid,
            reservation,
            persistent,
            reservation_id: None,
            stage_out_unfinished: None,
            uses: directive.use_persistent.clone(),
            access: None,
        };
        let existing = self.show_reservation(&record.reservation)?;
        if let (true, Some(existing)) = (directive.create_persistent, &existing) {
            // Setup runs again after a slurmctld restart: what this job created is its own.
            let created_by_this_job =
                self.read_record(job)?.and_then(|r| r.reservation_id) == Some(existing.id);
            if !created_by_this_job {
                bail!(
                    "job {job}: persistent reservation {} already exists: create_persistent makes a new one; use persistent={} to use it",
                    record.reservation,
                    record.reservation
                );
            }
        }
        match &existing {
            Some(existing) if persistent => check_persistent_access(&record, existing)?,
            Some(existing) => check_job_reservation_owner(&record, existing)?,
            None => {}
        }
        let beside = self.reservations_beside(&record)?;
        // Before anything is created: teardown then knows the job's user whatever happens next.
        self.write_record(&record)?;
        let reservation = match existing {
            // Setup re-run after a slurmctld restart, or the job's user reserved for it: adopted.
            Some(existing) => existing,
            None => self.create_reservation(&record, &directive)?,
        };
        let id = reservation.id;
        record.access = reservation.access;
        if persistent {
            let id_text = id.to_string();
            self.manager(&["reservation", "register-job", &id_text, "--job", &job.to_string()])?;
        }
        let key = beside_registration(job);
        for reservation in beside {
            let id_text = reservation.id.to_string();
            self.manager(&["reservation", "register-job", &id_text, "--job", &key])?;
        }
        record.reservation_id = Some(id);
        self.write_record(&record)
    }

    /// The persistent reservations of the job's `use_persistent` lines, each checked to exist
    /// and to admit the job's user, before setup creates or registers anything.
    fn reservations_beside(&self, record: &JobRecord) -> anyhow::Result<Vec<Reservation>> {
        let job = record.job;
        let mut found = Vec::new();
        for name in &record.uses {
            let reservation = self.show_reservation(name)?;
            let reservation = reservation
                .filter(|r| r.state.as_deref() != Some("destroyed"))
                .ok_or_else(|| anyhow!(
                    "job {job}: use_persistent name={name}: no such persistent reservation (create it first: a job's create_persistent line, or `spillway reservation create --persistent {name}`)"
                ))?;
            if !reservation.persistent {
                bail!("job {job}: use_persistent name={name}: {name} is a job reservation, not a persistent one");
            }
            check_persistent_access(record, &reservation)?;
            found.push(reservation);
        }
        Ok(found)
    }

    /// `reservation create` for the job's user: the job's own reservation, or the persistent
    /// one the directive names (which then needs `capacity=` or a target). A request by
    /// performance targets that the pool cannot serve now leaves a marker for the pools
    /// refresh, which releases the job Slurm holds once a dry run says it fits (held.rs).
    fn create_reservation(
        &self,
        record: &JobRecord,
        directive: &Directive,
    ) -> anyhow::Result<Reservation> {
        let JobRecord { job, reservation: name, .. } = record;
        if directive.capacity_bytes.is_none() && !directive.rates.has_rates() {
            bail!("job {job}: persistent reservation {name} does not exist; add capacity=SIZE or a performance target to create it");
        }
        let mut create = create_arguments(record, directive);
        create.push("--json".into());
        let args: Vec<&str> = create.iter().map(String::as_str).collect();
        let created = match self.manager(&args) {
            Ok(created) => created,
            Err(e) if directive.rates.has_rates() && format!("{e:#}").contains(TARGETS_BUSY) => {
                create.pop();
                if let Err(marker) = self.note_waiting_for_targets(record, create) {
                    eprintln!("job {job}: cannot note the job for a retry: {marker:#}");
                }
                return Err(e.context(format!(
                    "job {job} waits for its performance targets: the pools refresh releases it when they fit"
                )));
            }
            Err(e) => return Err(e),
        };
        let reservation: Reservation = serde_json::from_str(created.trim())
            .with_context(|| format!("parsing `reservation create --json` output {created:?}"))?;
        if reservation.name != *name {
            bail!(
                "job {job}: the manager named the reservation {} instead of {name}",
                reservation.name
            );
        }
        Ok(reservation)
    }

    /// slurm_bb_data_in and slurm_bb_data_out: one `spillway stage-in`/`stage-out` per pair, run
    /// as the job's user. A private reservation's stage-ins are only checked here (each node's
    /// prolog copies them, private.rs), its stage-outs run once per node.
    pub(crate) fn stage(
        &self,
        job: u64,
        script: &Path,
        direction: StageDirection,
    ) -> anyhow::Result<()> {
        let directive = self.require_directive(script)?;
        let stages = match direction {
            StageDirection::In => directive.stage_in.clone(),
            StageDirection::Out => stage_outs_to_run(job, &directive.stage_out),
        };
        if stages.is_empty() {
            return Ok(());
        }
        let record = self.require_record(job)?;
        let private = record.private(Some(&directive));
        let result = match (direction, private) {
            (StageDirection::In, true) => self.check_private_stage_in(&record, &stages),
            (StageDirection::In, false) => {
                self.run_stages(&record, &plain_runs(&stages), direction)
            }
            (StageDirection::Out, _) => self
                .stage_out_plan(job, &stages, private)
                .and_then(|runs| self.run_stages(&record, &runs, direction)),
        };
        match (result, direction) {
            (Ok(()), StageDirection::In) => Ok(()),
            (Ok(()), StageDirection::Out) => {
                let mut record = record;
                record.stage_out_unfinished = None;
                self.write_record(&record)
            }
            (Err(e), StageDirection::In) => {
                // Slurm holds the job now; the pools refresh releases it once the sources are
                // there (held.rs).
                if let Err(marker) = self.note_held(&record, &stages) {
                    eprintln!("job {job}: cannot note the job for a retry: {marker:#}");
                }
                Err(e)
            }
            // The job's output is in the reservation only: keep it (never a clean success).
            (Err(e), StageDirection::Out) => {
                Err(self.keep_for_rescue(record, &directive, &format!("stage-out failed: {e:#}")))
            }
        }
    }

    /// The stage-outs as data_out runs them: per node of the job for a private reservation.
    fn stage_out_plan(
        &self,
        job: u64,
        stages: &[directive::Stage],
        private: bool,
    ) -> anyhow::Result<Vec<StageRun>> {
        if !private {
            return Ok(plain_runs(stages));
        }
        let nodes = job_nodes(job).context("staging out a private reservation, node by node")?;
        Ok(per_node_stage_outs(stages, &nodes))
    }

    /// One `spillway stage-in|stage-out` per run, as the job's user; the first failure stops.
    pub(crate) fn run_stages(
        &self,
        record: &JobRecord,
        runs: &[StageRun],
        direction: StageDirection,
    ) -> anyhow::Result<()> {
        let job = record.job;
        let groups = spillway_sys::user::groups_of(record.uid, record.gid)
            .with_context(|| format!("groups of uid {}", record.uid))?;
        for (index, StageRun { stage, node }) in runs.iter().enumerate() {
            let mut command = self.spillway()?;
            let (verb, src, dst) = match direction {
                StageDirection::In => ("stage-in", &stage.pfs_path, &stage.reservation_path),
                StageDirection::Out => ("stage-out", &stage.reservation_path, &stage.pfs_path),
            };
            command.args([verb, "--reservation", &record.reservation, src.as_str(), dst.as_str()]);
            if stage.kind != directive::StageKind::Any {
                command.args(["--type", stage.kind.as_str()]);
            }
            let on_node = node.as_deref().map(|n| format!(" on {n}")).unwrap_or_default();
            if let Some(node) = node {
                command.args(["--node", node]);
                if direction == StageDirection::Out {
                    // destination/<node>: the destination itself may be new.
                    if let Some(parent) = Path::new(&stage.pfs_path).parent() {
                        self.make_stage_out_directory(record, parent)?;
                    }
                }
            }
            if direction == StageDirection::In {
                // The user sees where a pending job's stage-in is (`scontrol show job`).
                let count = runs.len();
                let step = index + 1;
                note_on_job(
                    job,
                    &format!("spillway stage-in {step}/{count}{on_node}: {src} -> {dst}"),
                );
            }
            spillway_sys::process::run_as(&mut command, record.uid, record.gid, &groups);
            let what = format!("job {job}: {verb}{on_node} {src} -> {dst} (as uid {})", record.uid);
            let output = output_of(&mut command, &what)?;
            // Progress lines go to the slurmctld log through the Lua (slurm.log_info).
            if !output.trim().is_empty() {
                println!("{}", output.trim());
            }
        }
        if direction == StageDirection::In {
            note_on_job(job, &format!("spillway stage-in done ({} of {})", runs.len(), runs.len()));
        }
        Ok(())
    }

    /// slurm_bb_real_size: print the bytes the manager granted.
    pub(crate) fn real_size(&self, job: u64) -> anyhow::Result<()> {
        let record = self.require_record(job)?;
        let reservation = self
            .show_reservation(&record.reservation)?
            .ok_or_else(|| anyhow!("job {job}: reservation {} is gone", record.reservation))?;
        if let Some(bytes) = reservation.capacity_bytes {
            println!("{bytes}");
        }
        Ok(())
    }

    /// slurm_bb_paths: append SPILLWAY_BB, SPILLWAY_BB_RESERVATION, `SPILLWAY_BB_<NAME>` for
    /// each `use_persistent` line and, with `tiering=`, SPILLWAY_TIERING to Slurm's path file
    /// (local only).
    pub(crate) fn paths(&self, job: u64, script: &Path, path_file: &Path) -> anyhow::Result<()> {
        let directive = self.require_directive(script)?;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path_file)
            .with_context(|| format!("opening Slurm's path file {}", path_file.display()))?;
        let mut lines = format!("SPILLWAY_BB={}\n", self.mountpoint(job).display());
        let name = directive.persistent.clone().unwrap_or_else(|| job_reservation_name(job));
        lines.push_str(&format!("SPILLWAY_BB_RESERVATION={name}\n"));
        for name in &directive.use_persistent {
            let variable = directive::persistent_variable(name);
            let mountpoint = self.beside_mountpoint(job, name);
            lines.push_str(&format!("{variable}={}\n", mountpoint.display()));
        }
        // The job's processes schedule their phases with this strategy (docs/design/ias.md).
        if let Some(strategy) = directive.tiering {
            lines.push_str(&format!("SPILLWAY_TIERING={}\n", strategy.name()));
        }
        file.write_all(lines.as_bytes())
            .with_context(|| format!("writing {}", path_file.display()))?;
        Ok(())
    }

    /// slurm_bb_pre_run: check the job's reservations are there to be mounted (every node's
    /// prolog mounts them, see `node.rs`), and note in the record that a stage-out is due.
    pub(crate) fn pre_run(&self, job: u64, script: &Path) -> anyhow::Result<()> {
        let directive = self.require_directive(script)?;
        let record = self.require_record(job)?;
        for name in std::iter::once(&record.reservation).chain(&record.uses) {
            let reservation = self
                .show_reservation(name)?
                .ok_or_else(|| anyhow!("job {job}: reservation {name} is gone"))?;
            if reservation.state.as_deref() == Some("destroyed") {
                bail!("job {job}: reservation {name} was destroyed");
            }
            if reservation.servers.is_empty() || reservation.namespace_id.is_none() {
                bail!("job {job}: reservation {name} has no servers or no namespace");
            }
        }
        self.expect_stage_out(record, &directive)
    }

    /// From now on the job writes data only its stage-out takes to the PFS: until that
    /// succeeds, the record says so (teardown then keeps the reservation whatever happens to
    /// post_run and data_out).
    fn expect_stage_out(&self, mut record: JobRecord, directive: &Directive) -> anyhow::Result<()> {
        if directive.stage_out.is_empty() || record.persistent {
            return Ok(());
        }
        if record.stage_out_unfinished.is_none() {
            record.stage_out_unfinished = Some(
                "the job ran but its stage-out did not finish (post_run or data_out failed, timed out or was killed)"
                    .into(),
            );
            self.write_record(&record)?;
        }
        Ok(())
    }

    /// slurm_bb_post_run: wait until every node's epilog has unmounted (Slurm starts post_run
    /// when the job ends, while the epilogs still run), then unmount here too if mounted. If
    /// that fails Slurm skips data_out: a job with stage-outs then keeps its reservation as a
    /// rescue reservation.
    pub(crate) fn post_run(&self, job: u64, script: &Path) -> anyhow::Result<()> {
        let directive = self.require_directive(script)?;
        let result = crate::node::wait_for_epilogs(job).and_then(|()| self.unmount(job));
        let Err(e) = result else {
            self.snapshot_namespace(job, &directive);
            return Ok(());
        };
        if directive.stage_out.is_empty() {
            return Err(e);
        }
        let record = self.require_record(job)?;
        Err(self.keep_for_rescue(
            record,
            &directive,
            &format!("post_run failed, so Slurm does not run the stage-out: {e:#}"),
        ))
    }

    /// Every node has unmounted: the namespace's file names and paths go into the data epoch
    /// (`spillway reservation snapshot`), so that a stage-out or drain after its server is
    /// lost still finds them. Best effort: without it only that loss costs the paths.
    fn snapshot_namespace(&self, job: u64, directive: &Directive) {
        let snapshot = self.require_record(job).and_then(|record| {
            if record.private(Some(directive)) {
                return Ok(String::new()); // private namespaces are per node and not staged out
            }
            let key = record.reservation_id.map_or(record.reservation, |id| id.to_string());
            self.manager(&["reservation", "snapshot", &key])
        });
        match snapshot {
            // slurmctld's log shows it before data_out's line.
            Ok(stored) if stored.is_empty() => {}
            Ok(stored) => println!("job {job}: {}", stored.trim()),
            Err(e) => eprintln!("job {job}: no snapshot of the namespace was stored ({e:#}); the stage-out still reads the live namespace"),
        }
    }

    /// The job's stage-out failed (`why`): record it in the job's record (teardown then never
    /// destroys the reservation), ask the manager to keep the job reservation as a rescue
    /// reservation, and return the error for Slurm (the job's reason and comment), naming the
    /// reservation and how to finish it.
    fn keep_for_rescue(
        &self,
        mut record: JobRecord,
        directive: &Directive,
        why: &str,
    ) -> anyhow::Error {
        let job = record.job;
        let name = record.reservation.clone();
        if record.persistent {
            return anyhow!(
                "job {job}: {why}; the data stays in persistent reservation {name}: stage it out with `spillway stage-out --reservation {name} SRC DST`"
            );
        }
        record.stage_out_unfinished = Some(why.to_string());
        let mut problems = Vec::new();
        if let Err(e) = self.write_record(&record) {
            problems.push(format!("{e:#}"));
        }
        if let Err(e) = self.mark_rescue(&record, Some(directive), why) {
            problems.push(format!("{e:#}"));
        }
        let kept = format!(
            "job {job}: {why}; reservation {name} kept as a rescue reservation (uid {}): finish it with `spillway stage-out --retry {name}`",
            record.uid
        );
        if problems.is_empty() {
            anyhow!(kept)
        } else {
            anyhow!("{kept}; recording the rescue failed too: {}", problems.join("; "))
        }
    }

    /// `reservation mark-rescue` for the job's reservation with its stage-outs (a private
    /// reservation's per node, when Slurm still names the job's nodes; else without, and the
    /// owner names the node when retrying).
    fn mark_rescue(
        &self,
        record: &JobRecord,
        directive: Option<&Directive>,
        why: &str,
    ) -> anyhow::Result<()> {
        let key =
            record.reservation_id.map_or_else(|| record.reservation.clone(), |id| id.to_string());
        let mut args = vec![
            "reservation".to_string(),
            "mark-rescue".into(),
            key,
            "--error".into(),
            why.into(),
        ];
        let stage_outs = directive.map_or(&[][..], |d| &d.stage_out[..]);
        let private = record.private(directive);
        let runs = self
            .stage_out_plan(record.job, stage_outs, private)
            .unwrap_or_else(|_| plain_runs(stage_outs));
        for StageRun { stage, node } in runs {
            args.extend(["--from".into(), stage.reservation_path, "--to".into(), stage.pfs_path]);
            args.extend(node.map(|node| ["--node".into(), node]).into_iter().flatten());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.manager(&args).map(|_| ())
    }

    /// Unmount every mount point of the job on this host (idempotent), then kill a mount
    /// process that outlived its mount; every mount point is tried, the first error returned.
    pub(crate) fn unmount(&self, job: u64) -> anyhow::Result<()> {
        let mut first_error = None;
        for mountpoint in self.job_mountpoints(job) {
            if let Err(e) = self.unmount_at(job, &mountpoint) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Unmount `mountpoint` if mounted (lazily when the mount process is wedged), then kill a
    /// mount process of it that outlived its mount.
    fn unmount_at(&self, job: u64, mountpoint: &Path) -> anyhow::Result<()> {
        if is_mounted(mountpoint)? {
            let mut umount = self.spillway()?;
            umount.arg("umount").arg(mountpoint);
            let result =
                output_of(&mut umount, &format!("job {job}: unmounting {}", mountpoint.display()));
            if is_mounted(mountpoint)? {
                // The mount process is wedged: detach so the node is usable, then report.
                spillway_sys::mount::unmount(mountpoint, true)
                    .with_context(|| format!("detaching {}", mountpoint.display()))?;
                result?;
            }
        }
        let leftovers = find_processes(|args| is_mount_of(args, mountpoint))?;
        kill_all(&leftovers);
        Ok(())
    }

    /// slurm_bb_job_teardown: unmount, kill leftovers, destroy the job reservation setup made
    /// (or unregister the job from its persistent one), remove the mount point and, once all
    /// that succeeded, the record. A failed step does not stop the next.
    pub(crate) fn teardown(
        &self,
        job: u64,
        _hurry: bool,
        script: Option<&Path>,
    ) -> anyhow::Result<()> {
        let record = self.read_record(job)?;
        let directive = match script {
            Some(script) if script.exists() => self.read_directive(script).unwrap_or(None),
            _ => None,
        };
        let name = match (&record, &directive) {
            (Some(record), _) => record.reservation.clone(),
            (None, Some(Directive { persistent: Some(name), .. })) => name.clone(),
            (None, _) => job_reservation_name(job),
        };
        let mut problems = Vec::new();
        if let Err(e) = self.unmount(job) {
            problems.push(format!("{e:#}"));
        }
        // Copies of this job still running (a cancelled stage-in): Slurm killed the hook, not
        // necessarily its children.
        match find_processes(|args| is_stage_of(args, &name)) {
            Ok(pids) => kill_all(&pids),
            Err(e) => problems.push(format!("{e:#}")),
        }
        // Without a record setup never asked the manager for anything: nothing of this job's.
        if let Some(record) = &record {
            let released = self.release_reservation(record, directive.as_ref());
            let unregistered = self.unregister_beside(record);
            match released.and(unregistered) {
                Err(e) => problems.push(format!("{e:#}")),
                Ok(()) => {
                    if let Some(directive) = &directive {
                        self.destroy_persistent(record, &directive.destroy_persistent);
                    }
                }
            }
        }
        let mountpoints: Vec<_> =
            self.job_mountpoints(job).into_iter().filter(|m| m.exists()).collect();
        if !mountpoints.is_empty() {
            // A cancelled running job is torn down while its nodes' epilogs still run, and
            // removing a (shared) mount point detaches it on every host still using it: let
            // the epilogs unmount first (bounded; right away when post_run already waited).
            if let Err(e) = crate::node::wait_for_epilogs(job) {
                eprintln!("{e:#}");
            }
        }
        for mountpoint in mountpoints {
            if !is_mounted(&mountpoint).unwrap_or(true) {
                if let Err(e) = std::fs::remove_dir(&mountpoint) {
                    problems.push(format!("removing {}: {e}", mountpoint.display()));
                }
            }
        }
        if problems.is_empty() {
            self.remove_mount_logs(job);
            match std::fs::remove_file(self.record_path(job)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    problems.push(format!("removing {}: {e}", self.record_path(job).display()))
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            // Slurm retries a failed teardown; every step above is idempotent.
            bail!("job {job}: teardown incomplete: {}", problems.join("; "))
        }
    }

    /// Teardown unregisters the job from the reservations of its `use_persistent` lines
    /// (idempotent; one destroyed meanwhile is no error); every one is tried.
    fn unregister_beside(&self, record: &JobRecord) -> anyhow::Result<()> {
        let key = beside_registration(record.job);
        let mut first_error = None;
        for name in &record.uses {
            let unregistered =
                self.manager_unless_gone(&["reservation", "unregister-job", name, "--job", &key]);
            if let Err(e) = unregistered {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// `destroy_persistent`: each named persistent reservation destroyed as the job's user (the
    /// manager refuses another user's, and one another job still uses), unless this job's
    /// stage-out did not finish (its data may be in there). A refusal does not fail the teardown
    /// (Slurm would retry it for ever): it goes to the log and onto the job.
    fn destroy_persistent(&self, record: &JobRecord, names: &[String]) {
        let job = record.job;
        if names.is_empty() {
            return;
        }
        if let Some(why) = &record.stage_out_unfinished {
            let message = format!("spillway: destroy_persistent not done: {why}");
            eprintln!("job {job}: {message}");
            note_on_job(job, &message);
            return;
        }
        for name in names {
            let destroyed = self.spillway().and_then(|mut command| {
                command.args(["reservation", "destroy", name]);
                let groups = spillway_sys::user::groups_of(record.uid, record.gid)
                    .with_context(|| format!("groups of uid {}", record.uid))?;
                spillway_sys::process::run_as(&mut command, record.uid, record.gid, &groups);
                output_of(
                    &mut command,
                    &format!("reservation destroy {name} (as uid {})", record.uid),
                )
            });
            match destroyed {
                Ok(_) => println!("job {job}: persistent reservation {name} destroyed"),
                Err(e) => {
                    let message = format!("spillway: destroy_persistent name={name} failed: {e:#}");
                    eprintln!("job {job}: {message}");
                    note_on_job(job, &message);
                }
            }
        }
    }

    /// Teardown's part with the manager: unregister the job from its persistent reservation, or
    /// destroy its job reservation — the one setup recorded, never another (a `job-N` someone
    /// else holds stays). If setup stopped between asking for the reservation and recording it,
    /// the `job-N` reservation is the job's when the job's user owns it (only that user or root
    /// can create one for the job).
    fn release_reservation(
        &self,
        record: &JobRecord,
        directive: Option<&Directive>,
    ) -> anyhow::Result<()> {
        let JobRecord { job, reservation: name, persistent, reservation_id, .. } = record;
        let job_text = job.to_string();
        let key = reservation_id.map_or_else(|| name.clone(), |id| id.to_string());
        if *persistent {
            self.manager_unless_gone(&["reservation", "unregister-job", &key, "--job", &job_text])?;
            return Ok(());
        }
        let Some(existing) = self.show_reservation(&key)? else { return Ok(()) };
        if existing.state.as_deref() == Some("destroyed") {
            return Ok(());
        }
        if let Some(why) = &record.stage_out_unfinished {
            // The stage-out failed: the data is only here. Make sure the manager knows (the
            // stage-out hook may not have reached it), never destroy.
            if existing.rescue.is_none() {
                self.mark_rescue(record, directive, why).with_context(|| {
                    format!("job {job}: keeping reservation {name} as a rescue reservation")
                })?;
            }
            println!("job {job}: keeping rescue reservation {name}: {why}");
            return Ok(());
        }
        if existing.rescue.is_some() {
            println!("job {job}: keeping rescue reservation {name} (its stage-out failed)");
            return Ok(());
        }
        if !teardown_destroys(record, &existing) {
            println!(
                "job {job}: leaving reservation {name} (uid {}) alone: this job's setup did not create it",
                existing.owner.map_or_else(|| "unknown".into(), |o| o.to_string())
            );
            return Ok(());
        }
        let id_text = existing.id.to_string();
        self.manager_unless_gone(&["reservation", "destroy", &id_text, "--job", &job_text])?;
        Ok(())
    }

    /// slurm_bb_pools: print the cached answer, or (`--refresh`) reap lost teardowns, ask the
    /// manager and rewrite the cache.
    pub(crate) fn pools(&self, cache: Option<&Path>, refresh: bool) -> anyhow::Result<()> {
        if !refresh {
            let cache =
                cache.ok_or_else(|| anyhow!("bb pools: give --refresh, --cache FILE or both"))?;
            print!("{}", pools::read_cache(cache)?);
            return Ok(());
        }
        self.reap_orphans();
        self.retry_held();
        let json = self.slurm_pools_json()?;
        if let Some(cache) = cache {
            pools::write_cache(cache, &json)?;
        }
        println!("{json}");
        Ok(())
    }
}

/// The stage-outs data_out runs: all of them, but those with `when=success` only when the job
/// exited 0. When Slurm cannot say how the job ended they run too: a copy too many is
/// recoverable, a checkpoint never copied is not.
fn stage_outs_to_run(job: u64, stages: &[directive::Stage]) -> Vec<directive::Stage> {
    if stages.iter().all(|s| s.when == directive::StageWhen::Always) {
        return stages.to_vec();
    }
    let succeeded = job_succeeded(job);
    stages
        .iter()
        .filter(|stage| {
            let run = stage.when == directive::StageWhen::Always || succeeded != Some(false);
            if !run {
                println!(
                    "job {job}: stage-out {} -> {} skipped: the job did not exit 0 (when=success)",
                    stage.reservation_path, stage.pfs_path
                );
            }
            run
        })
        .cloned()
        .collect()
}

/// How the manager says a request by targets must wait (`CreateReservationError::TargetsBusy`).
pub(crate) const TARGETS_BUSY: &str = "targets not available now";

/// `spillway reservation create …` for the job's reservation as the directive asks it, for
/// the job's user (without `--json`): what setup runs, and what the pools refresh runs with
/// `--dry-run` for a job waiting for its targets.
pub(crate) fn create_arguments(record: &JobRecord, directive: &Directive) -> Vec<String> {
    let JobRecord { job, uid, gid, reservation: name, persistent, .. } = record;
    let mut create: Vec<String> = ["reservation", "create", "--replicas"].map(String::from).into();
    create.push(directive.replicas.to_string());
    create.extend(["--owner".into(), uid.to_string(), "--group".into(), gid.to_string()]);
    let rates = &directive.rates;
    let flags = [
        ("--capacity", directive.capacity_bytes.map(|bytes| bytes.to_string())),
        ("--bandwidth", rates.bandwidth_bytes_per_s.map(|rate| format!("{rate}/s"))),
        ("--iops", rates.iops.map(|rate| rate.to_string())),
        ("--metadata", rates.metadata_ops_per_s.map(|rate| rate.to_string())),
        ("--access", directive.access.map(|access| access.as_str().to_string())),
        ("--pool", directive.pool.clone()),
        ("--tiering", directive.tiering.map(|strategy| strategy.name().to_string())),
    ];
    for (flag, value) in flags {
        create.extend(value.map(|value| [flag.to_string(), value]).into_iter().flatten());
    }
    if *persistent {
        create.extend(["--persistent".into(), name.clone()]);
    } else {
        create.extend(["--job".into(), job.to_string()]);
    }
    create
}

/// What setup refuses before asking the manager: root as the job's user, and a pool that
/// differs from the one Slurm accounted the job against.
fn check_setup_request(
    job: u64,
    uid: u32,
    slurm_pool: Option<&str>,
    directive: &Directive,
) -> anyhow::Result<()> {
    if uid == 0 {
        bail!("job {job}: root may not use a burst buffer reservation");
    }
    if let (Some(slurm_pool), Some(pool)) = (slurm_pool, directive.pool.as_deref()) {
        if slurm_pool != pool && slurm_pool != "(null)" && !slurm_pool.is_empty() {
            bail!("job {job}: Slurm accounted pool {slurm_pool} but the directive asks for pool={pool}");
        }
    }
    Ok(())
}

/// Whether teardown destroys `existing` (an active reservation found under the record's
/// reservation id, or its name when setup recorded none): the reservation setup recorded for
/// the job; without a recorded id (setup stopped between asking the manager and recording) the
/// job's `job-N` only if the job's user owns it — never a reservation someone else holds.
fn teardown_destroys(record: &JobRecord, existing: &Reservation) -> bool {
    match record.reservation_id {
        Some(id) => existing.id == id,
        None => existing.owner == Some(record.uid) && existing.name == record.reservation,
    }
}

/// Is the existing `job-N` reservation the job's own? Its owner must be the job's user: anyone
/// else holding that name squatted it (the manager refuses that when it asks Slurm who owns
/// the job; `manager.job_owner_check = "none"` does not), and using it would mount the
/// squatter's namespace in the job.
fn check_job_reservation_owner(record: &JobRecord, existing: &Reservation) -> anyhow::Result<()> {
    let JobRecord { job, uid, reservation: name, .. } = record;
    match existing.owner {
        Some(owner) if owner == *uid => Ok(()),
        owner => bail!(
            "job {job}: reservation {name} already exists and belongs to uid {}, not to the job's uid {uid}; refusing to use it (root can destroy it: spillway reservation destroy {name})",
            owner.map_or_else(|| "unknown".into(), |o| o.to_string())
        ),
    }
}

/// May the job's user use the existing persistent reservation?
fn check_persistent_access(record: &JobRecord, existing: &Reservation) -> anyhow::Result<()> {
    let JobRecord { job, uid, gid, .. } = record;
    let name = &existing.name;
    // The hooks run as root and see every reservation: apply the manager's rule for
    // persistent reservations here (owner, allowed uids, allowed groups).
    let groups = spillway_sys::user::groups_of(*uid, *gid)
        .with_context(|| format!("groups of uid {uid}"))?;
    let allowed = existing.owner.is_none_or(|owner| owner == *uid)
        || existing.allowed_uids.contains(uid)
        || existing.allowed_gids.iter().any(|g| groups.contains(g));
    if !allowed {
        bail!(
            "job {job}: persistent reservation {name} belongs to uid {} and does not allow uid {uid}",
            existing.owner.unwrap_or_default()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(job: u64, uid: u32) -> JobRecord {
        JobRecord {
            job,
            uid,
            gid: uid,
            reservation: job_reservation_name(job),
            persistent: false,
            reservation_id: None,
            stage_out_unfinished: None,
            uses: Vec::new(),
            access: None,
        }
    }

    /// Hooks with their state and mounts under `dir`, and no manager.
    fn hooks_in(dir: &Path) -> Hooks {
        Hooks {
            manager: None,
            directive: "BB_LUA".into(),
            state_dir: dir.join("state"),
            mount_root: dir.join("mnt"),
        }
    }

    fn reservation(name: &str, owner: u32) -> Reservation {
        serde_json::from_value(serde_json::json!({"id": 5, "name": name, "owner": owner})).unwrap()
    }

    #[test]
    fn paths_export_the_strategy_the_directive_names() {
        let dir = tempfile::tempdir().unwrap();
        let hooks = hooks_in(dir.path());
        let script = dir.path().join("job.sh");
        let exported = |directive: &str| {
            std::fs::write(&script, format!("#!/bin/sh\n{directive}\nsrun app\n")).unwrap();
            let path_file = dir.path().join(format!("paths-{}", directive.len()));
            hooks.paths(7, &script, &path_file).unwrap();
            std::fs::read_to_string(path_file).unwrap()
        };
        let with = exported("#BB_LUA capacity=1G tiering=measured");
        assert!(with.contains("SPILLWAY_BB_RESERVATION=job-7\n"), "{with}");
        assert!(with.contains("SPILLWAY_TIERING=measured\n"), "{with}");
        let without = exported("#BB_LUA capacity=1G");
        assert!(!without.contains("SPILLWAY_TIERING"), "{without}");
        let beside = exported("#BB_LUA capacity=1G\n#BB_LUA use_persistent name=in-2.x");
        let mountpoint = hooks.beside_mountpoint(7, "in-2.x");
        let line = format!("SPILLWAY_BB_IN_2_X={}\n", mountpoint.display());
        assert!(beside.contains(&line), "{beside}");
        assert!(mountpoint.ends_with("job-7.in-2.x"), "{}", mountpoint.display());
    }

    #[test]
    fn scripts_with_bytes_that_are_not_utf8_outside_the_directive_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let hooks = hooks_in(dir.path());
        let script = dir.path().join("job.sh");
        // A Latin-1 comment ("caf\xe9") and data after the first command.
        std::fs::write(&script, b"#!/bin/sh\n# caf\xe9\n#BB_LUA capacity=1G pool=p\necho \xff\n")
            .unwrap();
        hooks.validate(&script).unwrap();
        hooks.submit_check(&script, None, None).unwrap();
        assert_eq!(hooks.require_directive(&script).unwrap().capacity_bytes, Some(1 << 30));
        std::fs::write(&script, b"#!/bin/sh\n#BB_LUA capacity=1G stage_in=/pfs/caf\xe9:x\n")
            .unwrap();
        let error = hooks.validate(&script).unwrap_err().to_string();
        assert!(error.contains("line 2: this #BB_LUA line is not UTF-8"), "{error}");
    }

    #[test]
    fn setup_refuses_a_job_reservation_another_user_holds() {
        let error = check_job_reservation_owner(&record(12, 999), &reservation("job-12", 1500))
            .unwrap_err()
            .to_string();
        assert!(error.contains("job-12 already exists and belongs to uid 1500"), "{error}");
        assert!(error.contains("not to the job's uid 999"), "{error}");
        check_job_reservation_owner(&record(12, 999), &reservation("job-12", 999))
            .expect("the job's own reservation (setup re-run, or its user reserved) is used");
    }

    #[test]
    fn teardown_destroys_only_what_setup_recorded() {
        let recorded = JobRecord { reservation_id: Some(5), ..record(12, 999) };
        assert!(teardown_destroys(&recorded, &reservation("job-12", 999)));
        let other_id = JobRecord { reservation_id: Some(6), ..record(12, 999) };
        assert!(!teardown_destroys(&other_id, &reservation("job-12", 999)));
        // Setup stopped before recording: the job's own job-N only, never a squatter's.
        assert!(teardown_destroys(&record(12, 999), &reservation("job-12", 999)));
        assert!(!teardown_destroys(&record(12, 999), &reservation("job-12", 1500)));
    }
}
