//! `spillway mount` and `spillway umount`: the POSIX mount of a reservation's burst buffer.
//!
//! `mount` connects to the reservation's servers, opens (creating on first use) the namespace
//! that holds the tree, and serves it through FUSE at MOUNTPOINT until unmounted (`spillway
//! umount`, `umount`, `fusermount3 -u`) or until it gets SIGTERM, SIGINT or SIGHUP, which unmount
//! cleanly (every write flushed, the namespace synced). `--background` returns once the mount is
//! live (the form Slurm's prolog uses): the same command runs again as a detached child that
//! reports on a pipe when the kernel has the mount.
//!
//! Namespaces (docs/semantics.md, "Mount"): `striped` is one namespace for the reservation, on
//! its first server, shared by every node; `private` gives each node (`--node`, default the host
//! name) its own namespace on server `fnv1a64(node) % servers` (spillway_policy::namespace), so metadata scales with nodes.
//! File bytes are striped over all servers in either mode.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use spillway_client::Client;
use spillway_mount::connect::{
    connect_namespace, data_clients, namespace_placement, NamespaceRoot, MOUNT_EPOCH_DEFAULT,
};
use spillway_mount::phases::PhaseReporting;
use spillway_mount::MountConfig;
use spillway_namespace::Namespace;
use spillway_policy::namespace::NamespaceAccess;
use spillway_proto::Endpoint;
use spillway_types::EpochId;

/// The line the mount prints on stdout once the kernel has the mount.
const READY_PREFIX: &str = "mounted ";
/// How long `--background` waits for the child to report the mount live.
const BACKGROUND_READY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Access {
    /// One namespace for the reservation, on its first server.
    Striped,
    /// One namespace per compute node, on server hash(node) % servers.
    Private,
}

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The reservation's servers, in order (`HOST:PORT` or `unix:/path`, comma-separated).
    #[arg(long, value_delimiter = ',', required = true)]
    pub servers: Vec<String>,
    /// Namespace mode.
    #[arg(long, value_enum, default_value = "striped")]
    pub access: Access,
    /// Copies of every piece, on servers of distinct hosts (the reservation's `replicas`, 1–4).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4))]
    pub replicas: u32,
    /// This compute node's name, for `private` namespaces (default: the host name).
    #[arg(long)]
    pub node: Option<String>,
    /// Namespace id (default: 1 for striped; derived from the node name for private).
    #[arg(long)]
    pub namespace_id: Option<u64>,
    /// Epoch that holds the files' bytes when the namespace is created.
    #[arg(long, default_value_t = MOUNT_EPOCH_DEFAULT)]
    pub epoch: u64,
    /// Owner of the namespace's root directory when it is created, `UID:GID`.
    #[arg(long, default_value = "0:0")]
    pub root_owner: String,
    /// Permission bits of the root directory when the namespace is created (octal).
    #[arg(long, default_value = "1777")]
    pub root_mode: String,
    /// FUSE session threads (each with its own cloned /dev/fuse descriptor and data client).
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Attribute and entry cache time in milliseconds. Other mounts' changes are dropped from
    /// the cache before they return, so this only bounds staleness while the namespace server
    /// is unreachable; 0 caches nothing (every lookup and stat asks the server). See
    /// docs/semantics.md, "Mount".
    #[arg(long, default_value_t = spillway_mount::ATTR_TTL_DEFAULT.as_millis() as u64)]
    pub attr_ttl_ms: u64,
    /// Let device nodes on the mount open hardware (`dev`). Off by default (`nodev`): a
    /// burst buffer holds users' files, not devices. Only root's mount can honour it.
    #[arg(long)]
    pub allow_devices: bool,
    /// Return once the mount is live, leaving a detached process serving it.
    #[arg(long)]
    pub background: bool,
    /// With --background: where the serving process writes its log (default: discarded).
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Mount the read-only view of your epochs instead of the namespace: `epoch-<E>/<name>`
    /// wherever tiering put them (burst buffer, PFS, or another node's local tier: EAGAIN).
    #[arg(long)]
    pub epochs: bool,
    /// With --epochs: the PFS directory the reservation drains to (drained and PFS-written
    /// epochs are found there).
    #[arg(long, requires = "epochs")]
    pub pfs: Option<PathBuf>,
    /// The manager: with --epochs it locates tiered epochs (default: $SPILLWAY_MANAGER; without
    /// either, epochs only the scheduler knows of are not listed); with --tiering-job it takes
    /// the phase reports (default: $SPILLWAY_MANAGER, else the default socket).
    #[arg(long)]
    pub manager: Option<String>,
    /// Report this mount's bursts of writes to the manager's data scheduler as phases of job
    /// JOB (the Slurm prolog passes the job id), so interference-aware tiering counts the job
    /// on the burst buffer. The mount's data always goes to the burst buffer.
    #[arg(long, conflicts_with = "epochs")]
    pub tiering_job: Option<String>,
    /// Print the environment that points libspillway_preload.so (LD_PRELOAD) at the namespace
    /// these flags mount, as shell `export` lines, and exit without mounting
    /// (docs/design/preload.md).
    #[arg(long, conflicts_with_all = ["epochs", "background"])]
    pub print_preload_env: bool,
    /// Where to mount (an existing directory).
    pub mountpoint: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct UmountArgs {
    /// Detach now even if files are open (`umount -l`).
    #[arg(long)]
    pub lazy: bool,
    pub mountpoint: PathBuf,
}

