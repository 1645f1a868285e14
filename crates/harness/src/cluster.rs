//! A test cluster: N hosts as Linux namespaces on this machine, started by
//! `scripts/cluster/up.sh` and stopped by `scripts/cluster/down.sh` (docs/design/cluster.md).
//!
//! Each host has its own network namespace and address on a private bridge, hostname, `/tmp`,
//! `/var/tmp`, mounts and `munged` (one key for the cluster); the rest of the file system is
//! shared. A [`Cluster`] owns a directory under the system's temporary directory and stops the
//! hosts when dropped (or by [`Cluster::down`], which returns what was left behind). A [`Host`]
//! gives [`Command`]s that run inside it; [`ServerBuilder::in_host`](crate::ServerBuilder::in_host)
//! and [`ManagerProcess::start_in_host`](crate::ManagerProcess::start_in_host) run daemons there.
//! [`Cluster::start_pfs`] makes one host serve a real shared file system (MooseFS) that every
//! other host mounts at the same path, through a link shaped to a bandwidth ([`SharedPfs`]).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the scripts are, from this crate's directory in the workspace.
const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/cluster");
/// The programs `up.sh` needs, checked first so a missing one is named.
const TOOLS: [&str; 4] = ["ip", "unshare", "nsenter", "munged"];

/// Why a cluster could not be started, changed or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    #[error(
        "cluster tests need root (network and mount namespaces); run them as root, as CI does"
    )]
    NotRoot,
    #[error("{tool} not found on PATH nor in /usr/sbin, /sbin (cluster hosts need the Debian packages iproute2, util-linux and munge)")]
    ToolMissing { tool: &'static str },
    #[error("cluster: cannot prepare {path}: {source}")]
    Prepare { path: PathBuf, source: std::io::Error },
    #[error("cannot run {script}: {source}")]
    Spawn { script: PathBuf, source: std::io::Error },
    #[error("{script} failed ({status}): {stderr}")]
    Script { script: PathBuf, status: std::process::ExitStatus, stderr: String },
    #[error("{path}: {problem}")]
    BadEnv { path: PathBuf, problem: String },
    #[error("no host {name} in the cluster at {dir}")]
    NoSuchHost { name: String, dir: PathBuf },
}

/// One host of a [`Cluster`].
#[derive(Debug, Clone)]
pub struct Host {
    name: String,
    address: IpAddr,
    netns: String,
    ssd_dir: PathBuf,
    cluster_dir: PathBuf,
}

impl Host {
    /// Its name, which is also its hostname inside (`host1`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its address on the cluster's bridge.
    pub fn address(&self) -> IpAddr {
        self.address
    }

    /// `address:port`.
    pub fn socket_address(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.address, port)
    }

    /// Its network namespace (`ip netns` name).
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// Its SSD directory (`DIR/hosts/<name>/ssd`): deleted when the host is removed for good.
    pub fn ssd_dir(&self) -> &Path {
        &self.ssd_dir
    }

    /// `program` run inside this host (its network, hostname and mounts) as root, through
    /// `scripts/cluster/exec.sh`; the caller adds arguments, environment and streams.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(Path::new(SCRIPTS).join("exec.sh"));
        command.arg(&self.cluster_dir).arg(&self.name).arg(program);
        command
    }

    /// `program` run inside this host as `uid` (primary group `uid`, no supplementary groups).
    pub fn command_as(&self, uid: u32, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = self.command("setpriv");
        command
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={uid}"))
            .arg("--clear-groups")
            .arg(program);
        command
    }
}

/// A shared parallel file system served by one host of a [`Cluster`] and mounted by every other
/// live host ([`Cluster::start_pfs`], `scripts/cluster/pfs-up.sh`): MooseFS, its master and
/// chunkserver in the server host (data under that host's directory, lost with it), `mfsmount`
/// (FUSE) in each client at the same path, and the server host's link shaped with `tc` to the
/// rate in each direction, so jobs that write or read it at once share that bandwidth
/// physically. It stops with the cluster (or by [`Cluster::stop_pfs`]).
#[derive(Debug, Clone)]
pub struct SharedPfs {
    mount: PathBuf,
    server: String,
    server_address: IpAddr,
    rate_mbit: u32,
    clients: Vec<String>,
}

