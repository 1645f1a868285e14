//! The Slurm integration: `spillway bb <hook>`, the burst_buffer/lua hooks (one subcommand per
//! hook), and the `#BB_LUA` directive they read ([`directive`]).
//!
//! `slurm/burst_buffer.lua` is a thin shim: each `slurm_bb_*` function runs the matching
//! subcommand here and hands its exit status and output back to Slurm. Keeping the logic in Rust
//! means the directive parser is the tested one in [`directive`], errors are the CLI's, and the
//! hooks can be run by hand when something goes wrong.
//!
//! Hooks that run inside slurmctld (`validate` for job_process, `paths`, `pools` from the cache)
//! do local work only. The others talk to the manager through the contract CLI (`spillway
//! reservation …`, `stage-in`, `stage-out`, `mount`, `umount`), run as child processes of this
//! binary so that the manager sees the right caller through SO_PEERCRED: reservations are
//! created by root *for* the job's uid (`--owner`), while stage-in and stage-out run *as* the
//! job's uid/gid/groups, so the PFS permissions of the user apply to what gets copied.
//!
//! The job script is the job's state: every hook re-parses it. The only extra state is a small
//! JSON record per job in the state directory, written by `setup` (the only hook Slurm gives the
//! uid/gid) and removed by `teardown`. Teardown is idempotent and thorough: unmount if mounted,
//! kill any leftover `spillway mount`/`stage-in`/`stage-out` process of the job (found in /proc
//! by its exact arguments), destroy the job's reservation (never a persistent one), remove the
//! mount point — so a job cancelled during stage-in or while running leaves nothing behind.

mod commands;
pub mod directive;
mod job;
mod orphans;
mod pools;
mod processes;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{anyhow, bail, Context};
use clap::{Parser, Subcommand};
use commands::{output_of, Reservation};
use directive::Directive;
use job::{job_reservation_name, JobRecord};
use processes::{find_processes, is_mount_of, is_mounted, is_stage_of, kill_all};

/// Where job reservations are mounted on the node unless `--mount-root` says otherwise.
const MOUNT_ROOT_DEFAULT: &str = "/mnt/spillway";
/// Where per-job records live unless `--state-dir` says otherwise.
const STATE_DIR_DEFAULT: &str = "/var/lib/spillway/bb";
#[derive(Parser)]
pub struct Args {
    /// Manager socket, passed to every manager command (`SPILLWAY_MANAGER`).
    #[arg(long, global = true, env = "SPILLWAY_MANAGER")]
    manager: Option<PathBuf>,
    /// Directive name without the `#` (burst_buffer.conf `Directive=`).
    #[arg(long, global = true, default_value = directive::DIRECTIVE_DEFAULT)]
    directive: String,
    /// Directory for per-job records (root-only).
    #[arg(long, global = true, env = "SPILLWAY_BB_STATE_DIR", default_value = STATE_DIR_DEFAULT)]
    state_dir: PathBuf,
    /// Directory under which each job's reservation is mounted (`<root>/job-<id>`).
    #[arg(long, global = true, env = "SPILLWAY_BB_MOUNT_ROOT", default_value = MOUNT_ROOT_DEFAULT)]
    mount_root: PathBuf,
    #[command(subcommand)]
    hook: Hook,
}

