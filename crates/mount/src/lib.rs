//! The POSIX mount of Spillway: a FUSE file system whose metadata lives in a namespace
//! ([`spillway_namespace::Namespace`], on a burst buffer server or in-process) and whose file bytes
//! live in the burst buffer store as ordinary epoch data (`ns/<namespace>/<ino>.<generation>`),
//! so `ls`, `cp`, Python and static binaries see the same files as the native API and the files
//! drain to the PFS like any other epoch.
//!
//! [`mount`] mounts [`SpillwayFs`] at a directory and returns a [`Mount`] that unmounts when
//! dropped. Requests are served by [`MountConfig::threads`] FUSE session threads, each reading
//! its own cloned `/dev/fuse` descriptor; data goes through a pool of clients
//! ([`data::DataPlane`], one slot per thread, an inode always on the same slot). See
//! docs/design/mount.md for threads, caching, TTLs, truncation and identity, and
//! docs/semantics.md ("Mount") for what applications may rely on.

pub mod cache;
pub mod connect;
pub mod data;
pub mod epochs;
pub mod fs;
pub mod identity;
pub mod phases;
pub mod readahead;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::{BackgroundSession, Config, MountOption, SessionACL};
use spillway_client::Client;
use spillway_namespace::Namespace;

pub use data::{DataError, DataPlane};
pub use fs::{MountConfig, SpillwayFs, ATTR_TTL_DEFAULT, MAX_WRITE_BYTES};

/// Why mounting or unmounting failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    #[error("mount point {path}: {problem}")]
    MountPoint { path: PathBuf, problem: String },
    #[error("mounting FUSE at {path}: {source}")]
    Mount { path: PathBuf, source: std::io::Error },
    #[error("unmounting {path}: {source}")]
    Unmount { path: PathBuf, source: std::io::Error },
    #[error("mount configuration: {0}")]
    Config(String),
    #[error("subscribing to the namespace's changes: {0}")]
    Watch(spillway_namespace::MetaError),
}

/// How long [`Mount::unmount`] (as root) retries an unmount the kernel refuses as busy.
pub const UNMOUNT_BUSY_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// A live mount; unmounts (lazily, like `umount -l`) when dropped.
pub struct Mount {
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    /// Drops other users' changes from the kernel's cache; stopped when dropped.
    _invalidator: Option<cache::Invalidator>,
}

impl Mount {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Whether the session has ended (someone unmounted the file system from outside).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// Unmounts and waits until the session has flushed every write and synced the namespace.
    pub fn unmount(mut self) -> Result<(), MountError> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> Result<(), MountError> {
        let Some(session) = self.session.take() else { return Ok(()) };
        if !session.guard.is_finished() && spillway_sys::user::euid() == 0 {
            // Root unmounts itself, waiting out EBUSY: the kernel refuses a non-lazy unmount
            // while requests of files closed a moment ago are still in flight (asynchronous
            // readahead), and fuser's unmount gives up at once.
            let deadline = std::time::Instant::now() + UNMOUNT_BUSY_WAIT_MAX;
            loop {
                match spillway_sys::mount::unmount(&self.mountpoint, false) {
                    Ok(()) => break,
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY)
                            && std::time::Instant::now() < deadline =>
                    {
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    }
                    Err(source) => {
                        return Err(MountError::Unmount { path: self.mountpoint.clone(), source })
                    }
                }
            }
            // The session ends once the kernel's DESTROY is served (every write flushed).
            while !session.guard.is_finished() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        if session.guard.is_finished() {
            // Unmounted (here, or from outside: `spillway umount`, `umount`): the session
            // thread has flushed and ended. Dropping fuser's session would unmount the *path*
            // once more, which could take down a new mount made there meanwhile; leak the
            // finished handle.
            std::mem::forget(session);
            return Ok(());
        }
        session
            .umount_and_join()
            .map_err(|source| MountError::Unmount { path: self.mountpoint.clone(), source })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = self.unmount_inner() {
            tracing::warn!(error = %e, "unmount at drop failed");
        }
    }
}

