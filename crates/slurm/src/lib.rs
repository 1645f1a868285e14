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
//!
//! The mount is per node: Slurm's Prolog and Epilog (`PrologFlags=Alloc`) run `spillway bb
//! prolog` / `bb epilog` on every node of the job (`node.rs`), which mount the job's reservation
//! (found through the manager) at the same `<mount root>/job-<id>` on each and unmount it after.
//!
//! Where things live: `hooks.rs` has one method per hook, doing its steps in order; `node.rs` the
//! per-node prolog and epilog and post_run's wait for them; `job.rs` the
//! per-job record and the names derived from a job id (mount point, reservation); `processes.rs`
//! mountinfo and finding/killing a job's leftover processes in /proc; `commands.rs` running
//! `spillway …` children and checking their output; `pools.rs` Slurm's pools answer and its cache;
//! `orphans.rs` the periodic reaper of lost teardowns; `held.rs` the release of jobs held for a
//! failed stage-in once their sources are there; `private.rs` staging a private reservation
//! (per node: stage-in in each node's prolog, stage-out into one directory per node); `status.rs` what `scontrol show bbstat`
//! shows to whom; [`directive`] the `#BB_LUA` parser. This file holds the command line and the
//! dispatch.

mod commands;
pub mod directive;
mod held;
mod hooks;
mod job;
mod node;
mod orphans;
mod pools;
mod private;
mod processes;
mod status;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use hooks::{Hooks, StageDirection};

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
    /// Slurm's job_submit/lua (`slurm/job_submit.lua`): refuse what Slurm would ignore or
    /// pend forever on (another system's directive, a directive after the first command,
    /// `sbatch --bb` text, an unknown pool, a size no pool holds), naming the line (local only).
    SubmitCheck {
        /// What `sbatch --bb` gave (job_desc.burst_buffer).
        #[arg(long, value_name = "TEXT")]
        bb: Option<String>,
        /// The pools cache `slurm_bb_pools` reads (no pool checks when absent or unreadable).
        #[arg(long, value_name = "PATH")]
        pools_cache: Option<PathBuf>,
        script: PathBuf,
    },
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
    /// slurm_bb_pre_run: check the reservation is there to mount; note the stage-out due.
    PreRun {
        #[arg(long)]
        job: u64,
        script: PathBuf,
    },
    /// slurm_bb_post_run: wait for every node's epilog, unmount here if mounted.
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
    /// Slurm Prolog (PrologFlags=Alloc), on every node of the job: mount the job's reservation
    /// at `<mount root>/job-<id>` (nothing for a job without one).
    Prolog {
        #[arg(long, env = "SLURM_JOB_ID")]
        job: u64,
        #[arg(long, env = "SLURM_JOB_UID")]
        uid: u32,
        #[arg(long, env = "SLURM_JOB_GID")]
        gid: u32,
        /// This node's Slurm name (names its private namespace); default: the host name.
        #[arg(long, env = "SLURMD_NODENAME")]
        node: Option<String>,
    },
    /// Slurm Epilog, on every node of the job: unmount the job's reservation (idempotent).
    Epilog {
        #[arg(long, env = "SLURM_JOB_ID")]
        job: u64,
        #[arg(long, env = "SLURMD_NODENAME")]
        node: Option<String>,
    },
    /// Run by the pools refresh as a held job's user: every stage-in source (`KIND:PATH`, KIND
    /// any, file, directory or list) is there, of its kind, and readable.
    #[command(hide = true)]
    SourcesReady { sources: Vec<String> },
    /// slurm_bb_get_status (`scontrol show bbstat`): `spillway status` as the asking user
    /// (Slurm 23.02+ passes its uid and gid first), else capacity only (22.05).
    Status {
        /// What Slurm passes: the caller's uid and gid (23.02+), then the words after `bbstat`
        /// (only `--json` is accepted).
        #[arg(allow_hyphen_values = true)]
        words: Vec<String>,
    },
}

/// Run one hook (`spillway bb <hook>`).
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
        Hook::SubmitCheck { bb, pools_cache, script } => {
            ctx.submit_check(&script, bb.as_deref(), pools_cache.as_deref())
        }
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
        Hook::SourcesReady { sources } => {
            println!("{}", held::sources_ready(&sources)?);
            Ok(())
        }
        Hook::Prolog { job, uid, gid, node } => {
            ctx.prolog(job, uid, gid, &node.unwrap_or_else(hostname))
        }
        Hook::Epilog { job, node } => ctx.epilog(job, &node.unwrap_or_else(hostname)),
    }
}

/// This host's name (the node name when Slurm does not pass one).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}