impl SharedPfs {
    /// Where it is mounted, the same path in every client host (under the cluster's directory;
    /// neither the machine nor the server host sees the mount there).
    pub fn mount_path(&self) -> &Path {
        &self.mount
    }

    /// The host that serves it (its link is the shaped one).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The server host's address, on which the MooseFS daemons listen.
    pub fn server_address(&self) -> IpAddr {
        self.server_address
    }

    /// The bandwidth of the server host's link, each way, in Mbit/s (10^6 bit/s).
    pub fn rate_mbit(&self) -> u32 {
        self.rate_mbit
    }

    /// The hosts that mount it: every host that was live when it started, but the server.
    pub fn clients(&self) -> &[String] {
        &self.clients
    }
}

/// A running cluster; stopped, with nothing left behind, when dropped.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    tag: String,
    hosts: Vec<Host>,
    removed: Vec<String>,
    stopped: bool,
}

impl Cluster {
    /// Starts `hosts` hosts (`host1` … `hostN`) in a new directory under the system's temporary
    /// directory.
    pub fn start(hosts: usize) -> Result<Cluster, ClusterError> {
        if spillway_sys::user::euid() != 0 {
            return Err(ClusterError::NotRoot);
        }
        for tool in TOOLS {
            if !on_path(tool) {
                return Err(ClusterError::ToolMissing { tool });
            }
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "spillway-cluster-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|source| ClusterError::Prepare { path: dir.clone(), source })?;
        // up.sh tears down what it made when it fails; the directory is ours to remove. Its
        // watchdog stops the cluster if this process dies without dropping it (a killed test).
        let env = [
            ("SPILLWAY_CLUSTER_OWNER_PID", std::process::id().to_string()),
            ("SPILLWAY_CLUSTER_KEEP", kept_directories()),
        ];
        run_script("up.sh", &[dir.as_os_str(), hosts.to_string().as_ref()], &env).inspect_err(
            |_| {
                let _ = std::fs::remove_dir_all(&dir);
            },
        )?;
        let mut cluster = Cluster {
            dir,
            tag: String::new(),
            hosts: Vec::new(),
            removed: Vec::new(),
            stopped: false,
        };
        let env = cluster.dir.join("cluster.env");
        let text = std::fs::read_to_string(&env)
            .map_err(|source| ClusterError::Prepare { path: env.clone(), source })?;
        let (tag, hosts) = parse_env(&text, &cluster.dir)
            .map_err(|problem| ClusterError::BadEnv { path: env, problem })?;
        cluster.tag = tag;
        cluster.hosts = hosts;
        Ok(cluster)
    }

    /// [`start`](Self::start), panicking with the error.
    #[track_caller]
    pub fn started(hosts: usize) -> Cluster {
        Cluster::start(hosts).unwrap_or_else(|error| panic!("{error}"))
    }

    /// The cluster's directory: shared by every host (put PFS directories and anything hosts
    /// must share under it; the machine's `/tmp` is not what hosts see as `/tmp`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The short tag in its namespaces' names (`spw-<tag>-…`).
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Every host it started, removed ones included, in order.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Host `index` (0-based: `host(0)` is `host1`). Panics past the end.
    pub fn host(&self, index: usize) -> &Host {
        &self.hosts[index]
    }

    /// The host of this name.
    pub fn host_named(&self, name: &str) -> Result<&Host, ClusterError> {
        self.hosts.iter().find(|h| h.name == name).ok_or_else(|| ClusterError::NoSuchHost {
            name: name.to_string(),
            dir: self.dir.clone(),
        })
    }

    /// Whether `name` was removed for good.
    pub fn is_removed(&self, name: &str) -> bool {
        self.removed.iter().any(|r| r == name)
    }

    /// Loses host `name` for good (`remove-host.sh`), as a crash: every process in it
    /// SIGKILLed (peers see their connections closed), its network namespace and its directory
    /// (SSD included) deleted. The other hosts keep running.
    pub fn remove_host(&mut self, name: &str) -> Result<(), ClusterError> {
        self.remove(name, false)
    }

    /// [`remove_host`](Self::remove_host) as a power loss: the host's link is cut first, so
    /// peers get no FIN or RST and notice only by their timeouts.
    pub fn remove_host_silently(&mut self, name: &str) -> Result<(), ClusterError> {
        self.remove(name, true)
    }

    fn remove(&mut self, name: &str, silent: bool) -> Result<(), ClusterError> {
        self.host_named(name)?;
        let mut args = vec![self.dir.as_os_str(), name.as_ref()];
        if silent {
            args.insert(0, "--silent".as_ref());
        }
        run_script("remove-host.sh", &args, &[])?;
        self.removed.push(name.to_string());
        Ok(())
    }

    /// Makes host `server` serve a shared parallel file system (MooseFS) mounted at
    /// `DIR/pfs-mnt` in every other live host, the server host's link shaped to
    /// `bandwidth_mbit` Mbit/s each way (`scripts/cluster/pfs-up.sh`; docs/design/cluster.md,
    /// "A shared PFS with limited bandwidth"). One at a time per cluster; it stops with the
    /// cluster or by [`stop_pfs`](Self::stop_pfs). The error of a failed start names the step
    /// (what was started is stopped again).
    pub fn start_pfs(&self, server: &str, bandwidth_mbit: u32) -> Result<SharedPfs, ClusterError> {
        self.host_named(server)?;
        let mount = self.dir.join("pfs-mnt");
        run_script(
            "pfs-up.sh",
            &[
                self.dir.as_os_str(),
                server.as_ref(),
                mount.as_os_str(),
                bandwidth_mbit.to_string().as_ref(),
            ],
            &[],
        )?;
        let env = self.dir.join("pfs.env");
        let text = std::fs::read_to_string(&env)
            .map_err(|source| ClusterError::Prepare { path: env.clone(), source })?;
        parse_pfs_env(&text).map_err(|problem| ClusterError::BadEnv { path: env, problem })
    }

    /// Shapes `host`'s link to `bandwidth_mbit` Mbit/s each way (`scripts/cluster/shape.sh`:
    /// tc tbf on the switch's port toward it and on its `eth0`), e.g. a burst buffer server's
    /// network, which its clients then share physically.
    pub fn shape_link(&self, host: &str, bandwidth_mbit: u32) -> Result<(), ClusterError> {
        self.host_named(host)?;
        let rate = bandwidth_mbit.to_string();
        run_script("shape.sh", &[self.dir.as_os_str(), host.as_ref(), rate.as_ref()], &[])
            .map(|_| ())
    }

    /// Stops the shared PFS of [`start_pfs`](Self::start_pfs) (`scripts/cluster/pfs-down.sh`):
    /// its mounts, its daemons, the shaping and its data; the hosts keep running. Nothing to do
    /// when none runs.
    pub fn stop_pfs(&self) -> Result<(), ClusterError> {
        run_script("pfs-down.sh", &[self.dir.as_os_str()], &[]).map(|_| ())
    }

    /// Stops every host (`down.sh`), which checks that no namespace, process or mount is left,
    /// and removes the directory. The error names what was left (the directory then stays).
    pub fn down(mut self) -> Result<(), ClusterError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), ClusterError> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        run_script("down.sh", &[self.dir.as_os_str()], &[])?;
        // down.sh found no mount under the directory, so removing it stays inside it.
        std::fs::remove_dir_all(&self.dir)
            .map_err(|source| ClusterError::Prepare { path: self.dir.clone(), source })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            eprintln!("cluster {}: {error}", self.tag);
        }
    }
}