impl From<Access> for NamespaceAccess {
    fn from(access: Access) -> NamespaceAccess {
        match access {
            Access::Striped => NamespaceAccess::Striped,
            Access::Private => NamespaceAccess::Private,
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}

fn parse_owner(text: &str) -> anyhow::Result<(u32, u32)> {
    let (uid, gid) =
        text.split_once(':').with_context(|| format!("--root-owner {text:?}: expected UID:GID"))?;
    Ok((uid.parse().context("--root-owner uid")?, gid.parse().context("--root-owner gid")?))
}

fn parse_endpoints(servers: &[String]) -> anyhow::Result<Vec<Endpoint>> {
    servers
        .iter()
        .map(|s| s.parse::<Endpoint>().map_err(|e| anyhow::anyhow!("server {s:?}: {e}")))
        .collect()
}

/// Opens (creating if needed, never over files whose metadata is gone) the mount's namespace
/// on its server.
fn open_namespace(
    args: &Args,
    endpoints: &[Endpoint],
    data: &mut Client,
) -> anyhow::Result<Arc<dyn Namespace>> {
    let node = args.node.clone().unwrap_or_else(hostname);
    let (id, server) =
        namespace_placement(args.access.into(), &node, args.namespace_id, endpoints.len());
    let (uid, gid) = parse_owner(&args.root_owner)?;
    let mode = u32::from_str_radix(&args.root_mode, 8)
        .with_context(|| format!("--root-mode {:?} is not octal", args.root_mode))?;
    let root = NamespaceRoot { data_epoch: EpochId(args.epoch), uid, gid, mode: mode & 0o7777 };
    connect_namespace(&endpoints[server], id, root, args.threads, Some(data))
        .with_context(|| format!("server {server} of the reservation"))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.print_preload_env {
        return print_preload_env(&args);
    }
    if args.background {
        return run_background(&args);
    }
    let endpoints = parse_endpoints(&args.servers)?;
    if endpoints.is_empty() {
        bail!("--servers is empty");
    }
    // Caught from before the mount exists: a stop signal always unmounts cleanly.
    let signals = spillway_sys::signal::StopSignals::catch().context("catching signals")?;
    if args.epochs {
        return run_epochs(&args, endpoints, signals);
    }
    let config = MountConfig {
        threads: args.threads,
        attr_ttl: Duration::from_millis(args.attr_ttl_ms),
        phases: phase_reporting(&args)?,
        devices: args.allow_devices,
        ..MountConfig::default()
    };
    let mut clients = data_clients(&endpoints, config.threads, args.replicas)?;
    let Some(first) = clients.first_mut() else { bail!("--threads must be at least 1") };
    let namespace = open_namespace(&args, &endpoints, first)?;
    let mount = spillway_mount::mount(namespace.clone(), clients, &args.mountpoint, config)?;
    let what = format!("namespace {}, data epoch {}", namespace.id(), namespace.data_epoch().0);
    serve(&args.mountpoint, mount, signals, &what)
}

/// `--print-preload-env`: the interception library's settings for this namespace, placed by the
/// same rule as [`open_namespace`], quoted for a POSIX shell.
fn print_preload_env(args: &Args) -> anyhow::Result<()> {
    let endpoints = parse_endpoints(&args.servers)?;
    if endpoints.is_empty() {
        bail!("--servers is empty");
    }
    let mountpoint = std::path::absolute(&args.mountpoint)
        .with_context(|| format!("{}", args.mountpoint.display()))?;
    let node = args.node.clone().unwrap_or_else(hostname);
    let (id, server) =
        namespace_placement(args.access.into(), &node, args.namespace_id, endpoints.len());
    let quote = |value: &str| format!("'{}'", value.replace('\'', "'\\''"));
    let servers: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
    // Next to the binary (a build tree), or in <prefix>/lib/spillway (the Debian package).
    let binary = std::env::current_exe()?;
    let library = [
        binary.with_file_name("libspillway_preload.so"),
        binary.with_file_name("../lib/spillway/libspillway_preload.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .map_or_else(
        || binary.with_file_name("libspillway_preload.so"),
        |p| std::fs::canonicalize(&p).unwrap_or(p),
    );
    let mut lines = Vec::new();
    if library.is_file() {
        lines.push(("LD_PRELOAD", library.display().to_string()));
    }
    lines.extend([
        ("SPILLWAY_PRELOAD_MOUNT", mountpoint.display().to_string()),
        ("SPILLWAY_PRELOAD_SERVERS", servers.join(",")),
        ("SPILLWAY_PRELOAD_NAMESPACE", id.to_string()),
        ("SPILLWAY_PRELOAD_NAMESPACE_SERVER", server.to_string()),
        ("SPILLWAY_PRELOAD_REPLICAS", args.replicas.to_string()),
    ]);
    if !library.is_file() {
        println!("# libspillway_preload.so is neither next to this binary nor in ../lib/spillway: set LD_PRELOAD to it");
    }
    for (name, value) in lines {
        println!("export {name}={}", quote(&value));
    }
    Ok(())
}

/// With `--tiering-job`: how the mount reports its write phases.
fn phase_reporting(args: &Args) -> anyhow::Result<Option<PhaseReporting>> {
    let Some(job) = &args.tiering_job else { return Ok(None) };
    spillway_client::tiering::check_job_name(job)
        .map_err(|e| anyhow::anyhow!("--tiering-job: {e}"))?;
    let api = spillway_manager::ApiClient::from_flag(args.manager.as_deref())
        .context("the manager for --tiering-job")?;
    Ok(Some(PhaseReporting {
        service: Arc::new(spillway_manager::tiering::ManagerTiers::new(api)),
        job: job.clone(),
        processes: 1,
        quiet: spillway_mount::phases::PHASE_QUIET_DEFAULT,
    }))
}

/// The read-only epochs view (`--epochs`): one client with the caller's identity, the PFS
/// fallback, and the manager's locations of tiered epochs.
fn run_epochs(
    args: &Args,
    endpoints: Vec<Endpoint>,
    signals: spillway_sys::signal::StopSignals,
) -> anyhow::Result<()> {
    let manager = args
        .manager
        .clone()
        .or_else(|| std::env::var("SPILLWAY_MANAGER").ok().filter(|v| !v.is_empty()));
    let tiering = match &manager {
        Some(address) => {
            let api = spillway_manager::ApiClient::new(address)
                .with_context(|| format!("manager {address:?}"))?;
            Some(spillway_client::TieringOptions {
                // The view never writes, so it never begins a phase; the scheduler is asked
                // only where epochs are.
                strategy: Some(spillway_client::TieringStrategy::HighPriority),
                service: Some(Arc::new(spillway_manager::tiering::ManagerTiers::new(api))),
                ..spillway_client::TieringOptions::new("epochs-view")
            })
        }
        None => None,
    };
    let options = spillway_client::ClientOptions {
        replicas: args.replicas,
        tiering,
        ..spillway_client::ClientOptions::default()
    };
    let mut client = Client::connect(&endpoints, options).context("connecting to the servers")?;
    if let Some(pfs) = &args.pfs {
        anyhow::ensure!(pfs.is_dir(), "--pfs {}: not a directory", pfs.display());
        client.set_pfs_fallback(pfs);
    }
    let mount = spillway_mount::epochs::mount_epochs(
        client,
        args.pfs.clone(),
        &args.mountpoint,
        "spillway-epochs",
    )?;
    serve(&args.mountpoint, mount, signals, "epochs view, read-only")
}

/// Says the mount is live, then serves until it is unmounted or a stop signal arrives.
fn serve(
    mountpoint: &Path,
    mount: spillway_mount::Mount,
    mut signals: spillway_sys::signal::StopSignals,
    what: &str,
) -> anyhow::Result<()> {
    println!("{READY_PREFIX}{} ({what})", mountpoint.display());
    use std::io::Write;
    std::io::stdout().flush().ok();
    loop {
        if mount.is_finished() {
            eprintln!("spillway mount: {} was unmounted", mountpoint.display());
            break;
        }
        if let Some(signal) = signals.wait(Duration::from_millis(200)) {
            eprintln!("spillway mount: signal {signal}, unmounting {}", mountpoint.display());
            break;
        }
    }
    mount.unmount()?;
    Ok(())
}

/// The same mount in the foreground: what `--background` runs as its detached child.
fn foreground_command(args: &Args) -> anyhow::Result<Command> {
    let binary = std::env::current_exe().context("finding the spillway binary")?;
    let mut command = Command::new(binary);
    command.arg("mount").arg("--servers").arg(args.servers.join(","));
    command.arg("--replicas").arg(args.replicas.to_string());
    command.arg("--access").arg(match args.access {
        Access::Striped => "striped",
        Access::Private => "private",
    });
    if let Some(node) = &args.node {
        command.arg("--node").arg(node);
    }
    if let Some(id) = args.namespace_id {
        command.arg("--namespace-id").arg(id.to_string());
    }
    command
        .arg("--epoch")
        .arg(args.epoch.to_string())
        .arg("--root-owner")
        .arg(&args.root_owner)
        .arg("--root-mode")
        .arg(&args.root_mode)
        .arg("--threads")
        .arg(args.threads.to_string())
        .arg("--attr-ttl-ms")
        .arg(args.attr_ttl_ms.to_string());
    if args.epochs {
        command.arg("--epochs");
    }
    if args.allow_devices {
        command.arg("--allow-devices");
    }
    if let Some(pfs) = &args.pfs {
        command.arg("--pfs").arg(pfs);
    }
    if let Some(manager) = &args.manager {
        command.arg("--manager").arg(manager);
    }
    if let Some(job) = &args.tiering_job {
        command.arg("--tiering-job").arg(job);
    }
    command.arg(&args.mountpoint);
    Ok(command)
}

/// Runs the mount as a detached child and returns once it reports the mount live.
fn run_background(args: &Args) -> anyhow::Result<()> {
    let mut command = foreground_command(args)?;
    let log = match &args.log {
        Some(path) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening log {}", path.display()))?,
        ),
        None => Stdio::null(),
    };
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
    // Its own session, so the caller's terminal or job step does not take it down, and none of
    // the caller's descriptors (Slurm's hook result pipe) for the mount's lifetime.
    spillway_sys::process::detach(&mut command);
    let mut child = command.spawn().context("starting the mount process")?;
    let stdout = child.stdout.take().expect("piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = sender.send(line);
    });
    match receiver.recv_timeout(BACKGROUND_READY_TIMEOUT) {
        Ok(line) if line.starts_with(READY_PREFIX) => {
            println!("{} (pid {})", line.trim_end(), child.id());
            Ok(())
        }
        Ok(line) => {
            let status = child.wait().ok();
            bail!("the mount process ended without mounting ({status:?}, said {line:?}); see --log for its log")
        }
        Err(_) => {
            let _ = child.kill();
            bail!(
                "the mount was not live after {BACKGROUND_READY_TIMEOUT:?}; see --log for its log"
            )
        }
    }
}

pub fn run_umount(args: UmountArgs) -> anyhow::Result<()> {
    unmount(&args.mountpoint, args.lazy)
}

/// Unmounts a Spillway mount; the serving process then flushes, syncs and exits.
pub fn unmount(mountpoint: &Path, lazy: bool) -> anyhow::Result<()> {
    spillway_mount::unmount_path(mountpoint, lazy)?;
    Ok(())
}