#[derive(Subcommand)]
enum Hook {
    /// slurm_bb_job_process: check the script's directive lines (local parsing only).
    Validate { script: PathBuf },
    /// slurm_bb_pools: print the pools as Slurm's JSON; `--cache` reads/refreshes a file.
    Pools {
        /// Cache file the Lua reads from slurmctld.
        #[arg(long)]
        cache: Option<PathBuf>,
        /// Ask the manager and rewrite the cache (without it, print the cache as is).
        #[arg(long)]
        refresh: bool,
    },
    /// slurm_bb_setup: create (or reuse) the job's reservation for uid/gid.
    Setup {
        #[arg(long)]
        job: u64,
        #[arg(long)]
        uid: u32,
        #[arg(long)]
        gid: u32,
        /// The pool Slurm accounted the job against (checked against the directive).
        #[arg(long)]
        pool: Option<String>,
        script: PathBuf,
    },
    /// slurm_bb_data_in: copy the stage_in pairs from the PFS, as the job's user.
    DataIn {
        #[arg(long)]
        job: u64,
        script: PathBuf,
    },
    /// slurm_bb_real_size: print the bytes the manager granted (22.05 passes no script).
    RealSize {
        #[arg(long)]
        job: u64,
    },
    /// slurm_bb_paths: write SPILLWAY_BB=<mount point> into Slurm's path file (local only).
    Paths {
        #[arg(long)]
        job: u64,
        script: PathBuf,
        path_file: PathBuf,
    },
    /// slurm_bb_pre_run: mount the reservation on this node.
    PreRun {
        #[arg(long)]
        job: u64,
        script: PathBuf,
    },
    /// slurm_bb_post_run: unmount it.
    PostRun {
        #[arg(long)]
        job: u64,
        script: PathBuf,
    },
    /// slurm_bb_data_out: copy the stage_out pairs to the PFS, as the job's user.
    DataOut {
        #[arg(long)]
        job: u64,
        script: PathBuf,
    },
    /// slurm_bb_job_teardown: unmount, kill leftovers, destroy the job reservation.
    Teardown {
        #[arg(long)]
        job: u64,
        /// Slurm's hurry flag (cancelled job): same cleanup, nothing is staged either way.
        #[arg(long)]
        hurry: bool,
        /// The script may be gone when Slurm tears down a failed submission.
        script: Option<PathBuf>,
    },
    /// slurm_bb_get_status (`scontrol show bbstat`): `spillway status`.
    Status {
        /// Extra words after `bbstat`, passed to `spillway status`.
        words: Vec<String>,
    },
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // Slurm's slurmscriptd reads each hook's result from a pipe until EOF, and the Lua's popen
    // hands that pipe down to us: no child of ours (above all the mount's serving process,
    // which outlives the hook) may inherit it, or the hook "hangs" until its timeout.
    // Best effort: without /proc the descriptors stay, which only delays Slurm's reader.
    let _ = spillway_sys::process::close_inherited_descriptors_on_exec();
    let ctx = Hooks {
        manager: args.manager,
        directive: args.directive,
        state_dir: args.state_dir,
        mount_root: args.mount_root,
    };
    match args.hook {
        Hook::Validate { script } => ctx.validate(&script),
        Hook::Pools { cache, refresh } => ctx.pools(cache.as_deref(), refresh),
        Hook::Setup { job, uid, gid, pool, script } => {
            ctx.setup(job, uid, gid, pool.as_deref(), &script)
        }
        Hook::DataIn { job, script } => ctx.stage(job, &script, StageDirection::In),
        Hook::RealSize { job } => ctx.real_size(job),
        Hook::Paths { job, script, path_file } => ctx.paths(job, &script, &path_file),
        Hook::PreRun { job, script } => ctx.pre_run(job, &script),
        Hook::PostRun { job, script } => ctx.post_run(job, &script),
        Hook::DataOut { job, script } => ctx.stage(job, &script, StageDirection::Out),
        Hook::Teardown { job, hurry, script } => ctx.teardown(job, hurry, script.as_deref()),
        Hook::Status { words } => ctx.status(&words),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum StageDirection {
    In,
    Out,
}

/// Settings shared by every hook.
struct Hooks {
    manager: Option<PathBuf>,
    directive: String,
    state_dir: PathBuf,
    mount_root: PathBuf,
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

/// May the job's user use the existing persistent reservation?
fn check_persistent_access(record: &JobRecord, existing: &Reservation) -> anyhow::Result<()> {
    let JobRecord { job, uid, gid, reservation: name, .. } = record;
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

impl Hooks {
    fn read_directive(&self, script: &Path) -> anyhow::Result<Option<Directive>> {
        let text = std::fs::read_to_string(script)
            .with_context(|| format!("reading job script {}", script.display()))?;
        directive::parse_script(&text, &self.directive)
            .map_err(|e| anyhow!("{}: {e}", script.display()))
    }

    fn require_directive(&self, script: &Path) -> anyhow::Result<Directive> {
        self.read_directive(script)?.ok_or_else(|| {
            anyhow!("{}: no #{} line in the job script", script.display(), self.directive)
        })
    }

    fn validate(&self, script: &Path) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(script)
            .with_context(|| format!("reading job script {}", script.display()))?;
        // The message goes to the submitting user through sbatch: name the line and token, not
        // the copy of the script in slurmctld's state directory. No directive line at all is odd
        // (Slurm calls job_process only when it saw one) but harmless: no burst buffer.
        directive::parse_script(&text, &self.directive)
            .map_err(|e| anyhow!("invalid #{} directive: {e}", self.directive))?;
        Ok(())
    }

    fn setup(
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
        let record = JobRecord { job, uid, gid, reservation, persistent };
        match self.show_reservation(&record.reservation)? {
            Some(existing) if persistent => check_persistent_access(&record, &existing)?,
            Some(_) => {} // setup re-run after a slurmctld restart: the job's reservation exists
            None => self.create_reservation(&record, &directive)?,
        }
        self.write_record(&record)
    }

    /// `reservation create` for the job's user: the job's own reservation, or the persistent
    /// one the directive names (which then needs `capacity=`).
    fn create_reservation(&self, record: &JobRecord, directive: &Directive) -> anyhow::Result<()> {
        let JobRecord { job, uid, gid, reservation: name, persistent } = record;
        let uid_text = uid.to_string();
        let gid_text = gid.to_string();
        let job_text = job.to_string();
        let capacity = directive.capacity_bytes.ok_or_else(|| {
            anyhow!("job {job}: persistent reservation {name} does not exist; add capacity=SIZE to create it")
        })?;
        let capacity_text = capacity.to_string();
        let mut create = vec![
            "reservation",
            "create",
            "--capacity",
            &capacity_text,
            "--access",
            directive.access.as_str(),
            "--owner",
            &uid_text,
            "--group",
            &gid_text,
            "--json",
        ];
        if let Some(pool) = directive.pool.as_deref() {
            create.extend(["--pool", pool]);
        }
        if *persistent {
            create.extend(["--persistent", name]);
        } else {
            create.extend(["--job", &job_text]);
        }
        let created = self.manager(&create)?;
        let reservation: Reservation = serde_json::from_str(created.trim())
            .with_context(|| format!("parsing `reservation create --json` output {created:?}"))?;
        if reservation.name != *name {
            bail!(
                "job {job}: the manager named the reservation {} instead of {name}",
                reservation.name
            );
        }
        Ok(())
    }

    fn stage(&self, job: u64, script: &Path, direction: StageDirection) -> anyhow::Result<()> {
        let directive = self.require_directive(script)?;
        let stages = match direction {
            StageDirection::In => &directive.stage_in,
            StageDirection::Out => &directive.stage_out,
        };
        if stages.is_empty() {
            return Ok(());
        }
        let record = self.require_record(job)?;
        for stage in stages {
            let mut command = self.spillway()?;
            let (verb, src, dst) = match direction {
                StageDirection::In => ("stage-in", &stage.pfs_path, &stage.reservation_path),
                StageDirection::Out => ("stage-out", &stage.reservation_path, &stage.pfs_path),
            };
            command.args([verb, "--reservation", &record.reservation, src.as_str(), dst.as_str()]);
            let groups = spillway_sys::user::groups_of(record.uid, record.gid)
                .with_context(|| format!("groups of uid {}", record.uid))?;
            spillway_sys::process::run_as(&mut command, record.uid, record.gid, &groups);
            let what = format!("job {job}: {verb} {src} -> {dst} (as uid {})", record.uid);
            let output = output_of(&mut command, &what)?;
            // Progress lines go to the slurmctld log through the Lua (slurm.log_info).
            if !output.trim().is_empty() {
                println!("{}", output.trim());
            }
        }
        Ok(())
    }

    fn real_size(&self, job: u64) -> anyhow::Result<()> {
        let record = self.require_record(job)?;
        let reservation = self
            .show_reservation(&record.reservation)?
            .ok_or_else(|| anyhow!("job {job}: reservation {} is gone", record.reservation))?;
        if let Some(bytes) = reservation.capacity_bytes {
            println!("{bytes}");
        }
        Ok(())
    }

    fn paths(&self, job: u64, script: &Path, path_file: &Path) -> anyhow::Result<()> {
        let directive = self.require_directive(script)?;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path_file)
            .with_context(|| format!("opening Slurm's path file {}", path_file.display()))?;
        let mut lines = format!("SPILLWAY_BB={}\n", self.mountpoint(job).display());
        let name = directive.persistent.clone().unwrap_or_else(|| job_reservation_name(job));
        lines.push_str(&format!("SPILLWAY_BB_RESERVATION={name}\n"));
        file.write_all(lines.as_bytes())
            .with_context(|| format!("writing {}", path_file.display()))?;
        Ok(())
    }

    fn pre_run(&self, job: u64, script: &Path) -> anyhow::Result<()> {
        let directive = self.require_directive(script)?;
        let record = self.require_record(job)?;
        let reservation = self
            .show_reservation(&record.reservation)?
            .ok_or_else(|| anyhow!("job {job}: reservation {} is gone", record.reservation))?;
        let mut help = self.spillway()?;
        help.args(["mount", "--help"]).stdout(Stdio::null()).stderr(Stdio::null());
        if !help.status().map(|s| s.success()).unwrap_or(false) {
            bail!(
                "job {job}: cannot mount reservation {}: this spillway has no `mount` subcommand",
                record.reservation
            );
        }
        let mountpoint = self.mountpoint(job);
        if is_mounted(&mountpoint)? {
            return Ok(()); // pre_run re-run: already mounted
        }
        std::fs::create_dir_all(&mountpoint)
            .with_context(|| format!("creating mount point {}", mountpoint.display()))?;
        let namespace_id = reservation.namespace_id.ok_or_else(|| {
            anyhow!("job {job}: reservation {} has no namespace_id", record.reservation)
        })?;
        let epoch = reservation.epoch.unwrap_or(1);
        if reservation.servers.is_empty() {
            bail!("job {job}: reservation {} has no servers", record.reservation);
        }
        let access =
            reservation.access.clone().unwrap_or_else(|| directive.access.as_str().to_string());
        // The namespace root belongs to the reservation's owner: private (0700) for a job
        // reservation, sticky and shared (1777, like /tmp) for a persistent one, whose allowed
        // users and groups the manager decides.
        let owner = format!(
            "{}:{}",
            reservation.owner.unwrap_or(record.uid),
            reservation.group.unwrap_or(record.gid)
        );
        let mode = if reservation.persistent { "1777" } else { "0700" };
        let log = self.mount_log_path(job);
        // The serving process stays behind: it must not inherit a pipe of ours (or the Lua's
        // popen), or whoever reads that pipe waits for it until the hook times out. Its output
        // goes to the log file instead.
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut mount = self.spillway()?;
        mount
            .args(["mount", "--servers", &reservation.servers.join(","), "--access", &access])
            .args(["--namespace-id", &namespace_id.to_string(), "--epoch", &epoch.to_string()])
            .args(["--root-owner", &owner, "--root-mode", mode])
            .arg("--log")
            .arg(&log)
            .arg("--background")
            .arg(&mountpoint)
            .stdout(out.try_clone()?)
            .stderr(out);
        let status = mount.status().context("running spillway mount")?;
        if !status.success() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "job {job}: mounting {} on {} failed ({status}): {}",
                record.reservation,
                mountpoint.display(),
                tail.join(" / ")
            );
        }
        if !is_mounted(&mountpoint)? {
            bail!(
                "job {job}: `spillway mount` succeeded but {} is not a mount point",
                mountpoint.display()
            );
        }
        Ok(())
    }