/// Runs `scripts/cluster/<script>` with `args` and `env`; its stderr is in the error.
fn run_script(
    script: &str,
    args: &[&std::ffi::OsStr],
    env: &[(&str, String)],
) -> Result<Output, ClusterError> {
    let path = Path::new(SCRIPTS).join(script);
    let output = Command::new(&path)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ClusterError::Spawn { script: path.clone(), source })?;
    if !output.status.success() {
        return Err(ClusterError::Script {
            script: path,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(output)
}

/// What the hosts must see at its path although their `/tmp` and `/var/tmp` are their own
/// (up.sh's `SPILLWAY_CLUSTER_KEEP`): the caller's, and the build directory this executable
/// runs from (`target/debug` for a test, `target` for `spillway bench`), which holds the
/// binaries the hosts run even when the target directory lies under `/tmp`.
fn kept_directories() -> String {
    let mut kept = std::env::var("SPILLWAY_CLUSTER_KEEP").unwrap_or_default();
    let exe = std::env::current_exe().ok();
    if let Some(build) = exe.as_deref().and_then(|e| e.parent()?.parent()) {
        if !kept.is_empty() {
            kept.push(':');
        }
        kept.push_str(&build.to_string_lossy());
    }
    kept
}

/// Whether `tool` is on `PATH` or in the system directories a root shell has.
fn on_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .any(|dir| dir.join(tool).is_file())
}

/// The tag and hosts of a `cluster.env` written by up.sh.
fn parse_env(text: &str, dir: &Path) -> Result<(String, Vec<Host>), String> {
    let value = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim_matches('\'').to_string())
            .ok_or_else(|| format!("no {key}"))
    };
    let tag = value("CLUSTER_TAG")?;
    let hosts = value("CLUSTER_HOSTS")?
        .split_whitespace()
        .map(|name| {
            let address = value(&format!("CLUSTER_ADDR_{name}"))?;
            Ok(Host {
                name: name.to_string(),
                address: address.parse().map_err(|e| format!("address {address:?}: {e}"))?,
                netns: value(&format!("CLUSTER_NETNS_{name}"))?,
                ssd_dir: PathBuf::from(value(&format!("CLUSTER_SSD_{name}"))?),
                cluster_dir: dir.to_path_buf(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if hosts.is_empty() {
        return Err("no hosts".to_string());
    }
    Ok((tag, hosts))
}

/// The shared PFS a `pfs.env` written by pfs-up.sh describes.
fn parse_pfs_env(text: &str) -> Result<SharedPfs, String> {
    let value = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim_matches('\'').to_string())
            .ok_or_else(|| format!("no {key}"))
    };
    let address = value("PFS_SERVER_ADDR")?;
    let rate = value("PFS_RATE_MBIT")?;
    Ok(SharedPfs {
        mount: PathBuf::from(value("PFS_MOUNT")?),
        server: value("PFS_SERVER")?,
        server_address: address.parse().map_err(|e| format!("address {address:?}: {e}"))?,
        rate_mbit: rate.parse().map_err(|e| format!("rate {rate:?}: {e}"))?,
        clients: value("PFS_CLIENTS")?.split_whitespace().map(str::to_string).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_env_file_names_every_host() {
        let text = "CLUSTER_DIR=/d\nCLUSTER_TAG=c7\nCLUSTER_HOSTS='host1 host2'\n\
                    CLUSTER_ADDR_host1=10.213.7.1\nCLUSTER_NETNS_host1=spw-c7-host1\n\
                    CLUSTER_SSD_host1=/d/hosts/host1/ssd\nCLUSTER_ADDR_host2=10.213.7.2\n\
                    CLUSTER_NETNS_host2=spw-c7-host2\nCLUSTER_SSD_host2=/d/hosts/host2/ssd\n";
        let (tag, hosts) = parse_env(text, Path::new("/d")).unwrap();
        assert_eq!(tag, "c7");
        assert_eq!(hosts.len(), 2);
        assert_eq!(hosts[1].name(), "host2");
        assert_eq!(hosts[1].socket_address(7), "10.213.7.2:7".parse().unwrap());
        assert_eq!(hosts[0].netns(), "spw-c7-host1");
        assert_eq!(hosts[0].ssd_dir(), Path::new("/d/hosts/host1/ssd"));
        let missing = parse_env("CLUSTER_TAG=c7\nCLUSTER_HOSTS='host1'\n", Path::new("/d"));
        assert_eq!(missing.unwrap_err(), "no CLUSTER_ADDR_host1");
    }

    #[test]
    fn the_pfs_env_file_names_server_mount_and_rate() {
        let text = "PFS_KIND=moosefs\nPFS_SERVER=host3\nPFS_SERVER_ADDR=10.213.7.3\n\
                    PFS_MOUNT=/d/pfs-mnt\nPFS_RATE_MBIT=200\nPFS_CLIENTS='host1 host2'\n\
                    PFS_DATA=/d/hosts/host3/pfs\n";
        let pfs = parse_pfs_env(text).unwrap();
        assert_eq!(pfs.mount_path(), Path::new("/d/pfs-mnt"));
        assert_eq!(pfs.server(), "host3");
        assert_eq!(pfs.server_address(), "10.213.7.3".parse::<IpAddr>().unwrap());
        assert_eq!(pfs.rate_mbit(), 200);
        assert_eq!(pfs.clients(), ["host1", "host2"]);
        assert_eq!(parse_pfs_env("PFS_SERVER=host3\n").unwrap_err(), "no PFS_SERVER_ADDR");
    }
}