/// Mounts a namespace at `mountpoint`, with file data going through `clients` (one per data
/// slot; all connected to the reservation's servers in the same order with striped placement).
/// Returns once the kernel has the mount (the FUSE handshake is done).
pub fn mount(
    namespace: Arc<dyn Namespace>,
    clients: Vec<Client>,
    mountpoint: &Path,
    config: MountConfig,
) -> Result<Mount, MountError> {
    if clients.is_empty() {
        return Err(MountError::Config("no data clients".into()));
    }
    if config.threads == 0 {
        return Err(MountError::Config("threads must be at least 1".into()));
    }
    check_mountpoint(mountpoint)?;
    let phases = match &config.phases {
        Some(reporting) => Some(
            phases::Phases::start(
                reporting.clone(),
                namespace.data_epoch(),
                clients[0].client_id(),
            )
            .map_err(|e| MountError::Config(format!("starting the phase reporter: {e}")))?,
        ),
        None => None,
    };
    let data = DataPlane::new(clients, namespace.id(), namespace.data_epoch());
    let mut options = Config::default();
    options.mount_options = vec![
        MountOption::FSName(config.fs_name.clone()),
        subtype_option(),
        MountOption::RW,
        MountOption::Suid,
        if config.devices { MountOption::Dev } else { MountOption::NoDev },
        MountOption::Exec,
        MountOption::Atime,
        // The kernel opens FIFOs, sockets and device nodes without asking the file system, so
        // only its own check of the mode bits stops another user opening them; the namespace
        // checks everything else again with the same rules.
        MountOption::DefaultPermissions,
    ];
    options.acl = if config.allow_other { SessionACL::All } else { SessionACL::Owner };
    options.n_threads = Some(config.threads);
    options.clone_fd = true;
    // Subscribed before the kernel caches anything, so no change after it is missed.
    let watch = if config.attr_ttl.is_zero() || !config.watch_changes {
        None
    } else {
        match namespace.watch().map_err(MountError::Watch)? {
            Some(mut watch) => {
                let first = watch.next(0).map_err(MountError::Watch)?;
                Some((watch, first.version))
            }
            None => None,
        }
    };
    let fs = SpillwayFs::new(namespace, data, config).with_phases(phases);
    let tracker = fs.cache();
    let session = fuser::spawn_mount(fs, mountpoint, &options)
        .map_err(|source| MountError::Mount { path: mountpoint.to_path_buf(), source })?;
    let invalidator = match watch {
        Some((watch, since)) => Some(
            cache::Invalidator::start(watch, since, tracker, session.notifier())
                .map_err(|source| MountError::Mount { path: mountpoint.to_path_buf(), source })?,
        ),
        None => None,
    };
    Ok(Mount {
        session: Some(session),
        mountpoint: mountpoint.to_path_buf(),
        _invalidator: invalidator,
    })
}

/// The file system's type shows as `fuse.spillway`. fuser hands `subtype=` only to
/// fusermount3; mounting with mount(2) itself (as root) it drops it, so root passes the option
/// to the kernel directly.
fn subtype_option() -> MountOption {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        MountOption::CUSTOM("subtype=spillway".to_string())
    } else {
        MountOption::Subtype("spillway".to_string())
    }
}

/// The mount point must be an existing directory.
fn check_mountpoint(mountpoint: &Path) -> Result<(), MountError> {
    let meta = std::fs::metadata(mountpoint).map_err(|e| MountError::MountPoint {
        path: mountpoint.to_path_buf(),
        problem: e.to_string(),
    })?;
    if meta.is_dir() {
        Ok(())
    } else {
        Err(MountError::MountPoint {
            path: mountpoint.to_path_buf(),
            problem: "not a directory".into(),
        })
    }
}

/// Unmounts whatever is mounted at `mountpoint` (as root with umount2, else with
/// `fusermount3 -u`); `lazy` detaches even if files are still open.
pub fn unmount_path(mountpoint: &Path, lazy: bool) -> Result<(), MountError> {
    let Err(first) = spillway_sys::mount::unmount(mountpoint, lazy) else {
        return Ok(());
    };
    let mut command = std::process::Command::new("fusermount3");
    command.arg("-u");
    if lazy {
        command.arg("-z");
    }
    match command.arg(mountpoint).output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(MountError::Unmount {
            path: mountpoint.to_path_buf(),
            source: std::io::Error::other(format!(
                "umount2: {first}; fusermount3: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
        }),
        Err(_) => Err(MountError::Unmount { path: mountpoint.to_path_buf(), source: first }),
    }
}