    fn post_run(&self, job: u64, script: &Path) -> anyhow::Result<()> {
        let _ = self.require_directive(script)?;
        self.unmount(job)
    }

    /// Unmount the job's mount point if mounted (idempotent), then kill a mount process that
    /// outlived its mount.
    fn unmount(&self, job: u64) -> anyhow::Result<()> {
        let mountpoint = self.mountpoint(job);
        if is_mounted(&mountpoint)? {
            let mut umount = self.spillway()?;
            umount.arg("umount").arg(&mountpoint);
            let result =
                output_of(&mut umount, &format!("job {job}: unmounting {}", mountpoint.display()));
            if is_mounted(&mountpoint)? {
                // The mount process is wedged: detach so the node is usable, then report.
                spillway_sys::mount::unmount(&mountpoint, true)
                    .with_context(|| format!("detaching {}", mountpoint.display()))?;
                result?;
            }
        }
        let leftovers = find_processes(|args| is_mount_of(args, &mountpoint))?;
        kill_all(&leftovers);
        Ok(())
    }

    fn teardown(&self, job: u64, _hurry: bool, script: Option<&Path>) -> anyhow::Result<()> {
        let record = self.read_record(job)?;
        let directive = match script {
            Some(script) if script.exists() => self.read_directive(script).unwrap_or(None),
            _ => None,
        };
        let (name, persistent) = match (&record, &directive) {
            (Some(record), _) => (record.reservation.clone(), record.persistent),
            (None, Some(Directive { persistent: Some(name), .. })) => (name.clone(), true),
            (None, _) => (job_reservation_name(job), false),
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
        if !persistent {
            match self.show_reservation(&name) {
                Ok(Some(_)) => {
                    if let Err(e) =
                        self.manager(&["reservation", "destroy", &name, "--job", &job.to_string()])
                    {
                        problems.push(format!("{e:#}"));
                    }
                }
                Ok(None) => {}
                Err(e) => problems.push(format!("{e:#}")),
            }
        }
        let mountpoint = self.mountpoint(job);
        if mountpoint.exists() && !is_mounted(&mountpoint).unwrap_or(true) {
            if let Err(e) = std::fs::remove_dir(&mountpoint) {
                problems.push(format!("removing {}: {e}", mountpoint.display()));
            }
        }
        if problems.is_empty() {
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

    fn pools(&self, cache: Option<&Path>, refresh: bool) -> anyhow::Result<()> {
        if !refresh {
            let cache =
                cache.ok_or_else(|| anyhow!("bb pools: give --refresh, --cache FILE or both"))?;
            print!("{}", pools::read_cache(cache)?);
            return Ok(());
        }
        self.reap_orphans();
        let json = self.slurm_pools_json()?;
        if let Some(cache) = cache {
            pools::write_cache(cache, &json)?;
        }
        println!("{json}");
        Ok(())
    }

    fn status(&self, words: &[String]) -> anyhow::Result<()> {
        let mut command = self.spillway()?;
        command.arg("status").args(words);
        print!("{}", output_of(&mut command, "spillway status")?);
        Ok(())
    }
}
