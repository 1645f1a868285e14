//! A private `munged` for tests, the demo and benchmarks: its own key, socket and files in a
//! directory of its own, stopped and removed when its [`Munged`] is dropped.
//!
//! Two `Munged`s have different keys, so a credential made through one is a forgery to the
//! other: that is how tests forge credentials without touching the host's munge.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spillway_sys::munge::{MungeContext, MungeError};

/// Bytes of the generated key (munged requires at least 32).
pub const MUNGED_KEY_BYTES: usize = 1024;
/// How long `munged` may take to answer on its socket.
pub const MUNGED_READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Where `munged` is looked for when it is not on `PATH` (Debian's `munge` package).
const MUNGED_FALLBACK: &str = "/usr/sbin/munged";

/// Why a `munged` could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MungedError {
    #[error(
        "munged not found on PATH nor at {MUNGED_FALLBACK} (install the Debian package munge)"
    )]
    NotInstalled,
    #[error("munged: cannot prepare {path}: {source}")]
    Prepare { path: PathBuf, source: std::io::Error },
    #[error("cannot start {binary}: {source}")]
    Spawn { binary: PathBuf, source: std::io::Error },
    #[error("munged exited at start ({status}); log ({log}): {log_text}")]
    Exited { status: std::process::ExitStatus, log: PathBuf, log_text: String },
    #[error(
        "munged did not answer on {socket} within {timeout:?} ({last}); log ({log}): {log_text}"
    )]
    NotAnswering {
        socket: PathBuf,
        timeout: Duration,
        last: String,
        log: PathBuf,
        log_text: String,
    },
}

/// A running `munged` with its own key; killed, and its directory removed, when dropped.
#[derive(Debug)]
pub struct Munged {
    child: Child,
    directory: PathBuf,
    socket: PathBuf,
    log: PathBuf,
}

impl Munged {
    /// Generates a key and starts `munged --foreground` in a new directory under the system's
    /// temporary directory, then waits until a credential can be encoded through its socket.
    pub fn start() -> Result<Munged, MungedError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let directory = std::env::temp_dir().join(format!(
            "spillway-munged-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let binary = munged_binary().ok_or(MungedError::NotInstalled)?;
        prepare_directory(&directory)?;
        let socket = directory.join("munge.socket");
        let log = directory.join("munged.log");
        let child = spawn(&binary, &directory, &socket, &log).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&directory);
        })?;
        let mut munged = Munged { child, directory, socket, log };
        munged.wait_until_answering()?;
        Ok(munged)
    }

    /// [`start`](Self::start), panicking with the error (which carries munged's log).
    #[track_caller]
    pub fn started() -> Munged {
        Munged::start().unwrap_or_else(|error| panic!("{error}"))
    }

    /// The socket clients and servers pass as their munge socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A context that encodes and decodes through this daemon.
    pub fn context(&self) -> MungeContext {
        MungeContext::new().with_socket(Some(self.socket.clone()))
    }

    /// What munged logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_until_answering(&mut self) -> Result<(), MungedError> {
        let deadline = Instant::now() + MUNGED_READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(MungedError::Exited {
                    status,
                    log: self.log.clone(),
                    log_text: self.log_text(),
                });
            }
            let last = match self.context().encode(b"ready?") {
                Ok(_) => return Ok(()),
                Err(error) => error,
            };
            // Only a socket that is not there yet is worth waiting for.
            if !matches!(last, MungeError::SocketError { .. }) || Instant::now() >= deadline {
                return Err(MungedError::NotAnswering {
                    socket: self.socket.clone(),
                    timeout: MUNGED_READY_TIMEOUT,
                    last: last.to_string(),
                    log: self.log.clone(),
                    log_text: self.log_text(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Munged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

/// `munged` on `PATH`, else the Debian location.
fn munged_binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path).map(|dir| dir.join("munged")).find(|p| p.is_file())
    });
    on_path.or_else(|| Some(PathBuf::from(MUNGED_FALLBACK)).filter(|p| p.is_file()))
}

/// The daemon's directory (mode 0755: every user must reach the socket, munged checks that)
/// and its key: `MUNGED_KEY_BYTES` random bytes, mode 0400.
fn prepare_directory(directory: &Path) -> Result<(), MungedError> {
    use std::io::{Read, Write};
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let prepare = |path: &Path| {
        let path = path.to_path_buf();
        move |source| MungedError::Prepare { path, source }
    };
    std::fs::create_dir_all(directory).map_err(prepare(directory))?;
    std::fs::set_permissions(directory, std::fs::Permissions::from_mode(0o755))
        .map_err(prepare(directory))?;
    let mut key = vec![0u8; MUNGED_KEY_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut key))
        .map_err(prepare(Path::new("/dev/urandom")))?;
    let key_path = directory.join("munge.key");
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(&key_path)
        .and_then(|mut file| file.write_all(&key))
        .map_err(prepare(&key_path))
}

/// `munged --foreground --force` on the directory's files, its stderr appended to the log.
fn spawn(binary: &Path, directory: &Path, socket: &Path, log: &Path) -> Result<Child, MungedError> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|source| MungedError::Prepare { path: log.to_path_buf(), source })?;
    let mut command = Command::new(binary);
    command
        .args(["--foreground", "--force"])
        .arg("--socket")
        .arg(socket)
        .arg("--key-file")
        .arg(directory.join("munge.key"))
        .arg("--pid-file")
        .arg(directory.join("munged.pid"))
        .arg("--log-file")
        .arg(log)
        .arg("--seed-file")
        .arg(directory.join("munged.seed"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file);
    spillway_sys::process::die_with_parent(&mut command);
    command.spawn().map_err(|source| MungedError::Spawn { binary: binary.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_munged_answers_and_is_gone_after_drop() {
        let munged = Munged::started();
        let credential = munged.context().encode(b"hello").unwrap();
        let decoded = munged.context().decode(&credential).unwrap();
        assert_eq!(decoded.payload, b"hello");
        assert_eq!(decoded.uid, spillway_sys::user::euid());
        let key = std::fs::metadata(munged.directory.join("munge.key")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(key.permissions().mode() & 0o777, 0o400);
        assert_eq!(key.len(), MUNGED_KEY_BYTES as u64);
        let (pid, directory) = (munged.child.id(), munged.directory.clone());
        drop(munged);
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "munged {pid} still running");
        assert!(!directory.exists());
    }
}
