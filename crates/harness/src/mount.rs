//! FUSE mounts of the end-to-end tests: one guard that unmounts on drop, also after a failed
//! assertion, whether the test mounted in its own process (`spillway_mount::mount`, which this
//! crate cannot depend on: the test passes the orderly unmount as a closure) or with
//! `spillway mount --background`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use spillway_proto::Endpoint;

/// The orderly unmount of a guarded mount: flushes and syncs; the error says what failed.
type Unmount = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// Owns a mount point with a FUSE mount on it. Dropped: the orderly unmount (a failure is
/// printed), then `fusermount3 -u -z` if that failed or the path is still mounted, so a
/// failed test never leaves a mount behind.
pub struct MountGuard {
    path: PathBuf,
    /// In a mutex only so that threads can share the guard (a `Box<dyn FnOnce>` is not `Sync`).
    unmount: Mutex<Option<Unmount>>,
}

impl MountGuard {
    /// Guards the mount at `path` that the caller made; `unmount` is its orderly unmount.
    pub fn new(
        path: impl Into<PathBuf>,
        unmount: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> MountGuard {
        MountGuard { path: path.into(), unmount: Mutex::new(Some(Box::new(unmount))) }
    }

    /// `binary mount --servers <endpoints> <extra> --background --log <path>.log <path>`,
    /// asserted to have mounted (it prints `mounted …` once the kernel has the mount);
    /// unmounted with `binary umount <path>`.
    ///
    /// # Panics
    /// If the mount fails: with the command's output and its log.
    pub fn spillway(
        binary: impl AsRef<Path>,
        endpoints: &[Endpoint],
        path: &Path,
        extra: &[&str],
    ) -> MountGuard {
        let binary = binary.as_ref().to_path_buf();
        std::fs::create_dir_all(path).unwrap();
        let log = path.with_extension("log");
        let out = Command::new(&binary)
            .arg("mount")
            .arg("--servers")
            .arg(crate::endpoint_list(endpoints))
            .args(extra)
            .arg("--background")
            .arg("--log")
            .arg(&log)
            .arg(path)
            .output()
            .unwrap();
        let unmount_path = path.to_path_buf();
        let guard = MountGuard::new(path, move || {
            match Command::new(&binary).arg("umount").arg(&unmount_path).status() {
                Ok(status) if status.success() => Ok(()),
                Ok(status) => Err(format!("spillway umount: {status}")),
                Err(e) => Err(format!("spillway umount: {e}")),
            }
        });
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "spillway mount failed: {stdout}{}; log: {}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(stdout.starts_with("mounted "), "{stdout}");
        guard
    }

    fn take(&self) -> Option<Unmount> {
        self.unmount.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The orderly unmount now, asserted to succeed.
    ///
    /// # Panics
    /// If it fails.
    pub fn unmount(self) {
        let unmount = self.take().expect("unmounted once");
        if let Err(e) = unmount() {
            panic!("unmount of {} failed: {e}", self.path.display());
        }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        let failed = self.take().is_some_and(|unmount| match unmount() {
            Ok(()) => false,
            Err(e) => {
                eprintln!("unmount of {} failed: {e}", self.path.display());
                true
            }
        });
        if failed || mounted(&self.path).is_some() {
            let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(&self.path).status();
        }
    }
}

/// The file system type of what is mounted at `path` (`fuse`, `fuse.spillway`, …), from
/// /proc/mounts; `None` when nothing is.
pub fn mounted(path: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let path = path.display().to_string();
    mounts.lines().find_map(|line| {
        let mut fields = line.split(' ');
        let (point, kind) = (fields.nth(1)?, fields.next()?);
        (point == path).then(|| kind.to_string())
    })
}

/// Asserts that this machine can mount FUSE (`/dev/fuse`; the tests also need root).
///
/// # Panics
/// If `/dev/fuse` is missing, naming `who` (the tests that need it).
pub fn require_fuse(who: &str) {
    assert!(
        Path::new("/dev/fuse").exists(),
        "{who} need /dev/fuse (the fuse kernel module) and root"
    );
}
